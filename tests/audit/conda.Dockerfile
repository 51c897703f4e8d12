# conda's pytorch-cuda 12.1 on a CUDA 11.8 base
FROM nvidia/cuda:11.8.0-base-ubuntu22.04
RUN conda install -y -c pytorch -c nvidia pytorch==2.1.0 pytorch-cuda=12.1 python=3.10
