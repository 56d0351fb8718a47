"""Records in JSON (docs/api.md, "Records"): an append's request and result, a read's result.

A record's key, value and header values are bytes; JSON carries them as UTF-8 text, or, when
one of them is not UTF-8, all three as base64 with `"encoding": "base64"`. The records are the
log's own types (`laminar.log.batch`): `Record` to append, `StoredRecord` read back, so that
the binary format (docs/formats.md) and JSON decode to the same objects.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from ..contract import MAX_APPEND_RECORDS, MAX_INDEX
from ..log.batch import MAX_HEADERS_PER_RECORD, Record, StoredRecord
from ..log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from .checks import (
    ModelError,
    TooLargeError,
    boolean,
    integer,
    is_int,
    json_object,
    objects,
)

#: A record header name is at most this many bytes of UTF-8 (the batch format's u16).
MAX_HEADER_NAME_BYTES = 2**16 - 1
BASE64 = "base64"
RECORD_FIELDS = frozenset({"key", "value", "headers", "encoding", "timestamp_ms"})

Headers = tuple[tuple[str, bytes], ...]


# ---- key, value and headers ----------------------------------------------------------------


def payload_to_json(key: bytes | None, value: bytes | None, headers: Headers) -> dict[str, Any]:
    """`key`, `value` and `headers` as JSON: text, or all three base64 (with `encoding`)."""
    try:
        return {
            "key": None if key is None else key.decode(),
            "value": None if value is None else value.decode(),
            "headers": {name: data.decode() for name, data in headers},
        }
    except UnicodeDecodeError:
        return {
            "encoding": BASE64,
            "key": _b64(key),
            "value": _b64(value),
            "headers": {name: base64.b64encode(data).decode() for name, data in headers},
        }


def payload_from_json(obj: Any) -> tuple[bytes | None, bytes | None, Headers]:
    """The key, value and headers of a record or message as JSON shows them."""
    encoding = obj.get("encoding", "utf-8")
    if encoding not in ("utf-8", BASE64):
        raise ModelError(f'encoding must be "utf-8" or "base64", not {encoding!r:.40}')
    binary = encoding == BASE64
    headers = json_object(obj.get("headers") or {}, "headers must be an object")
    pairs = tuple((name, _field(data, binary, "a header") or b"") for name, data in headers.items())
    return _field(obj.get("key"), binary, "key"), _field(obj.get("value"), binary, "value"), pairs


def record_to_json(record: StoredRecord) -> dict[str, Any]:
    """A stored record as a JSON read answers it (written out for text, the common case: a
    read answers up to 100,000 records)."""
    key, value = record.key, record.value
    try:
        return {
            "index": record.index,
            "timestamp_ms": record.timestamp_ms,
            "key": None if key is None else key.decode(),
            "value": None if value is None else value.decode(),
            "headers": {name: data.decode() for name, data in record.headers},
        }
    except UnicodeDecodeError:
        return {
            "index": record.index,
            "timestamp_ms": record.timestamp_ms,
            **payload_to_json(key, value, record.headers),
        }


def record_from_json(obj: Any) -> StoredRecord:
    """A record of a JSON read answer (ModelError if it is not one)."""
    obj = json_object(obj, "a record must be an object")
    key, value, headers = payload_from_json(obj)
    return StoredRecord(integer(obj, "index"), integer(obj, "timestamp_ms"), key, value, headers)


def _field(data: object, binary: bool, what: str) -> bytes | None:
    if data is None:
        return None
    if not isinstance(data, str):
        raise ModelError(f"{what} must be a string or null")
    if not binary:
        return data.encode()
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ModelError(f"{what} is not valid base64") from e


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


# ---- appends -------------------------------------------------------------------------------


def append_record_to_json(record: Record) -> dict[str, Any]:
    """A record to append as a JSON append carries it."""
    item = payload_to_json(record.key, record.value, record.headers)
    if record.timestamp_ms is not None:
        item["timestamp_ms"] = record.timestamp_ms
    return item


def append_record_from_json(n: int, item: Any) -> Record:
    """`records[n]` of a JSON append (ModelError, with the broker's message, if it is not a
    record the broker takes)."""
    if not isinstance(item, dict):
        raise ModelError(f"records[{n}] must be an object")
    unknown = set(item) - RECORD_FIELDS
    if unknown:
        raise ModelError(f"records[{n}] has unknown fields {sorted(unknown)}")
    encoding = item.get("encoding", "utf-8")
    if encoding not in ("utf-8", BASE64):
        raise ModelError(f'records[{n}].encoding must be "utf-8" or "base64"')
    binary = encoding == BASE64
    headers = item.get("headers")
    if headers is None:
        headers = {}
    if not isinstance(headers, dict):
        raise ModelError(f"records[{n}].headers must be an object")
    if len(headers) > MAX_HEADERS_PER_RECORD:
        raise ModelError(f"records[{n}] has more than {MAX_HEADERS_PER_RECORD} headers")
    pairs = []
    for name, data in headers.items():
        what = f"records[{n}].headers[{name[:40]!r}]"
        if len(_append_field(name, False, f"{what} name") or b"") > MAX_HEADER_NAME_BYTES:
            raise ModelError(f"{what}: a name is at most {MAX_HEADER_NAME_BYTES} bytes")
        pairs.append((name, _append_field(data, binary, what) or b""))
    timestamp = item.get("timestamp_ms")
    if timestamp is not None and (
        not is_int(timestamp) or not MIN_TIMESTAMP_MS <= timestamp <= MAX_TIMESTAMP_MS
    ):
        raise ModelError(
            f"records[{n}].timestamp_ms must be an integer in [{MIN_TIMESTAMP_MS}, "
            f"{MAX_TIMESTAMP_MS}] (ms since the epoch, up to the end of the year 9999)"
        )
    return Record(
        value=_append_field(item.get("value"), binary, f"records[{n}].value"),
        key=_append_field(item.get("key"), binary, f"records[{n}].key"),
        headers=tuple(pairs),
        timestamp_ms=timestamp,
    )


def _append_field(data: Any, binary: bool, what: str) -> bytes | None:
    if data is None:
        return None
    if not isinstance(data, str):
        raise ModelError(f"{what} must be a string or null")
    if not binary:
        try:
            return data.encode()
        except UnicodeEncodeError as e:  # a lone surrogate (the JSON parser refuses them too)
            raise ModelError(f"{what} is not valid Unicode") from e
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ModelError(f"{what} is not valid base64") from e


def _producer_int(document: Any, name: str, low: int) -> int | None:
    value = document.get(name)
    if value is None:
        return None
    if not is_int(value) or not low <= value <= MAX_INDEX:
        raise ModelError(f"{name} must be an integer in [{low}, 2^63-1]")
    return int(value)


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """A JSON append: its records, and the idempotent producer's id and sequence (both or
    neither), and whether it is part of that producer's transaction (`transactional`: the
    id is a transactional producer's, docs/transactions.md). A binary append carries the same
    in its batch header instead."""

    SCHEMA: ClassVar[str] = "#/components/schemas/AppendRequest"

    records: tuple[Record, ...]
    producer_id: int | None = None
    sequence: int | None = None
    transactional: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"records": [append_record_to_json(r) for r in self.records]}
        if self.producer_id is not None:
            out["producer_id"] = self.producer_id
        if self.sequence is not None:
            out["sequence"] = self.sequence
        if self.transactional:
            out["transactional"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        """ModelError with the broker's message; TooLargeError over MAX_APPEND_RECORDS."""
        if not isinstance(obj, dict) or not isinstance(obj.get("records"), list):
            raise ModelError('the body must be {"records": [...]}')
        items = obj["records"]
        if not items:
            raise ModelError("records must not be empty")
        if len(items) > MAX_APPEND_RECORDS:
            raise TooLargeError(
                f"a JSON append carries at most {MAX_APPEND_RECORDS} records, not {len(items)}: "
                "split it (or send a binary batch)"
            )
        producer_id = _producer_int(obj, "producer_id", 1)
        sequence = _producer_int(obj, "sequence", 0)
        if (producer_id is None) != (sequence is None):
            raise ModelError("give producer_id and sequence together")
        transactional = boolean(obj, "transactional") if "transactional" in obj else False
        if "transactional" in obj and producer_id is None:
            raise ModelError("a transactional append needs its producer_id and sequence")
        records = tuple(append_record_from_json(n, item) for n, item in enumerate(items))
        return cls(records, producer_id, sequence, transactional)


@dataclass(frozen=True, slots=True)
class AppendResult:
    """A committed append: the batch's first index, its record count, and whether the broker
    had already written it (an idempotent retry: then `base_index` is the original one)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/AppendResult"

    base_index: int
    count: int
    duplicate: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"base_index": self.base_index, "count": self.count, "duplicate": self.duplicate}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(integer(obj, "base_index"), integer(obj, "count"), boolean(obj, "duplicate"))


# ---- reads ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Records read from one partition, in index order, and where to read next; a binary read
    answers the same (its positions in headers: laminar.contract)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/ReadResult"

    records: list[StoredRecord]
    next_index: int
    commit_index: int
    log_start: int

    def to_json(self) -> dict[str, Any]:
        return {
            "records": [record_to_json(record) for record in self.records],
            "next_index": self.next_index,
            "commit_index": self.commit_index,
            "log_start": self.log_start,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            [record_from_json(item) for item in objects(obj, "records")],
            integer(obj, "next_index"),
            integer(obj, "commit_index"),
            integer(obj, "log_start"),
        )
