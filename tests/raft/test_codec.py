"""The Raft message codec: every message round-trips; any other bytes raise FrameError only."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar.log import Record, encode_batch
from laminar.raft import ConfState, Entry, EntryKind, Message, MessageType, Snapshot
from laminar.raft.codec import MAX_FRAME_BYTES, FrameError, decode, encode
from laminar.raft.raft import encode_control

BATCH = encode_batch([Record(value=b"v" * 100, key=b"k")], now_ms=5)
APPEND = Message(
    MessageType.APPEND,
    "orders/3",
    "n1",
    "n2",
    7,
    log_term=6,
    index=41,
    entries=(
        Entry(42, 1, 7, BATCH),
        Entry(43, 1, 7, encode_control(EntryKind.NOOP), EntryKind.NOOP),
    ),
    commit=40,
)
SAMPLES = [
    APPEND,
    Message(
        MessageType.APPEND_RESP,
        "g",
        "n2",
        "n1",
        7,
        index=41,
        reject=True,
        reject_hint=30,
        log_term=5,
    ),
    Message(MessageType.VOTE, "g", "a", "b", 3, index=-1, log_term=0, context=b"transfer"),
    Message(MessageType.PRE_VOTE_RESP, "g", "b", "a", 4, reject=True),
    Message(
        MessageType.SNAPSHOT,
        "g",
        "a",
        "b",
        9,
        snapshot=Snapshot(99, 8, ConfState(("a", "b", "c"), ("d",)), b"state"),
    ),
    Message(MessageType.READ_INDEX_RESP, "g", "a", "b", 2, index=17, context=b"r1"),
    Message(
        MessageType.HEARTBEATS,
        "",
        "a",
        "b",
        0,
        batch=tuple(
            Message(MessageType.HEARTBEAT, f"p{i}", "a", "b", 3, commit=i, context=b"")
            for i in range(5)
        ),
    ),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.type.name)
def test_every_kind_of_message_round_trips(message: Message) -> None:
    assert decode(encode(message)) == message


def test_entries_keep_their_bytes_exactly() -> None:
    (decoded,) = [decode(encode(APPEND))]
    assert [e.data for e in decoded.entries] == [e.data for e in APPEND.entries]


@given(st.booleans(), st.binary(max_size=512))
def test_random_bytes_raise_only_frame_error(versioned: bool, data: bytes) -> None:
    # half the inputs carry the right version byte, to get past the first check
    with contextlib.suppress(FrameError):
        decode(b"\x01" + data if versioned else data)


@given(st.sampled_from(SAMPLES), st.data())
def test_mutated_frames_decode_or_raise_frame_error(message: Message, data: st.DataObject) -> None:
    frame = bytearray(encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(frame) - 1))
        frame[position] = data.draw(st.integers(0, 255))
    try:
        decoded = decode(bytes(frame))
    except FrameError:
        return
    assert encode(decoded) == bytes(frame)  # anything accepted is exactly what it says


def test_truncated_and_oversized_frames_are_refused() -> None:
    frame = encode(APPEND)
    for cut in range(len(frame)):
        with pytest.raises(FrameError):
            decode(frame[:cut])
    with pytest.raises(FrameError, match="after the message"):
        decode(frame + b"\0")
    with pytest.raises(FrameError, match="exceeds"):
        decode(bytes(MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameError, match="version"):
        decode(b"\x09" + frame[1:])
