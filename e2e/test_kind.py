"""End to end on kind: the images built with Docker, the operator installed with its Helm
chart, `kubectl apply -f examples/cluster.yaml`, a Topic, records through the client Service,
`kubectl scale` up (Rebalancing, then converged) and the cluster deleted. Records go in and
out with the `laminar` CLI inside the broker pods (`kubectl exec`), through the client
Service.

Runs where Docker and kind exist (kind needs a running Docker engine); skipped, with the
reason, elsewhere. kubectl and helm come from PATH, else from e2e/kube/build-binaries.sh.
LAMINAR_KIND_KEEP=1 leaves the kind cluster for a look afterwards.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.test_operator import wait_for

ROOT = Path(__file__).resolve().parents[1]
TAG = "e2e"
WAIT_S = 300.0


def _docker_running() -> str | None:
    """Why kind cannot run here, or None when it can."""
    for tool in ("docker", "kind"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return "no Docker engine is running (kind runs its nodes as Docker containers)"
    return None


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    built = subprocess.run(
        [str(ROOT / "e2e" / "kube" / "build-binaries.sh")],
        capture_output=True, text=True, check=True, timeout=3600,
    )  # fmt: skip
    return str(Path(built.stdout.strip()) / name)


def run(*args: str, stdin: str | None = None, timeout_s: float = 600) -> str:
    done = subprocess.run(
        args, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    return done.stdout


class Kind:
    def __init__(self, name: str, kubeconfig: Path) -> None:
        self.name = name
        self.kubeconfig = kubeconfig
        self.kubectl_bin = _tool("kubectl")
        self.helm_bin = _tool("helm")

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return run(self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args, stdin=stdin)

    def get(self, what: str, namespace: str = "default") -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", what, "-n", namespace, "-o", "json"))
        return found

    def helm(self, *args: str) -> str:
        return run(self.helm_bin, "--kubeconfig", str(self.kubeconfig), *args)


@pytest.fixture(scope="module")
def kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kind]:
    why = _docker_running()
    if why:
        pytest.skip(f"kind e2e: {why}; tests/kube covers the operator against a real API server")
    for dockerfile, image in (("Dockerfile.broker", "laminar-broker"),
                              ("Dockerfile.operator", "laminar-operator")):  # fmt: skip
        run("docker", "build", "-f", str(ROOT / dockerfile), "-t", f"{image}:{TAG}", str(ROOT),
            timeout_s=1800)  # fmt: skip
    name = f"laminar-e2e-{secrets.token_hex(3)}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    run("kind", "create", "cluster", "--name", name, "--kubeconfig", str(kubeconfig),
        "--wait", "180s", timeout_s=600)  # fmt: skip
    try:
        for image in ("laminar-broker", "laminar-operator"):
            run("kind", "load", "docker-image", f"{image}:{TAG}", "--name", name)
        yield Kind(name, kubeconfig)
    finally:
        if not os.environ.get("LAMINAR_KIND_KEEP"):
            run("kind", "delete", "cluster", "--name", name)


def test_a_cluster_from_helm_install_to_scale_up(kind: Kind) -> None:
    kind.helm(
        "install", "laminar-operator", str(ROOT / "charts" / "laminar-operator"),
        "--namespace", "laminar-system", "--create-namespace", "--wait", "--timeout", "5m",
        "--set", "image.repository=laminar-operator", "--set", f"image.tag={TAG}",
    )  # fmt: skip
    cluster = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    cluster["spec"]["image"] = f"laminar-broker:{TAG}"
    cluster["spec"]["resources"] = {}
    kind.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(cluster))

    def status() -> dict[str, Any]:
        return kind.get("laminarcluster/demo").get("status") or {}

    wait_for("3 brokers ready", lambda: status().get("readyReplicas") == 3, WAIT_S)
    wait_for("Running", lambda: status().get("phase") == "Running", WAIT_S)
    kind.kubectl("apply", "-f", str(ROOT / "examples" / "topic.yaml"))

    def led() -> dict[str, Any] | None:
        s = kind.get("topic.laminarmq.io/orders").get("status") or {}
        parts = s.get("partitions") or []
        return s if len(parts) == 4 and all(p["leader"] for p in parts) else None

    shown = wait_for("the topic's leaders in status", led, WAIT_S)
    assert all(len(p["replicas"]) == 3 for p in shown["partitions"])

    # records through the client Service, with the CLI the broker image carries
    brokers = "--brokers=http://demo:7070"
    lines = "".join(f"record-{i}\n" for i in range(20))
    kind.kubectl("exec", "-i", "demo-0", "-c", "broker", "--", "laminar", "produce", brokers,
                 "orders", stdin=lines)  # fmt: skip
    read = kind.kubectl("exec", "demo-1", "-c", "broker", "--", "laminar", "consume", brokers,
                        "--json", "orders")  # fmt: skip
    values = sorted(json.loads(line)["value"] for line in read.splitlines() if line.strip())
    assert values == sorted(f"record-{i}" for i in range(20))

    kind.kubectl("scale", "laminarcluster/demo", "--replicas=4")
    wait_for("4 brokers ready", lambda: status().get("readyReplicas") == 4, WAIT_S)

    def converged() -> bool:
        s = status()
        members = {m["name"]: m for m in s.get("members") or []}
        moved = members.get("demo-3", {}).get("replicas", 0) > 0
        rebalancing = next((c for c in s.get("conditions", []) if c["type"] == "Rebalancing"), {})
        return moved and rebalancing.get("status") == "False"

    wait_for("partitions moved onto demo-3, Rebalancing over", converged, WAIT_S)
    kind.kubectl("delete", "laminarcluster/demo", "--wait=true", "--timeout=180s")
    wait_for("the StatefulSet collected", lambda: "demo" not in kind.kubectl(
        "get", "statefulsets", "-o", "name"))  # fmt: skip
