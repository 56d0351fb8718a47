package dev.laminar.spark;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.http.Header;
import org.apache.http.HttpEntity;
import org.apache.http.client.methods.CloseableHttpResponse;
import org.apache.http.client.methods.HttpGet;
import org.apache.http.impl.client.CloseableHttpClient;

/**
 * Binary reads of one topic partition from its replicas, received into one buffer reused from
 * read to read. A replica that cannot serve (down, 503, a redirect elsewhere) is left for the
 * next; the whole list is tried again with a growing pause until the request timeout has
 * passed with no answer. Only a 200 of stored batches, or a 416 (out of range) is an answer.
 */
final class Fetcher implements AutoCloseable {
  /** As much as a broker gives in one answer (contract.MAX_READ_BYTES / MAX_READ_RECORDS). */
  static final int READ_MAX_BYTES = 16 << 20;
  static final int READ_MAX_RECORDS = 100_000;
  /** How long a replica may take to learn the commit index the range was planned from. */
  static final int READ_WAIT_MS = 10_000;
  /** The longest a transaction may stay open (contract.MAX_TXN_TIMEOUT_MS). */
  static final long MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000L;
  private static final long FIRST_PAUSE_MS = 50;
  private static final long LONGEST_PAUSE_MS = 2_000;
  /** Redirects followed in a row before the broker is taken as unable to serve. */
  private static final int MAX_REDIRECTS = 5;

  /** One answer: the batches in `body[0:length]`, or out of range (`logStart` then). */
  static final class Answer {
    final ByteBuffer body;
    final int length;
    final long nextIndex; // Laminar-Next-Index: where the next read starts (-1: not given)
    final long commitIndex;
    final long logStart;
    final boolean outOfRange;

    Answer(ByteBuffer body, int length, long nextIndex, long commitIndex, long logStart,
        boolean outOfRange) {
      this.body = body;
      this.length = length;
      this.nextIndex = nextIndex;
      this.commitIndex = commitIndex;
      this.logStart = logStart;
      this.outOfRange = outOfRange;
    }
  }

  private final RangePartition range;
  private final ReadSettings settings;
  private final CloseableHttpClient client;
  private final List<String> urls = new ArrayList<>();
  private final long heldUntilNs;
  private int current;
  private byte[] buffer = new byte[0];
  /** Where the last attempt's answer redirected the read (null: it did not). */
  private String redirectedTo;

  Fetcher(RangePartition range, ReadSettings settings) {
    this.range = range;
    this.settings = settings;
    this.client = Http.blockingClient(settings.caFile, settings.requestTimeoutMs + READ_WAIT_MS);
    for (String url : range.replicaUrls) {
      urls.add(url);
    }
    for (String url : settings.brokers) {
      if (!urls.contains(url)) {
        urls.add(url); // any broker redirects to a replica that can serve
      }
    }
    this.heldUntilNs =
        System.nanoTime() + (MAX_TXN_TIMEOUT_MS + READ_WAIT_MS) * 1_000_000L;
  }

  /** The next answer from index `at` (records below `high` only are wanted). */
  Answer read(long at, long high) throws IOException {
    long records = Math.min(READ_MAX_RECORDS, high - at);
    String path =
        "/v1/topics/" + URLEncoder.encode(range.topic, StandardCharsets.UTF_8) + "/partitions/"
            + range.partition + "/records?from=" + at + "&max_records=" + records
            + "&max_bytes=" + READ_MAX_BYTES + "&wait_ms=" + READ_WAIT_MS;
    long deadlineNs = System.nanoTime() + settings.requestTimeoutMs * 1_000_000L;
    long pauseMs = FIRST_PAUSE_MS;
    String problem = null;
    int tried = 0;
    int redirects = 0;
    while (true) {
      String base = urls.get(current);
      try {
        Answer answer = attempt(base + path);
        if (answer != null) {
          return answer;
        }
        problem = base + " could not serve the read";
        if (redirectedTo != null && ++redirects <= MAX_REDIRECTS) {
          current = urls.indexOf(redirectedTo);
          if (current < 0) {
            urls.add(redirectedTo);
            current = urls.size() - 1;
          }
          redirectedTo = null;
          continue;
        }
        redirectedTo = null;
      } catch (IOException e) {
        problem = base + ": " + e;
      }
      current = (current + 1) % urls.size();
      if (++tried % urls.size() == 0) {
        if (System.nanoTime() > deadlineNs) {
          throw new IOException(
              range + ": no replica served the read within " + settings.requestTimeoutMs
                  + " ms; last: " + problem);
        }
        sleep(pauseMs);
        pauseMs = Math.min(pauseMs * 2, LONGEST_PAUSE_MS);
      }
    }
  }

  /** An answer that holds no record from `at`: wait on while a transaction may hold it. */
  void noProgress(long at, long commitIndex) {
    if (commitIndex >= at && System.nanoTime() < heldUntilNs) {
      return; // committed, but held back by a transaction still open before it: read again
    }
    String why = commitIndex < at
        ? " (the replica has committed up to " + commitIndex + " after waiting "
            + READ_WAIT_MS / 1000 + " s)"
        : " (the replica has committed up to " + commitIndex + ")";
    throw new IllegalStateException(range + ": no progress reading at " + at + why);
  }

  private Answer attempt(String url) throws IOException {
    HttpGet request = new HttpGet(URI.create(url));
    request.setHeader("Accept", Http.BATCH_TYPE);
    if (settings.token != null) {
      request.setHeader("Authorization", "Bearer " + settings.token);
    }
    try (CloseableHttpResponse response = client.execute(request)) {
      int status = response.getStatusLine().getStatusCode();
      HttpEntity entity = response.getEntity();
      try (InputStream in = entity == null ? InputStream.nullInputStream() : entity.getContent()) {
        Header type = response.getFirstHeader("Content-Type");
        if (status == 200 && type != null && type.getValue().startsWith(Http.BATCH_TYPE)) {
          long length = entity.getContentLength();
          if (length < 0 || length > READ_MAX_BYTES * 2L) {
            throw new IOException("a read answer without a usable Content-Length");
          }
          int size = (int) length;
          if (buffer.length < size) {
            buffer = new byte[Math.max(size, READ_MAX_BYTES + (1 << 16))];
          }
          int got = in.readNBytes(buffer, 0, size);
          if (got != size) {
            throw new IOException("a read answer was cut short at " + got + " of " + size);
          }
          return new Answer(
              ByteBuffer.wrap(buffer, 0, size).order(ByteOrder.LITTLE_ENDIAN), size,
              header(response, Http.NEXT_INDEX, -1), header(response, Http.COMMIT_INDEX, -1),
              header(response, Http.LOG_START, 0), false);
        }
        byte[] text = in.readNBytes(4096);
        in.transferTo(OutputStream.nullOutputStream()); // (the connection stays usable)
        if (status == 416) {
          return new Answer(null, 0, -1, -1, header(response, Http.LOG_START, -1), true);
        }
        Header location = response.getFirstHeader("Location");
        if (status >= 300 && status < 400 && location != null) {
          URI to = URI.create(url).resolve(location.getValue());
          redirectedTo = to.getScheme() + "://" + to.getRawAuthority();
          return null; // (a broker's redirect names another member: the token may go there)
        }
        if (status == 429 || status == 502 || status == 503 || status == 504 || status == 421) {
          return null; // this replica cannot serve now: the next one
        }
        throw new IllegalStateException(
            range + ": the broker answered " + status + ": "
                + new String(text, StandardCharsets.UTF_8));
      }
    }
  }

  private static long header(CloseableHttpResponse response, String name, long missing) {
    Header header = response.getFirstHeader(name);
    if (header == null) {
      return missing;
    }
    try {
      return Long.parseLong(header.getValue().trim());
    } catch (NumberFormatException e) {
      return missing;
    }
  }

  private static void sleep(long ms) throws IOException {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted", e);
    }
  }

  @Override
  public void close() throws IOException {
    buffer = new byte[0];
    client.close();
  }
}
