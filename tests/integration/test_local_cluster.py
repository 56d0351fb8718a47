"""`laminar local-cluster up|status|down`, detached and in the foreground (Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar.credentials import load as load_credentials
from laminar.credentials import token_hash
from laminar.local_cluster import PACKAGE_ROOT, ClusterError, LocalCluster, pid_alive

from .conftest import interruptible, loopback_prefix

pytestmark = pytest.mark.integration
LAMINAR = [sys.executable, "-m", "laminar"]


def brokers_of(data_dir: Path) -> list[int]:
    document = json.loads((data_dir / "cluster.json").read_text())
    return [node["pid"] for node in document["nodes"].values()]


def test_brokers_import_the_laminar_this_process_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that put a checkout on sys.path (a bench) starts that checkout's brokers, not
    the one PYTHONPATH or an editable install would give them; PYTHONPATH's entries follow."""
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("PYTHONPATH", str(elsewhere))
    env = LocalCluster(tmp_path / "cluster", 1, env={"LAMINAR_TEST": "1"}).broker_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PACKAGE_ROOT), str(elsewhere)]
    assert env["LAMINAR_TEST"] == "1"
    imported = subprocess.run(
        [sys.executable, "-c", "import laminar; print(laminar.__file__)"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert Path(imported).resolve().parent.parent == PACKAGE_ROOT


def test_detached_up_status_down(tmp_path: Path) -> None:
    data_dir = tmp_path / "detached"
    prefix = loopback_prefix()
    up = subprocess.run(
        [
            *LAMINAR,
            "local-cluster",
            "up",
            "--nodes",
            "2",
            "--detach",
            "--prefix",
            prefix,
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        # TLS by default: HTTPS URLs, and the CA the clients need, made in the data directory
        assert f"n1  https://{prefix}.11:7070" in up.stdout and "LAMINAR_BROKERS=" in up.stdout
        ca_file = data_dir / "tls" / "ca.crt"
        assert f"export LAMINAR_CA_FILE={ca_file}" in up.stdout
        assert (data_dir / "tls" / "ca.key").stat().st_mode & 0o777 == 0o600
        # an admin token, and the brokers' credentials file admitting it, both private
        token_file = data_dir / "token"
        assert f"export LAMINAR_TOKEN_FILE={token_file}" in up.stdout
        for made in (token_file, data_dir / "credentials.yaml"):
            assert made.stat().st_mode & 0o777 == 0o600, made
        (admin,) = load_credentials(data_dir / "credentials.yaml")
        assert admin.admin and admin.hashes == (token_hash(token_file.read_text().strip()),)
        env = {
            **os.environ,
            "LAMINAR_BROKERS": f"https://{prefix}.11:7070",
            "LAMINAR_TOKEN_FILE": str(token_file),  # the client commands take it from there
        }
        anonymous = subprocess.run(
            [*LAMINAR, "topic", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in env.items() if k != "LAMINAR_TOKEN_FILE"}
            | {"LAMINAR_CA_FILE": str(data_dir / "tls" / "ca.crt")},
        )
        assert anonymous.returncode == 1 and "401 unauthorized" in anonymous.stderr
        listed = subprocess.run(
            [*LAMINAR, "cluster", "status"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "LAMINAR_CA_FILE": str(ca_file)},
        )
        assert listed.returncode == 0 and "n2" in listed.stdout, listed.stdout + listed.stderr
        untrusted = subprocess.run(  # without the CA: the certificate is refused, at once
            [*LAMINAR, "cluster", "status", "--timeout", "30"],
            capture_output=True,
            text=True,
            timeout=20,
            env={k: v for k, v in env.items() if k != "LAMINAR_CA_FILE"},
        )
        assert untrusted.returncode == 1, untrusted.stderr
        assert "certificate verify failed" in untrusted.stderr, untrusted.stderr
        status = subprocess.run(
            [*LAMINAR, "local-cluster", "status", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.stdout.count("ready") == 2, status.stdout
        again = subprocess.run(
            [*LAMINAR, "local-cluster", "up", "--data-dir", str(data_dir), "--detach"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = subprocess.run(
            [*LAMINAR, "local-cluster", "down", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert down.returncode == 0 and "stopped 2 brokers" in down.stdout
    assert all(not pid_alive(pid) for pid in brokers_of(data_dir))
    for line in (data_dir / "n1" / "broker.log").read_text().splitlines()[-3:]:
        assert "Traceback" not in line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_foreground_up_stops_its_brokers_on_ctrl_c_or_sigterm(
    signum: signal.Signals, tmp_path: Path
) -> None:
    """The signal comes the instant the line inviting Ctrl-C is read: `up` stops every broker
    and exits 0. This test and `up` share one CPU, so the reader's wake-up preempts `up` inside
    the line's write, where a KeyboardInterrupt once escaped `up`'s handling (exit -2)."""
    data_dir = tmp_path / "foreground"
    prefix = loopback_prefix()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})  # this thread; `up` and its broker inherit it
    process = subprocess.Popen(
        [
            *LAMINAR,
            "local-cluster",
            "up",
            "--nodes",
            "1",
            "--prefix",
            prefix,
            "--data-dir",
            str(data_dir),
            "--no-tls",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "Ctrl-C" in line or not line:
                break
        pids = brokers_of(data_dir)  # a file read and kill(0): this thread keeps the CPU
        running = pids and all(pid_alive(pid) for pid in pids)
        process.send_signal(signum)
        os.sched_setaffinity(0, affinity)
        assert "running; Ctrl-C stops the cluster" in "".join(lines), lines
        assert "LAMINAR_CA_FILE" not in "".join(lines)  # --no-tls: plain HTTP
        assert running, pids
        assert process.wait(timeout=60) == 0
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        os.sched_setaffinity(0, affinity)
        if process.poll() is None:
            process.kill()
            LocalCluster.load(data_dir).stop()


def test_each_cluster_gets_its_own_random_secret_passed_to_every_broker(tmp_path: Path) -> None:
    """No broker of a local cluster relies on a built-in secret: `up` makes a random one in
    the data directory (mode 600) and hands the same file to every broker; a later `up`
    reuses it; another cluster gets another."""
    from laminar.server.config import read_secret_file, secret_problem

    first = LocalCluster(tmp_path / "first", 3, prefix=loopback_prefix())
    files = set()
    for node in first.nodes.values():
        command = first.command(node)
        files.add(command[command.index("--secret-file") + 1])
    assert files == {str(tmp_path / "first" / "secret")}
    path = Path(files.pop())
    assert path.stat().st_mode & 0o777 == 0o600
    secret = read_secret_file(str(path))
    assert secret_problem(secret) is None
    assert read_secret_file(str(LocalCluster(tmp_path / "first", 3).secret_path())) == secret
    other = LocalCluster(tmp_path / "other", 1, prefix=loopback_prefix())
    assert read_secret_file(str(other.secret_path())) != secret
    # A weak secret someone put there is refused before any broker starts.
    (tmp_path / "weak").mkdir()
    (tmp_path / "weak" / "secret").write_text("changeme")
    weak = LocalCluster(tmp_path / "weak", 1, prefix=loopback_prefix())
    with pytest.raises(ClusterError, match="8 bytes long"):
        weak.start()
    assert all(node.pid is None for node in weak.nodes.values())


def test_each_cluster_gets_an_admin_token_and_credentials_passed_to_every_broker(
    tmp_path: Path,
) -> None:
    """`up` makes an admin token (`<data-dir>/token`) and the credentials file admitting it,
    hands the file to every broker (--credentials-file), and reuses both later; a credentials
    file that does not admit the token is refused before any broker starts."""
    first = LocalCluster(tmp_path / "first", 2, prefix=loopback_prefix())
    for node in first.nodes.values():
        command = first.command(node)
        assert command[command.index("--credentials-file") + 1] == str(
            tmp_path / "first" / "credentials.yaml"
        )
        assert "--token-file" not in command and "--allow-anonymous" not in command
    token = first.token
    assert token.startswith("lmq_") and LocalCluster(tmp_path / "first", 2).token == token
    assert LocalCluster(tmp_path / "other", 1).token != token
    chosen = LocalCluster(tmp_path / "chosen", 1, token="a-token-chosen-by-a-test")
    assert chosen.token == "a-token-chosen-by-a-test"
    (tmp_path / "first" / "token").write_text("lmq_someone-elses\n")
    with pytest.raises(ClusterError, match="is no admin's"):
        LocalCluster(tmp_path / "first", 2, prefix=loopback_prefix()).start()
