FROM nvidia/cuda:12.6.3-base-ubuntu24.04 AS base
ENV GLOO_SOCKET_IFNAME=eth0
FROM base AS torch
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126
FROM torch
CMD ["/opt/venv/bin/python"]
