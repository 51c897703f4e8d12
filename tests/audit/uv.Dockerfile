# uv, told to take the best version of every index: PyPI can win
FROM nvidia/cuda:11.8.0-base-ubuntu22.04
RUN uv pip install --system --index-strategy unsafe-best-match \
      --extra-index-url https://download.pytorch.org/whl/cu118 torch==2.3.1
