"""Laminar against Kafka, NATS JetStream and RabbitMQ quorum queues, in one sitting (issue 22).

    python3 bench/compare.py --quick --json   # plumbing check, about 10 minutes: 1 round
    python3 bench/compare.py --json           # the full run (2 rounds, 1M records a publish):
                                              # Markdown tables for bench/RESULTS.md

The systems run in interleaved rounds (round 1: laminar, nats, kafka, queue; round 2: the
same again; --rounds N), so that a noisy stretch on this shared 2-core machine hits every
system; each figure is reported as its median and its best over the rounds. Every phase
records the 1-minute load average before and after it. All figures use records of --size
(1120) bytes and --partitions (6) partitions unless said otherwise.

laminar  a fresh LocalCluster of real `laminar serve` processes (fsync `always`: every ack
         waits for a majority fdatasync) for RF 1 (1 broker) and RF 3 (3 brokers), driven by
         `python3 -m laminar bench produce --json` (subprocesses; their CPU from rusage, the
         brokers' from /proc). Phases per configuration:
           publish      500 records (560 KB) per append, 2 appends in flight per partition
           kafka_batch  14 records per append (Kafka's default producer batch of 1120 B
                        records), --kafka-batch-in-flight appends in flight per partition;
                        then the same batches over a streaming append per partition
                        (`--stream`: a persistent binary connection, as Kafka's producer's)
           single       1 record per append, 64 appends in flight, on a 1-partition topic
                        (`--in-flight` counts per partition), sent by the Python client and
                        (RF 1) by wrk, a C HTTP load generator (64 keep-alive connections,
                        --wrk-seconds; installed with apt-get if missing): the client is not
                        the limit then; and one record per batch over a streaming append
                        (`--stream`, one WebSocket, 64 batches unacknowledged)
           http_floor   (RF 1) the same wrk load against bench/http_floor.py, the broker's
                        HTTP stack (its fast path, uvloop) answering each append with nothing
                        behind it: the floor of the HTTP stack, in CPU-s per million requests
           idle         --idle-count records, one per append, one append in flight, on a
                        1-partition topic with nothing else running, over HTTP and streamed:
                        the round trip of one append (majority fdatasync included), the floor
                        under every latency figure below
           latency      records due at a fixed --rate (5000/s) for --latency-seconds; every
                        --linger-ms (3, on a fixed schedule) the due records go out as one
                        append: 15 records at 5000/s, Kafka's default producer batch (its
                        16 KB batch.size fills in 2.8 ms, within its 5 ms linger.ms); due ->
                        ack; then the same over a streaming append per partition
           scale6 / scale192  (RF 3 only) 14 records per append, 6 partitions x 64 in
                        flight and 192 partitions x 2 in flight: the same 384 appends in
                        flight in all; the append p99s are compared
nats     bench/nats_peer.py: NATS JetStream 2.9, R1 and R3, its Go client (single messages,
         4000 in flight), latency at --rate. Acks before fsync.
kafka    bench/kafka_peer.py: Kafka 4.1 KRaft, RF 1 and RF 3, ProducerPerformance with the
         default producer batch and with 560 KB batches, KafkaLat at --rate. Acks before fsync.
queue    shared-queue publish -> accept latency at --queue-rates (500, 1000, 2000 msg/s):
         Laminar 3 brokers RF 3 (bench/queue_bench.py) and RabbitMQ 3.10 quorum queue, 3 nodes
         (bench/queue_peers.py, Node amqplib client).
Once per sitting, after the rounds: leadership of 1000 partitions RF 3 on 3 brokers
(bench/partitions_bench.py `measure`, or a fallback here that counts leaders per broker).

JSON keys (the last line with --json; medians over the rounds, "best" holds the best round's
figure of each): lam_* Laminar, nats_r1/r3_*, kafka_rf1/rf3_*, rabbit_r3_*; *_msgs_s throughput;
*_p50_ms / *_p99_ms latency at --rate; *_cpu_s_per_million the servers' CPU seconds per million
messages, *_client_cpu_s_per_million the client's; lam_single_* one record per HTTP append on
one RF 1 broker (wrk; lam_single_pyclient_* the Python client's run, lam_single_stream_*
streamed; http_floor_* the HTTP stack's floor); lam_rf1/rf3_idle_* and *_idle_stream_* one
append in flight, nothing else running; *_publish_* 560 KB batches (Laminar 500 records per
append); *_kafka_batch_* / *_default_batch_* about 14 records; lam_queue_p50_ms /
rabbit_r3_queue_p50_ms at 1000 msg/s and *_queue_p50_ms_<rate> at each rate; target_* the
issue's targets (true: met, false: missed, null: not measured); load_avg_1m at the start
(load_avg_1m_end at the end); machine: the CPUs, 4 KiB fdatasyncs a second in one file, and
sync_round_us, the p50 µs of 4 files x 64 KiB appended and synced at once (a group commit's disk
work, measured as the sitting starts).

Every phase is bounded in count and time; every server is stopped and every data directory
removed in finally blocks (also on Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "broker"))

import disk_bench  # noqa: E402
from machine import cpu_seconds, fdatasync_per_s, load_avg_1m, run_in_group  # noqa: E402
from queue_peers import signals_raise  # noqa: E402

from laminar.local_cluster import LocalCluster, probe  # noqa: E402

PREFIX = "127.0.22"  # the Laminar clusters' loopback /24 (issue 22)
QUEUE_PREFIX = "127.0.23"
SKEW_PREFIX = "127.0.24"
SYSTEMS = ("laminar", "nats", "kafka", "queue")
KAFKA_BATCH_RECORDS = 14  # Kafka's default batch.size 16384 / (1120 B + overhead)
BIG_BATCH_RECORDS = 500  # 560 KB of 1120 B records
SINGLE_IN_FLIGHT = 64
SCALE_PARTITIONS = (6, 192)
SCALE_IN_FLIGHT = {6: 64, 192: 2}  # 384 appends in flight either way
#: issue 22's measurement of one record per append on one RF 1 broker (server CPU-s per
#: million): the target is 10x better
ISSUE_SINGLE_CPU_S_PER_MILLION = 164.0
#: peers' ports, checked for leftover listeners at the end
PEER_PORTS = {
    "kafka": (19092, 19093, 19111, 19112, 19113, 19121, 19122, 19123),
    "nats": (4222, 8222, 4231, 4232, 4233, 6231, 6232, 6233, 8231, 8232, 8233),
    "rabbit": (5673, 5674, 5675, 25673, 25674, 25675),
}

QUICK = {
    "rounds": 1, "count": 100_000, "kafka_batch_count": 50_000, "single_count": 10_000,
    "idle_count": 1_000,
    "latency_seconds": 4.0, "scale_count": 50_000, "peer_count": 100_000, "wrk_seconds": 5.0,
    "kafka_warmup": 50_000, "queue_duration": 3.0, "skew_idle_seconds": 5.0,
    "skew_restart": False, "max_seconds": 30.0,
}  # fmt: skip
FULL = {
    "rounds": 2, "count": 1_000_000, "kafka_batch_count": 300_000, "single_count": 50_000,
    "idle_count": 3_000,
    "latency_seconds": 10.0, "scale_count": 200_000, "peer_count": 1_000_000,
    "wrk_seconds": 10.0,
    "kafka_warmup": 200_000, "queue_duration": 10.0, "skew_idle_seconds": 20.0,
    "skew_restart": True, "max_seconds": 120.0,
}  # fmt: skip


def log(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def per_million(cpu_s: float | None, records: int | float | None) -> float | None:
    if cpu_s is None or not records:
        return None
    return round(cpu_s / records * 1e6, 2)


# ---- phases and their load averages --------------------------------------------------------


class Phases:
    """Every phase of the sitting, with its wall time and the load average around it."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def phase(self, round_number: int, system: str, name: str) -> Iterator[dict[str, Any]]:
        row: dict[str, Any] = {
            "round": round_number, "system": system, "phase": name,
            "load_before": load_avg_1m(),
        }  # fmt: skip
        started = time.monotonic()
        try:
            yield row
        except BaseException as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            raise
        finally:
            row["seconds"] = round(time.monotonic() - started, 1)
            row["load_after"] = load_avg_1m()
            self.rows.append(row)


# ---- Laminar ---------------------------------------------------------------------------------


def this_tree_env() -> dict[str, str]:
    """The environment of a Python process this bench starts: it imports this tree's
    `laminar`, as the bench itself and its brokers do (`LocalCluster.broker_env`)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "broker"), str(REPO)]))


def laminar_bench(
    cluster: LocalCluster, arguments: Sequence[str], timeout_s: float
) -> dict[str, Any]:
    """`laminar bench ... --json` against `cluster`: its figures, plus the brokers' CPU
    seconds (from /proc) and the bench process's (rusage) while it ran."""
    command = [sys.executable, "-m", "laminar", "bench", *arguments, "--json", "--no-progress"]
    command += ["--brokers", ",".join(cluster.urls), "--token-file", str(cluster.token_file)]
    env = this_tree_env()
    pids = list(cluster.serving_pids().values())
    before = [cpu_seconds(p) for p in pids]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = run_in_group(command, timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"timed out after {timeout_s:.0f} s: {' '.join(command)}") from e
    stdout, stderr = done.stdout, done.stderr
    after = [cpu_seconds(p) for p in pids]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{stdout[-1500:]}\n{stderr[-1500:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    deltas = [a - b for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    server = sum(deltas) if len(deltas) == len(pids) else None  # None: a broker went away
    client = used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime
    records = result.get("records")
    result["server_cpu_s"] = _round(server, 2)
    result["client_cpu_s"] = round(client, 2)
    result["server_cpu_s_per_million"] = per_million(server, records)
    result["client_cpu_s_per_million"] = per_million(client, records)
    return result


def repeat_rounds(
    name: str, rounds: int, one_round: Callable[[Path], dict[str, Any]], figures: Sequence[str]
) -> None:
    """`rounds` of `one_round` (each given a scratch directory, removed after), logged as
    they end; then one JSON line: the machine's limits, the medians of `figures` and every
    round's figures (`latency_bench.py`, `batch_bench.py`)."""
    root = Path(tempfile.mkdtemp(prefix=f"laminar-{name}-"))
    rows: list[dict[str, Any]] = []
    try:
        machine = {"fdatasync_per_s": fdatasync_per_s(root), "load_1m": load_avg_1m()}
        log(f"machine: {machine}")
        for n in range(rounds):
            rows.append(one_round(root))
            log(f"round {n + 1}: " + ", ".join(f"{k} {rows[-1][k]}" for k in figures))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(r[k] for r in rows) for k in figures}
    print(json.dumps({"machine": machine, "medians": medians, "rounds": rows}))


def wrk_path() -> str | None:
    """wrk (Debian's HTTP load generator, C): installed with apt-get when missing and root."""
    found = shutil.which("wrk")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        log("installing wrk (apt-get) for the one-record-per-request phase")
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], capture_output=True,
                       timeout=600, check=False)  # fmt: skip
        found = shutil.which("wrk")
    return found


def wrk_single(
    cluster: LocalCluster, url: str, size: int, seconds: float, connections: int, root: Path
) -> dict[str, Any]:
    """One record per HTTP append, `connections` appends in flight (one each, keep-alive),
    for `seconds`, sent by wrk: the broker's cost per request with no Python client in the
    way. Its figures and the brokers' CPU seconds (from /proc) while it ran."""
    token = cluster.token_file.read_text().strip()
    pids = list(cluster.serving_pids().values())
    return wrk_appends(url, token, pids, size, seconds, connections, root)


def wrk_floor(
    size: int, seconds: float, connections: int, root: Path, stack: str = "laminar"
) -> dict[str, Any]:
    """The same load as `wrk_single` against bench/http_floor.py: the broker's HTTP stack
    (`stack` "aiohttp": aiohttp's alone) answering an append with nothing behind it, the floor
    of what the broker is built on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(HERE / "http_floor.py"), "--port", str(port), "--stack", stack],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True, env=this_tree_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _listening("127.0.0.1", port):
            if server.poll() is not None:
                _, stderr = server.communicate()
                raise RuntimeError(f"bench/http_floor.py exited: {stderr[-800:]!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("bench/http_floor.py did not listen within 30 s")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/v1/topics/floor/partitions/0/records"
        return wrk_appends(url, None, [server.pid], size, seconds, connections, root)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.communicate()


def wrk_appends(
    url: str,
    token: str | None,
    pids: list[int],
    size: int,
    seconds: float,
    connections: int,
    root: Path,
) -> dict[str, Any]:
    """wrk POSTs one-record batches to `url` on `connections` keep-alive connections for
    `seconds`: its figures, and the CPU seconds (from /proc) of `pids` while it ran."""
    wrk = wrk_path()
    if wrk is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    from laminar.log.batch import Record, encode_batch

    body = root / "wrk-record.bin"
    body.write_bytes(encode_batch([Record(value=os.urandom(size))]))
    script = root / "wrk-append.lua"
    authorization = "" if token is None else f'wrk.headers["Authorization"] = "Bearer {token}"\n'
    lua = (
        f'local f = io.open("{body}", "rb")\nwrk.method = "POST"\nwrk.body = f:read("*a")\n'
        'f:close()\nwrk.headers["Content-Type"] = "application/vnd.laminar.batch"\n'
    )
    script.write_text(lua + authorization)
    before = [cpu_seconds(p) for p in pids]
    command = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", str(script),
               url]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60,
                          check=False)  # fmt: skip
    after = [cpu_seconds(p) for p in pids]
    out = done.stdout
    if done.returncode != 0 or "Requests/sec" not in out:
        raise RuntimeError(f"wrk failed: {out[-800:]} {done.stderr[-800:]}")
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw failed appends:\n{out[-1200:]}")
    requests = int(out.split(" requests in ")[0].split()[-1])
    percentiles = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("50%", "99%"):
            value, unit = float(parts[1].rstrip("mus")), parts[1].lstrip("0123456789.")
            percentiles[parts[0]] = value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    deltas = [a - b for a, b in zip(after, before, strict=True) if a is not None and b is not None]
    server = sum(deltas) if len(deltas) == len(pids) else None
    return {
        "records": requests,
        "msgs_per_s": float(out.split("Requests/sec:")[1].split()[0]),
        "batch_latency_p50_ms": _round(percentiles.get("50%"), 3),
        "batch_latency_p99_ms": _round(percentiles.get("99%"), 3),
        "server_cpu_s_per_million": per_million(server, requests),
        "client_cpu_s_per_million": None,
    }


def _check_free(cluster: LocalCluster) -> None:
    for url in cluster.urls:
        if probe(url + "/readyz") is not None:
            raise RuntimeError(f"something already serves {url}: not starting a cluster")


def laminar_config(
    s: argparse.Namespace,
    brokers: int,
    rf: int,
    root: Path,
    phases: Phases,
    round_number: int,
) -> dict[str, Any]:
    """One fresh cluster (brokers, rf): its phases' figures. Stopped and removed after."""
    cluster = LocalCluster(
        root / f"laminar-{brokers}b-rf{rf}-r{round_number}", brokers, prefix=PREFIX,
        fsync=s.fsync,
    )  # fmt: skip
    system = f"laminar rf{rf}"
    out: dict[str, Any] = {}
    _check_free(cluster)
    timeout_s = s.max_seconds + 180  # the bench's own bound, plus start-up and topic creation
    common = ["--size", str(s.size), "--replication-factor", str(rf)]
    common += ["--max-seconds", str(s.max_seconds)]
    try:
        with phases.phase(round_number, system, "start"):
            cluster.start()

        def produce(name: str, arguments: list[str]) -> dict[str, Any]:
            with phases.phase(round_number, system, name):
                figures = laminar_bench(cluster, ["produce", *arguments, *common], timeout_s)
            out[name] = figures
            return figures

        tput = ["--partitions", str(s.partitions)]
        r = produce("publish", ["--topic", "publish", "--count", str(s.count), *tput,
                                "--batch", str(BIG_BATCH_RECORDS), "--in-flight", "2"])  # fmt: skip
        log(f"laminar RF {rf}: 500/append {r['msgs_per_s']:,.0f} msg/s")
        r = produce("kafka_batch", ["--topic", "kbatch", "--count", str(s.kafka_batch_count),
                                    *tput, "--batch", str(KAFKA_BATCH_RECORDS),
                                    "--in-flight", str(s.kafka_batch_in_flight)])  # fmt: skip
        log(f"laminar RF {rf}: 14/append {r['msgs_per_s']:,.0f} msg/s")
        r = produce("kafka_batch_stream", ["--topic", "kstream", "--count",
                                           str(s.kafka_batch_count), *tput, "--batch",
                                           str(KAFKA_BATCH_RECORDS), "--stream", "--in-flight",
                                           str(s.kafka_batch_in_flight)])  # fmt: skip
        log(f"laminar RF {rf}: 14/streamed batch {r['msgs_per_s']:,.0f} msg/s")
        r = produce("single", ["--topic", "single", "--count", str(s.single_count),
                               "--partitions", "1", "--batch", "1",
                               "--in-flight", str(SINGLE_IN_FLIGHT)])  # fmt: skip
        log(f"laminar RF {rf}: 1/append {r['msgs_per_s']:,.0f} msg/s (Python client)")
        if rf == 1:
            with phases.phase(round_number, system, "single_wrk"):
                url = cluster.urls[0] + "/v1/topics/single/partitions/0/records"
                r = wrk_single(cluster, url, s.size, s.wrk_seconds, SINGLE_IN_FLIGHT, root)
            out["single_wrk"] = r
            log(f"laminar RF 1: 1/append {r['msgs_per_s']:,.0f} msg/s (wrk, C client)")
            with phases.phase(round_number, "http_floor", "wrk"):
                r = wrk_floor(s.size, s.wrk_seconds, SINGLE_IN_FLIGHT, root)
            out["http_floor"] = r
            log(f"HTTP floor: {r['msgs_per_s']:,.0f} requests/s (wrk, the same load)")
        r = produce("single_stream", ["--topic", "single", "--count", str(s.single_count),
                                      "--partitions", "1", "--batch", "1", "--stream",
                                      "--in-flight", str(SINGLE_IN_FLIGHT)])  # fmt: skip
        log(f"laminar RF {rf}: 1/batch streamed {r['msgs_per_s']:,.0f} msg/s")
        for name, stream in (("idle", []), ("idle_stream", ["--stream"])):
            r = produce(name, ["--topic", name, "--count", str(s.idle_count), "--partitions",
                               "1", "--batch", "1", "--in-flight", "1", *stream])  # fmt: skip
            log(
                f"laminar RF {rf}: one append in flight ({name}): p50 "
                f"{r['batch_latency_p50_ms']} p99 {r['batch_latency_p99_ms']} ms"
            )
        r = produce("latency", ["--topic", "latency", *tput, "--rate", str(s.rate),
                                "--seconds", str(s.latency_seconds),
                                "--linger-ms", str(s.linger_ms)])  # fmt: skip
        log(f"laminar RF {rf}: at {s.rate}/s p50 {r['latency_p50_ms']} p99 {r['latency_p99_ms']}")
        r = produce("latency_stream", ["--topic", "latstream", *tput, "--rate", str(s.rate),
                                       "--seconds", str(s.latency_seconds), "--stream",
                                       "--linger-ms", str(s.linger_ms)])  # fmt: skip
        log(
            f"laminar RF {rf}: at {s.rate}/s streamed p50 {r['latency_p50_ms']} "
            f"p99 {r['latency_p99_ms']}"
        )
        if rf == 3 and not s.skip_scale:
            for partitions in SCALE_PARTITIONS:
                r = produce(
                    f"scale{partitions}",
                    ["--topic", f"scale{partitions}", "--count", str(s.scale_count),
                     "--partitions", str(partitions), "--batch", str(KAFKA_BATCH_RECORDS),
                     "--in-flight", str(SCALE_IN_FLIGHT[partitions])],
                )  # fmt: skip
                log(
                    f"laminar RF 3, {partitions} partitions: {r['msgs_per_s']:,.0f} msg/s, "
                    f"append p99 {r['batch_latency_p99_ms']} ms"
                )
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(cluster.data_dir, ignore_errors=True)
    return out


def laminar_round(
    s: argparse.Namespace, root: Path, phases: Phases, round_number: int
) -> dict[str, Any]:
    m: dict[str, Any] = {}
    for brokers, rf in ((1, 1), (3, 3)):
        res = laminar_config(s, brokers, rf, root, phases, round_number)
        key = f"lam_rf{rf}"
        pub, kb, single, lat = res["publish"], res["kafka_batch"], res["single"], res["latency"]
        m[f"{key}_publish_msgs_s"] = pub["msgs_per_s"]
        m[f"{key}_publish_cpu_s_per_million"] = pub["server_cpu_s_per_million"]
        m[f"{key}_publish_client_cpu_s_per_million"] = pub["client_cpu_s_per_million"]
        m[f"{key}_publish_kafka_batch_msgs_s"] = kb["msgs_per_s"]
        m[f"{key}_publish_kafka_batch_cpu_s_per_million"] = kb["server_cpu_s_per_million"]
        m[f"{key}_publish_kafka_batch_client_cpu_s_per_million"] = kb["client_cpu_s_per_million"]
        kbs = res["kafka_batch_stream"]
        m[f"{key}_publish_kafka_batch_stream_msgs_s"] = kbs["msgs_per_s"]
        m[f"{key}_publish_kafka_batch_stream_cpu_s_per_million"] = kbs["server_cpu_s_per_million"]
        m[f"{key}_publish_kafka_batch_stream_client_cpu_s_per_million"] = kbs[
            "client_cpu_s_per_million"
        ]
        single_key = "lam_single" if rf == 1 else "lam_rf3_single"
        # one record per HTTP append: wrk's figures where it ran (the Python client is the
        # limit of its own: *_pyclient_*), and one record per streamed batch
        for suffix, figures in (
            ("_pyclient", single), ("", res.get("single_wrk", single)),
            ("_stream", res["single_stream"]),
        ):  # fmt: skip
            k = single_key + suffix
            m[f"{k}_msgs_s"] = figures["msgs_per_s"]
            m[f"{k}_cpu_s_per_million"] = figures["server_cpu_s_per_million"]
            m[f"{k}_client_cpu_s_per_million"] = figures["client_cpu_s_per_million"]
            m[f"{k}_append_p50_ms"] = figures["batch_latency_p50_ms"]
            m[f"{k}_append_p99_ms"] = figures["batch_latency_p99_ms"]
        if (floor := res.get("http_floor")) is not None:
            m["http_floor_msgs_s"] = floor["msgs_per_s"]
            m["http_floor_cpu_s_per_million"] = floor["server_cpu_s_per_million"]
        for name in ("idle", "idle_stream"):
            m[f"{key}_{name}_p50_ms"] = res[name]["batch_latency_p50_ms"]
            m[f"{key}_{name}_p99_ms"] = res[name]["batch_latency_p99_ms"]
        m[f"{key}_p50_ms"] = lat["latency_p50_ms"]
        m[f"{key}_p99_ms"] = lat["latency_p99_ms"]
        m[f"{key}_p999_ms"] = lat["latency_p999_ms"]
        m[f"{key}_latency_achieved_rate"] = lat["achieved_rate"]
        m[f"{key}_latency_cpu_s_per_million"] = lat["server_cpu_s_per_million"]
        lat_stream = res["latency_stream"]
        for q in ("p50", "p99", "p999"):
            m[f"{key}_stream_{q}_ms"] = lat_stream[f"latency_{q}_ms"]
        m[f"{key}_stream_latency_cpu_s_per_million"] = lat_stream["server_cpu_s_per_million"]
        if "scale6" in res:
            for partitions in SCALE_PARTITIONS:
                r = res[f"scale{partitions}"]
                m[f"lam_scale{partitions}_msgs_s"] = r["msgs_per_s"]
                m[f"lam_scale{partitions}_cpu_s_per_million"] = r["server_cpu_s_per_million"]
                m[f"lam_p50_{partitions}_ms"] = r["batch_latency_p50_ms"]
                m[f"lam_p99_{partitions}_ms"] = r["batch_latency_p99_ms"]
            p6, p192 = m["lam_p99_6_ms"], m["lam_p99_192_ms"]
            m["lam_p99_192_vs_6"] = round(p192 / p6, 2) if p6 and p192 else None
    return m


# ---- peers -----------------------------------------------------------------------------------


def _nats_cpu(raw: Path, label: str, acked: int | None) -> tuple[float | None, float | None]:
    """Server and client CPU-s per million of the last publish run of `label` in the raw
    jsbench results (cpurun.py's CPU % of each process over the run's wall time)."""
    rec = None
    with contextlib.suppress(OSError):
        for line in raw.read_text().splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if row.get("mode") == "pub" and row.get("label") == label:
                    rec = row
    if rec is None or not acked:
        return None, None
    cpu = rec.get("cpu") or {}
    elapsed = cpu.get("elapsed_s")
    procs = cpu.get("procs") or {}
    if not isinstance(elapsed, int | float):
        return None, None
    servers = [v.get("avg_cpu_pct") for k, v in procs.items() if k.startswith("nats-")]
    client = (procs.get("client(cmd)") or {}).get("avg_cpu_pct")
    server_s = sum(v for v in servers if isinstance(v, int | float)) / 100 * elapsed
    client_s = client / 100 * elapsed if isinstance(client, int | float) else None
    return per_million(server_s, acked), per_million(client_s, acked)


def nats_round(s: argparse.Namespace, phases: Phases, round_number: int) -> dict[str, Any]:
    import nats_peer

    with phases.phase(round_number, "nats", "r1+r3"):
        res = nats_peer.run(
            s.size, s.peer_count, s.rate, s.latency_seconds, "both", s.peers_dir,
            max_seconds=s.max_seconds, idle_wait=1, log=log,
        )  # fmt: skip
    m: dict[str, Any] = {}
    raw = Path(res.get("raw_results", ""))
    for key, label in (("nats_r1", "single-R1"), ("nats_r3", "cluster-R3")):
        r = res.get(key) or {}
        m[f"{key}_publish_msgs_s"] = r.get("publish_msgs_per_s")
        m[f"{key}_p50_ms"] = r.get("latency_p50_ms")
        m[f"{key}_p99_ms"] = r.get("latency_p99_ms")
        m[f"{key}_p999_ms"] = r.get("latency_p999_ms")
        srv, cli = _nats_cpu(raw, label, r.get("publish_acked"))
        m[f"{key}_publish_cpu_s_per_million"] = srv
        m[f"{key}_publish_client_cpu_s_per_million"] = cli
    m["_nats_warnings"] = res.get("warnings", [])
    m["_nats_versions"] = res.get("versions", {})
    return m


def kafka_round(s: argparse.Namespace, phases: Phases, round_number: int) -> dict[str, Any]:
    import kafka_peer

    with phases.phase(round_number, "kafka", "rf1+rf3"):
        res = kafka_peer.run(
            "both", size=s.size, count=s.peer_count, partitions=s.partitions, rate=s.rate,
            latency_seconds=s.latency_seconds, warmup=s.kafka_warmup, peers_dir=s.peers_dir,
            timeout_s=s.max_seconds * 4 + 300, log=log,
        )  # fmt: skip
    m: dict[str, Any] = {}
    for key in ("kafka_rf1", "kafka_rf3"):
        r = res.get(key) or {}
        big, default, lat = r.get("big_batch", {}), r.get("default_batch", {}), r.get("latency", {})
        m[f"{key}_publish_msgs_s"] = big.get("msgs_per_s")
        m[f"{key}_publish_cpu_s_per_million"] = big.get("server_cpu_s_per_million")
        m[f"{key}_publish_client_cpu_s_per_million"] = big.get("client_cpu_s_per_million")
        m[f"{key}_default_batch_msgs_s"] = default.get("msgs_per_s")
        m[f"{key}_default_batch_cpu_s_per_million"] = default.get("server_cpu_s_per_million")
        m[f"{key}_default_batch_client_cpu_s_per_million"] = default.get("client_cpu_s_per_million")
        m[f"{key}_p50_ms"] = lat.get("p50_ms")
        m[f"{key}_p99_ms"] = lat.get("p99_ms")
        m[f"{key}_p999_ms"] = lat.get("p999_ms")
    m["_kafka_version"] = f"{res.get('version')} ({res.get('java')})"
    return m


def queue_round(
    s: argparse.Namespace, root: Path, phases: Phases, round_number: int
) -> dict[str, Any]:
    """Shared-queue publish -> accept latency: Laminar (3 brokers RF 3), then RabbitMQ."""
    import queue_bench
    import queue_peers

    rates = ",".join(f"{r:g}" for r in s.queue_rates)
    count = int(max(s.queue_rates) * s.queue_duration)
    m: dict[str, Any] = {}
    work = root / f"queue-r{round_number}"
    work.mkdir()
    try:
        a = queue_bench.parse_args(
            ["--phases", "latency", "--rates", rates, "--duration", str(s.queue_duration),
             "--count", str(count), "--size", str(s.size), "--idle-wait", "0",
             "--max-seconds", str(s.max_seconds), "--prefix", QUEUE_PREFIX,
             "--fsync", s.fsync, "--linger-ms", str(s.linger_ms)],
        )  # fmt: skip
        with phases.phase(round_number, "queue", "laminar"):
            lam = queue_bench.run_laminar(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for rate, lat in lam.get("latency", {}).items():
        e2e = lat.get("latency_publish_to_accept", {})
        m[f"lam_queue_p50_ms_{rate}"] = e2e.get("p50_ms")
        m[f"lam_queue_p99_ms_{rate}"] = e2e.get("p99_ms")
        # publish -> delivered: when the consumer sends its accept (RabbitMQ's figure ends at
        # the consumer's ack, sent and not confirmed; Laminar's above at the accept answered)
        delivered = lat.get("latency_publish_to_acquired", {})
        m[f"lam_queue_delivered_p50_ms_{rate}"] = delivered.get("p50_ms")
        m[f"lam_queue_delivered_p99_ms_{rate}"] = delivered.get("p99_ms")
    with phases.phase(round_number, "queue", "rabbit r3"):
        peer = queue_peers.run(
            ["rabbit3"], size=s.size, count=count, rates=s.queue_rates,
            duration=s.queue_duration, max_seconds=s.max_seconds, idle_wait=0,
            peers_dir=s.peers_dir, log=log, phases=("latency",),
        )  # fmt: skip
    rabbit = peer["systems"]["rabbit3"]
    for rate, lat in rabbit.get("latency", {}).items():
        e2e = lat.get("latency_publish_to_ack", {})
        m[f"rabbit_r3_queue_p50_ms_{rate}"] = e2e.get("p50_ms")
        m[f"rabbit_r3_queue_p99_ms_{rate}"] = e2e.get("p99_ms")
    headline = "1000" if 1000 in s.queue_rates else f"{s.queue_rates[0]:g}"
    m["lam_queue_p50_ms"] = m.get(f"lam_queue_p50_ms_{headline}")
    m["rabbit_r3_queue_p50_ms"] = m.get(f"rabbit_r3_queue_p50_ms_{headline}")
    m["_queue_warnings"] = peer.get("warnings", [])
    return m


# ---- leadership of 1000 partitions -----------------------------------------------------------


async def _count_leaders(cluster: LocalCluster, partitions: int, timeout_s: float) -> Any:
    from laminar.client import AsyncClient

    async with AsyncClient(cluster.urls, token=cluster.token, timeout_s=timeout_s) as client:
        started = time.monotonic()
        await client.create_topic("many", partitions=partitions, replication_factor=3)
        await client.wait_for_leaders("many", timeout_s=timeout_s)
        elect_s = time.monotonic() - started
        states = await client.partitions("many")
    counts = {n: 0 for n in cluster.nodes}
    for state in states:
        if state.leader is not None:
            counts[state.leader] = counts.get(state.leader, 0) + 1
    return elect_s, counts


def measure_skew_fallback(partitions: int, idle_seconds: float, root: Path) -> dict[str, Any]:
    """A `partitions`-partition RF 3 topic on 3 fresh brokers: leaders per broker (from the
    partition status API) once every partition has one, and the brokers' idle CPU."""
    cluster = LocalCluster(root / "skew", 3, prefix=SKEW_PREFIX, fsync="always")
    _check_free(cluster)
    try:
        cluster.start()
        elect_s, counts = asyncio.run(_count_leaders(cluster, partitions, 60 + partitions * 0.1))
        pids = [n.pid for n in cluster.nodes.values() if n.pid]
        before = [cpu_seconds(p) or 0.0 for p in pids]
        time.sleep(idle_seconds)
        after = [cpu_seconds(p) or 0.0 for p in pids]
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(cluster.data_dir, ignore_errors=True)
    mean = partitions / 3
    return {
        "source": "compare.py fallback",
        "elect_new_s": round(elect_s, 2),
        "leader_counts": [counts[n] for n in sorted(counts)],
        "leader_skew": round(max(counts.values()) / mean, 3),
        "idle_cpu_pct": [
            round(100 * (a - b) / idle_seconds, 2) for a, b in zip(after, before, strict=True)
        ],
    }


def measure_skew(s: argparse.Namespace, root: Path, phases: Phases) -> dict[str, Any]:
    work = root / "partitions"
    work.mkdir()
    try:
        with phases.phase(0, "laminar", f"leaders {s.skew_partitions}"):
            try:
                import partitions_bench
            except ImportError:
                log("bench/partitions_bench.py not there: counting leaders here")
                return measure_skew_fallback(s.skew_partitions, s.skew_idle_seconds, work)
            options: dict[str, Any] = {}
            accepted = inspect.signature(partitions_bench.measure).parameters
            if "prefix" in accepted:
                options["prefix"] = SKEW_PREFIX
            if "restart" in accepted:
                options["restart"] = s.skew_restart
            res: dict[str, Any] = partitions_bench.measure(
                s.skew_partitions, 3, 3, s.skew_idle_seconds, work, **options
            )
            res["source"] = "bench/partitions_bench.py"
            return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- figures, targets, tables ----------------------------------------------------------------


def higher_is_better(key: str) -> bool:
    return key.endswith("_msgs_s") or key.endswith("_rate")


def aggregate(rounds: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(median, best) of every figure over the rounds that have it."""
    keys = sorted({k for r in rounds for k in r if not k.startswith("_")})
    median: dict[str, Any] = {}
    best: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in rounds if isinstance(r.get(key), int | float)]
        if not values:
            median[key] = best[key] = None
            continue
        median[key] = round(statistics.median(values), 3)
        best[key] = max(values) if higher_is_better(key) else min(values)
    return median, best


def _le(a: Any, b: Any) -> bool | None:
    return None if a is None or b is None else bool(a <= b)


def targets(m: dict[str, Any], queue_rates: Sequence[float]) -> dict[str, bool | None]:
    """The issue's targets against the figures `m` (None: a figure is missing)."""
    t: dict[str, bool | None] = {}
    t["target_rf3_p50_le_2ms"] = _le(m.get("lam_rf3_p50_ms"), 2.0)
    t["target_rf3_stream_p50_le_2ms"] = _le(m.get("lam_rf3_stream_p50_ms"), 2.0)
    peers = [m.get("nats_r3_p99_ms"), m.get("kafka_rf3_p99_ms")]
    lowest = None if None in peers else min(peers)  # type: ignore[type-var]
    t["target_rf3_p99_le_nats_and_kafka"] = _le(m.get("lam_rf3_p99_ms"), lowest)
    t["target_rf3_stream_p99_le_nats_and_kafka"] = _le(m.get("lam_rf3_stream_p99_ms"), lowest)
    t["target_single_ge_15k_msgs_s"] = _le(15_000, m.get("lam_single_msgs_s"))
    t["target_single_cpu_10x_better"] = _le(
        m.get("lam_single_cpu_s_per_million"), ISSUE_SINGLE_CPU_S_PER_MILLION / 10
    )
    t["target_stream_cpu_10x_better"] = _le(
        m.get("lam_single_stream_cpu_s_per_million"), ISSUE_SINGLE_CPU_S_PER_MILLION / 10
    )
    queue = []
    for rate in queue_rates:
        r = f"{rate:g}"
        v = _le(m.get(f"lam_queue_p50_ms_{r}"), m.get(f"rabbit_r3_queue_p50_ms_{r}"))
        t[f"target_queue_p50_le_rabbit_{r}"] = v
        queue.append(v)
    t["target_queue_p50_le_rabbit"] = None if None in queue else all(queue)
    for rf in (1, 3):
        lam, kafka = f"lam_rf{rf}_publish", f"kafka_rf{rf}"
        t[f"target_rf{rf}_kafka_batch_ge_kafka"] = _le(
            m.get(f"{kafka}_default_batch_msgs_s"), m.get(f"{lam}_kafka_batch_msgs_s")
        )
        t[f"target_rf{rf}_kafka_batch_cpu_le_kafka"] = _le(
            m.get(f"{lam}_kafka_batch_cpu_s_per_million"),
            m.get(f"{kafka}_default_batch_cpu_s_per_million"),
        )
        t[f"target_rf{rf}_kafka_batch_stream_ge_kafka"] = _le(
            m.get(f"{kafka}_default_batch_msgs_s"), m.get(f"{lam}_kafka_batch_stream_msgs_s")
        )
        t[f"target_rf{rf}_kafka_batch_stream_cpu_le_kafka"] = _le(
            m.get(f"{lam}_kafka_batch_stream_cpu_s_per_million"),
            m.get(f"{kafka}_default_batch_cpu_s_per_million"),
        )
        t[f"target_rf{rf}_560k_ge_kafka"] = _le(
            m.get(f"{kafka}_publish_msgs_s"), m.get(f"{lam}_msgs_s")
        )
        t[f"target_rf{rf}_560k_cpu_le_kafka"] = _le(
            m.get(f"{lam}_cpu_s_per_million"), m.get(f"{kafka}_publish_cpu_s_per_million")
        )
    nats = m.get("nats_r3_publish_msgs_s")
    t["target_rf3_publish_ge_2x_nats_r3"] = _le(
        None if nats is None else 2 * nats, m.get("lam_rf3_publish_msgs_s")
    )
    t["target_leader_skew_le_1_1"] = _le(m.get("leader_skew_1000"), 1.1)
    t["target_p99_192_within_2x_of_6"] = _le(m.get("lam_p99_192_vs_6"), 2.0)
    return t


def _f(value: Any, digits: int = 0) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if not isinstance(value, int | float):
        return "-"
    return f"{value:,.{digits}f}"


def sync_round_us(root: Path) -> float:
    """p50 µs of a group commit's disk work on this machine now: 4 files of 64 KiB appended and
    fdatasync'd at once (bench/disk_bench.py's "4 files x 64 KiB, extending"). The fdatasync
    rate of one small file does not show it: the disk of the day can cost a round 40 % more
    while that rate moves 9 % (bench/RESULTS.md, issue 22, eighteenth sitting)."""
    directory = Path(tempfile.mkdtemp(prefix="sync-round-", dir=root))
    try:
        with ThreadPoolExecutor(disk_bench.ROUND_FILES) as pool:
            measured = disk_bench.measure(
                directory, pool, "round", disk_bench.ROUND_FILES,
                disk_bench.ROUND_KIB * disk_bench.KIB, rounds=200, seconds=5.0,
            )  # fmt: skip
        return measured["p50_us"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def tables(result: dict[str, Any]) -> str:
    """The sitting as Markdown tables (for bench/RESULTS.md)."""
    m, b = result["median"], result["best"]
    rounds = result["rounds"]
    lines = [
        f"Sitting {result['started_utc']} UTC, commit {result['commit']}, {rounds} round(s), "
        f"{result['wall_s']:.0f} s; {result['machine']['cpus']} CPUs, "
        f"{_f(result['machine']['fdatasync_4k_per_s'])} fdatasync'd 4 KiB writes/s, a round of "
        f"4 x 64 KiB appends synced at once in {_f(result['machine'].get('sync_round_us'))} µs "
        "p50; "
        f"load average (1 min) {result['load_avg_1m']} at the start, "
        f"{result['load_avg_1m_end']} at the end. Figures: median of the rounds (best).",
        "",
        f"Publish, {result['params']['size']} B records, {result['params']['partitions']} "
        "partitions (CPU: seconds per million messages; Laminar acks after a majority "
        "fdatasync, Kafka and NATS before any fsync)",
        "",
        "| system | batching | msg/s | server CPU-s/M | client CPU-s/M |",
        "|---|---|---:|---:|---:|",
    ]

    def row(name: str, batching: str, prefix: str, rate_key: str | None = None) -> None:
        key = rate_key or f"{prefix}_msgs_s"
        if key not in m:
            return
        lines.append(
            f"| {name} | {batching} | {_f(m[key])} ({_f(b[key])}) "
            f"| {_f(m.get(f'{prefix}_cpu_s_per_million'), 1)} "
            f"| {_f(m.get(f'{prefix}_client_cpu_s_per_million'), 1)} |"
        )

    for rf, nats in ((1, "R1"), (3, "R3")):
        row(f"Laminar RF {rf}", "500 records (560 KB) per append", f"lam_rf{rf}_publish")
        row(f"Kafka RF {rf}", "560 KB batches", f"kafka_rf{rf}_publish")
        row(f"Laminar RF {rf}", "14 records per append", f"lam_rf{rf}_publish_kafka_batch")
        row(f"Laminar RF {rf}", "14 records per streamed batch",
            f"lam_rf{rf}_publish_kafka_batch_stream")  # fmt: skip
        row(f"Kafka RF {rf}", "default producer (~14 records)", f"kafka_rf{rf}_default_batch")
        row(f"NATS {nats}", "single messages, 4000 in flight", f"nats_{nats.lower()}_publish")
    row("Laminar RF 1, one broker", "1 record per HTTP append, 64 in flight (wrk)",
        "lam_single")  # fmt: skip
    row("HTTP stack, empty handler", "the same wrk load: the HTTP stack's floor",
        "http_floor")  # fmt: skip
    row("Laminar RF 1, one broker", "1 record per HTTP append, 64 in flight (Python client)",
        "lam_single_pyclient")  # fmt: skip
    row("Laminar RF 1, one broker", "1 record per streamed batch, 64 in flight",
        "lam_single_stream")  # fmt: skip
    row("Laminar RF 3", "1 record per HTTP append, 64 in flight (Python client)",
        "lam_rf3_single_pyclient")  # fmt: skip
    row("Laminar RF 3", "1 record per streamed batch, 64 in flight", "lam_rf3_single_stream")
    lines += [
        "",
        f"Latency at a steady {result['params']['rate']:,} msg/s, ms (Laminar, Kafka: due -> "
        "ack, no coordinated omission; NATS: jsbench's send -> ack)",
        "",
        "| system | p50 | p99 | p99.9 |",
        "|---|---:|---:|---:|",
    ]
    for name, prefix in (
        ("Laminar RF 1", "lam_rf1"), ("Kafka RF 1", "kafka_rf1"), ("NATS R1", "nats_r1"),
        ("Laminar RF 1, streaming append", "lam_rf1_stream"),
        ("Laminar RF 3", "lam_rf3"), ("Kafka RF 3", "kafka_rf3"), ("NATS R3", "nats_r3"),
        ("Laminar RF 3, streaming append", "lam_rf3_stream"),
    ):  # fmt: skip
        if f"{prefix}_p50_ms" in m:
            lines.append(
                f"| {name} | {_f(m[f'{prefix}_p50_ms'], 2)} ({_f(b[f'{prefix}_p50_ms'], 2)}) "
                f"| {_f(m[f'{prefix}_p99_ms'], 2)} ({_f(b[f'{prefix}_p99_ms'], 2)}) "
                f"| {_f(m.get(f'{prefix}_p999_ms'), 2)} |"
            )
    if "lam_rf3_idle_p50_ms" in m:
        lines += [
            "",
            "One record per append, one append in flight, nothing else running (Laminar): "
            "the round trip of one append, ms, the floor under the latencies above",
            "",
            "| system | p50 | p99 |",
            "|---|---:|---:|",
        ]
        for rf in (1, 3):
            for name, suffix in (("HTTP append", "idle"), ("streaming append", "idle_stream")):
                key = f"lam_rf{rf}_{suffix}"
                lines.append(
                    f"| Laminar RF {rf}, {name} | {_f(m.get(f'{key}_p50_ms'), 2)} "
                    f"({_f(b.get(f'{key}_p50_ms'), 2)}) | {_f(m.get(f'{key}_p99_ms'), 2)} "
                    f"({_f(b.get(f'{key}_p99_ms'), 2)}) |"
                )
    queue_rates = result["params"]["queue_rates"]
    if any(f"lam_queue_p50_ms_{r:g}" in m for r in queue_rates):
        lines += [
            "",
            "Shared queue, ms: publish -> accept answered (Laminar 3 brokers RF 3; in brackets "
            "publish -> delivered, when the consumer sends its accept) and publish -> "
            "consumer's ack sent (RabbitMQ quorum queue, 3 nodes)",
            "",
            "| rate msg/s | Laminar p50 | Laminar p99 | RabbitMQ p50 | RabbitMQ p99 |",
            "|---:|---:|---:|---:|---:|",
        ]
        for rate in queue_rates:
            r = f"{rate:g}"
            lines.append(
                f"| {r} | {_f(m.get(f'lam_queue_p50_ms_{r}'), 2)} "
                f"({_f(m.get(f'lam_queue_delivered_p50_ms_{r}'), 2)}) "
                f"| {_f(m.get(f'lam_queue_p99_ms_{r}'), 2)} "
                f"({_f(m.get(f'lam_queue_delivered_p99_ms_{r}'), 2)}) "
                f"| {_f(m.get(f'rabbit_r3_queue_p50_ms_{r}'), 2)} "
                f"| {_f(m.get(f'rabbit_r3_queue_p99_ms_{r}'), 2)} |"
            )
    if "lam_p99_6_ms" in m:
        lines += [
            "",
            "Partition count, Laminar RF 3, 14 records per append, 384 appends in flight",
            "",
            "| partitions | in flight each | msg/s | server CPU-s/M | append p50 ms "
            "| append p99 ms |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for p in SCALE_PARTITIONS:
            lines.append(
                f"| {p} | {SCALE_IN_FLIGHT[p]} | {_f(m.get(f'lam_scale{p}_msgs_s'))} "
                f"| {_f(m.get(f'lam_scale{p}_cpu_s_per_million'), 1)} "
                f"| {_f(m.get(f'lam_p50_{p}_ms'), 1)} | {_f(m.get(f'lam_p99_{p}_ms'), 1)} |"
            )
    skew = result.get("partitions") or {}
    if skew:
        lines += [
            "",
            f"{result['params']['skew_partitions']} partitions RF 3 on 3 brokers "
            f"({skew.get('source')}): leaders per broker {skew.get('leader_counts')}, skew "
            f"{skew.get('leader_skew')} (max / mean); idle CPU % of a core per broker "
            f"{skew.get('idle_cpu_pct')}; all led {skew.get('elect_new_s')} s after create"
            + (
                f"; after a restart of all brokers in {skew['elect_all_s']} s"
                if skew.get("elect_all_s")
                else ""
            ),
        ]
    lines += ["", "| target (issue 22) | verdict |", "|---|---|"]
    lines.extend(f"| {k[len('target_') :]} | {_f(v)} |" for k, v in result["targets"].items())
    lines += [
        "",
        "| round | system | phase | s | load 1m before | after |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for p in result["phases"]:
        phase = p["phase"] + (" (failed)" if "error" in p else "")
        lines.append(
            f"| {p['round'] or '-'} | {p['system']} | {phase} | {p['seconds']} "
            f"| {p['load_before']} | {p['load_after']} |"
        )
    lines.extend(f"WARNING: {w}" for w in result["warnings"])
    return "\n".join(lines)


# ---- leftovers -------------------------------------------------------------------------------


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def leftovers(peers_dir: Path, root: Path) -> list[str]:
    """What this run's servers or files may have left: listeners on their addresses, the
    data directory, Kafka work directories."""
    found = []
    for prefix in (PREFIX, QUEUE_PREFIX, SKEW_PREFIX):
        for i in (11, 12, 13):
            if _listening(f"{prefix}.{i}", 7070):
                found.append(f"listener {prefix}.{i}:7070")
    for system, ports in PEER_PORTS.items():
        found += [f"{system} listener 127.0.0.1:{p}" for p in ports if _listening("127.0.0.1", p)]
    if root.exists():
        found.append(f"directory {root}")
    found += [f"directory {p}" for p in peers_dir.glob("kafka-work-*")]
    return found


# ---- the sitting -----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument("--quick", action="store_true", help="1 round, small counts (~10 min)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (2; --quick 1)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="subset of %(default)s")
    parser.add_argument("--size", type=int, default=1120, help="record bytes")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--count", type=int, help="Laminar records per 560 KB-batch publish")
    parser.add_argument("--kafka-batch-count", type=int, help="Laminar, 14 records an append")
    parser.add_argument(
        "--kafka-batch-in-flight", type=int, default=5,
        help="Laminar appends in flight per partition at 14 records an append (Kafka's "
        "max.in.flight.requests.per.connection is 5)",
    )  # fmt: skip
    parser.add_argument("--single-count", type=int, help="records, one per append")
    parser.add_argument("--idle-count", type=int, help="records of the one-append-in-flight phase")
    parser.add_argument(
        "--wrk-seconds", type=float, help="wrk's run of one record per HTTP append (RF 1)"
    )
    parser.add_argument("--peer-count", type=int, help="NATS and Kafka records per publish")
    parser.add_argument("--kafka-warmup", type=int, help="Kafka JIT warm-up records")
    parser.add_argument("--rate", type=int, default=5000, help="latency phases, msg/s")
    parser.add_argument("--latency-seconds", type=float)
    parser.add_argument(
        "--linger-ms", type=float, default=3.0, help="Laminar fixed-rate batching (and the queue's)"
    )
    parser.add_argument("--scale-count", type=int, help="records per 6 / 192 partition run")
    parser.add_argument("--skip-scale", action="store_true", help="no 6 vs 192 partitions")
    parser.add_argument("--queue-rates", default="500,1000,2000", help="msg/s, comma list")
    parser.add_argument("--queue-duration", type=float, help="seconds per queue rate")
    parser.add_argument("--skew-partitions", type=int, default=1000, help="0: skip")
    parser.add_argument("--skew-idle-seconds", type=float)
    parser.add_argument("--max-seconds", type=float, help="time bound of each phase's load")
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    parser.add_argument("--peers-dir", type=Path, default=REPO / ".peers")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data directory")
    parser.add_argument("--json", action="store_true", help="every figure as JSON, last line")
    a = parser.parse_args(argv)
    defaults = QUICK if a.quick else FULL
    for key, value in defaults.items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    a.systems = [x.strip() for x in a.systems.split(",") if x.strip()]
    unknown = sorted(set(a.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    a.queue_rates = [float(r) for r in a.queue_rates.split(",") if r.strip()]
    counts = (a.count, a.single_count, a.idle_count, a.peer_count, a.scale_count)
    if a.rounds < 1 or min(counts) < 1:
        parser.error("--rounds and the counts must be >= 1")
    a.peers_dir = a.peers_dir.resolve()
    return a


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20
        ).stdout.strip()

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = git("rev-parse", "--short", "HEAD")
        return head + (" + working tree" if git("status", "--porcelain", "--", "broker") else "")
    return "?"


def run(a: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    phases = Phases()
    root = Path(tempfile.mkdtemp(prefix="laminar-compare-", dir=a.dir))
    result: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "commit": _commit(),
        "load_avg_1m": load_avg_1m(),
        "params": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "warnings": [],
    }
    log(f"load average {os.getloadavg()}; data under {root}")
    rounds: list[dict[str, Any]] = []
    steps: dict[str, Callable[[int], dict[str, Any]]] = {
        "laminar": lambda n: laminar_round(a, root, phases, n),
        "nats": lambda n: nats_round(a, phases, n),
        "kafka": lambda n: kafka_round(a, phases, n),
        "queue": lambda n: queue_round(a, root, phases, n),
    }
    try:
        result["machine"] = {
            "cpus": os.cpu_count(),
            "fdatasync_4k_per_s": fdatasync_per_s(root),
            "sync_round_us": sync_round_us(root),
        }
        for n in range(1, a.rounds + 1):
            figures: dict[str, Any] = {}
            for system in SYSTEMS:
                if system in a.systems:
                    log(f"round {n}/{a.rounds}: {system}")
                    try:
                        figures.update(steps[system](n))
                    except Exception as e:  # servers stopped already; the others still run
                        log(f"round {n} {system} FAILED: {type(e).__name__}: {e}")
                        result["warnings"].append(f"round {n} {system} failed: {e}"[:500])
            rounds.append(figures)
        if a.skew_partitions > 0 and "laminar" in a.systems:
            try:
                result["partitions"] = measure_skew(a, root, phases)
            except Exception as e:
                log(f"leaders of {a.skew_partitions} partitions FAILED: {e}")
                result["warnings"].append(f"leader skew failed: {e}"[:500])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for figures in rounds:
        for key in ("_nats_warnings", "_queue_warnings"):
            result["warnings"] += figures.get(key, [])
    median, best = aggregate(rounds)
    skew = result.get("partitions") or {}
    for figures in (median, best):
        figures["leader_skew_1000"] = skew.get("leader_skew")
    median["leader_counts_1000"] = skew.get("leader_counts")
    median["lam_idle_cpu_pct_1000"] = skew.get("idle_cpu_pct")
    result.update(median)
    result["median"], result["best"] = median, best
    result["per_round"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rounds]
    result["targets"] = targets(median, a.queue_rates)
    result.update(result["targets"])
    result["rounds"] = len(rounds)
    result["phases"] = phases.rows
    result["versions"] = {
        "kafka": next((r["_kafka_version"] for r in rounds if "_kafka_version" in r), None),
        "nats": next((r["_nats_versions"] for r in rounds if "_nats_versions" in r), None),
    }
    result["load_avg_1m_end"] = load_avg_1m()
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["leftovers"] = leftovers(a.peers_dir, root)
    result["warnings"] += [f"left behind: {x}" for x in result["leftovers"]]
    return result


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        with signals_raise():
            result = run(a)
    except KeyboardInterrupt:
        log("interrupted (servers stopped, data removed)")
        return 130
    print(tables(result))
    if a.json:  # the medians are the top-level figures: no second copy
        print(json.dumps({k: v for k, v in result.items() if k != "median"}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
