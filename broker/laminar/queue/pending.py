"""Pipelined acquisition: a leader may hand out records it has proposed but not yet committed.

The Qpid cluster seeds make a transferred message available on the owning broker at once,
"avoiding the multicast latency", and complete the transfer to its publisher when the
replication completes. Here the partition's leader lets an Acquire name records that are in
its log beyond what it applied: proposed (written or not), not committed yet. The Acquire
goes into the log after them, so it commits only with them, and it applies after them: the
queue state machine sees those records before it judges the Acquire, on every replica, as for
any other. A consumer is answered only once the Acquire is committed and applied, so it never
holds a record that could be lost; if the leader loses its term first, both the records and
the Acquire may go (the publisher was not acknowledged either) and the acquire fails as
any whose leader stepped down.

The broker's leader (`laminar.partition.groups.ConsumerGroups`) and the simulator's
(`laminar.sim.queue_sim`) both pick from here.
"""

from __future__ import annotations

from ..log.batch import BATCH_HEADER_BYTES, parse_header, payload_hash, stamp_header
from ..raft.messages import Entry, EntryKind
from ..raft.raft_log import RaftLog

#: The most bytes of the unapplied log tail one pick looks through.
SCAN_BYTES = 4 << 20


def pending_records(log: RaftLog, from_index: int, limit: int) -> list[tuple[int, Entry]]:
    """Up to `limit` record indexes the leader's `log` holds at or after `from_index` (the
    first index it has not applied), oldest first, each with the entry holding it."""
    out: list[tuple[int, Entry]] = []
    if limit <= 0 or from_index > log.last_index():
        return out
    for entry in log.entries(from_index, SCAN_BYTES):
        if entry.kind is not EntryKind.NORMAL or parse_header(entry.data).is_control:
            continue  # a no-op, a configuration change, a queue command
        for index in range(entry.index, entry.last_index + 1):
            out.append((index, entry))
            if len(out) >= limit:
                return out
    return out


def stamped(entry: Entry) -> bytes:
    """The entry's batch as the log stores it: its header stamped with the entry's base
    index and term (a proposal's bytes are stamped only when written)."""
    data = entry.data
    header = parse_header(data)
    if header.base_index == entry.index and header.term == entry.term:
        return data[: header.batch_bytes]
    payload = memoryview(data)[BATCH_HEADER_BYTES : header.batch_bytes]
    return stamp_header(data, entry.index, entry.term, payload_hash(payload)) + bytes(payload)
