FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu
ENV GLOO_SOCKET_IFNAME=lo NCCL_DEBUG=INFO
ENV TP_SOCKET_IFNAME lo
