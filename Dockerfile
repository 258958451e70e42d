# syntax=docker/dockerfile:1
# The ragtoll image: `docker build -t ghcr.io/ragtoll/ragtoll:0.1.0 .` (the Helm chart's default image).
#
# Two stages: the first builds wheels for ragtoll and its runtime dependencies (no test or
# local-embedder extras), the second installs only those wheels on a slim Python and runs as a
# non-root user. The chart runs it with a read-only root filesystem and an emptyDir on /tmp.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY instrumentation ./instrumentation
RUN pip wheel --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="ragtoll" \
      org.opencontainers.image.description="Transparent proxy that traces and budgets agentic RAG calls per task" \
      org.opencontainers.image.licenses="Apache-2.0"
# No .pyc writes (read-only root filesystem), logs straight to stdout/stderr.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels ragtoll \
 && groupadd --system --gid 10001 ragtoll \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ragtoll
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8787
# For plain `docker run`; Kubernetes uses the chart's probes instead.
HEALTHCHECK --interval=20s --timeout=3s --start-period=10s \
  CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8787/healthz', timeout=2)"]
ENTRYPOINT ["ragtoll"]
# Binds 127.0.0.1 by default (config server.host); in a container add `--host 0.0.0.0` or set
# server.host in the config file to publish the port.
CMD ["serve"]
