//! Differential conformance: the same bytes to a real redis-server and to
//! stockgate, and their replies compared type for type (issue 11).
//!
//! Clients are written against what Redis does, not against our reading of
//! its documentation. Each case below is one conversation on a fresh
//! connection to each server: bytes written, replies read, and then either
//! the server's close (QUIT, a protocol error) or one more PING that shows
//! the connection still serves. Every reply has an expectation in the
//! table: the same reply as Redis's, or a difference named there with its
//! reason.
//!
//! Replies are framed by [`frame_len`] and parsed by the redis crate's
//! `ValueCodec`, an independent parser that keeps RESP3's types apart (maps,
//! sets, pushes, attributes, verbatim strings, doubles, ...). What it folds
//! together, `$-1`, `*-1` and `_` (all nil) and `-` and `!` (both errors),
//! is taken from the wire, so a RESP2 null where Redis sends a RESP3 one
//! is a difference too.
//!
//! Two pairs of servers, each started once and shared by every case: a
//! reference server and a stockgate without a password, and a pair with
//! one. The test runs once per server of the upstream matrix (`::redis7`,
//! `::redis8`, `::valkey8`, `::valkey9`), that server being the reference.
//! stockgate speaks Redis 7.2's level (HELLO's `version`): where 7.2
//! changed a reply, Redis 7.0's answer is a difference and the case checks
//! stockgate's reply against 7.2's source (`src/networking.c` at 7.2.6),
//! while Redis 8.2 and Valkey, which answer as 7.2 does, must match it.
//! Where a server answers in its own way, the case's expectation is a
//! table by server ([`by`]), each difference with its reason.

mod support;

use ServerKind::{Redis7, Redis8, Valkey8, Valkey9};
use bytes::BytesMut;
use redis::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use stockgate::auth::Password;
use stockgate::dev::{LocalRedis, RedisOptions};
use support::{ServerKind, matrix, proxy};
use tokio_util::codec::Decoder;

/// The password of the locked pair.
const PASSWORD: &str = "conformance-pw";

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn stockgate_answers_connection_commands_as_redis_does }
async fn stockgate_answers_connection_commands_as_redis_does(kind: ServerKind) {
    // DEBUG (below, to show the parser tells RESP3's types apart) is off
    // by default in Redis 7; loopback connections may use it with `local`.
    let debug = vec!["--enable-debug-command".to_owned(), "local".to_owned()];
    let open_redis = LocalRedis::start(&RedisOptions {
        extra_args: debug.clone(),
        ..RedisOptions::of(kind)
    })
    .expect("redis-server starts");
    let locked_redis = LocalRedis::start(&RedisOptions {
        extra_args: debug,
        password: Some(PASSWORD.into()),
        ..RedisOptions::of(kind)
    })
    .expect("redis-server with requirepass starts");
    support::assert_runs(&open_redis.node, kind);
    support::assert_runs(&locked_redis.node, kind);
    // Both stockgates use the open server as their upstream: only their
    // own front is compared here.
    let open_gate = proxy(vec![open_redis.url()], |_| {}).await;
    let locked_gate = proxy(vec![open_redis.url()], |c| {
        c.password = Password::new(PASSWORD);
    })
    .await;
    let open = Pair {
        redis: ([127, 0, 0, 1], open_redis.node.port).into(),
        stockgate: open_gate.addr,
    };
    let locked = Pair {
        redis: ([127, 0, 0, 1], locked_redis.node.port).into(),
        stockgate: locked_gate.addr,
    };

    // Blocking sockets, off the runtime that serves stockgate.
    let (checked, failures) = tokio::task::spawn_blocking(move || {
        let mut checked = 0;
        let mut failures = Vec::new();
        for case in cases() {
            let pair = if case.locked { &locked } else { &open };
            checked += run(&case, kind, pair, &mut failures);
        }
        (checked, failures)
    })
    .await
    .unwrap();
    assert!(checked > 200, "only {checked} replies compared");
    assert!(
        failures.is_empty(),
        "{} of {checked} replies differ from {kind}'s:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------

/// HELLO's fields: the server's, in its order and types, then stockgate's
/// own. The servers that load a module of their own list it.
fn hello() -> Expect {
    let fields = |differ, why| Expect::Fields {
        differ,
        extra: &["stockgate_version"],
        why,
    };
    by([
        (
            &[Redis7, Valkey8],
            fields(&["server", "version", "id"], HELLO_FIELDS),
        ),
        (
            &[Redis8],
            fields(
                &["server", "version", "id", "modules"],
                "as on the others, and Redis 8 lists the `vectorset` module it \
                 loads built in, where stockgate has no modules",
            ),
        ),
        (
            &[Valkey9],
            fields(
                &["server", "version", "id", "modules"],
                "as on the others, and Valkey 9 lists its Lua engine as the \
                 module `lua`, where stockgate has no modules",
            ),
        ),
    ])
}

const HELLO_FIELDS: &str = "`server` is stockgate; `version` is the Redis level stockgate \
                            speaks (7.2.0), not the server's; ids are each server's own; \
                            `stockgate_version` follows the server's fields, and clients \
                            ignore fields they don't know";

/// The servers that answer as Redis 7.2 does where 7.2 changed a reply:
/// all but Redis 7.0.
const FROM_7_2: &[ServerKind] = &[Redis8, Valkey8, Valkey9];

/// Where Redis 7.2 differs from 7.0.
const SINCE_7_2: &str = "Redis 7.2 answers this (networking.c, 7.2.6), as Redis 8.2 and \
                         Valkey do; Redis 7.0 does not, and stockgate speaks 7.2's level";

/// New in Redis 7.2: Redis 7.0 answers `redis_7_0`, stockgate answers
/// `stockgate`, and the servers from 7.2 on answer as stockgate does.
fn since_7_2(redis_7_0: Want, stockgate: Resp) -> Expect {
    by([
        (&[Redis7], differs(redis_7_0, stockgate, SINCE_7_2)),
        (FROM_7_2, Expect::Same),
    ])
}

/// Valkey 9 answers NOAUTH to a client that has not authenticated before
/// it looks the command up (valkey#1475: such a client learns nothing of
/// which commands exist); Redis and Valkey 8.0 look it up first, and so
/// does stockgate. Both are errors a client reports as such.
fn noauth_first_on_valkey_9(stockgate: &str) -> Expect {
    by([
        (&[Redis7, Redis8, Valkey8], Expect::Same),
        (
            &[Valkey9],
            differs(
                is(error("NOAUTH Authentication required.")),
                error(stockgate),
                "Valkey 9 asks for authentication before it looks a command up \
                 (valkey#1475); stockgate looks it up first, as Redis does",
            ),
        ),
    ])
}

/// Valkey 9's inline parser joins a quoted part with what follows it, as a
/// shell does (`"a"b` is `ab`; valkey#2098), where Redis and Valkey 8.0
/// refuse a closing quote followed by anything but a space (an error, then
/// the close). stockgate keeps Redis's rule: inline commands are for
/// people at a terminal, and clients send arrays.
const VALKEY_9_INLINE: &str = "Valkey 9's inline parser joins a closing quote with what follows \
                               it (valkey#2098); stockgate keeps Redis's rule";

fn cases() -> Vec<Case> {
    use Expect::*;
    let hello3 = || cmd(&["HELLO", "3"]);
    let unbalanced = || error("ERR Protocol error: unbalanced quotes in request");
    vec![
        // PING and ECHO.
        case("PING").send(cmd(&["PING"]), [Same]),
        case("PING with a message").send(cmd(&["PING", "hi"]), [Same]),
        case("PING with two arguments").send(cmd(&["PING", "a", "b"]), [Same]),
        case("PING in RESP3")
            .send(hello3(), [hello()])
            .send(cmd(&["PING"]), [Same]),
        case("ECHO").send(cmd(&["ECHO", "hi there"]), [Same]),
        case("ECHO of binary bytes").send(raw(b"*2\r\n$4\r\nECHO\r\n$3\r\n\x00\xff\n\r\n"), [Same]),
        case("ECHO without an argument").send(cmd(&["ECHO"]), [Same]),
        case("ECHO with two arguments").send(cmd(&["ECHO", "a", "b"]), [Same]),
        // HELLO.
        case("HELLO without a version").send(cmd(&["HELLO"]), [hello()]),
        case("HELLO 2").send(cmd(&["HELLO", "2"]), [hello()]),
        case("HELLO 3, then a RESP3 null")
            .send(hello3(), [hello()])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("HELLO 3 then HELLO 2: RESP2 nulls again")
            .send(hello3(), [hello()])
            .send(cmd(&["HELLO", "2"]), [hello()])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("HELLO 3 SETNAME")
            .send(cmd(&["HELLO", "3", "SETNAME", "app-1"]), [hello()])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("hello 3 setname, lowercase")
            .send(cmd(&["hello", "3", "setname", "app-1"]), [hello()])
            .send(cmd(&["client", "getname"]), [Same]),
        case("HELLO 3 AUTH default, no password set: any password").send(
            cmd(&["HELLO", "3", "AUTH", "default", "whatever"]),
            [hello()],
        ),
        case("HELLO 3 AUTH of a user that does not exist")
            .send(cmd(&["HELLO", "3", "AUTH", "nobody", "whatever"]), [Same]),
        case("HELLO 3 AUTH DEFAULT: user names are case-sensitive")
            .send(cmd(&["HELLO", "3", "AUTH", "DEFAULT", "whatever"]), [Same]),
        case("HELLO 2 AUTH and SETNAME, no password set")
            .send(
                cmd(&["HELLO", "2", "AUTH", "default", "x", "SETNAME", "n"]),
                [hello()],
            )
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("HELLO 3 SETNAME to nothing clears the name")
            .send(cmd(&["CLIENT", "SETNAME", "app-1"]), [Same])
            .send(cmd(&["HELLO", "3", "SETNAME", ""]), [hello()])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("HELLO 3 and a request after it in one write").send(
            [hello3(), cmd(&["CLIENT", "GETNAME"])].concat(),
            [hello(), Same],
        ),
        case("HELLO 3 SETNAME with a space").send(cmd(&["HELLO", "3", "SETNAME", "a b"]), [Same]),
        case("HELLO 3 SETNAME without a name").send(cmd(&["HELLO", "3", "SETNAME"]), [Same]),
        case("HELLO 3 AUTH without a password")
            .send(cmd(&["HELLO", "3", "AUTH", "default"]), [Same]),
        case("HELLO 3 with an unknown option").send(cmd(&["HELLO", "3", "FOO"]), [Same]),
        case("HELLO 4").send(cmd(&["HELLO", "4"]), [Same]),
        case("HELLO 1").send(cmd(&["HELLO", "1"]), [Same]),
        case("HELLO -3").send(cmd(&["HELLO", "-3"]), [Same]),
        case("HELLO x").send(cmd(&["HELLO", "x"]), [Same]),
        case("HELLO 03: not an integer to Redis").send(cmd(&["HELLO", "03"]), [Same]),
        case("HELLO +3: not an integer to Redis").send(cmd(&["HELLO", "+3"]), [Same]),
        case("HELLO with a version past 64 bits")
            .send(cmd(&["HELLO", "99999999999999999999"]), [Same]),
        case("a refused HELLO changes nothing")
            .send(cmd(&["HELLO", "4", "SETNAME", "n"]), [Same])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        // AUTH with no password set.
        case("AUTH <password>, no password set").send(cmd(&["AUTH", "x"]), [Same]),
        case("AUTH default <password>, no password set")
            .send(cmd(&["AUTH", "default", "x"]), [Same]),
        case("AUTH of a user that does not exist").send(cmd(&["AUTH", "nobody", "x"]), [Same]),
        case("AUTH DEFAULT: user names are case-sensitive")
            .send(cmd(&["AUTH", "DEFAULT", "x"]), [Same]),
        case("AUTH with three arguments").send(cmd(&["AUTH", "a", "b", "c"]), [Same]),
        case("AUTH without arguments").send(cmd(&["AUTH"]), [Same]),
        // CLIENT.
        case("CLIENT SETNAME then GETNAME")
            .send(cmd(&["CLIENT", "SETNAME", "app-1"]), [Same])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("CLIENT GETNAME, unnamed").send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("CLIENT SETNAME to nothing clears the name")
            .send(cmd(&["CLIENT", "SETNAME", "app-1"]), [Same])
            .send(cmd(&["CLIENT", "SETNAME", ""]), [Same])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("CLIENT SETNAME with a space").send(cmd(&["CLIENT", "SETNAME", "a b"]), [Same]),
        case("CLIENT SETNAME without a name").send(cmd(&["CLIENT", "SETNAME"]), [Same]),
        case("CLIENT GETNAME with an argument").send(cmd(&["CLIENT", "GETNAME", "x"]), [Same]),
        case("Client getName, mixed case").send(cmd(&["Client", "getName"]), [Same]),
        case("CLIENT ID").send(
            cmd(&["CLIENT", "ID"]),
            [Values("each server counts its own connections")],
        ),
        case("CLIENT INFO").send(cmd(&["CLIENT", "INFO"]), [CLIENT_INFO]),
        case("CLIENT INFO of a named connection in RESP3")
            .send(cmd(&["HELLO", "3", "SETNAME", "app-1"]), [hello()])
            .send(cmd(&["CLIENT", "INFO"]), [CLIENT_INFO]),
        case("CLIENT INFO after NO-EVICT on")
            .send(cmd(&["CLIENT", "NO-EVICT", "on"]), [Same])
            .send(cmd(&["CLIENT", "INFO"]), [CLIENT_INFO]),
        case("CLIENT INFO with an argument").send(cmd(&["CLIENT", "INFO", "x"]), [Same]),
        case("CLIENT SETINFO LIB-NAME").send(
            cmd(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
            [since_7_2(starts("ERR unknown subcommand 'SETINFO'"), ok())],
        ),
        case("client setinfo lib-ver, lowercase").send(
            cmd(&["client", "setinfo", "lib-ver", "5.0.1"]),
            [since_7_2(starts("ERR unknown subcommand 'setinfo'"), ok())],
        ),
        case("CLIENT SETINFO with a space in the value").send(
            cmd(&["CLIENT", "SETINFO", "LIB-VER", "1 2"]),
            [since_7_2(
                starts("ERR unknown subcommand 'SETINFO'"),
                error("ERR LIB-VER cannot contain spaces, newlines or special characters."),
            )],
        ),
        case("CLIENT SETINFO of an unknown attribute").send(
            cmd(&["CLIENT", "SETINFO", "LIB-FOO", "x"]),
            [since_7_2(
                starts("ERR unknown subcommand 'SETINFO'"),
                error("ERR Unrecognized option 'LIB-FOO'"),
            )],
        ),
        case("CLIENT SETINFO without a value").send(
            cmd(&["CLIENT", "SETINFO", "LIB-NAME"]),
            [since_7_2(
                starts("ERR unknown subcommand 'SETINFO'"),
                error("ERR wrong number of arguments for 'client|setinfo' command"),
            )],
        ),
        case("CLIENT NO-EVICT on").send(cmd(&["CLIENT", "NO-EVICT", "on"]), [Same]),
        case("client no-evict OFF").send(cmd(&["client", "no-evict", "OFF"]), [Same]),
        case("CLIENT NO-EVICT maybe").send(cmd(&["CLIENT", "NO-EVICT", "maybe"]), [Same]),
        case("CLIENT NO-EVICT without a value").send(cmd(&["CLIENT", "NO-EVICT"]), [Same]),
        case("CLIENT NO-TOUCH on").send(
            cmd(&["CLIENT", "NO-TOUCH", "on"]),
            [since_7_2(starts("ERR unknown subcommand 'NO-TOUCH'"), ok())],
        ),
        case("CLIENT NO-TOUCH maybe").send(
            cmd(&["CLIENT", "NO-TOUCH", "maybe"]),
            [since_7_2(
                starts("ERR unknown subcommand 'NO-TOUCH'"),
                error("ERR syntax error"),
            )],
        ),
        case("CLIENT without a subcommand").send(cmd(&["CLIENT"]), [Same]),
        case("CLIENT with an unknown subcommand").send(cmd(&["CLIENT", "nosuch"]), [Same]),
        case("CLIENT HELP").send(cmd(&["CLIENT", "HELP"]), [HELP]),
        case("client help, lowercase").send(cmd(&["client", "help"]), [HELP]),
        case("CLIENT HELP with an argument").send(cmd(&["CLIENT", "HELP", "x"]), [Same]),
        case("CLIENT LIST").send(
            cmd(&["CLIENT", "LIST"]),
            [differs(
                kind("bulk string"),
                error("ERR unknown subcommand 'LIST'. Try CLIENT HELP."),
                "a proxy's clients are its own business: stockgate lists none \
                 (and CLIENT HELP, which the error points to, says what it has)",
            )],
        ),
        case("CLIENT TRACKING in RESP3")
            .send(hello3(), [hello()])
            .send(
                cmd(&["CLIENT", "TRACKING", "on"]),
                [differs(
                    is(ok()),
                    error("ERR unknown subcommand 'TRACKING'. Try CLIENT HELP."),
                    "stockgate has no keyspace of its own to track, so it never \
                     sends invalidation pushes",
                )],
            ),
        // INFO: its fields are stockgate's own; its type is Redis's.
        case("INFO server").send(
            cmd(&["INFO", "server"]),
            [Like("stockgate's INFO fields are its own")],
        ),
        case("INFO server in RESP3").send(hello3(), [hello()]).send(
            cmd(&["INFO", "server"]),
            [Like("stockgate's INFO fields are its own")],
        ),
        // SELECT.
        case("SELECT 0").send(cmd(&["SELECT", "0"]), [Same]),
        case("SELECT 1").send(
            cmd(&["SELECT", "1"]),
            [differs(
                is(ok()),
                error("ERR DB index is out of range"),
                "stockgate has one database: a client that selects another \
                 expects a keyspace of its own, and gets Redis's error for a \
                 database that doesn't exist instead",
            )],
        ),
        case("SELECT 16").send(cmd(&["SELECT", "16"]), [Same]),
        case("SELECT -1").send(cmd(&["SELECT", "-1"]), [Same]),
        case("SELECT x").send(cmd(&["SELECT", "x"]), [Same]),
        case("SELECT 00").send(cmd(&["SELECT", "00"]), [Same]),
        case("SELECT without an index").send(cmd(&["SELECT"]), [Same]),
        // COMMAND.
        case("COMMAND COUNT").send(
            cmd(&["COMMAND", "COUNT"]),
            [Values("stockgate counts its own commands")],
        ),
        case("COMMAND COUNT with an argument").send(cmd(&["COMMAND", "COUNT", "x"]), [Same]),
        case("COMMAND DOCS ping").send(cmd(&["COMMAND", "DOCS", "ping"]), [command_docs()]),
        case("COMMAND DOCS of a subcommand").send(
            cmd(&["COMMAND", "DOCS", "client|setname"]),
            [command_docs()],
        ),
        case("COMMAND DOCS client").send(cmd(&["COMMAND", "DOCS", "client"]), [command_docs()]),
        case("COMMAND DOCS in RESP3")
            .send(hello3(), [hello()])
            .send(cmd(&["COMMAND", "DOCS", "ECHO"]), [command_docs()]),
        case("COMMAND DOCS of an unknown command")
            .send(cmd(&["COMMAND", "DOCS", "nosuch"]), [Same]),
        case("COMMAND DOCS of an unknown command in RESP3")
            .send(hello3(), [hello()])
            .send(cmd(&["COMMAND", "DOCS", "nosuch"]), [Same]),
        case("COMMAND INFO ping and an unknown command")
            .send(cmd(&["COMMAND", "INFO", "ping", "nosuch"]), [INFO]),
        case("COMMAND INFO of an unknown command in RESP3")
            .send(hello3(), [hello()])
            .send(cmd(&["COMMAND", "INFO", "nosuch"]), [Same]),
        case("COMMAND INFO client").send(cmd(&["COMMAND", "INFO", "client"]), [INFO]),
        case("COMMAND INFO of a subcommand")
            .send(cmd(&["COMMAND", "INFO", "client|setname"]), [INFO]),
        case("COMMAND INFO of every command").send(cmd(&["COMMAND", "INFO"]), [INFO]),
        case("COMMAND").send(cmd(&["COMMAND"]), [INFO]),
        case("COMMAND LIST").send(
            cmd(&["COMMAND", "LIST"]),
            [Like("each server lists its own commands")],
        ),
        case("COMMAND HELP").send(cmd(&["COMMAND", "HELP"]), [HELP]),
        case("COMMAND with an unknown subcommand").send(cmd(&["COMMAND", "FOO"]), [Same]),
        // QUIT and RESET.
        case("QUIT").send(cmd(&["QUIT"]), [Same]).closes(),
        case("QUIT with an argument")
            .send(cmd(&["QUIT", "x"]), [Same])
            .closes(),
        case("nothing after QUIT is answered")
            .send([cmd(&["QUIT"]), cmd(&["PING"])].concat(), [Same])
            .closes(),
        case("quit, inline and lowercase")
            .send(raw(b"quit\r\n"), [Same])
            .closes(),
        case("RESET").send(cmd(&["RESET"]), [Same]),
        case("RESET with an argument").send(cmd(&["RESET", "x"]), [Same]),
        case("RESET: back to RESP2, unnamed, flags cleared")
            .send(cmd(&["HELLO", "3", "SETNAME", "app-1"]), [hello()])
            .send(cmd(&["CLIENT", "NO-EVICT", "on"]), [Same])
            .send(cmd(&["RESET"]), [Same])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same])
            .send(
                cmd(&["CLIENT", "INFO"]),
                [by([
                    (
                        &[Redis7],
                        Rule(
                            client_info_after_reset,
                            "Redis 7.2's RESET clears NO-EVICT and NO-TOUCH (7.0 kept \
                             them: flags=e); stockgate speaks 7.2",
                        ),
                    ),
                    (FROM_7_2, CLIENT_INFO),
                ])],
            ),
        // Inline commands and empty lines.
        case("inline PING").send(raw(b"PING\r\n"), [Same]),
        case("inline ping ending in LF only").send(raw(b"ping\n"), [Same]),
        case("inline pInG").send(raw(b"pInG\r\n"), [Same]),
        case("inline PING with a message").send(raw(b"PING hi\r\n"), [Same]),
        case("inline HELLO 3").send(raw(b"HELLO 3\r\n"), [hello()]),
        case("inline unknown command").send(raw(b"NOSUCH a  b\r\n"), [Same]),
        case("inline double quotes").send(raw(b"ECHO \"two words\"\r\n"), [Same]),
        case("inline single quotes").send(raw(b"ECHO 'two words'\r\n"), [Same]),
        case("inline quotes inside a word").send(raw(b"ECHO a\"b c\"\r\n"), [Same]),
        case("inline escapes in double quotes").send(
            raw(b"ECHO \"\\x41\\x4g\\xZZ\\n\\r\\t\\b\\a\\q\\\\\\\"\"\r\n"),
            [Same],
        ),
        case("inline escapes in single quotes").send(raw(b"ECHO 'a\\'b\\n\"'\r\n"), [Same]),
        case("inline empty quotes").send(raw(b"ECHO \"\"\r\n"), [Same]),
        case("inline empty quotes as the name").send(raw(b"\"\"\r\n"), [Same]),
        case("inline quoted name").send(raw(b"\"ECHO\" 'x'\r\n"), [Same]),
        case("inline two quoted words").send(raw(b"ECHO  \"x y\"  'z'\r\n"), [Same]),
        case("inline closing quote followed by a letter")
            .send(
                raw(b"ECHO \"a\"b\r\n"),
                [by([
                    (&[Redis7, Redis8, Valkey8], Same),
                    (
                        &[Valkey9],
                        differs(is(bulk(b"ab")), unbalanced(), VALKEY_9_INLINE),
                    ),
                ])],
            )
            .closes_but_on(&[Valkey9], VALKEY_9_INLINE),
        case("inline closing single quote followed by a letter")
            .send(
                raw(b"ECHO 'a'b\r\n"),
                [by([
                    (&[Redis7, Redis8, Valkey8], Same),
                    (
                        &[Valkey9],
                        differs(is(bulk(b"ab")), unbalanced(), VALKEY_9_INLINE),
                    ),
                ])],
            )
            .closes_but_on(&[Valkey9], VALKEY_9_INLINE),
        case("inline unterminated double quote")
            .send(raw(b"ECHO \"ab\r\n"), [Same])
            .closes(),
        case("inline unterminated single quote")
            .send(raw(b"ECHO 'ab\r\n"), [Same])
            .closes(),
        case("inline backslash at the end of a quote")
            .send(raw(b"ECHO \"\\\r\n"), [Same])
            .closes(),
        case("inline: a request before the unbalanced one is answered")
            .send(raw(b"PING\r\nECHO \"ab\r\n"), [Same, Same])
            .closes(),
        case("inline vertical tab inside a word").send(raw(b"ECHO a\x0bb\r\n"), [Same]),
        case("inline vertical tab before a word").send(raw(b"ECHO \x0bx\x0c\r\n"), [Same]),
        case("inline vertical tab after a closing quote").send(
            raw(b"ECHO \"a\"\x0b\r\n"),
            [by([
                (&[Redis7, Redis8, Valkey8], Same),
                (
                    &[Valkey9],
                    differs(is(bulk(b"a\x0b")), bulk(b"a"), VALKEY_9_INLINE),
                ),
            ])],
        ),
        case("inline CR inside the line").send(raw(b"ECHO a\rb\r\n"), [Same]),
        case("inline CR before CRLF").send(raw(b"ECHO a\r\r\n"), [Same]),
        case("inline tab between words").send(raw(b"ECHO\ta\tb\r\n"), [Same]),
        case("empty lines are skipped").send(raw(b"\r\n\r\n\nPING\r\n"), [Same]),
        case("blank lines are skipped").send(raw(b"   \r\n\t \x0b\r\nPING\n"), [Same]),
        case("empty arrays are skipped").send(raw(b"*0\r\n*-1\r\nPING\r\n"), [Same]),
        // Malformed multibulk.
        case("multibulk: not a bulk")
            .send(raw(b"*1\r\nfoo\r\n"), [Same])
            .closes(),
        case("multibulk: bad bulk length")
            .send(raw(b"*1\r\n$blabla\r\n"), [Same])
            .closes(),
        case("multibulk: too many arguments")
            .send(raw(b"*3000000000\r\n"), [Same])
            .closes(),
        // Unknown commands and wrong arity.
        case("an unknown command").send(cmd(&["NOSUCH", "a", "b"]), [Same]),
        case("an unknown command without arguments").send(cmd(&["nosuch"]), [Same]),
        case("an unknown command with long arguments").send(
            cmd(&["NOSUCH", &"a".repeat(100), &"b".repeat(100), "c"]),
            [Same],
        ),
        case("an unknown command with a very long name")
            .send(cmd(&[&"N".repeat(200), "x"]), [Same]),
        case("an unknown command with control characters")
            .send(cmd(&["NOSUCH", "a\tb", "c\x01", "d\r\ne"]), [Same]),
        case("an unknown command with a NUL in its name")
            .send(raw(b"*2\r\n$7\r\nNO\x00SUCH\r\n$4\r\nx\x00yz\r\n"), [Same]),
        case("a Redis command stockgate does not have").send(
            cmd(&["GET", "k"]),
            [differs(
                is(Resp::Null("$-1")),
                error("ERR unknown command 'GET', with args beginning with: 'k' "),
                "stockgate serves its stock commands and the connection's, not Redis's keyspace",
            )],
        ),
        case("an unknown subcommand, mixed case").send(cmd(&["Command", "Foo"]), [Same]),
        case("EcHo, mixed case").send(cmd(&["EcHo", "Hi"]), [Same]),
        // RESP3: neither server pushes or attaches attributes unasked; the
        // DEBUG cases show this test would see them if one did.
        case("RESP3 push: SUBSCRIBE")
            .send(hello3(), [hello()])
            .send(
                cmd(&["SUBSCRIBE", "news"]),
                [differs(
                    kind("push"),
                    error("ERR unknown command 'SUBSCRIBE', with args beginning with: 'news' "),
                    "stockgate has no pub/sub: it never sends a push",
                )],
            ),
        debug_protocol("attrib", "attribute"),
        debug_protocol_push(),
        debug_protocol("map", "map"),
        debug_protocol("set", "set"),
        debug_protocol("double", "double"),
        debug_protocol("bignum", "big number"),
        debug_protocol("true", "boolean"),
        debug_protocol("verbatim", "verbatim string"),
        debug_protocol("null", "null (_)"),
        // With a password.
        case("PING before AUTH")
            .locked()
            .send(cmd(&["PING"]), [Same]),
        case("PING with a message before AUTH")
            .locked()
            .send(cmd(&["PING", "hi"]), [Same]),
        case("ECHO before AUTH")
            .locked()
            .send(cmd(&["ECHO", "x"]), [Same]),
        case("inline ECHO before AUTH")
            .locked()
            .send(raw(b"ECHO x\r\n"), [Same]),
        case("wrong arity before AUTH").locked().send(
            cmd(&["ECHO"]),
            [noauth_first_on_valkey_9(
                "ERR wrong number of arguments for 'echo' command",
            )],
        ),
        case("an unknown command before AUTH").locked().send(
            cmd(&["NOSUCH"]),
            [noauth_first_on_valkey_9(
                "ERR unknown command 'NOSUCH', with args beginning with: ",
            )],
        ),
        case("an unknown subcommand before AUTH").locked().send(
            cmd(&["CLIENT", "FOO"]),
            [noauth_first_on_valkey_9(
                "ERR unknown subcommand 'FOO'. Try CLIENT HELP.",
            )],
        ),
        case("a subcommand's wrong arity before AUTH")
            .locked()
            .send(
                cmd(&["CLIENT", "SETNAME"]),
                [noauth_first_on_valkey_9(
                    "ERR wrong number of arguments for 'client|setname' command",
                )],
            ),
        case("CLIENT ID before AUTH")
            .locked()
            .send(cmd(&["CLIENT", "ID"]), [Same]),
        case("CLIENT HELP before AUTH")
            .locked()
            .send(cmd(&["CLIENT", "HELP"]), [Same]),
        case("COMMAND COUNT before AUTH")
            .locked()
            .send(cmd(&["COMMAND", "COUNT"]), [Same]),
        case("SELECT 0 before AUTH")
            .locked()
            .send(cmd(&["SELECT", "0"]), [Same]),
        case("HELLO 3 before AUTH")
            .locked()
            .send(hello3(), [hello_noauth()]),
        case("HELLO before AUTH")
            .locked()
            .send(cmd(&["HELLO"]), [hello_noauth()]),
        case("HELLO 3 SETNAME before AUTH")
            .locked()
            .send(cmd(&["HELLO", "3", "SETNAME", "n"]), [hello_noauth()]),
        case("HELLO 4 before AUTH")
            .locked()
            .send(cmd(&["HELLO", "4"]), [Same]),
        case("HELLO 3 AUTH, right password")
            .locked()
            .send(cmd(&["HELLO", "3", "AUTH", "default", PASSWORD]), [hello()])
            .send(cmd(&["CLIENT", "GETNAME"]), [Same])
            .send(cmd(&["PING"]), [Same]),
        case("HELLO 3 AUTH, wrong password")
            .locked()
            .send(cmd(&["HELLO", "3", "AUTH", "default", "wrong"]), [Same])
            .send(cmd(&["PING"]), [Same]),
        case("HELLO 3 AUTH of another user")
            .locked()
            .send(cmd(&["HELLO", "3", "AUTH", "nobody", PASSWORD]), [Same]),
        case("HELLO 2 AUTH and SETNAME")
            .locked()
            .send(
                cmd(&[
                    "HELLO", "2", "AUTH", "default", PASSWORD, "SETNAME", "app-1",
                ]),
                [hello()],
            )
            .send(cmd(&["CLIENT", "GETNAME"]), [Same]),
        case("hello 3 auth, lowercase")
            .locked()
            .send(cmd(&["hello", "3", "auth", "default", PASSWORD]), [hello()]),
        case("HELLO AUTH with a bad option after it").locked().send(
            cmd(&["HELLO", "3", "AUTH", "default", "wrong", "FOO"]),
            [by([
                (
                    &[Redis7],
                    differs(
                        is(error(
                            "WRONGPASS invalid username-password pair or user is disabled.",
                        )),
                        error("ERR Syntax error in HELLO option 'FOO'"),
                        "Redis 7.2 reads every option before it authenticates (7.0 \
                         authenticated as it read); stockgate speaks 7.2",
                    ),
                ),
                (FROM_7_2, Same),
            ])],
        ),
        case("HELLO AUTH with a bad name after it").locked().send(
            cmd(&["HELLO", "3", "AUTH", "default", "wrong", "SETNAME", "a b"]),
            [by([
                (
                    &[Redis7],
                    differs(
                        is(error(
                            "WRONGPASS invalid username-password pair or user is disabled.",
                        )),
                        error(
                            "ERR Client names cannot contain spaces, newlines or special \
                             characters.",
                        ),
                        "Redis 7.2 checks the name before it authenticates (7.0 \
                         authenticated first); stockgate speaks 7.2",
                    ),
                ),
                (FROM_7_2, Same),
            ])],
        ),
        case("AUTH, right password")
            .locked()
            .send(cmd(&["AUTH", PASSWORD]), [Same])
            .send(cmd(&["PING"]), [Same])
            .send(cmd(&["ECHO", "in"]), [Same]),
        case("a wrong AUTH after a right one leaves the connection authenticated")
            .locked()
            .send(cmd(&["AUTH", PASSWORD]), [Same])
            .send(cmd(&["AUTH", "wrong"]), [Same])
            .send(cmd(&["HELLO", "3", "AUTH", "default", "wrong"]), [Same])
            .send(cmd(&["PING"]), [Same]),
        case("AUTH default, right password")
            .locked()
            .send(cmd(&["AUTH", "default", PASSWORD]), [Same]),
        case("AUTH, wrong password")
            .locked()
            .send(cmd(&["AUTH", "wrong"]), [Same])
            .send(cmd(&["PING"]), [Same]),
        case("AUTH of another user")
            .locked()
            .send(cmd(&["AUTH", "nobody", PASSWORD]), [Same]),
        case("AUTH with three arguments")
            .locked()
            .send(cmd(&["AUTH", "a", "b", "c"]), [Same]),
        case("AUTH without arguments")
            .locked()
            .send(cmd(&["AUTH"]), [Same]),
        case("QUIT before AUTH")
            .locked()
            .send(cmd(&["QUIT"]), [Same])
            .closes(),
        case("RESET before AUTH")
            .locked()
            .send(cmd(&["RESET"]), [Same]),
        case("RESET forgets the password")
            .locked()
            .send(cmd(&["AUTH", PASSWORD]), [Same])
            .send(cmd(&["RESET"]), [Same])
            .send(cmd(&["PING"]), [Same]),
    ]
}

/// HELLO refused for want of a password: the same code, 7.2's words.
fn hello_noauth() -> Expect {
    since_7_2(
        starts("NOAUTH HELLO must be called with the client already authenticated"),
        error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        ),
    )
}

const CLIENT_INFO: Expect = Expect::Rule(
    client_info,
    "a one-line `key=value` list of Redis's fields, in Redis's order; stockgate \
     gives the fields it knows (no addresses, fd or buffer sizes: a proxy's \
     connection has other ones) and the values that must agree do",
);

const HELP: Expect = Expect::Rule(
    help,
    "the subcommands are each server's own; the header and HELP lines are \
     Redis's (7.2 says `Print this help.`, 7.0 `Prints`)",
);

/// COMMAND DOCS: Redis's fields and types, stockgate's words.
fn command_docs() -> Expect {
    by([
        (&[Redis7], Expect::Rule(docs, DOCS)),
        (
            FROM_7_2,
            Expect::Rule(
                docs_but_display_text,
                "as on Redis 7.0, and where Redis 8.2 and Valkey give an argument a \
                 `display_text` (the name a client shows for it), stockgate's \
                 arguments have 7.0's fields: a client shows the argument's `name`",
            ),
        ),
    ])
}

const DOCS: &str = "summaries are stockgate's own and `since` is the stockgate version a \
                    command appeared in; the fields and their types are Redis's";

const INFO: Expect = Expect::Rule(
    command_info,
    "flags, ACL categories, tips and key specs are Redis's internals; \
     stockgate describes its own commands with Redis's types",
);

/// `DEBUG PROTOCOL <what>` in RESP3: Redis's reply is of type `kind`.
fn debug_protocol(what: &'static str, kind_name: &'static str) -> Case {
    case("RESP3 types: DEBUG PROTOCOL")
        .send(cmd(&["HELLO", "3"]), [hello()])
        .send(
            cmd(&["DEBUG", "PROTOCOL", what]),
            [differs(kind(kind_name), debug_refused(what), DEBUG)],
        )
}

/// `DEBUG PROTOCOL push` in RESP3: a push, and a reply after it for the
/// clients that drop pushes. Redis 7.0 writes the push first; from 7.2 on
/// a push made while a command runs goes out after the command's reply,
/// so the push is what answers the PING's place.
fn debug_protocol_push() -> Case {
    let after = || bulk(b"Some real reply following the push reply");
    let pong = || Resp::Simple("PONG".into());
    case("RESP3 types: DEBUG PROTOCOL push, and the reply after it")
        .send(cmd(&["HELLO", "3"]), [hello()])
        .send(
            cmd(&["DEBUG", "PROTOCOL", "push"]),
            [by([
                (
                    &[Redis7],
                    differs(kind("push"), debug_refused("push"), DEBUG),
                ),
                (FROM_7_2, differs(is(after()), debug_refused("push"), DEBUG)),
            ])],
        )
        .send(
            cmd(&["PING"]),
            [by([
                (&[Redis7], differs(is(after()), pong(), DEBUG)),
                (FROM_7_2, differs(kind("push"), pong(), DEBUG)),
            ])],
        )
}

const DEBUG: &str = "DEBUG is Redis's own developer command; here it shows that this test \
                     tells every RESP3 type apart";

fn debug_refused(what: &str) -> Resp {
    error(&format!(
        "ERR unknown command 'DEBUG', with args beginning with: 'PROTOCOL' '{what}' "
    ))
}

// ---------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------

/// How stockgate's reply must relate to Redis's.
enum Expect {
    /// The same reply: the same types all the way down, the same values.
    Same,
    /// The same types and shape; the values differ, for the reason given.
    Values(&'static str),
    /// A map (a flat array of pairs in RESP2) with Redis's fields in
    /// Redis's order and types, equal but for `differ`, and then `extra`.
    /// A field in `differ` need only be [`like`] Redis's: a list of the
    /// server's own (HELLO's `modules`) may be shorter.
    Fields {
        differ: &'static [&'static str],
        extra: &'static [&'static str],
        why: &'static str,
    },
    /// The same type, and the same type wherever both replies have an
    /// element at the same place (index, or map key); contents differ.
    Like(&'static str),
    /// A check of its own, for the reason given.
    Rule(fn(&Resp, &Resp) -> Result<(), String>, &'static str),
    /// Different on purpose: each side checked on its own.
    Differs {
        redis: Want,
        stockgate: Resp,
        why: &'static str,
    },
    /// Each server's own expectation (see [`by`]).
    By(Vec<(&'static [ServerKind], Expect)>),
}

/// What Redis's side of a deliberate difference must be.
enum Want {
    Is(Resp),
    /// An error starting with this.
    Starts(&'static str),
    /// A reply of this type (see [`kind`]).
    Kind(&'static str),
}

impl Expect {
    /// The expectation for a case run against `kind`.
    fn on(&self, kind: ServerKind) -> &Expect {
        match self {
            Expect::By(table) => table
                .iter()
                .find(|(kinds, _)| kinds.contains(&kind))
                .map(|(_, expect)| expect.on(kind))
                .expect("by() names every server"),
            other => other,
        }
    }

    /// What the table expects, for a failure's message.
    fn describe(&self) -> String {
        match self {
            Expect::Same => "Redis's reply".into(),
            Expect::Values(why) => format!("Redis's types and shape ({why})"),
            Expect::Fields { why, .. } => format!("Redis's fields, then stockgate's ({why})"),
            Expect::Like(why) | Expect::Rule(_, why) => format!("Redis's types ({why})"),
            Expect::Differs { why, .. } => format!("a listed difference ({why})"),
            Expect::By(_) => "one expectation per server".into(),
        }
    }
}

/// A table by server: what each server of the matrix answers, each named
/// once. `[(&[Redis7], differs(..)), (FROM_7_2, Same)]` reads "Redis 7.0
/// answers otherwise, for this reason; the others as stockgate does".
fn by<const N: usize>(table: [(&'static [ServerKind], Expect); N]) -> Expect {
    for kind in ServerKind::ALL {
        let named = table
            .iter()
            .filter(|(kinds, _)| kinds.contains(&kind))
            .count();
        assert_eq!(named, 1, "a table by server names {kind} {named} times");
    }
    Expect::By(table.into())
}

fn differs(redis: Want, stockgate: Resp, why: &'static str) -> Expect {
    Expect::Differs {
        redis,
        stockgate,
        why,
    }
}

fn is(reply: Resp) -> Want {
    Want::Is(reply)
}

fn starts(prefix: &'static str) -> Want {
    Want::Starts(prefix)
}

fn kind(name: &'static str) -> Want {
    Want::Kind(name)
}

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

fn error(text: &str) -> Resp {
    Resp::Error(text.to_owned().into())
}

fn bulk(bytes: &'static [u8]) -> Resp {
    Resp::Bulk(bytes::Bytes::from_static(bytes))
}

/// Checks one pair of replies; `Err` says how they differ.
fn compare(expect: &Expect, redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    for (who, reply) in [("redis", redis), ("stockgate", stockgate)] {
        let wanted = matches!(expect, Expect::Differs { redis: Want::Kind(k), .. }
            if who == "redis" && (*k == "push" || *k == "attribute"));
        if !wanted && has_push_or_attribute(reply) {
            return Err(format!("{who} sent a push or an attribute unasked"));
        }
    }
    match expect {
        Expect::Same if redis == stockgate => Ok(()),
        Expect::Same => Err("not the same reply".into()),
        Expect::Values(_) => same_shape(redis, stockgate),
        Expect::Fields { differ, extra, .. } => fields(redis, stockgate, differ, extra),
        Expect::Like(_) => like(redis, stockgate),
        Expect::Rule(rule, _) => rule(redis, stockgate),
        Expect::By(_) => unreachable!("run() picks the server's expectation"),
        Expect::Differs {
            redis: want,
            stockgate: mine,
            ..
        } => {
            let redis_ok = match want {
                Want::Is(reply) => redis == reply,
                Want::Starts(prefix) => {
                    matches!(redis, Resp::Error(text) if text.starts_with(prefix))
                }
                Want::Kind(name) => kind_of(redis) == *name,
            };
            if !redis_ok {
                return Err("Redis's reply is not the one this difference is about".into());
            }
            if stockgate != mine {
                return Err(format!("stockgate's reply should be {mine:?}"));
            }
            Ok(())
        }
    }
}

fn has_push_or_attribute(reply: &Resp) -> bool {
    match reply {
        Resp::Push(_) | Resp::Attribute(..) => true,
        Resp::Array(items) | Resp::Set(items) => items.iter().any(has_push_or_attribute),
        Resp::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| has_push_or_attribute(k) || has_push_or_attribute(v)),
        _ => false,
    }
}

/// The same types all the way down, the same lengths and map keys.
fn same_shape(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    let (r, s) = (kind_of(redis), kind_of(stockgate));
    if r != s {
        return Err(format!("a {s} where Redis has a {r}"));
    }
    match (redis, stockgate) {
        (Resp::Array(a), Resp::Array(b)) | (Resp::Set(a), Resp::Set(b)) => {
            if a.len() != b.len() {
                return Err(format!("{} elements where Redis has {}", b.len(), a.len()));
            }
            a.iter().zip(b).try_for_each(|(a, b)| same_shape(a, b))
        }
        (Resp::Map(a), Resp::Map(b)) => {
            if a.len() != b.len() {
                return Err(format!("{} fields where Redis has {}", b.len(), a.len()));
            }
            a.iter().zip(b).try_for_each(|((ka, va), (kb, vb))| {
                if ka != kb {
                    return Err(format!("field {kb:?} where Redis has {ka:?}"));
                }
                same_shape(va, vb)
            })
        }
        _ => Ok(()),
    }
}

/// The same type wherever both have an element at the same place.
fn like(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    let (r, s) = (kind_of(redis), kind_of(stockgate));
    if r != s {
        return Err(format!("a {s} where Redis has a {r}"));
    }
    match (redis, stockgate) {
        (Resp::Array(a), Resp::Array(b)) | (Resp::Set(a), Resp::Set(b)) => a
            .iter()
            .zip(b)
            .enumerate()
            .try_for_each(|(i, (a, b))| like(a, b).map_err(|e| format!("[{i}]: {e}"))),
        (Resp::Map(a), Resp::Map(b)) => {
            a.iter()
                .try_for_each(|(key, va)| match b.iter().find(|(kb, _)| kb == key) {
                    Some((_, vb)) => like(va, vb).map_err(|e| format!("{key:?}: {e}")),
                    None => Ok(()),
                })
        }
        _ => Ok(()),
    }
}

/// A map's fields, or a RESP2 flat array of field, value pairs.
fn pairs(reply: &Resp) -> Option<Vec<(&Resp, &Resp)>> {
    match reply {
        Resp::Map(pairs) => Some(pairs.iter().map(|(k, v)| (k, v)).collect()),
        Resp::Array(items) if items.len() % 2 == 0 => {
            Some(items.chunks(2).map(|p| (&p[0], &p[1])).collect())
        }
        _ => None,
    }
}

fn fields(redis: &Resp, stockgate: &Resp, differ: &[&str], extra: &[&str]) -> Result<(), String> {
    let (r, s) = (kind_of(redis), kind_of(stockgate));
    if r != s {
        return Err(format!("a {s} where Redis has a {r}"));
    }
    let (Some(theirs), Some(ours)) = (pairs(redis), pairs(stockgate)) else {
        return Err("not a map of fields".into());
    };
    let names = |p: &[(&Resp, &Resp)]| -> Vec<String> { p.iter().map(|(k, _)| text(k)).collect() };
    let mut want = names(&theirs);
    want.extend(extra.iter().map(|e| e.to_string()));
    if names(&ours) != want {
        return Err(format!(
            "fields {:?}, Redis's and extra are {want:?}",
            names(&ours)
        ));
    }
    for ((key, theirs), (_, ours)) in theirs.iter().zip(&ours) {
        let name = text(key);
        let result = if differ.contains(&name.as_str()) {
            like(theirs, ours)
        } else if theirs == ours {
            Ok(())
        } else {
            Err(format!("{ours:?} where Redis has {theirs:?}"))
        };
        result.map_err(|e| format!("field {name}: {e}"))?;
    }
    Ok(())
}

/// CLIENT INFO: `key=value` fields on one line. Redis 7.2 adds `lib-name`
/// and `lib-ver` at the end (7.0 has neither).
fn client_info(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    client_info_but(redis, stockgate, None)
}

/// CLIENT INFO after RESET, where 7.0 kept the `e` flag and 7.2 clears it.
fn client_info_after_reset(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    client_info_but(redis, stockgate, Some(("flags", "e", "N")))
}

/// CLIENT INFO; `differ` is a field that differs: (name, Redis's value,
/// stockgate's).
fn client_info_but(
    redis: &Resp,
    stockgate: &Resp,
    differ: Option<(&str, &str, &str)>,
) -> Result<(), String> {
    let (r, s) = (kind_of(redis), kind_of(stockgate));
    if r != s {
        return Err(format!("a {s} where Redis has a {r}"));
    }
    let line = |reply: &Resp| -> Result<Vec<(String, String)>, String> {
        let body = match reply {
            Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Resp::Verbatim(format, text) if format == "txt" => text.clone(),
            other => return Err(format!("{other:?} is not CLIENT INFO")),
        };
        let line = body
            .strip_suffix('\n')
            .filter(|l| !l.contains('\n'))
            .ok_or_else(|| format!("{body:?} is not one line ending in LF"))?;
        Ok(line
            .split(' ')
            .map(|f| match f.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (f.to_owned(), String::new()),
            })
            .collect())
    };
    let theirs = line(redis)?;
    let ours = line(stockgate)?;
    let mut order: Vec<&str> = theirs.iter().map(|(k, _)| k.as_str()).collect();
    for since_7_2 in ["lib-name", "lib-ver"] {
        if !order.contains(&since_7_2) {
            order.push(since_7_2);
        }
    }
    let mut at = 0;
    for (key, _) in &ours {
        match order[at..].iter().position(|k| k == key) {
            Some(i) => at += i + 1,
            None => {
                return Err(format!(
                    "field {key:?} is not Redis's, or out of Redis's order"
                ));
            }
        }
    }
    let must = [
        "id", "name", "age", "idle", "flags", "db", "sub", "psub", "ssub", "multi", "cmd", "user",
        "redir", "resp", "lib-name", "lib-ver",
    ];
    for key in must {
        if !ours.iter().any(|(k, _)| k == key) {
            return Err(format!("no {key} field"));
        }
    }
    let agree = [
        "name", "flags", "db", "sub", "psub", "ssub", "multi", "cmd", "user", "redir", "resp",
    ];
    for key in agree {
        let value = |fields: &[(String, String)]| {
            fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        if let Some((field, redis_value, our_value)) = differ
            && field == key
        {
            if value(&theirs).as_deref() != Some(redis_value)
                || value(&ours).as_deref() != Some(our_value)
            {
                return Err(format!("{key}: not the listed difference"));
            }
            continue;
        }
        if value(&theirs) != value(&ours) {
            return Err(format!(
                "{key}={:?} where Redis has {:?}",
                value(&ours),
                value(&theirs)
            ));
        }
    }
    Ok(())
}

/// `<CONTAINER> HELP`: an array of status lines, Redis's header first and
/// its HELP entry last; in between, each subcommand's usage line and its
/// indented description, one pair per subcommand stockgate serves.
fn help(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    let lines = |reply: &Resp| -> Result<Vec<String>, String> {
        match reply {
            Resp::Array(items) => items
                .iter()
                .map(|i| match i {
                    Resp::Simple(s) => Ok(s.to_string()),
                    other => Err(format!("{other:?} is not a status line")),
                })
                .collect(),
            other => Err(format!("{other:?} is not an array")),
        }
    };
    let theirs = lines(redis)?;
    let ours = lines(stockgate)?;
    let footer = |lines: &[String]| lines[lines.len() - 2..].to_vec();
    let since_7_2 = ["HELP".to_owned(), "    Print this help.".to_owned()];
    let before_7_2 = ["HELP".to_owned(), "    Prints this help.".to_owned()];
    if ours.len() < 3
        || ours[0] != theirs[0]
        || footer(&ours) != since_7_2
        || (footer(&theirs) != since_7_2 && footer(&theirs) != before_7_2)
    {
        return Err("not Redis's header and HELP lines".into());
    }
    let container = theirs[0].split(' ').next().unwrap().to_ascii_lowercase();
    let spec = stockgate::dispatch::COMMANDS
        .iter()
        .find(|c| c.name == container)
        .ok_or("no such container")?;
    let mut served: Vec<String> = spec
        .subcommands
        .iter()
        .map(|s| s.name.split_once('|').unwrap().1.to_ascii_uppercase())
        .filter(|s| s != "HELP")
        .collect();
    let body = &ours[1..ours.len() - 2];
    let mut listed = Vec::new();
    for pair in body.chunks(2) {
        let [usage, description] = pair else {
            return Err(format!("{usage:?} has no description", usage = pair[0]));
        };
        if usage.starts_with(' ') || !description.starts_with("    ") {
            return Err(format!(
                "{usage:?} / {description:?} are not a usage and its description"
            ));
        }
        listed.push(usage.split(' ').next().unwrap().to_owned());
    }
    listed.sort();
    served.sort();
    if listed != served {
        return Err(format!("lists {listed:?}, serves {served:?}"));
    }
    Ok(())
}

/// COMMAND DOCS: the commands asked for, each with Redis's fields in
/// Redis's order, of Redis's types.
fn docs(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    like(redis, stockgate)?;
    let (Some(theirs), Some(ours)) = (pairs(redis), pairs(stockgate)) else {
        return Err("not a map of commands".into());
    };
    let names = |p: &[(&Resp, &Resp)]| -> Vec<String> { p.iter().map(|(k, _)| text(k)).collect() };
    if names(&theirs) != names(&ours) {
        return Err(format!(
            "documents {:?}, Redis {:?}",
            names(&ours),
            names(&theirs)
        ));
    }
    for ((command, theirs), (_, ours)) in theirs.iter().zip(&ours) {
        let (Some(theirs), Some(ours)) = (pairs(theirs), pairs(ours)) else {
            return Err(format!("{command:?}: not a map of fields"));
        };
        if names(&theirs) != names(&ours) {
            return Err(format!(
                "{}: fields {:?}, Redis's are {:?}",
                text(command),
                names(&ours),
                names(&theirs)
            ));
        }
    }
    Ok(())
}

/// [`docs`], once the `display_text` of each of the server's arguments
/// is set aside: Redis 8.2 and Valkey give one, Redis 7.0 and stockgate
/// do not.
fn docs_but_display_text(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    docs(&without_display_text(redis), stockgate)
}

/// `reply` without its `display_text` fields, wherever they are.
fn without_display_text(reply: &Resp) -> Resp {
    let display_text = |key: &Resp| text(key) == "display_text";
    match reply {
        Resp::Map(pairs) => Resp::Map(
            pairs
                .iter()
                .filter(|(k, _)| !display_text(k))
                .map(|(k, v)| (k.clone(), without_display_text(v)))
                .collect(),
        ),
        // An argument's fields in RESP2: a flat array of pairs.
        Resp::Array(items)
            if items.len() % 2 == 0 && items.chunks(2).any(|p| display_text(&p[0])) =>
        {
            Resp::Array(
                items
                    .chunks(2)
                    .filter(|p| !display_text(&p[0]))
                    .flat_map(|p| [p[0].clone(), without_display_text(&p[1])])
                    .collect(),
            )
        }
        Resp::Array(items) => Resp::Array(items.iter().map(without_display_text).collect()),
        other => other.clone(),
    }
}

/// COMMAND and COMMAND INFO: one entry per command, with the command's
/// name and arity where both servers have it, and Redis's types.
fn command_info(redis: &Resp, stockgate: &Resp) -> Result<(), String> {
    like(redis, stockgate)?;
    let (Resp::Array(theirs), Resp::Array(ours)) = (redis, stockgate) else {
        return Err("not an array".into());
    };
    let name = |entry: &Resp| match entry {
        Resp::Array(fields) => fields.first().map(text),
        _ => None,
    };
    for entry in ours {
        let Resp::Array(fields) = entry else {
            continue;
        };
        let Some(same) = theirs.iter().find(|t| name(t) == name(entry)) else {
            continue;
        };
        let Resp::Array(redis_fields) = same else {
            continue;
        };
        if fields.len() != redis_fields.len() || fields[1] != redis_fields[1] {
            return Err(format!("{:?}: not Redis's length and arity", name(entry)));
        }
    }
    // A reply listing commands by name lists the ones asked for: where
    // Redis answers nil, so does stockgate, and the other way round, but
    // for the commands only one of them has.
    if theirs.len() <= 2 && theirs.len() == ours.len() {
        for (t, o) in theirs.iter().zip(ours) {
            if name(t).is_some() && name(t) != name(o) {
                return Err(format!("{:?} where Redis has {:?}", name(o), name(t)));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

struct Pair {
    redis: SocketAddr,
    stockgate: SocketAddr,
}

/// One conversation, the same on both servers.
struct Case {
    what: String,
    locked: bool,
    steps: Vec<(Vec<u8>, Vec<Expect>)>,
    closes: bool,
    /// The servers that serve on where stockgate closes, and why.
    serves_on: (&'static [ServerKind], &'static str),
}

fn case(what: &str) -> Case {
    Case {
        what: what.to_owned(),
        locked: false,
        steps: Vec::new(),
        closes: false,
        serves_on: (&[], ""),
    }
}

impl Case {
    /// Against the pair with a password.
    fn locked(mut self) -> Case {
        self.locked = true;
        self
    }

    /// Writes `bytes`, then reads one reply per expectation.
    fn send<const N: usize>(mut self, bytes: Vec<u8>, expect: [Expect; N]) -> Case {
        self.steps.push((bytes, expect.into()));
        self
    }

    /// The server closes the connection after the last reply.
    fn closes(mut self) -> Case {
        self.closes = true;
        self
    }

    /// stockgate closes the connection after the last reply, and so does
    /// every server but those in `servers`, which serve on, for `why`.
    fn closes_but_on(mut self, servers: &'static [ServerKind], why: &'static str) -> Case {
        self.closes = true;
        self.serves_on = (servers, why);
        self
    }
}

/// A request as clients send it: an array of bulk strings.
fn cmd(args: &[&str]) -> Vec<u8> {
    support::encode_request(args)
}

fn raw(bytes: &[u8]) -> Vec<u8> {
    bytes.to_vec()
}

/// Runs `case` on both servers of `pair`, the reference one being `kind`,
/// records what differs, and returns how many replies were compared.
fn run(case: &Case, kind: ServerKind, pair: &Pair, failures: &mut Vec<String>) -> usize {
    let mut redis = Wire::connect(pair.redis);
    let mut stockgate = Wire::connect(pair.stockgate);
    let mut compared = 0;
    let mut fail = |what: String| {
        let config = if case.locked { " (password set)" } else { "" };
        failures.push(format!("{}{config}: {what}", case.what));
    };
    for (bytes, expects) in &case.steps {
        redis.send(bytes);
        stockgate.send(bytes);
        for expect in expects {
            let expect = expect.on(kind);
            let (theirs, ours) = match (redis.reply(), stockgate.reply()) {
                (Ok(Some(theirs)), Ok(Some(ours))) => (theirs, ours),
                (theirs, ours) => {
                    fail(format!(
                        "sent {}: not a reply from both\n  redis:     {theirs:?}\n  stockgate: {ours:?}",
                        shown(bytes)
                    ));
                    return compared;
                }
            };
            compared += 1;
            if let Err(why) = compare(expect, &theirs, &ours) {
                fail(format!(
                    "sent {}: {why}\n  expected:  {}\n  redis:     {theirs:?}\n  stockgate: {ours:?}",
                    shown(bytes),
                    expect.describe()
                ));
            }
        }
    }
    let (serves_on, why) = case.serves_on;
    let redis_closes = case.closes && !serves_on.contains(&kind);
    for (who, wire, closes) in [
        ("redis", &mut redis, redis_closes),
        ("stockgate", &mut stockgate, case.closes),
    ] {
        if closes {
            match wire.reply() {
                Ok(None) => {}
                other => fail(format!("{who} did not close the connection: {other:?}")),
            }
        } else {
            // One more request is answered: the connection still serves.
            wire.send(&cmd(&["PING"]));
            match wire.reply() {
                Ok(Some(_)) => {}
                other if case.closes => fail(format!(
                    "{who} was to serve on where stockgate closes ({why}): {other:?}"
                )),
                other => fail(format!("{who} stopped serving: {other:?}")),
            }
        }
    }
    compared
}

fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() > 120 {
        format!("{:?}...", &text[..120])
    } else {
        format!("{text:?}")
    }
}

/// One client connection, read a whole reply at a time.
struct Wire {
    stream: TcpStream,
    buf: BytesMut,
}

impl Wire {
    fn connect(addr: SocketAddr) -> Wire {
        let stream = TcpStream::connect(addr).unwrap();
        // Only a hang fails on this: every reply is awaited in full.
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Wire {
            stream,
            buf: BytesMut::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next reply, `None` when the server closed the connection, or
    /// why there is neither.
    fn reply(&mut self) -> Result<Option<Resp>, String> {
        loop {
            if let Some((len, types)) = frame_len(&self.buf) {
                let wire = self.buf.split_to(len);
                return Ok(Some(parse(&wire, types)));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(format!("closed mid-reply: {:?}", self.buf)),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(format!("no reply within 10 s ({e}); have {:?}", self.buf)),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------

/// A reply, with every element's RESP type as it was on the wire.
#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Simple(std::borrow::Cow<'static, str>),
    Error(std::borrow::Cow<'static, str>),
    BlobError(String),
    Int(i64),
    /// `Bytes` so that a failure shows the text (`b"OK"`), not numbers.
    Bulk(bytes::Bytes),
    Verbatim(String, String),
    /// `$-1`, `*-1` or `_`.
    Null(&'static str),
    Double(String),
    Boolean(bool),
    BigNumber(String),
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Push(Vec<Resp>),
    Attribute(Vec<(Resp, Resp)>, Box<Resp>),
}

/// A reply's type, as the tables name it.
fn kind_of(reply: &Resp) -> &'static str {
    match reply {
        Resp::Simple(_) => "simple string",
        Resp::Error(_) => "error",
        Resp::BlobError(_) => "blob error",
        Resp::Int(_) => "integer",
        Resp::Bulk(_) => "bulk string",
        Resp::Verbatim(..) => "verbatim string",
        Resp::Null("$-1") => "null bulk ($-1)",
        Resp::Null("*-1") => "null array (*-1)",
        Resp::Null(_) => "null (_)",
        Resp::Double(_) => "double",
        Resp::Boolean(_) => "boolean",
        Resp::BigNumber(_) => "big number",
        Resp::Array(_) => "array",
        Resp::Map(_) => "map",
        Resp::Set(_) => "set",
        Resp::Push(_) => "push",
        Resp::Attribute(..) => "attribute",
    }
}

/// A map key or an INFO-ish field, as text.
fn text(reply: &Resp) -> String {
    match reply {
        Resp::Simple(s) => s.to_string(),
        Resp::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// The length of the first whole reply in `wire`, and the type byte of
/// each of its elements in wire order (with whether it was a `-1` null),
/// or `None` while the reply is incomplete.
fn frame_len(wire: &[u8]) -> Option<(usize, Vec<(u8, bool)>)> {
    let mut types = Vec::new();
    let mut at = 0;
    let mut pending = 1usize;
    while pending > 0 {
        pending -= 1;
        let kind = *wire.get(at)?;
        let end = at + wire[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&wire[at + 1..end]).unwrap_or("");
        let len = || -> i64 {
            line.parse().unwrap_or_else(|_| {
                panic!("bad length {line:?} in {:?}", String::from_utf8_lossy(wire))
            })
        };
        at = end + 2;
        match kind {
            b'$' | b'!' | b'=' => {
                let n = len();
                types.push((kind, n < 0));
                if n >= 0 {
                    at += n as usize + 2;
                    if wire.len() < at {
                        return None;
                    }
                }
            }
            b'*' | b'~' | b'>' => {
                let n = len();
                types.push((kind, n < 0));
                pending += n.max(0) as usize;
            }
            b'%' => {
                types.push((kind, false));
                pending += 2 * len() as usize;
            }
            // The attribute's pairs, then the reply they describe.
            b'|' => {
                types.push((kind, false));
                pending += 2 * len() as usize + 1;
            }
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => types.push((kind, kind == b'_')),
            other => panic!(
                "{:?} is not a RESP type in {:?}",
                other as char,
                String::from_utf8_lossy(wire)
            ),
        }
    }
    Some((at, types))
}

/// Parses one whole reply with the redis crate, and puts back the types
/// its values don't keep.
fn parse(wire: &[u8], types: Vec<(u8, bool)>) -> Resp {
    let mut buf = BytesMut::from(wire);
    let value = redis::ValueCodec::default()
        .decode(&mut buf)
        .unwrap_or_else(|e| {
            panic!(
                "the redis crate can't parse {:?}: {e}",
                String::from_utf8_lossy(wire)
            )
        })
        .unwrap_or_else(|| {
            panic!(
                "the redis crate wants more than {:?}",
                String::from_utf8_lossy(wire)
            )
        });
    assert!(buf.is_empty(), "the redis crate left {buf:?} of {wire:?}");
    let mut types = types.into_iter();
    let reply = typed(value, &mut types);
    assert!(types.next().is_none(), "elements left over in {wire:?}");
    reply
}

fn typed(value: Value, types: &mut std::vec::IntoIter<(u8, bool)>) -> Resp {
    let (kind, _) = types.next().expect("an element for every value");
    let mut each =
        |items: Vec<Value>| -> Vec<Resp> { items.into_iter().map(|v| typed(v, types)).collect() };
    match value {
        Value::Nil => Resp::Null(match kind {
            b'$' => "$-1",
            b'*' => "*-1",
            _ => "_",
        }),
        Value::Okay => Resp::Simple("OK".into()),
        Value::SimpleString(s) => Resp::Simple(s.into()),
        Value::ServerError(err) => {
            let mut text = err.code().to_owned();
            if let Some(details) = err.details() {
                text.push(' ');
                text.push_str(details);
            }
            if kind == b'!' {
                Resp::BlobError(text)
            } else {
                Resp::Error(text.into())
            }
        }
        Value::Int(n) => Resp::Int(n),
        Value::BulkString(b) => Resp::Bulk(b.into()),
        Value::VerbatimString { format, text } => Resp::Verbatim(format.to_string(), text),
        Value::Double(d) => Resp::Double(d.to_string()),
        Value::Boolean(b) => Resp::Boolean(b),
        Value::BigNumber(n) => Resp::BigNumber(String::from_utf8_lossy(&n).into_owned()),
        Value::Array(items) => Resp::Array(each(items)),
        Value::Set(items) => Resp::Set(each(items)),
        Value::Map(pairs) => Resp::Map(
            pairs
                .into_iter()
                .map(|(k, v)| {
                    let k = typed(k, types);
                    (k, typed(v, types))
                })
                .collect(),
        ),
        Value::Push { kind: push, data } => {
            // The kind is the push's first element on the wire.
            let (first, _) = types.next().expect("a push kind");
            let mut items = vec![match first {
                b'+' => Resp::Simple(push.to_string().into()),
                _ => Resp::Bulk(push.to_string().into()),
            }];
            items.extend(data.into_iter().map(|v| typed(v, types)));
            Resp::Push(items)
        }
        Value::Attribute { data, attributes } => {
            let attributes = attributes
                .into_iter()
                .map(|(k, v)| {
                    let k = typed(k, types);
                    (k, typed(v, types))
                })
                .collect();
            Resp::Attribute(attributes, Box::new(typed(*data, types)))
        }
        other => panic!("a value this test does not know: {other:?}"),
    }
}
