//! `--wait-replicas`: a write stands only once replicas confirm it.

mod support;

use std::time::Duration;
use stockgate::config::Durability;
use stockgate::dev::{LocalCluster, RedisOptions};
use stockgate::script::Calling;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_replicas_and_unconfirmed_ones_are_retryable_errors() {
    let mut cluster =
        LocalCluster::start(1, 1, &RedisOptions::default()).expect("a primary and a replica");
    set_stock(&cluster, "durable", 10);
    let server = proxy(cluster.seeds(), |c| {
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(200),
        });
    })
    .await;
    let mut conn = client(&server, false).await;

    // Confirmed by the replica: a normal reply, and the replica has it.
    let reply = parse(
        deduct(&mut conn, "durable", "2", "w1", Some("ORD-1"))
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 8));
    let mut replica = cluster.nodes[1].connection().unwrap();
    redis::cmd("READONLY").query::<()>(&mut replica).unwrap();
    let on_replica: Option<String> = redis::cmd("GET")
        .arg(record_key("durable", "w1"))
        .query(&mut replica)
        .unwrap();
    assert_eq!(
        on_replica.as_deref().map(summary).as_deref(),
        Some("D:2:ORD-1"),
        "WAIT returned only after the replica had it"
    );

    // No replica to confirm: the write happened on the primary, but the
    // caller is told it may not last, as a retryable fault.
    cluster.nodes[1].kill();
    let err = deduct(&mut conn, "durable", "3", "w2", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("UPSTREAM"), "{err:?}");
    let text = err.detail().unwrap();
    assert!(
        text.starts_with("not replicated: 0 of 1 replicas"),
        "{text}"
    );
    assert!(
        text.contains("retrying with the same request_id is safe"),
        "{text}"
    );
    // The retry finds the write on the primary, but no replica has it yet:
    // acknowledging it (code 1) would let a failover lose an acknowledged
    // deduction, so it is still not replicated. The stock changed once.
    let err = deduct(&mut conn, "durable", "3", "w2", None)
        .await
        .unwrap_err();
    assert!(
        err.detail().unwrap().starts_with("not replicated"),
        "{err:?}"
    );
    let mut primary = cluster.nodes[0].connection().unwrap();
    let stock: i64 = redis::cmd("GET")
        .arg(stock_key("durable"))
        .query(&mut primary)
        .unwrap();
    assert_eq!(stock, 5);
    // Replies that state nothing don't wait: insufficient stock still
    // answers with no replica.
    let short = parse(
        deduct(&mut conn, "durable", "99", "w3", None)
            .await
            .unwrap(),
    );
    assert_eq!(short.code, 2);
    // Once a replica has it, the retry is a duplicate.
    cluster.nodes[1].restart().unwrap();
    let mut retry = None;
    for _ in 0..100 {
        if let Ok(value) = deduct(&mut conn, "durable", "3", "w2", None).await {
            retry = Some(parse(value));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let retry = retry.expect("confirmed once the replica is back");
    assert_eq!((retry.code, retry.remain), (1, 5));
    let metrics = server.shared().metrics.render();
    // The write and its retry, at least (more while the replica resyncs).
    let not_replicated: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("stockgate_upstream_errors_total{kind=\"not_replicated\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(not_replicated >= 2.0, "{metrics}");
    server.stop_now();

    // FCALL taken away by an ACL while a call waits for its replicas: the
    // call goes again by EVALSHA with its WAIT, and is confirmed. (Once
    // CLUSTER SLOTS lists the replica again: a sidecar that reads it
    // without refuses writes at once, with no WAIT.)
    let mut primary = cluster.nodes[0].connection().unwrap();
    let mut listed = false;
    for _ in 0..300 {
        let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut primary)
            .unwrap();
        if slots.first().is_some_and(|range| range.len() > 3) {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(listed, "CLUSTER SLOTS lists the replica again");
    for node in &cluster.nodes {
        redis::cmd("ACL")
            .arg(&["SETUSER", "gate", "on", ">gate-pw", "~*", "+@all"])
            .query::<()>(&mut node.connection().unwrap())
            .unwrap();
    }
    let gate = format!("redis://gate:gate-pw@127.0.0.1:{}", cluster.nodes[0].port);
    let server = proxy(vec![gate], |c| {
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(200),
        });
    })
    .await;
    let upstream = &server.shared().upstream;
    assert_eq!(upstream.calling(), Calling::Function);
    for node in &cluster.nodes {
        redis::cmd("ACL")
            .arg(&["SETUSER", "gate", "-fcall"])
            .query::<()>(&mut node.connection().unwrap())
            .unwrap();
    }
    let mut conn = client(&server, false).await;
    let reply = deduct(&mut conn, "durable", "1", "w4", None)
        .await
        .expect("confirmed by EVALSHA and WAIT");
    assert_eq!(parse(reply).code, 0);
    assert_eq!(
        upstream.calling(),
        Calling::Eval,
        "{}",
        upstream.calling_text()
    );
}

/// Stops a server process (SIGSTOP) until dropped: it keeps its
/// connections, so a primary still counts it as a replica, but its
/// acknowledged replication offset stands still.
struct Frozen(i32);

impl Frozen {
    fn node(node: &stockgate::dev::RedisNode) -> Frozen {
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut node.connection().unwrap())
            .unwrap();
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("INFO server names the process");
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

matrix! { #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_reply_about_an_earlier_write_waits_for_that_write }
/// WAIT confirms what the connection it is sent on wrote. A duplicate
/// writes nothing, so on a server that tracks that per client (Valkey 8;
/// Redis 7.0 waits for its whole stream after any command) its WAIT would
/// confirm nothing, though the record it reports was written through
/// another connection (here another sidecar) that was told "not
/// replicated": acknowledging it would let a failover lose an acknowledged
/// deduction. Every reply that reports an existing record (DEDUCT 1 and
/// 4, REVERT 1) must wait for a replica that has it.
async fn a_reply_about_an_earlier_write_waits_for_that_write(kind: ServerKind) {
    let cluster =
        LocalCluster::start(1, 1, &RedisOptions::of(kind)).expect("a primary and a replica");
    assert_runs(&cluster.nodes[0], kind);
    set_stock(&cluster, "twice", 10);
    let durable = |c: &mut stockgate::config::Config| {
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(200),
        });
    };
    let (one, other) = (
        proxy(cluster.seeds(), durable).await,
        proxy(cluster.seeds(), durable).await,
    );
    let (mut first, mut second) = (client(&one, false).await, client(&other, false).await);
    let reply = parse(deduct(&mut first, "twice", "2", "t1", None).await.unwrap());
    assert_eq!(reply.code, 0, "{kind}: confirmed while the replica runs");

    let frozen = Frozen::node(&cluster.nodes[1]);
    let not_replicated = |result: redis::RedisResult<redis::Value>, what: &str| {
        let err = result.expect_err(what);
        assert!(
            err.code() == Some("UPSTREAM") && err.detail().unwrap().starts_with("not replicated"),
            "{kind}, {what}: {err:?}"
        );
    };
    not_replicated(
        deduct(&mut first, "twice", "3", "t2", None).await,
        "a write no replica has",
    );
    let record = record_key("twice", "t2");
    let mut primary = cluster.nodes[0].connection().unwrap();
    let expiry = |primary: &mut redis::Connection| -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(&record)
            .query(primary)
            .unwrap()
    };
    let expires_at = expiry(&mut primary);
    not_replicated(
        deduct(&mut second, "twice", "3", "t2", None).await,
        "its retry through another sidecar (code 1)",
    );
    not_replicated(revert(&mut first, "twice", "t1").await, "a revert");
    not_replicated(
        revert(&mut second, "twice", "t1").await,
        "its retry through another sidecar (code 1)",
    );
    not_replicated(
        deduct(&mut second, "twice", "2", "t1", None).await,
        "a late deduct of a reverted id (code 4)",
    );
    drop(frozen);

    // Once the replica has caught up, the same retries are acknowledged.
    let mut retry = None;
    for _ in 0..100 {
        if let Ok(value) = deduct(&mut second, "twice", "3", "t2", None).await {
            retry = Some(parse(value));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let retry = retry.expect("confirmed once the replica is back");
    assert_eq!((retry.code, retry.remain), (1, 7), "{kind}");
    let reply = parse(revert(&mut second, "twice", "t1").await.unwrap());
    assert_eq!(reply.code, 1, "{kind}");
    // Writing a record again changed neither it nor its expiry: the retry
    // window still counts from the deduction.
    assert_eq!(expiry(&mut primary), expires_at, "{kind}");
    let on_primary: String = redis::cmd("GET").arg(&record).query(&mut primary).unwrap();
    assert_eq!(summary(&on_primary), "D:3:", "{kind}");
    assert_eq!(get_stock(&cluster, "twice"), Some(7));
}

/// A hold that ran out, met by its own late CONFIRM, HOLD or REVERT under
/// `--wait-replicas`: the call's first step gives back the SKU's holds
/// that ran out, its own among them (EXPIRED, units back, out of the
/// holds set), and it then answers as for an EXPIRED record. Such an
/// answer writes its record again for the replica (`replicate_again`,
/// lua/common.lua), and that must write the record as it is now: it once
/// wrote the one the call had read before the release, so the record was
/// HELD again (with the retry window's TTL), though its units were back
/// in stock and nothing listed it in the holds set; a later REVERT then
/// gave the same units back a second time. Found by the fault checker
/// (the killed primary with STOCKGATE_FAULT_WAIT=1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_call_on_a_hold_that_ran_out_keeps_it_given_back_under_wait_replicas() {
    let cluster =
        LocalCluster::start(1, 1, &RedisOptions::default()).expect("a primary and a replica");
    let skus = ["late-confirm", "late-hold", "late-revert"];
    for sku in skus {
        set_stock(&cluster, sku, 100);
    }
    // No sweeper: only the late call itself gives each hold back.
    let server = proxy(cluster.seeds(), |c| {
        c.sweeper = false;
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(500),
        });
    })
    .await;
    let mut conn = client(&server, false).await;
    for sku in skus {
        let reply = parse_hold(hold(&mut conn, sku, "3", "h1", "1000", None).await.unwrap());
        assert_eq!((reply.code, reply.remain), (0, 97), "{sku}");
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let late = [
        parse_hold(confirm(&mut conn, skus[0], "h1").await.unwrap()).code,
        parse_hold(
            hold(&mut conn, skus[1], "3", "h1", "1000", None)
                .await
                .unwrap(),
        )
        .code,
        parse(revert(&mut conn, skus[2], "h1").await.unwrap()).code,
    ];
    assert_eq!(late, [5, 5, 1], "each hold ran out");
    let mut primary = cluster.nodes[0].connection().unwrap();
    for sku in skus {
        let record = record_key(sku, "h1");
        let raw: String = redis::cmd("GET").arg(&record).query(&mut primary).unwrap();
        let pttl: i64 = redis::cmd("PTTL").arg(&record).query(&mut primary).unwrap();
        assert_eq!(summary(&raw), "X:3:", "{sku}: {raw}");
        assert!(pttl > 0, "{sku}: an EXPIRED record has a TTL, {pttl}");
        let mut stock = stock_key(sku);
        let holds: i64 = redis::cmd("ZCARD")
            .arg([&stock[..], b":holds"].concat())
            .query(&mut primary)
            .unwrap();
        stock.extend_from_slice(b":held");
        let held: Option<i64> = redis::cmd("GET").arg(&stock).query(&mut primary).unwrap();
        assert_eq!((holds, held), (0, None), "{sku}: nothing on hold");
        assert_eq!(
            get_stock(&cluster, sku),
            Some(100),
            "{sku}: the units back once"
        );
        // And a REVERT now gives nothing back again.
        let reply = parse(revert(&mut conn, sku, "h1").await.unwrap());
        assert_eq!((reply.code, reply.remain), (1, 100), "{sku}");
        assert_eq!(get_stock(&cluster, sku), Some(100), "{sku}");
    }
}

/// How many times `node` has run `command` (its `INFO commandstats`).
fn calls(node: &stockgate::dev::RedisNode, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut node.connection().unwrap())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A primary with no replica (as a replica just promoted has): one
/// standalone Redis, or a cluster of one primary.
enum Lonely {
    Standalone(stockgate::dev::LocalRedis),
    Cluster(LocalCluster),
}

impl Lonely {
    fn primary(&self) -> &stockgate::dev::RedisNode {
        match self {
            Lonely::Standalone(redis) => &redis.node,
            Lonely::Cluster(cluster) => &cluster.nodes[0],
        }
    }
}

/// A primary without a replica ([`Lonely`]), four skus of 100 units on
/// it, and a stockgate in front with `--wait-replicas 1 --wait-timeout
/// 200ms`.
async fn without_a_replica(cluster: bool) -> (Lonely, Vec<String>, stockgate::server::Server) {
    let (lonely, seeds) = if cluster {
        let cluster = LocalCluster::start(1, 0, &RedisOptions::default()).expect("a primary");
        let seeds = cluster.seeds();
        (Lonely::Cluster(cluster), seeds)
    } else {
        let redis = standalone();
        let seeds = vec![redis.url()];
        (Lonely::Standalone(redis), seeds)
    };
    let skus: Vec<String> = (0..4).map(|i| format!("lonely-{i}")).collect();
    let mut direct = lonely.primary().connection().unwrap();
    for sku in &skus {
        redis::cmd("SET")
            .arg(stock_key(sku))
            .arg(100)
            .query::<()>(&mut direct)
            .unwrap();
    }
    let server = proxy(seeds, |c| {
        c.upstream.durability = Some(Durability {
            replicas: 1,
            timeout: Duration::from_millis(200),
        });
    })
    .await;
    (lonely, skus, server)
}

/// Issue 23, 4: with `--wait-replicas 1` and a primary that has no
/// replica, STOCK.GET and STOCK.STATUS are answered, and send no WAIT: a
/// read has nothing to make durable. Before, each sent a WAIT on the one
/// connection all such calls share; WAIT blocks it for the whole
/// `--wait-timeout` when no replica acknowledges, so 32 concurrent readers
/// queued behind each other's waits and 508 of their 512 reads timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_wait_for_replicas() {
    for cluster in [false, true] {
        reads_without_a_replica(cluster).await;
    }
}

async fn reads_without_a_replica(cluster: bool) {
    let (lonely, skus, server) = without_a_replica(cluster).await;
    let waits_before = calls(lonely.primary(), "wait");
    // 32 readers, each with its own connection to stockgate; every call
    // of theirs shares stockgate's one connection to the primary.
    let mut readers = Vec::new();
    for reader in 0..32 {
        let mut conn = client(&server, false).await;
        let skus = skus.clone();
        readers.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            for round in 0..8 {
                let sku = &skus[(reader + round) % skus.len()];
                let get: redis::RedisResult<redis::Value> = redis::cmd("STOCK.GET")
                    .arg(sku)
                    .query_async(&mut conn)
                    .await;
                if get != Ok(redis::Value::Int(100)) {
                    failed.push(format!("STOCK.GET {sku}: {get:?}"));
                }
                let status: redis::RedisResult<redis::Value> = redis::cmd("STOCK.STATUS")
                    .arg(sku)
                    .arg(format!("nobody-{reader}"))
                    .query_async(&mut conn)
                    .await;
                if !matches!(status, Ok(redis::Value::Array(_) | redis::Value::Map(_))) {
                    failed.push(format!("STOCK.STATUS {sku}: {status:?}"));
                }
            }
            failed
        }));
    }
    let mut failed = Vec::new();
    for reader in readers {
        failed.extend(reader.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "cluster {cluster}: {} of 512 reads failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(
        calls(lonely.primary(), "wait"),
        waits_before,
        "cluster {cluster}: a read sends no WAIT"
    );
    server.stop_now();
}
/// Issue 23, 4: with `--wait-replicas 1` and a primary known to have no
/// replica, 32 writes at once through the redis crate (the path a
/// fallback, an order's intent and a TLS upstream take) are each applied
/// on the primary once and answered `not replicated` at once. Sent with a
/// WAIT each, on the one connection they share, they queued behind each
/// other's waits and timed out one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replica_writes_through_the_redis_crate_fail_fast() {
    for cluster in [false, true] {
        writes_without_a_replica(cluster).await;
    }
}

async fn writes_without_a_replica(cluster: bool) {
    let (lonely, skus, server) = without_a_replica(cluster).await;
    let upstream = server.shared().upstream.clone();
    let scripts = stockgate::script::Scripts::new();
    let sku = stockgate::params::Sku::parse(skus[0].clone().into()).unwrap();
    let mut writes = Vec::new();
    for write in 0..32 {
        let (upstream, script) = (upstream.clone(), scripts.stock_add.clone());
        let op_id = stockgate::params::OpId::parse(format!("restock-{write}").into()).unwrap();
        let keys = layout().op_keys(&sku, &op_id);
        writes.push(tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + upstream.timeout();
            let nonce = format!("{write:x}");
            upstream
                .eval_fallback(
                    &script,
                    &keys.all(),
                    &[b"1", b"60000", nonce.as_bytes(), b"1"],
                    deadline,
                )
                .await
        }));
    }
    let mut outcomes = Vec::new();
    for write in writes {
        outcomes.push(write.await.unwrap());
    }
    let not_fast: Vec<_> = outcomes
        .iter()
        .filter(|o| {
            !matches!(o, Err(e) if e.kind == stockgate::error::FaultKind::NotReplicated
                && e.detail.starts_with("not replicated: 0 of 1 replicas"))
        })
        .collect();
    assert!(
        not_fast.is_empty(),
        "cluster {cluster}: {} of 32 writes were not a fast `not replicated`, e.g. {:?}",
        not_fast.len(),
        not_fast.first()
    );
    let stock: i64 = redis::cmd("GET")
        .arg(stock_key(&skus[0]))
        .query(&mut lonely.primary().connection().unwrap())
        .unwrap();
    assert_eq!(
        stock, 132,
        "cluster {cluster}: each write applied once on the primary"
    );
    server.stop_now();
}
