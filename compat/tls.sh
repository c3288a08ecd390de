#!/usr/bin/env bash
# service.tls end to end: certificates made now (compat/mkcert.go: a test CA and a leaf for
# 127.0.0.1), `serve up` of a file whose service.tls names them, then curl and the official
# OpenAI Node client over HTTPS trusting only that CA; then the pair is rotated in place
# and new connections must get the new certificate, without a restart.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/ ./cmd/serve ./cmd/replicasim
[ -d compat/node_modules/openai ] || (cd compat && npm ci --no-audit --no-fund --loglevel=error)
export ARBITER_HOME
ARBITER_HOME=$(mktemp -d)
certs=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
lp=$(port); cp=$(port); ap=$(port)
cleanup() {
  bin/serve down --all --wait 60s >/dev/null 2>&1 || true
  bin/serve stop >/dev/null 2>&1 || true
  rm -rf "$ARBITER_HOME" "$certs"
}
trap cleanup EXIT
go run compat/mkcert.go -dir "$certs" -serial 1
model=tls-model
cat > "$certs/service.yaml" <<YAML
name: tls
run: exec replicasim -listen 127.0.0.1:\$PORT -model $model -profile h100-llama-3.2-1b
service:
  readiness_probe: /health
  replicas: 1
  tls:
    keyfile: $certs/key.pem
    certfile: $certs/cert.pem
arbiter:
  model: $model
  readiness: {probe_interval_seconds: 1}
YAML
bin/serve up --listen "127.0.0.1:$lp" --control-listen "127.0.0.1:$cp" --admin "127.0.0.1:$ap" "$certs/service.yaml"
endpoint=$(bin/serve status --endpoint tls)
[ "$endpoint" = "https://127.0.0.1:$lp" ] || { echo "serve status --endpoint: $endpoint, want https://127.0.0.1:$lp" >&2; exit 1; }
curl -sf --cacert "$certs/ca.pem" "$endpoint/v1/models" | grep -q "\"$model\""
if curl -s -o /dev/null "http://127.0.0.1:$lp/v1/models"; then
  echo "plain HTTP was answered on the TLS endpoint" >&2; exit 1
fi
served_serial() { openssl s_client -connect "127.0.0.1:$lp" -CAfile "$certs/ca.pem" </dev/null 2>/dev/null | openssl x509 -noout -serial | cut -d= -f2; }
(cd compat && NODE_EXTRA_CA_CERTS="$certs/ca.pem" ARBITER_URL="$endpoint/v1" ARBITER_MODEL="$model" WANT_SERIAL=01 node --test tls.test.mjs)
# Rotation: a new leaf written over the pair; the router reads it within a second or two.
go run compat/mkcert.go -dir "$certs" -serial 2
for _ in $(seq 100); do [ "$(served_serial)" = "02" ] && break; sleep 0.1; done
[ "$(served_serial)" = "02" ] || { echo "after rotation the endpoint serves serial $(served_serial), want 02" >&2; exit 1; }
(cd compat && NODE_EXTRA_CA_CERTS="$certs/ca.pem" ARBITER_URL="$endpoint/v1" ARBITER_MODEL="$model" WANT_SERIAL=02 node --test tls.test.mjs)
bin/serve down --all
echo "tls.sh: ok"
