//! The call (FCALL or EVALSHA: [`Calling`]) of a script on one request
//! (DEDUCT, REVERT, HOLD, CONFIRM), as the node pipes send it and as the
//! redis-rs fallback sends it.
//!
//! Every such script takes the request's four keys (stock, record, holds,
//! held: [`crate::keys::RequestKeys`]) and its ARGV in one order: the
//! caller's arguments, then what stockgate supplies alike for every call
//! (window, limits, missing-stock mode), then the call's nonce, then the
//! replicate and journal flags. What every call has alike is encoded once at startup;
//! the hot path copies it in and writes only the keys from their parts,
//! the caller's arguments and the nonce.

use crate::keys::KeyLayout;
use crate::params::{RequestId, Sku};
use crate::reply;
use crate::script::{Calling, LuaScript};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// One script's call, pre-encoded.
#[derive(Clone)]
pub(super) struct Wire {
    pub(super) script: Arc<LuaScript>,
    /// `*<n>`, FCALL, the function, `4`; and `*<n>`, EVALSHA, the SHA, `4`.
    heads: [Bytes; 2],
    /// The arguments stockgate supplies before the nonce, encoded...
    fixed: Bytes,
    /// ... and as they are, for the fallback.
    fixed_args: Vec<Vec<u8>>,
    /// The flags after the nonce (replicate, journal), encoded and as they
    /// are.
    tail: Bytes,
    flags: Vec<Vec<u8>>,
    caller_args: usize,
}

impl Wire {
    /// The call of `script`, which takes `caller_args` of the caller's
    /// arguments, then `fixed`, the nonce and the `flags` (replicate,
    /// journal).
    pub(super) fn new(
        script: &Arc<LuaScript>,
        caller_args: usize,
        fixed: &[&[u8]],
        flags: [&[u8]; 2],
    ) -> Wire {
        let heads = [Calling::Function, Calling::Eval].map(|calling| {
            let mut head = BytesMut::new();
            script.write_head(
                calling,
                &mut head,
                4,
                caller_args + fixed.len() + 1 + flags.len(),
            );
            head.freeze()
        });
        let mut encoded = BytesMut::new();
        for arg in fixed {
            reply::bulk_of(&mut encoded, arg);
        }
        let mut tail = BytesMut::new();
        for flag in flags {
            reply::bulk_of(&mut tail, flag);
        }
        Wire {
            script: script.clone(),
            heads,
            fixed: encoded.freeze(),
            fixed_args: fixed.iter().map(|a| a.to_vec()).collect(),
            tail: tail.freeze(),
            flags: flags.iter().map(|f| f.to_vec()).collect(),
            caller_args,
        }
    }

    fn head(&self, calling: Calling) -> &[u8] {
        match calling {
            Calling::Function => &self.heads[0],
            Calling::Eval => &self.heads[1],
        }
    }

    /// Writes the call into a node pipe's batch: byte for byte what
    /// [`LuaScript::write_call`] of the request's keys and [`Wire::argv`]
    /// writes (a test checks).
    #[allow(clippy::too_many_arguments)] // the call's parts, as they come
    pub(super) fn encode(
        &self,
        calling: Calling,
        keys: &KeyLayout,
        sku: &Sku,
        request_id: &RequestId,
        caller: &[&[u8]],
        nonce: &[u8],
        buf: &mut BytesMut,
    ) {
        debug_assert_eq!(caller.len(), self.caller_args);
        buf.extend_from_slice(self.head(calling));
        reply::bulk_parts(buf, &keys.stock_key_parts(sku));
        reply::bulk_parts(buf, &keys.record_key_parts(sku, request_id));
        for parts in keys.hold_key_parts(sku) {
            reply::bulk_parts(buf, &parts);
        }
        for arg in caller {
            reply::bulk_of(buf, arg);
        }
        buf.extend_from_slice(&self.fixed);
        reply::bulk_of(buf, nonce);
        buf.extend_from_slice(&self.tail);
    }

    /// [`Wire::encode`] from keys and arguments written as bulk strings
    /// already: the stock key, the record key, the two hold keys, the
    /// caller's arguments and the nonce (a coalesced DEDUCT alone in its
    /// call, [`super::coalesce`]).
    pub(super) fn encode_bulks(
        &self,
        calling: Calling,
        [stock, record, hold_keys, caller, nonce]: [&[u8]; 5],
        buf: &mut BytesMut,
    ) {
        buf.extend_from_slice(self.head(calling));
        buf.extend_from_slice(stock);
        buf.extend_from_slice(record);
        buf.extend_from_slice(hold_keys);
        buf.extend_from_slice(caller);
        buf.extend_from_slice(&self.fixed);
        buf.extend_from_slice(nonce);
        buf.extend_from_slice(&self.tail);
    }

    /// The arguments stockgate supplies alike for every call, encoded, then
    /// the flags: what a coalesced call's members share.
    pub(super) fn shared_args(&self) -> [&[u8]; 2] {
        [&self.fixed, &self.tail]
    }

    /// The arguments stockgate supplies before the nonce, as they are.
    pub(super) fn fixed_argv<const N: usize>(&self) -> [&[u8]; N] {
        std::array::from_fn(|i| self.fixed_args[i].as_slice())
    }

    /// The script's ARGV, for the fallback.
    pub(super) fn argv<'a>(&'a self, caller: &[&'a [u8]], nonce: &'a [u8]) -> Vec<&'a [u8]> {
        let mut argv =
            Vec::with_capacity(self.caller_args + self.fixed_args.len() + 1 + self.flags.len());
        argv.extend_from_slice(caller);
        argv.extend(self.fixed_args.iter().map(Vec::as_slice));
        argv.push(nonce);
        argv.extend(self.flags.iter().map(Vec::as_slice));
        argv
    }
}
