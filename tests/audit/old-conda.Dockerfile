# Source pattern: conda-based Dockerfiles of 2021-2022 (pytorch==1.10.1 with cudatoolkit from -c pytorch);
# the cudatoolkit names CUDA 10.2 on a CUDA 11.3 base
FROM nvidia/cuda:11.3.1-cudnn8-runtime-ubuntu20.04
RUN conda install -y -c pytorch pytorch==1.10.1 torchvision==0.11.2 cudatoolkit=10.2
