# Pinned versions of everything the kind cluster is built from (sourced by the e2e/kind
# scripts). The Kubernetes release is the one e2e/kube/build-binaries.sh builds; the others are
# the versions kubeadm and kind of these releases expect (kubeadm's etcd, CoreDNS and pause).
KIND_VERSION=${KIND_VERSION:-v0.33.0}
KUBE_VERSION=${KUBE_VERSION:-v1.32.4}
ETCD_VERSION=v3.5.16
ETCD_IMAGE_TAG=3.5.16-0
COREDNS_VERSION=v1.11.3
LOCAL_PATH_VERSION=v0.0.30
PAUSE_IMAGE_TAG=3.10
DEBIAN_SUITE=bookworm
KIND_CACHE=${LAMINAR_KIND_CACHE:-$HOME/.cache/laminar/kind}
# The Debian mirror: the machine's own apt source.
debian_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then echo "$DEBIAN_MIRROR"; return; fi
  local sources=()
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $file ]] && sources+=("$file")
  done
  ((${#sources[@]})) || return 0
  awk '$1 == "deb" {print $2; exit} $1 == "URIs:" {print $2; exit}' "${sources[@]}"
}
# What the node's and kube-proxy's root filesystems carry (Debian's containerd, runc and CNI
# plugins: kindnetd and crictl are not on the Go module proxy).
NODE_PACKAGES=systemd,systemd-sysv,dbus,ca-certificates,iproute2,iptables,procps,util-linux,mount
NODE_PACKAGES+=,kmod,conntrack,ethtool,socat,ebtables,nftables,libseccomp2,pigz,bash,curl
NODE_PACKAGES+=,e2fsprogs,findutils,gzip,tar,jq,containerd,runc,containernetworking-plugins
PROXY_PACKAGES=iptables,conntrack,nftables,kmod
# podman, and kind's podman provider, within this machine's limits: without CAP_SYS_RESOURCE
# a container cannot be given more open files or processes than the caller's hard limits, and
# podman's defaults (1048576) are refused. Written to the cache, not /etc; CONTAINERS_CONF
# points podman at it.
use_containers_conf() {
  local conf=$KIND_CACHE/containers.conf nproc
  nproc=$(ulimit -Hu)
  [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
  mkdir -p "$KIND_CACHE"
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\nruntime = "runc"\n' \
    "$(ulimit -Hn)" "$(ulimit -Hn)" "$nproc" "$nproc" >"$conf"
  export CONTAINERS_CONF=$conf
}
