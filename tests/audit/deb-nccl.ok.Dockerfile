# Source pattern: a .deb that is not NCCL (a site's own tool) beside a pip torch
FROM nvidia/cuda:12.8.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN apt install -y ./site-tools_1.2.0-1_amd64.deb
RUN pip install torch==2.7.1+cu128 --index-url https://download.pytorch.org/whl/cu128
