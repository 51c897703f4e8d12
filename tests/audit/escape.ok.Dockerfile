# ESCAPE=`
# Source pattern: escape=` continuation lines (Windows-style Dockerfiles); directive names are case-insensitive
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && `
    apt-get install -y --no-install-recommends python3-pip
RUN pip install torch==2.5.1+cu124 `
    --index-url https://download.pytorch.org/whl/cu124
