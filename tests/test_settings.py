"""The one table of broker settings (laminar/settings.py) against what is made from it or must
agree with it: BrokerConfig, the `laminar serve` flags and their variables, the LaminarCluster
CRD (both copies), the operator's defaults and the brokers' environment, and the docs."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar import settings
from laminar.server.config import (
    OTLP_URL,
    BrokerConfig,
    add_arguments,
    from_arguments,
    new_secret,
)
from laminar.settings import SETTINGS, Setting
from laminar.workers import usable_cores
from laminar_operator import manifests

ROOT = Path(__file__).resolve().parents[1]
CRD = "laminarclusters.laminarmq.io.yaml"
CRD_FILES = [ROOT / "crds" / CRD, ROOT / "charts" / "laminar-operator" / "crds" / CRD]
#: Spec fields the operator gives a default the CRD does not have (manifests.DEFAULTS).
OPERATOR_DEFAULTS = [
    ("resources",),
    ("networkPolicy", "clientSelectors"),
    ("networkPolicy", "metricsNamespaceSelector"),
]
#: LAMINAR_* variables of the broker container that are not broker settings: the `laminar`
#: commands run in the pod (its preStop hook) read it.
CLIENT_VARIABLES = {"LAMINAR_TOKEN_FILE"}
CLUSTER: dict[str, Any] = {
    "apiVersion": manifests.API_VERSION,
    "kind": manifests.KIND,
    "metadata": {"name": "demo", "namespace": "prod", "uid": "1234-abcd", "generation": 1},
    "spec": {"replicas": 3},
}


def crd_spec(path: Path = CRD_FILES[0]) -> dict[str, Any]:
    """The LaminarCluster's spec schema."""
    (version,) = yaml.safe_load(path.read_text())["spec"]["versions"]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def schema_at(spec: dict[str, Any], crd_path: str) -> dict[str, Any]:
    """The schema of `crd_path` ("spec.config.fsync") in the spec's schema (KeyError: none)."""
    head, *keys = crd_path.split(".")
    assert head == "spec", crd_path
    schema = spec
    for key in keys:
        schema = schema["properties"][key]
    return schema


def schema_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """What the API server fills in an object of `schema`: its properties' defaults, and in
    an object so defaulted its own properties' defaults, recursively."""
    out: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        if "default" in prop:
            value = prop["default"]
            if isinstance(value, dict):
                value = {**value, **schema_defaults(prop)}
            out[key] = value
    return out


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser()
    add_arguments(out)
    return out


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for setting in SETTINGS:
        if setting.env is not None:
            monkeypatch.delenv(setting.env, raising=False)
    return monkeypatch


def test_the_table_is_every_setting_once() -> None:
    names = [s.name for s in SETTINGS]
    assert len(set(names)) == len(names)
    for constant, value in vars(settings).items():
        if isinstance(value, Setting):
            assert constant == value.name.upper()
    flags = [s.flag for s in SETTINGS if s.flag is not None]
    variables = [s.env for s in SETTINGS if s.env is not None]
    assert len(set(flags)) == len(flags) and len(set(variables)) == len(variables)


def test_broker_config_has_a_field_per_setting_with_its_type_and_default() -> None:
    fields = dataclasses.fields(BrokerConfig)
    assert [f.name for f in fields] == [s.name for s in SETTINGS]
    for f, setting in zip(fields, SETTINGS, strict=True):
        annotation = str(f.type)
        assert re.match(rf"{setting.type.__name__}\b", annotation), (f.name, annotation)
        if setting.required:
            assert f.default is dataclasses.MISSING and setting.default is None, f.name
        else:
            assert f.default == setting.default, f.name
            assert isinstance(setting.default, setting.type) or setting.default is None
            assert (setting.default is None) == annotation.endswith("| None"), f.name


def test_names_carry_their_units() -> None:
    for setting in SETTINGS:
        unit = re.search(r"_(ms|s|bytes|ticks)(_per_\w+)?$", setting.name)
        assert setting.unit == (unit and unit.group(1)), setting.name
        if setting.unit is not None and setting.flag is not None:
            assert f"-{setting.unit}" in setting.flag, setting.flag


def test_a_flag_and_a_variable_per_configurable_setting() -> None:
    for setting in SETTINGS:
        assert (setting.flag is None) == (setting.env is None), setting.name
        if setting.flag is None or setting.env is None:
            continue
        assert setting.flag == "--" + setting.flag.removeprefix("--").lower()
        if setting is settings.TOKEN:  # not the clients' LAMINAR_TOKEN_FILE
            assert setting.env == "LAMINAR_ADMIN_TOKEN_FILE"
        else:
            assert setting.env == settings.ENV_PREFIX + settings.dest(setting).upper()


def test_the_flags_are_the_tables(clean_env: pytest.MonkeyPatch) -> None:
    actions = [a for a in parser()._actions if a.dest != "help"]
    flagged = [s for s in SETTINGS if s.flag is not None]
    assert [a.option_strings for a in actions] == [[s.flag] for s in flagged]
    assert [a.dest for a in actions] == [settings.dest(s) for s in flagged]
    for action, setting in zip(actions, flagged, strict=True):
        assert action.help is not None and action.help.startswith(setting.help.split("(")[0])
        assert str(setting.env) in action.help
        if issubclass(setting.type, Enum):
            assert action.choices == [member.value for member in setting.type]


def test_without_flags_or_variables_a_broker_has_the_tables_defaults(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret())
    required = ["--node-id", "n1", "--data-dir", str(tmp_path), "--secret-file", str(secret)]
    config = from_arguments(parser().parse_args([*required, "--allow-anonymous"]))
    for setting in SETTINGS:
        if not setting.required and setting not in (settings.SECRET, settings.ALLOW_ANONYMOUS):
            default = usable_cores() if setting is settings.WORKERS else setting.default
            assert getattr(config, setting.name) == default, setting.name  # (0 resolved)


def test_every_variable_sets_its_flag(clean_env: pytest.MonkeyPatch) -> None:
    for setting in SETTINGS:
        if setting.env is None:
            continue
        if setting.type is bool:
            value, parsed = "true", True
        elif setting.type is int:
            value, parsed = "4097", 4097
        elif issubclass(setting.type, Enum):
            value = parsed = list(setting.type)[-1].value
        else:
            value = parsed = f"/set/by/{setting.env}"
        clean_env.setenv(setting.env, value)
        assert getattr(parser().parse_args([]), settings.dest(setting)) == parsed, setting.env
        clean_env.setenv(setting.env, "")  # empty: as unset
        unset = getattr(parser().parse_args([]), settings.dest(setting))
        assert unset in (None, setting.default, settings.text(setting.default)), setting.env
        clean_env.delenv(setting.env)


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_crd_paths_exist_with_the_tables_default_and_type(path: Path) -> None:
    spec = crd_spec(path)
    crd_types = {int: "integer", str: "string", bool: "boolean"}
    with_paths = [s for s in SETTINGS if s.crd_path is not None]
    assert with_paths, "no setting comes from the LaminarCluster"
    for setting in with_paths:
        assert setting.crd_path is not None and setting.env is not None
        schema = schema_at(spec, setting.crd_path)
        if issubclass(setting.type, Enum):
            assert schema["type"] == "string"
            assert schema["enum"] == [member.value for member in setting.type]
        else:
            assert schema["type"] == crd_types[setting.type], setting.crd_path
        default = setting.default
        if setting is settings.WORKERS:
            # a pod's count is always given (its ports and CPU request follow it): 1 unless
            # set; the broker's own default (0: one per usable core) is for other machines
            assert default == 0 and schema["default"] == schema["minimum"] == 1
            continue
        if "default" in schema:
            assert schema["default"] == default, setting.crd_path
        if default is not None:  # (None: unset, the feature off, as otelEndpoint)
            assert schema.get("minimum", default) <= default <= schema.get("maximum", default)


def test_every_spec_config_field_is_a_setting_or_a_topic_default() -> None:
    from laminar_operator.topics import CONFIG_KEYS  # (imports the client)

    topic_defaults = {"replicationFactor", *CONFIG_KEYS}  # topics.wanted
    fields = set(crd_spec()["properties"]["config"]["properties"])
    from_settings = {
        s.crd_path.removeprefix("spec.config.")
        for s in SETTINGS
        if s.crd_path and s.crd_path.startswith("spec.config.")  # (not spec.workersPerPod)
    }
    assert fields == from_settings | (fields & topic_defaults)
    assert from_settings & topic_defaults == {"segmentBytes"}  # the only one that is both


def test_the_operators_defaults_are_the_crds() -> None:
    spec = crd_spec()
    defaults = copy.deepcopy(manifests.DEFAULTS)
    for path in OPERATOR_DEFAULTS:
        *parents, last = path
        schema = spec
        for key in path:
            schema = schema["properties"][key]
        assert "default" not in schema, path  # else it is the CRD's
        holder = defaults
        for key in parents:
            holder = holder[key]
        del holder[last]
    assert defaults == schema_defaults(spec)


def test_the_brokers_environment_is_made_of_settings() -> None:
    cluster = copy.deepcopy(CLUSTER)
    cluster["spec"]["xdp"] = {"enabled": True}
    sts = manifests.stateful_set(cluster, 3, xdp_allowed=True)
    pod = sts["spec"]["template"]["spec"]
    names = {e["name"] for c in [*pod["containers"], *pod["initContainers"]] for e in c["env"]}
    names |= set(manifests.broker_settings(cluster, 3))
    known = {s.env for s in SETTINGS} | CLIENT_VARIABLES
    assert {n for n in names if n.startswith(settings.ENV_PREFIX)} <= known


def test_the_spec_reaches_the_brokers(clean_env: pytest.MonkeyPatch) -> None:
    """A value set in the spec for each setting with a CRD path: in the ConfigMap, under the
    setting's variable, and `laminar serve` parses it to that value."""
    cluster = copy.deepcopy(CLUSTER)
    wanted: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.crd_path is None:
            continue
        schema = schema_at(crd_spec(), setting.crd_path)
        bounds = [schema.get("minimum", 1), schema.get("maximum")]
        values = (
            [schema["enum"][-1]]
            if "enum" in schema
            else [schema["example"]]
            if "example" in schema
            else bounds
        )
        value = next(v for v in values if v is not None and v != setting.default)
        holder = cluster
        *parents, last = setting.crd_path.split(".")
        for key in parents:
            holder = holder.setdefault(key, {})
        holder[last] = value
        wanted[setting.name] = value
    config_map = manifests.broker_settings(cluster, 3)
    for key, value in config_map.items():
        clean_env.setenv(key, value)
    args = parser().parse_args([])
    for name, value in wanted.items():
        setting = settings.by_name(name)
        assert config_map[str(setting.env)] == settings.text(value)
        assert getattr(args, settings.dest(setting)) == value
    # unset, a setting without a CRD default is not in the ConfigMap: the broker's applies
    plain = manifests.broker_settings(CLUSTER, 3)
    assert settings.variable(settings.SEGMENT_BYTES) not in plain
    assert plain[settings.variable(settings.FSYNC)] == settings.FSYNC.default.value


@pytest.mark.parametrize(
    "url",
    [
        "http://collector:4318/v1/traces",
        "https://10.0.0.7:4318",
        "https://collector?x=1",
        "collector:4318",
        "http://",
        "http:///v1/traces",
        "http://collector /v1/traces",
        "ftp://collector",
    ],
)
def test_the_crds_tracing_url_is_what_the_brokers_take(url: str) -> None:
    """The CRD refuses an otelEndpoint the brokers would refuse (they would not start)."""
    pattern = schema_at(crd_spec(), settings.OTEL_ENDPOINT.crd_path or "")["pattern"]
    assert bool(re.search(pattern, url)) == bool(OTLP_URL.fullmatch(url)), url


def test_the_ports_are_the_tables() -> None:
    for port in ("API_PORT", "PEER_PORT", "GOSSIP_PORT"):
        assert getattr(manifests, port) == getattr(settings, port).default


def test_the_docs_table_of_the_laminarcluster_agrees() -> None:
    """docs/kubernetes.md's spec table: a setting's row names its variable and flag, and its
    CRD default (or none, and then the brokers' default)."""
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    spec = crd_spec()
    for setting in SETTINGS:
        if setting.crd_path is None:
            continue
        field = setting.crd_path.removeprefix("spec.")
        (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{field}` |")]
        _, default, meaning = (cell.strip() for cell in row.strip("| ").split(" | "))
        assert f"`{setting.env}`" in meaning and f"`{setting.flag}`" in meaning, row
        schema = schema_at(spec, setting.crd_path)
        if "default" in schema:
            assert default == f"`{schema['default']}`", row
        else:
            assert default.startswith("—"), row
            if setting.unit == "bytes":
                assert f"{setting.default // settings.MIB} MiB" in default, row
