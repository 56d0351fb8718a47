"""The `laminar` Spark source and sink: rows/s of a batch read and of a sink write, beside
`spark.range` producing rows of the same size as the engine's own ceiling, in one run.

A local 3-broker cluster on loopback gets N records of 1120 bytes (the laminarmq "k" size)
in 6 partitions; Spark (local[2], the machine's 2 cores shared with the brokers) then
1. reads them all into the `noop` sink (nothing is done with the rows but making them), with
   the laminar source and with laminar-jvm (its batch read in Java);
2. reads N rows of the source's schema from a Python data source that yields ready-made
   Arrow batches (no I/O, no decoding) into `noop`: the ceiling of Spark's Python data
   source path, which every Python source, this one included, goes through;
3. makes N rows of a 1120-byte binary column with spark.range into `noop`: the engine's
   ceiling for rows made in the JVM;
4. writes N spark.range rows (6 Spark partitions, as many as the topic has) to a new
   6-partition topic with the laminar sink.
Each is run once to warm up, then --repeats times; the median is reported with the range,
and the CPU seconds the brokers, the JVM and the Python processes spent (medians). The two
reads and the ready-made source take turns, round by round, so that all meet the same load
from whatever else runs on the machine; each read's ratio is the median of the rounds'. Also
printed: the read path without Spark (the same ranges read into Arrow batches by one Python
process), and a machine limit: the CPU seconds of moving the same bytes from one socket to
another over loopback TCP, with no HTTP, broker or decoding. Targets (issue 26): the read
at >= 0.85 of the ready-made source's rows/s, and the sink at >= 100,000 rows/s.

    python bench/spark_bench.py [--records 1000000] [--repeats 3] [--only read|write]
        [--conf KEY=VALUE ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from laminar.client import Client
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record, encode_batch
from laminar.spark.arrow import TIMESTAMP_TYPE, arrow_schema, schema_ddl
from laminar.spark.jar import jar_path
from laminar.spark.options import Options, Range
from laminar.spark.source import READ_MAX_BYTES, read_range

RECORD_BYTES = 1120
PARTITIONS = 6
RECORDS_PER_BATCH = 500
#: The read's target, as a share of the ready-made source's rows/s in the same run.
READ_TARGET_OF_CEILING = 0.85
SINK_TARGET_ROWS_PER_S = 100_000
ROOT = Path(__file__).resolve().parents[1]


def fill(cluster: LocalCluster, topic: str, records: int) -> float:
    """N records of RECORD_BYTES into the topic's partitions; returns the seconds it took."""
    per_partition = records // PARTITIONS
    started = time.perf_counter()

    def partition(p: int) -> None:
        with Client(cluster.urls, token=cluster.token) as client:
            done = 0
            while done < per_partition:
                count = min(RECORDS_PER_BATCH, per_partition - done)
                value = bytes([65 + p]) * RECORD_BYTES
                client.append(topic, p, encode_batch([Record(value=value)] * count))
                done += count

    with ThreadPoolExecutor(PARTITIONS) as pool:
        list(pool.map(partition, range(PARTITIONS)))
    return time.perf_counter() - started


class CeilingSource(DataSource):
    """Rows of the laminar source's schema from ready-made Arrow batches: what Spark's Python
    data source path costs with nothing to fetch or decode (option `rows`)."""

    @classmethod
    def name(cls) -> str:
        return "ceiling"

    def schema(self) -> str:
        return schema_ddl(False)

    def reader(self, schema: Any) -> DataSourceReader:
        return CeilingReader(int(self.options["rows"]))


class CeilingReader(DataSourceReader):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Any:
        per_batch = READ_MAX_BYTES // RECORD_BYTES  # as many rows as one read of the source
        batch = ceiling_batch(per_batch, partition.value)
        left = self.rows // PARTITIONS
        while left > 0:
            yield batch.slice(0, min(per_batch, left))
            left -= per_batch


def ceiling_batch(rows: int, partition: int) -> pa.RecordBatch:
    """The columns the laminar source makes of `rows` records of the bench's data, built
    directly: through ColumnBuilder it would cost an encode_batch per partition and run
    (about 0.4 s of Python each), which is not the path being measured."""
    values = np.full(rows * RECORD_BYTES, 65 + partition, dtype=np.uint8)
    topic = b"bench-in"
    offsets = pa.array(np.arange(rows, dtype=np.int64))
    columns = [
        pa.nulls(rows, pa.binary()),
        pa.Array.from_buffers(
            pa.binary(), rows,
            [None, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * RECORD_BYTES),
             pa.py_buffer(values)],
        ),
        pa.Array.from_buffers(
            pa.string(), rows,
            [None, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * len(topic)),
             pa.py_buffer(topic * rows)],
        ),
        pa.array(np.full(rows, partition, dtype=np.int32)),
        offsets,
        pa.array(np.arange(rows, dtype=np.int64), type=TIMESTAMP_TYPE),
        pa.array(np.zeros(rows, dtype=np.int32)),
        offsets,  # index
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(False))


def loopback_transfer(size_bytes: int) -> None:
    """`size_bytes` from one thread of this process to another over loopback TCP in 16 MiB
    sends, received into one reused buffer: nothing parsed, checked or kept. What moving the
    read's bytes between two processes costs the machine, HTTP, brokers and decoding aside."""
    chunk = bytes(READ_MAX_BYTES)
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        receiver, _ = server.accept()

        def send() -> None:
            with sender:
                left = size_bytes
                while left > 0:
                    sender.sendall(memoryview(chunk)[: min(len(chunk), left)])
                    left -= len(chunk)

        with ThreadPoolExecutor(1) as pool, receiver:
            sent = pool.submit(send)
            buffer = memoryview(bytearray(len(chunk)))
            received = 0
            while count := receiver.recv_into(buffer):
                received += count
            sent.result()
    assert received == size_bytes, received


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> dict[int, str]:
    """The processes below `pid`, with their names."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                head, tail = (entry / "stat").read_text().rsplit(")", 1)
            except OSError:
                continue
            names[int(entry.name)] = head.split("(", 1)[1]
            children.setdefault(int(tail.split()[1]), []).append(int(entry.name))
    out: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out[child] = names[child]
        todo.extend(children.get(child, []))
    return out


def cpu_by_group(brokers: list[int]) -> dict[str, float]:
    """CPU seconds so far of the brokers, the JVM and Python (this process and Spark's
    Python workers; the brokers are this process's children too, and counted apart)."""
    groups = {"brokers": sum(cpu_s(p) for p in brokers), "jvm": 0.0, "python": cpu_s(os.getpid())}
    for pid, name in descendants(os.getpid()).items():
        if pid not in brokers:
            groups["jvm" if name == "java" else "python"] += cpu_s(pid)
    return groups


def timed(action: Any, repeats: int, brokers: list[int]) -> tuple[list[float], dict[str, float]]:
    """Seconds of each of `repeats` runs, after one untimed run (JIT, Python workers), and
    the median CPU seconds each process group spent in a run."""
    action()
    runs = [once(action, brokers) for _ in range(repeats)]
    return [s for s, _ in runs], medians([cpu for _, cpu in runs])


def once(action: Any, brokers: list[int]) -> tuple[float, dict[str, float]]:
    """Seconds of one run of `action`, and the CPU seconds each process group spent in it."""
    before = cpu_by_group(brokers)
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    after = cpu_by_group(brokers)
    return seconds, {group: after[group] - before[group] for group in after}


def medians(spent: list[dict[str, float]]) -> dict[str, float]:
    return {group: statistics.median(s[group] for s in spent) for group in spent[0]}


def taking_turns(
    actions: list[Any], repeats: int, brokers: list[int]
) -> tuple[list[tuple[list[float], dict[str, float]]], list[list[float]]]:
    """`timed` of actions whose runs take turns (the order rotates from round to round, so
    that each meets the same load from whatever else runs), and for every action after the
    first the ratio of its rate to the first's, round by round."""
    for action in actions:
        action()
    runs: list[list[tuple[float, dict[str, float]]]] = [[] for _ in actions]
    for repeat in range(repeats):
        for turn in range(len(actions)):
            which = (repeat + turn) % len(actions)
            runs[which].append(once(actions[which], brokers))
    timings = [([s for s, _ in r], medians([c for _, c in r])) for r in runs]
    ratios = [
        [first[0] / other[0] for first, other in zip(runs[0], r, strict=True)] for r in runs[1:]
    ]
    return timings, ratios


def summary(rows: int, run: tuple[list[float], dict[str, float]]) -> dict[str, Any]:
    seconds, cpu = run
    rates = sorted(rows / s for s in seconds)
    return {"rows_per_s": statistics.median(rates), "min": rates[0], "max": rates[-1], "cpu_s": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    parser.add_argument("--only", choices=("read", "write"), help="run only the reads or the write")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    records = args.records // PARTITIONS * PARTITIONS

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from laminar.spark import register

    results: dict[str, Any] = {
        "records": records, "record_bytes": RECORD_BYTES, "spark_conf": args.conf
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), 3, prefix="127.0.44", fsync="interval")
        try:
            cluster.start()  # inside: the brokers a failed start left running are stopped too
            with Client(cluster.urls, token=cluster.token) as client:
                client.create_topic("bench-in", partitions=PARTITIONS, replication_factor=3)
                client.create_topic("bench-out", partitions=PARTITIONS, replication_factor=3)
                client.run(client.async_client.wait_for_leaders("bench-in"))
                client.run(client.async_client.wait_for_leaders("bench-out"))
            results["fill_s"] = fill(cluster, "bench-in", records)
            brokers = ",".join(cluster.urls)
            pids = [n.pid for n in cluster.nodes.values() if n.pid is not None]

            raw = {"brokers": brokers, "topic": "bench-in", "token": cluster.token}
            options = Options.parse(raw, stream=False)
            with Client(cluster.urls, token=cluster.token) as client:
                states = client.describe_topic("bench-in").partition_states
            ranges = [
                Range("bench-in", s.partition, s.log_start, s.commit_index + 1) for s in states
            ]

            def plain() -> None:
                rows = sum(b.num_rows for r in ranges for b in read_range(options, r))
                assert rows == records, rows

            if args.only != "write":
                results["python_read"] = summary(records, timed(plain, args.repeats, pids))
                results["loopback"] = summary(
                    records,
                    timed(lambda: loopback_transfer(records * RECORD_BYTES), args.repeats, pids),
                )

            builder = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.driver.memory", "4g")
                .config("spark.jars", str(jar_path()))
            )
            for setting in args.conf:
                key, _, value = setting.partition("=")
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            register(spark)
            spark.dataSource.register(CeilingSource)
            source = spark.read.format("laminar").option("brokers", brokers)
            source = source.option("token", cluster.token)
            read = source.option("subscribe", "bench-in").load()
            jvm_read = (
                spark.read.format("laminar-jvm").option("brokers", brokers)
                .option("token", cluster.token).option("subscribe", "bench-in").load()
            )  # fmt: skip
            # as many Spark partitions as the topics have: made where they are written (a
            # repartition would add a shuffle of the 1.12 GB to what the sink is timed with)
            ranged = spark.range(0, records, 1, PARTITIONS).selectExpr(
                f"cast(repeat('x', {RECORD_BYTES}) as binary) value"
            )
            ceiling = spark.read.format("ceiling").option("rows", records).load()

            def into_noop(frame: Any) -> Any:
                return lambda: frame.write.format("noop").mode("overwrite").save()

            if args.only != "write":
                (made, laminar, jvm), (ratios, jvm_ratios) = taking_turns(
                    [into_noop(ceiling), into_noop(read), into_noop(jvm_read)], args.repeats, pids
                )
                results["python_source"] = summary(records, made)
                results["spark_read"] = summary(records, laminar)
                results["read_of_ceiling"] = statistics.median(ratios)
                results["read_of_ceiling_runs"] = ratios
                results["jvm_read"] = summary(records, jvm)
                results["jvm_read_of_ceiling"] = statistics.median(jvm_ratios)
                results["jvm_read_of_ceiling_runs"] = jvm_ratios
                results["spark_range"] = summary(
                    records, timed(into_noop(ranged), args.repeats, pids)
                )
            if args.only != "read":
                sink = (
                    ranged.write.format("laminar")
                    .option("brokers", brokers)
                    .option("token", cluster.token)
                    .option("topic", "bench-out")
                    .mode("append")
                )
                results["spark_write"] = summary(records, timed(sink.save, args.repeats, pids))
            spark.stop()
        finally:
            cluster.stop()
    report(results)
    if args.json:
        print(json.dumps(results))
    return 0


def report(results: dict[str, Any]) -> None:
    print(f"{results['records']:,} records of {results['record_bytes']} B in {PARTITIONS} "
          f"partitions (filled in {results['fill_s']:.1f} s)")  # fmt: skip
    if results["spark_conf"]:
        print("Spark settings:", " ".join(results["spark_conf"]))
    ceiling = results.get("spark_range", {}).get("rows_per_s")
    python_ceiling = results.get("python_source", {}).get("rows_per_s")
    for name, label in (
        ("spark_range", "spark.range into noop (the JVM's ceiling)"),
        ("python_source", "ready-made Arrow batches from Python"),
        ("spark_read", "laminar source into noop"),
        ("jvm_read", "laminar-jvm source into noop"),
        ("spark_write", "spark.range into the laminar sink"),
        ("python_read", "read_range, one Python process, no Spark"),
        ("loopback", "the same bytes over loopback TCP, no more"),
    ):
        if name not in results:
            continue
        r = results[name]
        cpu = ", ".join(f"{group} {s:.2f}" for group, s in r["cpu_s"].items())
        shares = "".join(
            f", {r['rows_per_s'] / of:.2f} of {what}"
            for of, what in ((ceiling, "the JVM's"), (python_ceiling, "the Python source's"))
            if of
        )
        print(f"{label:44} {r['rows_per_s']:>12,.0f} rows/s ({r['min']:,.0f}-{r['max']:,.0f}), "
              f"{r['rows_per_s'] * results['record_bytes'] / 1e6:,.0f} MB/s{shares}")  # fmt: skip
        print(f"{'':44} CPU seconds a run: {cpu}")
    for key, name in (("read_of_ceiling", "laminar"), ("jvm_read_of_ceiling", "laminar-jvm")):
        if key not in results:
            continue
        runs = ", ".join(f"{ratio:.2f}" for ratio in results[f"{key}_runs"])
        share = results[key]
        met = "met" if share >= READ_TARGET_OF_CEILING else "not met"
        print(f"{name} read / ready-made source, run by run: {runs}; median {share:.2f}: "
              f"target >= {READ_TARGET_OF_CEILING} {met}")  # fmt: skip
    if "spark_write" in results:
        rate = results["spark_write"]["rows_per_s"]
        met = "met" if rate >= SINK_TARGET_ROWS_PER_S else "not met"
        print(f"sink target >= {SINK_TARGET_ROWS_PER_S:,} rows/s: {met}")


if __name__ == "__main__":
    raise SystemExit(main())
