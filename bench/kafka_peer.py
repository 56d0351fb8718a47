"""Apache Kafka 4.1 (KRaft) peer benchmark, RF 1 and/or RF 3 on this machine, for ratios.

Drives the Kafka peer tooling of ../shared/peers/kafka (README.md there) the way
nats_peer.py drives NATS: the jars are fetched into <peers-dir>/kafka-libs with its setup.sh
if they are missing (Maven Central; needs java, javac and mvn), the servers are started with
its start.sh (one combined broker+controller for RF 1, three for RF 3) in a work directory of
its own under <peers-dir>, measured with its kafka_bench.py (Kafka's own ProducerPerformance
and the microsecond fixed-rate probe KafkaLat), and stopped with its stop.sh --wipe in a
finally block, also on Ctrl-C, SIGTERM and errors; every recorded server PID is checked to
be gone afterwards and the work directory is removed. Nothing starts while a Kafka port is
taken.

Measured per configuration (record size --size, --partitions partitions, acks=all):
  default_batch  ProducerPerformance --throughput -1, Kafka's producer defaults
                 (batch.size 16384, linger.ms 5: about 14 records of 1120 B a batch),
                 after a JIT warm-up of --warmup records to a throw-away topic.
  latency        KafkaLat (phase latency-us): records due at a fixed --rate for
                 --latency-seconds, latency from the due time to the ack, p50/p99/p99.9 (us
                 resolution, no coordinated omission), producer defaults.
  big_batch      ProducerPerformance with 560 KB batches (BIG_BATCH_PROPS).
Each carries the servers' CPU seconds per million messages (from /proc) and the client JVM's
(wait4; it includes the JVM's start-up and JIT), and the load average before and after.

Caveat (quote it with every ratio): Kafka does not fsync before acking by default (an ack
means "in the page cache of every in-sync replica"); servers and client share this machine.

    python3 bench/kafka_peer.py --count 100000 --latency-seconds 3 --mode both --json
From another benchmark script:
    sys.path.insert(0, "bench"); import kafka_peer
    res = kafka_peer.run(modes="both", count=1_000_000, peers_dir=".peers")
    res["kafka_rf3"]["big_batch"]["msgs_per_s"], res["kafka_rf3"]["latency"]["p99_ms"]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import load_avg_1m, run_in_group  # noqa: E402
from queue_peers import signals_raise  # noqa: E402

REPO_ROOT = HERE.parent
DEFAULT_PEERS = REPO_ROOT / ".peers"
DEFAULT_KAFKA_SRC = REPO_ROOT.parent / "shared" / "peers" / "kafka"
KAFKA_SRC_ENV = "LAMINAR_KAFKA_PEER_SRC"
KAFKA_VERSION = "4.1.0"
BIG_BATCH_PROPS = (
    "batch.size=573440",
    "linger.ms=20",
    "max.request.size=8388608",
    "buffer.memory=134217728",
)
SETUP_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 120.0
#: configurations: mode of start.sh -> (result key, replication factor, ports it uses)
MODES: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "single": ("kafka_rf1", 1, (19092, 19093)),
    "cluster": ("kafka_rf3", 3, (19111, 19112, 19113, 19121, 19122, 19123)),
}

Log = Callable[[str], None]


class PeerError(RuntimeError):
    """The Kafka peer could not run (setup, port conflict, server or client failure)."""


def _log(message: str) -> None:
    print(f"[kafka_peer {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- setup


def kafka_src(src: str | os.PathLike[str] | None = None) -> Path:
    """The shared Kafka peer tooling (start.sh, stop.sh, kafka_bench.py, setup.sh)."""
    path = Path(src or os.environ.get(KAFKA_SRC_ENV) or DEFAULT_KAFKA_SRC).resolve()
    for name in ("setup.sh", "start.sh", "stop.sh", "kafka_bench.py", "KafkaLat.java"):
        if not (path / name).is_file():
            raise PeerError(f"Kafka peer tooling not found: {path / name} (set {KAFKA_SRC_ENV})")
    return path


def missing_setup(peers: Path, version: str = KAFKA_VERSION) -> list[str]:
    """What a run from `peers` lacks (empty: ready)."""
    libs = peers / "kafka-libs"
    wanted = [
        libs / f"kafka_2.13-{version}.jar",
        libs / f"kafka-tools-{version}.jar",
        peers / "kafka-classes" / "KafkaLat.class",
        peers / "kafka-log4j2.properties",
    ]
    missing = [str(p.relative_to(peers)) for p in wanted if not p.exists()]
    missing += [f"{tool} on PATH" for tool in ("java", "bash") if shutil.which(tool) is None]
    return missing


def ensure_kafka(peers: Path, src: Path, version: str = KAFKA_VERSION, log: Log = _log) -> float:
    """Fetch the Kafka jars and compile KafkaLat with the peers' setup.sh if anything is
    missing (needs java, javac, mvn). Returns the seconds it took (0.0: it was ready)."""
    missing = missing_setup(peers, version)
    if not missing:
        return 0.0
    for tool in ("java", "javac", "mvn"):
        if shutil.which(tool) is None:
            raise PeerError(f"{tool} is not on PATH: the Kafka peer needs Java 17+ and Maven")
    peers.mkdir(parents=True, exist_ok=True)
    logfile = peers / "kafka-setup.log"
    log(f"setting up Kafka {version} in {peers}/kafka-libs (missing: {', '.join(missing)})")
    started = time.monotonic()
    with open(logfile, "w") as out:
        try:
            rc = subprocess.run(
                ["bash", str(src / "setup.sh"), str(peers / "kafka-libs"), version],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=SETUP_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    still = missing_setup(peers, version)
    if rc != 0 or still:
        raise PeerError(f"setup.sh failed (rc {rc}, missing {still}); log {logfile}")
    took = time.monotonic() - started
    log(f"Kafka set up in {took:.0f} s")
    return took


# ----------------------------------------------------------------------------- helpers


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _is_kafka_server(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _server_pids(work: Path) -> dict[str, int]:
    out = {}
    for path in sorted((work / "pids").glob("kafka-*.pid")):
        with contextlib.suppress(OSError, ValueError):
            out[path.stem] = int(path.read_text().strip())
    return out


def _run(
    command: Sequence[str], timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`run_in_group`: a script and the JVMs it runs in the foreground are killed together on a
    timeout (PeerError), Ctrl-C or SIGTERM."""
    try:
        return run_in_group(command, timeout_s, env=env)
    except subprocess.TimeoutExpired as e:
        raise PeerError(f"timed out after {timeout_s:.0f} s: {' '.join(command)}") from e


@contextlib.contextmanager
def _lock(peers: Path) -> Iterator[None]:
    (peers / "pids").mkdir(parents=True, exist_ok=True)
    with open(peers / "pids" / ".kafka_peer.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise PeerError(f"another kafka_peer run is using {peers}") from e
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _tail(work: Path, lines: int = 15) -> str:
    out = []
    for path in sorted((work / "logs").glob("*.log")):
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(out)


# ----------------------------------------------------------------------------- one config


def _stop(src: Path, work: Path, started: dict[str, int], env: dict[str, str], log: Log) -> None:
    """TERM to every server at once (stop.sh stops them one by one, and a cluster's last
    nodes then wait for their lost controller quorum), stop.sh --wipe (TERM, KILL after
    30 s, by PID file), then make sure every PID start.sh recorded is gone."""
    pids = [p for p in {**_server_pids(work), **started}.values() if _is_kafka_server(p)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(_is_kafka_server(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        cp = _run(["bash", str(src / "stop.sh"), str(work), "--wipe"], STOP_TIMEOUT_S, env)
        if cp.returncode != 0:
            log(f"stop.sh failed (rc {cp.returncode}): {cp.stderr[-500:]}")
    except PeerError as e:
        log(f"stop.sh: {e}")
    for name, pid in {**_server_pids(work), **started}.items():
        if not _is_kafka_server(pid):
            continue
        log(f"{name} (pid {pid}) still running after stop.sh: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _is_kafka_server(pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _bench(
    src: Path,
    peers: Path,
    work: Path,
    mode: str,
    extra: Sequence[str],
    timeout_s: float,
    env: dict[str, str],
) -> dict[str, dict[str, Any]]:
    """One kafka_bench.py run against the running servers: {phase: its JSON line}."""
    command = [
        sys.executable, str(src / "kafka_bench.py"), "--libs", str(peers / "kafka-libs"),
        "--work", str(work), "--mode", mode, *extra,
    ]  # fmt: skip
    cp = _run(command, timeout_s, env)
    if cp.returncode != 0:
        raise PeerError(f"kafka_bench.py failed (rc {cp.returncode}):\n{cp.stderr[-2000:]}")
    phases: dict[str, dict[str, Any]] = {}
    for line in cp.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            phases[record["phase"]] = record
    return phases


def _throughput(record: dict[str, Any]) -> dict[str, Any]:
    cpu = record.get("cpu", {})
    return {
        "msgs_per_s": record.get("msgs_per_s"),
        "records": record.get("records"),
        "server_cpu_s_per_million": record.get("server_cpu_s_per_M"),
        "client_cpu_s_per_million": record.get("client_cpu_s_per_M"),
        "server_cpu_s": cpu.get("server_cpu_s"),
        "wall_s": cpu.get("wall_s"),
        "machine_busy_pct": cpu.get("machine_busy_pct"),
        "loadavg_before": cpu.get("loadavg_before"),
        "loadavg_after": cpu.get("loadavg_after"),
        "producer_props": record.get("producer_props"),
    }


def bench_config(
    mode: str,
    *,
    src: Path,
    peers: Path,
    size: int,
    count: int,
    partitions: int,
    rate: float,
    latency_seconds: float,
    warmup: int,
    heap: str,
    timeout_s: float,
    log: Log,
) -> dict[str, Any]:
    """Start Kafka `mode` (single: RF 1, cluster: RF 3), measure it, stop it, remove it."""
    key, rf, ports = MODES[mode]
    busy = [p for p in ports if _port_in_use(p)]
    if busy:
        raise PeerError(f"ports {busy} on 127.0.0.1 are in use: not starting Kafka {mode}")
    work = Path(tempfile.mkdtemp(prefix=f"kafka-work-{mode}-", dir=peers))
    env = dict(os.environ, KAFKA_LIBS=str(peers / "kafka-libs"), KAFKA_HEAP=heap)
    env.pop("PB_RESULTS", None)
    started: dict[str, int] = {}
    out: dict[str, Any] = {"replication_factor": rf, "nodes": 1 if mode == "single" else 3}
    t_all = time.monotonic()
    try:
        log(f"Kafka {mode} (RF {rf}): starting")
        try:
            cp = _run(["bash", str(src / "start.sh"), mode, str(work)], START_TIMEOUT_S, env)
        finally:
            started = _server_pids(work)
        if cp.returncode != 0:
            raise PeerError(f"start.sh {mode} failed (rc {cp.returncode}):\n{cp.stderr[-1500:]}")
        out["start_s"] = round(time.monotonic() - t_all, 1)
        log(f"Kafka {mode}: up in {out['start_s']} s, pids {started}")
        common = ["--size", str(size), "--count", str(count), "--partitions", str(partitions)]
        common += ["--rate", str(int(rate)), "--latency-seconds", str(latency_seconds)]
        stamp = f"b{int(time.time())}"
        phases = _bench(
            src, peers, work, mode,
            [*common, "--phases", "publish,latency-us", "--warmup", str(warmup),
             "--topic-prefix", f"{stamp}d", "--label", f"kafka-{mode}-default"],
            timeout_s, env,
        )  # fmt: skip
        out["default_batch"] = _throughput(phases["publish"])
        lat = phases["latency-us"]
        out["latency"] = {
            "target_rate": lat.get("target_rate"),
            "achieved_rate": lat.get("achieved_rate"),
            "records": lat.get("records"),
            "errors": lat.get("errors"),
            "p50_ms": lat.get("latency_p50_ms"),
            "p99_ms": lat.get("latency_p99_ms"),
            "p999_ms": lat.get("latency_p999_ms"),
            "max_ms": lat.get("latency_max_ms"),
            "send_to_ack_p50_ms": lat.get("send_to_ack_p50_ms"),
            "send_to_ack_p99_ms": lat.get("send_to_ack_p99_ms"),
            "server_cpu_s_per_million": lat.get("server_cpu_s_per_M"),
            "loadavg_before": lat.get("cpu", {}).get("loadavg_before"),
            "loadavg_after": lat.get("cpu", {}).get("loadavg_after"),
        }
        log(
            f"Kafka {mode}: default batch {out['default_batch']['msgs_per_s']:,.0f} msg/s; "
            f"latency at {rate:g}/s p50 {out['latency']['p50_ms']} p99 "
            f"{out['latency']['p99_ms']} ms; 560 KB batches next"
        )
        phases = _bench(
            src, peers, work, mode,
            [*common, "--phases", "publish", "--warmup", "0", "--topic-prefix", f"{stamp}b",
             "--label", f"kafka-{mode}-560k", "--producer-props", *BIG_BATCH_PROPS],
            timeout_s, env,
        )  # fmt: skip
        out["big_batch"] = _throughput(phases["publish"])
        log(f"Kafka {mode}: 560 KB batches {out['big_batch']['msgs_per_s']:,.0f} msg/s")
    except PeerError as e:
        raise PeerError(f"{e}\nlogs of {work}:\n{_tail(work)}") from e
    finally:
        _stop(src, work, started, env, log)
        shutil.rmtree(work, ignore_errors=True)
        log(f"Kafka {mode}: stopped, {work.name} removed")
    out["seconds"] = round(time.monotonic() - t_all, 1)
    return {key: out}


# ----------------------------------------------------------------------------- API


def _modes(modes: str | Sequence[str]) -> list[str]:
    items = [modes] if isinstance(modes, str) else list(modes)
    out: list[str] = []
    for m in items:
        for name in ("single", "cluster") if m == "both" else (m,):
            if name not in MODES:
                raise ValueError(f"mode must be single, cluster or both, not {m!r}")
            if name not in out:
                out.append(name)
    return out


def run(
    modes: str | Sequence[str] = "both",
    *,
    size: int = 1120,
    count: int = 1_000_000,
    partitions: int = 6,
    rate: float = 5000.0,
    latency_seconds: float = 10.0,
    warmup: int = 200_000,
    heap: str = "1G",
    peers_dir: str | os.PathLike[str] = DEFAULT_PEERS,
    kafka_src_dir: str | os.PathLike[str] | None = None,
    timeout_s: float = 900.0,
    log: Log | None = _log,
) -> dict[str, Any]:
    """Benchmark Kafka RF 1 ("single") and/or RF 3 ("cluster", or "both"); returns
    {"kafka_rf1": {...}, "kafka_rf3": {...}, ...}, each with "default_batch", "big_batch"
    (msgs_per_s, server/client_cpu_s_per_million) and "latency" (p50_ms, p99_ms, ...).
    Installs the jars first if missing. timeout_s bounds each kafka_bench.py run. Raises
    PeerError when a run cannot be completed; the servers are stopped in every case."""
    if min(size, count, partitions, rate, latency_seconds) <= 0 or warmup < 0:
        raise ValueError("size, count, partitions, rate and latency_seconds must be > 0")
    say: Log = log if log is not None else (lambda _m: None)
    src = kafka_src(kafka_src_dir)
    peers = Path(peers_dir).resolve()
    t_all = time.monotonic()
    result: dict[str, Any] = {"kafka_rf1": None, "kafka_rf3": None}
    result["setup_s"] = round(ensure_kafka(peers, src, KAFKA_VERSION, say), 1)
    load_before = load_avg_1m()
    with signals_raise(), _lock(peers):
        for mode in _modes(modes):
            result.update(
                bench_config(
                    mode, src=src, peers=peers, size=size, count=count, partitions=partitions,
                    rate=rate, latency_seconds=latency_seconds, warmup=warmup, heap=heap,
                    timeout_s=timeout_s, log=say,
                )
            )  # fmt: skip
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    result.update(
        {
            "version": KAFKA_VERSION,
            "java": (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 else "",
            "size": size,
            "count": count,
            "partitions": partitions,
            "rate": rate,
            "latency_seconds": latency_seconds,
            "big_batch_props": list(BIG_BATCH_PROPS),
            "load_avg_1m_before": load_before,
            "load_avg_1m_after": load_avg_1m(),
            "seconds": round(time.monotonic() - t_all, 1),
            "caveat": "Kafka acks before fsync by default (page cache of the in-sync "
            "replicas); servers and client share this machine",
        }
    )
    return result


def format_table(result: dict[str, Any]) -> str:
    """A human-readable table of a run() result."""

    def f(v: Any, nd: int = 0) -> str:
        return "-" if not isinstance(v, int | float) else f"{v:,.{nd}f}"

    head = (
        f"{'Kafka ' + str(result.get('version')):<16}{'default msg/s':>14}{'srv CPU-s/M':>12}"
        f"{'560KB msg/s':>13}{'srv CPU-s/M':>12}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}"
    )
    rows = [head]
    for key in ("kafka_rf1", "kafka_rf3"):
        r = result.get(key)
        if not r:
            continue
        d, b, lat = r["default_batch"], r["big_batch"], r["latency"]
        rows.append(
            f"{key:<16}{f(d['msgs_per_s']):>14}{f(d['server_cpu_s_per_million'], 1):>12}"
            f"{f(b['msgs_per_s']):>13}{f(b['server_cpu_s_per_million'], 1):>12}"
            f"{f(lat['p50_ms'], 3):>9}{f(lat['p99_ms'], 3):>9}{f(lat['p999_ms'], 3):>10}"
        )
    rows.append("caveat: " + str(result.get("caveat", "")))
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    ap.add_argument("--mode", choices=("single", "cluster", "both"), default="both")
    ap.add_argument("--size", type=int, default=1120, help="record bytes")
    ap.add_argument("--count", type=int, default=1_000_000, help="records per publish run")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rate", type=float, default=5000.0, help="msg/s of the latency phase")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=200_000, help="JIT warm-up records")
    ap.add_argument("--heap", default="1G", help="broker heap (start.sh's KAFKA_HEAP)")
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS))
    ap.add_argument("--kafka-src", default=None, help=f"../shared/peers/kafka (${KAFKA_SRC_ENV})")
    ap.add_argument("--json", action="store_true", help="print the result as JSON, last line")
    a = ap.parse_args(argv)
    try:
        res = run(
            a.mode, size=a.size, count=a.count, partitions=a.partitions, rate=a.rate,
            latency_seconds=a.latency_seconds, warmup=a.warmup, heap=a.heap,
            peers_dir=a.peers_dir, kafka_src_dir=a.kafka_src,
        )  # fmt: skip
    except PeerError as e:
        print(f"kafka_peer: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kafka_peer: interrupted (servers stopped)", file=sys.stderr)
        return 130
    print(format_table(res))
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
