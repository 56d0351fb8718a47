"""The Kubernetes API client of the operator and of the brokers' status reports: get, list,
server-side apply, create, merge patch (of an object or of its status) and delete, of the kinds
in PLURALS, namespaced or cluster-scoped.

The connection is kubernetes_asyncio's (docs/kubernetes.md, "The Kubernetes client"): it reads
kubeconfigs (the current context or a named one, KUBECONFIG's merged files, client
certificates, tokens, token files, exec plugins such as EKS's and GKE's) and the pod's
ServiceAccount, and makes the TLS connection. This module names the resources, re-reads the
credentials every `refresh_s` and after a 401 (rotated ServiceAccount tokens, token files,
expiring exec-plugin tokens), and turns the API's errors into KubeError.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .client.models import TopicDescription

# kubernetes_asyncio is imported where it is used: importing it takes about 0.2 s, which a
# broker that does not report to Kubernetes need not pay at every start.
if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

FIELD_MANAGER = "laminar-operator"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PLURALS = {
    "ConfigMap": "configmaps",
    "Event": "events",
    "LaminarCluster": "laminarclusters",
    "NetworkPolicy": "networkpolicies",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Secret": "secrets",
    "SelfSubjectReview": "selfsubjectreviews",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "StatefulSet": "statefulsets",
    "StorageClass": "storageclasses",
    "Topic": "topics",
}
TIMEOUT_S = 30.0
#: Credentials are read again this often (as client-go re-reads token files): a rotated
#: ServiceAccount token or token file, an expired exec-plugin token. A 401 re-reads them at once.
CREDENTIALS_REFRESH_S = 60.0
#: A Topic's status lists at most this many partitions one by one (the CRD's maxItems).
MAX_LISTED_PARTITIONS = 256
_ANSWERS = {200: "object", 201: "object", 202: "object"}  # JSON, as dicts
#: What reading a broken kubeconfig or token raises, besides the library's ConfigException.
_READ_ERRORS = (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError)


class KubeError(Exception):
    """An error answer of the API server (its HTTP `status`), or status 0: no usable
    credentials (none found, a broken kubeconfig, a failing exec plugin)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Credentials:
    """Where the API server and the credentials for it come from: kubeconfig files (one
    context of them) or a pod's ServiceAccount. Which one is settled here; the credentials
    themselves are read (token files, exec plugins run) when a KubeClient connects, and again
    every `refresh_s` and after a 401."""

    def __init__(
        self,
        source: str,
        kubeconfig: KubeConfigLoader | None = None,
        service_account_dir: Path | None = None,
        refresh_s: float = CREDENTIALS_REFRESH_S,
    ) -> None:
        self.source = source  # for messages
        self._kubeconfig = kubeconfig
        self._service_account_dir = service_account_dir
        self.refresh_s = refresh_s  # read the credentials again this often

    @classmethod
    def from_environment(cls, context: str | None = None) -> Credentials:
        """KUBECONFIG's files, else ~/.kube/config, else the pod's ServiceAccount."""
        return cls.from_path(None, context)

    @classmethod
    def from_path(cls, config: str | None, context: str | None = None) -> Credentials:
        """The kubeconfig files `config` names (os.pathsep-separated; each must exist), else
        KUBECONFIG's (those that exist, as kubectl), else ~/.kube/config, else the pod's
        ServiceAccount; in a kubeconfig, the context `context`, else its current context."""
        if config:
            paths = [Path(p).expanduser() for p in config.split(os.pathsep) if p]
            missing = [str(p) for p in paths if not p.is_file()]
            if missing:
                raise KubeError(0, f"no kubeconfig at {', '.join(missing)}")
            return cls.from_kubeconfig(paths, context)
        variable = os.environ.get("KUBECONFIG", "")
        if variable.strip(os.pathsep):
            listed = [Path(p).expanduser() for p in variable.split(os.pathsep) if p]
            found = [p for p in listed if p.is_file()]
            if not found:
                raise KubeError(
                    0, f"none of the kubeconfig files KUBECONFIG names exists: {variable}"
                )
            return cls.from_kubeconfig(found, context)
        default = Path.home() / ".kube" / "config"
        if default.is_file():
            return cls.from_kubeconfig([default], context)
        if (SERVICE_ACCOUNT_DIR / "token").is_file():
            return cls.in_cluster()
        raise KubeError(
            0,
            f"no Kubernetes credentials: no kubeconfig (--kube-config, KUBECONFIG, "
            f"{default}) and no ServiceAccount token in {SERVICE_ACCOUNT_DIR} "
            "(not in a pod, or automountServiceAccountToken is off)",
        )

    @classmethod
    def from_kubeconfig(cls, paths: list[Path], context: str | None = None) -> Credentials:
        """Kubeconfig files merged as kubectl merges KUBECONFIG's: the first file to name a
        cluster, user or context, and the first to set current-context, wins."""
        from kubernetes_asyncio.config import ConfigException
        from kubernetes_asyncio.config.kube_config import KubeConfigLoader, KubeConfigMerger

        where = os.pathsep.join(str(p) for p in paths)
        try:
            merged = KubeConfigMerger(where)
            if context is None:  # the library's merger lets the last file's win: kubectl's rule
                context = _first_current_context([merged.config_files[p] for p in merged.paths])
                if context is None:
                    raise KubeError(0, f"the kubeconfig {where} sets no current-context")
            loader = KubeConfigLoader(
                config_dict=merged.config, active_context=context, config_base_path=None
            )
        except (ConfigException, *_READ_ERRORS) as e:
            raise KubeError(0, f"cannot use the kubeconfig {where}: {e}") from None
        return cls(f"the kubeconfig {where} (context {context})", kubeconfig=loader)

    @classmethod
    def in_cluster(cls, directory: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
        """A pod's ServiceAccount: `directory`'s token and ca.crt, and the API server at
        KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT."""
        return cls(f"the ServiceAccount token in {directory}", service_account_dir=directory)

    async def load(self, configuration: Configuration) -> None:
        """Set the server, TLS files and current credentials into `configuration`."""
        from kubernetes_asyncio.config import ConfigException
        from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

        try:
            if self._kubeconfig is not None:
                await self._kubeconfig.load_and_set(configuration)
            else:
                assert self._service_account_dir is not None
                InClusterConfigLoader(
                    token_filename=str(self._service_account_dir / "token"),
                    cert_filename=str(self._service_account_dir / "ca.crt"),
                    try_refresh_token=False,  # re-read by KubeClient, every refresh_s
                ).load_and_set(configuration)
        except (ConfigException, *_READ_ERRORS) as e:
            raise KubeError(0, f"cannot read the credentials of {self.source}: {e}") from None
        token = configuration.api_key.get("BearerToken")
        if isinstance(token, str):  # a token file written with a newline (kubectl's output)
            configuration.api_key["BearerToken"] = token.strip()


def _first_current_context(documents: list[Any]) -> str | None:
    for document in documents:
        if isinstance(document, dict) and document.get("current-context"):
            return str(document["current-context"])
    return None


def path_of(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The resource path; `namespace` "" for a cluster-scoped kind (or all namespaces)."""
    if kind not in PLURALS:
        raise ValueError(f"the kind {kind} is not in laminar.kube.PLURALS")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    where = f"/namespaces/{namespace}" if namespace else ""
    path = f"{base}{where}/{PLURALS[kind]}"
    return path if name is None else f"{path}/{name}"


def _message(error: Any) -> str:
    """The API server's message in an ApiException."""
    body = error.body
    try:
        found = json.loads(body) if isinstance(body, str | bytes) and body else None
    except ValueError:
        found = None
    if isinstance(found, dict) and found.get("message"):
        return str(found["message"])
    return str(body or error.reason)


class KubeClient:
    def __init__(self, credentials: Credentials, field_manager: str = FIELD_MANAGER) -> None:
        self.credentials = credentials
        self.field_manager = field_manager  # who changed what, in managedFields
        self._api: ApiClient | None = None
        self._connecting = asyncio.Lock()
        self._refresh_at = 0.0  # when the credentials are read again (monotonic)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _connected(self) -> ApiClient:
        from kubernetes_asyncio.client import ApiClient, Configuration

        async with self._connecting:
            if self._api is None:
                configuration = Configuration()
                await self.credentials.load(configuration)
                self._refresh_at = time.monotonic() + self.credentials.refresh_s
                self._api = ApiClient(configuration)
                self._api.user_agent = f"laminar ({self.field_manager})"
            elif time.monotonic() >= self._refresh_at:
                await self.credentials.load(self._api.configuration)
                self._refresh_at = time.monotonic() + self.credentials.refresh_s
            return self._api

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        for attempt in range(2):
            api = await self._connected()
            try:
                answer = await api.call_api(
                    path,
                    method,
                    query_params=list((query or {}).items()),
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body,
                    auth_settings=["BearerToken"],
                    response_types_map=_ANSWERS,
                    _return_http_data_only=True,
                    _request_timeout=TIMEOUT_S,
                )
            except ApiException as e:
                if e.status == 401 and attempt == 0:  # maybe rotated: read the credentials again
                    self._refresh_at = 0.0
                    continue
                if e.status == 404 and method == "GET":
                    return None
                raise KubeError(e.status, f"{method} {path}: {_message(e)}") from None
            return answer if isinstance(answer, dict) else {}
        raise AssertionError("unreachable")

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """One object, None when there is none; `namespace` "" for a cluster-scoped kind."""
        return await self._request("GET", path_of(api_version, kind, namespace, name))

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (idempotent, forced): the field manager owns the fields it sets."""
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        query = {"fieldManager": self.field_manager, "force": "true"}
        answer = await self._request("PATCH", path, obj, "application/apply-patch+yaml", query)
        assert answer is not None
        return answer

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create `obj` (the created object); None, and the object left as it is, when it
        exists already (the operator's Secrets: created once, never read back)."""
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        path = path_of(obj["apiVersion"], obj["kind"], namespace)
        try:
            return await self._request(
                "POST", path, obj, query={"fieldManager": self.field_manager}
            )
        except KubeError as e:
            if e.status == 409:
                return None
            raise

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of one object (the patched object)."""
        answer = await self._request(
            "PATCH",
            path_of(api_version, kind, namespace, name),
            body,
            "application/merge-patch+json",
            {"fieldManager": self.field_manager},
        )
        assert answer is not None
        return answer

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        propagation: str | None = None,
    ) -> bool:
        """Delete one object (only if its uid is still `uid`, when given; its dependents as
        `propagation` says: "Orphan", "Background", "Foreground", else the kind's default);
        False when there was none."""
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        if propagation:
            options["propagationPolicy"] = propagation
        try:
            await self._request("DELETE", path_of(api_version, kind, namespace, name), options)
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
        """A JSON merge patch of the status subresource."""
        await self._request(
            "PATCH",
            path_of(api_version, kind, namespace, name) + "/status",
            {"status": status},
            "application/merge-patch+json",
            {"fieldManager": self.field_manager},
        )


def topic_status(description: TopicDescription) -> dict[str, Any]:
    """A Topic object's status from a topic description: the first MAX_LISTED_PARTITIONS
    partitions one by one, `summarized: true` when there are more (`underReplicated` counts
    them all), so that status stays small whatever the partition count; with the effective
    replication factor and partition count (the spec may leave them to defaults)."""
    states = sorted(description.partition_states, key=lambda p: p.partition)
    rf = description.replication_factor
    return {
        "replicationFactor": rf,
        "partitionCount": description.partitions,
        "underReplicated": len(description.under_replicated()),
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
