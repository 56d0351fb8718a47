"""What the console's pages show, gathered cluster-wide by the broker the browser talks to.

Membership, topics and partitions come from this broker's own state (SWIM, the cluster
metadata, the partition status table), through the same functions the API's handlers use.
What lives on other brokers is fetched from them: their /metrics (rates, latencies, the XDP
router), the consumer groups of the partitions each leads (`GET /console/internal/groups`,
which only the brokers' own principal may call), records (the brokers' internal client, which
reads from an in-sync replica as any client does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import ClientSession, ClientTimeout

from ...models import PartitionState, ReadResult
from ...models.topics import is_under_replicated
from ...swim.member import MemberStatus
from ...workers import broker_of, worker_index
from ..api import STATUS_REFRESH_S
from .rates import Rates, Snapshot, parse_metrics, rates_between

if TYPE_CHECKING:
    from ..api import Api

log = logging.getLogger(__name__)
#: How long the console waits for another broker's answer.
FETCH_TIMEOUT_S = 2.0
#: Scrapes of the brokers' metrics younger than this are reused (pages and charts refresh
#: every few seconds, from any number of browsers).
SCRAPE_MAX_AGE_S = 1.0
#: Rates are between scrapes at most this far apart (after a quiet spell, the first scrape
#: starts afresh rather than averaging over the whole spell).
MAX_RATE_INTERVAL_S = 30.0
#: The path at which a broker serves the groups of the partitions it leads (to brokers).
INTERNAL_GROUPS_PATH = "/console/internal/groups"
#: A record browser's page: at most this many records, and bytes read.
MAX_BROWSE_RECORDS = 200
MAX_BROWSE_BYTES = 1 << 20
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class MemberRow:
    id: str
    api_url: str
    state: str
    alive: bool
    weight: int
    draining: bool
    #: partitions it leads and replicas it hosts, as it last reported them
    leads: int
    hosts: int
    metadata_leader: bool
    #: "loaded", "not loaded" or "unknown" (its metrics could not be read)
    xdp: str


@dataclass(frozen=True)
class PartitionRow:
    state: PartitionState
    bytes: int | None
    #: its topic's
    replication_factor: int

    @property
    def offline(self) -> bool:
        return self.state.leader is None

    @property
    def under_replicated(self) -> bool:
        """No leader, or fewer replicas in sync than the topic's replication factor (also
        when the replica set itself shrank: `is_under_replicated`)."""
        return self.offline or is_under_replicated(self.state.in_sync, self.replication_factor)


@dataclass(frozen=True)
class TopicRow:
    name: str
    partitions: int
    replication_factor: int
    under_replicated: int
    offline: int
    bytes: int


@dataclass(frozen=True)
class GroupRow:
    partition: int
    group: str
    cursor: int
    acquired: int
    pending: int
    dead_letter_pending: int
    accepted: int
    dead_lettered: int

    @property
    def lag(self) -> int:
        """Committed records from the cursor on that the group has neither accepted nor
        dead-lettered: not handed out, held, or rejected and awaiting their move."""
        return self.pending + self.acquired + self.dead_letter_pending

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "group": self.group,
            "cursor": self.cursor,
            "acquired": self.acquired,
            "pending": self.pending,
            "dead_letter_pending": self.dead_letter_pending,
            "accepted": self.accepted,
            "dead_lettered": self.dead_lettered,
        }

    @classmethod
    def from_json(cls, obj: Any) -> GroupRow:
        """(KeyError, TypeError or ValueError when `obj` is not one.)"""
        fields = ("cursor", "acquired", "pending", "dead_letter_pending", "accepted")
        values = [obj[name] for name in (*fields, "dead_lettered", "partition")]
        if not isinstance(obj["group"], str) or any(type(v) is not int for v in values):
            raise TypeError("not a group row")
        return cls(obj["partition"], obj["group"], *values[:6])


class Gatherer:
    """The console's reads of the cluster, through broker `api.broker`."""

    def __init__(self, api: Api, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.broker = api.broker
        self.clock = clock
        self._session: ClientSession | None = None
        self._scraped: tuple[float, dict[str, Snapshot | None]] | None = None
        self._scraping: asyncio.Future[dict[str, Snapshot | None]] | None = None
        #: the last two scrapes' times and snapshots, for the rates between them
        self._previous: tuple[float, dict[str, Snapshot]] | None = None
        self._last: tuple[float, dict[str, Snapshot]] | None = None
        self._rates: Rates | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ---- other brokers ---------------------------------------------------------------------

    async def _get(self, node: str, path: str, internal: bool = False) -> tuple[int, bytes]:
        """GET `path` of node `node`'s API: (status, body); (0, b"") when it did not answer."""
        address = self.broker.api_address_of(node)
        if address is None:
            return 0, b""
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=FETCH_TIMEOUT_S))
        headers = {"Authorization": f"Bearer {self.api.auth.internal_token}"} if internal else {}
        tls = self.broker.tls
        try:
            async with self._session.get(
                self.broker.api_url(address) + path,
                headers=headers,
                ssl=True if tls is None else tls.client(),
                allow_redirects=False,
            ) as response:
                return response.status, await response.read()
        except (OSError, TimeoutError, ValueError) as e:  # (aiohttp's errors are OSErrors)
            log.debug("console: GET %s of %s failed: %s", path, node, e)
            return 0, b""

    def brokers(self) -> list[str]:
        """The cluster's alive brokers (worker 0 of each, which serves its /metrics)."""
        return sorted(
            node
            for node, (status, _, _) in self.broker.members().items()
            if status is MemberStatus.ALIVE and worker_index(node) == 0
        )

    async def _scrape_one(self, node: str) -> Snapshot | None:
        status, body = await self._get(node, "/metrics")
        if status != 200:
            return None
        try:
            return parse_metrics(body.decode())
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("console: the metrics of %s could not be read: %s", node, e)
            return None

    async def _scrape_all(self) -> dict[str, Snapshot | None]:
        nodes = self.brokers()
        snapshots = await asyncio.gather(*(self._scrape_one(node) for node in nodes))
        return dict(zip(nodes, snapshots, strict=True))

    async def scrape(self) -> dict[str, Snapshot | None]:
        """Every alive broker's metrics (None: it did not answer), at most SCRAPE_MAX_AGE_S
        old; concurrent callers share one scrape."""
        now = self.clock()
        if self._scraped is not None and now - self._scraped[0] < SCRAPE_MAX_AGE_S:
            return self._scraped[1]
        if self._scraping is None or self._scraping.done():
            self._scraping = asyncio.ensure_future(self._scrape_all())
        snapshots = await asyncio.shield(self._scraping)
        now = self.clock()
        if self._scraped is None or self._scraped[0] < now:
            self._scraped = (now, snapshots)
            answered = {node: s for node, s in snapshots.items() if s is not None}
            if self._last is None or now - self._last[0] >= SCRAPE_MAX_AGE_S:
                recent = self._last is not None and now - self._last[0] <= MAX_RATE_INTERVAL_S
                self._previous = self._last if recent else None
                self._last = (now, answered)
                self._rates = None
        return snapshots

    async def rates(self) -> dict[str, Any]:
        """The cluster's publish and consume rates and latency percentiles between the last
        two scrapes (nulls until there are two)."""
        await self.scrape()
        if self._rates is None and self._previous is not None and self._last is not None:
            interval_s = self._last[0] - self._previous[0]
            self._rates = rates_between(self._previous[1], self._last[1], interval_s)
        body: dict[str, Any] = {"time_ms": int(time.time() * 1000)}
        if self._rates is None:
            return {**body, "interval_s": None, "brokers": 0, "publish_per_s": None}
        return {**body, **self._rates.to_json()}

    # ---- the cluster -----------------------------------------------------------------------

    async def members(self) -> list[MemberRow]:
        """Every member SWIM knows of (and any the metadata still weighs or drains)."""
        broker = self.broker
        state = broker.core.state
        members = broker.members()
        view = self.api.cluster_view()
        snapshots = await self.scrape()
        leader = broker.core.metadata_leader
        rows = []
        for node in sorted(set(members) | set(state.weights) | set(state.draining)):
            status, api, _ = members.get(node, (None, "", ""))
            hosted = view.get(node, [])
            snapshot = snapshots.get(broker_of(node))  # (the router is the broker's)
            if snapshot is None:
                xdp = "unknown"
            else:
                xdp = "not loaded" if snapshot.xdp_packets is None else "loaded"
            rows.append(
                MemberRow(
                    id=node,
                    api_url=broker.api_url(api) if api else "",
                    state=status.name.lower() if status is not None else "unknown",
                    alive=status is MemberStatus.ALIVE,
                    weight=state.weight(node),
                    draining=node in state.draining,
                    leads=sum(1 for row in hosted if row.get("role") == "leader"),
                    hosts=len(hosted),
                    metadata_leader=node == leader,
                    xdp=xdp,
                )
            )
        return rows

    # ---- topics ----------------------------------------------------------------------------

    def topic_names(self, visible: Callable[[str], bool]) -> list[str]:
        return sorted(name for name in self.broker.core.state.topics if visible(name))

    async def partitions(self, name: str, refresh: bool = True) -> list[PartitionRow]:
        """Topic `name`'s partitions as `GET /v1/topics/{name}` describes them, with the
        bytes their leader stores (ApiError 404 if there is no such topic)."""
        if refresh:
            await self.broker.status.refresh(STATUS_REFRESH_S)
        view = self.api.cluster_view()
        described = await self.api.describe(name, view)
        stored: dict[int, int] = {}
        for rows in view.values():
            for row in rows:
                if row.get("topic") != name:
                    continue
                partition = int(row["partition"])
                if row.get("role") == "leader" or partition not in stored:
                    stored[partition] = int(row["bytes"])
        rf = described.replication_factor
        return [PartitionRow(p, stored.get(p.partition), rf) for p in described.partition_states]

    async def topics(self, visible: Callable[[str], bool]) -> list[TopicRow]:
        """The topics `visible` lets through, each with its health and size."""
        await self.broker.status.refresh(STATUS_REFRESH_S)
        out = []
        for name in self.topic_names(visible):
            topic = self.broker.core.state.topics.get(name)
            if topic is None:  # (deleted meanwhile)
                continue
            rows = await self.partitions(name, refresh=False)
            out.append(
                TopicRow(
                    name=name,
                    partitions=topic.partitions,
                    replication_factor=topic.replication_factor,
                    under_replicated=sum(1 for r in rows if r.under_replicated),
                    offline=sum(1 for r in rows if r.offline),
                    bytes=sum(r.bytes or 0 for r in rows),
                )
            )
        return out

    # ---- consumer groups -------------------------------------------------------------------

    def local_groups(self, topic: str) -> list[GroupRow]:
        """The groups of topic `topic`'s partitions this broker leads."""
        rows = []
        for replica in sorted(self.broker.core.replicas.values(), key=lambda r: r.partition):
            if replica.topic != topic or not replica.is_leader or replica.groups is None:
                continue
            state = replica.groups.state
            for group in sorted(state.groups):
                counts = state.describe(group)
                rows.append(
                    GroupRow(
                        replica.partition,
                        group,
                        cursor=counts["cursor"],
                        acquired=counts["acquired"],
                        pending=counts["pending"],
                        dead_letter_pending=counts["dead_letter_pending"],
                        accepted=counts["accepted"],
                        dead_lettered=counts["dead_lettered"],
                    )
                )
        return rows

    async def _remote_groups(self, node: str, topic: str) -> list[GroupRow] | None:
        status, body = await self._get(node, f"{INTERNAL_GROUPS_PATH}?topic={topic}", True)
        if status != 200:
            return None
        try:
            return [GroupRow.from_json(item) for item in orjson.loads(body)["groups"]]
        except (KeyError, TypeError, ValueError) as e:
            log.warning("console: %s answered groups that are not: %s", node, e)
            return None

    async def groups(self, topic: str) -> tuple[list[GroupRow], list[int]]:
        """Topic `topic`'s consumer groups on each partition, from each partition's leader;
        and the partitions whose leader could not be asked (none known, or no answer)."""
        partitions = await self.partitions(topic)
        by_leader: dict[str, list[int]] = {}
        unknown: list[int] = []
        for row in partitions:
            if row.state.leader is None:
                unknown.append(row.state.partition)
            else:
                by_leader.setdefault(row.state.leader, []).append(row.state.partition)
        asked: dict[str, Awaitable[list[GroupRow] | None]] = {}
        for leader in by_leader:
            if leader == self.broker.id:
                asked[leader] = _ready(self.local_groups(topic))
            else:
                asked[leader] = self._remote_groups(leader, topic)
        answers = dict(zip(asked, await asyncio.gather(*asked.values()), strict=True))
        rows: list[GroupRow] = []
        for leader, led in by_leader.items():
            answer = answers[leader]
            if answer is None:
                unknown += led
                continue
            # (a leadership that moved meanwhile: only the partitions it was asked for)
            rows += [row for row in answer if row.partition in led]
        rows.sort(key=lambda r: (r.group, r.partition))
        return rows, sorted(unknown)

    # ---- records ---------------------------------------------------------------------------

    async def records(
        self, topic: str, partition: int, from_index: int | None, max_records: int
    ) -> ReadResult:
        """Up to `max_records` committed records of the partition from `from_index` (None:
        its log start), read from an in-sync replica (LaminarError as the client raises it)."""
        client = self.broker.internal_client()
        return await client.read(
            topic,
            partition,
            from_index,
            max_records=min(max_records, MAX_BROWSE_RECORDS),
            max_bytes=MAX_BROWSE_BYTES,
            timeout_s=READ_TIMEOUT_S,
        )


async def _ready(value: list[GroupRow]) -> list[GroupRow] | None:
    return value
