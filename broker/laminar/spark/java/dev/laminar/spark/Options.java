package dev.laminar.spark;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Pattern;
import java.util.regex.PatternSyntaxException;

/**
 * The options of a batch read, as the Python source's {@code Options.parse(raw, stream=False)}
 * (laminar/spark/options.py; docs/spark.md maps each to the Kafka connector's): the same names
 * (case-insensitive), the same meaning, the same checks in the same order, and the same
 * messages (IllegalArgumentException). The options of streams and of the sink are known and
 * checked as the Python source checks them in a batch read, and otherwise unused.
 *
 * <p>{@code subscribePattern} is a {@code java.util.regex} pattern (with
 * UNICODE_CHARACTER_CLASS, as Python's {@code re} on text), and it must match a topic's whole
 * name, as Python's {@code re.fullmatch}. The common syntax means the same in both; a pattern
 * only one of them takes (Python's {@code (?P<name>...)}, Java's possessive quantifiers) is
 * refused by the other, and the reason given is {@code java.util.regex}'s.
 */
public final class Options {
  static final long EARLIEST = -2;
  static final long LATEST = -1;
  /** Options Spark itself passes, or that belong to the other side (source / sink). */
  static final Set<String> KNOWN =
      Set.of(
          "brokers", "kafka.bootstrap.servers", "topic", "topics", "subscribe",
          "subscribepattern", "assign", "startingoffsets", "endingoffsets", "startingtimestamp",
          "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
          "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "maxrecordspertrigger",
          "minoffsetspertrigger", "maxtriggerdelay", "minpartitions", "failondataloss",
          "includeheaders", "token", "path", "checkpointlocation", "cafile", "tokenfile",
          "context", "transactiontimeoutms");
  /** The sink's: how long a task's transaction may stay open. */
  static final long DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000;
  /** The longest a transaction may stay open (laminar.contract.MAX_TXN_TIMEOUT_MS). */
  static final long MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000;
  /** Kafka's maxTriggerDelay default. */
  static final BigInteger DEFAULT_MAX_TRIGGER_DELAY_MS = BigInteger.valueOf(15 * 60 * 1000);
  /** Records' timestamps, ms since the epoch (laminar.log.records). */
  static final long MIN_TIMESTAMP_MS = 0;
  static final long MAX_TIMESTAMP_MS = 253_402_300_799_999L; // 9999-12-31T23:59:59.999Z
  static final List<String> TIMESTAMP_STRATEGIES = List.of("error", "latest");
  /** maxTriggerDelay's units as Spark's time strings spell them, in ms ("us": a thousandth). */
  private static final Map<String, Long> TIME_UNITS_MS =
      Map.of("ms", 1L, "s", 1000L, "m", 60_000L, "min", 60_000L, "h", 3_600_000L,
          "d", 86_400_000L);
  /** What a planning request may take (ReadSettings.requestTimeoutMs). */
  static final long REQUEST_TIMEOUT_MS = 60_000;

  public final List<String> brokers;
  /** subscribe (or topic / topics): these topics */
  public final List<String> topics;
  public final String starting;
  public final String ending;
  public final BigInteger maxRecordsPerTrigger;
  public final BigInteger minPartitions;
  public final boolean failOnDataLoss;
  public final boolean includeHeaders;
  /** The token given, or once resolved on the driver (withCredentials) the token itself. */
  public final String token;
  public final String caFile;
  public final String tokenFile;
  public final String context;
  public final long transactionTimeoutMs;
  /** subscribePattern: every topic whose whole name matches */
  public final String pattern;
  /** assign: these partitions of these topics (null: not given) */
  public final Map<String, List<BigInteger>> assigned;
  public final Long startingTimestampMs;
  public final Long endingTimestampMs;
  /** startingOffsetsByTimestamp / endingOffsetsByTimestamp: JSON, checked */
  public final String startingByTimestamp;
  public final String endingByTimestamp;
  public final String timestampStrategy;
  public final BigInteger minRecordsPerTrigger;
  public final BigInteger maxTriggerDelayMs;

  private Options(Map<String, String> o) {
    List<String> unknown = new ArrayList<>();
    for (String key : o.keySet()) {
      if (!KNOWN.contains(key)) {
        unknown.add(key);
      }
    }
    if (!unknown.isEmpty()) {
      unknown.sort(PyText.ORDER);
      List<String> known = new ArrayList<>(KNOWN);
      known.sort(PyText.ORDER);
      throw new IllegalArgumentException(
          "unknown options " + PyText.repr(unknown) + " (known: " + PyText.repr(known) + ")");
    }
    brokers = brokers(o);
    Subscription subscription = subscription(o);
    pattern = subscription.pattern;
    assigned = subscription.assigned;
    topics = subscription.topics;
    starting = o.getOrDefault("startingoffsets", "earliest");
    ending = o.getOrDefault("endingoffsets", "latest");
    Offsets.spec(starting, "startingOffsets"); // checked now, resolved against the cluster later
    Offsets.spec(ending, "endingOffsets");
    if (ending.equals("earliest")) {
      throw new IllegalArgumentException("endingOffsets may not be earliest");
    }
    startingTimestampMs =
        o.containsKey("startingtimestamp")
            ? timestamp(o.get("startingtimestamp"), "startingTimestamp") : null;
    endingTimestampMs =
        o.containsKey("endingtimestamp")
            ? timestamp(o.get("endingtimestamp"), "endingTimestamp") : null;
    startingByTimestamp = o.get("startingoffsetsbytimestamp");
    if (startingByTimestamp != null) {
      Offsets.timestamps(startingByTimestamp, "startingOffsetsByTimestamp");
    }
    endingByTimestamp = o.get("endingoffsetsbytimestamp");
    if (endingByTimestamp != null) {
      Offsets.timestamps(endingByTimestamp, "endingOffsetsByTimestamp");
    }
    timestampStrategy = PyText.lower(o.getOrDefault("startingoffsetsbytimestampstrategy", "error"));
    if (!TIMESTAMP_STRATEGIES.contains(timestampStrategy)) {
      throw new IllegalArgumentException(
          "option startingOffsetsByTimestampStrategy must be error or latest, not "
              + PyText.repr(timestampStrategy));
    }
    String maxGiven = oneOf(o, "maxOffsetsPerTrigger", "maxRecordsPerTrigger");
    maxRecordsPerTrigger = maxGiven == null ? null : positive(o, maxGiven);
    minRecordsPerTrigger = positive(o, "minOffsetsPerTrigger");
    if (minRecordsPerTrigger != null
        && maxGiven != null
        && maxRecordsPerTrigger != null
        && minRecordsPerTrigger.compareTo(maxRecordsPerTrigger) > 0) {
      throw new IllegalArgumentException(
          "minOffsetsPerTrigger (" + minRecordsPerTrigger + ") is higher than " + maxGiven + " ("
              + maxRecordsPerTrigger + ")");
    }
    String delay = o.get("maxtriggerdelay");
    maxTriggerDelayMs =
        delay == null ? DEFAULT_MAX_TRIGGER_DELAY_MS : durationMs(delay, "maxTriggerDelay");
    BigInteger timeout = positive(o, "transactionTimeoutMs");
    if (timeout != null && timeout.compareTo(BigInteger.valueOf(MAX_TXN_TIMEOUT_MS)) > 0) {
      throw new IllegalArgumentException(
          "option transactionTimeoutMs may be " + MAX_TXN_TIMEOUT_MS + " at most");
    }
    transactionTimeoutMs = timeout == null ? DEFAULT_TRANSACTION_TIMEOUT_MS : timeout.longValue();
    minPartitions = positive(o, "minPartitions");
    failOnDataLoss = flag(o, "failOnDataLoss", true);
    includeHeaders = flag(o, "includeHeaders", false);
    token = emptyIsNone(o.get("token"));
    tokenFile = emptyIsNone(o.get("tokenfile"));
    context = emptyIsNone(o.get("context"));
    caFile = emptyIsNone(o.get("cafile"));
  }

  /** These options with the token and CA file resolved (withCredentials). */
  private Options(Options given, String token, String caFile) {
    brokers = given.brokers;
    topics = given.topics;
    starting = given.starting;
    ending = given.ending;
    maxRecordsPerTrigger = given.maxRecordsPerTrigger;
    minPartitions = given.minPartitions;
    failOnDataLoss = given.failOnDataLoss;
    includeHeaders = given.includeHeaders;
    this.token = token;
    this.caFile = caFile;
    tokenFile = given.tokenFile;
    context = given.context;
    transactionTimeoutMs = given.transactionTimeoutMs;
    pattern = given.pattern;
    assigned = given.assigned;
    startingTimestampMs = given.startingTimestampMs;
    endingTimestampMs = given.endingTimestampMs;
    startingByTimestamp = given.startingByTimestamp;
    endingByTimestamp = given.endingByTimestamp;
    timestampStrategy = given.timestampStrategy;
    minRecordsPerTrigger = given.minRecordsPerTrigger;
    maxTriggerDelayMs = given.maxTriggerDelayMs;
  }

  /** Spark's options (case-insensitive names): checked, or IllegalArgumentException. */
  public static Options parse(Map<String, String> options) {
    return new Options(lowered(options));
  }

  /**
   * These options with the token resolved, on the driver: {@code token}, else
   * {@code tokenFile}'s, else {@code context}'s, else the environment's (Credentials); the CA
   * file is {@code caFile}, else the explicit context's. The executors get the token itself.
   */
  public Options withCredentials() {
    return withCredentials(System.getenv());
  }

  Options withCredentials(Map<String, String> env) {
    Credentials.Resolved resolved = Credentials.resolve(token, tokenFile, context, caFile, env);
    return new Options(this, resolved.token, resolved.caFile);
  }

  /** How the source names what it reads, for messages. */
  public String subscribed() {
    if (pattern != null) {
      return "subscribePattern " + PyText.repr(pattern);
    }
    if (assigned != null) {
      return "assign " + PyText.dumps(assigned);
    }
    return "subscribe " + PyText.repr(String.join(",", topics));
  }

  /** What the executors' reads need (with the token resolved: call withCredentials first). */
  ReadSettings settings() {
    return new ReadSettings(
        brokers, token, caFile, includeHeaders, failOnDataLoss, REQUEST_TIMEOUT_MS);
  }

  private static Map<String, String> lowered(Map<String, String> options) {
    Map<String, String> out = new LinkedHashMap<>();
    for (Map.Entry<String, String> entry : options.entrySet()) {
      out.put(PyText.lower(entry.getKey()), entry.getValue());
    }
    return out;
  }

  private static String emptyIsNone(String value) {
    return value == null || value.isEmpty() ? null : value;
  }

  /** A true/false option (case-insensitive), `otherwise` when it is not given. */
  public static boolean flag(Map<String, String> options, String name, boolean otherwise) {
    String raw = lowered(options).get(PyText.lower(name));
    if (raw == null) {
      return otherwise;
    }
    String word = PyText.lower(raw);
    if (!word.equals("true") && !word.equals("false")) {
      throw new IllegalArgumentException(
          "option " + name + " must be true or false, not " + PyText.repr(raw));
    }
    return word.equals("true");
  }

  private static BigInteger positive(Map<String, String> options, String name) {
    String raw = options.get(PyText.lower(name));
    if (raw == null) {
      return null;
    }
    BigInteger value;
    try {
      value = PyText.toInt(raw);
    } catch (PyText.ValueError e) {
      value = null;
    }
    if (value == null || value.signum() < 1) {
      throw new IllegalArgumentException(
          "option " + name + " must be a positive integer, not " + PyText.repr(raw));
    }
    return value;
  }

  /** The one of `names` (aliases) given, or null; an error for two. */
  private static String oneOf(Map<String, String> options, String... names) {
    List<String> given = new ArrayList<>();
    for (String name : names) {
      if (options.containsKey(PyText.lower(name))) {
        given.add(name);
      }
    }
    if (given.size() > 1) {
      throw new IllegalArgumentException(
          "give option " + String.join(" or ", given) + ", not both (they are aliases)");
    }
    return given.isEmpty() ? null : given.get(0);
  }

  private static long timestamp(String raw, String name) {
    BigInteger value;
    try {
      value = PyText.toInt(raw);
    } catch (PyText.ValueError e) {
      value = BigInteger.ONE.negate();
    }
    if (value.compareTo(BigInteger.valueOf(MIN_TIMESTAMP_MS)) < 0
        || value.compareTo(BigInteger.valueOf(MAX_TIMESTAMP_MS)) > 0) {
      throw new IllegalArgumentException(
          "option " + name + " must be a timestamp in ms since the epoch (an integer in ["
              + MIN_TIMESTAMP_MS + ", " + MAX_TIMESTAMP_MS + "]), not " + PyText.repr(raw));
    }
    return value.longValue();
  }

  /**
   * A Spark time string ({@code 15m}, {@code 30s}, {@code 500ms}; a bare number is ms) in ms:
   * Python's {@code \s*(\d+)\s*([a-z]*)\s*} on the lowered text, digits of any script.
   */
  static BigInteger durationMs(String raw, String name) {
    String text = PyText.lower(raw);
    int at = skipSpace(text, 0);
    int digitsFrom = at;
    while (at < text.length()
        && Character.getType(text.codePointAt(at)) == Character.DECIMAL_DIGIT_NUMBER) {
      at += Character.charCount(text.codePointAt(at));
    }
    int digitsTo = at;
    at = skipSpace(text, at);
    int unitFrom = at;
    while (at < text.length() && text.charAt(at) >= 'a' && text.charAt(at) <= 'z') {
      at++;
    }
    String unit = text.substring(unitFrom, at);
    at = skipSpace(text, at);
    if (digitsTo == digitsFrom
        || at != text.length()
        || !(unit.isEmpty() || unit.equals("us") || TIME_UNITS_MS.containsKey(unit))) {
      throw new IllegalArgumentException(
          "option " + name + " must be a duration such as 15m, 30s or 500ms, not "
              + PyText.repr(raw));
    }
    BigInteger count = PyText.toInt(text.substring(digitsFrom, digitsTo));
    if (unit.equals("us")) { // Python multiplies by the float 0.001, then truncates
      double ms = count.doubleValue();
      if (Double.isInfinite(ms)) {
        throw new ArithmeticException("int too large to convert to float");
      }
      return new BigDecimal(ms * 0.001).toBigInteger();
    }
    return count.multiply(BigInteger.valueOf(unit.isEmpty() ? 1 : TIME_UNITS_MS.get(unit)));
  }

  private static int skipSpace(String text, int at) {
    while (at < text.length() && PyText.isSpace(text.codePointAt(at))) {
      at += Character.charCount(text.codePointAt(at));
    }
    return at;
  }

  private static List<String> brokers(Map<String, String> options) {
    String given = oneOf(options, "brokers", "kafka.bootstrap.servers");
    List<String> out = new ArrayList<>();
    for (String b : (given == null ? "" : options.get(PyText.lower(given))).split(",", -1)) {
      if (!PyText.strip(b).isEmpty()) {
        out.add(PyText.strip(b));
      }
    }
    if (out.isEmpty()) {
      throw new IllegalArgumentException(
          "option brokers (or kafka.bootstrap.servers) is required: comma-separated broker "
              + "API URLs");
    }
    for (String broker : out) {
      String lowered = PyText.lower(broker);
      if (!lowered.startsWith("http://") && !lowered.startsWith("https://")) {
        throw new IllegalArgumentException(
            "broker " + PyText.repr(broker) + " is not a URL: give the API URLs, "
                + "http://host:port or https://host:port (option "
                + (given == null ? "brokers" : given) + ")");
      }
    }
    return List.copyOf(out);
  }

  private static final class Subscription {
    final String pattern;
    final Map<String, List<BigInteger>> assigned;
    final List<String> topics;

    Subscription(String pattern, Map<String, List<BigInteger>> assigned, List<String> topics) {
      this.pattern = pattern;
      this.assigned = assigned;
      this.topics = topics;
    }
  }

  /**
   * The one strategy given, as the Kafka source: exactly one of subscribe (its aliases topic,
   * topics), subscribePattern, assign.
   */
  private static Subscription subscription(Map<String, String> options) {
    List<String> strategies = new ArrayList<>();
    for (String name : List.of("subscribe", "topic", "topics", "subscribePattern", "assign")) {
      if (options.containsKey(PyText.lower(name))) {
        strategies.add(name);
      }
    }
    if (strategies.isEmpty()) {
      throw new IllegalArgumentException(
          "one of the options subscribe (or topic, topics: comma-separated topics), "
              + "subscribePattern or assign is required");
    }
    if (strategies.size() > 1) {
      throw new IllegalArgumentException(
          "only one of the options subscribe, subscribePattern, assign may be given (topic and "
              + "topics are aliases of subscribe); got " + String.join(", ", strategies));
    }
    String name = strategies.get(0);
    String value = options.get(PyText.lower(name));
    if (name.equals("subscribePattern")) {
      try {
        compile(value);
      } catch (PatternSyntaxException e) {
        throw new IllegalArgumentException(
            "option subscribePattern " + PyText.repr(value) + " is not a valid pattern: "
                + e.getDescription() + (e.getIndex() >= 0 ? " at position " + e.getIndex() : ""));
      }
      return new Subscription(value, null, List.of());
    }
    if (name.equals("assign")) {
      return new Subscription(null, assignment(value), List.of());
    }
    List<String> topics = new ArrayList<>();
    for (String t : value.split(",", -1)) {
      if (!PyText.strip(t).isEmpty()) {
        topics.add(PyText.strip(t));
      }
    }
    if (topics.isEmpty()) {
      throw new IllegalArgumentException(
          "option " + name + " names no topic: give comma-separated topic names");
    }
    return new Subscription(null, null, List.copyOf(topics));
  }

  /** subscribePattern's pattern: a topic is read when it matches its whole name. */
  static Pattern compile(String pattern) {
    return Pattern.compile(pattern, Pattern.UNICODE_CHARACTER_CLASS);
  }

  /** assign: {"topicA": [0, 1], "topicB": [2]}, each topic's partitions sorted, once each. */
  private static Map<String, List<BigInteger>> assignment(String raw) {
    Object parsed;
    try {
      parsed = PyText.loads(raw);
    } catch (PyText.ValueError e) {
      parsed = null;
    }
    if (!(parsed instanceof Map) || ((Map<?, ?>) parsed).isEmpty()) {
      throw new IllegalArgumentException(
          "option assign must be JSON such as {\"orders\": [0, 1]}, not " + PyText.repr(raw));
    }
    Map<String, List<BigInteger>> out = new LinkedHashMap<>();
    for (Map.Entry<?, ?> entry : ((Map<?, ?>) parsed).entrySet()) {
      String topic = (String) entry.getKey();
      Object partitions = entry.getValue();
      boolean ok = partitions instanceof List && !((List<?>) partitions).isEmpty();
      if (ok) {
        for (Object p : (List<?>) partitions) {
          if (!PyText.isInt(p) || ((BigInteger) p).signum() < 0) {
            ok = false;
            break;
          }
        }
      }
      if (!ok) {
        throw new IllegalArgumentException(
            "option assign: " + PyText.repr(topic) + " must map to a list of partition numbers, "
                + "got " + PyText.repr(partitions));
      }
      TreeSet<BigInteger> sorted = new TreeSet<>();
      for (Object p : (List<?>) partitions) {
        sorted.add((BigInteger) p);
      }
      out.put(topic, List.copyOf(sorted));
    }
    return Collections.unmodifiableMap(out);
  }
}
