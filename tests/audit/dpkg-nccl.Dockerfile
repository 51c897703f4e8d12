# Source pattern: "dpkg -i libnccl2_*.deb libnccl-dev_*.deb" of NCCL-from-a-tarball Dockerfiles
FROM nvidia/cuda:12.8.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN dpkg -i /tmp/nccl/libnccl2_*.deb /tmp/nccl/libnccl-dev_*.deb
RUN pip install torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128
