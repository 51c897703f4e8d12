# Source pattern: Horovod-era Dockerfiles that install NCCL from a downloaded .deb beside a pip torch
FROM nvidia/cuda:12.8.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN apt install -y ./libnccl2_2.6.4-1+cuda9.1_amd64.deb
RUN pip install torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128
