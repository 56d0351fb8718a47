"""Weighted rendezvous hashing: which brokers host a partition, which worker owns it.

For partition key P and node N of weight w: `score = -w / ln(h)`, where h is xxh64(P ‖ N)
mapped strictly into (0, 1). The `replicas` highest-scoring eligible (alive, not draining)
nodes host P. Each node's share of first places is proportional to its weight; adding a node
moves only the partitions it now wins, and removing one moves only the partitions it held.

Preferred leaders (`preferred_leaders`) are chosen per topic so that leadership balances
exactly rather than by the luck of the hash, as Kafka's round-robin preferred replica does:
in partition order, each partition's preferred leader is the replica leading the fewest of
the topic's earlier partitions for its weight, ties going to the best-ranked replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import xxhash

SEPARATOR = b"\x00"  # cannot occur in topic names or node ids
UNIT_BITS = 53  # the top 53 bits of the hash: exact in a float, so h < 1 strictly
WORKER_DOMAIN = "worker\x00"  # `owner`'s keys, apart from `place`'s


@dataclass(frozen=True, slots=True)
class Candidate:
    id: str
    weight: int = 1
    alive: bool = True
    draining: bool = False
    #: the broker's workers' node ids (`laminar.workers`); empty: the broker is its own
    #: only worker
    workers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"weight {self.weight} of {self.id} is negative")

    @property
    def eligible(self) -> bool:
        return self.alive and not self.draining and self.weight > 0


def unit_hash(key: str, node: str) -> float:
    """xxh64(key ‖ node) mapped strictly into (0, 1)."""
    digest = xxhash.xxh64_intdigest(key.encode() + SEPARATOR + node.encode())
    return ((digest >> (64 - UNIT_BITS)) + 0.5) / (1 << UNIT_BITS)


def score(key: str, node: str, weight: int) -> float:
    if weight < 0:
        raise ValueError(f"weight {weight} of {node} is negative")
    return -weight / math.log(unit_hash(key, node))


def rank(key: str, candidates: Iterable[Candidate]) -> list[str]:
    """Eligible candidates by descending score (ties broken by id, so the order is total)."""
    scored = [(score(key, c.id, c.weight), c.id) for c in candidates if c.eligible]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [node for _, node in scored]


def place(key: str, candidates: Iterable[Candidate], replicas: int) -> list[str]:
    """The `replicas` nodes that should host `key`, best first (fewer if too few are
    eligible)."""
    if replicas < 1:
        raise ValueError(f"replicas={replicas} must be at least 1")
    return rank(key, candidates)[:replicas]


def hosts(key: str, candidates: Iterable[Candidate], replicas: int) -> list[str]:
    """The nodes that should host `key`, best first: the `replicas` brokers that `place`
    picks, each represented by the worker that owns `key` among its workers (`owner`)."""
    candidates = list(candidates)
    workers = {c.id: c.workers for c in candidates}
    return [worker_of(key, b, workers[b]) for b in place(key, candidates, replicas)]


def worker_of(key: str, broker: str, workers: Sequence[str]) -> str:
    """The node of `broker` that owns `key`: the owner among its `workers`, or the broker
    itself when it lists none (one worker)."""
    return owner(key, workers) if workers else broker


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def owner(key: str, workers: Sequence[str]) -> str:
    """The worker (one process per core, `laminar.workers`) that owns `key`, all workers
    weighing alike. The key is hashed in a domain of its own (`WORKER_DOMAIN`): worker 0's
    id is its broker's, and the keys that picked a broker score high for its id, so hashing
    them again unchanged would hand worker 0 more than its share."""
    if not workers:
        raise ValueError("no workers")
    return place(WORKER_DOMAIN + key, (Candidate(w) for w in workers), 1)[0]


def preferred_leaders(
    replica_sets: Sequence[Sequence[str]], weights: Mapping[str, int] | None = None
) -> list[str | None]:
    """The preferred leader of each of a topic's partitions, given their replicas (best
    first, as `place` lists them; None for a partition with none): in partition order, the
    replica whose count of preferred leaderships so far, plus this one, is lowest for its
    weight, ties going to the earlier replica. Each node so leads a share of the topic's
    partitions proportional to its weight, within one partition, wherever the replica sets
    leave a choice; the same input gives the same answer on every node."""
    counts: dict[str, int] = {}
    out: list[str | None] = []
    for replicas in replica_sets:
        best: str | None = None
        best_load = 0.0
        for node in replicas:
            weight = max(1, weights.get(node, 1)) if weights is not None else 1
            load = (counts.get(node, 0) + 1) / weight
            if best is None or load < best_load:
                best, best_load = node, load
        if best is not None:
            counts[best] = counts.get(best, 0) + 1
        out.append(best)
    return out
