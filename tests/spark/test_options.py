"""The Spark source's options, offsets and planning (pure: no Spark, no cluster)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow", reason="the Spark source needs pyarrow (pip install '.[spark]')")

import itertools
from pathlib import Path

from laminar.spark.options import (
    Bounds,
    OptionError,
    Options,
    Range,
    duration_ms,
    limit,
    place_by_time,
    plan,
    resolve,
    spec,
    timestamps_wanted,
    waiting,
)

BROKERS = {"brokers": "http://a:7070, http://b:7070"}


def test_defaults_follow_the_kafka_connector() -> None:
    batch = Options.parse({**BROKERS, "topic": "t"}, stream=False)
    assert batch.brokers == ("http://a:7070", "http://b:7070")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.fail_on_data_loss and not batch.include_headers
    stream = Options.parse({**BROKERS, "topics": "a,b", "maxRecordsPerTrigger": "5"}, stream=True)
    assert stream.topics == ("a", "b") and stream.starting == "latest"
    assert stream.max_records_per_trigger == 5
    assert batch.ca_file is None


def test_https_brokers_take_a_ca_file() -> None:
    options = {"brokers": "https://a:7070", "topic": "t", "caFile": "/etc/laminar/ca.crt"}
    parsed = Options.parse(options, stream=False)
    assert parsed.brokers == ("https://a:7070",) and parsed.ca_file == "/etc/laminar/ca.crt"


def test_the_token_is_resolved_on_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`token`, else `tokenFile`'s, else `context`'s, else the environment's; what the
    executors get is the token itself (never the file or the variable), and never printed."""
    token_file = tmp_path / "token"
    token_file.write_text("lmq_from-the-file\n")
    config = tmp_path / "config.yaml"
    config.write_text("contexts: [{name: spark, token: lmq_from-the-context, ca-file: ca.pem}]\n")
    monkeypatch.setenv("LAMINAR_CONFIG", str(config))
    monkeypatch.setenv("LAMINAR_TOKEN", "lmq_from-the-environment")

    def token(**options: str) -> str | None:
        parsed = Options.parse({**BROKERS, "topic": "t", **options}, stream=False)
        resolved = parsed.with_credentials()
        assert resolved.token is None or resolved.token not in repr(resolved)
        return resolved.token

    assert token(token="lmq_given", tokenFile=str(token_file)) == "lmq_given"
    assert token(tokenFile=str(token_file), context="spark") == "lmq_from-the-file"
    assert token(context="spark") == "lmq_from-the-context"
    assert token() == "lmq_from-the-environment"
    in_context = Options.parse({**BROKERS, "topic": "t", "context": "spark"}, stream=False)
    assert in_context.with_credentials().ca_file == str(tmp_path / "ca.pem")
    with pytest.raises(OptionError, match="cannot read the token file"):
        token(tokenFile=str(tmp_path / "missing"))
    with pytest.raises(OptionError, match="no context 'nope'"):
        token(context="nope")


@pytest.mark.parametrize(
    ("options", "stream", "message"),
    [
        ({"topic": "t"}, False, "option brokers (or kafka.bootstrap.servers) is required"),
        (BROKERS, False, "one of the options subscribe (or topic, topics"),
        ({**BROKERS, "topic": "t", "startingOfsets": "earliest"}, False, "unknown options"),
        ({**BROKERS, "topic": "t", "endingOffsets": "latest"}, True, "batch reads only"),
        ({**BROKERS, "topic": "t", "endingTimestamp": "5"}, True, "batch reads only"),
        ({**BROKERS, "topic": "t", "endingOffsetsByTimestamp": "{}"}, True, "batch reads only"),
        ({**BROKERS, "topic": "t", "endingOffsets": "earliest"}, False, "may not be earliest"),
        ({**BROKERS, "topic": "t", "startingOffsets": "soon"}, False, "earliest, latest or JSON"),
        ({**BROKERS, "topic": "t", "startingOffsets": '{"t": {"x": 1}}'}, False, "t/x"),
        ({**BROKERS, "topic": "t", "startingOffsets": '{"t": {"0": -3}}'}, False, "t/0"),
        ({**BROKERS, "topic": "t", "startingOffsets": '{"t": {"0": true}}'}, False, "t/0"),
        ({**BROKERS, "topic": "t", "maxRecordsPerTrigger": "0"}, True, "positive integer"),
        ({**BROKERS, "topic": "t", "maxOffsetsPerTrigger": "x"}, True, "maxOffsetsPerTrigger"),
        ({**BROKERS, "topic": "t", "failOnDataLoss": "yes"}, False, "true or false"),
        ({"brokers": "a:7070", "topic": "t"}, False, "'a:7070' is not a URL"),
        ({"kafka.bootstrap.servers": "h:1", "topic": "t"}, False, "kafka.bootstrap.servers"),
        ({**BROKERS, "subscribePattern": "(", "topic": None}, False, "not a valid pattern"),
        ({**BROKERS, "assign": "[0, 1]"}, False, "option assign must be JSON"),
        ({**BROKERS, "assign": '{"t": [-1]}'}, False, "list of partition numbers"),
        ({**BROKERS, "assign": '{"t": []}'}, False, "list of partition numbers"),
        ({**BROKERS, "subscribe": " , "}, False, "names no topic"),
        ({**BROKERS, "topic": "t", "startingTimestamp": "yesterday"}, False, "startingTimestamp"),
        ({**BROKERS, "topic": "t", "endingTimestamp": "-1"}, False, "endingTimestamp"),
        (
            {**BROKERS, "topic": "t", "startingOffsetsByTimestamp": '{"t": {"0": "x"}}'},
            False,
            "startingOffsetsByTimestamp: t/0",
        ),
        (
            {**BROKERS, "topic": "t", "startingOffsetsByTimestampStrategy": "earliest"},
            False,
            "must be error or latest",
        ),
        ({**BROKERS, "topic": "t", "maxTriggerDelay": "soon"}, True, "a duration such as 15m"),
        ({**BROKERS, "topic": "t", "maxTriggerDelay": "5 weeks"}, True, "maxTriggerDelay"),
        (
            {**BROKERS, "topic": "t", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
            True,
            "minOffsetsPerTrigger (9) is higher than maxOffsetsPerTrigger (5)",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str | None], stream: bool, message: str) -> None:
    given = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(OptionError) as caught:
        Options.parse(given, stream=stream)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "strategies",
    [
        {"subscribe": "a", "assign": '{"a": [0]}'},
        {"subscribe": "a", "subscribePattern": "a.*"},
        {"subscribePattern": "a.*", "assign": '{"a": [0]}'},
        {"topic": "a", "subscribePattern": "a.*"},
        {"topic": "a", "topics": "b"},
        {"topic": "a", "subscribe": "a"},
    ],
)
def test_only_one_way_to_name_what_is_read(strategies: dict[str, str]) -> None:
    """As the Kafka source: exactly one of subscribe, subscribePattern, assign (and here
    `topic` / `topics`, Laminar's older names, count as subscribe)."""
    with pytest.raises(OptionError) as caught:
        Options.parse({**BROKERS, **strategies}, stream=False)
    message = str(caught.value)
    assert "only one of the options subscribe, subscribePattern, assign" in message
    assert all(name in message for name in strategies)


def test_the_kafka_connector_names_and_laminar_aliases_mean_the_same() -> None:
    kafka = Options.parse(
        {
            "kafka.bootstrap.servers": "http://a:7070,http://b:7070",
            "subscribe": "orders,audit",
            "maxOffsetsPerTrigger": "500",
        },
        stream=True,
    )
    laminar = Options.parse(
        {"brokers": "http://a:7070, http://b:7070", "topics": "orders,audit",
         "maxRecordsPerTrigger": "500"},
        stream=True,
    )  # fmt: skip
    assert kafka == laminar
    assert kafka.topics == ("orders", "audit") and kafka.max_records_per_trigger == 500
    assert Options.parse({**BROKERS, "topic": "orders"}, stream=False).topics == ("orders",)
    for pair in (
        {"brokers": "http://a:1", "kafka.bootstrap.servers": "http://a:1"},
        {**BROKERS, "maxOffsetsPerTrigger": "5", "maxRecordsPerTrigger": "5"},
    ):
        with pytest.raises(OptionError, match="not both"):
            Options.parse({"topic": "t", **pair}, stream=True)
    # option names are case-insensitive, as Spark's
    assert Options.parse({"BROKERS": "http://a:1", "SubScribe": "t"}, stream=False).topics == ("t",)


def test_pattern_assign_and_the_trigger_limits() -> None:
    pattern = Options.parse({**BROKERS, "subscribePattern": r"orders-\d+"}, stream=True)
    assert pattern.pattern == r"orders-\d+" and pattern.topics == ()
    assigned = Options.parse({**BROKERS, "assign": '{"a": [2, 0, 2], "b": [1]}'}, stream=False)
    assert assigned.assigned == (("a", (0, 2)), ("b", (1,)))
    assert "assign" in assigned.subscribed
    limits = Options.parse(
        {**BROKERS, "topic": "t", "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s"},
        stream=True,
    )
    assert limits.min_records_per_trigger == 10 and limits.max_trigger_delay_ms == 30_000
    assert Options.parse({**BROKERS, "topic": "t"}, stream=True).max_trigger_delay_ms == 900_000
    for text, ms in (("15m", 900_000), ("2h", 7_200_000), ("250", 250), ("500 ms", 500),
                     ("1min", 60_000), ("1d", 86_400_000), ("3000us", 3)):  # fmt: skip
        assert duration_ms(text, "maxTriggerDelay") == ms


def test_timestamp_options() -> None:
    parsed = Options.parse(
        {
            **BROKERS, "topic": "t", "startingTimestamp": "1700000000000",
            "endingOffsetsByTimestamp": '{"t": {"1": 1700000009000}}',
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
        stream=False,
    )  # fmt: skip
    assert parsed.starting_timestamp_ms == 1_700_000_000_000
    assert parsed.ending_by_timestamp == '{"t": {"1": 1700000009000}}'
    assert parsed.timestamp_strategy == "latest"
    bounds = {"t": {"0": Bounds(0, 100), "1": Bounds(10, 50)}}
    # startingTimestamp is for every partition (it wins over the per-partition JSON)
    every = timestamps_wanted(5, '{"t": {"0": 9}}', bounds, "startingOffsetsByTimestamp")
    assert every == {"t": {"0": 5, "1": 5}}
    named = timestamps_wanted(None, '{"t": {"1": 9}}', bounds, "endingOffsetsByTimestamp")
    assert named == {"t": {"1": 9}}
    assert timestamps_wanted(None, None, bounds, "startingOffsetsByTimestamp") == {}
    with pytest.raises(OptionError, match="do not exist or are not read: t"):
        timestamps_wanted(None, '{"t": {"7": 9}}', bounds, "startingOffsetsByTimestamp")


def test_times_place_the_partitions_they_name() -> None:
    bounds = {"t": {"0": Bounds(0, 100), "1": Bounds(10, 50)}}
    offsets = {"t": {"0": 0, "1": 10}}
    wanted = {"t": {"0": 5, "1": 5}}
    placed = place_by_time(offsets, wanted, {"t": {"0": 42, "1": 17}}, bounds, starting=True)
    assert placed == {"t": {"0": 42, "1": 17}}
    # no record that late: a start fails (Kafka's default strategy) or starts at the latest
    with pytest.raises(OptionError, match="t/1 has no record at or after timestamp 5"):
        place_by_time(offsets, wanted, {"t": {"0": 42, "1": None}}, bounds, starting=True)
    late = place_by_time(
        offsets, wanted, {"t": {"0": 42, "1": None}}, bounds, starting=True, strategy="latest"
    )
    assert late == {"t": {"0": 42, "1": 50}}
    # an end without such a record is the latest
    ending = place_by_time(
        {"t": {"0": 100, "1": 50}}, {"t": {"1": 5}}, {"t": {"1": None}}, bounds, starting=False
    )
    assert ending == {"t": {"0": 100, "1": 50}}


BOUNDS = {"t": {"0": Bounds(5, 100), "1": Bounds(0, 10)}}


def test_resolve_words_json_and_kafka_markers() -> None:
    assert resolve("earliest", BOUNDS, "s") == {"t": {"0": 5, "1": 0}}
    assert resolve("latest", BOUNDS, "s") == {"t": {"0": 100, "1": 10}}
    assert resolve(spec('{"t": {"0": 42, "1": -1}}', "s"), BOUNDS, "s") == {"t": {"0": 42, "1": 10}}
    assert resolve(spec('{"t": {"1": -2}}', "s"), BOUNDS, "s") == {"t": {"0": 5, "1": 0}}
    with pytest.raises(OptionError, match="do not exist"):
        resolve(spec('{"t": {"7": 1}}', "s"), BOUNDS, "s")


def test_plan_is_one_range_per_partition_and_splits_for_min_partitions() -> None:
    start, end = {"t": {"0": 0, "1": 10}}, {"t": {"0": 100, "1": 10}}
    assert plan(start, end) == [Range("t", 0, 0, 100)]  # partition 1 has nothing new
    split = plan(start, end, min_partitions=4)
    assert len(split) == 4 and split[0].low == 0 and split[-1].high == 100
    assert all(a.high == b.low for a, b in itertools.pairwise(split))


def test_limit_shares_in_proportion_to_what_waits() -> None:
    start = {"t": {"0": 0, "1": 0, "2": 50}}
    latest = {"t": {"0": 300, "1": 100, "2": 50}}
    capped = limit(start, latest, 100)
    assert capped == {"t": {"0": 75, "1": 25, "2": 50}}
    assert limit(start, latest, 1000) == latest
    assert sum(limit(start, latest, 1)["t"][p] - start["t"][p] for p in "012") == 1


def test_waiting_counts_the_records_between_two_offsets() -> None:
    start = {"t": {"0": 0, "1": 7}}
    latest = {"t": {"0": 300, "1": 10, "2": 4}}  # partition 2: not started, not counted
    assert waiting(start, latest) == 303
    assert waiting(latest, latest) == 0
