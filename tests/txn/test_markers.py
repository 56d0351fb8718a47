"""Transaction markers (laminar.txn.markers): control batches that name their producer."""

from __future__ import annotations

import pytest

from laminar.log.batch import Record, encode_batch, parse_header
from laminar.queue.entries import encode_entry
from laminar.queue.state import Expire
from laminar.txn.markers import decode_marker, encode_marker
from laminar.txn.producer import TxnProducer


def test_markers_say_commit_or_abort_and_carry_their_epoch() -> None:
    for commit in (True, False):
        batch = encode_marker(TxnProducer(9, 4), commit=commit)
        header = parse_header(batch)
        assert header.is_control and not header.is_transactional
        assert TxnProducer.of(header.producer_id) == (9, 4)
        assert decode_marker(batch, header.producer_id) is commit


def test_other_control_batches_are_not_markers() -> None:
    queue_command = encode_entry(Expire("g", now_ms=1))
    noop = encode_batch([Record(value=None, key=b"noop")], control=True)
    forged = encode_batch([Record(value=b"\x01", key=b"txn")], control=True)  # no producer
    odd = encode_batch([Record(value=b"\x07", key=b"txn")], producer_id=1 << 16, control=True)
    for batch in (queue_command, noop, forged, odd):
        assert decode_marker(batch, parse_header(batch).producer_id) is None


def test_a_marker_needs_a_producer_in_range() -> None:
    with pytest.raises(ValueError):
        encode_marker(TxnProducer(0, 1), commit=True)
