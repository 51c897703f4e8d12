# Source pattern: NGC base with a requirements.txt beside the Dockerfile, COPY then pip install -r
# (research repositories' docker/Dockerfile + requirements.txt layout); the file pins torch again
FROM nvcr.io/nvidia/pytorch:25.12-py3
WORKDIR /workspace
COPY context/requirements-train.txt requirements.txt
RUN pip install --no-cache-dir -r requirements.txt
