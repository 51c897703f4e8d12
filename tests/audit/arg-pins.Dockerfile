# ARG-driven pins; the stage forgets to declare TORCH_VERSION again
ARG CUDA='121'
ARG TORCH_VERSION="2.4.0"
FROM nvidia/cuda:12.1.1-base-ubuntu22.04
ARG CUDA
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch==${TORCH_VERSION}+cu${CUDA} --index-url https://download.pytorch.org/whl/cu${CUDA}
