//! RESP on the wire: exact bytes in and out, pipelining, bad input.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_mixed_commands_are_answered_in_order() {
    let cluster = cluster();
    set_stock(&cluster, "pipe", 5);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut request = Vec::new();
    for args in [
        &["PING"][..],
        &["DEDUCT", "pipe", "2", "p1", "O1"],
        &["ECHO", "between"],
        &["NOSUCH", "x"],
        &["DEDUCT", "pipe", "2", "p1", "O1"],
        &["DEDUCT", "pipe", "0", "p2"],
        &["DEDUCT", "pipe", "9", "p3"],
        &["deduct", "pipe", "1", "p4"],
        &["PING", "last"],
    ] {
        request.extend_from_slice(&encode_request(args));
    }
    let v = stockgate::outcome::SCRIPT_VERSION;
    let expected = format!(
        concat!(
            "+PONG\r\n",
            "*4\r\n:0\r\n:3\r\n$2\r\nO1\r\n:{v}\r\n",
            "$7\r\nbetween\r\n",
            "-ERR unknown command 'NOSUCH', with args beginning with: 'x' \r\n",
            "*4\r\n:1\r\n:3\r\n$2\r\nO1\r\n:{v}\r\n",
            "*5\r\n:3\r\n:-1\r\n$0\r\n\r\n:{v}\r\n$40\r\nqty must be an integer from 1 to 1000000\r\n",
            "*4\r\n:2\r\n:3\r\n$0\r\n\r\n:{v}\r\n",
            "*4\r\n:0\r\n:2\r\n$0\r\n\r\n:{v}\r\n",
            "$4\r\nlast\r\n",
        ),
        v = v
    );
    let (got, closed) = raw(server.addr, &request, expected.len());
    assert_eq!(String::from_utf8_lossy(&got), expected);
    assert!(!closed);
    assert_eq!(get_stock(&cluster, "pipe"), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_pipeline_of_deducts_is_answered_in_request_order() {
    let cluster = cluster();
    set_stock(&cluster, "deep", 10_000);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut request = Vec::new();
    for i in 0..2000 {
        request.extend_from_slice(&encode_request(&[
            "DEDUCT",
            "deep",
            "1",
            &format!("d{i}"),
            &format!("O{i}"),
        ]));
    }
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || stream.write_all(&request).unwrap())
    };
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let mut replies: Vec<(i64, String)> = Vec::new();
    while replies.len() < 2000 {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
        // Each reply is "*4\r\n:0\r\n:<remain>\r\n$<n>\r\nO<i>\r\n:2\r\n".
        replies = String::from_utf8_lossy(&got)
            .split("*4\r\n:0\r\n:")
            .skip(1)
            .filter_map(|r| {
                let mut lines = r.split("\r\n");
                let remain = lines.next()?.parse().ok()?;
                lines.next()?;
                Some((remain, lines.next()?.to_owned()))
            })
            .collect();
    }
    writer.join().unwrap();
    // The i-th reply is the i-th request's (its order_no says so). The
    // DEDUCTs ran concurrently, so their execution order is not promised;
    // each took exactly one unit.
    let order: Vec<String> = replies.iter().map(|(_, o)| o.clone()).collect();
    assert_eq!(
        order,
        (0..2000).map(|i| format!("O{i}")).collect::<Vec<_>>()
    );
    let mut remains: Vec<i64> = replies.iter().map(|(r, _)| *r).collect();
    remains.sort_unstable();
    assert_eq!(remains, (8000..10_000).collect::<Vec<_>>());
    assert_eq!(get_stock(&cluster, "deep"), Some(8000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_commands_keep_the_connection_open() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.write_all(&encode_request(&["GET", "foo"])).unwrap();
    stream.write_all(&encode_request(&["FLUSHALL"])).unwrap();
    stream
        .write_all(&encode_request(&["CLIENT", "KILL", "x"]))
        .unwrap();
    stream.write_all(&encode_request(&["PING"])).unwrap();
    let expected = concat!(
        "-ERR unknown command 'GET', with args beginning with: 'foo' \r\n",
        "-ERR unknown command 'FLUSHALL', with args beginning with: \r\n",
        "-ERR unknown subcommand 'KILL'. Try CLIENT HELP.\r\n",
        "+PONG\r\n",
    );
    let mut got = vec![0u8; expected.len()];
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.read_exact(&mut got).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_resp_gets_one_protocol_error_then_a_close() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let cases: &[(&[u8], &str)] = &[
        (b"*3000000000\r\n", "invalid multibulk length"),
        (b"*1\r\n$-10\r\n", "invalid bulk length"),
        (b"*1\r\n$2000000000\r\n", "invalid bulk length"),
        (b"*1\r\n$blabla\r\n", "invalid bulk length"),
        (b"*1\r\nfoo\r\n", "expected '$', got 'f'"),
        (b"*2\r\n*1\r\n$1\r\na\r\n", "expected '$', got '*'"),
    ];
    for (input, message) in cases {
        // A valid request first: it is answered before the bad one closes.
        let mut request = encode_request(&["PING"]);
        request.extend_from_slice(input);
        let expected = format!("+PONG\r\n-ERR Protocol error: {message}\r\n");
        let (got, _) = raw(server.addr, &request, expected.len());
        assert_eq!(String::from_utf8_lossy(&got), expected);
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream.write_all(input).unwrap();
        assert!(
            closed_by_peer(&mut stream),
            "{:?} should close",
            String::from_utf8_lossy(input)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_sizes_are_refused_and_the_server_carries_on() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;

    // A request over 64 KiB.
    let big = "x".repeat(70 * 1024);
    let (got, closed) = raw(server.addr, &encode_request(&["ECHO", &big]), 1 << 20);
    assert!(closed);
    assert!(
        String::from_utf8_lossy(&got).starts_with("-ERR Protocol error: "),
        "{:?}",
        String::from_utf8_lossy(&got)
    );

    // Nesting deep enough to overflow a recursive decoder's stack.
    let nested = b"*1\r\n".repeat(64 * 1024 / 4);
    let (got, closed) = raw(server.addr, &nested, 1 << 20);
    assert!(closed);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: expected '$', got '*'\r\n"
    );

    // 64 KiB of NUL bytes with no newline.
    let (got, closed) = raw(server.addr, &vec![0u8; 64 * 1024], 1 << 20);
    assert!(closed);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: too big inline request\r\n"
    );

    // The server is unharmed.
    assert_eq!(redis_cli(server.addr.port(), &["PING"]).trim(), "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_commands_work_for_telnet_and_nc() {
    let cluster = cluster();
    set_stock(&cluster, "inline", 3);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let expected = format!(
        "+PONG\r\n*4\r\n:0\r\n:2\r\n$0\r\n\r\n:{}\r\n",
        stockgate::outcome::SCRIPT_VERSION
    );
    let (got, _) = raw(server.addr, b"PING\r\ndeduct inline 1 i1\n", expected.len());
    assert_eq!(String::from_utf8_lossy(&got), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_switches_the_connection_to_resp3() {
    let cluster = cluster();
    set_stock(&cluster, "hello", 3);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut request = encode_request(&["CLIENT", "GETNAME"]);
    request.extend_from_slice(&encode_request(&[
        "HELLO", "3", "AUTH", "default", "pw", "SETNAME", "app-1",
    ]));
    request.extend_from_slice(&encode_request(&["CLIENT", "GETNAME"]));
    request.extend_from_slice(&encode_request(&["DEDUCT", "hello", "1", "h1"]));
    request.extend_from_slice(&encode_request(&["HELLO", "2"]));
    request.extend_from_slice(&encode_request(&["CLIENT", "SETNAME", ""]));
    request.extend_from_slice(&encode_request(&["CLIENT", "GETNAME"]));
    request.extend_from_slice(&encode_request(&["HELLO", "4"]));
    let hello3 = "%8\r\n$6\r\nserver\r\n$9\r\nstockgate\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n";
    let got = raw_until(
        server.addr,
        &request,
        "-NOPROTO unsupported protocol version\r\n",
    );
    assert!(
        got.starts_with("$-1\r\n"),
        "RESP2 null before HELLO: {got:?}"
    );
    assert!(got[5..].starts_with(hello3), "{got:?}");
    let (_, rest) = got
        .split_once(concat!(
            "$7\r\nmodules\r\n*0\r\n",
            "$17\r\nstockgate_version\r\n$5\r\n",
            env!("CARGO_PKG_VERSION"),
            "\r\n"
        ))
        .expect("HELLO 3 map ends with modules, then stockgate_version");
    let expected_rest = format!(
        "$5\r\napp-1\r\n*4\r\n:0\r\n:2\r\n$0\r\n\r\n:{}\r\n*16\r\n",
        stockgate::outcome::SCRIPT_VERSION
    );
    assert!(rest.starts_with(&expected_rest), "{rest:?}");
    assert!(
        rest.ends_with("+OK\r\n$-1\r\n-NOPROTO unsupported protocol version\r\n"),
        "back on RESP2 the null is $-1 again: {rest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_nulls_and_maps() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut request = encode_request(&["HELLO", "3"]);
    request.extend_from_slice(&encode_request(&["CLIENT", "GETNAME"]));
    request.extend_from_slice(&encode_request(&["PING"]));
    let got = raw_until(server.addr, &request, "+PONG\r\n");
    assert!(got.ends_with("_\r\n+PONG\r\n"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_answers_ok_and_closes() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut request = encode_request(&["PING"]);
    request.extend_from_slice(&encode_request(&["QUIT"]));
    request.extend_from_slice(&encode_request(&["PING"]));
    let (got, closed) = raw(server.addr, &request, 1000);
    assert_eq!(String::from_utf8_lossy(&got), "+PONG\r\n+OK\r\n");
    assert!(closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_and_select_commands() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let port = server.addr.port();
    assert_eq!(
        redis_cli(port, &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]).trim(),
        "OK"
    );
    assert_eq!(
        redis_cli(port, &["CLIENT", "SETINFO", "LIB-VER", "5.0.1"]).trim(),
        "OK"
    );
    assert_eq!(redis_cli(port, &["SELECT", "0"]).trim(), "OK");
    assert_eq!(
        redis_cli(port, &["SELECT", "1"]).trim(),
        "ERR DB index is out of range"
    );
    let id: i64 = redis_cli(port, &["CLIENT", "ID"]).trim().parse().unwrap();
    assert!(id > 0);
    assert_eq!(redis_cli(port, &["ECHO", "hi there"]).trim(), "hi there");
    assert_eq!(
        redis_cli(port, &["COMMAND", "COUNT"]).trim(),
        stockgate::dispatch::COMMANDS.len().to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_has_the_fields_clients_check() {
    let cluster = cluster();
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;
    let info: redis::InfoDict = redis::cmd("INFO").query_async(&mut conn).await.unwrap();
    assert_eq!(
        info.get::<String>("redis_version").as_deref(),
        Some("7.2.0")
    );
    assert_eq!(info.get::<i64>("loading"), Some(0));
    assert_eq!(info.get::<String>("role").as_deref(), Some("master"));
    assert_eq!(
        info.get::<String>("upstream_mode").as_deref(),
        Some("cluster")
    );
    assert_eq!(info.get::<i64>("upstream_ready"), Some(1));
    assert!(info.get::<i64>("connected_clients").unwrap() >= 1);
    let sha: String = info.get("script_sha").unwrap();
    assert_eq!(sha, stockgate::script::Scripts::new().deduct.sha);
    let only: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(only.trim_end(), "# Persistence\r\nloading:0");
}

/// redis-cli asks COMMAND DOCS when it starts interactively and asserts on
/// the reply's types; a bad reply would crash it. Drive a real interactive
/// session through a pseudo-terminal (`script`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_redis_cli_survives_command_docs_and_deducts() {
    let cluster = cluster();
    set_stock(&cluster, "tty", 4);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let session = format!("redis-cli -h 127.0.0.1 -p {}", server.addr.port());
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &session, "/dev/null"])
        .env("TERM", "dumb")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("`script` (util-linux) runs redis-cli on a pseudo-terminal");
    let mut stdin = child.stdin.take().unwrap();
    // Give redis-cli time to connect and load COMMAND DOCS, like a human.
    std::thread::sleep(Duration::from_millis(500));
    stdin.write_all(b"DEDUCT tty 3 t1 ORD-9\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"help DEDUCT\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"quit\r\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "redis-cli exited with {:?}: {text}",
        out.status
    );
    assert!(text.contains("1) (integer) 0"), "{text}");
    assert!(text.contains("2) (integer) 1"), "{text}");
    assert!(text.contains("\"ORD-9\""), "{text}");
    // `help DEDUCT` prints the usage built from COMMAND DOCS.
    assert!(text.contains("sku qty request_id [order_no]"), "{text}");
    assert!(text.contains("group:\u{1b}[0m stockgate"), "{text}");
    assert_eq!(get_stock(&cluster, "tty"), Some(1));
}

/// Redis's "1 GB bulk header trickled in slowly" case: the header is
/// refused as soon as its line ends, without waiting for (or reserving
/// room for) the body it announces, and other clients are served while
/// the bytes trickle in. stockgate runs as a process of its own here, so
/// the memory measured is its alone: in this test process, the sibling
/// tests running in parallel share the heap.
#[test]
fn a_huge_bulk_header_trickled_in_is_refused_when_its_line_ends() {
    let cluster = cluster();
    set_stock(&cluster, "trickle", 5);
    let gate = Launch::serve(&cluster.seeds()).start();
    // Resident memory, and address space: a buffer reserved for the body
    // would show in the second even if its pages were never touched.
    let memory = || (gate.status_kib("VmRSS"), gate.status_kib("VmSize"));
    let before = memory();
    let header = b"*2\r\n$6\r\nDEDUCT\r\n$1073741824\r\n".to_vec();
    let mut stream = TcpStream::connect(gate.addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for (i, byte) in header.iter().enumerate() {
        stream.write_all(&[*byte]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        if i == header.len() / 2 {
            // Halfway through, another client is served as usual.
            let reply = redis_cli(gate.addr.port(), &["DEDUCT", "trickle", "1", "t1"]);
            assert_eq!(reply.lines().next(), Some("0"), "{reply}");
        }
    }
    let mut got = Vec::new();
    stream.read_to_end(&mut got).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: invalid bulk length\r\n"
    );
    assert_eq!(get_stock(&cluster, "trickle"), Some(4));
    let after = memory();
    let rss_grown = after.0.saturating_sub(before.0);
    assert!(rss_grown < 32 * 1024, "RSS grew by {rss_grown} KiB");
    let size_grown = after.1.saturating_sub(before.1);
    assert!(
        size_grown < 256 * 1024,
        "address space grew by {size_grown} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_with_bytes_after_it_still_delivers_every_reply_and_closes_with_a_fin() {
    // Closing a socket whose receive buffer holds unread bytes makes Linux
    // send a reset and drop the replies still queued. Here 2.4 MB of
    // replies are queued when QUIT closes the connection, and the client
    // has sent more after QUIT that stockgate will never read as requests.
    let server = server_without_redis().await;
    let addr = server.addr;
    let (replies, ended) = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let payload = "e".repeat(60 * 1024);
        let mut request = Vec::new();
        for _ in 0..40 {
            request.extend(encode_request(&["ECHO", &payload]));
        }
        request.extend(encode_request(&["QUIT"]));
        request.extend(b"PING\r\n".repeat(40_000));
        stream.write_all(&request).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let ended = loop {
            match stream.read(&mut buf) {
                Ok(0) => break "eof".to_owned(),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break format!("{:?}", e.kind()),
            }
        };
        (got, ended)
    })
    .await
    .unwrap();
    let echo = format!("${}\r\n{}\r\n", 60 * 1024, "e".repeat(60 * 1024));
    let mut expected = echo.repeat(40).into_bytes();
    expected.extend_from_slice(b"+OK\r\n");
    assert_eq!(ended, "eof", "closed with a FIN, not a reset");
    assert_eq!(replies.len(), expected.len(), "every reply, then nothing");
    assert!(replies == expected, "the replies are intact");
}

#[tokio::test]
async fn a_drain_takes_in_bytes_that_arrived_after_the_last_short_read() {
    // On this current-thread runtime the connection's task runs only when
    // this test yields. A request arrives after the connection's last read
    // (a short read, which clears tokio's readiness) and before the drain;
    // the connection meets the drain before the reactor has seen the new
    // bytes' event. It must still read and answer them: they were sent
    // before the signal.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = server_without_redis().await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(&encode_request(&["PING", "first"]))
        .await
        .unwrap();
    let mut first = vec![0u8; 64];
    let n = stream.read(&mut first).await.unwrap();
    assert_eq!(&first[..n], b"$5\r\nfirst\r\n");
    // No yield from here to the drain: the connection task doesn't run
    // while the second request lands in its socket.
    let second = encode_request(&["PING", "second"]);
    assert_eq!(stream.try_write(&second).unwrap(), second.len());
    std::thread::sleep(Duration::from_millis(50));
    let drained = server.drain(Duration::from_secs(5)).await;
    assert!(drained, "the connection finished within the grace");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("closed")
        .unwrap();
    assert_eq!(
        rest, b"$6\r\nsecond\r\n",
        "the request sent before the drain is answered"
    );
}
