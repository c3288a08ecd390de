#!/usr/bin/env bash
# Builds the real Kubernetes control plane the kubernetes provider's tests run against
# (kube-apiserver, kube-scheduler and kubectl, etcd and kwok, and Karpenter's controller
# with its KWOK provider, at the versions that
# kubetest.Versions in replicas/kubernetes/kubetest/cluster.go names), all from Go modules,
# into a cache outside the checkout keyed by those versions, and prints the cache folder on
# its last line: the folder the tests look in (kubetest.DefaultDir). This script is the
# cache's only writer: it builds into a temporary folder and renames it into place, under a
# lock, so a half-built cache is never seen and two runs never build at once. About 6
# minutes cold on 2 cores; instant warm.
#
#   bash scripts/kube-bins.sh            # build if missing, print the folder
#   ARBITER_KUBE_CACHE=/path bash ...    # cache root (default ~/.cache/arbiter/kube)
set -euo pipefail
export PATH="$PATH:/usr/local/go/bin"

log() { echo "kube-bins: $*" >&2; }

# The versions, and the folder's name, are kubetest.Versions: the tests look for the folder
# by that constant, so reading it here is what keeps the two from drifting apart.
versions_go="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/replicas/kubernetes/kubetest/cluster.go"
name=$(sed -n 's/^const Versions = "\([^"]*\)"$/\1/p' "$versions_go")
if [[ ! $name =~ ^k8s-(v1\.[0-9]+\.[0-9]+)-etcd-(v[0-9.]+)-kwok-(v[0-9.]+)-karpenter-(v[0-9.]+)-noopt$ ]]; then
  log "cannot read the versions from $versions_go: want one line const Versions = \"k8s-v1.X.Y-etcd-vA.B.C-kwok-vD.E.F-karpenter-vG.H.I-noopt\", found \"$name\""
  exit 1
fi
K8S=${BASH_REMATCH[1]}
STAGING=v0.${K8S#v1.} # the published version of every k8s.io/<m> staging module of $K8S
ETCD=${BASH_REMATCH[2]} # the etcd server kubernetes $K8S itself requires
KWOK=${BASH_REMATCH[3]}
KARPENTER=${BASH_REMATCH[4]}
root=${ARBITER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/arbiter/kube}
# Compiled without optimisation or inlining (-N -l): a fifth less compile time cold, and
# these binaries only serve a test cluster's handful of objects. The name's -noopt says so.
GCFLAGS='all=-N -l'
dir="$root/$name"

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

# One wrapper module builds all five: `go install k8s.io/kubernetes/cmd/...` refuses the
# module's replace directives (its staging modules live in its own tree), so the wrapper
# requires it and points each staging module at its published version. etcd and KWOK join
# the same module so that the packages they share with Kubernetes (client-go, apimachinery,
# grpc, otel…) are compiled once, at the versions Kubernetes itself requires: etcd at the
# server version kubernetes' go.mod names, KWOK against the same client-go.
log "building kube-apiserver, kube-scheduler, kubectl $K8S, etcd $ETCD, kwok $KWOK (about 6 minutes cold on 2 cores)"
start=$SECONDS
go mod download k8s.io/kubernetes@$K8S
kmod="$gomodcache/cache/download/k8s.io/kubernetes/@v/$K8S.mod"
grep -q "go.etcd.io/etcd/server/v3 $ETCD\b" "$kmod" || { log "kubernetes $K8S does not require etcd server $ETCD: update ETCD"; exit 1; }
mkdir -p "$work/mod"
(
  cd "$work/mod"
  {
    echo "module arbiter.local/kubebins"
    echo "go 1.26.0"
    echo "require ("
    echo "	k8s.io/kubernetes $K8S"
    echo "	go.etcd.io/etcd/server/v3 $ETCD"
    echo "	sigs.k8s.io/kwok $KWOK"
    echo ")"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"$STAGING"'#p' "$kmod"
  } >go.mod
  n=$(grep -c '^replace' go.mod)
  [ "$n" -ge 30 ] || { log "found only $n staging replaces in $kmod"; exit 1; }
  cat >tools.go <<'EOT'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
EOT
  go mod tidy
  minor=${K8S#v1.}
  minor=${minor%%.*}
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1"
  ld="$ld -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S"
  go build -tags tools -gcflags "$GCFLAGS" -ldflags "$ld" -o "$work/out/bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3 sigs.k8s.io/kwok/cmd/kwok
  mv "$work/out/bin/server" "$work/out/bin/etcd"
)
log "built in $((SECONDS - start)) s"

# Karpenter's controller with its KWOK cloud provider (the tests' on-demand capacity: it
# creates KWOK nodes for pending pods), in a module of its own: it is built against another
# Kubernetes client than the five above. Its CRDs, and its KWOKNodeClass's, ship in its module.
log "building Karpenter $KARPENTER's controller (KWOK provider)"
kstart=$SECONDS
mkdir -p "$work/karpenter" "$work/out/karpenter"
(
  cd "$work/karpenter"
  printf 'module arbiter.local/karpenterkwok\n\ngo 1.26.0\n\nrequire sigs.k8s.io/karpenter %s\n' "$KARPENTER" >go.mod
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/karpenter/kwok"\n' >tools.go
  go mod tidy
  go build -tags tools -gcflags "$GCFLAGS" -ldflags "-s -w" -o "$work/out/bin/karpenter-kwok" sigs.k8s.io/karpenter/kwok
)
kmod="$gomodcache/sigs.k8s.io/karpenter@$KARPENTER"
for crd in pkg/apis/crds/karpenter.sh_nodepools.yaml pkg/apis/crds/karpenter.sh_nodeclaims.yaml pkg/apis/crds/karpenter.sh_nodeoverlays.yaml \
  kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml; do
  [ -f "$kmod/$crd" ] || { log "missing Karpenter CRD $kmod/$crd"; exit 1; }
  cp "$kmod/$crd" "$work/out/karpenter/"
done
chmod -R u+w "$work/out/karpenter"
log "Karpenter built in $((SECONDS - kstart)) s"

# kwok's stages (how fake nodes get Ready and fake pods run and end) ship in its module.
go mod download sigs.k8s.io/kwok@$KWOK
for s in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  src="$gomodcache/sigs.k8s.io/kwok@$KWOK/kustomize/stage/$s"
  [ -f "$src" ] || { log "missing kwok stage $src"; exit 1; }
  cp "$src" "$work/out/stages/"
done
chmod -R u+w "$work/out/stages"

for b in kube-apiserver kube-scheduler kubectl etcd kwok; do
  "$work/out/bin/$b" --version >/dev/null 2>&1 || "$work/out/bin/$b" version --client >/dev/null 2>&1 ||
    { log "$b does not run"; exit 1; }
done
[ -x "$work/out/bin/karpenter-kwok" ] || { log "karpenter-kwok was not built"; exit 1; }
touch "$work/out/.complete"
rm -rf "$dir"
mv "$work/out" "$dir"
echo "$dir"
