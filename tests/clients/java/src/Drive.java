import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

/**
 * What every Java driver shares: reading the plan from stdin, typing each
 * reply for the test, and printing the result as JSON.
 *
 * <p>A plan is {"commands": [["DEDUCT", "sku", "3", "req-1", "ORD-1"], ...]}
 * (the reconnect mode adds "after", run once stockgate has restarted). A
 * typed reply is {"int": n}, {"str": s}, {"null": true}, a list of replies,
 * or {"error": message, "class": exception class}. Nothing is judged here:
 * tests/clients.rs compares the replies with what stockgate owes.
 *
 * <p>JSON is read and written by hand, so the drivers need nothing on the
 * class path but the client under test.
 */
final class Drive {
    private Drive() {}

    /** The plan's lists of commands, by name ("commands", "after"). */
    static Map<String, List<List<String>>> plan(InputStream in) throws IOException {
        String text = readLine(in);
        Object parsed = new Parser(text).value();
        Map<String, List<List<String>>> plan = new LinkedHashMap<>();
        for (Map.Entry<?, ?> entry : ((Map<?, ?>) parsed).entrySet()) {
            List<List<String>> commands = new ArrayList<>();
            for (Object command : (List<?>) entry.getValue()) {
                List<String> words = new ArrayList<>();
                for (Object word : (List<?>) command) {
                    words.add((String) word);
                }
                commands.add(words);
            }
            plan.put((String) entry.getKey(), commands);
        }
        return plan;
    }

    /**
     * One line of stdin, read byte by byte: the reconnect mode reads a
     * second line later, so nothing may be buffered past the first.
     */
    static String readLine(InputStream in) throws IOException {
        StringBuilder line = new StringBuilder();
        for (int b = in.read(); b != -1 && b != '\n'; b = in.read()) {
            line.append((char) b);
        }
        return line.toString();
    }

    /** A reply (or the exception a command failed with) as the test reads it. */
    static Object typed(Object value) {
        Map<String, Object> out = new LinkedHashMap<>();
        if (value == null) {
            out.put("null", true);
        } else if (value instanceof Long) {
            out.put("int", value);
        } else if (value instanceof String) {
            out.put("str", value);
        } else if (value instanceof byte[]) {
            out.put("str", new String((byte[]) value, StandardCharsets.UTF_8));
        } else if (value instanceof List) {
            List<Object> items = new ArrayList<>();
            for (Object item : (List<?>) value) {
                items.add(typed(item));
            }
            return items;
        } else if (value instanceof Throwable) {
            out.put("error", ((Throwable) value).getMessage());
            out.put("class", value.getClass().getSimpleName());
        } else {
            throw new IllegalStateException(
                "unexpected reply type " + value.getClass().getName() + ": " + value);
        }
        return out;
    }

    /** The version of the jar that holds a Maven artifact, from its pom.properties. */
    static String version(String groupId, String artifactId) throws IOException {
        String path = "META-INF/maven/" + groupId + "/" + artifactId + "/pom.properties";
        try (InputStream in = Drive.class.getClassLoader().getResourceAsStream(path)) {
            if (in == null) {
                throw new IOException("no " + path + " on the class path");
            }
            Properties properties = new Properties();
            properties.load(in);
            return properties.getProperty("version");
        }
    }

    /** Prints {"client", "version", "replies", ...extra} on one line. */
    static void print(String client, String version, List<Object> replies, Map<String, Object> extra) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("client", client);
        out.put("version", version);
        out.put("replies", replies);
        out.putAll(extra);
        System.out.println(write(out));
        System.out.flush();
    }

    static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out);
        return out.toString();
    }

    private static void write(Object value, StringBuilder out) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Boolean || value instanceof Long || value instanceof Integer) {
            out.append(value);
        } else if (value instanceof String) {
            out.append('"');
            for (char c : ((String) value).toCharArray()) {
                if (c == '"' || c == '\\') {
                    out.append('\\').append(c);
                } else if (c < 0x20) {
                    out.append(String.format("\\u%04x", (int) c));
                } else {
                    out.append(c);
                }
            }
            out.append('"');
        } else if (value instanceof Map) {
            out.append('{');
            String sep = "";
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
                out.append(sep);
                write(entry.getKey(), out);
                out.append(':');
                write(entry.getValue(), out);
                sep = ",";
            }
            out.append('}');
        } else if (value instanceof List) {
            out.append('[');
            String sep = "";
            for (Object item : (List<?>) value) {
                out.append(sep);
                write(item, out);
                sep = ",";
            }
            out.append(']');
        } else {
            throw new IllegalArgumentException("cannot write " + value.getClass());
        }
    }

    /** JSON objects, arrays, strings and literals: all a plan holds. */
    private static final class Parser {
        private final String text;
        private int at;

        Parser(String text) {
            this.text = text;
        }

        Object value() {
            skipSpace();
            char c = text.charAt(at);
            if (c == '{') {
                Map<String, Object> map = new LinkedHashMap<>();
                at++;
                skipSpace();
                if (text.charAt(at) == '}') {
                    at++;
                    return map;
                }
                do {
                    skipSpace();
                    String key = (String) value();
                    skipSpace();
                    expect(':');
                    map.put(key, value());
                    skipSpace();
                } while (text.charAt(at++) == ',');
                check(text.charAt(at - 1) == '}');
                return map;
            }
            if (c == '[') {
                List<Object> list = new ArrayList<>();
                at++;
                skipSpace();
                if (text.charAt(at) == ']') {
                    at++;
                    return list;
                }
                do {
                    list.add(value());
                    skipSpace();
                } while (text.charAt(at++) == ',');
                check(text.charAt(at - 1) == ']');
                return list;
            }
            if (c == '"') {
                return string();
            }
            for (String literal : new String[] {"true", "false", "null"}) {
                if (text.startsWith(literal, at)) {
                    at += literal.length();
                    return literal.equals("null") ? null : Boolean.valueOf(literal);
                }
            }
            throw new IllegalArgumentException("unexpected JSON at " + at + ": " + text);
        }

        private String string() {
            StringBuilder out = new StringBuilder();
            expect('"');
            for (char c = text.charAt(at++); c != '"'; c = text.charAt(at++)) {
                if (c == '\\') {
                    char escaped = text.charAt(at++);
                    switch (escaped) {
                        case 'n': out.append('\n'); break;
                        case 't': out.append('\t'); break;
                        case 'r': out.append('\r'); break;
                        case 'b': out.append('\b'); break;
                        case 'f': out.append('\f'); break;
                        case 'u':
                            out.append((char) Integer.parseInt(text.substring(at, at + 4), 16));
                            at += 4;
                            break;
                        default: out.append(escaped);
                    }
                } else {
                    out.append(c);
                }
            }
            return out.toString();
        }

        private void skipSpace() {
            while (at < text.length() && Character.isWhitespace(text.charAt(at))) {
                at++;
            }
        }

        private void expect(char c) {
            check(text.charAt(at++) == c);
        }

        private void check(boolean ok) {
            if (!ok) {
                throw new IllegalArgumentException("malformed JSON at " + at + ": " + text);
            }
        }
    }
}
