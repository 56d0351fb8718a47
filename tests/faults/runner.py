"""One run: the network and brokers, the history, the workload under a schedule of faults,
then heal, converge, drain, read back and check; the JSON summary."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from . import readback
from .checker import check
from .cluster import BrokerSettings, Cluster, ClusterError
from .faults import Env, make_fault
from .history import create_topic, make_history
from .net import CLIENT, Network, enter_netns
from .schedule import FaultPlan, make_schedule, parse_kinds
from .workload import (
    GROUP,
    IDEMPOTENT,
    PLAIN,
    Context,
    Recorder,
    parse_text,
    probe,
    producer_writer,
    queue_consumer,
    raw_writer,
)

HISTORY_TOPIC = "hist"
WRITE_TOPIC = "w"
QUEUE_TOPIC = "q"
QUEUE_MAX_DELIVERIES = 4
WARMUP_S = 3.0
COOLDOWN_S = 4.0
WORKLOAD_STOP_TIMEOUT_S = 60.0
#: broker log lines worth a look: replicas removed, corruption, errors and the exception line
#: that ends each traceback (laminar.*Error: ..., OSError: ...)
LOG_NEEDLES = ("removing ", "Corrupt", " ERROR ", " CRITICAL ", "Error: ")
LOG_LINES_PER_BROKER = 25
REMOVING = "removing "  # broker log: "removing t/0: its topic no longer exists"


@dataclass(frozen=True)
class RunConfig:
    brokers: int
    seed: int
    faults: str  # "mixed" or kinds, comma-separated
    fault_count: int
    run_dir: Path

    def replay_command(self) -> str:
        return (
            f"sudo PYTHONPATH=broker:operator:. python3 -m tests.faults --brokers {self.brokers} "
            f"--seed {self.seed} --faults {self.faults} --fault-count {self.fault_count}"
        )


def say(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def recovery_s(
    recorder: Recorder, partitions: list[tuple[str, int]], since_s: float, until_s: float
) -> dict[str, Any]:
    """Unavailability after an event at `since_s`: per partition, the time until a probe
    append sent at or after it was acknowledged; the worst over partitions. A partition with
    no such acknowledgement before `until_s` (the next event) reports null."""
    per_partition: dict[str, float | None] = {}
    for topic, partition in partitions:
        name = f"probe-{topic}-{partition}"
        best: float | None = None
        for value in recorder.values.values():
            if value.writer != name:
                continue
            for a in value.attempts:
                if a.index is not None and a.sent_s >= since_s and a.answered_s <= until_s:
                    took = a.answered_s - since_s
                    best = took if best is None else min(best, took)
        per_partition[f"{topic}/{partition}"] = None if best is None else round(best, 2)
    known = [v for v in per_partition.values() if v is not None]
    # a partition that took no append before the next event: at least that long
    worst: float | str = (
        max(known) if len(known) == len(per_partition) else f">{until_s - since_s:.1f}"
    )
    slowest = max(per_partition, key=lambda k: per_partition[k] or float("inf"))
    return {"all_partitions_s": worst, "slowest": slowest, "per_partition_s": per_partition}


def outcomes_between(recorder: Recorder, since_s: float, until_s: float) -> dict[str, int]:
    """How the appends sent while a fault was held were answered (e.g. what a full disk
    answers: it may refuse appends, with a clear error, never a 500)."""
    return dict(
        Counter(
            a.outcome
            for value in recorder.values.values()
            for a in value.attempts
            if since_s <= a.sent_s < until_s
        )
    )


def annotate(
    violations: dict[str, list[dict[str, Any]]], recorder: Recorder, events: list[dict[str, Any]]
) -> None:
    """Say, for a violation about a value, which fault was held (or last healed) when its
    first attempt was sent: where to look in the broker logs."""
    by_id = {(v.writer, v.seq): v for v in recorder.values.values()}
    for examples in violations.values():
        for example in examples:
            parsed = parse_text(str(example.get("value", "")))
            value = by_id.get(parsed) if parsed else None
            if value is None or not value.attempts:
                continue
            sent_s = value.attempts[0].sent_s
            example["first_attempt_during"] = "before the faults"
            for event in events:
                if event["inject_s"] <= sent_s:
                    held = sent_s < event["heal_s"]
                    example["first_attempt_during"] = (
                        f"fault {event['number']} {event['kind']} on {event['target']} "
                        + ("(held)" if held else "(after its heal)")
                    )


async def heal_everything(env: Env) -> None:
    """Network healed, paused brokers resumed, clocks reset, fillers removed, every broker
    running and ready."""
    env.network.heal()
    for node, broker in env.cluster.brokers.items():
        if broker.paused:
            env.cluster.signal(node, signal.SIGCONT)
        env.cluster.set_clock_offset(node, 0)
        (broker.data_dir / "filler").unlink(missing_ok=True)
    for node, broker in env.cluster.brokers.items():
        if not broker.alive():
            env.cluster.start(node)
    await asyncio.gather(*(env.start(n, "the final heal") for n in env.cluster.node_ids))


async def run_faults(env: Env, schedule: list[FaultPlan]) -> list[dict[str, Any]]:
    events = []
    for plan in schedule:
        fault = make_fault(plan, env)
        event: dict[str, Any] = {"number": plan.number, "kind": plan.kind}
        event["inject_s"] = time.monotonic()
        try:
            await fault.inject()
        except (ClusterError, OSError, RuntimeError) as e:
            env.problems.append({"fault": plan.kind, "problem": f"inject: {e}"})
        say(f"fault {plan.number} {plan.kind} on {fault.target} {fault.details or ''}")
        await asyncio.sleep(plan.hold_s)
        event["heal_s"] = time.monotonic()
        try:
            await fault.heal()
        except (ClusterError, OSError, RuntimeError) as e:
            env.problems.append({"fault": plan.kind, "problem": f"heal: {e}"})
        event["healed_s"] = time.monotonic()
        event.update(target=fault.target, details=fault.details)
        events.append(event)
        await asyncio.sleep(plan.gap_s)
    return events


def start_workload(
    ctx: Context, seed: int, partitions: int, probe_partitions: list[tuple[str, int]]
) -> list[asyncio.Task[None]]:
    def rng(name: str) -> random.Random:
        return random.Random(f"workload-{seed}-{name}")

    jobs = []
    for i in range(2):
        name = f"plain-{i}"
        jobs.append(raw_writer(ctx, name, PLAIN, WRITE_TOPIC, i % partitions, rng(name)))
        name = f"idem-{i}"
        jobs.append(raw_writer(ctx, name, IDEMPOTENT, WRITE_TOPIC, (i + 1) % partitions, rng(name)))
        name = f"prod-{i}"
        jobs.append(
            producer_writer(ctx, name, WRITE_TOPIC, (i + 2) % partitions, partitions, rng(name))
        )
    for p in range(partitions):
        name = f"qidem-{p}"
        jobs.append(raw_writer(ctx, name, IDEMPOTENT, QUEUE_TOPIC, p, rng(name)))
    for i in range(3):
        name = f"consumer-{i}"
        jobs.append(queue_consumer(ctx, name, QUEUE_TOPIC, partitions, rng(name)))
    for topic, p in probe_partitions:
        jobs.append(probe(ctx, topic, p, rng(f"probe-{topic}-{p}")))
    return [asyncio.create_task(job) for job in jobs]


async def run_async(config: RunConfig, cluster: Cluster, network: Network) -> dict[str, Any]:
    started = time.monotonic()
    phases: dict[str, float] = {}
    kinds = parse_kinds(config.faults)
    schedule = make_schedule(config.seed, kinds, config.fault_count)
    connector = aiohttp.TCPConnector(limit=0, use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector, headers=cluster.auth_headers) as session:
        recorder = Recorder()
        env = Env(cluster, network, session, recorder, partitions=[])
        for node in cluster.node_ids:
            cluster.start(node)
        await cluster.wait_ready()
        phases["start_s"] = time.monotonic() - started
        say(f"{config.brokers} brokers ready; history")
        partitions = 3
        rf = min(3, config.brokers)
        history_partitions = max(3, config.brokers)
        steps: list[Any] = []
        try:
            steps = await make_history(env, config.seed, HISTORY_TOPIC, history_partitions, rf)
            await create_topic(env, WRITE_TOPIC, partitions, rf, {})
            await create_topic(
                env, QUEUE_TOPIC, partitions, rf, {"max_deliveries": QUEUE_MAX_DELIVERIES}
            )
            steps.append({"step": "created after the restarts", "topics": ["w", "q"]})
        except (ClusterError, RuntimeError) as e:
            # a broker that does not restart, a topic that cannot be created: the cluster
            # failed before any fault; the run goes on so that the checks show the damage
            env.findings.append(
                {"kind": "history_failed", "error": str(e)[:500], "steps": steps,
                 "log": {n: cluster.tail(n, 10) for n in cluster.node_ids}}
            )  # fmt: skip
        phases["history_s"] = time.monotonic() - started - phases["start_s"]
        env.partitions = [(t, p) for t in (WRITE_TOPIC, QUEUE_TOPIC) for p in range(partitions)]
        probe_partitions = env.partitions + [(HISTORY_TOPIC, p) for p in range(history_partitions)]
        ctx = Context(session, cluster.urls, recorder, asyncio.Event(), cluster.token)
        tasks = start_workload(ctx, config.seed, partitions, probe_partitions)
        say(f"workload running; {len(schedule)} faults: {[p.kind for p in schedule]}")
        workload_started = time.monotonic()
        events: list[dict[str, Any]] = []
        try:
            await asyncio.sleep(WARMUP_S)
            events = await run_faults(env, schedule)
            await asyncio.sleep(COOLDOWN_S)
        finally:
            ctx.stop.set()
            _, stuck = await asyncio.wait(tasks, timeout=WORKLOAD_STOP_TIMEOUT_S)
            for task in stuck:
                task.cancel()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                env.problems.append({"problem": f"workload task failed: {task.exception()!r}"})
        phases["workload_s"] = time.monotonic() - workload_started
        say("workload stopped; healing, converging, draining, reading back")
        check_started = time.monotonic()

        def lap(name: str) -> None:
            phases[name] = (
                time.monotonic()
                - check_started
                - sum(v for k, v in phases.items() if k.startswith("check_"))
            )

        await heal_everything(env)
        lap("check_heal_s")
        gaps = await readback.wait_converged(env)
        lap("check_converge_s")
        groups = await readback.drain(ctx, env, QUEUE_TOPIC, partitions)
        lap("check_drain_s")
        gaps += await readback.wait_converged(env)
        replicas = await readback.read_all(env)
        lap("check_read_s")
        report = check(recorder, replicas, QUEUE_TOPIC, partitions, groups, GROUP)
        for gap in gaps:
            report.add("no_convergence", gap=gap)
        for node in cluster.node_ids:
            for line in cluster.grep(node, (REMOVING,), limit=1000):
                removed = line.split(REMOVING, 1)[1].split(":", 1)[0].rsplit("/", 1)[0]
                if removed.removesuffix(".dlq") in recorder.topics:
                    # no topic is ever deleted in a run: a broker that drops a replica of one
                    # has misread the metadata (acknowledged records may go with it)
                    report.add("replica_of_existing_topic_removed", node=node, line=line)
        for finding in env.findings:
            report.add(finding["kind"], **{k: v for k, v in finding.items() if k != "kind"})
        phases["check_total_s"] = time.monotonic() - check_started
    end_s = time.monotonic()
    annotate(report.violations, recorder, events)
    for n, event in enumerate(events):
        next_s = events[n + 1]["inject_s"] if n + 1 < len(events) else end_s
        event["unavailability_after_inject"] = recovery_s(
            recorder, probe_partitions, event["inject_s"], next_s
        )
        event["unavailability_after_heal"] = recovery_s(
            recorder, probe_partitions, event["healed_s"], next_s
        )
        event["append_outcomes_while_held"] = outcomes_between(
            recorder, event["inject_s"], event["heal_s"]
        )
        event["hold_s"] = round(event["heal_s"] - event["inject_s"], 2)
        for key in ("inject_s", "heal_s", "healed_s"):
            event[key] = round(event[key] - workload_started, 2)
    unavailability: dict[str, list[float | str]] = {}
    for event in events:
        unavailability.setdefault(event["kind"], []).append(
            event["unavailability_after_inject"]["all_partitions_s"]
        )
    logs = {n: cluster.notable(n, LOG_NEEDLES, LOG_LINES_PER_BROKER) for n in cluster.node_ids}
    return {
        "ok": report.total() == 0,
        "seed": config.seed,
        "brokers": config.brokers,
        "faults": config.faults,
        "replay": config.replay_command(),
        "run_dir": str(config.run_dir),
        "violations": report.summary(),
        "harness_problems": env.problems,
        "counts": report.counts,
        "unavailability_s_by_kind": unavailability,
        "history": steps,
        "events": events,
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "took_s": round(end_s - started, 1),
        "broker_log_lines": {n: lines for n, lines in logs.items() if lines},
    }


def run(config: RunConfig) -> dict[str, Any]:
    """A whole run in its own network; everything it made is removed at the end."""
    names = [f"n{i}" for i in range(1, config.brokers + 1)]
    network = Network(names)
    cluster = Cluster(network, config.run_dir, BrokerSettings())
    # SIGTERM and SIGINT raise in the main thread, out of the event loop (asyncio's own
    # SIGINT handling only cancels the main task, which a cleanup path may outlive): the
    # `finally` below then removes the brokers, mounts and namespaces
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        network.up()
        cluster.setup()
        say(f"network {network.prefix}-*, run dir {config.run_dir}")
        enter_netns(network.hosts[CLIENT].netns)
        summary = asyncio.run(run_async(config, cluster, network))
        if not summary["ok"]:
            summary["broker_log_tails"] = {n: cluster.tail(n) for n in cluster.node_ids}
        (config.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        with contextlib.suppress(Exception):
            cluster.teardown()
        network.down()
        for number, handler in previous.items():
            signal.signal(number, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
