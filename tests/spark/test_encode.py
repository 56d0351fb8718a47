"""The sink's columnar encoder against `encode_batch`, the reference: the same rows at the same
time give the same bytes, whatever the mix of keys, nulls, headers and string columns, in one
chunk or several; and rows it cannot encode are refused with the column named."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("pyarrow", reason="the Spark sink needs pyarrow (pip install '.[spark]')")

import pyarrow as pa

from laminar.log.batch import Record, encode_batch, iter_records
from laminar.spark.arrow import HEADER_TYPE
from laminar.spark.encode import Rows, binary, encode_rows, records_section, row_sizes
from laminar.spark.options import OptionError

NOW_MS = 1_700_000_000_000


def rows_of(records: list[Record], *, keys: bool = True, headers: bool = True) -> Rows:
    return Rows(
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.key for r in records], pa.binary()) if keys else None,
        pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], HEADER_TYPE)
        if headers
        else None,
    )


MIXED = [
    Record(
        value=None if i % 7 == 0 else b"value-%d" % i * (i % 5),
        key=None if i % 3 == 0 else b"key-%d" % i,
        headers=tuple((f"h{j}", b"x" * j) for j in range(i % 4)),
    )
    for i in range(60)
]
PLAIN = [Record(value=b"%04d" % i * 280) for i in range(40)]  # 1120 bytes, no key


@pytest.mark.parametrize(
    ("records", "keys", "headers"),
    [(MIXED, True, True), (PLAIN, False, False), (PLAIN, True, False), (MIXED[:1], True, True)],
)
@pytest.mark.parametrize("cuts", [(), (1,), (10, 11, 30)])
def test_the_same_bytes_as_encode_batch(
    records: list[Record], keys: bool, headers: bool, cuts: tuple[int, ...]
) -> None:
    rows = rows_of(records, keys=keys, headers=headers)
    edges = [0, *[c for c in cuts if c < len(records)], len(records)]
    chunks = [rows.slice(a, b - a) for a, b in itertools.pairwise(edges)]
    got = encode_rows(chunks, producer_id=7, producer_seq=11, transactional=True, now_ms=NOW_MS)
    assert got == encode_batch(
        records, producer_id=7, producer_seq=11, transactional=True, now_ms=NOW_MS
    )
    assert list(row_sizes(rows)) == list(records_section(rows)[1])


def test_strings_are_their_utf8_bytes_and_null_headers_none() -> None:
    rows = Rows(
        binary(pa.array(["é", "b", None]), "value"),
        binary(pa.array(["k", None, "k"], pa.large_string()), "key"),
        pa.array([None, [], [{"key": "n", "value": None}]], HEADER_TYPE),
    )
    batch = encode_rows([rows], producer_id=0, producer_seq=0, transactional=False)
    decoded = [(key, value, heads) for _, _, key, value, heads in iter_records(batch)]
    assert decoded == [(b"k", "é".encode(), ()), (None, b"b", ()), (b"k", None, (("n", b""),))]


def test_what_cannot_be_encoded_is_named() -> None:
    with pytest.raises(OptionError, match="column value must be binary or string, not int64"):
        binary(pa.array([1, 2]), "value")
    nameless = Rows(pa.array([b"v"]), None, pa.array([[{"key": None, "value": b"x"}]], HEADER_TYPE))
    with pytest.raises(OptionError, match="a header's key may not be null"):
        encode_rows([nameless], producer_id=0, producer_seq=0, transactional=False)
    with pytest.raises(ValueError, match="at least one record"):
        encode_rows([], producer_id=0, producer_seq=0, transactional=False)
