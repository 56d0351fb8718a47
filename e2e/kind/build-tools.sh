#!/usr/bin/env bash
# Build, from the Go module proxy, the static binaries a kind cluster needs besides
# Kubernetes itself: kind, and the images kubeadm and kind pull (etcd, CoreDNS, the
# local-path provisioner, pause). Cached by version; prints the directory holding them.
#
#   e2e/kind/build-tools.sh     # -> ~/.cache/laminar/kind/tools-kind-v0.33.0-...
set -euo pipefail
source "$(dirname "$0")/versions.sh"
CACHE=$KIND_CACHE/tools-kind-$KIND_VERSION-etcd-$ETCD_VERSION-coredns-$COREDNS_VERSION
CACHE+=-local-path-$LOCAL_PATH_VERSION
TOOLS=(kind etcd coredns local-path-provisioner pause)
built() {
  for tool in "${TOOLS[@]}"; do [[ -x $CACHE/$tool ]] || return 1; done
}
if built; then echo "$CACHE"; exit 0; fi
mkdir -p "$KIND_CACHE"
exec 9>"$CACHE.lock" && flock 9  # one build at a time
if built; then echo "$CACHE"; exit 0; fi
command -v go >/dev/null || { echo "go is needed to build kind and its images" >&2; exit 1; }
export GOFLAGS=-mod=mod GOSUMDB=off GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
out=$CACHE.tmp
mkdir -p "$out"
build=(go build -trimpath -ldflags "-s -w")
# a module's source, writable, in $work/$2
source_of() {
  local dir
  dir=$(cd "$work" && go mod download -json "$1" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  cp -r "$dir" "$work/$2" && chmod -R u+w "$work/$2"
}
echo "building kind $KIND_VERSION" >&2
(cd "$work" && GOBIN="$out" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION")
echo "building etcd $ETCD_VERSION" >&2
source_of "go.etcd.io/etcd/server/v3@$ETCD_VERSION" etcd
(
  cd "$work/etcd"
  # the module's go.mod replaces its sibling modules with ../ paths: use their releases
  go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("../"):
        print(r["Old"]["Path"])
' | while read -r module; do go mod edit -dropreplace "$module"; done
  "${build[@]}" -o "$out/etcd" .
)
echo "building coredns $COREDNS_VERSION" >&2
source_of "github.com/coredns/coredns@$COREDNS_VERSION" coredns
(cd "$work/coredns" && "${build[@]}" -o "$out/coredns" .)
echo "building local-path-provisioner $LOCAL_PATH_VERSION" >&2
source_of "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION" local-path
# its module zip carries only vendor/modules.txt: build in module mode
(cd "$work/local-path" && rm -rf vendor && "${build[@]}" -o "$out/local-path-provisioner" .)
echo "building pause" >&2
mkdir -p "$work/pause"
cp "$(dirname "$0")/pause.go" "$work/pause/main.go"
(cd "$work/pause" && go mod init pause >/dev/null 2>&1 && "${build[@]}" -o "$out/pause" .)
rm -rf "$CACHE" && mv "$out" "$CACHE"
echo "$CACHE"
