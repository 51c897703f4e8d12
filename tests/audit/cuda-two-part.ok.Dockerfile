# Source pattern: 2020 Dockerfiles on the two-part nvidia/cuda tags (11.0-devel-ubuntu20.04), the cu110 wheel
FROM nvidia/cuda:11.0-devel-ubuntu20.04
RUN apt-get update && apt-get install -y python3-pip && rm -rf /var/lib/apt/lists/*
RUN pip3 install torch==1.7.1+cu110 -f https://download.pytorch.org/whl/torch_stable.html
