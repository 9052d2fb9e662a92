# Image for the lance-cdf services in docker-compose.yml.
FROM python:3.11-slim
# Java: the Spark driver of `lance-cdf publish`; gcc + libc6-dev: planning's C readers
# (setup.py; optional, protobuf reads everything without them, slower on long histories)
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY lance_cdf lance_cdf
COPY schemas schemas
RUN pip install --no-cache-dir -e '.[all]'
ENV PYSPARK_PYTHON=python
