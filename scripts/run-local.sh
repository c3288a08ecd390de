#!/usr/bin/env bash
# Starts two simulated vLLM replicas (one "reserved", one "spot") and the router in front of
# them, on loopback, until Ctrl-C. Stand-in for `serve up` until the control plane lands.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/ ./cmd/replicasim ./cmd/router
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT INT TERM
bin/replicasim -listen 127.0.0.1:8001 -profile h100-llama-3.1-8b & pids+=($!)
bin/replicasim -listen 127.0.0.1:8002 -profile h200-llama-3.1-8b & pids+=($!)
bin/router -listen 127.0.0.1:8080 -admin 127.0.0.1:8082 -replicas examples/replicas.yaml & pids+=($!)
sleep 1
cat <<MSG

Arbiter router on http://127.0.0.1:8080/v1 (metrics: http://127.0.0.1:8082/metrics). Try:
  curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
Ctrl-C stops everything.
MSG
wait
