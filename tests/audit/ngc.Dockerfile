# NGC already ships PyTorch: a pip torch on top makes a second one
FROM nvcr.io/nvidia/pytorch:25.12-py3
RUN pip install --no-cache-dir torch==2.10.0 --index-url https://download.pytorch.org/whl/cu130
