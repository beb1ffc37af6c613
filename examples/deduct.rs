//! DEDUCT from Rust with the `redis` crate, handling every outcome.
//!
//! Run it against `deploy/dev.sh` (which seeds demo-1 with 100 units):
//!
//! ```text
//! cargo run --example deduct -- 127.0.0.1:6390 demo-1 2 order-1001
//! ```

use redis::{RedisError, Value};

/// What the order service does next, decided by the reply alone.
enum Next {
    /// Deducted now (code 0) or earlier by this same request (code 1).
    Proceed { remain: i64, order_no: String },
    /// Code 2: not enough stock. Nothing changed; fail the order.
    FailOrder,
    /// Code 3: a bug in the caller. Nothing changed; don't retry as is.
    FixRequest(String),
    /// A system fault: the outcome may be unknown. Retry with the SAME
    /// request_id (safe: a retry of an applied request answers 1).
    RetrySameId(String),
    /// The sku has no stock record (UNKNOWNSKU) or corrupt data: an
    /// operator must look; retrying won't help.
    Escalate(String),
}

fn classify(reply: Result<Value, RedisError>) -> Next {
    let items = match reply {
        Ok(Value::Array(items)) if items.len() >= 4 => items,
        Ok(other) => return Next::RetrySameId(format!("unexpected reply {other:?}")),
        Err(err) => {
            return match err.code() {
                Some("UPSTREAM") | Some("BADREPLY") => Next::RetrySameId(err.to_string()),
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
    match int(&items[0]) {
        0 | 1 => Next::Proceed {
            remain: int(&items[1]),
            order_no: text(&items[2]),
        },
        2 => Next::FailOrder,
        3 => Next::FixRequest(items.get(4).map(text).unwrap_or_default()),
        code => Next::Escalate(format!("unknown code {code}: upgrade this client")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> redis::RedisResult<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:6390".into());
    let sku = args.next().unwrap_or_else(|| "demo-1".into());
    let qty = args.next().unwrap_or_else(|| "1".into());
    let request_id = args.next().unwrap_or_else(|| "example-request-1".into());

    let client = redis::Client::open(format!("redis://{addr}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    for attempt in 1..=3 {
        let reply = redis::cmd("DEDUCT")
            .arg(&sku)
            .arg(&qty)
            .arg(&request_id)
            .arg("ORD-EXAMPLE")
            .query_async(&mut conn)
            .await;
        match classify(reply) {
            Next::RetrySameId(why) => {
                eprintln!("attempt {attempt}: {why}; retrying with the same request_id");
                tokio::time::sleep(std::time::Duration::from_millis(100 * attempt)).await;
            }
            Next::Proceed { remain, order_no } => {
                println!("deducted (now or by an earlier try): {remain} left, order {order_no:?}");
                return Ok(());
            }
            Next::FailOrder => {
                println!("insufficient stock: fail the order");
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
    println!("still unknown after 3 attempts: park the order and retry later with the same id");
    Ok(())
}
