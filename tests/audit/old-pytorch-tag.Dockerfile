# Source pattern: 2019 repositories on the two-part pytorch/pytorch tags, torchvision pinned for another torch
FROM pytorch/pytorch:1.3-cuda10.1-cudnn7-devel
RUN pip install torchvision==0.5.0
