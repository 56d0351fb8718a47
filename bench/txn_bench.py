"""Transactions (issue 24) against plain idempotent appends, on this machine, in the same run.

    python3 bench/txn_bench.py [--rounds 2] [--seconds 8] [--producers 4] [--json]

One local cluster of three brokers, RF 3, fsync always (every answer after its fdatasync),
a topic of 6 partitions. Each round runs, interleaved so that a drift of the machine hits
both alike:

  plain        `--producers` tasks, each appending one 500-record batch (1120-byte records)
               to each of the 6 partitions in turn as an idempotent producer, for `--seconds`
  transactions the same tasks, each batch of 6 appends one transaction (a transactional
               producer per task: add the 6 partitions, 6 appends, commit)
  commit       one transaction at a time of one small record on 1, 2 and 6 partitions:
               p50 / p99 of the commit (the end call, markers written) and of the whole
               transaction (add, appends, commit)
  read         one partition of committed records read start to end (10,000 records a
               read) with isolation read_uncommitted, then read_committed: msg/s each

Printed: msg/s of plain and transactional appends and their ratio (goal: >= 0.5), the commit
latencies, the reads and their ratio, and the server CPU seconds per million records of each
broker (from /proc), with the machine's limits measured in the run (CPUs, 4 KiB fdatasync/s).
Every phase is bounded in count and time; the cluster is stopped in a finally block.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from compare import _check_free, log
from machine import cpu_seconds, fdatasync_per_s

from laminar.client import AsyncClient, Record
from laminar.local_cluster import LocalCluster
from laminar.log.batch import encode_batch

PREFIX = "127.0.24"  # the cluster's loopback /24
TOPIC = "bench-txn"
PARTITIONS = 6
BATCH_RECORDS = 500
SIZE = 1120
MAX_UNITS = 100_000  # bound on the batches of 6 appends a phase sends
COMMIT_SAMPLES = 200
READ_RECORDS = 200_000


def records(n: int) -> list[Record]:
    payload = os.urandom(SIZE)
    return [Record(value=payload) for _ in range(n)]


def cpu(cluster: LocalCluster) -> dict[str, float]:
    return {node: cpu_seconds(pid) or 0.0 for node, pid in cluster.serving_pids().items()}


def per_million(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    return {n: round((after[n] - before.get(n, 0.0)) / count * 1e6, 1) for n in after if count}


async def plain(client: AsyncClient, _task: int, seconds: float, batch: list[Record]) -> int:
    producer_id, sequence, sent = random.getrandbits(62) + 1, 0, 0  # (new each phase)
    deadline = time.monotonic() + seconds
    for _ in range(MAX_UNITS):
        if time.monotonic() >= deadline:
            break
        for partition in range(PARTITIONS):
            data = encode_batch(batch, producer_id=producer_id, producer_seq=sequence)
            await client.append(TOPIC, partition, data)
            sent += len(batch)
        sequence += len(batch)  # (one sequence per partition: they move together here)
    return sent


async def transactional(client: AsyncClient, task: int, seconds: float, batch: list[Record]) -> int:
    producer = await client.transactional_producer(f"bench-{task}")
    sent = 0
    deadline = time.monotonic() + seconds
    for _ in range(MAX_UNITS):
        if time.monotonic() >= deadline:
            break
        async with producer.transaction() as tx:
            await tx.add_partitions([(TOPIC, p) for p in range(PARTITIONS)])
            for partition in range(PARTITIONS):
                await tx.append(TOPIC, partition, batch)
                sent += len(batch)
    return sent


async def throughput(
    cluster: LocalCluster, kind: str, producers: int, seconds: float
) -> dict[str, Any]:
    batch = records(BATCH_RECORDS)
    work = plain if kind == "plain" else transactional
    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=60.0) as client:
        before = cpu(cluster)
        started = time.perf_counter()
        counts = await asyncio.gather(*(work(client, t, seconds, batch) for t in range(producers)))
        elapsed = time.perf_counter() - started
        after = cpu(cluster)
    total = sum(counts)
    return {
        "msg_s": round(total / elapsed),
        "records": total,
        "cpu_s_per_million": per_million(before, after, total),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def commit_latency(cluster: LocalCluster, partitions: int) -> dict[str, float]:
    commits: list[float] = []
    whole: list[float] = []
    one = [Record(value=b"x" * 100)]
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        producer = await client.transactional_producer(f"latency-{partitions}")
        for _ in range(COMMIT_SAMPLES):
            started = time.perf_counter()
            tx = producer.transaction()
            await tx.add_partitions([(TOPIC, p) for p in range(partitions)])
            await asyncio.gather(*(tx.append(TOPIC, p, one) for p in range(partitions)))
            ending = time.perf_counter()
            await tx.commit()
            done = time.perf_counter()
            commits.append((done - ending) * 1000)
            whole.append((done - started) * 1000)
    return {
        "commit_p50_ms": round(statistics.median(commits), 2),
        "commit_p99_ms": round(percentile(commits, 0.99), 2),
        "txn_p50_ms": round(statistics.median(whole), 2),
        "txn_p99_ms": round(percentile(whole, 0.99), 2),
    }


async def read_rate(cluster: LocalCluster, isolation: str) -> dict[str, Any]:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        position, count = 0, 0
        started = time.perf_counter()
        for _ in range(READ_RECORDS // 1000 + 10):  # bounded: each read moves on
            read = await client.read(TOPIC, 0, position, max_records=10_000, isolation=isolation)
            count += len(read.records)
            if not read.records or count >= READ_RECORDS:
                break
            position = read.next_index
        elapsed = time.perf_counter() - started
    return {"msg_s": round(count / elapsed), "records": count}


async def setup(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        await client.wait_for_leaders(TOPIC)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="laminar-txn-bench-"))
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "fdatasync_per_s": round(fdatasync_per_s(root)),
        "rounds": [],
    }
    cluster = LocalCluster(root / "cluster", 3, prefix=PREFIX, fsync="always")
    _check_free(cluster)
    try:
        cluster.start()
        asyncio.run(setup(cluster))
        for number in range(args.rounds):
            row: dict[str, Any] = {}
            for kind in ("plain", "transactions") if number % 2 == 0 else ("transactions", "plain"):
                log(f"round {number + 1}: {kind}")
                row[kind] = asyncio.run(throughput(cluster, kind, args.producers, args.seconds))
            row["ratio"] = round(row["transactions"]["msg_s"] / max(1, row["plain"]["msg_s"]), 2)
            results["rounds"].append(row)
        results["commit"] = {}
        for partitions in (1, 2, 6):
            log(f"commit latency, {partitions} partitions")
            results["commit"][partitions] = asyncio.run(commit_latency(cluster, partitions))
        results["read"] = {}
        for isolation in (
            "read_uncommitted",
            "read_committed",
            "read_uncommitted",
            "read_committed",
        ):
            log(f"read, {isolation}")
            results["read"].setdefault(isolation, []).append(
                asyncio.run(read_rate(cluster, isolation))
            )
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"machine: {results['cpus']} CPUs, {results['fdatasync_per_s']} fdatasync/s (4 KiB)")
    print("3 brokers, RF 3, 6 partitions; 500 x 1120-byte records a batch, one per partition")
    for number, row in enumerate(results["rounds"], start=1):
        print(
            f"round {number}: plain {row['plain']['msg_s']:,} msg/s, transactions "
            f"{row['transactions']['msg_s']:,} msg/s, ratio {row['ratio']} (goal >= 0.5); "
            f"server CPU s per million: plain {row['plain']['cpu_s_per_million']}, "
            f"transactions {row['transactions']['cpu_s_per_million']}"
        )
    for partitions, latency in results["commit"].items():
        print(
            f"commit of {partitions} partition(s): p50 {latency['commit_p50_ms']} ms, p99 "
            f"{latency['commit_p99_ms']} ms; whole transaction p50 {latency['txn_p50_ms']} "
            f"ms, p99 {latency['txn_p99_ms']} ms"
        )
    best = {k: max(r["msg_s"] for r in v) for k, v in results["read"].items()}
    print(
        f"read: read_uncommitted {best['read_uncommitted']:,} msg/s, read_committed "
        f"{best['read_committed']:,} msg/s, ratio "
        f"{best['read_committed'] / max(1, best['read_uncommitted']):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
