FROM nvidia/cuda:12.4.1-base-ubuntu22.04
<<<<<<< HEAD
RUN pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124
=======
RUN pip install torch==2.4.1+cu124 --index-url https://download.pytorch.org/whl/cu124
>>>>>>> upgrade-torch
