#!/usr/bin/env bash
# Build the kind node image with podman and no image registry: a debootstrap Debian root file
# system made into a kind node the way kind's images/base Dockerfile does it, the Kubernetes
# binaries of e2e/kube/build-binaries.sh, and the images kubeadm and kind's storage manifest
# need (built FROM scratch from e2e/kind/build-tools.sh's binaries) preloaded into the node's
# containerd. The tag carries the versions and a hash of this recipe, so a changed recipe
# builds a new image. Prints the image's name.
#
#   e2e/kind/build-node-image.sh     # -> localhost/laminar-kind-node:v1.32.4-<hash>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
source "$here/versions.sh"
recipe=$(cat "$here"/versions.sh "$here"/build-node-image.sh "$here"/build-tools.sh \
  "$here"/rootfs.sh "$here"/manifests.py "$here"/pause.go "$root_dir"/e2e/kube/build-binaries.sh |
  sha256sum | cut -c1-12)
NODE_IMAGE=localhost/laminar-kind-node:$KUBE_VERSION-$recipe
use_containers_conf
PODMAN=(podman --runtime runc)
if "${PODMAN[@]}" image exists "$NODE_IMAGE"; then echo "$NODE_IMAGE"; exit 0; fi
mkdir -p "$KIND_CACHE"
exec 9>"$KIND_CACHE/node-image.lock" && flock 9  # one build at a time
if "${PODMAN[@]}" image exists "$NODE_IMAGE"; then echo "$NODE_IMAGE"; exit 0; fi
log() { echo "[node-image $(date +%T)] $*" >&2; }

# the network-bound steps first: a CI run builds the Kubernetes binaries meanwhile
log "root file systems, tools and binaries (cached by version)"
node_tarball=$("$here"/rootfs.sh node "$NODE_PACKAGES")
proxy_tarball=$("$here"/rootfs.sh proxy "$PROXY_PACKAGES")
tools=$("$here"/build-tools.sh)
kube=$("$root_dir"/e2e/kube/build-binaries.sh)
work=$(mktemp -d)
build_container=laminar-kind-node-build-$$
base=localhost/laminar-kind-node-base:$recipe
proxy_base=localhost/laminar-kind-proxy-base:$recipe
components=()  # the images preloaded into the node: they live on inside it only
cleanup() {
  "${PODMAN[@]}" rm -f "$build_container" >/dev/null 2>&1 || true
  "${PODMAN[@]}" rmi -f "$base" "$proxy_base" "${components[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
kind_source=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
R=$work/rootfs
mkdir -p "$R" "$work/images" "$work/context"
tar -C "$R" -xf "$node_tarball"

log "assemble the node root file system (kind $KIND_VERSION images/base)"
F=$kind_source/images/base/files
install -m 0755 "$F"/usr/local/bin/* "$R/usr/local/bin/"
mkdir -p "$R/kind/bin" "$R/kind/manifests" "$R/etc/containerd" "$R/etc/default" \
  "$R/etc/sysctl.d" "$R/etc/systemd/system/kubelet.service.d" "$R/etc/kubernetes/manifests"
install -m 0755 "$F"/kind/bin/* "$R/kind/bin/"
install -m 0644 "$F/etc/crictl.yaml" "$R/etc/"
install -m 0644 "$F"/etc/containerd/* "$R/etc/containerd/"
install -m 0644 "$F"/etc/default/* "$R/etc/default/"
install -m 0644 "$F"/etc/sysctl.d/* "$R/etc/sysctl.d/"
install -m 0644 "$F"/etc/systemd/system/*.service "$F"/etc/systemd/system/*.slice "$R/etc/systemd/system/"
install -m 0644 "$F"/etc/systemd/system/kubelet.service.d/* "$R/etc/systemd/system/kubelet.service.d/"
# the Dockerfile's RUN steps
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$R/sbin/init"
# Without CAP_SYS_RESOURCE (this machine), the -998 oom_score_adj that CRI gives pod sandboxes is
# refused and runc's init dies ("can't get final child's PID from pipe"): clamp it, as kind does
# for rootless nodes.
sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$R/etc/containerd/config.toml"
# Debian's containerd is in /usr/bin; kind's unit runs /usr/local/bin/containerd
ln -sf /usr/bin/containerd "$R/usr/local/bin/containerd"
# LimitNOFILE/LimitNPROC=infinity also needs CAP_SYS_RESOURCE: keep the inherited limits
mkdir -p "$R/etc/systemd/system/containerd.service.d"
printf '[Service]\nLimitNOFILE=\nLimitNPROC=\n' >"$R/etc/systemd/system/containerd.service.d/20-limits.conf"
# The BPF file system at /sys/fs/bpf, where the broker's XDP init container pins its maps (systemd
# refuses a mount unit for an API file system, so a oneshot service mounts it).
cat >"$R/etc/systemd/system/bpffs.service" <<'UNIT'
[Unit]
Description=Mount the BPF file system at /sys/fs/bpf
DefaultDependencies=no
Before=containerd.service kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf'
[Install]
WantedBy=multi-user.target
UNIT
chroot "$R" systemctl enable kubelet.service containerd.service undo-mount-hacks.service bpffs.service >&2
chroot "$R" systemctl mask systemd-binfmt.service >&2
chroot "$R" sh -c 'ctr oci spec |
  jq ".hooks.createContainer[.hooks.createContainer | length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" |
  jq "del(.process.rlimits)" > /etc/containerd/cri-base.json'
# CNI plugins where containerd's CRI looks for them (Debian installs them in /usr/lib/cni)
mkdir -p "$R/opt/cni/bin" && cp -a "$R/usr/lib/cni/." "$R/opt/cni/bin/"
# kindnetd is not on the Go module proxy: the cluster is made with disableDefaultCNI and the node
# carries a static point-to-point network for its pod CIDR (kind's default 10.244.0.0/16, the
# single node's 10.244.0.0/24). One node only.
mkdir -p "$R/etc/cni/net.d"
cat >"$R/etc/cni/net.d/10-laminar-kind.conflist" <<'JSON'
{
  "cniVersion": "0.3.1",
  "name": "laminar-kind",
  "plugins": [
    {"type": "ptp", "ipMasq": true, "mtu": 1400,
     "ipam": {"type": "host-local", "dataDir": "/run/cni-ipam-state",
              "routes": [{"dst": "0.0.0.0/0"}], "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
for binary in kubeadm kubelet kubectl; do install -m 0755 "$kube/$binary" "$R/usr/bin/$binary"; done
printf '%s' "$KUBE_VERSION" >"$R/kind/version"
storage_images=$(python3 "$here/manifests.py" "$kind_source" "$R/kind/manifests")
rm -f "$R/etc/resolv.conf" && : >"$R/etc/resolv.conf"

log "component images"
save() {
  components+=("$1")
  "${PODMAN[@]}" save -q --format docker-archive -o "$work/images/$(echo "$1" | tr '/:' '__').tar" "$1"
}
# an image of one static binary, FROM scratch
static_image() { # name, path in the image, binary, [entrypoint]
  rm -rf "$work/context"/* && cp "$3" "$work/context/binary"
  {
    echo "FROM scratch"
    echo "COPY binary $2"
    echo "ENV PATH=/usr/local/bin:/usr/bin:/bin"
    if [[ -n ${4:-} ]]; then echo "ENTRYPOINT [\"$4\"]"; fi
  } >"$work/context/Containerfile"
  "${PODMAN[@]}" build -q -t "$1" "$work/context" >/dev/null
  save "$1"
}
for component in kube-apiserver kube-controller-manager kube-scheduler; do
  static_image "registry.k8s.io/$component:$KUBE_VERSION" "/usr/local/bin/$component" "$kube/$component"
done
static_image "registry.k8s.io/etcd:$ETCD_IMAGE_TAG" /usr/local/bin/etcd "$tools/etcd"
static_image "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" /coredns "$tools/coredns" /coredns
static_image "registry.k8s.io/pause:$PAUSE_IMAGE_TAG" /pause "$tools/pause" /pause
provisioner=$(awk '$1 == "storageProvisionerImage" {print $2}' <<<"$storage_images")
helper=$(awk '$1 == "storageHelperImage" {print $2}' <<<"$storage_images")
static_image "$provisioner" /usr/local/bin/local-path-provisioner "$tools/local-path-provisioner"
# kube-proxy needs iptables and conntrack, the storage helper a shell and coreutils: a Debian
# minbase with them, legacy iptables (what kind's entrypoint picks in a fresh network namespace)
proxy_root=$work/proxy
mkdir -p "$proxy_root" && tar -C "$proxy_root" -xf "$proxy_tarball"
chroot "$proxy_root" sh -c 'update-alternatives --set iptables /usr/sbin/iptables-legacy &&
  update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy' >/dev/null
tar -C "$proxy_root" -c . | "${PODMAN[@]}" import - "$proxy_base" >/dev/null
rm -rf "$work/context"/* && cp "$kube/kube-proxy" "$work/context/kube-proxy"
printf 'FROM %s\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' "$proxy_base" >"$work/context/Containerfile"
"${PODMAN[@]}" build -q -t "registry.k8s.io/kube-proxy:$KUBE_VERSION" "$work/context" >/dev/null
save "registry.k8s.io/kube-proxy:$KUBE_VERSION"
"${PODMAN[@]}" tag "$proxy_base" "$helper" && save "$helper"

log "node image $NODE_IMAGE"
tar -C "$R" -c . | "${PODMAN[@]}" import \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'ENV container=docker' --change 'STOPSIGNAL SIGRTMIN+3' - "$base" >/dev/null
"${PODMAN[@]}" run -d --name "$build_container" --privileged --entrypoint sleep "$base" infinity >/dev/null
"${PODMAN[@]}" exec "$build_container" sh -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
"${PODMAN[@]}" exec "$build_container" sh -c 'for _ in $(seq 60); do
  ctr version >/dev/null 2>&1 && exit 0; sleep 0.5; done; cat /tmp/containerd.log; exit 1'
for tarball in "$work"/images/*.tar; do
  "${PODMAN[@]}" exec -i "$build_container" ctr --namespace=k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - <"$tarball" >/dev/null
done
# (stopped: only a zombie left, as nothing in the build container reaps it)
"${PODMAN[@]}" exec "$build_container" sh -c 'pkill containerd; for _ in $(seq 40); do
  ps -o stat= -C containerd | grep -q "^[^Z]" || exit 0; sleep 0.5; done; exit 1'
"${PODMAN[@]}" commit -q --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'CMD []' "$build_container" "$NODE_IMAGE" >/dev/null
# node images of other recipes are stale
"${PODMAN[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/laminar-kind-node |
  grep -vx "$NODE_IMAGE" | xargs -r "${PODMAN[@]}" rmi -f >/dev/null 2>&1 || true
log "done"
echo "$NODE_IMAGE"
