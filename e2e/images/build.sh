#!/usr/bin/env bash
# Build the broker and operator images with podman from the local base image
# (build-base.sh): prints their names. podman's layer cache makes unchanged rebuilds quick.
#
#   e2e/images/build.sh     # -> localhost/laminar-broker:dev localhost/laminar-operator:dev
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=${LAMINAR_IMAGE_TAG:-dev}
base=$(e2e/images/build-base.sh)
# this machine's podman: runc, and ulimits within what the sandbox allows
build=(podman --runtime runc build --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
  --build-arg "BASE_IMAGE=$base")
"${build[@]}" -f Dockerfile.broker -t "localhost/laminar-broker:$TAG" . >&2
"${build[@]}" -f Dockerfile.operator -t "localhost/laminar-operator:$TAG" . >&2
echo "localhost/laminar-broker:$TAG localhost/laminar-operator:$TAG"
