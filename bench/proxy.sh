#!/usr/bin/env bash
# Router vs nginx on the same echo replicas, plus a 5,000-stream SSE soak. Installs nginx
# and wrk from Debian if missing. Prints Markdown tables (see bench/docs/proxy.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk >/dev/null
fi
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
mkdir -p bin
go build -o bin/ ./cmd/replicasim ./cmd/router ./bench/proxybench
bin/proxybench -bin bin "$@"
