"""The decompressing batch decoder under Hypothesis: compressed batches (zstd, lz4), mutated
anywhere (the header, the declared length, the codec's frame), resealed so that the checks
behind the checksum are what is fuzzed. Whatever the bytes, every entry point returns a value
or raises BatchError, never anything else (a codec's own error, MemoryError, struct.error...);
never produces more than the section declares, nor more than its limit; and the append check
(verify_batch), the client's decoder (iter_records) and the Spark source's
(decompressed_batch) agree on what is valid. Bounded and derandomized (tests/fuzz/__init__.py).
"""

from __future__ import annotations

import struct

from hypothesis import event, given
from hypothesis import strategies as st

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    decode_batch,
    decompressed_batch,
    encode_batch,
    iter_records,
    parse_header,
    records_from,
    verify_batch,
)
from laminar.log.compression import (
    RECORDS_BYTES,
    RECORDS_BYTES_LENGTH,
    Codec,
    decompress,
)
from laminar.log.errors import BatchError, DecompressionError

from . import decoder_settings
from .strategies import U64, mutated, records, resealed

FUZZ = decoder_settings(300)
#: the append limit of the fuzzed batches' records, decompressed
LIMIT_BYTES = 1 << 16


@st.composite
def compressed_batches(draw: st.DrawFn) -> bytes:
    return encode_batch(
        draw(st.lists(records, min_size=1, max_size=8)),
        producer_id=draw(st.integers(0, U64)),
        producer_seq=draw(st.integers(0, U64)),
        compression=draw(st.sampled_from(["zstd", "lz4"])),
    )


@st.composite
def lying_length(draw: st.DrawFn, batch: bytes) -> bytes:
    """`batch` whose compressed section declares another length (a bomb's trick)."""
    declared = draw(st.one_of(st.integers(0, 2 * LIMIT_BYTES), st.integers(0, 2**32 - 1)))
    data = bytearray(batch)
    if len(data) >= BATCH_HEADER_BYTES + RECORDS_BYTES_LENGTH:
        RECORDS_BYTES.pack_into(data, BATCH_HEADER_BYTES, declared)
    return bytes(data)


compressed_inputs = st.one_of(
    compressed_batches(),
    compressed_batches().flatmap(mutated).map(resealed),
    # the section alone, its declared length kept: the codecs' frame parsers
    compressed_batches()
    .flatmap(lambda b: mutated(b, keep=BATCH_HEADER_BYTES + RECORDS_BYTES_LENGTH))
    .map(resealed),
    compressed_batches().flatmap(lying_length).map(resealed),
    # a compressed batch's header over another batch's payload, and the other way around
    st.tuples(compressed_batches(), st.binary(max_size=200)).map(
        lambda pair: resealed(pair[0][:BATCH_HEADER_BYTES] + pair[1])
    ),
)


def payload_bytes_fixed(data: bytes) -> bytes:
    """`data` with payload_bytes made to match its length (else framing stops most inputs)."""
    if len(data) < BATCH_HEADER_BYTES:
        return data
    fixed = bytearray(data)
    struct.pack_into("<I", fixed, 24, len(data) - BATCH_HEADER_BYTES)
    return resealed(bytes(fixed))


@FUZZ
@given(st.one_of(compressed_inputs, compressed_inputs.map(payload_bytes_fixed)))
def test_compressed_batch_decoding_raises_only_batch_errors(data: bytes) -> None:
    try:
        header = parse_header(data)
    except BatchError:
        header = None
    event(f"codec: {header.codec.label if header else 'no header'}")
    try:
        verify_batch(data, BATCH_HEADER_BYTES + LIMIT_BYTES)
    except BatchError as e:
        event(f"verify_batch: {type(e).__name__}")
        verified = False
    else:
        event("verify_batch: valid")
        verified = True
    try:
        decoded = list(iter_records(data))
    except BatchError:
        # (a reader's bound is the format's, wider than the append's: it may decode more)
        assert not verified, "verify_batch passed a batch iter_records refuses"
    else:
        assert header is not None and len(decoded) == header.record_count
        try:
            plain = decompressed_batch(data)
        except BatchError as e:
            raise AssertionError("decompressed_batch refuses what iter_records decodes") from e
        assert list(iter_records(plain)) == decoded
        assert not parse_header(plain).is_compressed
    try:
        decode_batch(data)
    except BatchError:
        assert not verified
    try:
        records_from(data, 0, 100)
    except BatchError:
        assert not verified


@FUZZ
@given(
    st.sampled_from([Codec.ZSTD, Codec.LZ4]),
    st.one_of(
        compressed_batches().map(lambda b: b[BATCH_HEADER_BYTES:]),
        compressed_batches().flatmap(lambda b: mutated(b[BATCH_HEADER_BYTES:])),
        st.binary(max_size=300),
    ),
    st.integers(0, 2 * LIMIT_BYTES),
)
def test_decompress_returns_exactly_what_is_declared_within_the_limit(
    codec: Codec, section: bytes, limit: int
) -> None:
    try:
        records = decompress(codec, section, limit)
    except DecompressionError as e:
        event(f"refused: {str(e)[:40]}")
        return
    (declared,) = RECORDS_BYTES.unpack_from(section)
    assert len(records) == declared <= limit
