FROM nvidia/cuda:12.1.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y python3-pip
RUN pip install torch torchvision
