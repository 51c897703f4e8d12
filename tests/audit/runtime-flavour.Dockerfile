# the runtime flavour ships libnccl2 2.25.1 beside the wheel's 2.27.3
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv
RUN /opt/venv/bin/pip install torch==2.8.0 --index-url https://download.pytorch.org/whl/cu128
