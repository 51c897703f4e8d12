FROM ubuntu:22.04
RUN apt-get update && apt-get install -y python3 python3-pip
RUN pip3 install torch==2.5.1+cpu --index-url https://download.pytorch.org/whl/cpu
