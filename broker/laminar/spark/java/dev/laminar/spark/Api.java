package dev.laminar.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashSet;
import java.util.Optional;

/**
 * The driver's JSON calls for planning (topic descriptions, the partition table, the members,
 * offsets for timestamps), to any broker that answers: the brokers given are tried in turn,
 * as a Kafka client's bootstrap servers are. A 4xx is the answer (a topic that does not exist
 * is an error the caller reports); a broker down or answering 5xx is left for the next.
 */
final class Api {
  /** A broker's JSON error answer. */
  static final class Refused extends RuntimeException {
    private static final long serialVersionUID = 1L;
    final int status;

    Refused(int status, String message) {
      super(message);
      this.status = status;
    }
  }

  private static final ObjectMapper JSON = new ObjectMapper();
  private static final long FIRST_PAUSE_MS = 50;
  private static final long LONGEST_PAUSE_MS = 2_000;
  private String lastProblem;
  /** Redirects followed per broker tried (laminar.client.client.MAX_REDIRECTS). */
  static final int MAX_REDIRECTS = 5;
  private final ReadSettings settings;
  private final HttpClient client;

  Api(ReadSettings settings) {
    this.settings = settings;
    this.client = Http.client(settings.caFile, settings.requestTimeoutMs);
  }

  static String segment(String name) {
    return URLEncoder.encode(name, StandardCharsets.UTF_8).replace("+", "%20");
  }

  JsonNode describeTopic(String topic) {
    return get("/v1/topics/" + segment(topic));
  }

  JsonNode partitions() {
    return get("/v1/partitions");
  }

  JsonNode cluster() {
    return get("/v1/cluster");
  }

  /** Every partition's first index at or after `timestampMs` (Kafka's offsetsForTimes). */
  JsonNode topicOffsets(String topic, long timestampMs) {
    return get("/v1/topics/" + segment(topic) + "/offsets?timestamp_ms=" + timestampMs);
  }

  JsonNode partitionOffsets(String topic, int partition, long timestampMs) {
    return partitionOffsets(topic, partition, timestampMs, null);
  }

  /** The same, asked of the partition's leader first (it answers; the others redirect). */
  JsonNode partitionOffsets(String topic, int partition, long timestampMs, String leaderUrl) {
    return get(
        "/v1/topics/" + segment(topic) + "/partitions/" + partition + "/offsets?timestamp_ms="
            + timestampMs,
        leaderUrl);
  }

  JsonNode get(String path) {
    return get(path, null);
  }

  /**
   * `path` of `first` (when given), else of the brokers in turn; a 307/308 redirect (to a
   * partition's leader) is followed, MAX_REDIRECTS hops at most, with the token, as the Python
   * client does.
   */
  JsonNode get(String path, String first) {
    LinkedHashSet<String> bases = new LinkedHashSet<>();
    if (first != null && !first.isEmpty()) {
      bases.add(first.replaceAll("/+$", ""));
    }
    for (String broker : settings.brokers) {
      bases.add(broker.replaceAll("/+$", ""));
    }
    // brokers down or answering 5xx (a cluster in motion) are tried again, in turn, with a
    // growing pause, until the request timeout has passed, as the Python client does
    long deadlineNs = System.nanoTime() + settings.requestTimeoutMs * 1_000_000L;
    long pauseMs = FIRST_PAUSE_MS;
    String problem = null;
    while (true) {
      for (String broker : bases) {
        try {
          JsonNode answer = attempt(broker, path);
          if (answer != null) {
            return answer;
          }
          problem = lastProblem;
        } catch (IOException e) {
          problem = broker + ": " + e;
        }
      }
      if (System.nanoTime() > deadlineNs) {
        throw new IllegalStateException(
            "no broker answered GET " + path + " within " + settings.requestTimeoutMs + " ms: "
                + problem);
      }
      try {
        Thread.sleep(pauseMs);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted", e);
      }
      pauseMs = Math.min(pauseMs * 2, LONGEST_PAUSE_MS);
    }
  }

  /** One broker's JSON answer to GET `path`; null (lastProblem says why) if it cannot give one now. */
  private JsonNode attempt(String broker, String path) throws IOException {
    URI target = URI.create(broker + path);
    HttpResponse<byte[]> response = null;
    boolean redirected = false;
    for (int hop = 0; hop <= MAX_REDIRECTS; hop++) {
      HttpRequest.Builder request =
          HttpRequest.newBuilder(target)
              .timeout(Duration.ofMillis(settings.requestTimeoutMs))
              .header("Accept", "application/json")
              .GET();
      if (settings.token != null) {
        request.header("Authorization", "Bearer " + settings.token);
      }
      try {
        response = client.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted", e);
      }
      Optional<String> location = response.headers().firstValue("Location");
      redirected =
          (response.statusCode() == 307 || response.statusCode() == 308) && location.isPresent();
      if (!redirected) {
        break;
      }
      target = target.resolve(location.get());
    }
    int status = response.statusCode();
    if (redirected) {
      lastProblem = broker + ": over " + MAX_REDIRECTS + " redirects";
      return null;
    }
    if (status >= 500 || status == 429) {
      lastProblem = broker + " answered " + status;
      return null;
    }
    JsonNode body = JSON.readTree(response.body());
    if (status >= 400) {
      throw new Refused(status, message(body, status));
    }
    return body;
  }

  private static String message(JsonNode body, int status) {
    JsonNode error = body == null ? null : body.path("error");
    if (error != null && error.hasNonNull("message")) {
      return error.get("message").asText();
    }
    return "the broker answered " + status;
  }
}
