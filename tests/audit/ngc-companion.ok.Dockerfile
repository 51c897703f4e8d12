# Source pattern: NGC-based fine-tuning repositories of 2024 (the image ships torchvision and torchaudio)
FROM nvcr.io/nvidia/pytorch:24.08-py3
RUN pip install --no-cache-dir transformers==4.44.2
