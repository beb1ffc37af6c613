//! The call (FCALL or EVALSHA: [`Calling`]) of a script on one request, as
//! the node pipes send it and as the redis-rs fallback sends it, from its
//! command's description ([`Single`]: its keys and its ARGV).
//!
//! Every such script takes the request's six keys (stock, record, and
//! the SKU's holds, held units, journal marker and journal:
//! [`crate::keys::RequestKeys`]), then the ones its description adds (the
//! SKU's locations hash, a change's record). Its ARGV is what the
//! description lists: words of its own, the caller's fields, the settings
//! and the call's nonce. The settings are one argument: what stockgate
//! supplies alike for every call (window, limits, missing-stock mode) and
//! the flags `<replicate><journal>` ("0" or "1" each), separated by spaces
//! (`lua/common.lua`, `settle`, which a function library runs once per
//! text). What every call has alike is encoded once at startup; the hot
//! path copies it in and writes only the keys from their parts, the
//! caller's fields and the nonce.

use super::single::{Arg, Field, Keys, OneRequest, Single};
use crate::keys::KeyLayout;
use crate::params::Location;
use crate::pipeline::LoneMarks;
use crate::reply::{self, Spare};
use crate::script::{Calling, LuaScript};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

/// What one line of a type byte, an integer and CRLF takes at most.
const LINE_MOST: usize = 1 + 20 + 2;
/// What a bulk string's header and CRLF take at most, besides its bytes.
const LINE_MOST_BULK: usize = LINE_MOST + 2;
/// The most of the caller's fields a script takes (HOLD.AT's four).
const MOST_CALLER: usize = 4;

/// One script's call on one request, pre-encoded.
#[derive(Clone)]
pub(super) struct Wire {
    pub(super) script: Arc<LuaScript>,
    /// The call's head, per [`Calling`] and per whether the request names
    /// a change (whose record is one more key): `*<n>` (when every call
    /// has as many elements: see `counted`), the verb, the function or the
    /// SHA, and the number of keys, encoded.
    heads: [[Bytes; 2]; 2],
    /// Whether `heads` hold the element count: not when the caller's
    /// locations are arguments, one each, so the count is the request's.
    counted: bool,
    keys: Keys,
    /// Its ARGV, each run of what every call has alike encoded once.
    pieces: Vec<Piece>,
    /// The caller's fields among them, in order.
    callers: Vec<Field>,
    /// How many ARGV elements every call has alike (words, settings, nonce).
    fixed_argc: usize,
    /// What a call takes at most besides its keys and the bytes of the
    /// caller's fields and nonce: its head and the encoded pieces, and a
    /// bulk string's header and CRLF for each caller's field and the nonce.
    most: usize,
    /// The settings, one argument, as they are (for the fallback).
    settings_arg: Vec<u8>,
    /// The settings one by one, as they are (for `lua/deduct_many.lua`,
    /// which takes them so: a coalesced call's shared arguments cost once
    /// for all its members)...
    fixed_args: Vec<Vec<u8>>,
    /// ... and encoded, with the two flags after them.
    split: Bytes,
}

/// A piece of a call's ARGV.
#[derive(Clone)]
enum Piece {
    /// Words and the settings, encoded; `settings` when the settings are
    /// its end (where a coalesced call's marks fall).
    Encoded {
        bytes: Bytes,
        settings: bool,
    },
    Caller(Field),
    Nonce,
}

impl Wire {
    /// The call `single` describes: `fixed` its settings' values, then the
    /// `flags` (replicate, journal: `"0"` or `"1"` each), as one argument.
    pub(super) fn new(
        single: &Single,
        scripts: &crate::script::Scripts,
        fixed: &[&[u8]],
        flags: [&[u8]; 2],
    ) -> Wire {
        let script = (single.script)(scripts);
        let joined_flags = flags.concat();
        let settings_arg = fixed
            .iter()
            .copied()
            .chain([joined_flags.as_slice()])
            .collect::<Vec<&[u8]>>()
            .join(&b' ');
        let mut pieces: Vec<Piece> = Vec::new();
        let mut fixed_argc = 0;
        for arg in single.argv {
            let encoded = match arg {
                Arg::Word(word) => Some((word.as_bytes(), false)),
                Arg::Settings => Some((settings_arg.as_slice(), true)),
                Arg::Caller(field) => {
                    pieces.push(Piece::Caller(*field));
                    None
                }
                Arg::Nonce => {
                    fixed_argc += 1;
                    pieces.push(Piece::Nonce);
                    None
                }
            };
            let Some((bytes, settings)) = encoded else {
                continue;
            };
            fixed_argc += 1;
            let mut more = BytesMut::new();
            reply::bulk_of(&mut more, bytes);
            // One run of encoded pieces, unless the settings end one (a
            // coalesced call marks where they start).
            match pieces.last_mut() {
                Some(Piece::Encoded {
                    bytes: run,
                    settings: false,
                }) if !settings => {
                    let mut joined = BytesMut::from(&run[..]);
                    joined.extend_from_slice(&more);
                    *run = joined.freeze();
                }
                _ => pieces.push(Piece::Encoded {
                    bytes: more.freeze(),
                    settings,
                }),
            }
        }
        let mut split = BytesMut::new();
        for arg in fixed.iter().chain(&flags) {
            reply::bulk_of(&mut split, arg);
        }
        let counted = !single.argv.contains(&Arg::Caller(Field::Locations));
        let fields: Vec<Field> = pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Caller(field) => Some(*field),
                _ => None,
            })
            .collect();
        assert!(
            fields.len() <= MOST_CALLER,
            "a script takes at most {MOST_CALLER} of the caller's fields"
        );
        let callers = fields.len();
        let heads = [Calling::Function, Calling::Eval].map(|calling| {
            [false, true].map(|change| {
                let key_count = key_count(single.keys, change);
                let mut head = BytesMut::new();
                if counted {
                    script.write_head(calling, &mut head, key_count, callers + fixed_argc);
                } else {
                    // `*<n>` is the request's, written before these.
                    let (verb, name) = script.named(calling);
                    for word in [verb, name, &key_count.to_string()] {
                        reply::bulk_of(&mut head, word.as_bytes());
                    }
                }
                head.freeze()
            })
        });
        let most = LINE_MOST
            + heads.iter().flatten().map(Bytes::len).max().unwrap_or(0)
            + pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Encoded { bytes, .. } => bytes.len(),
                    Piece::Caller(_) | Piece::Nonce => LINE_MOST_BULK,
                })
                .sum::<usize>();
        Wire {
            script: script.clone(),
            heads,
            counted,
            keys: single.keys,
            pieces,
            callers: fields,
            fixed_argc,
            most,
            settings_arg,
            fixed_args: fixed.iter().map(|a| a.to_vec()).collect(),
            split: split.freeze(),
        }
    }

    /// The head of a call on `request` (see [`Wire::heads`]).
    fn head(&self, calling: Calling, request: &OneRequest) -> &[u8] {
        let change = usize::from(self.names_change(request));
        match calling {
            Calling::Function => &self.heads[0][change],
            Calling::Eval => &self.heads[1][change],
        }
    }

    /// Whether a call on `request` names its change's record.
    fn names_change(&self, request: &OneRequest) -> bool {
        request.change_id.is_some() && matches!(self.keys, Keys::Changed | Keys::LocatedChanged)
    }

    /// How many ARGV elements a call on `request` has.
    fn arg_count(&self, request: &OneRequest) -> usize {
        self.fixed_argc
            + self
                .pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Caller(Field::Locations) => request.locations().len(),
                    Piece::Caller(_) => 1,
                    _ => 0,
                })
                .sum::<usize>()
    }

    /// Writes the call on `request` into a node pipe's batch: byte for byte
    /// what [`LuaScript::write_call`] of [`Wire::keys`] and [`Wire::argv`]
    /// writes (a test checks). Its marks: where the head, the stock key,
    /// the record key, the other keys, the caller's fields, the settings
    /// and the nonce end (what a coalesced DEDUCT alone in its call is cut
    /// at, [`super::coalesce`]).
    pub(super) fn encode(
        &self,
        calling: Calling,
        keys: &KeyLayout,
        request: &OneRequest,
        nonce: &[u8],
        buf: &mut BytesMut,
    ) -> LoneMarks {
        let (sku, request_id) = (&request.sku, &request.request_id);
        let head = self.head(calling, request);
        let stock = keys.stock_key_parts(sku);
        let record = keys.record_key_parts(sku, request_id);
        let side = keys.side_key_parts(sku);
        let located = matches!(self.keys, Keys::Located | Keys::LocatedChanged)
            .then(|| keys.locations_key_parts(sku));
        let change = match &request.change_id {
            Some(change_id) if self.names_change(request) => {
                Some(keys.change_key_parts(sku, change_id))
            }
            _ => None,
        };
        // The caller's fields, each looked up once (the locations aside:
        // they are as many arguments as the request names).
        let mut caller: [&[u8]; MOST_CALLER] = [b""; MOST_CALLER];
        let mut caller_len = 0;
        let mut located_args = 0;
        for (slot, field) in caller.iter_mut().zip(&self.callers) {
            if *field == Field::Locations {
                located_args = request
                    .locations()
                    .iter()
                    .map(|l| l.as_bytes().len() + LINE_MOST_BULK)
                    .sum();
            } else {
                *slot = request.field(*field).unwrap_or_default();
                caller_len += slot.len();
            }
        }
        let most = self.most
            + caller_len
            + located_args
            + nonce.len()
            + Spare::bulk_parts_most(&stock)
            + Spare::bulk_parts_most(&record)
            + side
                .iter()
                .map(|k| Spare::bulk_parts_most(k))
                .sum::<usize>()
            + located.as_ref().map_or(0, |k| Spare::bulk_parts_most(k))
            + change.as_ref().map_or(0, |k| Spare::bulk_parts_most(k));
        let mut out = Spare::new(buf, most);
        let mut marks = LoneMarks::default();
        if !self.counted {
            let key_count = key_count(self.keys, change.is_some());
            out.line(b'*', (3 + key_count + self.arg_count(request)) as i64);
        }
        out.put(head);
        marks[0] = out.written();
        out.bulk_parts(&stock);
        marks[1] = out.written();
        out.bulk_parts(&record);
        marks[2] = out.written();
        for key in &side {
            out.bulk_parts(key);
        }
        if let Some(key) = &located {
            out.bulk_parts(key);
        }
        if let Some(key) = &change {
            out.bulk_parts(key);
        }
        marks[3] = out.written();
        marks[4] = out.written();
        let mut caller = caller.iter();
        for piece in &self.pieces {
            match piece {
                Piece::Encoded { bytes, settings } => {
                    if *settings {
                        marks[4] = out.written();
                    }
                    out.put(bytes);
                    if *settings {
                        marks[5] = out.written();
                    }
                }
                Piece::Caller(Field::Locations) => {
                    caller.next();
                    for location in request.locations() {
                        out.bulk(location.as_bytes());
                    }
                }
                Piece::Caller(_) => out.bulk(caller.next().copied().unwrap_or_default()),
                Piece::Nonce => out.bulk(nonce),
            }
        }
        marks[6] = out.written();
        out.done();
        marks
    }

    /// [`Wire::encode`] of a DEDUCT from keys and arguments written as
    /// bulk strings already: the stock key, the record key, the SKU's four
    /// other keys, the caller's arguments and the nonce (a coalesced DEDUCT
    /// alone in its call, [`super::coalesce`]).
    pub(super) fn encode_bulks(
        &self,
        calling: Calling,
        [stock, record, side, caller, nonce]: [&[u8]; 5],
        buf: &mut BytesMut,
    ) {
        debug_assert!(self.keys == Keys::Request && self.counted);
        let settings = self
            .pieces
            .iter()
            .find_map(|piece| match piece {
                Piece::Encoded {
                    bytes,
                    settings: true,
                } => Some(&bytes[..]),
                _ => None,
            })
            .unwrap_or_default();
        let head = match calling {
            Calling::Function => &self.heads[0][0],
            Calling::Eval => &self.heads[1][0],
        };
        let pieces = [head, stock, record, side, caller, settings, nonce];
        let mut out = Spare::new(buf, pieces.iter().map(|p| p.len()).sum::<usize>());
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

    /// The keys of a call on `request`, for the fallback.
    pub(super) fn keys(&self, layout: &KeyLayout, request: &OneRequest) -> Vec<Vec<u8>> {
        let (sku, request_id) = (&request.sku, &request.request_id);
        let mut keys: Vec<Vec<u8>> = layout
            .request_keys(sku, request_id)
            .all()
            .iter()
            .map(|k| k.to_vec())
            .collect();
        if matches!(self.keys, Keys::Located | Keys::LocatedChanged) {
            keys.push(layout.locations_key(sku));
        }
        if let Some(change_id) = request
            .change_id
            .as_ref()
            .filter(|_| matches!(self.keys, Keys::Changed | Keys::LocatedChanged))
        {
            keys.push(layout.change_key_parts(sku, change_id).concat());
        }
        keys
    }

    /// The script's ARGV for a call on `request`, for the fallback.
    pub(super) fn argv<'a>(
        &'a self,
        single: &Single,
        request: &'a OneRequest,
        nonce: &'a [u8],
    ) -> Vec<&'a [u8]> {
        let mut argv = Vec::with_capacity(self.arg_count(request));
        for arg in single.argv {
            match arg {
                Arg::Word(word) => argv.push(word.as_bytes()),
                Arg::Settings => argv.push(&self.settings_arg),
                Arg::Nonce => argv.push(nonce),
                Arg::Caller(Field::Locations) => {
                    argv.extend(request.locations().iter().map(Location::as_bytes))
                }
                Arg::Caller(field) => argv.push(request.field(*field).unwrap_or_default()),
            }
        }
        argv
    }
}

/// How many keys a call names: the request's six, then what `keys` adds
/// (with `change`, the change's record).
fn key_count(keys: Keys, change: bool) -> usize {
    let change = usize::from(change);
    match keys {
        Keys::Request => 6,
        Keys::Located => 7,
        Keys::Changed => 6 + change,
        Keys::LocatedChanged => 7 + change,
    }
}
