"""A small Kubernetes API client (the operator's, and the brokers' status reports): server-side
apply, create, get, list, delete, merge-patch of status.

Credentials come from the kubeconfig (`KUBECONFIG`, else ~/.kube/config: its current
context's server, CA and bearer token) or, inside a pod, from the ServiceAccount mount. Only
bearer tokens are supported (what ServiceAccounts and `kubectl create token` give).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from .client.models import TopicDescription

FIELD_MANAGER = "laminar-operator"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PLURALS = {
    "ConfigMap": "configmaps",
    "LaminarCluster": "laminarclusters",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Secret": "secrets",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "StatefulSet": "statefulsets",
    "Topic": "topics",
}
TIMEOUT_S = 30.0
#: A Topic's status lists at most this many partitions one by one (the CRD's maxItems).
MAX_LISTED_PARTITIONS = 256


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str
    ssl: ssl.SSLContext

    @classmethod
    def from_environment(cls) -> Credentials:
        config = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
        return cls.from_path(config)

    @classmethod
    def from_path(cls, config: str | None) -> Credentials:
        """The kubeconfig at `config`, else the pod's ServiceAccount."""
        config = config or ""
        if config and Path(config).exists():
            return cls.from_kubeconfig(Path(config))
        if (SERVICE_ACCOUNT_DIR / "token").exists():
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
            token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
            return cls(f"https://{host}:{port}", token, context)
        raise KubeError(0, f"no kubeconfig at {config} and not in a pod")

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Credentials:
        document = yaml.safe_load(path.read_text())
        current = document["current-context"]
        context = next(c["context"] for c in document["contexts"] if c["name"] == current)
        clusters = document["clusters"]
        cluster = next(c["cluster"] for c in clusters if c["name"] == context["cluster"])
        user = next(u["user"] for u in document["users"] if u["name"] == context["user"])
        token = user.get("token") or Path(user["tokenFile"]).read_text().strip()
        if cluster.get("insecure-skip-tls-verify"):
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            tls = ssl.create_default_context(cadata=ca)
        elif "certificate-authority" in cluster:
            tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        else:
            tls = ssl.create_default_context()
        return cls(cluster["server"].rstrip("/"), token, tls)


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{PLURALS[kind]}"
    return path if name is None else f"{path}/{name}"


class KubeClient:
    def __init__(self, credentials: Credentials, field_manager: str = FIELD_MANAGER) -> None:
        self.credentials = credentials
        self.field_manager = field_manager  # who changed what, in managedFields
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any] | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                connector=aiohttp.TCPConnector(ssl=self.credentials.ssl),
            )
        headers = {
            "Authorization": f"Bearer {self.credentials.token}",
            "Accept": "application/json",
        }
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = self.credentials.server + path
        async with self._session.request(method, url, data=data, headers=headers) as answer:
            text = await answer.text()
            if answer.status == 404 and method == "GET":
                return None
            if answer.status >= 300:
                try:
                    message = json.loads(text).get("message", text)
                except ValueError:
                    message = text
                raise KubeError(answer.status, f"{method} {path}: {message}")
            document: dict[str, Any] = json.loads(text) if text else {}
            return document

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        return await self._request("GET", path_of(api_version, kind, namespace, name))

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (idempotent): the operator owns the fields it sets."""
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = f"?fieldManager={self.field_manager}&force=true"
        answer = await self._request("PATCH", path + query, obj, "application/apply-patch+yaml")
        assert answer is not None
        return answer

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create `obj`; None, and the object left as it is, when it exists already (the
        operator's Secrets: created once, never read back)."""
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            return await self._request("POST", path + f"?fieldManager={self.field_manager}", obj)
        except KubeError as e:
            if e.status == 409:
                return None
            raise

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> bool:
        """Delete one object (only if its uid is still `uid`, when given); False when there
        was none."""
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._request("DELETE", path_of(api_version, kind, namespace, name), body)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def list(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        found = await self._request("GET", path_of(api_version, kind, namespace))
        return list((found or {}).get("items") or [])

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        path = (
            path_of(api_version, kind, namespace, name)
            + f"/status?fieldManager={self.field_manager}"
        )
        await self._request("PATCH", path, {"status": status}, "application/merge-patch+json")


def topic_status(description: TopicDescription) -> dict[str, Any]:
    """A Topic object's status from a topic description: the first MAX_LISTED_PARTITIONS
    partitions one by one, `summarized: true` when there are more (`underReplicated` counts
    them all), so that status stays small whatever the partition count."""
    states = sorted(description.partition_states, key=lambda p: p.partition)
    rf = description.replication_factor
    return {
        "underReplicated": sum(1 for p in states if len(p.in_sync) < rf),
        "summarized": len(states) > MAX_LISTED_PARTITIONS,
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader or "",
                "replicas": list(p.replicas),
                "inSync": list(p.in_sync),
                "commitIndex": p.commit_index,
            }
            for p in states[:MAX_LISTED_PARTITIONS]
        ],
    }
