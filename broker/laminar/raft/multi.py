"""Many Raft groups on one node; heartbeats to the same peer node go out as one message.

A broker hosts one group per partition replica. Every tick, each group it leads would send a
heartbeat to each follower; `ready()` folds all heartbeats (and heartbeat responses) bound for
the same node into one HEARTBEATS (HEARTBEATS_RESP) message, and `step()` unfolds them.
"""

from __future__ import annotations

from collections import defaultdict

from .messages import Message, MessageType
from .raft import Raft, Ready

FOLDED = {
    MessageType.HEARTBEAT: MessageType.HEARTBEATS,
    MessageType.HEARTBEAT_RESP: MessageType.HEARTBEATS_RESP,
}


class MultiRaft:
    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.groups: dict[str, Raft] = {}
        #: every node a message came from: a repairing group asks them all for what it lost
        #: (the member still holding it may have left the group's configuration since)
        self.peers: set[str] = set()

    def add(self, raft: Raft) -> None:
        assert raft.id == self.id and raft.group not in self.groups
        self.groups[raft.group] = raft

    def remove(self, group: str) -> None:
        self.groups.pop(group, None)

    def tick(self) -> None:
        for group in sorted(self.groups):
            raft = self.groups[group]
            if raft.repair_floor is not None:
                raft.repair_peers |= self.peers
            raft.tick()

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
        readies: dict[str, Ready] = {}
        outgoing: list[Message] = []
        folded: dict[tuple[str, MessageType], list[Message]] = defaultdict(list)
        for group in sorted(self.groups):
            raft = self.groups[group]
            if not raft.has_ready():
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
