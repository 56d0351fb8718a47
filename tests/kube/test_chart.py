"""The Helm chart: lint and template clean (helm of the pinned release, built from the Go module
proxy), its objects accepted by the real API server, its CRDs the same as crds/, and every
metric its dashboard queries exported by a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from ..integration.conftest import make_cluster
from .conftest import ROOT, KubeApi

CHART = ROOT / "charts" / "laminar-operator"


def helm(kube: KubeApi, *args: str) -> str:
    result = subprocess.run(
        [str(kube.bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def rendered(kube: KubeApi, *sets: str) -> list[dict[str, Any]]:
    out = helm(kube, "template", "laminar", str(CHART), "--namespace", "laminar-system", *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_lint_is_clean(kube: KubeApi) -> None:
    out = helm(kube, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out, out


def test_template_defaults(kube: KubeApi) -> None:
    docs = rendered(kube)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Pod",
        "Service",
        "ServiceAccount",
    ]  # the Pod is `helm test`'s
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == yaml.safe_load((CHART / "files" / "operator-rules.yaml").read_text())
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][-2:] == ["-m", "laminar_operator.handlers"]
    assert "--all-namespaces" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_template_options(kube: KubeApi) -> None:
    docs = rendered(
        kube,
        "--set", "serviceMonitor.enabled=true",
        "--set", "grafanaDashboard.enabled=true",
        "--set", "extraArgs={--namespace,team-a}",
    )  # fmt: skip
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap")
    assert json.loads(dashboard["data"]["laminar.json"])["uid"] == "laminar-brokers"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--all-namespaces" not in args and args[-2:] == ["--namespace", "team-a"]


def test_the_api_server_accepts_the_chart(crds: KubeApi) -> None:
    docs = [d for d in rendered(crds) if d["kind"] != "ServiceMonitor"]
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "laminar-system"}})
    # the `helm test` pod runs as the namespace's default ServiceAccount, which the controller
    # manager here (garbage collector only) does not make
    crds.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": "laminar-system"},
        }
    )
    crds.apply(docs, "--dry-run=server")


def test_chart_crds_are_the_crds() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert (CHART / "crds" / path.name).read_text() == path.read_text(), path.name
    assert {p.name for p in (CHART / "crds").glob("*.yaml")} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }


def test_the_dashboard_queries_metrics_brokers_export(tmp_path: Path) -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\blaminar_[a-z_]+", e)}
    cluster = make_cluster(tmp_path, 1)
    try:

        async def scrape() -> str:
            async with (
                aiohttp.ClientSession() as session,
                session.get(cluster.urls[0] + "/metrics") as answer,
            ):
                return await answer.text()

        text = asyncio.run(scrape())
    finally:
        cluster.stop()
    exported = set(re.findall(r"^# TYPE (\w+)", text, re.M))
    samples = set(re.findall(r"^(laminar_\w+?)(?:\{| )", text, re.M))
    known = samples | exported
    base = {m: re.sub(r"_(total|bucket)$", "", m) for m in queried}
    missing = {m for m in queried if m not in known and base[m] not in known}
    assert not missing, f"the dashboard queries metrics no broker exports: {sorted(missing)}"
