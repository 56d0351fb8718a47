"""Queue commands as entries of the partition's own log, and applying committed entries.

A queue command is a control batch (consumers of user data skip it; Raft treats it as a
no-op) holding one record with key `queue` and the encoded command as its value. Every
replica feeds each committed entry, in log order, to `apply_entry`; entries at or below what
its state already holds (after restoring a snapshot taken later than the log's start) are
skipped, so applying is idempotent by index.
"""

from __future__ import annotations

import logging

from ..log.batch import Record, decode_batch, encode_batch, parse_header
from .state import (
    QueueCommand,
    QueueError,
    QueueState,
    Result,
    decode_command,
    encode_command,
)

log = logging.getLogger(__name__)

QUEUE_KEY = b"queue"


def encode_entry(command: QueueCommand) -> bytes:
    record = Record(key=QUEUE_KEY, value=encode_command(command), timestamp_ms=0)
    return encode_batch([record], now_ms=0, control=True)


def decode_entry(batch: bytes | memoryview) -> QueueCommand | None:
    """The queue command in a control batch, or None for any other control batch."""
    (record,) = decode_batch(batch)
    if record.key != QUEUE_KEY or record.value is None:
        return None
    return decode_command(record.value)


def apply_entry(
    state: QueueState, index: int, count: int, batch: bytes | memoryview | None
) -> tuple[QueueCommand, Result] | None:
    """Apply the committed entry [index, index + count). `batch` may be None for a record
    batch (only control batches are decoded). Returns the queue command and its result."""
    if index < state.end_index:
        return None
    if batch is None or not parse_header(batch).is_control:
        state.on_records(index, count)
        return None
    state.on_other(index, count)
    try:
        command = decode_entry(batch)
        if command is None:
            return None
        return command, state.apply(command)
    except QueueError:
        # never proposed by a correct leader; every replica skips it alike
        log.error("queue command at %d is malformed: skipped", index)
        return None
