"""One record per HTTP request (issue 22): the broker's cost per request against the floor of
its HTTP stack, measured in the same run.

    python3 bench/single_bench.py [--rounds 3] [--seconds 8]

Each round, interleaved: wrk (a C load generator: the client is not the limit) POSTs one
1120-byte record per request on 64 keep-alive connections for --seconds to a fresh one-broker
cluster (RF 1, fsync always, every answer after its fdatasync); then the same load against
bench/http_floor.py on the broker's HTTP stack and on aiohttp's alone, answering each request
with nothing behind it. Printed per round and as medians: requests/s, server CPU seconds per
million requests (from /proc), wrk's p50 and p99, and the broker's ratios to both floors.
To compare two trees, run each tree's own copy of this script: its broker runs the code of
the tree the script is in (`LocalCluster.broker_env`; bench/RESULTS.md, issue 22).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from compare import SINGLE_IN_FLIGHT, log, wrk_floor, wrk_single
from machine import fdatasync_per_s, load_avg_1m

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster

PREFIX = "127.0.25"  # the cluster's loopback /24
FIGURES = ("msgs_per_s", "server_cpu_s_per_million", "batch_latency_p50_ms",
           "batch_latency_p99_ms")  # fmt: skip


async def _create(cluster: LocalCluster, topic: str) -> None:
    token = cluster.token_file.read_text().strip()
    async with AsyncClient(cluster.urls, token=token) as client:
        await client.create_topic(topic, partitions=1, replication_factor=1)
        await client.wait_for_leaders(topic)


def broker_round(root: Path, size: int, seconds: float) -> dict[str, Any]:
    cluster = LocalCluster(root / "single", 1, prefix=PREFIX, fsync="always")
    try:
        cluster.start()
        asyncio.run(_create(cluster, "single"))
        url = cluster.urls[0] + "/v1/topics/single/partitions/0/records"
        return wrk_single(cluster, url, size, seconds, SINGLE_IN_FLIGHT, root)
    finally:
        cluster.stop()
        shutil.rmtree(root / "single", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk's run, each phase")
    parser.add_argument("--size", type=int, default=1120, help="record bytes")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="laminar-single-"))
    rows: dict[str, list[dict[str, Any]]] = {"broker": [], "floor": [], "aiohttp_floor": []}
    try:
        machine = {"fdatasync_per_s": fdatasync_per_s(root), "load_1m": load_avg_1m()}
        log(f"machine: {machine}")
        for n in range(args.rounds):
            rows["broker"].append(broker_round(root, args.size, args.seconds))
            rows["floor"].append(wrk_floor(args.size, args.seconds, SINGLE_IN_FLIGHT, root))
            rows["aiohttp_floor"].append(
                wrk_floor(args.size, args.seconds, SINGLE_IN_FLIGHT, root, "aiohttp")
            )
            for name, runs in rows.items():
                log(f"round {n + 1} {name}: " + ", ".join(f"{k} {runs[-1][k]}" for k in FIGURES))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        name: {k: statistics.median(r[k] for r in runs) for k in FIGURES}
        for name, runs in rows.items()
    }
    broker = medians["broker"]
    for floor in ("floor", "aiohttp_floor"):
        base = medians[floor]
        medians["broker"][f"throughput_vs_{floor}"] = round(
            broker["msgs_per_s"] / base["msgs_per_s"], 3
        )
        medians["broker"][f"cpu_vs_{floor}"] = round(
            broker["server_cpu_s_per_million"] / base["server_cpu_s_per_million"], 3
        )
    print(json.dumps({"machine": machine, "medians": medians, "rounds": rows}))


if __name__ == "__main__":
    main()
