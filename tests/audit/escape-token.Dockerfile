# syntax=docker/dockerfile:1
# escape=x
# Source pattern: a typo in the escape directive; Docker refuses the file ("invalid escape token")
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
RUN pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124
