# the python image's 3.8 has no torch 2.5 wheel
FROM python:3.8-slim-bookworm
RUN pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu
