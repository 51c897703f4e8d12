# Source pattern: a series pin "torch==2.4.*" (pip takes the newest 2.4 release) with the wheel index of another CUDA
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN pip install "torch==2.4.*" --index-url https://download.pytorch.org/whl/cu121
