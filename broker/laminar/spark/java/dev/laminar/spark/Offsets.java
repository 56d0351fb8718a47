package dev.laminar.spark;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.function.Predicate;

/**
 * Offsets and range planning, pure (no I/O), as the Python source's options.py: offsets are
 * per topic, per partition (a string, as in the JSON options), the next index to read; in
 * {@code startingOffsets} / {@code endingOffsets} -2 means earliest and -1 latest, as Kafka's.
 * Timestamps are ms since the epoch; the first record at or after one is found by the brokers
 * (Planner).
 *
 * <p>Maps keep their keys' order (LinkedHashMap), as Python's dicts: which partition a message
 * names first depends on it. An index beyond a Java long in the JSON options (Python's are
 * unbounded) is taken as Long.MAX_VALUE.
 */
public final class Offsets {
  /** What one partition holds now: its first stored index and the next index to commit. */
  public record Bounds(long logStart, long end) {}

  /** Records low <= index < high of one topic partition: one Spark input partition. */
  public record Range(String topic, int partition, long low, long high) {}

  /** startingOffsets / endingOffsets: earliest, latest (`word`), or JSON offsets. */
  public static final class Spec {
    public final String word;
    public final Map<String, Map<String, Long>> offsets;

    Spec(String word, Map<String, Map<String, Long>> offsets) {
      this.word = word;
      this.offsets = offsets;
    }
  }

  private static final BigInteger LONG_MAX = BigInteger.valueOf(Long.MAX_VALUE);

  private Offsets() {}

  /** {@code earliest}, {@code latest}, or per-partition JSON offsets (checked). */
  public static Spec spec(String value, String name) {
    if (value.equals("earliest") || value.equals("latest")) {
      return new Spec(value, null);
    }
    Object parsed;
    try {
      parsed = PyText.loads(value);
    } catch (PyText.ValueError e) {
      throw new IllegalArgumentException(
          name + " must be earliest, latest or JSON, not " + PyText.repr(value));
    }
    if (!(parsed instanceof Map)) {
      throw new IllegalArgumentException(
          name + ": expected {\"topic\": {\"0\": 23}}, got " + PyText.repr(value));
    }
    return new Spec(
        null,
        perPartition(
            (Map<?, ?>) parsed,
            name,
            index -> index.compareTo(BigInteger.valueOf(Options.EARLIEST)) >= 0,
            "an index (or -2 earliest, -1 latest)"));
  }

  /** {@code {"topic": {"0": 1700000000000}}}: a timestamp (ms since the epoch) per partition. */
  public static Map<String, Map<String, Long>> timestamps(String value, String name) {
    Object parsed;
    try {
      parsed = PyText.loads(value);
    } catch (PyText.ValueError e) {
      parsed = null;
    }
    if (!(parsed instanceof Map)) {
      throw new IllegalArgumentException(
          name + " must be JSON such as {\"orders\": {\"0\": 1700000000000}}");
    }
    return perPartition(
        (Map<?, ?>) parsed,
        name,
        stamp ->
            stamp.compareTo(BigInteger.valueOf(Options.MIN_TIMESTAMP_MS)) >= 0
                && stamp.compareTo(BigInteger.valueOf(Options.MAX_TIMESTAMP_MS)) <= 0,
        "a timestamp in ms since the epoch");
  }

  /**
   * {@code {"topic": {"0": n}}} checked: every topic's value an object, every key a partition
   * number, every value an integer (not a bool) that `valid` takes; `what` names it.
   */
  private static Map<String, Map<String, Long>> perPartition(
      Map<?, ?> parsed, String name, Predicate<BigInteger> valid, String what) {
    Map<String, Map<String, Long>> out = new LinkedHashMap<>();
    for (Map.Entry<?, ?> topicEntry : parsed.entrySet()) {
      String topic = (String) topicEntry.getKey();
      if (!(topicEntry.getValue() instanceof Map)) {
        throw new IllegalArgumentException(
            name + ": the partitions of " + PyText.repr(topic) + " must be an object");
      }
      Map<String, Long> partitions = new LinkedHashMap<>();
      out.put(topic, partitions);
      for (Map.Entry<?, ?> entry : ((Map<?, ?>) topicEntry.getValue()).entrySet()) {
        String partition = (String) entry.getKey();
        Object value = entry.getValue();
        if (!PyText.isDigit(partition)
            || !PyText.isInt(value)
            || !valid.test((BigInteger) value)) {
          throw new IllegalArgumentException(
              name + ": " + topic + "/" + partition + " must map a partition number to " + what
                  + ", got " + PyText.repr(value));
        }
        BigInteger number = (BigInteger) value;
        partitions.put(
            PyText.toInt(partition).toString(), number.min(LONG_MAX).longValue());
      }
    }
    return out;
  }

  private static final Comparator<String> BY_NUMBER =
      Comparator.comparing((String number) -> new BigInteger(number));

  /**
   * Concrete offsets for every partition of every topic in `bounds`. Partitions that JSON
   * offsets leave out start at the earliest (as new partitions do).
   */
  public static Map<String, Map<String, Long>> resolve(
      Spec wanted, Map<String, Map<String, Bounds>> bounds, String name) {
    Map<String, Map<String, Long>> out = new LinkedHashMap<>();
    for (Map.Entry<String, Map<String, Bounds>> topic : bounds.entrySet()) {
      Map<String, Long> given =
          wanted.offsets == null ? Map.of() : wanted.offsets.getOrDefault(topic.getKey(), Map.of());
      Map<String, Long> resolved = new LinkedHashMap<>();
      out.put(topic.getKey(), resolved);
      for (Map.Entry<String, Bounds> partition : topic.getValue().entrySet()) {
        Bounds bound = partition.getValue();
        boolean earliest;
        boolean latest;
        long index = 0;
        if (wanted.offsets != null) {
          index = given.getOrDefault(partition.getKey(), Options.EARLIEST);
          earliest = index == Options.EARLIEST;
          latest = index == Options.LATEST;
        } else {
          earliest = wanted.word.equals("earliest");
          latest = wanted.word.equals("latest");
        }
        resolved.put(
            partition.getKey(), earliest ? bound.logStart() : latest ? bound.end() : index);
      }
    }
    if (wanted.offsets != null) {
      allRead(wanted.offsets, bounds, name);
    }
    return out;
  }

  /** Every partition `named` is one that is read (`bounds`), or an error naming them. */
  static void allRead(
      Map<String, ? extends Map<String, ?>> named, Map<String, ? extends Map<String, ?>> bounds,
      String name) {
    for (Map.Entry<String, ? extends Map<String, ?>> topic : named.entrySet()) {
      Map<String, ?> read =
          bounds.containsKey(topic.getKey()) ? bounds.get(topic.getKey()) : Map.of();
      TreeSet<String> missing = new TreeSet<>(BY_NUMBER);
      for (String partition : topic.getValue().keySet()) {
        if (!read.containsKey(partition)) {
          missing.add(partition);
        }
      }
      if (!bounds.containsKey(topic.getKey()) || !missing.isEmpty()) {
        throw new IllegalArgumentException(
            name + " names partitions that do not exist or are not read: " + topic.getKey() + " "
                + PyText.repr(new ArrayList<>(missing)));
      }
    }
  }

  /**
   * The timestamp to look up per partition: `everyMs` for all (it wins, as Kafka's
   * starting/endingTimestamp), else those the JSON `byPartition` names (every one must be
   * read); the partitions left out are placed by the offsets options.
   */
  public static Map<String, Map<String, Long>> timestampsWanted(
      Long everyMs, String byPartition, Map<String, Map<String, Bounds>> bounds, String name) {
    if (everyMs != null) {
      Map<String, Map<String, Long>> out = new LinkedHashMap<>();
      for (Map.Entry<String, Map<String, Bounds>> topic : bounds.entrySet()) {
        Map<String, Long> parts = new LinkedHashMap<>();
        for (String partition : topic.getValue().keySet()) {
          parts.put(partition, everyMs);
        }
        out.put(topic.getKey(), parts);
      }
      return out;
    }
    if (byPartition == null) {
      return new LinkedHashMap<>();
    }
    Map<String, Map<String, Long>> wanted = timestamps(byPartition, name);
    allRead(wanted, bounds, name);
    return wanted;
  }

  /**
   * `offsets` with the partitions of `wanted` at `found`: the index of the first record at or
   * after the partition's timestamp, null when it has none that late. Such a partition ends at
   * the latest (Kafka's rule for endings); a start fails unless `strategy` is "latest", which
   * starts it at the latest.
   */
  public static Map<String, Map<String, Long>> placeByTime(
      Map<String, Map<String, Long>> offsets,
      Map<String, Map<String, Long>> wanted,
      Map<String, Map<String, Long>> found,
      Map<String, Map<String, Bounds>> bounds,
      boolean starting,
      String strategy) {
    Map<String, Map<String, Long>> out = new LinkedHashMap<>();
    offsets.forEach((topic, parts) -> out.put(topic, new LinkedHashMap<>(parts)));
    for (Map.Entry<String, Map<String, Long>> topic : wanted.entrySet()) {
      for (Map.Entry<String, Long> partition : topic.getValue().entrySet()) {
        Long index = found.getOrDefault(topic.getKey(), Map.of()).get(partition.getKey());
        if (index == null && starting && strategy.equals("error")) {
          throw new IllegalArgumentException(
              topic.getKey() + "/" + partition.getKey() + " has no record at or after timestamp "
                  + partition.getValue() + " (set startingOffsetsByTimestampStrategy=latest to "
                  + "start such partitions at the latest offset)");
        }
        Bounds bound = bounds.get(topic.getKey()).get(partition.getKey());
        out.computeIfAbsent(topic.getKey(), t -> new LinkedHashMap<>())
            .put(partition.getKey(), index == null ? bound.end() : index);
      }
    }
    return out;
  }

  /**
   * One range per topic partition with records between `start` and `end`; with
   * `minPartitions`, the largest ranges are split in two until there are at least that many.
   */
  public static List<Range> plan(
      Map<String, Map<String, Long>> start, Map<String, Map<String, Long>> end,
      long minPartitions) {
    List<String> topics = new ArrayList<>(end.keySet());
    topics.sort(PyText.ORDER);
    List<Range> ranges = new ArrayList<>();
    for (String topic : topics) {
      List<String> partitions = new ArrayList<>(end.get(topic).keySet());
      partitions.sort(BY_NUMBER);
      for (String partition : partitions) {
        long high = end.get(topic).get(partition);
        long low = start.getOrDefault(topic, Map.of()).getOrDefault(partition, high);
        if (high > low) {
          ranges.add(new Range(topic, Integer.parseInt(partition), low, high));
        }
      }
    }
    while (minPartitions > 0 && ranges.size() < minPartitions) {
      int at = -1;
      for (int i = 0; i < ranges.size(); i++) {
        if (at < 0 || size(ranges.get(i)) > size(ranges.get(at))) {
          at = i;
        }
      }
      if (at < 0 || size(ranges.get(at)) < 2) {
        break;
      }
      Range largest = ranges.get(at);
      long middle = largest.low() + size(largest) / 2;
      ranges.set(at, new Range(largest.topic(), largest.partition(), middle, largest.high()));
      ranges.add(at, new Range(largest.topic(), largest.partition(), largest.low(), middle));
    }
    return ranges;
  }

  private static long size(Range range) {
    return range.high() - range.low();
  }
}
