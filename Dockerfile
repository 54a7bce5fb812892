# Image of the stream-anon worker (used by docker-compose.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_anon ./stream_anon
COPY topics ./topics
COPY configs ./configs
RUN pip install --no-cache-dir .
ENTRYPOINT ["stream-anon"]
