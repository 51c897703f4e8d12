# Source pattern: 2020-2021 Dockerfiles on a CUDA 11.1 image with the cu110 wheel of torch 1.7.1
FROM nvidia/cuda:11.1.1-cudnn8-runtime-ubuntu20.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip && rm -rf /var/lib/apt/lists/*
RUN pip3 install torch==1.7.1+cu110 torchvision==0.8.2+cu110 -f https://download.pytorch.org/whl/torch_stable.html
