"""Fault injectors for the deterministic simulation (`laminar.sim.cluster`).

A `FaultInjector` is handed to the simulation in `SimConfig.injectors` (or built from the
config's rates by `SimConfig.fault_injectors`) and acts through hooks the simulation calls:

* `on_send(sim, message)` for every message a node sends: the deliveries it becomes, each
  `(delay_ms, message)`; the injectors are chained in list order (a message one drops, the
  next never sees; delays add up);
* `delivers(sim, message)` when a message is due: False keeps it from its destination;
* `on_tick(sim)` once per faulty tick, before the nodes tick: node, disk and clock faults;
* `on_persist(sim, node)` once per faulty persist round that wrote entries, once they are
  written and the early messages sent, before the fsync: True if it crashed the node;
* `heal(sim)` when the faulty phase ends: undo whatever would outlast it.

The injectors:

* network: `Drop`, `Duplicate`, `Delay` (a random latency for every message, which already
  reorders them), `Reorder` (a message held back long, so that many later ones overtake it:
  stale messages arrive), `Partition` (cuts the nodes in two for a while);
* nodes: `Crash` (crash, restart a while later), `CrashMidWrite` (crash after writing, before
  the fsync, optionally leaving a torn tail), `ClockJump` (a node's clock jumps ahead: it gets
  a burst of ticks at once, as after a paused VM or a stepped clock, and its wall clock, which
  stamps the queue's lease times, stays ahead), `DiskFull` (a node's disk fills up for a
  while: writes growing its files fail with ENOSPC, the node fail-stops and restarts only once
  the disk has room again), `BitFlip` (a bit flips in a stored batch).

Every injector draws its randomness from the simulation's one seeded generator, in a fixed
order, and counts its firings in the run's stats under `stat`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ..log.batch import BATCH_HEADER_BYTES
from ..raft.messages import Message

if TYPE_CHECKING:
    from .cluster import SimNode, Simulation

#: a message to deliver this many milliseconds from now
Delivery = tuple[int, Message]


class FaultInjector:
    """One kind of fault. Every hook is optional: the defaults inject nothing."""

    #: the counter of its firings in the run's stats
    stat: ClassVar[str] = ""

    def on_send(self, sim: Simulation, message: Message) -> list[Delivery]:
        return [(0, message)]

    def delivers(self, sim: Simulation, message: Message) -> bool:
        return True

    def on_tick(self, sim: Simulation) -> None:
        pass

    def on_persist(self, sim: Simulation, node: SimNode) -> bool:
        return False

    def heal(self, sim: Simulation) -> None:
        pass

    def fired(self, sim: Simulation, event: str | None = None) -> None:
        sim.stats[self.stat] = sim.stats.get(self.stat, 0) + 1
        if event is not None:
            sim._log(event)


# ---- network -------------------------------------------------------------------------------


class Drop(FaultInjector):
    """Lose a message."""

    stat = "drops"

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def on_send(self, sim: Simulation, message: Message) -> list[Delivery]:
        if sim.rng.random() < self.rate:
            self.fired(sim)
            return []
        return [(0, message)]


class Duplicate(FaultInjector):
    """Deliver a message twice (each copy delayed on its own by the injectors after)."""

    stat = "duplicates"

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def on_send(self, sim: Simulation, message: Message) -> list[Delivery]:
        if sim.rng.random() < self.rate:
            self.fired(sim)
            return [(0, message), (0, message)]
        return [(0, message)]


class Delay(FaultInjector):
    """A random latency of 0 to `max_ms` for every message (which reorders them)."""

    stat = "delays"

    def __init__(self, max_ms: int) -> None:
        self.max_ms = max_ms

    def on_send(self, sim: Simulation, message: Message) -> list[Delivery]:
        delay = sim.rng.randint(0, self.max_ms)
        if delay:
            self.fired(sim)
        return [(delay, message)]


class Reorder(FaultInjector):
    """Hold a message back `hold_ms` (a range) longer, far past the usual latency: many later
    messages overtake it, and it arrives stale."""

    stat = "reorders"

    def __init__(self, rate: float, hold_ms: tuple[int, int] = (50, 250)) -> None:
        self.rate = rate
        self.hold_ms = hold_ms

    def on_send(self, sim: Simulation, message: Message) -> list[Delivery]:
        if sim.rng.random() < self.rate:
            self.fired(sim)
            return [(sim.rng.randint(*self.hold_ms), message)]
        return [(0, message)]


class Partition(FaultInjector):
    """Per tick, with `rate`: cut off a minority of the nodes (at most half) from the rest for
    `ticks` (a range); messages across the cut, also those already in flight, are lost."""

    stat = "partitions"

    def __init__(self, rate: float, ticks: tuple[int, int] = (5, 50)) -> None:
        self.rate = rate
        self.ticks = ticks
        self.side: frozenset[str] | None = None
        self.until_ms = 0

    def on_tick(self, sim: Simulation) -> None:
        rng = sim.rng
        if self.side is not None and sim.now_ms >= self.until_ms:
            self.heal(sim)
        if self.side is None and rng.random() < self.rate:
            self.side = frozenset(
                rng.sample(sorted(sim.nodes), rng.randint(1, len(sim.nodes) // 2))
            )
            self.until_ms = sim.after_ticks(rng.randint(*self.ticks))
            self.fired(sim, f"partition {sorted(self.side)} from the rest")

    def delivers(self, sim: Simulation, message: Message) -> bool:
        return self.side is None or (message.src in self.side) == (message.dst in self.side)

    def heal(self, sim: Simulation) -> None:
        if self.side is not None:
            sim._log("heal partition")
            self.side = None


# ---- nodes ---------------------------------------------------------------------------------


class Crash(FaultInjector):
    """Per tick, with `rate`: crash a live node (never the last one), losing what it did not
    fsync, with a torn tail with `torn_rate`; it restarts 5-40 ticks later."""

    stat = "node_crashes"

    def __init__(self, rate: float, torn_rate: float = 0.5) -> None:
        self.rate = rate
        self.torn_rate = torn_rate

    def on_tick(self, sim: Simulation) -> None:
        rng = sim.rng
        alive = sim._alive()
        if len(alive) > 1 and rng.random() < self.rate:
            node = rng.choice(alive)
            self.fired(sim)
            sim._crash(node, torn=rng.random() < self.torn_rate)


class CrashMidWrite(FaultInjector):
    """Per persist round, with `rate`: crash the node once the round's entries are written
    and its early messages sent, before the fsync; `torn` leaves a random prefix of the
    unsynced bytes (a torn tail), else they are all lost."""

    stat = "mid_write_crashes"

    def __init__(self, rate: float, *, torn: bool = True) -> None:
        self.rate = rate
        self.torn = torn

    def on_persist(self, sim: Simulation, node: SimNode) -> bool:
        if sim.rng.random() >= self.rate:
            return False
        self.fired(sim)
        sim._crash(node, torn=self.torn)  # written and sent, never fsynced: lost
        return True


class ClockJump(FaultInjector):
    """Per tick, with `rate`: a live node's clock jumps 2 to `max_ticks` ticks ahead, as after
    a paused VM or a stepped clock: its Raft groups get that many ticks at once (elections
    and heartbeats fire in a burst), and its wall clock (`Simulation.clock_ms`: the time its
    leaders stamp on queue commands, so lease deadlines and expiry) stays that far ahead."""

    stat = "clock_jumps"

    def __init__(self, rate: float, max_ticks: int = 8) -> None:
        self.rate = rate
        self.max_ticks = max_ticks

    def on_tick(self, sim: Simulation) -> None:
        rng = sim.rng
        alive = sim._alive()
        if not alive or rng.random() >= self.rate:
            return
        node = rng.choice(alive)
        ticks = rng.randint(2, self.max_ticks)
        self.fired(sim, f"{node.id}'s clock jumps {ticks} ticks ahead")
        sim.jump_clock(node, ticks)


class DiskFull(FaultInjector):
    """Per tick, with `rate`: a live node's disk fills up for `ticks` (a range), leaving it
    up to `slack_bytes` of room: writes that would grow its files past that fail with ENOSPC
    (`MemoryDirectory.capacity_bytes`), which stops the node (`Simulation`: it crashes, losing
    what it did not fsync). It restarts only once the disk is freed again."""

    stat = "disk_full"

    def __init__(
        self, rate: float, ticks: tuple[int, int] = (5, 40), slack_bytes: int = 2048
    ) -> None:
        self.rate = rate
        self.ticks = ticks
        self.slack_bytes = slack_bytes
        self.full_until_ms: dict[str, int] = {}  # node -> when its disk is freed

    def on_tick(self, sim: Simulation) -> None:
        rng = sim.rng
        for node_id, until_ms in sorted(self.full_until_ms.items()):
            if sim.now_ms >= until_ms:
                self._free(sim, sim.nodes[node_id])
        alive = [n for n in sim._alive() if n.id not in self.full_until_ms]
        if not alive or rng.random() >= self.rate:
            return
        node = rng.choice(alive)
        for _, directory in sorted(node.directories.items()):
            directory.capacity_bytes = directory.used_bytes() + rng.randrange(self.slack_bytes)
        self.full_until_ms[node.id] = sim.after_ticks(rng.randint(*self.ticks))
        self.fired(sim, f"{node.id}'s disk is full")

    def heal(self, sim: Simulation) -> None:
        for node_id in sorted(self.full_until_ms):
            self._free(sim, sim.nodes[node_id])

    def _free(self, sim: Simulation, node: SimNode) -> None:
        del self.full_until_ms[node.id]
        for directory in node.directories.values():
            directory.capacity_bytes = None
        sim._log(f"{node.id}'s disk has room again")


class BitFlip(FaultInjector):
    """Per tick, with `rate`: damage one stored batch of a live node's group (its payload,
    where only the checksum can tell), then, half the time, restart the node, sometimes
    without the segment's index file so that opening it scans the damage. One damaged replica
    per group at a time (`Simulation.unrepaired`): damage on a majority of a group is beyond
    what replication can survive."""

    stat = "bit_flips"

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def on_tick(self, sim: Simulation) -> None:
        rng = sim.rng
        choices = [
            (node, group)
            for node in sim._alive()
            for group in sorted(node.storages)
            if group not in sim.unrepaired
            and node.storages[group].log.start_index < node.storages[group].log.next_index
        ]
        if not choices or rng.random() >= self.rate:
            return
        node, group = rng.choice(choices)
        log = node.storages[group].log
        index = rng.randrange(log.start_index, log.next_index)
        name, start, end = log.batch_location(index)
        if end - start <= BATCH_HEADER_BYTES:
            return
        position = rng.randrange(start + BATCH_HEADER_BYTES, end)
        directory = node.directories[group]
        for data in (directory.files[name].data, directory.files[name].durable):
            if position < len(data):
                data[position] ^= 1 << rng.randrange(8)
        sim.unrepaired[group] = (node.id, index)
        self.fired(sim, f"bit flip in {node.id} {group} batch holding {index}")
        if rng.random() < 0.5:
            sim._crash(node, torn=False)
            if rng.random() < 0.5:
                directory.remove(name.replace(".log", ".index"))
