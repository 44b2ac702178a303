# syntax=docker/dockerfile:1
# wafer in a container: built on Debian 12, run as a non-root user on Debian 12 slim.
#   docker build --build-arg GIT_COMMIT=$(git describe --always --dirty) -t wafer .
#   docker run -p 8080:8080 -v /srv/wafer.yaml:/etc/wafer/wafer.yaml:ro -v wafer-models:/var/lib/wafer/models wafer
#   docker run -p 8080:8080 -v wafer-models:/var/lib/wafer/models -e HF_TOKEN wafer \
#       serve --host 0.0.0.0 --port 8080 --model hf://OWNER/NAME:Q4_K_M
# The health check asks /ready on port 8080 (change it along with --port).

FROM debian:12 AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential ca-certificates libjansson-dev libfyaml-dev \
      libcurl4-openssl-dev libsqlite3-dev libhiredis-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# .git is not copied (.dockerignore): the commit for `wafer --version` comes from this argument
ARG GIT_COMMIT=unknown
RUN make -j"$(nproc)" GIT_COMMIT="$GIT_COMMIT" \
 && make install GIT_COMMIT="$GIT_COMMIT" PREFIX=/usr/local DESTDIR=/out

FROM debian:12-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libjansson4 libfyaml0 libcurl4 libsqlite3-0 \
      libhiredis0.14 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/wafer --create-home --shell /usr/sbin/nologin wafer \
 && mkdir -p /var/lib/wafer/models /etc/wafer \
 && chown wafer:wafer /var/lib/wafer/models
COPY --from=build /out/usr/local/ /usr/local/
RUN ldconfig
ENV WAFER_MODELS=/var/lib/wafer/models
USER wafer
WORKDIR /var/lib/wafer
VOLUME ["/var/lib/wafer/models"]
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
  CMD ["wafer", "client", "--url", "http://127.0.0.1:8080", "--retries", "0", "--timeout", "4", "get", "/ready"]
ENTRYPOINT ["wafer"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--config", "/etc/wafer/wafer.yaml"]
