package dev.laminar.spark;

import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.InvalidPathException;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Date;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import org.yaml.snakeyaml.LoaderOptions;
import org.yaml.snakeyaml.Yaml;
import org.yaml.snakeyaml.constructor.SafeConstructor;
import org.yaml.snakeyaml.error.YAMLException;

/**
 * The token and CA file of a read, resolved on the driver as the Python source's
 * {@code Options.with_credentials()} resolves them with {@code laminar.client.config.resolve}
 * (docs/security.md, "Clients: authentication and authorization"): the option {@code token},
 * else {@code tokenFile}'s, else the explicit {@code context}'s, else $LAMINAR_TOKEN, else
 * $LAMINAR_TOKEN_FILE's, else the context $LAMINAR_CONTEXT names or the file's current-context.
 * The CA file is the option {@code caFile}, else (with an explicit context) the context's, else
 * $LAMINAR_CA_FILE. The same precedence, the same files read in the same order, the same
 * messages (IllegalArgumentException).
 *
 * <p>The configuration file is $LAMINAR_CONFIG, else $XDG_CONFIG_HOME/laminar/config.yaml, else
 * ~/.config/laminar/config.yaml (a missing file is no context); relative token-file and ca-file
 * paths are the file's directory's. It is read with SnakeYAML's safe loader (what Jackson's YAML
 * reads with), YAML 1.1 as PyYAML's {@code safe_load}; only a YAML syntax error's own words
 * differ from Python's.
 */
public final class Credentials {
  static final String TOKEN_ENV = "LAMINAR_TOKEN";
  static final String TOKEN_FILE_ENV = "LAMINAR_TOKEN_FILE";
  static final String CONTEXT_ENV = "LAMINAR_CONTEXT";
  static final String CONFIG_ENV = "LAMINAR_CONFIG";
  static final String BROKERS_ENV = "LAMINAR_BROKERS";
  static final String CA_FILE_ENV = "LAMINAR_CA_FILE";
  private static final Set<String> CONTEXT_FIELDS =
      Set.of("name", "brokers", "token", "token-file", "ca-file");

  /** What a read uses: the token itself (null: none) and the CA bundle's path (null: none). */
  public static final class Resolved {
    public final String token;
    public final String caFile;

    Resolved(String token, String caFile) {
      this.token = token;
      this.caFile = caFile;
    }
  }

  /** A context of the configuration file. */
  static final class Context {
    final String name;
    final List<String> brokers;
    final String token;
    final String tokenFile;
    final String caFile;
    final String source;

    Context(
        String name, List<String> brokers, String token, String tokenFile, String caFile,
        String source) {
      this.name = name;
      this.brokers = brokers;
      this.token = token;
      this.tokenFile = tokenFile;
      this.caFile = caFile;
      this.source = source;
    }

    String readToken() {
      if (token != null) {
        return token;
      }
      if (tokenFile != null) {
        return readTokenFile(
            tokenFile, "token-file of context " + PyText.repr(name) + " (" + source + ")");
      }
      return null;
    }
  }

  private Credentials() {}

  /**
   * {@code Options.with_credentials()}'s: the token from the options {@code token},
   * {@code tokenFile}, {@code context} or the environment `env`, and the CA file.
   */
  public static Resolved resolve(
      String token, String tokenFile, String context, String caFile, Map<String, String> env) {
    Resolver resolver = new Resolver(context, env);
    String found = resolver.token(token, tokenFile);
    resolver.brokers(); // (as Python's resolve: it may read the configuration file, and fail)
    String contextCa = resolver.caFile();
    String ca = caFile != null ? caFile : context != null ? contextCa : null;
    return new Resolved(found, ca);
  }

  /** The explicit context (read at once), and the environment's or current one (on demand). */
  private static final class Resolver {
    final Map<String, String> env;
    final boolean explicit;
    final Context chosen;
    private boolean ambientRead;
    private Context ambient;

    Resolver(String context, Map<String, String> env) {
      this.env = env;
      this.explicit = context != null && !context.isEmpty();
      this.chosen = explicit ? findContext(context, env) : null;
    }

    Context ambient() {
      if (explicit) {
        return null; // an explicit context replaces the environment's and the current one
      }
      if (!ambientRead) {
        ambient = findContext(null, env);
        ambientRead = true;
      }
      return ambient;
    }

    String token(String token, String tokenFile) {
      if (token != null) {
        return token;
      }
      if (tokenFile != null) {
        return readTokenFile(tokenFile, "token file");
      }
      if (chosen != null && (truthy(chosen.token) || truthy(chosen.tokenFile))) {
        return chosen.readToken();
      }
      String fromEnv = PyText.strip(env.getOrDefault(TOKEN_ENV, ""));
      if (!fromEnv.isEmpty()) {
        return fromEnv;
      }
      String path = env.get(TOKEN_FILE_ENV);
      if (truthy(path)) {
        return readTokenFile(path, "token file " + path + " ($" + TOKEN_FILE_ENV + ")");
      }
      Context current = ambient();
      if (current != null && (truthy(current.token) || truthy(current.tokenFile))) {
        return current.readToken();
      }
      return null;
    }

    List<String> brokers() {
      if (chosen != null && !chosen.brokers.isEmpty()) {
        return chosen.brokers;
      }
      if (truthy(env.get(BROKERS_ENV))) {
        return List.of(env.get(BROKERS_ENV).split(","));
      }
      Context current = ambient();
      return current != null ? current.brokers : List.of();
    }

    String caFile() {
      if (chosen != null && truthy(chosen.caFile)) {
        return chosen.caFile;
      }
      if (truthy(env.get(CA_FILE_ENV))) {
        return env.get(CA_FILE_ENV);
      }
      Context current = ambient();
      return current != null ? current.caFile : null;
    }
  }

  private static boolean truthy(String s) {
    return s != null && !s.isEmpty();
  }

  // ---- the configuration file ---------------------------------------------------------------

  static String configPath(Map<String, String> env) {
    if (truthy(env.get(CONFIG_ENV))) {
      return expandUser(env.get(CONFIG_ENV), env);
    }
    String base = env.get("XDG_CONFIG_HOME");
    if (!truthy(base)) {
      base = expandUser("~/.config", env);
    }
    return join(join(base, "laminar"), "config.yaml");
  }

  /**
   * Context `name` (an error if there is none), or without a name the context $LAMINAR_CONTEXT
   * names, else the current context (null when there is none).
   */
  static Context findContext(String name, Map<String, String> env) {
    String path = configPath(env);
    String explicit =
        truthy(name) ? name : truthy(env.get(CONTEXT_ENV)) ? env.get(CONTEXT_ENV) : null;
    Config config = loadConfig(path, env);
    String wanted = explicit != null ? explicit : config.current;
    if (wanted == null) {
      return null;
    }
    if (!config.contexts.containsKey(wanted)) {
      List<String> names = new ArrayList<>(config.contexts.keySet());
      names.sort(PyText.ORDER);
      throw new IllegalArgumentException(
          "no context " + PyText.repr(wanted) + " in " + path + " (contexts: "
              + (names.isEmpty() ? "none" : String.join(", ", names)) + ")");
    }
    return config.contexts.get(wanted);
  }

  private static final class Config {
    final String current;
    final Map<String, Context> contexts;

    Config(String current, Map<String, Context> contexts) {
      this.current = current;
      this.contexts = contexts;
    }
  }

  /** The current context's name and every context of the file at `path` (no file: none). */
  static Config loadConfig(String path, Map<String, String> env) {
    byte[] raw;
    try {
      raw = Files.readAllBytes(Path.of(path));
    } catch (InvalidPathException e) {
      throw new IllegalArgumentException("embedded null byte");
    } catch (NoSuchFileException e) {
      return new Config(null, Map.of());
    } catch (IOException e) {
      throw new IllegalArgumentException(
          "cannot read the client configuration " + path + ": " + osError(e, path));
    }
    String text = utf8(raw);
    if (text == null) {
      throw new IllegalArgumentException(
          "cannot read the client configuration " + path + ": " + decodeError(raw));
    }
    Object document;
    try {
      document = new Yaml(new SafeConstructor(new LoaderOptions())).load(text);
    } catch (YAMLException e) {
      throw new IllegalArgumentException(
          "the client configuration " + path + " is not YAML: " + e.getMessage());
    }
    if (!pyTruth(document)) {
      document = Map.of();
    }
    if (!(document instanceof Map)
        || !Set.of("current-context", "contexts").containsAll(((Map<?, ?>) document).keySet())) {
      throw new IllegalArgumentException(
          "the client configuration " + path + ": want current-context and contexts (a list)");
    }
    Map<?, ?> top = (Map<?, ?>) document;
    Map<String, Context> contexts = new LinkedHashMap<>();
    String directory = parent(path);
    int n = 0;
    for (Object item : iterate(top.get("contexts"))) {
      Context context = context(item, path + ": contexts[" + n++ + "]", directory, env);
      contexts.put(context.name, context);
    }
    Object current = top.get("current-context");
    if (current != null && !(current instanceof String)) {
      throw new IllegalArgumentException(
          "the client configuration " + path + ": current-context is a name");
    }
    return new Config((String) current, contexts);
  }

  /** Python's truth of a YAML value. */
  private static boolean pyTruth(Object value) {
    if (value == null || Boolean.FALSE.equals(value)) {
      return false;
    }
    if (value instanceof String) {
      return !((String) value).isEmpty();
    }
    if (value instanceof Collection) {
      return !((Collection<?>) value).isEmpty();
    }
    if (value instanceof Map) {
      return !((Map<?, ?>) value).isEmpty();
    }
    if (value instanceof byte[]) {
      return ((byte[]) value).length > 0;
    }
    if (value instanceof Double) {
      return (Double) value != 0;
    }
    if (value instanceof BigInteger) {
      return ((BigInteger) value).signum() != 0;
    }
    if (value instanceof Number) {
      return ((Number) value).longValue() != 0;
    }
    return true;
  }

  /** {@code for item in (value or [])}. */
  private static List<Object> iterate(Object value) {
    if (!pyTruth(value)) {
      return List.of();
    }
    if (value instanceof Collection) {
      return new ArrayList<>((Collection<?>) value);
    }
    if (value instanceof Map) {
      return new ArrayList<>(((Map<?, ?>) value).keySet());
    }
    if (value instanceof String) {
      List<Object> out = new ArrayList<>();
      ((String) value).codePoints().forEach(c -> out.add(new String(Character.toChars(c))));
      return out;
    }
    if (value instanceof byte[]) {
      List<Object> out = new ArrayList<>();
      for (byte b : (byte[]) value) {
        out.add(BigInteger.valueOf(b & 0xff));
      }
      return out;
    }
    throw new IllegalArgumentException("'" + typeName(value) + "' object is not iterable");
  }

  private static String typeName(Object value) {
    if (value instanceof Boolean) {
      return "bool";
    }
    if (value instanceof Double) {
      return "float";
    }
    if (value instanceof Number) {
      return "int";
    }
    if (value instanceof Date) {
      return "datetime.date";
    }
    return value.getClass().getSimpleName();
  }

  /** A mapping key as Python compares it: a bool or an integral float is that integer. */
  private static Object pyKey(Object key) {
    if (key instanceof Boolean) {
      return (Boolean) key ? BigInteger.ONE : BigInteger.ZERO;
    }
    if (key instanceof Double) {
      double number = (Double) key;
      return number == Math.rint(number) && !Double.isInfinite(number)
          ? new BigDecimal(number).toBigInteger()
          : key;
    }
    if (key instanceof Number) {
      return new BigInteger(key.toString());
    }
    return key;
  }

  /** {@code str(key)} of a YAML mapping key. */
  private static String str(Object value) {
    if (value == null || value instanceof Boolean || value instanceof Number) {
      return PyText.repr(value);
    }
    return String.valueOf(value);
  }

  private static Context context(
      Object item, String where, String directory, Map<String, String> env) {
    if (!(item instanceof Map) || !(((Map<?, ?>) item).get("name") instanceof String)) {
      throw new IllegalArgumentException(where + ": a context is a mapping with a name");
    }
    Map<?, ?> fields = (Map<?, ?>) item;
    Set<String> unknown = new TreeSet<>(PyText.ORDER);
    Set<Object> seen = new HashSet<>(); // (Python's keys: True is 1, 1.0 is 1, the first stays)
    for (Object key : fields.keySet()) {
      if (seen.add(pyKey(key)) && (!(key instanceof String) || !CONTEXT_FIELDS.contains(key))) {
        unknown.add(str(key));
      }
    }
    if (!unknown.isEmpty()) {
      throw new IllegalArgumentException(
          where + ": unknown fields " + PyText.repr(new ArrayList<>(unknown)));
    }
    if (fields.containsKey("token") && fields.containsKey("token-file")) {
      throw new IllegalArgumentException(where + ": give token or token-file, not both");
    }
    Object brokers = fields.get("brokers");
    List<Object> listed = new ArrayList<>();
    if (brokers instanceof String) {
      for (String b : ((String) brokers).split(",", -1)) {
        if (!PyText.strip(b).isEmpty()) {
          listed.add(b);
        }
      }
    } else if (pyTruth(brokers)) {
      if (!(brokers instanceof List)) {
        throw new IllegalArgumentException(
            where + ": brokers is a list of URLs (or one, comma-separated)");
      }
      listed.addAll((List<?>) brokers);
    }
    List<String> urls = new ArrayList<>();
    for (Object b : listed) {
      if (!(b instanceof String)) {
        throw new IllegalArgumentException(
            where + ": brokers is a list of URLs (or one, comma-separated)");
      }
      urls.add(PyText.strip((String) b));
    }
    for (String key : List.of("token", "token-file", "ca-file")) {
      if (fields.get(key) != null && !(fields.get(key) instanceof String)) {
        throw new IllegalArgumentException(where + ": " + key + " must be a string");
      }
    }
    return new Context(
        (String) fields.get("name"),
        List.copyOf(urls),
        (String) fields.get("token"),
        pathOf(fields.get("token-file"), directory, env),
        pathOf(fields.get("ca-file"), directory, env),
        where);
  }

  private static String pathOf(Object value, String directory, Map<String, String> env) {
    return value == null ? null : join(directory, expandUser((String) value, env));
  }

  // ---- paths as pathlib writes them ------------------------------------------------------------

  /** {@code str(Path(p))}: no empty or "." parts, no trailing slash ("." for nothing). */
  static String normalize(String p) {
    String root = p.startsWith("//") && !p.startsWith("///") ? "//" : p.startsWith("/") ? "/" : "";
    List<String> parts = new ArrayList<>();
    for (String part : p.split("/", -1)) {
      if (!part.isEmpty() && !part.equals(".")) {
        parts.add(part);
      }
    }
    String out = root + String.join("/", parts);
    return out.isEmpty() ? "." : out;
  }

  /** {@code str(Path(p).parent)}. */
  static String parent(String p) {
    String path = normalize(p);
    int cut = path.lastIndexOf('/');
    if (path.equals(".") || path.equals("/") || path.equals("//")) {
      return path;
    }
    if (cut < 0) {
      return ".";
    }
    String head = path.substring(0, cut);
    return head.isEmpty() || head.equals("/") ? path.substring(0, cut + 1) : head;
  }

  /** {@code str(Path(directory) / child)}. */
  static String join(String directory, String child) {
    String tail = normalize(child);
    if (tail.startsWith("/")) {
      return tail;
    }
    String head = normalize(directory);
    if (head.equals("/") || head.equals("//")) {
      return head + (tail.equals(".") ? "" : tail);
    }
    return normalize(head + "/" + tail);
  }

  /** {@code str(Path(p).expanduser())}: a leading ~ or ~user is that home directory. */
  static String expandUser(String p, Map<String, String> env) {
    String path = normalize(p);
    if (!path.startsWith("~")) {
      return path;
    }
    int slash = path.indexOf('/');
    String first = slash < 0 ? path : path.substring(0, slash);
    String rest = slash < 0 ? "" : path.substring(slash + 1);
    String home = first.equals("~")
        ? env.containsKey("HOME") ? env.get("HOME") : System.getProperty("user.home")
        : homeOf(first.substring(1));
    if (home == null) {
      throw new IllegalArgumentException("Could not determine home directory.");
    }
    home = home.replaceAll("/+$", "");
    if (home.isEmpty()) {
      home = "/";
    }
    return rest.isEmpty() ? normalize(home) : join(home, rest);
  }

  /** The home directory of user `name` in /etc/passwd (null: no such user). */
  private static String homeOf(String name) {
    try {
      for (String line : Files.readAllLines(Path.of("/etc/passwd"))) {
        String[] fields = line.split(":", -1);
        if (fields.length >= 6 && fields[0].equals(name)) {
          return fields[5];
        }
      }
    } catch (IOException e) {
      return null;
    }
    return null;
  }

  // ---- token files -----------------------------------------------------------------------------

  /**
   * The token in a text file, without surrounding whitespace (an error if the file cannot be
   * read, is empty or holds more than one word): laminar.credentials.read_token_file.
   */
  static String readTokenFile(String path, String what) {
    byte[] raw;
    try {
      raw = Files.readAllBytes(Path.of(path.isEmpty() ? "." : path));
    } catch (InvalidPathException e) {
      throw new IllegalArgumentException("embedded null byte");
    } catch (IOException e) {
      throw new IllegalArgumentException(
          "cannot read the " + what + " " + path + ": " + strerror(e));
    }
    int start = 0;
    int end = raw.length;
    while (start < end && asciiSpace(raw[start])) {
      start++;
    }
    while (end > start && asciiSpace(raw[end - 1])) {
      end--;
    }
    byte[] stripped = Arrays.copyOfRange(raw, start, end);
    String text = utf8(stripped);
    if (text == null) {
      throw new IllegalArgumentException("the " + what + " " + path + " is not UTF-8 text");
    }
    if (text.isEmpty()) {
      throw new IllegalArgumentException("the " + what + " " + path + " is empty");
    }
    if (PyText.hasSpace(text)) {
      throw new IllegalArgumentException(
          "the " + what + " " + path + " holds more than one word");
    }
    return text;
  }

  /** {@code bytes.isspace()} of one byte. */
  private static boolean asciiSpace(byte b) {
    return b == ' ' || (b >= '\t' && b <= '\r');
  }

  private static String utf8(byte[] raw) {
    try {
      return StandardCharsets.UTF_8
          .newDecoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .decode(ByteBuffer.wrap(raw))
          .toString();
    } catch (CharacterCodingException e) {
      return null;
    }
  }

  /** Python's words for the UTF-8 decoding error of `raw` (str(UnicodeDecodeError)). */
  static String decodeError(byte[] raw) {
    int at = 0;
    while (at < raw.length) {
      int lead = raw[at] & 0xff;
      if (lead < 0x80) {
        at++;
        continue;
      }
      int length = lead >= 0xc2 && lead <= 0xdf ? 2 : lead >= 0xe0 && lead <= 0xef ? 3
          : lead >= 0xf0 && lead <= 0xf4 ? 4 : 0;
      if (length == 0) {
        return decodeMessage(raw, at, at + 1, "invalid start byte");
      }
      for (int k = 1; k < length; k++) {
        if (at + k >= raw.length) {
          return decodeMessage(raw, at, raw.length, "unexpected end of data");
        }
        int b = raw[at + k] & 0xff;
        int low = 0x80;
        int high = 0xbf;
        if (k == 1) {
          low = lead == 0xe0 ? 0xa0 : lead == 0xf0 ? 0x90 : 0x80;
          high = lead == 0xed ? 0x9f : lead == 0xf4 ? 0x8f : 0xbf;
        }
        if (b < low || b > high) {
          return decodeMessage(raw, at, at + k, "invalid continuation byte");
        }
      }
      at += length;
    }
    return "'utf-8' codec can't decode the file";
  }

  private static String decodeMessage(byte[] raw, int start, int end, String reason) {
    if (end - start == 1) {
      return String.format(
          "'utf-8' codec can't decode byte 0x%02x in position %d: %s", raw[start] & 0xff, start,
          reason);
    }
    return String.format(
        "'utf-8' codec can't decode bytes in position %d-%d: %s", start, end - 1, reason);
  }

  /** Python's {@code e.strerror} of a failed read. */
  static String strerror(IOException e) {
    if (e instanceof NoSuchFileException) {
      return "No such file or directory";
    }
    if (e instanceof AccessDeniedException) {
      return "Permission denied";
    }
    if (e instanceof FileSystemException && ((FileSystemException) e).getReason() != null) {
      String reason = ((FileSystemException) e).getReason();
      int cut = reason.indexOf(" or unable to access attributes of symbolic link");
      return cut >= 0 ? reason.substring(0, cut) : reason;
    }
    return String.valueOf(e.getMessage());
  }

  private static final Map<String, Integer> ERRNO =
      Map.of(
          "Permission denied", 13,
          "Is a directory", 21,
          "Not a directory", 20,
          "File name too long", 36,
          "Too many levels of symbolic links", 40,
          "Input/output error", 5);

  /** {@code str(OSError)}: [Errno n] strerror: 'path'. */
  private static String osError(IOException e, String path) {
    String reason = strerror(e);
    Integer errno = ERRNO.get(reason);
    return (errno == null ? "" : "[Errno " + errno + "] ") + reason + ": " + PyText.repr(path);
  }
}
