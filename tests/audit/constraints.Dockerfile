# Source pattern: unpinned install, versions from a constraints file (pip -c, "constraints.txt" of CI images)
FROM nvidia/cuda:12.4.1-base-ubuntu22.04
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip
COPY context/constraints-cu121.txt /tmp/constraints.txt
RUN pip install torch -c /tmp/constraints.txt --index-url https://download.pytorch.org/whl/cu121
