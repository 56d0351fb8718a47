package dev.laminar.spark;

import com.github.luben.zstd.Zstd;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import net.jpountz.lz4.LZ4FrameInputStream;

/**
 * A compressed records section (laminar/log/compression.py): u32 records_bytes, then one zstd
 * or LZ4 frame. The declared length bounds the output before the codec runs, and no more than
 * it is ever taken out of the codec, so a small section cannot expand without bound.
 */
final class Codecs {
  /** The most a batch's records may decompress to: the broker's own bound (u32). */
  static final long MAX_RECORDS_BYTES = 0xffffffffL;

  private Codecs() {}

  static ByteBuffer decompress(int codec, ByteBuffer body, int at, int length) {
    if (length < 4) {
      throw new IllegalStateException("a compressed records section is cut short");
    }
    long declared = body.getInt(at) & 0xffffffffL;
    if (declared > Integer.MAX_VALUE - 16) {
      throw new IllegalStateException("a compressed batch declares " + declared + " bytes");
    }
    byte[] frame = new byte[length - 4];
    body.get(at + 4, frame, 0, frame.length);
    byte[] out = new byte[(int) declared];
    try {
      if (codec == Batches.CODEC_ZSTD) {
        long size = Zstd.getFrameContentSize(frame);
        if (size != declared) {
          throw new IllegalStateException(
              "a zstd frame's content size " + size + " is not the declared " + declared);
        }
        long got = Zstd.decompressByteArray(out, 0, out.length, frame, 0, frame.length);
        if (Zstd.isError(got) || got != declared) {
          throw new IllegalStateException("a zstd frame does not decompress to its length");
        }
      } else if (codec == Batches.CODEC_LZ4) {
        try (InputStream in = new LZ4FrameInputStream(new ByteArrayInputStream(frame))) {
          int got = in.readNBytes(out, 0, out.length);
          if (got != declared || in.read() != -1) {
            throw new IllegalStateException("an lz4 frame does not decompress to its length");
          }
        }
      } else {
        throw new IllegalStateException("unknown compression codec " + codec);
      }
    } catch (IOException e) {
      throw new IllegalStateException("a compressed batch does not decompress: " + e, e);
    }
    return ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN);
  }
}
