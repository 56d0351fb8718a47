package dev.laminar.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * XXH3_64bits_withSeed, bit for bit as the reference xxhash.h (v0.8) computes it.
 *
 * <p>Why it exists: every Laminar record batch carries {@code XXH3_64(header[0:64],
 * seed=XXH3_64(payload))} (broker/laminar/log/batch.py, docs/formats.md), the JVM Spark reader
 * must verify it, and neither the JDK nor Spark's jars ship XXH3. The seed chain is the
 * caller's: {@code hash64(header, 0, 64, hash64(payload, ..., 0))}.
 *
 * <p>Why it looks like this: a read hashes about a gigabyte, so the long-input loop reads eight
 * little-endian bytes at a time through a byte-view {@link VarHandle} (intrinsified by the JIT
 * into one unaligned load, whatever the platform's byte order), keeps the eight
 * accumulators in locals instead of a {@code long[]}, and allocates nothing for seed 0 (the
 * payload hash; the 64-byte header hash with a payload-hash seed takes the short path, which
 * needs no derived secret either). Only a long input with a non-zero seed allocates, for the
 * 192-byte secret that XXH3_initCustomSecret derives from the seed.
 *
 * <p>It hashes byte arrays only: the reader's answers and decompressed records are heap arrays.
 */
public final class Xxh3 {
  private static final VarHandle ARRAY_LONG_LE =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle ARRAY_INT_LE =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  private static final long PRIME32_1 = 0x9E3779B1L;
  private static final long PRIME32_2 = 0x85EBCA77L;
  private static final long PRIME32_3 = 0xC2B2AE3DL;
  private static final long PRIME64_1 = 0x9E3779B185EBCA87L;
  private static final long PRIME64_2 = 0xC2B2AE3D27D4EB4FL;
  private static final long PRIME64_3 = 0x165667B19E3779F9L;
  private static final long PRIME64_4 = 0x85EBCA77C2B2AE63L;
  private static final long PRIME64_5 = 0x27D4EB2F165667C5L;
  private static final long PRIME_MX1 = 0x165667919E3779F9L;
  private static final long PRIME_MX2 = 0x9FB21C651E98DF25L;

  private static final int STRIPE_BYTES = 64;
  private static final int SECRET_CONSUME_BYTES = 8;
  private static final int SECRET_BYTES = 192;
  private static final int SECRET_MIN_BYTES = 136;
  private static final int STRIPES_PER_BLOCK = (SECRET_BYTES - STRIPE_BYTES) / SECRET_CONSUME_BYTES;
  private static final int BLOCK_BYTES = STRIPE_BYTES * STRIPES_PER_BLOCK;
  private static final int SCRAMBLE_SECRET_OFFSET = SECRET_BYTES - STRIPE_BYTES;
  private static final int LAST_STRIPE_SECRET_OFFSET = SECRET_BYTES - STRIPE_BYTES - 7;
  private static final int MERGE_SECRET_OFFSET = 11;
  private static final int MIDSIZE_MAX_BYTES = 240;
  private static final int MIDSIZE_START_OFFSET = 3;
  private static final int MIDSIZE_LAST_OFFSET = 17;

  /** The default secret, XXH3_kSecret: the one every length uses when the seed is 0. */
  private static final byte[] DEFAULT_SECRET =
      bytes(
          0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,
          0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3,
          0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,
          0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
          0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65,
          0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
          0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9,
          0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
          0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb,
          0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0,
          0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,
          0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
          0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e);

  static {
    if (DEFAULT_SECRET.length != SECRET_BYTES || SECRET_BYTES < SECRET_MIN_BYTES) {
      throw new AssertionError("XXH3 default secret must be " + SECRET_BYTES + " bytes");
    }
  }

  private Xxh3() {}

  /**
   * XXH3_64bits_withSeed of {@code data[offset, offset + length)}.
   *
   * @return the 64-bit hash; compare or print it unsigned ({@link Long#toUnsignedString})
   * @throws IndexOutOfBoundsException if the range is not inside {@code data}
   */
  public static long hash64(byte[] data, int offset, int length, long seed) {
    Objects.checkFromIndexSize(offset, length, data.length);
    return hash(data, offset, length, seed);
  }

  private static long hash(byte[] array, int offset, int length, long seed) {
    if (length <= 16) {
      return hashUpTo16(array, offset, length, seed);
    }
    if (length <= 128) {
      return hash17To128(array, offset, length, seed);
    }
    if (length <= MIDSIZE_MAX_BYTES) {
      return hash129To240(array, offset, length, seed);
    }
    byte[] secret = seed == 0 ? DEFAULT_SECRET : customSecret(seed);
    return hashLong(array, offset, length, secret);
  }

  private static long hashUpTo16(
      byte[] array, int offset, int length, long seed) {
    byte[] k = DEFAULT_SECRET;
    if (length > 8) {
      long bitflip1 = (le64(k, 24) ^ le64(k, 32)) + seed;
      long bitflip2 = (le64(k, 40) ^ le64(k, 48)) - seed;
      long inputLo = le64(array, offset) ^ bitflip1;
      long inputHi = le64(array, offset + length - 8) ^ bitflip2;
      long acc = length + Long.reverseBytes(inputLo) + inputHi + mul128Fold64(inputLo, inputHi);
      return avalanche(acc);
    }
    if (length >= 4) {
      long s = seed ^ ((long) Integer.reverseBytes((int) seed) << 32);
      long input1 = le32(array, offset);
      long input2 = le32(array, offset + length - 4);
      long bitflip = (le64(k, 8) ^ le64(k, 16)) - s;
      long keyed = (input2 + (input1 << 32)) ^ bitflip;
      return rrmxmx(keyed, length);
    }
    if (length > 0) {
      int c1 = byteAt(array, offset);
      int c2 = byteAt(array, offset + (length >> 1));
      int c3 = byteAt(array, offset + length - 1);
      long combined = ((c1 << 16) | (c2 << 24) | c3 | (length << 8)) & 0xFFFFFFFFL;
      long bitflip = (le32(k, 0) ^ le32(k, 4)) + seed;
      return xxh64Avalanche(combined ^ bitflip);
    }
    return xxh64Avalanche(seed ^ le64(k, 56) ^ le64(k, 64));
  }

  private static long hash17To128(
      byte[] array, int offset, int length, long seed) {
    long acc = length * PRIME64_1;
    int end = offset + length;
    if (length > 32) {
      if (length > 64) {
        if (length > 96) {
          acc += mix16(array, offset + 48, 96, seed);
          acc += mix16(array, end - 64, 112, seed);
        }
        acc += mix16(array, offset + 32, 64, seed);
        acc += mix16(array, end - 48, 80, seed);
      }
      acc += mix16(array, offset + 16, 32, seed);
      acc += mix16(array, end - 32, 48, seed);
    }
    acc += mix16(array, offset, 0, seed);
    acc += mix16(array, end - 16, 16, seed);
    return avalanche(acc);
  }

  private static long hash129To240(
      byte[] array, int offset, int length, long seed) {
    long acc = length * PRIME64_1;
    int rounds = length / 16;
    for (int i = 0; i < 8; i++) {
      acc += mix16(array, offset + 16 * i, 16 * i, seed);
    }
    acc = avalanche(acc);
    for (int i = 8; i < rounds; i++) {
      acc += mix16(array, offset + 16 * i, 16 * (i - 8) + MIDSIZE_START_OFFSET, seed);
    }
    acc +=
        mix16(
            array, offset + length - 16, SECRET_MIN_BYTES - MIDSIZE_LAST_OFFSET, seed);
    return avalanche(acc);
  }

  /** XXH3_mix16B with the default secret (the short and mid lengths never derive one). */
  private static long mix16(byte[] array, int at, int secretAt, long seed) {
    byte[] k = DEFAULT_SECRET;
    long lo = le64(array, at) ^ (le64(k, secretAt) + seed);
    long hi = le64(array, at + 8) ^ (le64(k, secretAt + 8) - seed);
    return mul128Fold64(lo, hi);
  }

  /**
   * XXH3_hashLong_64b over a byte[]: 64-byte stripes into 8 accumulators, scrambled every block
   * of 16 stripes. This loop is where nearly all of a read's hashing time goes, so it exists
   * twice, once per source: one copy over both, testing the source in the loop, measured some
   * 10-20% slower. The two differ only in the VarHandle of their eight loads.
   */
  private static long hashLong(byte[] array, int offset, int length, byte[] secret) {
    long acc0 = PRIME32_3;
    long acc1 = PRIME64_1;
    long acc2 = PRIME64_2;
    long acc3 = PRIME64_3;
    long acc4 = PRIME64_4;
    long acc5 = PRIME32_2;
    long acc6 = PRIME64_5;
    long acc7 = PRIME32_1;
    int fullBlocks = (length - 1) / BLOCK_BYTES;
    int lastBlockStripes = ((length - 1) - BLOCK_BYTES * fullBlocks) / STRIPE_BYTES;
    for (int block = 0; block <= fullBlocks; block++) {
      int stripes = block < fullBlocks ? STRIPES_PER_BLOCK : lastBlockStripes;
      int blockAt = offset + block * BLOCK_BYTES;
      for (int stripe = 0; stripe < stripes; stripe++) {
        int in = blockAt + stripe * STRIPE_BYTES;
        int sec = stripe * SECRET_CONSUME_BYTES;
        long d0 = (long) ARRAY_LONG_LE.get(array, in);
        long d1 = (long) ARRAY_LONG_LE.get(array, in + 8);
        long d2 = (long) ARRAY_LONG_LE.get(array, in + 16);
        long d3 = (long) ARRAY_LONG_LE.get(array, in + 24);
        long d4 = (long) ARRAY_LONG_LE.get(array, in + 32);
        long d5 = (long) ARRAY_LONG_LE.get(array, in + 40);
        long d6 = (long) ARRAY_LONG_LE.get(array, in + 48);
        long d7 = (long) ARRAY_LONG_LE.get(array, in + 56);
        acc0 = lane(acc0, d1, d0 ^ le64(secret, sec));
        acc1 = lane(acc1, d0, d1 ^ le64(secret, sec + 8));
        acc2 = lane(acc2, d3, d2 ^ le64(secret, sec + 16));
        acc3 = lane(acc3, d2, d3 ^ le64(secret, sec + 24));
        acc4 = lane(acc4, d5, d4 ^ le64(secret, sec + 32));
        acc5 = lane(acc5, d4, d5 ^ le64(secret, sec + 40));
        acc6 = lane(acc6, d7, d6 ^ le64(secret, sec + 48));
        acc7 = lane(acc7, d6, d7 ^ le64(secret, sec + 56));
      }
      if (block < fullBlocks) {
        acc0 = scramble(acc0, le64(secret, SCRAMBLE_SECRET_OFFSET));
        acc1 = scramble(acc1, le64(secret, SCRAMBLE_SECRET_OFFSET + 8));
        acc2 = scramble(acc2, le64(secret, SCRAMBLE_SECRET_OFFSET + 16));
        acc3 = scramble(acc3, le64(secret, SCRAMBLE_SECRET_OFFSET + 24));
        acc4 = scramble(acc4, le64(secret, SCRAMBLE_SECRET_OFFSET + 32));
        acc5 = scramble(acc5, le64(secret, SCRAMBLE_SECRET_OFFSET + 40));
        acc6 = scramble(acc6, le64(secret, SCRAMBLE_SECRET_OFFSET + 48));
        acc7 = scramble(acc7, le64(secret, SCRAMBLE_SECRET_OFFSET + 56));
      }
    }
    return lastStripeAndMerge(
        array, offset, length, secret, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
  }

  /**
   * The end of XXH3_hashLong_64b: the input's final 64 bytes as one more stripe (overlapping what
   * came before), keyed at an offset no full stripe uses, then XXH3_mergeAccs.
   */
  private static long lastStripeAndMerge(
      byte[] array,
      int offset,
      int length,
      byte[] secret,
      long acc0,
      long acc1,
      long acc2,
      long acc3,
      long acc4,
      long acc5,
      long acc6,
      long acc7) {
    int in = offset + length - STRIPE_BYTES;
    long d0 = le64(array, in);
    long d1 = le64(array, in + 8);
    long d2 = le64(array, in + 16);
    long d3 = le64(array, in + 24);
    long d4 = le64(array, in + 32);
    long d5 = le64(array, in + 40);
    long d6 = le64(array, in + 48);
    long d7 = le64(array, in + 56);
    int sec = LAST_STRIPE_SECRET_OFFSET;
    acc0 = lane(acc0, d1, d0 ^ le64(secret, sec));
    acc1 = lane(acc1, d0, d1 ^ le64(secret, sec + 8));
    acc2 = lane(acc2, d3, d2 ^ le64(secret, sec + 16));
    acc3 = lane(acc3, d2, d3 ^ le64(secret, sec + 24));
    acc4 = lane(acc4, d5, d4 ^ le64(secret, sec + 32));
    acc5 = lane(acc5, d4, d5 ^ le64(secret, sec + 40));
    acc6 = lane(acc6, d7, d6 ^ le64(secret, sec + 48));
    acc7 = lane(acc7, d6, d7 ^ le64(secret, sec + 56));
    int m = MERGE_SECRET_OFFSET;
    long result = length * PRIME64_1;
    result += mul128Fold64(acc0 ^ le64(secret, m), acc1 ^ le64(secret, m + 8));
    result += mul128Fold64(acc2 ^ le64(secret, m + 16), acc3 ^ le64(secret, m + 24));
    result += mul128Fold64(acc4 ^ le64(secret, m + 32), acc5 ^ le64(secret, m + 40));
    result += mul128Fold64(acc6 ^ le64(secret, m + 48), acc7 ^ le64(secret, m + 56));
    return avalanche(result);
  }

  /**
   * One lane of XXH3_accumulate_512: lane i adds the data of lane i^1 (swapped) and the 32x32-bit
   * product of its own keyed halves.
   */
  private static long lane(long acc, long swappedData, long keyed) {
    return acc + swappedData + (keyed & 0xFFFFFFFFL) * (keyed >>> 32);
  }

  /** XXH3_initCustomSecret: the default secret with the seed added to and taken from words. */
  private static byte[] customSecret(long seed) {
    byte[] secret = new byte[SECRET_BYTES];
    for (int i = 0; i < SECRET_BYTES; i += 16) {
      ARRAY_LONG_LE.set(secret, i, le64(DEFAULT_SECRET, i) + seed);
      ARRAY_LONG_LE.set(secret, i + 8, le64(DEFAULT_SECRET, i + 8) - seed);
    }
    return secret;
  }

  private static long scramble(long acc, long key) {
    return ((acc ^ (acc >>> 47)) ^ key) * PRIME32_1;
  }

  /**
   * The 128-bit product of two unsigned 64-bit values, its halves xored (XXH3_mul128_fold64).
   * Java 17 has only the signed {@link Math#multiplyHigh} (unsignedMultiplyHigh is Java 18+):
   * as two's complement, a negative factor counts 2^64 too little, so the unsigned high half is
   * the signed one plus each factor where the other is negative.
   */
  private static long mul128Fold64(long a, long b) {
    long high = Math.multiplyHigh(a, b) + ((a >> 63) & b) + ((b >> 63) & a);
    return (a * b) ^ high;
  }

  private static long avalanche(long h) {
    h ^= h >>> 37;
    h *= PRIME_MX1;
    return h ^ (h >>> 32);
  }

  private static long xxh64Avalanche(long h) {
    h ^= h >>> 33;
    h *= PRIME64_2;
    h ^= h >>> 29;
    h *= PRIME64_3;
    return h ^ (h >>> 32);
  }

  private static long rrmxmx(long h, int length) {
    h ^= Long.rotateLeft(h, 49) ^ Long.rotateLeft(h, 24);
    h *= PRIME_MX2;
    h ^= (h >>> 35) + length;
    h *= PRIME_MX2;
    return h ^ (h >>> 28);
  }

  private static int byteAt(byte[] array, int at) {
    return array[at] & 0xFF;
  }

  private static long le64(byte[] array, int at) {
    return (long) ARRAY_LONG_LE.get(array, at);
  }

  /** Four little-endian bytes, unsigned. */
  private static long le32(byte[] array, int at) {
    return (int) ARRAY_INT_LE.get(array, at) & 0xFFFFFFFFL;
  }

  private static byte[] bytes(int... values) {
    byte[] out = new byte[values.length];
    for (int i = 0; i < values.length; i++) {
      out[i] = (byte) values[i];
    }
    return out;
  }
}
