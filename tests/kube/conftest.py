"""A real Kubernetes control plane for the operator's tests (no mock API).

etcd (Debian's etcd-server) and the pinned Kubernetes release's kube-apiserver and
kube-controller-manager (built from the Go module proxy by e2e/kube/build-binaries.sh, cached
across runs) run on loopback ports of their own, with RBAC on; the controller manager runs the
garbage collector only (there are no nodes: pods are never scheduled). `kube.kubectl(...)`
runs the kubectl built with them against it as an admin (system:masters). The API server
takes bearer tokens (`--token-auth-file`, ServiceAccount tokens) and client certificates of
`KubeApi.client_ca` (`--client-ca-file`): `client_cert_kubeconfig` writes a kubeconfig as kind's.

`operator_identity(...)` installs what the Helm chart grants the operator (its ServiceAccount,
ClusterRole or Roles and their bindings, rendered by `helm template`), and `run_operator(...)`
runs the operator (kopf, in a thread) as that ServiceAccount with the chart Deployment's own
arguments and environment, and checks that the API server denied it nothing.

Skipped, with the reason, where etcd or Go is missing (.ci/run installs both).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import itertools
import json
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from laminar import certs

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "laminar-operator"
BUILD = ROOT / "e2e" / "kube" / "build-binaries.sh"
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
ADMIN_TOKEN = "laminar-test-admin-token"
START_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 3600.0
_NAMESPACES = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KubeApi:
    url: str
    kubeconfig: Path
    bin_dir: Path
    workdir: Path
    client_ca: certs.KeyPair  # the API server trusts client certificates this CA signed

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [
                str(self.bin_dir / "kubectl"),
                "--kubeconfig",
                str(kubeconfig or self.kubeconfig),
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, objects: list[dict[str, Any]] | dict[str, Any], *extra: str) -> None:
        docs = objects if isinstance(objects, list) else [objects]
        self.kubectl("apply", *extra, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def kubeconfig_for(self, name: str, token: str, namespace: str = "default") -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(
            _kubeconfig(self.url, token, self.workdir / "certs" / "apiserver.crt", namespace)
        )
        return path

    def client_cert_kubeconfig(
        self, name: str, user: str, groups: tuple[str, ...] = ("system:masters",)
    ) -> Path:
        """A kubeconfig as kind writes one: the server's CA, and a client certificate (of the
        user `user` in `groups`) and its key, all inline (`*-data`), context `kind-<name>`."""
        pair = client_certificate(self.client_ca, user, groups)
        server_ca = (self.workdir / "certs" / "apiserver.crt").read_bytes()

        def inline(data: bytes) -> str:
            return base64.b64encode(data).decode()

        path = self.workdir / f"{name}.kubeconfig"
        context = f"kind-{name}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": context,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": inline(server_ca),
                    },
                }
            ],
            "users": [
                {
                    "name": context,
                    "user": {
                        "client-certificate-data": inline(pair.cert_pem),
                        "client-key-data": inline(pair.key_pem),
                    },
                }
            ],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config))
        return path


def client_certificate(ca: certs.KeyPair, user: str, groups: tuple[str, ...]) -> certs.KeyPair:
    """A client certificate as the API server reads one: the user is the subject's CN, the
    groups its Os."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # "EC PRIVATE KEY", as kubeadm's
        serialization.NoEncryption(),
    )
    return certs.KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def _kubeconfig(url: str, token: str, ca: Path, namespace: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "test", "cluster": {"server": url, "certificate-authority": str(ca)}}
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "test",
                    "context": {"cluster": "test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "test",
        }
    )


def _wait_http(
    url: str, what: str, proc: subprocess.Popen[bytes], log: Path, token: str | None = None
) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{what} not ready in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _binaries() -> Path:
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server; .ci/run does)")
    if shutil.which("go") is None:
        pytest.skip("Go is not installed: the pinned kube-apiserver is built from the module proxy")
    built = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if built.returncode != 0:
        raise RuntimeError(f"building Kubernetes failed:\n{built.stderr[-5000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    bin_dir = _binaries()
    work = tmp_path_factory.mktemp("kube")
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, command: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = work / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, log

    try:
        client, peer = _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        etcd, etcd_log = start(
            "etcd",
            [
                "etcd", "--name", "default", "--data-dir", str(work / "etcd"),
                "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
            ],
        )  # fmt: skip
        _wait_http(f"{etcd_url}/health", "etcd", etcd, etcd_log)

        (work / "certs").mkdir()
        key, pub = work / "sa.key", work / "sa.pub"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
            check=True,
            capture_output=True,
        )
        tokens = work / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
        client_ca = certs.make_ca("laminar-test-client-ca")
        (work / "client-ca.crt").write_bytes(client_ca.cert_pem)
        port = _free_port()
        url = f"https://127.0.0.1:{port}"
        apiserver, apiserver_log = start(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={port}", f"--cert-dir={work / 'certs'}",
                f"--token-auth-file={tokens}",
                f"--client-ca-file={work / 'client-ca.crt'}",
                "--authorization-mode=RBAC",
                # as OpenShift has it: owner references that block deletion need the right to
                # update the owner's finalizers (the operator's rules grant it)
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pub}",
                f"--service-account-signing-key-file={key}",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
            ],
        )  # fmt: skip
        _wait_http(f"{url}/readyz", "kube-apiserver", apiserver, apiserver_log, ADMIN_TOKEN)
        admin = work / "admin.kubeconfig"
        admin.write_text(_kubeconfig(url, ADMIN_TOKEN, work / "certs" / "apiserver.crt", "default"))
        start(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={admin}",
                "--controllers=garbagecollector,persistentvolume-binder",
                "--leader-elect=false",
                "--secure-port=0",
                "--use-service-account-credentials=false",
            ],
        )
        yield KubeApi(url, admin, bin_dir, work, client_ca)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture()
def namespace(kube: KubeApi, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for one test."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t{next(_NAMESPACES)}-{words}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crds(kube: KubeApi) -> KubeApi:
    """The API server with the CRDs installed (and established)."""
    for path in CRDS:
        kube.kubectl("apply", "-f", str(path))
    for path in CRDS:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        kube.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return kube


# ---- the operator as the chart installs it -----------------------------------------------------

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
#: Any refusal in a log: 403 Forbidden (RBAC's, or a namespace being deleted refusing writes).
#: (Not the milliseconds of a log line's time, "04:23:48,403": CI48.)
FORBIDDEN = re.compile(r"(?<![\d,.])403(?!\d)|[Ff]orbidden")


def helm(kube: KubeApi, *args: str) -> str:
    result = subprocess.run(
        [str(kube.bin_dir / "helm"), *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def rendered(
    kube: KubeApi, *sets: str, release: str = "laminar", namespace: str = "laminar-system"
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its objects."""
    out = helm(kube, "template", release, str(CHART), "--namespace", namespace, *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass
class OperatorIdentity:
    """The chart's operator ServiceAccount, installed with its RBAC, and how the chart runs it."""

    namespace: str
    account: str  # the ServiceAccount's name
    kubeconfig: Path  # with a token of the ServiceAccount
    args: list[str]  # `kopf run` arguments of the chart's Deployment
    env: dict[str, str]  # the Deployment's environment (the downward API's namespace resolved)
    objects: list[dict[str, Any]]  # the RBAC objects applied

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    def can(self, kube: KubeApi, *args: str) -> bool:
        """`kubectl auth can-i` as the operator (impersonated by the admin)."""
        answer = kube.kubectl("auth", "can-i", f"--as={self.user}", *args, check=False)
        assert answer.stdout.strip() in ("yes", "no"), answer.stdout + answer.stderr
        return answer.stdout.strip() == "yes"


def operator_identity(kube: KubeApi, release: str, namespace: str, *sets: str) -> OperatorIdentity:
    """Install the chart's RBAC (exactly as rendered with `sets`) and the operator's
    ServiceAccount in `namespace`; watched namespaces must exist already."""
    docs = rendered(kube, *sets, release=release, namespace=namespace)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    objects = [d for d in docs if d["kind"] in RBAC_KINDS]
    kube.apply(objects)
    (account,) = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
    token = kube.kubectl(
        "create", "token", account, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    (container,) = pod["containers"]
    args = [a for a in container["args"] if not a.startswith("--liveness")]  # no probe port
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, var
            env[var["name"]] = namespace
    return OperatorIdentity(
        namespace, account, kube.kubeconfig_for(f"{release}-operator", token), args, env, objects
    )


@contextlib.contextmanager
def run_operator(identity: OperatorIdentity, strict: bool = False, **env: str) -> Iterator[Any]:
    """The operator (kopf's KopfRunner, in a thread) as `identity`, with the chart's arguments
    and environment (`env` overrides). On exit: it raised nothing, and RBAC denied it nothing
    (kopf's "Not enough permissions" included); `strict`: no 403 at all in its log (else a 403
    for writes into a namespace another test is deleting is fine)."""
    from kopf.testing import KopfRunner

    from laminar_operator.logs import LOGGERS

    variables = {**identity.env, **env, "KUBECONFIG": str(identity.kubeconfig)}
    saved = {name: os.environ.get(name) for name in variables}
    # the operator sets its loggers' level (LAMINAR_OPERATOR_LOG_LEVEL), "laminar" among them:
    # the broker's too, in this process; left at debug, the tests of the API's fast path that
    # run here next would find it declining every append (it leaves debug logging to the API)
    levels = {name: logging.getLogger(name).level for name in ("", *LOGGERS)}
    os.environ.update(variables)
    try:
        with KopfRunner(identity.args, timeout=60) as runner:
            yield runner
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    assert runner.exception is None, runner.output
    denied = re.compile(
        rf'User "{re.escape(identity.user)}" cannot|Not enough permissions'
        + (f"|{FORBIDDEN.pattern}" if strict else "")
    )
    refused = [line for line in runner.output.splitlines() if denied.search(line)]
    assert not refused, "\n".join(refused)
