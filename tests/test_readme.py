"""The README tells the truth: two set-up commands, CI runs the test one, the example runs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from laminar.log.batch import Record

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    commands = [block.strip() for block in code_blocks("sh")]
    assert len(commands) == 2
    demo, tests = commands
    assert "laminar demo" in demo and "pytest" in tests
    assert tests in (REPO / ".ci" / "run").read_text().splitlines()


def test_demo_command_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "laminar", "demo", "--messages", "12"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "produced 12 messages" in out and out.count(": message ") == 12
    assert "cluster status" in out and "stopped the cluster" in out
    assert "web console, while the demo runs: https://127.0.2.11:7070/ " in out


def test_log_demo_command_runs(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "laminar", "log-demo", "--records", "1000"]
    result = subprocess.run(
        [*command, "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "records_appended: 1000" in result.stdout
    assert "records_read_back: 1000" in result.stdout


def run_example(tmp_path: Path, marker: str, before: Any, after: Any = None) -> None:
    """Run the README's Python block containing `marker` against a one-broker cluster (the
    block's URL swapped for the cluster's), with `before(client)` / `after(client)` around it;
    the block finds the token where the README says, in $LAMINAR_TOKEN_FILE."""
    from laminar.client import AsyncClient
    from tests.integration.conftest import make_cluster

    (example,) = [block for block in code_blocks("python") if marker in block]
    cluster = make_cluster(tmp_path / "cluster", 1)
    try:
        body = example.replace("http://127.0.0.11:7070", cluster.urls[0])
        source = "async def example():\n" + "".join(f"    {line}\n" for line in body.splitlines())
        namespace: dict[str, Any] = {}
        exec(source, namespace)

        async def run() -> None:
            async with AsyncClient(cluster.urls, token=cluster.token) as client:
                await before(client)
            await asyncio.wait_for(namespace["example"](), 60)
            if after is not None:
                async with AsyncClient(cluster.urls, token=cluster.token) as client:
                    await after(client)

        os.environ["LAMINAR_TOKEN_FILE"] = str(cluster.token_file)
        try:
            asyncio.run(run())
        finally:
            del os.environ["LAMINAR_TOKEN_FILE"]
    finally:
        cluster.stop()


def test_client_example_runs(tmp_path: Path, capsys) -> None:
    async def before(client: Any) -> None:
        await client.create_topic("orders", partitions=1, replication_factor=1)

    run_example(tmp_path, "Producer(client", before)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("RecordMetadata(partition=0, index=")
    assert lines[1].startswith("0 ") and lines[1].endswith(" b'hello'")


def test_queue_example_runs(tmp_path: Path, capsys) -> None:
    async def before(client: Any) -> None:
        await client.create_topic("orders", partitions=1, replication_factor=1)
        await client.wait_for_leaders("orders")
        await client.append("orders", 0, [Record(value=b"work")])

    async def after(client: Any) -> None:
        assert (await client.describe_group("orders", 0, "billing")).accepted == 1

    run_example(tmp_path, "GroupConsumer", before, after)
    assert capsys.readouterr().out.strip() == "0 1 1 b'work'"


def test_log_example_runs(tmp_path: Path, capsys) -> None:
    (example,) = [block for block in code_blocks("python") if "SegmentedLog.open" in block]
    exec(example.replace("/var/lib/laminar/p0", str(tmp_path / "p0")), {})
    assert capsys.readouterr().out.strip() == "0 b'k' b'hello'"
    assert os.listdir(tmp_path / "p0")  # the path the README names is where the log went
