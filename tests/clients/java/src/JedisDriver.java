import java.io.FileInputStream;
import java.io.InputStream;
import java.security.KeyStore;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.TrustManagerFactory;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisPool;
import redis.clients.jedis.JedisPoolConfig;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Response;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.SafeEncoder;

/**
 * Runs DEDUCTs and REVERTs through Jedis (5 and 8 build from this one
 * source) and prints every reply, typed, as JSON.
 *
 * <pre>java -cp CLASSES:JEDIS_CLASSPATH JedisDriver PORT MODE &lt; plan.json</pre>
 *
 * MODE:
 * <ul>
 *   <li>plain: {@code new Jedis(host, port)} with its defaults, {@code sendCommand}
 *       one command at a time. With STOCKGATE_TEST_TLS_TRUSTSTORE set, over
 *       TLS instead (see {@link #tls}).
 *   <li>pool: a {@link JedisPool} with testOnBorrow, so the pool PINGs a
 *       connection every time it lends it out; each command borrows one and
 *       gives it back.
 *   <li>pipeline: every command in one {@link Pipeline}, {@code sync()}, then
 *       each {@link Response} in order.
 * </ul>
 */
public final class JedisDriver {
    private JedisDriver() {}

    /** A custom command: Jedis sends its name as given. */
    static ProtocolCommand command(String name) {
        byte[] raw = SafeEncoder.encode(name);
        return () -> raw;
    }

    static String[] rest(List<String> command) {
        return command.subList(1, command.size()).toArray(new String[0]);
    }

    static Object send(Jedis jedis, List<String> command) {
        try {
            return Drive.typed(jedis.sendCommand(command(command.get(0)), rest(command)));
        } catch (JedisDataException e) {
            // An error reply; anything else (a broken connection) fails the driver.
            return Drive.typed(e);
        }
    }

    /**
     * A Jedis over TLS, as a Java application sets one up: the server's
     * certificate checked against the truststore STOCKGATE_TEST_TLS_TRUSTSTORE
     * (its host name too), and the client certificate of the keystore
     * STOCKGATE_TEST_TLS_KEYSTORE presented when that is set; both PKCS12,
     * with the password STOCKGATE_TEST_TLS_STORE_PASSWORD.
     */
    static Jedis tls(int port, String truststore) throws Exception {
        char[] password = System.getenv("STOCKGATE_TEST_TLS_STORE_PASSWORD").toCharArray();
        TrustManagerFactory trust =
            TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        trust.init(load(truststore, password));
        KeyManagerFactory keys =
            KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        String keystore = System.getenv("STOCKGATE_TEST_TLS_KEYSTORE");
        keys.init(keystore == null ? null : load(keystore, password), password);
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(keys.getKeyManagers(), trust.getTrustManagers(), null);
        SSLParameters parameters = new SSLParameters();
        parameters.setEndpointIdentificationAlgorithm("HTTPS");
        return new Jedis(new HostAndPort("127.0.0.1", port),
            DefaultJedisClientConfig.builder()
                .ssl(true)
                .sslSocketFactory(context.getSocketFactory())
                .sslParameters(parameters)
                .build());
    }

    static KeyStore load(String path, char[] password) throws Exception {
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (InputStream in = new FileInputStream(path)) {
            store.load(in, password);
        }
        return store;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        String mode = args[1];
        List<List<String>> commands = Drive.plan(System.in).get("commands");
        List<Object> replies = new ArrayList<>();
        switch (mode) {
            case "plain":
                String truststore = System.getenv("STOCKGATE_TEST_TLS_TRUSTSTORE");
                try (Jedis jedis = truststore == null
                        ? new Jedis("127.0.0.1", port)
                        : tls(port, truststore)) {
                    // A named user (stockgate's --users-file), when the
                    // test gives one: AUTH <user> <password>.
                    String user = System.getenv("STOCKGATE_TEST_USER");
                    if (user != null) {
                        jedis.auth(user, System.getenv("STOCKGATE_TEST_PASSWORD"));
                    }
                    for (List<String> command : commands) {
                        replies.add(send(jedis, command));
                    }
                }
                break;
            case "pool":
                JedisPoolConfig config = new JedisPoolConfig();
                config.setTestOnBorrow(true);
                try (JedisPool pool = new JedisPool(config, "127.0.0.1", port)) {
                    for (List<String> command : commands) {
                        try (Jedis jedis = pool.getResource()) {
                            replies.add(send(jedis, command));
                        }
                    }
                }
                break;
            case "pipeline":
                try (Jedis jedis = new Jedis("127.0.0.1", port)) {
                    Pipeline pipeline = jedis.pipelined();
                    List<Response<Object>> responses = new ArrayList<>();
                    for (List<String> command : commands) {
                        responses.add(pipeline.sendCommand(command(command.get(0)), rest(command)));
                    }
                    pipeline.sync();
                    for (Response<Object> response : responses) {
                        try {
                            replies.add(Drive.typed(response.get()));
                        } catch (JedisDataException e) {
                            replies.add(Drive.typed(e));
                        }
                    }
                }
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        Drive.print("jedis", Drive.version("redis.clients", "jedis"), replies,
            Collections.emptyMap());
    }
}
