"""The chart's alert rules and Grafana dashboard (charts/laminar-operator/files/).

The rules file is what the chart's PrometheusRule carries (rendered by helm); promtool checks
it and runs tests/operator/alerts_test.yaml on it: every alert fires on the series it is about,
after its `for:`, with its labels and annotations, and stays silent on healthy ones; broken
rules (a wrong metric name, threshold, window or label) fail those cases. Every metric the
rules and the dashboard query is one the brokers export (docs/metrics.md, which
tests/integration/test_metrics.py holds to a real broker's exposition).

promtool is Debian's prometheus package (.ci/run installs it); helm is the pinned release
e2e/kube/build-binaries.sh builds (as for tests/kube).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar_operator import manifests

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "laminar-operator"
RULES = CHART / "files" / "broker-alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
METRICS_DOC = ROOT / "docs" / "metrics.md"
ALERTS_DOC = ROOT / "docs" / "alerts.md"
BUILD = ROOT / "e2e" / "kube" / "build-binaries.sh"
BUILD_TIMEOUT_S = 3600.0
PROMTOOL_TIMEOUT_S = 120.0

ALERTS = {
    "LaminarBrokerDown",
    "LaminarMembersDead",
    "LaminarUnderReplicatedPartitions",
    "LaminarOfflinePartitions",
    "LaminarDeadLettersGrowing",
    "LaminarDiskAlmostFull",
    "LaminarDiskFillingUp",
    "LaminarRaftElectionsChurning",
}
#: A metric name in PromQL (label names and values are inside {} or by (...): not matched here
#: unless they look like one, which none of ours does).
METRIC_NAME = re.compile(r"\b(?:laminar|process|python)_[a-z_]+\b")
LABEL_PLACEHOLDER = re.compile(r"\{\{ \$labels\.([a-z_]+) \}\}")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def alert_rules(groups: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    return {
        rule["alert"]: rule
        for group in (rule_groups() if groups is None else groups)
        for rule in group["rules"]
    }


def exported_metrics() -> set[str]:
    """The families docs/metrics.md lists (the first column of its tables), and Prometheus'
    own `up`."""
    names = set(re.findall(r"^\| `([a-z_]+)` \|", METRICS_DOC.read_text(), re.M))
    assert len(names) > 50, "docs/metrics.md lists no metrics: its tables changed shape?"
    return names | {"up"}


def unknown_metrics(exprs: list[str]) -> set[str]:
    exported = exported_metrics()
    unknown = set()
    for name in {m for expr in exprs for m in METRIC_NAME.findall(expr)}:
        base = next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
        if name not in exported and base not in exported:
            unknown.add(name)
    return unknown


# ---- the rules ---------------------------------------------------------------------------------


def test_every_alert_has_a_severity_a_runbook_and_a_page_in_the_docs() -> None:
    rules = alert_rules()
    assert set(rules) == ALERTS
    docs = ALERTS_DOC.read_text()
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert re.fullmatch(r"[0-9]+[mh]", rule["for"]), name  # never on a single evaluation
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, name
        runbook = annotations["runbook"]
        # concrete steps, numbered, and where the whole story is
        assert runbook.startswith("1. ") and "\n2. " in runbook, name
        assert runbook.endswith(f"Details: docs/alerts.md#{name.lower()}"), name
        assert f"\n## {name}\n" in docs, f"docs/alerts.md has no section {name}"
        # runbooks fill in labels only (the test below relies on it)
        assert "{{" not in LABEL_PLACEHOLDER.sub("", runbook), name


def test_the_rules_query_metrics_the_brokers_export() -> None:
    exprs = [rule["expr"] for rule in alert_rules().values()]
    assert not unknown_metrics(exprs), "the rules query metrics docs/metrics.md does not list"
    # every alert is about the brokers' series: by the ServiceMonitor's job, or by their names
    for name, rule in alert_rules().items():
        assert 'job="laminar"' in rule["expr"] or "laminar_" in rule["expr"], name


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not() -> None:
    cases = [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    for name in ALERTS:
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name} never fires in the cases"
        assert any(not case["exp_alerts"] for case in mine), f"{name} is never silent"


def with_runbooks(unit_tests: dict[str, Any], groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The unit tests with each expected alert's `runbook` annotation: its rule's runbook with
    the alert's labels filled in (alerts_test.yaml leaves it out, not to write it twice)."""
    runbooks = {name: rule["annotations"]["runbook"] for name, rule in alert_rules(groups).items()}
    filled = copy.deepcopy(unit_tests)
    for test in filled["tests"]:
        for case in test["alert_rule_test"]:
            for alert in case["exp_alerts"]:
                labels = alert["exp_labels"]

                def label(match: re.Match[str], labels: dict[str, str] = labels) -> str:
                    assert match[1] in labels, f"a runbook names {match[1]}, not an alert label"
                    return labels[match[1]]

                runbook = runbooks.get(case["alertname"], "")
                alert["exp_annotations"]["runbook"] = LABEL_PLACEHOLDER.sub(label, runbook)
    return filled


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S
    )


def unit_test(tmp_path: Path, groups: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """`promtool test rules` of alerts_test.yaml against `groups`."""
    (tmp_path / "broker-alerts.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = with_runbooks(yaml.safe_load(UNIT_TESTS.read_text()), groups)
    path = tmp_path / "alerts_test.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    return run_promtool("test", "rules", str(path))


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "broker-alerts.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}))
    checked = run_promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout, checked.stdout


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    result = unit_test(tmp_path, rule_groups())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('up{job="laminar"} == 0', "up == 0"),  # every job's targets
        ('laminar_swim_members{state="dead"}', 'laminar_swim_members{state="suspect"}'),
        ("for: 10m", "for: 15m"),  # under-replicated: waits too long
        ("(laminar_offline_partitions)", "(laminar_offline_partition)"),  # a misspelt metric
        (
            "max by (namespace, service, topic) (laminar_offline",
            "sum by (namespace, service, topic) (laminar_offline",
        ),  # counted once per exporting broker
        ("increase(laminar_group_dead_lettered_total[10m])", "laminar_group_dead_lettered_total"),
        ("  ) < 0.10", "  ) < 0.05"),
        ("  ) < 0.40", "  ) < 0.30"),
        ("[6h], 24 * 3600", "[6h], 2 * 3600"),
        ("[10m])) > 10", "[10m])) > 30"),
        ("[10m])) > 10", "[10m])) > 2"),  # the calm cluster would alert
        ("< 900", "< 60"),  # the restarted cluster would alert
        ('process_start_time_seconds{job="laminar"}', "process_start_time_seconds"),
    ],
)
def test_the_unit_tests_catch_a_broken_rule(tmp_path: Path, old: str, new: str) -> None:
    text = RULES.read_text()
    assert text.count(old) == 1, old
    broken = yaml.safe_load(text.replace(old, new))["groups"]
    result = unit_test(tmp_path, broken)
    # valid rules all the same: what fails is the cases
    checked = run_promtool("check", "rules", str(tmp_path / "broker-alerts.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert result.returncode != 0, f"the cases pass with {new!r} for {old!r}"
    assert "FAILED" in result.stdout + result.stderr


# ---- the chart ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Path:
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: the pinned helm is built from the module proxy")
    built = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    assert built.returncode == 0, f"building helm failed:\n{built.stderr[-5000:]}"
    return Path(built.stdout.strip().splitlines()[-1]) / "helm"


def rendered(helm: Path, *sets: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(helm), "template", "laminar", str(CHART), "--namespace", "monitoring", *sets],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_the_prometheus_rule_carries_the_rules_file(helm: Path) -> None:
    assert "PrometheusRule" not in {d["kind"] for d in rendered(helm)}  # off by default
    docs = rendered(
        helm, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=kps"
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == {"groups": rule_groups()}  # the file the promtool tests use


def test_a_prometheus_rule_value_of_the_wrong_type_is_refused(helm: Path) -> None:
    out = subprocess.run(
        [str(helm), "template", "x", str(CHART), "--set", "prometheusRule.enabled=yes"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "prometheusRule" in out.stderr, out.stderr


def test_the_service_monitor_labels_the_series_as_the_rules_expect(helm: Path) -> None:
    """job="laminar" for every broker (the rules' `up{job="laminar"}`), and `service` the
    cluster's name: the client Service the ServiceMonitor selects is named after the cluster
    and labelled app.kubernetes.io/name=laminar, the ServiceMonitor's jobLabel."""
    (monitor,) = [
        d for d in rendered(helm, "--set", "serviceMonitor.enabled=true")
        if d["kind"] == "ServiceMonitor"
    ]  # fmt: skip
    cluster = {
        "apiVersion": "laminarmq.io/v1alpha1",
        "kind": "LaminarCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": "1234-abcd"},
        "spec": {},
    }
    service = manifests.client_service(cluster)
    labels = service["metadata"]["labels"]
    assert service["metadata"]["name"] == "demo"
    assert labels[monitor["spec"]["jobLabel"]] == "laminar"
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= labels.items()


# ---- the dashboard -----------------------------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_has_namespace_cluster_and_pod_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for name in ("namespace", "cluster", "pod"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
    # chained: a cluster of the namespaces chosen, a pod of the clusters chosen
    assert variables["namespace"]["query"]["query"].startswith("label_values(")
    cluster_query = variables["cluster"]["query"]["query"]
    assert '$namespace"' in cluster_query and cluster_query.endswith(", service)")
    pod_query = variables["pod"]["query"]["query"]
    assert '$namespace"' in pod_query and '$cluster"' in pod_query
    assert pod_query.endswith(", pod)")
    assert variables["pod"]["includeAll"] and variables["cluster"]["includeAll"]


def test_every_dashboard_query_is_filtered_by_the_variables() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    filters = ('namespace=~"$namespace"', 'service=~"$cluster"', 'pod=~"$pod"')
    for expr in dashboard_exprs(dashboard):
        selectors = re.findall(r"\b(up|(?:laminar|process)_[a-z_]+)\b(\{[^}]*\})?", expr)
        assert selectors, expr
        for name, matchers in selectors:
            assert all(f in matchers for f in filters), f"{name} in {expr!r} is not filtered"


def test_the_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """promtool parses each panel's query (as a recording rule), with the variables set as
    Grafana sets them for "All"."""
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    substituted = [
        re.sub(r"\$(namespace|cluster|pod)\b", ".*", e.replace("$__rate_interval", "1m"))
        for e in exprs
    ]
    assert all("$" not in e for e in substituted), "a variable the test does not set"
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(substituted)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_has_the_panels_and_queries_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert not unknown_metrics(exprs), "the dashboard queries metrics docs/metrics.md lacks"
    queried = {m for expr in exprs for m in METRIC_NAME.findall(expr)}
    for metric in (
        "laminar_partition_under_replicated",
        "laminar_partition_in_sync_replicas",
        "laminar_offline_partitions",
        "laminar_topic_bytes_in_total",
        "laminar_topic_bytes_out_total",
        "laminar_topic_records_in_total",
        "laminar_topic_records_out_total",
        "laminar_read_requests_total",
        "laminar_http_requests_total",
        "laminar_group_lag",
        "laminar_group_dead_lettered_total",
        "laminar_data_dir_free_bytes",
        "laminar_raft_elections_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert metric in queried, f"no panel shows {metric}"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
