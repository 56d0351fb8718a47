"""The kind cluster the end-to-end tests share (e2e/cluster.py makes it), and a small face on
kubectl, helm and a client pod inside the cluster."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.kube.test_operator import wait_for as kube_wait_for

from . import cluster as kind_cluster

T = TypeVar("T")
WORKLOAD = Path(__file__).with_name("workload.py")
WAIT_S = 300.0
#: kubectl's environment: exec over SPDY, not WebSockets. kubectl 1.32's WebSocket executor
#: (client-go v0.32 tools/remotecommand) starts reading the connection before it has made
#: its streams; a command that ends at once (`touch`) can have its output and close read
#: first, and kubectl then fails with "Unknown stream id 1 ... error: closed all streams"
#: (CI64). client-go v0.34 makes the streams first; until the pinned Kubernetes has it,
#: SPDY, whose client opens every stream before the command runs, is used.
KUBECTL_ENV = {**os.environ, "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
#: reads of a workload's file copy after its printed lines came cut (`Kube.workload_lines`)
READ_ATTEMPTS = 5


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    """The operator tests' `wait_for`, with the longer default a kind node needs (pods start,
    images unpack)."""
    found: T = kube_wait_for(what, probe, timeout_s)
    return found


class Kube:
    """kubectl and helm against the kind cluster, with their errors in the failure message."""

    def __init__(self, kubeconfig: Path, tools: kind_cluster.Tools) -> None:
        self.kubeconfig = kubeconfig
        self.tools = tools

    def kubectl(self, *args: str, stdin: str | None = None, timeout_s: float = 600.0) -> str:
        return self._run(self.tools.kubectl, *args, stdin=stdin, timeout_s=timeout_s)

    def helm(self, *args: str, timeout_s: float = 600.0) -> str:
        return self._run(self.tools.helm, *args, timeout_s=timeout_s)

    def _run(self, tool: Path, *args: str, stdin: str | None = None, timeout_s: float) -> str:
        command = [str(tool), "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout_s,
            check=False, env=KUBECTL_ENV,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"{' '.join(command[2:])} exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
        return done.stdout

    def get(self, what: str, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", what, "-o", "json", *args))
        return found

    def exists(self, what: str, *args: str) -> bool:
        names = self.kubectl("get", what, "-o", "name", "--ignore-not-found", *args)
        return bool(names.strip())

    def metrics(self, pod: str, port: int = 7070, scheme: str = "https") -> str:
        """A pod's /metrics, through the API server's proxy (the brokers serve HTTPS: their
        cluster's spec.tls.enabled is true by default; the proxy does not verify pods)."""
        return self.kubectl("get", "--raw", f"/api/v1/namespaces/default/pods/{scheme}:{pod}:"
                            f"{port}/proxy/metrics")  # fmt: skip

    def workload(self, pod: str, *args: str, timeout_s: float = 600.0) -> list[dict[str, Any]]:
        """Run e2e/workload.py in `pod`; the JSON lines it printed."""
        out_file = workload_out_file()
        out = self.kubectl("exec", "-i", pod, "--", "env", f"E2E_OUT={out_file}", "python3", "-",
                           *args, stdin=WORKLOAD.read_text(), timeout_s=timeout_s)  # fmt: skip
        return self.workload_lines(pod, out, out_file)

    def start_workload(self, pod: str, out_file: str, *args: str) -> subprocess.Popen[str]:
        """Start e2e/workload.py in `pod`, its lines written to `out_file` there too (read them
        with `workload_lines`)."""
        process = subprocess.Popen(
            [str(self.tools.kubectl), "--kubeconfig", str(self.kubeconfig), "exec", "-i", pod,
             "--", "env", f"E2E_OUT={out_file}", "python3", "-", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=KUBECTL_ENV,
        )  # fmt: skip
        assert process.stdin is not None
        process.stdin.write(WORKLOAD.read_text())
        process.stdin.close()
        process.stdin = None  # all given: communicate() has nothing more to send
        return process

    def workload_lines(self, pod: str, out: str, out_file: str) -> list[dict[str, Any]]:
        """The JSON lines a workload printed (`out`), its end marker checked and dropped. When
        `kubectl exec` cut them (it can, and exit 0: kubernetes/kubernetes#124571), the copy in
        `out_file` in `pod` is read instead, again while that read is cut too (each read is
        checked the same way), at most READ_ATTEMPTS times."""
        for attempt in range(READ_ATTEMPTS + 1):
            if attempt:
                out = self.kubectl("exec", pod, "--", "cat", out_file)
            lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if lines and lines[-1] == {"lines": len(lines) - 1}:
                self.kubectl("exec", pod, "--", "rm", "-f", out_file)
                return lines[:-1]
        raise AssertionError(f"the workload's output was cut in {READ_ATTEMPTS + 1} reads")


def workload_out_file() -> str:
    """A fresh path in the client pod for a workload's copy of its lines."""
    return f"/tmp/workload-{secrets.token_hex(6)}.jsonl"


def cluster_state(kube: Kube) -> str:
    """What a failed scenario leaves to read: the custom resources' status, the pods, events,
    and the tail of the operator's and each broker's log."""
    parts: list[str] = []

    def run(title: str, *args: str, tail: int = 4000) -> None:
        try:
            out = kube.kubectl(*args, timeout_s=60)
        except (AssertionError, subprocess.SubprocessError) as e:
            out = f"({e})"
        parts.append(f"--- {title}\n{out[-tail:]}")

    run("laminarclusters", "get", "laminarclusters", "-o", "jsonpath={.items[*].status}")
    run("topics", "get", "topics.laminarmq.io", "-o", "jsonpath={.items[*].status}")
    run("pods", "get", "pods", "-A", "-o", "wide")
    run("events", "get", "events", "--sort-by=.lastTimestamp", tail=3000)
    operator = ("-n", "laminar-system", "deploy/laminar-operator")
    run("operator log", "logs", *operator, "--tail=80", tail=8000)
    pods = kube.kubectl("get", "pods", "-l", "app.kubernetes.io/instance=demo", "-o", "name")
    for pod in pods.split():
        run(f"{pod} log", "logs", pod, "-c", "broker", "--tail=40", tail=4000)
    # an event says only "PreStopHook failed": the kubelet's journal has the exit code and
    # output of each failed hook (the node is a container of the kind provider's engine)
    engine = "podman" if kind_cluster.mode() == "local" else "docker"
    for node in kube.kubectl("get", "nodes", "-o", "name").split():
        journal = subprocess.run(
            [engine, "exec", node.removeprefix("node/"), "sh", "-c",
             "journalctl -u kubelet --no-pager -o cat | grep -i 'hook failed'"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        found = journal.stdout or journal.stderr or "(none)"
        parts.append(f"--- {node}: the kubelet's failed hooks\n{found[-3000:]}")
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    kube = getattr(item, "funcargs", {}).get("kube")
    if report.when == "call" and report.failed and isinstance(kube, Kube):
        report.sections.append(("cluster state at the failure", cluster_state(kube)))


# module: the cluster goes once test_kind.py's last test ends, not when its pytest-xdist worker
# ends its session, so that an idle kind cluster takes no CPU from the files that run after
@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    why = kind_cluster.why_not_here()
    if why:
        pytest.skip(f"kind e2e: {why}")
    # LAMINAR_KIND_CLUSTER: a cluster of that name (made if missing), kept afterwards
    name = os.environ.get("LAMINAR_KIND_CLUSTER") or f"laminar-e2e-{secrets.token_hex(3)}"
    keep = bool(os.environ.get("LAMINAR_KIND_KEEP") or os.environ.get("LAMINAR_KIND_CLUSTER"))
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    try:
        made = kind_cluster.up(name, kubeconfig)
        yield Kube(made.kubeconfig_path, kind_cluster.Tools.build())
    finally:
        if not keep:
            kind_cluster.down(name)
