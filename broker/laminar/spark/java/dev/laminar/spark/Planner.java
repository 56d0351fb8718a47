package dev.laminar.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Pattern;

/**
 * A batch read's plan, on the driver, as the Python source's {@code BatchReader.partitions()}
 * (source.py): the partitions read ({@code subscribe}, {@code subscribePattern} or
 * {@code assign}) and their bounds from the brokers, where the read starts and ends (offsets,
 * or timestamps looked up by the brokers), cut into ranges (one per topic partition, split for
 * minPartitions). Each range carries the replicas that may serve it, best first, as Python
 * readers pick them (Replicas), then the leader. Nothing to read is no range at all.
 *
 * <p>The options' token must be resolved first (Options.withCredentials).
 */
public final class Planner {
  private final Options options;
  private Api api;
  /** Per topic, per partition: its row of the status table (in-sync replicas, leader URL). */
  private final Map<String, Map<Integer, JsonNode>> states = new LinkedHashMap<>();

  public Planner(Options options) {
    this.options = options;
  }

  private Api api() {
    if (api == null) {
      api = new Api(options.settings());
    }
    return api;
  }

  /** The ranges to read, each with its replicas; empty when nothing is to be read. */
  public List<RangePartition> plan() {
    List<Offsets.Range> ranges = ranges();
    List<RangePartition> out = new ArrayList<>();
    if (ranges.isEmpty()) {
      return out;
    }
    List<Replicas.Member> members = new ArrayList<>();
    for (JsonNode m : api().cluster().path("members")) {
      members.add(
          new Replicas.Member(
              m.path("id").asText(),
              m.path("api_url").asText(""),
              m.path("state").asText(""),
              m.path("weight").asLong(1),
              m.path("draining").asBoolean(false)));
    }
    for (Offsets.Range range : ranges) {
      JsonNode state = states.get(range.topic()).get(range.partition());
      List<String> inSync = new ArrayList<>();
      for (JsonNode node : state.path("in_sync")) {
        inSync.add(node.asText());
      }
      List<String> urls =
          new ArrayList<>(
              Replicas.readReplicas(range.topic(), range.partition(), inSync, members));
      String leader = state.path("leader_url").asText("").replaceAll("/+$", "");
      if (!leader.isEmpty() && !urls.contains(leader)) {
        urls.add(leader);
      }
      out.add(
          new RangePartition(
              range.topic(), range.partition(), range.low(), range.high(),
              urls.toArray(new String[0])));
    }
    return out;
  }

  /** The ranges alone: {@code plan(start, end, min_partitions)}. */
  public List<Offsets.Range> ranges() {
    Map<String, Map<String, Offsets.Bounds>> bounds = bounds();
    Map<String, Map<String, Long>> start = startingOffsets(bounds);
    Map<String, Map<String, Long>> end = endingOffsets(bounds);
    long minPartitions =
        options.minPartitions == null
            ? 0
            : options.minPartitions.min(BigInteger.valueOf(Long.MAX_VALUE)).longValue();
    return Offsets.plan(start, end, minPartitions);
  }

  /** Every partition read, per topic: its first stored index and next index to commit. */
  Map<String, Map<String, Offsets.Bounds>> bounds() {
    Map<String, Map<String, Offsets.Bounds>> out = new LinkedHashMap<>();
    states.clear();
    if (options.pattern != null) {
      Pattern matches = Options.compile(options.pattern);
      for (JsonNode state : api().partitions().path("partitions")) {
        String topic = state.path("topic").asText(null);
        if (topic != null && matches.matcher(topic).matches()) {
          out.computeIfAbsent(topic, t -> new LinkedHashMap<>())
              .put(String.valueOf(state.path("partition").asInt()), bounds(state));
          states.computeIfAbsent(topic, t -> new LinkedHashMap<>())
              .put(state.path("partition").asInt(), state);
        }
      }
      return out;
    }
    Map<String, List<BigInteger>> wanted = new LinkedHashMap<>();
    if (options.assigned != null) {
      wanted.putAll(options.assigned);
    }
    List<String> topics = options.assigned != null ? List.copyOf(wanted.keySet()) : options.topics;
    for (String topic : topics) {
      List<BigInteger> partitions = wanted.get(topic);
      JsonNode described;
      try {
        described = api().describeTopic(topic);
      } catch (Api.Refused e) {
        if (e.status == 404) {
          throw new IllegalArgumentException(
              "topic " + PyText.repr(topic) + " does not exist", e);
        }
        throw e;
      }
      Map<Integer, JsonNode> byPartition = new TreeMap<>();
      for (JsonNode state : described.path("partition_states")) {
        byPartition.put(state.path("partition").asInt(), state);
      }
      Set<BigInteger> known = new HashSet<>();
      byPartition.keySet().forEach(p -> known.add(BigInteger.valueOf(p)));
      TreeSet<BigInteger> missing = new TreeSet<>();
      for (BigInteger p : partitions == null ? List.<BigInteger>of() : partitions) {
        if (!known.contains(p)) {
          missing.add(p);
        }
      }
      if (!missing.isEmpty()) {
        throw new IllegalArgumentException(
            "option assign: topic " + PyText.repr(topic) + " has no partitions "
                + PyText.repr(new ArrayList<>(missing)));
      }
      Map<String, Offsets.Bounds> read = new LinkedHashMap<>();
      Map<Integer, JsonNode> readStates = new LinkedHashMap<>();
      List<Integer> chosen = new ArrayList<>();
      if (partitions == null) {
        chosen.addAll(byPartition.keySet());
      } else {
        partitions.forEach(p -> chosen.add(p.intValueExact()));
      }
      for (int p : chosen) {
        read.put(String.valueOf(p), bounds(byPartition.get(p)));
        readStates.put(p, byPartition.get(p));
      }
      out.put(topic, read);
      states.put(topic, readStates);
    }
    return out;
  }

  private static Offsets.Bounds bounds(JsonNode state) {
    return new Offsets.Bounds(
        state.path("log_start").asLong(), state.path("commit_index").asLong() + 1);
  }

  /**
   * Per partition of `wanted`, the index of its first record whose timestamp is at or after
   * the partition's (null: no record that late), from the brokers (Kafka's offsetsForTimes):
   * one call per topic when its partitions share one timestamp, else one per partition.
   */
  Map<String, Map<String, Long>> timesToOffsets(Map<String, Map<String, Long>> wanted) {
    Map<String, Map<String, Long>> found = new LinkedHashMap<>();
    for (Map.Entry<String, Map<String, Long>> topic : wanted.entrySet()) {
      Map<String, Long> parts = topic.getValue();
      Map<String, Long> indexes = new LinkedHashMap<>();
      found.put(topic.getKey(), indexes);
      Set<Long> stamps = new HashSet<>(parts.values());
      if (stamps.size() == 1) {
        Map<Integer, Long> every = new LinkedHashMap<>();
        JsonNode answer = api().topicOffsets(topic.getKey(), stamps.iterator().next());
        for (JsonNode p : answer.path("partitions")) {
          boolean hit = p.hasNonNull("index") && p.hasNonNull("record_timestamp_ms");
          every.put(p.path("partition").asInt(), hit ? p.get("index").asLong() : null);
        }
        for (String partition : parts.keySet()) {
          indexes.put(partition, every.get(Integer.parseInt(partition)));
        }
        continue;
      }
      for (Map.Entry<String, Long> partition : parts.entrySet()) {
        int number = Integer.parseInt(partition.getKey());
        JsonNode state = states.getOrDefault(topic.getKey(), Map.of()).get(number);
        String leader = state == null ? null : state.path("leader_url").asText(null);
        JsonNode answer =
            api().partitionOffsets(topic.getKey(), number, partition.getValue(), leader);
        indexes.put(
            partition.getKey(), answer.hasNonNull("index") ? answer.get("index").asLong() : null);
      }
    }
    return found;
  }

  /**
   * Where the read starts: startingTimestamp, else startingOffsetsByTimestamp for the
   * partitions it names, else startingOffsets (Kafka's precedence).
   */
  Map<String, Map<String, Long>> startingOffsets(Map<String, Map<String, Offsets.Bounds>> bounds) {
    Map<String, Map<String, Long>> start =
        Offsets.resolve(
            Offsets.spec(options.starting, "startingOffsets"), bounds, "startingOffsets");
    Map<String, Map<String, Long>> wanted =
        Offsets.timestampsWanted(
            options.startingTimestampMs, options.startingByTimestamp, bounds,
            "startingOffsetsByTimestamp");
    if (wanted.isEmpty()) {
      return start;
    }
    return Offsets.placeByTime(
        start, wanted, timesToOffsets(wanted), bounds, true, options.timestampStrategy);
  }

  /**
   * Where the read ends (exclusive): endingTimestamp, else endingOffsetsByTimestamp for the
   * partitions it names, else endingOffsets.
   */
  Map<String, Map<String, Long>> endingOffsets(Map<String, Map<String, Offsets.Bounds>> bounds) {
    Map<String, Map<String, Long>> end =
        Offsets.resolve(Offsets.spec(options.ending, "endingOffsets"), bounds, "endingOffsets");
    Map<String, Map<String, Long>> wanted =
        Offsets.timestampsWanted(
            options.endingTimestampMs, options.endingByTimestamp, bounds,
            "endingOffsetsByTimestamp");
    if (wanted.isEmpty()) {
      return end;
    }
    return Offsets.placeByTime(end, wanted, timesToOffsets(wanted), bounds, false, "error");
  }
}
