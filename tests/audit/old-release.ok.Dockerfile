# Source pattern: research repositories of 2020 (torch 1.6 from torch_stable.html, the pytorch.org
# previous-versions command) on the matching CUDA 10.1 devel image
FROM nvidia/cuda:10.1-cudnn7-devel-ubuntu18.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip git \
 && rm -rf /var/lib/apt/lists/*
RUN pip3 install --no-cache-dir torch==1.6.0+cu101 torchvision==0.7.0+cu101 \
      -f https://download.pytorch.org/whl/torch_stable.html
