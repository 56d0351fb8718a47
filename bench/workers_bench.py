"""Workers (issue 23): one worker against two per broker, on this machine, in the same run.

    python3 bench/workers_bench.py [--rounds 2] [--seconds 8] [--json]

Each round runs every phase with 1 worker per broker, then with 2 (interleaved, so that a
drift of the machine hits both alike), each phase on a fresh local cluster (fsync always,
every answer after its fdatasync):

  rf1_single   one broker, RF 1, 8 partitions: wrk (C: the client is not the limit) POSTs one
               1120-byte record per request on 32 connections to each of two partitions'
               leaders (with 2 workers, one partition led by each worker: the clients route
               to the owning worker, layer 1 of docs/workers.md)
  rf1_batch    one broker, RF 1, 6 partitions: `laminar bench produce`, 500 records an append
  rf3_batch    three brokers, RF 3, 6 partitions: the same
  rf1_latency  one broker, RF 1: `laminar bench produce --rate 5000`: p50 / p99 due -> ack
  rf3_latency  three brokers, RF 3: the same
  queue_drain  bench/queue_bench.py --phases drain: 3 brokers, RF 3, acquire + accept msg/s
  routing      three brokers: the share of requests that reached the right worker first,
               for each routing layer: 1, the client's (it routes by each partition's
               leader: `laminar bench produce`'s requests not answered by a redirect); 2,
               none (every request to each broker's worker 0, answered by a redirect when
               another worker owns the partition: raw HTTP, counting 307s); 3, with 2
               workers, the kernel's (every append on a new connection to the broker's
               --steer-port, from a source port the kernel hands to the leading worker).

Printed per phase: msg/s (or ms) with 1 and 2 workers and their ratio, and the server CPU
seconds per million messages of each broker process (from /proc). Also the machine's limits
measured in the run: CPUs, 4 KiB fdatasync/s. Every phase is bounded in count and time; the
clusters are stopped in a finally block. Target (issue 23): >= 1.7x publish msg/s with 2
workers on 2 cores, p99 no worse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from compare import HERE, REPO, _check_free, laminar_bench, log, wrk_appends
from machine import cpu_seconds, fdatasync_per_s, load_avg_1m

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.server.steering import source_port_for
from laminar.workers import broker_of, worker_index

PREFIX = "127.0.23"  # the clusters' loopback /24
SIZE = 1120
WRK_CONNECTIONS = 32  # per partition (two partitions: 64 in flight, as bench/single_bench.py)
BATCH_RECORDS = 500
RATE = 5000
ROUTING_REQUESTS = 600
#: the supervisor's line that says which program steers the steer port (server/supervisor.py)
STEERED_BY = re.compile(r"steer port \d+: connections go to worker .*by the (\w+) program")
STEER_PORT = 7090
PHASES = ("rf1_single", "rf1_batch", "rf3_batch", "rf1_latency", "rf3_latency",
          "queue_drain", "routing")  # fmt: skip


def per_process(cluster: LocalCluster) -> dict[str, float]:
    """The CPU seconds each serving process (broker or worker) used so far."""
    return {node: cpu_seconds(pid) or 0.0 for node, pid in cluster.serving_pids().items()}


def cpu_per_million(
    before: dict[str, float], after: dict[str, float], messages: float
) -> dict[str, float]:
    return {
        node: round((after[node] - before.get(node, 0.0)) / messages * 1e6, 1)
        for node in after
        if messages
    }


async def _leaders(cluster: LocalCluster, topic: str, partitions: int, rf: int) -> dict[int, Any]:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        await client.create_topic(topic, partitions=partitions, replication_factor=rf)
        await client.wait_for_leaders(topic)
        deadline = time.monotonic() + 30
        while True:  # placement settled: no replica still moving
            info = await client.describe_topic(topic)
            states = info.partition_states
            if all(p.leader and not p.learners for p in states) or time.monotonic() > deadline:
                return {p.partition: (p.leader, p.leader_url) for p in states}
            await asyncio.sleep(0.2)


def cluster_of(
    root: Path, name: str, brokers: int, workers: int, *, steer: bool = False
) -> LocalCluster:
    extra = ("--steer-port", str(STEER_PORT)) if steer else ()
    cluster = LocalCluster(
        root / name, brokers, prefix=PREFIX, fsync="always", workers=workers, extra_args=extra
    )
    _check_free(cluster)
    cluster.start()
    return cluster


def stopped(cluster: LocalCluster) -> None:
    try:
        cluster.stop()
    finally:
        shutil.rmtree(cluster.data_dir, ignore_errors=True)


def rf1_single(root: Path, workers: int, seconds: float) -> dict[str, Any]:
    cluster = cluster_of(root, f"single-w{workers}", 1, workers)
    try:
        leaders = asyncio.run(_leaders(cluster, "single", 8, 1))
        chosen: dict[str, tuple[int, str]] = {}
        for partition, (leader, url) in sorted(leaders.items()):
            chosen.setdefault(leader, (partition, url))
        targets = list(chosen.values())
        targets += [(p, u) for p, (_, u) in sorted(leaders.items()) if (p, u) not in targets]
        targets = targets[:2]  # one partition of each worker (two of the one worker)
        before = per_process(cluster)
        with ThreadPoolExecutor(len(targets)) as pool:
            runs = [
                pool.submit(
                    wrk_appends,
                    f"{url}/v1/topics/single/partitions/{partition}/records",
                    cluster.token,
                    [],
                    SIZE,
                    seconds,
                    WRK_CONNECTIONS,
                    root,
                )
                for partition, url in targets
            ]
            results = [run.result() for run in runs]
        after = per_process(cluster)
        rate = sum(r["msgs_per_s"] for r in results)
        return {
            "msgs_per_s": round(rate),
            "p50_ms": max(r["batch_latency_p50_ms"] for r in results),
            "p99_ms": max(r["batch_latency_p99_ms"] for r in results),
            "cpu_s_per_million": cpu_per_million(before, after, rate * seconds),
            "partitions": [p for p, _ in targets],
        }
    finally:
        stopped(cluster)


def produce(
    root: Path, workers: int, name: str, brokers: int, rf: int, arguments: list[str]
) -> dict[str, Any]:
    cluster = cluster_of(root, f"{name}-w{workers}", brokers, workers)
    try:
        asyncio.run(_leaders(cluster, name, 6, rf))
        before = per_process(cluster)
        figures = laminar_bench(
            cluster,
            ["produce", "--topic", name, "--size", str(SIZE), *arguments],
            timeout_s=240,
        )
        after = per_process(cluster)
        figures["cpu_s_per_million"] = cpu_per_million(before, after, figures["records"])
        return figures
    finally:
        stopped(cluster)


def queue_drain(root: Path, workers: int, count: int) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "queue_bench.py"), "--phases", "drain", "--json",
               "--workers", str(workers), "--count", str(count), "--prefix", PREFIX,
               "--max-seconds", "60"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "broker"), str(REPO)]))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"queue_bench failed: {done.stdout[-800:]} {done.stderr[-800:]}")
    drain = json.loads(done.stdout.strip().splitlines()[-1])["laminar"]["drain"]
    return {"msgs_per_s": drain["msgs_per_s"], "accepted": drain["accepted"]}


async def _steered(
    cluster: LocalCluster, leaders: dict[int, Any], body: bytes, requests: int
) -> dict[str, Any]:
    """Layer 3: each append on a new connection to its partition's broker's steer port, from
    a source port that the kernel's program hands to the leading worker."""
    rng = random.Random(23)
    used: set[int] = set()  # each source port once: no connection meets another's TIME_WAIT
    first_time = 0
    for n in range(requests):
        partition = n % len(leaders)
        leader = leaders[partition][0]
        host = cluster.nodes[broker_of(leader)].host
        for _ in range(100):  # a source port naming the worker that no socket holds
            port = source_port_for(worker_index(leader), cluster.workers, rng)
            if port in used:
                continue
            used.add(port)
            try:
                reader, writer = await asyncio.open_connection(
                    host, STEER_PORT, local_addr=(host, port)
                )
                break
            except OSError:
                continue
        else:
            raise RuntimeError("no free source port for a steered connection")
        head = (f"POST /v1/topics/steered/partitions/{partition}/records HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: Bearer {cluster.token}\r\n"
                f"Content-Type: application/vnd.laminar.batch\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + body)
        answer = await reader.read()
        writer.close()
        status = answer.split(b" ", 2)[1]
        if status == b"200":
            first_time += 1
        elif status != b"307":
            raise RuntimeError(f"a steered append answered {answer[:300]!r}")
    return {"requests": requests, "first_time": first_time}


async def _unrouted(cluster: LocalCluster, topic: str, requests: int) -> dict[str, Any]:
    """Layer 2 alone: each append goes to its partition's broker's worker 0 (the address a
    client without routing knows), which redirects it if another worker owns it. Then, with
    more than one worker, layer 3 (`_steered`) on another topic."""
    import aiohttp

    from laminar.log.batch import Record, encode_batch

    leaders = await _leaders(cluster, topic, 6, 3)
    body = encode_batch([Record(value=b"x" * SIZE)])
    headers = {"Authorization": f"Bearer {cluster.token}",
               "Content-Type": "application/vnd.laminar.batch"}  # fmt: skip
    first_time = redirected = 0
    async with aiohttp.ClientSession(headers=headers) as session:
        for n in range(requests):
            partition = n % len(leaders)
            broker = cluster.nodes[broker_of(leaders[partition][0])]
            url = f"{broker.api_url}/v1/topics/{topic}/partitions/{partition}/records"
            async with session.post(url, data=body, allow_redirects=False) as answer:
                await answer.read()
                if answer.status == 307:
                    redirected += 1
                    target = answer.headers["Location"]
                    async with session.post(target, data=body) as again:
                        assert again.status == 200, await again.text()
                else:
                    assert answer.status == 200, await answer.text()
                    first_time += 1
    out: dict[str, Any] = {"requests": requests, "first_time": first_time}
    if cluster.workers > 1:
        steered = await _leaders(cluster, "steered", 6, 3)
        out["steered"] = await _steered(cluster, steered, body, requests)
    return out


def routing(root: Path, workers: int) -> dict[str, Any]:
    cluster = cluster_of(root, f"routing-w{workers}", 3, workers, steer=workers > 1)
    try:
        layer2 = asyncio.run(_unrouted(cluster, "unrouted", ROUTING_REQUESTS))
        figures = laminar_bench(
            cluster,
            ["produce", "--topic", "routed", "--size", str(SIZE), "--partitions", "6",
             "--replication-factor", "3", "--batch", "14", "--count", "20000"],
            timeout_s=240,
        )  # fmt: skip
        logs = [(n.data_dir / "broker.log").read_text(errors="replace")
                for n in cluster.nodes.values()]  # fmt: skip
        programs = sorted({program for text in logs for program in STEERED_BY.findall(text)})
    finally:
        stopped(cluster)
    requests, redirects = figures["requests"], figures["redirects"]
    out = {
        "layer1_first_time_share": round(1 - redirects / requests, 4) if requests else None,
        "layer1_requests": requests,
        "layer2_first_time_share": round(layer2["first_time"] / layer2["requests"], 4),
        "layer2_requests": layer2["requests"],
    }
    if "steered" in layer2:
        steered = layer2["steered"]
        out["layer3_first_time_share"] = round(steered["first_time"] / steered["requests"], 4)
        out["layer3_requests"] = steered["requests"]
        out["layer3_program"] = ",".join(programs) or "none: the kernel's hash"
    return out


def round_of(root: Path, a: argparse.Namespace, workers: int) -> dict[str, Any]:
    batch = ["--batch", str(BATCH_RECORDS), "--in-flight", "2", "--count", str(a.count),
             "--partitions", "6", "--max-seconds", str(a.max_seconds)]  # fmt: skip
    rate = ["--rate", str(RATE), "--seconds", str(a.seconds), "--partitions", "6",
            "--linger-ms", "1"]  # fmt: skip
    runs = {
        "rf1_single": lambda: rf1_single(root, workers, a.seconds),
        "rf1_batch": lambda: produce(root, workers, "rf1batch", 1, 1,
                                     [*batch, "--replication-factor", "1"]),
        "rf3_batch": lambda: produce(root, workers, "rf3batch", 3, 3,
                                     [*batch, "--replication-factor", "3"]),
        "rf1_latency": lambda: produce(root, workers, "rf1lat", 1, 1,
                                       [*rate, "--replication-factor", "1"]),
        "rf3_latency": lambda: produce(root, workers, "rf3lat", 3, 3,
                                       [*rate, "--replication-factor", "3"]),
        "queue_drain": lambda: queue_drain(root, workers, a.queue_count),
        "routing": lambda: routing(root, workers),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for phase in a.phases:
        started = time.monotonic()
        out[phase] = runs[phase]()
        out[phase]["seconds"] = round(time.monotonic() - started, 1)
        log(f"{workers} worker(s) {phase}: {_headline(phase, out[phase])}")
    return out


def _headline(phase: str, figures: dict[str, Any]) -> str:
    if phase.endswith("latency"):
        return f"p50 {figures['latency_p50_ms']} ms, p99 {figures['latency_p99_ms']} ms"
    if phase == "routing":
        layer3 = figures.get("layer3_first_time_share")
        return (
            f"first time: layer 1 {figures['layer1_first_time_share']:.1%}, "
            f"layer 2 {figures['layer2_first_time_share']:.1%}"
            + (
                f", layer 3 {layer3:.1%} ({figures['layer3_program']} program)"
                if layer3 is not None
                else ""
            )
        )
    return f"{figures['msgs_per_s']:,.0f} msg/s"


def median(rounds: list[dict[str, Any]], phase: str, key: str) -> float | None:
    values = [r[phase][key] for r in rounds if phase in r and r[phase].get(key) is not None]
    return statistics.median(values) if values else None


def table(result: dict[str, Any]) -> str:
    one, two = result["rounds"]["1"], result["rounds"]["2"]
    lines = ["| phase | figure | 1 worker | 2 workers | 2 / 1 |", "|---|---|---:|---:|---:|"]
    rows = [("rf1_single", "msgs_per_s"), ("rf1_single", "p99_ms"),
            ("rf1_batch", "msgs_per_s"), ("rf3_batch", "msgs_per_s"),
            ("rf1_latency", "latency_p50_ms"), ("rf1_latency", "latency_p99_ms"),
            ("rf3_latency", "latency_p50_ms"), ("rf3_latency", "latency_p99_ms"),
            ("queue_drain", "msgs_per_s"), ("routing", "layer1_first_time_share"),
            ("routing", "layer2_first_time_share"),
            ("routing", "layer3_first_time_share")]  # fmt: skip
    for phase, key in rows:
        a, b = median(one, phase, key), median(two, phase, key)
        if a is None and b is None:
            continue
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        lines.append(f"| {phase} | {key} | {_f(a)} | {_f(b)} | {ratio} |")
    lines.append("")
    lines.append("Server CPU seconds per million messages, per process (the last round):")
    for phase in ("rf1_single", "rf1_batch", "rf3_batch"):
        for workers, rounds in (("1", one), ("2", two)):
            if rounds and phase in rounds[-1]:
                cpu = rounds[-1][phase]["cpu_s_per_million"]
                lines.append(f"- {phase}, {workers} worker(s): {cpu}")
    return "\n".join(lines)


def _f(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}" if value < 10 else f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk and fixed-rate phases")
    parser.add_argument("--count", type=int, default=300_000, help="records, batched phases")
    parser.add_argument("--queue-count", type=int, default=50_000)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap per bench run")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--json", action="store_true", help="all figures as JSON, last line")
    a = parser.parse_args()
    a.phases = [p for p in a.phases.split(",") if p]
    unknown = set(a.phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    root = Path(tempfile.mkdtemp(prefix="laminar-workers-bench-"))
    result: dict[str, Any] = {"rounds": {"1": [], "2": []}}
    try:
        result["machine"] = {"cpus": os.cpu_count(), "fdatasync_4k_per_s": fdatasync_per_s(root),
                             "load_1m_at_start": load_avg_1m()}  # fmt: skip
        log(f"machine: {result['machine']}")
        for number in range(a.rounds):
            for workers in (1, 2):
                log(f"round {number + 1}, {workers} worker(s)")
                result["rounds"][str(workers)].append(round_of(root, a, workers))
        result["machine"]["load_1m_at_end"] = load_avg_1m()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(result))
    if a.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
