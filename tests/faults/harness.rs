//! The cluster under test and the knobs every fault turns: a 3-primary,
//! 3-replica cluster with a short `cluster-node-timeout`, a stockgate in
//! front of it, and the cluster operations a fault needs (promotion polls,
//! slot moves, announce ports, settling).
//!
//! Blocking Redis calls here run on the test's own thread: a test body is
//! polled there by `block_on`, while stockgate and the load run on the
//! runtime's workers. Nodes must be started and restarted from that thread,
//! too: `RedisNode` asks the kernel to kill a server when the thread that
//! spawned it exits, and a `spawn_blocking` thread exits when idle.

pub(crate) use crate::support::{ServerKind, matrix};
use redis::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use stockgate::config::{Durability, ScriptCalls};
use stockgate::dev::{LocalCluster, RedisNode, RedisOptions};
use stockgate::server::Server;

use crate::checker::{History, Policy, Workload};

/// The fault tests measure recovery times on a 2-core machine; run one at a
/// time so one test's load does not stretch another's numbers. (A tokio
/// mutex: it never poisons, so one failed test does not fail the rest.)
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// stockgate's `--timeout` in these tests (its default).
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// The loose "no hang" bound: an error must arrive within this.
pub fn no_hang_bound(timeout: Duration) -> Duration {
    timeout * 4 + Duration::from_secs(2)
}

/// `STOCKGATE_LONG_FAULTS=1` selects the long variants.
pub fn long_faults() -> bool {
    std::env::var("STOCKGATE_LONG_FAULTS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Three Redis primaries, one replica each, `cluster-node-timeout` of
/// `node_timeout_ms`, and `extra_args` for every node.
pub fn cluster(node_timeout_ms: u64, extra_args: &[&str]) -> LocalCluster {
    cluster_of(ServerKind::Redis7, node_timeout_ms, extra_args)
}

/// [`cluster`] of `kind`'s servers: the faults of the upstream matrix run
/// against Redis and Valkey alike.
pub fn cluster_of(kind: ServerKind, node_timeout_ms: u64, extra_args: &[&str]) -> LocalCluster {
    let options = RedisOptions {
        node_timeout_ms,
        extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        ..RedisOptions::of(kind)
    };
    let cluster = LocalCluster::start(3, 1, &options)
        .unwrap_or_else(|e| panic!("cannot start a {kind} cluster: {e}"));
    crate::support::assert_runs(&cluster.nodes[0], kind);
    cluster
}

/// The replica of primary `m` (one replica each).
pub fn replica_of(cluster: &LocalCluster, m: usize) -> usize {
    cluster.masters + m
}

/// `--wait-replicas 1 --wait-timeout 200ms`, as a test may ask for it.
pub const WAIT_ONE: Durability = Durability {
    replicas: 1,
    timeout: Duration::from_millis(200),
};

/// `STOCKGATE_FAULT_WAIT=1` runs every fault with `--wait-replicas 1`.
pub fn wait_from_env() -> Option<Durability> {
    std::env::var("STOCKGATE_FAULT_WAIT")
        .is_ok_and(|v| !v.is_empty() && v != "0")
        .then_some(WAIT_ONE)
}

/// A stockgate in front of `cluster`, ready, with `--timeout` = `timeout`
/// (and `--wait-replicas 1` if `STOCKGATE_FAULT_WAIT` asks).
pub async fn stockgate(seeds: Vec<String>, timeout: Duration) -> Server {
    stockgate_with(seeds, timeout, wait_from_env()).await
}

/// A stockgate with `--wait-replicas` as given.
pub async fn stockgate_with(
    seeds: Vec<String>,
    timeout: Duration,
    durability: Option<Durability>,
) -> Server {
    stockgate_calling(seeds, timeout, durability, ScriptCalls::Auto).await
}

/// A stockgate with `--wait-replicas` and `--scripts` as given.
pub async fn stockgate_calling(
    seeds: Vec<String>,
    timeout: Duration,
    durability: Option<Durability>,
    scripts: ScriptCalls,
) -> Server {
    crate::support::proxy(seeds, |c| {
        c.upstream.timeout = timeout;
        c.upstream.connect_timeout = Duration::from_millis(500);
        c.upstream.durability = durability;
        c.upstream.scripts = scripts;
        // The journal on: the audit keeps it as a third book.
        c.journal = true;
    })
    .await
}

/// Whether `node` has the function library `name` (FUNCTION LIST).
pub fn has_library(node: &RedisNode, name: &str) -> bool {
    let Ok(mut conn) = node.connection() else {
        return false;
    };
    let libraries: redis::RedisResult<Vec<redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .query(&mut conn);
    // LIBRARYNAME is a pattern: a name with another suffix would match too.
    libraries.is_ok_and(|libraries| {
        libraries
            .iter()
            .any(|library| format!("{library:?}").contains(&format!("\"{name}\"")))
    })
}

/// How many times `node` has run `command` (INFO commandstats, lower case).
pub fn command_calls(node: &RedisNode, command: &str) -> u64 {
    info_field(node, "commandstats", &format!("cmdstat_{command}"))
        .and_then(|stats| {
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A node's answer to a command that returns text, or None when it cannot
/// be asked.
pub fn text(node: &RedisNode, args: &[&str]) -> Option<String> {
    let mut conn = node.connection().ok()?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<String>(&mut conn).ok()
}

/// `role:master` or `role:slave` from INFO replication.
pub fn is_primary(node: &RedisNode) -> bool {
    text(node, &["INFO", "replication"]).is_some_and(|i| i.contains("role:master"))
}

pub fn node_id(node: &RedisNode) -> String {
    text(node, &["CLUSTER", "MYID"]).expect("CLUSTER MYID")
}

/// Polls `node` until it reports itself primary; the instant it was first
/// seen so (polled every 5 ms, so within a few ms of the promotion).
pub fn wait_promoted(node: &RedisNode, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if is_primary(node) {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "node on port {} was not promoted within {within:?}",
            node.port
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Restarts the killed node `old` (empty: no persistence) and waits until
/// it has rejoined as the replica of `new`, the primary promoted in its
/// place; returns when the link is up.
pub fn rejoin(cluster: &mut LocalCluster, old: usize, new: usize) -> Instant {
    cluster.nodes[old].restart().expect("old primary restarts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while info_field(&cluster.nodes[new], "replication", "connected_slaves").as_deref() != Some("1")
        || info_field(&cluster.nodes[old], "replication", "master_link_status").as_deref()
            != Some("up")
    {
        assert!(
            Instant::now() < deadline,
            "the old primary rejoins as a replica"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Instant::now()
}

/// Waits until every running node says `cluster_state:ok`, all 16384 slots
/// are served, and all agree on each slot's primary.
pub fn wait_stable(cluster: &LocalCluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let views: Vec<Option<Vec<(u16, u16, u16)>>> = cluster
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .map(|n| {
                let info = text(n, &["CLUSTER", "INFO"])?;
                if !info.contains("cluster_state:ok") || !info.contains("cluster_slots_ok:16384") {
                    return None;
                }
                let mut slots = slot_ranges(n)?;
                slots.sort_unstable();
                Some(slots)
            })
            .collect();
        let stable = views.iter().all(Option::is_some)
            && views.windows(2).all(|w| w[0] == w[1])
            && no_slot_in_migration(cluster);
        if stable {
            return;
        }
        assert!(Instant::now() < deadline, "cluster did not settle in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn no_slot_in_migration(cluster: &LocalCluster) -> bool {
    cluster.nodes.iter().filter(|n| n.is_running()).all(|n| {
        text(n, &["CLUSTER", "NODES"])
            .is_some_and(|nodes| !nodes.contains("->-") && !nodes.contains("-<-"))
    })
}

/// `(first, last, primary port)` for each range of CLUSTER SLOTS, as `node`
/// sees it.
pub fn slot_ranges(node: &RedisNode) -> Option<Vec<(u16, u16, u16)>> {
    let mut conn = node.connection().ok()?;
    let ranges: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).ok()?;
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i as u16),
        _ => None,
    };
    ranges
        .into_iter()
        .map(|range| {
            let Value::Array(items) = range else {
                return None;
            };
            let Value::Array(primary) = items.get(2)? else {
                return None;
            };
            Some((int(&items[0])?, int(&items[1])?, int(primary.get(1)?)?))
        })
        .collect()
}

/// The slot ranges `node` itself serves as primary (its `myself` line of
/// CLUSTER NODES), whatever port it announces.
pub fn own_slots(node: &RedisNode) -> Vec<(u16, u16)> {
    let nodes = text(node, &["CLUSTER", "NODES"]).unwrap_or_default();
    let Some(line) = nodes.lines().find(|l| l.contains("myself")) else {
        return Vec::new();
    };
    line.split_whitespace()
        .skip(8)
        .filter(|f| !f.starts_with('['))
        .filter_map(|f| match f.split_once('-') {
            Some((lo, hi)) => Some((lo.parse().ok()?, hi.parse().ok()?)),
            None => f.parse().ok().map(|s| (s, s)),
        })
        .collect()
}

/// The slot of a sku's keys.
pub fn sku_slot(sku: &str) -> u16 {
    stockgate::keys::slot(&crate::support::stock_key(sku))
}

/// The first sku named `<prefix>-<i>` whose keys live in `slot` (about
/// 16,384 names tried: each hashed alone, as its keys' hash tag, since
/// building its keys costs a key layout each).
pub fn sku_in_slot(prefix: &str, slot: u16) -> String {
    let sku = (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|sku| stockgate::keys::slot(sku.as_bytes()) == slot)
        .expect("every slot has names");
    assert_eq!(sku_slot(&sku), slot, "{sku}: its keys' slot");
    sku
}

/// The index (in `cluster.nodes`) of the primary serving `slot` now.
pub fn owner(cluster: &LocalCluster, slot: u16) -> usize {
    let node = cluster.primary_for_slot(slot).expect("slot has a primary");
    cluster
        .nodes
        .iter()
        .position(|n| n.port == node.port)
        .expect("a node of this cluster")
}

/// Sets each sku's stock directly, and opens its journal as stockgate
/// does before a sku's first entry (`lua/journal_open.lua`: listed, then
/// made), so that the load's first calls on it take the path every later
/// one does (the stockgates here run with `--journal`; tests/journal.rs
/// covers a first call that opens it).
pub fn seed(cluster: &LocalCluster, skus: &[String], stock: i64) {
    let mut conn = cluster.cluster_connection().expect("cluster connection");
    let open = stockgate::script::Scripts::new().journal_open;
    let layout = crate::support::layout();
    for sku in skus {
        redis::cmd("SET")
            .arg(crate::support::stock_key(sku))
            .arg(stock)
            .query::<()>(&mut conn)
            .expect("SET stock");
        let parsed = stockgate::params::Sku::parse(sku.clone().into()).expect("a sku");
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&parsed)];
        for (key, args) in [
            (shard.journals.clone(), vec!["list", sku.as_str()]),
            (layout.journal_key(&parsed), vec!["make"]),
        ] {
            redis::cmd("EVAL")
                .arg(&open.body)
                .arg(1)
                .arg(key)
                .arg(&args)
                .query::<redis::Value>(&mut conn)
                .expect("open the sku's journal");
        }
    }
}

/// Moves `slot` from primary `from` to primary `to` with the commands
/// `redis-cli --cluster reshard` uses: IMPORTING on the target, MIGRATING
/// on the source, MIGRATE of the keys in batches of `batch` (pausing `pace`
/// between batches, to keep the slot in motion long enough for traffic to
/// meet it), then SETSLOT NODE on both and on every other primary.
/// The slot stays in migration at least `hold`. Returns how long the slot
/// was in migration and how many keys moved.
/// Puts `slot` in migration from node `from` to node `to` (IMPORTING on the
/// target first, then MIGRATING on the source), moving no key yet; their
/// connections, source first. [`migrate_slot`] goes on from here, and may
/// be called after it.
pub fn begin_migration(
    cluster: &LocalCluster,
    slot: u16,
    from: usize,
    to: usize,
) -> (redis::Connection, redis::Connection) {
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
    let mut src = source.connection().expect("source");
    let mut dst = target.connection().expect("target");
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(node_id(source))
        .query::<()>(&mut dst)
        .expect("SETSLOT IMPORTING");
    redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(node_id(target))
        .query::<()>(&mut src)
        .expect("SETSLOT MIGRATING");
    (src, dst)
}

pub fn migrate_slot(
    cluster: &LocalCluster,
    slot: u16,
    from: usize,
    to: usize,
    batch: usize,
    pace: Duration,
    hold: Duration,
) -> (Duration, usize) {
    let target = &cluster.nodes[to];
    let target_id = node_id(target);
    let started = Instant::now();
    let (mut src, mut dst) = begin_migration(cluster, slot, from, to);
    let mut moved = 0;
    loop {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(batch)
            .query(&mut src)
            .expect("GETKEYSINSLOT");
        if keys.is_empty() {
            break;
        }
        moved += keys.len();
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query::<()>(&mut src)
            .expect("MIGRATE");
        std::thread::sleep(pace);
    }
    if let Some(rest) = hold.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    // The target first, so the slot is never owned by nobody; then the
    // source, which stops redirecting with ASK; then the rest.
    for conn in [&mut dst, &mut src] {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&target_id)
            .query::<()>(conn)
            .expect("SETSLOT NODE");
    }
    let in_migration = started.elapsed();
    for (i, node) in cluster.nodes.iter().enumerate() {
        if i != from && i != to && node.is_running() && is_primary(node) {
            let mut conn = node.connection().expect("primary");
            let _ = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&target_id)
                .query::<()>(&mut conn);
        }
    }
    (in_migration, moved)
}

/// Makes `node` announce `port` to clients (CLUSTER SLOTS, NODES, MOVED)
/// and waits until every running node has heard it through gossip.
pub fn announce_port(cluster: &LocalCluster, node: usize, port: u16) {
    let id = node_id(&cluster.nodes[node]);
    let mut conn = cluster.nodes[node].connection().expect("node");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("cluster-announce-port")
        .arg(port)
        .query::<()>(&mut conn)
        .expect("CONFIG SET cluster-announce-port");
    let expect = format!("127.0.0.1:{port}@");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.nodes.iter().filter(|n| n.is_running()).all(|n| {
        text(n, &["CLUSTER", "NODES"]).is_some_and(|nodes| {
            nodes
                .lines()
                .any(|l| l.starts_with(&id) && l.contains(&expect))
        })
    }) {
        assert!(
            Instant::now() < deadline,
            "the cluster did not learn the announced port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A counter from INFO errorstats (`errorstat_MOVED:count=3`), 0 if absent.
pub fn error_stat(node: &RedisNode, name: &str) -> u64 {
    let info = text(node, &["INFO", "errorstats"]).unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("errorstat_{name}:count=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One field of INFO (any section), as text.
pub fn info_field(node: &RedisNode, section: &str, field: &str) -> Option<String> {
    let info = text(node, &["INFO", section])?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
}

/// Whether `node` has the script with `sha` cached.
pub fn has_script(node: &RedisNode, sha: &str) -> bool {
    let mut conn = node.connection().expect("node");
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(sha)
        .query(&mut conn)
        .expect("SCRIPT EXISTS");
    exists == vec![1]
}

/// Skus named `<prefix>-<i>` spread over every primary: at least `per_primary`
/// on each of the three, by the slot map at the time of the call.
pub fn skus_on_every_primary(
    cluster: &LocalCluster,
    prefix: &str,
    per_primary: usize,
) -> Vec<String> {
    let mut by_owner: HashMap<usize, usize> = HashMap::new();
    let mut skus = Vec::new();
    let ranges = slot_ranges(&cluster.nodes[0]).expect("slots");
    let port_of = |slot: u16| {
        ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|r| r.2)
            .expect("slot served")
    };
    for i in 0.. {
        let sku = format!("{prefix}-{i}");
        let port = port_of(sku_slot(&sku));
        let count = by_owner.entry(port as usize).or_default();
        if *count < per_primary {
            *count += 1;
            skus.push(sku);
        }
        if by_owner.len() == cluster.masters && by_owner.values().all(|c| *c >= per_primary) {
            break;
        }
    }
    skus
}

/// `count` skus named `<prefix>-<i>` whose slot's primary (an index into
/// `cluster.nodes`) satisfies `keep`.
pub fn skus_where(
    cluster: &LocalCluster,
    prefix: &str,
    count: usize,
    keep: impl Fn(usize) -> bool,
) -> Vec<String> {
    let ranges = slot_ranges(&cluster.nodes[0]).expect("slots");
    let index_of = |slot: u16| {
        let port = ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|r| r.2)
            .expect("slot served");
        cluster
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of this cluster")
    };
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|sku| keep(index_of(sku_slot(sku))))
        .take(count)
        .collect()
}

/// Two loads: one on the skus of primary `victim` (named `name`), one on
/// the other primaries' skus (`<name>_rest`), each with its own clients,
/// so a client stuck retrying on the faulted shard never slows the
/// measurement of the others. Both lanes' stock is seeded.
pub fn lanes(cluster: &LocalCluster, name: &str, victim: usize) -> (Workload, Workload) {
    let mut fault = Workload::new(
        name,
        skus_where(cluster, name, 12, |o| o == victim),
        TIMEOUT,
    );
    let rest_name = format!("{name}_rest");
    let mut rest = Workload::new(
        &rest_name,
        skus_where(cluster, &rest_name, 24, |o| o != victim),
        TIMEOUT,
    );
    fault.clients = 12;
    rest.clients = 12;
    rest.seed = fault.seed.wrapping_add(1);
    fault.seed(cluster);
    rest.seed(cluster);
    (fault, rest)
}

/// The end of a test on [`lanes`]: the faulted lane's history audited
/// under `policy`, the other lane's strictly, each green; then stockgate
/// stopped.
pub fn audit_lanes_and_stop(
    cluster: &LocalCluster,
    server: Server,
    (fault, policy): (&History, Policy),
    rest: &History,
) {
    fault.audit(cluster, policy).assert_green();
    rest.audit(cluster, Policy::default()).assert_green();
    server.stop_now();
}

/// Milliseconds, for the reports.
pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Other shards are served through a fault on one: no request to another
/// shard waits behind the faulted node's queue. Such a wait would fail
/// every one of them for as long as the fault lasts; a busy machine (the
/// flood itself, other tests in CI's lanes) only slows some past
/// `--timeout`. So what is asserted is what the design promises, not how
/// fast the machine is: requests to other shards went on being made and
/// most were answered with a code, and any that was not is stockgate's
/// own timeout, never a fault of the faulted node's kind.
pub fn assert_other_shards_served(others: &[&crate::checker::Attempt], fault: &str) {
    assert!(
        !others.is_empty(),
        "no request to another shard was made during the {fault}"
    );
    let failed: Vec<_> = others.iter().filter(|a| !a.outcome.is_code()).collect();
    for attempt in &failed {
        assert_eq!(
            attempt.outcome.label(),
            "timeout",
            "a request to another shard failed during the {fault}: {attempt:?}"
        );
    }
    assert!(
        failed.len() * 2 < others.len(),
        "requests to other shards failed as if queued behind the {fault}: \
         {} of {} timed out",
        failed.len(),
        others.len()
    );
}
