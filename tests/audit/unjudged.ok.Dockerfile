# Source pattern: 2020 lab images on a private base, torch 1.4.0 from PyPI (its default cu101 build)
FROM mycompany/train-base:2020
RUN pip install torch==1.4.0
