"""The XDP router's cost and benefit, on a veth pair between two network namespaces made here.

1. Packets/s through the veth, each way, with and without the router on the receiving end (a
   bounded UDP flood to a port no class claims, from one sender process); the run without the
   router is the machine limit the other is compared with.
2. UDP round-trip latency percentiles (an echo in the other namespace), with and without.
3. The CPU seconds a broker spends while a bounded flood of wrong-cluster gossip hits its
   gossip port, with and without the router (which drops it in the kernel). Target (issue 8):
   >= 90 % fewer broker CPU seconds with the router.

Needs root, clang, bpftool and libbpf-dev (as tests/xdp). Every flood is bounded in count and
time.

    python bench/xdp_bench.py [--packets 300000] [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.netns import Host, veth_pair  # noqa: E402
from tests.xdp.conftest import SECRET, bpffs, gossip_datagram  # noqa: E402

CLUSTER = "bench.xdp"
GOSSIP, OTHER, ECHO = 7072, 9999, 9998
TARGET_CPU_SAVED = 0.90
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

FLOOD = """
import socket, sys, time
payload, address, port = bytes.fromhex(sys.argv[1]), sys.argv[2], int(sys.argv[3])
count, limit = int(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent, start = 0, time.perf_counter()
while sent < count and time.perf_counter() - start < limit:
    for _ in range(500):
        try:
            s.sendto(payload, (address, port))
        except OSError:
            pass
    sent += 500
print(sent, time.perf_counter() - start)
"""

ECHO_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
s.settimeout(30)
try:
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)
except TimeoutError:
    pass
"""

PING = """
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
samples = []
for i in range(int(sys.argv[3])):
    start = time.perf_counter()
    s.sendto(b"x" * 64, (sys.argv[1], int(sys.argv[2])))
    try:
        s.recvfrom(2048)
    except TimeoutError:
        continue
    samples.append((time.perf_counter() - start) * 1e6)
print(json.dumps(samples))
"""


def rx_packets(host: Host) -> int:
    return int(host.run("cat", f"/sys/class/net/{host.iface}/statistics/rx_packets").stdout)


def flood(
    sender: Host, receiver: Host, port: int, payload: bytes, count: int, limit: float
) -> dict[str, float]:
    before = rx_packets(receiver)
    out = sender.run(sys.executable, "-c", FLOOD, payload.hex(), receiver.address, str(port),
                     str(count), str(limit)).stdout.split()  # fmt: skip
    sent, seconds = int(out[0]), float(out[1])
    received = rx_packets(receiver) - before
    return {"sent": sent, "received": received, "seconds": seconds,
            "received_per_s": received / seconds}  # fmt: skip


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    at = {"p50_us": 0.50, "p99_us": 0.99, "p999_us": 0.999}
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for name, q in at.items()}


def round_trips(client: Host, server: Host, count: int) -> dict[str, float]:
    echo = subprocess.Popen(
        ["ip", "netns", "exec", server.netns, sys.executable, "-c", ECHO_SERVER, server.address,
         str(ECHO)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        out = client.run(sys.executable, "-c", PING, server.address, str(ECHO), str(count))
        return percentiles(json.loads(out.stdout))
    finally:
        echo.kill()
        echo.wait()


def load(host: Host, pins: Path, obj: Path) -> None:
    host.run(sys.executable, "-m", "laminar.xdp", "--pin-dir", str(pins), "load", "--iface",
             host.iface, "--object", str(obj), "--cluster-id", CLUSTER)  # fmt: skip


def unload(host: Host, pins: Path) -> None:
    host.run(sys.executable, "-m", "laminar.xdp", "--pin-dir", str(pins), "unload", "--iface",
             host.iface)  # fmt: skip


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


SEEN = """
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
metric = 'laminar_swim_dropped_datagrams_total{reason="wrong_cluster"}'
found = re.search("^" + re.escape(metric) + r" (\\S+)$", text, re.M)
print(int(float(found.group(1))) if found else 0)
"""


def seen_by_broker(host: Host) -> int:
    """The wrong-cluster datagrams the broker read and dropped itself (the rest of the flood
    was dropped by the router, or overflowed the socket's receive queue)."""
    url = f"http://{host.address}:7070/metrics"
    return int(host.run(sys.executable, "-c", SEEN, url).stdout)


def broker_cpu_under_flood(
    sender: Host, receiver: Host, work: Path, count: int, limit: float
) -> dict[str, float]:
    """Broker CPU seconds while wrong-cluster gossip floods it, and while idle as long."""
    secret = work / "secret"
    secret.write_bytes(SECRET)
    data = Path(tempfile.mkdtemp(dir=work))
    broker = subprocess.Popen(
        ["ip", "netns", "exec", receiver.netns, sys.executable, "-m", "laminar", "serve",
         "--node-id", "b", "--data-dir", str(data), "--host", receiver.address,
         "--initial-nodes", "b", "--cluster-id", CLUSTER, "--secret-file", str(secret),
         "--allow-anonymous", "--workers", "1"],  # its metrics only are read; one process
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(3)  # started and settled
        start = cpu_s(broker.pid)
        flooded = flood(sender, receiver, GOSSIP, gossip_datagram("someone.else"), count, limit)
        busy = cpu_s(broker.pid) - start
        start = cpu_s(broker.pid)
        time.sleep(flooded["seconds"])
        idle = cpu_s(broker.pid) - start
        seen = seen_by_broker(receiver)
        return {"broker_cpu_s": busy, "idle_cpu_s": idle, "datagrams": flooded["sent"],
                "seconds": flooded["seconds"], "seen_by_broker": seen}  # fmt: skip
    finally:
        broker.terminate()
        broker.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packets", type=int, default=300_000, help="per flood, at most")
    parser.add_argument("--seconds", type=float, default=10.0, help="per flood, at most")
    parser.add_argument("--pings", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("xdp_bench needs root (network namespaces, BPF)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        obj = work / "router.o"
        subprocess.run([str(ROOT / "broker" / "xdp" / "build.sh"), str(obj)], check=True)
        with veth_pair() as (a, b), bpffs(work / "bpf") as fs:
            pins = {a: fs / "a", b: fs / "b"}
            payload = b"p" * 64
            for mode in ("without", "with"):
                if mode == "with":
                    load(a, pins[a], obj)
                    load(b, pins[b], obj)
                results[mode] = {
                    "a_to_b": flood(a, b, OTHER, payload, args.packets, args.seconds),
                    "b_to_a": flood(b, a, OTHER, payload, args.packets, args.seconds),
                    "round_trip": round_trips(a, b, args.pings),
                }
            unload(a, pins[a])
            unload(b, pins[b])
            results["without"]["broker"] = broker_cpu_under_flood(
                a, b, work, args.packets, args.seconds
            )
            load(b, pins[b], obj)
            results["with"]["broker"] = broker_cpu_under_flood(
                a, b, work, args.packets, args.seconds
            )
            unload(b, pins[b])
    report(results)
    if args.json:
        print(json.dumps(results))
    return 0


def report(results: dict[str, Any]) -> None:
    for way in ("a_to_b", "b_to_a"):
        limit = results["without"][way]["received_per_s"]
        got = results["with"][way]["received_per_s"]
        print(f"veth {way}: {limit:,.0f} pkt/s without the router (the limit here), "
              f"{got:,.0f} with it: ratio {got / limit:.2f}")  # fmt: skip
    for mode in ("without", "with"):
        rt = results[mode]["round_trip"]
        print(f"UDP round trip {mode} the router: p50 {rt['p50_us']:.0f} us, "
              f"p99 {rt['p99_us']:.0f} us, p99.9 {rt['p999_us']:.0f} us")  # fmt: skip
    for mode in ("without", "with"):
        b = results[mode]["broker"]
        print(f"broker under {b['datagrams']:,} wrong-cluster datagrams in {b['seconds']:.1f} s, "
              f"{mode} the router: {b['broker_cpu_s']:.2f} CPU s "
              f"(idle for as long: {b['idle_cpu_s']:.2f}); the broker read "
              f"{b['seen_by_broker']:,} of them")  # fmt: skip
    without = results["without"]["broker"]
    with_ = results["with"]["broker"]
    # the flood's own cost: CPU above what the broker spends idle in the same time
    cost_with = max(with_["broker_cpu_s"] - with_["idle_cpu_s"], 0.0)
    cost_without = max(without["broker_cpu_s"] - without["idle_cpu_s"], 0.0)
    saved_total = 1 - with_["broker_cpu_s"] / without["broker_cpu_s"]
    saved_flood = 1 - cost_with / cost_without if cost_without else float("nan")
    target = f"target >= {TARGET_CPU_SAVED:.0%}"
    print(f"broker CPU saved by the router: {saved_total:.1%} of all its CPU seconds, "
          f"{saved_flood:.1%} of what the flood cost ({target})")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
