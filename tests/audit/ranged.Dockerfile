# a range and an extra index: next month's torch from PyPI wins
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv
RUN /opt/venv/bin/pip install "torch>=2.0" --extra-index-url https://download.pytorch.org/whl/cpu
