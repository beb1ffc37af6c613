//! STOCK.GET, STOCK.SET and STOCK.ADD: an operator's view of stock, and
//! changes to it outside the order flow (restocking, corrections).
//!
//! # Format
//!
//! ```text
//! STOCK.GET <sku>                    the stock (available: units on hold are
//!                                    not in it), or nil when the sku has none
//! STOCK.SET <sku> <qty> <op_id>      [code, stock, "", version]   (--admin-commands)
//! STOCK.ADD <sku> <delta> <op_id>    [code, stock, "", version]   (--admin-commands)
//! ```
//!
//! SET and ADD change stock outside the order flow, so they are refused
//! with `-NOPERM` unless stockgate runs with `--admin-commands`, and each
//! change is written to the `stockgate::audit` log target.
//!
//! A change is as retry-prone as an order: its reply can be lost after it
//! ran and the change sent again, by stockgate's fallback client, by
//! redis-rs after a dropped connection, or by the operator's tool. Added
//! twice is phantom stock, which is overselling; a SET sent again after
//! deductions ran between would sell their units again. So each change
//! names itself with an `op_id`, kept in a record like an order's
//! request_id for the retry window (`lua/stock_set.lua`,
//! `lua/stock_add.lua`): 0 applied now, 1 this op_id was already applied,
//! 2 (ADD) refused because the stock would go below 0, 3 invalid.

use super::{Caller, StockCommand, StockResult, StockService};
use crate::doc::{Doc, arg};
use crate::outcome::{Code, StockReply};
use crate::params::{Delta, InvalidParam, OpId, Sku, StockLevel};
use crate::reply::Reply;
use crate::script::LuaScript;
use bytes::Bytes;
use redis::Value;

pub const GET: Doc = Doc {
    name: StockCommand::Get.name(),
    arity: 2,
    max_args: None,
    flags: &["fast"],
    group: "stockgate",
    summary: "Returns a sku's stock, or nil when it has none.",
    args: &[arg("sku", "string")],
};

pub const SET: Doc = Doc {
    name: StockCommand::Set.name(),
    arity: 4,
    max_args: None,
    flags: &["write", "admin"],
    group: "stockgate",
    summary: "Sets a sku's stock, once per op_id (needs --admin-commands). Replies [code, stock, \"\", version]: 0 set, 1 this op_id was already applied, 3 invalid.",
    args: &[
        arg("sku", "string"),
        arg("qty", "integer"),
        arg("op_id", "string"),
    ],
};

pub const ADD: Doc = Doc {
    name: StockCommand::Add.name(),
    arity: 4,
    max_args: None,
    flags: &["write", "admin"],
    group: "stockgate",
    summary: "Adds a signed delta to a sku's stock, once per op_id, never below 0 (needs --admin-commands). Replies [code, stock, \"\", version]: 0 added, 1 this op_id was already applied, 2 it would go below 0, 3 invalid.",
    args: &[
        arg("sku", "string"),
        arg("delta", "integer"),
        arg("op_id", "string"),
    ],
};

const NOPERM: &str = "NOPERM STOCK.SET and STOCK.ADD change stock outside the order flow; start stockgate with --admin-commands to allow them";

/// Which change, checked.
enum Change {
    Set(StockLevel),
    Add(Delta),
}

/// The operators' corrections of stock: STOCK.SET and STOCK.ADD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Correction {
    Set,
    Add,
}

impl StockService {
    /// `STOCK.GET <sku>`
    pub(super) async fn get(&self, args: &[Bytes]) -> Reply {
        let sku = match Sku::parse(args[0].clone()) {
            Ok(sku) => sku,
            Err(invalid) => return Reply::error(format!("ERR {invalid}")),
        };
        // A script, not a GET: like every call on a SKU, it first gives
        // back the SKU's expired holds (`lua/get.lua`).
        let keys = self.keys.sku_keys(&sku);
        let keys = keys.all();
        let args = [
            self.retry_window_arg.as_bytes(),
            self.journal_arg.as_bytes(),
        ];
        match self
            .with_journal(&sku, self.deadline(), || {
                self.upstream.eval(&self.scripts.get, &keys, &args)
            })
            .await
        {
            Ok(Value::Array(mut items)) if items.len() >= 4 => {
                if let Value::Int(released) = items[3]
                    && released > 0
                {
                    self.metrics
                        .record_holds(crate::outcome::HoldEvent::Expired, released as u64);
                }
                stock_value(items.swap_remove(0))
            }
            Ok(other) => Reply::error(format!("BADREPLY STOCK.GET answered {other:?}")),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// `STOCK.SET <sku> <qty> <op_id>` and `STOCK.ADD <sku> <delta> <op_id>`.
    pub(super) async fn change(
        &self,
        correction: Correction,
        args: &[Bytes],
        caller: &Caller,
    ) -> Reply {
        if !self.admin_commands {
            return Reply::error(NOPERM);
        }
        let parsed = (|| -> Result<(Sku, Change, OpId), InvalidParam> {
            let change = match correction {
                Correction::Set => Change::Set(StockLevel::parse(&args[1])?),
                Correction::Add => Change::Add(Delta::parse(&args[1])?),
            };
            Ok((
                Sku::parse(args[0].clone())?,
                change,
                OpId::parse(args[2].clone())?,
            ))
        })();
        let (sku, change, op_id) = match parsed {
            Ok(parsed) => parsed,
            Err(invalid) => return Reply::Stock(StockReply::invalid(invalid.0)),
        };
        let script: &LuaScript = match change {
            Change::Set(_) => &self.scripts.stock_set,
            Change::Add(_) => &self.scripts.stock_add,
        };
        let keys = self.keys.op_keys(&sku, &op_id);
        let nonce = self.nonces.next();
        let script_args: [&[u8]; 5] = [
            &args[1],
            self.retry_window_arg.as_bytes(),
            &nonce,
            self.replicate_arg.as_bytes(),
            self.journal_arg.as_bytes(),
        ];
        let result: StockResult = self
            .with_journal(&sku, self.deadline(), || {
                self.upstream
                    .eval_stock(script, [&keys.stock, &keys.record], &script_args)
            })
            .await;
        match result {
            Ok(reply) => {
                if reply.code == Code::Ok {
                    let (name, amount) = match change {
                        Change::Set(level) => ("STOCK.SET", level.0),
                        Change::Add(delta) => ("STOCK.ADD", delta.0),
                    };
                    audit(name, &sku, amount, &op_id, reply.remain, caller);
                }
                Reply::Stock(reply)
            }
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
fn audit(command: &str, sku: &Sku, amount: i64, op_id: &OpId, after: i64, caller: &Caller) {
    let (qty, delta) = match command {
        "STOCK.SET" => (Some(amount), None),
        _ => (None, Some(amount)),
    };
    tracing::info!(
        target: "stockgate::audit",
        command,
        sku = %String::from_utf8_lossy(sku.as_bytes()),
        qty,
        delta,
        op_id = %String::from_utf8_lossy(op_id.as_bytes()),
        stock_after = after,
        client_id = caller.client_id,
        client_addr = caller.addr.map(|a| a.to_string()),
        client_name = caller.name.as_deref().map(|n| String::from_utf8_lossy(n).into_owned()),
        "stock changed outside the order flow"
    );
}
