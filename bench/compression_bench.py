"""Batch compression (issue 26): bytes on disk and throughput for none / lz4 / zstd on a
text-like payload, JSON log lines, through a real broker.

    python3 bench/compression_bench.py                       # 100k lines, 2 rounds, 1 broker
    python3 bench/compression_bench.py --records 300000 --brokers 3 --rf 3

A fresh `LocalCluster` of real `laminar serve` processes (fsync `always`) gets, per round and
codec, a topic of one partition. The same `--records` JSON log lines (made once, seeded:
timestamps, levels, services, messages from a few templates, user ids, trace ids, latencies;
about 250 bytes each) are produced through `Producer(compression=...)` with its defaults
(1 MiB batches, 5 ms linger), then read back with a `Consumer` (the client decodes, and so
decompresses, every record). Measured per codec:

* bytes on disk: the partition directory of one replica (store and index files), and the
  ratio of none's to it;
* produce: records/s and MB/s of the lines (uncompressed) from the first send to the last
  acknowledgement, and the leader's CPU seconds meanwhile (it decompresses every batch to
  check its records, then stores the compressed bytes);
* consume: records/s and MB/s from the first read to the last record;
* the codec's own cost, without the network or the brokers (one thread, the best of 3): MB/s
  of lines through `encode_batch` (the producer), `verify_batch` (the broker's check at
  append: checksum, decompression within the limit, the C record walk) and `records_from`
  (the client's decoding), in batches of up to 1 MiB of records as the Producer makes them.

Codecs take turns within each round (none, lz4, zstd, then the next round in another order),
so a machine growing busier lands on all alike; the medians over the rounds are printed, then
one JSON object as the last line. Bounded: each phase stops after `--max-seconds`. The data
directory is removed at the end, also on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "broker"))
sys.path.insert(0, str(HERE))

from machine import cpu_seconds, load_avg_1m  # noqa: E402

from laminar.client import AsyncClient, Consumer, Producer  # noqa: E402
from laminar.local_cluster import LocalCluster  # noqa: E402
from laminar.log.batch import (  # noqa: E402
    BATCH_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    Record,
    encode_batch,
    records_from,
    verify_batch,
)

PREFIX = "127.0.62"
BATCH_BYTES = 1 << 20  # (the Producer's default max_batch_bytes)
CODECS = ("none", "lz4", "zstd")
CODEC_FIGURES = ("encode_mb_per_s", "verify_mb_per_s", "decode_mb_per_s")
FIGURES = (
    "disk_bytes",
    "produce_records_per_s",
    "produce_mb_per_s",
    "leader_cpu_s",
    "consume_records_per_s",
    "consume_mb_per_s",
)
LEVELS = ("info",) * 8 + ("warn", "error")
SERVICES = ("checkout", "payments", "search", "catalog", "auth", "shipping")
MESSAGES = (
    "order {n} paid",
    "cart {n} updated with {k} items",
    "user {u} signed in",
    "payment {n} declined: card expired",
    "search for 'item {k}' answered with {k} results",
    "shipment {n} handed to the carrier",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def log_lines(count: int, seed: int = 26) -> list[bytes]:
    """`count` JSON log lines, the same for every codec and run."""
    rng = random.Random(seed)
    start_ms = 1_767_225_600_000
    lines = []
    for i in range(count):
        n, k, u = rng.randrange(10**6), rng.randrange(1, 40), rng.randrange(5000)
        lines.append(
            json.dumps(
                {
                    "ts": start_ms + i * 3 + rng.randrange(3),
                    "level": rng.choice(LEVELS),
                    "service": rng.choice(SERVICES),
                    "host": f"web-{rng.randrange(12):02d}",
                    "msg": rng.choice(MESSAGES).format(n=n, k=k, u=u),
                    "user": f"user-{u}",
                    "trace_id": f"{rng.getrandbits(64):016x}",
                    "latency_ms": round(rng.lognormvariate(3, 0.8), 1),
                },
                separators=(",", ":"),
            ).encode()
        )
    return lines


def codec_costs(lines: list[bytes], codec: str) -> dict[str, float]:
    """MB/s of `lines` through the producer's encoding, the broker's check and the client's
    decoding, in batches of up to BATCH_BYTES of records: the best of 3 passes."""
    compression = None if codec == "none" else codec
    groups: list[list[Record]] = [[]]
    size = 0
    for line in lines:
        size += RECORD_HEADER_BYTES + len(line)
        if size > BATCH_BYTES - BATCH_HEADER_BYTES:
            groups.append([])
            size = RECORD_HEADER_BYTES + len(line)
        groups[-1].append(Record(line, timestamp_ms=0))
    total_mb = sum(len(line) for line in lines) / 1e6
    best = {name: float("inf") for name in CODEC_FIGURES}
    for _ in range(3):
        started = time.perf_counter()
        batches = [encode_batch(group, compression=compression) for group in groups]
        encoded = time.perf_counter()
        for batch in batches:
            verify_batch(batch, BATCH_BYTES)
        verified = time.perf_counter()
        for batch in batches:
            records_from(batch, 0, len(lines))
        decoded = time.perf_counter()
        for name, seconds in zip(
            CODEC_FIGURES, (encoded - started, verified - encoded, decoded - verified), strict=True
        ):
            best[name] = min(best[name], seconds)
    return {name: round(total_mb / seconds, 1) for name, seconds in best.items()}


def disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


async def one(
    cluster: LocalCluster, topic: str, codec: str, lines: list[bytes], rf: int, max_s: float
) -> dict[str, Any]:
    """Produce `lines` to a new topic compressed with `codec`, read them back: the figures."""
    total_bytes = sum(len(line) for line in lines)
    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=60) as client:
        await client.create_topic(topic, partitions=1, replication_factor=rf)
        described = await client.wait_for_leaders(topic)
        leader = described.partition_states[0].leader
        assert leader is not None
        leader_pid = cluster.nodes[leader].pid
        assert leader_pid is not None
        cpu_before = cpu_seconds(leader_pid) or 0.0
        started = time.perf_counter()
        deadline = started + max_s
        sent = 0
        compression = None if codec == "none" else codec
        async with Producer(client, topic, compression=compression, partitions=1) as producer:
            last = None
            for line in lines:
                last = await producer.send(line)
                sent += 1
                if sent % 1000 == 0 and time.perf_counter() > deadline:
                    break
            await producer.flush()
        assert last is not None
        end = (await last).index + 1
        produce_s = time.perf_counter() - started
        leader_cpu_s = (cpu_seconds(leader_pid) or 0.0) - cpu_before

        started = time.perf_counter()
        deadline = started + max_s
        got = 0
        async with Consumer(client, topic, wait_ms=200) as consumer:
            async for _, record in consumer:
                got += 1
                if record.index + 1 >= end or time.perf_counter() > deadline:
                    break
        consume_s = time.perf_counter() - started
    partition_dir = cluster.nodes[leader].data_dir / "partitions" / topic / "0"
    sent_bytes = total_bytes * sent / len(lines)
    return {
        "records": sent,
        "consumed": got,
        "disk_bytes": disk_bytes(partition_dir),
        "produce_records_per_s": round(sent / produce_s),
        "produce_mb_per_s": round(sent_bytes / produce_s / 1e6, 1),
        "leader_cpu_s": round(leader_cpu_s, 2),
        "consume_records_per_s": round(got / consume_s),
        "consume_mb_per_s": round(sent_bytes * got / max(sent, 1) / consume_s / 1e6, 1),
    }


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    lines = log_lines(args.records)
    average = sum(len(line) for line in lines) / len(lines)
    log(f"{len(lines)} JSON log lines of {average:.0f} bytes on average, e.g. {lines[0]!r}")
    cluster = LocalCluster(root / "cluster", args.brokers, prefix=PREFIX)
    rows: dict[str, list[dict[str, Any]]] = {codec: [] for codec in CODECS}
    try:
        cluster.start()
        for round_number in range(args.rounds):
            order = CODECS if round_number % 2 == 0 else CODECS[::-1]
            for codec in order:
                topic = f"logs-{codec}-{round_number}"
                row = await one(cluster, topic, codec, lines, args.rf, args.max_seconds)
                rows[codec].append(row)
                log(f"round {round_number + 1} {codec:>4}: " + json.dumps(row))
    finally:
        cluster.stop()
    medians = {
        codec: {k: round(statistics.median(r[k] for r in runs), 2) for k in FIGURES}
        for codec, runs in rows.items()
    }
    none_bytes = medians["none"]["disk_bytes"]
    for codec in CODECS:
        medians[codec]["disk_ratio"] = round(none_bytes / medians[codec]["disk_bytes"], 2)
        medians[codec].update(codec_costs(lines, codec))
    return {
        "records": args.records,
        "average_line_bytes": round(average, 1),
        "brokers": args.brokers,
        "rf": args.rf,
        "rounds": args.rounds,
        "load_1m": load_avg_1m(),
        "codecs": medians,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="JSON log lines")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--rf", type=int, default=1, help="replication factor")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound of each phase")
    args = parser.parse_args()
    if not 1 <= args.records <= 10_000_000 or not 1 <= args.rounds <= 10:
        parser.error("--records must be in 1..10000000 and --rounds in 1..10")
    if not 1 <= args.rf <= args.brokers:
        parser.error("--rf must be in 1..--brokers")
    root = Path(tempfile.mkdtemp(prefix="laminar-compression-"))
    try:
        result = asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    columns = (*FIGURES, "disk_ratio", *CODEC_FIGURES)
    print(f"{'codec':>5} " + " ".join(f"{k:>22}" for k in columns))
    for codec, figures in result["codecs"].items():
        print(f"{codec:>5} " + " ".join(f"{figures[k]:>22}" for k in columns))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
