//! An order service in miniature, against a running stockgate.
//!
//! It places `--orders` orders concurrently. Each one DEDUCTs its stock;
//! then its payment fails for some (`--payment-failures` percent) and those
//! orders REVERT. Timeouts, dropped connections and `UPSTREAM`/`BADREPLY`
//! errors leave the outcome unknown, so the request is sent again with the
//! same request_id; some requests are also sent twice on purpose
//! (`--duplicates` percent), as a client's own retry would, and answer 1.
//! Which orders fail payment or resend is drawn from `--seed`, so a run can
//! be repeated; which ones find the stock short depends on timing.
//!
//! At the end it reconciles, as an order service would overnight: units
//! deducted minus units given back must equal the change of the stock
//! (`STOCK.GET` before and after), and each order's record
//! (`STOCK.STATUS`) must say what the service believes happened. The exit
//! status is 0 only when everything adds up.
//!
//! Then, being a demo on a shared dev cluster, it gives back the units its
//! paid orders kept (a REVERT each), so the sku's stock is what it was
//! before the run and examples that come after it see the stock they
//! expect. `--keep` leaves them deducted, as a real order service would.
//!
//! ```text
//! deploy/dev.sh                       # in another terminal: demo-1 = 100
//! cargo run --example order_flow      # 50 orders of demo-1 on 127.0.0.1:6390, given back after
//! cargo run --example order_flow -- --keep   # the paid orders keep their units
//! cargo run --example order_flow -- 127.0.0.1:6390 --sku demo-2 --orders 20 --seed 7
//! cargo run --example order_flow -- --timeout-ms 5   # provoke timeouts and retries
//! ```
//!
//! Nothing else may change the sku's stock during a run: the check compares
//! before and after. Each run names its request_ids after `--run-id` (by
//! default the clock), so runs never collide.

use clap::Parser;
use futures_util::{StreamExt, stream};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, FromRedisValue, RedisError, Value};
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Parser)]
#[command(about = "Places orders through stockgate, fails some payments, reconciles the stock")]
struct Args {
    /// stockgate's RESP address.
    #[arg(default_value = "127.0.0.1:6390")]
    addr: String,
    #[arg(long, default_value = "demo-1")]
    sku: String,
    #[arg(long, default_value_t = 50)]
    orders: u64,
    /// Orders in flight at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Each order takes 1 to this many units.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    max_qty: u64,
    /// Percent of orders whose payment fails, so they REVERT.
    #[arg(long, default_value_t = 20)]
    payment_failures: u64,
    /// Percent of DEDUCTs and REVERTs sent a second time on purpose.
    #[arg(long, default_value_t = 10)]
    duplicates: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long to wait for one reply. Keep it above stockgate's --timeout
    /// (1s) in production; lower it here to see retries.
    #[arg(long, default_value_t = 1500)]
    timeout_ms: u64,
    /// How many times one request is sent before its outcome is called unknown.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    attempts: u32,
    /// Prefix of this run's request_ids and order numbers.
    #[arg(long)]
    run_id: Option<String>,
    /// Leave the paid orders' units deducted after the reconciliation;
    /// without it they are given back (REVERT), so the demo leaves the
    /// stock as it found it.
    #[arg(long)]
    keep: bool,
}

/// SplitMix64: a tiny seeded generator, so a run's choices can be repeated.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// How one order ended, as the order service knows it.
#[derive(Debug)]
enum Outcome {
    /// Deducted and paid for: the stock stays taken.
    Kept,
    /// Deducted, the payment failed, given back by REVERT.
    Reverted,
    /// DEDUCT answered 2: not enough stock. Nothing was taken.
    OutOfStock,
    /// DEDUCT's outcome stayed unknown, so the order was cancelled with
    /// REVERT; `given_back` says whether it had been deducted after all.
    Cancelled { given_back: bool },
    /// An answer no retry changes (code 3, an unexpected 4, UNKNOWNSKU...),
    /// or a REVERT still unknown: needs a person.
    Unsettled(String),
}

impl Outcome {
    /// Whether this order's DEDUCT took stock at some point.
    fn took_stock(&self) -> bool {
        matches!(
            self,
            Outcome::Kept | Outcome::Reverted | Outcome::Cancelled { given_back: true }
        )
    }

    /// Whether a REVERT gave that stock back.
    fn gave_back(&self) -> bool {
        matches!(
            self,
            Outcome::Reverted | Outcome::Cancelled { given_back: true }
        )
    }
}

/// One order's result and what it saw on the way.
struct Placed {
    request_id: String,
    qty: u64,
    outcome: Outcome,
    /// Code 1 answers: a resend of something already applied.
    duplicates: u64,
    /// Requests sent again after an unknown outcome.
    retries: u64,
}

/// Why a request got no business answer.
enum Fault {
    /// No answer within `--attempts`: it may or may not have been applied.
    Unknown(String),
    /// An error reply that says nothing changed and a retry won't help.
    Refused(String),
}

/// The four fixed elements of a DEDUCT or REVERT reply.
struct Reply {
    code: i64,
    order_no: String,
}

/// Sends `cmd` until it gets an answer. Timeouts, dropped connections,
/// UPSTREAM and BADREPLY leave the outcome unknown; resending the same
/// request_id is safe, because a request already applied answers 1.
async fn send(
    conn: &mut ConnectionManager,
    cmd: &Cmd,
    attempts: u32,
    retries: &mut u64,
) -> Result<Value, Fault> {
    let mut last = String::new();
    for attempt in 1..=attempts {
        if attempt > 1 {
            *retries += 1;
            let backoff = 20u64 << (attempt - 2).min(5);
            tokio::time::sleep(Duration::from_millis(backoff)).await;
        }
        match cmd.query_async::<Value>(conn).await {
            Ok(value) => return Ok(value),
            Err(err) if outcome_unknown(&err) => last = err.to_string(),
            Err(err) => return Err(Fault::Refused(err.to_string())),
        }
    }
    Err(Fault::Unknown(last))
}

fn outcome_unknown(err: &RedisError) -> bool {
    match err.code() {
        Some(code) => code == "UPSTREAM" || code == "BADREPLY",
        // No error reply at all: a timeout or a dropped connection.
        None => true,
    }
}

/// Reads `[code, remain, order_no, version, ...]`.
fn reply(value: Value) -> Result<Reply, Fault> {
    let bad = |value: &Value| Fault::Refused(format!("unexpected reply {value:?}"));
    let Value::Array(items) = &value else {
        return Err(bad(&value));
    };
    match items.as_slice() {
        [
            Value::Int(code),
            Value::Int(_),
            Value::BulkString(order_no),
            Value::Int(_),
            ..,
        ] => Ok(Reply {
            code: *code,
            order_no: String::from_utf8_lossy(order_no).into_owned(),
        }),
        _ => Err(bad(&value)),
    }
}

/// What one order will do, drawn up front from the seed alone.
struct Plan {
    qty: u64,
    payment_fails: bool,
    resend_deduct: bool,
    resend_revert: bool,
}

impl Plan {
    fn draw(args: &Args, i: u64) -> Plan {
        let mut rng = Rng(args.seed.rotate_left(32) ^ i);
        Plan {
            qty: 1 + rng.below(args.max_qty),
            payment_fails: rng.percent(args.payment_failures),
            resend_deduct: rng.percent(args.duplicates),
            resend_revert: rng.percent(args.duplicates),
        }
    }
}

/// One order on its way, with what it has seen so far.
struct Order {
    conn: ConnectionManager,
    attempts: u32,
    duplicates: u64,
    retries: u64,
}

/// Places order `i`: DEDUCT, then pay, then REVERT if the payment failed.
async fn place(conn: ConnectionManager, args: &Args, run: &str, i: u64) -> Placed {
    let plan = Plan::draw(args, i);
    let request_id = format!("{run}-{i}");
    let mut deduct = redis::cmd("DEDUCT");
    deduct
        .arg(&args.sku)
        .arg(plan.qty)
        .arg(&request_id)
        .arg(format!("ORD-{run}-{i}"));
    let mut revert = redis::cmd("REVERT");
    revert.arg(&args.sku).arg(&request_id);
    let mut order = Order {
        conn,
        attempts: args.attempts,
        duplicates: 0,
        retries: 0,
    };
    let outcome = order.run(&plan, &deduct, &revert).await;
    Placed {
        request_id,
        qty: plan.qty,
        outcome,
        duplicates: order.duplicates,
        retries: order.retries,
    }
}

impl Order {
    async fn run(&mut self, plan: &Plan, deduct: &Cmd, revert: &Cmd) -> Outcome {
        let retries_before = self.retries;
        let deducted = self.call(deduct).await;
        let unsure = self.retries > retries_before;
        match deducted {
            // 0: deducted now; 1: by an earlier attempt whose reply was lost.
            Ok(Reply { code: 0 | 1, .. }) => {}
            // A first answer of 2 settles it: nothing was taken, ever.
            Ok(Reply { code: 2, .. }) if !unsure => return Outcome::OutOfStock,
            // But after an attempt whose outcome is unknown, that attempt
            // may still run later (stockgate doesn't promise the order in
            // which requests in flight run), and so may a DEDUCT that never
            // got an answer. REVERT settles both: it gives back what was
            // taken, or revokes the id so that a late DEDUCT takes nothing.
            Ok(Reply { code: 2, .. }) | Err(Fault::Unknown(_)) => return self.cancel(revert).await,
            other => return Outcome::Unsettled(describe("DEDUCT", other)),
        }
        if plan.resend_deduct {
            // A client's retry of an applied DEDUCT: 1, nothing taken again.
            let _ = self.call(deduct).await;
        }
        if !plan.payment_fails {
            return Outcome::Kept;
        }
        // Compensation: the qty given back is the one stockgate recorded.
        // 1 means an earlier attempt gave it back and its reply was lost.
        match self.call(revert).await {
            Ok(Reply { code: 0 | 1, .. }) => {}
            other => return Outcome::Unsettled(describe("REVERT", other)),
        }
        if plan.resend_revert {
            let _ = self.call(revert).await;
        }
        Outcome::Reverted
    }

    /// Cancels an order whose DEDUCT may or may not have been applied.
    async fn cancel(&mut self, revert: &Cmd) -> Outcome {
        match self.call(revert).await {
            Ok(Reply { code: 0, .. }) => Outcome::Cancelled { given_back: true },
            // An earlier REVERT attempt did it: it gave back if the reply
            // carries the DEDUCT's order_no, it revoked if "".
            Ok(Reply { code: 1, order_no }) => Outcome::Cancelled {
                given_back: !order_no.is_empty(),
            },
            Ok(Reply { code: 4, .. }) => Outcome::Cancelled { given_back: false },
            other => Outcome::Unsettled(describe("REVERT", other)),
        }
    }

    /// One DEDUCT or REVERT, resent until it has an answer.
    async fn call(&mut self, cmd: &Cmd) -> Result<Reply, Fault> {
        let answer = send(&mut self.conn, cmd, self.attempts, &mut self.retries).await;
        let answer = answer.and_then(reply);
        if let Ok(Reply { code: 1, .. }) = answer {
            self.duplicates += 1;
        }
        answer
    }
}

fn describe(command: &str, answer: Result<Reply, Fault>) -> String {
    match answer {
        Ok(reply) => format!("{command} answered code {}", reply.code),
        Err(Fault::Unknown(why)) => {
            format!("{command} still unknown ({why}); retry it later with the same request_id")
        }
        Err(Fault::Refused(why)) => format!("{command} refused: {why}"),
    }
}

/// `STOCK.GET`, retried like the rest; None when the sku has no stock.
async fn stock(conn: &mut ConnectionManager, args: &Args) -> Result<Option<i64>, String> {
    let mut get = redis::cmd("STOCK.GET");
    get.arg(&args.sku);
    match send(conn, &get, args.attempts, &mut 0).await {
        Ok(Value::Int(stock)) => Ok(Some(stock)),
        Ok(Value::Nil) => Ok(None),
        Ok(other) => Err(format!("STOCK.GET answered {other:?}")),
        Err(Fault::Unknown(why) | Fault::Refused(why)) => Err(format!("STOCK.GET: {why}")),
    }
}

/// Checks one order's record (`STOCK.STATUS`) against what the order
/// service believes; Some(why) when they disagree.
async fn check_record(mut conn: ConnectionManager, args: &Args, placed: &Placed) -> Option<String> {
    let (state, qty) = match placed.outcome {
        Outcome::Kept => ("DEDUCTED", placed.qty),
        Outcome::Reverted | Outcome::Cancelled { given_back: true } => ("REVERTED", placed.qty),
        Outcome::Cancelled { given_back: false } => ("REVOKED", 0),
        Outcome::OutOfStock => ("none", 0),
        Outcome::Unsettled(_) => return None,
    };
    let mut status = redis::cmd("STOCK.STATUS");
    status.arg(&args.sku).arg(&placed.request_id);
    // A map: state, qty, order_no, ttl_ms, stock.
    let got = match send(&mut conn, &status, args.attempts, &mut 0).await {
        Ok(value) => HashMap::<String, Value>::from_redis_value(value)
            .map_err(|e| e.to_string())
            .map(|fields| (fields.get("state").cloned(), fields.get("qty").cloned())),
        Err(Fault::Unknown(why) | Fault::Refused(why)) => Err(why),
    };
    let want = (
        Some(Value::BulkString(state.as_bytes().to_vec())),
        Some(Value::Int(qty as i64)),
    );
    match got {
        Ok(got) if got == want => None,
        Ok(got) => Some(format!(
            "{}: the order service says {state} {qty}, the record {got:?}",
            placed.request_id
        )),
        Err(why) => Some(format!("{}: STOCK.STATUS failed: {why}", placed.request_id)),
    }
}

/// The run's books, as the order service keeps them.
#[derive(Default)]
struct Books {
    kept: u64,
    reverted: u64,
    cancelled_given_back: u64,
    cancelled_revoked: u64,
    out_of_stock: u64,
    unsettled: Vec<String>,
    duplicates: u64,
    retries: u64,
    units_deducted: u64,
    units_given_back: u64,
}

impl Books {
    fn of(orders: &[Placed]) -> Books {
        let mut books = Books::default();
        for order in orders {
            match &order.outcome {
                Outcome::Kept => books.kept += 1,
                Outcome::Reverted => books.reverted += 1,
                Outcome::Cancelled { given_back: true } => books.cancelled_given_back += 1,
                Outcome::Cancelled { given_back: false } => books.cancelled_revoked += 1,
                Outcome::OutOfStock => books.out_of_stock += 1,
                Outcome::Unsettled(why) => {
                    books.unsettled.push(format!("{}: {why}", order.request_id))
                }
            }
            if order.outcome.took_stock() {
                books.units_deducted += order.qty;
            }
            if order.outcome.gave_back() {
                books.units_given_back += order.qty;
            }
            books.duplicates += order.duplicates;
            books.retries += order.retries;
        }
        books
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let run = args.run_id.clone().unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        format!("flow-{}", now.as_millis())
    });
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(args.timeout_ms)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    let client = redis::Client::open(format!("redis://{}", args.addr)).expect("a valid address");
    let mut conn = match client.get_connection_manager_with_config(config).await {
        Ok(conn) => conn,
        Err(err) => {
            eprintln!("cannot connect to stockgate at {}: {err}", args.addr);
            return ExitCode::from(2);
        }
    };
    let before = match stock(&mut conn, &args).await {
        Ok(Some(stock)) => stock,
        Ok(None) => {
            eprintln!(
                "{} has no stock: pick a stocked sku with --sku (deploy/dev.sh seeds demo-1, demo-2, demo-3)",
                args.sku
            );
            return ExitCode::from(2);
        }
        Err(why) => {
            eprintln!("cannot read the stock: {why}");
            return ExitCode::from(2);
        }
    };
    println!(
        "{} orders of {} through {} (seed {}, run {run})",
        args.orders, args.sku, args.addr, args.seed
    );

    let orders: Vec<Placed> = stream::iter(0..args.orders)
        .map(|i| place(conn.clone(), &args, &run, i))
        .buffer_unordered(args.concurrency as usize)
        .collect()
        .await;

    let after = match stock(&mut conn, &args).await {
        Ok(Some(stock)) => stock,
        other => {
            eprintln!("cannot read the stock after the run: {other:?}");
            return ExitCode::FAILURE;
        }
    };
    let disagreeing: Vec<String> = stream::iter(&orders)
        .map(|placed| check_record(conn.clone(), &args, placed))
        .buffer_unordered(args.concurrency as usize)
        .filter_map(|why| async { why })
        .collect()
        .await;

    let books = Books::of(&orders);
    let net = books.units_deducted as i64 - books.units_given_back as i64;
    let balanced = before - after == net;
    let line = |name: &str, value: u64| println!("{:<32}{value}", format!("{name}:"));
    line("orders placed", orders.len() as u64);
    line(
        "deducted",
        books.kept + books.reverted + books.cancelled_given_back,
    );
    line("  kept (paid)", books.kept);
    line("  reverted (payment failed)", books.reverted);
    line("  cancelled, had been deducted", books.cancelled_given_back);
    line("failed for stock", books.out_of_stock);
    line("cancelled, never deducted", books.cancelled_revoked);
    line("unsettled", books.unsettled.len() as u64);
    line("duplicates seen", books.duplicates);
    line("retries", books.retries);
    line("units deducted", books.units_deducted);
    line("units given back", books.units_given_back);
    println!("{:<32}{before}", "stock before:");
    println!("{:<32}{after}", "stock after:");
    line("records disagreeing", disagreeing.len() as u64);
    let unsettled = &books.unsettled;
    for why in unsettled.iter().chain(&disagreeing) {
        println!("  {why}");
    }
    let books = format!(
        "{} deducted - {} given back = {net}, stock {before} - {after} = {}",
        books.units_deducted,
        books.units_given_back,
        before - after
    );
    let verdict = if !unsettled.is_empty() {
        println!(
            "cannot reconcile: {} orders unsettled ({books})",
            unsettled.len()
        );
        ExitCode::FAILURE
    } else if !balanced || !disagreeing.is_empty() {
        println!("books DO NOT balance: {books}");
        ExitCode::FAILURE
    } else {
        println!("books balance: {books}");
        ExitCode::SUCCESS
    };
    if args.keep {
        return verdict;
    }
    match give_back(&mut conn, &args, &orders).await {
        Ok((kept, units, stock)) => {
            println!(
                "gave back the {kept} paid orders' {units} units (--keep leaves them): {} stock now {stock}",
                args.sku
            );
            verdict
        }
        Err(why) => {
            println!("could not give back every paid order: {why}");
            ExitCode::FAILURE
        }
    }
}

/// REVERTs every paid order, so the demo leaves the stock as it found it:
/// how many orders, their units, and the stock after.
async fn give_back(
    conn: &mut ConnectionManager,
    args: &Args,
    orders: &[Placed],
) -> Result<(u64, u64, i64), String> {
    let (mut kept, mut units) = (0, 0);
    for placed in orders {
        if !matches!(placed.outcome, Outcome::Kept) {
            continue;
        }
        let mut revert = redis::cmd("REVERT");
        revert.arg(&args.sku).arg(&placed.request_id);
        match send(conn, &revert, args.attempts, &mut 0)
            .await
            .and_then(reply)
        {
            // 1: an attempt whose reply was lost gave it back.
            Ok(Reply { code: 0 | 1, .. }) => {}
            other => {
                return Err(format!(
                    "{}: {}",
                    placed.request_id,
                    describe("REVERT", other)
                ));
            }
        }
        kept += 1;
        units += placed.qty;
    }
    match stock(conn, args).await {
        Ok(Some(stock)) => Ok((kept, units, stock)),
        other => Err(format!(
            "cannot read the stock after giving back: {other:?}"
        )),
    }
}
