# nested ${A%.*} / ${A#*.} forms, as sh expands them
ARG CUDA_VERSION=12.1.1
FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu22.04
ARG CUDA_VERSION
RUN apt-get update && apt-get install -y python3-pip
RUN MM=${CUDA_VERSION%.*} \
 && pip install torch==2.1.0 --index-url "https://download.pytorch.org/whl/cu${MM%.*}${MM#*.}"
