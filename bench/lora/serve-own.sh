#!/usr/bin/env bash
# A hot adapter's own replicas through `serve up` (issue 51), about 4 minutes: the local
# provider, replicasim standing in for vllm, a service whose adapter fin has a merged
# checkpoint (a folder whose config.json names its base model), and 16 clients calling fin
# for 150 s. It prints the replicas every 6 s, then the control plane's scale events: fin's
# own replicas launch as its load grows, the shared ones shrink, and fin's own go again
# after the load, a step per downscale delay.
#
#   go build -o bin/ ./cmd/serve ./cmd/replicasim ./cmd/router ./cmd/autoscaler && bash bench/lora/serve-own.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export ARBITER_HOME
ARBITER_HOME=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
lp=$(port); cp=$(port); ap=$(port)
cleanup() { bin/serve down --all --wait 60s >/dev/null 2>&1 || true; bin/serve stop >/dev/null 2>&1 || true; rm -rf "$ARBITER_HOME"; }
trap cleanup EXIT
mkdir -p "$ARBITER_HOME/adapters/fin" "$ARBITER_HOME/merged/fin"
echo '{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"]}' > "$ARBITER_HOME/adapters/fin/adapter_config.json"
truncate -s 16M "$ARBITER_HOME/adapters/fin/adapter_model.safetensors"
echo '{"_name_or_path": "meta-llama/Llama-3.2-1B-Instruct", "architectures": ["LlamaForCausalLM"], "model_type": "llama"}' > "$ARBITER_HOME/merged/fin/config.json"
cat > "$ARBITER_HOME/svc.yaml" <<EOT
name: own
run: vllm serve meta-llama/Llama-3.2-1B-Instruct --port \$PORT --enable-lora --max-loras 2
service:
  readiness_probe: /health
  replica_policy: {min_replicas: 1, max_replicas: 4, upscale_delay_seconds: 10, downscale_delay_seconds: 30}
arbiter:
  model: meta-llama/Llama-3.2-1B-Instruct
  adapters:
    - {name: fin, source: $ARBITER_HOME/adapters/fin, merged: $ARBITER_HOME/merged/fin}
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 4, stable_window_seconds: 20}
  readiness: {probe_interval_seconds: 1}
  local: {capacity: on_demand, price_per_hour: 1}
EOT
bin/serve validate "$ARBITER_HOME/svc.yaml"
bin/serve up --listen "127.0.0.1:$lp" --control-listen "127.0.0.1:$cp" --admin "127.0.0.1:$ap" --wait 3m "$ARBITER_HOME/svc.yaml"
python3 - "$lp" <<'PY' &
import sys, threading, time, urllib.request, json
url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"
stop = time.time() + 150
stats = {"ok": 0, "err": 0}
def worker():
    while time.time() < stop:
        body = json.dumps({"model": "fin", "prompt": "hello " * 200, "max_tokens": 200}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body, {"Content-Type": "application/json"}), timeout=120) as r:
                r.read(); stats["ok"] += 1
        except Exception as e:
            stats["err"] += 1; print("error", e, flush=True)
ts = [threading.Thread(target=worker) for _ in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
print("load done", stats, flush=True)
PY
load=$!
for i in $(seq 30); do sleep 6; echo "--- t=$((i*6))s"; (bin/serve status 2>&1 | grep -E "^own +own-" || true); done
wait $load
for i in $(seq 20); do sleep 6; echo "--- after the load, t=$((i*6))s"; (bin/serve status 2>&1 | grep -E "^own +own-" || true); done
echo "=== scale events"
grep -E 'msg=scale' "$ARBITER_HOME/daemon.log" | sed 's/.*service=own //' | cut -c1-220
