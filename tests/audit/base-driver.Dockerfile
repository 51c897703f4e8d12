# Source pattern: NGC 24.08 based services, audited with --driver 550.142 (the hosts' driver):
# the base image's CUDA 12.6 needs 560.28.03
FROM nvcr.io/nvidia/pytorch:24.08-py3
RUN pip install --no-cache-dir fastapi==0.112.0
