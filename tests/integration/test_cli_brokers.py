"""The `laminar` commands given several brokers, and `bench produce` creating its topic (issue 26),
against three real TLS broker processes, as `laminar local-cluster up` runs them by default.

Any broker of the list that answers will do: with the first one stopped, commands still work,
whether the list comes from --brokers or $LAMINAR_BROKERS (and `bench` takes the same list). The
default list is local-cluster's three brokers, and a client given no brokers finds them (and
its CA file) as the commands do. `bench produce` says on stderr that it is creating
its topic and waiting for its leaders (seconds that would pass in silence without a terminal),
and says nothing when the topic exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.client import Client, LaminarError
from laminar.client.config import DEFAULT_BROKERS
from laminar.local_cluster import LocalCluster

from .conftest import make_cluster
from .test_cli import TIMEOUT_S, environment, json_lines, ok, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three TLS brokers (HTTPS for clients, as local-cluster's), for this module alone: a
    test stops one of them."""
    cluster = make_cluster(tmp_path_factory.mktemp("brokers"), tls=True)
    yield cluster
    cluster.stop()


def client_env(cluster: LocalCluster, **extra: str) -> dict[str, str]:
    """The environment `local-cluster up` tells a user to export (token and CA), and `extra`."""
    assert cluster.ca_file is not None
    return environment(
        LAMINAR_TOKEN_FILE=str(cluster.token_file), LAMINAR_CA_FILE=str(cluster.ca_file), **extra
    )


def run(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`python3 -m laminar ARGS`, with a timeout."""
    return subprocess.run(
        [sys.executable, "-m", "laminar", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 3,
        env=env,
    )


def test_the_default_brokers_are_local_clusters_three(tmp_path: Path) -> None:
    # `laminar local-cluster up` with its defaults: three brokers, TLS, from 127.0.0.11
    assert list(DEFAULT_BROKERS) == LocalCluster(tmp_path, 3, tls=True).urls
    help_text = " ".join(ok(run("topic", "list", "--help", env=environment())).split())
    assert "https://127.0.0.{11,12,13}:7070" in help_text


def test_a_client_given_no_brokers_finds_them_as_the_commands_do(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # what `local-cluster up` tells a user to export, and no configuration file
    for name in [n for n in os.environ if n.startswith("LAMINAR_")]:
        monkeypatch.delenv(name)
    exported = client_env(cluster, LAMINAR_BROKERS=",".join(cluster.urls))
    for name, value in exported.items():
        if name.startswith("LAMINAR_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("LAMINAR_CONFIG", str(tmp_path / "none.yaml"))
    topic = unique("found")
    with Client(timeout_s=TIMEOUT_S) as client:  # brokers, CA file and token: all found
        assert client.async_client.brokers == cluster.urls
        client.create_topic(topic, partitions=2)
        assert client.produce(topic, [b"found"])
    # the CA came from $LAMINAR_CA_FILE: without it, the brokers' certificates are not trusted
    monkeypatch.delenv("LAMINAR_CA_FILE")
    with Client(timeout_s=TIMEOUT_S) as client, pytest.raises(LaminarError) as refused:
        client.topics()
    assert refused.value.code == "tls_error", refused.value
    # nothing given anywhere: local-cluster's three, as the commands' default
    monkeypatch.delenv("LAMINAR_BROKERS")
    with Client() as client:
        assert client.async_client.brokers == list(DEFAULT_BROKERS)


def test_bench_produce_says_it_creates_its_topic(cluster: LocalCluster) -> None:
    topic = unique("bench")
    brokers = ",".join(cluster.urls)
    bench = (
        "bench", "produce", "--topic", topic, "--count", "300", "--batch", "100",
        "--partitions", "2", "--replication-factor", "3", "--json", "--brokers", brokers,
    )  # fmt: skip
    first = run(*bench, env=client_env(cluster))
    figures = json.loads(ok(first).splitlines()[-1])
    assert (figures["records"], figures["partitions"], figures["topic"]) == (300, 2, topic)
    # stderr is not a terminal here (no progress bar): the one line says what the wait is
    assert first.stderr.splitlines() == [
        f"laminar bench: creating topic {topic} (2 partitions, replication factor 3) and "
        "waiting for its leaders"
    ]
    described = json.loads(
        ok(run("topic", "describe", topic, "--json", "--brokers", brokers, env=client_env(cluster)))
    )
    assert (described["partitions"], described["replication_factor"]) == (2, 3)

    again = run(*bench, env=client_env(cluster))
    assert json.loads(ok(again).splitlines()[-1])["records"] == 300
    assert again.stderr == ""  # the topic exists: nothing is created, nothing to say

    assert "(default: 1120)" in " ".join(ok(run("bench", "--help", env=environment())).split())


def test_a_stopped_first_broker_fails_no_command(cluster: LocalCluster) -> None:
    listed = ",".join(cluster.urls)
    assert listed.startswith(cluster.nodes["n1"].api_url)  # n1 is the first one tried
    cluster.stop_node("n1")
    try:
        from_flag = client_env(cluster)
        from_env = client_env(cluster, LAMINAR_BROKERS=listed)
        # n1 alone: nothing answers (what the others answer below, they answer for it)
        alone = run("topic", "list", "--brokers", cluster.nodes["n1"].api_url, "--timeout", "2",
                    env=from_flag)  # fmt: skip
        assert alone.returncode == 1 and "no answer from the brokers" in alone.stderr
        topic = unique("first-down")
        wait = ("--timeout", str(TIMEOUT_S))  # (the metadata leader may have been n1)
        ok(run("topic", "create", topic, "--partitions", "2", "--brokers", listed, *wait,
               env=from_flag))  # fmt: skip
        assert topic in ok(run("topic", "list", *wait, env=from_env)).split()
        produced = ok(run("produce", topic, *wait, env=from_env, stdin="a\nb\nc\n"))
        assert produced.startswith("produced 3 records")
        records = json_lines(ok(run("consume", topic, "--json", *wait, env=from_env)))
        assert sorted(r["value"] for r in records) == ["a", "b", "c"]
        status = json.loads(ok(run("cluster", "status", "--json", "--brokers", listed, *wait,
                                   env=from_flag)))  # fmt: skip
        assert status["node_id"] in ("n2", "n3")  # answered by one of the others
        bench = run(
            "bench", "produce", "--topic", topic, "--count", "100", "--batch", "50", "--json",
            *wait, env=from_env,
        )  # fmt: skip
        assert json.loads(ok(bench).splitlines()[-1])["records"] == 100
    finally:
        cluster.start_missing()
