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
    limit,
    plan,
    resolve,
    spec,
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
        ({"topic": "t"}, False, "option brokers is required"),
        (BROKERS, False, "option topic (or topics"),
        ({**BROKERS, "topic": "t", "topics": "u"}, False, "not both"),
        ({**BROKERS, "topic": "t", "startingOfsets": "earliest"}, False, "unknown options"),
        ({**BROKERS, "topic": "t", "endingOffsets": "latest"}, True, "batch reads only"),
        ({**BROKERS, "topic": "t", "endingOffsets": "earliest"}, False, "may not be earliest"),
        ({**BROKERS, "topic": "t", "startingOffsets": "soon"}, False, "earliest, latest or JSON"),
        ({**BROKERS, "topic": "t", "startingOffsets": '{"t": {"x": 1}}'}, False, "t/x"),
        ({**BROKERS, "topic": "t", "startingOffsets": '{"t": {"0": -3}}'}, False, "t/0"),
        ({**BROKERS, "topic": "t", "maxRecordsPerTrigger": "0"}, True, "positive integer"),
        ({**BROKERS, "topic": "t", "failOnDataLoss": "yes"}, False, "true or false"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], stream: bool, message: str) -> None:
    with pytest.raises(OptionError, match=None) as caught:
        Options.parse(options, stream=stream)
    assert message in str(caught.value)


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
