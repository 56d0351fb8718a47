"""Kernel steering of connections to a broker's workers (docs/workers.md, routing layer 3).

With `--steer-port P` and more than one worker, the supervisor listens on P once per worker:
N sockets in one SO_REUSEPORT group, made in worker order, each handed to its worker (which
serves the API on it as on its own port). A classic BPF program attached to the group
(SO_ATTACH_REUSEPORT_CBPF) picks the socket of each new connection: the client's TCP source
port modulo N. So a client that wants worker w connects from a source port p with p mod N ==
w (`source_port_for`), and the kernel hands the connection to worker w with no user-space
hop. The supervisor keeps the sockets open while workers restart, so the group's order never
changes and connections for a worker being restarted wait in its backlog.

Attaching needs no privilege. Where it fails (a kernel without it), the group spreads
connections by the kernel's own hash and a wrong worker answers with a redirect (layer 2).
"""

from __future__ import annotations

import ctypes
import logging
import random
import socket
import struct

log = logging.getLogger(__name__)
SO_ATTACH_REUSEPORT_CBPF = 51
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


def attach(sock: socket.socket, workers: int) -> bool:
    """Attach the program to `sock`'s reuseport group; False (logged) if the kernel refuses."""
    code = program(workers, sock.family)
    instructions = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(instructions))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as e:
        log.warning("kernel steering is off (%s): connections spread by hash, and redirect", e)
        return False
    return True


def listen(host: str, port: int, workers: int, backlog: int) -> tuple[list[socket.socket], bool]:
    """One listening socket per worker on (host, port), in one SO_REUSEPORT group in worker
    order, and whether the steering program is attached."""
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
    return sockets, attach(sockets[0], workers)


def source_port_for(worker: int, workers: int, rng: random.Random | None = None) -> int:
    """A source port in the ephemeral range that the program steers to `worker`."""
    low, high = EPHEMERAL_PORTS
    first = low + (worker - low) % workers
    return (rng or random).randrange(first, high + 1, workers)
