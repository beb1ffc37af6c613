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

use super::{StockCommand, StockResult, StockService};
use crate::command::spec::{CommandSpec, Serve, arg};
use crate::params::{InvalidParam, RequestId, Sku};
use crate::reply;
use crate::script::LuaScript;
use bytes::{Bytes, BytesMut};
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
    /// REVERT, awaited (the HTTP face), with its metrics and access log.
    pub async fn revert(&self, args: &[Bytes], arrived: Instant) -> StockResult {
        match self.prepare(StockCommand::Revert, args, arrived) {
            Some(prepared) => self.run(prepared).await,
            None => unreachable!("REVERT is prepared"),
        }
    }

    /// The script's ARGV for a revert (`lua/revert.lua`).
    pub(super) fn revert_args<'a>(&'a self, nonce: &'a [u8]) -> [&'a [u8]; 3] {
        [
            self.retry_window_arg.as_bytes(),
            self.missing_stock.as_arg().as_bytes(),
            nonce,
        ]
    }

    /// The EVALSHA of `revert`, written into a node pipe's batch.
    pub(super) fn encode_revert(
        &self,
        revert: &Revert,
        nonce: &[u8],
        script: &LuaScript,
        buf: &mut BytesMut,
    ) {
        let args = self.revert_args(nonce);
        reply::evalsha_start(buf, &script.sha, 2, args.len());
        reply::bulk_parts(buf, &self.keys.stock_key_parts(&revert.sku));
        reply::bulk_parts(
            buf,
            &self.keys.record_key_parts(&revert.sku, &revert.request_id),
        );
        for arg in args {
            reply::bulk_of(buf, arg);
        }
    }
}
