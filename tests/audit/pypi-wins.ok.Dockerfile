FROM nvidia/cuda:11.8.0-base-ubuntu22.04
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch==2.1.0 --index-url https://download.pytorch.org/whl/cu118
