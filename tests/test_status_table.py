"""The partition status table (laminar.partition.status_table): newest report per broker,
stale and dead brokers left out, leaders by highest term, and hostile reports refused."""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

import orjson
import pytest

from laminar.partition import status_table
from laminar.partition.status_table import ReportError, StatusTable, decode_report, leaders


def row(partition: int, role: str, leader: str | None, term: int, **extra: Any) -> dict[str, Any]:
    base = {
        "topic": "t", "partition": partition, "role": role, "leader": leader, "term": term,
        "voters": ["n1", "n2", "n3"], "learners": [], "in_sync": [], "log_start": 0,
        "commit_index": 9, "log_end": 10, "bytes": 100,
    }  # fmt: skip
    return {**base, **extra}


def test_the_newest_report_of_each_alive_broker_counts() -> None:
    table = StatusTable()
    assert table.merge("n2", 5, [row(0, "leader", "n2", 3)], now_ms=1_000)
    assert not table.merge("n2", 4, [row(0, "follower", "n1", 4)], now_ms=1_100)  # older
    assert not table.merge("n2", 5, [], now_ms=1_100)  # replayed
    assert table.merge("n3", 1, [row(0, "follower", "n2", 3)], now_ms=1_000)
    view = table.view({"n2", "n3"}, now_ms=2_000)
    assert view["n2"][0]["role"] == "leader" and set(view) == {"n2", "n3"}
    assert set(table.view({"n3"}, now_ms=2_000)) == {"n3"}  # n2 not alive
    fresh_only = table.view({"n2", "n3"}, now_ms=1_000 + status_table.FRESH_MS + 1,
                            max_age_ms=status_table.FRESH_MS)  # fmt: skip
    assert fresh_only == {}  # (what dropping a replica may act on)
    stale = 1_000 + status_table.STALE_MS + 1
    assert table.view({"n2", "n3"}, now_ms=stale) == {}
    table.forget("n2")
    assert table.version_of("n2") is None
    assert table.merge("n2", 1, [], now_ms=1_000)  # a new incarnation, any version


def test_the_leader_of_a_group_is_the_claim_of_the_highest_term() -> None:
    view = {
        "n1": [row(0, "leader", "n1", 3), row(1, "follower", "n2", 2)],
        "n2": [row(0, "leader", "n2", 4), row(1, "leader", "n2", 2)],
        "n3": [row(2, "candidate", None, 5)],
    }
    found = leaders(view)
    assert found["t/0"]["leader"] == "n2" and found["t/1"]["leader"] == "n2"
    assert "t/2" not in found


def test_a_report_round_trips_and_a_malformed_one_is_refused() -> None:
    rows = [row(0, "leader", "n1", 3), row(1, "follower", None, 0)]
    assert decode_report(status_table.encode_report(rows)) == rows
    bad: list[bytes] = [
        b"not zlib",
        zlib.compress(b"{not json"),
        zlib.compress(orjson.dumps({"rows": []})),
        zlib.compress(orjson.dumps([1])),
        zlib.compress(orjson.dumps([{**rows[0], "term": "3"}])),
        zlib.compress(orjson.dumps([{**rows[0], "term": True}])),
        zlib.compress(orjson.dumps([{**rows[0], "voters": [1]}])),
        zlib.compress(orjson.dumps([{k: v for k, v in rows[0].items() if k != "leader"}])),
        zlib.compress(b"[" + b" " * (status_table.MAX_REPORT_BYTES + 1) + b"]"),  # a bomb
    ]
    for data in bad:
        with pytest.raises(ReportError):
            decode_report(data)


def test_an_unchanged_report_is_sent_again_without_encoding_and_heals_a_lost_one() -> None:
    """`StatusPublisher.publish` with the `reuse` key of the last report sends its bytes
    again (the rows are not even asked for); a receiver holding those bytes refreshes its
    report without decoding them, and one that lost the earlier report decodes them."""
    publisher = status_table.StatusPublisher("n1", first_version=100)
    asked: list[int] = []

    def rows() -> list[dict[str, Any]]:
        asked.append(1)
        return [row(0, "leader", "n1", 3)]

    first = publisher.publish("shape", rows, ["n2", "n3"], now_ms=1_000, reuse=7)
    again = publisher.publish("shape", rows, ["n2", "n3"], now_ms=2_000, reuse=7)
    assert len(asked) == 1 and again[0].index > first[0].index
    assert again[0].entries[0].data == first[0].entries[0].data
    table, lost = StatusTable(), StatusTable()
    assert table.receive(first[0], now_ms=1_000)  # n2 got the first report; n3 lost it
    held = table.view({"n1"}, now_ms=1_000)["n1"]
    assert table.receive(again[0], now_ms=2_000) and table.version_of("n1") == again[0].index
    assert table.view({"n1"}, now_ms=2_000)["n1"] is held  # the rows held, not decoded again
    assert lost.receive(again[1], now_ms=2_000)
    assert lost.view({"n1"}, now_ms=2_000)["n1"] == rows()
    changed = publisher.publish("shape", rows, ["n2"], now_ms=3_000, reuse=8)
    answer = publisher.publish(None, rows, ["n2"], now_ms=3_000)  # to a request: fresh
    assert len(asked) == 4 and table.receive(changed[0], now_ms=3_000)  # (2: the check)
    assert decode_report(answer[0].entries[0].data) == rows()
    with pytest.raises(ReportError):  # bytes unlike the held ones are checked as ever
        table.receive(replace(changed[0], index=changed[0].index + 5,
                              entries=(replace(changed[0].entries[0], data=b"junk"),)),
                      now_ms=3_000)  # fmt: skip
