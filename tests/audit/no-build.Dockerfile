# torch 2.5.1 has no cu126 build: pip finds nothing on that index
FROM nvidia/cuda:12.6.3-base-ubuntu24.04
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv
RUN /opt/venv/bin/pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu126
