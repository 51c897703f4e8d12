# Source pattern: a lab's own base image whose tag names its Python (py38), torch 1.4.0 from PyPI (wheels for 3.5-3.8)
FROM mycompany/train-base:2020-py38
RUN pip install torch==1.4.0
