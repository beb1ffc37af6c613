//! ORDER.STATUS: where one order is, for support and reconciliation.
//!
//! # Format
//!
//! ```text
//! ORDER.STATUS <request_id>
//! ```
//!
//! Replies a map read from the intent record (`lua/order.lua`), changing
//! nothing: `phase` (none, HOLDING, HELD, CONFIRMING, DONE, ABORTING,
//! ABORTED, REVERTING, REVERTED, REVOKED), `kind` (`order`, `hold`, or
//! empty), `lines` (flat `sku, qty, ...`, by sku), `expires_at` (the order
//! hold's expiry, ms of Redis time; 0 for an ORDER), `expired` (1 when a
//! HELD order's expiry has passed), `code` (why an order aborted: 2, 3, 4
//! or 5; else 0) and `short` (the SKUs at fault). Each line's own record
//! is `STOCK.STATUS <sku> ~ord:<request_id>`. Over HTTP:
//! `GET /v1/orders/{request_id}`.

use super::intent::IntentOp;
use super::{Filing, Phase, Saga, parse_id};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::error::UpstreamError;
use crate::params::InvalidParam;
use crate::reply::Reply;
use crate::stock::command::{Command, Footprint, Http, Serve};
use crate::stock::{Answer, StockService};
use bytes::Bytes;
use futures_util::FutureExt;
use std::sync::Arc;

static ARGS: [ArgSpec; 1] = [arg("request_id", "string")];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.status",
        arity: 2,
        max_args: None,
        flags: &["fast"],
        group: "stockgate",
        summary: "Returns one order's phase (none, HOLDING, HELD, CONFIRMING, DONE, ABORTING, ABORTED, REVERTING, REVERTED, REVOKED), kind, lines, hold expiry, abort code and short skus, from its intent record.",
        args: &ARGS,
    },
    answers: &[],
    right: Right::Reader,
    gives_back: false,
    footprint: Footprint::All,
    serve: Serve::Alone(|service, args, _| status(service, args).boxed()),
    http: Http::get("/v1/orders/{request_id}"),
};

/// An order's intent record, as ORDER.STATUS shows it.
#[derive(Debug, Clone)]
pub struct OrderState {
    /// `none` (no record), `HOLDING`, `HELD`, ... (see [`Phase`]).
    pub phase: &'static str,
    /// `order`, `hold`, or empty (none, REVOKED).
    pub kind: &'static str,
    /// `(sku, qty)` per line, by sku.
    pub lines: Vec<(Bytes, Bytes)>,
    /// The order hold's expiry, ms of Redis time; 0 for an ORDER.
    pub expires_at: i64,
    /// A HELD order whose expiry has passed.
    pub expired: bool,
    /// Why it aborted (2, 3, 4 or 5); else 0.
    pub code: i64,
    pub short: Vec<Bytes>,
}

/// ORDER.STATUS: the intent record, read, as the RESP reply.
async fn status(service: &Arc<StockService>, args: &[Bytes]) -> Answer {
    match order_state(service, &args[0]).await {
        Ok(Ok(state)) => Answer::OrderState(Ok(state)),
        Ok(Err(invalid)) => Answer::Invalid(invalid),
        Err(fault) => Answer::OrderState(Err(fault)),
    }
}

impl OrderState {
    /// ORDER.STATUS's reply: a map of its fields.
    pub fn to_reply(&self) -> Reply {
        let flat = |words: &[Bytes]| Reply::Array(words.iter().cloned().map(Reply::Bulk).collect());
        let lines: Vec<Bytes> = self
            .lines
            .iter()
            .flat_map(|(sku, qty)| [sku.clone(), qty.clone()])
            .collect();
        Reply::Map(vec![
            (Reply::bulk("phase"), Reply::bulk(self.phase)),
            (Reply::bulk("kind"), Reply::bulk(self.kind)),
            (Reply::bulk("lines"), flat(&lines)),
            (Reply::bulk("expires_at"), Reply::Integer(self.expires_at)),
            (
                Reply::bulk("expired"),
                Reply::Integer(i64::from(self.expired)),
            ),
            (Reply::bulk("code"), Reply::Integer(self.code)),
            (Reply::bulk("short"), flat(&self.short)),
        ])
    }
}

/// ORDER.STATUS of `request_id` (RESP, and HTTP's
/// `GET /v1/orders/{request_id}`): the intent record, read, changing
/// nothing; the inner error for a request_id that is not one.
pub async fn order_state(
    service: &StockService,
    request_id: &Bytes,
) -> Result<Result<OrderState, InvalidParam>, UpstreamError> {
    let id = match parse_id(request_id) {
        Ok(id) => id,
        Err(invalid) => return Ok(Err(invalid)),
    };
    let mut saga = Saga::new(service, &id, Filing::Off);
    let intent = saga.intent(IntentOp::Read).await?;
    let words = |text: &Bytes| -> Vec<Bytes> {
        text.split(|b| *b == b' ')
            .filter(|w| !w.is_empty())
            .map(Bytes::copy_from_slice)
            .collect()
    };
    let kind = match &intent.kind[..] {
        b"T" | b"D" => "order",
        b"H" => "hold",
        _ => "",
    };
    let phase = match intent.phase {
        Phase::None => "none",
        phase => phase.as_str(),
    };
    let lines = words(&intent.lines)
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    Ok(Ok(OrderState {
        phase,
        kind,
        lines,
        expires_at: intent.expires_at,
        expired: intent.ran_out(),
        code: intent.code,
        short: words(&intent.short),
    }))
}
