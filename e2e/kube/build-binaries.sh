#!/usr/bin/env bash
# Build the pinned Kubernetes release's kube-apiserver, kube-controller-manager and kubectl
# from the Go module proxy (k8s.io/kubernetes, its staging modules at the matching v0.x
# release), and the pinned helm (helm.sh/helm/v3), into a cache that later runs reuse:
# prints the directory holding the binaries.
#
#   e2e/kube/build-binaries.sh            # -> ~/.cache/laminar/kube/v1.32.4-helm-v3.16.4
#
# KUBE_VERSION / HELM_VERSION pick other releases; LAMINAR_KUBE_CACHE another cache root. The
# first build takes about 10 minutes on 2 cores; cached runs return at once.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.32.4}
HELM_VERSION=${HELM_VERSION:-v3.16.4}
STAGING_VERSION=v0.${KUBE_VERSION#v1.}
CACHE=${LAMINAR_KUBE_CACHE:-$HOME/.cache/laminar/kube}/$KUBE_VERSION-helm-$HELM_VERSION
COMMANDS=(kube-apiserver kube-controller-manager kubectl)

built() {
  for command in "${COMMANDS[@]}" helm; do [[ -x $CACHE/$command ]] || return 1; done
}
if built; then echo "$CACHE"; exit 0; fi
command -v go >/dev/null || { echo "go is needed to build Kubernetes $KUBE_VERSION" >&2; exit 1; }

export GOFLAGS=-mod=mod GOSUMDB=off GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
source_dir=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$source_dir" "$work/kubernetes"
chmod -R u+w "$work/kubernetes"
cd "$work/kubernetes"
# The release's go.mod points its k8s.io/* staging modules at ./staging, which the module
# zip does not carry: use their published releases instead.
go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])
' | while read -r module; do
  go mod edit -replace "$module=$module@$STAGING_VERSION"
done
mkdir -p "$CACHE.tmp"
for command in "${COMMANDS[@]}"; do
  echo "building $command $KUBE_VERSION" >&2
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION" \
    -o "$CACHE.tmp/$command" "./cmd/$command"
done
echo "building helm $HELM_VERSION" >&2
(cd "$work" && GOBIN="$CACHE.tmp" go install -trimpath -ldflags "-s -w" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
echo "$CACHE"
