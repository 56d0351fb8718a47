"""The checker, the schedule and the bit flip on made-up histories (no broker, no root): each
rule fires on the history that breaks it and stays quiet on the one that does not."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from laminar.log import LogConfig
from laminar.log.batch import StoredRecord, single_record_batch
from laminar.log.errors import CorruptBatchError
from laminar.log.segmented_log import SegmentedLog
from laminar.log.storage import FileDirectory

from .bitflip import flip_sealed_bit, sealed_segments
from .checker import check
from .readback import Replica, convergence_gaps
from .schedule import KINDS, make_schedule, parse_kinds
from .workload import IDEMPOTENT, PLAIN, Attempt, Grant, Recorder, Settle, Value, make_text

pytestmark = pytest.mark.faults


def ok(index: int, duplicate: bool = False) -> Attempt:
    return Attempt(1.0, 1.1, "200", False, index=index, duplicate=duplicate)


def failed(outcome: str, definite: bool) -> Attempt:
    return Attempt(1.0, 1.1, outcome, definite)


def value(writer: str, seq: int, attempts: list[Attempt], mode: str = PLAIN, topic: str = "t",
          partition: int = 0) -> Value:  # fmt: skip
    v = Value(writer, mode, topic, partition, seq, make_text(writer, seq, 4), attempts)
    acked = [a.index for a in attempts if a.index is not None]
    v.acked_index = acked[-1] if acked else None
    if mode == IDEMPOTENT:
        v.producer_id, v.sequence = 7, seq
    return v


def replica(node: str, records: dict[int, str | None], topic: str = "t", partition: int = 0,
            headers: dict[int, dict[str, str]] | None = None) -> Replica:  # fmt: skip
    r = Replica(node, topic, partition, "leader" if node == "n1" else "follower",
                max(records, default=-1), 0)  # fmt: skip
    for index, text in sorted(records.items()):
        items = tuple((k, v.encode()) for k, v in (headers or {}).get(index, {}).items())
        stored = StoredRecord(index, 0, None, None if text is None else text.encode(), items)
        r.batches.append((index, index + 1, False, single_record_batch(stored, 1)))
    return r


def run_check(recorder: Recorder, *replicas: Replica, groups: list[dict[str, int]] | None = None):  # type: ignore[no-untyped-def]
    by_partition: dict[tuple[str, int], list[Replica]] = {}
    for r in replicas:
        by_partition.setdefault((r.topic, r.partition), []).append(r)
    empty = {"pending": 0, "acquired": 0, "dead_letter_pending": 0}
    return check(recorder, by_partition, "q", 1, groups or [empty], "g")


def recorder_of(*values: Value) -> Recorder:
    recorder = Recorder()
    for v in values:
        recorder.add(v)
    return recorder


def test_a_clean_history_passes() -> None:
    a, b = value("w", 0, [ok(0)]), value("w", 1, [failed("timeout", False), ok(1)])
    report = run_check(recorder_of(a, b), replica("n1", {0: a.text, 1: b.text}))
    assert report.total() == 0, report.summary()


def test_a_lost_acknowledged_record_is_found() -> None:
    a, b = value("w", 0, [ok(0)]), value("w", 1, [ok(1)])
    report = run_check(recorder_of(a, b), replica("n1", {0: a.text}))
    assert set(report.violations) == {"lost_acknowledged"}


def test_a_record_at_another_index_is_found() -> None:
    a = value("w", 0, [ok(3)])
    report = run_check(recorder_of(a), replica("n1", {2: a.text}))
    assert set(report.violations) == {"acknowledged_at_other_index"}


def test_plain_duplicates_need_an_ambiguous_attempt() -> None:
    explained = value("w", 0, [failed("504:timeout", False), ok(1)])
    report = run_check(
        recorder_of(explained), replica("n1", {0: explained.text, 1: explained.text})
    )
    assert report.total() == 0, report.summary()
    refused = value("w", 0, [failed("503:unavailable", True), ok(1)])
    report = run_check(recorder_of(refused), replica("n1", {0: refused.text, 1: refused.text}))
    assert set(report.violations) == {"unexplained_duplicate"}


def test_idempotent_values_never_twice() -> None:
    a = value("i", 0, [failed("timeout", False), ok(1, duplicate=True)], IDEMPOTENT)
    report = run_check(recorder_of(a), replica("n1", {0: a.text, 1: a.text}))
    assert "duplicate" in report.violations


def test_a_refused_write_must_not_be_written() -> None:
    a = value("w", 0, [failed("404:not_found", True)])
    report = run_check(recorder_of(a), replica("n1", {0: a.text}))
    assert set(report.violations) == {"written_though_refused"}


def test_a_503_that_committed_is_found_and_a_timeout_explains_it() -> None:
    after_503 = value("i", 0, [failed("503:unavailable", True), ok(0, duplicate=True)], IDEMPOTENT)
    report = run_check(recorder_of(after_503), replica("n1", {0: after_503.text}))
    assert set(report.violations) == {"answered_503_but_committed"}
    after_timeout = value(
        "i", 0, [failed("503:unavailable", True), failed("timeout", False), ok(0, True)],
        IDEMPOTENT,
    )  # fmt: skip
    report = run_check(recorder_of(after_timeout), replica("n1", {0: after_timeout.text}))
    assert report.total() == 0, report.summary()


def test_records_nobody_sent_are_found() -> None:
    report = run_check(Recorder(), replica("n1", {0: "stranger|0|x"}))
    assert set(report.violations) == {"record_never_sent"}


def test_replicas_must_be_byte_identical_up_to_the_smaller_commit() -> None:
    a, b = value("w", 0, [ok(0)]), value("w", 1, [ok(1)])
    leader = replica("n1", {0: a.text, 1: b.text})
    behind = replica("n2", {0: a.text})
    assert run_check(recorder_of(a, b), leader, behind).total() == 0
    forked = replica("n3", {0: a.text, 1: a.text})
    assert set(run_check(recorder_of(a, b), leader, forked).violations) == {"replicas_differ"}


def test_order_per_writer() -> None:
    a, b = value("w", 0, [ok(1)]), value("w", 1, [ok(0)])
    report = run_check(recorder_of(a, b), replica("n1", {0: b.text, 1: a.text}))
    assert set(report.violations) == {"order"}


def test_unreadable_replicas_are_violations() -> None:
    a = value("w", 0, [ok(0)])
    broken = replica("n2", {})
    broken.error = "read from 0: 500"
    report = run_check(recorder_of(a), replica("n1", {0: a.text}), broken)
    assert set(report.violations) == {"replica_unreadable"}


def queue_case(accepted_then_granted: bool) -> Recorder:
    recorder = recorder_of(
        value("q0", 0, [ok(0)], IDEMPOTENT, "q"), value("q0", 1, [ok(1)], IDEMPOTENT, "q")
    )
    recorder.grants.append(Grant("c", 0, 0, 1, 0, make_text("q0", 0, 4), 1.0, 1.1))
    recorder.settles.append(Settle("c", "accept", 0, [0], 1.2, 1.3, "200", done=[0]))
    recorder.grants.append(Grant("c", 0, 1, 1, 0, make_text("q0", 1, 4), 1.0, 1.1))
    recorder.settles.append(Settle("c", "reject", 0, [1], 1.2, 1.3, "200", done=[1]))
    if accepted_then_granted:
        recorder.grants.append(Grant("d", 0, 0, 2, 0, make_text("q0", 0, 4), 1.4, 1.5))
    return recorder


def queue_replicas(dlq: bool) -> list[Replica]:
    q = replica("n1", {0: make_text("q0", 0, 4), 1: make_text("q0", 1, 4)}, "q")
    letters: dict[int, str | None] = {0: make_text("q0", 1, 4)} if dlq else {}
    headers = {
        0: {"laminar.dlq.partition": "0", "laminar.dlq.index": "1", "laminar.dlq.group": "g"}
    }
    return [q, replica("n1", letters, "q.dlq", headers=headers)]


def test_the_total_queue_check() -> None:
    assert run_check(queue_case(False), *queue_replicas(True)).total() == 0
    report = run_check(queue_case(False), *queue_replicas(False))
    assert set(report.violations) == {"rejected_not_dead_lettered_once", "queue_message_unfinished"}
    report = run_check(queue_case(True), *queue_replicas(True))
    assert set(report.violations) == {"redelivered_after_accept"}


def test_convergence_needs_a_leader_and_equal_commits() -> None:
    leader = {"topic": "t", "partition": 0, "role": "leader", "term": 2, "voters": ["n1", "n2"],
              "commit_index": 9, "log_end": 10}  # fmt: skip
    follower = {**leader, "role": "follower", "commit_index": 8}
    assert convergence_gaps({"t": 1}, {"n1": [leader], "n2": [follower]})
    assert not convergence_gaps({"t": 1}, {"n1": [leader], "n2": [{**follower, "commit_index": 9}]})
    assert convergence_gaps({"t": 1}, {"n2": [follower]}) == ["t/0: no leader"]


def test_a_seed_gives_one_schedule() -> None:
    kinds = parse_kinds("mixed")
    assert make_schedule(5, kinds, 20) == make_schedule(5, kinds, 20)
    assert make_schedule(5, kinds, 20) != make_schedule(6, kinds, 20)
    assert {p.kind for p in make_schedule(5, kinds, len(KINDS))} == set(KINDS)
    with pytest.raises(ValueError):
        parse_kinds("kill9,nonsense")


def test_the_bit_flip_lands_in_a_sealed_batch_payload(tmp_path: Path) -> None:
    directory = tmp_path / "partitions" / "t" / "0"
    directory.mkdir(parents=True)
    log = SegmentedLog.open(FileDirectory(str(directory)), LogConfig(segment_bytes=4096))
    for i in range(200):
        stored = StoredRecord(i, 0, None, b"v" * 60, ())
        log.append(single_record_batch(stored, 1))
    log.close()
    assert sealed_segments(tmp_path)
    flip = flip_sealed_bit(tmp_path, random.Random(1))
    assert flip is not None and not flip.control
    log = SegmentedLog.open(FileDirectory(str(directory)), LogConfig(segment_bytes=4096))
    with pytest.raises(CorruptBatchError):
        log.read_range(flip.batch_base_index, 1 << 20)
