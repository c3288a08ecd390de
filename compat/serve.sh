#!/usr/bin/env bash
# The README's run command, end to end: `serve up examples/local.yaml` in a scratch home on
# free loopback ports, then curl and the official OpenAI Node client against the endpoint,
# then `serve down --all`, checking that no replica process is left.
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
# curl, as the README shows it (the first request wakes the service from zero).
curl -sf "http://127.0.0.1:$lp/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":5}" | grep -q '"completion_tokens":5'
(cd compat && ARBITER_URL="http://127.0.0.1:$lp/v1" ARBITER_MODEL="$model" node --test serve.test.mjs)
bin/serve status
# Replicas carry ARBITER_OWNER=arbiter-<first 12 hex of sha256(home)> (control.Owner).
owner="arbiter-$(printf %s "$ARBITER_HOME" | sha256sum | cut -c1-12)"
before=$(grep -alz "^ARBITER_OWNER=$owner\$" /proc/[0-9]*/environ 2>/dev/null | wc -l || true)
[ "$before" -gt 0 ] || { echo "no replica process found before serve down: the leak check cannot see them" >&2; exit 1; }
bin/serve down --all
left=$(grep -alz "^ARBITER_OWNER=$owner\$" /proc/[0-9]*/environ 2>/dev/null | wc -l || true)
if [ "$left" != "0" ]; then echo "serve down left $left replica processes" >&2; exit 1; fi
echo "serve.sh: ok"
