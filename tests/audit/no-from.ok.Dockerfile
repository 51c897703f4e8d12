ARG TORCH=2.5.1
FROM ubuntu:24.04
ARG TORCH
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install torch==${TORCH}+cpu --index-url https://download.pytorch.org/whl/cpu
