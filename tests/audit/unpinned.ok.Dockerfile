FROM nvidia/cuda:12.1.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch==2.1.0+cu121 torchvision==0.16.0+cu121 --index-url https://download.pytorch.org/whl/cu121
