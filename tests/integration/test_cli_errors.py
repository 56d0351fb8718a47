"""What a new user of the `laminar` command ran into (issue 26), each against the real thing:
`python3 -m laminar` subprocesses, and three broker processes (`cluster3`) where a broker is
involved.

`queue consume` ends once nothing is left to acquire (and `--follow` waits for more);
`inspect` never writes (a missing path or one without a log is a clear error, a damaged log
is reported, not repaired); expected failures are one `laminar: error: ...` line, never a
traceback; a wrongly typed topic config is refused naming the key and its type, by the command
line and by the HTTP API (400 JSON); the package ships `py.typed`.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from .conftest import auth
from .test_cli import TIMEOUT_S, environment, failed, json_lines, laminar, ok, unique

pytestmark = pytest.mark.integration

REPOSITORY = Path(__file__).resolve().parents[2]


def run_laminar(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python3 -m laminar ARGS` with no cluster involved."""
    return subprocess.run(
        [sys.executable, "-m", "laminar", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=environment(),
        cwd=cwd,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The `laminar: error: ...` line of a command that failed with exit 1 (and nothing else)."""
    assert result.returncode == 1, f"exit {result.returncode}: {result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laminar: error: "), result.stderr
    return lines[0]


def tree(path: Path) -> dict[str, tuple[int, str, int]]:
    """Every file and folder under `path`: size, sha256 and modification time."""
    found: dict[str, tuple[int, str, int]] = {}
    for item in sorted(path.rglob("*")):
        stat = item.stat()
        digest = hashlib.sha256(item.read_bytes()).hexdigest() if item.is_file() else "dir"
        found[str(item.relative_to(path))] = (stat.st_size, digest, stat.st_mtime_ns)
    return found


# ---------------------------------------------------------------------------- queue consume


def test_queue_consume_stops_when_nothing_is_left_and_follow_waits(cluster3: Any) -> None:
    topic = unique("qend")
    ok(laminar(cluster3, "topic", "create", topic, "--partitions", "2"))
    ok(laminar(cluster3, "produce", topic, stdin="a\nb\nc\n"))

    # fewer than --count exist: it takes them all and ends (it used to wait for ever)
    taken = json_lines(ok(laminar(cluster3, "queue", "consume", topic, "billing", "--count",
                                  "10", "--json")))  # fmt: skip
    assert sorted(m["value"] for m in taken) == ["a", "b", "c"]
    described = json.loads(ok(laminar(cluster3, "queue", "describe", topic, "billing", "--json")))
    assert sum(p["accepted"] for p in described["partitions"]) == 3
    assert ok(laminar(cluster3, "queue", "consume", topic, "billing")) == ""  # nothing left

    # --release (a peek) holds what it printed until it ends: it ends all the same
    ok(laminar(cluster3, "produce", topic, stdin="p\nq\n"))
    peeked = ok(laminar(cluster3, "queue", "consume", topic, "billing", "--release"))
    assert sorted(line.split()[-1] for line in peeked.splitlines()) == ["p", "q"]
    taken = json_lines(ok(laminar(cluster3, "queue", "consume", topic, "billing", "--json")))
    assert sorted(m["value"] for m in taken) == ["p", "q"]  # released, so taken again

    # --follow: what is there (x, y, z), then it waits for w, produced after them (a group
    # that is new would start where the slowest group is: the same group goes on)
    ok(laminar(cluster3, "produce", topic, stdin="x\ny\nz\n"))
    follow = subprocess.Popen(
        [sys.executable, "-m", "laminar", "queue", "consume", topic, "billing", "--follow",
         "--count", "4", "--brokers", ",".join(cluster3.urls)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(LAMINAR_TOKEN_FILE=str(cluster3.token_file)),
    )  # fmt: skip
    watchdog = threading.Timer(TIMEOUT_S, follow.kill)  # (bounds the readline below)
    watchdog.start()
    try:
        assert follow.stdout is not None
        first = [follow.stdout.readline().split()[-1:] for _ in range(3)]
        assert sorted(first) == [["x"], ["y"], ["z"]]
        assert follow.poll() is None  # all that existed is taken, and it still runs
        ok(laminar(cluster3, "produce", topic, stdin="w\n"))
        rest, err = follow.communicate(timeout=TIMEOUT_S)
    finally:
        watchdog.cancel()
        follow.kill()
    assert follow.returncode == 0, err
    assert [line.split()[-1] for line in rest.splitlines()] == ["w"]

    help_text = ok(laminar(cluster3, "queue", "consume", "--help", brokers=False))
    assert "--follow" in help_text and "taken or settled" in " ".join(help_text.split())


# ---------------------------------------------------------------------------- inspect


def test_inspect_never_writes(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert "no such directory" in one_error_line(run_laminar("inspect", str(missing)))
    assert not missing.exists()

    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("x")
    assert "not a directory" in one_error_line(run_laminar("inspect", str(not_a_directory)))
    assert not_a_directory.read_text() == "x"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no log here" in one_error_line(run_laminar("inspect", str(empty)))
    assert list(empty.iterdir()) == []

    log = tmp_path / "log"
    made = run_laminar("log-demo", "--data-dir", str(log), "--records", "300")
    assert made.returncode == 0, made.stderr
    clean = tree(log)
    described = json.loads(ok(run_laminar("inspect", str(log))))
    assert (described["start_index"], described["next_index"]) == (0, 300)
    assert tree(log) == clean

    # a torn tail and a lost index: opening the log would cut and rebuild; inspect only says so
    (store,) = log.glob("*.log")
    with store.open("ab") as file:
        file.write(b"\x01torn" * 100)
    for index in log.glob("*.index"):
        index.unlink()
    damaged = tree(log)
    described = json.loads(ok(run_laminar("inspect", str(log))))
    assert described["next_index"] == 300
    assert described["recovery"]["cut_bytes"] == 500 and described["recovery"]["cuts"]
    assert tree(log) == damaged


# ---------------------------------------------------------------------------- one-line errors


def test_expected_errors_are_one_line_not_a_traceback(tmp_path: Path) -> None:
    line = one_error_line(
        run_laminar("local-cluster", "down", "--data-dir", "./nonexistent", cwd=tmp_path)
    )
    assert "no local cluster in nonexistent" in line
    assert not (tmp_path / "nonexistent").exists()
    # nothing listens on the discard port of loopback
    line = one_error_line(
        run_laminar("bench", "produce", "--brokers", "http://127.0.0.1:9", "--timeout", "1")
    )
    assert "127.0.0.1:9" in line


# ---------------------------------------------------------------------------- topic config types


async def test_a_wrongly_typed_topic_config_names_the_key_and_the_type(cluster3: Any) -> None:
    name = unique("cfgtype")
    for action in ("create", "alter"):
        usage = failed(
            laminar(cluster3, "topic", action, name, "--config", "retention_ms=abc"), code=2
        )
        assert "retention_ms='abc' must be an integer or null" in usage
        assert "not supported" not in usage
    ok(laminar(cluster3, "topic", "create", name))

    async with aiohttp.ClientSession(headers=auth(cluster3)) as session:
        for method, path, body in (
            ("POST", "/v1/topics", {"name": unique("cfgtype"), "config": {"retention_ms": "abc"}}),
            ("PATCH", f"/v1/topics/{name}", {"config": {"retention_ms": "abc"}}),
            ("PATCH", f"/v1/topics/{name}", {"config": {"segment_bytes": None}}),
            ("PATCH", f"/v1/topics/{name}", {"config": {"fsync": 1}}),
        ):
            key = next(iter(body["config"]))
            url, deadline = cluster3.urls[0] + path, time.monotonic() + TIMEOUT_S
            while True:  # to the metadata leader (307; not elected yet: 503), header and all
                async with session.request(method, url, json=body, allow_redirects=False) as answer:
                    status, text = answer.status, await answer.text()
                    location = answer.headers.get("Location")
                if status == 307 and location:
                    url = str(answer.url.join(URL(location)))
                elif status != 503 or time.monotonic() > deadline:
                    break
                assert time.monotonic() < deadline, (status, text)
            assert status == 400, (method, path, status, text)
            message = json.loads(text)["error"]["message"]
            assert key in message and "must be" in message, message
            assert "not supported" not in message
    described = json.loads(ok(laminar(cluster3, "topic", "describe", name, "--json")))
    assert described["config"] == {}


# ---------------------------------------------------------------------------- py.typed


def test_the_package_ships_py_typed(tmp_path: Path) -> None:
    assert importlib.resources.files("laminar").joinpath("py.typed").is_file()
    # what a build installs: setuptools' build_py on a copy of the sources (no network)
    source = tmp_path / "source"
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPOSITORY / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    shutil.copytree(REPOSITORY / "broker" / "laminar", source / "broker" / "laminar", ignore=ignore)
    shutil.copytree(
        REPOSITORY / "operator" / "laminar_operator",
        source / "operator" / "laminar_operator",
        ignore=ignore,
    )
    built = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path / "lib")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "lib" / "laminar" / "py.typed").is_file()
    assert (tmp_path / "lib" / "laminar" / "log" / "_records.pyi").is_file()
