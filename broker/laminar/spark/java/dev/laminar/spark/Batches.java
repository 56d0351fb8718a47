package dev.laminar.spark;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Laminar's stored record batches (docs/formats.md), read in place from an answer buffer:
 * header fields, the checksum check, and the records section's layout. The Python codec
 * (laminar/log/batch.py) is the reference; these constants are its.
 */
final class Batches {
  static final int HEADER_BYTES = 72;
  static final int CHECKSUM_OFFSET = 64;
  static final int RECORD_HEADER_BYTES = 14;
  static final int MAGIC = 0x42514d4c; // b"LMQB" read as a little-endian u32
  static final int VERSION = 1;
  static final int CONTROL = 0x1;
  static final int CODEC_SHIFT = 2;
  static final int CODEC_MASK = 0x7 << CODEC_SHIFT;
  static final int CODEC_NONE = 0;
  static final int CODEC_LZ4 = 3;
  static final int CODEC_ZSTD = 4;

  private Batches() {}

  /** A little-endian view of `data` (the wire's byte order). */
  static ByteBuffer view(byte[] data, int length) {
    return ByteBuffer.wrap(data, 0, length).order(ByteOrder.LITTLE_ENDIAN);
  }

  static int attributes(ByteBuffer b, int at) {
    return b.getShort(at + 6) & 0xffff;
  }

  static long baseIndex(ByteBuffer b, int at) {
    return b.getLong(at + 8);
  }

  static int payloadBytes(ByteBuffer b, int at) {
    return b.getInt(at + 24);
  }

  static int recordCount(ByteBuffer b, int at) {
    return b.getInt(at + 28);
  }

  static long firstTimestampMs(ByteBuffer b, int at) {
    return b.getLong(at + 48);
  }

  /** The framing every batch must have before anything else of it is read. */
  static void checkFrame(ByteBuffer b, int at, int end) {
    if (end - at < HEADER_BYTES) {
      throw new IllegalStateException("a batch header is cut short at byte " + at);
    }
    if (b.getInt(at) != MAGIC || (b.getShort(at + 4) & 0xffff) != VERSION) {
      throw new IllegalStateException("no batch (bad magic or version) at byte " + at);
    }
    long size = HEADER_BYTES + (payloadBytes(b, at) & 0xffffffffL);
    if (size > end - at || recordCount(b, at) < 1) {
      throw new IllegalStateException("a batch at byte " + at + " is cut short or empty");
    }
  }

  /** XXH3_64(header[0:64], seed = XXH3_64(payload)) against the header's checksum field. */
  static void verify(ByteBuffer b, int at) {
    int payload = payloadBytes(b, at);
    long expected = b.getLong(at + CHECKSUM_OFFSET);
    byte[] array = b.array(); // (an answer's buffer: always a heap array)
    int base = b.arrayOffset() + at;
    long got =
        Xxh3.hash64(
            array, base, CHECKSUM_OFFSET, Xxh3.hash64(array, base + HEADER_BYTES, payload, 0L));
    if (got != expected) {
      throw new IllegalStateException(
          "batch at index " + baseIndex(b, at) + ": checksum mismatch (damaged in transit or at rest)");
    }
  }
}
