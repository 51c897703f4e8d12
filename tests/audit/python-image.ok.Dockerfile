# the python image's own Python 3.12 (not Debian's 3.11) is fine for wheels
FROM python:3.12-slim-bookworm
RUN pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu
