//! The load: the [`Workload`] (what it does, and how hard) and its
//! clients, each working through chains of requests until stopped, every
//! step retried with the same request_id until it gets a business code.

use redis::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stockgate::dev::LocalCluster;
use tokio_util::sync::CancellationToken;

use super::history::{Attempt, History, Left, Lines, Op, Outcome, Unsettled};

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
