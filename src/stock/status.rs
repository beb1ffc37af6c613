//! STOCK.STATUS: the state of one request, for reconciliation and support.
//!
//! # Format
//!
//! ```text
//! STOCK.STATUS <sku> <request_id>
//! ```
//!
//! Replies a map: `state` (none, DEDUCTED, REVERTED, REVOKED, HELD,
//! CONFIRMED, EXPIRED), `qty`, `order_no`, `ttl_ms` (the record's remaining
//! TTL; -2 when there is no record), `stock` (available), `expires_at`
//! (the request's hold expiry, ms of Redis time, 0 when it has none),
//! `held` (the SKU's units on hold) and `next_expiry` (the earliest of the
//! SKU's holds, 0 when none). Like every call on a SKU it first gives back
//! the SKU's expired holds, so it answers by Redis time (`lua/status.lua`).
//! On a SKU kept by location `stock` is its total available, as STOCK.GET
//! answers it (`lua/allocate.lua` "status", where `lua/status.lua` answered
//! LOCATED).

use super::command::{Command, Footprint, Serve};
use super::{Answer, StockService};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::outcome::HoldEvent;
use crate::params::{RequestId, Sku};
use crate::reply::Reply;
use bytes::Bytes;
use futures_util::FutureExt;
use redis::Value;
use std::sync::Arc;

static ARGS: [ArgSpec; 2] = [arg("sku", "string"), arg("request_id", "string")];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "stock.status",
        arity: 3,
        max_args: None,
        flags: &["fast"],
        group: "stockgate",
        summary: "Returns one request's state (none, DEDUCTED, REVERTED, REVOKED, HELD, CONFIRMED, EXPIRED), qty, order_no, remaining TTL and hold expiry, and its sku's stock, units held and next expiry.",
        args: &ARGS,
    },
    answers: &[],
    right: Right::Reader,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, _| status(service, args).map(Answer::Reply).boxed()),
    http: None,
};

/// `STOCK.STATUS <sku> <request_id>`
async fn status(service: &Arc<StockService>, args: &[Bytes]) -> Reply {
    let parsed =
        Sku::parse(args[0].clone()).and_then(|sku| Ok((sku, RequestId::parse(args[1].clone())?)));
    let (sku, request_id) = match parsed {
        Ok(parsed) => parsed,
        Err(invalid) => return Reply::error(format!("ERR {invalid}")),
    };
    let by_one_number = async || {
        let keys = service.keys.request_keys(&sku, &request_id);
        let keys = keys.all();
        let settings = &service.settings;
        let args = [
            settings.retry_window_arg.as_bytes(),
            settings.journal_arg.as_bytes(),
        ];
        service
            .with_journal(&sku, service.deadline(), || {
                service.upstream.eval(&service.scripts.status, &keys, &args)
            })
            .await
    };
    let read = match by_one_number().await {
        Err(fault) if fault.is_located() => {
            match service.status_by_location(&sku, &request_id).await {
                // It keeps its stock by location no more: the first
                // script answers it now.
                Ok(Value::Nil) => by_one_number().await,
                read => read,
            }
        }
        read => read,
    };
    match read {
        Ok(value) => {
            if let Value::Array(items) = &value
                && let Some(Value::Int(released)) = items.get(8)
                && *released > 0
            {
                service
                    .books
                    .metrics
                    .record_holds(HoldEvent::Expired, *released as u64);
            }
            status_reply(value)
        }
        Err(fault) => Reply::Error(fault.reply_text()),
    }
}

/// The status script's `{state, qty, order_no, ttl_ms, stock, held,
/// next_expiry, expires_at, released}` as a map (`stock` as stored, or a
/// located SKU's total).
fn status_reply(value: Value) -> Reply {
    let Value::Array(items) = value else {
        return Reply::error("BADREPLY STOCK.STATUS answered an unexpected shape");
    };
    let field = |i: usize| items.get(i).cloned().unwrap_or(Value::Nil);
    let text = |v: Value| match v {
        Value::BulkString(b) => Reply::Bulk(b.into()),
        Value::SimpleString(s) => Reply::Bulk(s.into_bytes().into()),
        _ => Reply::Null,
    };
    let int = |v: Value| match v {
        Value::Int(i) => Reply::Integer(i),
        _ => Reply::Null,
    };
    let stock = match field(4) {
        // A SKU kept by location: its total.
        Value::Int(total) => Reply::Integer(total),
        Value::BulkString(raw) => std::str::from_utf8(&raw)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Reply::Null, Reply::Integer),
        _ => Reply::Null,
    };
    Reply::Map(vec![
        (Reply::bulk("state"), text(field(0))),
        (Reply::bulk("qty"), int(field(1))),
        (Reply::bulk("order_no"), text(field(2))),
        (Reply::bulk("ttl_ms"), int(field(3))),
        (Reply::bulk("stock"), stock),
        (Reply::bulk("expires_at"), int(field(7))),
        (Reply::bulk("held"), int(field(5))),
        (Reply::bulk("next_expiry"), int(field(6))),
    ])
}
