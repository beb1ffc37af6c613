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
use crate::error::UpstreamError;
use crate::params::Sku;
use crate::reply::Reply;
use crate::stock::command::{Command, Footprint, Http, Serve};
use crate::stock::{Answer, StockService};
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
    http: Http::get("/v1/stock/{sku}/locations"),
};

async fn locations(service: &Arc<StockService>, args: &[Bytes]) -> Answer {
    match Sku::parse(args[0].clone()) {
        Ok(sku) => Answer::Locations(read(service, &sku).await),
        Err(invalid) => Answer::Invalid(invalid),
    }
}

/// What STOCK.LOCATIONS read of a SKU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockLocations {
    /// Its available units over all its locations (a SKU that keeps one
    /// number: that number).
    pub total: i64,
    /// Each location by name; none for a SKU that keeps one number.
    pub locations: Vec<LocationUnits>,
}

/// One location's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationUnits {
    pub location: Bytes,
    pub available: i64,
    pub held: i64,
    pub floor: i64,
}

/// Why STOCK.LOCATIONS read nothing.
#[derive(Debug)]
pub enum Unread {
    Fault(UpstreamError),
    /// The script's reply was not of its documented shape.
    Shape,
}

impl Unread {
    pub const SHAPE: &str = "BADREPLY STOCK.LOCATIONS answered an unexpected shape";
}

/// STOCK.LOCATIONS of `sku`, RESP and HTTP alike: `None` when the SKU has
/// no stock.
pub async fn read(service: &StockService, sku: &Sku) -> Result<Option<StockLocations>, Unread> {
    match service.read_by_location("locations", sku).await {
        Ok(Value::Nil) => Ok(None),
        Ok(found) => parsed(found).map(Some).ok_or(Unread::Shape),
        Err(fault) => Err(Unread::Fault(fault)),
    }
}

impl StockLocations {
    /// `[total, [location, available, held, floor], ...]`.
    pub fn to_reply(&self) -> Reply {
        let mut reply = vec![Reply::Integer(self.total)];
        reply.extend(self.locations.iter().map(|l| {
            Reply::Array(vec![
                Reply::Bulk(l.location.clone()),
                Reply::Integer(l.available),
                Reply::Integer(l.held),
                Reply::Integer(l.floor),
            ])
        }));
        Reply::Array(reply)
    }
}

fn parsed(found: Value) -> Option<StockLocations> {
    let Value::Array(items) = found else {
        return None;
    };
    let mut items = items.into_iter();
    let Some(Value::Int(total)) = items.next() else {
        return None;
    };
    let mut locations = Vec::new();
    for item in items {
        let Value::Array(parts) = item else {
            return None;
        };
        match &parts[..] {
            [
                Value::BulkString(name),
                Value::Int(available),
                Value::Int(held),
                Value::Int(floor),
            ] => locations.push(LocationUnits {
                location: Bytes::copy_from_slice(name),
                available: *available,
                held: *held,
                floor: *floor,
            }),
            _ => return None,
        }
    }
    Some(StockLocations { total, locations })
}
