"""The kopf handlers: thin over `manifests` (what to own) and `kube` (how to apply it).

    kopf run --all-namespaces --standalone -m laminar_operator.handlers

A LaminarCluster is reconciled on create, on every spec change and on operator start: its
objects are server-side applied (idempotent; a changed spec rolls the StatefulSet through the
pod template's spec hash). The HMAC key's Secret is created once and never read (the operator
may create Secrets, not read them); the initial node set is the replicas the cluster was
created with, read back from its ConfigMap. The NetworkPolicy is applied, or deleted when
spec.networkPolicy.enabled turns false. spec.xdp.enabled is honoured only where the operator
allows XDP (LAMINAR_XDP_ALLOWED, the chart's xdp.allowed); elsewhere the XdpAllowed condition
is False and a Warning event says why.

TLS (spec.tls.enabled, the default; docs/kubernetes.md "TLS"): each cluster gets its own CA,
made once; its key is kept in a Secret of the operator's own namespace (`laminar-ca-<uid>`,
read back by name to sign renewals: the operator reads no Secret elsewhere), its certificate
in `<name>-ca` for clients. The brokers' certificate (`<name>-tls`) is issued before the
StatefulSet is applied, restored if deleted (on every reconcile), and renewed in place by the
status timer once less than a third of its lifetime is left (the kubelet refreshes the
mounted Secret and the brokers reload it: no restart). The CA itself is rotated, one step per
timer tick, when annotated `laminarmq.io/rotate-ca` or due (ca_rotation: the steps, each after
what the brokers report having loaded). The operator's own calls to the brokers verify them
with the cluster's CA bundle.

Client credentials (docs/kubernetes.md "Client credentials"): each cluster's Secret
`<name>-credentials` (the brokers' credentials file, an admin and a client token) is made
once, never read back; the operator's own token for the cluster is kept in its namespace
(`laminar-token-<uid>`, read back by name, deleted with the cluster), and every call to the
brokers sends it.

Status (docs/kubernetes.md, "LaminarCluster"): the reconcile's result is the condition
ReconcileSuccess, with the generation it was computed from; a timer sets replicas,
readyReplicas, selector (the scale subresource's) and phase from the StatefulSet, Ready from
the reconcile's result and the brokers' readiness, as of status.observedGeneration (never over
a failed reconcile), and Rebalancing and Degraded from what the brokers report
(rebalancingPartitions, underReplicated), Unknown while their reports are stale. Conditions
are JSON patches of the freshest object (`_set_condition`): concurrent handlers keep each
other's. Decisions are Kubernetes Events, through a spam filter (`events`).

A Topic is created, adopted or altered (partitions grow, config) through the brokers' admin
API, and deleted with it (a finalizer; when the brokers stay unreachable the deletion lets go
after DELETE_TIMEOUT_S, and at once when the cluster itself is gone). A failure is retried
(a spec the broker refuses less often), with ReconcileSuccess and Ready saying why in the
broker's words; an adopted topic that differs from the spec where it cannot change is told by
SpecMismatch.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import secrets
import ssl
import time
import urllib.parse
from typing import Any

import kopf

from laminar import certs, settings
from laminar.client import AsyncClient, NodeTls
from laminar.client.errors import BadRequest, Forbidden, LaminarError, NotFound, Unauthorized
from laminar.credentials import new_token
from laminar.kube import Credentials, KubeClient, KubeError, topic_status
from laminar.tls import client_context
from laminar.workers import worker_id

from . import ca_rotation, events, logs, manifests, topics
from .ca_rotation import CaState

GROUP, VERSION = "laminarmq.io", "v1alpha1"
STATUS_INTERVAL_S = 10.0
BACKOFF_S = 5.0
#: A scale-down checks on the broker it drains this often.
SCALE_POLL_S = 2.0


#: "true" lets clusters run the privileged XDP init container (the chart's xdp.allowed).
XDP_ALLOWED_ENV = "LAMINAR_XDP_ALLOWED"
#: The namespace the operator runs in (the chart sets it from the downward API); its pods are
#: admitted to the brokers' API port. Unset (an operator outside the cluster): none is.
OPERATOR_NAMESPACE_ENV = "LAMINAR_OPERATOR_NAMESPACE"
#: Where the clusters' CA keys are kept (default: the operator's namespace; neither set: each
#: cluster's own namespace, where the operator then needs to read Secrets).
CA_NAMESPACE_ENV = "LAMINAR_CA_NAMESPACE"
#: The brokers' certificates' lifetime in seconds (default: certs.CERT_LIFETIME, 90 days).
CERT_LIFETIME_ENV = "LAMINAR_CERT_LIFETIME_S"
#: A cluster's CA is read again from its Secret after this long (a CA replaced by hand).
CA_CACHE_S = 300.0
#: How long a CA rotation publishes the new CA before it signs (default: 10 minutes).
CA_DWELL_ENV = "LAMINAR_CA_ROTATION_DWELL_S"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: Conditions and events carry at most this much of a message (an error's text can be long).
MAX_CONDITION_MESSAGE = 4096
MAX_EVENT_MESSAGE = 1024
CONDITION_KEYS = ("status", "reason", "message", "observedGeneration")
NOT_ADMITTED = (
    "the brokers do not admit the operator's token (its hash is in the Secret "
    '<cluster>-credentials the brokers mount; docs/kubernetes.md, "Client credentials")'
)
XDP_NOT_ALLOWED = (
    "spec.xdp.enabled is ignored: this operator does not allow the privileged XDP init "
    "container (the operator chart's value xdp.allowed is false; an administrator may set it "
    "to true). The brokers run without the XDP router."
)


#: A deleted object's timers (`cluster_status`, `refresh_topic_status`) must have exited before
#: its deletion handlers run and its finalizer goes. kopf waits this long in memory for a
#: timer run that is under way (a call to the brokers: at most ADMIN_TIMEOUT_S), then looks
#: again every TIMER_EXIT_POLL_S. kopf's default is to look again after 60 s, so a Topic or
#: LaminarCluster deleted while its timer ran stayed for a minute (`kubectl delete` waited).
TIMER_EXIT_WAIT_S = 2.0
TIMER_EXIT_POLL_S = 1.0


def xdp_allowed(environ: Any = os.environ) -> bool:
    return str(environ.get(XDP_ALLOWED_ENV, "")).strip().lower() in ("1", "true", "yes")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    # No watching of namespaces and CRDs: the operator serves its two resources, whose CRDs
    # are installed before it (the chart's crds/), in the namespaces it is given by exact name
    # (--namespace) or in all (--all-namespaces). So it needs no cluster-wide read of
    # namespaces or CRDs (docs/kubernetes.md, "Privileges").
    settings.scanning.disabled = True
    settings.background.instant_exit_timeout = TIMER_EXIT_WAIT_S
    settings.background.cancellation_polling = TIMER_EXIT_POLL_S
    logs.configure(logs.level_of(os.environ))
    memo.events = events.EventLimiter()
    memo.kube = KubeClient(Credentials.from_environment())
    memo.xdp_allowed = xdp_allowed()
    memo.operator_namespace = os.environ.get(OPERATOR_NAMESPACE_ENV) or None
    memo.ca_namespace = os.environ.get(CA_NAMESPACE_ENV) or memo.operator_namespace
    lifetime = os.environ.get(CERT_LIFETIME_ENV)
    memo.cert_lifetime = (
        datetime.timedelta(seconds=float(lifetime)) if lifetime else certs.CERT_LIFETIME
    )
    dwell = os.environ.get(CA_DWELL_ENV)
    memo.ca_dwell = datetime.timedelta(seconds=float(dwell)) if dwell else ca_rotation.DEFAULT_DWELL
    memo.cas = {}  # cluster uid -> (when read, ca_rotation.CaState, client context)
    memo.tokens = {}  # cluster uid -> (when read, the operator's token for its brokers)
    memo.issued = {}  # cluster uid -> status.tls of the certificate this operator issued last
    memo.tls_locks = {}  # cluster uid -> asyncio.Lock: one `_ensure_tls` at a time


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.kube.close()


async def _initial_replicas(kube: KubeClient, namespace: str, name: str, spec: Any) -> int:
    found = await kube.get("v1", "ConfigMap", namespace, manifests.config_map_name(name))
    nodes = ((found or {}).get("data") or {}).get(manifests.INITIAL_NODES_KEY)
    return len(nodes.split(",")) if nodes else int(spec.get("replicas", 3))


@kopf.on.resume(GROUP, VERSION, "laminarclusters")
@kopf.on.create(GROUP, VERSION, "laminarclusters")
@kopf.on.update(GROUP, VERSION, "laminarclusters", field="spec")
async def reconcile_cluster(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    kube: KubeClient = memo.kube
    cluster = dict(body)
    name, namespace = manifests.names(cluster)
    allowed = bool(memo.xdp_allowed)
    generation = body.metadata.get("generation")
    _xdp_condition(memo, patch, body, manifests.xdp_wanted(cluster), allowed)
    try:
        initial = await _initial_replicas(kube, namespace, name, body.spec)
        replicas, draining = await _scale_step(kube, cluster, body, patch, memo)
        workers, lowering = await _workers_step(kube, cluster, body, memo, replicas)
        draining = draining or lowering
        if workers != manifests.spec_of(cluster)["workersPerPod"]:  # the old count, for now
            cluster = {**cluster, "spec": {**cluster["spec"], "workersPerPod": workers}}
        objects = manifests.owned(
            cluster,
            initial_replicas=initial,
            replicas=replicas,
            xdp_allowed=allowed,
            operator_namespace=memo.operator_namespace,
        )
        # the key: made once (a Secret that exists is left alone, never read back)
        await kube.create(manifests.secret(cluster, secrets.token_bytes(32)))
        # the client credentials: made once with new tokens, never read back; the operator's
        # own token is kept in the operator's namespace (only its hash is in the Secret)
        operator_token = await _operator_token(kube, memo, cluster)
        tokens = {"admin_token": new_token(), "client_token": new_token()}
        credentials = manifests.credentials_secret(cluster, operator_token=operator_token, **tokens)
        await kube.create(credentials)
        if manifests.tls_enabled(cluster):  # before the pods that mount it
            await _ensure_tls(kube, memo, cluster, body, patch, restore=True)
        # grown volumes (the StatefulSet made again), or its volume templates kept as they are
        sts = next(obj for obj in objects if obj["kind"] == "StatefulSet")
        await _expand_storage(kube, memo, cluster, body, patch, sts)
        for obj in objects:
            await kube.apply(obj)
        if not manifests.network_policy_enabled(cluster):
            await _delete_network_policy(kube, cluster)
    except KubeError as e:
        message = f"applying generation {generation}: {e}"
        _set_condition(patch, body, "ReconcileSuccess", "False", "ApplyFailed", message)
        _set_condition(patch, body, "Ready", "False", "ReconcileFailed", message)
        _event(memo, body, "Warning", "ApplyFailed", message)
        raise kopf.TemporaryError(f"applying {namespace}/{name}: {e}", delay=BACKOFF_S) from e
    patch.status["selector"] = manifests.selector(name)
    patch.status["observedGeneration"] = generation
    message = f"generation {generation} applied"
    _set_condition(patch, body, "ReconcileSuccess", "True", "Applied", message)
    if body.status.get("observedGeneration") != generation:
        _event(memo, body, "Normal", "Applied", message)
    if draining:
        raise kopf.TemporaryError(draining, delay=SCALE_POLL_S)


def _xdp_condition(
    memo: kopf.Memo, patch: kopf.Patch, body: kopf.Body, wanted: bool, allowed: bool
) -> None:
    """XdpAllowed: False (and a Warning event) while the spec asks for XDP that the operator
    does not allow; True otherwise (set only once a spec has asked for XDP)."""
    if wanted and not allowed:
        _set_condition(patch, body, "XdpAllowed", "False", "XdpNotAllowed", XDP_NOT_ALLOWED)
        _event(memo, body, "Warning", "XdpNotAllowed", XDP_NOT_ALLOWED)
    elif wanted:
        message = "the XDP router is loaded by a privileged init container"
        _set_condition(patch, body, "XdpAllowed", "True", "XdpAllowed", message)
    elif any(c.get("type") == "XdpAllowed" for c in body.status.get("conditions") or []):
        _set_condition(patch, body, "XdpAllowed", "True", "XdpNotRequested", "")


async def _delete_network_policy(kube: KubeClient, cluster: dict[str, Any]) -> None:
    """The cluster's NetworkPolicy, gone (spec.networkPolicy.enabled turned false): only the
    one this cluster owns, not another of the same name."""
    name, namespace = manifests.names(cluster)
    found = await kube.get("networking.k8s.io/v1", "NetworkPolicy", namespace, name)
    owners = ((found or {}).get("metadata") or {}).get("ownerReferences") or []
    uid = cluster["metadata"]["uid"]
    if found and any(o.get("uid") == uid for o in owners):
        policy_uid = found["metadata"]["uid"]
        await kube.delete("networking.k8s.io/v1", "NetworkPolicy", namespace, name, policy_uid)


#: How long a reconcile waits for the StatefulSet it deleted to make it again with grown
#: volumes (its pods and claims orphaned) to be gone; after that the reconcile is retried.
STS_RECREATE_TIMEOUT_S = 30.0
STS_RECREATE_POLL_S = 0.5


async def _expand_storage(
    kube: KubeClient,
    memo: kopf.Memo,
    cluster: dict[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    sts: dict[str, Any],
) -> None:
    """spec.storage.size grown (docs/kubernetes.md, "Storage"): each broker's claim
    (data-<name>-<ordinal>) is patched to the new size, then the StatefulSet is deleted with
    its pods and claims orphaned (the brokers keep running), for `sts`, applied next, to make
    it again with the new volumeClaimTemplate (a StatefulSet's cannot change in place).

    When a claim refuses (its StorageClass does not allow expansion, it is not bound: the API
    server says which; no StorageClass is read), the volumes keep their size: `sts` keeps the
    existing StatefulSet's volumeClaimTemplates, so that every other change still rolls out
    (never a 422 retried forever), and the condition StorageExpanded is False with a Warning
    event. The expansion is tried again at the next reconcile (a spec change, the operator's
    restart). Without a grown size, `sts` keeps the existing templates too."""
    name, namespace = manifests.names(cluster)
    existing = await kube.get("apps/v1", "StatefulSet", namespace, name)
    if existing is not None and existing["metadata"].get("deletionTimestamp"):
        existing = await _sts_gone(kube, namespace, name)  # a recreation under way
    if existing is None:
        return
    have, want = manifests.claim_size(existing), manifests.claim_size(sts)
    try:
        grown = have is not None and want is not None
        grown = grown and manifests.quantity(str(want)) > manifests.quantity(str(have))
    except ValueError:
        grown = False
    if not grown:
        sts["spec"]["volumeClaimTemplates"] = existing["spec"].get("volumeClaimTemplates") or []
        return
    ordinal, refused = 0, ""
    replicas = max(int(existing["spec"].get("replicas") or 0), int(sts["spec"]["replicas"]))
    while not refused:  # the brokers' claims, and those that outlived a scale-down (Retain)
        claim = manifests.claim_name(name, ordinal)
        found = await kube.get("v1", "PersistentVolumeClaim", namespace, claim)
        if found is None and ordinal >= replicas:
            break
        ordinal += 1
        size = (((found or {}).get("spec") or {}).get("resources") or {}).get("requests", {})
        try:
            if found is None or manifests.quantity(str(size.get("storage"))) >= (
                manifests.quantity(str(want))
            ):
                continue
            resize = {"spec": {"resources": {"requests": {"storage": want}}}}
            await kube.patch("v1", "PersistentVolumeClaim", namespace, claim, resize)
        except ValueError:
            refused = f"{claim}: its size {size.get('storage')!r} is not a quantity"
        except KubeError as e:
            if e.status not in (403, 422):  # refused: by admission (the class), by validation
                raise
            refused = f"{claim}: {e}"
    if refused:
        message = (
            f"the volumes stay at {have}, not {want}: the API server refused to expand "
            f"{refused}. Use a StorageClass with allowVolumeExpansion: true (an administrator "
            "may set it on this one): the operator expands the volumes at its next reconcile "
            "(a spec change, or its restart). Meanwhile the StatefulSet keeps its volume "
            "template and every other change still rolls out."
        )
        sts["spec"]["volumeClaimTemplates"] = existing["spec"].get("volumeClaimTemplates") or []
        _set_condition(patch, body, "StorageExpanded", "False", "ExpansionRefused", message)
        _event(memo, body, "Warning", "StorageExpansionRefused", message)
        return
    uid = existing["metadata"]["uid"]
    await kube.delete("apps/v1", "StatefulSet", namespace, name, uid, propagation="Orphan")
    await _sts_gone(kube, namespace, name)
    message = (
        f"the brokers' claims asked to grow from {have} to {want} (the storage driver resizes "
        "them: kubectl get pvc shows their capacity); the StatefulSet made again with the new "
        "size, its pods kept running"
    )
    _set_condition(patch, body, "StorageExpanded", "True", "Expanded", message)
    _event(memo, body, "Normal", "StorageExpanded", message)


async def _sts_gone(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """Wait (STS_RECREATE_TIMEOUT_S at most) for a StatefulSet being deleted to be gone: None,
    or the one made since; a TemporaryError (retried) while it is still there."""
    deadline = time.monotonic() + STS_RECREATE_TIMEOUT_S
    while True:
        found = await kube.get("apps/v1", "StatefulSet", namespace, name)
        if found is None or not found["metadata"].get("deletionTimestamp"):
            return found
        if time.monotonic() >= deadline:
            raise kopf.TemporaryError(
                f"the StatefulSet {namespace}/{name}, deleted to be made again with grown "
                "volumes (its pods orphaned, kept running), is not gone yet: the garbage "
                "collector orphans its pods first",
                delay=BACKOFF_S,
            )
        await asyncio.sleep(STS_RECREATE_POLL_S)


def node_id(cluster: dict[str, Any], ordinal: int) -> str:
    """The broker node id of a StatefulSet ordinal: the pod's name, or the NODE_IDS_ANNOTATION
    entry for brokers not run by the StatefulSet (tests)."""
    listed = (cluster["metadata"].get("annotations") or {}).get(NODE_IDS_ANNOTATION)
    if listed:
        return str(listed.split(",")[ordinal].strip())
    return f"{cluster['metadata']['name']}-{ordinal}"


async def _scale_step(
    kube: KubeClient, cluster: dict[str, Any], body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo
) -> tuple[int, str]:
    """The StatefulSet's replicas now, and what a scale-down still waits for ("" for nothing).

    Scaling up takes spec.replicas at once (placement moves partitions to the new brokers).
    Scaling down drains the highest ordinal through the admin API and shrinks the StatefulSet
    by one only when that broker hosts nothing, one ordinal at a time; it is refused (the
    ScaleDown condition and a Warning event say why) while fewer brokers than some topic's
    replication factor would remain."""
    name, namespace = manifests.names(cluster)
    wanted = int(body.spec.get("replicas", 3))
    sts = await kube.get("apps/v1", "StatefulSet", namespace, name)
    current = int(sts["spec"]["replicas"]) if sts else wanted
    if wanted >= current:
        _set_condition(patch, body, "ScaleDown", "False", "NotScalingDown", "")
        if wanted > current:  # until the new brokers joined and placement converged
            message = f"scaling up to {wanted}: new brokers join, then partitions move to them"
            _set_condition(patch, body, "Rebalancing", "True", "BrokersJoining", message)
            _event(memo, body, "Normal", "ScalingUp", f"scaling up from {current} to {wanted}")
        if sts is not None:
            await _undrain(cluster, body, current, wanted, memo)
        return wanted, ""
    leaving = node_id(cluster, current - 1)
    try:
        async with await _admin(memo, cluster) as client:
            needed = max((t.replication_factor for t in await client.topics()), default=1)
            if wanted < needed:
                message = (
                    f"refusing to scale down to {wanted}: a topic has replication factor "
                    f"{needed}; {current} brokers kept"
                )
                _set_condition(patch, body, "ScaleDown", "False", "WouldUnderReplicate", message)
                _event(memo, body, "Warning", "ScaleDownRefused", message)
                return current, ""
            await client.drain(leaving)
            hosted = await client.node_partitions(leaving)
    except LaminarError as e:
        message = f"scale-down waits for the brokers: {e}"
        _set_condition(patch, body, "ScaleDown", "True", "BrokersUnreachable", message)
        _event(memo, body, "Warning", "ScaleDownWaiting", message)
        return current, message
    if hosted.partitions:
        message = f"draining {leaving}: {len(hosted.partitions)} partition replicas left"
        _set_condition(patch, body, "ScaleDown", "True", "Draining", message)
        what = f"draining {leaving}: its partitions move away before it is removed"
        _event(memo, body, "Normal", "Draining", f"scaling down to {wanted}; {what}")
        return current, message
    message = f"{leaving} drained; {current - 1} brokers"
    more = f"scaling down to {wanted}" if current - 1 > wanted else ""
    _set_condition(patch, body, "ScaleDown", "True" if more else "False", "Drained", message)
    _event(memo, body, "Normal", "ScaledDown", f"{leaving} drained and removed: {message}")
    return current - 1, more


async def _undrain(
    cluster: dict[str, Any], body: kopf.Body, current: int, wanted: int, memo: kopf.Memo
) -> None:
    """Brokers a scale-down drained, and that the cluster wants again (a scale-up bringing
    their ordinals back, or a scale-down given up): let placement use them again."""
    returning = [node_id(cluster, ordinal) for ordinal in range(current, wanted)]
    staying = {node_id(cluster, ordinal) for ordinal in range(min(current, wanted))}
    await _undrain_nodes(memo, cluster, body, returning, staying)


async def _undrain_nodes(
    memo: kopf.Memo,
    cluster: dict[str, Any],
    body: kopf.Body,
    returning: list[str],
    staying: set[str],
) -> None:
    """Undrain the nodes (brokers or workers) `returning`, and those of `staying` that are
    drained members. Best effort: a failure is a Warning event (for `returning`), not a
    stop."""
    try:
        async with await _admin(memo, cluster) as client:
            members = (await client.cluster()).members
            drained = [m.id for m in members if m.draining and m.id in staying]
            for node in dict.fromkeys(returning + drained):
                try:
                    await client.undrain(node)
                except NotFound:
                    continue  # never a member: nothing to undo
    except LaminarError as e:
        if returning:
            message = f"{', '.join(returning)} may stay drained: {e}"
            _event(memo, body, "Warning", "UndrainFailed", message)


async def _workers_step(
    kube: KubeClient, cluster: dict[str, Any], body: kopf.Body, memo: kopf.Memo, replicas: int
) -> tuple[int, str]:
    """The workers per pod the brokers are to run now, and what lowering the count still
    waits for ("" for nothing); `replicas`: the brokers running.

    Raising spec.workersPerPod takes it at once (placement moves partitions to the new
    workers), and undrains the workers an earlier lowering drained. Lowering it first drains,
    through the admin API, every worker that goes (worker w >= the new count of each broker:
    `<broker>~<w>`), and applies the new count only once none of them hosts a partition
    replica, so a partition of replication factor 1 moves to a staying worker, with its
    records, before the only process that holds it is gone (docs/workers.md)."""
    name, namespace = manifests.names(cluster)
    wanted = int(manifests.spec_of(cluster)["workersPerPod"])
    found = await kube.get("v1", "ConfigMap", namespace, manifests.config_map_name(name))
    if found is None:
        return wanted, ""  # a new cluster: nothing runs yet
    text = str((found.get("data") or {}).get(settings.variable(settings.WORKERS), "1"))
    current = int(text) if text.isdigit() and int(text) > 0 else wanted
    brokers = [node_id(cluster, ordinal) for ordinal in range(replicas)]
    if wanted >= current:
        # workers an earlier lowering drained that the pods run again (a raise, or a
        # lowering given up)
        staying = {worker_id(b, w) for b in brokers for w in range(1, wanted)}
        returning = [worker_id(b, w) for b in brokers for w in range(max(current, 1), wanted)]
        if staying:
            await _undrain_nodes(memo, cluster, body, returning, staying)
        return wanted, ""
    leaving = [worker_id(b, w) for b in brokers for w in range(wanted, current)]
    try:
        async with await _admin(memo, cluster) as client:
            members = {m.id: m for m in (await client.cluster()).members}
            left = 0
            for worker in leaving:
                if worker not in members:
                    continue  # its broker does not run it: nothing of it to move
                if not members[worker].draining:
                    await client.drain(worker)
                left += len((await client.node_partitions(worker)).partitions)
    except LaminarError as e:
        message = f"lowering workersPerPod to {wanted} waits for the brokers: {e}"
        _event(memo, body, "Warning", "WorkersDrainWaiting", message)
        return current, message
    if left:
        message = (
            f"lowering workersPerPod from {current} to {wanted}: draining "
            f"{', '.join(leaving)}; {left} partition replicas left"
        )
        _event(memo, body, "Normal", "DrainingWorkers", message)
        return current, message
    message = f"{', '.join(leaving)} drained: the pods run {wanted} workers each"
    _event(memo, body, "Normal", "WorkersDrained", message)
    return wanted, ""


@kopf.timer(GROUP, VERSION, "laminarclusters", interval=STATUS_INTERVAL_S, initial_delay=1.0)
async def cluster_status(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    kube: KubeClient = memo.kube
    name, namespace = body.metadata["name"], body.metadata["namespace"]
    try:
        sts = await kube.get("apps/v1", "StatefulSet", namespace, name)
    except KubeError as e:
        what = f"reading {namespace}/{name}'s StatefulSet: {e}"
        raise kopf.TemporaryError(what, delay=BACKOFF_S) from e
    wanted = int(body.spec.get("replicas", 3))
    state = (sts or {}).get("status") or {}
    replicas, ready = int(state.get("replicas", 0)), int(state.get("readyReplicas", 0))
    status = dict(body.status)
    changes: dict[str, Any] = {
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": manifests.selector(name),
    }
    running = int(((sts or {}).get("spec") or {}).get("replicas", wanted))
    reported = _reported(dict(body))
    moving = int(status.get("rebalancingPartitions") or 0) if reported else 0
    joining = _joining(dict(body), wanted) if reported else []
    if running > wanted:
        changes["phase"] = "ScalingDown"
    elif moving or joining:
        changes["phase"] = "Rebalancing"
    else:
        changes["phase"] = "Running" if ready >= wanted and replicas == wanted else "Pending"
    for key, value in changes.items():
        if status.get(key) != value:
            patch.status[key] = value
    _ready_condition(patch, body, ready, wanted)
    _placement_conditions(patch, body, reported, moving, joining)
    if manifests.tls_enabled(dict(body)) and sts is not None:
        try:  # the CA rotated when asked or due; the brokers' certificate renewed in place
            await _rotate_ca(kube, memo, dict(body), body, patch)  # once a third of its
            await _ensure_tls(kube, memo, dict(body), body, patch, restore=False)  # life is left
        except KubeError as e:
            raise kopf.TemporaryError(f"renewing {namespace}/{name}'s certificate: {e}") from e


def _ready_condition(patch: kopf.Patch, body: kopf.Body, ready: int, wanted: int) -> None:
    """Ready, kept apart from the last reconcile's result: False while that failed (its
    reason kept, from the generation it failed on); else whether the brokers are ready, as of
    the generation last applied (status.observedGeneration). So `kubectl wait
    --for=condition=Ready` never passes for a spec that was not applied."""
    reconciled = condition(body, "ReconcileSuccess")
    if reconciled is not None and reconciled["status"] == "False":
        failed = reconciled.get("observedGeneration")
        reason, message = "ReconcileFailed", reconciled["message"]
        _set_condition(patch, body, "Ready", "False", reason, message, generation=failed)
        return
    applied = body.status.get("observedGeneration")
    if applied is None:
        return  # not reconciled yet: nothing to be ready as of
    state, reason = ("True", "AllBrokersReady") if ready >= wanted else ("False", "BrokersNotReady")
    _set_condition(patch, body, "Ready", state, reason, f"{ready}/{wanted} ready", applied)


def _joining(cluster: dict[str, Any], wanted: int) -> list[str]:
    """The brokers of the first `wanted` ordinals the brokers' report does not show alive
    (none when the report lists no members)."""
    members = (cluster.get("status") or {}).get("members")
    if members is None:
        return []
    alive = {m["name"] for m in members if m.get("state") == "alive"}
    try:
        expected = [node_id(cluster, ordinal) for ordinal in range(wanted)]
    except IndexError:  # node ids listed for fewer brokers than wanted (tests)
        return []
    return [node for node in expected if node not in alive]


def _placement_conditions(
    patch: kopf.Patch, body: kopf.Body, reported: bool, moving: int, joining: list[str]
) -> None:
    """Rebalancing and Degraded, from what the brokers last reported (as of the generation
    last applied)."""
    applied = body.status.get("observedGeneration")
    if not reported:
        why = f"no broker has reported for {STALE_REPORT_S:.0f} s"
        _set_condition(patch, body, "Rebalancing", "Unknown", "NoRecentReport", why, applied)
        _set_condition(patch, body, "Degraded", "Unknown", "NoRecentReport", why, applied)
        return
    if moving:
        message = f"{moving} partitions moving to the brokers placement chose"
        _set_condition(patch, body, "Rebalancing", "True", "PartitionsMoving", message, applied)
    elif joining:
        message = f"waiting for {', '.join(joining)} to join the cluster"
        _set_condition(patch, body, "Rebalancing", "True", "BrokersJoining", message, applied)
    else:
        message = "every led partition is on the brokers placement chose"
        _set_condition(patch, body, "Rebalancing", "False", "Converged", message, applied)
    under = int(body.status.get("underReplicated") or 0)
    if under:
        message = f"{under} partitions have fewer in-sync replicas than their replication factor"
        _set_condition(patch, body, "Degraded", "True", "UnderReplicated", message, applied)
    else:
        _set_condition(patch, body, "Degraded", "False", "FullyReplicated", "", applied)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(
    patch: kopf.Patch,
    body: kopf.Body,
    kind: str,
    state: str,
    reason: str,
    message: str,
    generation: int | None = None,
) -> None:
    """Set one condition, computed from `generation` (default: the object's, the spec being
    reconciled; a timer passes status.observedGeneration, the spec last applied), following
    the Kubernetes conventions: the transition time moves only when the status does.

    The condition is written as a JSON patch of the freshest object, guarded by its
    resourceVersion (kopf retries on a conflict): a timer and a handler running at once each
    change their own conditions, never drop the other's."""
    if generation is None:
        generation = body.metadata.get("generation")
    message = message[:MAX_CONDITION_MESSAGE]

    def upsert(fresh: Any) -> None:
        status = fresh.setdefault("status", {})
        conditions = list(status.get("conditions") or [])
        old = next((c for c in conditions if c.get("type") == kind), None)
        shown = (state, reason, message, generation)
        if old and tuple(old.get(k) for k in CONDITION_KEYS) == shown:
            return
        now = _now()
        since = now if old is None or old["status"] != state else old["lastTransitionTime"]
        new: dict[str, Any] = {
            "type": kind,
            "status": state,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
        }
        if generation is not None:
            new["observedGeneration"] = generation
        status["conditions"] = [new if c is old else c for c in conditions] + ([] if old else [new])

    patch.fns.append(upsert)


def condition(body: Any, kind: str) -> dict[str, Any] | None:
    """The object's condition of type `kind`, if set."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((dict(c) for c in conditions if c.get("type") == kind), None)


def _event(memo: kopf.Memo, body: kopf.Body, kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event (`kind` Normal or Warning) on the object, unless the spam filter
    (events.EventLimiter: repeats and bursts) holds it back."""
    if memo.events.allow(body.metadata["uid"], reason, message, time.monotonic()):
        kopf.event(body, type=kind, reason=reason, message=message[:MAX_EVENT_MESSAGE])


# ---- topics ----------------------------------------------------------------------------------

#: A LaminarCluster annotation with the brokers' API URLs (comma-separated), for clusters whose
#: brokers the operator cannot reach through the client Service (tests, other networks).
BROKERS_ANNOTATION = f"{GROUP}/brokers"
#: A LaminarCluster annotation with the broker node id of each ordinal (comma-separated), for
#: brokers not run by its StatefulSet (tests); by default a node id is the pod's name.
NODE_IDS_ANNOTATION = f"{GROUP}/node-ids"
#: How long a Topic's deletion waits for unreachable brokers before it lets go (the Laminar
#: topic is then left behind; the namespace is not held forever).
DELETE_TIMEOUT_S = 300.0
ADMIN_TIMEOUT_S = 10.0
TOPIC_STATUS_INTERVAL_S = 3.0
#: A topic spec the brokers refused is tried again this often (it may pass later: a
#: replication factor waiting for more brokers).
REJECTED_RETRY_S = 60.0
#: Brokers report at least this often (a heartbeat in the LaminarCluster's status.reportedAt);
#: past it the operator reads topic status from the brokers itself.
STALE_REPORT_S = 90.0


def brokers_of(cluster: dict[str, Any]) -> list[str]:
    annotations = cluster["metadata"].get("annotations") or {}
    listed = annotations.get(BROKERS_ANNOTATION)
    if listed:
        return [url.strip() for url in listed.split(",") if url.strip()]
    name, namespace = manifests.names(cluster)
    return [f"{manifests.api_scheme(cluster)}://{name}.{namespace}.svc:{manifests.API_PORT}"]


def _annotated_hosts(cluster: dict[str, Any]) -> list[str]:
    """The hosts of the brokers' URLs BROKERS_ANNOTATION lists (the certificate names them too:
    the operator verifies the brokers by the names it calls them by)."""
    annotations = cluster["metadata"].get("annotations") or {}
    if not annotations.get(BROKERS_ANNOTATION):
        return []
    hosts = (urllib.parse.urlsplit(url).hostname for url in brokers_of(cluster))
    return sorted({host for host in hosts if host})


async def _admin(memo: kopf.Memo, cluster: dict[str, Any]) -> AsyncClient:
    """A client of the cluster's brokers, verifying them with the cluster's CA (TLS on), as
    the operator's principal (an admin: its token, `_operator_token`)."""
    context = None
    if manifests.tls_enabled(cluster):
        context = (await _cluster_ca(memo.kube, memo, cluster))[1]
    token = await _operator_token(memo.kube, memo, cluster)
    return AsyncClient(
        brokers_of(cluster), timeout_s=ADMIN_TIMEOUT_S, ssl_context=context, token=token
    )


# ---- client credentials ------------------------------------------------------------------------


async def _operator_token(kube: KubeClient, memo: kopf.Memo, cluster: dict[str, Any]) -> str:
    """The operator's token for the cluster's brokers (docs/kubernetes.md, "Client
    credentials"): made once, with the cluster's credentials, and kept in a Secret of the
    operator's own namespace (`laminar-token-<uid>`, read back by name: the operator reads no
    Secret of the clusters' namespaces, theirs included, and never their credentials)."""
    uid = cluster["metadata"]["uid"]
    cached = memo.tokens.get(uid)
    if cached is not None and time.monotonic() - cached[0] < CA_CACHE_S:
        return str(cached[1])
    _, namespace = manifests.names(cluster)
    where = memo.ca_namespace or namespace
    secret_name = manifests.operator_token_secret_name(uid)
    found = await kube.get("v1", "Secret", where, secret_name)
    if found is None:
        made = manifests.operator_token_secret(cluster, where, new_token())
        if await kube.create(made) is None:  # made meanwhile: that one is the token
            found = await kube.get("v1", "Secret", where, secret_name)
            if found is None:
                raise KubeError(404, f"the token Secret {where}/{secret_name} vanished")
        else:
            found = made
    token = base64.b64decode((found.get("data") or {}).get("token", "")).decode().strip()
    if not token:
        raise KubeError(422, f"the Secret {where}/{secret_name} holds no token")
    memo.tokens[uid] = (time.monotonic(), token)
    return token


@kopf.on.delete(GROUP, VERSION, "laminarclusters", optional=True)
async def forget_operator_token(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The deleted cluster's operator token, deleted from the operator's namespace (best
    effort, as its CA key; in the cluster's namespace its owner reference collects it)."""
    uid = body.metadata["uid"]
    memo.tokens.pop(uid, None)
    where = memo.ca_namespace
    if where and where != body.metadata["namespace"]:
        await memo.kube.delete("v1", "Secret", where, manifests.operator_token_secret_name(uid))


# ---- TLS ---------------------------------------------------------------------------------------


async def _cluster_ca(
    kube: KubeClient, memo: kopf.Memo, cluster: dict[str, Any]
) -> tuple[CaState, ssl.SSLContext]:
    """The cluster's CA (made and kept the first time; ca_rotation.CaState: the signer, and
    what is trusted) and a client context trusting its bundle."""
    uid = cluster["metadata"]["uid"]
    cached = memo.cas.get(uid)
    if cached is not None and time.monotonic() - cached[0] < CA_CACHE_S:
        return cached[1], cached[2]
    name, namespace = manifests.names(cluster)
    where = memo.ca_namespace or namespace
    secret_name = manifests.ca_key_secret_name(uid)
    found = await kube.get("v1", "Secret", where, secret_name)
    if found is None:
        state = CaState.new(certs.make_ca(f"laminar {namespace}/{name}"))
        made = manifests.ca_key_secret(cluster, where, state.to_data())
        if await kube.create(made) is None:  # made meanwhile: that one is the CA
            found = await kube.get("v1", "Secret", where, secret_name)
            if found is None:
                raise KubeError(404, f"the CA Secret {where}/{secret_name} vanished")
    if found is not None:
        try:
            state = CaState.from_data(found.get("data") or {})
        except ValueError as e:
            raise KubeError(422, f"the CA Secret {where}/{secret_name} is unusable: {e}") from e
    return state, _remember_ca(memo, uid, state)


def _remember_ca(memo: kopf.Memo, uid: str, state: CaState) -> ssl.SSLContext:
    context = client_context(cadata=state.bundle.decode())
    memo.cas[uid] = (time.monotonic(), state, context)
    return context


async def _store_ca(
    kube: KubeClient, memo: kopf.Memo, cluster: dict[str, Any], state: CaState
) -> None:
    _, namespace = manifests.names(cluster)
    where = memo.ca_namespace or namespace
    await kube.apply(manifests.ca_key_secret(cluster, where, state.to_data()))
    _remember_ca(memo, cluster["metadata"]["uid"], state)


def _certificate_due(state: Any, ca: CaState) -> bool:
    """Whether the brokers need a new certificate: none recorded, one of another CA, one
    published with another CA bundle, or less than a third of its lifetime left."""
    try:
        not_before = datetime.datetime.fromisoformat(state["notBefore"].replace("Z", "+00:00"))
        not_after = datetime.datetime.fromisoformat(state["notAfter"].replace("Z", "+00:00"))
        fingerprint = state["caFingerprint"]
        trusted = state.get("trustedCaFingerprints") or [fingerprint]
    except (KeyError, TypeError, AttributeError, ValueError):
        return True
    if fingerprint != certs.fingerprint(ca.signer.cert_pem) or trusted != ca.fingerprints:
        return True
    return certs.renewal_due(not_before, not_after)


async def _ensure_tls(
    kube: KubeClient,
    memo: kopf.Memo,
    cluster: dict[str, Any],
    body: kopf.Body,
    patch: kopf.Patch,
    *,
    restore: bool,
) -> None:
    """The cluster's CA bundle and its brokers' certificate: issued when due (status.tls says
    what the Secret holds; it is never read back), updated in place; with `restore`
    (reconciling) the CA's public Secret applied and a missing certificate Secret made again.

    The reconcile and the status timer both come here, each with the object as it was when it
    started, and each status patch lands only when its handler ends: so one at a time per
    cluster, and what was issued last is remembered (`_issued`) until status.tls says so, lest
    both issue a certificate and status.tls name the one the Secret no longer holds."""
    name, namespace = manifests.names(cluster)
    uid = cluster["metadata"]["uid"]
    async with memo.tls_locks.setdefault(uid, asyncio.Lock()):
        ca, _ = await _cluster_ca(kube, memo, cluster)
        published = body.status.get("tls")
        state = _issued(published, memo.issued.get(uid))
        due = _certificate_due(state, ca)
        if not (due or restore):
            _republish(patch, published, state)
            return
        await kube.apply(manifests.ca_secret(cluster, ca.bundle))  # before a certificate needs it
        names = [*manifests.broker_names(name, namespace), *_annotated_hosts(cluster)]
        pair = certs.issue(ca.signer, f"{name}.{namespace}", names, memo.cert_lifetime)
        secret = manifests.tls_secret(cluster, pair.cert_pem, pair.key_pem, ca.bundle)
        if due:
            await kube.apply(secret)
        elif await kube.create(secret) is None:
            _republish(patch, published, state)
            return  # there, and not due: left as it is
        cert = pair.certificate
        issued = {
            "notBefore": cert.not_valid_before_utc.strftime(TIME_FORMAT),
            "notAfter": cert.not_valid_after_utc.strftime(TIME_FORMAT),
            "serial": format(cert.serial_number, "x"),
            "fingerprint": certs.fingerprint(pair.cert_pem),
            "caFingerprint": certs.fingerprint(ca.signer.cert_pem),
            "caNotAfter": ca.signer.not_after.strftime(TIME_FORMAT),
            "trustedCaFingerprints": ca.fingerprints,
        }
        memo.issued[uid] = issued
        _patch_tls(patch, issued)
    if state:
        message = f"the brokers' certificate renewed (until {issued['notAfter']})"
        _event(memo, body, "Normal", "CertificateRenewed", message)


def _issued(published: Any, remembered: dict[str, Any] | None) -> Any:
    """The brokers' certificate last issued: what status.tls says, or what this operator
    issued after it (its patch not landed yet), whichever is newer."""
    if remembered is None or not isinstance(published, dict):
        return remembered or published
    if published.get("serial") == remembered["serial"]:
        return published
    newer = str(published.get("notBefore") or "") > remembered["notBefore"]
    return published if newer else remembered


def _republish(patch: kopf.Patch, published: Any, state: Any) -> None:
    """status.tls set to the certificate last issued where it does not say so yet (a patch
    of another handler, not landed or lost)."""
    if state and state is not published:
        _patch_tls(patch, dict(state))


async def _rotate_ca(
    kube: KubeClient, memo: kopf.Memo, cluster: dict[str, Any], body: kopf.Body, patch: kopf.Patch
) -> None:
    """One step of the CA's rotation when one is due or under way (ca_rotation: the states);
    `_ensure_tls`, run next, publishes what the step changed."""
    name, namespace = manifests.names(cluster)
    ca, _ = await _cluster_ca(kube, memo, cluster)
    tls = dict(body.status.get("tls") or {})
    rotation = dict(tls.get("caRotation") or {})
    now = datetime.datetime.now(datetime.UTC)
    annotations = body.metadata.get("annotations") or {}
    request = annotations.get(ca_rotation.ROTATE_ANNOTATION)
    if ca.phase == ca_rotation.IDLE:
        reason = ca_rotation.rotation_reason(ca, request, tls.get("rotateCaRequest"))
        if reason is None:
            if rotation:
                _patch_tls(patch, {"caRotation": None})
            return
        ca = ca.begin(f"laminar {namespace}/{name}")
        await _store_ca(kube, memo, cluster, ca)
        _patch_tls(patch, {
            "rotateCaRequest": request,
            "caRotation": {"phase": ca.phase, "since": now.strftime(TIME_FORMAT)},
        })  # fmt: skip
        message = f"rotating the CA: {reason}; the new CA is trusted first"
        _event(memo, body, "Normal", "CaRotationStarted", message)
        return
    if rotation.get("phase") != ca.phase or "since" not in rotation:
        # a step the status does not show yet (an operator restarted, a CA edited by hand)
        _patch_tls(patch, {"caRotation": {"phase": ca.phase, "since": now.strftime(TIME_FORMAT)}})
        return
    since = datetime.datetime.fromisoformat(rotation["since"].replace("Z", "+00:00"))
    if ca.phase == ca_rotation.TRUSTING and now - since < memo.ca_dwell:
        return
    issued = tls.get("fingerprint")
    if tls.get("caFingerprint") != certs.fingerprint(ca.signer.cert_pem):
        issued = None
    pending = ca_rotation.waiting_for(ca, await _brokers_tls(memo, cluster), issued)
    if pending:
        waiting = "; ".join(pending)[:500]
        if rotation.get("waitingFor") != waiting:
            _patch_tls(patch, {"caRotation": {**rotation, "waitingFor": waiting}})
        return
    if ca.phase == ca_rotation.TRUSTING:
        ca = ca.promote()
        await _store_ca(kube, memo, cluster, ca)
        _patch_tls(patch, {"caRotation": {"phase": ca.phase, "since": now.strftime(TIME_FORMAT)}})
        message = "every broker trusts the new CA: it signs their certificate now"
        _event(memo, body, "Normal", "CaRotationSigning", message)
    else:
        ca = ca.retire()
        await _store_ca(kube, memo, cluster, ca)
        _patch_tls(patch, {"caRotation": None})
        message = "every broker serves a certificate of the new CA: the old CA is dropped"
        _event(memo, body, "Normal", "CaRotated", message)


def _patch_tls(patch: kopf.Patch, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` merged into the status.tls this patch sets (None deletes a field)."""
    merged = {**(patch.status.get("tls") or {}), **fields}
    patch.status["tls"] = merged
    return merged


async def _brokers_tls(memo: kopf.Memo, cluster: dict[str, Any]) -> list[NodeTls | str]:
    """Each alive broker's TLS state, or why it could not be read."""
    reports: list[NodeTls | str] = []
    try:
        async with await _admin(memo, cluster) as client:
            members = (await client.cluster()).members
            for member in members:
                if member.state != "alive":
                    continue
                try:
                    reports.append(await client.node_tls(member.id))
                except LaminarError as e:
                    reports.append(f"{member.id}: {e}")
    except LaminarError as e:
        reports.append(f"the brokers: {e}")
    return reports


@kopf.on.delete(GROUP, VERSION, "laminarclusters", optional=True)
async def forget_cluster_ca(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The deleted cluster's CA key, deleted from the operator's namespace (best effort: no
    finalizer holds the cluster for it; in the cluster's namespace its owner reference
    collects it)."""
    uid = body.metadata["uid"]
    for remembered in (memo.cas, memo.issued, memo.tls_locks):
        remembered.pop(uid, None)
    where = memo.ca_namespace
    if where and where != body.metadata["namespace"]:
        await memo.kube.delete("v1", "Secret", where, manifests.ca_key_secret_name(uid))


async def _cluster_of(kube: KubeClient, body: kopf.Body) -> dict[str, Any] | None:
    name = body.spec.get("cluster", "")
    return await kube.get(manifests.API_VERSION, "LaminarCluster", body.metadata["namespace"], name)


@kopf.on.resume(GROUP, VERSION, "topics")
@kopf.on.create(GROUP, VERSION, "topics")
@kopf.on.update(GROUP, VERSION, "topics", field="spec")
async def reconcile_topic(body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any) -> None:
    """The brokers' topic created or altered to the spec. ReconcileSuccess says how that went,
    with the broker's own reason when it refused; Ready is True once it went, and the topic
    matches the spec (SpecMismatch says where an adopted topic does not)."""
    name = body.metadata["name"]
    cluster = await _cluster_of(memo.kube, body)
    if cluster is None:
        message = f"LaminarCluster {body.spec.get('cluster')!r} not found in this namespace"
        _topic_failed(memo, patch, body, "ClusterNotFound", message)
        raise kopf.TemporaryError(message, delay=BACKOFF_S)
    want = topics.wanted(body.spec, cluster.get("spec") or {})
    done = ""
    try:
        async with await _admin(memo, cluster) as client:
            try:
                have = await client.describe_topic(name)
            except NotFound:
                have = await client.create_topic(
                    name, want.partitions, want.replication_factor, want.config
                )
                done = "TopicCreated"
            else:
                done = "TopicAdopted" if body.status.get("observedGeneration") is None else ""
                if alter := topics.changes(want, have):
                    have = await client.alter_topic(name, **alter)
                    done = "TopicAltered"
    except BadRequest as e:  # the broker refuses the spec; may pass later (more brokers)
        _topic_failed(memo, patch, body, "Rejected", str(e))
        raise kopf.TemporaryError(f"topic {name}: {e}", delay=REJECTED_RETRY_S) from e
    except (Unauthorized, Forbidden) as e:  # retried: the brokers may not have re-read yet
        _topic_failed(memo, patch, body, "Unauthorized", f"{e}: {NOT_ADMITTED}")
        raise kopf.TemporaryError(f"topic {name}: {e}: {NOT_ADMITTED}", delay=BACKOFF_S) from e
    except LaminarError as e:
        _topic_failed(memo, patch, body, "BrokersUnreachable", str(e))
        raise kopf.TemporaryError(f"topic {name}: {e}", delay=BACKOFF_S) from e
    for key, value in topic_status(have).items():
        patch.status[key] = value
    generation = body.metadata.get("generation")
    patch.status["observedGeneration"] = generation
    shape = f"{have.partitions} partitions, replication factor {have.replication_factor}"
    applied = f"generation {generation} applied: {shape}"
    _set_condition(patch, body, "ReconcileSuccess", "True", "Applied", applied)
    if done:
        _event(memo, body, "Normal", done, f"{DONE[done]}: {shape}")
    differs = topics.mismatch(body.spec, want, have)
    if differs:
        _set_condition(patch, body, "SpecMismatch", "True", "AdoptedTopicDiffers", differs)
        _set_condition(patch, body, "Ready", "False", "SpecMismatch", differs)
        _event(memo, body, "Warning", "SpecMismatch", differs)
        return
    if condition(body, "SpecMismatch") is not None:
        _set_condition(patch, body, "SpecMismatch", "False", "Matches", "")
    _set_condition(patch, body, "Ready", "True", "Created", shape)


#: The event each outcome of reconcile_topic posts.
DONE = {
    "TopicCreated": "created on the brokers",
    "TopicAdopted": "adopted: the brokers had it already",
    "TopicAltered": "altered on the brokers",
}


def _topic_failed(
    memo: kopf.Memo, patch: kopf.Patch, body: kopf.Body, reason: str, message: str
) -> None:
    """A reconcile of the Topic failed: ReconcileSuccess and Ready False with the real reason
    (the status timer leaves both alone until a reconcile succeeds), and a Warning event."""
    _set_condition(patch, body, "ReconcileSuccess", "False", reason, message)
    _set_condition(patch, body, "Ready", "False", reason, message)
    _event(memo, body, "Warning", reason, message)


@kopf.on.delete(GROUP, VERSION, "topics")
async def delete_topic(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    name = body.metadata["name"]
    cluster = await _cluster_of(memo.kube, body)
    if cluster is None or cluster["metadata"].get("deletionTimestamp"):
        memo.events.forget(body.metadata["uid"])
        return  # the cluster (and its data) is gone or going: nothing to delete
    try:
        async with await _admin(memo, cluster) as client:
            await client.delete_topic(name)
    except NotFound:
        memo.events.forget(body.metadata["uid"])
        return
    except LaminarError as e:
        deleting = body.metadata.get("deletionTimestamp") or _now()
        since = datetime.datetime.fromisoformat(deleting.replace("Z", "+00:00"))
        waited = (datetime.datetime.now(datetime.UTC) - since).total_seconds()
        if waited >= DELETE_TIMEOUT_S:
            _event(memo, body, "Warning", "TopicLeftBehind", f"brokers unreachable: {e}")
            memo.events.forget(body.metadata["uid"])
            return
        _event(memo, body, "Warning", "DeleteWaiting", f"deleting the topic waits: {e}")
        raise kopf.TemporaryError(f"deleting topic {name}: {e}", delay=BACKOFF_S) from e
    _event(memo, body, "Normal", "TopicDeleted", "deleted from the brokers")
    memo.events.forget(body.metadata["uid"])


@kopf.timer(GROUP, VERSION, "topics", interval=TOPIC_STATUS_INTERVAL_S, initial_delay=1.0)
async def refresh_topic_status(
    body: kopf.Body, memo: kopf.Memo, patch: kopf.Patch, **_: Any
) -> None:
    """The fallback: while no broker of the cluster has reported for STALE_REPORT_S (brokers
    without Kubernetes access, or all down), read the topic from the brokers here. Ready is
    touched only once a reconcile succeeded: a failed one's reason stays (the broker's own
    words), and it is only the reconcile's retry that changes it."""
    cluster = await _cluster_of(memo.kube, body)
    if cluster is None or body.metadata.get("deletionTimestamp") or _reported(cluster):
        return
    reconciled = condition(body, "ReconcileSuccess")
    if reconciled is None or reconciled["status"] != "True":
        return
    applied = body.status.get("observedGeneration")
    try:
        async with await _admin(memo, cluster) as client:
            have = await client.describe_topic(body.metadata["name"])
    except NotFound:
        message = "the brokers have no such topic (deleted there, not through this object)"
        _set_condition(patch, body, "Ready", "False", "TopicMissing", message, applied)
        _event(memo, body, "Warning", "TopicMissing", message)
        return
    except LaminarError as e:
        _set_condition(patch, body, "Ready", "False", "BrokersUnreachable", str(e), applied)
        return
    for key, value in topic_status(have).items():
        if body.status.get(key) != value:
            patch.status[key] = value
    ready = condition(body, "Ready")
    if ready is not None and ready["reason"] in ("TopicMissing", "BrokersUnreachable"):
        shape = f"{have.partitions} partitions, replication factor {have.replication_factor}"
        _set_condition(patch, body, "Ready", "True", "Created", shape, applied)


def _reported(cluster: dict[str, Any]) -> bool:
    """Has a broker of `cluster` reported status within STALE_REPORT_S?"""
    reported = (cluster.get("status") or {}).get("reportedAt")
    if not reported:
        return False
    since = datetime.datetime.fromisoformat(reported.replace("Z", "+00:00"))
    return (datetime.datetime.now(datetime.UTC) - since).total_seconds() < STALE_REPORT_S
