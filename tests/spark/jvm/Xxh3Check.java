import dev.laminar.spark.Xxh3;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Test driver for tests/spark/jvm/test_xxh3.py: for each stdin line {@code <seed> <hex bytes>}
 * (seed unsigned decimal, hex possibly empty) prints one line of two unsigned decimal hashes of
 * those bytes: from an exact-size byte[] at offset 0 (a read past the range throws instead of
 * hashing a neighbour), and from a larger array at a non-zero offset with filler bytes around
 * them (a read outside the range changes the hash).
 */
public final class Xxh3Check {
  private static final int INNER_OFFSET = 13;
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

      byte[] padded = new byte[INNER_OFFSET + data.length + 5];
      Arrays.fill(padded, FILLER);
      System.arraycopy(data, 0, padded, INNER_OFFSET, data.length);
      long fromInside = Xxh3.hash64(padded, INNER_OFFSET, data.length, seed);

      out.write(Long.toUnsignedString(fromArray));
      out.write(' ');
      out.write(Long.toUnsignedString(fromInside));
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
