"""The JVM reader resolves the token and CA file as the Python source does
(`Options.with_credentials()`, laminar.client.config): the options token, tokenFile and
context, $LAMINAR_TOKEN, $LAMINAR_TOKEN_FILE, $LAMINAR_CONTEXT and the configuration file
($LAMINAR_CONFIG, $XDG_CONFIG_HOME, ~/.config), with the same precedence and messages.

Each scenario is an environment: the Java driver runs in it (its own process environment), and
Python's `with_credentials()` runs with the same variables (monkeypatch), over the same option
sets. The one difference allowed: why a file is not YAML is said in SnakeYAML's words, not
PyYAML's (the message up to the reason is the same).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import JavaBuild
from .test_jvm_options import BROKERS, comparable, python_outcome

NOT_YAML = " is not YAML: "
#: every variable the resolution reads (cleared, then set per scenario)
VARIABLES = (
    "LAMINAR_TOKEN", "LAMINAR_TOKEN_FILE", "LAMINAR_CONTEXT", "LAMINAR_CONFIG",
    "LAMINAR_BROKERS", "LAMINAR_CA_FILE", "XDG_CONFIG_HOME", "HOME",
)  # fmt: skip

CONFIG = """\
current-context: current
contexts:
  - name: current
    token: lmq_current
  - name: spark
    token-file: tokens/spark
    ca-file: ./certs//ca.pem
    brokers: [http://x:1]
  - name: inline
    token: lmq_inline
    brokers: http://y:1, http://z:2
  - name: bare
  - name: missing-file
    token-file: nowhere
  - name: home
    token-file: ~/home-token
    ca-file: /etc/ca.pem
  - name: empty-token
    token: ""
"""

BROKEN_CONFIGS = {
    "not-yaml": "contexts: [a, b\n",
    "a-list": "- a\n- b\n",
    "unknown-key": "contexts: []\nusers: []\n",
    "not-a-mapping": "contexts: [5]\n",
    "no-name": "contexts: [{token: x}]\n",
    "unknown-fields": "contexts: [{name: a, tokn: x, 1: 2, true: 3}]\n",
    "both": "contexts: [{name: a, token: x, token-file: y}]\n",
    "brokers-number": "contexts: [{name: a, brokers: 5}]\n",
    "brokers-numbers": "contexts: [{name: a, brokers: [1, 2]}]\n",
    "token-number": "contexts: [{name: a, token: 5}]\n",
    "ca-bool": "contexts: [{name: a, ca-file: yes}]\n",
    "current-number": "current-context: 5\ncontexts: []\n",
    "contexts-string": "contexts: ab\n",
    "contexts-number": "contexts: 5\n",
    "empty": "",
    "comment": "# nothing\n",
    "no-current": "contexts: [{name: a, token: lmq_a}]\n",
    "dangling-current": "current-context: gone\ncontexts: [{name: a, token: lmq_a}]\n",
    "empty-current": "current-context: ''\ncontexts: [{name: a, token: lmq_a}]\n",
    "duplicate": "contexts: [{name: a, token: lmq_1}, {name: a, token: lmq_2}]\n"
    "current-context: a\n",
}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """The configuration file, token files good and bad, a home directory."""
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "spark").write_text("lmq_spark\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "home-token").write_text("  lmq_home\t\n")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    out = {
        "config": config,
        "home": tmp_path / "home",
        "good": tmp_path / "good",
        "empty": tmp_path / "empty",
        "words": tmp_path / "words",
        "nbsp": tmp_path / "nbsp",
        "latin1": tmp_path / "latin1",
        "missing": tmp_path / "missing",
        "directory": tmp_path / "tokens",
        "not-a-directory": tmp_path / "good" / "x",
    }
    out["good"].write_text("\r\n lmq_good \x0b\n")
    out["empty"].write_text(" \n")
    out["words"].write_text("lmq_a lmq_b\n")
    out["nbsp"].write_bytes("lmq_a\u00a0b".encode())
    out["latin1"].write_bytes(b"lmq_\xe9")
    for name, text in BROKEN_CONFIGS.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    (tmp_path / "bad-utf8.yaml").write_bytes(b"contexts: []\n# \xe2\x82x\n")
    xdg = tmp_path / "xdg" / "laminar"
    xdg.mkdir(parents=True)
    (xdg / "config.yaml").write_text("current-context: x\ncontexts: [{name: x, token: lmq_xdg}]\n")
    dot_config = tmp_path / "home" / ".config" / "laminar"
    dot_config.mkdir(parents=True)
    (dot_config / "config.yaml").write_text(
        "current-context: h\ncontexts: [{name: h, token-file: ../../home-token}]\n"
    )
    return out


def option_sets(files: dict[str, Path]) -> list[dict[str, str]]:
    """What every scenario resolves: each source of a token, and each way it fails."""
    sets: list[dict[str, str]] = [
        {},
        {"token": "lmq_given", "tokenFile": str(files["missing"]), "context": "spark"},
        {"context": "spark"},
        {"context": "spark", "caFile": "/given/ca.pem"},
        {"context": "inline"},
        {"context": "bare"},
        {"context": "home"},
        {"context": "missing-file"},
        {"context": "empty-token"},
        {"context": "nope"},
        {"token": "lmq_given", "context": "nope"},
        {"tokenFile": str(files["good"]), "context": "inline"},
        {"caFile": "/given/ca.pem"},
        {"token": "", "tokenFile": "", "context": ""},
    ]
    bad = ("good", "empty", "words", "nbsp", "latin1", "missing", "directory", "not-a-directory")
    sets += [{"tokenFile": str(files[name])} for name in bad]
    return [{**BROKERS, "topic": "t", **given} for given in sets]


def scenarios(files: dict[str, Path]) -> dict[str, dict[str, str]]:
    base = files["config"].parent
    home = {"HOME": str(files["home"])}
    config = {**home, "LAMINAR_CONFIG": str(files["config"])}
    out = {
        "config only": config,
        "token variable": {**config, "LAMINAR_TOKEN": " lmq_env \n", "LAMINAR_CA_FILE": "/env/ca"},
        "blank token variable": {**config, "LAMINAR_TOKEN": " \u2003",
                                 "LAMINAR_TOKEN_FILE": str(files["good"])},
        "token file variable": {**config, "LAMINAR_TOKEN_FILE": str(files["missing"])},
        "context variable": {**config, "LAMINAR_CONTEXT": "inline"},
        "missing context variable": {**config, "LAMINAR_CONTEXT": "nope"},
        "missing context, brokers and CA set": {
            **config, "LAMINAR_CONTEXT": "nope", "LAMINAR_BROKERS": "http://b:1",
            "LAMINAR_CA_FILE": "/env/ca"},
        "missing context, brokers set": {
            **config, "LAMINAR_CONTEXT": "nope", "LAMINAR_BROKERS": "http://b:1"},
        "xdg": {**home, "XDG_CONFIG_HOME": str(base / "xdg")},
        "home": home,
        "relative config": {**home, "LAMINAR_CONFIG": "./x/..//config.yaml"},
        "home config": {"HOME": str(base), "LAMINAR_CONFIG": "~/config.yaml"},
        "config is a directory": {**home, "LAMINAR_CONFIG": str(base / "tokens")},
        "no config": {**home, "LAMINAR_CONFIG": str(base / "absent.yaml")},
        "bad utf-8": {**home, "LAMINAR_CONFIG": str(base / "bad-utf8.yaml")},
    }  # fmt: skip
    (base / "x").mkdir()
    for name in BROKEN_CONFIGS:
        out[f"config {name}"] = {**home, "LAMINAR_CONFIG": str(base / f"{name}.yaml")}
    return out


def cut_yaml_reason(outcome: dict[str, Any]) -> dict[str, Any]:
    out = comparable(outcome)
    error = out.get("error")
    if error is not None and NOT_YAML in error:
        out["error"] = error[: error.index(NOT_YAML) + len(NOT_YAML)]
    return out


def test_every_scenario_resolves_as_python_does(
    java_build: JavaBuild, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sets = option_sets(files)
    cwd = files["config"].parent
    monkeypatch.chdir(cwd)  # (relative paths: the Java driver runs there too)
    differ = []
    tokens: set[str | None] = set()
    errors: set[str] = set()
    for scenario, env in scenarios(files).items():
        for name in VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        answers = java_build.run(
            "OptionsCheck",
            [{"options": s, "credentials": True} for s in sets],
            env={"PATH": os.environ["PATH"], **env},
            cwd=cwd,
        )
        for given, got in zip(sets, answers, strict=True):
            want = python_outcome(given, credentials=True)
            if cut_yaml_reason(got) != cut_yaml_reason(want):
                differ.append((scenario, given, want, got))
            tokens.add(want.get("result", {}).get("token"))
            errors.add(want.get("error", ""))
    assert not differ, f"{len(differ)} differ ({sorted({d[0] for d in differ})}): {differ[:3]}"
    # every source of a token was taken somewhere, and many different failures were met
    assert {"lmq_given", "lmq_spark", "lmq_inline", "lmq_home", "lmq_env", "lmq_good",
            "lmq_current", "lmq_xdg", "lmq_2", None} <= tokens  # fmt: skip
    assert len(errors) >= 30
