#!/usr/bin/env bash
# A Debian root filesystem made with debootstrap (minbase plus the packages named), cached as a
# tarball keyed by the suite and the package list: prints the tarball's path.
#
#   e2e/kind/rootfs.sh node systemd,containerd,...    # -> ~/.cache/laminar/kind/rootfs-node-....tar
set -euo pipefail
source "$(dirname "$0")/versions.sh"
name=${1:?a name}
packages=${2:?packages, comma-separated}
key=$(printf '%s %s' "$DEBIAN_SUITE" "$packages" | sha256sum | cut -c1-12)
tarball=$KIND_CACHE/rootfs-$name-$DEBIAN_SUITE-$key.tar
if [[ -s $tarball ]]; then echo "$tarball"; exit 0; fi
mkdir -p "$KIND_CACHE"
exec 9>"$tarball.lock" && flock 9  # one build at a time
if [[ -s $tarball ]]; then echo "$tarball"; exit 0; fi
command -v debootstrap >/dev/null || { echo "debootstrap is needed (Debian: debootstrap)" >&2; exit 1; }
mirror=$(debian_mirror)
[[ -n $mirror ]] || { echo "no Debian mirror in /etc/apt/sources*; set DEBIAN_MIRROR" >&2; exit 1; }
mkdir -p "$KIND_CACHE"
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "debootstrap $name ($DEBIAN_SUITE, $packages)" >&2
debootstrap --variant=minbase --include="$packages" "$DEBIAN_SUITE" "$root" "$mirror" \
  >"$KIND_CACHE/debootstrap-$name.log" 2>&1 ||
  { tail -20 "$KIND_CACHE/debootstrap-$name.log" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
echo "$tarball"
