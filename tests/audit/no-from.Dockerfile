# the FROM line was lost
ARG TORCH=2.5.1
RUN pip install torch==${TORCH}
