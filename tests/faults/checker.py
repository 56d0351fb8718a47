"""The checks, as a pure function of what the clients recorded and what the replicas hold.

What an answer allows (see calls.DEFINITE_STATUSES for the classification, which follows
docs/api.md: a 503 did nothing, a 504 may still commit):
* an acknowledged record must be at the index it was acknowledged with, with its value;
* a record whose every attempt failed definitely must not be in the log at all;
* a `plain` value (no producer id) may be in the log at most once per attempt that succeeded
  or ended ambiguously (each such attempt may have been written once, and only once);
* `idempotent` and `producer` values at most once: retries carry the same producer id and
  sequence, so the broker must deduplicate them;
* an idempotent retry answered `duplicate: true` proves an earlier attempt was written; if
  every earlier attempt was answered 503 (or failed definitely otherwise), a 503 was written.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from laminar.log.batch import iter_records

from .readback import Replica
from .workload import PLAIN, Recorder, Value

EXAMPLES_PER_KIND = 20
DLQ_INDEX = "laminar.dlq.index"
DLQ_PARTITION = "laminar.dlq.partition"
DLQ_GROUP = "laminar.dlq.group"
DLQ_REASON = "laminar.dlq.reason"


@dataclass
class Report:
    violations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)

    def add(self, kind: str, **detail: Any) -> None:
        self.violations.setdefault(kind, []).append(detail)

    def total(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def summary(self) -> dict[str, Any]:
        return {
            "total": self.total(),
            "by_kind": {k: len(v) for k, v in sorted(self.violations.items())},
            "examples": {k: v[:EXAMPLES_PER_KIND] for k, v in sorted(self.violations.items())},
        }


@dataclass
class Stored:
    """One partition's records as its reference replica holds them."""

    values: dict[int, str | None]  # index -> value (user records only)
    headers: dict[int, dict[str, str]]
    source: str  # the node whose copy it is


def reference(report: Report, topic: str, partition: int, replicas: list[Replica]) -> Stored | None:
    """The leader's copy (else the readable one with the highest commit index), decoded;
    unreadable replicas are violations: a replica must serve what it has committed."""
    for r in replicas:
        if r.error is not None:
            report.add("replica_unreadable", partition=f"{topic}/{partition}", node=r.node,
                       error=r.error[:300])  # fmt: skip
    readable = [r for r in replicas if r.error is None]
    if not readable:
        return None
    best = max(readable, key=lambda r: (r.role == "leader", r.commit_index))
    values: dict[int, str | None] = {}
    headers: dict[int, dict[str, str]] = {}
    for _, _, control, batch in best.batches:
        if control:
            continue
        try:
            for index, _, _, value, record_headers in iter_records(batch):
                values[index] = None if value is None else value.decode(errors="replace")
                if record_headers:
                    headers[index] = {n: v.decode(errors="replace") for n, v in record_headers}
        except ValueError as e:
            report.add("undecodable_batch", partition=f"{topic}/{partition}", node=best.node,
                       error=str(e)[:200])  # fmt: skip
    return Stored(values, headers, best.node)


def check_identical(report: Report, topic: str, partition: int, replicas: list[Replica]) -> None:
    """Every readable replica holds the same bytes up to the smallest commit index."""
    readable = [r for r in replicas if r.error is None]
    if len(readable) < 2:
        return
    upto = min(r.commit_index for r in readable)
    copies = {r.node: [b for b in r.batches if b[1] - 1 <= upto] for r in readable}
    nodes = sorted(copies)
    first = copies[nodes[0]]
    for node in nodes[1:]:
        other = copies[node]
        for mine, theirs in zip(first, other, strict=False):
            if mine != theirs:
                report.add("replicas_differ", partition=f"{topic}/{partition}",
                           nodes=[nodes[0], node], base_index=mine[0],
                           other_base_index=theirs[0], upto_commit=upto)  # fmt: skip
                break
        else:
            if len(first) != len(other):
                report.add("replicas_differ", partition=f"{topic}/{partition}",
                           nodes=[nodes[0], node], batches=[len(first), len(other)],
                           upto_commit=upto)  # fmt: skip


def check_values(report: Report, recorder: Recorder, stored: dict[tuple[str, int], Stored]) -> None:
    occurrences: dict[str, list[int]] = defaultdict(list)
    for (topic, partition), copy in stored.items():
        if topic.endswith(".dlq"):
            continue
        for index, text in copy.values.items():
            value = recorder.values.get(text or "")
            if value is None:
                report.add("record_never_sent", partition=f"{topic}/{partition}", index=index,
                           value=(text or "")[:60])  # fmt: skip
            elif (value.topic, value.partition) != (topic, partition):
                report.add("record_in_wrong_partition", partition=f"{topic}/{partition}",
                           index=index, value=value.text[:60])  # fmt: skip
            else:
                occurrences[value.text].append(index)
    for value in recorder.values.values():
        check_value(report, value, sorted(occurrences.get(value.text, [])),
                    stored.get((value.topic, value.partition)))  # fmt: skip
    check_order(report, recorder)


def check_value(report: Report, value: Value, found: list[int], copy: Stored | None) -> None:
    name = value.text[:60]
    where = f"{value.topic}/{value.partition}"
    acked = [a for a in value.attempts if a.index is not None]
    if acked and copy is None:
        report.add("lost_acknowledged", partition=where, value=name, index=value.acked_index,
                   why="the partition is unreadable or gone")  # fmt: skip
        return
    for attempt in acked:
        assert copy is not None and attempt.index is not None
        at = copy.values.get(attempt.index, "<nothing>")
        if at != value.text:
            kind = "lost_acknowledged" if not found else "acknowledged_at_other_index"
            report.add(kind, partition=where, value=name, acked_index=attempt.index,
                       found_at=found, holds=(at or "")[:60], source=copy.source)  # fmt: skip
    if not found:
        return
    if all(a.definite for a in value.attempts):
        report.add("written_though_refused", partition=where, value=name, found_at=found,
                   outcomes=[a.outcome for a in value.attempts])  # fmt: skip
    elif value.mode == PLAIN:
        # each attempt that succeeded or ended ambiguously may have written the value once
        allowed = sum(1 for a in value.attempts if not a.definite)
        if len(found) > allowed:
            report.add("unexplained_duplicate", partition=where, value=name, found_at=found,
                       outcomes=[a.outcome for a in value.attempts])  # fmt: skip
    elif len(found) > 1:
        report.add("duplicate", partition=where, mode=value.mode, value=name, found_at=found,
                   outcomes=[a.outcome for a in value.attempts])  # fmt: skip
    first_of_batch = value.sequence is None or value.seq == value.sequence
    for n, attempt in enumerate(value.attempts if first_of_batch else []):
        if attempt.duplicate:
            before = value.attempts[:n]
            if any(a.outcome.startswith("503") for a in before) and all(
                a.definite or a.outcome.startswith("503") for a in before
            ):
                report.add("answered_503_but_committed", partition=where, value=name,
                           outcomes=[a.outcome for a in value.attempts[: n + 1]],
                           messages=sorted({a.message for a in before}))  # fmt: skip
            break


def check_order(report: Report, recorder: Recorder) -> None:
    """A writer's acknowledged records appear in the order it sent them (per partition)."""
    by_writer: dict[tuple[str, str, int], list[Value]] = defaultdict(list)
    for value in recorder.values.values():
        if value.acked_index is not None:
            by_writer[(value.writer, value.topic, value.partition)].append(value)
    for (writer, topic, partition), values in by_writer.items():
        values.sort(key=lambda v: v.seq)
        for earlier, later in itertools.pairwise(values):
            assert earlier.acked_index is not None and later.acked_index is not None
            if later.acked_index <= earlier.acked_index:
                report.add("order", writer=writer, partition=f"{topic}/{partition}",
                           earlier=[earlier.seq, earlier.acked_index],
                           later=[later.seq, later.acked_index])  # fmt: skip


def check_queue(
    report: Report,
    recorder: Recorder,
    stored: dict[tuple[str, int], Stored],
    topic: str,
    partitions: int,
    groups: list[dict[str, Any]],
    group: str,
) -> None:
    """The total-queue check: dead letters are real messages of the topic, none twice; no
    message granted again after its accept was answered done; every reject answered done is
    in the dead-letter topic exactly once; every acknowledged message was accepted or
    dead-lettered; the group is empty at the end."""
    dlq: Counter[tuple[int, int]] = Counter()
    for p in range(partitions):
        copy = stored.get((f"{topic}.dlq", p))
        if copy is None:
            continue
        for index, text in copy.values.items():
            headers = copy.headers.get(index, {})
            if headers.get(DLQ_GROUP) != group:
                continue
            original = (int(headers.get(DLQ_PARTITION, -1)), int(headers.get(DLQ_INDEX, -1)))
            dlq[original] += 1
            source = stored.get((topic, original[0]))
            if source is None or source.values.get(original[1], "<nothing>") != text:
                report.add("dead_letter_mismatch", dlq=f"{topic}.dlq/{p}", index=index,
                           original=list(original), value=(text or "")[:60])  # fmt: skip
    for original, count in dlq.items():
        if count > 1:
            report.add("dead_lettered_twice", message=list(original), count=count)
    accepted_done: dict[tuple[int, int], float] = {}
    rejected_done: set[tuple[int, int]] = set()
    accept_ambiguous: set[tuple[int, int]] = set()
    for s in recorder.settles:
        for i in s.done:
            key = (s.partition, i)
            if s.action == "accept":
                accepted_done[key] = min(accepted_done.get(key, s.answered_s), s.answered_s)
            elif s.action == "reject":
                rejected_done.add(key)
        if s.action == "accept" and not s.outcome.startswith("2"):
            accept_ambiguous.update((s.partition, i) for i in s.indexes)
    # no message delivered again after its accept was answered done: a grant whose acquire
    # was sent after that answer came back
    for g in recorder.grants:
        done_s = accepted_done.get((g.partition, g.index))
        if done_s is not None and g.sent_s > done_s:
            report.add("redelivered_after_accept", message=[g.partition, g.index],
                       consumer=g.consumer, deliveries=g.deliveries)  # fmt: skip
        copy = stored.get((topic, g.partition))
        if copy is not None and copy.values.get(g.index, "<nothing>") != g.value:
            report.add("grant_value_mismatch", message=[g.partition, g.index],
                       granted=(g.value or "")[:60],
                       stored=(copy.values.get(g.index) or "")[:60])  # fmt: skip
    for key in sorted(rejected_done):
        if dlq[key] != 1:
            report.add("rejected_not_dead_lettered_once", message=list(key), in_dlq=dlq[key],
                       story=message_story(recorder, key))  # fmt: skip
    # every acknowledged message was accepted or dead-lettered; an accept whose answer was
    # lost may have been applied, so it explains a message that is in neither
    for value in recorder.values.values():
        if value.topic != topic or value.acked_index is None:
            continue
        key = (value.partition, value.acked_index)
        if key not in accepted_done and not dlq[key] and key not in accept_ambiguous:
            report.add("queue_message_unfinished", message=list(key), value=value.text[:60],
                       story=message_story(recorder, key))  # fmt: skip
    for p, description in enumerate(groups):
        if description.get("pending") != 0 or description.get("acquired") != 0:
            report.add("queue_not_drained", partition=p, group=description)
        if description.get("dead_letter_pending") != 0:
            report.add("dead_letters_stuck", partition=p, group=description)


def message_story(recorder: Recorder, key: tuple[int, int]) -> list[str]:
    """What the consumers did with one message, in time order (monotonic seconds)."""
    partition, index = key
    events = [
        (g.sent_s, f"{g.sent_s:.2f}-{g.answered_s:.2f} {g.consumer} granted, deliveries "
                   f"{g.deliveries}, lease until {g.lease_deadline_ms}")
        for g in recorder.grants
        if (g.partition, g.index) == key
    ]  # fmt: skip
    for s in recorder.settles:
        if s.partition == partition and index in s.indexes:
            answer = "done" if index in s.done else "refused" if index in s.refused else "?"
            events.append(
                (s.sent_s, f"{s.sent_s:.2f}-{s.answered_s:.2f} {s.consumer} {s.action}: "
                           f"{s.outcome} {answer}")
            )  # fmt: skip
    return [text for _, text in sorted(events)]


def check(
    recorder: Recorder,
    replicas: dict[tuple[str, int], list[Replica]],
    queue_topic: str,
    queue_partitions: int,
    groups: list[dict[str, Any]],
    group: str,
) -> Report:
    report = Report()
    stored: dict[tuple[str, int], Stored] = {}
    for (topic, partition), copies in sorted(replicas.items()):
        copy = reference(report, topic, partition, copies)
        if copy is not None:
            stored[(topic, partition)] = copy
        check_identical(report, topic, partition, copies)
    check_values(report, recorder, stored)
    check_queue(report, recorder, stored, queue_topic, queue_partitions, groups, group)
    for bad in recorder.bad_answers:
        report.add(bad["kind"], **{k: v for k, v in bad.items() if k != "kind"})
    modes = Counter(v.mode for v in recorder.values.values())
    acked = Counter(v.mode for v in recorder.values.values() if v.acked_index is not None)
    writers: dict[str, list[int]] = {}
    for value in recorder.values.values():
        sent_acked = writers.setdefault(value.writer, [0, 0])
        sent_acked[0] += 1
        sent_acked[1] += value.acked_index is not None
    report.counts = {
        "values_sent_acknowledged_by_writer": dict(sorted(writers.items())),
        "values_sent": dict(modes),
        "values_acknowledged": dict(acked),
        "attempts": sum(len(v.attempts) for v in recorder.values.values()),
        "attempt_outcomes": dict(
            Counter(a.outcome for v in recorder.values.values() for a in v.attempts)
        ),
        "grants": len(recorder.grants),
        "settles": dict(Counter(f"{s.action}:{s.outcome}" for s in recorder.settles)),
        "partitions_read": len(stored),
        "replicas_read": sum(len(c) for c in replicas.values()),
        "replica_reads_retried_while_repairing": {
            f"{r.node}:{r.topic}/{r.partition}": r.retries
            for copies in replicas.values()
            for r in copies
            if r.retries
        },
        "records_read": sum(len(c.values) for c in stored.values()),
    }
    return report
