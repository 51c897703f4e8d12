# Source pattern: 2019 NGC-based repositories keeping the base's torch (apex, DALI ship with it)
FROM nvcr.io/nvidia/pytorch:19.10-py3
RUN pip install tensorboardX==1.9
