"""Who hosts and leads what, as every broker holds it: the partition status table.

Each broker publishes a report of the replicas it hosts (`Broker.group_status`: role, leader,
term, voters, learners, in-sync set, log start, commit index, log end, bytes) to every peer,
over the peer transport (a node-level STATUS message, docs/formats.md §7), with a version
that only grows (a restarted broker starts above its earlier versions: they are derived from
the wall clock). It sends one as soon as what it leads or hosts changes (role, leader, term,
configuration, a led partition's in-sync set), and at least every REFRESH_MS with fresh
indexes.

The table keeps the newest report per broker. The view it gives (`view`) is what a broker
routes by, what replica collection and the Kubernetes reporter read, and what
`GET /v1/partitions` serves: each alive broker's report no older than STALE_MS. A group's
leader is the report claiming leadership in the highest term (`leaders`). Nothing here is
scraped over HTTP; a peer's report is a peer's word, checked for shape (`decode_report`), and
peers are authenticated by the transport's handshake.

Pure: no clock, no I/O (callers pass `now_ms`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..metadata.state import Topic
from ..placement import Candidate, hosts, partition_key
from ..raft.messages import Entry, Message, MessageType

#: A broker re-sends its report at least this often (fresh commit indexes and in-sync sets).
REFRESH_MS = 1_000
#: A report older than this is left out of the view (its broker stopped reporting to us).
STALE_MS = 5_000
#: What dropping a replica may act on: reports this fresh only, so that two looks some
#: seconds apart read two reports, never one report twice (a leader that stopped
#: reporting to us drops nothing).
FRESH_MS = 2 * REFRESH_MS
#: A report this large (decompressed) is refused: 4,096 replicas of ~300 bytes fit 5 times.
MAX_REPORT_BYTES = 8 << 20
#: The fields of a row, and the types each must have.
ROW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "topic": str,
    "partition": int,
    "role": str,
    "leader": (str, type(None)),
    "term": int,
    "voters": list,
    "learners": list,
    "in_sync": list,
    "log_start": int,
    "commit_index": int,
    "log_end": int,
    "bytes": int,
}

Row = dict[str, Any]
#: every member's hosted replicas, as `GET /v1/nodes/{id}/partitions` reports them
View = Mapping[str, list[Row]]


class ReportError(ValueError):
    """A peer's report that is not one."""


def encode_report(rows: list[Row]) -> bytes:
    return zlib.compress(orjson.dumps(rows), 1)


def decode_report(data: bytes) -> list[Row]:
    """The rows of a report (ReportError: malformed, too large, or rows of the wrong shape)."""
    try:
        decompressor = zlib.decompressobj()
        raw = decompressor.decompress(data, MAX_REPORT_BYTES)
        if decompressor.unconsumed_tail or not decompressor.eof:
            raise ReportError(f"a report over {MAX_REPORT_BYTES} bytes, or truncated")
        rows = orjson.loads(raw)
    except (zlib.error, orjson.JSONDecodeError) as e:
        raise ReportError(f"undecodable report: {e}") from e
    if not isinstance(rows, list):
        raise ReportError("a report is a list of rows")
    for row in rows:
        if not isinstance(row, dict):
            raise ReportError("a row is an object")
        for name, kind in ROW_FIELDS.items():
            value = row.get(name)
            if name not in row or not isinstance(value, kind) or isinstance(value, bool):
                raise ReportError(f"row field {name!r} is missing or of the wrong type")
        for name in ("voters", "learners", "in_sync"):
            if not all(isinstance(node, str) for node in row[name]):
                raise ReportError(f"row field {name!r} lists a non-string")
    return rows


@dataclass(slots=True)
class Report:
    version: int
    rows: list[Row]
    received_ms: int
    #: the encoded rows as received (b"": not known): a newer report with the same bytes
    #: is not decoded again
    data: bytes = b""


class StatusTable:
    """The newest report of every other broker (this broker's own rows are read live)."""

    def __init__(self) -> None:
        self._reports: dict[str, Report] = {}

    def merge(
        self, node: str, version: int, rows: list[Row], now_ms: int, data: bytes = b""
    ) -> bool:
        """Keep `node`'s report if it is newer than the one held (False: an older one,
        reordered or replayed, is ignored); `data`: its encoding, if known."""
        held = self._reports.get(node)
        if held is not None and held.version >= version:
            return False
        self._reports[node] = Report(version, rows, now_ms, data)
        return True

    def receive(self, message: Message, now_ms: int) -> bool:
        """Merge the report a STATUS message carries (ReportError: not a report). A report
        whose bytes are those of the one held (an idle broker's refresh) is not decoded
        again: its rows are the held ones, as of now."""
        data = bytes(message.entries[0].data)
        held = self._reports.get(message.src)
        if held is not None and held.data and held.data == data:
            rows = held.rows
        else:
            rows = decode_report(data)
        return self.merge(message.src, message.index, rows, now_ms, data)

    def forget(self, node: str) -> None:
        """`node` left or died: its report no longer counts."""
        self._reports.pop(node, None)

    def version_of(self, node: str) -> int | None:
        held = self._reports.get(node)
        return None if held is None else held.version

    def view(
        self, alive: set[str], now_ms: int, max_age_ms: int = STALE_MS
    ) -> dict[str, list[Row]]:
        """Each alive broker's rows, from reports no older than `max_age_ms`."""
        return {
            node: report.rows
            for node, report in self._reports.items()
            if node in alive and now_ms - report.received_ms <= max_age_ms
        }


class StatusPublisher:
    """When a broker sends its report, and the messages that carry it: at once when the
    structure of what it hosts changed (`shape`), else every REFRESH_MS, or when asked."""

    def __init__(self, node_id: str, first_version: int) -> None:
        """`first_version`: above any this broker sent before (the caller derives it from
        the wall clock, so that versions grow across restarts)."""
        self.id = node_id
        self.version = first_version
        self._published: object = None
        self._published_ms = 0
        #: the last report's encoding, and the key it was encoded for (`publish`'s `reuse`)
        self._encoded = b""
        self._encoded_for: object = None

    def due(self, shape: object, now_ms: int) -> bool:
        return now_ms - self._published_ms >= REFRESH_MS or shape != self._published

    def publish(
        self,
        shape: object,
        rows: list[Row] | Callable[[], list[Row]],
        peers: list[str],
        now_ms: int,
        *,
        reuse: object = None,
    ) -> list[Message]:
        """STATUS messages with `rows` (or what calling it returns) to `peers`, recording
        `shape` as published (an answer to one peer's request passes `shape` None: it
        records nothing). `reuse`: a key that, equal to the one of the last report sent,
        says the rows are unchanged since: that report's encoding is sent again, without
        calling or encoding `rows`."""
        if shape is not None:
            self._published, self._published_ms = shape, now_ms
        if not peers:
            return []
        self.version += 1
        if reuse is None or reuse != self._encoded_for:
            self._encoded = encode_report(rows() if callable(rows) else rows)
            self._encoded_for = reuse
        entry = Entry(0, 1, 0, self._encoded)
        return [
            Message(MessageType.STATUS, "", self.id, peer, 0, index=self.version, entries=(entry,))
            for peer in peers
        ]


def is_request(message: Message) -> bool:
    """A STATUS message without a report: its sender asks for ours."""
    return not message.entries


def leaders(view: Mapping[str, list[Row]]) -> dict[str, Row]:
    """Per group ("topic/partition"): the row of the replica that claims leadership in the
    highest term."""
    found: dict[str, Row] = {}
    for rows in view.values():
        for row in rows:
            if row.get("role") != "leader":
                continue
            group = f"{row['topic']}/{row['partition']}"
            best = found.get(group)
            if best is None or int(row["term"]) > int(best["term"]):
                found[group] = row
    return found


def misplaced_partitions(
    view: Mapping[str, list[Row]], topics: Mapping[str, Topic], candidates: Sequence[Candidate]
) -> int:
    """How many led partitions are not yet where placement wants them: their leader's Raft
    configuration has learners (replicas catching up) or voters other than the placement's
    choice. 0 once a rebalance (a broker added, drained or reweighted) has converged.
    Leaderless partitions are not counted: they are under-replicated, not moving."""
    led = leaders(view)
    moving = 0
    for name, topic in topics.items():
        for partition in range(topic.partitions):
            key = partition_key(name, partition)
            report = led.get(key)
            if report is None:
                continue
            target = hosts(key, candidates, topic.replication_factor)
            if report["learners"] or set(report["voters"]) != set(target):
                moving += 1
    return moving
