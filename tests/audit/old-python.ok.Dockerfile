# Source pattern: 2020 inference images on the python image, torch 1.4.0 on Python 3.8
FROM python:3.8-slim-bullseye
RUN pip install --no-cache-dir torch==1.4.0 flask==1.1.2
