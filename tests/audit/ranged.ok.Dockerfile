# an exact local-version pin: an extra index beside PyPI is no risk
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv
RUN /opt/venv/bin/pip install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
