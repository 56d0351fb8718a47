"""Kafka's default batch over HTTP on one RF 1 broker (issue 22): `bench/compare.py`'s
`kafka_batch` phase alone, with what bounds it, to compare trees quickly.

    python3 bench/batch_bench.py [--rounds 3] [--count 400000] [--batch 14] [--in-flight 5]

Each round starts a fresh one-broker cluster (fsync always: every answer after its
fdatasync), appends --count 1120-byte records over 6 partitions, --batch records per HTTP
request and --in-flight requests per partition (`laminar bench produce`), and removes the
cluster. Printed per round and as medians: msg/s, the broker's and the client's CPU seconds
per million records (from /proc), the client's p50 per append, and from the broker's own
counters over the run: group-commit rounds a second, fdatasync'd files a round, the mean
time a round waits for its disk work, the mean append time inside the broker, and how often a
second its event loop's thread was switched out runnable (involuntary context switches, from
/proc: another thread or process took its CPU).
To compare two trees, run each tree's own copy of this script in turn (its broker runs the
code of the tree the script is in: `LocalCluster.broker_env`).
"""

from __future__ import annotations

import argparse
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

from compare import KAFKA_BATCH_RECORDS, laminar_bench, repeat_rounds
from prometheus_client.parser import text_string_to_metric_families

from laminar.local_cluster import LocalCluster

PREFIX = "127.0.27"  # the cluster's loopback /24
COUNTERS = (
    "laminar_raft_ready_rounds_total",
    "laminar_raft_fsyncs_total",
    "laminar_raft_fsync_seconds_total",
    "laminar_append_latency_seconds_sum",
    "laminar_append_latency_seconds_count",
)
FIGURES = (
    "msgs_per_s",
    "server_cpu_s_per_million",
    "client_cpu_s_per_million",
    "batch_latency_p50_ms",
    "rounds_per_s",
    "files_synced_per_round",
    "disk_wait_ms_per_round",
    "append_in_broker_ms",
    "loop_preempted_per_s",
)


def counters(cluster: LocalCluster) -> dict[str, float]:
    request = urllib.request.Request(
        cluster.urls[0] + "/metrics", headers={"Authorization": f"Bearer {cluster.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS and not sample.labels:
                out[sample.name] = sample.value
    return out


def involuntary_switches(pid: int) -> int:
    """Of the process's main thread: the broker's event loop."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split(":")[1])
    raise RuntimeError(f"no context switch count for {pid}")


def one_round(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    cluster = LocalCluster(root / "batch", 1, prefix=PREFIX, fsync="always")
    arguments = ["produce", "--topic", "batch", "--partitions", "6", "--count", str(args.count),
                 "--batch", str(args.batch), "--in-flight", str(args.in_flight), "--size",
                 "1120", "--replication-factor", "1", "--max-seconds", "120"]  # fmt: skip
    try:
        cluster.start()
        pid = next(iter(cluster.serving_pids().values()))
        before, switched, started = counters(cluster), involuntary_switches(pid), time.monotonic()
        figures = laminar_bench(cluster, arguments, 300)
        seconds = time.monotonic() - started
        switched = involuntary_switches(pid) - switched
        after = counters(cluster)
    finally:
        cluster.stop()
        shutil.rmtree(root / "batch", ignore_errors=True)
    d = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}
    rounds = d["laminar_raft_ready_rounds_total"] or 1.0
    appends = d["laminar_append_latency_seconds_count"] or 1.0
    figures["rounds_per_s"] = round(rounds / seconds)
    figures["files_synced_per_round"] = round(d["laminar_raft_fsyncs_total"] / rounds, 2)
    figures["disk_wait_ms_per_round"] = round(
        1000 * d["laminar_raft_fsync_seconds_total"] / rounds, 3
    )
    figures["append_in_broker_ms"] = round(
        1000 * d["laminar_append_latency_seconds_sum"] / appends, 3
    )
    figures["loop_preempted_per_s"] = round(switched / seconds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=400_000, help="records each round")
    parser.add_argument("--batch", type=int, default=KAFKA_BATCH_RECORDS, help="records a request")
    parser.add_argument("--in-flight", type=int, default=5, help="requests per partition")
    args = parser.parse_args()
    repeat_rounds("batch", args.rounds, lambda root: one_round(root, args), FIGURES)


if __name__ == "__main__":
    main()
