"""The fault-injection suite as CI runs it: three seeded runs of real brokers in network
namespaces (about 8 minutes in all on 2 cores), each a subprocess of `python -m tests.faults`
so that its namespace switch, signals and brokers stay out of the pytest process.

Between them the runs cover every fault kind at least once: the 3-broker runs split the kinds
in two, the 5-broker run takes a seeded mix. A failure prints the violations, the seed and
the command that replays the same schedule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .net import missing_tools
from .schedule import KINDS

ROOT = Path(__file__).resolve().parents[2]
#: a run's own bound: start, history, faults, checks (each run takes 2-3 minutes here)
RUN_TIMEOUT_S = 420
STOP_TIMEOUT_S = 90
PROCESS_KINDS = "kill9,kill9_leader,kill9_meta_leader,kill9_all,pause,bitflip_clean,bitflip_kill9"
NETWORK_KINDS = "isolate,isolate_leader,one_way,bridge,disk_full,clock_jump"
RUNS = [
    pytest.param(3, 11, PROCESS_KINDS, 0, id="3-brokers-processes-disks"),
    pytest.param(3, 12, NETWORK_KINDS, 0, id="3-brokers-network-disk-clock"),
    pytest.param(5, 13, "mixed", 6, id="5-brokers-mixed"),
]

pytestmark = pytest.mark.faults


def test_the_runs_cover_every_kind() -> None:
    covered = set(PROCESS_KINDS.split(",")) | set(NETWORK_KINDS.split(","))
    assert covered == set(KINDS)


@pytest.mark.parametrize(("brokers", "seed", "faults", "count"), RUNS)
def test_fault_run(brokers: int, seed: int, faults: str, count: int, tmp_path: Path) -> None:
    reason = missing_tools()
    if reason:
        pytest.skip(f"the fault suite needs its own network namespaces: {reason}")
    env = dict(os.environ)
    paths = [str(ROOT / "broker"), str(ROOT / "operator"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [
        sys.executable, "-m", "tests.faults", "--brokers", str(brokers), "--seed", str(seed),
        "--faults", faults, "--run-dir", str(tmp_path / "run"),
        "--json-out", str(tmp_path / "summary.json"),
    ]  # fmt: skip
    if count:
        command += ["--fault-count", str(count)]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM: the run removes its namespaces, mounts and brokers before it exits
        process.terminate()
        stdout, stderr = process.communicate(timeout=STOP_TIMEOUT_S)
        pytest.fail(f"the run took over {RUN_TIMEOUT_S} s:\n{stderr[-5000:]}")
    sys.stderr.write(stderr[-20_000:])
    try:
        summary = json.loads(stdout)
    except ValueError:
        pytest.fail(f"no summary (exit {process.returncode}):\n{stdout[-3000:]}{stderr[-3000:]}")
    print(json.dumps(_short(summary), indent=2))
    if summary.get("violations", {}).get("total"):
        pytest.fail(
            f"{summary['violations']['total']} violations "
            f"{summary['violations']['by_kind']} with seed {seed}\n"
            f"replay: {summary['replay']}\n"
            f"first violations: {json.dumps(summary['violations']['examples'], indent=1)[:6000]}\n"
            f"broker log lines: {json.dumps(summary.get('broker_log_lines'), indent=1)[:4000]}\n"
            f"broker log tails: {json.dumps(summary.get('broker_log_tails'), indent=1)[-6000:]}"
        )
    assert not summary["harness_problems"], (
        f"the harness did not inject every fault as asked: {summary['harness_problems']}\n"
        f"replay: {summary['replay']}"
    )
    assert process.returncode == 0, stderr[-3000:]


def _short(summary: dict[str, object]) -> dict[str, object]:
    """What a CI log needs: no per-partition detail."""
    keep = ("ok", "seed", "brokers", "faults", "replay", "violations", "counts",
            "unavailability_s_by_kind", "phases_s", "took_s", "harness_problems")  # fmt: skip
    return {k: summary[k] for k in keep if k in summary}
