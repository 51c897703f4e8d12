# Source pattern: NGC-based training repositories of 2021 that also pip-install torch (the base ships one)
FROM nvcr.io/nvidia/pytorch:21.05-py3
RUN pip install torch==1.8.1+cu102 -f https://download.pytorch.org/whl/torch_stable.html
