# Source pattern: 2018 lab images on a private base, torch 0.4.1 from PyPI: neither the release (before
# envbuild's facts), its build nor the base's CUDA and OS are known, so nothing can be judged (3)
FROM mycompany/train-base:2018
RUN pip install torch==0.4.1
