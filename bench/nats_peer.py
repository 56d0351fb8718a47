"""NATS JetStream peer benchmark (1 node R1 and/or 3 nodes R3) on this machine, for ratios.

Runs the peer-broker tooling of ../shared/peers (copied into --peers-dir by its install.sh):
the servers are started with the peers' own start_nats_single.sh / start_nats_cluster.sh,
the stream is (re)created with the peers' `nats_bench.py setup`, and every measurement is made
by the peers' Go reference client `jsbench` (nats.go 1.22.1), run through the peers'
`cpurun.py` exactly as run_nats.sh does, so each phase also records the CPU of the servers,
of the client and of every other process on the machine. Results are read back from the raw
JSON line jsbench appends to a per-run file in <peers-dir>/raw/.

Phases per configuration (as in run_nats.sh, Go part):
  publish  jsbench -mode pub: --count messages of --size bytes with PublishAsync, 4000 acks in
           flight, stopped at --max-seconds; msgs/s = acknowledged messages / elapsed.
  consume  jsbench -mode sub: read that stream back (pull consumer, AckNone, Fetch(1000)).
  latency  on a fresh stream, jsbench -mode lat: --rate msgs/s offered for --latency-seconds
           (at most --count messages); send->ack percentiles p50/p99/p99.9.
A publishing run (publish, latency) whose stream takes no message for STALL_S once it took one
is killed and run once more on a new stream, with a warning: nats.go 1.22.1 can keep an ack it
never matched pending for good, and jsbench then waits on it until its time limit (issue 22,
twenty-first sitting).
Every server this script started is stopped by PID (the peers' stop_pid.sh, then a check of
the recorded PIDs) in a finally block, also on Ctrl-C, SIGTERM and errors, and its data
directories are removed. Nothing is started while a NATS port is already taken.

Caveats (from ../shared/peers/RESULTS.md; quote them with any ratio):
  * NATS JetStream 2.9.10 (Debian 12) acknowledges BEFORE fsync. The PubAck is sent once the
    leader wrote the message to its file store (R1), or once the Raft entry is stored on 2 of 3
    nodes (R3); writes land in the page cache, the store syncs on a timer, and 2.9 has no
    `sync_interval` / `sync: always` option (2.10+). R1 numbers are "written, not fsynced"
    anchors, R3 numbers "in the page cache of 2 of 3 processes": an upper bound against a log
    that fsyncs before acking.
  * Server(s) and client share this machine's 2 cores; the 3-node cluster is CPU-bound here
    (3 servers + client on 2 cores), so R3 measures CPU cost per replicated message.
  * Compare only with a Laminar run made on the same machine in the same sitting, and quote
    ratios. Check `other_procs_cpu_pct` (CPU of unrelated processes) per phase: this machine
    is shared, and a phase with other load is contaminated (a warning is added).

Usage:
    python3 bench/nats_peer.py --size 1120 --count 50000 --rate 5000 --latency-seconds 3 \\
        --mode both --peers-dir .peers --json
From another benchmark script:
    sys.path.insert(0, "bench"); import nats_peer
    res = nats_peer.run(1120, 1_000_000, 5000, 10, "both", ".peers")
    res["nats_r1"]["publish_msgs_per_s"], nats_peer.ratios(laminar_metrics, res["nats_r1"])
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import Stalled, run_in_group

from laminar.local_cluster import get_json

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PEERS_SRC = REPO_ROOT.parent / "shared" / "peers"
PEERS_SRC_ENV = "LAMINAR_PEERS_SRC"

INFLIGHT = 4000
FETCH_BATCH = 1000
DEFAULT_MAX_SECONDS = 60.0
OTHER_CPU_WARN_PCT = 10.0  # other processes above this (100 = one core): phase contaminated
INSTALL_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 90.0
SETUP_TIMEOUT_S = 60.0
#: how long an R3 cluster may take to have every route up and the stream's replicas current
SETTLE_TIMEOUT_S = 60.0
#: a publishing run whose stream took no message for this long, once it took its first, is
#: stalled: nats.go 1.22.1 keeps an async publish whose ack it never matched pending for good,
#: and jsbench's ack reader, which takes the futures in order, waits on it until killed
STALL_S = 15.0

METRICS = (
    "publish_msgs_per_s",
    "publish_mb_per_s",
    "consume_msgs_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_p999_ms",
)
LOWER_IS_BETTER = frozenset({"latency_p50_ms", "latency_p99_ms", "latency_p999_ms"})

Log = Callable[[str], None]


@dataclass(frozen=True)
class Topology:
    key: str  # key in the result: nats_r1 / nats_r3
    mode: str  # run_nats.sh configuration name
    replicas: int
    start_script: str
    names: tuple[str, ...]  # pid-file names (peers' pids/<name>.pid) = data dir names
    client_ports: tuple[int, ...]
    other_ports: tuple[int, ...]  # http monitoring + cluster routes
    http_ports: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.mode}-R{self.replicas}"


TOPOLOGIES: dict[str, Topology] = {
    "single": Topology(
        key="nats_r1",
        mode="single",
        replicas=1,
        start_script="start_nats_single.sh",
        names=("nats-single",),
        client_ports=(4222,),
        other_ports=(8222,),
        http_ports=(8222,),
    ),
    "cluster": Topology(
        key="nats_r3",
        mode="cluster",
        replicas=3,
        start_script="start_nats_cluster.sh",
        names=("nats-c1", "nats-c2", "nats-c3"),
        client_ports=(4231, 4232, 4233),
        other_ports=(8231, 8232, 8233, 6231, 6232, 6233),
        http_ports=(8231, 8232, 8233),
    ),
}
REQUIRED_FILES = (
    "jsbench",
    "venv/bin/python",
    "nats_bench.py",
    "pbcommon.py",
    "cpurun.py",
    "stop_pid.sh",
    "start_nats_single.sh",
    "start_nats_cluster.sh",
)


class PeerError(RuntimeError):
    """The peer benchmark could not run (setup, port conflict, server or client failure)."""


def _stderr_log(msg: str) -> None:
    print(f"[nats_peer {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- setup


def missing_setup(peers: Path) -> list[str]:
    """What is missing for a run from `peers` (empty list: ready)."""
    missing = [f for f in REQUIRED_FILES if not (peers / f).exists()]
    if shutil.which("nats-server") is None:
        missing.append("nats-server on PATH")
    if shutil.which("curl") is None:
        missing.append("curl on PATH")
    start = peers / "start_nats_single.sh"
    if start.exists() and str(peers) not in start.read_text():
        missing.append(f"scripts configured for {peers} (they were installed elsewhere)")
    return missing


def ensure_peers(
    peers_dir: str | os.PathLike[str],
    peers_src: str | os.PathLike[str] | None = None,
    log: Log = _stderr_log,
) -> float:
    """Install the peers tooling into peers_dir with the peers' install.sh if anything is
    missing (apt, pip, npm, Go build of jsbench). Returns the seconds it took (0.0: ready)."""
    peers = Path(peers_dir).resolve()
    missing = missing_setup(peers)
    if not missing:
        return 0.0
    src = Path(peers_src or os.environ.get(PEERS_SRC_ENV) or DEFAULT_PEERS_SRC).resolve()
    install = src / "install.sh"
    if not install.is_file():
        raise PeerError(f"peers tooling not found: {install} (set {PEERS_SRC_ENV})")
    log(f"setting up {peers} with {install} (missing: {', '.join(missing)})")
    peers.mkdir(parents=True, exist_ok=True)
    logfile = peers / "install.log"
    t0 = time.monotonic()
    with open(logfile, "w") as out:
        try:
            rc = subprocess.run(
                ["bash", str(install), str(peers)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=INSTALL_TIMEOUT_S,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    took = time.monotonic() - t0
    still = missing_setup(peers)
    if rc != 0 or still:
        raise PeerError(
            f"install.sh failed (rc={rc}, missing: {still}); log {logfile}:\n{_tail(logfile)}"
        )
    log(f"peers set up in {took:.1f}s (log {logfile})")
    return took


# ----------------------------------------------------------------------------- helpers


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run(
    cmd: Sequence[str],
    cwd: Path,
    timeout: float,
    logf: IO[str],
    env: Mapping[str, str] | None = None,
    stalled: Callable[[], bool] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command (bounded by timeout, and by `stalled` if given: `run_in_group`), copy
    its output into the run log, return it."""
    logf.write(f"\n$ {' '.join(cmd)}\n")
    logf.flush()
    # own process group: on a timeout, Ctrl-C or SIGTERM the whole tree this command started
    # (cpurun.py -> jsbench) is killed, by that group's id; servers are stopped by _stop().
    try:
        done = run_in_group(cmd, timeout, env=env, cwd=cwd, stalled=stalled)
    except subprocess.TimeoutExpired as e:
        logf.write(f"TIMEOUT after {timeout}s\n")
        raise PeerError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    except Stalled:
        logf.write(f"STALLED: no message taken for {STALL_S:g}s\n")
        raise
    stdout, stderr = done.stdout, done.stderr
    logf.write(stdout)
    logf.write(stderr)
    logf.write(f"(rc {done.returncode})\n")
    logf.flush()
    return done


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _read_pid(peers: Path, name: str) -> int | None:
    try:
        return int((peers / "pids" / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _is_nats_server(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "nats-server"
    except OSError:
        return False


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _cmd_out(cmd: Sequence[str]) -> str:
    try:
        cp = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
        return (cp.stdout or cp.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _versions(peers: Path) -> dict[str, str]:
    out: dict[str, str] = {"nats_server": _cmd_out(["nats-server", "--version"])}
    deb = _cmd_out(
        [
            "dpkg-query",
            "-W",
            "-f=${Package} ${Version}\\n",
            "nats-server",
            "golang-github-nats-io-go-nats-dev",
        ]
    )
    for line in deb.splitlines():
        pkg, _, ver = line.partition(" ")
        out[f"deb:{pkg}"] = ver
    gos = sorted(Path("/usr/lib").glob("go-1.*/bin/go"))  # the Go setup.sh builds jsbench with
    out["go_build"] = _cmd_out([str(gos[-1]) if gos else "go", "version"])
    out["client"] = "jsbench (nats.go 1.22.1, Go reference client of the peers tooling)"
    out["python"] = sys.version.split()[0]
    return out


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into SystemExit (so finally blocks stop the servers) while running, if
    this is the main thread and nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    prev = signal.getsignal(signal.SIGTERM)
    if prev is not signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


@contextlib.contextmanager
def _peers_lock(peers: Path) -> Iterator[None]:
    (peers / "pids").mkdir(parents=True, exist_ok=True)
    with open(peers / "pids" / ".nats_peer.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            raise PeerError(f"another nats_peer run is using {peers}") from e
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- servers


def _check_free(topo: Topology, peers: Path) -> None:
    """Refuse to start over a running server; drop stale PID files (so that after our start
    every PID file of this topology names a process this run started)."""
    for name in topo.names:
        pid = _read_pid(peers, name)
        if pid is not None and _is_nats_server(pid):
            raise PeerError(
                f"{name} (pid {pid}) from {peers}/pids is already running (another peers run?); "
                f"stop it with {peers}/stop_pid.sh {name} if it is a leftover"
            )
        (peers / "pids" / f"{name}.pid").unlink(missing_ok=True)
    busy = [p for p in topo.client_ports + topo.other_ports if _port_in_use(p)]
    if busy:
        raise PeerError(f"ports {busy} on 127.0.0.1 are in use: not starting NATS {topo.label}")


def _start(topo: Topology, peers: Path, logf: IO[str]) -> dict[str, int]:
    """Start the servers with the peers' start script; returns {name: pid}."""
    cp = _run(["./" + topo.start_script, "--fresh"], peers, START_TIMEOUT_S, logf)
    pids = {n: p for n in topo.names if (p := _read_pid(peers, n)) is not None}
    if cp.returncode != 0 or len(pids) != len(topo.names):
        raise PeerError(f"{topo.start_script} failed (rc {cp.returncode}): {cp.stdout}{cp.stderr}")
    deadline = time.monotonic() + 20
    while True:
        dead = [n for n, p in pids.items() if not _is_nats_server(p)]
        if dead:
            logs = "\n".join(_tail(peers / "logs" / f"{n}.log", 10) for n in dead)
            raise PeerError(f"nats-server {dead} exited right after start:\n{logs}")
        if all(_healthy(p) for p in topo.http_ports):
            return pids
        if time.monotonic() > deadline:
            raise PeerError(f"NATS {topo.label} not healthy on ports {topo.http_ports}")
        time.sleep(0.3)


def _stop(topo: Topology, peers: Path, started: Mapping[str, int], logf: IO[str], log: Log) -> None:
    """Stop what this run started (peers' stop_pid.sh, by PID file), make sure the recorded
    PIDs are gone, and remove the data directories."""
    names = [n for n in topo.names if (peers / "pids" / f"{n}.pid").exists() or n in started]
    if names:
        try:
            _run(["./stop_pid.sh", *names], peers, 60, logf)
        except PeerError as e:
            log(f"stop_pid.sh: {e}")
    for name, pid in started.items():
        if not _is_nats_server(pid):
            continue
        log(f"{name} (pid {pid}) still running after stop_pid.sh: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if not _is_nats_server(pid):
                break
            time.sleep(0.1)
    for name in topo.names:
        shutil.rmtree(peers / "data" / name, ignore_errors=True)


# ----------------------------------------------------------------------------- phases


def _create_stream(topo: Topology, peers: Path, logf: IO[str], log: Log) -> str:
    """(Re)create stream BENCH (file storage, R1/R3) with the peers' nats_bench.py setup and
    return the server URL the client should use (the stream leader in the cluster, once the
    cluster has settled: `_wait_settled`)."""
    url = f"nats://127.0.0.1:{topo.client_ports[0]}"
    cmd = [
        str(peers / "venv/bin/python"),
        "nats_bench.py",
        "setup",
        "--servers",
        url,
        "--replicas",
        str(topo.replicas),
    ]
    cp: subprocess.CompletedProcess[str] | None = None
    for attempt in range(5):
        cp = _run(cmd, peers, SETUP_TIMEOUT_S, logf)
        if cp.returncode == 0 and "stream created" in cp.stdout:
            break
        log(f"stream setup attempt {attempt + 1} failed; retrying")
        time.sleep(1.0 + attempt)
    else:
        err = (cp.stdout + cp.stderr)[-800:] if cp else ""
        raise PeerError(f"could not create the stream on NATS {topo.label}: {err}")
    if topo.replicas > 1:
        m = re.search(r"leader n([123])\b", cp.stdout)
        if m is None:
            raise PeerError(f"no stream leader in: {cp.stdout.strip()}")
        leader = int(m.group(1))
        _wait_settled(topo, leader, log)
        url = f"nats://127.0.0.1:{topo.client_ports[leader - 1]}"
    return url


def _monitor(port: int, path: str) -> dict[str, Any]:
    """A server's monitoring endpoint as JSON ({} when it does not answer)."""
    _, body = get_json(f"http://127.0.0.1:{port}{path}", timeout_s=2.0)
    return body if isinstance(body, dict) else {}


class StreamProgress:
    """A `stalled` check for a publishing run: True once the stream's message count (the most
    any server reports) has not moved for STALL_S since it first moved (cpurun.py waits for an
    idle machine before it starts jsbench, and jsbench connects first)."""

    def __init__(
        self,
        count: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        stall_s: float = STALL_S,
    ) -> None:
        self._count = count
        self._clock = clock
        self._stall_s = stall_s
        self._last: tuple[int, float] | None = None  # (count, when it was first seen)
        self._moved = False

    def __call__(self) -> bool:
        count, now = self._count(), self._clock()
        if self._last is None or count != self._last[0]:
            self._moved = self._moved or self._last is not None
            self._last = (count, now)
            return False
        return self._moved and now - self._last[1] >= self._stall_s


def _bench_stream(port: int) -> dict[str, Any]:
    """Stream BENCH as the server whose monitoring port is `port` reports it ({}: not there,
    or the server does not answer)."""
    jsz = _monitor(port, "/jsz?accounts=true&streams=true")
    streams = [s for a in jsz.get("account_details") or [] for s in a.get("stream_detail") or []]
    return next((s for s in streams if s.get("name") == "BENCH"), {})


def stream_messages(topo: Topology) -> int:
    """Messages in stream BENCH, the most any of `topo`'s servers reports (0: none answers)."""
    states = [_bench_stream(port).get("state") or {} for port in topo.http_ports]
    return max(int(state.get("messages") or 0) for state in states)


def _unsettled(topo: Topology, leader: int) -> str | None:
    """Why the cluster is not ready for a run yet (None: ready): a server without a route to
    each other server, or the stream BENCH, as its leader (server `leader`, 1-based) sees it,
    with a replica that is not current."""
    for port in topo.http_ports:
        routes = _monitor(port, "/routez").get("routes") or []
        remotes = {r.get("remote_id") for r in routes}
        if len(remotes) < len(topo.http_ports) - 1:
            return f"server on :{port} has routes to {len(remotes)} of the others"
    cluster = _bench_stream(topo.http_ports[leader - 1]).get("cluster") or {}
    if cluster.get("leader") != f"n{leader}":
        return f"n{leader} does not lead stream BENCH (leader {cluster.get('leader')!r})"
    replicas = cluster.get("replicas") or []
    lagging = [r.get("name") for r in replicas if not r.get("current")]
    if len(replicas) < topo.replicas - 1 or lagging:
        return f"stream BENCH has {len(replicas)} followers, not current: {lagging}"
    return None


def _wait_settled(topo: Topology, leader: int, log: Log) -> None:
    """Before a run on an R3 cluster: wait until every route is up and the stream's replicas
    are current. A run started while the routes were still forming stalled in the eighth and
    nineteenth sittings of issue 22: jsbench published for a second, then sat idle to its time
    limit."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (why := _unsettled(topo, leader)) is not None:
        if time.monotonic() > deadline:
            raise PeerError(f"NATS {topo.label} not settled after {SETTLE_TIMEOUT_S:g}s: {why}")
        time.sleep(0.2)
    log(f"NATS {topo.label}: routes up, stream replicas current")


def _jsbench(
    topo: Topology,
    peers: Path,
    mode: str,
    args: Sequence[str],
    results: Path,
    idle_wait: int,
    timeout: float,
    logf: IO[str],
    stalled: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One jsbench run through cpurun.py (CPU attribution), as run_nats.sh does; returns the
    raw JSON line jsbench appended to `results` (with the "cpu" block cpurun.py attached).
    With `stalled`, a run it finds stalled is killed and raises Stalled."""
    env = dict(os.environ)
    env["PB_RESULTS"] = str(results)
    env["PB_IDLE_WAIT"] = str(max(1, idle_wait))  # cpurun.py's wait_idle() needs >= 1
    before = len(results.read_text().splitlines()) if results.exists() else 0
    cmd = [
        str(peers / "venv/bin/python"),
        "cpurun.py",
        "--watch",
        ",".join(topo.names),
        "--timeout",
        str(int(timeout)),
        "--",
        "./jsbench",
        "-mode",
        mode,
        "-label",
        topo.label,
        *args,
    ]
    cp = _run(cmd, peers, timeout + max(1, idle_wait) + 60, logf, env, stalled)
    lines = results.read_text().splitlines() if results.exists() else []
    if cp.returncode != 0 or len(lines) <= before:
        raise PeerError(
            f"jsbench -mode {mode} on NATS {topo.label} failed (rc {cp.returncode}): "
            f"{(cp.stdout + cp.stderr)[-800:]}"
        )
    rec: dict[str, Any] = json.loads(lines[-1])
    if rec.get("mode") != mode:
        raise PeerError(f"unexpected jsbench result line: {lines[-1][:300]}")
    return rec


def _cpu_summary(rec: Mapping[str, Any]) -> dict[str, Any]:
    cpu = rec.get("cpu") or {}
    procs = cpu.get("procs", {})
    return {
        "server_cpu_pct": {
            k: v.get("avg_cpu_pct") for k, v in procs.items() if k.startswith("nats-")
        },
        "client_cpu_pct": procs.get("client(cmd)", {}).get("avg_cpu_pct"),
        "machine_busy_pct_of_all_cores": cpu.get("machine_busy_pct_of_2cores"),
        "other_procs_cpu_pct": cpu.get("other_procs_cpu_pct"),
    }


def _num(v: Any, nd: int) -> float | None:
    return round(float(v), nd) if isinstance(v, int | float) and v >= 0 else None


def _bench_topology(
    topo: Topology,
    peers: Path,
    *,
    size: int,
    count: int,
    rate: float,
    latency_seconds: float,
    max_seconds: float,
    idle_wait: int,
    results: Path,
    logf: IO[str],
    log: Log,
    warnings: list[str],
) -> tuple[dict[str, Any], dict[str, float]]:
    timings: dict[str, float] = {}
    cpu: dict[str, Any] = {}
    started: dict[str, int] = {}
    t_all = time.monotonic()
    _check_free(topo, peers)
    try:
        t = time.monotonic()
        log(f"NATS {topo.label}: starting {', '.join(topo.names)}")
        started = _start(topo, peers, logf)
        timings["start"] = round(time.monotonic() - t, 2)
        log(f"NATS {topo.label}: up in {timings['start']}s, pids {started}")

        def phase(name: str, mode: str, args: list[str], timeout: float) -> dict[str, Any]:
            t = time.monotonic()
            if mode == "sub":  # reads: no stream to watch
                rec = _jsbench(topo, peers, mode, args, results, idle_wait, timeout, logf)
            else:
                rec = publish(name, mode, args, timeout)
            timings[name] = round(time.monotonic() - t, 2)
            cpu[name] = _cpu_summary(rec)
            other = cpu[name]["other_procs_cpu_pct"]
            if isinstance(other, int | float) and other > OTHER_CPU_WARN_PCT:
                warnings.append(
                    f"{topo.key} {name}: other processes used {other}% CPU during the run "
                    "(shared machine): numbers contaminated"
                )
            return rec

        def publish(name: str, mode: str, args: list[str], timeout: float) -> dict[str, Any]:
            """A publishing run watched for the client's stall (STALL_S); a stalled one is run
            once more on the stream made anew (the stall is in the client, not the server)."""
            why = f"{topo.key} {name}: jsbench stalled (no message for {STALL_S:g}s)"
            for again in (False, True):
                if again:
                    warnings.append(f"{why}; run again on a new stream")
                    log(f"NATS {topo.label}: {name} stalled; again on a new stream")
                    url = _create_stream(topo, peers, logf, log)
                    args = [url if i and args[i - 1] == "-s" else a for i, a in enumerate(args)]
                progress = StreamProgress(lambda: stream_messages(topo))
                try:
                    return _jsbench(
                        topo, peers, mode, args, results, idle_wait, timeout, logf, progress
                    )
                except Stalled:
                    pass
            raise PeerError(f"{why}, twice")

        t = time.monotonic()
        url = _create_stream(topo, peers, logf, log)
        timings["stream_setup"] = round(time.monotonic() - t, 2)
        common = ["-s", url, "-size", str(size), "-count", str(count), "-max", str(max_seconds)]
        log(f"NATS {topo.label}: publish {count} x {size} B (cap {max_seconds:g}s) -> {url}")
        pub = phase("publish", "pub", [*common, "-inflight", str(INFLIGHT)], max_seconds + 70)
        log(
            f"NATS {topo.label}: publish {pub.get('msgs_per_s', 0):,.0f} msgs/s "
            f"({pub.get('acked')} acked in {pub.get('elapsed_s', 0):.2f}s); consume"
        )
        sub = phase("consume", "sub", [*common, "-batch", str(FETCH_BATCH)], max_seconds + 30)
        log(f"NATS {topo.label}: consume {sub.get('msgs_per_s', 0):,.0f} msgs/s; latency")
        t = time.monotonic()
        url = _create_stream(topo, peers, logf, log)
        timings["stream_setup"] += round(time.monotonic() - t, 2)
        lat_args = ["-s", url, "-size", str(size), "-count", str(count), "-max", str(max_seconds)]
        lat_args += ["-rate", str(rate), "-duration", str(latency_seconds)]
        lat = phase("latency", "lat", lat_args, latency_seconds + max_seconds + 70)
        log(
            f"NATS {topo.label}: latency p50 {lat.get('p50_ms')} p99 {lat.get('p99_ms')} "
            f"p99.9 {lat.get('p999_ms')} ms at {lat.get('achieved_rate', 0):,.0f}/s"
        )
    finally:
        t = time.monotonic()
        _stop(topo, peers, started, logf, log)
        timings["stop"] = round(time.monotonic() - t, 2)
        log(f"NATS {topo.label}: stopped, data removed ({timings['stop']}s)")
    timings["total"] = round(time.monotonic() - t_all, 2)

    acked, sent = int(pub.get("acked", 0)), int(pub.get("sent", 0))
    if pub.get("errors") or acked < sent:
        warnings.append(f"{topo.key} publish: {acked}/{sent} acked, errors {pub.get('errors')}")
    if sent < count:
        warnings.append(f"{topo.key} publish: time cap {max_seconds:g}s hit after {sent} msgs")
    if int(sub.get("read", 0)) < acked:
        warnings.append(f"{topo.key} consume: read {sub.get('read')} of {acked} messages")
    if lat.get("errors"):
        warnings.append(f"{topo.key} latency: {lat.get('errors')} publish errors")
    n_lat = min(count, int(rate * latency_seconds))
    if n_lat < 1000:
        warnings.append(f"{topo.key} latency: only {n_lat} samples, p99.9 is not meaningful")

    out = {
        "publish_msgs_per_s": _num(pub.get("msgs_per_s"), 1),
        "publish_mb_per_s": _num(pub.get("MB_per_s"), 2),
        "consume_msgs_per_s": _num(sub.get("msgs_per_s"), 1),
        "latency_p50_ms": _num(lat.get("p50_ms"), 3),
        "latency_p99_ms": _num(lat.get("p99_ms"), 3),
        "latency_p999_ms": _num(lat.get("p999_ms"), 3),
        # details
        "publish_sent": sent,
        "publish_acked": acked,
        "publish_elapsed_s": _num(pub.get("elapsed_s"), 3),
        "consume_read": sub.get("read"),
        "consume_mb_per_s": _num(sub.get("MB_per_s"), 2),
        "latency_max_ms": _num(lat.get("max_ms"), 3),
        "latency_target_rate": rate,
        "latency_achieved_rate": _num(lat.get("achieved_rate"), 1),
        "latency_sent": lat.get("sent"),
        "replicas": topo.replicas,
        "nodes": len(topo.names),
        "ack_semantics": "ack before fsync (page cache; R3: 2 of 3 nodes)",
        "cpu": cpu,
    }
    return out, timings


# ----------------------------------------------------------------------------- API


def _parse_modes(modes: str | Sequence[str]) -> list[str]:
    items = [modes] if isinstance(modes, str) else list(modes)
    out: list[str] = []
    for m in items:
        for name in ("single", "cluster") if m == "both" else (m,):
            if name not in TOPOLOGIES:
                raise ValueError(f"mode must be single, cluster or both, not {m!r}")
            if name not in out:
                out.append(name)
    return out


def run(
    size: int,
    count: int,
    rate: float,
    latency_seconds: float,
    modes: str | Sequence[str],
    peers_dir: str | os.PathLike[str],
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    idle_wait: int = 1,
    peers_src: str | os.PathLike[str] | None = None,
    log: Log | None = _stderr_log,
) -> dict[str, Any]:
    """Benchmark NATS JetStream R1 and/or R3 with the Go reference client; return the result.

    modes: "single" (1 node, R1), "cluster" (3 nodes, R3), "both", or a list of those.
    peers_dir: the peers' work directory (relative paths against the current directory); it
    is set up with ../shared/peers/install.sh if anything is missing.
    max_seconds caps the publish and consume phases (the latency phase sends at most
    min(count, rate * latency_seconds) messages). idle_wait: seconds cpurun.py may wait for
    the machine to be idle before each phase (RESULTS.md used 90). Progress goes to `log`
    (stderr by default; None for silence). Raises PeerError if a run cannot be completed;
    the servers are stopped in every case.
    """
    if size <= 0 or count <= 0 or rate <= 0 or latency_seconds <= 0 or max_seconds <= 0:
        raise ValueError("size, count, rate, latency_seconds and max_seconds must be > 0")
    names = _parse_modes(modes)
    say: Log = log if log is not None else (lambda _m: None)
    peers = Path(peers_dir).resolve()
    t_all = time.monotonic()
    timings: dict[str, Any] = {"setup": round(ensure_peers(peers, peers_src, say), 2)}
    stamp = time.strftime("%Y%m%dT%H%M%S")
    results = peers / "raw" / f"nats_peer-{stamp}-{os.getpid()}.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    runlog = peers / "logs" / f"nats_peer-{stamp}-{os.getpid()}.log"
    runlog.parent.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    out: dict[str, Any] = {"nats_r1": None, "nats_r3": None}
    load0 = os.getloadavg()
    with _sigterm_raises(), _peers_lock(peers), open(runlog, "w") as logf:
        for name in names:
            topo = TOPOLOGIES[name]
            metrics, tm = _bench_topology(
                topo,
                peers,
                size=size,
                count=count,
                rate=rate,
                latency_seconds=latency_seconds,
                max_seconds=max_seconds,
                idle_wait=idle_wait,
                results=results,
                logf=logf,
                log=say,
                warnings=warnings,
            )
            out[topo.key] = metrics
            timings[topo.key] = tm
    timings["total"] = round(time.monotonic() - t_all, 2)
    out.update(
        {
            "size": size,
            "count": count,
            "rate": rate,
            "latency_seconds": latency_seconds,
            "max_seconds": max_seconds,
            "versions": _versions(peers),
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_at_start": [round(x, 2) for x in load0],
            },
            "timings_s": timings,
            "warnings": warnings,
            "raw_results": str(results),
            "run_log": str(runlog),
            "caveat": "NATS 2.9 acks before fsync (no sync option before 2.10); "
            "servers and client share this machine",
        }
    )
    return out


def ratios(laminar: Mapping[str, Any], peer: Mapping[str, Any] | None) -> dict[str, float | None]:
    """laminar / peer for each metric in METRICS both have; > 1 means Laminar is better
    (for the latency metrics the ratio is inverted: peer / laminar)."""
    res: dict[str, float | None] = {}
    for k in METRICS:
        a, b = laminar.get(k), (peer or {}).get(k)
        if not isinstance(a, int | float) or not isinstance(b, int | float) or a <= 0 or b <= 0:
            res[k] = None
        else:
            res[k] = round(b / a if k in LOWER_IS_BETTER else a / b, 3)
    return res


def format_table(result: Mapping[str, Any]) -> str:
    """Human-readable table of a run() result."""

    def f(v: Any, nd: int) -> str:
        return "-" if not isinstance(v, int | float) else f"{v:,.{nd}f}"

    head = (
        f"{'system':<26}{'pub msgs/s':>12}{'pub MB/s':>10}{'cons msgs/s':>13}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'other CPU%':>12}"
    )
    rows = [
        f"NATS JetStream peer, {result['size']} B messages, count {result['count']:,}, "
        f"latency at {result['rate']:g}/s for {result['latency_seconds']:g}s",
        head,
        "-" * len(head),
    ]
    for key, label in (("nats_r1", "NATS 2.9 1 node R1"), ("nats_r3", "NATS 2.9 3 nodes R3")):
        m = result.get(key)
        if not m:
            continue
        other = [c.get("other_procs_cpu_pct") for c in m.get("cpu", {}).values()]
        worst = max((o for o in other if isinstance(o, int | float)), default=None)
        rows.append(
            f"{label:<26}{f(m['publish_msgs_per_s'], 0):>12}{f(m['publish_mb_per_s'], 1):>10}"
            f"{f(m['consume_msgs_per_s'], 0):>13}{f(m['latency_p50_ms'], 3):>9}"
            f"{f(m['latency_p99_ms'], 3):>9}{f(m['latency_p999_ms'], 3):>10}{f(worst, 1):>12}"
        )
    tm = result.get("timings_s", {})
    parts = [f"setup {tm.get('setup', 0):g}s"]
    for key in ("nats_r1", "nats_r3"):
        if isinstance(tm.get(key), dict):
            parts.append(key + " " + " ".join(f"{k} {v:g}s" for k, v in tm[key].items()))
    rows.append("timings: " + "; ".join(parts) + f"; total {tm.get('total', 0):g}s")
    rows.append("caveat: " + str(result.get("caveat", "")))
    rows.extend("WARNING: " + w for w in result.get("warnings", []))
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    ap.add_argument("--size", type=int, default=1120, help="message bytes (1120)")
    ap.add_argument("--count", type=int, default=1_000_000, help="messages per publish run")
    ap.add_argument("--rate", type=float, default=5000.0, help="offered msgs/s for latency")
    ap.add_argument("--latency-seconds", type=float, default=10.0, help="latency run length")
    ap.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS, help="time cap")
    ap.add_argument("--mode", choices=("single", "cluster", "both"), default="both")
    ap.add_argument("--peers-dir", default=".peers")
    ap.add_argument("--peers-src", default=None, help="shared peers tooling (../shared/peers)")
    ap.add_argument("--idle-wait", type=int, default=1, help="max s to wait for an idle machine")
    ap.add_argument("--json", action="store_true", help="print the result as JSON, last line")
    a = ap.parse_args(argv)
    try:
        res = run(
            a.size,
            a.count,
            a.rate,
            a.latency_seconds,
            a.mode,
            a.peers_dir,
            max_seconds=a.max_seconds,
            idle_wait=a.idle_wait,
            peers_src=a.peers_src,
        )
    except PeerError as e:
        print(f"nats_peer: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nats_peer: interrupted (servers stopped)", file=sys.stderr)
        return 130
    print(format_table(res))
    if a.json:
        print(json.dumps(res, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
