//! The invariant checker: drives load through stockgate while a fault is
//! injected, records every request and every reply, then audits the
//! history against what Redis holds at the end (read directly, not through
//! stockgate), in the manner of a Jepsen checker.
//!
//! # The load
//!
//! `clients` tasks, each with its own connection to stockgate and a
//! response timeout well above stockgate's `--timeout`, work through
//! *chains* until stopped. A chain is one request_id on a random sku:
//!
//! - usually DEDUCT (random qty 1..=5), sometimes re-sent once more as a
//!   duplicate, sometimes then REVERTed (itself sometimes re-sent), and
//!   sometimes a late DEDUCT of the same id after its REVERT (the "hanging"
//!   hazard, which must get code 4);
//! - sometimes a REVERT of an id never deducted (empty rollback: code 4),
//!   then a late DEDUCT of it (code 4).
//!
//! Every step retries on an error with the **same** request_id and a
//! bounded backoff, as the README tells callers to, until it gets a
//! business code. After [`Load::stop`], steps still retrying get
//! [`Workload::settle_within`] more to settle.
//!
//! Stock is seeded far above what the load can take and every parameter
//! is valid, so codes 2 (insufficient) and 3 (invalid) can only mean a fault
//! leaked through as a business answer.
//!
//! # The audit
//!
//! - **Conservation**: per sku, initial − final = Σ qty of the records in
//!   state DEDUCTED (REVERTED and REVOKED count zero).
//! - **Agreement**: each record agrees with the replies its request_id got
//!   (state, qty, order_no); code 0 is answered at most once per id and
//!   operation; a code 1 or 4 has an earlier attempt that explains it.
//! - **No negative stock**, and every record has a TTL.
//! - **No business code for a fault**: any 2 or 3 is a violation.
//! - **Bounded unknown outcomes**: every reply is a code or an `UPSTREAM` /
//!   `BADREPLY` error within the client's timeout (a client timeout is a
//!   hang), and every request_id ends in a definite state.
//! - No record exists that the load did not cause, and none lives on a node
//!   that does not own its slot.
//!
//! Acknowledged writes lost by an asynchronous failover are counted
//! ([`Audit::lost_acks`]); they are violations unless the test allows them
//! ([`Policy::allow_lost_acks`]), since Redis Cluster may lose them by design.

use redis::Value;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stockgate::dev::LocalCluster;
use tokio_util::sync::CancellationToken;

/// What the load does, and how hard.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Names the skus (`<name>-<i>`) and request_ids, and the report line.
    pub name: String,
    pub skus: Vec<String>,
    /// Every sku's stock before the load: far above what it can deduct.
    pub initial_stock: i64,
    pub clients: usize,
    /// The client's response timeout: above stockgate's `--timeout`, so
    /// stockgate always answers first; a timeout here is a hang.
    pub client_timeout: Duration,
    /// After [`Load::stop`], how long unsettled steps keep retrying.
    pub settle_within: Duration,
    /// A pause between chains on each client, so the load leaves CPU for
    /// Redis's failure detector on a 2-core machine.
    pub think: Duration,
    /// Chances, in percent.
    pub duplicate_pct: u64,
    pub revert_pct: u64,
    pub empty_revert_pct: u64,
    pub late_deduct_pct: u64,
    pub seed: u64,
}

impl Workload {
    /// The default mix over `skus`, for a stockgate whose `--timeout` is
    /// `timeout`.
    pub fn new(name: &str, skus: Vec<String>, timeout: Duration) -> Workload {
        let seed = std::env::var("STOCKGATE_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        Workload {
            name: name.to_owned(),
            skus,
            initial_stock: 1_000_000_000,
            clients: 24,
            client_timeout: crate::harness::no_hang_bound(timeout),
            settle_within: Duration::from_secs(30),
            think: Duration::from_millis(4),
            duplicate_pct: 15,
            revert_pct: 15,
            empty_revert_pct: 4,
            late_deduct_pct: 30,
            seed,
        }
    }

    /// Seeds every sku's stock in the cluster.
    pub fn seed(&self, cluster: &LocalCluster) {
        crate::harness::seed(cluster, &self.skus, self.initial_stock);
    }

    /// Starts the clients against stockgate at `addr`.
    pub async fn start(&self, addr: SocketAddr) -> Load {
        let stop = CancellationToken::new();
        let give_up = Arc::new(std::sync::OnceLock::new());
        let started = Instant::now();
        let mut tasks = Vec::new();
        for client in 0..self.clients {
            let conn = connect(addr, self.client_timeout).await;
            let worker = Client {
                client,
                addr,
                conn,
                rng: Rng::new(self.seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                workload: self.clone(),
                stop: stop.clone(),
                give_up: give_up.clone(),
                attempts: Vec::new(),
                unsettled: Vec::new(),
            };
            tasks.push(tokio::spawn(worker.run()));
        }
        eprintln!(
            "[{}] load: {} clients over {} skus, seed {} (STOCKGATE_FAULT_SEED to replay)",
            self.name,
            self.clients,
            self.skus.len(),
            self.seed
        );
        Load {
            workload: self.clone(),
            stop,
            give_up,
            started,
            tasks,
        }
    }
}

/// The running load.
pub struct Load {
    workload: Workload,
    stop: CancellationToken,
    give_up: Arc<std::sync::OnceLock<Instant>>,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<ClientLog>>,
}

impl Load {
    /// Stops starting new chains, lets the steps in progress settle (within
    /// `settle_within`), and returns the whole history.
    pub async fn stop(self) -> History {
        let _ = self
            .give_up
            .set(Instant::now() + self.workload.settle_within);
        self.stop.cancel();
        let mut attempts = Vec::new();
        let mut unsettled = Vec::new();
        for task in self.tasks {
            let log = task.await.expect("client task");
            attempts.extend(log.attempts);
            unsettled.extend(log.unsettled);
        }
        attempts.sort_by_key(|a| a.started);
        History {
            workload: self.workload,
            started: self.started,
            attempts,
            unsettled,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Deduct,
    Revert,
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A business code.
    Code {
        code: i64,
        remain: i64,
        order_no: String,
    },
    /// An error reply: its first word (`UPSTREAM`, `BADREPLY`, ...) and text.
    Fault { word: String, text: String },
    /// The client's own timeout fired: stockgate did not answer in time.
    ClientTimeout,
    /// The connection to stockgate failed.
    ClientIo(String),
    /// A reply that is neither a code array nor an error.
    Malformed(String),
}

impl Outcome {
    pub fn is_code(&self) -> bool {
        matches!(self, Outcome::Code { .. })
    }

    pub fn code(&self) -> Option<i64> {
        match self {
            Outcome::Code { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A short label for the summary: `code 0`, `timeout`, `cluster`, ...
    pub fn label(&self) -> String {
        match self {
            Outcome::Code { code, .. } => format!("code {code}"),
            Outcome::Fault { word, text } => fault_kind(word, text).to_owned(),
            Outcome::ClientTimeout => "CLIENT TIMEOUT".into(),
            Outcome::ClientIo(_) => "CLIENT IO".into(),
            Outcome::Malformed(_) => "MALFORMED".into(),
        }
    }
}

/// The kind of an error reply, from stockgate's wording.
pub fn fault_kind(word: &str, text: &str) -> &'static str {
    let text = text.to_ascii_lowercase();
    let has = |s: &str| text.contains(s);
    match word {
        "UPSTREAM" if has("not connected") => "not_ready",
        "UPSTREAM" if has("no reply from redis within") || has("timed out") => "timeout",
        "UPSTREAM" if has("busy") => "busy",
        "UPSTREAM" if has("out of memory") => "oom",
        "UPSTREAM" if has("not replicated") => "not_replicated",
        "UPSTREAM" if has("unreachable") => "connection",
        "UPSTREAM" if has("tryagain") => "tryagain",
        "UPSTREAM" if has("clusterdown") || has("cluster is down") => "clusterdown",
        "UPSTREAM" if has("moved") || has("ask") => "redirect",
        "UPSTREAM" if has("readonly") => "readonly",
        "UPSTREAM" => "upstream_other",
        "BADREPLY" => "badreply",
        _ => "UNDOCUMENTED",
    }
}

/// One request sent, and what came back.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub client: usize,
    pub op: Op,
    pub sku: usize,
    pub id: Arc<str>,
    pub qty: u32,
    /// Retries of this step before this attempt (0: the first send).
    pub retry: u32,
    pub started: Instant,
    pub took: Duration,
    pub outcome: Outcome,
}

impl Attempt {
    pub fn ended(&self) -> Instant {
        self.started + self.took
    }
}

/// A step that never got a business code.
#[derive(Debug, Clone)]
pub struct Unsettled {
    pub op: Op,
    pub sku: usize,
    pub id: Arc<str>,
}

struct ClientLog {
    attempts: Vec<Attempt>,
    unsettled: Vec<Unsettled>,
}

type Conn = redis::aio::MultiplexedConnection;

async fn connect(addr: SocketAddr, timeout: Duration) -> Conn {
    try_connect(addr, timeout)
        .await
        .expect("connects to stockgate")
}

async fn try_connect(addr: SocketAddr, timeout: Duration) -> Option<Conn> {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(timeout))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(format!("redis://{addr}"))
        .ok()?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .ok()
}

struct Client {
    client: usize,
    addr: SocketAddr,
    conn: Conn,
    rng: Rng,
    workload: Workload,
    stop: CancellationToken,
    give_up: Arc<std::sync::OnceLock<Instant>>,
    attempts: Vec<Attempt>,
    unsettled: Vec<Unsettled>,
}

impl Client {
    async fn run(mut self) -> ClientLog {
        let mut n = 0u64;
        while !self.stop.is_cancelled() {
            n += 1;
            let id: Arc<str> = format!("{}-c{}-{n}", self.workload.name, self.client).into();
            let sku = self.rng.below(self.workload.skus.len() as u64) as usize;
            let qty = 1 + self.rng.below(5) as u32;
            let w = self.workload.clone();
            if self.rng.pct(w.empty_revert_pct) {
                // Empty rollback, then the hanging DEDUCT.
                if self.step(Op::Revert, sku, &id, qty).await && self.rng.pct(w.late_deduct_pct * 2)
                {
                    self.step(Op::Deduct, sku, &id, qty).await;
                }
            } else if self.step(Op::Deduct, sku, &id, qty).await {
                if self.rng.pct(w.duplicate_pct) {
                    self.step(Op::Deduct, sku, &id, qty).await;
                }
                if self.rng.pct(w.revert_pct) && self.step(Op::Revert, sku, &id, qty).await {
                    if self.rng.pct(w.duplicate_pct) {
                        self.step(Op::Revert, sku, &id, qty).await;
                    }
                    if self.rng.pct(w.late_deduct_pct) {
                        self.step(Op::Deduct, sku, &id, qty).await;
                    }
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => {}
                _ = tokio::time::sleep(w.think) => {}
            }
        }
        ClientLog {
            attempts: self.attempts,
            unsettled: self.unsettled,
        }
    }

    /// Sends one step until it gets a business code; true if it did.
    async fn step(&mut self, op: Op, sku: usize, id: &Arc<str>, qty: u32) -> bool {
        let mut backoff = Duration::from_millis(10);
        for retry in 0.. {
            let started = Instant::now();
            let outcome = self.send(op, sku, id, qty).await;
            let took = started.elapsed();
            let settled = outcome.is_code();
            let broken = matches!(outcome, Outcome::ClientTimeout | Outcome::ClientIo(_));
            self.attempts.push(Attempt {
                client: self.client,
                op,
                sku,
                id: id.clone(),
                qty,
                retry,
                started,
                took,
                outcome,
            });
            if settled {
                return true;
            }
            if broken {
                // A timed-out or failed multiplexed connection is not
                // reused: the retry goes out on a new one.
                if let Some(conn) = try_connect(self.addr, self.workload.client_timeout).await {
                    self.conn = conn;
                }
            }
            if self.give_up.get().is_some_and(|at| Instant::now() > *at) {
                break;
            }
            tokio::time::sleep(backoff + Duration::from_millis(self.rng.below(10))).await;
            backoff = (backoff * 2).min(Duration::from_millis(250));
        }
        self.unsettled.push(Unsettled {
            op,
            sku,
            id: id.clone(),
        });
        false
    }

    async fn send(&mut self, op: Op, sku: usize, id: &str, qty: u32) -> Outcome {
        let sku = &self.workload.skus[sku];
        let cmd = match op {
            Op::Deduct => {
                let mut cmd = redis::cmd("DEDUCT");
                cmd.arg(sku).arg(qty).arg(id).arg(order_no(id));
                cmd
            }
            Op::Revert => {
                let mut cmd = redis::cmd("REVERT");
                cmd.arg(sku).arg(id);
                cmd
            }
        };
        match cmd.query_async::<Value>(&mut self.conn).await {
            Ok(value) => parse_reply(value),
            Err(err) if err.is_timeout() => Outcome::ClientTimeout,
            Err(err) => match err.code() {
                Some(word) => Outcome::Fault {
                    word: word.to_owned(),
                    text: err.detail().unwrap_or_default().to_owned(),
                },
                None => Outcome::ClientIo(err.to_string()),
            },
        }
    }
}

/// The order_no the load sends with a request_id.
pub fn order_no(id: &str) -> String {
    format!("O-{id}")
}

fn parse_reply(value: Value) -> Outcome {
    let Value::Array(items) = &value else {
        return Outcome::Malformed(format!("{value:?}"));
    };
    match (items.first(), items.get(1), items.get(2), items.get(3)) {
        (
            Some(Value::Int(code)),
            Some(Value::Int(remain)),
            Some(Value::BulkString(order_no)),
            Some(Value::Int(_version)),
        ) => Outcome::Code {
            code: *code,
            remain: *remain,
            order_no: String::from_utf8_lossy(order_no).into_owned(),
        },
        _ => Outcome::Malformed(format!("{value:?}")),
    }
}

/// A small deterministic generator (xorshift64*): tests need no `rand`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// Everything the load sent and got.
pub struct History {
    pub workload: Workload,
    pub started: Instant,
    /// Every attempt, by start time.
    pub attempts: Vec<Attempt>,
    pub unsettled: Vec<Unsettled>,
}

/// Latency figures of a set of attempts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={} p99={} max={}",
            self.count,
            crate::harness::ms(self.p50),
            crate::harness::ms(self.p99),
            crate::harness::ms(self.max)
        )
    }
}

impl History {
    pub fn sku_name(&self, sku: usize) -> &str {
        &self.workload.skus[sku]
    }

    /// The attempts on skus for which `on` holds.
    pub fn on<'a>(
        &'a self,
        on: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Attempt> + 'a {
        self.attempts
            .iter()
            .filter(move |a| on(&self.workload.skus[a.sku]))
    }

    /// The first attempt that got a code and ended at or after `after`.
    pub fn first_code_after<'a>(
        &'a self,
        after: Instant,
        on: impl Fn(&str) -> bool + 'a,
    ) -> Option<&'a Attempt> {
        self.on(on)
            .filter(|a| a.outcome.is_code() && a.ended() >= after)
            .min_by_key(|a| a.ended())
    }

    /// The last attempt that got a code and ended before `before`.
    pub fn last_code_before<'a>(
        &'a self,
        before: Instant,
        on: impl Fn(&str) -> bool + 'a,
    ) -> Option<&'a Attempt> {
        self.on(on)
            .filter(|a| a.outcome.is_code() && a.ended() < before)
            .max_by_key(|a| a.ended())
    }

    /// Latency of the attempts that `keep` selects.
    pub fn latency<'a>(&self, attempts: impl Iterator<Item = &'a Attempt>) -> Latency {
        let mut took: Vec<Duration> = attempts.map(|a| a.took).collect();
        took.sort_unstable();
        let at = |q: f64| {
            took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Latency {
            count: took.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: took.last().copied().unwrap_or_default(),
        }
    }

    /// Counts by outcome label.
    pub fn by_label<'a>(
        &self,
        attempts: impl Iterator<Item = &'a Attempt>,
    ) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for a in attempts {
            *counts.entry(a.outcome.label()).or_default() += 1;
        }
        counts
    }

    /// Each error kind: how many, and when the first and the last ended,
    /// relative to `origin`.
    pub fn error_spans(&self, origin: Instant) -> String {
        let mut spans: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        for a in self.attempts.iter().filter(|a| !a.outcome.is_code()) {
            let at = if a.ended() >= origin {
                (a.ended() - origin).as_secs_f64()
            } else {
                -(origin - a.ended()).as_secs_f64()
            } * 1000.0;
            let span = spans.entry(a.outcome.label()).or_insert((0, at, at));
            span.0 += 1;
            span.1 = span.1.min(at);
            span.2 = span.2.max(at);
        }
        let parts: Vec<String> = spans
            .iter()
            .map(|(k, (n, lo, hi))| format!("{k}={n} [{lo:+.0}..{hi:+.0} ms]"))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// Seconds since the load started, for the reports.
    pub fn at(&self, t: Instant) -> String {
        format!(
            "t+{:.3}s",
            t.saturating_duration_since(self.started).as_secs_f64()
        )
    }

    /// Reads the final state from the cluster and checks every invariant.
    pub fn audit(&self, cluster: &LocalCluster, policy: Policy) -> Audit {
        crate::harness::wait_stable(cluster);
        let state = FinalState::read(cluster, &self.workload);
        audit(self, &state, policy)
    }
}

/// Conservation alone, for skus changed by requests the test did not
/// record (clients that left mid-request): per sku, `initial` − final =
/// Σ qty of DEDUCTED records. The violations, if any.
pub fn conservation(
    cluster: &LocalCluster,
    name: &str,
    skus: &[String],
    initial: i64,
) -> Vec<String> {
    let mut workload = Workload::new(name, skus.to_vec(), crate::harness::TIMEOUT);
    workload.initial_stock = initial;
    let state = FinalState::read(cluster, &workload);
    let mut violations = state.violations.clone();
    for sku in skus {
        let recorded: i64 = state
            .records
            .iter()
            .filter(|((s, _), _)| s == sku)
            .filter_map(|(_, (value, _))| {
                value
                    .strip_prefix("D:")?
                    .split(':')
                    .next()?
                    .parse::<i64>()
                    .ok()
            })
            .sum();
        match state.stock.get(sku) {
            Some(stock) if initial - stock == recorded && *stock >= 0 => {}
            other => violations.push(format!(
                "{sku}: stock {other:?}, DEDUCTED records hold {recorded} of {initial}"
            )),
        }
    }
    violations
}

/// What the audit tolerates.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    /// An acknowledged change missing after a failover (asynchronous
    /// replication) is counted, not failed.
    pub allow_lost_acks: bool,
}

/// What Redis holds at the end, for the load's skus.
struct FinalState {
    stock: HashMap<String, i64>,
    /// (sku, request_id) -> (value, pttl)
    records: HashMap<(String, String), (String, i64)>,
    violations: Vec<String>,
}

impl FinalState {
    /// SCANs every primary for the load's keys and reads each, checking
    /// that each key lives on the primary that owns its slot.
    fn read(cluster: &LocalCluster, workload: &Workload) -> FinalState {
        let mut state = FinalState {
            stock: HashMap::new(),
            records: HashMap::new(),
            violations: Vec::new(),
        };
        let pattern = format!("stock:{{{}-*", workload.name);
        for node in cluster.nodes.iter().filter(|n| n.is_running()) {
            if !crate::harness::is_primary(node) {
                continue;
            }
            let owned = crate::harness::own_slots(node);
            let mut conn = node.connection().expect("primary");
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut conn)
                    .expect("SCAN");
                keys.extend(batch);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            for chunk in keys.chunks(500) {
                let mut pipe = redis::pipe();
                for key in chunk {
                    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
                }
                let values: Vec<Value> = pipe.query(&mut conn).expect("GET/PTTL");
                for (key, pair) in chunk.iter().zip(values.chunks(2)) {
                    let slot = stockgate::keys::slot(key);
                    let key_text = String::from_utf8_lossy(key).into_owned();
                    if !owned.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)) {
                        state.violations.push(format!(
                            "stray key {key_text} on port {} which does not own its slot",
                            node.port
                        ));
                        continue;
                    }
                    let value = match &pair[0] {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    let pttl = match pair[1] {
                        Value::Int(t) => t,
                        _ => -3,
                    };
                    state.add(&key_text, value, pttl);
                }
            }
        }
        state
    }

    fn add(&mut self, key: &str, value: String, pttl: i64) {
        let Some(rest) = key.strip_prefix("stock:{") else {
            self.violations.push(format!("unexpected key {key}"));
            return;
        };
        let Some((sku, tail)) = rest.split_once('}') else {
            self.violations.push(format!("unexpected key {key}"));
            return;
        };
        if tail.is_empty() {
            match value.parse() {
                Ok(stock) => {
                    self.stock.insert(sku.to_owned(), stock);
                }
                Err(_) => self
                    .violations
                    .push(format!("stock of {sku} is not an integer: {value:?}")),
            }
        } else if let Some(id) = tail.strip_prefix(":req:") {
            // Audited without the nonce of the call that wrote it.
            match stockgate::record::Record::parse(&value) {
                Some(record) => {
                    self.records
                        .insert((sku.to_owned(), id.to_owned()), (record.summary(), pttl));
                }
                None => self
                    .violations
                    .push(format!("record {key} has an unknown shape: {value:?}")),
            }
        } else {
            self.violations.push(format!("unexpected key {key}"));
        }
    }
}

/// A request's state, as a record holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    None,
    Deducted,
    Reverted,
    Revoked,
}

impl State {
    fn of_record(value: Option<&str>, qty: u32, order: &str) -> Result<State, String> {
        match value {
            None => Ok(State::None),
            Some(v) if v == format!("D:{qty}:{order}") => Ok(State::Deducted),
            Some(v) if v == format!("R:{qty}:{order}") => Ok(State::Reverted),
            Some("V:0:") => Ok(State::Revoked),
            Some(v) => Err(format!(
                "record {v:?} does not match qty {qty}, order_no {order}"
            )),
        }
    }

    /// How far along the state machine (none → DEDUCTED → REVERTED; none →
    /// REVOKED): a record "behind" a state the replies allow lost an
    /// acknowledged write. (After a DEDUCT 4, say, the replies allow REVERTED
    /// or REVOKED; a DEDUCTED record is behind the first: the REVERT was
    /// acknowledged, then lost.)
    fn is_behind(self, expected: &[State]) -> bool {
        expected.iter().any(|e| {
            matches!(
                (self, e),
                (
                    State::None,
                    State::Deducted | State::Reverted | State::Revoked
                ) | (State::Deducted, State::Reverted)
            )
        })
    }
}

/// The audit's findings.
pub struct Audit {
    pub name: String,
    pub violations: Vec<String>,
    /// Acknowledged changes missing from the final state (or re-applied
    /// after they went missing).
    pub lost_acks: usize,
    pub requests: usize,
    pub ids: usize,
    pub retries: usize,
    pub by_label: BTreeMap<String, usize>,
    /// Σ qty of the ids the replies say are deducted now.
    pub units_acked: i64,
    /// Σ (initial − final) over the skus.
    pub units_taken: i64,
    /// Σ qty of DEDUCTED records.
    pub units_recorded: i64,
    pub unsettled: usize,
    /// One error text per kind, for the report.
    pub samples: BTreeMap<String, String>,
}

impl Audit {
    /// The one-line summary.
    pub fn summary(&self) -> String {
        let errors: Vec<String> = self
            .by_label
            .iter()
            .filter(|(k, _)| !k.starts_with("code"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let codes: Vec<String> = self
            .by_label
            .iter()
            .filter(|(k, _)| k.starts_with("code"))
            .map(|(k, v)| format!("{}={v}", k.trim_start_matches("code ")))
            .collect();
        format!(
            "[{}] requests={} ids={} retries={} codes{{{}}} errors{{{}}} unsettled={} units deducted={} accounted={} recorded={} lost_acks={} violations={}",
            self.name,
            self.requests,
            self.ids,
            self.retries,
            codes.join(","),
            errors.join(","),
            self.unsettled,
            self.units_acked,
            self.units_taken,
            self.units_recorded,
            self.lost_acks,
            self.violations.len()
        )
    }

    /// Prints the summary and fails the test on any violation.
    pub fn assert_green(&self) {
        eprintln!("{}", self.summary());
        for (kind, text) in &self.samples {
            eprintln!("[{}]   {kind}: {text}", self.name);
        }
        if !self.violations.is_empty() {
            let shown: Vec<&String> = self.violations.iter().take(25).collect();
            panic!(
                "[{}] {} invariant violations, first ones:\n  {}",
                self.name,
                self.violations.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
        }
    }
}

fn audit(history: &History, state: &FinalState, policy: Policy) -> Audit {
    let w = &history.workload;
    let mut violations = state.violations.clone();
    let mut lost_acks = 0;
    let bound = w.client_timeout;

    // Every reply: a valid code or a documented error, in time.
    for a in &history.attempts {
        let what = || {
            format!(
                "{:?} {} {} (client {}, retry {}) at {}",
                a.op,
                w.skus[a.sku],
                a.id,
                a.client,
                a.retry,
                history.at(a.started)
            )
        };
        match &a.outcome {
            Outcome::Code { code, remain, .. } => {
                if !(0..=4).contains(code) || *code == 2 || *code == 3 {
                    violations.push(format!(
                        "{} got business code {code} during a fault",
                        what()
                    ));
                }
                if *remain < 0 {
                    violations.push(format!("{} reports negative remain {remain}", what()));
                }
            }
            Outcome::Fault { word, text } => {
                if fault_kind(word, text) == "UNDOCUMENTED" {
                    violations.push(format!(
                        "{} got an undocumented error: {word} {text}",
                        what()
                    ));
                } else if a.took > bound {
                    violations.push(format!("{} error after {:?}", what(), a.took));
                }
            }
            Outcome::ClientTimeout => violations.push(format!(
                "{} hung: no reply within the client's {:?}",
                what(),
                bound
            )),
            Outcome::ClientIo(e) => {
                violations.push(format!("{} lost its connection to stockgate: {e}", what()))
            }
            Outcome::Malformed(v) => violations.push(format!("{} malformed reply {v}", what())),
        }
    }
    for u in &history.unsettled {
        violations.push(format!(
            "{:?} {} {} never got a business code (outcome left unknown)",
            u.op, w.skus[u.sku], u.id
        ));
    }

    // Per request_id: replies agree with each other and with the record.
    let mut by_id: HashMap<&str, Vec<&Attempt>> = HashMap::new();
    for a in &history.attempts {
        by_id.entry(&a.id).or_default().push(a);
    }
    let mut units_acked = 0i64;
    let mut units_recorded_by_sku: HashMap<&str, i64> = HashMap::new();
    for (id, attempts) in &by_id {
        let sku = w.skus[attempts[0].sku].as_str();
        let qty = attempts[0].qty;
        let order = order_no(id);
        let mut sent_deduct = false;
        let mut sent_revert = false;
        let mut deduct_acked = false;
        let mut revert_zero = false;
        let mut expected: Option<Vec<State>> = None;
        let mut lost_here = false;
        for a in attempts {
            let tag = || format!("{:?} {sku} {id} at {}", a.op, history.at(a.started));
            if let Outcome::Code {
                code, order_no: o, ..
            } = &a.outcome
            {
                match (a.op, code) {
                    (Op::Deduct, 0) => {
                        if deduct_acked || revert_zero || sent_revert {
                            // Acked before (or reverted), and now deducted
                            // again: only possible if the earlier ack was lost.
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} deducted again (code 0) after an earlier ack or revert",
                                    tag()
                                ));
                            }
                        }
                        if o != &order {
                            violations.push(format!("{} code 0 with order_no {o:?}", tag()));
                        }
                        deduct_acked = true;
                        expected = Some(vec![State::Deducted]);
                    }
                    (Op::Deduct, 1) => {
                        if !sent_deduct {
                            violations
                                .push(format!("{} code 1 for an id never sent before", tag()));
                        }
                        if o != &order {
                            violations.push(format!("{} code 1 with order_no {o:?}", tag()));
                        }
                        if revert_zero || expected.as_deref() == Some(&[State::Revoked]) {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} code 1 (deducted) after its revert was acknowledged",
                                    tag()
                                ));
                            }
                        }
                        deduct_acked = true;
                        expected = Some(vec![State::Deducted]);
                    }
                    (Op::Deduct, 4) => {
                        if !sent_revert {
                            violations
                                .push(format!("{} code 4 but no REVERT was ever sent", tag()));
                        }
                        expected = Some(vec![State::Reverted, State::Revoked]);
                    }
                    (Op::Revert, 0) => {
                        if !sent_deduct {
                            violations.push(format!("{} gave back a deduction never sent", tag()));
                        }
                        if revert_zero {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations
                                    .push(format!("{} gave back twice (code 0 again)", tag()));
                            }
                        }
                        if o != &order {
                            violations.push(format!("{} REVERT 0 with order_no {o:?}", tag()));
                        }
                        revert_zero = true;
                        expected = Some(vec![State::Reverted]);
                    }
                    (Op::Revert, 1) => {
                        if !sent_revert {
                            violations
                                .push(format!("{} code 1 for a REVERT never sent before", tag()));
                        }
                        expected = Some(vec![State::Reverted, State::Revoked]);
                    }
                    (Op::Revert, 4) => {
                        if deduct_acked {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} found nothing to give back after the DEDUCT was acknowledged",
                                    tag()
                                ));
                            }
                        }
                        expected = Some(vec![State::Revoked]);
                    }
                    _ => {} // 2, 3 and others: reported above
                }
            }
            match a.op {
                Op::Deduct => sent_deduct = true,
                Op::Revert => sent_revert = true,
            }
        }
        let record = state.records.get(&(sku.to_owned(), id.to_string()));
        let actual = match State::of_record(record.map(|(v, _)| v.as_str()), qty, &order) {
            Ok(s) => s,
            Err(e) => {
                violations.push(format!("{sku} {id}: {e}"));
                continue;
            }
        };
        if let Some((_, pttl)) = record
            && *pttl <= 0
        {
            violations.push(format!("{sku} {id}: record without a TTL (PTTL {pttl})"));
        }
        if actual == State::Deducted {
            *units_recorded_by_sku.entry(sku).or_default() += qty as i64;
        }
        match &expected {
            Some(exp) if exp.contains(&actual) => {}
            Some(exp) => {
                if actual.is_behind(exp) {
                    lost_here = true;
                    if !policy.allow_lost_acks {
                        violations.push(format!(
                            "{sku} {id}: replies say {exp:?}, Redis holds {actual:?} (acknowledged change lost)"
                        ));
                    }
                } else {
                    violations.push(format!(
                        "{sku} {id}: replies say {exp:?}, Redis holds {actual:?}"
                    ));
                }
            }
            // Never settled (reported above): any state a send could cause.
            None => {
                if !(actual == State::None
                    || (actual == State::Deducted && sent_deduct)
                    || (actual == State::Revoked && sent_revert))
                {
                    violations.push(format!("{sku} {id}: unsettled, yet Redis holds {actual:?}"));
                }
            }
        }
        if expected.as_deref() == Some(&[State::Deducted]) {
            units_acked += qty as i64;
        }
        if lost_here {
            lost_acks += 1;
        }
    }

    // Records nobody asked for.
    for (sku, id) in state.records.keys() {
        if !by_id.contains_key(id.as_str()) {
            violations.push(format!("{sku} {id}: a record for a request_id never sent"));
        }
    }

    // Conservation and no negative stock, per sku.
    let mut units_taken = 0;
    let mut units_recorded = 0;
    for sku in &w.skus {
        let Some(&final_stock) = state.stock.get(sku) else {
            violations.push(format!("{sku}: stock key missing at the end"));
            continue;
        };
        if final_stock < 0 {
            violations.push(format!("{sku}: negative stock {final_stock}"));
        }
        let taken = w.initial_stock - final_stock;
        let recorded = units_recorded_by_sku
            .get(sku.as_str())
            .copied()
            .unwrap_or(0);
        if taken != recorded {
            violations.push(format!(
                "{sku}: conservation broken: stock went down by {taken}, DEDUCTED records hold {recorded}"
            ));
        }
        units_taken += taken;
        units_recorded += recorded;
    }

    Audit {
        name: w.name.clone(),
        violations,
        lost_acks,
        requests: history.attempts.len(),
        ids: by_id.len(),
        retries: history.attempts.iter().filter(|a| a.retry > 0).count(),
        by_label: history.by_label(history.attempts.iter()),
        units_acked,
        units_taken,
        units_recorded,
        unsettled: history.unsettled.len(),
        samples: history
            .attempts
            .iter()
            .filter_map(|a| match &a.outcome {
                Outcome::Fault { word, text } => {
                    Some((a.outcome.label(), format!("-{word} {text}")))
                }
                _ => None,
            })
            .collect(),
    }
}
