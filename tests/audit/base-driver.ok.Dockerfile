# Source pattern: NGC 24.05 based services, audited with --driver 550.142: CUDA 12.4.1 runs on it
FROM nvcr.io/nvidia/pytorch:24.05-py3
RUN pip install --no-cache-dir fastapi==0.112.0
