# Source pattern: miniconda on a CUDA base, "conda env create -f environment.yml" (research repositories)
FROM nvidia/cuda:11.8.0-base-ubuntu22.04
COPY context/environment-cu121.yml /tmp/environment.yml
RUN conda env create -f /tmp/environment.yml
