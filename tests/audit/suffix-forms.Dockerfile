# a bash-only substitution: sh cannot run it, audit cannot expand it
ARG CUDA_VERSION=12.1.1
FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04
ARG CUDA_VERSION
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch==2.1.0 --index-url https://download.pytorch.org/whl/cu${CUDA_VERSION//./}
