"""Binary encoding of Raft messages for the peer transport (`docs/formats.md` §6).

A message is one frame body: versioned, little-endian, every length bounded. Entries carry
their batches as they are stored, so a follower appends exactly the bytes the leader holds.
`decode` raises only `FrameError`, whatever the input; the transport closes a connection
that sends one.
"""

from __future__ import annotations

import struct

from .messages import (
    ConfState,
    Entry,
    EntryKind,
    Message,
    MessageType,
    Snapshot,
)

FRAME_VERSION = 1
MAX_FRAME_BYTES = 64 << 20  # a frame larger than this is refused before it is read
MAX_ENTRIES = 1 << 16
MAX_FOLDED = 1 << 16  # heartbeats folded into one HEARTBEATS message
MAX_MEMBERS = 255

_HEAD = struct.Struct("<BBqqqqqB")  # version, type, term, log_term, index, commit, hint, reject
_ENTRY = struct.Struct("<qIqBI")  # index, count, term, kind, data length
_SNAPSHOT = struct.Struct("<qqI")  # index, term, data length
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


class FrameError(ValueError):
    """Bytes that are not a valid Raft message frame."""


def encode(message: Message) -> bytes:
    parts: list[bytes] = []
    _encode_into(message, parts, nested=False)
    return b"".join(parts)


def _str(value: str, parts: list[bytes], width: struct.Struct) -> None:
    data = value.encode()
    parts.append(width.pack(len(data)))
    parts.append(data)


def _encode_into(message: Message, parts: list[bytes], *, nested: bool) -> None:
    parts.append(
        _HEAD.pack(
            FRAME_VERSION,
            message.type,
            message.term,
            message.log_term,
            message.index,
            message.commit,
            message.reject_hint,
            message.reject,
        )
    )
    _str(message.group, parts, _U16)
    _str(message.src, parts, _U8)
    _str(message.dst, parts, _U8)
    parts.append(_U16.pack(len(message.context)))
    parts.append(message.context)
    parts.append(_U32.pack(len(message.entries)))
    for entry in message.entries:
        parts.append(_ENTRY.pack(entry.index, entry.count, entry.term, entry.kind, len(entry.data)))
        parts.append(entry.data)
    snapshot = message.snapshot
    parts.append(_U8.pack(snapshot is not None))
    if snapshot is not None:
        parts.append(_SNAPSHOT.pack(snapshot.index, snapshot.term, len(snapshot.data)))
        parts.append(snapshot.data)
        for members in (snapshot.conf.voters, snapshot.conf.learners):
            parts.append(_U8.pack(len(members)))
            for member in members:
                _str(member, parts, _U8)
    if nested and message.batch:
        raise ValueError("folded messages do not nest")
    parts.append(_U32.pack(len(message.batch)))
    for part in message.batch:
        _encode_into(part, parts, nested=True)


class _Reader:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def take(self, length: int) -> bytes:
        end = self.position + length
        if length < 0 or end > len(self.data):
            raise FrameError(f"frame truncated: {length} bytes wanted at {self.position}")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def unpack(self, shape: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = shape.unpack(self.take(shape.size))
        return values

    def text(self, width: struct.Struct) -> str:
        (length,) = self.unpack(width)
        try:
            return self.take(length).decode()
        except UnicodeDecodeError as e:
            raise FrameError(f"invalid UTF-8 in frame: {e}") from e


def decode(data: bytes) -> Message:
    """Parse one frame body; FrameError for anything malformed."""
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    reader = _Reader(data)
    message = _decode_from(reader, nested=False)
    if reader.position != len(data):
        raise FrameError(f"{len(data) - reader.position} bytes after the message")
    return message


def _decode_from(reader: _Reader, *, nested: bool) -> Message:
    version, kind, term, log_term, index, commit, hint, reject = reader.unpack(_HEAD)
    if version != FRAME_VERSION:
        raise FrameError(f"unsupported frame version {version}")
    if reject > 1:
        raise FrameError("bad reject flag")
    try:
        message_type = MessageType(kind)
    except ValueError as e:
        raise FrameError(f"unknown message type {kind}") from e
    if term < 0 or log_term < 0:
        raise FrameError("negative term")
    group = reader.text(_U16)
    src = reader.text(_U8)
    dst = reader.text(_U8)
    (context_bytes,) = reader.unpack(_U16)
    context = reader.take(context_bytes)
    (entry_count,) = reader.unpack(_U32)
    if entry_count > MAX_ENTRIES:
        raise FrameError(f"{entry_count} entries exceed {MAX_ENTRIES}")
    entries = []
    for _ in range(entry_count):
        entry_index, count, entry_term, entry_kind, data_bytes = reader.unpack(_ENTRY)
        if count < 1 or entry_term < 0:
            raise FrameError("an entry needs at least one record and a term")
        try:
            kind_value = EntryKind(entry_kind)
        except ValueError as e:
            raise FrameError(f"unknown entry kind {entry_kind}") from e
        entries.append(Entry(entry_index, count, entry_term, reader.take(data_bytes), kind_value))
    (has_snapshot,) = reader.unpack(_U8)
    snapshot = None
    if has_snapshot > 1:
        raise FrameError("bad snapshot flag")
    if has_snapshot:
        snapshot_index, snapshot_term, data_bytes = reader.unpack(_SNAPSHOT)
        snapshot_data = reader.take(data_bytes)
        groups = []
        for _ in range(2):
            (members,) = reader.unpack(_U8)
            groups.append(tuple(reader.text(_U8) for _ in range(members)))
        snapshot = Snapshot(
            snapshot_index, snapshot_term, ConfState(groups[0], groups[1]), snapshot_data
        )
    (folded_count,) = reader.unpack(_U32)
    if folded_count and nested:
        raise FrameError("folded messages do not nest")
    if folded_count > MAX_FOLDED:
        raise FrameError(f"{folded_count} folded messages exceed {MAX_FOLDED}")
    folded = tuple(_decode_from(reader, nested=True) for _ in range(folded_count))
    return Message(
        message_type,
        group,
        src,
        dst,
        term,
        log_term=log_term,
        index=index,
        entries=tuple(entries),
        commit=commit,
        reject=bool(reject),
        reject_hint=hint,
        context=context,
        snapshot=snapshot,
        batch=folded,
    )
