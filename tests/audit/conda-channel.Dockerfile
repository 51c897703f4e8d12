# the pytorch channel stopped at 2.5
FROM debian:bookworm-slim
RUN micromamba install -y -n base -c pytorch pytorch=2.6.0 cpuonly python=3.11
