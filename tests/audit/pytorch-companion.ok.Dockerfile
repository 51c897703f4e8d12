# Source pattern: pytorch/pytorch-based Dockerfiles of 2021, torchaudio pinned to the base's torch
FROM pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime
RUN pip install torchaudio==0.9.0 librosa==0.8.1
