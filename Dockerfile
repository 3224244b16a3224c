# traefik-etcd-exporter: small, non-root, no test extras and no embedded binaries; the `otel` extra
# is in (tracing stays off, and OpenTelemetry unimported, until `otel.enabled`).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY templates ./templates
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[otel]'

FROM python:3.11-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="traefik-etcd-exporter" \
      org.opencontainers.image.description="Keeps Traefik's etcd keys equal to the ingresses a coordinator pushes, health-checking the upstreams itself" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/quickstart.md in the source tree"
RUN useradd --system --uid 10001 --no-create-home exporter
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# A read-only root filesystem (compose): nothing to write, not even bytecode.
ENV PYTHONDONTWRITEBYTECODE=1
USER 10001
WORKDIR /etc/exporter
EXPOSE 8570 8571
# Reads control.listen (and its TLS) from the same config the daemon runs with.
HEALTHCHECK --interval=10s --timeout=5s --retries=3 \
  CMD ["traefik-etcd-exporter", "healthcheck", "--config", "/etc/exporter/exporter.yaml"]
ENTRYPOINT ["traefik-etcd-exporter", "run", "--config", "/etc/exporter/exporter.yaml"]
