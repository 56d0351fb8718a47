package dev.laminar.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The committed records low <= index < high of one topic partition, as rows: the answers of
 * {@link Fetcher} walked batch by batch, each batch's checksum verified once, control batches
 * skipped. Without headers a row is written straight from the answer buffer into an UnsafeRow
 * (one copy of each value); with includeHeaders the rows are generic.
 */
final class RangeReader implements PartitionReader<InternalRow> {
  private static final int KEY = 0, VALUE = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4;
  private static final int TIMESTAMP = 5, TIMESTAMP_TYPE = 6;

  private final RangePartition range;
  private final boolean includeHeaders;
  private final boolean failOnDataLoss;
  private final Fetcher fetcher;
  private final UTF8String topic;
  private final UnsafeRowWriter writer;
  private final int indexColumn;

  /** The next index to read; the answer's batches, as a little-endian view. */
  private long position;
  private Fetcher.Answer answer;
  private long fetchedAt; // the index the answer was asked from
  private ByteBuffer body;
  private int bodyEnd;
  private int nextBatchAt;
  /** The records of the batch being walked: in `body`, or in a decompressed copy. */
  private ByteBuffer records;
  private int recordAt;
  private int recordsEnd; // where the batch's records end: its last record must end there
  private int recordsLeft;
  private long recordIndex;
  private long batchBase;
  private long firstTimestampMs;
  private InternalRow row;

  RangeReader(RangePartition range, ReadSettings settings) {
    this.range = range;
    this.includeHeaders = settings.includeHeaders;
    this.failOnDataLoss = settings.failOnDataLoss;
    this.fetcher = new Fetcher(range, settings);
    this.topic = UTF8String.fromString(range.topic);
    this.indexColumn = includeHeaders ? 8 : 7;
    this.writer = new UnsafeRowWriter(indexColumn + 1, 2 * 1024);
    this.position = range.low;
  }

  @Override
  public boolean next() throws IOException {
    while (true) {
      if (recordsLeft > 0) {
        if (takeRecord()) {
          return true;
        }
        continue;
      }
      if (body != null && nextBatchAt < bodyEnd) {
        startBatch(nextBatchAt);
        continue;
      }
      if (body != null) {
        finishAnswer();
      }
      if (position >= range.high) {
        return false;
      }
      fetch();
    }
  }

  private void fetch() throws IOException {
    Fetcher.Answer got = fetcher.read(position, range.high);
    if (got.outOfRange) {
      long logStart = got.logStart > position ? got.logStart : position + 1;
      if (failOnDataLoss) {
        throw new DataLossException(
            range.topic + "/" + range.partition + ": records " + position + ".." + (logStart - 1)
                + " were removed (retention) before they were read; set failOnDataLoss=false to"
                + " skip them");
      }
      position = logStart;
      body = null;
      return;
    }
    answer = got;
    fetchedAt = position;
    body = got.body;
    bodyEnd = got.length;
    nextBatchAt = 0;
  }

  /**
   * Every batch of the answer was looked at. An answer that moved nothing on (no batch from
   * `position`) says where the next record is (Laminar-Next-Index: past records a transaction
   * aborted, which read_committed reads leave out), or holds nothing yet: the replica has not
   * learned the commit index the range was planned from (it waited READ_WAIT_MS), or a
   * transaction still open holds the records back; then the same index is asked for again.
   */
  private void finishAnswer() {
    Fetcher.Answer done = answer;
    body = null;
    answer = null;
    if (position > fetchedAt) {
      return;
    }
    if (done.nextIndex > fetchedAt) {
      position = done.nextIndex;
      return;
    }
    fetcher.noProgress(fetchedAt, done.commitIndex);
  }

  /** Look at the batch at byte `at` of the answer: skip it, or make its records next. */
  private void startBatch(int at) {
    Batches.checkFrame(body, at, bodyEnd);
    long base = Batches.baseIndex(body, at);
    int count = Batches.recordCount(body, at);
    int payload = Batches.payloadBytes(body, at);
    nextBatchAt = at + Batches.HEADER_BYTES + payload;
    if (base >= range.high) {
      position = range.high;
      nextBatchAt = bodyEnd;
      return;
    }
    long after = base + count;
    if (after > position) {
      position = after;
    }
    int attributes = Batches.attributes(body, at);
    if ((attributes & Batches.CONTROL) != 0 || after <= range.low) {
      return;
    }
    Batches.verify(body, at);
    int codec = (attributes & Batches.CODEC_MASK) >>> Batches.CODEC_SHIFT;
    if (codec == Batches.CODEC_NONE) {
      records = body;
      recordAt = at + Batches.HEADER_BYTES;
    } else {
      records = Codecs.decompress(codec, body, at + Batches.HEADER_BYTES, payload);
      recordAt = 0;
    }
    recordsLeft = count;
    recordsEnd = codec == Batches.CODEC_NONE ? nextBatchAt : records.limit();
    recordIndex = base;
    batchBase = base;
    firstTimestampMs = Batches.firstTimestampMs(body, at);
  }

  /** The next record of the batch as `row`; false when it lies outside the range. */
  private boolean takeRecord() {
    ByteBuffer r = records;
    int at = recordAt;
    long deltaMs = r.getInt(at);
    int keyBytes = r.getInt(at + 4);
    int valueBytes = r.getInt(at + 8);
    int headerCount = r.getShort(at + 12) & 0xffff;
    int keyAt = at + Batches.RECORD_HEADER_BYTES;
    int valueAt = keyAt + Math.max(keyBytes, 0);
    // (long: lengths a damaged batch declares cannot wrap around; the checksum has passed,
    // so only a broker's bug could make them wrong, and that is an error, not rows)
    long end = (long) valueAt + Math.max(valueBytes, 0);
    int headersAt = (int) Math.min(end, recordsEnd);
    for (int h = 0; h < headerCount; h++) {
      if (end + 6 > recordsEnd) {
        end = Long.MAX_VALUE; // cut short: malformed
        break;
      }
      int nameBytes = r.getShort((int) end) & 0xffff;
      long headerValueBytes = r.getInt((int) end + 2) & 0xffffffffL;
      end += 6 + nameBytes + headerValueBytes;
    }
    if (keyBytes < -1 || valueBytes < -1 || end > recordsEnd
        || (recordsLeft == 1 && end != recordsEnd)) {
      throw new IllegalStateException(
          range + ": malformed records in the batch at index " + batchBase);
    }
    recordAt = (int) end;
    recordsLeft--;
    long index = recordIndex++;
    if (index >= range.high) {
      recordsLeft = 0; // (the rest of the batch lies past the range too)
      return false;
    }
    if (index < range.low) {
      return false;
    }
    long micros = (firstTimestampMs + deltaMs) * 1000L;
    if (includeHeaders) {
      row = generic(r, keyAt, keyBytes, valueAt, valueBytes, index, micros, headersAt, headerCount);
    } else {
      row = unsafe(r, keyAt, keyBytes, valueAt, valueBytes, index, micros);
    }
    return true;
  }

  private InternalRow unsafe(
      ByteBuffer r, int keyAt, int keyBytes, int valueAt, int valueBytes, long index, long micros) {
    UnsafeRowWriter w = writer;
    w.reset();
    w.zeroOutNullBytes();
    byte[] array = r.array();
    int base = r.arrayOffset();
    if (keyBytes < 0) {
      w.setNullAt(KEY);
    } else {
      w.write(KEY, array, base + keyAt, keyBytes);
    }
    if (valueBytes < 0) {
      w.setNullAt(VALUE);
    } else {
      w.write(VALUE, array, base + valueAt, valueBytes);
    }
    w.write(TOPIC, topic);
    w.write(PARTITION, range.partition);
    w.write(OFFSET, index);
    w.write(TIMESTAMP, micros);
    w.write(TIMESTAMP_TYPE, 0);
    w.write(indexColumn, index);
    return w.getRow();
  }

  private InternalRow generic(
      ByteBuffer r, int keyAt, int keyBytes, int valueAt, int valueBytes, long index, long micros,
      int headersAt, int headerCount) {
    Object[] headers = new Object[headerCount];
    int at = headersAt;
    for (int h = 0; h < headerCount; h++) {
      int nameBytes = r.getShort(at) & 0xffff;
      int valueLength = r.getInt(at + 2);
      at += 6;
      UTF8String name = UTF8String.fromBytes(slice(r, at, nameBytes));
      at += nameBytes;
      headers[h] = new GenericInternalRow(new Object[] {name, slice(r, at, valueLength)});
      at += valueLength;
    }
    return new GenericInternalRow(
        new Object[] {
          keyBytes < 0 ? null : slice(r, keyAt, keyBytes),
          valueBytes < 0 ? null : slice(r, valueAt, valueBytes),
          topic,
          range.partition,
          index,
          micros,
          0,
          new GenericArrayData(headers),
          index
        });
  }

  private static byte[] slice(ByteBuffer r, int at, int length) {
    byte[] out = new byte[length];
    r.get(at, out, 0, length);
    return out;
  }

  @Override
  public InternalRow get() {
    return row;
  }

  @Override
  public void close() {
    try {
      fetcher.close();
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) {
      throw new UncheckedIOException(new IOException(e));
    }
  }
}
