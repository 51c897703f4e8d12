# Source pattern: "case $CUDA in" picking the wheel index, the CUDA given by the ARG default: one branch runs
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
ARG CUDA=12.4
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN case "$CUDA" in \
      12.*) pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124 ;; \
      11.8) pip install torch==2.5.1+cu118 --index-url https://download.pytorch.org/whl/cu118 ;; \
    esac
