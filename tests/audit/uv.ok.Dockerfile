# uv takes torch from the first index that has it: the extra index wins
FROM nvidia/cuda:11.8.0-base-ubuntu22.04
RUN uv pip install --system --extra-index-url https://download.pytorch.org/whl/cu118 torch==2.3.1
