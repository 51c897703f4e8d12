# syntax=docker/dockerfile:1
# the venv is built on the devel image and copied into the base image
FROM nvidia/cuda:12.4.1-devel-ubuntu22.04 as Builder
RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/venv/bin/pip install torch==2.4.1+cu124 \
      --index-url https://download.pytorch.org/whl/cu124

FROM python:3.11-slim AS docs
RUN pip install torch sphinx

FROM nvidia/cuda:12.4.1-base-ubuntu22.04
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
