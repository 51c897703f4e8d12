FROM debian:bookworm-slim
RUN micromamba install -y -n base -c pytorch pytorch=2.5.1 cpuonly python=3.11
