"""Real `laminar serve` processes, one per network namespace, each with its data directory on
a size-capped tmpfs of its own (so that a disk can be filled) and its wall clock behind
libfaketime (so that one broker's clock can jump while the host's does not)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from laminar import credentials
from laminar.credentials import Role, new_token, token_hash

from .net import Network

API_PORT = 7070
PEER_PORT = 7071
GOSSIP_PORT = 7072
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.1
#: Debian's libfaketime (any architecture's directory)
FAKETIME_LIBRARY = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
#: how long libfaketime may cache the offset file: a jump is seen within this
FAKETIME_CACHE_S = 1


class ClusterError(RuntimeError):
    pass


@dataclass
class BrokerSettings:
    segment_bytes: int = 256 * 1024
    tick_ms: int = 50
    request_timeout_ms: int = 4_000
    dead_grace_ms: int = 30_000
    disk_bytes: int = 256 * 1024 * 1024


@dataclass
class Broker:
    node_id: str
    address: str
    netns: str
    data_dir: Path
    log_path: Path
    clock_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def api_url(self) -> str:
        return f"http://{self.address}:{API_PORT}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()


@dataclass
class Cluster:
    network: Network
    run_dir: Path
    settings: BrokerSettings = field(default_factory=BrokerSettings)
    brokers: dict[str, Broker] = field(default_factory=dict)
    #: the admin token of the brokers' credentials file (every client of the suite uses it)
    token: str = field(default_factory=new_token, repr=False)
    _mounts: list[Path] = field(default_factory=list)

    @property
    def node_ids(self) -> list[str]:
        return list(self.brokers)

    @property
    def urls(self) -> list[str]:
        return [b.api_url for b in self.brokers.values()]

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def faketime(self) -> bool:
        return FAKETIME_LIBRARY is not None

    def setup(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "secret").write_text(secrets.token_hex(32))
        admin = credentials.entry("admin", [Role.ADMIN], hashes=[token_hash(self.token)])
        (self.run_dir / "credentials.yaml").write_text(credentials.dump([admin]))
        for name in self.network.names:
            host = self.network.hosts[name]
            data_dir = self.run_dir / "data" / name
            data_dir.mkdir(parents=True, exist_ok=True)
            # a tmpfs of its own per broker: disk_full fills exactly one broker's disk
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.settings.disk_bytes}", "tmpfs",
                 str(data_dir)],
                check=True, capture_output=True, timeout=30,
            )  # fmt: skip
            self._mounts.append(data_dir)
            clock = self.run_dir / f"{name}.clock"
            clock.write_text("+0\n")
            self.brokers[name] = Broker(
                name, host.address, host.netns, data_dir, self.run_dir / f"{name}.log", clock
            )

    def teardown(self) -> None:
        """Kill every broker still running and unmount the data directories."""
        for broker in self.brokers.values():
            if broker.alive():
                assert broker.process is not None
                with contextlib.suppress(ProcessLookupError):
                    broker.process.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    broker.process.wait(timeout=STOP_TIMEOUT_S)
        for path in reversed(self._mounts):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self._mounts.clear()

    # ---- processes ------------------------------------------------------------------------

    def command(self, broker: Broker) -> list[str]:
        seeds = ",".join(
            f"{b.address}:{GOSSIP_PORT}" for b in self.brokers.values() if b is not broker
        )
        s = self.settings
        return [
            *self.network.hosts[broker.node_id].exec_prefix(),
            sys.executable, "-m", "laminar", "serve",
            "--node-id", broker.node_id,
            "--data-dir", str(broker.data_dir),
            "--host", broker.address,
            "--seeds", seeds,
            "--initial-nodes", ",".join(self.brokers),
            "--cluster-id", "faults",
            "--secret-file", str(self.run_dir / "secret"),
            "--credentials-file", str(self.run_dir / "credentials.yaml"),
            "--segment-bytes", str(s.segment_bytes),
            "--tick-ms", str(s.tick_ms),
            "--request-timeout-ms", str(s.request_timeout_ms),
            "--dead-grace-ms", str(s.dead_grace_ms),
            "--fsync", "always",
            # one process per broker: the faults act on a broker's process (a worker's own
            # kill -9 is tests/integration/test_workers.py)
            "--workers", "1",
        ]  # fmt: skip

    def environment(self, broker: Broker) -> dict[str, str]:
        env = dict(os.environ)
        if self.faketime:
            # only CLOCK_REALTIME moves (the leases' clock, record timestamps); the monotonic
            # clock that drives Raft ticks and timeouts stays the host's
            env.update(
                LD_PRELOAD=str(FAKETIME_LIBRARY),
                FAKETIME_TIMESTAMP_FILE=str(broker.clock_path),
                FAKETIME_CACHE_DURATION=str(FAKETIME_CACHE_S),
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        return env

    def start(self, node_id: str) -> None:
        broker = self.brokers[node_id]
        if broker.alive():
            raise ClusterError(f"{node_id} is already running")
        with open(broker.log_path, "ab") as output:
            output.write(f"==== start {broker.starts + 1} at {time.time():.3f}\n".encode())
            output.flush()
            # `ip netns exec` execs the broker: the child's pid is the broker's own
            broker.process = subprocess.Popen(
                self.command(broker),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(broker),
                start_new_session=True,
            )
        broker.starts += 1
        broker.paused = False

    def signal(self, node_id: str, sig: int) -> None:
        broker = self.brokers[node_id]
        if broker.alive():
            assert broker.process is not None
            with contextlib.suppress(ProcessLookupError):
                broker.process.send_signal(sig)
            if sig == signal.SIGSTOP:
                broker.paused = True
            elif sig == signal.SIGCONT:
                broker.paused = False

    async def wait_exit(self, node_id: str, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        broker = self.brokers[node_id]
        deadline = time.monotonic() + timeout_s
        while broker.alive():
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(POLL_INTERVAL_S)
        return broker.exit_code()

    async def kill9(self, node_id: str) -> None:
        broker = self.brokers[node_id]
        if broker.paused:
            self.signal(node_id, signal.SIGCONT)
        self.signal(node_id, signal.SIGKILL)
        await self.wait_exit(node_id)

    async def stop(self, node_id: str) -> int | None:
        """Graceful stop: SIGTERM and wait for the exit (SIGKILL if it does not come)."""
        broker = self.brokers[node_id]
        if not broker.alive():
            return broker.exit_code()
        if broker.paused:
            self.signal(node_id, signal.SIGCONT)
        self.signal(node_id, signal.SIGTERM)
        code = await self.wait_exit(node_id)
        if code is None:
            await self.kill9(node_id)
            raise ClusterError(f"{node_id} did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM")
        return code

    async def wait_ready(
        self, node_ids: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """Until each broker answers /readyz 200 (ClusterError if one exits or time runs out)."""
        deadline = time.monotonic() + timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for node_id in node_ids or self.node_ids:
                broker = self.brokers[node_id]
                while True:
                    if not broker.alive():
                        raise ClusterError(
                            f"{node_id} exited ({broker.exit_code()}):\n{self.tail(node_id)}"
                        )
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                        async with session.get(broker.api_url + "/readyz") as response:
                            if response.status == 200:
                                break
                    if time.monotonic() > deadline:
                        raise ClusterError(f"{node_id} not ready after {timeout_s:.0f} s")
                    await asyncio.sleep(POLL_INTERVAL_S)

    async def restart(self, node_id: str) -> None:
        await self.stop(node_id)
        self.start(node_id)
        await self.wait_ready([node_id])

    def set_clock_offset(self, node_id: str, offset_s: int) -> None:
        """libfaketime reads the offset from this file (the host clock is never touched)."""
        path = self.brokers[node_id].clock_path
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}s\n" if offset_s else "+0\n")
        tmp.replace(path)

    # ---- logs -----------------------------------------------------------------------------

    def tail(self, node_id: str, lines: int = 40) -> str:
        path = self.brokers[node_id].log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def notable(self, node_id: str, needles: tuple[str, ...], limit: int) -> list[str]:
        """The distinct log lines that contain a needle (the timestamp left out, so that a
        line repeated every round counts once), each with how often it came."""
        counts: dict[str, int] = {}
        for line in self.grep(node_id, needles, limit=100_000):
            parts = line.split(" ", 2)
            key = parts[2] if len(parts) == 3 and parts[0][:2] == "20" else line
            counts[key] = counts.get(key, 0) + 1
        return [f"{n}x {line}" for line, n in list(counts.items())[:limit]]

    def grep(self, node_id: str, needles: tuple[str, ...], limit: int = 30) -> list[str]:
        path = self.brokers[node_id].log_path
        if not path.exists():
            return []
        found = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if any(needle in line for needle in needles)
        ]
        return found[:limit]
