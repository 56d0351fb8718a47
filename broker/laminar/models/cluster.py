"""The cluster and its nodes in JSON (docs/api.md, "Cluster" and "Nodes"): `GET /v1/cluster`,
`/v1/nodes/{id}/partitions` and `/tls`, and the node administration calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from ..contract import MAX_WEIGHT
from .checks import (
    JsonObject,
    ModelError,
    boolean,
    integer,
    is_int,
    json_object,
    objects,
    optional_integer,
    optional_string,
    string,
    strings,
)


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the cluster as SWIM sees it, with its placement weight and drain."""

    SCHEMA: ClassVar[str] = "#/components/schemas/Member"

    id: str
    api_url: str
    #: alive, suspect, dead or left
    state: str
    weight: int = 1
    draining: bool = False
    #: host:port of its peer (Raft) transport
    peer_addr: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "api_url": self.api_url}
        if self.peer_addr is not None:
            out["peer_addr"] = self.peer_addr
        out.update(state=self.state, weight=self.weight, draining=self.draining)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj, "a member must be an object")
        return cls(
            id=string(obj, "id"),
            api_url=string(obj, "api_url"),
            state=string(obj, "state"),
            weight=integer(obj, "weight"),
            draining=boolean(obj, "draining"),
            peer_addr=optional_string(obj, "peer_addr"),
        )


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """`GET /v1/cluster`: the members, the broker that answered, the metadata leader."""

    SCHEMA: ClassVar[str] = "#/components/schemas/Cluster"

    cluster_id: str
    node_id: str
    metadata_leader: str | None
    members: tuple[Member, ...]
    #: the JSON object this was read from (empty when made here): fields a newer broker adds
    raw: JsonObject = field(default_factory=dict, repr=False, compare=False)

    def member(self, node_id: str) -> Member | None:
        return next((m for m in self.members if m.id == node_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "node_id": self.node_id,
            "metadata_leader": self.metadata_leader,
            "members": [m.to_json() for m in self.members],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(
            cluster_id=string(obj, "cluster_id"),
            node_id=string(obj, "node_id"),
            metadata_leader=optional_string(obj, "metadata_leader"),
            members=tuple(Member.from_json(m) for m in objects(obj, "members")),
            raw=obj,
        )


@dataclass(frozen=True, slots=True)
class HostedPartition:
    """A partition replica a node hosts, as that node sees it."""

    SCHEMA: ClassVar[str] = "#/components/schemas/HostedPartition"

    topic: str
    partition: int
    #: the node's role in the partition's Raft group: leader, follower, candidate, learner
    role: str
    leader: str | None
    term: int
    voters: tuple[str, ...]
    learners: tuple[str, ...]
    in_sync: tuple[str, ...]
    log_start: int
    commit_index: int
    log_end: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "role": self.role,
            "leader": self.leader,
            "term": self.term,
            "voters": list(self.voters),
            "learners": list(self.learners),
            "in_sync": list(self.in_sync),
            "log_start": self.log_start,
            "commit_index": self.commit_index,
            "log_end": self.log_end,
            "bytes": self.bytes,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj, "a hosted partition must be an object")
        return cls(
            topic=string(obj, "topic"),
            partition=integer(obj, "partition"),
            role=string(obj, "role"),
            leader=optional_string(obj, "leader"),
            term=integer(obj, "term"),
            voters=strings(obj, "voters"),
            learners=strings(obj, "learners"),
            in_sync=strings(obj, "in_sync"),
            log_start=integer(obj, "log_start"),
            commit_index=integer(obj, "commit_index"),
            log_end=integer(obj, "log_end"),
            bytes=integer(obj, "bytes"),
        )


@dataclass(frozen=True, slots=True)
class NodePartitions:
    """`GET /v1/nodes/{id}/partitions`: the partition replicas node `node_id` hosts."""

    SCHEMA: ClassVar[str] = "#/components/schemas/NodePartitions"

    node_id: str
    partitions: tuple[HostedPartition, ...]

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        hosted = objects(obj, "partitions")
        return cls(string(obj, "node_id"), tuple(HostedPartition.from_json(p) for p in hosted))


@dataclass(frozen=True, slots=True)
class NodeTls:
    """`GET /v1/nodes/{id}/tls`: what a broker's TLS has loaded (fingerprints are SHA-256 of
    the DER encoding, hex; `not_after` is RFC 3339 UTC). Without TLS `enabled` is False and
    the rest empty: the JSON then carries `node_id` and `enabled` only."""

    SCHEMA: ClassVar[str] = "#/components/schemas/NodeTls"

    node_id: str
    enabled: bool
    #: the certificate's (JSON: `certificate.fingerprint`, `certificate.not_after`)
    fingerprint: str = ""
    not_after: str = ""
    trusted_cas: tuple[str, ...] = ()
    reloads: int = 0
    reload_error: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node_id": self.node_id, "enabled": self.enabled}
        if self.enabled:
            out["certificate"] = {"fingerprint": self.fingerprint, "not_after": self.not_after}
            out["trusted_cas"] = list(self.trusted_cas)
            out["reloads"] = self.reloads
            out["reload_error"] = self.reload_error
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        certificate = json_object(obj.get("certificate") or {}, "certificate must be an object")
        return cls(
            node_id=string(obj, "node_id"),
            enabled=boolean(obj, "enabled"),
            fingerprint=optional_string(certificate, "fingerprint") or "",
            not_after=optional_string(certificate, "not_after") or "",
            trusted_cas=strings(obj, "trusted_cas") if "trusted_cas" in obj else (),
            reloads=optional_integer(obj, "reloads") or 0,
            reload_error=optional_string(obj, "reload_error") or "",
        )


@dataclass(frozen=True, slots=True)
class NodeAdminState:
    """A node's drain and placement weight: the answer of the node administration calls."""

    SCHEMA: ClassVar[str] = "#/components/schemas/NodeAdminState"

    node: str
    draining: bool
    weight: int

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "draining": self.draining, "weight": self.weight}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(string(obj, "node"), boolean(obj, "draining"), integer(obj, "weight"))


@dataclass(frozen=True, slots=True)
class WeightRequest:
    """`PUT /v1/nodes/{id}/weight`: the node's new placement weight (0: it hosts nothing)."""

    SCHEMA: ClassVar[str] = "#/components/schemas/WeightRequest"

    weight: int

    def to_json(self) -> dict[str, Any]:
        return {"weight": self.weight}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        weight = obj.get("weight") if isinstance(obj, dict) else None
        if not is_int(weight) or not 0 <= weight <= MAX_WEIGHT:
            raise ModelError(f"weight must be an integer in [0, {MAX_WEIGHT}]")
        return cls(weight)


@dataclass(frozen=True, slots=True)
class Handoff:
    """`POST /v1/nodes/{id}/handoff`: how many Raft groups the node still leads."""

    SCHEMA: ClassVar[str] = (
        "#/paths/~1v1~1nodes~1{id}~1handoff/post/responses/200/content/application~1json/schema"
    )

    node: str
    leading: int

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "leading": self.leading}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        return cls(string(obj, "node"), integer(obj, "leading"))


@dataclass(frozen=True, slots=True)
class MetadataCommitted:
    """(Brokers only) `POST /v1/metadata/commands`: the metadata log index at which the
    metadata leader committed and applied a forwarded command (laminar.server.forward); the
    broker that forwarded it waits until it has applied that far itself."""

    SCHEMA: ClassVar[str] = "#/components/schemas/MetadataCommitted"

    index: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index}

    @classmethod
    def from_json(cls, obj: Any) -> Self:
        obj = json_object(obj)
        index = integer(obj, "index")
        if index < 0:
            raise ModelError(f"index must be a non-negative integer, not {index}")
        return cls(index)
