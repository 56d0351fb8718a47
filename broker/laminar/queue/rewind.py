"""The `Reset` a partition's leader proposes to move a consumer group's cursor: the record
ranges a rewind needs, read from its own log.

A group's state forgets the record ranges below every group's cursor (`QueueState._prune`),
so a group moved back below them must learn them again, and every replica the same ones: the
leader puts them in the command. They are the log's batches in [cursor, known) that are user
records: not control batches (queue commands, Raft no-ops, transaction markers), not the
records of aborted (or fenced) transactions, which the partition's transactions remember
until retention removes them. Between `known_from` and the group's own cursor the leader adds
the ranges its state knows, so that the command still fits the replicas if other groups move
on (and the forgotten floor with them) before it commits.

Bounded: one command names at most MAX_RESET_BATCHES batches of the log, and fits the log's
batch limit (a topic's `max_batch_bytes`: fewer batches, halved until it does). A rewind
further back is proposed in steps (`plan_reset` answers the step nearest the target; the
caller proposes again until it gets there). The broker's leader (`laminar.partition.groups`) and the
simulator's (`laminar.sim.queue_sim`) both plan with this.
"""

from __future__ import annotations

from ..log.segmented_log import SegmentedLog
from ..txn.producer import TxnProducer
from .entries import encode_entry
from .state import MAX_SCAN, QueueError, QueueState, Reset

#: The most batch headers of the log one Reset reads (and so the most ranges it carries).
MAX_RESET_BATCHES = 20_000
#: The most ranges of the leader's own state one Reset carries above its forgotten floor.
MAX_KNOWN_RANGES = MAX_SCAN - MAX_RESET_BATCHES


def reset_target(state: QueueState, log: SegmentedLog, index: int) -> int:
    """`index` within what a reset can reach: not below the log start (those records are gone;
    Kafka's tools move such a reset to the earliest offset too), not past the applied end."""
    return min(max(index, log.start_index, state.log_start), state.end_index)


def plan_reset(
    state: QueueState,
    log: SegmentedLog,
    group: str,
    target: int,
    now_ms: int,
    *,
    force: bool = False,
) -> Reset:
    """The Reset of `group` toward `target` (see `reset_target`): to it, or to the furthest
    step back one command within the log's batch limit may take (its `cursor` says which)."""
    batches, known = MAX_RESET_BATCHES, MAX_KNOWN_RANGES
    limit = log.config.batch_limit_bytes
    while True:
        command = _plan(state, log, group, target, now_ms, force, batches, known)
        if len(encode_entry(command)) <= limit:
            return command
        if batches == 1 and known == 0:
            raise QueueError(
                "invalid",
                f"a reset of {group} does not fit the topic's max_batch_bytes={limit}",
            )
        batches, known = max(1, batches // 2), known // 2


def _plan(
    state: QueueState,
    log: SegmentedLog,
    group: str,
    target: int,
    now_ms: int,
    force: bool,
    batches: int,
    known_limit: int,
) -> Reset:
    cursor = reset_target(state, log, target)
    low = state.known_from
    if cursor >= low:
        return Reset(group, cursor, now_ms, force, (), cursor)
    cursor = max(cursor, log.batch_base_back(low, batches))
    ranges: list[tuple[int, int]] = []
    for header in log.batch_headers(cursor):
        base, end = header.base_index, header.next_index
        if base >= low:
            break
        if header.is_control:
            continue
        if header.is_transactional and state.txns.aborted(
            TxnProducer.of(header.producer_id).number, base
        ):
            continue
        base, end = max(base, cursor), min(end, low)
        if ranges and ranges[-1][1] == base:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((base, end))
    existing = state.groups.get(group)
    upto = low if existing is None else max(low, min(existing.cursor, state.end_index))
    known = state.record_ranges(low, upto, known_limit + 1)
    if len(known) > known_limit:
        upto = known.pop()[0]  # (the ranges must say everything below `known_from`)
    if known and ranges and ranges[-1][1] == known[0][0]:
        ranges[-1] = (ranges[-1][0], known.pop(0)[1])
    ranges += known
    return Reset(group, cursor, now_ms, force, tuple(ranges), upto)
