"""Laminar shared queues (issue 6): acquire + accept throughput and publish -> accept latency.

A fresh local cluster of real `laminar serve` processes on loopback (--brokers, fsync policy
--fsync, default always), one topic with --partitions partitions and replication factor
--replication-factor, one consumer group. Phases:

  publish  pre-publish --count records of --size bytes (ASCII, so acquire answers carry them as
           plain JSON strings) with binary batch appends (--publish-batch records a batch, 2 in
           flight per partition: the wire format the Producer sends), each acknowledged once
           committed. Reported, not the target metric.
  drain    --consumers consumer processes (multiprocessing, so that one Python process is not
           the limit), each with its own AsyncClient and consumer id and, like GroupConsumer,
           one loop per partition: acquire up to --max messages (lease --lease-ms, long-poll
           --wait-ms), then accept all of them in ONE accept call (per-message accept
           semantics: every index is settled individually, batched on the wire), until the
           group accepted --count messages, each accept answered before the next acquire.
           With --settle pipelined the loop acquires again while up to 4 of its accepts are
           unanswered, as GroupConsumer's settling runs apart from its acquiring loops (and a
           RabbitMQ consumer's acks are one-way): bench/RESULTS.md found no difference.
           msgs/s = accepted / (last accept answered - start).
  latency  a fresh topic; the consumers long-poll while this process publishes at a fixed
           rate (--rates, msg/s) for --duration s: every --linger-ms (a fixed schedule) the
           records due go out as one append, partitions in turn. Each record carries its due
           time; its latency = time its accept was answered - due time (no coordinated
           omission; one clock, CLOCK_REALTIME, shared by the processes). 200 warm-up records
           not counted.
           Also reported: due time -> delivered (the acquire answer holding it reached the
           consumer). That one is what the peers' latency measures: RabbitMQ's is the time
           its consumer received the message - the time just before the publish (its ack
           is one-way: nothing answers it), so the ratios compare both against it.

Every phase is bounded by --count and --max-seconds; the cluster (and the consumer processes)
are stopped in a finally block, also on Ctrl-C, SIGTERM and SIGHUP. Printed too, measured in
the same run: the machine's limits (CPUs, 4 KiB fdatasync/s on the data disk) and the CPU of
every broker and client process per phase (from /proc; 100 % = one core).

With --peers the RabbitMQ quorum-queue and NATS JetStream work-queue peers (bench/queue_peers.py,
non-Python reference clients) run right after, in the same sitting, with the same phases, size,
count, consumers, rates and duration, and the ratios are printed (target: Laminar drain >= 2x
RabbitMQ quorum R3).

    python3 bench/queue_bench.py                       # Laminar only (about 1-2 minutes)
    python3 bench/queue_bench.py --peers --json        # + RabbitMQ 3 nodes + NATS 3 nodes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "broker"))

from machine import fdatasync_per_s  # noqa: E402
from queue_peers import signals_raise  # noqa: E402

from laminar.bench import sleep_to_next_tick  # noqa: E402
from laminar.client import AsyncClient, NotFound  # noqa: E402
from laminar.local_cluster import LocalCluster, probe  # noqa: E402
from laminar.log.batch import Record, encode_batch  # noqa: E402

PREFIX = "127.0.6"
GROUP = "bench"
WARMUP = 200
#: accepts a consumer's partition loop leaves unanswered while it acquires again (--settle
#: pipelined)
SETTLES_IN_FLIGHT = 4
CLK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[queue_bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _pct(sorted_ms: Sequence[float], q: float) -> float | None:
    if not sorted_ms:
        return None
    k = min(len(sorted_ms) - 1, max(0, round(q / 100 * (len(sorted_ms) - 1))))
    return round(sorted_ms[k], 3)


def lat_summary(values_ms: list[float]) -> dict[str, Any]:
    v = sorted(values_ms)
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "p50_ms": _pct(v, 50),
        "p90_ms": _pct(v, 90),
        "p99_ms": _pct(v, 99),
        "p999_ms": _pct(v, 99.9),
        "max_ms": round(v[-1], 3),
        "mean_ms": round(sum(v) / len(v), 3),
    }


# ---- machine limits and CPU accounting ------------------------------------------------------


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])
    except (OSError, IndexError, ValueError):
        return None


def _user_procs() -> dict[int, tuple[int, str]]:
    """{pid: (cpu ticks, name)} of every user-space process (kernel threads skipped)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                raw = f.read()
            parts = raw.rsplit(")", 1)[1].split()
            if int(parts[6]) & 0x00200000:  # PF_KTHREAD
                continue
            out[int(d)] = (
                int(parts[11]) + int(parts[12]),
                raw[raw.index("(") + 1 : raw.rindex(")")],
            )
        except (OSError, ValueError, IndexError):
            pass
    return out


def _machine() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]


class CpuMeter:
    """Average CPU % (100 = one core) of the given processes between start() and stop(), the
    machine's busy %, and what other processes used (machine minus ours)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.t0 = 0.0
        self.first: dict[str, int | None] = {}
        self.m0 = (0, 0)
        self.all0: dict[int, tuple[int, str]] = {}

    def add(self, label: str, pid: int) -> None:
        self.pids[label] = pid
        if self.t0:
            self.first[label] = _ticks(pid)

    def start(self) -> CpuMeter:
        self.t0 = time.monotonic()
        self.first = {k: _ticks(p) for k, p in self.pids.items()}
        self.m0 = _machine()
        self.all0 = _user_procs()
        return self

    def stop(self, last: dict[str, int] | None = None) -> dict[str, Any]:
        elapsed = max(1e-6, time.monotonic() - self.t0)
        total, idle = _machine()
        busy = 100.0 * (1 - (idle - self.m0[1]) / max(1, total - self.m0[0]))
        procs: dict[str, float | None] = {}
        for label, pid in self.pids.items():
            end = (last or {}).get(label, _ticks(pid))
            start = self.first.get(label)
            procs[label] = (
                None
                if end is None or start is None
                else round(100 * (end - start) / CLK / elapsed, 1)
            )
        ours = sum(v or 0 for v in procs.values())
        cpus = os.cpu_count() or 1
        mine = set(self.pids.values())
        others: dict[str, float] = {}
        for pid, (ticks, name) in _user_procs().items():
            if pid not in mine and (used := ticks - self.all0.get(pid, (0, name))[0]) > 0:
                others[name] = others.get(name, 0) + 100 * used / CLK / elapsed
        return {
            "elapsed_s": round(elapsed, 2),
            "procs_pct": procs,
            "machine_busy_pct": round(busy, 1),
            # CPU not of our processes: other users' processes, kernel threads, softirq
            "other_procs_pct": round(max(0.0, busy * cpus - ours), 1),
            "other_user_procs_pct": round(sum(others.values()), 1),
            "other_top": {
                k: round(v, 1) for k, v in sorted(others.items(), key=lambda x: -x[1])[:3]
            },
        }


def wait_idle(max_wait_s: float, busy_below: float = 15.0, need: int = 3) -> tuple[float, float]:
    """Wait (bounded) until the machine was < busy_below % busy for `need` seconds in a row."""
    t0 = time.monotonic()
    ok, busy = 0, 100.0
    while time.monotonic() - t0 < max_wait_s:
        a = _machine()
        time.sleep(1)
        b = _machine()
        busy = 100.0 * (1 - (b[1] - a[1]) / max(1, b[0] - a[0]))
        ok = ok + 1 if busy < busy_below else 0
        if ok >= need:
            break
    return round(time.monotonic() - t0, 1), round(busy, 1)


# ---- consumer processes -------------------------------------------------------------------


def _consumer_process(cfg: dict[str, Any], go: Any, done: Any, counter: Any, out: Any) -> None:
    """One consumer (its own process, event loop, client and consumer id)."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    try:
        asyncio.run(_consume(cfg, go, done, counter, out))
    except BaseException as e:  # report, never hang the parent
        out.put({"id": cfg["id"], "error": f"{type(e).__name__}: {e}"})


async def _consume(cfg: dict[str, Any], go: Any, done: Any, counter: Any, out: Any) -> None:
    topic, consumer = cfg["topic"], f"bench-c{cfg['id']}"
    latency_mode = cfg["mode"] == "latency"
    stats = {"accepted": 0, "refused": 0, "acquires": 0, "empty_acquires": 0, "accepts": 0}
    lats: list[float] = []
    to_acquire: list[float] = []
    last_answer = 0.0
    async with AsyncClient(cfg["urls"], timeout_s=30) as client:
        await client.wait_for_leaders(topic)
        out.put({"id": cfg["id"], "ready": os.getpid()})
        ready_at = time.monotonic()
        while not go.value and time.monotonic() - ready_at < 600:
            await asyncio.sleep(0.005)
        deadline = time.monotonic() + cfg["max_seconds"]

        async def settle(partition: int, messages: list[Any], acquired_ns: int) -> None:
            nonlocal last_answer
            indexes = [m.index for m in messages]
            settled = await client.accept(topic, partition, GROUP, consumer, indexes)
            now_ns = time.time_ns()
            last_answer = time.monotonic()
            stats["accepts"] += 1
            stats["accepted"] += len(settled.done)
            stats["refused"] += len(settled.refused)
            if latency_mode:
                for m in messages:
                    ts, seq, _ = (m.value or b"0:0:").split(b":", 2)
                    if int(seq) >= WARMUP:
                        lats.append((now_ns - int(ts)) / 1e6)
                        to_acquire.append((acquired_ns - int(ts)) / 1e6)
            with counter.get_lock():
                counter.value += len(settled.done)
                if counter.value >= cfg["target"]:
                    done.value = 1

        async def partition_loop(partition: int) -> None:
            # pipelined: the next acquire goes out while the last accepts are unanswered (at
            # most SETTLES_IN_FLIGHT), as GroupConsumer settles apart from its acquiring
            # loops; "wait": each accept answered before the next acquire
            settling: deque[asyncio.Task[None]] = deque()
            limit = 1 if cfg["settle"] == "wait" else SETTLES_IN_FLIGHT
            try:
                while not done.value and time.monotonic() < deadline:
                    got = await client.acquire(
                        topic, partition, GROUP, consumer=consumer, max_messages=cfg["max"],
                        lease_ms=cfg["lease_ms"], wait_ms=cfg["wait_ms"],
                    )  # fmt: skip
                    stats["acquires"] += 1
                    if not got.messages:
                        stats["empty_acquires"] += 1
                        continue
                    messages = list(got.messages)
                    settling.append(
                        asyncio.create_task(settle(partition, messages, time.time_ns()))
                    )
                    while len(settling) >= limit or (settling and settling[0].done()):
                        await settling.popleft()
                for task in settling:
                    await task
            finally:
                for task in settling:
                    task.cancel()

        mine = range(cfg["partitions"])
        if cfg["assign"] == "spread":  # consumer i only on partitions p = i-1 (mod consumers)
            mine = range((cfg["id"] - 1) % cfg["consumers"], cfg["partitions"], cfg["consumers"])
        tasks = [asyncio.create_task(partition_loop(p)) for p in mine]
        while not done.value and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if any(t.done() and t.exception() for t in tasks):
                break
        for t in tasks:  # loops may sit in a long poll: the work is done, stop them
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        errors = [e for e in errors if not isinstance(e, asyncio.CancelledError)]
        if errors:
            raise errors[0]
    out.put(
        {
            "id": cfg["id"],
            "stats": stats,
            "last_answer": last_answer,
            "lats": lats,
            "to_acquire": to_acquire,
        }
    )


class Consumers:
    """--consumers consumer processes; start(), go(), wait() -> per-consumer results.
    They are signalled through shared flags they poll (go, done), not multiprocessing Events:
    setting an Event that a killed process was waiting on blocks forever."""

    def __init__(self, cfg: dict[str, Any], count: int) -> None:
        self.ctx = mp.get_context("spawn")
        self.go_event = self.ctx.Value("b", 0)
        self.done = self.ctx.Value("b", 0)
        self.counter = self.ctx.Value("q", 0)
        self.out = self.ctx.Queue()
        self.procs = [
            self.ctx.Process(
                target=_consumer_process,
                args=({**cfg, "id": i}, self.go_event, self.done, self.counter, self.out),
                daemon=True,
            )
            for i in range(1, count + 1)
        ]
        self.pids: dict[str, int] = {}
        self.results: dict[int, dict[str, Any]] = {}

    def _get(self, timeout: float) -> dict[str, Any]:
        item: dict[str, Any] = self.out.get(timeout=timeout)
        if "error" in item:
            raise RuntimeError(f"consumer {item['id']} failed: {item['error']}")
        return item

    def start(self, timeout: float = 60) -> dict[str, int]:
        for p in self.procs:
            p.start()
        while len(self.pids) < len(self.procs):
            item = self._get(timeout)
            self.pids[f"consumer-{item['id']}"] = item["ready"]
        return self.pids

    def go(self) -> float:
        started = time.monotonic()
        self.go_event.value = 1
        return started

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.results) < len(self.procs):
            item = self._get(max(0.1, deadline - time.monotonic()))
            self.results[item["id"]] = item
        return [self.results[i] for i in sorted(self.results)]

    def wait_done(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.done.value and time.monotonic() < deadline:
            time.sleep(0.005)
        return bool(self.done.value)

    def stop(self) -> None:
        self.done.value = 1
        for p in self.procs:
            p.join(timeout=5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()


# ---- phases -------------------------------------------------------------------------------


async def _ensure_topic(urls: list[str], topic: str, partitions: int, rf: int) -> None:
    async with AsyncClient(urls) as client:
        try:
            await client.describe_topic(topic)
        except NotFound:
            await client.create_topic(topic, partitions=partitions, replication_factor=rf)
        await client.wait_for_leaders(topic)


async def _check_acquire(urls: list[str], topic: str) -> None:
    """The acquire endpoint must answer 200 (brokers without shared queues answer 404)."""
    async with AsyncClient(urls) as client:
        await client.acquire(topic, 0, GROUP, consumer="bench-probe", max_messages=1)


async def _prepublish(urls: list[str], a: argparse.Namespace) -> dict[str, Any]:
    value = b"0:0:" + b"a" * max(0, a.size - 4)
    batch = encode_batch([Record(value=value) for _ in range(a.publish_batch)])
    total_batches = -(-a.count // a.publish_batch)
    next_batch = 0
    done = 0
    deadline = time.perf_counter() + a.max_seconds
    async with AsyncClient(urls) as client:
        await client.wait_for_leaders("queue")

        async def worker(partition: int) -> None:
            nonlocal next_batch, done
            while next_batch < total_batches and time.perf_counter() < deadline:
                next_batch += 1
                await client.append("queue", partition, batch)
                done += a.publish_batch

        started = time.perf_counter()
        await asyncio.gather(*(worker(p) for p in range(a.partitions) for _ in range(2)))
        elapsed = time.perf_counter() - started
    return {"records": done, "elapsed_s": round(elapsed, 3), "msgs_per_s": round(done / elapsed, 1)}


async def _publish_at_rate(
    urls: list[str], topic: str, a: argparse.Namespace, rate: float, consumers: Consumers
) -> dict[str, Any]:
    """Warm-up, then `rate` records/s for a.duration s; returns what was sent."""
    pad = b"a" * a.size
    total = min(a.count, int(rate * a.duration))
    async with AsyncClient(urls) as client:
        await client.wait_for_leaders(topic)

        def records(seqs: range, due_ns: list[int]) -> bytes:
            out = []
            for seq, due in zip(seqs, due_ns, strict=True):
                head = f"{due}:{seq}:".encode()
                out.append(Record(value=head + pad[len(head) :]))
            return encode_batch(out)

        for i in range(0, WARMUP, 20):  # warm-up: not counted by the consumers
            now = time.time_ns()
            await client.append(
                topic, i // 20 % a.partitions, records(range(i, i + 20), [now] * 20)
            )
        t_wait = time.monotonic()
        while consumers.counter.value < WARMUP and time.monotonic() - t_wait < 30:
            await asyncio.sleep(0.01)
        pending: set[asyncio.Task[Any]] = set()
        append_ms: list[float] = []

        async def timed_append(partition: int, body: bytes) -> None:
            t0 = time.perf_counter()
            await client.append(topic, partition, body)
            append_ms.append((time.perf_counter() - t0) * 1000)

        started_ns = time.time_ns()
        started = time.monotonic()
        hard = started + a.duration + a.max_seconds
        sent = turn = 0
        tick = time.perf_counter()
        while sent < total and time.monotonic() < hard:
            elapsed = time.monotonic() - started
            due = min(total, int(elapsed * rate) + 1) - sent
            if due > 0:
                due_ns = [started_ns + int((sent + i) * 1e9 / rate) for i in range(due)]
                body = records(range(WARMUP + sent, WARMUP + sent + due), due_ns)
                task = asyncio.create_task(timed_append(turn % a.partitions, body))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += due
                turn += 1
            tick = await sleep_to_next_tick(tick, a.linger_ms / 1000)
        if pending:
            await asyncio.gather(*pending)
        publish_elapsed = time.monotonic() - started
    return {
        "sent": sent,
        "appends": len(append_ms),
        "append_latency": lat_summary(append_ms),
        "publish_elapsed_s": round(publish_elapsed, 3),
        "target": WARMUP + sent,
    }


def run_phase_consumers(
    cfg: dict[str, Any], a: argparse.Namespace, cpu_pids: dict[str, int]
) -> tuple[Consumers, CpuMeter]:
    consumers = Consumers(cfg, a.consumers)
    consumers.start()
    meter = CpuMeter({**cpu_pids, **consumers.pids, "bench(self)": os.getpid()})
    return consumers, meter


def drain(urls: list[str], a: argparse.Namespace, broker_pids: dict[str, int]) -> dict[str, Any]:
    cfg = {
        "urls": urls, "topic": "queue", "mode": "drain", "partitions": a.partitions,
        "assign": a.assign, "consumers": a.consumers,
        "max": a.max, "lease_ms": a.lease_ms, "wait_ms": a.wait_ms, "target": a.count,
        "max_seconds": a.max_seconds, "settle": a.settle,
    }  # fmt: skip
    consumers, meter = run_phase_consumers(cfg, a, broker_pids)
    try:
        idle = wait_idle(a.idle_wait) if a.idle_wait > 0 else None
        meter.start()
        started = consumers.go()
        log("drain: consumers go")
        consumers.wait_done(a.max_seconds + 5)
        ended = time.monotonic()
        cpu = meter.stop()
        results = consumers.wait(60)
    finally:
        consumers.stop()
    last = max((r["last_answer"] for r in results), default=ended)
    accepted = sum(r["stats"]["accepted"] for r in results)
    elapsed = max(1e-6, (last if last > started else ended) - started)
    stats = {k: sum(r["stats"][k] for r in results) for k in results[0]["stats"]}
    return {
        "accepted": accepted,
        "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(accepted / elapsed, 1),
        "per_consumer": [r["stats"]["accepted"] for r in results],
        **stats,
        "msgs_per_accept_call": round(accepted / max(1, stats["accepts"]), 1),
        "cpu": cpu,
        "idle_wait_s_busy": idle,
    }


def latency(
    urls: list[str], a: argparse.Namespace, rate: float, broker_pids: dict[str, int]
) -> dict[str, Any]:
    topic = f"latency-{int(rate)}"
    asyncio.run(_ensure_topic(urls, topic, a.partitions, a.replication_factor))
    total = WARMUP + min(a.count, int(rate * a.duration))
    cfg = {
        "urls": urls, "topic": topic, "mode": "latency", "partitions": a.partitions,
        "assign": a.assign, "consumers": a.consumers,
        "max": a.max, "lease_ms": a.lease_ms, "wait_ms": max(a.wait_ms, 1000), "target": total,
        "max_seconds": a.duration + a.max_seconds + 30, "settle": a.settle,
    }  # fmt: skip
    consumers, meter = run_phase_consumers(cfg, a, broker_pids)
    try:
        idle = wait_idle(a.idle_wait) if a.idle_wait > 0 else None
        consumers.go()
        meter.start()
        started = time.monotonic()
        sent = asyncio.run(_publish_at_rate(urls, topic, a, rate, consumers))
        consumers.wait_done(30)
        elapsed = time.monotonic() - started
        cpu = meter.stop()
        results = consumers.wait(60)
    finally:
        consumers.stop()
    lats = [x for r in results for x in r["lats"]]
    return {
        "target_rate": rate,
        "duration_s": a.duration,
        **sent,
        "received": len(lats),
        "elapsed_s": round(elapsed, 3),
        "achieved_rate": round(len(lats) / max(1e-6, elapsed), 1),
        "latency_publish_to_accept": lat_summary(lats),
        "latency_publish_to_acquired": lat_summary([x for r in results for x in r["to_acquire"]]),
        "accepts": sum(r["stats"]["accepts"] for r in results),
        "refused": sum(r["stats"]["refused"] for r in results),
        "cpu": cpu,
        "idle_wait_s_busy": idle,
    }


# ---- the run ------------------------------------------------------------------------------


def _check_free(cluster: LocalCluster) -> None:
    for url in cluster.urls:
        if probe(url + "/readyz") is not None:
            raise RuntimeError(f"something already serves {url}: not starting a cluster")


def run_laminar(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    cluster = LocalCluster(
        root / "laminar", a.brokers, prefix=a.prefix, fsync=a.fsync, workers=a.workers
    )
    log(f"laminar: {a.brokers} brokers on {a.prefix}.x, fsync {a.fsync}")
    out: dict[str, Any] = {}
    _check_free(cluster)
    token_file_env = os.environ.get("LAMINAR_TOKEN_FILE")
    try:
        cluster.start()
        urls = cluster.urls
        # the cluster's admin token, for every client here and in the worker processes
        os.environ["LAMINAR_TOKEN_FILE"] = str(cluster.token_file)
        pids = cluster.serving_pids()
        out["broker_pids"] = pids
        asyncio.run(_ensure_topic(urls, "queue", a.partitions, a.replication_factor))
        try:
            asyncio.run(_check_acquire(urls, "queue"))
        except NotFound as e:
            raise RuntimeError(f"the brokers do not serve acquire yet (404): {e}") from e
        out["latency"] = {}
        if "drain" in a.phases:
            meter = CpuMeter({**pids, "bench(self)": os.getpid()}).start()
            out["publish"] = asyncio.run(_prepublish(urls, a))
            out["publish"]["cpu"] = meter.stop()
            log(f"laminar: pre-published {out['publish']['msgs_per_s']:,.0f} msg/s; draining")
            out["drain"] = drain(urls, a, pids)
            d = out["drain"]
            log(
                f"laminar: drain {d['msgs_per_s']:,.0f} msg/s ({d['accepted']} accepted, "
                f"{d['msgs_per_accept_call']} per accept call)"
            )
        for rate in a.rates if "latency" in a.phases else ():
            lat = latency(urls, a, rate, pids)
            e2e = lat["latency_publish_to_accept"]
            log(
                f"laminar: latency at {rate:g}/s: achieved {lat['achieved_rate']:,.0f}/s "
                f"p50 {e2e.get('p50_ms')} p99 {e2e.get('p99_ms')} ms"
            )
            out["latency"][f"{rate:g}"] = lat
    finally:
        cluster.stop()
        log("laminar: cluster stopped")
        if token_file_env is None:  # the caller's environment as it was
            os.environ.pop("LAMINAR_TOKEN_FILE", None)
        else:
            os.environ["LAMINAR_TOKEN_FILE"] = token_file_env
    return out


def limited_by(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return "?"
    procs = cpu.get("procs_pct", {})
    busy = cpu.get("machine_busy_pct") or 0
    brokers = {k: v or 0 for k, v in procs.items() if k.startswith("n")}
    clients = {k: v or 0 for k, v in procs.items() if not k.startswith("n")}
    parts = []
    if busy >= 90:
        parts.append(f"CPU: machine {busy:.0f}% busy")
    hot = [f"{k} {v:.0f}%" for k, v in {**brokers, **clients}.items() if v >= 85]
    if hot:
        parts.append("near one core: " + ", ".join(hot))
    if not parts:
        parts.append(f"not CPU-saturated (machine {busy:.0f}% busy)")
    return "; ".join(parts)


def _cpu_text(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return "-"
    p = cpu.get("procs_pct", {})
    brokers = "/".join(f"{v or 0:.0f}" for k, v in p.items() if k.startswith("n"))
    cons = "/".join(f"{v or 0:.0f}" for k, v in p.items() if k.startswith("consumer"))
    return (
        f"brokers {brokers} consumers {cons or '-'} self {p.get('bench(self)') or 0:.0f} "
        f"busy {cpu.get('machine_busy_pct') or 0:.0f}% "
        f"other users' procs {cpu.get('other_user_procs_pct') or 0:.0f}"
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (also what `run_laminar` takes: bench/compare.py builds
    them with this)."""
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="worker processes per broker")
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--size", type=int, default=1120)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--max", type=int, default=500, help="messages per acquire")
    parser.add_argument("--lease-ms", type=int, default=30_000)
    parser.add_argument(
        "--assign",
        default="all",
        choices=["all", "spread"],
        help="all: every consumer loops on every partition (as GroupConsumer); spread: "
        "consumer i only on partitions i-1 mod consumers",
    )
    parser.add_argument("--wait-ms", type=int, default=200, help="acquire long-poll (drain)")
    parser.add_argument(
        "--settle",
        default="wait",
        choices=["wait", "pipelined"],
        help="a consumer loop acquires again once its accept is answered (wait), or while up "
        "to 4 accepts are unanswered (pipelined, as GroupConsumer settles)",
    )
    parser.add_argument("--publish-batch", type=int, default=500)
    parser.add_argument("--rates", default="1000", help="latency phase rates, msg/s, comma list")
    parser.add_argument("--duration", type=float, default=10.0, help="latency phase seconds")
    parser.add_argument("--linger-ms", type=float, default=3.0, help="fixed-rate batching")
    parser.add_argument(
        "--phases", default="drain,latency", help="drain (with the publish), latency"
    )
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap per phase")
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    parser.add_argument("--prefix", default=PREFIX, help="loopback /24 of the brokers")
    parser.add_argument("--idle-wait", type=int, default=30, help="max s to wait for idle CPUs")
    parser.add_argument("--peers", action="store_true", help="also run bench/queue_peers.py")
    parser.add_argument("--peer-systems", default="rabbit3,nats3")
    parser.add_argument("--prefetch", type=int, default=500, help="peers: RabbitMQ prefetch")
    parser.add_argument("--peers-dir", default=str(HERE.parent / ".peers"))
    parser.add_argument("--json", action="store_true", help="all figures as JSON, last line")
    a = parser.parse_args(argv)
    a.rates = [float(r) for r in a.rates.split(",") if r.strip()]
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    if not a.prefix.startswith("127."):
        parser.error("--prefix must be a loopback prefix (127.x.y)")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="laminar-qbench-"))
    results: dict[str, Any] = {"params": {k: v for k, v in vars(a).items()}}
    try:
        with signals_raise():
            results["machine"] = {
                "cpus": os.cpu_count(),
                "fdatasync_4k_per_s": fdatasync_per_s(root),
            }
            log(f"machine: {results['machine']}")
            results["laminar"] = run_laminar(a, root)
            if a.peers:
                import queue_peers

                results["peers"] = queue_peers.run(
                    [s for s in a.peer_systems.split(",") if s],
                    size=a.size, count=a.count, consumers=a.consumers, prefetch=a.prefetch,
                    batch=a.max, rates=a.rates, duration=a.duration,
                    max_seconds=a.max_seconds, idle_wait=a.idle_wait, peers_dir=a.peers_dir,
                    log=log, phases=a.phases,
                )  # fmt: skip
    except KeyboardInterrupt:
        log("interrupted (servers stopped)")
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(report(results))
    if a.json:
        print(json.dumps(results, sort_keys=True))
    return 0


def report(results: dict[str, Any]) -> str:
    p, m, lam = results["params"], results["machine"], results["laminar"]
    fs = m.get("fdatasync_4k_per_s") or 0
    lines = [
        f"Laminar shared queue: {p['brokers']} brokers, RF {p['replication_factor']}, "
        f"{p['partitions']} partitions, {p['consumers']} consumer processes, acquire max "
        f"{p['max']}, one accept call per acquired batch ({p['settle']}); {p['size']} B, "
        f"count {p['count']:,}, "
        f"fsync {p['fsync']}",
        f"machine: {m['cpus']} CPUs, {fs:,.0f} fdatasync/s (4 KiB) measured now",
    ]
    d = lam.get("drain") or {}
    if d:
        lines.append(f"  pre-publish {lam['publish']['msgs_per_s']:>10,.0f} msg/s")
        lines.append(
            f"  acquire+accept {d['msgs_per_s']:>10,.0f} msg/s = {d['msgs_per_s'] / fs:.1f} x "
            f"fdatasync/s; {d['msgs_per_accept_call']} msgs per accept call; "
            f"{_cpu_text(d['cpu'])}"
        )
        lines.append(f"    limited by: {limited_by(d['cpu'])}")
    for rate, lat in lam["latency"].items():
        e = lat["latency_publish_to_accept"]
        g = lat["latency_publish_to_acquired"]
        lines.append(
            f"  latency @{rate}/s: achieved {lat['achieved_rate']:,.0f}/s; publish -> accept "
            f"answered p50 {e.get('p50_ms')} p99 {e.get('p99_ms')} p99.9 {e.get('p999_ms')} "
            f"max {e.get('max_ms')} ms; publish -> delivered p50 {g.get('p50_ms')} "
            f"p99 {g.get('p99_ms')} ms; {_cpu_text(lat['cpu'])}"
        )
        lines.append(f"    limited by: {limited_by(lat['cpu'])}")
    peers = results.get("peers")
    if peers:
        import queue_peers

        lines.append("")
        lines.append(queue_peers.format_table(peers))
        rows = {r["key"]: r for r in queue_peers.summary_rows(peers)}
        ratios: dict[str, Any] = {}
        for key in rows:
            r = rows[key]
            ratios[f"drain_vs_{key}"] = ratio(d.get("msgs_per_s"), r["drain_msgs_per_s"])
            for rate, lat in lam["latency"].items():
                peer = r["latency"].get(rate)
                if peer:
                    e = lat["latency_publish_to_accept"]
                    ratios[f"p50_{key}_over_laminar@{rate}"] = ratio(
                        peer["p50_ms"], e.get("p50_ms")
                    )
                    ratios[f"p99_{key}_over_laminar@{rate}"] = ratio(
                        peer["p99_ms"], e.get("p99_ms")
                    )
                    # like for like: the peers measure publish -> delivered
                    g = lat["latency_publish_to_acquired"]
                    ratios[f"p50_{key}_over_laminar_delivered@{rate}"] = ratio(
                        peer["p50_ms"], g.get("p50_ms")
                    )
        results["ratios"] = ratios
        lines.append("")
        lines.append("ratios (> 1: Laminar better; target drain_vs_rabbit3 >= 2):")
        lines.extend(f"  {k:<40} {v}" for k, v in ratios.items())
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
