# ubuntu 20.04's Python is 3.8; torch 2.5 wheels start at 3.9
FROM ubuntu:20.04
RUN apt-get update && apt-get install -y python3 python3-pip
RUN pip3 install torch==2.5.1+cpu --index-url https://download.pytorch.org/whl/cpu
