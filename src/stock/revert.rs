//! REVERT: give back what one request deducted.
//!
//! # Format
//!
//! ```text
//! REVERT <sku> <request_id>
//! ```
//!
//! Replies like DEDUCT, `[code, remain, order_no, version]`: 0 given back,
//! 1 already reverted or revoked, 3 invalid, 4 nothing had been deducted
//! (the id is now revoked, and a later DEDUCT of it is refused). The qty
//! given back is the one the DEDUCT recorded, never the caller's. See
//! `lua/revert.lua` for the state machine.

use super::{AccessEntry, StockCommand, StockResult, StockService};
use crate::command::spec::{CommandSpec, Serve, arg};
use crate::metrics::CommandLabel;
use crate::outcome::StockReply;
use crate::params::{InvalidParam, RequestId, Sku};
use bytes::Bytes;
use std::time::Instant;

pub const SPEC: CommandSpec = CommandSpec {
    name: "revert",
    arity: 3,
    max_args: None,
    flags: &["write", "denyoom"],
    group: "stockgate",
    summary: "Gives back what one request_id deducted, once. Replies like DEDUCT: 0 given back, 1 already reverted, 3 invalid, 4 nothing was deducted (the id is revoked).",
    args: &[arg("sku", "string"), arg("request_id", "string")],
    subcommands: &[],
    serve: Serve::Stock(StockCommand::Revert),
};

/// One validated revert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revert {
    pub sku: Sku,
    pub request_id: RequestId,
}

impl Revert {
    /// Checks the arguments after the command name: sku and request_id.
    pub fn parse(args: &[Bytes]) -> Result<Revert, InvalidParam> {
        Ok(Revert {
            sku: Sku::parse(args[0].clone())?,
            request_id: RequestId::parse(args[1].clone())?,
        })
    }
}

impl StockService {
    /// REVERT, with its metrics and access log.
    pub async fn revert(&self, args: &[Bytes], arrived: Instant) -> StockResult {
        let parsed = Revert::parse(args).and_then(|r| self.fresh(&r.request_id).map(|()| r));
        let result = match parsed {
            Ok(revert) => self.apply_revert(&revert).await,
            Err(invalid) => Ok(StockReply::invalid(invalid.0)),
        };
        let entry = AccessEntry {
            command: CommandLabel::Revert,
            sku: args.first(),
            request_id: args.get(1),
            qty: None,
        };
        self.record(entry, &result, arrived);
        result
    }

    /// Runs the REVERT script for a validated revert.
    pub async fn apply_revert(&self, revert: &Revert) -> StockResult {
        let keys = self.keys.deduct_keys(&revert.sku, &revert.request_id);
        let nonce = self.nonces.next();
        let started = Instant::now();
        let reply = self
            .upstream
            .eval_stock(
                &self.scripts.revert,
                [&keys.stock, &keys.record],
                &[
                    self.retry_window_arg.as_bytes(),
                    self.missing_stock.as_arg().as_bytes(),
                    &nonce,
                    self.replicate_arg.as_bytes(),
                ],
            )
            .await;
        self.metrics
            .record_upstream(CommandLabel::Revert, started.elapsed());
        reply
    }
}
