# Source pattern: 2019 NGC-based repositories reinstalling torch from PyPI over the base's own build
FROM nvcr.io/nvidia/pytorch:19.10-py3
RUN pip install torch==1.3.0 torchvision==0.4.1
