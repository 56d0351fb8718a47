"""bpf(2), called directly (ctypes): the few commands Laminar uses without libbpf or bpftool.

The XDP router's counters (`laminar.xdp`) and the steer port's eBPF program
(`laminar.server.steering`) go through `call`. Attributes are packed by the caller as the
kernel's `union bpf_attr` lays them out (linux/bpf.h); a failure raises OSError with errno.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
from typing import Any

#: bpf(2): its syscall number per machine
BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351}
#: commands (enum bpf_cmd)
MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, PROG_LOAD, OBJ_PIN, OBJ_GET = 0, 1, 2, 5, 6, 7
OBJ_GET_INFO_BY_FD = 15
#: the size of the attribute buffer passed (the kernel checks that the unused tail is zero)
ATTR_BYTES = 128


@functools.cache
def _syscall() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall


def call(command: int, attr: bytes) -> int:
    """bpf(command, attr): the result (a new file descriptor for MAP_CREATE, PROG_LOAD and
    OBJ_GET, else 0). OSError (errno set) when the kernel refuses."""
    number = BPF_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"bpf(2) on {platform.machine()} is not known here")
    buffer = ctypes.create_string_buffer(attr.ljust(ATTR_BYTES, b"\0"), ATTR_BYTES)
    result = int(_syscall()(ctypes.c_long(number), ctypes.c_long(command), buffer,
                            ctypes.c_uint(ATTR_BYTES)))  # fmt: skip
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"bpf command {command}: {os.strerror(code)}")
    return result


def _path(path: str | os.PathLike[str]) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(os.fsencode(path))


def obj_get(path: str | os.PathLike[str], flags: int = 0) -> int:
    """OBJ_GET: a new file descriptor of the object pinned at `path` (`flags`: 0 to read and
    write, BPF_F_RDONLY to read)."""
    name = _path(path)
    return call(OBJ_GET, struct.pack("<QII", ctypes.addressof(name), 0, flags))


def obj_pin(path: str | os.PathLike[str], fd: int) -> None:
    """OBJ_PIN: pin the object `fd` at `path` (in a bpffs)."""
    name = _path(path)
    call(OBJ_PIN, struct.pack("<QII", ctypes.addressof(name), fd, 0))
