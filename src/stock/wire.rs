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
use crate::pipeline::LoneMarks;
use crate::reply::{self, Spare};

/// What a bulk string's header and CRLF take at most, besides its bytes.
const LINE_MOST_BULK: usize = 1 + 20 + 2 + 2;
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
    ) -> LoneMarks {
        debug_assert_eq!(caller.len(), self.caller_args);
        let head = self.head(calling);
        let stock = keys.stock_key_parts(sku);
        let record = keys.record_key_parts(sku, request_id);
        let [holds, held] = keys.hold_key_parts(sku);
        let most = head.len()
            + Spare::bulk_parts_most(&stock)
            + Spare::bulk_parts_most(&record)
            + Spare::bulk_parts_most(&holds)
            + Spare::bulk_parts_most(&held)
            + Spare::bulk_parts_most(caller)
            + caller.len() * LINE_MOST_BULK
            + self.fixed.len()
            + Spare::bulk_parts_most(&[nonce])
            + self.tail.len();
        let mut out = Spare::new(buf, most);
        let mut marks = LoneMarks::default();
        out.put(head);
        marks[0] = out.written();
        out.bulk_parts(&stock);
        marks[1] = out.written();
        out.bulk_parts(&record);
        marks[2] = out.written();
        out.bulk_parts(&holds);
        out.bulk_parts(&held);
        marks[3] = out.written();
        for arg in caller {
            out.bulk(arg);
        }
        marks[4] = out.written();
        out.put(&self.fixed);
        marks[5] = out.written();
        out.bulk(nonce);
        marks[6] = out.written();
        out.put(&self.tail);
        marks[7] = out.written();
        out.done();
        marks
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
        let head = self.head(calling);
        let pieces = [
            head,
            stock,
            record,
            hold_keys,
            caller,
            &self.fixed,
            nonce,
            &self.tail,
        ];
        let mut out = Spare::new(buf, pieces.iter().map(|p| p.len()).sum());
        for piece in pieces {
            out.put(piece);
        }
        out.done();
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
