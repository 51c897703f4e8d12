# Source pattern: a lab's own base image whose tag names its Python (py3.9), torch 1.4.0 from PyPI (wheels for 3.5-3.8)
FROM mycompany/train-base:2020-py3.9
RUN pip install torch==1.4.0
