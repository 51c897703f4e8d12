# Source pattern: mamba env create --file environment.yml on a CUDA base
FROM nvidia/cuda:11.8.0-base-ubuntu22.04
COPY context/environment-cu118.yml /tmp/environment.yml
RUN mamba env create --file /tmp/environment.yml
