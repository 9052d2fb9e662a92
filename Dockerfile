# Image for the lance-cdf services in docker-compose.yml.
FROM python:3.11-slim
# Java: the Spark driver of `lance-cdf publish`
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY lance_cdf lance_cdf
COPY schemas schemas
RUN pip install --no-cache-dir -e '.[all]'
ENV PYSPARK_PYTHON=python
