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

use crate::params::{InvalidParam, RequestId, Sku};
use bytes::Bytes;

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
