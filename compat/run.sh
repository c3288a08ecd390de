#!/usr/bin/env bash
# Runs the compat tests against the router in front of simulated replicas, all on loopback:
# openai.test.mjs and responses.test.mjs (the official OpenAI Node client), aisdk.test.mjs
# (the Vercel AI SDK's default provider, over the Responses API) with a generation model;
# pooling.test.mjs (rerank, score, tokenize, an audio transcription) with a reranker
# (replicasim -task score, which declares no tasks: the router learns from its refusals) and
# a Whisper model (-task transcription, declared). Installs the npm packages if needed.
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
rp=$(port); sp=$(port); wp=$(port); lp=$(port); ap=$(port)
bin/replicasim -listen "127.0.0.1:$rp" -model "$model" -profile h100-llama-3.2-1b -log-level warn & pids+=($!)
bin/replicasim -listen "127.0.0.1:$sp" -model compat-reranker -task score -profile h100-llama-3.2-1b -log-level warn & pids+=($!)
bin/replicasim -listen "127.0.0.1:$wp" -model compat-whisper -task transcription -profile h100-llama-3.2-1b -log-level warn & pids+=($!)
cat > "$tmp/replicas.yaml" <<EOF
replicas:
  - {id: r0, address: "127.0.0.1:$rp", model: $model, capacity: reserved}
  - {id: s0, address: "127.0.0.1:$sp", model: compat-reranker, capacity: reserved}
  - {id: w0, address: "127.0.0.1:$wp", model: compat-whisper, capacity: reserved, tasks: [transcription]}
EOF
bin/router -listen "127.0.0.1:$lp" -admin "127.0.0.1:$ap" -replicas "$tmp/replicas.yaml" -log-level warn & pids+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$lp/health" >/dev/null && curl -sf "http://127.0.0.1:$rp/health" >/dev/null &&
    curl -sf "http://127.0.0.1:$sp/health" >/dev/null && curl -sf "http://127.0.0.1:$wp/health" >/dev/null && break
  sleep 0.1
done
cd compat
export ARBITER_URL="http://127.0.0.1:$lp/v1" ARBITER_MODEL="$model"
REPLICA_URL="http://127.0.0.1:$rp" node --test openai.test.mjs
node --test responses.test.mjs
node --test aisdk.test.mjs
RERANK_MODEL=compat-reranker WHISPER_MODEL=compat-whisper TOKENIZE_MODEL="$model" node --test pooling.test.mjs
