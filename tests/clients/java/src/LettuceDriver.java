import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.async.RedisAsyncCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.ArrayOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;

/**
 * Runs DEDUCTs and REVERTs through Lettuce's async API (6 and 7 build from
 * this one source) and prints every reply, typed, as JSON.
 *
 * <pre>java -cp CLASSES:LETTUCE_CLASSPATH LettuceDriver PORT MODE &lt; plan.json</pre>
 *
 * Every mode connects with {@code RedisClient.create("redis://host:port")}
 * and its defaults: RESP3, negotiated with HELLO 3, whose reply map Lettuce
 * type-checks before the connection is usable. MODE:
 * <ul>
 *   <li>plain: one async command at a time, each awaited before the next.
 *   <li>pipeline: every command dispatched at once on the one connection,
 *       then every future awaited in order.
 *   <li>reconnect: the plan's "commands" one at a time; then the driver prints
 *       {@code restart} and waits for a line on stdin while the test kills
 *       stockgate and starts it again on the same port; then the plan's
 *       "after" commands, all at once, on the same connection, which
 *       Lettuce's watchdog has reconnected (or reconnects) by itself.
 * </ul>
 */
public final class LettuceDriver {
    private LettuceDriver() {}

    /** A custom command: Lettuce writes its bytes as the command name. */
    static final class Keyword implements ProtocolKeyword {
        private final String name;
        private final byte[] bytes;

        Keyword(String name) {
            this.name = name;
            this.bytes = name.getBytes(StandardCharsets.US_ASCII);
        }

        @Override
        public byte[] getBytes() {
            return bytes;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        public String toString() {
            return name;
        }
    }

    /** Sends one command; its reply (a list of Long and String) comes later. */
    static RedisFuture<List<Object>> dispatch(RedisAsyncCommands<String, String> async, List<String> command) {
        CommandArgs<String, String> args = new CommandArgs<>(StringCodec.UTF8);
        for (String arg : command.subList(1, command.size())) {
            args.add(arg);
        }
        return async.dispatch(new Keyword(command.get(0)), new ArrayOutput<>(StringCodec.UTF8), args);
    }

    static Object await(RedisFuture<List<Object>> future) throws InterruptedException {
        try {
            return Drive.typed(future.get());
        } catch (ExecutionException e) {
            // An error reply is a RedisCommandExecutionException; anything
            // else fails the driver.
            if (!e.getCause().getClass().getSimpleName().equals("RedisCommandExecutionException")) {
                throw new IllegalStateException(e.getCause());
            }
            return Drive.typed(e.getCause());
        }
    }

    static List<Object> oneByOne(RedisAsyncCommands<String, String> async, List<List<String>> commands)
            throws InterruptedException {
        List<Object> replies = new ArrayList<>();
        for (List<String> command : commands) {
            replies.add(await(dispatch(async, command)));
        }
        return replies;
    }

    static List<Object> allAtOnce(RedisAsyncCommands<String, String> async, List<List<String>> commands)
            throws InterruptedException {
        List<RedisFuture<List<Object>>> futures = new ArrayList<>();
        for (List<String> command : commands) {
            futures.add(dispatch(async, command));
        }
        List<Object> replies = new ArrayList<>();
        for (RedisFuture<List<Object>> future : futures) {
            replies.add(await(future));
        }
        return replies;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String mode = args[1];
        Map<String, List<List<String>>> plan = Drive.plan(System.in);
        RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
        Map<String, Object> extra = new LinkedHashMap<>();
        List<Object> replies;
        try (StatefulRedisConnection<String, String> connection = client.connect()) {
            RedisAsyncCommands<String, String> async = connection.async();
            switch (mode) {
                case "plain":
                    replies = oneByOne(async, plan.get("commands"));
                    break;
                case "pipeline":
                    replies = allAtOnce(async, plan.get("commands"));
                    break;
                case "reconnect":
                    replies = oneByOne(async, plan.get("commands"));
                    System.out.println("restart");
                    System.out.flush();
                    String line = Drive.readLine(System.in);
                    if (!line.equals("restarted")) {
                        throw new IllegalStateException("expected restarted, got " + line);
                    }
                    extra.put("after", allAtOnce(async, plan.get("after")));
                    break;
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
        } finally {
            client.shutdown();
        }
        Drive.print("lettuce", Drive.version("io.lettuce", "lettuce-core"), replies, extra);
    }
}
