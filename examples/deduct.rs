//! DEDUCT and REVERT from Rust with the `redis` crate, handling every
//! outcome.
//!
//! Run it against `deploy/dev.sh` (which seeds demo-1 with 100 units):
//!
//! ```text
//! cargo run --example deduct -- 127.0.0.1:6390 demo-1 2 order-4001 ORD-4001
//! cargo run --example deduct -- --revert 127.0.0.1:6390 demo-1 order-4001
//! ```
//!
//! The first takes 2 units for order line order-4001, of order ORD-4001
//! (the order_no is optional; run it twice: the second is a retry,
//! "already deducted", nothing taken again). The second
//! gives them back, as the order service does when the payment fails or the
//! order is cancelled; it is safe to repeat, and safe even when the
//! DEDUCT's outcome is unknown. `examples/order_flow.rs` runs many orders
//! this way and reconciles the stock.

use redis::{RedisError, Value};

/// What the order service does next, decided by the reply alone.
enum Next {
    /// DEDUCT: deducted now (code 0) or earlier by this same request (1).
    Proceed { remain: i64, order_no: String },
    /// DEDUCT code 2: not enough stock. Nothing changed; fail the order.
    FailOrder,
    /// DEDUCT code 4: this id was reverted or revoked, so the order was
    /// cancelled. Nothing changed; a new order needs a new request_id.
    Cancelled,
    /// REVERT code 0 (given back), 1 (an earlier REVERT did it) or 4
    /// (nothing had been deducted; the id is now revoked): done either way.
    Compensated(String),
    /// Code 3: a bug in the caller. Nothing changed; don't retry as is.
    FixRequest(String),
    /// A system fault: the outcome may be unknown. Retry with the SAME
    /// request_id (safe: a retry of an applied request answers 1).
    RetrySameId(String),
    /// The sku has no stock record (UNKNOWNSKU) or corrupt data: an
    /// operator must look; retrying won't help.
    Escalate(String),
}

fn classify(command: &str, reply: Result<Value, RedisError>) -> Next {
    let items = match reply {
        Ok(Value::Array(items)) if items.len() >= 4 => items,
        Ok(other) => return Next::RetrySameId(format!("unexpected reply {other:?}")),
        Err(err) => {
            return match err.code() {
                Some("UPSTREAM") | Some("BADREPLY") => Next::RetrySameId(err.to_string()),
                // No error code: a timeout or a dropped connection.
                None => Next::RetrySameId(err.to_string()),
                _ => Next::Escalate(err.to_string()),
            };
        }
    };
    let int = |v: &Value| if let Value::Int(i) = v { *i } else { -1 };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    // Only the first four elements are fixed; ignore any extra ones.
    let (remain, order_no) = (int(&items[1]), text(&items[2]));
    match (command, int(&items[0])) {
        ("DEDUCT", 0 | 1) => Next::Proceed { remain, order_no },
        ("DEDUCT", 2) => Next::FailOrder,
        ("DEDUCT", 4) => Next::Cancelled,
        // The qty given back comes from stockgate's record, not from us.
        ("REVERT", 0) => Next::Compensated(format!("given back: {remain} in stock")),
        ("REVERT", 1) => Next::Compensated(format!("done by an earlier REVERT: {remain} in stock")),
        ("REVERT", 4) => Next::Compensated("nothing had been deducted; the id is revoked".into()),
        (_, 3) => Next::FixRequest(items.get(4).map(text).unwrap_or_default()),
        (_, code) => Next::Escalate(format!("unknown code {code}: upgrade this client")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1).peekable();
    let revert = args.next_if(|a| a == "--revert").is_some();
    let mut arg = |default: &str| args.next().unwrap_or_else(|| default.into());
    let addr = arg("127.0.0.1:6390");
    let sku = arg("demo-1");
    let name = if revert { "REVERT" } else { "DEDUCT" };
    let mut cmd = redis::cmd(name);
    cmd.arg(&sku);
    if revert {
        // No qty: REVERT gives back what the DEDUCT recorded.
        cmd.arg(arg("example-request-1"));
    } else {
        let qty = arg("1");
        cmd.arg(qty).arg(arg("example-request-1"));
        // The order_no is optional: send one only when given.
        if let Some(order_no) = args.next() {
            cmd.arg(order_no);
        }
    }

    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for attempt in 1..=3 {
        match classify(name, cmd.query_async(&mut conn).await) {
            Next::RetrySameId(why) => {
                eprintln!("attempt {attempt}: {why}; retrying with the same request_id");
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            Next::Proceed { remain, order_no } => {
                // The order_no stockgate stored with the first call: "" when
                // it was given none.
                if order_no.is_empty() {
                    println!("deducted (now or by an earlier try): {remain} left");
                } else {
                    println!(
                        "deducted (now or by an earlier try): {remain} left, order {order_no:?}"
                    );
                }
                return Ok(());
            }
            Next::FailOrder => {
                println!("insufficient stock: fail the order");
                return Ok(());
            }
            Next::Cancelled => {
                println!("reverted or revoked earlier: the order was cancelled, don't proceed");
                return Ok(());
            }
            Next::Compensated(what) => {
                println!("compensation done: {what}");
                return Ok(());
            }
            Next::FixRequest(reason) => {
                println!("invalid request: {reason}");
                return Ok(());
            }
            Next::Escalate(why) => {
                println!("needs an operator: {why}");
                return Ok(());
            }
        }
    }
    println!("still unknown after 3 attempts: park it and retry later with the same request_id");
    Ok(())
}
