//! Histories for the linearizability checker (`tests/linearizability/`,
//! porcupine, in Go): concurrent clients send DEDUCT, retried DEDUCT,
//! REVERT, HOLD, CONFIRM and STOCK.GET through several stockgates (or, on
//! SKUs kept by location, DEDUCT.AT, HOLD.AT, REVERT, CONFIRM,
//! HOLD.EXTEND, HOLD.SHRINK and STOCK.LOCATIONS: [`record_located`]), and
//! every request is recorded with its call and return times and its answer
//! (or that its outcome is unknown: an error or a timeout). The checker
//! then proves every answer was possible in some one-at-a-time order
//! consistent with real time, against a sequential model of the contract.

use redis::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One request, as the checker reads it.
#[derive(Debug, Clone)]
pub struct Op {
    pub client: usize,
    pub kind: &'static str,
    pub sku: String,
    pub id: String,
    pub qty: i64,
    pub call_ns: i64,
    pub ret_ns: i64,
    /// `None`: the outcome is unknown (an error, a timeout, a lost
    /// connection).
    pub answer: Option<Answer>,
    /// The error that left the outcome unknown.
    pub error: Option<String>,
    /// An unknown outcome known to have taken effect before the request
    /// returned, its answer still unknown ([`History::applied`]): the
    /// checker then places it within its call and return, not anywhere
    /// after its call.
    pub applied: bool,
    /// A located request's: DEDUCT.AT's and HOLD.AT's policy and
    /// locations (comma separated, in the caller's order), HOLD.EXTEND's
    /// and HOLD.SHRINK's change_id, and HOLD.EXTEND's level (its ttl_ms
    /// 600 s plus `level` minutes); empty otherwise.
    pub located: Located,
}

/// What a request on a SKU kept by location asked beyond kind, sku, id
/// and qty, and what its answer said beyond code and remain.
#[derive(Debug, Clone, Default)]
pub struct Located {
    pub policy: &'static str,
    pub locations: String,
    pub change: String,
    pub level: i64,
    /// DEDUCT.AT's and HOLD.AT's allocation answered (`w1=2,w2=1`),
    /// STOCK.LOCATIONS's locations (`w1:<available>/<held>,...`).
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A stock call's code and remain.
    Code(i64, i64),
    /// STOCK.GET's stock (`None`: no stock key).
    Stock(Option<i64>),
}

#[derive(Debug, Clone)]
pub struct History {
    pub initial_stock: i64,
    /// A located load's: each sku's locations at the start, (name, units,
    /// floor); empty for the others.
    pub initial_locations: Vec<(String, i64, i64)>,
    pub ops: Vec<Op>,
    /// The instant call and return times count from.
    pub started: Instant,
}

/// What the load does.
#[derive(Debug, Clone)]
pub struct Load {
    pub skus: Vec<String>,
    pub initial_stock: i64,
    pub clients: usize,
    /// Requests each client sends (retries included); with [`start`], the
    /// most it sends before it is stopped.
    pub ops_per_client: usize,
    /// A client's pause after each request: a load that must span a fault
    /// of several seconds keeps its history small enough to check.
    pub pause: Duration,
    pub seed: u64,
}

/// What the checker said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// Not linearizable; the visualization's path.
    Illegal(PathBuf),
    /// The checker ran out of time.
    Unknown,
}

/// A small xorshift generator: a load is replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

async fn connect(addr: SocketAddr) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)))
        .set_connection_timeout(Some(Duration::from_secs(10)));
    redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connects to stockgate")
}

/// Runs `load` through the stockgates at `addrs` (each client alternates
/// between them, and retries through the other one), recording every
/// request, until each client has sent `load.ops_per_client`. Every sku
/// must hold `load.initial_stock` before.
pub async fn record(addrs: &[SocketAddr], load: &Load) -> History {
    start(addrs, load).finish().await
}

/// A load being recorded ([`start`]).
pub struct Recording {
    started: Instant,
    initial_stock: i64,
    initial_locations: Vec<(String, i64, i64)>,
    stop: Arc<AtomicBool>,
    ops: Arc<Mutex<Vec<Op>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recording {
    /// How many requests called after `t` have an answer so far.
    pub fn answered_after(&self, t: Instant) -> usize {
        let from = t.saturating_duration_since(self.started).as_nanos() as i64;
        let ops = self.ops.lock().unwrap();
        ops.iter()
            .filter(|o| o.call_ns > from && o.answer.is_some())
            .count()
    }

    /// Lets every client finish its `ops_per_client`; the history.
    pub async fn finish(self) -> History {
        for task in self.tasks {
            task.await.expect("a client's load");
        }
        let mut ops = Arc::try_unwrap(self.ops).unwrap().into_inner().unwrap();
        ops.sort_by_key(|o| o.call_ns);
        History {
            initial_stock: self.initial_stock,
            initial_locations: self.initial_locations,
            ops,
            started: self.started,
        }
    }

    /// Stops the clients from sending new requests, lets those in flight
    /// end (a request whose outcome is still unknown is sent again, as
    /// usual, at most three times), and returns the history.
    pub async fn stop(self) -> History {
        self.stop.store(true, Ordering::Relaxed);
        self.finish().await
    }
}

/// [`record`], running in the background until [`Recording::stop`] (or
/// until each client has sent `load.ops_per_client`): for a load that
/// spans a fault.
pub fn start(addrs: &[SocketAddr], load: &Load) -> Recording {
    let start = Instant::now();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..load.clients {
        let addrs = addrs.to_vec();
        let load = load.clone();
        let ops = ops.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut conns = Vec::new();
            for addr in &addrs {
                conns.push(connect(*addr).await);
            }
            let mut rng =
                Rng((load.seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
            // This client's ids: (sku, id, qty, kind) of what it sent.
            let mut mine: Vec<(String, String, i64, &'static str)> = Vec::new();
            let mut sent = 0;
            let mut next_id = 0;
            while sent < load.ops_per_client && !stop.load(Ordering::Relaxed) {
                let via = rng.below(conns.len() as u64) as usize;
                let sku = load.skus[rng.below(load.skus.len() as u64) as usize].clone();
                let roll = rng.below(100);
                let (kind, sku, id, qty) = if roll < 35 || mine.is_empty() {
                    next_id += 1;
                    let id = format!("c{client}-{next_id}");
                    let qty = 1 + rng.below(3) as i64;
                    mine.push((sku.clone(), id.clone(), qty, "deduct"));
                    ("deduct", sku, id, qty)
                } else if roll < 45 {
                    // A retry of an earlier id, as a caller that lost its
                    // answer sends it: same sku, qty, and kind.
                    let (sku, id, qty, kind) = mine[rng.below(mine.len() as u64) as usize].clone();
                    (kind, sku, id, qty)
                } else if roll < 58 {
                    let (sku, id, _, _) = mine[rng.below(mine.len() as u64) as usize].clone();
                    ("revert", sku, id, 0)
                } else if roll < 62 {
                    next_id += 1;
                    ("revert", sku, format!("c{client}-{next_id}"), 0)
                } else if roll < 74 {
                    next_id += 1;
                    let id = format!("c{client}-{next_id}");
                    let qty = 1 + rng.below(2) as i64;
                    mine.push((sku.clone(), id.clone(), qty, "hold"));
                    ("hold", sku, id, qty)
                } else if roll < 84 {
                    let held: Vec<_> = mine.iter().filter(|m| m.3 == "hold").collect();
                    match held.get(rng.below(held.len().max(1) as u64) as usize) {
                        Some((sku, id, _, _)) => ("confirm", sku.clone(), id.clone(), 0),
                        None => ("get", sku, String::new(), 0),
                    }
                } else {
                    ("get", sku, String::new(), 0)
                };
                // Sent until it gets an answer, each attempt through the
                // next stockgate, at most three times.
                for attempt in 0..3 {
                    let conn = &mut conns[(via + attempt) % addrs.len()];
                    let mut cmd = match kind {
                        "deduct" => redis::cmd("DEDUCT"),
                        "revert" => redis::cmd("REVERT"),
                        "hold" => redis::cmd("HOLD"),
                        "confirm" => redis::cmd("CONFIRM"),
                        _ => redis::cmd("STOCK.GET"),
                    };
                    cmd.arg(&sku);
                    match kind {
                        "deduct" => {
                            cmd.arg(qty).arg(&id);
                        }
                        "hold" => {
                            cmd.arg(qty).arg(&id).arg(600_000);
                        }
                        "revert" | "confirm" => {
                            cmd.arg(&id);
                        }
                        _ => {}
                    }
                    let call_ns = start.elapsed().as_nanos() as i64;
                    let reply: redis::RedisResult<Value> = cmd.query_async(conn).await;
                    let ret_ns = start.elapsed().as_nanos() as i64;
                    let answer = match (kind, &reply) {
                        ("get", Ok(Value::Int(stock))) => Some(Answer::Stock(Some(*stock))),
                        ("get", Ok(Value::Nil)) => Some(Answer::Stock(None)),
                        (_, Ok(Value::Array(items))) => match (items.first(), items.get(1)) {
                            (Some(Value::Int(code)), Some(Value::Int(remain))) => {
                                Some(Answer::Code(*code, *remain))
                            }
                            _ => panic!("{kind} {sku} {id}: {items:?}"),
                        },
                        (_, Ok(other)) => panic!("{kind} {sku} {id}: {other:?}"),
                        (_, Err(_)) => None,
                    };
                    let error = reply.as_ref().err().map(|e| e.to_string());
                    let known = answer.is_some();
                    ops.lock().unwrap().push(Op {
                        client,
                        kind,
                        sku: sku.clone(),
                        id: id.clone(),
                        qty,
                        call_ns,
                        ret_ns,
                        answer,
                        error,
                        applied: false,
                        located: Located::default(),
                    });
                    sent += 1;
                    if known {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if !load.pause.is_zero() {
                    tokio::time::sleep(load.pause).await;
                }
            }
        }));
    }
    Recording {
        started: start,
        initial_stock: load.initial_stock,
        initial_locations: Vec::new(),
        stop,
        ops,
        tasks,
    }
}

/// What a load on SKUs kept by location does ([`record_located`]).
#[derive(Debug, Clone)]
pub struct LocatedLoad {
    pub skus: Vec<String>,
    /// Each sku's locations at the start: (name, units, floor).
    pub places: Vec<(String, i64, i64)>,
    pub clients: usize,
    /// Requests each client sends (retries included).
    pub ops_per_client: usize,
    pub seed: u64,
}

/// One request a located client made, for its later requests on it.
struct Made {
    kind: &'static str,
    sku: String,
    id: String,
    qty: i64,
    located: Located,
}

/// [`record`] for SKUs kept by location: each client sends DEDUCT.AT and
/// HOLD.AT (1 to 3 units, SPLIT or WHOLE, over one or all of the
/// locations in a random order), some of them again later as a caller
/// that lost its answer does, REVERTs of its own requests and of ids
/// never used, CONFIRMs of its holds, HOLD.EXTENDs of its holds to a
/// level above any it asked for that hold before (or one of its changes
/// sent again), HOLD.SHRINKs of one unit, and STOCK.LOCATIONS, each sent
/// until answered (at most three times, each through the next
/// stockgate). Every sku must hold `load.places` before.
pub async fn record_located(addrs: &[SocketAddr], load: &LocatedLoad) -> History {
    let start = Instant::now();
    let ops = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in 0..load.clients {
        let addrs = addrs.to_vec();
        let load = load.clone();
        let ops = ops.clone();
        tasks.push(tokio::spawn(async move {
            let mut conns = Vec::new();
            for addr in &addrs {
                conns.push(connect(*addr).await);
            }
            let mut rng =
                Rng((load.seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
            let names: Vec<String> = load.places.iter().map(|p| p.0.clone()).collect();
            let mut mine: Vec<Made> = Vec::new();
            // This client's holds' last levels asked, and its changes.
            let mut levels: std::collections::HashMap<String, i64> = Default::default();
            let mut changes: Vec<Made> = Vec::new();
            let (mut sent, mut next_id) = (0, 0);
            while sent < load.ops_per_client {
                let via = rng.below(conns.len() as u64) as usize;
                let sku = load.skus[rng.below(load.skus.len() as u64) as usize].clone();
                let roll = rng.below(100);
                let holds: Vec<usize> = (0..mine.len())
                    .filter(|&i| mine[i].kind == "hold_at")
                    .collect();
                let request = if roll < 37 || mine.is_empty() {
                    next_id += 1;
                    let mut order = names.clone();
                    for i in (1..order.len()).rev() {
                        order.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                    order.truncate(if rng.below(2) == 0 { 1 } else { order.len() });
                    let made = Made {
                        kind: if roll < 25 { "deduct_at" } else { "hold_at" },
                        sku,
                        id: format!("c{client}-{next_id}"),
                        qty: 1 + rng.below(3) as i64,
                        located: Located {
                            policy: if rng.below(3) == 0 { "WHOLE" } else { "SPLIT" },
                            locations: order.join(","),
                            ..Located::default()
                        },
                    };
                    let request = made.again();
                    mine.push(made);
                    request
                } else if roll < 47 {
                    mine[rng.below(mine.len() as u64) as usize].again()
                } else if roll < 57 {
                    let made = &mine[rng.below(mine.len() as u64) as usize];
                    Made::on("revert", made, Located::default())
                } else if roll < 61 {
                    next_id += 1;
                    Made {
                        kind: "revert",
                        sku,
                        id: format!("c{client}-{next_id}"),
                        qty: 0,
                        located: Located::default(),
                    }
                } else if roll < 87 && !holds.is_empty() {
                    let made = &mine[holds[rng.below(holds.len() as u64) as usize]];
                    if roll < 69 {
                        Made::on("confirm", made, Located::default())
                    } else if roll < 73 && !changes.is_empty() {
                        changes[rng.below(changes.len() as u64) as usize].again()
                    } else {
                        next_id += 1;
                        let change = format!("k{client}-{next_id}");
                        let request = if roll < 80 {
                            let level = levels.entry(made.id.clone()).or_default();
                            *level += 1;
                            let located = Located {
                                change,
                                level: *level,
                                ..Located::default()
                            };
                            Made::on("extend", made, located)
                        } else {
                            let mut shrink = Made::on(
                                "shrink",
                                made,
                                Located {
                                    change,
                                    ..Located::default()
                                },
                            );
                            shrink.qty = 1;
                            shrink
                        };
                        changes.push(request.again());
                        request
                    }
                } else {
                    Made {
                        kind: "locations",
                        sku,
                        id: String::new(),
                        qty: 0,
                        located: Located::default(),
                    }
                };
                for attempt in 0..3 {
                    let conn = &mut conns[(via + attempt) % addrs.len()];
                    let call_ns = start.elapsed().as_nanos() as i64;
                    let reply: redis::RedisResult<Value> =
                        request.command().query_async(conn).await;
                    let ret_ns = start.elapsed().as_nanos() as i64;
                    let (answer, detail) = match &reply {
                        Ok(value) => {
                            let (code, remain, detail) = request.read(value);
                            (Some(Answer::Code(code, remain)), detail)
                        }
                        Err(_) => (None, String::new()),
                    };
                    let known = answer.is_some();
                    ops.lock().unwrap().push(Op {
                        client,
                        kind: request.kind,
                        sku: request.sku.clone(),
                        id: request.id.clone(),
                        qty: request.qty,
                        call_ns,
                        ret_ns,
                        answer,
                        error: reply.as_ref().err().map(|e| e.to_string()),
                        applied: false,
                        located: Located {
                            detail,
                            ..request.located.clone()
                        },
                    });
                    sent += 1;
                    if known {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    Recording {
        started: start,
        initial_stock: 0,
        initial_locations: load.places.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        ops,
        tasks,
    }
    .finish()
    .await
}

impl Made {
    /// The same request again.
    fn again(&self) -> Made {
        Made {
            kind: self.kind,
            sku: self.sku.clone(),
            id: self.id.clone(),
            qty: self.qty,
            located: self.located.clone(),
        }
    }

    /// A request of `kind` on the request `made`.
    fn on(kind: &'static str, made: &Made, located: Located) -> Made {
        Made {
            kind,
            sku: made.sku.clone(),
            id: made.id.clone(),
            qty: 0,
            located,
        }
    }

    fn command(&self) -> redis::Cmd {
        let located = &self.located;
        let mut cmd = match self.kind {
            "deduct_at" | "hold_at" => {
                let hold = self.kind == "hold_at";
                let mut cmd = redis::cmd(if hold { "HOLD.AT" } else { "DEDUCT.AT" });
                cmd.arg(&self.sku).arg(self.qty).arg(&self.id);
                if hold {
                    cmd.arg(600_000);
                }
                cmd.arg(located.policy);
                for name in located.locations.split(',') {
                    cmd.arg(name);
                }
                return cmd;
            }
            "extend" | "shrink" => {
                let mut cmd = redis::cmd(if self.kind == "extend" {
                    "HOLD.EXTEND"
                } else {
                    "HOLD.SHRINK"
                });
                cmd.arg(&self.sku).arg(&self.id).arg(&located.change);
                if self.kind == "extend" {
                    cmd.arg(600_000 + 60_000 * located.level);
                } else {
                    cmd.arg(self.qty);
                }
                return cmd;
            }
            "locations" => redis::cmd("STOCK.LOCATIONS"),
            _ => redis::cmd(&self.kind.to_uppercase()),
        };
        cmd.arg(&self.sku);
        if self.kind != "locations" {
            cmd.arg(&self.id);
        }
        cmd
    }

    /// An answer's code, remain and detail ([`Located::detail`]).
    fn read(&self, value: &Value) -> (i64, i64, String) {
        let Value::Array(items) = value else {
            panic!("{} {} {}: {value:?}", self.kind, self.sku, self.id)
        };
        let int = |v: &Value| match v {
            Value::Int(n) => *n,
            other => panic!("{} {}: not an integer: {other:?}", self.kind, self.id),
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("{} {}: not text: {other:?}", self.kind, self.id),
        };
        if self.kind == "locations" {
            let each: Vec<String> = items[1..]
                .iter()
                .map(|item| match item {
                    Value::Array(p) => format!("{}:{}/{}", text(&p[0]), int(&p[1]), int(&p[2])),
                    other => panic!("STOCK.LOCATIONS: {other:?}"),
                })
                .collect();
            return (0, int(&items[0]), each.join(","));
        }
        let detail = match items.get(6) {
            Some(Value::Array(flat)) if matches!(self.kind, "deduct_at" | "hold_at") => flat
                .chunks(2)
                .map(|pair| format!("{}={}", text(&pair[0]), int(&pair[1])))
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        };
        (int(&items[0]), int(&items[1]), detail)
    }
}

impl History {
    fn to_json(&self) -> String {
        let ops: Vec<serde_json::Value> = self
            .ops
            .iter()
            .map(|o| {
                let mut op = serde_json::json!({
                    "client": o.client, "kind": o.kind, "sku": o.sku, "id": o.id,
                    "qty": o.qty, "call": o.call_ns, "ret": o.ret_ns,
                    "known": o.answer.is_some(), "applied": o.applied,
                });
                // For whoever reads an illegal history; the checker ignores it.
                if let Some(error) = &o.error {
                    op["error"] = error.as_str().into();
                }
                let located = &o.located;
                if !located.policy.is_empty() || !located.change.is_empty() {
                    op["policy"] = located.policy.into();
                    op["locations"] = located.locations.as_str().into();
                    op["change"] = located.change.as_str().into();
                    op["level"] = located.level.into();
                }
                if o.answer.is_some() && !located.detail.is_empty() {
                    op["detail"] = located.detail.as_str().into();
                }
                match &o.answer {
                    Some(Answer::Code(code, remain)) => {
                        op["code"] = (*code).into();
                        op["remain"] = (*remain).into();
                    }
                    Some(Answer::Stock(stock)) => op["stock"] = serde_json::json!(stock),
                    None => {}
                }
                op
            })
            .collect();
        let places: Vec<serde_json::Value> = self
            .initial_locations
            .iter()
            .map(|(name, units, floor)| serde_json::json!({"name": name, "units": units, "floor": floor}))
            .collect();
        serde_json::json!({"initial_stock": self.initial_stock, "initial_locations": places, "ops": ops})
            .to_string()
    }

    /// Requests whose outcome is unknown.
    pub fn unknown(&self) -> usize {
        self.ops.iter().filter(|o| o.answer.is_none()).count()
    }

    /// `t` on this history's clock (nanoseconds since it started; negative
    /// before).
    pub fn at(&self, t: Instant) -> i64 {
        match t.checked_duration_since(self.started) {
            Some(after) => after.as_nanos() as i64,
            None => -(self.started.duration_since(t).as_nanos() as i64),
        }
    }

    /// A copy without the requests `leave_out` picks, and how many it
    /// left out. Only for answers the system under test never promised
    /// (each caller says which and why): a request left out must have had
    /// no effect, or the model would miss a change.
    pub fn without(&self, leave_out: impl Fn(&Op) -> bool) -> (History, usize) {
        let mut kept = self.clone();
        kept.ops.retain(|o| !leave_out(o));
        let dropped = self.ops.len() - kept.ops.len();
        (kept, dropped)
    }

    /// A copy in which the unknown outcomes `pick` picks are known to have
    /// taken effect before they returned (their answers still unknown),
    /// and how many it picked. Only for requests whose error says so and
    /// whose effect nothing could undo after (each caller says why).
    pub fn applied(&self, pick: impl Fn(&Op) -> bool) -> (History, usize) {
        let mut marked = self.clone();
        let mut count = 0;
        for op in marked.ops.iter_mut() {
            if op.answer.is_none() && pick(op) {
                op.applied = true;
                count += 1;
            }
        }
        (marked, count)
    }

    /// How many requests got each kind of answer: `"deduct Some(2)"` for
    /// DEDUCTs answered 2, `"get Some(-1)"` for answered reads, `"... None"`
    /// for unknown outcomes.
    pub fn answers(&self) -> std::collections::BTreeMap<String, usize> {
        self.ops.iter().fold(Default::default(), |mut m, o| {
            let code = o.answer.as_ref().map(|a| match a {
                Answer::Code(code, _) => *code,
                Answer::Stock(_) => -1,
            });
            *m.entry(format!("{} {code:?}", o.kind)).or_default() += 1;
            m
        })
    }

    /// [`History::check`], failing unless porcupine found the history
    /// linearizable: Illegal names the visualization to read, Unknown (the
    /// checker ran out of time) is a failure too, since nothing was proven.
    pub fn assert_linearizable(&self, name: &str) {
        match self.check(name) {
            Verdict::Linearizable => {}
            Verdict::Illegal(html) => panic!(
                "{name}: {} requests ({} with an unknown outcome) are not linearizable; porcupine's visualization is {} (the history is the .json beside it)",
                self.ops.len(),
                self.unknown(),
                html.display()
            ),
            Verdict::Unknown => panic!(
                "{name}: the linearizability checker ran out of time on {} requests ({} with an unknown outcome), so nothing was proven; make the load smaller (fewer clients, a longer pause) rather than the checker's budget larger",
                self.ops.len(),
                self.unknown()
            ),
        }
    }

    /// Asks porcupine. The history and, when illegal, the visualization go
    /// to `target/linearizability/<name>.*`.
    pub fn check(&self, name: &str) -> Verdict {
        self.check_within(name, Duration::from_secs(120))
    }

    /// [`History::check`], with porcupine given `budget` (whole seconds)
    /// before it answers Unknown.
    pub fn check_within(&self, name: &str, budget: Duration) -> Verdict {
        let dir = crate::support::in_repo("target/linearizability");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, self.to_json()).unwrap();
        let html = dir.join(format!("{name}.html"));
        let out = Command::new(checker())
            .arg(&file)
            .arg(&html)
            .arg(budget.as_secs().max(1).to_string())
            .output()
            .expect("runs the linearizability checker");
        eprintln!(
            "[linearizability] {name}: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
        match out.status.code() {
            Some(0) => Verdict::Linearizable,
            Some(1) => Verdict::Illegal(html),
            Some(2) => Verdict::Unknown,
            _ => panic!(
                "the checker failed on {}: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// A copy with one answer made wrong: the remain of a DEDUCT answered
    /// 0, one higher than it was (as if a unit had been counted twice).
    pub fn with_one_answer_flipped(&self) -> History {
        let mut flipped = self.clone();
        let op = flipped
            .ops
            .iter_mut()
            .find(|o| o.kind == "deduct" && matches!(o.answer, Some(Answer::Code(0, _))))
            .expect("a DEDUCT answered 0");
        if let Some(Answer::Code(_, remain)) = &mut op.answer {
            *remain += 1;
        }
        flipped
    }
}

impl History {
    /// A copy in which one DEDUCT.AT or HOLD.AT answered 0 that named one
    /// location says its units came from another location of the SKU, its
    /// code and remain kept: an allocation no order can explain, since a
    /// call takes only from the locations it names. `None` when there is
    /// no such request.
    pub fn with_one_allocation_moved(&self) -> Option<History> {
        let mut moved = self.clone();
        let names: Vec<String> = self.initial_locations.iter().map(|p| p.0.clone()).collect();
        let op = moved.ops.iter_mut().find(|o| {
            matches!(o.kind, "deduct_at" | "hold_at")
                && matches!(o.answer, Some(Answer::Code(0, _)))
                && !o.located.locations.contains(',')
        })?;
        let named = op.located.locations.clone();
        let other = names.iter().find(|n| **n != named)?;
        op.located.detail =
            op.located
                .detail
                .replacen(&format!("{named}="), &format!("{other}="), 1);
        Some(moved)
    }
}

impl History {
    /// A copy in which a request that was the first of its request_id, a
    /// DEDUCT or HOLD sent after `after_ns` and answered 0 or 2, is
    /// answered 1 instead (a duplicate), its remain kept: as if stockgate
    /// had found a record nobody wrote. No order can explain it (its
    /// client sends an id's later requests only after this one returned,
    /// and no other client uses the id), however many outcomes around it
    /// are unknown; `None` when there is no such request.
    pub fn with_a_first_request_answered_duplicate(&self, after_ns: i64) -> Option<History> {
        let mut flipped = self.clone();
        let mut seen = std::collections::HashSet::new();
        let op = flipped.ops.iter_mut().find(|o| {
            let first = seen.insert((o.sku.clone(), o.id.clone()));
            first
                && o.call_ns > after_ns
                && matches!(o.kind, "deduct" | "hold")
                && matches!(o.answer, Some(Answer::Code(0 | 2, _)))
        })?;
        if let Some(Answer::Code(code, _)) = &mut op.answer {
            *code = 1;
        }
        Some(flipped)
    }
}

/// The checker, built once per test run with `go build` from the
/// committed go.mod and go.sum (porcupine from the Go module proxy).
fn checker() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        const HINT: &str = "the linearizability checker needs Go 1.26+ on PATH: install the official release in /usr/local/go, or run any Go 1.21+ with GOTOOLCHAIN=go1.26.8";
        let output = crate::support::in_repo("target/linearizability/checker");
        let out = Command::new("go")
            .args(["build", "-mod=readonly", "-buildvcs=false", "-o"])
            .arg(&output)
            .arg(".")
            .current_dir(crate::support::in_repo("tests/linearizability"))
            .env("GOWORK", "off")
            .output()
            .unwrap_or_else(|e| panic!("cannot run go ({e}): {HINT}"));
        assert!(
            out.status.success(),
            "go build of the checker failed ({HINT}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        output
    })
}
