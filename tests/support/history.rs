//! Histories for the linearizability checker (`tests/linearizability/`,
//! porcupine, in Go): concurrent clients send DEDUCT, retried DEDUCT,
//! REVERT, HOLD, CONFIRM and STOCK.GET through several stockgates, and
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
        stop,
        ops,
        tasks,
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
        serde_json::json!({"initial_stock": self.initial_stock, "ops": ops}).to_string()
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
