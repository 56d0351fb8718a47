"""Workers: one process per core, each owning a share of a broker's partitions.

A broker with N workers is N Raft nodes under one identity. Worker 0's node id is the
broker's id (so a one-worker broker is exactly the broker it always was); worker w > 0 is
`<broker>~<w>` ("~" cannot occur in a broker id). Placement picks brokers (`placement.place`)
and then, within each broker, the worker that owns the partition (`placement.owner`, a
rendezvous hash over that broker's workers): so two replicas of a partition never share a
broker, and a change of a broker's workers moves only the partitions whose owner changed,
by the same Raft membership steps that move them between brokers.

`usable_cores` is the default worker count: the CPUs this process may run on, capped by
its cgroup's CPU quota (a Kubernetes CPU limit), which `os.cpu_count()` does not see.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from .swim.member import (
    MAX_WORKERS,
    EventKind,
    Member,
    MembershipEvent,
    MemberState,
    MemberStatus,
)

WORKER_SEPARATOR = "~"
#: worker w listens on each of the broker's ports plus PORT_STRIDE·w
PORT_STRIDE = 3
CGROUP_ROOT = Path("/sys/fs/cgroup")


def worker_id(broker: str, index: int) -> str:
    """The node id of worker `index` of `broker`."""
    if not 0 <= index < MAX_WORKERS:
        raise ValueError(f"worker index {index} is not in [0, {MAX_WORKERS})")
    return broker if index == 0 else f"{broker}{WORKER_SEPARATOR}{index}"


def broker_of(node: str) -> str:
    """The broker a node (worker) id belongs to."""
    return node.split(WORKER_SEPARATOR, 1)[0]


def worker_index(node: str) -> int:
    """The worker index of a node id (0 for a broker's own id)."""
    _, sep, index = node.partition(WORKER_SEPARATOR)
    return int(index) if sep else 0


def worker_ids(broker: str, count: int) -> tuple[str, ...]:
    """The node ids of a broker's `count` workers, worker 0 first."""
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"workers={count} is not in [1, {MAX_WORKERS}]")
    return tuple(worker_id(broker, w) for w in range(count))


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, membership: str | None = None) -> float | None:
    """The CPU quota of this process's cgroup and its ancestors, in cores (the lowest; None:
    no limit found).

    `membership` is the text of /proc/self/cgroup. cgroup v2 ("0::<path>") keeps the quota
    in `cpu.max` ("<quota> <period>", or "max <period>" for none); v1 ("<n>:cpu,...:<path>")
    in `cpu/<path>/cpu.cfs_quota_us` (-1 for none) and `cpu.cfs_period_us`. In a container
    the path is "/" and the root is the container's own cgroup."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            membership = ""
    limits: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        files: tuple[str, ...]
        if hierarchy == "0" and not controllers:
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):
            base, files = root / "cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        directory = base / path.strip("/")
        for folder in (directory, *directory.parents):
            if limit := _limit(folder, files):
                limits.append(limit)
            if folder == base:
                break
    return min(limits) if limits else None


def _limit(folder: Path, files: tuple[str, ...]) -> float | None:
    try:
        texts = [(folder / name).read_text() for name in files]
    except OSError:
        return None
    words = texts[0].split() if len(texts) == 1 else [t.strip() for t in texts]
    if len(words) < 2:
        return None
    try:
        quota, period = int(words[0]), int(words[1])
    except ValueError:  # "max": no limit
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(root: Path = CGROUP_ROOT, membership: str | None = None) -> int:
    """The CPUs this process may use: its affinity set, capped by its cgroup's CPU quota
    rounded up (a limit of 1.5 cores is 2 workers, each using what it gets), at least 1."""
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root, membership)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, min(cores, MAX_WORKERS))


def worker_address(address: str, index: int) -> str:
    """Worker `index`'s address for one of the broker's ports: the same host, the port plus
    `PORT_STRIDE` times the index (the defaults 7070-7072 for worker 0, 7073-7075 for
    worker 1, and so on)."""
    if index == 0:
        return address
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + PORT_STRIDE * index}"


def peer_address(member: Member | None, node: str) -> str | None:
    """The peer address that `expand` gives node `node` of SWIM member `member` (the member
    `broker_of(node)`, or None when SWIM has none), without expanding every member: None
    when `member` has no such worker."""
    if member is None or broker_of(node) != member.id:
        return None
    _, separator, text = node.partition(WORKER_SEPARATOR)
    if not separator:
        index = 0
    elif text.isascii() and text.isdigit() and text[0] != "0":  # as `worker_id` spells it
        index = int(text)
    else:
        return None
    if index >= member.workers:
        return None
    return worker_address(member.addresses.peer, index)


def expand(states: Iterable[MemberState]) -> dict[str, tuple[MemberStatus, str, str]]:
    """The nodes that SWIM's members stand for, as (status, API address, peer address) by
    node id: each member's workers, a worker it reports down counted dead."""
    out: dict[str, tuple[MemberStatus, str, str]] = {}
    for state in states:
        member, status = state.member, state.status
        api, peer = member.addresses.api, member.addresses.peer
        for w in range(member.workers):
            worker_status = status
            if member.workers_down >> w & 1 and status in (
                MemberStatus.ALIVE,
                MemberStatus.SUSPECT,
            ):
                worker_status = MemberStatus.DEAD
            out[worker_id(member.id, w)] = (
                worker_status,
                worker_address(api, w),
                worker_address(peer, w),
            )
    return out


def standing_events(states: Iterable[MemberState], at_ms: int) -> list[MembershipEvent]:
    """What a worker starting now is told of the members already gone (SWIM reported them
    dead or left before it ran): the events it missed, as of `at_ms`, so that its placement
    counts their grace from now on, as a restarted broker does."""
    kinds = {MemberStatus.DEAD: EventKind.DEAD, MemberStatus.LEFT: EventKind.LEFT}
    return [
        MembershipEvent(kinds[state.status], state, at_ms)
        for state in states
        if state.status in kinds
    ]
