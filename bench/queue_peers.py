"""Work-queue peers for issue 6: RabbitMQ quorum queues and NATS JetStream work-queue streams.

The like-for-like of Laminar's shared queues (acquire + accept): one queue, 4 competing
consumers, every message acknowledged individually, measured on this machine with the
peer-broker tooling of ../shared/peers (installed into --peers-dir by its install.sh; servers
are started and stopped only with its start_*.sh / stop_pid.sh, CPU is sampled with its
pbcommon.CpuWatch like cpurun.py does). Clients are the non-Python reference clients, because
the peers' RESULTS.md shows the Python ones (aio-pika, nats-py) are the bottleneck:

  rabbit  bench/queue_peers_rabbit.js (Node 20 + amqplib 0.10.9 from <peers>/node).
          Quorum queue (x-quorum-initial-group-size = nodes), persistent messages.
          pre-publish: ConfirmChannel, 2000 unconfirmed at most (the peers' fastest publisher).
          drain: 4 connections, a channel each, prefetch --prefetch, basic.ack per message
          (multiple=false; --ack-every N acks with multiple=true every N instead).
  nats    <peers>/queuebench (Go, nats.go 1.22.1 from Debian, built offline in GOPATH mode
          like the peers' jsbench; its source is QUEUEBENCH_GO below). Stream with retention
          workqueue, file storage, R = nodes; one durable pull consumer, AckExplicit,
          max_ack_pending 20000, shared by 4 clients (a connection each) that keep pull
          requests of --batch outstanding and ack each message (+ACK).
          pre-publish: PublishAsync, 4000 PubAcks outstanding (as the peers' jsbench).

Phases per system (a fresh server start for each system; servers stopped in a finally
block, also on Ctrl-C / SIGTERM / SIGHUP):
  publish  pre-publish --count messages of --size bytes (reported, not the target metric)
  drain    the 4 consumers consume + ack the queue: msgs/s = acked / (last ack sent - start).
           Acks are one-way in AMQP and NATS, so the clients then check the queue is empty.
  latency  fresh queue; the 4 consumers run while one publisher (publisher confirms /
           PubAcks) sends at a fixed --rates R msg/s for --duration s with a timestamp in the
           body; latency = consumer's ack time - time just before publish (same process, one
           clock), p50/p99/p99.9; 200 warm-up messages are not counted.
Every phase is bounded by --count and --max-seconds.

Caveats (quote them with the numbers): NATS 2.9 acknowledges before fsync (no sync option
before 2.10); RabbitMQ quorum queues fsync their WAL before confirming. The 3-node clusters
put 3 server processes plus the client on this machine's 2 cores (CPU-bound: they measure CPU
per replicated message). An AMQP / NATS ack is fire-and-forget, while a Laminar accept is an
HTTP call answered once the settlement is committed.

    python3 bench/queue_peers.py                          # RabbitMQ 3 nodes + NATS 3 nodes
    python3 bench/queue_peers.py --systems rabbit3,rabbit1,nats3,nats1 --json
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from machine import fdatasync_per_s  # bench/ (the script's folder)
from nats_peer import _port_in_use, _read_pid

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_PEERS = REPO / ".peers"
RABBIT_JS = HERE / "queue_peers_rabbit.js"
OTHER_CPU_WARN_PCT = 10.0

Log = Callable[[str], None]


def _log(msg: str) -> None:
    print(f"[queue_peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class PeerError(RuntimeError):
    """A peer run could not be completed (servers are stopped anyway)."""


@dataclass(frozen=True)
class System:
    key: str
    broker: str  # rabbit | nats
    nodes: int
    start: tuple[str, ...]  # start command, run in the peers dir
    names: tuple[str, ...]  # pid-file names of the server processes
    extra_names: tuple[str, ...]  # other pid files the start script writes (launchers)
    ports: tuple[int, ...]  # must be free before the start
    client_ports: tuple[int, ...]
    data_dirs: tuple[str, ...]
    label: str


SYSTEMS: dict[str, System] = {
    "rabbit3": System(
        "rabbit3", "rabbit", 3, ("./start_rabbit_cluster.sh",),
        ("rabbitmq-c1", "rabbitmq-c2", "rabbitmq-c3"),
        ("rabbitmq-c1-launcher", "rabbitmq-c2-launcher", "rabbitmq-c3-launcher"),
        (5673, 5674, 5675, 25673, 25674, 25675), (5673,),
        ("rabbitmq-c1", "rabbitmq-c2", "rabbitmq-c3"),
        "RabbitMQ 3.10 quorum queue, 3 nodes (group size 3)",
    ),
    "rabbit1": System(
        "rabbit1", "rabbit", 1, ("./start_rabbit.sh",), ("rabbitmq",),
        ("rabbitmq-launcher",), (5672, 25672), (5672,), ("rabbitmq",),
        "RabbitMQ 3.10 quorum queue, 1 node",
    ),
    "nats3": System(
        "nats3", "nats", 3, ("./start_nats_cluster.sh", "--fresh"),
        ("nats-c1", "nats-c2", "nats-c3"), (),
        (4231, 4232, 4233, 6231, 6232, 6233, 8231, 8232, 8233), (4231, 4232, 4233),
        ("nats-c1", "nats-c2", "nats-c3"),
        "NATS JetStream 2.9 work-queue stream, 3 nodes R3",
    ),
    "nats1": System(
        "nats1", "nats", 1, ("./start_nats_single.sh", "--fresh"), ("nats-single",), (),
        (4222, 8222), (4222,), ("nats-single",),
        "NATS JetStream 2.9 work-queue stream, 1 node R1",
    ),
}  # fmt: skip


# ----------------------------------------------------------------------------- helpers


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _pgrep(name: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and _comm(int(d)) == name:
            out.append(int(d))
    return out


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM / SIGHUP raise SystemExit while running (so finally blocks stop servers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            signal.signal(sig, prev)


@contextlib.contextmanager
def _peers_lock(peers: Path, wait_s: float, log: Log) -> Iterator[None]:
    """The lock nats_peer.py takes too: one peers run at a time (shared pid files, ports)."""
    (peers / "pids").mkdir(parents=True, exist_ok=True)
    with open(peers / "pids" / ".nats_peer.lock", "w") as f:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                if time.monotonic() > deadline:
                    raise PeerError(f"another peers run holds {peers}/pids/.nats_peer.lock") from e
                if not said:
                    log("waiting for another peers run to finish (lock)")
                    said = True
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run a command in its own process group (killed as a group on timeout / interrupt)."""
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException as e:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise PeerError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
        raise
    if proc.returncode != 0:
        raise PeerError(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{out[-1500:]}")
    return out


def machine_limits(directory: Path, seconds: float = 2.0) -> dict[str, Any]:
    """CPU count and small fdatasync'd writes per second on the data disk (as broker_bench)."""
    return {"cpus": os.cpu_count(), "fdatasync_4k_per_s": fdatasync_per_s(directory, seconds)}


# ----------------------------------------------------------------------------- the Go client


def build_queuebench(peers: Path, log: Log) -> Path:
    """Write QUEUEBENCH_GO to <peers>/queuebench/main.go and build it (offline, GOPATH mode with
    Debian's nats.go 1.22.1, as the peers' setup.sh builds jsbench) unless it is current."""
    src_dir = peers / "queuebench"
    src_dir.mkdir(parents=True, exist_ok=True)
    src, binary = src_dir / "main.go", src_dir / "queuebench"
    digest = hashlib.sha256(QUEUEBENCH_GO.encode()).hexdigest()
    stamp = src_dir / "source.sha256"
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return binary
    src.write_text(QUEUEBENCH_GO)
    gos = sorted(Path("/usr/lib").glob("go-1.*/bin/go"))
    go = str(gos[-1]) if gos else (shutil.which("go") or "go")
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{peers}/gopath:/usr/share/gocode")
    env["GOCACHE"] = str(peers / "gocache")
    log(f"building {binary} with {go}")
    _run([go, "build", "-o", str(binary), str(src)], peers, 300, env)
    stamp.write_text(digest + "\n")
    return binary


# ----------------------------------------------------------------------------- one client run


def _import_pbcommon(peers: Path) -> Any:
    sys.path.insert(0, str(peers))
    try:
        import pbcommon
    finally:
        sys.path.remove(str(peers))
    return pbcommon


def client_phase(
    cmd: Sequence[str],
    *,
    peers: Path,
    server_pids: dict[str, int],
    timeout: float,
    idle_wait: int,
    env: dict[str, str] | None = None,
    measure_cpu: bool = True,
) -> dict[str, Any]:
    """Run one client invocation; CPU of the servers and the client is sampled between the
    client's GO and END lines (pbcommon.CpuWatch). Returns its RESULT json (+ "cpu")."""
    pb = _import_pbcommon(peers)
    idle = pb.wait_idle(idle_wait) if measure_cpu and idle_wait > 0 else None
    proc = subprocess.Popen(
        list(cmd), cwd=peers, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    result: dict[str, Any] | None = None
    cpu: dict[str, Any] | None = None
    watch = None
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line == "GO" and measure_cpu and watch is None:
                labels = [*server_pids, "client"]
                watch = pb.CpuWatch([*server_pids.values(), proc.pid], labels=labels)
                watch.idle_wait = idle
                watch.start()
            elif line == "END" and watch is not None and cpu is None:
                cpu = watch.stop()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT ") :])
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        timer.cancel()
        if watch is not None and cpu is None:
            cpu = watch.stop()
    reader.join(timeout=5)
    if proc.returncode != 0 or result is None:
        raise PeerError(
            f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{''.join(errors)[-1500:]}"
        )
    if cpu is not None:
        result["cpu"] = _cpu_summary(cpu, list(server_pids))
    return result


def _cpu_summary(cpu: dict[str, Any], server_names: list[str]) -> dict[str, Any]:
    procs = cpu.get("procs", {})
    servers = {n: procs.get(n, {}).get("avg_cpu_pct") for n in server_names}
    client = procs.get("client", {}).get("avg_cpu_pct")
    return {
        "servers_pct": servers,
        "servers_total_pct": round(sum(v or 0 for v in servers.values()), 1),
        "client_pct": client,
        "client_max_1s_pct": procs.get("client", {}).get("max_1s_cpu_pct"),
        "machine_busy_pct": cpu.get("machine_busy_pct_of_2cores"),
        "other_procs_pct": cpu.get("other_procs_cpu_pct"),  # incl. kernel threads, softirq
        "other_user_procs_pct": cpu.get("other_user_procs_cpu_pct"),
        "other_top": cpu.get("other_top"),
        "softirq_pct": cpu.get("irq_softirq_cpu_pct"),
        "idle_wait_s_busy": cpu.get("idle_wait_s_busy"),
    }


def limited_by(cpu: dict[str, Any] | None, cpus: int) -> str:
    """A one-line reading of the CPU figures (100 % = one core)."""
    if not cpu:
        return "?"
    busy = cpu.get("machine_busy_pct") or 0.0
    client = cpu.get("client_pct") or 0.0
    servers = cpu.get("servers_pct") or {}
    top = max(servers.items(), key=lambda kv: kv[1] or 0, default=("-", 0))
    parts = []
    if busy >= 90:
        parts.append(f"CPU: machine {busy:.0f}% busy of {cpus} cores")
    if client >= 90:
        parts.append(f"client at {client:.0f}% of a core")
    if (top[1] or 0) >= 90:
        parts.append(f"{top[0]} at {top[1]:.0f}%")
    if not parts:
        parts.append(f"not CPU-saturated (machine {busy:.0f}% busy): latency / protocol bound")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- servers


def _start(sysd: System, peers: Path, epmd_before: bool, log: Log) -> dict[str, int]:
    """Start the servers with the peers' start script. Returns {name: pid}."""
    for name in (*sysd.names, *sysd.extra_names):
        pid = _read_pid(peers, name)
        if pid is not None and _comm(pid) in ("beam.smp", "nats-server", "rabbitmq-server"):
            raise PeerError(f"{name} (pid {pid}) from {peers}/pids is still running")
        (peers / "pids" / f"{name}.pid").unlink(missing_ok=True)
    busy = [p for p in sysd.ports if _port_in_use(p)]
    if busy:
        raise PeerError(f"ports {busy} on 127.0.0.1 are in use: not starting {sysd.key}")
    log(f"{sysd.key}: starting ({' '.join(sysd.start)})")
    out = ""
    try:
        out = _run(sysd.start, peers, 180)
    finally:
        if sysd.broker == "rabbit" and epmd_before:
            (peers / "pids" / "epmd.pid").unlink(missing_ok=True)  # not ours: leave it running
    pids = {n: p for n in sysd.names if (p := _read_pid(peers, n)) is not None}
    if len(pids) != len(sysd.names):
        raise PeerError(f"{sysd.key}: start script did not record all pids:\n{out[-1500:]}")
    return pids


def _stop(sysd: System, peers: Path, started: dict[str, int], epmd_ours: bool, log: Log) -> None:
    names = [*sysd.names, *sysd.extra_names]
    if epmd_ours:
        names.append("epmd")
    names = [n for n in names if (peers / "pids" / f"{n}.pid").exists()]
    if names:
        try:
            _run(["./stop_pid.sh", *names], peers, 120)
        except PeerError as e:
            log(f"stop_pid.sh: {e}")
    for name, pid in started.items():
        if _comm(pid) in ("beam.smp", "nats-server"):
            log(f"{name} (pid {pid}) still running after stop_pid.sh: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for d in sysd.data_dirs:
        shutil.rmtree(peers / "data" / d, ignore_errors=True)


# ----------------------------------------------------------------------------- one system


def _phase_note(res: dict[str, Any], key: str, warnings: list[str]) -> None:
    other = (res.get("cpu") or {}).get("other_user_procs_pct")
    if isinstance(other, int | float) and other > OTHER_CPU_WARN_PCT:
        warnings.append(f"{key}: other users' processes used {other}% CPU during the phase")


def bench_system(
    sysd: System, peers: Path, a: argparse.Namespace, log: Log, warnings: list[str]
) -> dict[str, Any]:
    started: dict[str, int] = {}
    epmd_before = bool(_pgrep("epmd"))
    epmd_ours = sysd.broker == "rabbit" and not epmd_before
    out: dict[str, Any] = {"label": sysd.label, "nodes": sysd.nodes}
    t0 = time.monotonic()
    try:
        started = _start(sysd, peers, epmd_before, log)
        out["server_pids"] = started
        log(f"{sysd.key}: up in {time.monotonic() - t0:.1f}s, pids {started}")
        watch = started
        tmo = a.max_seconds * 2 + 120
        if sysd.broker == "rabbit":
            env = dict(os.environ, NODE_PATH=str(peers / "node" / "node_modules"))
            url = f"amqp://guest:guest@127.0.0.1:{sysd.client_ports[0]}/"
            base = ["node", str(RABBIT_JS)]
            common = ["--url", url, "--group-size", str(sysd.nodes), "--size", str(a.size)]
            common += ["--max-seconds", str(a.max_seconds)]
            cons = ["--consumers", str(a.consumers), "--prefetch", str(a.prefetch)]
            cons += ["--ack-every", str(a.ack_every)]

            def setup() -> None:
                client_phase([*base, "setup", *common], peers=peers, server_pids=watch,
                             timeout=120, idle_wait=0, env=env, measure_cpu=False)  # fmt: skip

            pub_cmd = [*base, "pub", *common, "--count", str(a.count), "--window", "2000"]
            drain_cmd = [*base, "drain", *common, *cons, "--count", str(a.count)]

            def lat_cmd(rate: float) -> list[str]:
                return [*base, "lat", *common, *cons, "--rate", str(rate),
                        "--duration", str(a.duration), "--count", str(a.count)]  # fmt: skip

        else:
            env = None
            qb = str(build_queuebench(peers, log))
            url = f"nats://127.0.0.1:{sysd.client_ports[0]}"
            setup_out = client_phase(
                [qb, "-mode", "setup", "-s", url, "-replicas", str(sysd.nodes)],
                peers=peers, server_pids=watch, timeout=120, idle_wait=0, measure_cpu=False,
            )  # fmt: skip
            leader = str(setup_out.get("stream_leader") or "")
            if sysd.nodes > 1 and (m := re.fullmatch(r"n([123])", leader)):
                url = f"nats://127.0.0.1:{sysd.client_ports[int(m.group(1)) - 1]}"
            out["stream_leader"] = leader
            out["consumer_leader"] = setup_out.get("consumer_leader")
            base = [qb, "-s", url, "-replicas", str(sysd.nodes), "-size", str(a.size)]
            base += ["-max", str(a.max_seconds)]
            cons = ["-consumers", str(a.consumers), "-batch", str(a.batch)]
            if a.nats_acksync:
                cons.append("-acksync")

            def setup() -> None:
                client_phase([*base, "-mode", "setup"], peers=peers, server_pids=watch,
                             timeout=120, idle_wait=0, measure_cpu=False)  # fmt: skip

            pub_cmd = [*base, "-mode", "pub", "-count", str(a.count), "-inflight", "4000"]
            drain_cmd = [*base, "-mode", "drain", *cons, "-count", str(a.count)]

            def lat_cmd(rate: float) -> list[str]:
                return [*base, "-mode", "lat", *cons, "-rate", str(rate),
                        "-duration", str(a.duration), "-count", str(a.count)]  # fmt: skip

        def phase(name: str, cmd: list[str]) -> dict[str, Any]:
            res = client_phase(cmd, peers=peers, server_pids=watch, timeout=tmo,
                               idle_wait=a.idle_wait, env=env)  # fmt: skip
            _phase_note(res, f"{sysd.key} {name}", warnings)
            return res

        pub: dict[str, Any] = {}
        drain: dict[str, Any] = {}
        if "drain" in a.phases:
            setup()
            pub = phase("publish", pub_cmd)
            log(f"{sysd.key}: pre-published {pub.get('msgs_per_s', 0):,.0f} msg/s; draining")
            drain = phase("drain", drain_cmd)
            log(f"{sysd.key}: drain {drain.get('msgs_per_s', 0):,.0f} msg/s (consume + ack)")
        out["publish"], out["drain"], out["latency"] = pub, drain, {}
        for rate in a.rates if "latency" in a.phases else ():
            setup()
            lat = phase(f"latency@{rate:g}", lat_cmd(rate))
            e2e = lat.get("latency_publish_to_ack", {})
            log(
                f"{sysd.key}: latency at {rate:g}/s: achieved {lat.get('achieved_rate', 0):,.0f}"
                f"/s p50 {e2e.get('p50_ms')} p99 {e2e.get('p99_ms')} ms"
            )
            out["latency"][f"{rate:g}"] = lat
    finally:
        _stop(sysd, peers, started, epmd_ours, log)
        log(f"{sysd.key}: stopped")
    out["seconds"] = round(time.monotonic() - t0, 1)
    if drain.get("acked", 0) < drain.get("target", 0):
        warnings.append(f"{sysd.key} drain: acked {drain.get('acked')} of {drain.get('target')}")
    left = drain.get("ready_after_close", drain.get("stream_msgs_after"))
    if left:
        warnings.append(f"{sysd.key} drain: {left} messages left in the queue after the drain")
    return out


# ----------------------------------------------------------------------------- API


def _versions(peers: Path) -> dict[str, str]:
    def cmd(c: Sequence[str]) -> str:
        try:
            return subprocess.run(list(c), capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    deb = cmd(["dpkg-query", "-W", "-f=${Package} ${Version}\\n", "rabbitmq-server",
               "erlang-base", "nats-server", "golang-github-nats-io-go-nats-dev"])  # fmt: skip
    out = dict(line.split(" ", 1) for line in deb.splitlines() if " " in line)
    out["node"] = cmd(["node", "--version"]).strip()
    with contextlib.suppress(OSError, ValueError):
        pkg = json.loads((peers / "node/node_modules/amqplib/package.json").read_text())
        out["amqplib"] = pkg["version"]
    return out


def run(
    systems: Sequence[str] = ("rabbit3", "nats3"),
    *,
    size: int = 1120,
    count: int = 100_000,
    consumers: int = 4,
    prefetch: int = 500,
    ack_every: int = 1,
    batch: int = 500,
    rates: Sequence[float] = (1000.0,),
    duration: float = 10.0,
    max_seconds: float = 60.0,
    idle_wait: int = 30,
    nats_acksync: bool = False,
    peers_dir: str | os.PathLike[str] = DEFAULT_PEERS,
    lock_wait: float = 600.0,
    log: Log | None = _log,
    phases: Sequence[str] = ("drain", "latency"),
) -> dict[str, Any]:
    """Run the work-queue peers; returns {"systems": {key: ...}, "machine": ..., ...}.
    phases: "drain" (pre-publish, then drain) and/or "latency" (one run per rate)."""
    say: Log = log or (lambda _m: None)
    peers = Path(peers_dir).resolve()
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {sorted(SYSTEMS)}")
    for need in ("start_rabbit_cluster.sh", "stop_pid.sh", "pbcommon.py", "node/node_modules"):
        if not (peers / need).exists():
            raise PeerError(f"{peers}/{need} missing: run ../shared/peers/install.sh {peers}")
    a = argparse.Namespace(
        size=size, count=count, consumers=consumers, prefetch=prefetch, ack_every=ack_every,
        batch=batch, rates=list(rates), duration=duration, max_seconds=max_seconds,
        idle_wait=idle_wait, nats_acksync=nats_acksync, phases=list(phases),
    )  # fmt: skip
    warnings: list[str] = []
    result: dict[str, Any] = {
        "params": {k: v for k, v in vars(a).items()},
        "machine": machine_limits(peers),
        "versions": _versions(peers),
        "systems": {},
        "warnings": warnings,
    }
    say(f"machine: {result['machine']}")
    with signals_raise(), _peers_lock(peers, lock_wait, say):
        for key in systems:
            result["systems"][key] = bench_system(SYSTEMS[key], peers, a, say, warnings)
    raw = peers / "raw" / f"queue_peers-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(result, indent=1))
    result["raw"] = str(raw)
    return result


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per system: the figures the tables and ratios use."""
    rows = []
    cpus = result.get("machine", {}).get("cpus") or 2
    for key, s in result.get("systems", {}).items():
        d = s.get("drain", {})
        row: dict[str, Any] = {
            "key": key,
            "label": s.get("label"),
            "publish_msgs_per_s": round(s.get("publish", {}).get("msgs_per_s", 0), 1),
            "drain_msgs_per_s": round(d.get("msgs_per_s", 0), 1),
            "drain_acked": d.get("acked"),
            "drain_cpu": d.get("cpu"),
            "drain_limited_by": limited_by(d.get("cpu"), cpus),
            "latency": {},
        }
        for rate, lat in s.get("latency", {}).items():
            e2e = lat.get("latency_publish_to_ack", {})
            row["latency"][rate] = {
                "achieved_rate": round(lat.get("achieved_rate", 0), 1),
                "p50_ms": e2e.get("p50_ms"),
                "p99_ms": e2e.get("p99_ms"),
                "p999_ms": e2e.get("p999_ms"),
                "max_ms": e2e.get("max_ms"),
                "cpu": lat.get("cpu"),
                "limited_by": limited_by(lat.get("cpu"), cpus),
            }
        rows.append(row)
    return rows


def _cpu_text(cpu: dict[str, Any] | None) -> str:
    if not cpu:
        return "-"
    servers = "/".join(f"{v:.0f}" for v in (cpu.get("servers_pct") or {}).values() if v is not None)
    return (
        f"srv {servers} cli {cpu.get('client_pct') or 0:.0f} "
        f"busy {cpu.get('machine_busy_pct') or 0:.0f}% "
        f"oth {cpu.get('other_user_procs_pct') or 0:.0f}"
    )


def format_table(result: dict[str, Any]) -> str:
    p, m = result.get("params", {}), result.get("machine", {})
    fsyncs = m.get("fdatasync_4k_per_s") or 0
    lines = [
        f"work queue, {p.get('consumers')} consumers, {p.get('size')} B messages, "
        f"count {p.get('count'):,}; machine: {m.get('cpus')} CPUs, "
        f"{fsyncs:,.0f} fdatasync/s (4 KiB)",
        f"{'system':<52}{'pre-pub/s':>10}{'drain/s':>10}{'/fsync':>8}  CPU % during drain "
        "(100 = 1 core)",
    ]
    rows = summary_rows(result)
    for r in rows:
        ratio = r["drain_msgs_per_s"] / fsyncs if fsyncs else 0
        lines.append(
            f"{r['label']:<52}{r['publish_msgs_per_s']:>10,.0f}{r['drain_msgs_per_s']:>10,.0f}"
            f"{ratio:>8.1f}  {_cpu_text(r['drain_cpu'])}"
        )
        lines.append(f"{'':<52}  drain limited by: {r['drain_limited_by']}")
    lines.append(f"{'latency publish -> ack':<36}{'rate':>7}{'achieved':>10}{'p50 ms':>9}"
                 f"{'p99 ms':>9}{'p99.9 ms':>10}  CPU %")  # fmt: skip
    for r in rows:
        for rate, lt in r["latency"].items():
            lines.append(
                f"{r['key']:<36}{rate:>7}{lt['achieved_rate']:>10,.0f}{lt['p50_ms'] or -1:>9.2f}"
                f"{lt['p99_ms'] or -1:>9.2f}{lt['p999_ms'] or -1:>10.2f}  {_cpu_text(lt['cpu'])}"
            )
    lines.append(
        "ack: "
        + ("per message" if p.get("ack_every", 1) <= 1 else f"every {p.get('ack_every')}")
        + f"; rabbit prefetch {p.get('prefetch')}, nats pull batch {p.get('batch')}"
        + ("; nats AckSync" if p.get("nats_acksync") else "; nats +ACK one-way")
    )
    lines.append("caveat: NATS 2.9 acks before fsync; RabbitMQ quorum fsyncs its WAL; AMQP/NATS "
                 "acks are one-way, a Laminar accept is a committed HTTP call")  # fmt: skip
    lines.extend("WARNING: " + w for w in result.get("warnings", []))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    ap.add_argument("--systems", default="rabbit3,nats3", help="rabbit3,rabbit1,nats3,nats1")
    ap.add_argument("--size", type=int, default=1120)
    ap.add_argument("--count", type=int, default=100_000, help="messages pre-published")
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--prefetch", type=int, default=500, help="RabbitMQ prefetch per consumer")
    ap.add_argument("--ack-every", type=int, default=1, help="RabbitMQ: 1 = per-message ack")
    ap.add_argument("--batch", type=int, default=500, help="NATS pull batch per request")
    ap.add_argument("--nats-acksync", action="store_true", help="NATS: wait for each ack reply")
    ap.add_argument("--rates", default="1000", help="latency phase rates, msg/s, comma list")
    ap.add_argument("--duration", type=float, default=10.0, help="latency phase seconds")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="cap per phase")
    ap.add_argument("--idle-wait", type=int, default=30, help="max s to wait for an idle machine")
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS))
    ap.add_argument("--json", action="store_true", help="print the result as JSON, last line")
    a = ap.parse_args(argv)
    try:
        res = run(
            [s.strip() for s in a.systems.split(",") if s.strip()],
            size=a.size, count=a.count, consumers=a.consumers, prefetch=a.prefetch,
            ack_every=a.ack_every, batch=a.batch,
            rates=[float(r) for r in a.rates.split(",") if r.strip()], duration=a.duration,
            max_seconds=a.max_seconds, idle_wait=a.idle_wait, nats_acksync=a.nats_acksync,
            peers_dir=a.peers_dir,
        )  # fmt: skip
    except PeerError as e:
        print(f"queue_peers: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("queue_peers: interrupted (servers stopped)", file=sys.stderr)
        return 130
    print(format_table(res))
    if a.json:
        print(json.dumps(res))
    return 0


QUEUEBENCH_GO = r"""
// queuebench: NATS JetStream work-queue client for bench/queue_peers.py (issue 6).
// Stream with retention workqueue (file storage, -replicas), one durable pull consumer with
// AckExplicit shared by -consumers clients (one connection each). Each client keeps pull
// requests of -batch messages outstanding (a new one when half of the previous arrived) and acks
// every message individually (+ACK, one-way like AMQP basic.ack; -acksync waits for the
// server's reply to each ack). Modes:
//
//	setup  (re)create the stream and the durable consumer, print leaders
//	pub    PublishAsync -count messages of -size bytes, -inflight PubAcks outstanding
//	drain  consume+ack what the stream holds (at most -count); msgs/s = acked / elapsed
//	lat    the consumers plus one publisher at -rate msg/s for -duration s with a timestamp in
//	       the body; latency = time the consumer acks - time just before publish (one clock)
//
// Every loop is bounded by -count and -max. Prints GO / END around the measured phase and
// one line "RESULT {json}".
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

var (
	mode      = flag.String("mode", "drain", "setup|pub|drain|lat")
	url       = flag.String("s", "nats://127.0.0.1:4222", "server URL")
	stream    = flag.String("stream", "WQ", "stream")
	subject   = flag.String("subject", "wq.jobs", "subject")
	durable   = flag.String("durable", "WQC", "durable consumer")
	replicas  = flag.Int("replicas", 1, "stream replicas")
	size      = flag.Int("size", 1120, "message size")
	count     = flag.Int("count", 100000, "messages")
	maxSec    = flag.Float64("max", 60, "max seconds per phase")
	inflight  = flag.Int("inflight", 4000, "PubAcks outstanding (pub)")
	consumers = flag.Int("consumers", 4, "competing consumers")
	batch     = flag.Int("batch", 500, "pull batch per request")
	maxAckP   = flag.Int("max-ack-pending", 20000, "consumer max_ack_pending")
	ackSync   = flag.Bool("acksync", false, "wait for the server's reply to every ack")
	rate      = flag.Float64("rate", 2000, "msgs/s (lat)")
	duration  = flag.Float64("duration", 10, "seconds (lat)")
	warmup    = flag.Int("warmup", 200, "warm-up messages (lat)")
)

func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return -1
	}
	k := int(q/100*float64(len(v)-1) + 0.5)
	return float64(int64(v[k]*1000)) / 1000
}

func summary(v []float64) map[string]interface{} {
	sort.Float64s(v)
	if len(v) == 0 {
		return map[string]interface{}{"n": 0}
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return map[string]interface{}{"n": len(v), "p50_ms": pct(v, 50), "p90_ms": pct(v, 90),
		"p99_ms": pct(v, 99), "p999_ms": pct(v, 99.9), "max_ms": pct(v, 100),
		"mean_ms": float64(int64(s/float64(len(v))*1000)) / 1000}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func connect() *nats.Conn {
	nc, err := nats.Connect(*url, nats.MaxReconnects(-1))
	must(err)
	return nc
}

func setup(res map[string]interface{}) {
	nc := connect()
	defer nc.Close()
	js, err := nc.JetStream()
	must(err)
	_ = js.DeleteStream(*stream)
	si, err := js.AddStream(&nats.StreamConfig{Name: *stream, Subjects: []string{*subject},
		Retention: nats.WorkQueuePolicy, Storage: nats.FileStorage, Replicas: *replicas})
	must(err)
	ci, err := js.AddConsumer(*stream, &nats.ConsumerConfig{Durable: *durable,
		AckPolicy: nats.AckExplicitPolicy, AckWait: 30 * time.Second, MaxWaiting: 512,
		MaxAckPending: *maxAckP, DeliverPolicy: nats.DeliverAllPolicy, Replicas: *replicas})
	must(err)
	res["stream_leader"], res["consumer_leader"] = "", ""
	for i := 0; i < 50; i++ { // leaders may take a moment in the cluster
		si, _ = js.StreamInfo(*stream)
		ci, _ = js.ConsumerInfo(*stream, *durable)
		if si != nil && ci != nil && (si.Cluster == nil || si.Cluster.Leader != "") &&
			(ci.Cluster == nil || ci.Cluster.Leader != "") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if si != nil && si.Cluster != nil {
		res["stream_leader"] = si.Cluster.Leader
	}
	if ci != nil && ci.Cluster != nil {
		res["consumer_leader"] = ci.Cluster.Leader
	}
	res["retention"] = "workqueue"
	res["replicas"] = *replicas
}

func pub(res map[string]interface{}) {
	nc := connect()
	defer nc.Close()
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(*inflight))
	must(err)
	payload := make([]byte, *size)
	var acked, errs int64
	futs := make(chan nats.PubAckFuture, *inflight*2)
	done := make(chan struct{})
	go func() {
		for f := range futs {
			select {
			case <-f.Ok():
				atomic.AddInt64(&acked, 1)
			case <-f.Err():
				atomic.AddInt64(&errs, 1)
			}
		}
		close(done)
	}()
	fmt.Println("GO")
	t0 := time.Now()
	deadline := t0.Add(time.Duration(*maxSec * float64(time.Second)))
	sent := 0
	for sent < *count {
		if sent%1024 == 0 && time.Now().After(deadline) {
			break
		}
		f, err := js.PublishAsync(*subject, payload)
		if err != nil {
			atomic.AddInt64(&errs, 1)
			continue
		}
		futs <- f
		sent++
	}
	close(futs)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
	}
	el := time.Since(t0).Seconds()
	fmt.Println("END")
	a := atomic.LoadInt64(&acked)
	res["sent"], res["acked"], res["elapsed_s"] = sent, a, el
	res["errors"] = atomic.LoadInt64(&errs)
	res["msgs_per_s"] = float64(a) / el
	res["MB_per_s"] = float64(a) * float64(*size) / el / 1e6
	res["inflight"] = *inflight
}

// consumer: one connection, pull requests of -batch kept outstanding, one ack per message.
type consumer struct {
	nc       *nats.Conn
	ch       chan *nats.Msg
	n        int64
	ackErrs  int64
	statuses map[string]int
}

func newConsumer() *consumer {
	c := &consumer{nc: connect(), ch: make(chan *nats.Msg, 4**batch+64),
		statuses: map[string]int{}}
	return c
}

func (c *consumer) run(stop <-chan struct{}, handle func(m *nats.Msg)) {
	inbox := nats.NewInbox()
	sub, err := c.nc.ChanSubscribe(inbox, c.ch)
	must(err)
	defer sub.Unsubscribe()
	reqSubj := "$JS.API.CONSUMER.MSG.NEXT." + *stream + "." + *durable
	expires := time.Second
	req := []byte(fmt.Sprintf(`{"batch":%d,"expires":%d}`, *batch, expires.Nanoseconds()))
	ack := []byte("+ACK")
	pending := 0
	safety := time.NewTicker(3 * expires)
	defer safety.Stop()
	for {
		if pending <= *batch/2 {
			must(c.nc.PublishRequest(reqSubj, inbox, req))
			pending += *batch
		}
		select {
		case <-stop:
			return
		case <-safety.C: // a lost status message must not stall the client
			if pending > *batch {
				pending = *batch
			}
		case m := <-c.ch:
			if len(m.Data) == 0 && m.Header != nil && m.Header.Get("Status") != "" {
				c.statuses[m.Header.Get("Status")]++
				p, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages"))
				if err == nil {
					pending -= p
				} else {
					pending = 0
				}
				if pending < 0 {
					pending = 0
				}
				continue
			}
			pending--
			handle(m)
			if *ackSync {
				if _, err := c.nc.Request(m.Reply, ack, 5*time.Second); err != nil {
					c.ackErrs++
				}
			} else if err := c.nc.Publish(m.Reply, ack); err != nil {
				c.ackErrs++
			}
			c.n++
		}
	}
}

func streamMsgs(js nats.JetStreamContext) int64 {
	si, err := js.StreamInfo(*stream)
	if err != nil {
		return -1
	}
	return int64(si.State.Msgs)
}

func consumerNotes(res map[string]interface{}, cs []*consumer) {
	per := make([]int64, len(cs))
	st := map[string]int{}
	var ackErrs int64
	for i, c := range cs {
		per[i] = c.n
		ackErrs += c.ackErrs
		for k, v := range c.statuses {
			st[k] += v
		}
	}
	res["per_consumer"], res["ack_errors"], res["pull_statuses"] = per, ackErrs, st
	res["consumers"], res["batch"] = *consumers, *batch
	if *ackSync {
		res["ack"] = "per message, AckSync (waits for the server's reply)"
	} else {
		res["ack"] = "per message, +ACK one-way (like AMQP basic.ack)"
	}
}

func drain(res map[string]interface{}) {
	nc := connect()
	defer nc.Close()
	js, err := nc.JetStream()
	must(err)
	before := streamMsgs(js)
	total := int64(*count)
	if before < total {
		total = before
	}
	cs := make([]*consumer, *consumers)
	for i := range cs {
		cs[i] = newConsumer()
	}
	var got, nbytes int64
	var tLast time.Time
	var once sync.Once
	done := make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	fmt.Println("GO")
	t0 := time.Now()
	for _, c := range cs {
		wg.Add(1)
		go func(c *consumer) {
			defer wg.Done()
			c.run(stop, func(m *nats.Msg) {
				atomic.AddInt64(&nbytes, int64(len(m.Data)))
				if atomic.AddInt64(&got, 1) >= total {
					once.Do(func() { tLast = time.Now(); close(done) })
				}
			})
		}(c)
	}
	select {
	case <-done:
	case <-time.After(time.Duration(*maxSec * float64(time.Second))):
		tLast = time.Now()
	}
	close(stop)
	wg.Wait()
	for _, c := range cs { // the acks reached the server
		_ = c.nc.FlushTimeout(10 * time.Second)
	}
	tFlushed := time.Now()
	fmt.Println("END")
	el := tLast.Sub(t0).Seconds()
	after := streamMsgs(js)
	for i := 0; i < 100 && after > 0; i++ {
		time.Sleep(100 * time.Millisecond)
		after = streamMsgs(js)
	}
	tEmpty := time.Now()
	for _, c := range cs {
		c.nc.Close()
	}
	n := atomic.LoadInt64(&got)
	res["stream_msgs"], res["target"], res["acked"], res["elapsed_s"] = before, total, n, el
	res["msgs_per_s"] = float64(n) / el
	res["MB_per_s"] = float64(nbytes) / el / 1e6
	res["elapsed_incl_flush_s"] = tFlushed.Sub(t0).Seconds()
	res["msgs_per_s_incl_flush"] = float64(n) / tFlushed.Sub(t0).Seconds()
	res["stream_msgs_after"] = after
	res["until_stream_empty_s"] = tEmpty.Sub(t0).Seconds()
	consumerNotes(res, cs)
}

func lat(res map[string]interface{}) {
	cs := make([]*consumer, *consumers)
	for i := range cs {
		cs[i] = newConsumer()
	}
	var mu sync.Mutex
	e2e := make([]float64, 0, int(*rate**duration)+1)
	var got int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func(c *consumer) {
			defer wg.Done()
			c.run(stop, func(m *nats.Msg) {
				now := time.Now().UnixNano()
				atomic.AddInt64(&got, 1)
				if len(m.Data) < 12 {
					return
				}
				ts := int64(binary.LittleEndian.Uint64(m.Data))
				if int(binary.LittleEndian.Uint32(m.Data[8:])) >= *warmup {
					mu.Lock()
					e2e = append(e2e, float64(now-ts)/1e6)
					mu.Unlock()
				}
			})
		}(c)
	}
	pnc := connect()
	defer pnc.Close()
	js, err := pnc.JetStream(nats.PublishAsyncMaxPending(1 << 20))
	must(err)
	var conf []float64
	var cmu sync.Mutex
	var perrs int64
	send := func(seq int, measure bool) {
		b := make([]byte, *size)
		ts := time.Now()
		binary.LittleEndian.PutUint64(b, uint64(ts.UnixNano()))
		binary.LittleEndian.PutUint32(b[8:], uint32(seq))
		f, err := js.PublishAsync(*subject, b)
		if err != nil {
			atomic.AddInt64(&perrs, 1)
			return
		}
		go func() {
			select {
			case <-f.Ok():
				if measure {
					cmu.Lock()
					conf = append(conf, float64(time.Since(ts).Nanoseconds())/1e6)
					cmu.Unlock()
				}
			case <-f.Err():
				atomic.AddInt64(&perrs, 1)
			case <-time.After(30 * time.Second):
				atomic.AddInt64(&perrs, 1)
			}
		}()
	}
	for i := 0; i < *warmup; i++ {
		send(i, false)
		time.Sleep(time.Millisecond)
	}
	tw := time.Now()
	for atomic.LoadInt64(&got) < int64(*warmup) && time.Since(tw) < 10*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	n := int(*rate * *duration)
	if n > *count {
		n = *count
	}
	fmt.Println("GO")
	t0 := time.Now()
	hard := t0.Add(time.Duration((*duration + *maxSec) * float64(time.Second)))
	sent := 0
	for sent < n && time.Now().Before(hard) {
		sched := t0.Add(time.Duration(float64(sent) / *rate * float64(time.Second)))
		if d := time.Until(sched); d > 0 {
			time.Sleep(d)
		}
		send(*warmup+sent, true)
		sent++
	}
	for ts := time.Now(); time.Since(ts) < 30*time.Second; time.Sleep(2 * time.Millisecond) {
		mu.Lock()
		k := len(e2e)
		mu.Unlock()
		if k >= sent {
			break
		}
	}
	el := time.Since(t0).Seconds()
	fmt.Println("END")
	close(stop)
	wg.Wait()
	for _, c := range cs {
		_ = c.nc.FlushTimeout(5 * time.Second)
		c.nc.Close()
	}
	mu.Lock()
	cmu.Lock()
	res["target_rate"], res["duration_s"], res["sent"] = *rate, *duration, sent
	res["received"], res["elapsed_s"] = len(e2e), el
	res["achieved_rate"] = float64(len(e2e)) / el
	res["latency_publish_to_ack"] = summary(e2e)
	res["latency_publish_to_puback"] = summary(conf)
	res["publish_errors"] = perrs
	res["warmup_msgs"] = *warmup
	cmu.Unlock()
	mu.Unlock()
	consumerNotes(res, cs)
}

func main() {
	flag.Parse()
	res := map[string]interface{}{"mode": *mode, "size": *size, "client": "nats.go 1.22.1 (Go)"}
	go func() { // hard bound on the whole run
		time.Sleep(time.Duration((3**maxSec + *duration + 120) * float64(time.Second)))
		fmt.Fprintln(os.Stderr, "hard time limit reached")
		os.Exit(3)
	}()
	switch *mode {
	case "setup":
		setup(res)
	case "pub":
		pub(res)
	case "drain":
		drain(res)
	case "lat":
		lat(res)
	default:
		must(fmt.Errorf("unknown mode %q", *mode))
	}
	b, _ := json.Marshal(res)
	fmt.Println("RESULT " + string(b))
}
"""


if __name__ == "__main__":
    sys.exit(main())
