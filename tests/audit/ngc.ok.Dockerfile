# NGC's own PyTorch, extra packages only
FROM nvcr.io/nvidia/pytorch:25.12-py3
RUN pip install --no-cache-dir transformers==4.57.1
