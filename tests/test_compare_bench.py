"""bench/compare.py's arithmetic: medians and bests over rounds, and the issue 22 verdicts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import compare
import kafka_peer


def test_aggregate_takes_the_median_and_the_best_in_each_figures_direction() -> None:
    rounds = [
        {"lam_rf3_publish_msgs_s": 100.0, "lam_rf3_p99_ms": 9.0, "kafka_rf3_p99_ms": None},
        {"lam_rf3_publish_msgs_s": 300.0, "lam_rf3_p99_ms": 5.0, "_nats_warnings": ["x"]},
        {"lam_rf3_publish_msgs_s": 200.0, "lam_rf3_p99_ms": 7.0},
    ]
    median, best = compare.aggregate(rounds)
    assert median["lam_rf3_publish_msgs_s"] == 200.0
    assert best["lam_rf3_publish_msgs_s"] == 300.0  # throughput: the highest
    assert median["lam_rf3_p99_ms"] == 7.0
    assert best["lam_rf3_p99_ms"] == 5.0  # latency: the lowest
    assert median["kafka_rf3_p99_ms"] is None  # measured in no round
    assert "_nats_warnings" not in median


def test_targets_compare_in_the_right_direction_and_stay_open_without_figures() -> None:
    figures = {
        "lam_rf3_p50_ms": 1.5,
        "lam_rf3_p99_ms": 6.0,
        "nats_r3_p99_ms": 5.0,
        "kafka_rf3_p99_ms": 40.0,
        "lam_single_msgs_s": 16_000.0,
        "lam_single_cpu_s_per_million": 20.0,
        "lam_queue_p50_ms_500": 1.0,
        "rabbit_r3_queue_p50_ms_500": 2.0,
        "lam_rf3_publish_msgs_s": 100_000.0,
        "nats_r3_publish_msgs_s": 50_000.0,
        "kafka_rf3_publish_msgs_s": 120_000.0,
        "lam_rf3_publish_cpu_s_per_million": 5.0,
        "kafka_rf3_publish_cpu_s_per_million": 6.0,
        "leader_skew_1000": 1.05,
    }
    t = compare.targets(figures, [500.0, 1000.0])
    assert t["target_rf3_p50_le_2ms"] is True
    assert t["target_rf3_p99_le_nats_and_kafka"] is False  # 6 ms > NATS's 5 ms
    assert t["target_single_ge_15k_msgs_s"] is True
    assert t["target_single_cpu_10x_better"] is False  # 20 > 164 / 10
    assert t["target_queue_p50_le_rabbit_500"] is True
    assert t["target_queue_p50_le_rabbit_1000"] is None  # not measured
    assert t["target_queue_p50_le_rabbit"] is None
    assert t["target_rf3_publish_ge_2x_nats_r3"] is True  # exactly 2x
    assert t["target_rf3_560k_ge_kafka"] is False
    assert t["target_rf3_560k_cpu_le_kafka"] is True
    assert t["target_rf1_560k_ge_kafka"] is None
    assert t["target_leader_skew_le_1_1"] is True
    assert t["target_p99_192_within_2x_of_6"] is None


def _sitting(median: dict[str, float], best: dict[str, float]) -> dict[str, object]:
    return {
        "median": median, "best": best, "rounds": 2, "started_utc": "2026-12-07 18:00",
        "commit": "abc1234", "wall_s": 60.0, "load_avg_1m": 1.0, "load_avg_1m_end": 1.5,
        "machine": {"cpus": 2, "fdatasync_4k_per_s": 6000, "sync_round_us": 600},
        "params": {"size": 1120, "partitions": 6, "rate": 5000, "queue_rates": [500.0],
                   "skew_partitions": 1000},
        "partitions": {}, "targets": {}, "phases": [], "warnings": [],
    }  # fmt: skip


def test_tables_give_the_one_append_round_trip_only_where_it_was_measured() -> None:
    keys = [f"lam_rf{rf}_idle{s}_{q}_ms" for rf in (1, 3) for s in ("", "_stream")
            for q in ("p50", "p99")]  # fmt: skip
    median = {k: 2.0 + i for i, k in enumerate(keys)}
    best = {k: 1.0 + i for i, k in enumerate(keys)}
    text = compare.tables(_sitting(median, best))
    assert "| Laminar RF 1, HTTP append | 2.00 (1.00) | 3.00 (2.00) |" in text
    assert "| Laminar RF 3, streaming append | 8.00 (7.00) | 9.00 (8.00) |" in text
    assert "one append in flight" not in compare.tables(_sitting({}, {}))


def test_kafka_peer_names_what_an_empty_peers_directory_lacks(tmp_path: Path) -> None:
    missing = kafka_peer.missing_setup(tmp_path)
    assert f"kafka-libs/kafka_2.13-{kafka_peer.KAFKA_VERSION}.jar" in missing
    assert "kafka-classes/KafkaLat.class" in missing
