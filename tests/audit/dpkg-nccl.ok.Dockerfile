# Source pattern: dpkg -i of a package that is not NCCL
FROM nvidia/cuda:12.8.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN dpkg -i /tmp/site-tools_1.2.0-1_amd64.deb
RUN pip install torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128
