#!/usr/bin/env bash
# Builds the real Kubernetes control plane the kubernetes provider's tests run against
# (kube-apiserver, kube-scheduler and kubectl v1.37.2, etcd v3.6.16, kwok v0.8.0), all from
# Go modules, into a cache outside the checkout keyed by those versions, and prints the
# cache folder on its last line. This script is the cache's only writer: it builds into a
# temporary folder and renames it into place, under a lock, so a half-built cache is never
# seen and two runs never build at once. About 7 minutes cold on 2 cores; instant warm.
#
#   bash scripts/kube-bins.sh            # build if missing, print the folder
#   ARBITER_KUBE_CACHE=/path bash ...    # cache root (default ~/.cache/arbiter/kube)
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

K8S=v1.37.2
STAGING=v0.37.2 # the published version of every k8s.io/<m> staging module of $K8S
ETCD=v3.6.16
KWOK=v0.8.0
root=${ARBITER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/arbiter/kube}
dir="$root/k8s-$K8S-etcd-$ETCD-kwok-$KWOK"

if [ -f "$dir/.complete" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [ -f "$dir/.complete" ]; then # built by the run we waited for
  echo "$dir"
  exit 0
fi

work=$(mktemp -d "$root/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out/bin" "$work/out/stages"
gomodcache=$(go env GOMODCACHE)
log() { echo "kube-bins: $*" >&2; }

# kube-apiserver, kube-scheduler, kubectl: `go install k8s.io/kubernetes/cmd/...` refuses the
# module's replace directives (its staging modules live in its own tree), so a wrapper
# module requires it and points each staging module at its published version.
log "building kube-apiserver, kube-scheduler, kubectl $K8S (about 5 minutes cold)"
start=$SECONDS
go mod download k8s.io/kubernetes@$K8S
kmod="$gomodcache/cache/download/k8s.io/kubernetes/@v/$K8S.mod"
mkdir -p "$work/k8s"
(
  cd "$work/k8s"
  {
    echo "module arbiter.local/kubebins"
    echo "go 1.26.0"
    echo "require k8s.io/kubernetes $K8S"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"$STAGING"'#p' "$kmod"
  } >go.mod
  n=$(grep -c '^replace' go.mod)
  [ "$n" -ge 30 ] || { log "found only $n staging replaces in $kmod"; exit 1; }
  cat >tools.go <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
EOF
  go mod tidy -e >/dev/null 2>&1 || true
  go mod tidy
  minor=${K8S#v1.}
  minor=${minor%%.*}
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1"
  ld="$ld -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S"
  go build -tags tools -ldflags "$ld" -o "$work/out/bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
)
log "kubernetes binaries built in $((SECONDS - start)) s"

# etcd 3.6 (Debian's 3.4 makes every client-go informer fall back from watch progress
# requests): the server module's replaces point at sibling folders, so the same trick.
log "building etcd $ETCD"
start=$SECONDS
mkdir -p "$work/etcd"
(
  cd "$work/etcd"
  cat >go.mod <<EOF
module arbiter.local/etcdbin
go 1.26.0
require go.etcd.io/etcd/server/v3 $ETCD
replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD
replace go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD
replace go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD
replace go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD
EOF
  cat >tools.go <<'EOF'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
  go mod tidy
  go build -tags tools -ldflags "-s -w" -o "$work/out/bin/etcd" go.etcd.io/etcd/server/v3
)
log "etcd built in $((SECONDS - start)) s"

log "building kwok $KWOK"
start=$SECONDS
GOBIN="$work/out/bin" go install -ldflags "-s -w" sigs.k8s.io/kwok/cmd/kwok@$KWOK
go mod download sigs.k8s.io/kwok@$KWOK
# kwok's stages (how fake nodes get Ready and fake pods run and end) ship in its module.
for s in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  src="$gomodcache/sigs.k8s.io/kwok@$KWOK/kustomize/stage/$s"
  [ -f "$src" ] || { log "missing kwok stage $src"; exit 1; }
  cp "$src" "$work/out/stages/"
done
chmod -R u+w "$work/out/stages"
log "kwok built in $((SECONDS - start)) s"

for b in kube-apiserver kube-scheduler kubectl etcd kwok; do
  "$work/out/bin/$b" --version >/dev/null 2>&1 || "$work/out/bin/$b" version --client >/dev/null 2>&1 ||
    { log "$b does not run"; exit 1; }
done
touch "$work/out/.complete"
rm -rf "$dir"
mv "$work/out" "$dir"
echo "$dir"
