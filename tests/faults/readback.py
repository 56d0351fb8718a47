"""After the faults: bring the cluster to rest, drain the queue, and read every replica of
every partition back from the broker that hosts it (binary batches, for byte comparison)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from laminar.log.batch import parse_header, split_batches

from .calls import BATCH_TYPE, call
from .faults import Env
from .workload import Context, Entry, acquire, group_url, settle

CONVERGE_TIMEOUT_S = 90.0
DRAIN_TIMEOUT_S = 120.0
DEAD_LETTER_TIMEOUT_S = 60.0
READ_MAX_BYTES = 16 << 20
DRAIN_LEASE_MS = 30_000
POLL_S = 0.3
#: how long a replica may answer reads 503, or serve nothing past a cut (repairing a damaged
#: batch), before it counts as unreadable
REPAIR_TIMEOUT_S = 60.0


@dataclass
class Replica:
    node: str
    topic: str
    partition: int
    role: str
    commit_index: int
    log_start: int
    #: (base_index, next_index, control, batch bytes) of every whole batch up to the commit
    batches: list[tuple[int, int, bool, bytes]] = field(default_factory=list)
    error: str | None = None  # the read failed: why
    retries: int = 0  # reads answered 503 before it served them


async def hosted(env: Env) -> dict[str, list[dict[str, Any]]]:
    """Each running broker's own report of the replicas it hosts (asked directly)."""
    result: dict[str, list[dict[str, Any]]] = {}
    for node in env.running():
        url = env.cluster.brokers[node].api_url
        answer = await call(env.session, "GET", f"{url}/v1/nodes/{node}/partitions", timeout_s=3)
        data = answer.json() if answer.ok else None
        if isinstance(data, dict):
            result[node] = list(data.get("partitions", []))
    return result


async def topic_partitions(env: Env) -> dict[str, int]:
    listed = await env.ask("/v1/topics")
    if not isinstance(listed, dict):
        return {}
    return {t["name"]: int(t["partitions"]) for t in listed.get("topics", [])}


def convergence_gaps(topics: dict[str, int], view: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What keeps the cluster from being at rest: a partition without a leader, or a voter
    whose commit index or log end differs from its leader's."""
    reports: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for node, items in view.items():
        for item in items:
            reports.setdefault((item["topic"], int(item["partition"])), {})[node] = item
    gaps = []
    for topic, count in sorted(topics.items()):
        for p in range(count):
            replicas = reports.get((topic, p), {})
            leaders = [i for i in replicas.values() if i.get("role") == "leader"]
            if not leaders:
                gaps.append(f"{topic}/{p}: no leader")
                continue
            leader = max(leaders, key=lambda i: int(i["term"]))
            for voter in leader.get("voters", []):
                mine = replicas.get(voter)
                if mine is None:
                    gaps.append(f"{topic}/{p}: voter {voter} does not report it")
                elif (mine["commit_index"], mine["log_end"]) != (
                    leader["commit_index"],
                    leader["log_end"],
                ):
                    gaps.append(
                        f"{topic}/{p}: {voter} at commit {mine['commit_index']} end "
                        f"{mine['log_end']}, leader at {leader['commit_index']} "
                        f"{leader['log_end']}"
                    )
    return gaps


async def wait_converged(env: Env, timeout_s: float = CONVERGE_TIMEOUT_S) -> list[str]:
    """Poll until at rest; the gaps still open when time runs out (empty: converged)."""
    deadline = time.monotonic() + timeout_s
    gaps = ["not asked yet"]
    while time.monotonic() < deadline:
        topics = await topic_partitions(env)
        view = await hosted(env)
        gaps = convergence_gaps(topics, view) if topics else ["no topic list"]
        if not gaps:
            return []
        await asyncio.sleep(POLL_S)
    return gaps


async def describe_group(env: Env, topic: str, partition: int) -> dict[str, Any] | None:
    url = env.cluster.brokers[env.running()[0]].api_url
    answer = await call(env.session, "GET", group_url(url, topic, partition), timeout_s=3)
    data = answer.json() if answer.ok else None
    return data if isinstance(data, dict) else None


async def drain(ctx: Context, env: Env, topic: str, partitions: int) -> list[dict[str, Any]]:
    """A clean consumer accepts everything left until no message is pending or held (the
    workload's abandoned leases run out meanwhile); then wait until no dead letter is
    pending. Returns the groups' last descriptions."""
    entry = Entry(env.cluster.urls, random.Random(0))
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    descriptions: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        took = 0
        for p in range(partitions):
            grants = await acquire(ctx, entry, "drain", topic, p, DRAIN_LEASE_MS, 100, 200)
            took += len(grants)
            if grants:
                await settle(ctx, entry, "drain", "accept", topic, p, [g.index for g in grants])
        if took:
            continue
        descriptions = [await describe_group(env, topic, p) or {} for p in range(partitions)]
        if all(d.get("pending") == 0 and d.get("acquired") == 0 for d in descriptions):
            break
        await asyncio.sleep(POLL_S)
    deadline = time.monotonic() + DEAD_LETTER_TIMEOUT_S
    while time.monotonic() < deadline:
        descriptions = [await describe_group(env, topic, p) or {} for p in range(partitions)]
        if all(d.get("dead_letter_pending") == 0 for d in descriptions):
            break
        await asyncio.sleep(POLL_S)
    return descriptions


async def read_replica(env: Env, replica: Replica) -> None:
    """Every batch the hosting broker serves from the log start up to its commit index."""
    url = env.cluster.brokers[replica.node].api_url
    path = f"/v1/topics/{replica.topic}/partitions/{replica.partition}/records"
    next_index = replica.log_start
    repair_deadline = time.monotonic() + REPAIR_TIMEOUT_S
    while next_index <= replica.commit_index:
        answer = await call(
            env.session, "GET",
            f"{url}{path}?from={next_index}&max_bytes={READ_MAX_BYTES}&max_records=100000",
            accept=BATCH_TYPE, timeout_s=10, follow=False,
        )  # fmt: skip
        if answer.status == 503 and time.monotonic() < repair_deadline:
            # documented: retry (e.g. a damaged batch being fetched again from the leader);
            # a replica that never serves what it committed is a violation below
            replica.retries += 1
            await asyncio.sleep(POLL_S)
            continue
        if answer.status != 200:
            replica.error = f"read from {next_index}: {answer.outcome} {answer.message()}"
            return
        progressed = False
        for batch in split_batches(answer.body):
            header = parse_header(batch)
            if header.next_index <= next_index:
                continue  # the first batch may start before `from`
            if header.next_index - 1 > replica.commit_index:
                return
            replica.batches.append(
                (header.base_index, header.next_index, header.is_control, bytes(batch))
            )
            next_index = header.next_index
            progressed = True
        if not progressed and time.monotonic() < repair_deadline:
            # a replica repairing a damaged batch cuts its log there and fetches the rest
            # from the leader again: it serves nothing past the cut until then
            replica.retries += 1
            await asyncio.sleep(POLL_S)
            continue
        if not progressed:
            replica.error = (
                f"read from {next_index}: no progress (commit {replica.commit_index}; "
                f"answered {len(answer.body)} bytes, Laminar-Next-Index "
                f"{answer.headers.get('Laminar-Next-Index')}, Laminar-Commit-Index "
                f"{answer.headers.get('Laminar-Commit-Index')})"
            )
            return


async def read_all(env: Env) -> dict[tuple[str, int], list[Replica]]:
    """Every replica of every partition, as its own broker serves it."""
    view = await hosted(env)
    replicas: dict[tuple[str, int], list[Replica]] = {}
    for node, items in sorted(view.items()):
        for item in items:
            replica = Replica(
                node, item["topic"], int(item["partition"]), str(item.get("role")),
                int(item["commit_index"]), int(item.get("log_start", 0)),
            )  # fmt: skip
            replicas.setdefault((replica.topic, replica.partition), []).append(replica)
    # all at once: a replica under repair may take up to REPAIR_TIMEOUT_S, once in all
    await asyncio.gather(*(read_replica(env, r) for g in replicas.values() for r in g))
    return replicas
