"""Laminar brokers against NATS JetStream on this machine, in one sitting.

For each configuration (1 broker RF 1, 3 brokers RF 1, 3 brokers RF 3) a fresh local cluster
of real `laminar serve` processes runs `laminar bench`: publish `--count` records of `--size`
bytes (each append acknowledged only once committed: a majority of the partition's replicas
have it, fdatasync'd with the default fsync policy `always`), consume them back, then publish
at a fixed `--rate` and report latency percentiles. Then NATS JetStream runs the same
workload with its Go reference client (`nats_peer.py`, R1 and R3 — note NATS 2.9 acknowledges
before any fsync), and the ratios are printed. Also measured in the same run, as the
machine's limits: small fdatasync'd writes per second and sequential fdatasync'd MB/s on the
data disk, and loopback TCP MB/s. With `--tls both` (the default) each Laminar configuration
runs twice, plain HTTP and then HTTPS with mutual TLS between the brokers (certificates
made by `laminar local-cluster`'s CA), so that TLS's cost is measured in the same sitting.

    python3 bench/broker_bench.py                       # the full run (about 5 minutes)
    python3 bench/broker_bench.py --count 200000 --skip-nats --latency-seconds 3   # quick
    python3 bench/broker_bench.py --count 200000 --skip-nats --configs 3:3 --tls both

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "broker"))

from machine import fdatasync_per_s  # noqa: E402
from queue_peers import signals_raise  # noqa: E402

from laminar.local_cluster import LocalCluster  # noqa: E402

PREFIX = "127.0.3"
CONFIGS = [(1, 1), (3, 1), (3, 3)]  # (brokers, replication factor)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- machine limits ------------------------------------------------------------------------


def disk_limits(directory: Path, seconds: float = 2.0) -> dict[str, float]:
    syncs_per_s = fdatasync_per_s(directory, seconds)
    path = directory / "disk-probe"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        chunk = os.urandom(1 << 20)
        started = time.perf_counter()
        written = 0
        while written < 256 << 20 and time.perf_counter() - started < 10:
            os.write(fd, chunk)
            written += len(chunk)
        os.fdatasync(fd)
        seq_mb_s = written / (time.perf_counter() - started) / 1e6
    finally:
        os.close(fd)
        path.unlink()
    return {
        "fdatasync_4k_per_s": syncs_per_s,
        "sequential_fdatasync_mb_s": round(seq_mb_s, 1),
    }


def loopback_mb_s(total_bytes: int = 512 << 20) -> float:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        connection, _ = server.accept()
        with connection:
            while connection.recv(1 << 20):
                pass

    thread = threading.Thread(target=sink)
    thread.start()
    chunk = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as client:
        started = time.perf_counter()
        sent = 0
        while sent < total_bytes:
            client.sendall(chunk)
            sent += len(chunk)
    thread.join()
    server.close()
    return round(sent / (time.perf_counter() - started) / 1e6, 1)


# ---- Laminar ---------------------------------------------------------------------------------


def laminar_bench(cluster: LocalCluster, *arguments: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "laminar", "bench", *arguments, "--json", "--no-progress"]
    command += ["--brokers", ",".join(cluster.urls)]
    if cluster.ca_file is not None:
        command += ["--ca-file", str(cluster.ca_file)]
    token_file = getattr(cluster, "token_file", None)  # the local cluster's admin token
    if token_file is not None:
        command += ["--token-file", str(token_file)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if output.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output.stdout}\n{output.stderr}")
    result: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    return result


def run_laminar(
    args: argparse.Namespace, brokers: int, rf: int, root: Path, tls: bool = False
) -> dict[str, Any]:
    cluster = LocalCluster(
        root / f"laminar-{brokers}-{rf}{'-tls' if tls else ''}",
        brokers,
        prefix=PREFIX,
        fsync=args.fsync,
        tls=tls,
    )
    log(f"laminar: {brokers} broker(s), RF {rf}, fsync {args.fsync}, {'TLS' if tls else 'plain'}")
    try:
        cluster.start()  # in the try: a start that fails half-way stops what it started
        common = ["--size", str(args.size), "--partitions", str(args.partitions)]
        common += ["--replication-factor", str(rf)]
        produce = laminar_bench(
            cluster, "produce", "--topic", "tput", "--count", str(args.count), *common,
            "--batch", str(args.batch), "--in-flight", str(args.in_flight),
        )  # fmt: skip
        log(f"  publish {produce['msgs_per_s']:,.0f} msg/s {produce['mb_per_s']} MB/s")
        consume = laminar_bench(cluster, "consume", "--topic", "tput")
        log(f"  consume {consume['msgs_per_s']:,.0f} msg/s")
        latency = laminar_bench(
            cluster, "produce", "--topic", "latency", "--rate", str(args.rate),
            "--seconds", str(args.latency_seconds), "--linger-ms", str(args.linger_ms), *common,
        )  # fmt: skip
        log(
            f"  latency at {args.rate}/s: p50 {latency['latency_p50_ms']} ms "
            f"p99 {latency['latency_p99_ms']} ms"
        )
    finally:
        cluster.stop()
        shutil.rmtree(cluster.data_dir, ignore_errors=True)  # GBs of segments: free them now
    return {
        "brokers": brokers,
        "replication_factor": rf,
        "tls": tls,
        "publish_msgs_per_s": produce["msgs_per_s"],
        "publish_mb_per_s": produce["mb_per_s"],
        "publish_records": produce["records"],
        "batch_latency_p50_ms": produce["batch_latency_p50_ms"],
        "consume_msgs_per_s": consume["msgs_per_s"],
        "consume_mb_per_s": consume["mb_per_s"],
        "consume_records": consume["records"],
        "latency_rate": args.rate,
        "latency_achieved_rate": latency["achieved_rate"],
        "latency_p50_ms": latency["latency_p50_ms"],
        "latency_p99_ms": latency["latency_p99_ms"],
        "latency_p999_ms": latency["latency_p999_ms"],
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1120)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--linger-ms", type=float, default=3.0, help="fixed-rate batching")
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--peers-dir", default=str(HERE.parent / ".peers"))
    parser.add_argument(
        "--tls",
        default="both",
        choices=["off", "on", "both"],
        help="Laminar plain, with TLS (HTTPS, mutual TLS between brokers), or both in turn",
    )
    parser.add_argument(
        "--configs",
        default=",".join(f"{b}:{rf}" for b, rf in CONFIGS),
        help="the Laminar configurations, BROKERS:RF,... (default: %(default)s)",
    )
    args = parser.parse_args()
    configs = [tuple(int(n) for n in c.split(":")) for c in args.configs.split(",") if c]

    root = Path(tempfile.mkdtemp(prefix="laminar-bench-"))
    results: dict[str, Any] = {
        "size": args.size,
        "count": args.count,
        "fsync": args.fsync,
        "linger_ms": args.linger_ms,
    }
    try:
        with signals_raise():  # SIGTERM / SIGHUP: the finally blocks stop and remove all
            results["machine"] = {**disk_limits(root), "loopback_tcp_mb_s": loopback_mb_s()}
            log(f"machine: {results['machine']}")
            for brokers, rf in configs:
                key = f"laminar_{brokers}b_rf{rf}"
                if args.tls in ("off", "both"):
                    results[key] = run_laminar(args, brokers, rf, root)
                if args.tls in ("on", "both"):
                    results[key + "_tls"] = run_laminar(args, brokers, rf, root, True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.skip_nats:
        import nats_peer

        log("NATS JetStream (R1 and R3) with its Go client")
        nats = nats_peer.run(
            args.size, args.count, args.rate, args.latency_seconds, "both", args.peers_dir
        )
        results["nats_r1"], results["nats_r3"] = nats["nats_r1"], nats["nats_r3"]
        results["nats_versions"] = nats.get("versions")
    r1 = results.get("laminar_1b_rf1") or results.get("laminar_1b_rf1_tls") or {}
    r3 = results.get("laminar_3b_rf3") or results.get("laminar_3b_rf3_tls") or {}
    machine = results["machine"]
    results["ratios"] = {
        "rf1_publish_mb_s_vs_disk_sequential": ratio(
            r1.get("publish_mb_per_s"), machine["sequential_fdatasync_mb_s"]
        ),
        "rf3_publish_mb_s_vs_loopback": ratio(
            r3.get("publish_mb_per_s"), machine["loopback_tcp_mb_s"]
        ),
    }
    for brokers, rf in configs:
        plain = results.get(f"laminar_{brokers}b_rf{rf}")
        tls = results.get(f"laminar_{brokers}b_rf{rf}_tls")
        if plain and tls:
            results["ratios"][f"{brokers}b_rf{rf}_tls_publish_vs_plain"] = ratio(
                tls["publish_msgs_per_s"], plain["publish_msgs_per_s"]
            )
            results["ratios"][f"{brokers}b_rf{rf}_tls_p99_vs_plain"] = ratio(
                tls["latency_p99_ms"], plain["latency_p99_ms"]
            )
    if "nats_r1" in results and r1 and r3:
        n1, n3 = results["nats_r1"], results["nats_r3"]
        results["ratios"].update(
            {
                "rf3_publish_vs_nats_r3 (target >= 2)": ratio(
                    r3["publish_msgs_per_s"], n3["publish_msgs_per_s"]
                ),
                "rf3_p99_vs_nats_r3_p99 (target <= 1)": ratio(
                    r3["latency_p99_ms"], n3["latency_p99_ms"]
                ),
                "rf1_publish_vs_nats_r1 (target >= 1)": ratio(
                    r1["publish_msgs_per_s"], n1["publish_msgs_per_s"]
                ),
                "rf1_consume_vs_nats_r1 (target >= 1)": ratio(
                    r1["consume_msgs_per_s"], n1["consume_msgs_per_s"]
                ),
            }
        )
    rows = [("", "publish msg/s", "MB/s", "consume msg/s", "p50 ms", "p99 ms", "p99.9 ms")]
    names = [f"laminar_{b}b_rf{rf}{tls}" for b, rf in configs for tls in ("", "_tls")]
    for name in (*names, "nats_r1", "nats_r3"):
        if name in results:
            row = results[name]
            rows.append(
                (
                    name,
                    f"{row['publish_msgs_per_s']:,.0f}",
                    f"{row['publish_mb_per_s']:.1f}",
                    f"{row['consume_msgs_per_s']:,.0f}",
                    str(row["latency_p50_ms"]),
                    str(row["latency_p99_ms"]),
                    str(row["latency_p999_ms"]),
                )
            )
    for row in rows:
        print("  ".join(cell.rjust(16) for cell in row))
    for key, value in results["ratios"].items():
        print(f"{key:>44}: {value}")
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
