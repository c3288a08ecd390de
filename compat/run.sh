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
# Ready means ready to the router: every replica available in its admin view (its probe has
# seen the replica answer), not only each process's /health, which answers before the router's
# first probe (a 2-core CI run once sent the first chat 40 ms before it, and got 503s).
nrep=$(grep -c '{id:' "$tmp/replicas.yaml")
all_ready() {
  curl -sf "http://127.0.0.1:$ap/replicas" | python3 -c 'import json, sys
r = json.load(sys.stdin) or []
sys.exit(0 if len(r) == int(sys.argv[1]) and all(x["available"] for x in r) else 1)' "$nrep"
}
for _ in $(seq 600); do all_ready && break; sleep 0.1; done
all_ready || { echo "compat/run.sh: the router did not see its $nrep replicas ready within 60 s: $(curl -s "http://127.0.0.1:$ap/replicas")" >&2; exit 1; }
cd compat
export ARBITER_URL="http://127.0.0.1:$lp/v1" ARBITER_MODEL="$model"
REPLICA_URL="http://127.0.0.1:$rp" node --test openai.test.mjs
node --test responses.test.mjs
node --test aisdk.test.mjs
RERANK_MODEL=compat-reranker WHISPER_MODEL=compat-whisper TOKENIZE_MODEL="$model" node --test pooling.test.mjs
