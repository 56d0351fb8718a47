"""Opening a Raft group over a log that may have lost records this node acknowledged.

Recovery (`SegmentedLog.open`) cuts a torn tail: bytes that were never all written, so never
acknowledged. Anything else found damaged, on opening or by a read later, may hold entries
this node acknowledged and a leader counted towards a commit. Such a log is repaired:
`LogStorage.begin_repair` durably records the repair floor (`HardState.repair_floor`: where
the log ended before) and cuts the log at the first damaged batch; the Raft core then fetches
the rest from the leader (log repair, or a snapshot) and meanwhile neither campaigns nor votes
for a candidate behind the floor.

A group whose only voter is this node has nobody to fetch from. The cut loses the records
after the damage for good (`Damage.data_loss`), and the node goes on without a floor.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..log.errors import CorruptBatchError
from .config import RaftConfig
from .log_storage import LogStorage
from .messages import up_to_date_order
from .raft import Raft, scan_pending_confs
from .storage import StorageUnavailable

#: an open that keeps meeting damage gives up after this many repairs (each cuts the log
#: shorter, so this is only a bound)
MAX_REPAIRS_ON_OPEN = 64

T = TypeVar("T")


class RepairError(Exception):
    """The log kept meeting damage while it was being opened and repaired."""


@dataclass(frozen=True, slots=True)
class Damage:
    """What a replica's log lost: everything from `first_index` on is cut."""

    first_index: int
    #: (index, term) the log reached before the damage (the repair floor)
    floor: tuple[int, int]
    reason: str
    #: the group's only voter was damaged: the records cut are lost for good
    data_loss: bool = False


def last_entry(storage: LogStorage) -> tuple[int, int]:
    """(index, term) of the log's last entry."""
    last = storage.last_index()
    return last, storage.term_or(last, storage.hard_state.term)


def found_on_open(storage: LogStorage) -> Damage | None:
    """Damage the log's recovery found that was not a torn tail: records cut from inside
    written data, damaged spans kept in sealed segments, or a log that ends before the
    commit index it saved."""
    report = storage.log.recovery
    found = []
    if report.lost is not None:
        lost = report.lost
        floor = lost.last or (
            max(lost.first_index, storage.hard_state.commit),
            storage.hard_state.term,  # the term of the last record is lost too: the largest
        )
        found.append(Damage(lost.first_index, floor, "damaged records were cut on opening"))
    if report.corrupt_indexes:
        first = min(report.corrupt_indexes)
        found.append(Damage(first, last_entry(storage), f"damaged batch at {first}"))
    beyond = storage.lost_floor()
    if beyond is not None:
        found.append(Damage(storage.last_index() + 1, beyond, "the log ends before its commit"))
    if not found:
        return None
    return Damage(
        min(d.first_index for d in found),
        max((d.floor for d in found), key=up_to_date_order),
        "; ".join(d.reason for d in found),
    )


def repair(storage: LogStorage, node_id: str, damage: Damage) -> Damage:
    """Start repairing the log: record the floor, cut at the damage. Returns the damage as
    carried out (`data_loss` when this node is the group's only voter: no floor)."""
    only_voter = storage.hard_state.conf.voters == (node_id,)
    storage.begin_repair(damage.first_index, None if only_voter else damage.floor)
    if only_voter:
        return Damage(damage.first_index, damage.floor, damage.reason, data_loss=True)
    return damage


def open_raft(
    group: str,
    node_id: str,
    storage: LogStorage,
    config: RaftConfig,
    rng: random.Random,
    state_machine: Callable[[], T],
    damage: Damage | None = None,
) -> tuple[Raft, T, list[Damage]]:
    """The group's Raft core over `storage` and its state machine (built by
    `state_machine`, which may read committed entries), repairing the log first for
    `damage` or for what its recovery found, then for any damaged batch met on the way.
    Returns them with the repairs carried out."""
    repairs = []
    damage = damage or found_on_open(storage)
    if damage is not None:
        repairs.append(repair(storage, node_id, damage))
    log = storage.log
    hook = log.on_corrupt
    met: list[int] = []
    log.on_corrupt = lambda error: met.append(error.index)
    try:
        for _ in range(MAX_REPAIRS_ON_OPEN):
            met.clear()
            try:
                hard_state = storage.hard_state
                raft = Raft(
                    group,
                    node_id,
                    storage,
                    config,
                    rng,
                    pending_confs=scan_pending_confs(storage, hard_state.commit),
                )
                return raft, state_machine(), repairs
            except (StorageUnavailable, CorruptBatchError):
                if not met:
                    raise
                index = min(met)
                found = Damage(index, last_entry(storage), f"damaged batch at {index}")
                repairs.append(repair(storage, node_id, found))
        raise RepairError(f"{group}: still damaged after {MAX_REPAIRS_ON_OPEN} repairs")
    finally:
        log.on_corrupt = hook
