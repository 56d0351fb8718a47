"""Transaction markers: the control batch the coordinator writes into every partition of a
transaction to end it there (docs/transactions.md, docs/formats.md).

A marker is a control batch (readers of user data skip it) of one record with key `txn` and a
one-byte value, 1 for COMMIT and 0 for ABORT. Its header's `producer_id` names the producer
number and the epoch the marker carries: the ended transaction's epoch + 1.
"""

from __future__ import annotations

from ..log.batch import Record, decode_batch, encode_batch
from .producer import TxnProducer

MARKER_KEY = b"txn"
COMMIT = b"\x01"
ABORT = b"\x00"


def encode_marker(producer: TxnProducer, *, commit: bool) -> bytes:
    record = Record(key=MARKER_KEY, value=COMMIT if commit else ABORT, timestamp_ms=0)
    return encode_batch([record], producer_id=producer.check().producer_id, now_ms=0, control=True)


def decode_marker(batch: bytes | memoryview, producer_id: int) -> bool | None:
    """Whether the control batch (whose header names `producer_id`) is a COMMIT (True) or
    ABORT (False) marker; None for any other control batch."""
    records = decode_batch(batch)
    if len(records) != 1 or records[0].key != MARKER_KEY or not producer_id:
        return None
    value = records[0].value
    if value == COMMIT:
        return True
    if value == ABORT:
        return False
    return None
