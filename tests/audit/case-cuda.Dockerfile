# Source pattern: "case $CUDA in" picking the wheel index (multi-CUDA build scripts); CUDA is not known
# here (no default, no --build-arg), so each branch is an alternative audit cannot decide
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
ARG CUDA
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN case "$CUDA" in \
      12.*) pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124 ;; \
      11.8) pip install torch==2.5.1+cu118 --index-url https://download.pytorch.org/whl/cu118 ;; \
    esac
