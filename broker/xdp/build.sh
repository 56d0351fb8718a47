#!/usr/bin/env sh
# Compile the XDP router: broker/xdp/build.sh [OUT] (default: broker/xdp/router.o).
# Needs clang and libbpf's headers (Debian: clang, libbpf-dev, linux-libc-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/router.o}
multiarch=$(${CC_HOST:-cc} -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
exec clang -O2 -g -Wall -Werror -target bpf -I"/usr/include/$multiarch" \
  -c "$here/router.c" -o "$out"
