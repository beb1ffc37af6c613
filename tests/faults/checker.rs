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
//!   then a late DEDUCT of it (code 4);
//! - with [`Workload::hold_pct`], sometimes a HOLD instead (random qty; a
//!   long ttl, or a short one of 1–3 s so that some run out during the
//!   load), sometimes re-sent as a duplicate, then a CONFIRM (sometimes
//!   REVERTed after it: a refund), a REVERT (a cancel), or nothing (it
//!   expires). After a short hold the next step waits until half a second
//!   either side of its expiry, so CONFIRMs and REVERTs race it: a CONFIRM
//!   may answer 0 or 5, a REVERT 0 or 1.
//! - with [`Workload::order_pct`], sometimes an order of 2–4 lines over
//!   distinct skus (so different slots): an ORDER (sometimes re-sent: 1;
//!   sometimes ORDER.REVERTed after: 0, re-sent: 1, then perhaps a late
//!   ORDER: 4), an ORDER.REVERT of an order never seen (4) then perhaps
//!   its late ORDER (4), or an ORDER.HOLD (mostly 1–3 s) then its
//!   ORDER.CONFIRM around the expiry (0 or 5) or nothing (it expires).
//!
//! Every step retries on an error with the **same** request_id and a
//! bounded backoff, as the README tells callers to, until it gets a
//! business code. After [`Load::stop`], steps still retrying get
//! [`Workload::settle_within`] more to settle.
//!
//! But with [`Workload::unretried_pct`], some order chains have a caller
//! that never retries: when one of their ORDER, ORDER.HOLD, ORDER.CONFIRM
//! or ORDER.REVERT attempts ends in an error (an `UPSTREAM` or `BADREPLY`
//! reply, a client timeout), the chain stops there. It never sends that
//! order again, nor any step after it, and the order is *left after an
//! error* ([`Left`]): stockgate alone must end it.
//!
//! Stock is seeded far above what the load can take and every parameter
//! is valid, so codes 2 (insufficient) and 3 (invalid) can only mean a fault
//! leaked through as a business answer.
//!
//! # The audit
//!
//! - **Conservation**: per sku, initial − final = Σ qty of the records in
//!   state DEDUCTED, CONFIRMED and HELD (REVERTED, REVOKED and EXPIRED
//!   count zero); the sku's `:held` counter is Σ qty of its HELD records,
//!   and its `:holds` set names exactly those, each at its record's expiry
//!   (no hold counted twice, none lost). A hold whose expiry passed but
//!   that nothing released yet is still HELD in all three: the equation is
//!   exact at any instant, sweeper or not.
//! - **Agreement**: each record agrees with the replies its request_id got
//!   (state, qty, order_no); code 0 is answered at most once per id and
//!   operation; a code 1 or 4 has an earlier attempt that explains it. A
//!   hold's replies are checked against its state machine (lua/revert.lua):
//!   each code must follow from the states the earlier replies leave
//!   possible, counting expiry (HELD → EXPIRED at any time) and any
//!   unanswered attempt as things that may have happened meanwhile. So a
//!   HOLD answered 0 ends HELD, CONFIRMED, EXPIRED or REVERTED; a CONFIRM
//!   answered 0 ends CONFIRMED (REVERTED if reverted later); one answered 5
//!   ends EXPIRED; every hold reply's `expires_at` is the record's.
//! - **No negative stock**, and every record has a TTL but the HELD ones,
//!   which have none (a hold's units are in its record).
//! - **No business code for a fault**: any 2 or 3 is a violation (the load
//!   never mixes a DEDUCT and a HOLD under one id, the one legitimate 3 of
//!   the holds' state machine), and so is a 5 for a DEDUCT or a REVERT.
//! - **Bounded unknown outcomes**: every reply is a code or an `UPSTREAM` /
//!   `BADREPLY` error within the client's timeout (a client timeout is a
//!   hang), and every request_id ends in a definite state.
//! - **Orders, all or nothing**: an order's lines are records of
//!   `~ord:<request_id>` on their skus, counted in the books like holds
//!   (HELD and CONFIRMED keep units out, the rest count zero). Every line
//!   is applied (all CONFIRMED, or all HELD by a live order hold) or none
//!   is (REVERTED, REVOKED, EXPIRED, absent, or HELD past its expiry on its
//!   way back); the intent record (`stock:{order:<id>}:intent`, read
//!   through the cluster) rests in a final phase that says the same as the
//!   lines (DONE, HELD, ABORTED / REVERTED / REVOKED) and names the lines
//!   sent; and the order's last answer agrees (0/1 → applied unless
//!   ORDER.REVERTed after; 2, 4, 5 → none), each code explained by the
//!   steps before it.
//! - **Orders end on their own**: an order left after an error had an
//!   attempt whose outcome is unknown, so it may have ended applied or
//!   not, but it must have ended, with no caller: once stockgate's
//!   recovery had its time (the audit waits for it, [`History::audit`]),
//!   its intent rests in a final phase (DONE, ABORTED, REVERTED, REVOKED,
//!   or HELD for an ORDER.HOLD, its lines held until they run out), its
//!   lines agree with it, and the books are exact; or it has no intent at
//!   all (its first command failed before the begin), and then no line
//!   holds or took units. An intent still HOLDING, CONFIRMING, ABORTING or
//!   REVERTING is a violation whatever the policy.
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
    /// stockgate's `--timeout`: how long recovery may take follows from it.
    pub timeout: Duration,
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
    /// Chains that are holds rather than DEDUCTs (0: none, the default).
    pub hold_pct: u64,
    /// Of the holds: short ones (1–3 s, most expire during the load),
    /// CONFIRMed ones and REVERTed ones (the rest are left to expire).
    pub short_hold_pct: u64,
    pub confirm_pct: u64,
    pub cancel_pct: u64,
    /// The ttl of the other holds: longer than any test, so they are still
    /// HELD at the audit.
    pub long_hold: Duration,
    /// Chains that are orders of 2–4 lines (0: none, the default).
    pub order_pct: u64,
    /// Of the orders: ORDER.HOLDs (most short, 1–3 s) rather than ORDERs.
    pub order_hold_pct: u64,
    /// Of the order chains: those whose caller never retries, so that an
    /// error leaves the order to stockgate's recovery (module doc).
    pub unretried_pct: u64,
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
            timeout,
            client_timeout: crate::harness::no_hang_bound(timeout),
            settle_within: Duration::from_secs(30),
            think: Duration::from_millis(4),
            duplicate_pct: 15,
            revert_pct: 15,
            empty_revert_pct: 4,
            late_deduct_pct: 30,
            hold_pct: 0,
            short_hold_pct: 35,
            confirm_pct: 40,
            cancel_pct: 25,
            long_hold: Duration::from_secs(600),
            order_pct: 0,
            order_hold_pct: 35,
            unretried_pct: 0,
            seed,
        }
    }

    /// The mix with holds: a quarter of the chains. Off by default so that
    /// the faults whose reports count DEDUCTs keep measuring what they did;
    /// a test turns it on where the audit is the point.
    pub fn with_holds(mut self) -> Workload {
        self.hold_pct = 25;
        self
    }

    /// The mix with orders: a fifth of the chains are ORDERs or
    /// ORDER.HOLDs of 2–4 lines over distinct skus, half of them with a
    /// caller that never retries. Off by default, as holds are.
    pub fn with_orders(mut self) -> Workload {
        self.order_pct = 20;
        self.unretried_pct = 50;
        self
    }

    /// stockgate's `recover_after` (src/stock/order/recovery.rs): how long
    /// after an order's last command recovery takes it for left behind,
    /// its saga's budget of 4 x `--timeout` and a margin of 5 s.
    pub fn recover_after(&self) -> Duration {
        self.timeout * 4 + Duration::from_secs(5)
    }

    /// How much longer than [`Workload::recover_after`] after an order's
    /// last command, or than the fault's healing if that is later,
    /// recovery may take to end it: a sweep pass, a few recoveries that
    /// failed while a fault lasted, and the sweep lease's handover in case
    /// the stockgate that filed the order died. Generous: it bounds a wait
    /// for a state that may never come.
    pub fn recovery_slack(&self) -> Duration {
        use stockgate::stock::{order::recovery::RETRY_AFTER, sweeper};
        sweeper::PASS_EVERY + RETRY_AFTER * 3 + sweeper::LEASE + sweeper::TRY_EVERY
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
        let started_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
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
                left: Vec::new(),
                later: Vec::new(),
                once: false,
                gave_up: false,
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
            started_unix_ms,
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
    started_unix_ms: i64,
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
        let mut left = Vec::new();
        for task in self.tasks {
            let log = task.await.expect("client task");
            attempts.extend(log.attempts);
            unsettled.extend(log.unsettled);
            left.extend(log.left);
        }
        attempts.sort_by_key(|a| a.started);
        left.sort_by_key(|l: &Left| l.at);
        History {
            workload: self.workload,
            started: self.started,
            started_unix_ms: self.started_unix_ms,
            attempts,
            unsettled,
            left,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Deduct,
    Revert,
    Hold,
    Confirm,
    Order,
    OrderHold,
    OrderConfirm,
    OrderRevert,
}

impl Op {
    /// One of the four order commands.
    pub fn is_order(self) -> bool {
        matches!(
            self,
            Op::Order | Op::OrderHold | Op::OrderConfirm | Op::OrderRevert
        )
    }
}

/// An order's lines: (sku index, qty), in the order sent.
pub type Lines = Arc<[(usize, u32)]>;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A business code.
    Code {
        code: i64,
        remain: i64,
        order_no: String,
        /// HOLD's and CONFIRM's 5th element (0 for DEDUCT and REVERT); an
        /// order reply's expires_at_ms.
        expires_at: i64,
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
    /// The sku (an order's: its first line's).
    pub sku: usize,
    /// An order's lines (empty for the single-line operations).
    pub lines: Lines,
    pub id: Arc<str>,
    pub qty: u32,
    /// A HOLD's ttl_ms (0 for the other operations).
    pub ttl_ms: u32,
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

/// An order its caller left after an error, never to send it again.
#[derive(Debug, Clone)]
pub struct Left {
    /// The step whose attempt failed.
    pub op: Op,
    pub id: Arc<str>,
    /// When that attempt ended.
    pub at: Instant,
}

struct ClientLog {
    attempts: Vec<Attempt>,
    unsettled: Vec<Unsettled>,
    left: Vec<Left>,
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
    left: Vec<Left>,
    /// The next steps of short holds, due at a random point around their
    /// expiry; taken before new chains. Those still waiting at the stop
    /// are never sent: their holds are left to expire.
    later: Vec<Later>,
    /// The order chain under way never retries ([`Workload::unretried_pct`]).
    once: bool,
    /// ... and an error has ended it: none of its steps is sent any more.
    gave_up: bool,
}

/// What a hold chain does after its HOLD.
#[derive(Debug, Clone, Copy)]
enum Then {
    Confirm,
    Cancel,
    /// An order hold's ORDER.CONFIRM.
    OrderConfirm,
}

struct Later {
    at: Instant,
    then: Then,
    sku: usize,
    id: Arc<str>,
    qty: u32,
    lines: Lines,
    /// The chain never retries.
    once: bool,
}

impl Client {
    async fn run(mut self) -> ClientLog {
        let mut n = 0u64;
        while !self.stop.is_cancelled() {
            let w = self.workload.clone();
            let now = Instant::now();
            if let Some(due) = self.later.iter().position(|l| l.at <= now) {
                let l = self.later.swap_remove(due);
                (self.once, self.gave_up) = (l.once, false);
                match l.then {
                    Then::OrderConfirm => self.order_confirm(&l.id, &l.lines).await,
                    then => self.then(then, l.sku, &l.id, l.qty).await,
                }
                continue;
            }
            n += 1;
            let id: Arc<str> = format!("{}-c{}-{n}", self.workload.name, self.client).into();
            let sku = self.rng.below(self.workload.skus.len() as u64) as usize;
            let qty = 1 + self.rng.below(5) as u32;
            (self.once, self.gave_up) = (false, false);
            if self.rng.pct(w.order_pct) {
                self.once = self.rng.pct(w.unretried_pct);
                self.order_chain(&id).await;
            } else if self.rng.pct(w.hold_pct) {
                self.hold_chain(sku, &id, qty).await;
            } else if self.rng.pct(w.empty_revert_pct) {
                // Empty rollback, then the hanging DEDUCT.
                if self.step(Op::Revert, sku, &id, qty, 0).await
                    && self.rng.pct(w.late_deduct_pct * 2)
                {
                    self.step(Op::Deduct, sku, &id, qty, 0).await;
                }
            } else if self.step(Op::Deduct, sku, &id, qty, 0).await {
                if self.rng.pct(w.duplicate_pct) {
                    self.step(Op::Deduct, sku, &id, qty, 0).await;
                }
                if self.rng.pct(w.revert_pct) && self.step(Op::Revert, sku, &id, qty, 0).await {
                    if self.rng.pct(w.duplicate_pct) {
                        self.step(Op::Revert, sku, &id, qty, 0).await;
                    }
                    if self.rng.pct(w.late_deduct_pct) {
                        self.step(Op::Deduct, sku, &id, qty, 0).await;
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
            left: self.left,
        }
    }

    /// A HOLD, perhaps re-sent, then its CONFIRM or REVERT (at once for a
    /// long hold, around the expiry for a short one) or nothing.
    async fn hold_chain(&mut self, sku: usize, id: &Arc<str>, qty: u32) {
        let w = &self.workload;
        let short = self.rng.pct(w.short_hold_pct);
        let ttl = if short {
            1000 + self.rng.below(2001) as u32
        } else {
            w.long_hold.as_millis() as u32
        };
        let (duplicate_pct, confirm_pct, cancel_pct) =
            (w.duplicate_pct, w.confirm_pct, w.cancel_pct);
        if !self.step(Op::Hold, sku, id, qty, ttl).await {
            return;
        }
        if self.rng.pct(duplicate_pct) {
            self.step(Op::Hold, sku, id, qty, ttl).await;
        }
        let roll = self.rng.below(100);
        let then = if roll < confirm_pct {
            Then::Confirm
        } else if roll < confirm_pct + cancel_pct {
            Then::Cancel
        } else {
            return;
        };
        if short {
            // Within half a second of the expiry, either side: the race.
            let wait = ttl as u64 - 500 + self.rng.below(1001);
            self.later.push(Later {
                at: Instant::now() + Duration::from_millis(wait),
                then,
                sku,
                id: id.clone(),
                qty,
                lines: Arc::new([]),
                once: false,
            });
        } else {
            self.then(then, sku, id, qty).await;
        }
    }

    /// A hold's CONFIRM (sometimes re-sent, sometimes then REVERTed) or its
    /// REVERT (sometimes re-sent).
    async fn then(&mut self, then: Then, sku: usize, id: &Arc<str>, qty: u32) {
        let w = self.workload.clone();
        match then {
            Then::Confirm => {
                if !self.step(Op::Confirm, sku, id, qty, 0).await {
                    return;
                }
                if self.rng.pct(w.duplicate_pct) {
                    self.step(Op::Confirm, sku, id, qty, 0).await;
                }
                if self.rng.pct(w.revert_pct) {
                    self.step(Op::Revert, sku, id, qty, 0).await;
                }
            }
            Then::Cancel => {
                if self.step(Op::Revert, sku, id, qty, 0).await && self.rng.pct(w.duplicate_pct) {
                    self.step(Op::Revert, sku, id, qty, 0).await;
                }
            }
            Then::OrderConfirm => {}
        }
    }

    /// An order chain over 2–4 distinct skus: an ORDER (perhaps re-sent,
    /// perhaps ORDER.REVERTed after, the REVERT perhaps re-sent, perhaps a
    /// late ORDER after it); or an ORDER.REVERT of an order never seen,
    /// then perhaps its late ORDER; or an ORDER.HOLD (perhaps re-sent),
    /// then its ORDER.CONFIRM (around the expiry of a short one) or
    /// nothing.
    async fn order_chain(&mut self, id: &Arc<str>) {
        let w = self.workload.clone();
        let n = (2 + self.rng.below(3) as usize).min(w.skus.len());
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < n {
            let sku = self.rng.below(w.skus.len() as u64) as usize;
            if !picked.contains(&sku) {
                picked.push(sku);
            }
        }
        let lines: Lines = picked
            .into_iter()
            .map(|sku| (sku, 1 + self.rng.below(5) as u32))
            .collect();
        if self.rng.pct(w.order_hold_pct) {
            let short = self.rng.pct(70);
            let ttl = if short {
                1000 + self.rng.below(2001) as u32
            } else {
                w.long_hold.as_millis() as u32
            };
            if !self.order_step(Op::OrderHold, id, &lines, ttl).await {
                return;
            }
            if self.rng.pct(w.duplicate_pct) {
                self.order_step(Op::OrderHold, id, &lines, ttl).await;
            }
            if !self.rng.pct(60) || self.gave_up {
                return; // left to expire (or still held at the audit)
            }
            if short {
                let wait = ttl as u64 - 500 + self.rng.below(1001);
                self.later.push(Later {
                    at: Instant::now() + Duration::from_millis(wait),
                    then: Then::OrderConfirm,
                    sku: lines[0].0,
                    id: id.clone(),
                    qty: 0,
                    lines,
                    once: self.once,
                });
            } else {
                self.order_confirm(id, &lines).await;
            }
        } else if self.rng.pct(w.empty_revert_pct * 2) {
            if self.order_step(Op::OrderRevert, id, &lines, 0).await
                && self.rng.pct(w.late_deduct_pct * 2)
            {
                self.order_step(Op::Order, id, &lines, 0).await;
            }
        } else if self.order_step(Op::Order, id, &lines, 0).await {
            if self.rng.pct(w.duplicate_pct) {
                self.order_step(Op::Order, id, &lines, 0).await;
            }
            if self.rng.pct(w.revert_pct) && self.order_step(Op::OrderRevert, id, &lines, 0).await {
                if self.rng.pct(w.duplicate_pct) {
                    self.order_step(Op::OrderRevert, id, &lines, 0).await;
                }
                if self.rng.pct(w.late_deduct_pct) {
                    self.order_step(Op::Order, id, &lines, 0).await;
                }
            }
        }
    }

    /// An order hold's ORDER.CONFIRM, sometimes re-sent.
    async fn order_confirm(&mut self, id: &Arc<str>, lines: &Lines) {
        if self.order_step(Op::OrderConfirm, id, lines, 0).await
            && self.rng.pct(self.workload.duplicate_pct)
        {
            self.order_step(Op::OrderConfirm, id, lines, 0).await;
        }
    }

    /// Sends one order step until it gets a business code; or once, in a
    /// chain that never retries, and none once an error ended that chain.
    async fn order_step(&mut self, op: Op, id: &Arc<str>, lines: &Lines, ttl_ms: u32) -> bool {
        if self.gave_up {
            return false;
        }
        self.step_with(op, lines[0].0, id, 0, ttl_ms, lines).await
    }

    /// Sends one step until it gets a business code; true if it did.
    async fn step(&mut self, op: Op, sku: usize, id: &Arc<str>, qty: u32, ttl_ms: u32) -> bool {
        self.step_with(op, sku, id, qty, ttl_ms, &Arc::from([]))
            .await
    }

    async fn step_with(
        &mut self,
        op: Op,
        sku: usize,
        id: &Arc<str>,
        qty: u32,
        ttl_ms: u32,
        lines: &Lines,
    ) -> bool {
        let mut backoff = Duration::from_millis(10);
        for retry in 0.. {
            let started = Instant::now();
            let outcome = self.send(op, sku, id, qty, ttl_ms, lines).await;
            let took = started.elapsed();
            let settled = outcome.is_code();
            let broken = matches!(outcome, Outcome::ClientTimeout | Outcome::ClientIo(_));
            self.attempts.push(Attempt {
                client: self.client,
                op,
                sku,
                lines: lines.clone(),
                id: id.clone(),
                qty,
                ttl_ms,
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
                // reused: the retry (or the next chain) goes out on a new
                // one.
                if let Some(conn) = try_connect(self.addr, self.workload.client_timeout).await {
                    self.conn = conn;
                }
            }
            if self.once && op.is_order() {
                // Its caller never retries: the order is stockgate's now.
                self.gave_up = true;
                self.left.push(Left {
                    op,
                    id: id.clone(),
                    at: started + took,
                });
                return false;
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

    async fn send(
        &mut self,
        op: Op,
        sku: usize,
        id: &str,
        qty: u32,
        ttl_ms: u32,
        lines: &Lines,
    ) -> Outcome {
        let skus = &self.workload.skus;
        let sku = &skus[sku];
        let with_lines = |cmd: &mut redis::Cmd| {
            for (sku, qty) in lines.iter() {
                cmd.arg(&skus[*sku]).arg(*qty);
            }
        };
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
            Op::Hold => {
                let mut cmd = redis::cmd("HOLD");
                cmd.arg(sku).arg(qty).arg(id).arg(ttl_ms).arg(order_no(id));
                cmd
            }
            Op::Confirm => {
                let mut cmd = redis::cmd("CONFIRM");
                cmd.arg(sku).arg(id);
                cmd
            }
            Op::Order => {
                let mut cmd = redis::cmd("ORDER");
                cmd.arg(id);
                with_lines(&mut cmd);
                cmd
            }
            Op::OrderHold => {
                let mut cmd = redis::cmd("ORDER.HOLD");
                cmd.arg(id).arg(ttl_ms);
                with_lines(&mut cmd);
                cmd
            }
            Op::OrderConfirm => {
                let mut cmd = redis::cmd("ORDER.CONFIRM");
                cmd.arg(id);
                cmd
            }
            Op::OrderRevert => {
                let mut cmd = redis::cmd("ORDER.REVERT");
                cmd.arg(id);
                cmd
            }
        };
        match cmd.query_async::<Value>(&mut self.conn).await {
            Ok(value) if op.is_order() => parse_order_reply(value),
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
            expires_at: match items.get(4) {
                Some(Value::Int(at)) => *at,
                _ => 0,
            },
        },
        _ => Outcome::Malformed(format!("{value:?}")),
    }
}

/// An order reply: `[code, version, expires_at_ms, lines, short]` (and a
/// reason for a 3); its remain and order_no are left 0 and empty.
fn parse_order_reply(value: Value) -> Outcome {
    let Value::Array(items) = &value else {
        return Outcome::Malformed(format!("{value:?}"));
    };
    match (items.first(), items.get(1), items.get(2), items.get(3)) {
        (
            Some(Value::Int(code)),
            Some(Value::Int(_version)),
            Some(Value::Int(expires_at)),
            Some(Value::Array(_lines)),
        ) => Outcome::Code {
            code: *code,
            remain: 0,
            order_no: String::new(),
            expires_at: *expires_at,
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
    /// `started` on the wall clock, in ms since the epoch: Redis's TIME on
    /// this host, for comparing with a hold's expiry.
    pub started_unix_ms: i64,
    /// Every attempt, by start time.
    pub attempts: Vec<Attempt>,
    pub unsettled: Vec<Unsettled>,
    /// The orders left after an error by callers that never retry, by
    /// when.
    pub left: Vec<Left>,
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
    /// `t` on the wall clock, ms since the epoch.
    pub fn unix_ms(&self, t: Instant) -> i64 {
        if t >= self.started {
            self.started_unix_ms + (t - self.started).as_millis() as i64
        } else {
            self.started_unix_ms - (self.started - t).as_millis() as i64
        }
    }

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
    /// First, if callers left orders after an error, waits for stockgate's
    /// recovery to end them ([`History::await_recovery`]).
    pub fn audit(&self, cluster: &LocalCluster, policy: Policy) -> Audit {
        crate::harness::wait_stable(cluster);
        let waited = self.await_recovery(cluster);
        let mut state = FinalState::read(cluster, &self.workload);
        state.read_intents(cluster, self);
        state.recovery_waited = waited;
        audit(self, &state, policy)
    }

    /// Polls the intents of the orders left after an error until none is
    /// in flight (HOLDING, CONFIRMING, ABORTING, REVERTING) but those
    /// filed nowhere among the orders in flight, which nothing will ever
    /// end; or, at most, until [`Workload::recover_after`] past the last
    /// one's error or now (the fault has healed by now), whichever is
    /// later, and [`Workload::recovery_slack`] more. Whatever is left in
    /// flight then is the audit's to report. How long it waited.
    pub fn await_recovery(&self, cluster: &LocalCluster) -> Duration {
        let started = Instant::now();
        let mut ids: Vec<&str> = self.left.iter().map(|l| &*l.id).collect();
        ids.sort_unstable();
        ids.dedup();
        let Some(last) = self.left.iter().map(|l| l.at).max() else {
            return Duration::ZERO;
        };
        let w = &self.workload;
        let deadline = (last + w.recover_after()).max(started) + w.recovery_slack();
        let name = &w.name;
        let mut at_first = None;
        loop {
            let mut waiting = Vec::new();
            let mut stuck = Vec::new();
            match cluster.cluster_connection() {
                Ok(mut conn) => {
                    for id in &ids {
                        match order_whereabouts(&mut conn, id) {
                            Some((phase, _)) if !in_flight(&phase) => {}
                            Some((phase, true)) => waiting.push(format!("{id} {phase}")),
                            Some((phase, false)) => stuck.push(format!("{id} {phase}")),
                            None => waiting.push(format!("{id} (unreadable)")),
                        }
                    }
                }
                Err(e) => waiting.push(format!("(no cluster connection: {e})")),
            }
            let at_first = *at_first.get_or_insert(waiting.len() + stuck.len());
            if waiting.is_empty() || Instant::now() >= deadline {
                eprintln!(
                    "[{name}] {} orders left after an error, {at_first} of them still in flight when the audit began; waited {} for recovery to end them; {} still in flight and filed: {waiting:?}; {} in flight and filed nowhere: {stuck:?}",
                    ids.len(),
                    crate::harness::ms(started.elapsed()),
                    waiting.len(),
                    stuck.len(),
                );
                return started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A phase an order never rests in: its saga, or recovery, is still to
/// move it on.
fn in_flight(phase: &str) -> bool {
    matches!(phase, "HOLDING" | "CONFIRMING" | "ABORTING" | "REVERTING")
}

/// The shard of the orders in flight that files order `id`
/// (`lua/order_due.lua`).
pub fn orders_in_flight_key(id: &str) -> Vec<u8> {
    let layout = crate::support::layout();
    let id = stockgate::params::RequestId::parse(bytes::Bytes::copy_from_slice(id.as_bytes()))
        .expect("the load's request_ids are valid");
    layout.sweep_shards()[layout.order_shard_index(&id)]
        .orders
        .clone()
}

/// Where order `id` is: its intent's phase ("" without one) and whether
/// it is filed among the orders in flight, in that order of reading: an
/// order is taken out only once it rests, and filed again only by a
/// command or by a recovery of it while filed, so one filed nowhere that
/// is then read in flight was left so for good. None if unreadable.
fn order_whereabouts(
    conn: &mut redis::cluster::ClusterConnection,
    id: &str,
) -> Option<(String, bool)> {
    let filed: Option<f64> = redis::cmd("ZSCORE")
        .arg(orders_in_flight_key(id))
        .arg(id)
        .query(conn)
        .ok()?;
    let phase: Option<String> = redis::cmd("HGET")
        .arg(format!("stock:{{order:{id}}}:intent"))
        .arg("p")
        .query(conn)
        .ok()?;
    Some((phase.unwrap_or_default(), filed.is_some()))
}

/// Conservation alone, for skus changed by requests the test did not
/// record (clients that left mid-request, holds placed by a test itself):
/// per sku, `initial` − final = Σ qty of DEDUCTED, CONFIRMED and HELD
/// records, the `:held` counter is Σ qty of the HELD ones and the `:holds`
/// set names exactly those. The violations, if any.
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
        let taken: i64 = state
            .records
            .iter()
            .filter(|((s, _), _)| s == sku)
            .filter(|(_, r)| {
                matches!(
                    r.state,
                    RecordState::Deducted | RecordState::Confirmed | RecordState::Held
                )
            })
            .map(|(_, r)| r.qty as i64)
            .sum();
        violations.extend(state.books(sku, initial, taken));
    }
    violations
}

/// The records of one sku in state HELD, from `records`: request_id ->
/// (qty, expiry).
fn held_records<'a>(
    records: &'a HashMap<(String, String), FinalRecord>,
    sku: &'a str,
) -> impl Iterator<Item = (&'a str, &'a FinalRecord)> + 'a {
    records
        .iter()
        .filter(move |((s, _), r)| s == sku && r.state == RecordState::Held)
        .map(|((_, id), r)| (id.as_str(), r))
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
    /// (sku, request_id) -> the record
    records: HashMap<(String, String), FinalRecord>,
    /// sku -> its `:holds` set, request_id -> expiry (ms of Redis time)
    holds: HashMap<String, HashMap<String, i64>>,
    /// sku -> its `:held` counter (absent: 0, as the scripts delete it at 0)
    held: HashMap<String, i64>,
    /// Redis time (ms) when the reading began: holds whose expiry is before
    /// it ran out, released or not.
    now_ms: i64,
    /// request_id -> its order's intent record (fields p, k, l, e, c, ...),
    /// for the orders of the load.
    intents: HashMap<String, HashMap<String, String>>,
    /// The orders left after an error that are still filed among the
    /// orders in flight (`lua/order_due.lua`), so that recovery would
    /// look at them again.
    filed: std::collections::HashSet<String>,
    /// How long the audit waited for recovery before reading.
    recovery_waited: Duration,
    violations: Vec<String>,
}

/// One record as the audit reads it.
struct FinalRecord {
    state: RecordState,
    /// `<state>:<qty>:<order_no>`, without the nonce of the call that
    /// wrote it.
    summary: String,
    qty: u64,
    /// A hold's expiry (HELD, CONFIRMED, EXPIRED).
    expires: Option<i64>,
    pttl: i64,
}

use stockgate::record::State as RecordState;

impl FinalRecord {
    /// A HELD record has no TTL (its units are in it, so it lasts until
    /// its hold ends); every other record has one.
    fn ttl_violation(&self) -> Option<String> {
        match (self.state == RecordState::Held, self.pttl) {
            (true, -1) => None,
            (true, pttl) => Some(format!("HELD record with a TTL (PTTL {pttl})")),
            (false, pttl) if pttl > 0 => None,
            (false, pttl) => Some(format!("record without a TTL (PTTL {pttl})")),
        }
    }
}

/// What a key of the load's is, by its name.
enum KeyKind {
    Stock,
    Record,
    Holds,
    Held,
}

impl FinalState {
    /// SCANs every primary for the load's keys and reads each, checking
    /// that each key lives on the primary that owns its slot.
    fn read(cluster: &LocalCluster, workload: &Workload) -> FinalState {
        let mut state = FinalState {
            stock: HashMap::new(),
            records: HashMap::new(),
            holds: HashMap::new(),
            held: HashMap::new(),
            now_ms: 0,
            intents: HashMap::new(),
            filed: Default::default(),
            recovery_waited: Duration::ZERO,
            violations: Vec::new(),
        };
        let pattern = format!("stock:{{{}-*", workload.name);
        for node in cluster.nodes.iter().filter(|n| n.is_running()) {
            if !crate::harness::is_primary(node) {
                continue;
            }
            let owned = crate::harness::own_slots(node);
            let mut conn = node.connection().expect("primary");
            if state.now_ms == 0 {
                let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
                state.now_ms = secs * 1000 + micros / 1000;
            }
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
            // One sku's keys share its hash tag, so one MULTI reads them
            // all at one instant: the sweeper may still be releasing
            // holds (a record turning EXPIRED, the set and the counter
            // shrinking with it), and a read spread over batches would see
            // half a release. The sku's own three keys are always read,
            // found by the SCAN or not.
            let mut by_sku: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
            for key in keys {
                let text = String::from_utf8_lossy(&key).into_owned();
                let sku = text
                    .strip_prefix("stock:{")
                    .and_then(|rest| rest.split_once('}'))
                    .map_or(String::new(), |(sku, _)| sku.to_owned());
                by_sku.entry(sku).or_default().push(key);
            }
            for (sku, mut keys) in by_sku {
                if !sku.is_empty() {
                    let stock = format!("stock:{{{sku}}}").into_bytes();
                    for own in [
                        stock.clone(),
                        [&stock[..], b":holds"].concat(),
                        [&stock[..], b":held"].concat(),
                    ] {
                        if !keys.contains(&own) {
                            keys.push(own);
                        }
                    }
                }
                let mut pipe = redis::pipe();
                pipe.atomic();
                for key in &keys {
                    // A holds set is read as one: GET of it would fail
                    // the whole transaction with WRONGTYPE.
                    if key.ends_with(b"}:holds") {
                        pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
                    } else {
                        pipe.cmd("GET").arg(key);
                    }
                    pipe.cmd("PTTL").arg(key);
                }
                let values: Vec<Value> = pipe.query(&mut conn).expect("MULTI GET/PTTL");
                for (key, pair) in keys.iter().zip(values.chunks(2)) {
                    let slot = stockgate::keys::slot(key);
                    let key_text = String::from_utf8_lossy(key).into_owned();
                    // Absent (a sku of another primary, or a counter at 0):
                    // nothing to read.
                    if pair[0] == Value::Nil
                        || (key.ends_with(b"}:holds") && pair[0] == Value::Array(Vec::new()))
                    {
                        continue;
                    }
                    if !owned.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)) {
                        state.violations.push(format!(
                            "stray key {key_text} on port {} which does not own its slot",
                            node.port
                        ));
                        continue;
                    }
                    let pttl = match pair[1] {
                        Value::Int(t) => t,
                        _ => -3,
                    };
                    state.add(&key_text, &pair[0], pttl);
                }
            }
        }
        state
    }

    /// Reads the intent record of every order the load sent, through the
    /// cluster (each lives in its own slot, `{order:<id>}`).
    fn read_intents(&mut self, cluster: &LocalCluster, history: &History) {
        let mut ids: Vec<&str> = history
            .attempts
            .iter()
            .filter(|a| a.op.is_order())
            .map(|a| &*a.id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return;
        }
        let mut conn = cluster.cluster_connection().expect("cluster connection");
        for id in ids {
            let key = format!("stock:{{order:{id}}}:intent");
            let fields: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query(&mut conn)
                .expect("HGETALL an intent");
            if !fields.is_empty() {
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query(&mut conn)
                    .expect("PTTL an intent");
                if pttl <= 0 {
                    self.violations
                        .push(format!("order {id}: intent without a TTL (PTTL {pttl})"));
                }
                self.intents.insert(id.to_owned(), fields);
            }
        }
        for left in &history.left {
            let filed: Option<f64> = redis::cmd("ZSCORE")
                .arg(orders_in_flight_key(&left.id))
                .arg(&*left.id)
                .query(&mut conn)
                .expect("ZSCORE an order in flight");
            if filed.is_some() {
                self.filed.insert(left.id.to_string());
            }
        }
    }

    fn add(&mut self, key: &str, value: &Value, pttl: i64) {
        let text = || match value {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        };
        let Some((sku, kind, id)) = key
            .strip_prefix("stock:{")
            .and_then(|rest| rest.split_once('}'))
            .and_then(|(sku, tail)| {
                let (kind, id) = match tail {
                    "" => (KeyKind::Stock, ""),
                    ":holds" => (KeyKind::Holds, ""),
                    ":held" => (KeyKind::Held, ""),
                    _ => (KeyKind::Record, tail.strip_prefix(":req:")?),
                };
                Some((sku, kind, id))
            })
        else {
            self.violations.push(format!("unexpected key {key}"));
            return;
        };
        match kind {
            KeyKind::Stock => match text().parse() {
                Ok(stock) => {
                    self.stock.insert(sku.to_owned(), stock);
                }
                Err(_) => self
                    .violations
                    .push(format!("stock of {sku} is not an integer: {:?}", text())),
            },
            KeyKind::Held => match text().parse() {
                Ok(held) => {
                    self.held.insert(sku.to_owned(), held);
                }
                Err(_) => self
                    .violations
                    .push(format!("{key} is not an integer: {:?}", text())),
            },
            KeyKind::Holds => {
                let Value::Array(items) = value else {
                    self.violations
                        .push(format!("{key} is not a sorted set: {value:?}"));
                    return;
                };
                let set = self.holds.entry(sku.to_owned()).or_default();
                for pair in items.chunks(2) {
                    let member = match &pair[0] {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        other => format!("{other:?}"),
                    };
                    let score = match pair.get(1) {
                        Some(Value::BulkString(b)) => {
                            String::from_utf8_lossy(b).parse::<f64>().ok()
                        }
                        Some(Value::Double(d)) => Some(*d),
                        _ => None,
                    };
                    set.insert(member, score.map_or(-1, |s| s as i64));
                }
            }
            KeyKind::Record => {
                // Audited without the nonce of the call that wrote it.
                match stockgate::record::Record::parse(&text()) {
                    Some(record) => {
                        self.records.insert(
                            (sku.to_owned(), id.to_owned()),
                            FinalRecord {
                                state: record.state,
                                summary: record.summary(),
                                qty: record.qty,
                                expires: record.hold.map(|(expires, _)| expires as i64),
                                pttl,
                            },
                        );
                    }
                    None => self
                        .violations
                        .push(format!("record {key} has an unknown shape: {:?}", text())),
                }
            }
        }
    }

    /// One sku's books: no negative stock; `initial` − final = `taken`
    /// (Σ qty of the records that keep units out of stock); the `:held`
    /// counter is Σ qty of the HELD records; the `:holds` set names exactly
    /// the HELD records, each at its expiry.
    fn books(&self, sku: &str, initial: i64, taken: i64) -> Vec<String> {
        let mut violations = Vec::new();
        match self.stock.get(sku) {
            None => violations.push(format!("{sku}: stock key missing at the end")),
            Some(&stock) => {
                if stock < 0 {
                    violations.push(format!("{sku}: negative stock {stock}"));
                }
                if initial - stock != taken {
                    violations.push(format!(
                        "{sku}: conservation broken: stock went down by {}, DEDUCTED, CONFIRMED and HELD records hold {taken}",
                        initial - stock
                    ));
                }
            }
        }
        let held: i64 = held_records(&self.records, sku)
            .map(|(_, r)| r.qty as i64)
            .sum();
        let counter = self.held.get(sku).copied().unwrap_or(0);
        if counter != held {
            violations.push(format!(
                "{sku}: the held counter says {counter}, HELD records hold {held}"
            ));
        }
        let empty = HashMap::new();
        let set = self.holds.get(sku).unwrap_or(&empty);
        for (id, record) in held_records(&self.records, sku) {
            match set.get(id) {
                None => violations.push(format!(
                    "{sku} {id}: HELD, but not in the holds set (its units would never come back)"
                )),
                Some(at) if Some(*at) != record.expires => violations.push(format!(
                    "{sku} {id}: in the holds set at {at}, its record expires at {:?}",
                    record.expires
                )),
                Some(_) => {}
            }
        }
        for id in set.keys() {
            let state = self
                .records
                .get(&(sku.to_owned(), id.clone()))
                .map(|r| r.state);
            if state != Some(RecordState::Held) {
                violations.push(format!(
                    "{sku} {id}: in the holds set, but its record is {state:?} (a hold still counted after it ended)"
                ));
            }
        }
        violations
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
    /// Σ qty of DEDUCTED, CONFIRMED and HELD records.
    pub units_recorded: i64,
    /// Σ qty of HELD records, and of CONFIRMED ones.
    pub units_held: i64,
    pub units_confirmed: i64,
    /// Holds that ran out and were released (EXPIRED records), and holds
    /// that ran out by Redis time but that nothing had released yet when
    /// the audit read them (still HELD, and counted so).
    pub holds_expired: usize,
    pub holds_due: usize,
    /// Orders sent; those that ended applied (every line CONFIRMED, or
    /// HELD by a live order hold), and those that ended with no line
    /// applied.
    pub orders: usize,
    pub orders_applied: usize,
    pub orders_undone: usize,
    /// Orders their callers left after an error, never retried; those
    /// that ended applied, and those that ended with no line applied.
    pub orders_left: usize,
    pub left_applied: usize,
    pub left_undone: usize,
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
            "[{}] requests={} ids={} retries={} codes{{{}}} errors{{{}}} unsettled={} units deducted={} accounted={} recorded={} (held={} confirmed={}) holds expired={} due={} orders={} (applied={} undone={}) left after an error={} (applied={} undone={}) lost_acks={} violations={}",
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
            self.units_held,
            self.units_confirmed,
            self.holds_expired,
            self.holds_due,
            self.orders,
            self.orders_applied,
            self.orders_undone,
            self.orders_left,
            self.left_applied,
            self.left_undone,
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
                let expiry_answer = *code == 5
                    && matches!(
                        a.op,
                        Op::Hold | Op::Confirm | Op::OrderHold | Op::OrderConfirm
                    );
                if !((0..=4).contains(code) || expiry_answer) || *code == 2 || *code == 3 {
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
    let (mut units_held, mut units_confirmed, mut holds_expired, mut holds_due) = (0, 0, 0, 0);
    let (mut orders, mut orders_applied, mut orders_undone) = (0, 0, 0);
    let (mut orders_left, mut left_applied, mut left_undone) = (0, 0, 0);
    for (id, attempts) in &by_id {
        let sku = w.skus[attempts[0].sku].as_str();
        let qty = attempts[0].qty;
        let order = order_no(id);
        if attempts[0].op.is_order() {
            let left = history.left.iter().find(|l| &*l.id == *id);
            let found = audit_order(history, state, id, attempts, left, policy, &mut violations);
            orders += 1;
            match found.applied {
                Some(true) => orders_applied += 1,
                Some(false) => orders_undone += 1,
                None => {}
            }
            if left.is_some() {
                orders_left += 1;
                match found.applied {
                    Some(true) => left_applied += 1,
                    Some(false) => left_undone += 1,
                    None => {}
                }
            }
            if found.lost {
                lost_acks += 1;
            }
            units_acked += found.acked;
            for (sku, units) in found.recorded {
                *units_recorded_by_sku
                    .entry(w.skus[sku].as_str())
                    .or_default() += units;
            }
            continue;
        }
        if attempts.iter().any(|a| a.op == Op::Hold) {
            let record = state.records.get(&(sku.to_owned(), id.to_string()));
            let held = audit_hold(history, id, attempts, record, policy, &mut violations);
            if held.lost {
                lost_acks += 1;
            }
            units_acked += held.acked;
            if let Some(r) = record
                && matches!(r.state, RecordState::Held | RecordState::Confirmed)
            {
                *units_recorded_by_sku.entry(sku).or_default() += r.qty as i64;
                match r.state {
                    RecordState::Held => units_held += r.qty as i64,
                    _ => units_confirmed += r.qty as i64,
                }
                if r.state == RecordState::Held && r.expires.is_some_and(|at| at <= state.now_ms) {
                    holds_due += 1;
                }
            }
            if record.is_some_and(|r| r.state == RecordState::Expired) {
                holds_expired += 1;
            }
            continue;
        }
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
                _ => {} // never in a DEDUCT's chain
            }
        }
        let record = state.records.get(&(sku.to_owned(), id.to_string()));
        let actual = match State::of_record(record.map(|r| r.summary.as_str()), qty, &order) {
            Ok(s) => s,
            Err(e) => {
                violations.push(format!("{sku} {id}: {e}"));
                continue;
            }
        };
        if let Some(r) = record
            && let Some(wrong) = r.ttl_violation()
        {
            violations.push(format!("{sku} {id}: {wrong}"));
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
        let request_id = id.strip_prefix(LINE_PREFIX).unwrap_or(id);
        let asked = by_id
            .get(request_id)
            .is_some_and(|a| a[0].op.is_order() == id.starts_with(LINE_PREFIX));
        if !asked {
            violations.push(format!("{sku} {id}: a record for a request_id never sent"));
        }
    }

    // Conservation, the hold books and no negative stock, per sku.
    let mut units_taken = 0;
    let mut units_recorded = 0;
    for sku in &w.skus {
        let recorded = units_recorded_by_sku
            .get(sku.as_str())
            .copied()
            .unwrap_or(0);
        violations.extend(state.books(sku, w.initial_stock, recorded));
        if let Some(stock) = state.stock.get(sku) {
            units_taken += w.initial_stock - stock;
        }
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
        units_held,
        units_confirmed,
        holds_expired,
        holds_due,
        orders,
        orders_applied,
        orders_undone,
        orders_left,
        left_applied,
        left_undone,
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

/// What one hold's audit found.
struct HoldAudit {
    /// An acknowledged change is missing (or was made again).
    lost: bool,
    /// qty when the replies leave the units out of stock for sure (HELD
    /// or CONFIRMED), else 0.
    acked: i64,
}

/// A hold's state, as its record holds it (HELD counts as HELD whether or
/// not its time ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hs {
    None,
    Held,
    Confirmed,
    Expired,
    Reverted,
    Revoked,
}

const HS: [Hs; 6] = [
    Hs::None,
    Hs::Held,
    Hs::Confirmed,
    Hs::Expired,
    Hs::Reverted,
    Hs::Revoked,
];

/// A set of [`Hs`], one bit each.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Hset(u8);

impl Hset {
    fn of(states: &[Hs]) -> Hset {
        Hset(states.iter().fold(0, |m, s| m | 1 << *s as u8))
    }
    fn has(self, s: Hs) -> bool {
        self.0 & (1 << s as u8) != 0
    }
    fn states(self) -> impl Iterator<Item = Hs> {
        HS.into_iter().filter(move |s| self.has(*s))
    }
    fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Debug for Hset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.states()).finish()
    }
}

impl Hs {
    fn of_record(record: Option<&FinalRecord>) -> Option<Hs> {
        Some(match record.map(|r| r.state) {
            None => Hs::None,
            Some(RecordState::Held) => Hs::Held,
            Some(RecordState::Confirmed) => Hs::Confirmed,
            Some(RecordState::Expired) => Hs::Expired,
            Some(RecordState::Reverted) => Hs::Reverted,
            Some(RecordState::Revoked) => Hs::Revoked,
            Some(RecordState::Deducted) => return None,
        })
    }

    /// What `op` answers in this state, and the state it leaves: the
    /// columns of lua/revert.lua's table. A HELD whose time ran out answers
    /// as EXPIRED (released by the call): the audit does not know Redis's
    /// clock at each call, so HELD allows both.
    fn step(self, op: Op) -> &'static [(i64, Hs)] {
        use Hs::*;
        match (op, self) {
            (Op::Hold, None) => &[(0, Held)],
            (Op::Hold, Held) => &[(1, Held), (5, Expired)],
            (Op::Hold, Confirmed) => &[(1, Confirmed)],
            (Op::Hold | Op::Confirm, Expired) => &[(5, Expired)],
            (Op::Confirm, None) => &[(4, Revoked)],
            (Op::Confirm, Held) => &[(0, Confirmed), (5, Expired)],
            (Op::Confirm, Confirmed) => &[(1, Confirmed)],
            (Op::Hold | Op::Confirm, Reverted) => &[(4, Reverted)],
            (Op::Hold | Op::Confirm, Revoked) => &[(4, Revoked)],
            (Op::Revert, None) => &[(4, Revoked)],
            (Op::Revert, Held) => &[(0, Reverted), (1, Expired)],
            (Op::Revert, Confirmed) => &[(0, Reverted)],
            (Op::Revert, Expired) => &[(1, Expired)],
            (Op::Revert, Reverted) => &[(1, Reverted)],
            (Op::Revert, Revoked) => &[(1, Revoked)],
            (Op::Deduct, _) => &[],
            (Op::Order | Op::OrderHold | Op::OrderConfirm | Op::OrderRevert, _) => &[],
        }
    }

    /// The states an acknowledged change lost in a failover can take this
    /// one back to: the earlier states on its path.
    fn behind(self) -> &'static [Hs] {
        use Hs::*;
        match self {
            None => &[],
            Held | Revoked => &[None],
            Confirmed | Expired => &[Held, None],
            Reverted => &[Confirmed, Held, None],
        }
    }
}

/// Every state `from` can reach without a reply to show it: a hold
/// running out (when its time can have come) and any attempt in
/// `unanswered` (it may have run, then or later).
fn reachable(from: Hset, unanswered: &[Op], can_expire: bool) -> Hset {
    let mut set = from;
    loop {
        let mut next = set;
        for s in set.states() {
            if s == Hs::Held && can_expire {
                next.0 |= Hset::of(&[Hs::Expired]).0;
            }
            for op in unanswered {
                for (_, to) in s.step(*op) {
                    next.0 |= Hset::of(&[*to]).0;
                }
            }
        }
        if next == set {
            return set;
        }
        set = next;
    }
}

/// `set` and every state behind one of its own (acknowledged changes lost).
fn with_lost(set: Hset) -> Hset {
    let mut all = set;
    for s in set.states() {
        all.0 |= Hset::of(s.behind()).0;
    }
    all
}

/// One hold's replies against its state machine, and against its record.
fn audit_hold(
    history: &History,
    id: &str,
    attempts: &[&Attempt],
    record: Option<&FinalRecord>,
    policy: Policy,
    violations: &mut Vec<String>,
) -> HoldAudit {
    let w = &history.workload;
    let sku = w.skus[attempts[0].sku].as_str();
    let order = order_no(id);
    // A hold can run out only once its ttl has passed since its first
    // HOLD was sent (Redis's clock and this one are the same host's; a
    // second of slack).
    let ttl = attempts.iter().map(|a| a.ttl_ms).max().unwrap_or(0);
    let runs_out = attempts[0].started + Duration::from_millis(ttl as u64);
    let can_expire = |by: Instant| runs_out <= by + Duration::from_secs(1);
    let mut possible = Hset::of(&[Hs::None]);
    let mut unanswered: Vec<Op> = Vec::new();
    let mut lost = false;
    let mut expiries: Vec<i64> = Vec::new();
    for a in attempts {
        let tag = || format!("{:?} {sku} {id} at {}", a.op, history.at(a.started));
        let Outcome::Code {
            code,
            order_no: o,
            expires_at,
            ..
        } = &a.outcome
        else {
            unanswered.push(a.op);
            continue;
        };
        let can_expire = can_expire(a.ended());
        let before = reachable(possible, &unanswered, can_expire);
        let after = |from: Hset| {
            let mut to = Hset(0);
            for s in from.states() {
                for (c, next) in s.step(a.op) {
                    if c == code {
                        to.0 |= Hset::of(&[*next]).0;
                    }
                }
            }
            to
        };
        let mut next = after(before);
        if next.is_empty() {
            let lossy = reachable(with_lost(before), &unanswered, can_expire);
            next = after(lossy);
            if next.is_empty() {
                if !matches!(code, 2 | 3) {
                    violations.push(format!(
                        "{} answered {code}, which no state the earlier replies allow ({before:?}) answers",
                        tag()
                    ));
                }
                // Reported: go on from whatever it could mean.
                next = Hset::of(&HS);
            } else {
                lost = true;
                if !policy.allow_lost_acks {
                    violations.push(format!(
                        "{} answered {code}: only possible if an acknowledged change was lost (states allowed before: {before:?})",
                        tag()
                    ));
                }
            }
        }
        possible = next;
        if matches!(code, 0 | 5) && o != &order {
            violations.push(format!("{} code {code} with order_no {o:?}", tag()));
        }
        if matches!(a.op, Op::Hold | Op::Confirm) && matches!(code, 0 | 1 | 5) {
            if *expires_at <= 0 {
                violations.push(format!("{} code {code} without an expiry", tag()));
            } else if !expiries.contains(expires_at) {
                expiries.push(*expires_at);
            }
            // Redis decides by its own clock, which is this host's: a
            // CONFIRM sent after the expiry can't have confirmed, and a 5
            // can't come before it (half a second of slack).
            let slack = 500;
            if a.op == Op::Confirm && *code == 0 && history.unix_ms(a.started) > expires_at + slack
            {
                violations.push(format!(
                    "{} confirmed, though sent {} ms after the hold's expiry",
                    tag(),
                    history.unix_ms(a.started) - expires_at
                ));
            }
            if *code == 5 && history.unix_ms(a.ended()) < expires_at - slack {
                violations.push(format!(
                    "{} answered expired {} ms before the hold's expiry",
                    tag(),
                    expires_at - history.unix_ms(a.ended())
                ));
            }
        }
    }
    if expiries.len() > 1 && !lost {
        violations.push(format!(
            "{sku} {id}: replies name different expiries {expiries:?}"
        ));
    }

    let Some(actual) = Hs::of_record(record) else {
        violations.push(format!("{sku} {id}: a hold's id has a DEDUCTED record"));
        return HoldAudit { lost, acked: 0 };
    };
    if let Some(r) = record {
        let qty = attempts[0].qty;
        let want = match actual {
            Hs::Revoked => "V:0:".to_owned(),
            _ => format!("{}:{qty}:{order}", r.state.letter()),
        };
        if r.summary != want {
            violations.push(format!(
                "{sku} {id}: record {:?} does not match qty {qty}, order_no {order}",
                r.summary
            ));
        }
        if let Some(wrong) = r.ttl_violation() {
            violations.push(format!("{sku} {id}: {wrong}"));
        }
        if let Some(at) = r.expires
            && !expiries.is_empty()
            && !expiries.contains(&at)
            && !lost
        {
            violations.push(format!(
                "{sku} {id}: record expires at {at}, the replies said {expiries:?}"
            ));
        }
    }
    let can_expire = can_expire(Instant::now());
    let allowed = reachable(possible, &unanswered, can_expire);
    if !allowed.has(actual) {
        if reachable(with_lost(allowed), &unanswered, can_expire).has(actual) {
            lost = true;
            if !policy.allow_lost_acks {
                violations.push(format!(
                    "{sku} {id}: replies say {allowed:?}, Redis holds {actual:?} (acknowledged change lost)"
                ));
            }
        } else {
            violations.push(format!(
                "{sku} {id}: replies say {allowed:?}, Redis holds {actual:?}"
            ));
        }
    }
    let out_of_stock = Hset::of(&[Hs::Held, Hs::Confirmed]);
    let acked = if !allowed.is_empty() && allowed.0 & !out_of_stock.0 == 0 {
        attempts[0].qty as i64
    } else {
        0
    };
    HoldAudit { lost, acked }
}

/// The prefix of an order's line ids: its lines are records of
/// `~ord:<request_id>` on their skus.
const LINE_PREFIX: &str = "~ord:";

/// What one order's audit found.
struct OrderAudit {
    /// An acknowledged change is missing (or was made again).
    lost: bool,
    /// Σ qty of the lines when the replies say the order is applied and
    /// Redis agrees, else 0.
    acked: i64,
    /// Every line applied (true), none (false), or half (None, reported).
    applied: Option<bool>,
    /// (sku, qty) of the line records that keep units out of stock.
    recorded: Vec<(usize, i64)>,
}

/// Where an order ended, by its intent record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Os {
    /// DONE: every line CONFIRMED.
    Applied,
    /// HELD before its expiry: every line HELD.
    Live,
    /// HELD after its expiry: every line HELD (due) or EXPIRED.
    RanOut,
    /// ABORTED, REVERTED, REVOKED: every line given back, revoked or never
    /// placed.
    Undone,
    /// A phase a settled order never rests in.
    InFlight,
    /// No intent record.
    Missing,
}

/// A violation, or an acknowledged change lost when the policy allows it.
fn lossy(policy: Policy, lost: &mut bool, violations: &mut Vec<String>, text: String) {
    *lost = true;
    if !policy.allow_lost_acks {
        violations.push(text);
    }
}

/// One order's replies, its intent record and its line records: all lines
/// or none, agreeing with the replies; and, for one its caller `left`
/// after an error, ended on its own.
fn audit_order(
    history: &History,
    state: &FinalState,
    id: &str,
    attempts: &[&Attempt],
    left: Option<&Left>,
    policy: Policy,
    violations: &mut Vec<String>,
) -> OrderAudit {
    let w = &history.workload;
    let lines = attempts[0].lines.clone();
    let line_id = format!("{LINE_PREFIX}{id}");
    let mut lost = false;

    // The intent.
    let intent = state.intents.get(id);
    let field = |f: &str| intent.and_then(|i| i.get(f)).map_or("", |v| v.as_str());
    let phase = field("p");
    let expires: i64 = field("e").parse().unwrap_or(0);
    let os = match phase {
        "DONE" => Os::Applied,
        "HELD" if expires > state.now_ms => Os::Live,
        "HELD" => Os::RanOut,
        "ABORTED" | "REVERTED" | "REVOKED" => Os::Undone,
        "" => Os::Missing,
        _ => Os::InFlight,
    };

    // The lines: C (confirmed), H (held, live), ? (held, but due, or of an
    // order hold that ran out: on its way back, whether or not the
    // sweeper released it yet, as lines on different primaries are read
    // at different instants), - (given back, revoked, expired or never
    // placed).
    let mut recorded = Vec::new();
    let mut marks = Vec::new();
    let mut shown = Vec::new();
    for &(sku, qty) in lines.iter() {
        let name = &w.skus[sku];
        let record = state.records.get(&(name.clone(), line_id.clone()));
        let mark = match record {
            None => '-',
            Some(r) => {
                let want = if r.state == RecordState::Revoked {
                    0
                } else {
                    qty as u64
                };
                if r.qty != want || r.state == RecordState::Deducted {
                    violations.push(format!(
                        "{name} {line_id}: line record {:?} does not match the order's line ({qty})",
                        r.summary
                    ));
                }
                if let Some(wrong) = r.ttl_violation() {
                    violations.push(format!("{name} {line_id}: {wrong}"));
                }
                match r.state {
                    RecordState::Confirmed | RecordState::Held | RecordState::Deducted => {
                        recorded.push((sku, r.qty as i64))
                    }
                    _ => {}
                }
                match r.state {
                    RecordState::Confirmed => 'C',
                    RecordState::Held
                        if os != Os::RanOut && r.expires.is_some_and(|at| at > state.now_ms) =>
                    {
                        'H'
                    }
                    RecordState::Held => '?',
                    _ => '-',
                }
            }
        };
        marks.push(mark);
        shown.push(format!(
            "{name}={}",
            record.map_or('-', |r| r.state.letter())
        ));
    }
    let mut kinds: Vec<char> = marks.iter().copied().filter(|m| *m != '?').collect();
    kinds.sort_unstable();
    kinds.dedup();
    let applied = match kinds.as_slice() {
        ['C'] | ['H'] => Some(true),
        [] | ['-'] => Some(false),
        _ => None,
    };

    if !matches!(os, Os::Missing) && phase != "REVOKED" {
        let mut sorted: Vec<(&str, u32)> = lines
            .iter()
            .map(|(sku, qty)| (w.skus[*sku].as_str(), *qty))
            .collect();
        sorted.sort_unstable();
        let canonical: Vec<String> = sorted.iter().map(|(s, q)| format!("{s} {q}")).collect();
        if field("l") != canonical.join(" ") {
            violations.push(format!(
                "order {id}: intent lines {:?}, the order sent {:?}",
                field("l"),
                canonical.join(" ")
            ));
        }
    }
    if let Some(left) = left
        && os == Os::InFlight
    {
        // Nobody will retry it: whatever its lines say, it never ended.
        let filed = if state.filed.contains(id) {
            format!(
                "still filed among the orders in flight after the audit waited {} for recovery",
                crate::harness::ms(state.recovery_waited)
            )
        } else {
            "filed nowhere among the orders in flight, so nothing will ever end it".to_owned()
        };
        violations.push(format!(
            "order {id}: unfinished: its caller left it after an error ({:?} at {}) and it never ended on its own: intent {phase:?}, {filed}; lines {}{}",
            left.op,
            history.at(left.at),
            shown.join(" "),
            if applied.is_none() { " (not whole)" } else { "" },
        ));
    } else if applied.is_none() {
        lossy(
            policy,
            &mut lost,
            violations,
            format!(
                "order {id}: half applied: lines {} (intent {phase:?})",
                shown.join(" ")
            ),
        );
    } else {
        let fits = match os {
            Os::Applied => marks.iter().all(|m| *m == 'C'),
            Os::Live => marks.iter().all(|m| *m == 'H'),
            Os::RanOut => marks.iter().all(|m| *m != 'C' && *m != 'H'),
            Os::Undone | Os::Missing => marks.iter().all(|m| *m == '-'),
            Os::InFlight => false,
        };
        // No intent is an end only for an order left after an error: its
        // first command failed before the begin (then no line was placed).
        if !fits || (os == Os::Missing && left.is_none()) {
            let text = format!("order {id}: intent {phase:?}, lines {}", shown.join(" "));
            // An order only rests in flight if a step never settled
            // (reported as such) or a write was lost.
            if !(os == Os::InFlight && history.unsettled.iter().any(|u| &*u.id == id)) {
                lossy(policy, &mut lost, violations, text);
            }
        }
    }

    // The replies, in order.
    let ttl = attempts.iter().map(|a| a.ttl_ms).max().unwrap_or(0);
    let runs_out = attempts[0].started + Duration::from_millis(ttl as u64);
    let mut sent: Vec<Op> = Vec::new();
    let mut answered: Vec<(Op, i64)> = Vec::new();
    let mut answer: Option<(Op, bool)> = None;
    let mut open_after = false;
    // When the first ORDER.CONFIRM went out: a retry of one that timed out
    // may answer 0 after the expiry, because the first attempt moved the
    // order to CONFIRMING in time and the retry only finishes it.
    let mut first_confirm: Option<Instant> = None;
    for a in attempts {
        if a.op == Op::OrderConfirm && first_confirm.is_none() {
            first_confirm = Some(a.started);
        }
        let tag = || format!("{:?} {id} at {}", a.op, history.at(a.started));
        let Outcome::Code {
            code, expires_at, ..
        } = &a.outcome
        else {
            sent.push(a.op);
            open_after = true;
            continue;
        };
        let code = *code;
        let tried = |op: Op| sent.contains(&op);
        let got = |op: Op, c: &[i64]| answered.iter().any(|(o, k)| *o == op && c.contains(k));
        let placed = got(Op::Order, &[0, 1]) || got(Op::OrderHold, &[0, 1]);
        let mut wrong = |why: &str, lossy_ok: bool| {
            let text = format!("{} answered {code}: {why}", tag());
            if lossy_ok {
                lossy(policy, &mut lost, violations, text);
            } else {
                violations.push(text);
            }
        };
        match (a.op, code) {
            (Op::Order | Op::OrderHold, 0) => {
                if tried(Op::OrderRevert) || placed {
                    wrong("applied again after an earlier ack or revert", true);
                }
                answer = Some((a.op, true));
            }
            (Op::Order | Op::OrderHold, 1) => {
                if !tried(a.op) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                answer = Some((a.op, true));
            }
            (Op::Order | Op::OrderHold, 4) => {
                if !tried(Op::OrderRevert) {
                    wrong("reverted, yet no ORDER.REVERT was sent", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderHold, 5) => {
                if runs_out > a.ended() + Duration::from_secs(1) {
                    wrong("expired before its ttl", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderConfirm, 0 | 1) => {
                if code == 1 && !tried(Op::OrderConfirm) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                if code == 0 && got(Op::OrderConfirm, &[0, 1]) {
                    wrong("confirmed twice", true);
                }
                if history.unix_ms(first_confirm.unwrap_or(a.started)) > expires_at + 500 {
                    wrong(
                        "confirmed, though first sent after the order hold's expiry",
                        false,
                    );
                }
                answer = Some((a.op, true));
            }
            (Op::OrderConfirm, 5) => {
                if history.unix_ms(a.ended()) < expires_at - 500 {
                    wrong("expired before the order hold's expiry", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 0) => {
                if !(placed || tried(Op::Order)) || got(Op::OrderRevert, &[0, 1]) {
                    wrong("reverted what was not applied, or twice", true);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 1) => {
                if !tried(Op::OrderRevert) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 4) => {
                if placed {
                    wrong("nothing to revert after the order was acknowledged", true);
                }
                answer = Some((a.op, false));
            }
            (_, 2 | 3 | 5) => {} // reported with every reply
            _ => wrong("not a code this step can answer", false),
        }
        if matches!(a.op, Op::OrderHold | Op::OrderConfirm)
            && matches!(code, 0 | 1 | 5)
            && os != Os::Missing
            && *expires_at != expires
        {
            lossy(
                policy,
                &mut lost,
                violations,
                format!(
                    "{} answered expires_at {expires_at}, the intent says {expires}",
                    tag()
                ),
            );
        }
        sent.push(a.op);
        answered.push((a.op, code));
        open_after = false;
    }

    // The last answer against where the order ended.
    let want: &[Os] = match answer {
        // Not one answer: it may never have begun.
        _ if open_after && answered.is_empty() => &[
            Os::Applied,
            Os::Live,
            Os::RanOut,
            Os::Undone,
            Os::InFlight,
            Os::Missing,
        ],
        _ if open_after => &[Os::Applied, Os::Live, Os::RanOut, Os::Undone, Os::InFlight],
        None => &[],
        Some((Op::OrderHold, true)) => &[Os::Live, Os::RanOut],
        Some((_, true)) => &[Os::Applied],
        Some((Op::OrderHold, false)) => &[Os::RanOut, Os::Undone],
        Some((_, false)) => &[Os::Undone],
    };
    if !want.is_empty() && !want.contains(&os) {
        lossy(
            policy,
            &mut lost,
            violations,
            format!("order {id}: replies say {want:?}, the intent is {phase:?} ({os:?})"),
        );
    }
    let qty: i64 = lines.iter().map(|(_, q)| *q as i64).sum();
    let acked = match answer {
        Some((_, true)) if matches!(os, Os::Applied | Os::Live) && !open_after => qty,
        _ => 0,
    };
    OrderAudit {
        lost,
        acked,
        applied: applied.map(|a| a && matches!(os, Os::Applied | Os::Live)),
        recorded,
    }
}
