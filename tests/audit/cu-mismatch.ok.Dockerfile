# twin: the wheel's CUDA is the base's
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/*
RUN pip3 install --no-cache-dir torch==2.5.1+cu124 \
      --index-url https://download.pytorch.org/whl/cu124
