# Image for the lance-cdf services in docker-compose.yml.
FROM python:3.11-slim
# gcc + libc6-dev: the encoder's compiled join and planning's decoders (setup.py; optional,
# Python falls back)
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY lance_cdf lance_cdf
COPY schemas schemas
RUN pip install --no-cache-dir -e .
ENV PYSPARK_PYTHON=python
