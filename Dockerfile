# Every Arbiter program, built static, on a small Debian base: the embedded daemon's local
# provider runs each replica's `run` with bash, and the cloud providers need CA
# certificates. By default the container runs the daemon (control plane and router) with
# its endpoint and admin port on every interface; `docker exec` runs the CLI against it.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 arbiter \
 && mkdir /data && chown arbiter /data
COPY --from=build /out/ /usr/local/bin/
COPY examples/ /usr/share/arbiter/examples/
USER arbiter
ENV ARBITER_HOME=/data
VOLUME /data
EXPOSE 8080 8082
ENTRYPOINT ["/usr/local/bin/serve"]
CMD ["daemon", "--listen", "0.0.0.0:8080", "--admin", "0.0.0.0:8082"]
