# conda's Python 3.10 on ubuntu 18.04: torch 2.7 wheels are manylinux_2_28, 18.04 has glibc 2.27
FROM ubuntu:18.04
RUN conda create -y -p /opt/env python=3.10
RUN /opt/env/bin/pip install torch==2.7.0+cpu --index-url https://download.pytorch.org/whl/cpu
