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

/// One script's call on one request, pre-encoded.
#[derive(Clone)]
pub(super) struct Wire {
    pub(super) script: Arc<LuaScript>,
    /// `FCALL <function>` and `EVALSHA <sha>`, encoded: the words after
    /// the call's count, before its number of keys.
    verbs: [Bytes; 2],
    keys: Keys,
    /// Its ARGV, each run of what every call has alike encoded once.
    pieces: Vec<Piece>,
    /// How many ARGV elements every call has alike (words, settings, nonce).
    fixed_argc: usize,
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
        let verbs = [Calling::Function, Calling::Eval].map(|calling| {
            let (verb, name) = script.named(calling);
            let mut head = BytesMut::new();
            reply::bulk_of(&mut head, verb.as_bytes());
            reply::bulk_of(&mut head, name.as_bytes());
            head.freeze()
        });
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
        Wire {
            script: script.clone(),
            verbs,
            keys: single.keys,
            pieces,
            fixed_argc,
            settings_arg,
            fixed_args: fixed.iter().map(|a| a.to_vec()).collect(),
            split: split.freeze(),
        }
    }

    fn verbs(&self, calling: Calling) -> &[u8] {
        match calling {
            Calling::Function => &self.verbs[0],
            Calling::Eval => &self.verbs[1],
        }
    }

    /// How many keys a call on `request` names.
    fn key_count(&self, request: &OneRequest) -> usize {
        let change = usize::from(request.change_id.is_some());
        match self.keys {
            Keys::Request => 6,
            Keys::Located => 7,
            Keys::Changed => 6 + change,
            Keys::LocatedChanged => 7 + change,
        }
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
        let verbs = self.verbs(calling);
        let stock = keys.stock_key_parts(sku);
        let record = keys.record_key_parts(sku, request_id);
        let side = keys.side_key_parts(sku);
        let located = matches!(self.keys, Keys::Located | Keys::LocatedChanged)
            .then(|| keys.locations_key_parts(sku));
        let change = request
            .change_id
            .as_ref()
            .filter(|_| matches!(self.keys, Keys::Changed | Keys::LocatedChanged))
            .map(|change_id| keys.change_key_parts(sku, change_id));
        let mut most = 2 * LINE_MOST
            + verbs.len()
            + Spare::bulk_parts_most(&stock)
            + Spare::bulk_parts_most(&record)
            + side
                .iter()
                .map(|k| Spare::bulk_parts_most(k))
                .sum::<usize>()
            + located.as_ref().map_or(0, |k| Spare::bulk_parts_most(k))
            + change.as_ref().map_or(0, |k| Spare::bulk_parts_most(k));
        for piece in &self.pieces {
            most += match piece {
                Piece::Encoded { bytes, .. } => bytes.len(),
                Piece::Caller(Field::Locations) => request
                    .locations()
                    .iter()
                    .map(|l| l.as_bytes().len() + LINE_MOST_BULK)
                    .sum(),
                Piece::Caller(field) => {
                    request.field(*field).map_or(0, <[u8]>::len) + LINE_MOST_BULK
                }
                Piece::Nonce => nonce.len() + LINE_MOST_BULK,
            };
        }
        let key_count = self.key_count(request);
        let mut out = Spare::new(buf, most);
        let mut marks = LoneMarks::default();
        out.line(b'*', (3 + key_count + self.arg_count(request)) as i64);
        out.put(verbs);
        out.bulk(itoa::Buffer::new().format(key_count).as_bytes());
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
                    for location in request.locations() {
                        out.bulk(location.as_bytes());
                    }
                }
                Piece::Caller(field) => out.bulk(request.field(*field).unwrap_or_default()),
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
        debug_assert_eq!(self.keys, Keys::Request);
        let caller_count = self
            .pieces
            .iter()
            .filter(|piece| matches!(piece, Piece::Caller(_)))
            .count();
        let verbs = self.verbs(calling);
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
        let pieces = [
            verbs,
            b"$1\r\n6\r\n",
            stock,
            record,
            side,
            caller,
            settings,
            nonce,
        ];
        let mut out = Spare::new(
            buf,
            LINE_MOST + pieces.iter().map(|p| p.len()).sum::<usize>(),
        );
        out.line(b'*', (3 + 6 + caller_count + self.fixed_argc) as i64);
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
