//! stockgate's scripts as one Redis Functions library (`src/script.rs`),
//! on every server of the upstream matrix: loaded once on every primary
//! under a versioned name, each function registered with its script's
//! flags, called with FCALL on the hot path; and EVALSHA where an ACL
//! refuses FUNCTION LOAD or FCALL, or `--scripts eval` asks, which
//! `stockgate check` says. The faults (FUNCTION FLUSH under load, a new
//! primary, a failover) are in `tests/faults/functions.rs` and
//! `tests/faults/failover.rs`.

mod support;

use redis::Value;
use std::process::Command;
use std::time::{Duration, Instant};
use stockgate::config::ScriptCalls;
use stockgate::dev::{LocalRedis, RedisNode};
use stockgate::script::{Calling, Library, Scripts};
use support::*;

fn library() -> Library {
    Library::of(&Scripts::new().all()).expect("stockgate has scripts")
}

/// Calls of `command` a node has run (INFO commandstats).
fn calls(node: &RedisNode, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut node.connection().unwrap())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// FUNCTION LIST of `name`, each function as (name, flags).
fn functions_of(node: &RedisNode, name: &str) -> Vec<(String, Vec<String>)> {
    let libraries: Vec<Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .query(&mut node.connection().unwrap())
        .unwrap();
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    // RESP2: each library a flat [key, value, ...] list.
    let field = |items: &[Value], key: &str| -> Option<Value> {
        items
            .chunks(2)
            .find(|pair| text(&pair[0]) == key)
            .map(|pair| pair[1].clone())
    };
    let mut found = Vec::new();
    for library in libraries {
        let Value::Array(items) = library else {
            panic!("FUNCTION LIST answered {library:?}")
        };
        if field(&items, "library_name").map(|v| text(&v)).as_deref() != Some(name) {
            continue;
        }
        let Some(Value::Array(functions)) = field(&items, "functions") else {
            panic!("no functions in {items:?}")
        };
        for function in functions {
            let Value::Array(function) = function else {
                panic!("{function:?}")
            };
            let flags = match field(&function, "flags") {
                Some(Value::Array(flags)) | Some(Value::Set(flags)) => {
                    flags.iter().map(text).collect()
                }
                other => panic!("flags: {other:?}"),
            };
            found.push((text(&field(&function, "name").unwrap()), flags));
        }
    }
    found.sort();
    found
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn scripts_run_as_one_versioned_library_called_with_fcall }
/// Ready means the library is on every primary; DEDUCT, REVERT and HOLD
/// then reach Redis as FCALLs (no EVALSHA at all), answering as the
/// scripts always did; the library's name carries the scripts' version
/// and digest, and each function its script's flags.
async fn scripts_run_as_one_versioned_library_called_with_fcall(kind: ServerKind) {
    let cluster = cluster_of(kind);
    set_stock(&cluster, "lib-1", 10);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let upstream = &server.shared().upstream;
    assert_eq!(
        upstream.calling(),
        Calling::Function,
        "{}",
        upstream.calling_text()
    );
    let library = library();
    let version = stockgate::outcome::SCRIPT_VERSION;
    assert!(
        library.name.starts_with(&format!("stockgate_v{version}_")),
        "{}",
        library.name
    );
    assert!(
        upstream.calling_text().contains(&library.name),
        "{}",
        upstream.calling_text()
    );
    let mut expected: Vec<(String, Vec<String>)> = Scripts::new()
        .all()
        .iter()
        .map(|s| {
            // `lua/order.lua` files its order in another slot of its node
            // (issue 25): its shebang says `flags=allow-cross-slot-keys`.
            let flags = if s.name == "order" {
                vec!["allow-cross-slot-keys".to_owned()]
            } else {
                Vec::new()
            };
            (s.function.clone(), flags)
        })
        .collect();
    expected.push((
        library.probe.clone(),
        vec!["allow-oom".into(), "allow-stale".into(), "no-writes".into()],
    ));
    expected.sort();
    for node in &cluster.nodes {
        let mut functions = functions_of(node, &library.name);
        for (_, flags) in &mut functions {
            flags.sort();
        }
        // Every script of lua/ is `#!lua` (a writing function, as the
        // script is a writing script), with the flags its shebang names.
        assert_eq!(functions, expected, ":{}", node.port);
    }

    let mut conn = client(&server, false).await;
    let info: String = redis::cmd("INFO")
        .arg("stockgate")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        info.contains(&format!(
            "scripts_called_by:FCALL (library {})",
            library.name
        )),
        "{info}"
    );
    let reply = parse(
        deduct(&mut conn, "lib-1", "3", "lib-r1", Some("ORD-1"))
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 7));
    let again = parse(
        deduct(&mut conn, "lib-1", "3", "lib-r1", Some("ORD-1"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (again.code, again.remain, again.order_no.as_str()),
        (1, 7, "ORD-1")
    );
    let revert: Value = redis::cmd("REVERT")
        .arg("lib-1")
        .arg("lib-r1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(parse(revert).code, 0);
    let fcalls: u64 = cluster.nodes.iter().map(|n| calls(n, "fcall")).sum();
    let evalshas: u64 = cluster.nodes.iter().map(|n| calls(n, "evalsha")).sum();
    let evals: u64 = cluster.nodes.iter().map(|n| calls(n, "eval")).sum();
    assert!(fcalls >= 3, "{fcalls} FCALLs");
    assert_eq!((evalshas, evals), (0, 0), "no call went by EVALSHA or EVAL");
    assert_eq!(get_stock(&cluster, "lib-1"), Some(10));
    server.stop_now();

    // ACLs on the same cluster (a cluster costs more to start than these).
    let primaries: Vec<&RedisNode> = cluster.nodes.iter().collect();
    fcall_revoked_while_serving_moves_to_evalsha(&primaries, |sku, stock| {
        set_stock(&cluster, sku, stock)
    })
    .await;
    an_acl_refusing_fcall_at_start_means_evalsha(&primaries).await;
    an_acl_refusing_function_load_means_evalsha_not_three_calls(&primaries).await;
}

/// `stockgate_function_refusals_total` of each command, as `server`
/// counts them: (function_list, function_load, fcall).
fn refusals(server: &stockgate::server::Server) -> (u64, u64, u64) {
    let of = |command: &str| {
        metric(
            server,
            &format!("stockgate_function_refusals_total{{command=\"{command}\"}}"),
        )
    };
    (of("function_list"), of("function_load"), of("fcall"))
}

/// Gives user `user` (password `gate-pw`) every right, then takes away
/// `denied` (ACL rules such as `-fcall`), on each of `nodes`: ACLs are
/// each node's own, a cluster's included.
fn set_user(nodes: &[&RedisNode], user: &str, denied: &[&str]) {
    for node in nodes {
        let mut setuser = redis::cmd("ACL");
        setuser
            .arg("SETUSER")
            .arg(user)
            .arg("reset")
            .arg("on")
            .arg(">gate-pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all");
        for rule in denied {
            setuser.arg(*rule);
        }
        setuser
            .query::<()>(&mut node.connection().unwrap())
            .unwrap();
    }
}

fn url_of(user: &str, node: &RedisNode) -> String {
    format!("redis://{user}:gate-pw@127.0.0.1:{}", node.port)
}

/// Calls of `command` served by `nodes` together.
fn calls_on(nodes: &[&RedisNode], command: &str) -> u64 {
    nodes.iter().map(|node| calls(node, command)).sum()
}

/// A user refused FUNCTION LOAD, where no primary has the library: it is
/// not taken as loaded, stockgate calls by EVALSHA (not FCALL, `Function
/// not found`, then EVAL: three calls each), says why once and counts it,
/// and so does `stockgate check`.
async fn an_acl_refusing_function_load_means_evalsha_not_three_calls(nodes: &[&RedisNode]) {
    set_user(nodes, "gate-l", &["-function|load"]);
    for node in nodes {
        redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query::<()>(&mut node.connection().unwrap())
            .unwrap();
    }
    let url = url_of("gate-l", nodes[0]);
    let server = proxy(vec![url.clone()], |_| {}).await;
    let upstream = &server.shared().upstream;
    let how = upstream.calling_text();
    assert_eq!(upstream.calling(), Calling::Eval, "{how}");
    assert!(
        how.contains("refuses FUNCTION LOAD") && how.to_ascii_lowercase().contains("noperm"),
        "{how}"
    );
    assert_eq!(refusals(&server), (0, 1, 0));
    let name = library().name;
    for node in nodes {
        assert!(functions_of(node, &name).is_empty(), ":{}", node.port);
    }
    let (fcalls, evals, evalshas) = (
        calls_on(nodes, "fcall"),
        calls_on(nodes, "eval"),
        calls_on(nodes, "evalsha"),
    );
    let mut conn = client(&server, false).await;
    for (n, id) in ["acl-l1", "acl-l2", "acl-l3"].into_iter().enumerate() {
        let reply = parse(deduct(&mut conn, "lib-1", "1", id, None).await.unwrap());
        assert_eq!((reply.code, reply.remain), (0, 8 - n as i64));
    }
    assert_eq!(calls_on(nodes, "fcall"), fcalls, "no FCALL");
    assert_eq!(calls_on(nodes, "eval"), evals, "no EVAL");
    assert_eq!(calls_on(nodes, "evalsha"), evalshas + 3, "one EVALSHA each");
    server.stop_now();
    let line = check_scripts_line(url).await;
    assert!(
        line.contains("called with EVALSHA (") && line.contains("refuses FUNCTION LOAD"),
        "{line}"
    );
}

/// `stockgate check` against `url`: its `scripts` line, which must PASS.
async fn check_scripts_line(url: String) -> String {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(stockgate_bin())
            .args(["check", "--upstream", &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    report
        .lines()
        .find(|l| l.starts_with("PASS  scripts"))
        .unwrap_or_else(|| panic!("no PASS for scripts in\n{report}"))
        .to_owned()
}

/// FCALL revoked from stockgate's user while it serves by FCALL: the
/// next call, a DEDUCT on the node pipes or an ORDER's intent, is sent
/// again by EVALSHA and answered, never `-BADREPLY ... NOPERM`; from then
/// on stockgate calls by EVALSHA and says why. `nodes` are every node of
/// the upstream; `stock` sets a sku's stock there.
async fn fcall_revoked_while_serving_moves_to_evalsha(
    nodes: &[&RedisNode],
    stock: impl Fn(&str, i64),
) {
    set_user(nodes, "gate-r", &[]);
    for sku in ["rev-1", "rev-2"] {
        stock(sku, 10);
    }
    let url = url_of("gate-r", nodes[0]);
    // Two sidecars: each meets the refusal first on another path.
    let piped = proxy(vec![url.clone()], |_| {}).await;
    let ordering = proxy(vec![url.clone()], |_| {}).await;
    for server in [&piped, &ordering] {
        let upstream = &server.shared().upstream;
        assert_eq!(
            upstream.calling(),
            Calling::Function,
            "{}",
            upstream.calling_text()
        );
    }
    let mut conn = client(&piped, false).await;
    let first = parse(
        deduct(&mut conn, "rev-1", "1", "rev-r1", None)
            .await
            .unwrap(),
    );
    assert_eq!((first.code, first.remain), (0, 9));

    set_user(nodes, "gate-r", &["-fcall", "-fcall_ro"]);
    let evalshas = calls_on(nodes, "evalsha");
    let reply = deduct(&mut conn, "rev-1", "2", "rev-r2", None)
        .await
        .expect("a DEDUCT refused FCALL is answered by EVALSHA");
    let reply = parse(reply);
    assert_eq!((reply.code, reply.remain), (0, 7));
    let mut orders = client(&ordering, false).await;
    let order: Value = redis::cmd("ORDER")
        .arg("rev-o1")
        .arg("rev-2")
        .arg("3")
        .query_async(&mut orders)
        .await
        .expect("an ORDER refused FCALL is answered by EVALSHA");
    let Value::Array(order) = order else {
        panic!("ORDER answered {order:?}")
    };
    assert_eq!(order.first(), Some(&Value::Int(0)), "{order:?}");
    for server in [&piped, &ordering] {
        let upstream = &server.shared().upstream;
        let how = upstream.calling_text();
        assert_eq!(upstream.calling(), Calling::Eval, "{how}");
        assert!(
            how.starts_with("EVALSHA (")
                && how.contains("refuses FCALL")
                && how.to_ascii_lowercase().contains("noperm"),
            "{how}"
        );
    }
    for server in [&piped, &ordering] {
        // Counted once, and not again when the health loop's check, run
        // at once, meets it on a primary it names.
        assert_eq!(refusals(server), (0, 0, 1));
        let upstream = &server.shared().upstream;
        loop_until_async(Duration::from_secs(10), || async {
            upstream.calling_text().contains("127.0.0.1:").then_some(())
        })
        .await;
        assert_eq!(upstream.calling(), Calling::Eval);
        assert_eq!(refusals(server), (0, 0, 1));
    }
    // And from then on, by EVALSHA at once.
    let again = parse(
        deduct(&mut conn, "rev-1", "1", "rev-r3", None)
            .await
            .unwrap(),
    );
    assert_eq!((again.code, again.remain), (0, 6));
    assert!(
        calls_on(nodes, "evalsha") >= evalshas + 3,
        "the DEDUCTs and the ORDER's calls went by EVALSHA"
    );
    piped.stop_now();
    ordering.stop_now();
}

/// A user refused FCALL from the start, on a cluster: stockgate is ready,
/// calls by EVALSHA and says why, and so does `stockgate check`.
async fn an_acl_refusing_fcall_at_start_means_evalsha(nodes: &[&RedisNode]) {
    set_user(nodes, "gate-f", &["-fcall", "-fcall_ro"]);
    let url = url_of("gate-f", nodes[0]);
    let server = proxy(vec![url.clone()], |_| {}).await;
    let upstream = &server.shared().upstream;
    let how = upstream.calling_text();
    assert_eq!(upstream.calling(), Calling::Eval, "{how}");
    assert!(
        how.contains("refuses FCALL") && how.to_ascii_lowercase().contains("noperm"),
        "{how}"
    );
    assert_eq!(refusals(&server), (0, 0, 1));
    let mut conn = client(&server, false).await;
    let reply = parse(
        deduct(&mut conn, "lib-1", "1", "acl-f1", None)
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 9));
    server.stop_now();
    let line = check_scripts_line(url).await;
    assert!(
        line.contains("called with EVALSHA (") && line.contains("refuses FCALL"),
        "{line}"
    );
}

/// A standalone `kind` server with a user `gate` (password `gate-pw`)
/// that may do everything but `denied` (ACL rules such as `-fcall`).
fn server_with_gate_user(kind: ServerKind, denied: &[&str]) -> LocalRedis {
    let redis = standalone_of(kind);
    set_user(&[&redis.node], "gate", denied);
    redis
}

fn gate_url(redis: &LocalRedis) -> String {
    url_of("gate", &redis.node)
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn fcall_revoked_while_serving_a_standalone_redis_moves_to_evalsha }
/// [`fcall_revoked_while_serving_moves_to_evalsha`], on one Redis.
async fn fcall_revoked_while_serving_a_standalone_redis_moves_to_evalsha(kind: ServerKind) {
    let redis = standalone_of(kind);
    fcall_revoked_while_serving_moves_to_evalsha(&[&redis.node], |sku, stock| {
        set_stock_standalone(&redis, sku, stock)
    })
    .await;
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn an_acl_that_refuses_function_leaves_evalsha_in_use }
/// An ACL that refuses FUNCTION, FUNCTION LOAD or only FCALL: stockgate
/// is ready all the same, calls by EVALSHA, says why and counts it;
/// `stockgate check` says which is in use. With `--scripts function` it stays not ready instead,
/// saying why.
async fn an_acl_that_refuses_function_leaves_evalsha_in_use(kind: ServerKind) {
    for (denied, refused, counted) in [
        (&["-function"][..], "refuses FUNCTION LIST", (1, 0, 0)),
        (&["-function|load"][..], "refuses FUNCTION LOAD", (0, 1, 0)),
        (&["-fcall", "-fcall_ro"][..], "refuses FCALL", (0, 0, 1)),
    ] {
        let redis = server_with_gate_user(kind, denied);
        set_stock_standalone(&redis, "acl-1", 5);
        let server = proxy(vec![gate_url(&redis)], |_| {}).await;
        let upstream = &server.shared().upstream;
        let how = upstream.calling_text();
        assert_eq!(upstream.calling(), Calling::Eval, "{how}");
        assert!(
            how.starts_with("EVALSHA (")
                && how.contains(refused)
                && how.to_ascii_lowercase().contains("noperm"),
            "{denied:?}: {how}"
        );
        assert_eq!(refusals(&server), counted, "{denied:?}");
        let mut conn = client(&server, false).await;
        let reply = parse(
            deduct(&mut conn, "acl-1", "2", "acl-r1", None)
                .await
                .unwrap(),
        );
        assert_eq!((reply.code, reply.remain), (0, 3), "{denied:?}");
        assert!(calls(&redis.node, "evalsha") >= 1, "{denied:?}");
        assert_eq!(calls(&redis.node, "fcall"), 0, "{denied:?}");
        server.stop_now();

        let line = check_scripts_line(gate_url(&redis)).await;
        assert!(
            line.contains("called with EVALSHA (") && line.contains(refused),
            "{denied:?}: {line}"
        );

        let strict = stockgate::server::start({
            let mut config = stockgate::config::Config::for_upstream(vec![gate_url(&redis)]);
            config.upstream.scripts = ScriptCalls::Function;
            config
        })
        .await
        .expect("stockgate starts");
        let deadline = Instant::now() + Duration::from_secs(15);
        let problem = loop {
            if let Some(problem) = strict.shared().upstream.problem()
                && problem.contains("--scripts function")
            {
                break problem;
            }
            assert!(
                Instant::now() < deadline,
                "--scripts function never said why it is not ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(problem.contains(refused), "{problem}");
        assert!(!strict.is_ready(), "{problem}");
        strict.stop_now();
    }
}

/// `--scripts eval`: no library is loaded, every call is an EVALSHA;
/// `stockgate check` with the default names the library it would call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_eval_loads_no_library_and_check_names_the_one_in_use() {
    let redis = standalone();
    set_stock_standalone(&redis, "eval-1", 5);
    let server = proxy(vec![redis.url()], |c| {
        c.upstream.scripts = ScriptCalls::Eval
    })
    .await;
    assert_eq!(server.shared().upstream.calling(), Calling::Eval);
    assert_eq!(
        server.shared().upstream.calling_text(),
        "EVALSHA (--scripts eval)"
    );
    let mut conn = client(&server, true).await;
    let reply = parse(
        deduct(&mut conn, "eval-1", "1", "eval-r1", None)
            .await
            .unwrap(),
    );
    assert_eq!(reply.code, 0);
    assert_eq!(calls(&redis.node, "fcall"), 0);
    assert!(calls(&redis.node, "evalsha") >= 1);
    let libraries: Vec<Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut redis.node.connection().unwrap())
        .unwrap();
    assert!(libraries.is_empty(), "{libraries:?}");
    server.stop_now();

    let url = redis.url();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(stockgate_bin())
            .args(["check", "--upstream", &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(&format!("called with FCALL of library {}", library().name)),
        "{report}"
    );
}

fn set_stock_standalone(redis: &LocalRedis, sku: &str, stock: i64) {
    redis::cmd("SET")
        .arg(stock_key(sku))
        .arg(stock)
        .query::<()>(&mut redis.node.connection().unwrap())
        .unwrap();
}
