package dev.laminar.spark;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.math.MathContext;
import java.math.RoundingMode;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Python's text rules, where the options' meaning or messages depend on them: the Python source
 * (laminar/spark/options.py) reads option values with {@code int()}, {@code str.strip()},
 * {@code str.isdigit()} and {@code json.loads}, and quotes them in its messages with
 * {@code repr()}; the JVM reader must take the same values and say the same words.
 *
 * <p>JSON is read with Jackson's streaming parser into the values {@code json.loads} gives: a
 * {@code LinkedHashMap} for an object (a repeated key keeps its first place and its last value),
 * an {@code ArrayList}, a {@code String}, a {@code BigInteger} for every integer (Python's are
 * unbounded), a {@code Double}, a {@code Boolean}, {@code null} for null.
 */
final class PyText {
  /** A Python {@code ValueError}: the input is not what was asked for (Python's message). */
  static final class ValueError extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    ValueError(String message) {
      super(message);
    }
  }

  /** CPython's limit on the digits of an integer read from text (sys.get_int_max_str_digits). */
  static final int MAX_INT_DIGITS = 4300;
  /** The digits of CPython's {@code %.200R}: a repr in a message is cut there. */
  private static final int MESSAGE_REPR_CHARS = 200;

  /** Python's code-point order of strings (Java's compareTo orders UTF-16 units). */
  static final Comparator<String> ORDER = PyText::compare;

  /**
   * The characters that are digits to {@code str.isdigit} but not decimal (Numeric_Type=Digit:
   * superscripts, circled digits...), as code point ranges, from Python 3.11's Unicode 14.
   */
  private static final int[][] DIGIT_NOT_DECIMAL = {
    {0xb2, 0xb3}, {0xb9, 0xb9}, {0x1369, 0x1371}, {0x19da, 0x19da}, {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2468}, {0x2474, 0x247c}, {0x2488, 0x2490},
    {0x24ea, 0x24ea}, {0x24f5, 0x24fd}, {0x24ff, 0x24ff}, {0x2776, 0x277e}, {0x2780, 0x2788},
    {0x278a, 0x2792}, {0x10a40, 0x10a43}, {0x10e60, 0x10e68}, {0x11052, 0x1105a},
    {0x1f100, 0x1f10a},
  };

  private static final JsonFactory JSON =
      JsonFactory.builder()
          .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS) // NaN, Infinity, -Infinity
          .streamReadConstraints(
              StreamReadConstraints.builder().maxNumberLength(Integer.MAX_VALUE).build())
          .build();

  private PyText() {}

  static int compare(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int x = a.codePointAt(i);
      int y = b.codePointAt(j);
      if (x != y) {
        return Integer.compare(x, y);
      }
      i += Character.charCount(x);
      j += Character.charCount(y);
    }
    return Boolean.compare(i < a.length(), j < b.length());
  }

  /** {@code str.isspace()} of one character (Python's list differs from Java's). */
  static boolean isSpace(int c) {
    return (c >= 0x9 && c <= 0xd)
        || (c >= 0x1c && c <= 0x20)
        || c == 0x85
        || c == 0xa0
        || c == 0x1680
        || (c >= 0x2000 && c <= 0x200a)
        || c == 0x2028
        || c == 0x2029
        || c == 0x202f
        || c == 0x205f
        || c == 0x3000;
  }

  static boolean hasSpace(String s) {
    return s.codePoints().anyMatch(PyText::isSpace);
  }

  /** {@code str.strip()}. */
  static String strip(String s) {
    int start = 0;
    int end = s.length();
    while (start < end && isSpace(s.codePointAt(start))) {
      start += Character.charCount(s.codePointAt(start));
    }
    while (end > start && isSpace(s.codePointBefore(end))) {
      end -= Character.charCount(s.codePointBefore(end));
    }
    return s.substring(start, end);
  }

  /** {@code str.lower()}. */
  static String lower(String s) {
    return s.toLowerCase(Locale.ROOT);
  }

  private static boolean isDecimal(int c) {
    return Character.getType(c) == Character.DECIMAL_DIGIT_NUMBER;
  }

  /** {@code str.isdigit()}: decimal digits and the other digits (superscripts...). */
  static boolean isDigit(String s) {
    if (s.isEmpty()) {
      return false;
    }
    return s.codePoints()
        .allMatch(
            c -> {
              if (isDecimal(c)) {
                return true;
              }
              for (int[] range : DIGIT_NOT_DECIMAL) {
                if (c >= range[0] && c <= range[1]) {
                  return true;
                }
              }
              return false;
            });
  }

  /**
   * {@code int(s)}: optional whitespace and sign, decimal digits (any script's) with single
   * underscores between them (CPython turns non-ASCII spaces and digits into ASCII ones, then
   * reads the ASCII text); ValueError with Python's message otherwise, or past CPython's
   * limit of 4300 digits.
   */
  static BigInteger toInt(String s) {
    StringBuilder ascii = new StringBuilder(s.length());
    for (int i = 0; i < s.length(); ) {
      int c = s.codePointAt(i);
      i += Character.charCount(c);
      if (c < 0x80) {
        ascii.append((char) c);
      } else if (isSpace(c)) {
        ascii.append(' ');
      } else if (isDecimal(c)) {
        ascii.append((char) ('0' + Character.digit(c, 10)));
      } else {
        ascii.append('?');
      }
    }
    String t = ascii.toString();
    int at = 0;
    while (at < t.length() && asciiSpace(t.charAt(at))) {
      at++;
    }
    boolean negative = false;
    if (at < t.length() && (t.charAt(at) == '+' || t.charAt(at) == '-')) {
      negative = t.charAt(at) == '-';
      at++;
    }
    StringBuilder digits = new StringBuilder();
    boolean afterUnderscore = false;
    while (at < t.length()) {
      char c = t.charAt(at);
      if (c >= '0' && c <= '9') {
        digits.append(c);
        afterUnderscore = false;
      } else if (c == '_' && digits.length() > 0 && !afterUnderscore) {
        afterUnderscore = true;
      } else {
        break;
      }
      at++;
    }
    if (digits.length() == 0 || afterUnderscore) {
      throw invalidInt(s);
    }
    if (digits.length() > MAX_INT_DIGITS) {
      throw tooManyDigits(digits.length());
    }
    while (at < t.length() && asciiSpace(t.charAt(at))) {
      at++;
    }
    if (at != t.length()) {
      throw invalidInt(s);
    }
    BigInteger value = new BigInteger(digits.toString());
    return negative ? value.negate() : value;
  }

  /** C's isspace in the "C" locale, what CPython's int() skips once other spaces became ' '. */
  private static boolean asciiSpace(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
  }

  private static ValueError invalidInt(String s) {
    String shown = repr(s);
    if (shown.codePointCount(0, shown.length()) > MESSAGE_REPR_CHARS) {
      shown = shown.substring(0, shown.offsetByCodePoints(0, MESSAGE_REPR_CHARS));
    }
    return new ValueError("invalid literal for int() with base 10: " + shown);
  }

  static ValueError tooManyDigits(int digits) {
    return new ValueError(
        "Exceeds the limit (" + MAX_INT_DIGITS + " digits) for integer string conversion: value"
            + " has " + digits + " digits; use sys.set_int_max_str_digits() to increase the limit");
  }

  /** {@code json.loads(text)} (ValueError when it is not JSON, as Python's refuses it). */
  static Object loads(String text) {
    if (text.startsWith("\ufeff")) {
      throw new ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)");
    }
    try (JsonParser parser = JSON.createParser(text)) {
      JsonToken first = parser.nextToken();
      if (first == null) {
        throw new ValueError("Expecting value: line 1 column 1 (char 0)");
      }
      Object value = value(parser, first);
      if (parser.nextToken() != null) {
        throw new ValueError("Extra data");
      }
      return value;
    } catch (IOException e) { // (Jackson's parse errors are IOExceptions)
      throw new ValueError(String.valueOf(e.getMessage()));
    }
  }

  private static Object value(JsonParser parser, JsonToken token) throws IOException {
    switch (token) {
      case START_OBJECT: {
        Map<String, Object> out = new LinkedHashMap<>();
        for (JsonToken t = parser.nextToken(); t != JsonToken.END_OBJECT; t = parser.nextToken()) {
          String key = parser.currentName();
          out.put(key, value(parser, parser.nextToken()));
        }
        return out;
      }
      case START_ARRAY: {
        List<Object> out = new ArrayList<>();
        for (JsonToken t = parser.nextToken(); t != JsonToken.END_ARRAY; t = parser.nextToken()) {
          out.add(value(parser, t));
        }
        return out;
      }
      case VALUE_STRING:
        return parser.getText();
      case VALUE_NUMBER_INT: {
        String digits = parser.getText();
        int count = digits.length() - (digits.startsWith("-") ? 1 : 0);
        if (count > MAX_INT_DIGITS) {
          throw tooManyDigits(count);
        }
        return new BigInteger(digits);
      }
      case VALUE_NUMBER_FLOAT: {
        String text = parser.getText();
        if (parser.isNaN()) { // Python's json takes these three words only
          if (!text.equals("NaN") && !text.equals("Infinity") && !text.equals("-Infinity")) {
            throw new ValueError("Expecting value: " + text);
          }
          return text.equals("NaN")
              ? Double.NaN
              : text.startsWith("-") ? Double.NEGATIVE_INFINITY : Double.POSITIVE_INFINITY;
        }
        return Double.parseDouble(text);
      }
      case VALUE_TRUE:
        return Boolean.TRUE;
      case VALUE_FALSE:
        return Boolean.FALSE;
      case VALUE_NULL:
        return null;
      default:
        throw new ValueError("Expecting value");
    }
  }

  /** {@code isinstance(v, int) and not isinstance(v, bool)} for a {@link #loads} value. */
  static boolean isInt(Object value) {
    return value instanceof BigInteger;
  }

  /** {@code repr(value)} of a string, number, bool, None, list or dict. */
  static String repr(Object value) {
    if (value == null) {
      return "None";
    }
    if (value instanceof Boolean) {
      return (Boolean) value ? "True" : "False";
    }
    if (value instanceof String) {
      return reprString((String) value);
    }
    if (value instanceof Double || value instanceof Float) {
      return reprFloat(((Number) value).doubleValue());
    }
    if (value instanceof Number) {
      return value.toString();
    }
    if (value instanceof List) {
      StringBuilder out = new StringBuilder("[");
      for (Object item : (List<?>) value) {
        out.append(out.length() > 1 ? ", " : "").append(repr(item));
      }
      return out.append(']').toString();
    }
    if (value instanceof Map) {
      StringBuilder out = new StringBuilder("{");
      for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
        out.append(out.length() > 1 ? ", " : "");
        out.append(repr(entry.getKey())).append(": ").append(repr(entry.getValue()));
      }
      return out.append('}').toString();
    }
    return reprString(value.toString());
  }

  private static boolean isPrintable(int c) {
    if (c == ' ') {
      return true;
    }
    switch (Character.getType(c)) {
      case Character.CONTROL:
      case Character.FORMAT:
      case Character.SURROGATE:
      case Character.PRIVATE_USE:
      case Character.UNASSIGNED:
      case Character.LINE_SEPARATOR:
      case Character.PARAGRAPH_SEPARATOR:
      case Character.SPACE_SEPARATOR:
        return false;
      default:
        return true;
    }
  }

  private static String reprString(String s) {
    char quote = s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? '"' : '\'';
    StringBuilder out = new StringBuilder(s.length() + 2).append(quote);
    for (int i = 0; i < s.length(); ) {
      int c = s.codePointAt(i);
      i += Character.charCount(c);
      if (c == quote || c == '\\') {
        out.append('\\').appendCodePoint(c);
      } else if (c == '\t') {
        out.append("\\t");
      } else if (c == '\n') {
        out.append("\\n");
      } else if (c == '\r') {
        out.append("\\r");
      } else if (c < ' ' || c == 0x7f) {
        out.append(String.format("\\x%02x", c));
      } else if (c < 0x7f || isPrintable(c)) {
        out.appendCodePoint(c);
      } else if (c <= 0xff) {
        out.append(String.format("\\x%02x", c));
      } else if (c <= 0xffff) {
        out.append(String.format("\\u%04x", c));
      } else {
        out.append(String.format("\\U%08x", c));
      }
    }
    return out.append(quote).toString();
  }

  /** {@code repr(float)}: the shortest digits that read back as the same double. */
  static String reprFloat(double x) {
    if (Double.isNaN(x)) {
      return "nan";
    }
    if (Double.isInfinite(x)) {
      return x > 0 ? "inf" : "-inf";
    }
    if (x == 0) {
      return (1 / x < 0) ? "-0.0" : "0.0";
    }
    BigDecimal exact = new BigDecimal(x);
    BigDecimal shortest = exact;
    for (int precision = 1; precision <= 17; precision++) {
      BigDecimal rounded = exact.round(new MathContext(precision, RoundingMode.HALF_EVEN));
      if (rounded.doubleValue() == x) {
        shortest = rounded;
        break;
      }
    }
    String digits = shortest.unscaledValue().abs().toString().replaceAll("0+$", "");
    if (digits.isEmpty()) {
      digits = "0";
    }
    // x = 0.d1d2... * 10^point
    int point = shortest.precision() - shortest.scale();
    String sign = x < 0 ? "-" : "";
    if (point > -4 && point <= 16) {
      if (point <= 0) {
        return sign + "0." + "0".repeat(-point) + digits;
      }
      if (digits.length() <= point) {
        return sign + digits + "0".repeat(point - digits.length()) + ".0";
      }
      return sign + digits.substring(0, point) + "." + digits.substring(point);
    }
    int exponent = point - 1;
    String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
    return sign + mantissa + "e" + (exponent < 0 ? "-" : "+")
        + String.format("%02d", Math.abs(exponent));
  }

  /** {@code json.dumps(value)}: ASCII only, separators ", " and ": ". */
  static String dumps(Object value) {
    if (value == null) {
      return "null";
    }
    if (value instanceof Boolean) {
      return value.toString();
    }
    if (value instanceof Number) {
      return value.toString();
    }
    if (value instanceof List) {
      StringBuilder out = new StringBuilder("[");
      for (Object item : (List<?>) value) {
        out.append(out.length() > 1 ? ", " : "").append(dumps(item));
      }
      return out.append(']').toString();
    }
    if (value instanceof Map) {
      StringBuilder out = new StringBuilder("{");
      for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
        out.append(out.length() > 1 ? ", " : "");
        out.append(dumps(String.valueOf(entry.getKey()))).append(": ");
        out.append(dumps(entry.getValue()));
      }
      return out.append('}').toString();
    }
    String s = value.toString();
    StringBuilder out = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          out.append("\\\"");
          break;
        case '\\':
          out.append("\\\\");
          break;
        case '\n':
          out.append("\\n");
          break;
        case '\r':
          out.append("\\r");
          break;
        case '\t':
          out.append("\\t");
          break;
        case '\b':
          out.append("\\b");
          break;
        case '\f':
          out.append("\\f");
          break;
        default:
          if (c < ' ' || c > '~') {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c);
          }
      }
    }
    return out.append('"').toString();
  }
}
