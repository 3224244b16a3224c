# traefik-etcd-exporter: small, non-root, no test extras and no embedded binaries.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY templates ./templates
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home exporter
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
WORKDIR /etc/exporter
EXPOSE 8570 8571
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8571/healthz', timeout=2)"]
ENTRYPOINT ["traefik-etcd-exporter", "run", "--config", "/etc/exporter/exporter.yaml"]
