#!/usr/bin/env bash
# Runs compat/openai.test.mjs (the official OpenAI Node client) against the router in front
# of a simulated replica, all on loopback. Installs the npm package if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/ ./cmd/replicasim ./cmd/router
(cd compat && npm ci --no-audit --no-fund --loglevel=error)
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model=compat-model
rp=$(port); lp=$(port); ap=$(port)
bin/replicasim -listen "127.0.0.1:$rp" -model "$model" -profile h100-llama-3.2-1b -log-level warn & pids+=($!)
printf 'replicas:\n  - {id: r0, address: "127.0.0.1:%s", model: %s, capacity: reserved}\n' "$rp" "$model" > "$tmp/replicas.yaml"
bin/router -listen "127.0.0.1:$lp" -admin "127.0.0.1:$ap" -replicas "$tmp/replicas.yaml" -log-level warn & pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$lp/health" >/dev/null && curl -sf "http://127.0.0.1:$rp/health" >/dev/null && break
  sleep 0.1
done
cd compat
ARBITER_URL="http://127.0.0.1:$lp/v1" REPLICA_URL="http://127.0.0.1:$rp" ARBITER_MODEL="$model" node --test openai.test.mjs
