"""Batch compression codecs: a producer compresses a batch's records section as a whole with
zstd or lz4; the broker stores and serves those bytes as they came, and readers decompress.

A compressed records section (docs/formats.md §1, "Compressed records") is

    u32 records_bytes    length of the records section once decompressed
    frame                one zstd frame (RFC 8878) or one LZ4 frame, nothing after it

The length comes first so that decompression is bounded before it starts: a decoder refuses a
section that declares more than its limit without running the codec, and never produces more
than the section declares (`decompress` takes at most that many bytes out of the codec). A
few hundred bytes can otherwise expand to gigabytes (a decompression bomb). A zstd frame must
declare its content size (zstd's default), equal to that length: its decoder then needs one
buffer of that size and a window no larger.

The codec numbers are Kafka's (`compression.type`: 3 lz4, 4 zstd), in bits 2-4 of the batch
attributes; gzip (1) and snappy (2) are not supported.
"""

from __future__ import annotations

import enum
import struct
import threading

import lz4.frame
import zstandard

from .errors import BatchFramingError, DecompressionError

Buffer = bytes | bytearray | memoryview

RECORDS_BYTES = struct.Struct("<I")  # the u32 before the codec's frame
RECORDS_BYTES_LENGTH = RECORDS_BYTES.size
#: Kafka's default zstd level (`compression.zstd.level`): most of the gain for little CPU.
ZSTD_LEVEL = 3
#: lz4's default (fast) level.
LZ4_LEVEL = 0
#: lz4 output is taken this much at a time (lz4 allocates all it is allowed at once)
LZ4_CHUNK_BYTES = 1 << 20


class Codec(enum.IntEnum):
    """A compression codec: its number in the batch attributes (bits 2-4, Kafka's numbers)."""

    NONE = 0
    LZ4 = 3
    ZSTD = 4

    @property
    def label(self) -> str:
        """The name users give (`compression="zstd"`)."""
        return self.name.lower()


#: The names a producer may give, as `compression=` and `--compression` take them.
CODEC_NAMES = ("none", "lz4", "zstd")


def codec_named(name: str | None) -> Codec:
    """The codec a user named ("zstd", "lz4", "none" or None). ValueError for any other."""
    if name is None:
        return Codec.NONE
    if name in CODEC_NAMES:
        return Codec[name.upper()]
    raise ValueError(f"unknown compression {name!r}: choose one of {', '.join(CODEC_NAMES)}")


_CODECS = {codec.value: codec for codec in Codec}  # (an enum's call costs ~10x a lookup)


def codec_of(number: int) -> Codec:
    """The codec with attribute number `number`. BatchFramingError for an unsupported one."""
    codec = _CODECS.get(number)
    if codec is None:
        raise BatchFramingError(f"unsupported compression codec {number}")
    return codec


_local = threading.local()  # (a zstd compressor is not thread-safe, and costly to create)


def _zstd_compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "zstd", None)
    if compressor is None:
        compressor = _local.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return compressor


def compress(codec: Codec, records: Buffer) -> bytes:
    """The compressed records section (length, then frame) of the records section `records`."""
    if codec is Codec.ZSTD:
        frame = _zstd_compressor().compress(records)
    elif codec is Codec.LZ4:
        frame = lz4.frame.compress(records, compression_level=LZ4_LEVEL, store_size=True)
    else:
        raise ValueError(f"{codec!r} does not compress")
    return RECORDS_BYTES.pack(len(records)) + frame


def declared_bytes(section: Buffer) -> int:
    """The decompressed length a compressed records section declares."""
    if len(section) <= RECORDS_BYTES_LENGTH:
        raise DecompressionError(
            f"a compressed records section needs more than {RECORDS_BYTES_LENGTH} bytes, "
            f"got {len(section)}"
        )
    (records_bytes,) = RECORDS_BYTES.unpack_from(section)
    return int(records_bytes)


def decompress(codec: Codec, section: Buffer, max_records_bytes: int) -> bytes:
    """The records section that the compressed `section` holds, of exactly the length it
    declares, which may be at most `max_records_bytes`. Raises DecompressionError; never
    produces more than that bound, whatever the frame says."""
    records_bytes = declared_bytes(section)
    if records_bytes > max_records_bytes:
        raise DecompressionError(
            f"the compressed records declare {records_bytes} bytes decompressed, over the "
            f"limit of {max_records_bytes} (a batch's records take at most max_batch_bytes less "
            "the batch header, compressed or not)"
        )
    frame = memoryview(section)[RECORDS_BYTES_LENGTH:]
    if codec is Codec.ZSTD:
        records = _zstd_decompress(frame, records_bytes)
    elif codec is Codec.LZ4:
        records = _lz4_decompress(frame, records_bytes)
    else:
        raise ValueError(f"{codec!r} does not decompress")
    if len(records) != records_bytes:
        raise DecompressionError(
            f"the {codec.label} frame holds {len(records)} bytes, not the {records_bytes} declared"
        )
    return records


def _zstd_decompress(frame: memoryview, records_bytes: int) -> bytes:
    try:
        content_bytes = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise DecompressionError(f"the zstd frame is damaged: {e}") from e
    if content_bytes == -1:  # (zstd's default is to write it; ours always does)
        raise DecompressionError("the zstd frame does not declare its content size")
    if content_bytes != records_bytes:
        raise DecompressionError(
            f"the zstd frame declares {content_bytes} bytes, not the {records_bytes} declared"
        )
    try:
        # (one buffer of the content size, known now to be records_bytes: a frame that holds
        # more fails instead of growing it)
        return zstandard.ZstdDecompressor().decompress(frame, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise DecompressionError(
            f"the zstd frame does not decompress to the {records_bytes} bytes declared: it is "
            f"damaged, cut short or holds more ({e})"
        ) from e


def _lz4_decompress(frame: memoryview, records_bytes: int) -> bytes:
    # in chunks: lz4 allocates the whole `max_length` it is given, and the output is held to
    # what the frame really holds, at most records_bytes (+ 1 to see that it holds more)
    decompressor = lz4.frame.LZ4FrameDecompressor()
    chunks: list[bytes] = []
    total_bytes = 0
    data: Buffer = frame
    try:
        while not decompressor.eof:
            if data is not frame and decompressor.needs_input:
                raise DecompressionError(
                    f"the lz4 frame is cut short after {total_bytes} of the {records_bytes} "
                    "bytes declared"
                )
            want_bytes = min(LZ4_CHUNK_BYTES, records_bytes + 1 - total_bytes)
            chunk = decompressor.decompress(data, max_length=want_bytes)
            data = b""
            chunks.append(chunk)
            total_bytes += len(chunk)
            if total_bytes > records_bytes:
                raise DecompressionError(
                    f"the lz4 frame holds more than the {records_bytes} bytes declared"
                )
    except RuntimeError as e:  # (what lz4 raises for a damaged frame)
        raise DecompressionError(f"the lz4 frame is damaged: {e}") from e
    if decompressor.unused_data:
        raise DecompressionError(f"{len(decompressor.unused_data)} bytes follow the lz4 frame")
    return b"".join(chunks)
