"""The fault kinds: each a small class whose `inject()` breaks one thing and whose `heal()`
mends it, with targets chosen from the plan's seeded pick among what the cluster looks like
at injection time."""

from __future__ import annotations

import asyncio
import errno
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from .bitflip import flip_sealed_bit
from .calls import call
from .cluster import Cluster, ClusterError
from .net import Network
from .schedule import FaultPlan
from .workload import IDEMPOTENT, Context, Entry, Recorder, Value, append_values, make_text

FILL_CHUNK_BYTES = 1 << 20
CLOCK_TOLERANCE_MS = 5_000
CLOCK_VERIFY_TIMEOUT_S = 10.0
#: how long a fault aimed at a leader waits for one to be known (e.g. right after kill9_all)
LEADER_WAIT_S = 15.0
LOOKUP_TIMEOUT_S = 3.0


@dataclass
class Env:
    """What faults act on."""

    cluster: Cluster
    network: Network
    session: aiohttp.ClientSession
    recorder: Recorder
    partitions: list[tuple[str, int]]  # the workload's partitions, in a fixed order
    #: violations seen while injecting or healing (a broker that does not start again)
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: the harness could not do what a fault asks (a fault that did not take effect)
    problems: list[dict[str, Any]] = field(default_factory=list)

    def running(self) -> list[str]:
        return [n for n, b in self.cluster.brokers.items() if b.alive() and not b.paused]

    async def ask(self, path: str) -> Any:
        """GET `path` from the first running broker that answers 200."""
        for node in self.running():
            url = self.cluster.brokers[node].api_url + path
            answer = await call(self.session, "GET", url, timeout_s=LOOKUP_TIMEOUT_S)
            if answer.ok:
                return answer.json()
        return None

    async def partition_leader(self, topic: str, partition: int) -> str | None:
        described = await self.ask(f"/v1/topics/{topic}")
        if not isinstance(described, dict):
            return None
        for state in described.get("partition_states", []):
            if state.get("partition") == partition:
                leader = state.get("leader")
                return leader if leader in self.cluster.brokers else None
        return None

    async def metadata_leader(self) -> str | None:
        info = await self.ask("/v1/cluster")
        leader = info.get("metadata_leader") if isinstance(info, dict) else None
        return leader if leader in self.cluster.brokers else None

    async def start(self, node: str, why: str) -> None:
        """Start `node` and wait until it is ready; a broker that does not come back is a
        finding (its log lines go with it)."""
        if not self.cluster.brokers[node].alive():
            self.cluster.start(node)
        try:
            await self.cluster.wait_ready([node])
        except ClusterError as e:
            self.findings.append(
                {"kind": "broker_did_not_start", "node": node, "after": why,
                 "error": str(e).splitlines()[0],
                 "log": self.cluster.grep(node, ("Error", "Traceback", "Corrupt", "removing"))}
            )  # fmt: skip


class Fault:
    kind: ClassVar[str]

    def __init__(self, plan: FaultPlan, env: Env) -> None:
        self.plan = plan
        self.env = env
        self.rng = random.Random(f"fault-{plan.number}-{plan.pick}")
        self.target: str | None = None
        self.details: dict[str, Any] = {}

    def pick_node(self, among: list[str] | None = None) -> str:
        nodes = sorted(among if among is not None else self.env.cluster.node_ids)
        return nodes[self.plan.pick % len(nodes)]

    async def pick_leader(self) -> str:
        """The leader of the partition the pick names, waiting up to LEADER_WAIT_S for one
        to be known (then any broker)."""
        topic, partition = self.env.partitions[self.plan.pick % len(self.env.partitions)]
        self.details["partition"] = f"{topic}/{partition}"
        deadline = time.monotonic() + LEADER_WAIT_S
        while (leader := await self.env.partition_leader(topic, partition)) is None:
            if time.monotonic() >= deadline:
                self.details["leader"] = "unknown: picked a broker instead"
                return self.pick_node()
            await asyncio.sleep(0.2)
        return leader

    async def inject(self) -> None:
        raise NotImplementedError

    async def heal(self) -> None:
        raise NotImplementedError


class Kill9(Fault):
    kind = "kill9"

    async def choose(self) -> str:
        return self.pick_node()

    async def inject(self) -> None:
        self.target = await self.choose()
        await self.env.cluster.kill9(self.target)

    async def heal(self) -> None:
        assert self.target is not None
        await self.env.start(self.target, f"{self.kind} of {self.target}")


class Kill9Leader(Kill9):
    kind = "kill9_leader"

    async def choose(self) -> str:
        return await self.pick_leader()


class Kill9MetaLeader(Kill9):
    kind = "kill9_meta_leader"

    async def choose(self) -> str:
        leader = await self.env.metadata_leader()
        if leader is None:
            self.details["metadata_leader"] = "unknown: picked a broker instead"
            return self.pick_node()
        return leader


class Kill9All(Fault):
    kind = "kill9_all"

    async def inject(self) -> None:
        self.target = "all"
        await asyncio.gather(*(self.env.cluster.kill9(n) for n in self.env.cluster.node_ids))

    async def heal(self) -> None:
        for node in self.env.cluster.node_ids:
            self.env.cluster.start(node)
        # all at once: a lone broker cannot become ready without a metadata quorum
        await asyncio.gather(
            *(self.env.start(n, "kill9_all") for n in self.env.cluster.node_ids)
        )  # fmt: skip


class Pause(Fault):
    kind = "pause"

    async def inject(self) -> None:
        self.target = self.pick_node(self.env.running())
        self.env.cluster.signal(self.target, signal.SIGSTOP)

    async def heal(self) -> None:
        assert self.target is not None
        self.env.cluster.signal(self.target, signal.SIGCONT)


class Isolate(Fault):
    """The node reaches no other broker (clients still reach it)."""

    kind = "isolate"

    async def choose(self) -> str:
        return self.pick_node()

    async def inject(self) -> None:
        self.target = await self.choose()
        for other in self.env.cluster.node_ids:
            if other != self.target:
                self.env.network.cut(self.target, other)

    async def heal(self) -> None:
        self.env.network.heal()


class IsolateLeader(Isolate):
    kind = "isolate_leader"

    async def choose(self) -> str:
        return await self.pick_leader()


class OneWay(Fault):
    """Packets from a partition's leader to one other broker are dropped; the other way works
    (or the reverse, by the pick)."""

    kind = "one_way"

    async def inject(self) -> None:
        leader = await self.pick_leader()
        others = sorted(n for n in self.env.cluster.node_ids if n != leader)
        other = others[self.rng.randrange(len(others))]
        source, sink = (leader, other) if self.rng.random() < 0.5 else (other, leader)
        self.target = f"{source}->{sink}"
        self.env.network.block(source, sink)

    async def heal(self) -> None:
        self.env.network.heal()


class Bridge(Fault):
    """One broker in the middle talks to everyone; the others are split in two sides that
    cannot talk to each other."""

    kind = "bridge"

    async def inject(self) -> None:
        middle = self.pick_node()
        rest = sorted(n for n in self.env.cluster.node_ids if n != middle)
        self.rng.shuffle(rest)
        left, right = rest[0::2], rest[1::2]
        for a in left:
            for c in right:
                self.env.network.cut(a, c)
        self.target = middle
        self.details.update(left=left, right=right)

    async def heal(self) -> None:
        self.env.network.heal()


class BitflipClean(Fault):
    """Stop the broker cleanly, flip one bit in a sealed segment's batch payload, start it."""

    kind = "bitflip_clean"

    async def stop(self, node: str) -> None:
        try:
            await self.env.cluster.stop(node)
        except ClusterError as e:  # it hung on SIGTERM and was killed
            self.env.findings.append(
                {"kind": "graceful_stop_hung", "node": node, "error": str(e),
                 "log": self.env.cluster.tail(node, 20)}
            )  # fmt: skip

    async def inject(self) -> None:
        self.target = self.pick_node(self.env.running())
        await self.stop(self.target)
        flip = flip_sealed_bit(self.env.cluster.brokers[self.target].data_dir, self.rng)
        if flip is None:
            self.env.problems.append({"fault": self.kind, "problem": "no sealed segment"})
        else:
            self.details["flip"] = flip.__dict__
        await self.env.start(self.target, f"{self.kind} of {self.target}")

    async def heal(self) -> None:
        assert self.target is not None
        await self.env.start(self.target, f"{self.kind} of {self.target}")


class BitflipKill9(BitflipClean):
    kind = "bitflip_kill9"

    async def stop(self, node: str) -> None:
        await self.env.cluster.kill9(node)


class DiskFull(Fault):
    """The broker's data filesystem (its own tmpfs) filled to the last byte by a filler file;
    healing deletes the filler (and starts the broker again if it exited meanwhile)."""

    kind = "disk_full"

    async def inject(self) -> None:
        self.target = self.pick_node(self.env.running())
        path = self.env.cluster.brokers[self.target].data_dir / "filler"
        written = 0
        # unbuffered: each write reaches the filesystem now, and ENOSPC surfaces at once
        with open(path, "wb", buffering=0) as f:
            for chunk_bytes in (FILL_CHUNK_BYTES, 4096, 1):
                chunk = b"\0" * chunk_bytes
                try:
                    while True:
                        written += f.write(chunk) or 0
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
        self.details["filler_bytes"] = written

    async def heal(self) -> None:
        assert self.target is not None
        broker = self.env.cluster.brokers[self.target]
        (broker.data_dir / "filler").unlink(missing_ok=True)
        if not broker.alive():
            self.details["broker_exited_while_full"] = broker.exit_code()
            await self.env.start(self.target, "disk_full")


class ClockJump(Fault):
    """One broker's wall clock (CLOCK_REALTIME, through libfaketime) jumps by
    plan.clock_offset_s; the host clock and every monotonic clock stay as they are."""

    kind = "clock_jump"

    async def inject(self) -> None:
        self.target = await self.pick_leader()
        if await self.led_partition() is None:
            # it no longer leads (leadership moved meanwhile): the leader of any partition,
            # so that a record it stamps can show the jump
            for topic, partition in self.env.partitions:
                if (leader := await self.env.partition_leader(topic, partition)) is not None:
                    self.details["leader"] = f"moved: {leader} leads {topic}/{partition}"
                    self.target = leader
                    break
        self.details["offset_s"] = self.plan.clock_offset_s
        if not self.env.cluster.faketime:
            self.env.problems.append({"fault": self.kind, "problem": "libfaketime is missing"})
            return
        self.env.cluster.set_clock_offset(self.target, self.plan.clock_offset_s)
        observed = await self.observe_offset_ms()
        self.details["observed_offset_ms"] = observed
        expected_ms = self.plan.clock_offset_s * 1000
        if observed is None or abs(observed - expected_ms) > CLOCK_TOLERANCE_MS:
            self.env.problems.append(
                {"fault": self.kind, "problem": "the jump was not seen in a record timestamp "
                 "stamped by the broker", "observed_offset_ms": observed}
            )  # fmt: skip

    async def observe_offset_ms(self) -> int | None:
        """Append a record (with no timestamp: the leader stamps it with its clock) to a
        partition the target leads and read its timestamp back: how far the target's clock
        is from ours. The record is part of the checked history."""
        assert self.target is not None
        env = self.env
        url = env.cluster.brokers[self.target].api_url
        deadline = time.monotonic() + CLOCK_VERIFY_TIMEOUT_S
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            led = await self.led_partition()
            if led is None:
                await asyncio.sleep(0.2)
                continue
            topic, partition = led
            name = f"clock-{self.plan.number}"
            value = Value(name, IDEMPOTENT, topic, partition, attempt, make_text(name, attempt, 0))
            value.producer_id, value.sequence = self.rng.randrange(1, 2**63), 0
            env.recorder.add(value)
            entry = Entry([url], self.rng)
            give_up = asyncio.Event()
            give_up.set()  # one attempt: a retry could reach another leader
            ctx = Context(env.session, [url], env.recorder, give_up, env.cluster.token)
            await append_values(ctx, entry, [value], timeout_s=3.0, give_up=give_up)
            if value.acked_index is None or not value.attempts[-1].url.startswith(url):
                continue
            read = await call(
                env.session, "GET",
                f"{url}/v1/topics/{topic}/partitions/{partition}/records"
                f"?from={value.acked_index}&max_records=1",
                timeout_s=3.0, follow=False,
            )  # fmt: skip
            data = read.json() if read.ok else None
            if isinstance(data, dict) and data.get("records"):
                stamped_ms = int(data["records"][0]["timestamp_ms"])
                local_ms = (time.time() + (value.attempts[-1].answered_s - time.monotonic())) * 1000
                offset_ms = stamped_ms - int(local_ms)
                if abs(offset_ms - self.plan.clock_offset_s * 1000) <= CLOCK_TOLERANCE_MS:
                    return offset_ms
            await asyncio.sleep(0.2)
        return None

    async def led_partition(self) -> tuple[str, int] | None:
        for topic, partition in self.env.partitions:
            if await self.env.partition_leader(topic, partition) == self.target:
                return topic, partition
        return None

    async def heal(self) -> None:
        if self.target is not None and self.env.cluster.faketime:
            self.env.cluster.set_clock_offset(self.target, 0)


FAULTS: dict[str, type[Fault]] = {
    cls.kind: cls
    for cls in (
        Kill9, Kill9Leader, Kill9MetaLeader, Kill9All, Pause, Isolate, IsolateLeader, OneWay,
        Bridge, BitflipClean, BitflipKill9, DiskFull, ClockJump,
    )
}  # fmt: skip


def make_fault(plan: FaultPlan, env: Env) -> Fault:
    return FAULTS[plan.kind](plan, env)
