# Source pattern: NGC base with requirements files (one -r nested) COPYed whole into the image
FROM nvcr.io/nvidia/pytorch:25.12-py3
COPY context/ /opt/reqs/
RUN pip install --no-cache-dir -r /opt/reqs/requirements-extras.txt
