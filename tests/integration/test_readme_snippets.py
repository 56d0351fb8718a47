"""Every Python snippet of README.md runs as the script a user saves it to, as they would run it.

The user's story, followed literally: in a working directory of their own they ran the
README's `laminar local-cluster up ... --detach` (here with a loopback prefix of the test's own)
and exported what it printed, then the README's `laminar topic create` and `laminar produce`
lines; each snippet then runs as `python3 snippet.py` in that shell (no URL or path swapped in).
A snippet must end on its own within SNIPPET_TIMEOUT_S, except the shared-queue worker, which
runs until a signal: it is stopped with SIGINT (Ctrl-C) and with SIGTERM, and must then end
cleanly with what it handled accepted and nothing left held. Every snippet has its check here
(a snippet without one fails), and none leaves a file behind in the working directory.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from laminar.client import AsyncClient
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record

from .conftest import interruptible, loopback_prefix, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
#: how long one snippet may run (a start of Python, a few requests to a cluster)
SNIPPET_TIMEOUT_S = 120.0
#: how long `laminar local-cluster up` and the README's set-up commands may take
SETUP_TIMEOUT_S = 180.0
DATA_DIR = "laminar-data"  # the README's --data-dir


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def console_lines() -> list[str]:
    """The lines of the README's console blocks, comments cut off."""
    blocks = re.findall(r"```console\n(.*?)```", README, flags=re.S)
    lines = [re.split(r"\s#\s", line)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def readme_line(prefix: str) -> str:
    (line,) = [line for line in console_lines() if line.startswith(prefix)]
    return line


SNIPPETS = python_snippets()


@dataclass
class Shell:
    """The user's shell: its working directory and its environment."""

    cwd: Path
    env: dict[str, str]

    def client(self) -> AsyncClient:
        return AsyncClient(
            self.env["LAMINAR_BROKERS"].split(","),
            token_file=self.env["LAMINAR_TOKEN_FILE"],
            ca_file=self.env["LAMINAR_CA_FILE"],
        )

    def leftovers(self) -> list[str]:
        return sorted(set(os.listdir(self.cwd)) - {DATA_DIR})


def bash(line: str, cwd: Path, env: dict[str, str]) -> str:
    """A README console line, run as the user's shell runs it (`laminar` found on PATH)."""
    result = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=SETUP_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, f"{line}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    cwd = tmp_path_factory.mktemp("user")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMINAR_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LAMINAR_CONFIG"] = str(cwd.parent / "no-client-config.yaml")  # none of the machine's
    env["PYTHONUNBUFFERED"] = "1"  # each line of a snippet's output as it prints it
    up = readme_line("laminar local-cluster up")
    assert f"--data-dir ./{DATA_DIR}" in up and "--detach" in up
    try:
        printed = bash(f"{up} --prefix {loopback_prefix()}", cwd, env)
        exports = dict(re.findall(r"^export (LAMINAR_\w+)=(.*)$", printed, flags=re.M))
        # the README exports what `up` prints, no more, no less
        readme_exports = {line.split()[1].split("=")[0] for line in console_lines()
                          if line.startswith("export LAMINAR_")}  # fmt: skip
        assert set(exports) == readme_exports, printed
        env.update(exports)
        for line in (readme_line("laminar topic create orders"), readme_line("printf ")):
            bash(line, cwd, env)
        yield Shell(cwd, env)
    finally:
        if (cwd / DATA_DIR / "cluster.json").exists():
            LocalCluster.load(cwd / DATA_DIR).stop()  # what `laminar local-cluster down` does


def script(tmp_path: Path, snippet: str) -> Path:
    path = tmp_path / "snippet.py"  # beside, not in, the user's working directory
    path.write_text(snippet)
    return path


def run_to_the_end(shell: Shell, path: Path) -> subprocess.CompletedProcess[str]:
    """The snippet at `path` run as a script in the user's shell; it must end, and succeed."""
    result = subprocess.run(
        [sys.executable, str(path)], cwd=shell.cwd, env=shell.env, capture_output=True,
        text=True, timeout=SNIPPET_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def check_produce_consume(shell: Shell, path: Path) -> None:
    result = run_to_the_end(shell, path)
    sent, consumed = result.stdout.splitlines()
    found = re.fullmatch(r"RecordMetadata\(partition=(\d+), index=(\d+)\)", sent)
    assert found is not None, sent
    assert re.fullmatch(r"\d+ \d+ b'.*'", consumed), consumed
    partition, index = int(found[1]), int(found[2])

    async def stored() -> tuple[bytes | None, bytes | None]:
        async with shell.client() as client:
            (record,) = (await client.read("orders", partition, index, max_records=1)).records
            return record.key, record.value

    assert asyncio.run(stored()) == (b"customer-1", b"hello")


def check_sync_consume(shell: Shell, path: Path) -> None:
    """The blocking consumer printed every record of the topic, each partition in order, and
    ended by itself (stop_at_end)."""
    printed: dict[str, list[str]] = {}
    for line in run_to_the_end(shell, path).stdout.splitlines():
        printed.setdefault(line.split(" ")[0], []).append(line)

    async def stored() -> dict[str, list[str]]:
        lines: dict[str, list[str]] = {}
        async with shell.client() as client:
            for p in range((await client.describe_topic("orders")).partitions):
                result = await client.read("orders", p, None, max_records=1000)
                lines[str(p)] = [f"{p} {r.index} {r.value!r}" for r in result.records]
        return {p: records for p, records in lines.items() if records}

    assert printed == asyncio.run(stored())


LINE = re.compile(r"(\d+) (\d+) (\d+) (b'.*')")


async def run_worker(shell: Shell, path: Path, signum: int, errors: Path) -> list[str]:
    """Start the worker, wait until it has handled a message made for this run, signal it, and
    return its output (it must have ended by itself, cleanly, after the signal)."""
    value = f"work-{uuid.uuid4().hex}".encode()
    async with shell.client() as client:
        await client.append("orders", 0, [Record(value=value)])
    with errors.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(path), cwd=shell.cwd, env=shell.env,
            stdout=subprocess.PIPE, stderr=stderr, preexec_fn=interruptible,
        )  # fmt: skip
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(SNIPPET_TIMEOUT_S):
            while not (lines and lines[-1].endswith(repr(value))):
                line = await process.stdout.readline()
                assert line, f"the worker ended before handling {value!r}: {errors.read_text()}"
                lines.append(line.decode().rstrip("\n"))
            process.send_signal(signum)
            rest, _ = await process.communicate()
        lines += rest.decode().splitlines()
    except TimeoutError:
        raise AssertionError(f"the worker did not end: {lines}\n{errors.read_text()}") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"{lines}\n{errors.read_text()}"
    return lines


def check_worker(shell: Shell, path: Path) -> None:
    handled = 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        lines = asyncio.run(run_worker(shell, path, signum, path.with_suffix(".err")))
        assert lines[-1] == "stopped", lines
        assert all(LINE.fullmatch(line) for line in lines[:-1]), lines
        handled += len(lines) - 1

    async def all_accepted() -> bool:
        """Every message the worker handled is accepted, none is held any more."""
        async with shell.client() as client:
            partitions = (await client.describe_topic("orders")).partitions
            groups = [
                await client.describe_group("orders", p, "billing") for p in range(partitions)
            ]
        return sum(g.accepted for g in groups) == handled and not any(g.acquired for g in groups)

    asyncio.run(wait_until("the worker's messages accepted, none held", all_accepted))


def check_log(shell: Shell, path: Path) -> None:
    result = run_to_the_end(shell, path)
    assert result.stdout.strip() == "0 b'k' b'hello'"


#: each snippet's check, found by a string only that snippet has
CHECKS: dict[str, Callable[[Shell, Path], None]] = {
    "Producer(client": check_produce_consume,
    "GroupConsumer(client": check_worker,
    "SegmentedLog.open": check_log,
    "client.consumer(": check_sync_consume,
}


def test_every_snippet_has_its_check() -> None:
    assert SNIPPETS, "README.md has no ```python block: the pattern or the README is wrong"
    for snippet in SNIPPETS:
        markers = [marker for marker in CHECKS if marker in snippet]
        assert len(markers) == 1, f"a README snippet with {len(markers)} checks:\n{snippet}"
    for marker in CHECKS:
        assert sum(marker in snippet for snippet in SNIPPETS) == 1, marker


@pytest.mark.parametrize("number", range(len(SNIPPETS)))
def test_snippet_runs_as_a_script(number: int, shell: Shell, tmp_path: Path) -> None:
    snippet = SNIPPETS[number]
    (check,) = [check for marker, check in CHECKS.items() if marker in snippet]
    check(shell, script(tmp_path, snippet))
    assert shell.leftovers() == []  # nothing made where the user works but the cluster's data
