# ARG-driven pins, declared again after FROM (both $A and ${A})
ARG CUDA='121'
ARG TORCH_VERSION="2.4.0"
FROM nvidia/cuda:12.1.1-base-ubuntu22.04
ARG CUDA
ARG TORCH_VERSION
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch==${TORCH_VERSION}+cu$CUDA --index-url https://download.pytorch.org/whl/cu${CUDA}
