"""Latency at a steady rate on 3 brokers, RF 3 (issue 22): `bench/compare.py`'s `latency`
phase alone, to compare trees quickly.

    python3 bench/latency_bench.py [--rounds 3] [--rate 5000] [--seconds 10] [--linger-ms 1]

Each round starts a fresh 3-broker cluster (fsync always: every acknowledgement after a
majority's fdatasync), runs `laminar bench produce` at --rate msg/s of 1120-byte records over
6 partitions (linger --linger-ms) for --seconds, and removes the cluster. Printed per round
and as medians: p50, p99 and p99.9 from each record's due time to its acknowledgement, and
the brokers' CPU seconds per million records (from /proc), beside the machine's fdatasync
rate.
To compare two trees, run each tree's own copy of this script in turn: the brokers and the
load run the code of the tree the script is in (`LocalCluster.broker_env`), whatever
PYTHONPATH or an editable install says (bench/RESULTS.md, issue 22, eighth sitting).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from compare import laminar_bench, repeat_rounds

from laminar.local_cluster import LocalCluster

PREFIX = "127.0.26"  # the cluster's loopback /24
FIGURES = ("latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "server_cpu_s_per_million")


def one_round(root: Path, rate: int, seconds: float, linger_ms: float) -> dict[str, Any]:
    cluster = LocalCluster(root / "latency", 3, prefix=PREFIX, fsync="always")
    arguments = ["produce", "--topic", "latency", "--partitions", "6", "--rate", str(rate),
                 "--seconds", f"{seconds:g}", "--linger-ms", f"{linger_ms:g}", "--size", "1120",
                 "--replication-factor", "3", "--max-seconds", f"{seconds + 50:g}"]  # fmt: skip
    try:
        cluster.start()
        return laminar_bench(cluster, arguments, seconds + 180)
    finally:
        cluster.stop()
        shutil.rmtree(root / "latency", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=5000, help="msg/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="each round's load")
    parser.add_argument(
        "--linger-ms",
        type=float,
        default=1.0,
        help="the producer's linger (at 1 ms and 5k msg/s the load saturates this machine's "
        "2 cores: bench/RESULTS.md, issue 22, twenty-fifth sitting)",
    )
    args = parser.parse_args()
    repeat_rounds(
        "latency",
        args.rounds,
        lambda root: one_round(root, args.rate, args.seconds, args.linger_ms),
        FIGURES,
    )


if __name__ == "__main__":
    main()
