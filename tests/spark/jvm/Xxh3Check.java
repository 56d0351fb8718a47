import dev.laminar.spark.Xxh3;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Test driver for tests/spark/jvm/test_xxh3.py: for each stdin line {@code <seed> <hex bytes>}
 * (seed unsigned decimal, hex possibly empty) prints one line of three unsigned decimal hashes of
 * those bytes, through each way the reader may hand them over: an exact-size byte[] at offset 0
 * (so a read past the range throws instead of hashing a neighbour), a direct ByteBuffer in its
 * default big-endian order at a non-zero offset, and a read-only little-endian heap ByteBuffer at
 * another offset (both buffers surrounded by filler bytes, so a read outside the range changes the
 * hash). Exits non-zero if a hash moved a buffer's position or limit.
 */
public final class Xxh3Check {
  private static final int DIRECT_OFFSET = 7;
  private static final int HEAP_OFFSET = 13;
  private static final byte FILLER = (byte) 0xA5;

  public static void main(String[] args) throws IOException {
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII), 1 << 16);
    BufferedWriter out =
        new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.US_ASCII), 1 << 16);
    String line;
    while ((line = in.readLine()) != null) {
      int space = line.indexOf(' ');
      String seedText = space < 0 ? line : line.substring(0, space);
      long seed = Long.parseUnsignedLong(seedText);
      byte[] data = space < 0 ? new byte[0] : hex(line, space + 1);

      long fromArray = Xxh3.hash64(data, 0, data.length, seed);

      ByteBuffer direct = ByteBuffer.allocateDirect(DIRECT_OFFSET + data.length + 11);
      while (direct.hasRemaining()) {
        direct.put(FILLER);
      }
      direct.put(DIRECT_OFFSET, data);
      direct.position(3).limit(direct.capacity() - 1);
      long fromDirect = Xxh3.hash64(direct, DIRECT_OFFSET, data.length, seed);
      if (direct.position() != 3 || direct.limit() != direct.capacity() - 1) {
        throw new IllegalStateException("hash64 moved the direct buffer's position or limit");
      }

      byte[] backing = new byte[HEAP_OFFSET + data.length + 5];
      Arrays.fill(backing, FILLER);
      System.arraycopy(data, 0, backing, HEAP_OFFSET, data.length);
      ByteBuffer heap = ByteBuffer.wrap(backing).asReadOnlyBuffer().order(ByteOrder.LITTLE_ENDIAN);
      long fromHeap = Xxh3.hash64(heap, HEAP_OFFSET, data.length, seed);
      if (heap.position() != 0) {
        throw new IllegalStateException("hash64 moved the heap buffer's position");
      }

      out.write(Long.toUnsignedString(fromArray));
      out.write(' ');
      out.write(Long.toUnsignedString(fromDirect));
      out.write(' ');
      out.write(Long.toUnsignedString(fromHeap));
      out.write('\n');
    }
    out.flush();
  }

  private static byte[] hex(String line, int from) {
    int digits = line.length() - from;
    if (digits % 2 != 0) {
      throw new IllegalArgumentException("odd number of hex digits");
    }
    byte[] data = new byte[digits / 2];
    for (int i = 0; i < data.length; i++) {
      int high = Character.digit(line.charAt(from + 2 * i), 16);
      int low = Character.digit(line.charAt(from + 2 * i + 1), 16);
      if (high < 0 || low < 0) {
        throw new IllegalArgumentException("not a hex digit near column " + (from + 2 * i));
      }
      data[i] = (byte) (high << 4 | low);
    }
    return data;
  }
}
