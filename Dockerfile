# Image of stream-anon (used by docker-compose.yml). Two stages: the first builds the wheel from exactly the files
# tests/cli/test_wheel_install.py builds it from; the second installs only that wheel (and its pinned dependencies)
# into a slim runtime and runs as a non-root user. Nothing here has been built on the development machines (no
# Docker engine there): tests/cli/test_cli_and_config.py checks these steps against the wheel test, which runs them.

# ---- build: the wheel (the bundled topics, configs and data slices ship inside it)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY stream_anon ./stream_anon
COPY topics ./topics
COPY configs ./configs
COPY data ./data
RUN pip wheel --no-cache-dir --no-deps -w /dist .

# ---- runtime: the installed wheel, a non-root user, the state directory as a volume
FROM python:3.11-slim AS runtime
COPY --from=build /dist/ /tmp/dist/
RUN pip install --no-cache-dir "$(ls /tmp/dist/stream_anon-*.whl)[service,report]" \
    && rm -rf /tmp/dist \
    && useradd --create-home --uid 10001 --user-group anon \
    && mkdir -p /state \
    && chown anon:anon /state
# /state: worker checkpoints and DP budget ledgers (--state-dir /state). A named volume mounted here starts with
# this directory's owner (anon), so the non-root worker can write to it.
VOLUME ["/state"]
USER anon
WORKDIR /home/anon
ENV PYTHONUNBUFFERED=1
# The port a worker serves /metrics, /livez and /readyz on: the worker's default for --web-port (they bind
# 127.0.0.1, which is where this check runs). Liveness: /livez answers 200 while the worker's loop runs; the compose
# workers check readiness (/readyz) instead. tests/cli/test_wheel_install.py runs this CMD and this HEALTHCHECK against
# a worker of the installed wheel started with this environment and no --web-port.
ENV STREAM_ANON_WEB_PORT=6066
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['STREAM_ANON_WEB_PORT'] + '/livez', timeout=4)"]
ENTRYPOINT ["stream-anon"]
CMD ["--help"]
