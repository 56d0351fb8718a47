"""The `laminar` Spark source and sink: rows/s of a batch read and of a sink write, beside
`spark.range` producing rows of the same size as the engine's own ceiling, in one run.

A local 3-broker cluster on loopback gets N records of 1120 bytes (the laminarmq "k" size)
in 6 partitions; Spark (local[2], the machine's 2 cores shared with the brokers) then
1. reads them all into the `noop` sink (nothing is done with the rows but making them);
2. makes N rows of a 1120-byte binary column with spark.range into `noop`: the ceiling;
3. writes N spark.range rows to a new 6-partition topic with the laminar sink.
Each is run once to warm up, then --repeats times; the median is reported with the range.
Also printed: the read path without Spark (the same ranges read into Arrow batches by one
Python process), which is what one Spark task can at most do. Target (issue 9): >= 1M rows/s read.

    python bench/spark_bench.py [--records 1000000] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from laminar.client import Client
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record, encode_batch
from laminar.spark.options import Options, Range
from laminar.spark.source import read_range

RECORD_BYTES = 1120
PARTITIONS = 6
RECORDS_PER_BATCH = 500
TARGET_ROWS_PER_S = 1_000_000
ROOT = Path(__file__).resolve().parents[1]


def fill(cluster: LocalCluster, topic: str, records: int) -> float:
    """N records of RECORD_BYTES into the topic's partitions; returns the seconds it took."""
    per_partition = records // PARTITIONS
    started = time.perf_counter()

    def partition(p: int) -> None:
        with Client(cluster.urls) as client:
            done = 0
            while done < per_partition:
                count = min(RECORDS_PER_BATCH, per_partition - done)
                value = bytes([65 + p]) * RECORD_BYTES
                client.append(topic, p, encode_batch([Record(value=value)] * count))
                done += count

    with ThreadPoolExecutor(PARTITIONS) as pool:
        list(pool.map(partition, range(PARTITIONS)))
    return time.perf_counter() - started


def timed(action: Any, repeats: int) -> list[float]:
    """Seconds of each of `repeats` runs, after one untimed run (JIT, Python workers)."""
    action()
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        out.append(time.perf_counter() - started)
    return out


def summary(rows: int, seconds: list[float]) -> dict[str, float]:
    rates = sorted(rows / s for s in seconds)
    return {"rows_per_s": statistics.median(rates), "min": rates[0], "max": rates[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    records = args.records // PARTITIONS * PARTITIONS

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from laminar.spark import register

    results: dict[str, Any] = {"records": records, "record_bytes": RECORD_BYTES}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), 3, prefix="127.0.44", fsync="interval")
        cluster.start()
        try:
            with Client(cluster.urls) as client:
                client.create_topic("bench-in", partitions=PARTITIONS, replication_factor=3)
                client.create_topic("bench-out", partitions=PARTITIONS, replication_factor=3)
                client.run(client.async_client.wait_for_leaders("bench-in"))
                client.run(client.async_client.wait_for_leaders("bench-out"))
            results["fill_s"] = fill(cluster, "bench-in", records)
            brokers = ",".join(cluster.urls)

            options = Options.parse({"brokers": brokers, "topic": "bench-in"}, stream=False)
            with Client(cluster.urls) as client:
                states = client.describe_topic("bench-in").partition_states
            ranges = [
                Range("bench-in", s.partition, s.log_start, s.commit_index + 1) for s in states
            ]

            def plain() -> None:
                rows = sum(b.num_rows for r in ranges for b in read_range(options, r))
                assert rows == records, rows

            results["python_read"] = summary(records, timed(plain, args.repeats))

            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.driver.memory", "4g")
                .getOrCreate()
            )
            register(spark)
            source = spark.read.format("laminar").option("brokers", brokers)
            read = source.option("topic", "bench-in").load()
            ranged = spark.range(records).selectExpr(
                f"cast(repeat('x', {RECORD_BYTES}) as binary) value"
            )

            results["spark_read"] = summary(
                records,
                timed(lambda: read.write.format("noop").mode("overwrite").save(), args.repeats),
            )
            results["spark_range"] = summary(
                records,
                timed(lambda: ranged.write.format("noop").mode("overwrite").save(), args.repeats),
            )
            sink = (
                ranged.repartition(PARTITIONS)
                .write.format("laminar")
                .option("brokers", brokers)
                .option("topic", "bench-out")
                .mode("append")
            )
            results["spark_write"] = summary(records, timed(sink.save, args.repeats))
            spark.stop()
        finally:
            cluster.stop()
    report(results)
    if args.json:
        print(json.dumps(results))
    return 0


def report(results: dict[str, Any]) -> None:
    ceiling = results["spark_range"]["rows_per_s"]
    print(f"{results['records']:,} records of {results['record_bytes']} B in {PARTITIONS} "
          f"partitions (filled in {results['fill_s']:.1f} s)")  # fmt: skip
    for name, label in (
        ("spark_range", "spark.range into noop (the ceiling)"),
        ("spark_read", "laminar source into noop"),
        ("spark_write", "spark.range into the laminar sink"),
        ("python_read", "read_range, one Python process, no Spark"),
    ):
        r = results[name]
        print(f"{label:44} {r['rows_per_s']:>12,.0f} rows/s ({r['min']:,.0f}-{r['max']:,.0f}), "
              f"{r['rows_per_s'] * results['record_bytes'] / 1e6:,.0f} MB/s, "
              f"{r['rows_per_s'] / ceiling:.2f} of the ceiling")  # fmt: skip
    met = results["spark_read"]["rows_per_s"] >= TARGET_ROWS_PER_S
    print(f"read target >= {TARGET_ROWS_PER_S:,} rows/s: {'met' if met else 'not met'}")


if __name__ == "__main__":
    raise SystemExit(main())
