"""`laminar bench produce|consume`: load a running cluster and measure it.

produce, throughput mode: `--count` records of `--size` bytes in batches of `--batch` records,
`--in-flight` appends outstanding per partition; every append is acknowledged only once
committed (a majority of the partition's replicas have it durably, as the brokers' fsync
policy says). The batches are encoded once before the clock starts (the broker cannot tell:
it stamps every batch with its own index and term), so the client's Python work per record
does not limit what is measured. produce, fixed-rate mode (`--rate`): records are due at a
steady rate; every `--linger-ms` (on a fixed schedule) the due records go out as one batch
(partitions take turns), as one HTTP append or, with `--stream`, on the partition's streaming
append; each record's latency runs from its due time to its acknowledgement (no coordinated
omission). A missing topic is created first (`--partitions`, `--replication-factor`), which
a line on stderr says: its leaders' elections take seconds.

consume: reads every partition from the start with binary reads, spread over the in-sync
replicas, counting records from batch headers (`--decode` decodes every record as the client
would).

Prints msg/s, MB/s and latency percentiles; with `--json` the figures as one JSON object on
the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import aiohttp

from . import settings
from .client import AsyncClient, LaminarError, NotFound
from .client.stream import AppendStream
from .contract import BATCH_TYPE, MAX_READ_RECORDS, NEXT_INDEX_HEADER, READ_RECORDS
from .log.batch import Record, decode_batches, encode_batch, parse_header, split_batches
from .log.compression import CODEC_NAMES
from .tls import client_context

DISTINCT_BATCHES = 8
PROGRESS_INTERVAL_S = 0.5
#: the client's connections: one per append in flight (`--partitions` x `--in-flight`) and a
#: few for the topic's metadata calls, at least the client's default (a scale phase of 384
#: appends in flight had a third of them wait for a connection), and at most what the brokers
#: let one client address hold (`--max-connections-per-client`, 256 each by default: a broker
#: refuses the connections over it at once; the client learns the cap from those refusals,
#: and sends their calls again, but the refusals cost a connection each)
DEFAULT_CONNECTIONS = 256
CONNECTIONS_SPARE = 16
CONNECTIONS_PER_BROKER = settings.MAX_CONNECTIONS_PER_CLIENT.default


def connections_for(partitions: int, in_flight: int, brokers: int) -> int:
    """The client's connection limit for `in_flight` appends on each of `partitions`
    partitions, led by `brokers` brokers."""
    wanted = partitions * in_flight + CONNECTIONS_SPARE
    return max(DEFAULT_CONNECTIONS, min(wanted, CONNECTIONS_PER_BROKER * max(1, brokers)))


def percentile_ms(sorted_s: Sequence[float], fraction: float) -> float | None:
    if not sorted_s:
        return None
    position = min(len(sorted_s) - 1, int(fraction * len(sorted_s)))
    return round(sorted_s[position] * 1000, 3)


async def sleep_to_next_tick(tick: float, period_s: float) -> float:
    """Sleep until `period_s` after `tick` (a `time.perf_counter()` reading) and return that
    time: a fixed schedule, which neither the caller's work nor the event loop's timer
    rounding (whole milliseconds) stretches. A tick already past is not made up: the next one
    is now."""
    tick = max(tick + period_s, time.perf_counter())
    await asyncio.sleep(tick - time.perf_counter())
    return tick


class Progress:
    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled
        self.done = 0
        self.started = time.perf_counter()
        self._shown = 0.0

    def add(self, count: int) -> None:
        self.done += count
        now = time.perf_counter()
        if self.enabled and (now - self._shown > PROGRESS_INTERVAL_S or self.done >= self.total):
            self._shown = now
            rate = self.done / max(now - self.started, 1e-9)
            width = 30
            filled = int(width * min(self.done, self.total) / max(self.total, 1))
            bar = "#" * filled + "." * (width - filled)
            sys.stderr.write(
                f"\r{self.label} [{bar}] {self.done}/{self.total} {rate:,.0f} msg/s   "
            )
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass
class ProduceOptions:
    topic: str
    size: int
    count: int
    batch: int
    partitions: int
    replication_factor: int
    in_flight: int
    rate: int | None
    seconds: float
    max_seconds: float
    linger_ms: float = 1.0
    stream: bool = False
    compression: str | None = None


async def ensure_topic(client: AsyncClient, topic: str, partitions: int, rf: int) -> int:
    """Create the topic if missing; wait until every partition has a leader; its partitions.
    Creating one says so on stderr first: it takes seconds (the leaders' elections), which
    without the progress bar (stderr not a terminal) would otherwise pass in silence."""
    try:
        await client.describe_topic(topic)
    except NotFound:
        print(
            f"laminar bench: creating topic {topic} ({partitions} partitions, replication "
            f"factor {rf}) and waiting for its leaders",
            file=sys.stderr,
            flush=True,
        )
        await client.create_topic(topic, partitions=partitions, replication_factor=rf)
    described = await client.wait_for_leaders(topic)
    return len(described.partition_states)


def make_batches(size: int, records: int, compression: str | None = None) -> list[bytes]:
    return [
        encode_batch(
            [Record(value=os.urandom(size)) for _ in range(records)], compression=compression
        )
        for _ in range(DISTINCT_BATCHES)
    ]


async def produce(client: AsyncClient, options: ProduceOptions, progress: bool) -> dict[str, Any]:
    partitions = await ensure_topic(
        client, options.topic, options.partitions, options.replication_factor
    )
    if options.rate:
        return await _produce_at_rate(client, options, partitions)
    batches = make_batches(options.size, options.batch, options.compression)
    total_batches = -(-options.count // options.batch)
    meter = Progress(total_batches * options.batch, "produce", progress)
    latencies: list[float] = []
    next_batch = 0
    deadline = time.perf_counter() + options.max_seconds

    async def worker(partition: int) -> None:
        nonlocal next_batch
        while next_batch < total_batches and time.perf_counter() < deadline:
            number = next_batch
            next_batch += 1
            started = time.perf_counter()
            await client.append(options.topic, partition, batches[number % DISTINCT_BATCHES])
            latencies.append(time.perf_counter() - started)
            meter.add(options.batch)

    async def streamer(partition: int) -> None:
        # one streaming append per partition, `in_flight` batches unacknowledged on it
        nonlocal next_batch
        done = asyncio.get_running_loop().create_future()
        acks = 0

        def acked(sent_at: float, future: asyncio.Future[object]) -> None:
            nonlocal acks
            if future.exception() is None:
                latencies.append(time.perf_counter() - sent_at)
                meter.add(options.batch)
            acks -= 1
            if acks == 0 and sending_ended and not done.done():
                done.set_result(None)

        sending_ended = False
        async with await client.append_stream(
            options.topic, partition, max_in_flight=options.in_flight
        ) as stream:
            while next_batch < total_batches and time.perf_counter() < deadline:
                number = next_batch
                next_batch += 1
                future = await stream.send(batches[number % DISTINCT_BATCHES])
                acks += 1
                future.add_done_callback(partial(acked, time.perf_counter()))
            sending_ended = True
            if acks:
                await done

    started = time.perf_counter()
    if options.stream:
        await asyncio.gather(*(streamer(p) for p in range(partitions)))
    else:
        await asyncio.gather(
            *(worker(p) for p in range(partitions) for _ in range(options.in_flight))
        )
    elapsed = time.perf_counter() - started
    sent = len(latencies) * options.batch
    latencies.sort()
    return {
        "mode": "throughput",
        "records": sent,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(sent / elapsed, 1),
        "mb_per_s": round(sent * options.size / elapsed / 1e6, 2),
        "batch_latency_p50_ms": percentile_ms(latencies, 0.5),
        "batch_latency_p99_ms": percentile_ms(latencies, 0.99),
        "batch_latency_p999_ms": percentile_ms(latencies, 0.999),
        "partitions": partitions,
        "batch_records": options.batch,
        "in_flight_per_partition": options.in_flight,
        "transport": "stream" if options.stream else "http",
    }


async def _produce_at_rate(
    client: AsyncClient, options: ProduceOptions, partitions: int
) -> dict[str, Any]:
    assert options.rate
    total = min(options.count, int(options.rate * options.seconds))
    value = os.urandom(options.size)
    latencies: list[float] = []
    pending: set[asyncio.Task[None]] = set()
    started = time.perf_counter()
    sent = 0
    turn = 0

    streams: list[AppendStream] = []

    async def send(partition: int, due: list[float]) -> None:
        batch = encode_batch([Record(value=value) for _ in due], compression=options.compression)
        if streams:
            await (await streams[partition].send(batch))
        else:
            await client.append(options.topic, partition, batch)
        done = time.perf_counter()
        latencies.extend(done - t for t in due)

    async with contextlib.AsyncExitStack() as stack:
        if options.stream:  # one streaming append per partition, opened before the clock
            for partition in range(partitions):
                stream = await client.append_stream(options.topic, partition, max_in_flight=4096)
                streams.append(await stack.enter_async_context(stream))
            started = time.perf_counter()
        tick = started
        while sent < total:
            now = time.perf_counter()
            due_count = min(total, int((now - started) * options.rate) + 1) - sent
            if due_count > 0:
                due = [started + (sent + i) / options.rate for i in range(due_count)]
                sent += due_count
                task = asyncio.create_task(send(turn % partitions, due))
                turn += 1
                pending.add(task)
                task.add_done_callback(pending.discard)
            tick = await sleep_to_next_tick(tick, options.linger_ms / 1000)
        if pending:
            await asyncio.gather(*pending)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "mode": "fixed_rate",
        "target_rate": options.rate,
        "records": len(latencies),
        "elapsed_s": round(elapsed, 3),
        "achieved_rate": round(len(latencies) / elapsed, 1),
        "latency_p50_ms": percentile_ms(latencies, 0.5),
        "latency_p99_ms": percentile_ms(latencies, 0.99),
        "latency_p999_ms": percentile_ms(latencies, 0.999),
        "latency_max_ms": percentile_ms(latencies, 1.0),
        "partitions": partitions,
        "transport": "stream" if options.stream else "http",
    }


async def consume(
    client: AsyncClient,
    topic: str,
    *,
    max_bytes: int,
    decode: bool,
    progress: bool,
    token: str | None,
    ca_file: str | None = None,
) -> dict[str, Any]:
    described = await client.describe_topic(topic)
    expected = sum(max(0, p.commit_index + 1 - p.log_start) for p in described.partition_states)
    meter = Progress(expected, "consume", progress)
    members = {m.id: m.api_url for m in (await client.cluster()).members}
    headers = {"Accept": BATCH_TYPE}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    counts: list[int] = []
    total_bytes = 0

    async def read_partition(session: aiohttp.ClientSession, n: int) -> None:
        nonlocal total_bytes
        state = described.partition_states[n]
        replicas = [r for r in state.in_sync if r in members] or [state.leader or ""]
        base = members.get(replicas[n % len(replicas)], state.leader_url or "")
        position, end, records = state.log_start, state.commit_index + 1, 0
        url = base + READ_RECORDS.url(topic=topic, partition=n)
        while position < end:
            # wait_ms: a follower may not yet have learned the leader's commit index
            params = {
                "from": str(position), "max_bytes": str(max_bytes),
                "max_records": str(MAX_READ_RECORDS), "wait_ms": "10000",
            }  # fmt: skip
            async with session.get(url, params=params, headers=headers) as response:
                if response.status != 200:
                    raise LaminarError(response.status, "read", await response.text())
                body = await response.read()
                next_index = int(response.headers[NEXT_INDEX_HEADER])
            total_bytes += len(body)
            got = 0
            for batch in split_batches(body):
                header = parse_header(batch)
                if header.is_control:
                    continue
                if decode:
                    got += sum(1 for r in decode_batches(batch) if r.index >= position)
                else:
                    got += header.next_index - max(position, header.base_index)
            records += got
            meter.add(got)
            if next_index <= position:
                break
            position = next_index
        counts.append(records)

    started = time.perf_counter()
    tls = client_context(ca_file) if ca_file else True
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session:
        await asyncio.gather(
            *(read_partition(session, n) for n in range(len(described.partition_states)))
        )
    elapsed = time.perf_counter() - started
    total = sum(counts)
    return {
        "records": total,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(total / elapsed, 1) if elapsed else None,
        "mb_per_s": round(total_bytes / elapsed / 1e6, 2) if elapsed else None,
        "partitions": len(described.partition_states),
        "decoded": decode,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `laminar bench` options (their help says each default)."""
    parser.add_argument(
        "mode",
        choices=["produce", "consume"],
        help="produce: append records (creating the topic if missing); consume: read the "
        "topic from the start",
    )
    parser.add_argument("--topic", default="bench", help="the topic")
    parser.add_argument(
        "--size", type=int, default=1120, metavar="BYTES", help="each record's value, in bytes"
    )
    parser.add_argument(
        "--count", type=int, default=1_000_000, help="records to produce (throughput mode)"
    )
    parser.add_argument("--batch", type=int, default=500, help="records per append")
    parser.add_argument(
        "--partitions", type=int, default=6, help="partitions, when creating the topic"
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=3,
        help="replicas per partition, when creating the topic",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=2,
        help="appends in flight per partition (with --stream: unacknowledged batches, up to 4096)",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="send the batches over one streaming append (WebSocket) per partition instead "
        "of one HTTP request each",
    )
    parser.add_argument(
        "--compression",
        choices=CODEC_NAMES,
        default="none",
        help="produce: compress each batch's records (the values are random bytes, which do "
        "not compress: bench/compression_bench.py measures a text-like payload) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--rate", type=int, help="fixed offered rate (msg/s): latency mode (over HTTP or --stream)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="fixed-rate duration")
    parser.add_argument(
        "--linger-ms", type=float, default=1.0, help="fixed-rate: due records go out this often"
    )
    parser.add_argument("--max-seconds", type=float, default=300.0, help="time bound")
    parser.add_argument("--max-bytes", type=int, default=4 << 20, help="consume read size")
    parser.add_argument("--decode", action="store_true", help="consume: decode every record")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none when stderr is not a terminal)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="give up on the cluster after this many seconds (default: %(default)s)",
    )


def check(args: argparse.Namespace) -> str | None:
    if not 1 <= args.size <= 4 << 20:
        return "--size must be in 1..4194304"
    if not 1 <= args.count <= 100_000_000:
        return "--count must be in 1..100000000"
    if not 1 <= args.batch <= 100_000 or args.batch * (args.size + 20) > 8 << 20:
        return "--batch must be >= 1 and a batch must stay under 8 MiB"
    if args.rate is not None and not 1 <= args.rate <= 1_000_000:
        return "--rate must be in 1..1000000"
    if not args.timeout > 0:
        return "--timeout must be positive"
    if not 1 <= args.in_flight <= (4096 if args.stream else 64):
        return f"--in-flight must be in 1..{4096 if args.stream else 64}"
    return None


async def run(args: argparse.Namespace, brokers: list[str], token: str | None) -> dict[str, Any]:
    progress = not args.no_progress and sys.stderr.isatty()
    ca_file = getattr(args, "ca_file", None)
    timeout_s = getattr(args, "timeout", 60.0)
    # one HTTP/1.1 connection per append in flight, so that the client's pool does not queue
    # them, within what the brokers let one client hold (beyond, appends wait their turn)
    connections = connections_for(args.partitions, args.in_flight, len(brokers))
    async with AsyncClient(
        brokers, token=token, timeout_s=timeout_s, ca_file=ca_file, max_connections=connections
    ) as client:
        if args.mode == "consume":
            result = await consume(
                client,
                args.topic,
                max_bytes=args.max_bytes,
                decode=args.decode,
                progress=progress,
                token=token,
                ca_file=ca_file,
            )
        else:
            options = ProduceOptions(
                args.topic,
                args.size,
                args.count,
                args.batch,
                args.partitions,
                args.replication_factor,
                args.in_flight,
                args.rate,
                args.seconds,
                args.max_seconds,
                args.linger_ms,
                args.stream,
                args.compression,
            )
            result = await produce(client, options, progress)
            result["compression"] = args.compression
        # how many requests went to the wrong broker or worker first (a redirect answered)
        result.update(requests=client.requests_sent, redirects=client.redirects)
    result.update({"topic": args.topic, "size": args.size})
    return result


def print_result(result: dict[str, Any], as_json: bool) -> None:
    for key, value in result.items():
        print(f"{key:>26}: {value}")
    if as_json:
        print(json.dumps(result, sort_keys=True))
