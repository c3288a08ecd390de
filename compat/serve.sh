#!/usr/bin/env bash
# The README's run command, end to end: `serve up examples/local.yaml` in a scratch home on
# free loopback ports, then the Vercel AI SDK (its first call finds the service at zero
# replicas), curl and the official OpenAI Node client against the endpoint; then three more
# services at zero: a second generation model (the OpenAI SDK's responses.create first), a
# reranker and a Whisper model (replicasim -task score / transcription, arbiter.tasks
# declared) for rerank, score, tokenize and an audio transcription; then `serve down --all`,
# then a service of LoRA adapters at zero (lora.test.mjs); checking that no replica process
# is left.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/ ./cmd/serve ./cmd/replicasim ./cmd/router ./cmd/autoscaler
(cd compat && npm ci --no-audit --no-fund --loglevel=error)
export ARBITER_HOME
ARBITER_HOME=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
lp=$(port); cp=$(port); ap=$(port)
cleanup() {
  bin/serve down --all --wait 60s >/dev/null 2>&1 || true
  bin/serve stop >/dev/null 2>&1 || true
  rm -rf "$ARBITER_HOME"
}
trap cleanup EXIT
bin/serve up --listen "127.0.0.1:$lp" --control-listen "127.0.0.1:$cp" --admin "127.0.0.1:$ap" examples/local.yaml
model=$(sed -n 's/^ *model: *\([^ #]*\).*/\1/p' examples/local.yaml | head -1)
export ARBITER_URL="http://127.0.0.1:$lp/v1"
# The AI SDK's generateText is the first request: it wakes the service from zero.
(cd compat && ARBITER_MODEL="$model" node --test aisdk.test.mjs)
# curl, as the README shows it.
curl -sf "http://127.0.0.1:$lp/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":5}" | grep -q '"completion_tokens":5'
(cd compat && ARBITER_MODEL="$model" node --test serve.test.mjs && ARBITER_MODEL="$model" node --test responses.test.mjs)

# Three more services, each at zero replicas until its first request.
svc() { # name model task
  cat > "$ARBITER_HOME/$1.yaml" <<EOF
name: $1
run: exec replicasim -listen 127.0.0.1:\$PORT -model $2 -task $3 -profile h100-llama-3.2-1b
service:
  readiness_probe: /health
  replica_policy: {min_replicas: 0, max_replicas: 1}
arbiter:
  model: $2
  tasks: [$3]
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 4}
  readiness: {probe_interval_seconds: 1}
  local: {capacity: reserved, price_per_hour: 0}
EOF
  bin/serve up -d "$ARBITER_HOME/$1.yaml" >/dev/null
  for _ in $(seq 100); do curl -sf "$ARBITER_URL/models/$2" >/dev/null && return; sleep 0.1; done
  echo "the router never listed $2" >&2; exit 1
}
svc compat-gen compat-responses generate
svc compat-rerank compat-reranker score
svc compat-whisper compat-whisper transcription
(cd compat && ARBITER_MODEL=compat-responses node --test responses.test.mjs && ARBITER_MODEL=compat-responses node --test aisdk.test.mjs &&
  RERANK_MODEL=compat-reranker WHISPER_MODEL=compat-whisper TOKENIZE_MODEL="$model" node --test pooling.test.mjs)

# LoRA adapters (issue 51): one from the run: command's --lora-modules, as SkyPilot's
# fine-tuning example writes it (vllm serve: replicasim stands in for the vllm this machine
# lacks), and two in arbiter.adapters, loaded by the routers at run time; the service starts
# at zero. Each adapter is a folder as PEFT saves one.
for a in fin sql chat; do
  mkdir -p "$ARBITER_HOME/adapters/$a"
  echo '{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"]}' > "$ARBITER_HOME/adapters/$a/adapter_config.json"
  truncate -s 16M "$ARBITER_HOME/adapters/$a/adapter_model.safetensors"
done
cat > "$ARBITER_HOME/compat-lora.yaml" <<EOF
name: compat-lora
envs:
  LORA_NAME: compat-fin
run: |
  vllm serve compat-lora-base --tensor-parallel-size \$SKYPILOT_NUM_GPUS_PER_NODE \\
    --enable-lora --max-loras 2 --lora-modules \$LORA_NAME=$ARBITER_HOME/adapters/fin --port 8000
service:
  readiness_probe: /health
  replica_policy: {min_replicas: 0, max_replicas: 1}
arbiter:
  model: compat-lora-base
  adapters:
    - {name: compat-sql, source: $ARBITER_HOME/adapters/sql}
    - {name: compat-chat, source: $ARBITER_HOME/adapters/chat}
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 4}
  readiness: {probe_interval_seconds: 1}
  local: {capacity: reserved, price_per_hour: 0}
EOF
bin/serve up -d "$ARBITER_HOME/compat-lora.yaml" >/dev/null
for _ in $(seq 100); do curl -sf "$ARBITER_URL/models/compat-sql" >/dev/null && break; sleep 0.1; done
(cd compat && LORA_BASE=compat-lora-base LORA_ADAPTERS=compat-fin,compat-sql,compat-chat node --test lora.test.mjs)
# serve status counts each adapter's requests and tokens (the routers report every second).
adapters_counted() { bin/serve status | grep -Eq '^compat-lora +compat-sql +[1-9][0-9]* +[1-9]'; }
for _ in $(seq 100); do adapters_counted && break; sleep 0.1; done
adapters_counted || { bin/serve status; echo "serve status does not count compat-sql's requests and tokens" >&2; exit 1; }
bin/serve status
# Replicas carry ARBITER_OWNER=arbiter-<first 12 hex of sha256(home)> (control.Owner).
owner="arbiter-$(printf %s "$ARBITER_HOME" | sha256sum | cut -c1-12)"
before=$(grep -alz "^ARBITER_OWNER=$owner\$" /proc/[0-9]*/environ 2>/dev/null | wc -l || true)
[ "$before" -gt 0 ] || { echo "no replica process found before serve down: the leak check cannot see them" >&2; exit 1; }
bin/serve down --all
left=$(grep -alz "^ARBITER_OWNER=$owner\$" /proc/[0-9]*/environ 2>/dev/null | wc -l || true)
if [ "$left" != "0" ]; then echo "serve down left $left replica processes" >&2; exit 1; fi
echo "serve.sh: ok"
