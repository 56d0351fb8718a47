"""The JVM reader's options (Options.java) are the Python source's: over many option sets, the
cases of tests/spark/test_options.py, edge cases of Python's int(), json.loads and repr(), and
seeded random mixes, Options.parse in Java gives the same fields (and `subscribed`) as
`Options.parse(..., stream=False)`, or fails with the same message.

The one difference allowed: why a subscribePattern is not a valid pattern is said in
java.util.regex's words, not Python re's (the message up to the reason is the same).
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from laminar.spark.options import Options

from .conftest import JavaBuild

BROKERS = {"brokers": "http://a:7070, http://b:7070"}
#: the Java exception each Python one is ported as
JAVA_TYPES = {
    "OptionError": "IllegalArgumentException",
    "ValueError": "ValueError",  # (raised past the option checks, as Python's int() does)
    "OverflowError": "ArithmeticException",
    "TypeError": "IllegalArgumentException",  # (a configuration file's contexts: 5)
}
PATTERN_REASON = "is not a valid pattern: "
SEED = 26

#: tests/spark/test_options.py's option sets
TEST_OPTIONS_CASES: list[dict[str, str]] = [
    {**BROKERS, "topic": "t"},
    {**BROKERS, "topics": "a,b", "maxRecordsPerTrigger": "5"},
    {"brokers": "https://a:7070", "topic": "t", "caFile": "/etc/laminar/ca.crt"},
    {**BROKERS, "topic": "t", "token": "lmq_given", "tokenFile": "/tmp/token"},
    {**BROKERS, "topic": "t", "tokenFile": "/tmp/token", "context": "spark"},
    {"topic": "t"},
    BROKERS,
    {**BROKERS, "topic": "t", "startingOfsets": "earliest"},
    {**BROKERS, "topic": "t", "endingOffsets": "latest"},
    {**BROKERS, "topic": "t", "endingTimestamp": "5"},
    {**BROKERS, "topic": "t", "endingOffsetsByTimestamp": "{}"},
    {**BROKERS, "topic": "t", "endingOffsets": "earliest"},
    {**BROKERS, "topic": "t", "startingOffsets": "soon"},
    {**BROKERS, "topic": "t", "startingOffsets": '{"t": {"x": 1}}'},
    {**BROKERS, "topic": "t", "startingOffsets": '{"t": {"0": -3}}'},
    {**BROKERS, "topic": "t", "startingOffsets": '{"t": {"0": true}}'},
    {**BROKERS, "topic": "t", "maxRecordsPerTrigger": "0"},
    {**BROKERS, "topic": "t", "maxOffsetsPerTrigger": "x"},
    {**BROKERS, "topic": "t", "failOnDataLoss": "yes"},
    {"brokers": "a:7070", "topic": "t"},
    {"kafka.bootstrap.servers": "h:1", "topic": "t"},
    {**BROKERS, "subscribePattern": "("},
    {**BROKERS, "assign": "[0, 1]"},
    {**BROKERS, "assign": '{"t": [-1]}'},
    {**BROKERS, "assign": '{"t": []}'},
    {**BROKERS, "subscribe": " , "},
    {**BROKERS, "topic": "t", "startingTimestamp": "yesterday"},
    {**BROKERS, "topic": "t", "endingTimestamp": "-1"},
    {**BROKERS, "topic": "t", "startingOffsetsByTimestamp": '{"t": {"0": "x"}}'},
    {**BROKERS, "topic": "t", "startingOffsetsByTimestampStrategy": "earliest"},
    {**BROKERS, "topic": "t", "maxTriggerDelay": "soon"},
    {**BROKERS, "topic": "t", "maxTriggerDelay": "5 weeks"},
    {**BROKERS, "topic": "t", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
    {**BROKERS, "subscribe": "a", "assign": '{"a": [0]}'},
    {**BROKERS, "subscribe": "a", "subscribePattern": "a.*"},
    {**BROKERS, "subscribePattern": "a.*", "assign": '{"a": [0]}'},
    {**BROKERS, "topic": "a", "subscribePattern": "a.*"},
    {**BROKERS, "topic": "a", "topics": "b"},
    {**BROKERS, "topic": "a", "subscribe": "a"},
    {"kafka.bootstrap.servers": "http://a:7070,http://b:7070", "subscribe": "orders,audit",
     "maxOffsetsPerTrigger": "500"},
    {"brokers": "http://a:7070, http://b:7070", "topics": "orders,audit",
     "maxRecordsPerTrigger": "500"},
    {"brokers": "http://a:1", "kafka.bootstrap.servers": "http://a:1", "topic": "t"},
    {**BROKERS, "maxOffsetsPerTrigger": "5", "maxRecordsPerTrigger": "5", "topic": "t"},
    {"BROKERS": "http://a:1", "SubScribe": "t"},
    {**BROKERS, "subscribePattern": r"orders-\d+"},
    {**BROKERS, "assign": '{"a": [2, 0, 2], "b": [1]}'},
    {**BROKERS, "topic": "t", "minOffsetsPerTrigger": "10", "maxTriggerDelay": "30s"},
    *({**BROKERS, "topic": "t", "maxTriggerDelay": text}
      for text in ("15m", "2h", "250", "500 ms", "1min", "1d", "3000us")),
    {**BROKERS, "topic": "t", "startingTimestamp": "1700000000000",
     "endingOffsetsByTimestamp": '{"t": {"1": 1700000009000}}',
     "startingOffsetsByTimestampStrategy": "LATEST"},
]  # fmt: skip

#: where Python's text rules (int(), str.strip, isdigit, json.loads, repr) show
EDGE_CASES: list[dict[str, str]] = [
    # int(): whitespace, signs, underscores, other scripts' digits, CPython's digit limit
    *({**BROKERS, "topic": "t", "minPartitions": v} for v in (
        " 5 ", "+7", "1_000", "1__0", "_1", "1_", "\u0663\u0664", "\u00b2", "0", "-1", "5.0",
        "0x10", "", " ", "\u00a05\u2003", "\x1c5", "1" * 4300, "1" * 4301, "9" * 40,
        "\uff15", "1 2")),
    *({**BROKERS, "topic": "t", "startingTimestamp": v} for v in (
        "0", "253402300799999", "253402300800000", " 1700000000000 ", "1_700_000_000_000",
        "1e12", "\u0661\u0662", "1" * 5000)),
    # flags and words
    *({**BROKERS, "topic": "t", "includeHeaders": v} for v in (
        "TRUE", "False", " true", "1", "", "tru\u0435")),
    *({**BROKERS, "topic": "t", "startingOffsetsByTimestampStrategy": v} for v in (
        "Latest", "ERROR", "latest ", "\u0130")),
    # durations (Python's regex: \s and \d are Unicode's)
    *({**BROKERS, "topic": "t", "maxTriggerDelay": v} for v in (
        " 5 MIN ", "5\u2003s", "\u0661\u0662s", "5 m s", "5ms ", "us", "7us", "0", "1" * 400,
        "1" * 400 + "us", "1" * 4301 + "s", "5\x1cm", "3\u212a", "10 D", "5\u00b2")),
    # brokers
    {"brokers": " http://a:1 ,, HTTPS://b:2 ,", "topic": "t"},
    {"brokers": "http://a:1,ftp://b", "topic": "t"},
    {"brokers": " , ", "topic": "t"},
    {"kafka.bootstrap.servers": "b:1", "topic": "t"},
    {"brokers": "\u00a0http://a:1\u2028", "topic": "t"},
    {"brokers": "http://it's", "topic": "t"},
    {"brokers": "http://\"it's\"", "topic": "t"},
    # topics
    {**BROKERS, "topics": " a ,b,, c\u3000"},
    {**BROKERS, "topic": "caf\u00e9,\U0001f600"},
    {**BROKERS, "subscribe": "it's"},
    # unknown options, sorted by code point
    {**BROKERS, "topic": "t", "Zeta": "1", "alpha": "2", "\u00e9": "3", "\U0001f600": "4",
     "\uff21": "5"},
    # JSON offsets
    *({**BROKERS, "topic": "t", "startingOffsets": v} for v in (
        '{"t": {"0": 5}}', '{"t": {"0": 1.0}}', '{"t": {"0": -2, "1": -1}}', '{"t": {"00": 5}}',
        '{"t": {"01": 5, "1": 6}}', '{"t": {"\\u0663": 5}}', '{"t": {"\\u00b2": 5}}',
        '{"t": {" 1": 5}}', '{"t": {"": 5}}', '{"t": []}', "[]", '"x"', "NaN", "5",
        '{"t": {"0": NaN}}', '{"t": {"0": Infinity}}', '{"t": {"0": -Infinity}}',
        '{"t": {"0": INF}}', '{"t": {"0": +Infinity}}', '{"t": {"0": 99999999999999999999999}}',
        '{"t": {"0": 1e400}}', '{"t": {"0": -1e400}}', '{"t": {"0": null}}',
        '{"t": {"0": {"a": [1, 2.5, "x", null, true, false, {}]}}}', '{"t": {"0": 5}} x',
        '\ufeff{"t": {"0": 5}}', ' {"t": {"0": 5}} ', "{}", '{"t": {}}',
        '{"t": {"0": 5}, "t": {"1": 6}}', '{"t": {"0": 1' + "0" * 4300 + "}}",
        '{"t": {"0": 1' + "0" * 4299 + "}}", '{"t": {"0": -0}}', '{"t": {"0": 0.1}}',
        '{"t": {"0": 1E5}}', '{"t": {"0": 1.5e300}}', '{"t": {"0": 123456789.125}}',
        '{"t": {"0": 1e16}}', '{"t": {"0": 1e-5}}', '{"t": {"0": 0.0001}}',
        '{"t": {"0": 2.5e-7}}', '{"a\\u00e9\\ud83d\\ude00": {"x": 5}}', "{'t': 1}",
        '{"t": {"0": 5,}}', '{"t":{"0":5}}\n', '\t{"t":{"0":5}}', '{"t": {"0": 01}}',
        '{"t": {"0": "it\'s"}}', '{"t": {"0": "\\u0085\\u00a0\\u2028\\ud800\\t"}}',
        '{"t": {"0": [1e22, 1e21, 5e-324, 1.7976931348623157e308]}}', "Earliest", " latest",
        '{"t": {"0": 5}, "u": 3}', '{"t": {"0": 5}}\u00a0', '{"t": {"0": "\x01"}}', "",
        '{"t": {"0": 1.}}', '{"t": {"0": .5}}', '{"t": {"0": -}}', '{"t\\u0000": {"x": 1}}',
        '{"t": {"0": -NaN}}', '{"t": {"0": [NaN, Infinity, -Infinity]}}', '{"t": {"0": 5}}//',
        '{"t": {"0": 5}}/* */', '{"t": {"0": [1,]}}', '{"t": {"0": 0x10}}', '{"t": {"0": 1_0}}',
        '{"t": {"0": 1e-400}}', '{"t": {"0": -0.0}}', '{"t": {"0": 9007199254740993.0}}',
        '{"t": {"0": 4.35}}', '{"t": {"0": 1e23}}', '{"t": {"0": 123456789012345680000.0}}')),
    # per-partition timestamps
    *({**BROKERS, "topic": "t", "endingOffsetsByTimestamp": v} for v in (
        '{"t": {"0": 1700000000000}}', '{"t": {"0": 253402300800000}}', '{"t": {"0": -1}}',
        '{"t": {"0": 0}}', "x", "[]", '{"t": 5}', '{"t": {"0": true}}', '{"t": {"0": 1.5}}')),
    # assign
    *({**BROKERS, "assign": v} for v in (
        '{"t": [0, 1]}', '{"t": [true]}', '{"t": [1.0]}', "{}", "[0]", "x", '{"t": 5}',
        '{"t": [99999999999999999999, 3]}', '{"t\'s": [0]}', '{"t": [0], "u": [-1]}',
        '{"caf\\u00e9": [1], "\\u2028": [0]}', '{"t": ["0"]}', '{"t": null}')),
    # patterns both Python's re and java.util.regex read alike
    *({**BROKERS, "subscribePattern": v} for v in (
        "a.*", "x|y", "", "[a-z]+-\\d{1,3}", "(", "*", "[a-", "a{2,1}", "it's")),
    # stream / sink options checked in a batch read
    *({**BROKERS, "topic": "t", **extra} for extra in (
        {"minOffsetsPerTrigger": "5", "maxRecordsPerTrigger": "10"},
        {"minOffsetsPerTrigger": "50", "maxRecordsPerTrigger": "10"},
        {"minOffsetsPerTrigger": "0"},
        {"transactionTimeoutMs": "900000"},
        {"transactionTimeoutMs": "900001"},
        {"transactionTimeoutMs": "0"},
        {"checkpointLocation": "/x", "path": "y"},
        {"token": "", "tokenFile": "", "context": "", "caFile": ""},
    )),
]  # fmt: skip

#: values for the random mixes: every option with good, bad and odd values
POOLS: dict[str, tuple[str, ...]] = {
    "startingOffsets": ("earliest", "latest", '{"t": {"0": 3}}', '{"t": {"0": -3}}', "x",
                        '{"t": {"1": true}}', "[]"),
    "endingOffsets": ("latest", "earliest", '{"t": {"0": 9}}', '{"t": {"a": 1}}'),
    "startingTimestamp": ("5", "-5", "x", " 1_0 "),
    "endingTimestamp": ("1700000000000", "253402300800000"),
    "startingOffsetsByTimestamp": ('{"t": {"0": 5}}', "x", '{"t": {"0": -5}}'),
    "endingOffsetsByTimestamp": ('{"t": {"0": 5}}', '{"t": []}'),
    "startingOffsetsByTimestampStrategy": ("latest", "ERROR", "x"),
    "maxOffsetsPerTrigger": ("5", "0", "x"),
    "maxRecordsPerTrigger": ("7", "\u0667"),
    "minOffsetsPerTrigger": ("3", "9", "-1"),
    "maxTriggerDelay": ("5s", "5 weeks", "\u0665m", "2us"),
    "minPartitions": ("4", "0", "1_0", "y"),
    "failOnDataLoss": ("false", "TRUE", "no"),
    "includeHeaders": ("true", "1"),
    "token": ("lmq_x", ""),
    "tokenFile": ("/tmp/t", ""),
    "context": ("ctx", ""),
    "caFile": ("/ca.pem", ""),
    "transactionTimeoutMs": ("1000", "999999999"),
    "path": ("p",),
    "checkpointLocation": ("c",),
    "unknownOption": ("1",),
    "kafka.bootstrap.servers": ("http://k:1", "k:1"),
}  # fmt: skip
BROKER_POOL = ("http://a:1", "https://a:1, http://b:2", "a:1", "", " , ", "http://\u00e9")
STRATEGY_POOL = (
    ("subscribe", "a,b"), ("topic", "t"), ("topics", " , "), ("subscribePattern", "t.*"),
    ("subscribePattern", "("), ("assign", '{"t": [1, 0]}'), ("assign", '{"t": [-1]}'),
)  # fmt: skip


def random_cases(count: int) -> list[dict[str, str]]:
    """Seeded mixes: brokers (or none), zero to two strategies, up to four other options,
    option names in random letter case."""
    rng = random.Random(SEED)
    cases = []
    for _ in range(count):
        case: dict[str, str] = {}
        if rng.random() < 0.9:
            case["brokers"] = rng.choice(BROKER_POOL)
        for name, value in rng.sample(STRATEGY_POOL, rng.choice((0, 1, 1, 1, 1, 2))):
            case[name] = value
        for name in rng.sample(sorted(POOLS), rng.randint(0, 4)):
            case[name] = rng.choice(POOLS[name])
        cases.append({"".join(rng.choice((c.lower(), c.upper())) for c in k): v
                      for k, v in case.items()})  # fmt: skip
    return cases


def fields(options: Options) -> dict[str, Any]:
    """Every field of the Python dataclass (a field added there is missed by Java's answer
    and fails the comparison), as JSON, and `subscribed`."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.name == "assigned" and value is not None:
            value = [[topic, list(partitions)] for topic, partitions in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    out["subscribed"] = options.subscribed
    return out


def python_outcome(raw: dict[str, str], *, credentials: bool = False) -> dict[str, Any]:
    try:
        options = Options.parse(raw, stream=False)
        if credentials:
            options = options.with_credentials()
    except (ValueError, OverflowError, TypeError) as e:  # (OptionError is a ValueError)
        return {"error": str(e), "type": type(e).__name__}
    return {"result": fields(options)}


def comparable(outcome: dict[str, Any]) -> dict[str, Any]:
    """`outcome` with a pattern error's reason cut (Python re's and java.util.regex's words
    differ) and Python's exception type named as its Java port."""
    out = dict(outcome)
    error = out.get("error")
    if (
        error is not None
        and error.startswith("option subscribePattern ")
        and PATTERN_REASON in error
    ):
        out["error"] = error[: error.index(PATTERN_REASON) + len(PATTERN_REASON)]
    if out.get("type") in JAVA_TYPES:
        out["type"] = JAVA_TYPES[out["type"]]
    return out


def compare(java_build: JavaBuild, cases: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The Java answers for `cases`, after asserting each is Python's."""
    answers = java_build.run("OptionsCheck", [{"options": case} for case in cases])
    differ = [
        (case, want, got)
        for case, got in zip(cases, answers, strict=True)
        if comparable(got) != (want := comparable(python_outcome(case)))
        or json.dumps(got.get("result")) != json.dumps(want.get("result"))
    ]
    assert not differ, f"{len(differ)} of {len(cases)} differ; the first: {differ[:3]}"
    return answers


def test_the_sources_compile_without_lint_warnings(java_build: JavaBuild) -> None:
    assert java_build.warnings == ()


def test_the_cases_of_the_python_tests_parse_alike(java_build: JavaBuild) -> None:
    answers = compare(java_build, TEST_OPTIONS_CASES)
    # both outcomes occur: these are not all errors, nor all accepted
    assert sum("error" in a for a in answers) >= 20
    assert sum("result" in a for a in answers) >= 15


def test_pythons_text_rules_hold_in_java(java_build: JavaBuild) -> None:
    answers = compare(java_build, EDGE_CASES)
    errors = [a["error"] for a in answers if "error" in a]
    # a few that matter: CPython's digit limit, a superscript digit taken by isdigit() but
    # not by int(), a non-ASCII repr, a JSON true that is no index
    assert any("Exceeds the limit (4300 digits)" in e for e in errors)
    assert "invalid literal for int() with base 10: '\u00b2'" in errors
    assert any("got True" in e for e in errors)
    # str.strip() strips what Python calls whitespace (a no-break space, a line separator)
    stripped = {"brokers": "\u00a0http://a:1\u2028", "topic": "t"}
    assert answers[EDGE_CASES.index(stripped)]["result"]["brokers"] == ["http://a:1"]


def test_random_mixes_parse_alike(java_build: JavaBuild) -> None:
    cases = random_cases(600)
    answers = compare(java_build, cases)
    assert sum("result" in a for a in answers) >= 30
    assert len({a.get("error") for a in answers}) >= 30


#: characters repr() shows as they are, escapes, or quotes by
REPR_CHARACTERS = (
    "a", "Z", "'", '"', "\\", " ", "\t", "\n", "\r", "\x00", "\x1f", "\x7f", "\x85", "\xa0",
    "\xe9", "\xff", "\u0100", "\u200b", "\u2028", "\u3000", "\ud7ff", "\ud800", "\udfff",
    "\ue000", "\ufeff", "\uffff", "\U0001f600", "\U000e0001", "\U0010ffff", "\u0378",
)  # fmt: skip


def test_repr_of_any_text_is_pythons(java_build: JavaBuild) -> None:
    """A flag's bad value is quoted by repr() in the message: random texts (lone surrogates,
    controls, unassigned and private characters, both quotes) are quoted alike."""
    rng = random.Random(SEED + 1)
    texts = ["".join(rng.choices(REPR_CHARACTERS, k=rng.randint(1, 8))) for _ in range(300)]
    answers = compare(java_build, [{**BROKERS, "topic": "t", "failOnDataLoss": t} for t in texts])
    assert sum("error" in a for a in answers) >= 290


def test_subscribed_names_each_strategy_as_python_does(java_build: JavaBuild) -> None:
    """`subscribed` (compared in every answer above) for the three strategies, spelled out."""
    answers = java_build.run(
        "OptionsCheck",
        [{"options": {**BROKERS, **s}} for s in (
            {"subscribePattern": "it's"}, {"assign": '{"caf\\u00e9": [2, 1]}'},
            {"topics": "a, b"})],
    )  # fmt: skip
    assert [a["result"]["subscribed"] for a in answers] == [
        'subscribePattern "it\'s"',
        'assign {"caf\\u00e9": [1, 2]}',
        "subscribe 'a,b'",
    ]
