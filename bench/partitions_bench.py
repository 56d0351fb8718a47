"""Many partitions on a real local cluster: leader balance, idle CPU, memory, re-election.

A fresh `LocalCluster` of real `laminar serve` processes (fsync `always`) gets one topic of
`--partitions` partitions at replication factor `--rf`. Measured:

* the leaders each broker holds once every partition has one, and again after the idle
  window (leadership rebalancing runs meanwhile); skew = the most-loaded broker's count over
  the mean (`partitions / brokers`);
* each broker's CPU over an idle window (`--idle-seconds`, nothing but the cluster's own
  chatter), from utime + stime in /proc/PID/stat, as % of one core; the same for the empty
  cluster (no topic) as the floor;
* RSS per partition replica: what the brokers' resident memory grew by with the topic,
  over the replicas they host (`partitions * rf`);
* the file descriptors each broker holds open (/proc/PID/fd) after the idle window, and
  again once every leader is elected after the restart;
* publish spread over every partition (`--publish-appends` appends of `--batch` records of
  1120 bytes, one append in flight per partition: `laminar bench produce`, each acknowledged
  once committed): msg/s, the append p50 / p99 and the brokers' CPU seconds per million
  records; then the restart below replays what the brokers' journals still hold;
* the time to elect every leader after all brokers restart (graceful stop, start, every
  partition led again), and the leader counts once that settles (a restart that fails leaves
  `elect_all_s` null and says why in `restart_error`).

    python3 bench/partitions_bench.py                                   # 1000 x RF3, 3 brokers
    python3 bench/partitions_bench.py --brokers 1 --rf 1 --partitions 10000
    python3 bench/partitions_bench.py --partitions 3000        # 3,000 replicas per broker

The data directory is removed at the end, also on errors. The last line printed is one JSON
object. `measure(...)` is the same as a function (bench/compare.py imports it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "broker"))

from laminar.client import Client  # noqa: E402
from laminar.local_cluster import LocalCluster  # noqa: E402

PREFIX = "127.0.61"
TOPIC = "many"
POLL_S = 0.5
#: seconds to wait for every leader after a create or a restart: a floor plus per partition
WAIT_BASE_S = 60.0
WAIT_PER_PARTITION_S = 0.02
#: a rebalance may still be moving leaders: wait up to this long for the counts to settle,
#: which they are once unchanged for STEADY_S
SETTLE_S = 60.0
STEADY_S = 10.0
CLOCK_TICKS_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
RECORD_BYTES = 1120
#: the publish phase's own time bound (the bench's --max-seconds)
PUBLISH_MAX_S = 120.0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_S


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


def open_fds(pid: int) -> int:
    """How many file descriptors process `pid` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def pids(cluster: LocalCluster) -> dict[str, int]:
    out = {}
    for node in cluster.nodes.values():
        assert node.pid is not None, f"{node.id} has no process"
        out[node.id] = node.pid
    return out


def idle_cpu_pct(cluster: LocalCluster, seconds: float) -> list[float]:
    """Each broker's CPU over `seconds` of idleness (nothing asked of it), % of one core."""
    by_node = pids(cluster)
    before = {n: cpu_seconds(p) for n, p in by_node.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = {n: cpu_seconds(p) for n, p in by_node.items()}
    return [round(100 * (after[n] - before[n]) / elapsed, 2) for n in sorted(by_node)]


def leader_counts(cluster: LocalCluster, token: str) -> dict[str, int]:
    """How many partitions of TOPIC each broker leads, as each broker itself says."""
    counts = {}
    for node in sorted(cluster.nodes.values(), key=lambda n: n.id):
        with Client([node.api_url], token=token, timeout_s=30) as client:
            hosted = client.node_partitions(node.id).partitions
        counts[node.id] = sum(1 for p in hosted if p.topic == TOPIC and p.role == "leader")
    return counts


def wait_all_led(
    cluster: LocalCluster, token: str, partitions: int, timeout_s: float
) -> tuple[float, dict[str, int]]:
    """Poll until the brokers lead `partitions` partitions in all (seconds taken, counts);
    RuntimeError after `timeout_s`."""
    started = time.monotonic()
    deadline = started + timeout_s
    counts: dict[str, int] = {}
    while True:
        for node in cluster.nodes.values():
            if not node.alive():
                raise RuntimeError(f"{node.id} exited: {cluster.tail(node.id, 3)}")
        try:
            counts = leader_counts(cluster, token)
        except Exception as e:  # a broker still starting: its API is not up yet
            log(f"  (polling leaders: {type(e).__name__}: {e})")
        if sum(counts.values()) >= partitions:
            return time.monotonic() - started, counts
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {sum(counts.values())} of {partitions} partitions have a leader after "
                f"{timeout_s:.0f} s: {counts}"
            )
        time.sleep(POLL_S)


def wait_settled(
    cluster: LocalCluster, token: str, partitions: int, timeout_s: float
) -> tuple[float, dict[str, int]]:
    """Poll until every partition is led and the counts have not changed for STEADY_S (a
    rebalance waits a few seconds for a returning broker), or `timeout_s` passes: (seconds
    taken, last counts)."""
    started = time.monotonic()
    deadline = started + timeout_s
    last: dict[str, int] = {}
    steady_since = started
    while True:
        counts = leader_counts(cluster, token)
        now = time.monotonic()
        if counts != last or sum(counts.values()) != partitions:
            last, steady_since = counts, now
        elif now - steady_since >= STEADY_S:
            return steady_since - started, counts
        if now > deadline:
            return now - started, counts
        time.sleep(2 * POLL_S)


def skew(counts: dict[str, int], partitions: int) -> float:
    mean = partitions / max(1, len(counts))
    return round(max(counts.values(), default=0) / mean, 3)


def publish(
    cluster: LocalCluster, partitions: int, rf: int, appends: int, batch: int
) -> dict[str, Any]:
    """`appends` appends of `batch` records, spread over every partition of TOPIC with one in
    flight on each (`laminar bench produce`): its figures and the brokers' CPU."""
    from compare import laminar_bench  # (compare imports this module: not at the top)

    count = appends * batch
    arguments = ["produce", "--topic", TOPIC, "--partitions", str(partitions),
                 "--replication-factor", str(rf), "--count", str(count), "--batch", str(batch),
                 "--in-flight", "1", "--size", str(RECORD_BYTES),
                 "--max-seconds", f"{PUBLISH_MAX_S:g}"]  # fmt: skip
    figures = laminar_bench(cluster, arguments, PUBLISH_MAX_S + 120)
    keys = ("records", "msgs_per_s", "batch_latency_p50_ms", "batch_latency_p99_ms",
            "server_cpu_s_per_million", "client_cpu_s_per_million")  # fmt: skip
    out = {k: figures.get(k) for k in keys}
    log(f"  published {out['records']} records over {partitions} partitions: "
        f"{out['msgs_per_s']} msg/s, append p50 {out['batch_latency_p50_ms']} ms, p99 "
        f"{out['batch_latency_p99_ms']} ms, {out['server_cpu_s_per_million']} CPU-s/M")  # fmt: skip
    return out


def measure(
    partitions: int,
    brokers: int,
    rf: int,
    idle_seconds: float,
    root: Path,
    *,
    prefix: str = PREFIX,
    restart: bool = True,
    publish_appends: int = 0,
    batch: int = 14,
) -> dict[str, Any]:
    """Run the measurement in a new data directory under `root` (removed at the end, also
    on errors); returns the figures (see the module's docstring)."""
    if not 1 <= rf <= brokers:
        raise ValueError(f"rf={rf} must be in 1..brokers ({brokers})")
    data = Path(tempfile.mkdtemp(prefix="laminar-partitions-", dir=root))
    cluster = LocalCluster(data / "cluster", brokers, prefix=prefix, fsync="always")
    wait_s = WAIT_BASE_S + WAIT_PER_PARTITION_S * partitions
    result: dict[str, Any] = {"partitions": partitions, "brokers": brokers, "rf": rf}
    try:
        cluster.start()
        token = cluster.token
        time.sleep(1.0)  # the brokers' own start-up work settles
        result["idle_cpu_pct_empty"] = idle_cpu_pct(cluster, min(idle_seconds, 5.0))
        rss_empty = {n: rss_bytes(p) for n, p in pids(cluster).items()}
        started = time.monotonic()
        with Client(cluster.urls, token=token, timeout_s=wait_s) as client:
            client.create_topic(TOPIC, partitions=partitions, replication_factor=rf)
        result["create_s"] = round(time.monotonic() - started, 2)
        elect_s, counts = wait_all_led(cluster, token, partitions, wait_s)
        result["elect_new_s"] = round(result["create_s"] + elect_s, 2)
        result["leader_counts_initial"] = list(counts.values())
        log(f"  created and led in {result['elect_new_s']} s: {counts}")
        settle_s, counts = wait_settled(cluster, token, partitions, SETTLE_S)
        result["settle_s"] = round(settle_s, 1)
        result["idle_cpu_pct"] = idle_cpu_pct(cluster, idle_seconds)
        log(f"  idle CPU % per broker over {idle_seconds} s: {result['idle_cpu_pct']}")
        rss = {n: rss_bytes(p) for n, p in pids(cluster).items()}
        grown = sum(rss[n] - rss_empty[n] for n in rss)
        result["rss_mb"] = [round(rss[n] / 1e6, 1) for n in sorted(rss)]
        result["rss_mb_per_partition"] = round(grown / 1e6 / (partitions * rf), 4)
        result["fds"] = [open_fds(p) for _, p in sorted(pids(cluster).items())]
        counts = leader_counts(cluster, token)
        result["leader_counts"] = [counts[n] for n in sorted(counts)]
        result["leader_skew"] = skew(counts, partitions)
        log(f"  leaders after the idle window: {counts} (skew {result['leader_skew']})")
        if publish_appends:
            result["publish"] = publish(cluster, partitions, rf, publish_appends, batch)
        result["elect_all_s"] = None
        if restart:
            cluster.stop()
            started = time.monotonic()
            cluster.start(wait=False)
            try:
                elect_s, counts = wait_all_led(cluster, token, partitions, wait_s)
            except RuntimeError as e:  # reported, not raised: the other figures stand
                result["restart_error"] = str(e)
                log(f"  restart failed: {e}")
            else:
                result["elect_all_s"] = round(time.monotonic() - started, 2)
                result["fds_restart"] = [open_fds(p) for _, p in sorted(pids(cluster).items())]
                log(f"  restarted: every leader elected after {result['elect_all_s']} s: {counts}")
                result["leader_counts_restart_initial"] = [counts[n] for n in sorted(counts)]
                settle_s, counts = wait_settled(cluster, token, partitions, SETTLE_S)
                result["leader_counts_restart"] = [counts[n] for n in sorted(counts)]
                result["leader_skew_restart"] = skew(counts, partitions)
                result["restart_settle_s"] = round(settle_s, 1)
                log(f"  restart settled in {settle_s:.1f} s: {counts}")
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(data, ignore_errors=True)
    result["load_avg_1m"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--no-restart", action="store_true", help="skip the restart")
    parser.add_argument(
        "--publish-appends", type=int, default=None,
        help="appends spread over the partitions before the restart (default: 2 per "
        "partition; 0: no publish)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=14, help="records per append")
    parser.add_argument("--prefix", default=PREFIX, help="loopback /24 of the brokers")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data directory")
    a = parser.parse_args()
    if not a.prefix.startswith("127."):
        parser.error("--prefix must be a loopback prefix (127.x.y)")
    if (a.publish_appends is not None and a.publish_appends < 0) or a.batch < 1:
        parser.error("--publish-appends must be >= 0 and --batch >= 1")
    root = Path(tempfile.mkdtemp(prefix="laminar-pbench-", dir=a.dir))
    log(f"load average before: {os.getloadavg()}")
    try:
        result = measure(
            a.partitions,
            a.brokers,
            a.rf,
            a.idle_seconds,
            root,
            prefix=a.prefix,
            restart=not a.no_restart,
            publish_appends=2 * a.partitions if a.publish_appends is None else a.publish_appends,
            batch=a.batch,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
