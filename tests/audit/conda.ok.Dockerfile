FROM nvidia/cuda:11.8.0-base-ubuntu22.04
RUN conda install -y -c pytorch -c nvidia pytorch==2.1.0 pytorch-cuda=11.8 python=3.10
