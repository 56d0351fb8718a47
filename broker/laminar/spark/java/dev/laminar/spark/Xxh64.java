package dev.laminar.spark;

/**
 * XXH64 with seed 0 of a byte array, as the Python {@code xxhash} package's
 * {@code xxh64_intdigest}: what laminar.placement ranks replicas with (Replicas).
 */
public final class Xxh64 {
  private static final long PRIME1 = 0x9E3779B185EBCA87L;
  private static final long PRIME2 = 0xC2B2AE3D27D4EB4FL;
  private static final long PRIME3 = 0x165667B19E3779F9L;
  private static final long PRIME4 = 0x85EBCA77C2B2AE63L;
  private static final long PRIME5 = 0x27D4EB2F165667C5L;

  private Xxh64() {}

  /** The hash of `data` (an unsigned 64-bit value in a long). */
  public static long hash(byte[] data) {
    int length = data.length;
    int at = 0;
    long h;
    if (length >= 32) {
      long v1 = PRIME1 + PRIME2;
      long v2 = PRIME2;
      long v3 = 0;
      long v4 = -PRIME1;
      do {
        v1 = round(v1, long64(data, at));
        v2 = round(v2, long64(data, at + 8));
        v3 = round(v3, long64(data, at + 16));
        v4 = round(v4, long64(data, at + 24));
        at += 32;
      } while (at <= length - 32);
      h = Long.rotateLeft(v1, 1) + Long.rotateLeft(v2, 7) + Long.rotateLeft(v3, 12)
          + Long.rotateLeft(v4, 18);
      h = merge(h, v1);
      h = merge(h, v2);
      h = merge(h, v3);
      h = merge(h, v4);
    } else {
      h = PRIME5;
    }
    h += length;
    while (at + 8 <= length) {
      h ^= round(0, long64(data, at));
      h = Long.rotateLeft(h, 27) * PRIME1 + PRIME4;
      at += 8;
    }
    if (at + 4 <= length) {
      h ^= (int32(data, at) & 0xFFFFFFFFL) * PRIME1;
      h = Long.rotateLeft(h, 23) * PRIME2 + PRIME3;
      at += 4;
    }
    while (at < length) {
      h ^= (data[at] & 0xFFL) * PRIME5;
      h = Long.rotateLeft(h, 11) * PRIME1;
      at++;
    }
    h ^= h >>> 33;
    h *= PRIME2;
    h ^= h >>> 29;
    h *= PRIME3;
    h ^= h >>> 32;
    return h;
  }

  private static long round(long acc, long input) {
    acc += input * PRIME2;
    acc = Long.rotateLeft(acc, 31);
    return acc * PRIME1;
  }

  private static long merge(long acc, long value) {
    acc ^= round(0, value);
    return acc * PRIME1 + PRIME4;
  }

  private static long long64(byte[] data, int at) {
    long out = 0;
    for (int i = 7; i >= 0; i--) {
      out = (out << 8) | (data[at + i] & 0xFFL);
    }
    return out;
  }

  private static int int32(byte[] data, int at) {
    return (data[at] & 0xFF)
        | (data[at + 1] & 0xFF) << 8
        | (data[at + 2] & 0xFF) << 16
        | (data[at + 3] & 0xFF) << 24;
  }
}
