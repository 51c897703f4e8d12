FROM ubuntu:20.04
RUN conda create -y -p /opt/env python=3.10
RUN /opt/env/bin/pip install torch==2.7.0+cpu --index-url https://download.pytorch.org/whl/cpu
