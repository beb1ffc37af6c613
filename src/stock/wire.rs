//! The call (FCALL or EVALSHA: [`Calling`]) of a script on one request
//! (DEDUCT, REVERT, HOLD, CONFIRM), as the node pipes send it and as the
//! redis-rs fallback sends it.
//!
//! Every such script takes the request's six keys (stock, record, and
//! the SKU's holds, held units, journal marker and journal:
//! [`crate::keys::RequestKeys`]) and its ARGV in one order: the caller's
//! arguments, then its settings, then the call's nonce. The settings are
//! one argument: what stockgate supplies alike for every call (window,
//! limits, missing-stock mode) and the flags `<replicate><journal>` ("0" or
//! "1" each), separated by spaces (`lua/common.lua`, `settle`, which a
//! function library runs once per text). What every call has alike is
//! encoded once at startup; the hot path copies it in and writes only the
//! keys from their parts, the caller's arguments and the nonce.

use crate::keys::KeyLayout;
use crate::params::{RequestId, Sku};
use crate::pipeline::LoneMarks;
use crate::reply::{self, Spare};
use crate::script::{Calling, LuaScript};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// What a bulk string's header and CRLF take at most, besides its bytes.
const LINE_MOST_BULK: usize = 1 + 20 + 2 + 2;

/// One script's call, pre-encoded.
#[derive(Clone)]
pub(super) struct Wire {
    pub(super) script: Arc<LuaScript>,
    /// `*<n>`, FCALL, the function, `6`; and `*<n>`, EVALSHA, the SHA, `6`.
    heads: [Bytes; 2],
    /// The settings, the argument before the nonce, encoded...
    settings: Bytes,
    /// ... and as it is, for the fallback.
    settings_arg: Vec<u8>,
    /// The settings one by one, as they are (for `lua/deduct_many.lua`,
    /// which takes them so: a coalesced call's shared arguments cost once
    /// for all its members)...
    fixed_args: Vec<Vec<u8>>,
    /// ... and encoded, with the two flags after them.
    split: Bytes,
    caller_args: usize,
}

impl Wire {
    /// The call of `script`, which takes `caller_args` of the caller's
    /// arguments, then `fixed`, the nonce and the `flags` (replicate,
    /// journal: `"0"` or `"1"` each), as one argument.
    pub(super) fn new(
        script: &Arc<LuaScript>,
        caller_args: usize,
        fixed: &[&[u8]],
        flags: [&[u8]; 2],
    ) -> Wire {
        let heads = [Calling::Function, Calling::Eval].map(|calling| {
            let mut head = BytesMut::new();
            script.write_head(calling, &mut head, 6, caller_args + 2);
            head.freeze()
        });
        let joined_flags = flags.concat();
        let settings_arg = fixed
            .iter()
            .copied()
            .chain([joined_flags.as_slice()])
            .collect::<Vec<&[u8]>>()
            .join(&b' ');
        let mut settings = BytesMut::new();
        reply::bulk_of(&mut settings, &settings_arg);
        let mut split = BytesMut::new();
        for arg in fixed.iter().chain(&flags) {
            reply::bulk_of(&mut split, arg);
        }
        Wire {
            script: script.clone(),
            heads,
            settings: settings.freeze(),
            settings_arg,
            fixed_args: fixed.iter().map(|a| a.to_vec()).collect(),
            split: split.freeze(),
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
        let side = keys.side_key_parts(sku);
        let most = head.len()
            + Spare::bulk_parts_most(&stock)
            + Spare::bulk_parts_most(&record)
            + side
                .iter()
                .map(|k| Spare::bulk_parts_most(k))
                .sum::<usize>()
            + Spare::bulk_parts_most(caller)
            + caller.len() * LINE_MOST_BULK
            + self.settings.len()
            + Spare::bulk_parts_most(&[nonce]);
        let mut out = Spare::new(buf, most);
        let mut marks = LoneMarks::default();
        out.put(head);
        marks[0] = out.written();
        out.bulk_parts(&stock);
        marks[1] = out.written();
        out.bulk_parts(&record);
        marks[2] = out.written();
        for key in &side {
            out.bulk_parts(key);
        }
        marks[3] = out.written();
        for arg in caller {
            out.bulk(arg);
        }
        marks[4] = out.written();
        out.put(&self.settings);
        marks[5] = out.written();
        out.bulk(nonce);
        marks[6] = out.written();
        out.done();
        marks
    }

    /// [`Wire::encode`] from keys and arguments written as bulk strings
    /// already: the stock key, the record key, the SKU's four other keys,
    /// the caller's arguments and the nonce (a coalesced DEDUCT alone in
    /// its call, [`super::coalesce`]).
    pub(super) fn encode_bulks(
        &self,
        calling: Calling,
        [stock, record, side, caller, nonce]: [&[u8]; 5],
        buf: &mut BytesMut,
    ) {
        let head = self.head(calling);
        let pieces = [head, stock, record, side, caller, &self.settings, nonce];
        let mut out = Spare::new(buf, pieces.iter().map(|p| p.len()).sum());
        for piece in pieces {
            out.put(piece);
        }
        out.done();
    }

    /// The settings and the two flags, one argument each, encoded, as
    /// `lua/deduct_many.lua` takes them: what a coalesced call's members
    /// share.
    pub(super) fn shared_args(&self) -> &[u8] {
        &self.split
    }

    /// The settings one by one, as they are.
    pub(super) fn fixed_argv<const N: usize>(&self) -> [&[u8]; N] {
        std::array::from_fn(|i| self.fixed_args[i].as_slice())
    }

    /// The settings, one argument, as they are.
    pub(super) fn settings_arg(&self) -> &[u8] {
        &self.settings_arg
    }

    /// The script's ARGV, for the fallback.
    pub(super) fn argv<'a>(&'a self, caller: &[&'a [u8]], nonce: &'a [u8]) -> Vec<&'a [u8]> {
        let mut argv = Vec::with_capacity(self.caller_args + 2);
        argv.extend_from_slice(caller);
        argv.push(&self.settings_arg);
        argv.push(nonce);
        argv
    }
}
