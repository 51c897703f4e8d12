# Source pattern: an optional pin from a build argument, "[ ${#V} -gt 0 ] && P=... || P=torch"
# (CI images that pin only when a version is given); here the version is set, on a CUDA 12.4 base
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
ARG TORCH_VERSION=2.5.1
ARG CU=121
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN [ ${#TORCH_VERSION} -gt 0 ] && P="torch==${TORCH_VERSION}+cu${CU}" || P='torch'; \
    pip install "$P" --index-url https://download.pytorch.org/whl/cu${CU}
