# Source pattern: NGC-based training repositories of 2021: the base's torch, extra packages pinned
FROM nvcr.io/nvidia/pytorch:21.05-py3
RUN pip install --no-cache-dir timm==0.4.12 einops==0.3.0
