"""The JVM reader's offsets and replica ranking (Offsets.java, Replicas.java with lz4-java's
XXH64) are the Python source's: seeded random inputs to spec / timestamps / resolve /
timestamps_wanted / place_by_time / plan (laminar.spark.options) and to read_replicas
(laminar.client.client, on laminar.placement's rank), and XXH64 against the xxhash package,
give the same results or the same messages in one Java process as in Python."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import xxhash

from laminar.client.client import read_replicas
from laminar.models.cluster import Member
from laminar.models.topics import PartitionState
from laminar.spark.options import (
    Bounds,
    Offsets,
    OptionError,
    place_by_time,
    plan,
    resolve,
    spec,
    timestamps,
    timestamps_wanted,
)

from .conftest import JavaBuild
from .test_jvm_options import EDGE_CASES

SEED = 2026
#: an index past a Java long (Python's ints are unbounded) is taken as the largest long
LONG_MAX = 2**63 - 1
TOPICS = ("t", "u", "caf\u00e9", "a-b.c_d")
NAMES = ("startingOffsets", "endingOffsets", "startingOffsetsByTimestamp")


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"result": call()}
    except OptionError as e:
        return {"error": str(e)}
    except ValueError as e:  # (Python's int() past the option checks)
        return {"error": str(e)}


def resolved(wanted: str, bounds: dict[str, dict[str, Bounds]], name: str) -> Offsets:
    return resolve(spec(wanted, name), bounds, name)


def clamped(want: dict[str, Any]) -> dict[str, Any]:
    """`want` with JSON offsets past a Java long at the largest long (Offsets.java's rule)."""
    result = want.get("result")
    if not isinstance(result, dict):
        return want
    return {"result": {t: {p: min(i, LONG_MAX) for p, i in parts.items()}
                       for t, parts in result.items()}}  # fmt: skip


def strip_type(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "type"}


def check(
    java_build: JavaBuild, requests: list[dict[str, Any]], wants: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Java's answers to `requests` are `wants`, Python's, keys in the same order too."""
    answers = java_build.run("OffsetsCheck", requests)
    differ = [
        (request, want, got)
        for request, want, got in zip(requests, wants, answers, strict=True)
        if json.dumps(strip_type(got)) != json.dumps(want)
    ]
    assert not differ, f"{len(differ)} of {len(requests)} differ; the first: {differ[:3]}"
    return answers


def random_bounds(rng: random.Random) -> dict[str, dict[str, Bounds]]:
    out: dict[str, dict[str, Bounds]] = {}
    for topic in rng.sample(TOPICS, rng.randint(0, 3)):
        out[topic] = {}
        for partition in rng.sample(range(12), rng.randint(0, 5)):
            low = rng.choice((0, 0, rng.randint(0, 1000)))
            out[topic][str(partition)] = Bounds(low, low + rng.choice((0, 1, rng.randint(0, 5000))))
    return out


def bounds_json(bounds: dict[str, dict[str, Bounds]]) -> dict[str, Any]:
    return {t: {p: [b.log_start, b.end] for p, b in parts.items()} for t, parts in bounds.items()}


def random_offsets(rng: random.Random, bounds: dict[str, dict[str, Bounds]], *, markers: bool,
                   strangers: bool) -> dict[str, dict[str, int]]:  # fmt: skip
    """Offsets for some partitions of `bounds` (and, with `strangers`, some it lacks)."""
    out: dict[str, dict[str, int]] = {}
    topics = list(bounds) + (["zz"] if strangers and rng.random() < 0.2 else [])
    for topic in topics:
        parts = list(bounds.get(topic, {}))
        if strangers and rng.random() < 0.2:
            parts.append(str(rng.randint(12, 30)))
        chosen = rng.sample(parts, rng.randint(0, len(parts)))
        out[topic] = {}
        for p in chosen:
            values = [rng.randint(0, 6000)] + ([-2, -1] if markers else [])
            out[topic][p] = rng.choice(values)
    return out


def test_spec_and_timestamps_take_what_python_takes(java_build: JavaBuild) -> None:
    texts = [v for case in EDGE_CASES for k, v in case.items()
             if k in ("startingOffsets", "endingOffsetsByTimestamp")]  # fmt: skip
    requests: list[dict[str, Any]] = []
    wants: list[dict[str, Any]] = []
    for text in texts:
        for name in NAMES:
            requests.append({"fn": "spec", "value": text, "name": name})
            wants.append(clamped(outcome(partial(spec, text, name))))
            requests.append({"fn": "timestamps", "value": text, "name": name})
            wants.append(outcome(partial(timestamps, text, name)))
    answers = check(java_build, requests, wants)
    assert sum("result" in a for a in answers) >= 20


def test_resolve_and_timestamps_wanted_alike(java_build: JavaBuild) -> None:
    rng = random.Random(SEED)
    requests: list[dict[str, Any]] = []
    wants: list[dict[str, Any]] = []
    for _ in range(400):
        bounds = random_bounds(rng)
        name = rng.choice(NAMES)
        if rng.random() < 0.3:
            wanted = rng.choice(("earliest", "latest"))
        else:
            wanted = json.dumps(random_offsets(rng, bounds, markers=True, strangers=True))
        requests.append({"fn": "resolve", "wanted": wanted, "bounds": bounds_json(bounds),
                         "name": name})  # fmt: skip
        wants.append(outcome(partial(resolved, wanted, bounds, name)))
        every = rng.choice((None, rng.randint(0, 10**13)))
        by = rng.choice((None, json.dumps(random_offsets(rng, bounds, markers=False,
                                                         strangers=True))))  # fmt: skip
        requests.append({"fn": "timestamps_wanted", "every_ms": every, "by_partition": by,
                         "bounds": bounds_json(bounds), "name": name})  # fmt: skip
        wants.append(outcome(partial(timestamps_wanted, every, by, bounds, name)))
    answers = check(java_build, requests, wants)
    assert sum("error" in a for a in answers) >= 40
    assert sum("result" in a for a in answers) >= 200


def test_place_by_time_and_plan_alike(java_build: JavaBuild) -> None:
    rng = random.Random(SEED + 1)
    requests: list[dict[str, Any]] = []
    wants: list[dict[str, Any]] = []
    for _ in range(400):
        bounds = random_bounds(rng)
        offsets = resolve("earliest", bounds, "startingOffsets")
        wanted = random_offsets(rng, bounds, markers=False, strangers=False)
        found = {t: {p: rng.choice((None, rng.randint(0, 6000))) for p in parts}
                 for t, parts in wanted.items() if rng.random() < 0.9}  # fmt: skip
        starting = rng.random() < 0.5
        strategy = rng.choice(("error", "latest"))
        requests.append({"fn": "place_by_time", "offsets": offsets, "wanted": wanted,
                         "found": found, "bounds": bounds_json(bounds), "starting": starting,
                         "strategy": strategy})  # fmt: skip
        placed = partial(place_by_time, offsets, wanted, found, bounds, starting=starting,
                         strategy=strategy)  # fmt: skip
        wants.append(outcome(placed))
        start = random_offsets(rng, bounds, markers=False, strangers=False)
        end = resolve("latest", bounds, "endingOffsets")
        minimum = rng.choice((None, None, 1, rng.randint(2, 40)))
        requests.append({"fn": "plan", "start": start, "end": end, "min_partitions": minimum})
        ranges = plan(start, end, minimum)
        wants.append({"result": [[r.topic, r.partition, r.low, r.high] for r in ranges]})
    answers = check(java_build, requests, wants)
    plans = [a["result"] for r, a in zip(requests, answers, strict=True) if r["fn"] == "plan"]
    assert any(len(p) > 12 for p in plans)  # min_partitions split some
    assert sum("error" in a for a in answers) >= 20


def random_members(rng: random.Random) -> list[Member]:
    members = []
    for n in range(rng.randint(0, 6)):
        url = rng.choice((f"http://127.0.0.{n}:7070", f"https://b{n}:7070//", ""))
        members.append(Member(
            id=rng.choice((f"node-{n}", f"n\u00e9{n}", f"{n}", "dup")),
            api_url=url,
            state=rng.choice(("alive", "alive", "alive", "suspect", "dead", "left")),
            weight=rng.choice((1, 1, 2, 3, 0, -1, 100)),
            draining=rng.random() < 0.15,
        ))  # fmt: skip
    return members


def test_read_replicas_rank_as_python_clients_do(java_build: JavaBuild) -> None:
    rng = random.Random(SEED + 2)
    requests: list[dict[str, Any]] = []
    wants: list[dict[str, Any]] = []
    for _ in range(1000):
        members = random_members(rng)
        ids = [m.id for m in members] + ["stranger"]
        in_sync = tuple(rng.choice(ids) for _ in range(rng.randint(0, 5)))
        topic = rng.choice((*TOPICS, "x" * 300))
        partition = rng.randint(0, 5000)
        state = PartitionState(partition, None, None, (), (), in_sync, 0, 0, 0)
        requests.append({"fn": "read_replicas", "topic": topic, "partition": partition,
                         "in_sync": list(in_sync),
                         "members": [m.to_json() for m in members]})  # fmt: skip
        wants.append({"result": read_replicas(topic, partition, state, members)})
    answers = check(java_build, requests, wants)
    assert sum(len(a["result"]) >= 2 for a in answers) >= 50  # orders, not only single picks


def test_xxh64_is_the_xxhash_packages(java_build: JavaBuild) -> None:
    rng = random.Random(SEED + 3)
    data = [rng.randbytes(n) for n in (*range(80), 100, 1000, 4096 + 3)]
    requests = [{"fn": "xxh64", "hex": d.hex()} for d in data]
    wants = [{"result": str(xxhash.xxh64_intdigest(d))} for d in data]
    check(java_build, requests, wants)
