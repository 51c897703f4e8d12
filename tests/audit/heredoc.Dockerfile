# syntax=docker/dockerfile:1.7
FROM nvidia/cuda:12.8.1-base-ubuntu24.04
RUN <<EOF
set -e
apt-get update
apt-get install -y python3 python3-venv
python3 -m venv /opt/venv
/opt/venv/bin/pip install torch==2.8.0+cu126 --index-url https://download.pytorch.org/whl/cu128
EOF
RUN cat > /etc/profile.d/venv.sh <<'SH'
pip install torch
SH
