#!/usr/bin/env bash
# Make the local base image, localhost/laminar-base:bookworm, with debootstrap (Debian
# bookworm, minbase, python3): for building the images where no image registry is reachable.
# The root filesystem is cached as a tarball (~/.cache/laminar/images, LAMINAR_IMAGE_CACHE) so
# later runs only import it. The machine's own CA certificates (/usr/local/share/ca-certificates)
# are added, so that builds can reach package registries through this machine's egress proxy.
set -euo pipefail
IMAGE=${LAMINAR_BASE_IMAGE:-localhost/laminar-base:bookworm}
CACHE=${LAMINAR_IMAGE_CACHE:-$HOME/.cache/laminar/images}
source "$(dirname "$0")/../kind/versions.sh"  # debian_mirror: the machine's apt source
PODMAN=(podman --runtime runc)
tarball=$CACHE/base-bookworm.tar

if "${PODMAN[@]}" image exists "$IMAGE"; then echo "$IMAGE"; exit 0; fi
if [[ ! -s $tarball ]]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is needed (Debian: debootstrap)" >&2; exit 1; }
  mkdir -p "$CACHE"
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mirror=$(debian_mirror)
  [[ -n $mirror ]] || { echo "no Debian mirror in /etc/apt/sources*; set DEBIAN_MIRROR" >&2; exit 1; }
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >&2
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >&2
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
fi
"${PODMAN[@]}" import "$tarball" "$IMAGE" >&2
echo "$IMAGE"
