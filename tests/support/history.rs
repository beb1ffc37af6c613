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
}

/// What the load does.
#[derive(Debug, Clone)]
pub struct Load {
    pub skus: Vec<String>,
    pub initial_stock: i64,
    pub clients: usize,
    /// Requests each client sends (retries included).
    pub ops_per_client: usize,
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
/// request. Every sku must hold `load.initial_stock` before.
pub async fn record(addrs: &[SocketAddr], load: &Load) -> History {
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
            // This client's ids: (sku, id, qty, kind) of what it sent.
            let mut mine: Vec<(String, String, i64, &'static str)> = Vec::new();
            let mut sent = 0;
            let mut next_id = 0;
            while sent < load.ops_per_client {
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
                    let answer = match (kind, reply) {
                        ("get", Ok(Value::Int(stock))) => Some(Answer::Stock(Some(stock))),
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
    for task in tasks {
        task.await.expect("a client's load");
    }
    let mut ops = Arc::try_unwrap(ops).unwrap().into_inner().unwrap();
    ops.sort_by_key(|o| o.call_ns);
    History {
        initial_stock: load.initial_stock,
        ops,
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
                    "known": o.answer.is_some(),
                });
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

    /// Asks porcupine. The history and, when illegal, the visualization go
    /// to `target/linearizability/<name>.*`.
    pub fn check(&self, name: &str) -> Verdict {
        let dir = crate::support::in_repo("target/linearizability");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, self.to_json()).unwrap();
        let html = dir.join(format!("{name}.html"));
        let out = Command::new(checker())
            .arg(&file)
            .arg(&html)
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
