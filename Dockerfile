# ortserve on CPU: multi-stage, slim Python, non-root, the model repository as a volume.
#   docker build -t ortserve .
#   docker run -p 8000-8002:8000-8002 -v "$PWD/models:/models:ro" ortserve
# Flags go after the image name (`docker run ... ortserve --workers auto`) or in ORTSERVE_* variables.
# Stopping drains: SIGTERM, --shutdown-delay (5 s) then --shutdown-grace (30 s) for requests in
# flight. `docker stop` waits 10 s by default before SIGKILL: use `docker stop -t 40`
# (compose: stop_grace_period: 40s; Kubernetes: terminationGracePeriodSeconds, see the chart).
# The GPU variant is Dockerfile.gpu (docs/deploy.md).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ortserve
WORKDIR /src
# The dependency layer: every package pinned in constraints.txt (scripts/constraints.py), the
# otel extra's included. A source change does not re-resolve or reinstall them.
COPY constraints.txt ./
RUN /opt/ortserve/bin/pip install --no-cache-dir -r constraints.txt
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/ortserve/bin/pip install --no-cache-dir --no-deps ".[otel]" \
    && /opt/ortserve/bin/pip check

FROM python:3.11-slim
# No compilers or build files here: only the virtual environment built above.
COPY --from=build /opt/ortserve /opt/ortserve
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin ortserve \
    && mkdir /models && chown ortserve /models
ENV PATH=/opt/ortserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    ORTSERVE_HOST=0.0.0.0 \
    ORTSERVE_MODEL_REPOSITORY=/models
USER 10001
VOLUME ["/models"]
EXPOSE 8000 8001 8002
# Liveness of the HTTP port (readiness is for load balancers: a loading server is alive).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('ORTSERVE_HTTP_PORT', '8000'), timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["ortserve", "serve"]
