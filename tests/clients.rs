//! Real client libraries against stockgate, used the way applications use
//! them: default settings, DEDUCT and REVERT sent as custom commands. (One
//! default is changed: rueidis's client-side cache, which needs CLIENT
//! TRACKING; see its entry below.)
//!
//! Every test starts a Redis Cluster and an in-process stockgate (see
//! `tests/support`), runs a real client as a subprocess against it and
//! compares **every field of every reply** (code, remain, order_no,
//! version, and reason for code 3, or the error text) with what stockgate
//! owes, then reads Redis directly to check what was written: stock, and
//! each idempotency record (`D:<qty>:<order_no>`, `R:<qty>:<order_no>`,
//! `V:0:`, or none) with its TTL.
//!
//! # Plans
//!
//! - The *codes plan*: one command at a time. DEDUCT codes 0, 1, 2, 3 (a
//!   bad qty, and a request_id reused with another qty) and an
//!   `UNKNOWNSKU` error, with and without order_no; then REVERT: a
//!   deduction given back (0, stock back, its order_no), reverted again
//!   (1), DEDUCTed again (4); an id never deducted (4), then DEDUCTed (4)
//!   and reverted again (1); a bad request_id (3).
//! - The *pipeline plan*: 100 independent DEDUCTs and REVERTs (one sku
//!   each, spread over the cluster's slots) sent at once, every reply
//!   checked in order. Each reply is known in advance because no two touch
//!   the same sku (states a REVERT or a duplicate needs are set up through
//!   stockgate beforehand): stockgate promises the order of replies, not the
//!   order of execution.
//!
//! # Clients
//!
//! Installed from their registries on first use into
//! `<target>/client-envs/<name>`, reused until their manifest or sources
//! change:
//! Python clients in a venv from hash-pinned requirements
//! (`tests/clients/python/*.txt`), Node clients with `npm ci` from a
//! committed lockfile (`tests/clients/node/<name>/`), the Go clients with
//! one `go build` of `tests/clients/go` (go.mod and go.sum pin go-redis and
//! rueidis; modules come from the Go module proxy), the Java clients with
//! one `mvn compile` of the reactor in `tests/clients/java` (a module per
//! client version, exact versions, jars from Maven Central). The Go and Java
//! envs are shared by every client of that language, so each is fetched and
//! compiled once per run, and not again while nothing changed. A missing
//! `python3`, `npm`, `go`, `java`, `mvn`, `redis-cli` or `redis-benchmark`
//! fails the test with how to install it. The drivers
//! (`tests/clients/{python,node,go,java}/...`) only run commands and print
//! typed replies as JSON; all judging is here.
//!
//! A recording relay ([`Tap`]) between client and stockgate captures what
//! each client really sends: the handshake on every connection (so the
//! protocol column of docs/interfaces.md's support table is tested, not assumed),
//! how many connections it used, its pool's health checks, and that every
//! planned command arrived exactly once (no client resent or dropped one).
//!
//! Lettuce also reconnects: stockgate runs as a subprocess on a fixed port,
//! is killed between two halves of a plan and started again on the same
//! port, and the second half goes through the same Lettuce connection.
//!
//! The examples in Python, Node, Go and Java (`examples/*`) run here too,
//! built with the envs above, for every outcome of DEDUCT and of REVERT,
//! including a retry after a client timeout. The Rust examples run in
//! `tests/examples.rs`.
//!
//! # Layout
//!
//! This file holds the tests and what each client is pinned to;
//! `clients/install.rs` installs and runs clients, `clients/plans.rs` builds
//! plans and compares replies, `clients/wire.rs` has the recording relay.

#[path = "clients/install.rs"]
mod install;
#[path = "clients/plans.rs"]
mod plans;
mod support;
#[path = "clients/wire.rs"]
mod wire;

use futures_util::future::join_all;
use install::*;
use plans::*;
use redis::Value;
use serde_json::{Value as Json, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use stockgate::dev::LocalCluster;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use wire::*;

// ---------------------------------------------------------------------------
// The clients under test
// ---------------------------------------------------------------------------

/// redis-py 5: RESP2 by default; announces itself with CLIENT SETINFO.
const REDIS_PY_5: Pinned = Pinned {
    name: "redis-py-5",
    runtime: Runtime::Python {
        requirements: "redis-py-5.txt",
    },
    version: "5.3.1",
    handshake: &[
        &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
        &["CLIENT", "SETINFO", "LIB-VER", "5.3.1"],
    ],
    error_class: "ResponseError",
    habits: Habits {
        borrow_ping: BorrowPing::OnReuse,
        ..Habits::PLAIN
    },
};

/// redis-py 8 (newest): RESP3 by default (`HELLO 3`), then asks for
/// maintenance notifications, which stockgate refuses with an error that
/// redis-py's default "auto" mode ignores.
const REDIS_PY_8: Pinned = Pinned {
    name: "redis-py-8",
    runtime: Runtime::Python {
        requirements: "redis-py-8.txt",
    },
    version: "8.1.0",
    handshake: &[
        &["HELLO", "3"],
        &[
            "CLIENT",
            "MAINT_NOTIFICATIONS",
            "ON",
            "moving-endpoint-type",
            "internal-ip",
        ],
        &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"],
        &["CLIENT", "SETINFO", "LIB-VER", "8.1.0"],
    ],
    error_class: "ResponseError",
    habits: Habits {
        borrow_ping: BorrowPing::OnReuse,
        ..Habits::PLAIN
    },
};

/// ioredis 5: RESP2; its ready check sends INFO and waits for `loading:0`.
const IOREDIS_5: Pinned = Pinned {
    name: "ioredis5",
    runtime: Runtime::Node {
        library: "ioredis",
        min_node: 12,
    },
    version: "5.11.1",
    handshake: &[
        &["client", "SETINFO", "LIB-NAME", "ioredis"],
        &["client", "SETINFO", "LIB-VER", "5.11.1"],
        &["info"],
    ],
    error_class: "ReplyError",
    habits: Habits::PLAIN,
};

/// ioredis 6: RESP3 by default (`hello 3`), then the same ready check.
/// Errors are `SimpleError`, a subclass of `ReplyError` named "ReplyError".
const IOREDIS_6: Pinned = Pinned {
    name: "ioredis6",
    runtime: Runtime::Node {
        library: "ioredis",
        min_node: 20,
    },
    version: "6.0.0",
    handshake: &[
        &["hello", "3"],
        &["client", "SETINFO", "LIB-VER", "6.0.0"],
        &["client", "SETINFO", "LIB-NAME", "ioredis"],
        &["info"],
    ],
    error_class: "SimpleError",
    habits: Habits::PLAIN,
};

/// node-redis 4: RESP2. It reports the version of @redis/client it was
/// released with (1.6.0), not the installed 1.6.1.
const NODE_REDIS_4: Pinned = Pinned {
    name: "node-redis4",
    runtime: Runtime::Node {
        library: "redis",
        min_node: 14,
    },
    version: "4.7.1",
    handshake: &[
        &["CLIENT", "SETINFO", "LIB-NAME", "node-redis"],
        &["CLIENT", "SETINFO", "LIB-VER", "1.6.0"],
    ],
    error_class: "ErrorReply",
    habits: Habits::PLAIN,
};

/// node-redis 6 (newest): RESP3 by default (`HELLO 3`), then asks for
/// maintenance notifications (refused; ignored by its default mode).
const NODE_REDIS_6: Pinned = Pinned {
    name: "node-redis6",
    runtime: Runtime::Node {
        library: "redis",
        min_node: 20,
    },
    version: "6.3.1",
    handshake: &[
        &["HELLO", "3"],
        &["CLIENT", "SETINFO", "LIB-VER", "6.3.1"],
        &["CLIENT", "SETINFO", "LIB-NAME", "node-redis"],
        &[
            "CLIENT",
            "MAINT_NOTIFICATIONS",
            "ON",
            "moving-endpoint-type",
            "external-ip",
        ],
    ],
    error_class: "SimpleError",
    habits: Habits::PLAIN,
};

/// go-redis v9 (newest): `redis.NewClient(&redis.Options{Addr})`, RESP3 by
/// default (lowercase `hello 3`). It then asks for maintenance
/// notifications, which stockgate refuses and its default "auto" mode
/// ignores, and announces itself (`LIB-NAME` carries the Go version it
/// was built with).
const GO_REDIS_9: Pinned = Pinned {
    name: "go-redis-9",
    runtime: Runtime::Go {
        library: "go-redis",
    },
    version: "9.23.0",
    handshake: &[
        &["hello", "3"],
        &[
            "client",
            "maint_notifications",
            "on",
            "moving-endpoint-type",
            "internal-ip",
        ],
        &["client", "setinfo", "LIB-NAME", "go-redis(,{runtime})"],
        &["client", "setinfo", "LIB-VER", "9.23.0"],
    ],
    error_class: "proto.RedisError",
    habits: Habits {
        dropped_once_refused: Some(&[
            "client",
            "maint_notifications",
            "on",
            "moving-endpoint-type",
            "internal-ip",
        ]),
        ..Habits::PLAIN
    },
};

/// rueidis (newest): RESP3 only (`HELLO 3`; without it rueidis falls back
/// to RESP2 only with its cache off). Its default client-side cache sends
/// `CLIENT TRACKING ON OPTIN` and fails the connection when refused;
/// stockgate refuses it, because it cannot send the invalidations such a
/// cache needs, so the driver sets `DisableCache: true`, as users must.
/// Its cluster probe (`CLUSTER SLOTS`) is refused too, and rueidis then
/// uses a single-node client by itself.
const RUEIDIS_1: Pinned = Pinned {
    name: "rueidis-1",
    runtime: Runtime::Go { library: "rueidis" },
    version: "1.0.79",
    handshake: &[
        &["HELLO", "3"],
        &["CLIENT", "SETINFO", "LIB-NAME", "rueidis"],
        &["CLIENT", "SETINFO", "LIB-VER", "1.0.79"],
        &["CLUSTER", "SLOTS"],
    ],
    error_class: "*rueidis.RedisError",
    habits: Habits::PLAIN,
};

/// Jedis 5 (newest 5.x): RESP2. `new Jedis(host, port)` sends nothing
/// before its first command; a connection made by `JedisPool` announces
/// itself with `CLIENT SETINFO`, and testOnBorrow PINGs it on every loan.
const JEDIS_5: Pinned = Pinned {
    name: "jedis-5",
    runtime: Runtime::Java {
        module: "jedis5",
        main: "JedisDriver",
    },
    version: "5.2.0",
    handshake: &[],
    error_class: "JedisDataException",
    habits: Habits {
        pool_handshake: Some(&[
            &["CLIENT", "SETINFO", "LIB-NAME", "jedis"],
            &["CLIENT", "SETINFO", "LIB-VER", "5.2.0"],
        ]),
        borrow_ping: BorrowPing::Always,
        ..Habits::PLAIN
    },
};

/// Jedis 8 (newest): the same on the wire, RESP2 by default too.
const JEDIS_8: Pinned = Pinned {
    name: "jedis-8",
    runtime: Runtime::Java {
        module: "jedis8",
        main: "JedisDriver",
    },
    version: "8.0.2",
    handshake: &[],
    error_class: "JedisDataException",
    habits: Habits {
        pool_handshake: Some(&[
            &["CLIENT", "SETINFO", "LIB-NAME", "jedis"],
            &["CLIENT", "SETINFO", "LIB-VER", "8.0.2"],
        ]),
        borrow_ping: BorrowPing::Always,
        ..Habits::PLAIN
    },
};

/// Lettuce 6 (newest 6.x): RESP3 by default; it casts the HELLO reply
/// map's fields (`(Long) id`, `(String) mode`, `version`, `role`), so a
/// wrong type there fails the connection.
const LETTUCE_6: Pinned = Pinned {
    name: "lettuce-6",
    runtime: Runtime::Java {
        module: "lettuce6",
        main: "LettuceDriver",
    },
    version: "6.8.2.RELEASE",
    handshake: &[
        &["HELLO", "3"],
        &["CLIENT", "SETINFO", "lib-name", "Lettuce"],
        &["CLIENT", "SETINFO", "lib-ver", "6.8.2.RELEASE/34f8700"],
    ],
    error_class: "RedisCommandExecutionException",
    habits: Habits::PLAIN,
};

/// Lettuce 7 (newest): the same, and then it asks for maintenance
/// notifications, which stockgate refuses and Lettuce ignores.
const LETTUCE_7: Pinned = Pinned {
    name: "lettuce-7",
    runtime: Runtime::Java {
        module: "lettuce7",
        main: "LettuceDriver",
    },
    version: "7.7.0.RELEASE",
    handshake: &[
        &["HELLO", "3"],
        &["CLIENT", "SETINFO", "lib-name", "Lettuce"],
        &["CLIENT", "SETINFO", "lib-ver", "7.7.0.RELEASE/1960d49"],
        &[
            "CLIENT",
            "MAINT_NOTIFICATIONS",
            "on",
            "moving-endpoint-type",
            "internal-ip",
        ],
    ],
    error_class: "RedisCommandExecutionException",
    habits: Habits::PLAIN,
};

/// Redisson 3 (newest 3.x), `useSingleServer()`: RESP2. It opens its pool
/// at start (24 idle connections and one for pub/sub by default), PINGs
/// each new connection twice, and spreads commands over the pool. Its
/// error messages append the channel, command and params to the server's
/// text; the driver checks that tail and cuts it off.
const REDISSON_3: Pinned = Pinned {
    name: "redisson-3",
    runtime: Runtime::Java {
        module: "redisson3",
        main: "RedissonDriver",
    },
    version: "3.52.0",
    handshake: &[&["PING"], &["PING"]],
    error_class: "RedisException",
    habits: Habits {
        spreads: true,
        ..Habits::PLAIN
    },
};

#[test]
fn redis_py_5_resp2_plain_pool_and_pipeline() {
    check_driver_client(&REDIS_PY_5, &["plain", "pool", "pipeline"]);
}

#[test]
fn redis_py_8_resp3_plain_pool_and_pipeline() {
    check_driver_client(&REDIS_PY_8, &["plain", "pool", "pipeline"]);
}

#[test]
fn ioredis_5_resp2_call_and_pipeline() {
    check_driver_client(&IOREDIS_5, &["plain", "pipeline"]);
}

#[test]
fn ioredis_6_resp3_call_and_pipeline() {
    check_driver_client(&IOREDIS_6, &["plain", "pipeline"]);
}

#[test]
fn node_redis_4_resp2_send_command_and_pipeline() {
    check_driver_client(&NODE_REDIS_4, &["plain", "pipeline"]);
}

#[test]
fn node_redis_6_resp3_send_command_and_pipeline() {
    check_driver_client(&NODE_REDIS_6, &["plain", "pipeline"]);
}

#[test]
fn go_redis_9_resp3_do_pipeline_and_pool_reuse() {
    check_driver_client(&GO_REDIS_9, &["plain", "pipeline", "concurrent"]);
}

/// Named users (`--users-file`) through redis-py and Jedis (AUTH <user>
/// <password>) and go-redis (HELLO 3 AUTH): each does what its right
/// allows, a command outside it answers NOPERM, and the stock shows that
/// nothing else ran. Then go-redis and Jedis over TLS, logged in by their
/// client certificate.
#[test]
fn named_users_log_in_with_redis_py_go_redis_and_jedis_and_are_refused_outside_their_rights() {
    let clients = [&REDIS_PY_8, &GO_REDIS_9, &JEDIS_8];
    let installs = clients.map(|client| std::thread::spawn(move || installed(client)));
    let cluster = cluster();
    let envs = installs.map(|i| i.join().expect("installing a client"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    std::fs::write(
        &path,
        "[users.checkout]\npasswords = [\"checkout-pw\"]\nrights = [\"caller\"]\n\n\
         [users.viewer]\npasswords = [\"viewer-pw\"]\nrights = [\"reader\"]\n\n\
         [users.certuser]\npasswords = [\"cert-pw\"]\nrights = [\"caller\"]\n",
    )
    .unwrap();
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |c| {
            c.users = Some(stockgate::config::UsersFile::read(&path).unwrap());
            c.admin_commands = true;
        })
        .await;
        for (client, env) in clients.iter().zip(&envs) {
            let sku = format!("{}-users", client.name);
            set_stock(&cluster, &sku, 10);
            let run = |user: &str, password: &str, commands: Vec<Vec<String>>| {
                let mut driver = env.driver(server.addr.port(), "plain");
                driver
                    .env("STOCKGATE_TEST_USER", user)
                    .env("STOCKGATE_TEST_PASSWORD", password);
                let plan = json!({ "commands": commands }).to_string();
                async move {
                    let out = finish(driver, plan.as_bytes()).await;
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    printed(&out.stdout).replies
                }
            };
            let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            let caller = run(
                "checkout",
                "checkout-pw",
                vec![
                    words(&["DEDUCT", &sku, "2", "u-1"]),
                    words(&["STOCK.SET", &sku, "100", "u-op"]),
                ],
            )
            .await;
            assert_eq!(
                caller[0][0],
                json!({"int": 0}),
                "{}: {caller:?}",
                client.name
            );
            assert_eq!(
                caller[0][1],
                json!({"int": 8}),
                "{}: {caller:?}",
                client.name
            );
            let refused = caller[1]["error"].as_str().unwrap_or_default();
            assert!(
                refused.contains("User checkout has no permissions to run the 'stock.set' command"),
                "{}: {caller:?}",
                client.name
            );
            let reader = run(
                "viewer",
                "viewer-pw",
                vec![
                    words(&["STOCK.GET", &sku]),
                    words(&["DEDUCT", &sku, "1", "u-2"]),
                ],
            )
            .await;
            assert_eq!(reader[0], json!({"int": 8}), "{}: {reader:?}", client.name);
            let refused = reader[1]["error"].as_str().unwrap_or_default();
            assert!(
                refused.contains("User viewer has no permissions to run the 'deduct' command"),
                "{}: {reader:?}",
                client.name
            );
            // The two refused commands changed nothing.
            assert_eq!(get_stock(&cluster, &sku), Some(8), "{}", client.name);
            let mut conn = cluster.cluster_connection().unwrap();
            assert_eq!(record_state(&mut conn, &sku, "u-2"), '-', "{}", client.name);
        }
        assert!(server.drain(std::time::Duration::from_secs(5)).await);

        // go-redis over TLS (--tls-cert, --tls-client-ca), logged in by its
        // client certificate (CN certuser), refused outside its rights.
        let certs = support::certs::Certs::for_server("IP:127.0.0.1");
        let server = proxy(cluster.seeds(), |c| {
            c.users = Some(stockgate::config::UsersFile::read(&path).unwrap());
            c.tls = Some(stockgate::config::ListenerTls {
                cert: certs.path("server.crt"),
                key: certs.path("server.key"),
                client_ca: Some(certs.path("ca.crt")),
            });
        })
        .await;
        set_stock(&cluster, "go-tls", 10);
        let mut driver = envs[1].driver(server.addr.port(), "plain");
        driver
            .env("STOCKGATE_TEST_TLS_CA", certs.path("ca.crt"))
            .env("STOCKGATE_TEST_TLS_CERT", certs.path("client.crt"))
            .env("STOCKGATE_TEST_TLS_KEY", certs.path("client.key"));
        let plan = json!({ "commands": [
            ["DEDUCT", "go-tls", "3", "tls-1"],
            ["STOCK.SET", "go-tls", "100", "tls-op"],
        ]})
        .to_string();
        let out = finish(driver, plan.as_bytes()).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let replies = printed(&out.stdout).replies;
        assert_eq!(replies[0][0], json!({"int": 0}), "{replies:?}");
        assert!(
            replies[1]["error"]
                .as_str()
                .unwrap_or_default()
                .contains("User certuser has no permissions to run the 'stock.set' command"),
            "{replies:?}"
        );
        assert_eq!(get_stock(&cluster, "go-tls"), Some(7));

        // Jedis over the same TLS, its truststore and keystore made from
        // the same CA and client certificate.
        let (truststore, keystore) = certs.java_stores("stockgate-test");
        set_stock(&cluster, "jedis-tls", 10);
        let mut driver = envs[2].driver(server.addr.port(), "plain");
        driver
            .env("STOCKGATE_TEST_TLS_TRUSTSTORE", &truststore)
            .env("STOCKGATE_TEST_TLS_KEYSTORE", &keystore)
            .env("STOCKGATE_TEST_TLS_STORE_PASSWORD", "stockgate-test");
        let plan = json!({ "commands": [
            ["DEDUCT", "jedis-tls", "3", "tls-1"],
            ["STOCK.SET", "jedis-tls", "100", "tls-op"],
        ]})
        .to_string();
        let out = finish(driver, plan.as_bytes()).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let replies = printed(&out.stdout).replies;
        assert_eq!(replies[0][0], json!({"int": 0}), "{replies:?}");
        assert_eq!(replies[0][1], json!({"int": 7}), "{replies:?}");
        assert!(
            replies[1]["error"]
                .as_str()
                .unwrap_or_default()
                .contains("User certuser has no permissions to run the 'stock.set' command"),
            "{replies:?}"
        );
        assert_eq!(get_stock(&cluster, "jedis-tls"), Some(7));
        assert!(server.drain(std::time::Duration::from_secs(5)).await);
    });
}

#[test]
fn rueidis_1_resp3_do_and_do_multi() {
    check_driver_client(&RUEIDIS_1, &["plain", "pipeline"]);
}

#[test]
fn jedis_5_send_command_pool_and_pipeline() {
    check_driver_client(&JEDIS_5, &["plain", "pool", "pipeline"]);
}

#[test]
fn jedis_8_send_command_pool_and_pipeline() {
    check_driver_client(&JEDIS_8, &["plain", "pool", "pipeline"]);
}

#[test]
fn lettuce_6_resp3_async_one_by_one_and_all_at_once() {
    check_driver_client(&LETTUCE_6, &["plain", "pipeline"]);
}

#[test]
fn lettuce_7_resp3_async_one_by_one_and_all_at_once() {
    check_driver_client(&LETTUCE_7, &["plain", "pipeline"]);
}

#[test]
fn redisson_3_custom_command_through_its_executor() {
    check_driver_client(&REDISSON_3, &["plain", "pipeline"]);
}

/// Runs `client`'s driver in each mode against a fresh cluster and
/// stockgate, checking replies, what went over the wire and what Redis
/// holds afterwards. Modes: `plain` (the codes plan, one command at a
/// time), `pool` (the same, each command on a connection borrowed from
/// the client's pool), `pipeline` (the pipeline plan at once) and
/// `concurrent` (the pipeline plan, each command from its own goroutine
/// through a small pool).
fn check_driver_client(client: &'static Pinned, modes: &[&str]) {
    // Install while the cluster starts (the cluster must start on this
    // thread: its servers die with the thread that spawned them).
    let install = std::thread::spawn(move || installed(client));
    let cluster = cluster();
    let env = install
        .join()
        .unwrap_or_else(|_| panic!("installing {}", client.name));
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        for mode in modes {
            let tag = format!("{}-{mode}", client.name);
            let plan = match *mode {
                "pipeline" | "concurrent" => pipeline_plan(&cluster, server.addr, &tag).await,
                _ => codes_plan(&cluster, &tag),
            };
            let tap = Tap::start(server.addr, false).await;
            let out = env.drive(tap.addr.port(), mode, &plan.commands).await;
            assert_eq!(
                out.version, client.version,
                "{}: the env holds another version",
                client.name
            );
            assert_replies(&tag, &out.replies, &plan.expected(client.error_class));
            plan.audit(&cluster);
            check_wire(client, &tag, mode, &tap.commands(), &plan.commands, &out);
        }
    });
}

/// The pool size the Go driver's `concurrent` mode sets.
const GO_POOL_SIZE: usize = 4;

/// What `client` sent in `mode`, connection by connection: the handshake
/// on each, every planned command exactly once, how many connections it
/// used, and in the `pool` mode the exact sequence with its health checks.
fn check_wire(
    client: &Pinned,
    tag: &str,
    mode: &str,
    sent: &[Vec<Vec<String>>],
    planned: &[Vec<String>],
    out: &Driven,
) {
    let used: Vec<&Vec<Vec<String>>> = sent.iter().filter(|c| !c.is_empty()).collect();
    assert!(!used.is_empty(), "{tag}: nothing sent");

    // No command resent by a client-side retry, none lost.
    let mut arrived: Vec<&Vec<String>> = used
        .iter()
        .flat_map(|c| c.iter())
        .filter(|c| is_stock_command(c))
        .collect();
    let mut expected: Vec<&Vec<String>> = planned.iter().collect();
    arrived.sort();
    expected.sort();
    assert_eq!(arrived, expected, "{tag}: every planned command sent once");

    // `{runtime}` in a handshake stands for the driver's language
    // version, which go-redis puts in its LIB-NAME.
    let runtime = out.printed["runtime"].as_str().unwrap_or("");
    let handshake: Vec<Vec<String>> = strings(match mode {
        "pool" => client.habits.pool_handshake.unwrap_or(client.handshake),
        _ => client.handshake,
    })
    .into_iter()
    .map(|c| {
        c.into_iter()
            .map(|a| a.replace("{runtime}", runtime))
            .collect()
    })
    .collect();
    if mode == "pool" {
        // One connection, borrowed and given back for each command, and
        // health-checked as the pool lends it.
        assert_eq!(used.len(), 1, "{tag}: the pool reuses one connection");
        let mut expected = Vec::new();
        if client.habits.borrow_ping == BorrowPing::OnReuse {
            // redis-py checks a new connection before its handshake.
            expected.push(vec!["PING".to_owned()]);
        }
        expected.extend(handshake);
        for (i, command) in planned.iter().enumerate() {
            match client.habits.borrow_ping {
                BorrowPing::Always => expected.push(vec!["PING".to_owned()]),
                BorrowPing::OnReuse if i > 0 => expected.push(vec!["PING".to_owned()]),
                _ => {}
            }
            expected.push(command.clone());
        }
        assert_eq!(
            used[0], &expected,
            "{tag}: the pooled connection's commands"
        );
        return;
    }
    let mut full = 0;
    for conn in &used {
        let before: Vec<Vec<String>> = conn
            .iter()
            .take_while(|c| !is_stock_command(c))
            .cloned()
            .collect();
        if before == handshake {
            full += 1;
            continue;
        }
        let Some(dropped) = client.habits.dropped_once_refused else {
            panic!("{tag}: handshake on connect: {before:?}, not {handshake:?}");
        };
        let without: Vec<Vec<String>> = handshake
            .iter()
            .filter(|c| *c != dropped)
            .cloned()
            .collect();
        assert_eq!(before, without, "{tag}: handshake on connect");
    }
    // Only a refusal stops it: some connection asked first.
    assert!(
        full > 0,
        "{tag}: no connection sent the whole handshake {handshake:?}"
    );
    if mode == "concurrent" {
        // 100 commands at once through a pool of 4: each connection
        // served many, and the pool's own count agrees with the wire.
        assert!(
            used.len() <= GO_POOL_SIZE,
            "{tag}: {} connections",
            used.len()
        );
        assert_eq!(
            out.printed["pool"]["TotalConns"],
            json!(used.len()),
            "{tag}: go-redis's pool stats: {}",
            out.printed["pool"]
        );
    } else if !client.habits.spreads {
        assert_eq!(used.len(), 1, "{tag}: one connection for the whole plan");
    }
}

// ---------------------------------------------------------------------------
// redis-cli and redis-benchmark
// ---------------------------------------------------------------------------

/// One-shot redis-cli in its three output styles: raw (what scripts
/// read), `--no-raw` (types shown) over RESP2, and `-3 --no-raw` over
/// RESP3 (`HELLO 3` first).
#[test]
fn redis_cli_one_shot_raw_typed_and_resp3() {
    let cluster = cluster();
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        let port = server.addr.port();
        for (flags, typed) in [
            (&[][..], false),
            (&["--no-raw"][..], true),
            (&["-3", "--no-raw"][..], true),
        ] {
            let tag = format!("cli{}", flags.concat());
            let plan = codes_plan(&cluster, &tag);
            for (command, expected) in plan.commands.iter().zip(plan.expected("")) {
                let mut args: Vec<&str> = flags.to_vec();
                args.extend(command.iter().map(String::as_str));
                assert_eq!(
                    redis_cli(port, &args),
                    cli_text(&expected, typed),
                    "redis-cli {args:?}"
                );
            }
            plan.audit(&cluster);
        }
    });
}

/// `redis-cli --pipe` streams raw RESP and only counts replies; it prints
/// error replies to stderr. Every reply's effect is then checked in Redis.
#[test]
fn redis_cli_pipe_mode_sends_the_pipeline_plan() {
    let cluster = cluster();
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        let plan = pipeline_plan(&cluster, server.addr, "cli-pipe").await;
        let mut input = Vec::new();
        for command in &plan.commands {
            input.extend_from_slice(&resp(command));
        }
        let port = server.addr.port().to_string();
        let out = run_with_stdin(
            "redis-cli",
            &["-h", "127.0.0.1", "-p", &port, "--pipe"],
            &input,
        )
        .await;
        let expected = plan.expected("");
        let errors: Vec<&str> = expected
            .iter()
            .filter_map(|r| r.get("error").and_then(Json::as_str))
            .collect();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.ends_with(&format!(
                "errors: {}, replies: {}\n",
                errors.len(),
                plan.commands.len()
            )),
            "{stdout}"
        );
        // redis-cli --pipe exits 1 when any reply was an error.
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().collect::<Vec<_>>(), errors);
        plan.audit(&cluster);
    });
}

/// redis-benchmark with DEDUCT as a custom command. `__rand_int__` (with
/// `-r`) becomes a 12-digit number, new at each occurrence, so it goes in
/// the request_id only: some ids repeat (duplicates), and the stock runs
/// out (insufficient). Whatever the mix, the books must balance.
#[test]
fn redis_benchmark_custom_deduct_keeps_the_books_balanced() {
    const REQUESTS: u64 = 2000;
    const STOCK: i64 = 1500;
    let cluster = cluster();
    set_stocks(&cluster, &[("bench".to_owned(), STOCK)]);
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        let port = server.addr.port().to_string();
        let n = REQUESTS.to_string();
        let out = run_with_stdin(
            "redis-benchmark",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-c",
                "8",
                "-n",
                &n,
                "-P",
                "4",
                "-r",
                "50000",
                "-q",
                "DEDUCT",
                "bench",
                "1",
                "bench-__rand_int__",
            ],
            b"",
        )
        .await;
        assert!(out.status.success(), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("DEDUCT bench 1 bench-__rand_int__"),
            "{out:?}"
        );

        let counts = deduct_counts(server.admin_addr).await;
        let stock = get_stock(&cluster, "bench").unwrap();
        let records = scan_records(&cluster, "bench");
        // Every request got a business answer; none was refused or failed.
        assert_eq!(counts["invalid"] + counts["error"], 0, "{counts:?}");
        assert_eq!(
            counts["ok"] + counts["duplicate"] + counts["insufficient"],
            REQUESTS,
            "{counts:?}"
        );
        assert!(counts["insufficient"] > 0, "the stock ran out: {counts:?}");
        // Each success wrote one record of qty 1 and took one unit.
        for (key, value) in &records {
            let id = key.rsplit(':').next().unwrap();
            assert!(
                id.len() == "bench-".len() + 12
                    && id["bench-".len()..].bytes().all(|b| b.is_ascii_digit()),
                "__rand_int__ is substituted: {key}"
            );
            assert_eq!(summary(value), "D:1:", "{key}");
        }
        let deducted: i64 = records
            .iter()
            .map(|(_, v)| {
                summary(v)
                    .split(':')
                    .nth(1)
                    .unwrap()
                    .parse::<i64>()
                    .unwrap()
            })
            .sum();
        assert_eq!(STOCK - stock, deducted);
        assert_eq!(deducted as u64, counts["ok"]);
        assert_eq!(stock, 0, "more distinct ids than stock");
    });
}

/// What one-shot redis-cli prints for `reply`: raw, or with types.
fn cli_text(reply: &Json, typed: bool) -> String {
    if let Some(error) = reply.get("error") {
        let error = error.as_str().unwrap();
        return if typed {
            format!("(error) {error}\n")
        } else {
            format!("{error}\n\n")
        };
    }
    let mut out = String::new();
    for (i, field) in reply.as_array().unwrap().iter().enumerate() {
        let text = match (field.get("int"), field.get("str")) {
            (Some(n), _) if typed => format!("(integer) {n}"),
            (Some(n), _) => n.to_string(),
            (_, Some(s)) if typed => format!("{s}"),
            (_, Some(s)) => s.as_str().unwrap().to_owned(),
            _ => unreachable!("{field}"),
        };
        if typed {
            out.push_str(&format!("{}) {text}\n", i + 1));
        } else {
            out.push_str(&format!("{text}\n"));
        }
    }
    out
}

/// Every idempotency record of `sku`, found with SCAN on every primary.
fn scan_records(cluster: &LocalCluster, sku: &str) -> Vec<(String, String)> {
    let pattern = format!("{}:req:*", String::from_utf8(stock_key(sku)).unwrap());
    let mut found = Vec::new();
    for node in &cluster.nodes[..cluster.masters] {
        let mut conn = node.connection().unwrap();
        let keys: Vec<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut conn)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for key in keys {
            let value: String = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
            found.push((key, value));
        }
    }
    found
}

/// `stockgate_requests_total{command=...,result=...}` from /metrics, by
/// (command, result).
async fn request_counts(admin: SocketAddr) -> HashMap<(String, String), u64> {
    let (_, text) = tokio::task::spawn_blocking(move || http_get(admin.port(), "/metrics"))
        .await
        .unwrap()
        .unwrap();
    text.lines()
        .filter_map(|line| {
            let labels = line.strip_prefix("stockgate_requests_total{command=\"")?;
            let (command, rest) = labels.split_once("\",result=\"")?;
            let (result, count) = rest.split_once("\"} ")?;
            Some(((command.to_owned(), result.to_owned()), count.parse().ok()?))
        })
        .collect()
}

/// DEDUCT's `stockgate_requests_total` by result.
async fn deduct_counts(admin: SocketAddr) -> HashMap<String, u64> {
    request_counts(admin)
        .await
        .into_iter()
        .filter(|((command, _), _)| command == "deduct")
        .map(|((_, result), n)| (result, n))
        .collect()
}

// ---------------------------------------------------------------------------
// The redis crate (Rust)
// ---------------------------------------------------------------------------

#[test]
fn rust_redis_crate_multiplexed_and_pipeline_resp2_and_resp3() {
    let cluster = cluster();
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        for resp3 in [false, true] {
            let tag = format!("rs-{}", if resp3 { "resp3" } else { "resp2" });
            let tap = Tap::start(server.addr, false).await;
            let url = format!(
                "redis://{}{}",
                tap.addr,
                if resp3 { "/?protocol=resp3" } else { "" }
            );
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .expect("connects through the tap");

            let plan = codes_plan(&cluster, &tag);
            let mut replies = Vec::new();
            for command in &plan.commands {
                let mut cmd = redis::cmd(&command[0]);
                for arg in &command[1..] {
                    cmd.arg(arg);
                }
                replies.push(match cmd.query_async::<Value>(&mut conn).await {
                    Ok(value) => typed(&value, "RedisError"),
                    Err(err) => json!({
                        "error": format!("{} {}", err.code().unwrap(), err.detail().unwrap()),
                        "class": "RedisError",
                    }),
                });
            }
            assert_replies(&tag, &replies, &plan.expected("RedisError"));
            plan.audit(&cluster);
            let handshake: Vec<Vec<String>> = tap.commands()[0]
                .iter()
                .take_while(|c| !is_stock_command(c))
                .cloned()
                .collect();
            let mut expected = vec![
                vec!["CLIENT", "SETINFO", "LIB-NAME", "redis-rs"],
                vec!["CLIENT", "SETINFO", "LIB-VER", "1.8.1"],
            ];
            if resp3 {
                expected.insert(0, vec!["HELLO", "3"]);
            }
            assert_eq!(handshake, expected, "{tag}: redis-rs handshake");

            let plan = pipeline_plan(&cluster, server.addr, &format!("{tag}-pipe")).await;
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for command in &plan.commands {
                pipe.cmd(&command[0]).arg(&command[1..]);
            }
            let values: Vec<Value> = pipe.query_async(&mut conn).await.unwrap();
            let replies: Vec<Json> = values.iter().map(|v| typed(v, "RedisError")).collect();
            assert_replies(&tag, &replies, &plan.expected("RedisError"));
            plan.audit(&cluster);
        }
    });
}

// ---------------------------------------------------------------------------
// Lettuce reconnecting after stockgate restarts
// ---------------------------------------------------------------------------

#[test]
fn lettuce_6_reconnects_after_stockgate_restarts() {
    check_reconnect(&LETTUCE_6);
}

#[test]
fn lettuce_7_reconnects_after_stockgate_restarts() {
    check_reconnect(&LETTUCE_7);
}

/// `stockgate serve` in front of `seeds` on `listen` (a fixed port, so a
/// test can kill it and start it again there), ready. Warnings and errors
/// only: its log is shown if the test fails.
fn start_gate(seeds: &[String], listen: SocketAddr) -> Stockgate {
    support::Launch::serve(seeds)
        .listen(listen)
        .env("STOCKGATE_LOG", "warn")
        .start()
}

/// Lettuce's async commands across a stockgate restart. The driver runs
/// the codes plan one command at a time and says `restart`; the test kills
/// stockgate (SIGKILL: a crash, no goodbye to the client), starts a new
/// one on the same port and says `restarted`; the driver then dispatches
/// the pipeline plan, all at once, on the same connection object, which
/// Lettuce's watchdog reconnects by itself (with a new HELLO 3). Every
/// reply of both halves is checked, Redis is audited, and the new
/// stockgate's metrics show it served exactly the second half.
fn check_reconnect(client: &'static Pinned) {
    let install = std::thread::spawn(move || installed(client));
    let cluster = cluster();
    let env = install.join().unwrap();
    let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let seeds = cluster.seeds();
    let mut gate = start_gate(&seeds, listen);
    runtime().block_on(async {
        let tag = format!("{}-restart", client.name);
        let before = codes_plan(&cluster, &tag);
        let after = pipeline_plan(&cluster, listen, &format!("{tag}-after")).await;
        let mut driver = env.driver(listen.port(), "reconnect");
        driver
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = driver.spawn().expect("the Lettuce driver starts");
        // Read apart, so a chatty stderr can never block the driver.
        let mut err = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text).await;
            text
        });
        let mut stdin = child.stdin.take().unwrap();
        let plan = json!({"commands": before.commands, "after": after.commands});
        stdin
            .write_all(format!("{plan}\n").as_bytes())
            .await
            .unwrap();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(WATCHDOG, stdout.read_line(&mut line))
            .await
            .expect("the driver says restart before the watchdog")
            .unwrap();
        if line != "restart\n" {
            let _ = child.kill().await;
            panic!(
                "the driver did not finish the first half: {line:?}\n{}",
                stderr.await.unwrap()
            );
        }

        gate.kill();
        let seeds = seeds.clone();
        gate = tokio::task::spawn_blocking(move || start_gate(&seeds, listen))
            .await
            .unwrap();
        stdin.write_all(b"restarted\n").await.unwrap();
        drop(stdin);

        let mut rest = Vec::new();
        let read = async {
            stdout.read_to_end(&mut rest).await.unwrap();
            child.wait().await.unwrap()
        };
        let status = tokio::time::timeout(WATCHDOG, read)
            .await
            .unwrap_or_else(|_| panic!("the Lettuce driver still running after {WATCHDOG:?}"));
        let stderr = stderr.await.unwrap();
        assert!(status.success(), "the driver failed: {stderr}");
        let out = printed(&rest);
        assert_eq!(out.version, client.version);
        assert_replies(&tag, &out.replies, &before.expected(client.error_class));
        let second: Vec<Json> = out.printed["after"].as_array().unwrap().clone();
        assert_replies(
            &format!("{tag} after the restart"),
            &second,
            &after.expected(client.error_class),
        );
        before.audit(&cluster);
        after.audit(&cluster);

        // The second half went to the new process, each command once (the
        // new process's counters start at zero; the first one also served
        // the pipeline plan's set-up).
        let served: u64 = request_counts(gate.admin)
            .await
            .into_iter()
            .filter(|((command, _), _)| command == "deduct" || command == "revert")
            .map(|(_, n)| n)
            .sum();
        assert_eq!(
            served as usize,
            after.commands.len(),
            "served by the new stockgate"
        );
    });
}

// ---------------------------------------------------------------------------
// The examples
// ---------------------------------------------------------------------------

#[test]
fn python_example_handles_every_outcome() {
    let requirements = read("examples/python/requirements.txt");
    assert!(
        requirements
            .lines()
            .any(|l| l == format!("redis=={}", REDIS_PY_8.version)),
        "examples/python/requirements.txt must pin the redis-py the test runs"
    );
    check_example(&REDIS_PY_8, "examples/python/deduct.py");
}

#[test]
fn node_example_handles_every_outcome() {
    let manifest = read("examples/node/package.json");
    assert!(
        manifest.contains(&format!("\"ioredis\": \"{}\"", IOREDIS_5.version)),
        "examples/node/package.json must pin the ioredis the test runs"
    );
    check_example(&IOREDIS_5, "examples/node/deduct.js");
}

/// examples/go, built from its own go.mod and go.sum (with the drivers, in
/// one env) and run as a binary.
#[test]
fn go_example_handles_every_outcome() {
    let manifest = read("examples/go/go.mod");
    assert!(
        manifest.contains(&format!(
            "require github.com/redis/go-redis/v9 v{}\n",
            GO_REDIS_9.version
        )),
        "examples/go/go.mod must pin the go-redis the test runs"
    );
    check_example(&GO_REDIS_9, "examples/go");
}

/// examples/java, compiled by its pom.xml (in the same Maven run as the
/// drivers) and run with the class path that pom resolved.
#[test]
fn java_example_handles_every_outcome() {
    let manifest = read("examples/java/pom.xml");
    assert!(
        manifest.contains(&format!(
            "<artifactId>jedis</artifactId>\n      <version>{}</version>",
            JEDIS_8.version
        )),
        "examples/java/pom.xml must pin the Jedis the test runs"
    );
    check_example(&JEDIS_8, "examples/java");
}

/// examples/go/warehouses, built with examples/go from its go.mod.
#[test]
fn go_warehouses_example_takes_and_gives_back_per_location() {
    check_warehouses(&GO_REDIS_9);
}

/// examples/java/Warehouses.java, compiled with Deduct.java by its pom.xml.
#[test]
fn java_warehouses_example_takes_and_gives_back_per_location() {
    check_warehouses(&JEDIS_8);
}

/// Runs a two-warehouse example (docs/locations.md) as its header says:
/// every line it prints, then the warehouses as Redis keeps them, read
/// directly (each location's units, holds and floor; the SKU's held
/// units). Go and Java print the same lines.
fn check_warehouses(client: &'static Pinned) {
    let install = std::thread::spawn(move || installed(client));
    let cluster = cluster();
    let env = install.join().unwrap();
    let sku = format!("{}-wh", client.name);
    let out = runtime().block_on(async {
        let server = proxy(cluster.seeds(), |c| c.admin_commands = true).await;
        let mut run = env.warehouses();
        let port = server.addr.port().to_string();
        run.args(["--port", &port, "--sku", &sku, "--run", "t"]);
        finish(run, b"").await
    });
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {printed}\n{}",
        client.name,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        printed,
        "stocked east: 3 units, floor 1\n\
         stocked west: 5 units, floor 0\n\
         line 1, 4 units, SPLIT east,west: deducted, east 2 + west 2; 4 left in all\n\
         line 1 again (a retry), 4 units, SPLIT east,west: already deducted, east 2 + west 2; 4 left in all\n\
         cart 2, 2 units, WHOLE east,west: held, west 2; 2 left in all\n\
         cart 2 paid: confirmed; 2 left in all\n\
         line 1 cancelled: given back where it came from; 6 left in all\n\
         east: 3 available, 0 held, floor 1\n\
         west: 3 available, 0 held, floor 0\n",
        "{}",
        client.name
    );
    let parsed = stockgate::params::Sku::parse(sku.clone().into()).unwrap();
    let mut redis = cluster.cluster_connection().unwrap();
    let mut hash: Vec<(String, i64)> = redis::cmd("HGETALL")
        .arg(layout().locations_key(&parsed))
        .query::<HashMap<String, i64>>(&mut redis)
        .unwrap()
        .into_iter()
        .filter(|(_, units)| *units != 0)
        .collect();
    hash.sort();
    let expected = [("east", 3), ("east:floor", 1), ("west", 3)];
    assert_eq!(
        hash,
        expected.map(|(f, n)| (f.to_owned(), n)),
        "{}",
        client.name
    );
    assert_eq!(held(&cluster, &sku), 0, "{}", client.name);
}

/// Runs an example once per outcome of DEDUCT and of REVERT (`--revert`),
/// and checks what it prints and exits with. Each timeout case goes
/// through a [`Tap`] that swallows the reply to the first DEDUCT or REVERT
/// (after stockgate applied it), so the example times out, retries with the
/// same request_id, and gets code 1.
///
/// The cases run in lanes at once, each on its own sku, to keep the test
/// short; within a lane they run in order, so every `left` and `in stock`
/// figure is known.
///
/// `example` is a script run with the client's interpreter, or the
/// directory of an example the client's env built (Go, Java).
fn check_example(client: &'static Pinned, example: &str) {
    let install = std::thread::spawn(move || installed(client));
    let cluster = cluster();
    let env = install.join().unwrap();
    let tag = client.name;
    let sku = format!("{tag}-ex");
    let refunds = format!("{tag}-ex-refunds");
    let lossy = format!("{tag}-ex-lossy");
    let lossy_revert = format!("{tag}-ex-lossy-revert");
    let order = format!("ORD-{tag}");
    let id = |n: u32| format!("{tag}-ex-{n}");
    let stocks = [&sku, &refunds, &lossy, &lossy_revert].map(|s| (s.clone(), 10));
    set_stocks(&cluster, &stocks);
    runtime().block_on(async {
        let server = proxy(cluster.seeds(), |_| {}).await;
        // A stockgate whose Redis is gone answers UPSTREAM at once.
        let dead = server_without_redis().await;
        let deduct_black_hole = Tap::start(server.addr, true).await;
        let revert_black_hole = Tap::start(server.addr, true).await;
        let retry = |why: &str, n: u32| {
            format!("attempt {n} of 3: {why}; retrying with the same request_id")
        };
        let upstream = "UPSTREAM not connected to redis yet; \
                        the outcome may be unknown, retrying with the same request_id is safe";
        let revoked = |left: u32| {
            format!(
                "stop: this request_id was reverted or revoked ({left} left); nothing was deducted. \
                 If the order must go ahead after all, use a new request_id"
            )
        };
        let case = |to: SocketAddr, args: &[&str], prints: &[String], proceeds: bool| Example {
            to,
            args: owned(args),
            prints: prints.to_vec(),
            proceeds,
        };
        let every_code = vec![
            case(
                server.addr,
                &[&sku, "3", &id(1), &order],
                &[format!("proceed: deducted, 7 left, order_no \"{order}\"")],
                true,
            ),
            case(
                server.addr,
                &[&sku, "3", &id(1), &order],
                &[format!(
                    "proceed: already deducted by an earlier attempt, 7 left, order_no \"{order}\""
                )],
                true,
            ),
            case(
                server.addr,
                &[&sku, "8", &id(2)],
                &["fail the order: insufficient stock (7 left); nothing was deducted".into()],
                false,
            ),
            case(
                server.addr,
                &[&sku, "0", &id(3)],
                &[format!("fix the request: {QTY_REASON}")],
                false,
            ),
            case(
                server.addr,
                &[&format!("{tag}-unstocked"), "1", &id(4)],
                &[format!("fail the order and alert: {UNKNOWN_SKU}")],
                false,
            ),
        ];
        // Compensation, on its own sku: give back a deduction, again, then
        // DEDUCT it again; revoke an id never deducted, then DEDUCT it.
        let compensation = vec![
            case(
                server.addr,
                &[&refunds, "3", &id(1), &order],
                &[format!("proceed: deducted, 7 left, order_no \"{order}\"")],
                true,
            ),
            case(
                server.addr,
                &["--revert", &refunds, &id(1)],
                &[format!(
                    "compensated: given back, 10 in stock, order_no \"{order}\""
                )],
                true,
            ),
            case(
                server.addr,
                &["--revert", &refunds, &id(1)],
                &[format!(
                    "compensated: already done by an earlier attempt, 10 in stock, order_no \"{order}\""
                )],
                true,
            ),
            case(server.addr, &[&refunds, "3", &id(1), &order], &[revoked(10)], false),
            // An id never deducted: revoked, then its DEDUCT is refused.
            case(
                server.addr,
                &["--revert", &refunds, &id(7)],
                &["compensated: nothing had been deducted; the request_id is revoked, \
                   so a late DEDUCT of it takes nothing"
                    .into()],
                true,
            ),
            case(server.addr, &[&refunds, "1", &id(7), &order], &[revoked(10)], false),
            case(
                server.addr,
                &["--revert", &refunds, &format!("{{{}}}", id(8))],
                &[format!("fix the request: {REQUEST_ID_REASON}")],
                false,
            ),
        ];
        // Replies lost after stockgate applied the command: a DEDUCT's, and
        // a REVERT's (of a deduction made first), each on its own sku.
        let lost_deduct = vec![case(
            deduct_black_hole.addr,
            &[&lossy, "2", &id(6), &order],
            &[
                retry("timed out", 1),
                format!(
                    "proceed: already deducted by an earlier attempt, 8 left, order_no \"{order}\""
                ),
            ],
            true,
        )];
        let lost_revert = vec![
            case(
                server.addr,
                &[&lossy_revert, "2", &id(9), &order],
                &[format!("proceed: deducted, 8 left, order_no \"{order}\"")],
                true,
            ),
            case(
                revert_black_hole.addr,
                &["--revert", &lossy_revert, &id(9)],
                &[
                    retry("timed out", 1),
                    format!(
                        "compensated: already done by an earlier attempt, 10 in stock, order_no \"{order}\""
                    ),
                ],
                true,
            ),
        ];
        let no_redis = vec![
            case(
                dead.addr,
                &[&sku, "1", &id(5)],
                &[
                    retry(upstream, 1),
                    retry(upstream, 2),
                    retry(upstream, 3),
                    "unknown: no answer after 3 attempts; \
                     park the order and retry later with the same request_id"
                        .into(),
                ],
                false,
            ),
            case(
                dead.addr,
                &["--revert", &sku, &id(5)],
                &[
                    retry(upstream, 1),
                    retry(upstream, 2),
                    retry(upstream, 3),
                    "unknown: no answer after 3 attempts; \
                     keep the compensation pending and retry REVERT later with the same request_id"
                        .into(),
                ],
                false,
            ),
        ];
        let env = &env;
        let lanes = [every_code, compensation, lost_deduct, lost_revert, no_redis];
        join_all(lanes.map(|lane| async move {
            for case in lane {
                let mut command = match client.runtime {
                    Runtime::Python { .. } | Runtime::Node { .. } => {
                        env.command(&repo_path(example))
                    }
                    Runtime::Go { .. } | Runtime::Java { .. } => env.example(),
                };
                command
                    .args(["--port", &case.to.port().to_string()])
                    .args(&case.args);
                let out = finish(command, &[]).await;
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert_eq!(
                    stdout.lines().collect::<Vec<_>>(),
                    case.prints,
                    "{example} {:?}; stderr: {}",
                    case.args,
                    String::from_utf8_lossy(&out.stderr)
                );
                assert_eq!(out.status.success(), case.proceeds, "{example}: {out:?}");
                // A logging library's own warnings (SLF4J's "no binder"
                // lines from Jedis, say) are noise on every run of the
                // example: it says everything itself.
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(!stderr.contains("SLF4J:"), "{example}: {stderr}");
            }
        }))
        .await;

        // What Redis holds: a lost reply's command and its retry applied
        // once, a REVERT gave back its DEDUCT's qty, nothing else written.
        assert_eq!(get_stock(&cluster, &sku), Some(7));
        assert_eq!(get_stock(&cluster, &refunds), Some(10));
        assert_eq!(get_stock(&cluster, &lossy), Some(8));
        assert_eq!(get_stock(&cluster, &lossy_revert), Some(10));
        let mut redis = cluster.cluster_connection().unwrap();
        for (sku, n, expected) in [
            (&sku, 1, format!("D:3:{order}")),
            (&sku, 2, String::new()),
            (&sku, 5, String::new()),
            (&refunds, 1, format!("R:3:{order}")),
            (&refunds, 7, "V:0:".to_owned()),
            (&lossy, 6, format!("D:2:{order}")),
            (&lossy_revert, 9, format!("R:2:{order}")),
        ] {
            let record: Option<String> = redis::cmd("GET")
                .arg(record_key(sku, &id(n)))
                .query(&mut redis)
                .unwrap();
            let expected = Some(expected).filter(|e| !e.is_empty());
            let record = record.as_deref().map(summary);
            assert_eq!(record, expected, "record of {sku} {}", id(n));
        }
    });
}

/// One run of an example: where it connects, its arguments, the lines it
/// must print and whether it must exit 0 (the order proceeds).
struct Example {
    to: SocketAddr,
    args: Vec<String>,
    prints: Vec<String>,
    proceeds: bool,
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}
