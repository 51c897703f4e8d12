# Source pattern: 2020 inference images on the python image; the base moved to Python 3.9 while torch
# stayed at 1.4.0 (wheels for Python 3.5 to 3.8: pip finds none)
FROM python:3.9-slim-bullseye
RUN pip install --no-cache-dir torch==1.4.0 flask==1.1.2
