"""The JVM reader's XXH3_64 (Xxh3.java) hashes exactly as the Python `xxhash` package does.

Both Java files are compiled into a temporary directory and one `java` process hashes every
case, through an exact byte[] and one with filler around the bytes (Xxh3Check.java);
the cases cover every length branch of XXH3_64bits_withSeed, zero and non-zero seeds (a non-zero
seed derives its own secret past 240 bytes), and the checksum chain of a real batch.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
import xxhash

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    CHECKSUM_OFFSET,
    Record,
    encode_batch,
    payload_hash,
)

REPO = Path(__file__).resolve().parents[3]
XXH3_SOURCE = (
    REPO / "broker" / "laminar" / "spark" / "java" / "dev" / "laminar" / "spark" / "Xxh3.java"
)
CHECK_SOURCE = Path(__file__).with_name("Xxh3Check.java")
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300
SEEDS = (0, 1, 2**63 + 5, random.Random(26).getrandbits(64))
#: every length up to past the mid-size limit (240), then whole blocks (1024), a block and a
#: byte, several blocks, many blocks with a partial stripe, and a large input
LENGTHS = (*range(301), 512, 1024, 1025, 4096, 65536 + 7, 1 << 20)

Case = tuple[int, bytes]


class JavaRun(NamedTuple):
    """The cases fed to the one `java` run and, per case, the hashes of its entry points."""

    cases: list[Case]
    rows: list[list[int]]
    batch: bytes
    checksum: int


def batch_with_checksum() -> tuple[bytes, int]:
    """A real batch (its payload past 240 bytes: the long path) and the checksum it carries."""
    records = [
        Record(value=bytes([i]) * 100, key=f"key-{i}".encode(), headers=(("h", b"v"),))
        for i in range(8)
    ]
    batch = encode_batch(records, producer_id=7, producer_seq=3, now_ms=1_700_000_000_000)
    checksum = int.from_bytes(batch[CHECKSUM_OFFSET:BATCH_HEADER_BYTES], "little")
    return batch, checksum


@pytest.fixture(scope="module")
def java_run(tmp_path_factory: pytest.TempPathFactory) -> JavaRun:
    """Compiles Xxh3.java and Xxh3Check.java, then hashes every case in one `java` process."""
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.skip("no JDK on PATH (javac and java): the JVM reader's XXH3 cannot be compiled")
    classes = tmp_path_factory.mktemp("xxh3-classes")
    compiled = subprocess.run(
        ["javac", "-Xlint:all", "-Werror", "-d", str(classes), str(XXH3_SOURCE), str(CHECK_SOURCE)],
        capture_output=True,
        text=True,
        timeout=COMPILE_TIMEOUT_S,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    rng = random.Random(20260)
    cases = [(seed, rng.randbytes(length)) for length in LENGTHS for seed in SEEDS]
    batch, checksum = batch_with_checksum()
    # The header hash is seeded with the payload hash, as batch.py chains them.
    cases.append((0, batch[BATCH_HEADER_BYTES:]))
    cases.append((payload_hash(batch[BATCH_HEADER_BYTES:]), batch[:CHECKSUM_OFFSET]))
    result = subprocess.run(
        ["java", "-cp", str(classes), "Xxh3Check"],
        input="".join(f"{seed} {data.hex()}\n" for seed, data in cases),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [[int(word) for word in line.split()] for line in result.stdout.splitlines()]
    assert len(rows) == len(cases)
    return JavaRun(cases, rows, batch, checksum)


def test_every_length_branch_and_seed_matches_xxhash(java_run: JavaRun) -> None:
    assert len(java_run.cases) == len(LENGTHS) * len(SEEDS) + 2
    wrong = []
    for (seed, data), row in zip(java_run.cases, java_run.rows, strict=True):
        want = xxhash.xxh3_64_intdigest(data, seed=seed)
        if row != [want] * 2:
            wrong.append((len(data), seed, want, row))
    assert not wrong, f"{len(wrong)} differ, as (length, seed, want, got): {wrong[:5]}"


def test_a_batch_checksum_verifies_through_the_seed_chain(java_run: JavaRun) -> None:
    payload = java_run.batch[BATCH_HEADER_BYTES:]
    assert len(payload) > 240
    payload_row, header_row = java_run.rows[-2:]
    # Java's payload hash is the seed the header row was fed, so matching it and then the
    # stored checksum is the chain the reader runs: hash64(header, 64, hash64(payload, 0)).
    assert payload_row == [payload_hash(payload)] * 2
    assert header_row == [java_run.checksum] * 2
