"""Many Raft groups on one node; heartbeats to the same peer node go out as one message.

A broker hosts one group per partition replica. Every tick, each group it leads would send a
heartbeat to each follower; `ready()` folds all heartbeats (and heartbeat responses) bound for
the same node into one HEARTBEATS (HEARTBEATS_RESP) message, and `step()` unfolds them.

Idle groups cost nothing: with `quiesce`, a group with nothing to do stops ticking
(`laminar.raft.raft`, "Quiescence"); `tick()` ticks only the groups awake, and `ready()`
looks only at the groups that took an input since their last Ready (`GroupHooks`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Set

from .messages import Message, MessageType
from .raft import GroupHooks, Raft, Ready, Role

FOLDED = {
    MessageType.HEARTBEAT: MessageType.HEARTBEATS,
    MessageType.HEARTBEAT_RESP: MessageType.HEARTBEATS_RESP,
}


class MultiRaft:
    def __init__(self, node_id: str, *, quiesce: bool = False) -> None:
        """`quiesce`: idle groups stop ticking (then give `live`, the failure detector)."""
        self.id = node_id
        self.groups: dict[str, Raft] = {}
        #: every node a message came from: a repairing group asks them all for what it lost
        #: (the member still holding it may have left the group's configuration since)
        self.peers: set[str] = set()
        self.hooks = GroupHooks(quiesce=quiesce)
        #: groups that took an input since the last `take_changed` and whose Ready was taken
        #: since (`hooks.touched` holds the others)
        self._changed: set[str] = set()

    @property
    def live(self) -> Callable[[str], bool]:
        """Whether the failure detector counts a node live (a quiescing leader does not wait
        for members that are not)."""
        return self.hooks.live

    @live.setter
    def live(self, live: Callable[[str], bool]) -> None:
        self.hooks.live = live

    def add(self, raft: Raft) -> None:
        assert raft.id == self.id and raft.group not in self.groups
        self.groups[raft.group] = raft
        raft.attach(self.hooks)

    def remove(self, group: str) -> None:
        self.groups.pop(group, None)
        self.hooks.awake.discard(group)
        self.hooks.touched.discard(group)
        self._changed.discard(group)

    def tick(self) -> None:
        """Tick every group awake (quiesced groups wait for an input)."""
        for group in sorted(self.hooks.awake):
            raft = self.groups.get(group)
            if raft is None:
                self.hooks.awake.discard(group)
                continue
            if raft.repair_floor is not None:
                raft.repair_peers |= self.peers
            raft.tick()

    def take_changed(self) -> set[str]:
        """The groups that took an input (a message, a tick, a proposal, a wake) since the
        last call: only their role, leader, term, configuration or progress can differ since.
        A group removed meanwhile may be missing."""
        changed = self._changed | self.hooks.touched
        self._changed = set()
        return changed

    def quiesced(self) -> int:
        """How many groups are quiesced."""
        return len(self.groups) - len(self.hooks.awake)

    def wake_orphans(self, alive: Set[str]) -> list[str]:
        """Wake the quiesced followers whose leader is not in `alive` (the nodes the failure
        detector counts alive): their election timeout runs again. Returns the groups
        woken."""
        woken = []
        for group in sorted(self.groups.keys() - self.hooks.awake):
            raft = self.groups[group]
            if raft.role is not Role.LEADER and raft.lead not in alive:
                raft.wake()
                woken.append(group)
        return woken

    def wake_leaders_of(self, members: Iterable[str]) -> list[str]:
        """Wake the quiesced leaders of groups `members` belong to (nodes back alive: one
        may lack entries a leader quiesced without). Returns the groups woken."""
        back = set(members)
        woken = []
        for group in sorted(self.groups.keys() - self.hooks.awake):
            raft = self.groups[group]
            if raft.role is Role.LEADER and back.intersection(raft.conf.members()):
                raft.wake()
                woken.append(group)
        return woken

    def step(self, message: Message) -> None:
        """Deliver a message from the network; messages for unknown groups are dropped."""
        self.peers.add(message.src)
        parts = message.batch if message.type in FOLDED.values() else (message,)
        for part in parts:
            raft = self.groups.get(part.group)
            if raft is not None:
                raft.step(part)

    def ready(self) -> tuple[dict[str, Ready], list[Message]]:
        """Per-group Readies (their messages moved out) and the node's messages to send,
        heartbeats coalesced per destination. Persist every Ready, send, then `advance`."""
        if not self.hooks.touched:  # (most calls of a busy node's loop)
            return {}, []
        readies: dict[str, Ready] = {}
        outgoing: list[Message] = []
        folded: dict[tuple[str, MessageType], list[Message]] = defaultdict(list)
        touched = sorted(self.hooks.touched)  # only a group that took an input has news
        self._changed.update(self.hooks.touched)
        self.hooks.touched.clear()
        for group in touched:
            raft = self.groups.get(group)
            if raft is None or not raft.has_ready():
                continue
            ready = raft.ready()
            for message in ready.messages:
                if message.type in FOLDED:
                    folded[(message.dst, FOLDED[message.type])].append(message)
                else:
                    outgoing.append(message)
            ready.messages = []
            readies[group] = ready
        for (dst, kind), parts in sorted(folded.items()):
            outgoing.append(Message(kind, "", self.id, dst, 0, batch=tuple(parts)))
        return readies, outgoing

    def advance(self, readies: dict[str, Ready]) -> None:
        for group, ready in readies.items():
            raft = self.groups.get(group)
            if raft is not None:
                raft.advance(ready)
