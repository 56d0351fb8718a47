#!/usr/bin/env bash
# Build the pinned Kubernetes release's binaries from the Go module proxy (k8s.io/kubernetes,
# its staging modules at the matching v0.x release) in one `go build`, so that the API-server
# tests (kube-apiserver, kube-controller-manager, kubectl) and the kind node image (kubelet,
# kubeadm, kube-scheduler, kube-proxy) share one compile; and the pinned helm
# (helm.sh/helm/v3). Into a cache that later runs reuse: prints the directory holding them.
#
#   e2e/kube/build-binaries.sh            # -> ~/.cache/laminar/kube/v1.32.4-helm-v3.16.4
#
# KUBE_VERSION / HELM_VERSION pick other releases; LAMINAR_KUBE_CACHE another cache root. The
# first build takes about 15 minutes on 2 cores; cached runs return at once.
set -euo pipefail
KUBE_VERSION=${KUBE_VERSION:-v1.32.4}
HELM_VERSION=${HELM_VERSION:-v3.16.4}
STAGING_VERSION=v0.${KUBE_VERSION#v1.}
CACHE=${LAMINAR_KUBE_CACHE:-$HOME/.cache/laminar/kube}/$KUBE_VERSION-helm-$HELM_VERSION
COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubeadm kubectl)

built() {
  for command in "${COMMANDS[@]}" helm; do [[ -x $CACHE/$command ]] || return 1; done
}
if built; then echo "$CACHE"; exit 0; fi
# one build at a time (a CI run starts the kind node image's build beside this one)
mkdir -p "$(dirname "$CACHE")"
exec 9>"$CACHE.lock" && flock 9
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
packages=()
for command in "${COMMANDS[@]}"; do packages+=("./cmd/$command"); done
echo "building ${COMMANDS[*]} $KUBE_VERSION" >&2
minor=${KUBE_VERSION#v1.}
version=k8s.io/component-base/version
ldflags="-s -w -X $version.gitVersion=$KUBE_VERSION -X $version.gitMajor=1"
ldflags+=" -X $version.gitMinor=${minor%%.*}"
go build -trimpath -ldflags "$ldflags" -o "$CACHE.tmp/" "${packages[@]}"
echo "building helm $HELM_VERSION" >&2
(cd "$work" && GOBIN="$CACHE.tmp" go install -trimpath -ldflags "-s -w" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
echo "$CACHE"
