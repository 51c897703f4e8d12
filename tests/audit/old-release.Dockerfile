# Source pattern: research repositories of 2020 (torch 1.6 from torch_stable.html, the pytorch.org
# previous-versions command); the base moved to CUDA 11.0 while the wheel stayed a CUDA 10.1 build
FROM nvidia/cuda:11.0.3-cudnn8-devel-ubuntu18.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip git \
 && rm -rf /var/lib/apt/lists/*
RUN pip3 install --no-cache-dir torch==1.6.0+cu101 torchvision==0.7.0+cu101 \
      -f https://download.pytorch.org/whl/torch_stable.html
