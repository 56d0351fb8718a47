"""The client-side `laminar` commands (laminar.client.commands) run as real `python3 -m laminar`
subprocesses against three broker processes (the `cluster3` fixture of
tests/integration/conftest.py; `secured_cluster` for the token).

Covers topic create / list / describe / alter / delete (and their errors: exit 1 with one clear
line on stderr; usage errors exit 2), producing stdin lines and consuming exactly those lines
back in order, keyed records landing on `partition_for(key)`, every `--json` output parsing as
JSON, consume bounds (--partition, --from, --to, --max-records, --follow), Ctrl-C ending
`consume --follow` cleanly, cluster status, node administration, and the bearer token.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar.client import partition_for

from .conftest import TOKEN, interruptible

pytestmark = pytest.mark.integration

TIMEOUT_S = 60


def unique(prefix: str) -> str:
    return f"cli-{prefix}-{uuid.uuid4().hex[:8]}"


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    env.update(extra)
    return env


def laminar(
    cluster: Any,
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    brokers: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`python3 -m laminar ARGS --brokers <the cluster>`, with a timeout."""
    command = [sys.executable, "-m", "laminar", *args]
    if brokers:
        command += ["--brokers", ",".join(cluster.urls)]
    return subprocess.run(
        command,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env or environment(LAMINAR_TOKEN_FILE=str(cluster.token_file)),
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one-line error of a command that had to fail with exit `code`."""
    assert result.returncode == code, f"exit {result.returncode}: {result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr
    if code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("laminar: "), result.stderr
    return result.stderr


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines()]


def wait_for_leaders(cluster: Any, topic: str, partitions: int) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        description: dict[str, Any] = json.loads(
            ok(laminar(cluster, "topic", "describe", topic, "--json"))
        )
        states = description["partition_states"]
        if len(states) == partitions and all(s["leader"] for s in states):
            return description
        assert time.monotonic() < deadline, description
        time.sleep(0.2)


def test_topic_commands(cluster3: Any) -> None:
    name = unique("admin")
    created = ok(laminar(cluster3, "topic", "create", name, "--partitions", "2"))
    assert name in created and "2 partitions" in created
    assert "exists" in failed(laminar(cluster3, "topic", "create", name))

    assert name in ok(laminar(cluster3, "topic", "list")).split()
    listed = json.loads(ok(laminar(cluster3, "topic", "list", "--json")))
    mine = [t for t in listed["topics"] if t["name"] == name]
    assert mine == [{"name": name, "partitions": 2, "replication_factor": 3, "config": {}}]

    wait_for_leaders(cluster3, name, 2)
    table = ok(laminar(cluster3, "topic", "describe", name)).splitlines()
    assert table[0].startswith(f"topic {name}: 2 partitions, replication factor 3")
    assert table[1].split() == [
        "PARTITION", "LEADER", "REPLICAS", "IN-SYNC", "LOG", "START", "COMMIT", "LOG", "END"
    ]  # fmt: skip
    assert [row.split()[0] for row in table[2:]] == ["0", "1"]
    assert all(row.split()[1] in ("n1", "n2", "n3") for row in table[2:])

    altered = ok(
        laminar(
            cluster3, "topic", "alter", name, "--partitions", "3", "--config",
            "retention_ms=3600000", "fsync=never",
        )
    )  # fmt: skip
    assert "3 partitions" in altered and "retention_ms=3600000" in altered
    described = json.loads(ok(laminar(cluster3, "topic", "describe", name, "--json")))
    assert described["partitions"] == 3 and len(described["partition_states"]) == 3
    assert described["config"] == {"fsync": "never", "retention_ms": 3600000}
    assert "only grow" in failed(laminar(cluster3, "topic", "alter", name, "--partitions", "1"))
    failed(laminar(cluster3, "topic", "alter", name), code=2)

    assert f"deleted topic {name}" in ok(laminar(cluster3, "topic", "delete", name))
    assert name not in ok(laminar(cluster3, "topic", "list")).split()
    assert f"no topic {name}" in failed(laminar(cluster3, "topic", "delete", name))
    assert f"no topic {name}" in failed(laminar(cluster3, "topic", "describe", name))

    name = unique("json")
    created_json = json.loads(ok(laminar(cluster3, "topic", "create", name, "--json")))
    assert (created_json["name"], created_json["partitions"]) == (name, 1)
    assert json.loads(ok(laminar(cluster3, "topic", "delete", name, "--json"))) == {"deleted": name}


def test_bad_input_is_one_clear_line(cluster3: Any) -> None:
    error = failed(laminar(cluster3, "topic", "create", "bad name!"))
    assert "topic name 'bad name!'" in error and "400 bad_request" in error
    error = failed(laminar(cluster3, "topic", "create", unique("cfg"), "--config", "nope=1"))
    assert "unknown config keys" in error
    assert "no topic" in failed(laminar(cluster3, "produce", unique("missing"), stdin="x\n"))
    assert "no topic" in failed(laminar(cluster3, "consume", unique("missing")))
    # usage errors: exit 2
    failed(laminar(cluster3, "topic", "create", "t", "--partitions", "0"), code=2)
    failed(laminar(cluster3, "topic", "create", "t", "--config", "novalue"), code=2)
    failed(laminar(cluster3, "consume", "t", "--from", "sideways"), code=2)
    failed(laminar(cluster3, "produce", "t", "--key", "k", "--key-separator", ":"), code=2)
    failed(laminar(cluster3, "topic", "list", "--brokers", "ftp://x", brokers=False), code=2)
    failed(laminar(cluster3, "node", "weight", "n1", "-3"), code=2)


def test_unreachable_brokers() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar", "topic", "list", "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment(LAMINAR_BROKERS="http://127.0.0.1:9"),
    )
    assert "no answer from the brokers (http://127.0.0.1:9)" in failed(result)


def test_produce_stdin_then_consume_the_same_lines(cluster3: Any) -> None:
    name = unique("lines")
    ok(laminar(cluster3, "topic", "create", name))  # no waiting: the client waits out the election
    lines = ["hello", "", "  spaces  around  ", "ünïcödé ✓", *(f"line {i}" for i in range(500))]
    summary = ok(laminar(cluster3, "produce", name, stdin="\n".join(lines) + "\n"))
    assert (
        summary.strip() == f"produced {len(lines)} records to {name}: partitions 0 ({len(lines)})"
    )

    text = ok(laminar(cluster3, "consume", name)).splitlines()
    assert len(text) == len(lines)
    fields = [line.split(" ", 3) for line in text]
    assert [f[3] for f in fields] == lines
    assert {f[0] for f in fields} == {"0"} and {f[2] for f in fields} == {"-"}
    indexes = [int(f[1]) for f in fields]
    assert indexes == sorted(indexes) and len(set(indexes)) == len(lines)

    records = json_lines(ok(laminar(cluster3, "consume", name, "--json")))
    assert [r["value"] for r in records] == lines
    assert [r["index"] for r in records] == indexes
    assert all(r["partition"] == 0 and r["key"] is None for r in records)

    # --file, a last line without a newline, CRLF, and --json per record
    path = Path(f"/tmp/{name}.txt")
    path.write_bytes(b"crlf\r\nlast")
    try:
        produced = json_lines(ok(laminar(cluster3, "produce", name, "--file", str(path), "--json")))
    finally:
        path.unlink()
    assert [(p["line"], p["partition"]) for p in produced] == [(1, 0), (2, 0)]
    assert produced[0]["index"] > indexes[-1] and produced[1]["index"] > produced[0]["index"]
    tail = ok(laminar(cluster3, "consume", name, "--from", str(produced[0]["index"])))
    assert [line.split(" ", 3)[3] for line in tail.splitlines()] == ["crlf", "last"]


def test_keys_and_partitions(cluster3: Any) -> None:
    name = unique("keys")
    ok(laminar(cluster3, "topic", "create", name, "--partitions", "3"))
    keys = [f"user-{i % 7}" for i in range(300)]
    stdin = "".join(f"{k}:value {i}:{k}\n" for i, k in enumerate(keys))
    produced = json_lines(
        ok(laminar(cluster3, "produce", name, "--key-separator", ":", "--json", stdin=stdin))
    )
    assert [p["line"] for p in produced] == list(range(1, 301))
    for p, key in zip(produced, keys, strict=True):
        assert p["partition"] == partition_for(key.encode(), 3)

    records = json_lines(ok(laminar(cluster3, "consume", name, "--json")))
    assert len(records) == 300
    by_key: dict[str, list[int]] = defaultdict(list)
    for r in records:
        key = r["key"]
        number, _, value_key = r["value"].removeprefix("value ").partition(":")
        assert r["partition"] == partition_for(key.encode(), 3) and value_key == key
        by_key[key].append(int(number))
    for key, numbers in by_key.items():  # each key's records in the order produced
        assert numbers == [i for i, k in enumerate(keys) if k == key]

    summary = ok(
        laminar(cluster3, "produce", name, "--key", "fixed", "--partition", "2", stdin="a\nb\n")
    )
    assert summary.strip() == f"produced 2 records to {name}: partitions 2 (2)"
    text = ok(laminar(cluster3, "consume", name, "--partition", "2")).splitlines()
    assert [line.split(" ", 3)[2:] for line in text[-2:]] == [["fixed", "a"], ["fixed", "b"]]
    assert "no partition 3" in failed(laminar(cluster3, "consume", name, "--partition", "3"))
    assert "no partition 5" in failed(
        laminar(cluster3, "produce", name, "--partition", "5", stdin="x\n")
    )


def test_consume_bounds_and_follow(cluster3: Any) -> None:
    name = unique("bounds")
    ok(laminar(cluster3, "topic", "create", name))
    ok(laminar(cluster3, "produce", name, stdin="".join(f"r{i}\n" for i in range(20))))
    everything = [
        line.split(" ", 3) for line in ok(laminar(cluster3, "consume", name)).splitlines()
    ]
    indexes = [int(f[1]) for f in everything]
    assert [f[3] for f in everything] == [f"r{i}" for i in range(20)]

    limited = ok(laminar(cluster3, "consume", name, "--max-records", "5")).splitlines()
    assert [line.split()[3] for line in limited] == [f"r{i}" for i in range(5)]
    middle = ok(
        laminar(cluster3, "consume", name, "--from", str(indexes[3]), "--to", str(indexes[7]))
    ).splitlines()
    assert [line.split()[3] for line in middle] == ["r3", "r4", "r5", "r6"]
    assert ok(laminar(cluster3, "consume", name, "--from", "latest")) == ""

    # --follow stops at --max-records; it also sees records produced after it started (from
    # the next index, named: "latest" would race with the produce below)
    follow = subprocess.Popen(
        [sys.executable, "-m", "laminar", "consume", name, "--follow",
         "--from", str(indexes[-1] + 1), "--max-records", "3", "--json",
         "--brokers", ",".join(cluster3.urls)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(LAMINAR_TOKEN_FILE=str(cluster3.token_file)),
    )  # fmt: skip
    try:
        ok(laminar(cluster3, "produce", name, stdin="new0\nnew1\nnew2\nnew3\n"))
        out, err = follow.communicate(timeout=TIMEOUT_S)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert [r["value"] for r in json_lines(out)] == ["new0", "new1", "new2"]

    # --follow until Ctrl-C: exit 0, no traceback
    follow = subprocess.Popen(
        [sys.executable, "-m", "laminar", "consume", name, "--follow",
         "--brokers", ",".join(cluster3.urls)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(LAMINAR_TOKEN_FILE=str(cluster3.token_file)),
        preexec_fn=interruptible,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        assert follow.stdout is not None
        assert follow.stdout.readline().split()[3] == "r0"  # it runs
        while time.monotonic() < deadline and follow.poll() is None:
            follow.send_signal(signal.SIGINT)
            try:
                follow.wait(timeout=5)
            except subprocess.TimeoutExpired:
                continue
        follow.wait(timeout=TIMEOUT_S)
        rest, err = follow.stdout.read(), (follow.stderr.read() if follow.stderr else "")
    finally:
        follow.kill()
    assert follow.returncode == 0 and "Traceback" not in err, err
    assert len(rest.splitlines()) == 23  # r1..r19 and new0..new3


def test_cluster_status(cluster3: Any) -> None:
    name = unique("status")
    ok(laminar(cluster3, "topic", "create", name, "--partitions", "2"))
    wait_for_leaders(cluster3, name, 2)
    text = ok(laminar(cluster3, "cluster", "status"))
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    for node, url in zip(("n1", "n2", "n3"), cluster3.urls, strict=True):
        assert rows[node][1] == url.rstrip("/") and rows[node][2] == "alive"
    assert rows[name][1:3] == ["2", "3"]

    status = json.loads(ok(laminar(cluster3, "cluster", "status", "--json")))
    members = {m["id"]: m for m in status["members"]}
    assert set(members) == {"n1", "n2", "n3"}
    assert status["metadata_leader"] in members
    topic = next(t for t in status["topics"] if t["name"] == name)
    assert sum(topic["leaders"].values()) + topic["leaderless"] == 2
    assert sum(m["replicas_hosted"] for m in members.values()) >= 6
    assert all(
        {"api_url", "state", "weight", "draining", "partitions_led"} <= set(m)
        for m in members.values()
    )


def test_node_commands(cluster3: Any) -> None:
    assert (
        ok(laminar(cluster3, "node", "weight", "n3", "1")).strip() == "n3: not draining, weight 1"
    )
    drained = json.loads(ok(laminar(cluster3, "node", "drain", "n3", "--json")))
    assert drained == {"node": "n3", "draining": True, "weight": 1}
    assert ok(laminar(cluster3, "node", "undrain", "n3")).strip() == "n3: not draining, weight 1"
    assert "404 not_found" in failed(laminar(cluster3, "node", "drain", "n99"))


def test_txn_commands(cluster3: Any) -> None:
    assert "404 not_found" in failed(laminar(cluster3, "txn", "describe", "cli-txn"))
    fenced = ok(laminar(cluster3, "txn", "fence", "cli-txn"))
    assert fenced.startswith("cli-txn: empty, producer ") and "partitions: none;" in fenced
    assert "last transaction: none yet; forgotten after 604800000 ms unused" in fenced
    again = json.loads(ok(laminar(cluster3, "txn", "fence", "cli-txn", "--json")))
    assert again["phase"] == "empty" and again["producer_id"] & 0xFFFF == 1  # the next epoch
    described = json.loads(ok(laminar(cluster3, "txn", "describe", "cli-txn", "--json")))
    assert described == again
    assert "400 bad_request" in failed(laminar(cluster3, "txn", "fence", "no spaces"))


def test_where_the_token_comes_from(secured_cluster: Any, tmp_path: Path) -> None:
    """--token-file, then $LAMINAR_TOKEN, then $LAMINAR_TOKEN_FILE, then a context of the
    client configuration file ($LAMINAR_CONFIG; --context or $LAMINAR_CONTEXT or its
    current-context), each read only when those before it are missing."""
    good = tmp_path / "token"
    good.write_text(secured_cluster.token + "\n")
    bad = tmp_path / "bad-token"
    bad.write_text("lmq_not-a-token-of-this-cluster\n")
    error = failed(laminar(secured_cluster, "topic", "list", env=environment()))
    assert "401 unauthorized" in error and "--token-file" in error and "LAMINAR_TOKEN" in error
    ok(laminar(secured_cluster, "topic", "list", "--token-file", str(good), env=environment()))
    ok(laminar(secured_cluster, "cluster", "status", env=environment(LAMINAR_TOKEN_FILE=str(good))))
    ok(laminar(secured_cluster, "topic", "list", env=environment(LAMINAR_TOKEN=TOKEN)))
    # the option before the environment; $LAMINAR_TOKEN before $LAMINAR_TOKEN_FILE (unread)
    bad_env = environment(LAMINAR_TOKEN="lmq_wrong", LAMINAR_TOKEN_FILE=str(tmp_path / "none"))
    ok(laminar(secured_cluster, "topic", "list", "--token-file", str(good), env=bad_env))
    assert "401" in failed(laminar(secured_cluster, "topic", "list", env=bad_env))
    either = environment(LAMINAR_TOKEN=TOKEN, LAMINAR_TOKEN_FILE=str(tmp_path / "none"))
    ok(laminar(secured_cluster, "topic", "list", env=either))
    missing = laminar(secured_cluster, "topic", "list", "--token-file", str(tmp_path / "x"))
    assert "cannot read the token file" in failed(missing)

    # contexts: brokers and token from the file; relative paths from its directory
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "current-context": "wrong",
                "contexts": [
                    {"name": "here", "brokers": secured_cluster.urls, "token-file": "token"},
                    {"name": "wrong", "brokers": secured_cluster.urls, "token-file": "bad-token"},
                ],
            }
        )
    )
    contexts = environment(LAMINAR_CONFIG=str(config))
    listed = laminar(secured_cluster, "topic", "list", env=contexts, brokers=False)
    assert "401" in failed(listed)  # the current context's token is not this cluster's
    ok(laminar(secured_cluster, "topic", "list", "--context", "here", env=contexts, brokers=False))
    chosen = {**contexts, "LAMINAR_CONTEXT": "here"}
    ok(laminar(secured_cluster, "topic", "list", env=chosen, brokers=False))
    # an explicit context before the environment; the environment before the current context
    ok(laminar(secured_cluster, "topic", "list", "--context", "here", env={**contexts,
       "LAMINAR_TOKEN": "lmq_wrong"}, brokers=False))  # fmt: skip
    ok(laminar(secured_cluster, "topic", "list", env={**contexts, "LAMINAR_TOKEN": TOKEN},
               brokers=False))  # fmt: skip
    unknown = laminar(secured_cluster, "topic", "list", "--context", "nope", env=contexts)
    assert "no context 'nope'" in failed(unknown)


@pytest.mark.parametrize("transport", ["http", "stream"])
def test_bench_produces_at_a_fixed_rate_and_consumes_it_back(cluster3: Any, transport: str) -> None:
    """`laminar bench produce --rate`, over HTTP appends or streaming appends: every record due
    is acknowledged, each with a latency, and `bench consume` reads them all back."""
    name = unique("rate")
    options = ["--topic", name, "--partitions", "2", "--size", "64", "--no-progress", "--json"]
    rate = ["--rate", "400", "--seconds", "1", "--linger-ms", "5"]
    stream = ["--stream"] if transport == "stream" else []
    produced = json.loads(ok(laminar(cluster3, "bench", "produce", *options, *rate, *stream))
                          .splitlines()[-1])  # fmt: skip
    assert (produced["mode"], produced["transport"]) == ("fixed_rate", transport)
    assert produced["records"] == 400
    assert 0 < produced["latency_p50_ms"] <= produced["latency_p99_ms"]
    consumed = json.loads(ok(laminar(cluster3, "bench", "consume", *options)).splitlines()[-1])
    assert consumed["records"] == 400
