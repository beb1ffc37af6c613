import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import org.redisson.Redisson;
import org.redisson.api.RFuture;
import org.redisson.api.RedissonClient;
import org.redisson.client.RedisException;
import org.redisson.client.codec.StringCodec;
import org.redisson.client.protocol.RedisCommand;
import org.redisson.client.protocol.decoder.ObjectListReplayDecoder;
import org.redisson.command.CommandAsyncExecutor;
import org.redisson.config.Config;

/**
 * Runs DEDUCTs and REVERTs through Redisson's command executor and prints
 * every reply, typed, as JSON.
 *
 * <pre>java -cp CLASSES:REDISSON_CLASSPATH RedissonDriver PORT MODE &lt; plan.json</pre>
 *
 * Redisson has no public "send any command" call; applications reach
 * custom commands through the {@link CommandAsyncExecutor} behind every
 * Redisson object, with a {@link RedisCommand} naming the command and how
 * to decode its reply. The client is {@code useSingleServer()} with its
 * defaults otherwise. MODE:
 * <ul>
 *   <li>plain: {@code writeAsync} one command at a time, each awaited.
 *   <li>pipeline: every command written at once (Redisson spreads them over
 *       its connection pool), then every future awaited in order.
 * </ul>
 */
public final class RedissonDriver {
    private RedissonDriver() {}

    /** A custom command whose reply is an array: Long and String elements. */
    static RedisCommand<List<Object>> command(String name) {
        return new RedisCommand<>(name, new ObjectListReplayDecoder<>());
    }

    static RFuture<List<Object>> write(CommandAsyncExecutor executor, List<String> command) {
        Object[] params = command.subList(1, command.size()).toArray();
        // The key picks the node in cluster mode; for a single server it
        // only names the command in Redisson's logs. The sku is the key.
        return executor.writeAsync(command.get(1), StringCodec.INSTANCE, command(command.get(0)), params);
    }

    static Object await(RFuture<List<Object>> future, List<String> command) throws InterruptedException {
        try {
            return Drive.typed(future.toCompletableFuture().get());
        } catch (ExecutionException e) {
            Throwable cause = e.getCause() instanceof CompletionException ? e.getCause().getCause() : e.getCause();
            // An error reply is a plain RedisException; its subclasses
            // (timeouts, connection failures) fail the driver.
            if (cause.getClass() != RedisException.class) {
                throw new IllegalStateException(cause);
            }
            return Drive.typed(new RedisException(serverText(cause.getMessage(), command)));
        }
    }

    /**
     * The error text stockgate sent. Redisson appends where it came from:
     * "&lt;text&gt;. channel: [id: ..., L:... - R:...] command: (DEDUCT), params:
     * [sku, 1, id], promise: ...". That tail is checked here and cut off,
     * so the test compares stockgate's own words.
     */
    static String serverText(String message, List<String> command) {
        int at = message.indexOf(". channel: [");
        String params = "command: (" + command.get(0) + "), params: "
            + command.subList(1, command.size()) + ", promise: ";
        if (at < 0 || !message.substring(at).contains(params)) {
            throw new IllegalStateException("not how Redisson reports an error reply: " + message);
        }
        return message.substring(0, at);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String mode = args[1];
        List<List<String>> commands = Drive.plan(System.in).get("commands");
        Config config = new Config();
        config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
        RedissonClient redisson = Redisson.create(config);
        List<Object> replies = new ArrayList<>();
        try {
            CommandAsyncExecutor executor = ((Redisson) redisson).getCommandExecutor();
            switch (mode) {
                case "plain":
                    for (List<String> command : commands) {
                        replies.add(await(write(executor, command), command));
                    }
                    break;
                case "pipeline":
                    List<RFuture<List<Object>>> futures = new ArrayList<>();
                    for (List<String> command : commands) {
                        futures.add(write(executor, command));
                    }
                    for (int i = 0; i < futures.size(); i++) {
                        replies.add(await(futures.get(i), commands.get(i)));
                    }
                    break;
                default:
                    throw new IllegalArgumentException("unknown mode " + mode);
            }
        } finally {
            redisson.shutdown();
        }
        Drive.print("redisson", Drive.version("org.redisson", "redisson"), replies,
            Collections.emptyMap());
    }
}
