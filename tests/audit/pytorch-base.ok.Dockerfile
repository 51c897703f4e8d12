FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
RUN pip install torchvision==0.20.1 -r /tmp/requirements.txt
