"""The operator (kopf, in a thread: KopfRunner) against the real API server, with only the
chart's ClusterRole rules (charts/laminar-operator/files/operator-rules.yaml)."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from .conftest import ROOT, KubeApi

RULES = ROOT / "charts" / "laminar-operator" / "files" / "operator-rules.yaml"
WAIT_S = 60.0


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


@pytest.fixture(scope="module")
def operator_kubeconfig(crds: KubeApi) -> Path:
    """A ServiceAccount bound to the chart's ClusterRole rules, and a kubeconfig with its token."""
    crds.kubectl("create", "namespace", "laminar-system")
    crds.kubectl("create", "serviceaccount", "laminar-operator", "-n", "laminar-system")
    crds.apply(
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "laminar-operator"},
                "rules": yaml.safe_load(RULES.read_text()),
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "laminar-operator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "laminar-operator",
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": "laminar-operator",
                        "namespace": "laminar-system",
                    }
                ],
            },
        ]
    )
    token = crds.kubectl(
        "create", "token", "laminar-operator", "-n", "laminar-system", "--duration=2h"
    ).stdout.strip()
    return crds.kubeconfig_for("operator", token)


@pytest.fixture()
def operator(operator_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KopfRunner]:
    monkeypatch.setenv("KUBECONFIG", str(operator_kubeconfig))
    args = ["run", "--all-namespaces", "--standalone", "-m", "laminar_operator.handlers"]
    with KopfRunner(args, timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.output
    assert "Forbidden" not in runner.output and "403" not in runner.output, runner.output


def test_the_operator_may_not_do_more_than_its_rules(
    crds: KubeApi, operator_kubeconfig: Path
) -> None:
    allowed = crds.kubectl(
        "auth", "can-i", "create", "statefulsets", "-n", "default", kubeconfig=operator_kubeconfig
    )
    assert allowed.stdout.strip() == "yes"
    denied = crds.kubectl(
        "auth", "can-i", "create", "pods", "-n", "default",
        kubeconfig=operator_kubeconfig, check=False,
    )  # fmt: skip
    assert denied.stdout.strip() == "no"


def test_a_cluster_gets_its_objects_and_status(
    crds: KubeApi,
    namespace: str,
    operator: KopfRunner,
) -> None:
    crds.kubectl("apply", "-n", namespace, "-f", str(ROOT / "examples" / "cluster.yaml"))
    cluster = crds.get("laminarcluster/demo", "-n", namespace)
    uid = cluster["metadata"]["uid"]

    def sts() -> Any:
        found = crds.kubectl("get", "statefulset/demo", "-n", namespace, "-o", "json", check=False)
        return yaml.safe_load(found.stdout) if found.returncode == 0 else None

    first = wait_for("the StatefulSet", sts)
    assert first["metadata"]["ownerReferences"][0]["uid"] == uid
    assert first["spec"]["replicas"] == 3
    for kind, name in [
        ("service", "demo"), ("service", "demo-peers"), ("configmap", "demo-config"),
        ("secret", "demo-secret"), ("poddisruptionbudget", "demo"),
        ("serviceaccount", "demo-broker"), ("role", "demo-broker"), ("rolebinding", "demo-broker"),
    ]:  # fmt: skip
        owned = crds.get(f"{kind}/{name}", "-n", namespace)
        assert owned["metadata"]["ownerReferences"][0]["uid"] == uid, (kind, name)
    key = crds.get("secret/demo-secret", "-n", namespace)["data"]["hmac"]
    assert len(base64.b64decode(key)) == 32

    status = wait_for(
        "the status",
        lambda: (
            (s := crds.get("laminarcluster/demo", "-n", namespace).get("status", {})).get(
                "selector"
            )
            and s.get("phase")
            and s
        ),
    )
    assert status["phase"] == "Pending"  # no kubelet here: no pod ever gets ready
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "BrokersNotReady"

    # kubectl scale goes through the scale subresource to the StatefulSet
    crds.kubectl("scale", "laminarcluster/demo", "--replicas=5", "-n", namespace)
    wait_for("5 replicas", lambda: (s := sts()) and s["spec"]["replicas"] == 5)
    # a spec change rolls the pods (a new spec hash); the key and the initial nodes stay
    hash_key = "laminarmq.io/spec-hash"
    before = sts()["spec"]["template"]["metadata"]["annotations"][hash_key]
    crds.kubectl(
        "patch", "laminarcluster/demo", "-n", namespace, "--type=merge",
        "-p", '{"spec": {"image": "laminar-broker:2"}}',
    )  # fmt: skip
    rolled = wait_for(
        "the new image",
        lambda: (
            (s := sts())
            and s["spec"]["template"]["spec"]["containers"][0]["image"] == "laminar-broker:2"
            and s
        ),
    )
    assert rolled["spec"]["template"]["metadata"]["annotations"][hash_key] != before
    assert crds.get("secret/demo-secret", "-n", namespace)["data"]["hmac"] == key
    nodes = crds.get("configmap/demo-config", "-n", namespace)["data"]["LAMINAR_INITIAL_NODES"]
    assert nodes == "demo-0,demo-1,demo-2"
