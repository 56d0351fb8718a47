package dev.laminar.spark;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import net.jpountz.xxhash.XXHash64;
import net.jpountz.xxhash.XXHashFactory;

/**
 * Which replicas may serve a partition's reads, best first, as every Python client picks them
 * ({@code laminar.client.client.read_replicas}): weighted rendezvous hashing on the partition
 * key ({@code laminar.placement.rank}), so the JVM reader's ranges spread over the replicas
 * exactly as Python readers' do, in proportion to the brokers' weights. Members not alive,
 * draining or of weight 0 serve none.
 */
public final class Replicas {
  /** A cluster member as {@code GET /v1/cluster} lists it. */
  public record Member(String id, String apiUrl, String state, long weight, boolean draining) {}

  /** XXH64 (seed 0), as the `xxhash` package's xxh64: lz4-java's, in Spark's own jars. */
  private static final XXHash64 XXH64 = XXHashFactory.fastestJavaInstance().hash64();
  /** The top 53 bits of the hash: exact in a double, so the unit hash is < 1 strictly. */
  private static final int UNIT_BITS = 53;

  private Replicas() {}

  /** {@code placement.partition_key}. */
  static String partitionKey(String topic, int partition) {
    return topic + "/" + partition;
  }

  /** xxh64(key ‖ 0 ‖ node) mapped strictly into (0, 1): {@code placement.unit_hash}. */
  static double unitHash(String key, String node) {
    byte[] k = key.getBytes(StandardCharsets.UTF_8);
    byte[] n = node.getBytes(StandardCharsets.UTF_8);
    byte[] joined = new byte[k.length + 1 + n.length];
    System.arraycopy(k, 0, joined, 0, k.length);
    System.arraycopy(n, 0, joined, k.length + 1, n.length);
    long digest = XXH64.hash(joined, 0, joined.length, 0L);
    return ((double) (digest >>> (64 - UNIT_BITS)) + 0.5) / (double) (1L << UNIT_BITS);
  }

  /** {@code placement.score}: -weight / ln(unit hash). */
  static double score(String key, String node, long weight) {
    return -(double) weight / Math.log(unitHash(key, node));
  }

  private record Scored(double score, String id) {}

  /**
   * {@code placement.rank}: the eligible candidates (alive, not draining, weight > 0) by
   * descending score, ties broken by id.
   */
  static List<String> rank(String key, List<Member> candidates) {
    List<Scored> scored = new ArrayList<>();
    for (Member c : candidates) {
      if (c.state().equals("alive") && !c.draining() && c.weight() > 0) {
        scored.add(new Scored(score(key, c.id(), c.weight()), c.id()));
      }
    }
    scored.sort(
        Comparator.comparingDouble((Scored s) -> -s.score())
            .thenComparing(Scored::id, PyText.ORDER));
    List<String> out = new ArrayList<>();
    for (Scored s : scored) {
      out.add(s.id());
    }
    return out;
  }

  /**
   * API URLs (no trailing slash) of the partition's in-sync replicas that may serve reads,
   * best first: {@code read_replicas(topic, partition, state, members)}.
   */
  public static List<String> readReplicas(
      String topic, int partition, List<String> inSync, List<Member> members) {
    Map<String, Member> byId = new LinkedHashMap<>();
    for (Member m : members) {
      if (m.apiUrl() != null && !m.apiUrl().isEmpty()) {
        byId.put(m.id(), m);
      }
    }
    List<Member> candidates = new ArrayList<>();
    for (String node : inSync) {
      Member m = byId.get(node);
      if (m != null) {
        candidates.add(new Member(m.id(), m.apiUrl(), m.state(), Math.max(m.weight(), 0),
            m.draining()));
      }
    }
    List<String> out = new ArrayList<>();
    for (String node : rank(partitionKey(topic, partition), candidates)) {
      out.add(byId.get(node).apiUrl().replaceAll("/+$", ""));
    }
    return out;
  }
}
