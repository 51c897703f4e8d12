# escape=`
# Source pattern: a Dockerfile shared with Windows builds (escape=` so \ stays a path character);
# the RUN ending in \ is one build step, the next RUN is another one that installs a second torch
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip \
RUN pip install torch==2.5.1+cu121 --index-url https://download.pytorch.org/whl/cu121
