"""Kernel steering of connections to a broker's workers (docs/workers.md, routing layer 3).

With `--steer-port P` and more than one worker, the supervisor listens on P once per worker:
N sockets in one SO_REUSEPORT group, made in worker order, each handed to its worker (which
serves the API on it as on its own port). A program attached to the group picks the socket
of each new connection: the client's TCP source port modulo N. So a client that wants worker
w connects from a source port p with p mod N == w (`source_port_for`), and the kernel hands
the connection to worker w with no user-space hop.

Tried in order (`MECHANISMS`):
* "pinned": the eBPF program below, loaded and pinned beside the XDP router by
  `laminar-xdp load` (`pin`: in the pods, the privileged init container) with its empty
  map, for the broker's uid. The unprivileged supervisor opens both pins, puts its sockets in
  the map and attaches the program (Linux >= 6.5: the pins' file permissions suffice).
* "ebpf": the same program loaded by the supervisor itself, which needs CAP_BPF (root). It
  is an eBPF `sk_reuseport` program that looks the socket up in a `REUSEPORT_SOCKARRAY` map
  holding worker w's socket at key w (`bpf_sk_select_reuseport`).
* "cbpf": a classic BPF program returning the socket's index in the group
  (SO_ATTACH_REUSEPORT_CBPF), which needs no privilege.
If none attaches, the group spreads connections by the kernel's hash and a wrong worker
answers with a redirect (layer 2). The supervisor keeps the sockets open while workers
restart, so the map and the group's order never change, and connections for a worker being
restarted wait in its backlog.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import random
import socket
import struct
from pathlib import Path

from .. import bpf

log = logging.getLogger(__name__)
SO_ATTACH_REUSEPORT_CBPF, SO_ATTACH_REUSEPORT_EBPF = 51, 52
#: the programs tried, best first (see the module's text)
MECHANISMS = ("pinned", "ebpf", "cbpf")
#: the pins of the program and its map, in the XDP router's pin directory (`pin`)
PINNED_PROGRAM, PINNED_MAP = "steer-prog", "steer-map"
#: classic BPF opcodes (linux/filter.h)
BPF_LD, BPF_LDX, BPF_ALU, BPF_RET = 0x00, 0x01, 0x04, 0x06
BPF_H, BPF_B = 0x08, 0x10
BPF_ABS, BPF_IND, BPF_MSH = 0x20, 0x40, 0xA0
BPF_MOD, BPF_K, BPF_A = 0x90, 0x00, 0x10
#: loads relative to the network header (SKF_NET_OFF, -0x100000 as an unsigned 32-bit k)
SKF_NET_OFF = 0xFFF00000
IPV6_HEADER_BYTES = 40
#: the ports a client picks its source port from (Linux's default ephemeral range)
EPHEMERAL_PORTS = (32768, 60999)


class SteeringError(Exception):
    pass


def _insn(code: int, k: int = 0) -> bytes:
    return struct.pack("<HBBI", code, 0, 0, k)


def program(workers: int, family: socket.AddressFamily) -> bytes:
    """The classic BPF program: the index of the socket (worker) for a new connection, its
    TCP source port modulo `workers`."""
    if family == socket.AF_INET:
        load_port = [
            _insn(BPF_LDX | BPF_B | BPF_MSH, SKF_NET_OFF),  # X = the IPv4 header's length
            _insn(BPF_LD | BPF_H | BPF_IND, SKF_NET_OFF),  # A = the TCP source port
        ]
    else:
        load_port = [_insn(BPF_LD | BPF_H | BPF_ABS, SKF_NET_OFF + IPV6_HEADER_BYTES)]
    return b"".join([*load_port, _insn(BPF_ALU | BPF_MOD | BPF_K, workers), _insn(BPF_RET | BPF_A)])


#: eBPF (linux/bpf.h): the program and map types, the attach type, the helper, a verdict
PROG_TYPE_SK_REUSEPORT, MAP_TYPE_REUSEPORT_SOCKARRAY = 21, 20
ATTACH_SK_REUSEPORT_SELECT, FUNC_SK_SELECT_REUSEPORT, SK_PASS = 39, 82, 1
PSEUDO_MAP_FD = 1
#: eBPF opcodes: loads (ldx) of 8 and 1 bytes, a 4-byte store, 64-bit ALU with a register (x)
#: or an immediate (k), the jump if greater, call, exit, and the 16-byte immediate load
LDX_DW, LDX_B, STX_W = 0x79, 0x71, 0x63
MOV_X, MOV_K, ADD_K, LSH_K, OR_X, MOD_K = 0xBF, 0xB7, 0x07, 0x67, 0x4F, 0x97
JGT_X, CALL, EXIT, LD_IMM64 = 0x2D, 0x85, 0x95, 0x18
VERIFIER_LOG_BYTES = 1 << 16


def _ebpf(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | dst, off, imm)


def ebpf_program(workers: int, sockarray_fd: int) -> bytes:
    """The eBPF program: look up the socket at key (TCP source port mod `workers`) in the
    REUSEPORT_SOCKARRAY map `sockarray_fd` and select it; if the header is short or the slot
    is empty, pass and let the kernel's hash choose. The context's `data` is the TCP header,
    for IPv4 and IPv6 alike (r1: the context, r10: the stack)."""
    pass_at = 17
    code = [
        _ebpf(LDX_DW, 2, 1, 0),  # r2 = ctx->data
        _ebpf(LDX_DW, 3, 1, 8),  # r3 = ctx->data_end
        _ebpf(MOV_X, 4, 2),
        _ebpf(ADD_K, 4, imm=2),
        _ebpf(JGT_X, 4, 3, off=pass_at - 5),  # the source port is not within the data
        _ebpf(LDX_B, 4, 2, 0),
        _ebpf(LSH_K, 4, imm=8),
        _ebpf(LDX_B, 5, 2, 1),
        _ebpf(OR_X, 4, 5),  # r4 = the source port (network order, read bytewise)
        _ebpf(MOD_K, 4, imm=workers),
        _ebpf(STX_W, 10, 4, -4),  # the key, on the stack
        _ebpf(LD_IMM64, 2, PSEUDO_MAP_FD, imm=sockarray_fd),
        _ebpf(0),
        _ebpf(MOV_X, 3, 10),
        _ebpf(ADD_K, 3, imm=-4),
        _ebpf(MOV_K, 4, imm=0),
        _ebpf(CALL, imm=FUNC_SK_SELECT_REUSEPORT),  # (ctx, map, &key, 0)
        _ebpf(MOV_K, 0, imm=SK_PASS),
        _ebpf(EXIT),
    ]
    assert len(code) == pass_at + 2
    return b"".join(code)


def _load(workers: int, sockarray_fd: int) -> int:
    """Load the eBPF program: its file descriptor. OSError carries the verifier's log."""
    code = ebpf_program(workers, sockarray_fd)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    name = b"laminar_steer"

    def attr(log: ctypes.Array[ctypes.c_char] | None) -> bytes:
        return struct.pack(
            "<IIQQIIQII16sII", PROG_TYPE_SK_REUSEPORT, len(code) // 8,
            ctypes.addressof(insns), ctypes.addressof(license_),
            int(log is not None), len(log) if log else 0, ctypes.addressof(log) if log else 0,
            0, 0, name, 0, ATTACH_SK_REUSEPORT_SELECT,
        )  # fmt: skip

    try:
        return bpf.call(bpf.PROG_LOAD, attr(None))
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            raise
        log_buffer = ctypes.create_string_buffer(VERIFIER_LOG_BYTES)
        try:
            return bpf.call(bpf.PROG_LOAD, attr(log_buffer))
        except OSError as again:
            text = log_buffer.value.decode(errors="replace").strip()
            raise OSError(again.errno, f"{again.strerror}; verifier: {text}") from e


def _sockarray(workers: int) -> int:
    return bpf.call(
        bpf.MAP_CREATE, struct.pack("<IIIII", MAP_TYPE_REUSEPORT_SOCKARRAY, 4, 8, workers, 0)
    )


def _key(index: int) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(struct.pack("<I", index), 4)


def _fill(sockarray: int, sockets: list[socket.socket]) -> None:
    """Put socket w at key w of the map `sockarray`."""
    for index, sock in enumerate(sockets):
        key = _key(index)
        value = ctypes.create_string_buffer(struct.pack("<Q", sock.fileno()), 8)
        bpf.call(
            bpf.MAP_UPDATE_ELEM,
            struct.pack("<IIQQQ", sockarray, 0, ctypes.addressof(key), ctypes.addressof(value), 0),
        )


def _attach_program(sockets: list[socket.socket], program_fd: int) -> None:
    """Attach the program `program_fd` to the group of `sockets`, and close the descriptor
    (the group holds the program)."""
    try:
        sockets[0].setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, program_fd)
    finally:
        os.close(program_fd)


def attach_ebpf(sockets: list[socket.socket]) -> None:
    """Put socket w at key w of a new REUSEPORT_SOCKARRAY and attach the eBPF program to the
    group. The group then holds the program and the program the map: their descriptors are
    closed here. OSError if the kernel refuses (EPERM without CAP_BPF)."""
    sockarray = _sockarray(len(sockets))
    try:
        _fill(sockarray, sockets)
        _attach_program(sockets, _load(len(sockets), sockarray))
    finally:
        os.close(sockarray)


def pin(directory: Path, workers: int, owner: int | None = None) -> None:
    """Load the eBPF program for `workers` with an empty map and pin both in `directory`
    (replacing any), mode 600 and owned by `owner` (the broker's uid), for `attach_pinned`:
    what `laminar-xdp load` does beside the router. Needs CAP_BPF; OSError if refused."""
    unpin(directory)
    sockarray = _sockarray(workers)
    try:
        program_fd = _load(workers, sockarray)
        try:
            for fd, name in ((program_fd, PINNED_PROGRAM), (sockarray, PINNED_MAP)):
                bpf.obj_pin(directory / name, fd)
                os.chmod(directory / name, 0o600)
                if owner is not None:
                    os.chown(directory / name, owner, owner)
        finally:
            os.close(program_fd)
    finally:
        os.close(sockarray)


def unpin(directory: Path) -> None:
    for name in (PINNED_PROGRAM, PINNED_MAP):
        (directory / name).unlink(missing_ok=True)


#: struct bpf_map_info's first fields: type, id, key size, value size, max entries
MAP_INFO = struct.Struct("<IIIII")
MAP_INFO_BYTES = 96


def _sockarray_size(sockarray: int) -> int:
    """The number of entries of the REUSEPORT_SOCKARRAY `sockarray` (OSError: not one)."""
    info = ctypes.create_string_buffer(MAP_INFO_BYTES)
    attr = struct.pack("<IIQ", sockarray, MAP_INFO_BYTES, ctypes.addressof(info))
    bpf.call(bpf.OBJ_GET_INFO_BY_FD, attr)
    kind, _, _, _, entries = MAP_INFO.unpack_from(info.raw)
    if kind != MAP_TYPE_REUSEPORT_SOCKARRAY:
        raise OSError(errno.EINVAL, f"the pinned map is of type {kind}, not a sockarray")
    return int(entries)


def _in_use(sockarray: int, entries: int) -> bool:
    """Whether any key of the map holds a socket (another group's: a broker's own are put
    in only now, and a closed socket leaves its key)."""
    value = ctypes.create_string_buffer(8)
    for index in range(entries):
        key = _key(index)
        attr = struct.pack("<IIQQQ", sockarray, 0, ctypes.addressof(key),
                           ctypes.addressof(value), 0)  # fmt: skip
        try:
            bpf.call(bpf.MAP_LOOKUP_ELEM, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:
                continue
            raise
        return True
    return False


def attach_pinned(sockets: list[socket.socket], directory: Path) -> None:
    """Attach the program `pin` pinned in `directory` to the group of `sockets`, after
    putting them in its map. OSError if there is none, it was pinned for another number of
    workers, another broker's sockets are in it, or the kernel refuses."""
    sockarray = bpf.obj_get(directory / PINNED_MAP)
    try:
        entries = _sockarray_size(sockarray)
        if entries != len(sockets):
            raise OSError(errno.EINVAL, f"pinned for {entries} workers, not {len(sockets)}")
        if _in_use(sockarray, entries):
            raise OSError(errno.EBUSY, "its map holds another group's sockets")
        _fill(sockarray, sockets)
        _attach_program(sockets, bpf.obj_get(directory / PINNED_PROGRAM))
    finally:
        os.close(sockarray)


def attach_cbpf(sockets: list[socket.socket]) -> None:
    """Attach the classic program to the group of `sockets` (made in worker order)."""
    code = program(len(sockets), sockets[0].family)
    instructions = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(instructions))
    sockets[0].setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def attach(
    sockets: list[socket.socket],
    mechanisms: tuple[str, ...] = MECHANISMS,
    pin_dir: Path | None = None,
) -> str | None:
    """Attach the first of `mechanisms` the kernel accepts to the group of `sockets` ("pinned"
    looks in `pin_dir`): its name, or None (each refusal logged) when connections are left
    to the kernel's hash."""
    for mechanism in mechanisms:
        try:
            if mechanism == "pinned":
                if pin_dir is None:
                    continue
                attach_pinned(sockets, pin_dir)
            elif mechanism == "ebpf":
                attach_ebpf(sockets)
            else:
                attach_cbpf(sockets)
        except OSError as e:
            log.info("steering: the %s program did not attach: %s", mechanism, e)
            continue
        return mechanism
    if mechanisms:
        log.warning("kernel steering is off: connections spread by hash, and redirect")
    return None


def listen(
    host: str,
    port: int,
    workers: int,
    backlog: int,
    mechanisms: tuple[str, ...] = MECHANISMS,
    pin_dir: Path | None = None,
) -> tuple[list[socket.socket], str | None]:
    """One listening socket per worker on (host, port), in one SO_REUSEPORT group in worker
    order, and the steering program attached to it (`attach`)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        raise SteeringError(f"--steer-port: cannot resolve {host!r}: {e}") from e
    family, kind, proto, _, address = infos[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(workers):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(backlog)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise SteeringError(f"--steer-port {port}: cannot listen on {host}: {e}") from e
    return sockets, attach(sockets, mechanisms, pin_dir)


def source_port_for(worker: int, workers: int, rng: random.Random | None = None) -> int:
    """A source port in the ephemeral range that the program steers to `worker`."""
    low, high = EPHEMERAL_PORTS
    first = low + (worker - low) % workers
    return (rng or random).randrange(first, high + 1, workers)
