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
    pub(super) fn revert_args<'a>(&'a self, nonce: &'a [u8]) -> [&'a [u8]; 4] {
        [
            self.retry_window_arg.as_bytes(),
            self.missing_stock.as_arg().as_bytes(),
            nonce,
            self.replicate_arg.as_bytes(),
        ]
    }

    /// The EVALSHA of `revert`, written into a node pipe's batch, with what
    /// every REVERT sends alike copied in encoded ([`Wire`]).
    pub(super) fn encode_revert(&self, revert: &Revert, nonce: &[u8], buf: &mut BytesMut) {
        buf.extend_from_slice(&self.revert_wire.head);
        reply::bulk_parts(buf, &self.keys.stock_key_parts(&revert.sku));
        reply::bulk_parts(
            buf,
            &self.keys.record_key_parts(&revert.sku, &revert.request_id),
        );
        buf.extend_from_slice(&self.revert_wire.fixed);
        reply::bulk_of(buf, nonce);
        buf.extend_from_slice(&self.revert_wire.tail);
    }
}

/// What every REVERT's EVALSHA has alike, encoded once: the head (`*9`,
/// EVALSHA, the SHA, 2 keys), ARGV 1 and 2 (window, missing stock), and
/// ARGV 4 (replicate).
pub(super) struct Wire {
    head: Bytes,
    fixed: Bytes,
    tail: Bytes,
}

impl Wire {
    pub(super) fn new(script: &LuaScript, fixed_args: [&[u8]; 2], replicate: &[u8]) -> Wire {
        let mut head = BytesMut::new();
        reply::evalsha_start(&mut head, &script.sha, 2, 4);
        let mut fixed = BytesMut::new();
        for arg in fixed_args {
            reply::bulk_of(&mut fixed, arg);
        }
        let mut tail = BytesMut::new();
        reply::bulk_of(&mut tail, replicate);
        Wire {
            head: head.freeze(),
            fixed: fixed.freeze(),
            tail: tail.freeze(),
        }
    }
}
