//! `stockgate check`: a doctor for the upstream, before a deploy or in CI.
//!
//! Connects with the same flags as the proxy and prints one line per check,
//! PASS, WARN or FAIL, with what it found and, when it isn't a PASS, why it
//! matters. Nothing it does writes to Redis: the script is run against a
//! probe sku that has no stock, which makes it answer UNKNOWNSKU after
//! every check and before any write.

use crate::config::MissingStock;
use crate::error::FaultKind;
use crate::keys::{KeyLayout, SLOTS, slot};
use crate::params::{RequestId, Sku};
use crate::script::{Calling, Library, Scripts};
use crate::upstream::{Eviction, Mode, Node, Upstream};
use redis::Value;
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub verdict: Verdict,
    pub check: &'static str,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}  {:<16} {}", self.verdict, self.check, self.detail)
    }
}

struct Report(Vec<Finding>);

impl Report {
    fn add(&mut self, verdict: Verdict, check: &'static str, detail: impl Into<String>) {
        let finding = Finding {
            verdict,
            check,
            detail: detail.into(),
        };
        println!("{finding}");
        self.0.push(finding);
    }
}

/// `--users-file`: one line per user, with its rights, its SKU prefixes
/// and how many passwords it has (never a password, nor its hash). A
/// file stockgate would refuse is a FAIL with its line; a user without a
/// password, who can't log in, a WARN.
pub fn users(path: &std::path::Path) -> Vec<Finding> {
    let mut report = Report(Vec::new());
    let file = match crate::config::UsersFile::read(path) {
        Ok(file) => file,
        Err(why) => {
            report.add(Verdict::Fail, "users", why);
            return report.0;
        }
    };
    if file.users.is_empty() {
        report.add(
            Verdict::Warn,
            "users",
            format!(
                "{} defines no user: only --requirepass's `default` can log in",
                path.display()
            ),
        );
    }
    for user in &file.users {
        let rights = user.grant.rights.names();
        let skus = match user.grant.sku_prefixes() {
            None => "every SKU".to_owned(),
            Some(prefixes) => format!(
                "SKUs {}",
                prefixes
                    .map(|p| format!("{}*", String::from_utf8_lossy(p)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let rights = if rights.is_empty() {
            "no rights".to_owned()
        } else {
            rights.join(", ")
        };
        let passwords = user.passwords.len();
        let (verdict, passwords) = match passwords {
            0 => (Verdict::Warn, "no password: cannot log in".to_owned()),
            1 => (Verdict::Pass, "1 password".to_owned()),
            n => (
                Verdict::Pass,
                format!("{n} passwords (a rotation in progress?)"),
            ),
        };
        report.add(
            verdict,
            "users",
            format!(
                "{} (line {}): {rights}; {skus}; {passwords}",
                user.name, user.line
            ),
        );
    }
    report.0
}

/// Runs every check, printing each line as it is decided.
pub async fn run(upstream: &Upstream, keys: &KeyLayout, timeout: Duration) -> Vec<Finding> {
    let mut report = Report(Vec::new());
    let mode = match upstream.connect_once().await {
        Ok(mode) => mode,
        Err(problem) => {
            report.add(Verdict::Fail, "connect", problem);
            return report.0;
        }
    };
    let nodes = match upstream.primaries().await {
        Ok(nodes) if !nodes.is_empty() => nodes,
        Ok(_) => {
            report.add(Verdict::Fail, "connect", "no primary serves any slot");
            return report.0;
        }
        Err(err) => {
            report.add(Verdict::Fail, "connect", err.detail);
            return report.0;
        }
    };
    if let Some(found) = stockgates(upstream, &nodes).await {
        report.add(Verdict::Fail, "connect", found);
        return report.0;
    }
    report.add(
        Verdict::Pass,
        "connect",
        format!(
            "{} mode, {} primar{}: {}",
            mode.as_str(),
            nodes.len(),
            if nodes.len() == 1 { "y" } else { "ies" },
            list(&nodes)
        ),
    );
    versions(upstream, &nodes, &mut report).await;
    if mode == Mode::Cluster {
        cluster_state(upstream, &nodes, &mut report).await;
        replicas(upstream, &mut report).await;
    }
    scripts(upstream, keys, &nodes, mode, &mut report).await;
    key_slots(upstream, keys, mode, &mut report).await;
    eviction(upstream, &nodes, &mut report).await;
    if mode == Mode::Cluster {
        node_timeout(upstream, &nodes[0], timeout, &mut report).await;
    }
    journal_backlog(upstream, keys, &mut report).await;
    report.0
}

fn list(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| format!("{}:{}", n.host, n.port))
        .collect::<Vec<_>>()
        .join(", ")
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

async fn info(upstream: &Upstream, node: &Node, section: &[&str]) -> Result<String, String> {
    let mut cmd = redis::cmd(section[0]);
    cmd.arg(&section[1..]);
    let reply = upstream
        .query_node(&cmd, node)
        .await
        .map_err(|e| e.detail)?;
    text(reply).ok_or_else(|| format!("{} answered an unexpected shape", section.join(" ")))
}

/// What a node runs, read from its `INFO server`.
///
/// Valkey names itself in `server_name:valkey` and gives its own version in
/// `valkey_version`; its `redis_version` is the Redis level it is
/// compatible with (7.2.4 in Valkey 8), not its release. Redis has no
/// `server_name`. Another server that names itself is reported by that
/// name and its `<name>_version` when it has one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerIdentity {
    /// `redis`, `valkey`, or the server's own `server_name`.
    pub name: String,
    /// The server's own release.
    pub version: String,
    /// The Redis compatibility level (`redis_version`): what stockgate's
    /// scripts need (7.0+, for script flags).
    pub redis_version: String,
}

impl ServerIdentity {
    pub fn from_info(info: &str) -> ServerIdentity {
        let redis_version = field(info, "redis_version").unwrap_or("unknown").to_owned();
        match field(info, "server_name").filter(|n| !n.is_empty()) {
            Some(name) if name != "redis" => ServerIdentity {
                name: name.to_owned(),
                version: field(info, &format!("{name}_version"))
                    .unwrap_or(&redis_version)
                    .to_owned(),
                redis_version,
            },
            _ => ServerIdentity {
                name: "redis".into(),
                version: redis_version.clone(),
                redis_version,
            },
        }
    }

    /// Script flags (`#!lua`), which make a replica redirect a script
    /// instead of failing at its first write, came with Redis 7.0; every
    /// Valkey release has them and says `redis_version:7.2.4`.
    fn has_script_flags(&self) -> bool {
        self.redis_version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|major| major >= 7)
    }
}

impl fmt::Display for ServerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// `--upstream` pointed at a stockgate instead of Redis is an easy slip:
/// the proxy's port is the one at hand after `stockgate dev`. A stockgate
/// answers like a Redis 7.2 up to SCRIPT, where the check would fail with
/// nothing that says why; its INFO names it (`stockgate_version`), so the
/// report can say it plainly instead.
async fn stockgates(upstream: &Upstream, nodes: &[Node]) -> Option<String> {
    let mut found = Vec::new();
    for node in nodes {
        if let Ok(text) = info(upstream, node, &["INFO", "server"]).await
            && let Some(version) = field(&text, "stockgate_version")
        {
            found.push(format!("{}:{} (stockgate {version})", node.host, node.port));
        }
    }
    (!found.is_empty()).then(|| {
        format!(
            "{} is a stockgate, not Redis: --upstream must name the Redis servers stockgate \
             fronts (for `stockgate dev`, the STOCKGATE_UPSTREAM it prints), not a stockgate's own port",
            found.join(", ")
        )
    })
}

/// Names the server and its version on every primary ("valkey 8.0.1",
/// "redis 7.0.15"), and fails a primary too old for script flags.
async fn versions(upstream: &Upstream, nodes: &[Node], report: &mut Report) {
    let mut found: Vec<(&Node, ServerIdentity)> = Vec::new();
    for node in nodes {
        match info(upstream, node, &["INFO", "server"]).await {
            Ok(text) => found.push((node, ServerIdentity::from_info(&text))),
            Err(err) => {
                report.add(
                    Verdict::Fail,
                    "server",
                    format!("{}:{}: {err}", node.host, node.port),
                );
                return;
            }
        }
    }
    let old: Vec<String> = found
        .iter()
        .filter(|(_, id)| !id.has_script_flags())
        .map(|(n, id)| format!("{}:{} runs {id}", n.host, n.port))
        .collect();
    if !old.is_empty() {
        report.add(
            Verdict::Fail,
            "server",
            format!(
                "{}: stockgate needs Redis 7.0 or newer, or Valkey (script flags)",
                old.join("; ")
            ),
        );
        return;
    }
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (node, id) in &found {
        groups
            .entry(id.to_string())
            .or_default()
            .push(format!("{}:{}", node.host, node.port));
    }
    if groups.len() == 1 {
        let (id, _) = groups.into_iter().next().expect("one group");
        report.add(Verdict::Pass, "server", format!("{id} on every primary"));
    } else {
        // Expected during a rolling move from Redis to Valkey (or an
        // upgrade), but each server and version was tested on its own.
        let mixed: Vec<String> = groups
            .into_iter()
            .map(|(id, nodes)| format!("{id} on {}", nodes.join(", ")))
            .collect();
        report.add(
            Verdict::Warn,
            "server",
            format!(
                "primaries run different servers or versions: {}; fine while a rolling upgrade is under way, \
                 but finish it: stockgate was tested against one server at a time",
                mixed.join("; ")
            ),
        );
    }
}

async fn cluster_state(upstream: &Upstream, nodes: &[Node], report: &mut Report) {
    let mut bad_state = Vec::new();
    let mut slots_ok = u32::MAX;
    for node in nodes {
        match info(upstream, node, &["CLUSTER", "INFO"]).await {
            Ok(text) => {
                if field(&text, "cluster_state") != Some("ok") {
                    bad_state.push(format!(
                        "{}:{} says {}",
                        node.host,
                        node.port,
                        field(&text, "cluster_state").unwrap_or("?")
                    ));
                }
                let ok = field(&text, "cluster_slots_ok")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                slots_ok = slots_ok.min(ok);
            }
            Err(err) => bad_state.push(format!("{}:{}: {err}", node.host, node.port)),
        }
    }
    if bad_state.is_empty() {
        report.add(Verdict::Pass, "cluster state", "ok on every primary");
    } else {
        report.add(Verdict::Fail, "cluster state", bad_state.join("; "));
    }
    if slots_ok == SLOTS as u32 {
        report.add(Verdict::Pass, "slots", "all 16384 slots are served");
    } else {
        report.add(
            Verdict::Fail,
            "slots",
            format!("only {slots_ok} of 16384 slots are served: DEDUCTs for the others fail"),
        );
    }
}

/// Primaries without a replica can't fail over: their slots stay down
/// until the node comes back.
async fn replicas(upstream: &Upstream, report: &mut Report) {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    let Ok(Some(nodes)) = upstream.query(&cmd).await.map(text) else {
        report.add(Verdict::Warn, "replicas", "CLUSTER NODES could not be read");
        return;
    };
    let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
    let primaries: Vec<&Vec<&str>> = lines
        .iter()
        .filter(|f| f.len() > 8 && f[2].contains("master"))
        .collect();
    let lonely: Vec<String> = primaries
        .iter()
        .filter(|p| {
            !lines
                .iter()
                .any(|f| f.len() > 3 && f[3] == p[0] && f[2].contains("slave"))
        })
        .map(|p| p[1].split('@').next().unwrap_or(p[1]).to_owned())
        .collect();
    if lonely.is_empty() {
        report.add(
            Verdict::Pass,
            "replicas",
            "every primary has a replica to fail over to",
        );
    } else {
        report.add(
            Verdict::Warn,
            "replicas",
            format!(
                "{} ha{} no replica: if it fails, its slots stay down until it returns",
                lonely.join(", "),
                if lonely.len() == 1 { "s" } else { "ve" }
            ),
        );
    }
}

/// Loads every script on every primary, then runs DEDUCT on each primary
/// against a probe sku it owns that has no stock: a healthy script checks
/// everything and answers UNKNOWNSKU, writing nothing.
async fn scripts(
    upstream: &Upstream,
    keys: &KeyLayout,
    nodes: &[Node],
    mode: Mode,
    report: &mut Report,
) {
    let scripts = Scripts::new();
    for node in nodes {
        for script in scripts.all() {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(&script.body);
            match upstream.query_node(&load, node).await.map(text) {
                Ok(Some(sha)) if sha == script.sha => {}
                Ok(other) => {
                    report.add(
                        Verdict::Fail,
                        "scripts",
                        format!(
                            "{}:{}: SCRIPT LOAD {} answered {other:?}",
                            node.host, node.port, script.name
                        ),
                    );
                    return;
                }
                Err(err) => {
                    report.add(
                        Verdict::Fail,
                        "scripts",
                        format!(
                            "{}:{}: SCRIPT LOAD {}: {}",
                            node.host, node.port, script.name, err.detail
                        ),
                    );
                    return;
                }
            }
        }
    }
    // FCALL where the servers and the ACL allow it (and --scripts does),
    // as `stockgate serve` would decide: the probe DEDUCTs below are then
    // FCALLs of the library on every primary.
    let library = Library::of(&scripts.all()).expect("stockgate has scripts");
    if let Err(problem) = upstream.settle_calling(&library, nodes).await.map(|_| ()) {
        report.add(Verdict::Fail, "scripts", problem);
        return;
    }
    let calling = match upstream.calling() {
        Calling::Function => format!("FCALL of library {}", library.name),
        Calling::Eval => upstream.calling_text(),
    };
    let owners = match slot_owners(upstream, mode).await {
        Ok(owners) => owners,
        Err(err) => {
            report.add(
                Verdict::Fail,
                "scripts",
                format!("cannot read the slot map: {err}"),
            );
            return;
        }
    };
    for node in nodes {
        let probe = (0..100_000).find_map(|i| {
            let sku = Sku::parse(format!("stockgate-check-{i}").into()).ok()?;
            let owner = owners
                .iter()
                .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot(&keys.stock_key(&sku))));
            (mode == Mode::Standalone || owner.is_some_and(|(_, _, n)| n == node)).then_some(sku)
        });
        let Some(sku) = probe else {
            report.add(
                Verdict::Fail,
                "scripts",
                format!("{}:{} owns no slot", node.host, node.port),
            );
            return;
        };
        let id = RequestId::parse("stockgate-check".into()).expect("valid id");
        let probe_keys = keys.request_keys(&sku, &id);
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&probe_keys.all()[..]);
        if !matches!(upstream.query(&exists).await, Ok(Value::Int(0))) {
            report.add(
                Verdict::Warn,
                "scripts",
                format!(
                    "probe keys under {} exist; skipped the run on {}:{}",
                    String::from_utf8_lossy(&probe_keys.stock),
                    node.host,
                    node.port
                ),
            );
            continue;
        }
        let run = upstream
            .eval(
                &scripts.deduct,
                &probe_keys.all(),
                &[
                    b"1",
                    b"",
                    // The settings (lua/deduct.lua ARGV[3]): window, max
                    // qty, missing-stock mode, flags.
                    format!("86400000 1000000 {} 00", MissingStock::Error.as_arg()).as_bytes(),
                    // The call's nonce.
                    b"c4ec4",
                ],
            )
            .await;
        match run {
            Err(err) if err.kind == FaultKind::UnknownSku => {}
            other => {
                report.add(
                    Verdict::Fail,
                    "scripts",
                    format!(
                        "{}:{}: a probe DEDUCT answered {other:?}, expected UNKNOWNSKU",
                        node.host, node.port
                    ),
                );
                return;
            }
        }
    }
    report.add(
        Verdict::Pass,
        "scripts",
        format!(
            "{} scripts load and DEDUCT runs on every primary (a probe without stock, nothing written); called with {calling}",
            scripts.all().len()
        ),
    );
}

async fn slot_owners(upstream: &Upstream, mode: Mode) -> Result<Vec<(u16, u16, Node)>, String> {
    if mode == Mode::Standalone {
        return Ok(Vec::new());
    }
    upstream.slot_owners().await.map_err(|e| e.detail)
}

/// Both key shapes hash to one slot, by stockgate's CRC16 and by Redis's.
async fn key_slots(upstream: &Upstream, keys: &KeyLayout, mode: Mode, report: &mut Report) {
    let sku = Sku::parse("SKU-10086".into()).expect("valid sku");
    let id = RequestId::parse("order-20261129-001".into()).expect("valid id");
    let both = keys.request_keys(&sku, &id);
    let ours = (slot(&both.stock), slot(&both.record));
    if ours.0 != ours.1 {
        report.add(
            Verdict::Fail,
            "key slots",
            "stock key and record hash to different slots",
        );
        return;
    }
    if mode == Mode::Cluster {
        let keyslot = |key: Vec<u8>| async move {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("KEYSLOT").arg(key);
            match upstream.query(&cmd).await {
                Ok(Value::Int(s)) => Some(s as u16),
                _ => None,
            }
        };
        let theirs = (
            keyslot(both.stock.clone()).await,
            keyslot(both.record.clone()).await,
        );
        if theirs != (Some(ours.0), Some(ours.1)) {
            report.add(
                Verdict::Fail,
                "key slots",
                format!("Redis puts them in slots {theirs:?}, stockgate in {ours:?}"),
            );
            return;
        }
    }
    report.add(
        Verdict::Pass,
        "key slots",
        format!(
            "{} and {} share slot {}",
            String::from_utf8_lossy(&both.stock),
            String::from_utf8_lossy(&both.record),
            ours.0
        ),
    );
}

async fn eviction(upstream: &Upstream, nodes: &[Node], report: &mut Report) {
    let mut risky = Vec::new();
    let mut unknown = Vec::new();
    for node in nodes {
        match upstream.eviction(node).await {
            Ok(Eviction::Safe(_)) => {}
            Ok(Eviction::Risky(policy)) => {
                risky.push(format!("{}:{} uses {policy}", node.host, node.port))
            }
            Err(err) => unknown.push(format!("{}:{}: {}", node.host, node.port, err.detail)),
        }
    }
    if !risky.is_empty() {
        report.add(
            Verdict::Fail,
            "eviction",
            format!(
                "{}. Use maxmemory-policy noeviction: volatile-* policies evict exactly the idempotency records \
                 (the only keys with a TTL), so a retry deducts again; allkeys-* can evict stock itself",
                risky.join("; ")
            ),
        );
    } else if !unknown.is_empty() {
        report.add(
            Verdict::Warn,
            "eviction",
            format!(
                "cannot read CONFIG ({}); make sure maxmemory-policy is noeviction",
                unknown.join("; ")
            ),
        );
    } else {
        report.add(
            Verdict::Pass,
            "eviction",
            "noeviction (or no memory limit) on every primary",
        );
    }
}

/// A failed primary's slots answer errors for about cluster-node-timeout,
/// until a replica is promoted. A request waits at most --timeout.
async fn node_timeout(upstream: &Upstream, node: &Node, timeout: Duration, report: &mut Report) {
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("cluster-node-timeout");
    let value = match upstream.query_node(&get, node).await {
        Ok(Value::Array(items)) => items.into_iter().nth(1).and_then(text),
        Ok(Value::Map(pairs)) => pairs.into_iter().next().and_then(|(_, v)| text(v)),
        _ => None,
    };
    let Some(node_timeout) = value.and_then(|v| v.parse::<u64>().ok()) else {
        report.add(
            Verdict::Warn,
            "node timeout",
            "cannot read cluster-node-timeout",
        );
        return;
    };
    let ms = timeout.as_millis() as u64;
    if ms < node_timeout {
        report.add(
            Verdict::Warn,
            "node timeout",
            format!(
                "cluster-node-timeout is {node_timeout} ms and --timeout {ms} ms: while a failed primary is \
                 being replaced (about cluster-node-timeout), requests for its slots get UPSTREAM errors \
                 and callers must retry with the same request_id (safe)"
            ),
        );
    } else {
        report.add(
            Verdict::Pass,
            "node timeout",
            format!("--timeout {ms} ms covers cluster-node-timeout {node_timeout} ms: requests can wait through a failover"),
        );
    }
}

/// How old the oldest journal entry the sink has not moved yet may get
/// before `check` warns (the sink's own alert waits 5 minutes too).
const JOURNAL_BEHIND: Duration = Duration::from_secs(300);

/// The journals' backlog: how many entries wait in Redis for
/// the sink, and how old the oldest is. Nothing trims a journal but the
/// sink, so a sink that is down or behind shows here as well as in its own
/// lag metrics. Read as the sink reads them ([`crate::journal::stream`]):
/// through each sweep shard's set of journals, no scan.
async fn journal_backlog(upstream: &Upstream, keys: &KeyLayout, report: &mut Report) {
    use crate::journal::stream;
    let listed = match stream::all_listed(upstream, keys).await {
        Ok(listed) => listed,
        Err(fault) => {
            report.add(
                Verdict::Warn,
                "journal",
                format!("cannot read the set of journals: {fault}"),
            );
            return;
        }
    };
    let mut entries = 0u64;
    let mut oldest: Option<u64> = None;
    for name in &listed {
        let Ok(sku) = stream::sku(name) else {
            continue;
        };
        if let Ok(read) = stream::read(upstream, keys, &sku, None, 1).await {
            entries += read.length;
            if let Some(first) = read.entries.first() {
                oldest = Some(oldest.map_or(first.time_ms, |o| o.min(first.time_ms)));
            }
        }
    }
    if listed.is_empty() {
        report.add(
            Verdict::Pass,
            "journal",
            "no SKU has a journal (--journal is off, or nothing changed since it was turned on)",
        );
        return;
    }
    let age = match (oldest, upstream.query(&redis::cmd("TIME")).await) {
        (Some(ms), Ok(Value::Array(time))) => time
            .first()
            .cloned()
            .and_then(text)
            .and_then(|s| s.parse::<u64>().ok())
            .map(|secs| Duration::from_millis((secs * 1000).saturating_sub(ms))),
        _ => None,
    };
    let detail = format!(
        "{} SKUs with a journal; {entries} entries not moved by the sink yet{}",
        listed.len(),
        age.map_or(String::new(), |age| format!(
            ", the oldest {} s old",
            age.as_secs()
        ))
    );
    if age.is_some_and(|age| age > JOURNAL_BEHIND) {
        report.add(
            Verdict::Warn,
            "journal",
            format!(
                "{detail}: the sink is behind or not running (nothing else trims a journal; docs/books.md)"
            ),
        );
    } else {
        report.add(Verdict::Pass, "journal", detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_is_named_by_its_own_info_fields() {
        // INFO server as Valkey 8.0.1 and Redis 7.0.15 answer it (abridged).
        let valkey = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.0.1\r\nredis_git_sha1:00000000\r\n";
        let redis = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        let id = ServerIdentity::from_info(valkey);
        assert_eq!(id.to_string(), "valkey 8.0.1");
        assert_eq!(id.redis_version, "7.2.4");
        assert!(id.has_script_flags());
        let id = ServerIdentity::from_info(redis);
        assert_eq!(id.to_string(), "redis 7.0.15");
        assert!(id.has_script_flags());
        let old = ServerIdentity::from_info("redis_version:6.2.14\r\n");
        assert_eq!(old.to_string(), "redis 6.2.14");
        assert!(!old.has_script_flags());
        // A server that names itself but has no <name>_version field.
        let other = ServerIdentity::from_info("redis_version:7.2.0\r\nserver_name:acme\r\n");
        assert_eq!(other.to_string(), "acme 7.2.0");
        assert_eq!(
            ServerIdentity::from_info("").to_string(),
            "redis unknown",
            "no INFO fields: unknown, and failed as too old"
        );
        assert!(!ServerIdentity::from_info("").has_script_flags());
    }
}
