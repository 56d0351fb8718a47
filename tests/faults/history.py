"""The cluster's history before the workload: topics created and written to, every broker
restarted gracefully in turn, one killed -9 and restarted, the metadata leader moved; new
topics are created only after all that (some bugs hide on fresh clusters: those topics are
the ones a restart may forget)."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from .calls import call
from .faults import Env
from .workload import IDEMPOTENT, Context, raw_writer

CREATE_TIMEOUT_S = 60.0
LEADERS_TIMEOUT_S = 60.0
HANDOFF_TIMEOUT_S = 15.0
HISTORY_BATCHES = 25  # per partition; with the records below, > 2 segments of 256 KiB
HISTORY_BATCH_RECORDS = 50
HISTORY_PADDING_BYTES = 500
LATE_HISTORY_BATCHES = 2


async def create_topic(
    env: Env, name: str, partitions: int, replication_factor: int, config: dict[str, Any]
) -> None:
    """Create (retrying what may not have happened; 409 after a lost answer is fine) and wait
    until every partition has a leader."""
    body = {"name": name, "partitions": partitions, "replication_factor": replication_factor,
            "config": config}  # fmt: skip
    deadline = time.monotonic() + CREATE_TIMEOUT_S
    while True:
        for url in [env.cluster.brokers[n].api_url for n in env.running()]:
            answer = await call(env.session, "POST", f"{url}/v1/topics", json_body=body)
            if answer.status in (201, 409):
                env.recorder.topics.add(name)
                await wait_for_leaders(env, name, partitions)
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not create topic {name}: {answer.outcome}")
        await asyncio.sleep(0.5)


async def wait_for_leaders(env: Env, name: str, partitions: int) -> None:
    deadline = time.monotonic() + LEADERS_TIMEOUT_S
    while time.monotonic() < deadline:
        described = await env.ask(f"/v1/topics/{name}")
        if isinstance(described, dict):
            states = described.get("partition_states", [])
            if len(states) == partitions and all(s.get("leader") for s in states):
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"topic {name}: not every partition has a leader")


async def write_history(
    env: Env, topic: str, partitions: int, seed: int, batches: int, tag: str
) -> None:
    """Idempotent batches of big records to every partition (checked like the workload's)."""
    ctx = Context(env.session, env.cluster.urls, env.recorder, asyncio.Event(), env.cluster.token)
    await asyncio.gather(
        *(
            raw_writer(
                ctx, f"{tag}-{topic}-{p}", IDEMPOTENT, topic, p,
                random.Random(f"history-{seed}-{tag}-{p}"),
                batch_records=HISTORY_BATCH_RECORDS, max_batches=batches,
                padding_bytes=HISTORY_PADDING_BYTES, interval_s=0.0,
            )
            for p in range(partitions)
        )
    )  # fmt: skip


async def move_metadata_leader(env: Env, steps: list[dict[str, Any]]) -> None:
    """Hand the metadata leadership off (POST /v1/nodes/{id}/handoff); if it stays, restart
    that broker gracefully."""
    leader = await env.metadata_leader()
    if leader is None:
        steps.append({"step": "move_metadata_leader", "result": "no leader known"})
        return
    url = env.cluster.brokers[leader].api_url
    answer = await call(
        env.session, "POST", f"{url}/v1/nodes/{leader}/handoff", timeout_s=HANDOFF_TIMEOUT_S
    )
    deadline = time.monotonic() + HANDOFF_TIMEOUT_S
    now_leader = leader
    while time.monotonic() < deadline:
        now_leader = await env.metadata_leader() or leader
        if now_leader != leader:
            break
        await asyncio.sleep(0.2)
    how = f"handoff ({answer.outcome})"
    if now_leader == leader:
        await env.cluster.restart(leader)
        now_leader = await env.metadata_leader() or "unknown"
        how += ", then a graceful restart"
    steps.append({"step": "move_metadata_leader", "from": leader, "to": now_leader, "how": how})


async def make_history(env: Env, seed: int, topic: str, partitions: int, rf: int) -> list[Any]:
    rng = random.Random(f"history-{seed}")
    steps: list[dict[str, Any]] = []
    started = time.monotonic()

    def done(**step: Any) -> None:
        steps.append({**step, "at_s": round(time.monotonic() - started, 1)})

    await create_topic(env, topic, partitions, rf, {})
    await write_history(env, topic, partitions, seed, HISTORY_BATCHES, "hist")
    done(step="created and wrote", topic=topic)
    for node in env.cluster.node_ids:
        code = await env.cluster.stop(node)  # ClusterError if it hangs: history_failed
        env.cluster.start(node)
        await env.cluster.wait_ready([node])
        done(step="graceful restart", node=node, exit_code=code)
    victim = rng.choice(env.cluster.node_ids)
    await env.cluster.kill9(victim)
    env.cluster.start(victim)
    await env.cluster.wait_ready([victim])
    done(step="kill -9 and restart", node=victim)
    await move_metadata_leader(env, steps)
    done(step="metadata leader moved")
    await write_history(env, topic, partitions, seed, LATE_HISTORY_BATCHES, "late")
    done(step="wrote after the restarts", topic=topic)
    return steps
