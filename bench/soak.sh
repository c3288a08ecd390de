#!/usr/bin/env bash
# Bounded soak of serve's daemon under mixed load while replicas are killed and added
# (see bench/soak/main.go and bench/docs/soak.md). Flags go to the soak program.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
mkdir -p bin
go build -o bin/ ./cmd/serve ./cmd/replicasim ./bench/soak
bin/soak -bin bin "$@"
