# Source pattern: 2018 repositories pinning torch 0.4.1 (before envbuild's facts) from the cu92 wheel folder,
# on a CUDA 10.0 base: the CUDA-major rule needs only the +cu92 tag and the base tag
FROM nvidia/cuda:10.0-cudnn7-runtime-ubuntu18.04
RUN apt-get update && apt-get install -y python3-pip && rm -rf /var/lib/apt/lists/*
RUN pip3 install torch==0.4.1+cu92 -f https://download.pytorch.org/whl/cu92/torch_stable.html
