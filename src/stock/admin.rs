//! STOCK.GET, STOCK.SET and STOCK.ADD: an operator's view of stock, and
//! changes to it outside the order flow (restocking, corrections).
//!
//! # Format
//!
//! ```text
//! STOCK.GET <sku>              the stock, or nil when the sku has none
//! STOCK.SET <sku> <qty>        +OK                     (--admin-commands)
//! STOCK.ADD <sku> <delta>      the stock after it      (--admin-commands)
//! ```
//!
//! SET and ADD change stock outside the order flow, so they are refused
//! with `-NOPERM` unless stockgate runs with `--admin-commands`, and each
//! change is written to the `stockgate::audit` log target. ADD never takes
//! the stock below 0 (`lua/stock_add.lua`).

use super::{StockCommand, StockService};
use crate::command::spec::{CommandSpec, Serve, arg};
use crate::params::{Delta, Sku, StockLevel};
use crate::reply::Reply;
use bytes::Bytes;
use redis::Value;

pub const GET: CommandSpec = CommandSpec {
    name: "stock.get",
    arity: 2,
    max_args: None,
    flags: &["fast"],
    group: "stockgate",
    summary: "Returns a sku's stock, or nil when it has none.",
    args: &[arg("sku", "string")],
    subcommands: &[],
    serve: Serve::Stock(StockCommand::Get),
};

pub const SET: CommandSpec = CommandSpec {
    name: "stock.set",
    arity: 3,
    max_args: None,
    flags: &["write", "admin"],
    group: "stockgate",
    summary: "Sets a sku's stock (needs --admin-commands).",
    args: &[arg("sku", "string"), arg("qty", "integer")],
    subcommands: &[],
    serve: Serve::Stock(StockCommand::Set),
};

pub const ADD: CommandSpec = CommandSpec {
    name: "stock.add",
    arity: 3,
    max_args: None,
    flags: &["write", "admin"],
    group: "stockgate",
    summary: "Adds a signed delta to a sku's stock, never below 0 (needs --admin-commands).",
    args: &[arg("sku", "string"), arg("delta", "integer")],
    subcommands: &[],
    serve: Serve::Stock(StockCommand::Add),
};

const NOPERM: &str = "NOPERM STOCK.SET and STOCK.ADD change stock outside the order flow; start stockgate with --admin-commands to allow them";

impl StockService {
    /// `STOCK.GET <sku>`
    pub(super) async fn get(&self, args: &[Bytes]) -> Reply {
        let sku = match Sku::parse(args[0].clone()) {
            Ok(sku) => sku,
            Err(invalid) => return Reply::error(format!("ERR {invalid}")),
        };
        let mut get = redis::cmd("GET");
        get.arg(self.keys.stock_key(&sku));
        match self.upstream.query(&get).await {
            Ok(value) => stock_value(value),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// `STOCK.SET <sku> <qty>`
    pub(super) async fn set(&self, args: &[Bytes]) -> Reply {
        if !self.admin_commands {
            return Reply::error(NOPERM);
        }
        let (sku, level) = match (Sku::parse(args[0].clone()), StockLevel::parse(&args[1])) {
            (Ok(sku), Ok(level)) => (sku, level),
            (Err(invalid), _) | (_, Err(invalid)) => return Reply::error(format!("ERR {invalid}")),
        };
        let mut set = redis::cmd("SET");
        set.arg(self.keys.stock_key(&sku)).arg(level.0);
        match self.upstream.query(&set).await {
            Ok(_) => {
                audit("STOCK.SET", &sku, level.0);
                Reply::Simple("OK")
            }
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// `STOCK.ADD <sku> <delta>`
    pub(super) async fn add(&self, args: &[Bytes]) -> Reply {
        if !self.admin_commands {
            return Reply::error(NOPERM);
        }
        let (sku, delta) = match (Sku::parse(args[0].clone()), Delta::parse(&args[1])) {
            (Ok(sku), Ok(delta)) => (sku, delta),
            (Err(invalid), _) | (_, Err(invalid)) => return Reply::error(format!("ERR {invalid}")),
        };
        let stock_key = self.keys.stock_key(&sku);
        let result = self
            .upstream
            .eval(&self.scripts.stock_add, &[&stock_key], &[&args[1]])
            .await;
        match result {
            Ok(Value::Int(after)) => {
                audit("STOCK.ADD", &sku, delta.0);
                Reply::Integer(after)
            }
            Ok(other) => Reply::error(format!("BADREPLY STOCK.ADD answered {other:?}")),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }
}

/// A stock key's value as a reply: an integer, or nil when missing.
fn stock_value(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Null,
        Value::BulkString(raw) => match std::str::from_utf8(&raw).ok().and_then(|s| s.parse().ok())
        {
            Some(stock) => Reply::Integer(stock),
            None => Reply::error("BADSTOCK stock value is not an integer"),
        },
        other => Reply::error(format!("BADREPLY GET answered {other:?}")),
    }
}

/// Stock changed outside the order flow: who, what, by how much, in the
/// audit log (its own target, so it can be routed and kept apart).
fn audit(command: &str, sku: &Sku, value: i64) {
    tracing::info!(
        target: "stockgate::audit",
        command,
        sku = %String::from_utf8_lossy(sku.as_bytes()),
        value,
        "stock changed outside the order flow"
    );
}
