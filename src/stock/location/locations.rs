//! STOCK.LOCATIONS: what each location of a SKU kept by location holds.
//!
//! # Format
//!
//! ```text
//! STOCK.LOCATIONS <sku>
//! ```
//!
//! Replies `[total, [location, available, held, floor], ...]`, the
//! locations by name; `total` is the SKU's available units over all of
//! them (what STOCK.GET answers for it). Like every call on a SKU it gives
//! the SKU's expired holds back first. A SKU that keeps one number answers
//! `[stock]` as stored, with no locations; a SKU with no stock, nil.

use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::params::Sku;
use crate::reply::Reply;
use crate::stock::StockService;
use crate::stock::command::{Command, Footprint, Serve};
use bytes::Bytes;
use futures_util::FutureExt;
use redis::Value;
use std::sync::Arc;

static ARGS: [ArgSpec; 1] = [arg("sku", "string")];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "stock.locations",
        arity: 2,
        max_args: None,
        flags: &["fast"],
        group: "stockgate",
        summary: "Returns a sku's total available and each location's available, held and floor units: [total, [location, available, held, floor], ...].",
        args: &ARGS,
    },
    answers: &[],
    right: Right::Reader,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, _| locations(service, args).boxed()),
};

async fn locations(service: &Arc<StockService>, args: &[Bytes]) -> Reply {
    let sku = match Sku::parse(args[0].clone()) {
        Ok(sku) => sku,
        Err(invalid) => return Reply::error(format!("ERR {invalid}")),
    };
    match service.read_by_location("locations", &sku).await {
        Ok(Value::Nil) => Reply::Null,
        Ok(found) => reply_of(found).unwrap_or_else(|| {
            Reply::error("BADREPLY STOCK.LOCATIONS answered an unexpected shape")
        }),
        Err(fault) => Reply::Error(fault.reply_text()),
    }
}

fn reply_of(found: Value) -> Option<Reply> {
    let Value::Array(items) = found else {
        return None;
    };
    let mut items = items.into_iter();
    let Some(Value::Int(total)) = items.next() else {
        return None;
    };
    let mut reply = vec![Reply::Integer(total)];
    for item in items {
        let Value::Array(parts) = item else {
            return None;
        };
        match &parts[..] {
            [
                Value::BulkString(name),
                Value::Int(units),
                Value::Int(held),
                Value::Int(floor),
            ] => reply.push(Reply::Array(vec![
                Reply::Bulk(Bytes::copy_from_slice(name)),
                Reply::Integer(*units),
                Reply::Integer(*held),
                Reply::Integer(*floor),
            ])),
            _ => return None,
        }
    }
    Some(Reply::Array(reply))
}
