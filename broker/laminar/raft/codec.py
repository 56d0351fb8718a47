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
    group, src, dst = message.group.encode(), message.src.encode(), message.dst.encode()
    context, entries = message.context, message.entries
    parts += (
        _HEAD.pack(
            FRAME_VERSION,
            message.type,
            message.term,
            message.log_term,
            message.index,
            message.commit,
            message.reject_hint,
            message.reject,
        ),
        _U16.pack(len(group)),
        group,
        _U8.pack(len(src)),
        src,
        _U8.pack(len(dst)),
        dst,
        _U16.pack(len(context)),
        context,
        _U32.pack(len(entries)),
    )
    for entry in entries:
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


_MESSAGE_TYPES = {t.value: t for t in MessageType}
_ENTRY_KINDS = {k.value: k for k in EntryKind}


def _text(data: bytes, start: int, length: int) -> str:
    try:
        return data[start : start + length].decode()
    except UnicodeDecodeError as e:
        raise FrameError(f"invalid UTF-8 in frame: {e}") from e


def _truncated(want: int, position: int) -> FrameError:
    return FrameError(f"frame truncated: {want} bytes wanted at {position}")


def decode(data: bytes) -> Message:
    """Parse one frame body; FrameError for anything malformed."""
    if len(data) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    message, position = _decode_from(data, 0, nested=False)
    if position != len(data):
        raise FrameError(f"{len(data) - position} bytes after the message")
    return message


def _decode_from(data: bytes, p: int, *, nested: bool) -> tuple[Message, int]:
    """The message at `p` in `data`, and where it ends. Offsets are kept in locals and every
    length is checked against `size` before it is used (a peer's frames are on the hot path
    of every round: a reader object with a method call per field cost 2-3x this)."""
    size = len(data)
    if p + _HEAD.size > size:
        raise _truncated(_HEAD.size, p)
    version, kind, term, log_term, index, commit, hint, reject = _HEAD.unpack_from(data, p)
    p += _HEAD.size
    if version != FRAME_VERSION:
        raise FrameError(f"unsupported frame version {version}")
    if reject > 1:
        raise FrameError("bad reject flag")
    message_type = _MESSAGE_TYPES.get(kind)
    if message_type is None:
        raise FrameError(f"unknown message type {kind}")
    if term < 0 or log_term < 0:
        raise FrameError("negative term")
    try:
        if p + 2 > size:
            raise _truncated(2, p)
        end = p + 2 + _U16.unpack_from(data, p)[0]
        if end + 1 > size:
            raise _truncated(end + 1 - p, p)
        group = data[p + 2 : end].decode()
        p = end + 1 + data[end]
        if p + 1 > size:
            raise _truncated(p + 1 - end, end)
        src = data[end + 1 : p].decode()
        end = p + 1 + data[p]
        if end + 6 > size:
            raise _truncated(end + 6 - p, p)
        dst = data[p + 1 : end].decode()
    except UnicodeDecodeError as e:
        raise FrameError(f"invalid UTF-8 in frame: {e}") from e
    p = end
    (context_bytes,) = _U16.unpack_from(data, p)
    p += 2
    if p + context_bytes + 4 > size:
        raise _truncated(context_bytes + 4, p)
    context = data[p : p + context_bytes]
    p += context_bytes
    (entry_count,) = _U32.unpack_from(data, p)
    p += 4
    if entry_count > MAX_ENTRIES:
        raise FrameError(f"{entry_count} entries exceed {MAX_ENTRIES}")
    entries = []
    entry_size = _ENTRY.size
    for _ in range(entry_count):
        if p + entry_size > size:
            raise _truncated(entry_size, p)
        entry_index, count, entry_term, entry_kind, data_bytes = _ENTRY.unpack_from(data, p)
        p += entry_size
        if count < 1 or entry_term < 0:
            raise FrameError("an entry needs at least one record and a term")
        kind_value = _ENTRY_KINDS.get(entry_kind)
        if kind_value is None:
            raise FrameError(f"unknown entry kind {entry_kind}")
        if p + data_bytes > size:
            raise _truncated(data_bytes, p)
        entries.append(Entry(entry_index, count, entry_term, data[p : p + data_bytes], kind_value))
        p += data_bytes
    if p + 1 > size:
        raise _truncated(1, p)
    has_snapshot = data[p]
    p += 1
    if has_snapshot > 1:
        raise FrameError("bad snapshot flag")
    snapshot = None
    if has_snapshot:
        snapshot, p = _decode_snapshot(data, p)
    if p + 4 > size:
        raise _truncated(4, p)
    (folded_count,) = _U32.unpack_from(data, p)
    p += 4
    if folded_count and nested:
        raise FrameError("folded messages do not nest")
    if folded_count > MAX_FOLDED:
        raise FrameError(f"{folded_count} folded messages exceed {MAX_FOLDED}")
    folded = []
    for _ in range(folded_count):
        part, p = _decode_from(data, p, nested=True)
        folded.append(part)
    message = Message(
        message_type,
        group,
        src,
        dst,
        term,
        log_term,
        index,
        tuple(entries),
        commit,
        bool(reject),
        hint,
        context,
        snapshot,
        tuple(folded),
    )
    return message, p


def _decode_snapshot(data: bytes, p: int) -> tuple[Snapshot, int]:
    size = len(data)
    if p + _SNAPSHOT.size > size:
        raise _truncated(_SNAPSHOT.size, p)
    snapshot_index, snapshot_term, data_bytes = _SNAPSHOT.unpack_from(data, p)
    p += _SNAPSHOT.size
    if p + data_bytes > size:
        raise _truncated(data_bytes, p)
    snapshot_data = data[p : p + data_bytes]
    p += data_bytes
    groups = []
    for _ in range(2):  # voters, learners: a u8 count of str8 ids
        if p + 1 > size:
            raise _truncated(1, p)
        members = data[p]
        p += 1
        names = []
        for _ in range(members):
            if p + 1 > size:
                raise _truncated(1, p)
            length = data[p]
            p += 1
            if p + length > size:
                raise _truncated(length, p)
            names.append(_text(data, p, length))
            p += length
        groups.append(tuple(names))
    conf = ConfState(groups[0], groups[1])
    return Snapshot(snapshot_index, snapshot_term, conf, snapshot_data), p
