"""The operator's event spam filter, its log level and quiet routine success, and what an
adopted topic's mismatch says: pure, no API server."""

from __future__ import annotations

import logging

import pytest

from laminar.client.models import TopicDescription
from laminar_operator import logs, topics
from laminar_operator.events import EventLimiter


def test_an_identical_event_is_posted_once_per_repeat_window() -> None:
    limiter = EventLimiter(burst=10, refill_s=60.0, repeat_s=600.0)
    assert limiter.allow("uid", "BrokersUnreachable", "refused", 0.0)
    for now_s in (5.0, 10.0, 300.0, 599.0):  # a failure retried every few seconds
        assert not limiter.allow("uid", "BrokersUnreachable", "refused", now_s)
    assert limiter.allow("uid", "BrokersUnreachable", "timed out", 600.0)  # it changed
    assert limiter.allow("uid", "BrokersUnreachable", "refused", 601.0)  # it persisted
    assert limiter.allow("other", "BrokersUnreachable", "refused", 601.0)  # another object


def test_each_object_has_a_burst_then_a_trickle() -> None:
    limiter = EventLimiter(burst=3, refill_s=60.0, repeat_s=600.0)
    assert [limiter.allow("uid", "Step", str(i), 0.0) for i in range(5)] == [
        True, True, True, False, False,
    ]  # fmt: skip
    assert not limiter.allow("uid", "Step", "5", 59.0)
    assert limiter.allow("uid", "Step", "6", 60.0)  # one token back per refill_s
    assert not limiter.allow("uid", "Step", "7", 61.0)
    assert limiter.allow("elsewhere", "Step", "0", 61.0)  # buckets are per object


def test_memory_is_bounded() -> None:
    limiter = EventLimiter(burst=1, refill_s=60.0, repeat_s=600.0, max_objects=2)
    for uid in ("a", "b", "c"):
        assert limiter.allow(uid, "Created", "", 0.0)
    assert limiter.allow("a", "Created", "", 1.0)  # forgotten (least recently seen): new again
    assert not limiter.allow("c", "Created", "", 1.0)  # still remembered
    limiter.forget("c")
    assert limiter.allow("c", "Created", "", 1.0)


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


@pytest.fixture()
def objects_logger() -> logging.Logger:
    logger = logging.getLogger(logs.OBJECTS_LOGGER)
    saved = logger.level
    yield logger
    logger.setLevel(saved)


def test_routine_timer_success_is_debug(objects_logger: logging.Logger) -> None:
    quiet = logs.RoutineSuccess()
    objects_logger.setLevel(logging.INFO)
    routine = _record("Timer 'refresh_topic_status' succeeded.")
    assert not quiet.filter(routine)
    objects_logger.setLevel(logging.DEBUG)
    shown = _record("Timer 'refresh_topic_status' succeeded.")
    assert quiet.filter(shown) and shown.levelno == logging.DEBUG and shown.levelname == "DEBUG"
    objects_logger.setLevel(logging.INFO)
    for message in (
        "Handler 'reconcile_topic' succeeded.",  # a change handled: a decision, kept
        "Timer 'refresh_topic_status' failed temporarily: refused",
    ):
        kept = _record(message)
        assert quiet.filter(kept) and kept.levelno == logging.INFO


def test_the_level_flag() -> None:
    assert logs.level_of({}) is None  # kopf's own (info; debug with --verbose)
    assert logs.level_of({logs.LEVEL_ENV: "WARNING"}) == logging.WARNING
    with pytest.raises(ValueError, match="one of debug, info, warning, error"):
        logs.level_of({logs.LEVEL_ENV: "loud"})


def _described(partitions: int, rf: int) -> TopicDescription:
    return TopicDescription.from_json(
        {
            "name": "t",
            "partitions": partitions,
            "replication_factor": rf,
            "config": {},
            "partition_states": [],
        }
    )


def test_an_adopted_topic_that_differs_is_told() -> None:
    want = topics.wanted({"partitions": 2, "replicationFactor": 3}, {})
    said = topics.mismatch({"partitions": 2, "replicationFactor": 3}, want, _described(3, 1))
    assert "replication factor 1, the spec asks 3" in said
    assert "3 partitions, the spec asks 2" in said
    assert topics.mismatch({"partitions": 2, "replicationFactor": 3}, want, _described(2, 3)) == ""
    # no replication factor in the spec: the brokers' is the effective one, not a mismatch
    default = topics.wanted({"partitions": 2}, {"config": {"replicationFactor": 3}})
    assert topics.mismatch({"partitions": 2}, default, _described(2, 1)) == ""
