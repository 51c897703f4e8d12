FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip \
      libnccl2=2.21.5-1+cuda12.4 libnccl-dev=2.21.5-1+cuda12.4
RUN pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124
