# Source pattern: pytorch/pytorch-based Dockerfiles of 2021 with an unpinned torchaudio
FROM pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime
RUN pip install torchaudio librosa==0.8.1
