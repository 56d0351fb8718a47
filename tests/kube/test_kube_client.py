"""laminar.kube's client (kubernetes_asyncio underneath) against the real API server, with each
kind of credentials it must take: a client-certificate kubeconfig as kind writes one, token
kubeconfigs (inline, token files, several contexts, KUBECONFIG's several files, an exec plugin
as EKS and GKE use), and a pod's ServiceAccount mount, its token rotated under the client."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import stat
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from laminar.kube import Credentials, KubeClient, KubeError

from .conftest import KubeApi

WAIT_S = 30.0


async def whoami(kube: KubeClient) -> str:
    """The user the API server takes the client for (a SelfSubjectReview, which every
    authenticated user may create)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await kube.create(review)
    assert answer is not None
    return str(answer["status"]["userInfo"]["username"])


async def eventually(
    what: str, probe: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S
) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


async def _is(answer: Awaitable[str], wanted: str) -> bool:
    return await answer == wanted


def account(kube: KubeApi, namespace: str, name: str) -> tuple[str, str]:
    """A new ServiceAccount: its user name and a token of it."""
    kube.kubectl("create", "serviceaccount", name, "-n", namespace)
    token = kube.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout
    return f"system:serviceaccount:{namespace}:{name}", token.strip()


def token_kubeconfig(
    kube: KubeApi, path: Path, users: dict[str, dict[str, Any]], current: str | None
) -> Path:
    """A kubeconfig with one context per user (named as the user), on the test cluster."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {
                    "server": kube.url,
                    "certificate-authority": str(kube.workdir / "certs" / "apiserver.crt"),
                },
            }
        ],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [
            {"name": name, "context": {"cluster": "test", "user": name}} for name in users
        ],
    }
    if current is not None:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


async def identity_of(credentials: Credentials) -> str:
    kube = KubeClient(credentials)
    try:
        return await whoami(kube)
    finally:
        await kube.close()


# ---- a client certificate, as kind's kubeconfig has -------------------------------------------


async def test_a_client_certificate_kubeconfig_as_kinds(crds: KubeApi, namespace: str) -> None:
    config = crds.client_cert_kubeconfig("kind-like", "laminar-test")
    document = yaml.safe_load(config.read_text())
    assert set(document["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}
    kube = KubeClient(Credentials.from_path(str(config)))
    try:
        assert await whoami(kube) == "laminar-test"
        settings = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": namespace},
            "data": {"retention": "7d"},
        }
        await kube.apply(settings)
        got = await kube.get("v1", "ConfigMap", namespace, "settings")
        assert got is not None and got["data"] == {"retention": "7d"}
        assert await kube.get("v1", "ConfigMap", namespace, "absent") is None
        topic = {
            "apiVersion": "laminarmq.io/v1alpha1",
            "kind": "Topic",
            "metadata": {"name": "orders", "namespace": namespace},
            "spec": {"cluster": "demo", "partitions": 2},
        }
        await kube.apply(topic)
        await kube.patch_status("laminarmq.io/v1alpha1", "Topic", namespace, "orders", {
            "underReplicated": 1, "summarized": False, "partitions": [],
        })  # fmt: skip
        listed = await kube.list("laminarmq.io/v1alpha1", "Topic", namespace)
        assert [t["metadata"]["name"] for t in listed] == ["orders"]
        assert listed[0]["status"]["underReplicated"] == 1
    finally:
        await kube.close()
    shown = crds.get("topic.laminarmq.io/orders", "-n", namespace, "--show-managed-fields")
    managers = {entry["manager"] for entry in shown["metadata"]["managedFields"]}
    assert managers == {"laminar-operator"}, shown["metadata"]["managedFields"]


async def test_every_kind_the_operator_uses(crds: KubeApi, namespace: str) -> None:
    """Cluster-scoped reads (StorageClass), merge patches (a PersistentVolumeClaim's),
    deletes with a uid precondition and with orphaned dependents, and Events of both APIs."""
    kube = KubeClient(Credentials.from_path(str(crds.client_cert_kubeconfig("admin", "admin"))))
    try:
        storage_class = f"laminar-{namespace}"
        await kube.apply({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": storage_class}, "provisioner": "example.com/none",
            "allowVolumeExpansion": True,
        })  # fmt: skip
        found = await kube.get("storage.k8s.io/v1", "StorageClass", "", storage_class)
        assert found is not None and found["allowVolumeExpansion"] is True
        assert await kube.delete("storage.k8s.io/v1", "StorageClass", "", storage_class)

        await kube.create({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-demo-0", "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}},
        })  # fmt: skip
        patched = await kube.patch("v1", "PersistentVolumeClaim", namespace, "data-demo-0", {
            "metadata": {"labels": {"laminarmq.io/kept": "true"}},
        })  # fmt: skip
        assert patched["metadata"]["labels"] == {"laminarmq.io/kept": "true"}
        assert crds.get("pvc/data-demo-0", "-n", namespace)["metadata"]["labels"] == {
            "laminarmq.io/kept": "true"
        }

        made = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "owner", "namespace": namespace}}  # fmt: skip
        owner = await kube.create(made)
        assert owner is not None
        assert await kube.create(made) is None  # there already: left as it is
        await kube.create({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "dependent", "namespace": namespace, "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner["metadata"]["uid"],
            }]},
        })  # fmt: skip
        with pytest.raises(KubeError) as stale:
            await kube.delete("v1", "ConfigMap", namespace, "owner", uid="not-its-uid")
        assert stale.value.status == 409
        deleted = await kube.delete(
            "v1", "ConfigMap", namespace, "owner", uid=owner["metadata"]["uid"],
            propagation="Orphan",
        )  # fmt: skip
        assert deleted

        async def orphaned() -> bool:  # the garbage collector lets the dependent go, unharmed
            found = await kube.get("v1", "ConfigMap", namespace, "dependent")
            assert found is not None, "the dependent was deleted: not orphaned"
            gone = await kube.get("v1", "ConfigMap", namespace, "owner") is None
            return gone and not found["metadata"].get("ownerReferences")

        await eventually("the dependent orphaned", orphaned)
        assert not await kube.delete("v1", "ConfigMap", namespace, "owner")  # none left

        now = datetime.datetime.now(datetime.UTC)
        regarding = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "name": "data-demo-0", "namespace": namespace}  # fmt: skip
        await kube.create({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "kept.1", "namespace": namespace},
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": "laminarmq.io/operator", "reportingInstance": "test",
            "action": "Keep", "reason": "VolumeKept", "type": "Normal", "note": "kept",
            "regarding": regarding,
        })  # fmt: skip
        await kube.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "kept.2", "namespace": namespace},
            "involvedObject": regarding, "reason": "VolumeKept", "message": "kept too",
            "type": "Normal", "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        })  # fmt: skip
        events = await kube.list("v1", "Event", namespace)
        kept = sorted(e["metadata"]["name"] for e in events if e["reason"] == "VolumeKept")
        assert kept == ["kept.1", "kept.2"]
    finally:
        await kube.close()


# ---- bearer tokens: inline, token files, contexts, several files, exec plugins ----------------


async def test_a_token_file_is_read_again_when_rotated(
    crds: KubeApi, namespace: str, tmp_path: Path
) -> None:
    first, first_token = account(crds, namespace, "first")
    second, second_token = account(crds, namespace, "second")
    token_file = tmp_path / "token"
    token_file.write_text(first_token + "\n")  # as `echo "$token" >file` writes it
    config = token_kubeconfig(
        crds, tmp_path / "config", {"filed": {"tokenFile": str(token_file)}}, "filed"
    )
    credentials = Credentials.from_path(str(config))
    credentials.refresh_s = 0.5
    kube = KubeClient(credentials)
    try:
        assert await whoami(kube) == first
        # the first token still valid: only the refresh has the second read
        token_file.write_text(second_token + "\n")
        await eventually("the new token used", lambda: _is(whoami(kube), second))
    finally:
        await kube.close()


async def test_the_current_context_or_the_one_named(
    crds: KubeApi, namespace: str, tmp_path: Path
) -> None:
    first, first_token = account(crds, namespace, "first")
    second, second_token = account(crds, namespace, "second")
    users = {"first": {"token": first_token}, "second": {"token": second_token}}
    config = token_kubeconfig(crds, tmp_path / "config", users, "second")
    assert await identity_of(Credentials.from_path(str(config))) == second
    assert await identity_of(Credentials.from_path(str(config), context="first")) == first
    with pytest.raises(KubeError, match="third"):
        Credentials.from_path(str(config), context="third")
    unset = token_kubeconfig(crds, tmp_path / "unset", users, None)
    with pytest.raises(KubeError, match="sets no current-context"):
        Credentials.from_path(str(unset))


async def test_kubeconfig_files_merged_as_kubectl_merges_them(
    crds: KubeApi, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBECONFIG's files: missing ones skipped; the first to name a user or set
    current-context wins (kubectl's rule; kubernetes_asyncio's merger alone lets the last
    file's current-context win)."""
    first, first_token = account(crds, namespace, "first")
    second, second_token = account(crds, namespace, "second")
    base = token_kubeconfig(crds, tmp_path / "base", {"first": {"token": first_token}}, "second")
    extra = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [
            {"name": "second", "user": {"token": second_token}},
            {"name": "first", "user": {"token": "shadowed-by-the-first-file"}},
        ],
        "contexts": [{"name": "second", "context": {"cluster": "test", "user": "second"}}],
        "current-context": "first",
    }
    (tmp_path / "extra").write_text(yaml.safe_dump(extra))
    variable = f"{base}:{tmp_path / 'missing'}:{tmp_path / 'extra'}"
    kubectl = subprocess.run(
        [str(crds.bin_dir / "kubectl"), "auth", "whoami", "-o", "json"],
        env={**os.environ, "KUBECONFIG": variable}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert kubectl.returncode == 0, kubectl.stderr
    assert json.loads(kubectl.stdout)["status"]["userInfo"]["username"] == second
    monkeypatch.setenv("KUBECONFIG", variable)
    assert await identity_of(Credentials.from_environment()) == second
    assert await identity_of(Credentials.from_environment(context="first")) == first

    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}")
    with pytest.raises(KubeError, match="none of the kubeconfig files KUBECONFIG names exists"):
        Credentials.from_environment()


async def test_the_sources_in_order(
    crds: KubeApi, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--kube-config, else KUBECONFIG, else ~/.kube/config."""
    names = ("explicit", "variable", "home")
    users = {name: account(crds, namespace, name) for name in names}
    configs = {
        name: token_kubeconfig(crds, tmp_path / f"{name}.yaml", {name: {"token": token}}, name)
        for name, (_, token) in users.items()
    }
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(configs["home"].read_text())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(configs["variable"]))
    assert (
        await identity_of(Credentials.from_path(str(configs["explicit"]))) == users["explicit"][0]
    )
    assert await identity_of(Credentials.from_path(None)) == users["variable"][0]
    monkeypatch.delenv("KUBECONFIG")
    assert await identity_of(Credentials.from_path(None)) == users["home"][0]
    with pytest.raises(KubeError, match="no kubeconfig at"):
        Credentials.from_path(str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize(("valid_minutes", "runs_wanted"), [(10, 1), (1, 2)])
async def test_an_exec_plugin_kubeconfig(
    crds: KubeApi, namespace: str, tmp_path: Path, valid_minutes: int, runs_wanted: int
) -> None:
    """As EKS's (`aws eks get-token`) and GKE's (gke-gcloud-auth-plugin): a command prints an
    ExecCredential; it runs again at a refresh once its token expires in under five minutes,
    not before."""
    user, token = account(crds, namespace, "plugged")
    runs = tmp_path / "runs"
    plugin = tmp_path / "get-token"
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=valid_minutes)
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {
            "token": token,
            "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    }
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(runs)!r}, 'a').write('run\\n')\n"
        f"sys.stdout.write({json.dumps(credential)!r})\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    config = token_kubeconfig(crds, tmp_path / "config", {"plugged": exec_user}, "plugged")
    credentials = Credentials.from_path(str(config))
    credentials.refresh_s = 0.0  # the credentials read at every request
    kube = KubeClient(credentials)
    try:
        assert await whoami(kube) == user
        assert await whoami(kube) == user
        assert runs.read_text() == "run\n" * runs_wanted
    finally:
        await kube.close()


async def test_no_credentials_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("running in a pod: its ServiceAccount is found")
    with pytest.raises(KubeError, match="no Kubernetes credentials") as missing:
        Credentials.from_environment()
    assert missing.value.status == 0


# ---- in a pod: the ServiceAccount mount --------------------------------------------------------


def mount(kube: KubeApi, directory: Path, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the kubelet gives a pod: the token and CA files, and the API server's address in
    KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT."""
    directory.mkdir(exist_ok=True)
    (directory / "ca.crt").write_bytes((kube.workdir / "certs" / "apiserver.crt").read_bytes())
    (directory / "token").write_text(token)  # the kubelet writes no newline
    address = urllib.parse.urlsplit(kube.url)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", str(address.hostname))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(address.port))


async def test_the_service_account_token_is_read_again_when_rotated(
    crds: KubeApi, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, first_token = account(crds, namespace, "first")
    second, second_token = account(crds, namespace, "second")
    third, third_token = account(crds, namespace, "third")
    directory = tmp_path / "serviceaccount"
    mount(crds, directory, first_token, monkeypatch)
    # the kubelet rotates the token, the old one still valid: the new one is read at the next
    # refresh (a minute by default; half a second here)
    credentials = Credentials.in_cluster(directory)
    credentials.refresh_s = 0.5
    kube = KubeClient(credentials)
    try:
        assert await whoami(kube) == first
        (directory / "token").write_text(second_token)
        await eventually("the rotated token used", lambda: _is(whoami(kube), second))
    finally:
        await kube.close()

    # the token in use stops working (its ServiceAccount deleted): the 401 has the file read
    # again at once, long before the next refresh
    credentials = Credentials.in_cluster(directory)
    credentials.refresh_s = 3600.0
    kube = KubeClient(credentials)
    try:
        assert await whoami(kube) == second
        (directory / "token").write_text(third_token)
        crds.kubectl("delete", "serviceaccount", "second", "-n", namespace)
        old = crds.kubeconfig_for("deleted-account", second_token)

        def refused() -> bool:
            answer = crds.kubectl("auth", "whoami", kubeconfig=old, check=False)
            return answer.returncode != 0 and "Unauthorized" in answer.stderr

        await eventually("the old token refused", lambda: asyncio.to_thread(refused))
        assert await whoami(kube) == third
    finally:
        await kube.close()
