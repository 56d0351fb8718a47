"""One round of a node's Raft groups, in the order every runtime carries it out: the node
core (node/core.py, `NodeCore.begin`, carried out by the broker's server/node.py and by the
node simulation) and the Raft simulator (sim/cluster.py, `_drain`) all run `plan` and then
these steps, so the seeds test the ordering that ships (etcd-raft's Ready, with its `msgs`
and `msgsAfterAppend`):

1. install each group's snapshot;
2. write its entries (not durable yet). The node core only plans them here: the broker
   writes them in an I/O thread together with step 5, and they become part of the log
   (its end, its reads) once written, so the steps below may run meanwhile;
3. send `before`: what may leave before this round is durable. A leader's appends and
   heartbeats, snapshots and TimeoutNow: the leader counts its own log toward a commit only
   once it is durable, so a copy sent early promises nothing it could lose;
4. apply the committed ranges (committed means durable on a majority already: their answers
   need not wait for this round's newer entries), each entry once it is stored here: those
   written in step 2 after that write (the node core: `NodeCore.stored`);
5. sync every log written in step 2;
6. persist the hard states (term, vote, configuration);
7. send `after`: acknowledgements and votes, which promise what steps 5 and 6 made durable;
8. advance every group past the round.

Pure: which messages go when is decided here, not by a runtime.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from .messages import Message, MessageType
from .raft import Ready

MT = MessageType
#: What may leave before the round is durable (step 3); everything else waits (step 7).
EARLY_TYPES = frozenset({MT.APPEND, MT.HEARTBEAT, MT.HEARTBEATS, MT.SNAPSHOT, MT.TIMEOUT_NOW})


@dataclass(frozen=True, slots=True)
class Round:
    readies: dict[str, Ready]
    #: step 3: sent once entries are written, before they are durable
    before: list[Message]
    #: step 7: sent once entries and hard states are durable
    after: list[Message]
    #: the groups whose logs took entries (step 5 syncs them)
    written: list[str]


def plan(readies: dict[str, Ready], messages: list[Message], gone: Set[str] = frozenset()) -> Round:
    """The round for `MultiRaft.ready()`'s result: node-level messages (coalesced heartbeats)
    first, then each group's, each sent before or after durability by its type. The groups
    in `gone` (their replica closed meanwhile: nothing of theirs is persisted) send nothing."""
    before: list[Message] = []
    after: list[Message] = []
    for message in messages:
        (before if message.type in EARLY_TYPES else after).append(message)
    for group, ready in readies.items():
        if group in gone:
            continue
        for message in ready.messages:
            (before if message.type in EARLY_TYPES else after).append(message)
    written = [g for g, ready in readies.items() if ready.entries and g not in gone]
    return Round(readies, before, after, written)
