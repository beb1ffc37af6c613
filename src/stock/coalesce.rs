//! Coalescing: the DEDUCTs of one SKU that wait for its primary at the
//! same moment run as one script call (`lua/deduct_many.lua`).
//!
//! In a flash sale every request is for one SKU, so one slot on one
//! primary, which runs them one after another anyway. A script call costs
//! that primary a fixed part (the call, the chunk's closures, the checks of
//! what stockgate supplies, the reads of the stock and held keys) and a
//! part per deduction (its record and its reply); on a hot SKU the fixed
//! part is most of it. So a DEDUCT joins the call gathering in its node
//! pipe's queue when that call is for the same SKU ([`crate::pipeline`]
//! keeps it gathering while the SKU's previous call is still in Redis),
//! and each member gets its own reply, exactly what its own call would
//! have answered at that place in the order.
//!
//! A call of one member is the plain `lua/deduct.lua` call (FCALL or
//! EVALSHA, as [`crate::script::Calling`] is now), byte for byte, so a SKU
//! without company costs nothing new in Redis.
//!
//! The sold-out tail's reads ([`super::sold_out`]) gather the same way
//! ([`ReadJoin`]): one `MGET` of the stock and held keys and every
//! member's record, split into each member's own three values. Every member
//! keeps its own nonce and its own deadline, and one whose answer calls for
//! the slow path (a lost connection, a lost script, a redirect) is sent again
//! alone through the redis crate: safe, because a resend of a call answers
//! as the first send did.

use super::single::OneRequest;
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::params::{RequestId, Sku};
use crate::pipeline::{Gathered, Join, LoneMarks};
use crate::reply::{self, Spare};
use crate::script::{CallingNow, LuaScript};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;

use super::wire::Wire;

/// Marks in [`Gathered::marks`]: one where the shared stock key ends, then
/// three per member (after its record key, after its qty and order_no,
/// after its nonce).
const MEMBER_MARKS: usize = 3;

/// Writes a SKU's gathered DEDUCTs as one call.
pub(super) struct DeductJoin {
    /// `lua/deduct.lua`'s call: a member alone.
    single: Wire,
    /// `lua/deduct_many.lua`.
    many: Arc<LuaScript>,
    /// How scripts are called now (the upstream's).
    calling: Arc<CallingNow>,
    /// Its shared arguments (window, max qty, missing-stock mode,
    /// replicate, journal), encoded.
    shared_args: Bytes,
    most: usize,
    metrics: Arc<Metrics>,
}

impl DeductJoin {
    pub(super) fn new(
        single: &Wire,
        many: &Arc<LuaScript>,
        calling: Arc<CallingNow>,
        most: usize,
        metrics: Arc<Metrics>,
    ) -> DeductJoin {
        DeductJoin {
            single: single.clone(),
            many: many.clone(),
            calling,
            shared_args: Bytes::copy_from_slice(single.shared_args()),
            most,
            metrics,
        }
    }
}

/// Where member `i`'s parts lie in [`Gathered::parts`]: its start, the end
/// of its record key, of its qty and order_no, and of its nonce.
fn member_at(gathered: &Gathered, i: usize) -> [usize; 4] {
    let marks = &gathered.marks[1 + MEMBER_MARKS * i..][..MEMBER_MARKS];
    let start = if i == 0 {
        0
    } else {
        gathered.marks[MEMBER_MARKS * i]
    };
    [start, marks[0], marks[1], marks[2]]
}

impl Join for DeductJoin {
    fn most(&self) -> usize {
        self.most
    }

    fn gather_lone(&self, call: &[u8], marks: &LoneMarks, gathered: &mut Gathered) {
        // The pieces `Wire::encode` marked: the head, the stock key, the
        // record key, the SKU's four other keys, the caller's arguments,
        // the settings, the nonce.
        let [head, stock, record, side, caller, settings, nonce] = *marks;
        let shared = &mut gathered.shared;
        shared.extend_from_slice(&call[head..stock]);
        gathered.marks.push(shared.len());
        shared.extend_from_slice(&call[record..side]);
        let parts = &mut gathered.parts;
        parts.extend_from_slice(&call[stock..record]);
        gathered.marks.push(parts.len());
        parts.extend_from_slice(&call[side..caller]);
        gathered.marks.push(parts.len());
        parts.extend_from_slice(&call[settings..nonce]);
        gathered.marks.push(parts.len());
    }

    fn split(&self, frame: &Bytes, members: usize) -> Option<Vec<Bytes>> {
        split_flat(frame, members)
    }

    fn write(&self, gathered: &Gathered, out: &mut BytesMut) {
        let members = gathered.members;
        let (stock, side) = gathered.shared.split_at(gathered.marks[0]);
        let parts = &gathered.parts[..];
        let calling = self.calling.get();
        if members == 1 {
            let [start, record, caller, nonce] = member_at(gathered, 0);
            self.single.encode_bulks(
                calling,
                [
                    stock,
                    &parts[start..record],
                    side,
                    &parts[record..caller],
                    &parts[caller..nonce],
                ],
                out,
            );
            return;
        }
        self.metrics.record_coalesced(members);
        // KEYS: stock, holds, held, marker, journal, then each member's record; ARGV: the
        // shared five (window, max qty, missing-stock mode, the replicate
        // and journal flags), then each member's qty, order_no and nonce.
        self.many
            .write_head(calling, out, 5 + members, 5 + 3 * members);
        out.extend_from_slice(stock);
        out.extend_from_slice(side);
        for i in 0..members {
            let [start, record, ..] = member_at(gathered, i);
            out.extend_from_slice(&parts[start..record]);
        }
        out.extend_from_slice(&self.shared_args);
        for i in 0..members {
            let [_, record, _, nonce] = member_at(gathered, i);
            out.extend_from_slice(&parts[record..nonce]);
        }
    }
}

/// `lua/deduct_many.lua`'s flat reply, split: for each member, the count
/// of its reply's elements, then those elements (its own call's reply is
/// that array); or 0, then its error reply; or `-1 - remain` (below 0),
/// then the order_no, of `{0, remain, order_no, VERSION}`, the commonest. Each member
/// gets the bytes its own call would have got; `None` unless there are
/// `members` of them.
fn split_flat(frame: &Bytes, members: usize) -> Option<Vec<Bytes>> {
    let crate::answer::Shape::Array(total) = crate::answer::shape(frame) else {
        return None;
    };
    let mut elements = crate::answer::elements(frame, total)?;
    let mut replies = Vec::with_capacity(members);
    while let Some(count) = elements.next() {
        match crate::answer::shape(&count) {
            crate::answer::Shape::Integer(0) => replies.push(elements.next()?),
            crate::answer::Shape::Integer(code) if code < 0 => {
                let order_no = elements.next()?;
                let mut own = BytesMut::with_capacity(32 + order_no.len());
                own.extend_from_slice(b"*4\r\n:0\r\n:");
                own.extend_from_slice(itoa::Buffer::new().format(-1 - code).as_bytes());
                own.extend_from_slice(b"\r\n");
                own.extend_from_slice(&order_no);
                own.extend_from_slice(b":");
                own.extend_from_slice(
                    itoa::Buffer::new()
                        .format(crate::outcome::SCRIPT_VERSION)
                        .as_bytes(),
                );
                own.extend_from_slice(b"\r\n");
                replies.push(own.freeze());
            }
            crate::answer::Shape::Integer(count) if count > 0 => {
                let mut own = BytesMut::new();
                own.extend_from_slice(b"*");
                own.extend_from_slice(itoa::Buffer::new().format(count).as_bytes());
                own.extend_from_slice(b"\r\n");
                for _ in 0..count {
                    own.extend_from_slice(&elements.next()?);
                }
                replies.push(own.freeze());
            }
            _ => return None,
        }
    }
    (replies.len() == members).then_some(replies)
}

/// What the first DEDUCT of a call writes for all of them: the SKU's stock
/// key, then its four other keys (holds, held units, journal marker,
/// journal), as
/// both a member alone and a call of many name them.
pub(super) fn write_shared(keys: &KeyLayout, sku: &Sku, gathered: &mut Gathered) {
    let stock = keys.stock_key_parts(sku);
    let side = keys.side_key_parts(sku);
    let shared = &mut gathered.shared;
    let base = shared.len();
    let mut out = Spare::new(
        shared,
        Spare::bulk_parts_most(&stock)
            + side
                .iter()
                .map(|k| Spare::bulk_parts_most(k))
                .sum::<usize>(),
    );
    out.bulk_parts(&stock);
    let stock_end = out.written();
    for key in &side {
        out.bulk_parts(key);
    }
    out.done();
    gathered.marks.push(base + stock_end);
}

/// What each DEDUCT of a call writes of its own: its record key, its qty
/// and order_no, its nonce.
pub(super) fn write_member(
    keys: &KeyLayout,
    deduct: &OneRequest,
    nonce: &[u8],
    gathered: &mut Gathered,
) {
    let record = keys.record_key_parts(&deduct.sku, &deduct.request_id);
    let args = deduct.caller_args();
    let args = args.as_slice();
    let parts = &mut gathered.parts;
    let base = parts.len();
    let mut out = Spare::new(
        parts,
        Spare::bulk_parts_most(&record)
            + args
                .iter()
                .map(|a| Spare::bulk_parts_most(&[a]))
                .sum::<usize>()
            + Spare::bulk_parts_most(&[nonce]),
    );
    out.bulk_parts(&record);
    let record_end = out.written();
    for arg in args {
        out.bulk(arg);
    }
    let args_end = out.written();
    out.bulk(nonce);
    let nonce_end = out.written();
    out.done();
    gathered
        .marks
        .extend([base + record_end, base + args_end, base + nonce_end]);
}

/// Writes a SKU's gathered sold-out reads as one `MGET`.
pub(super) struct ReadJoin {
    pub(super) most: usize,
}

impl Join for ReadJoin {
    fn most(&self) -> usize {
        self.most
    }

    /// Alone: `MGET <stock> <record> <held>` ([`super::sold_out::encode_read`]);
    /// together: `MGET <stock> <held> <record 1> ... <record n>`.
    fn write(&self, gathered: &Gathered, out: &mut BytesMut) {
        let members = gathered.members;
        let (stock, held) = gathered.shared.split_at(gathered.marks[0]);
        let mut header = itoa::Buffer::new();
        out.extend_from_slice(b"*");
        out.extend_from_slice(header.format(3 + members).as_bytes());
        out.extend_from_slice(b"\r\n$4\r\nMGET\r\n");
        out.extend_from_slice(stock);
        if members == 1 {
            out.extend_from_slice(&gathered.parts);
            out.extend_from_slice(held);
            return;
        }
        out.extend_from_slice(held);
        out.extend_from_slice(&gathered.parts);
    }

    /// Member i's reply is what its own MGET would read: the stock, its
    /// record, the held units.
    fn split(&self, frame: &Bytes, members: usize) -> Option<Vec<Bytes>> {
        let mut values = crate::answer::elements(frame, 2 + members)?;
        let (stock, held) = (values.next()?, values.next()?);
        Some(
            values
                .map(|record| {
                    let mut own =
                        BytesMut::with_capacity(4 + stock.len() + record.len() + held.len());
                    own.extend_from_slice(b"*3\r\n");
                    own.extend_from_slice(&stock);
                    own.extend_from_slice(&record);
                    own.extend_from_slice(&held);
                    own.freeze()
                })
                .collect(),
        )
    }
}

/// What the first read of a call writes for all of them: the stock key,
/// then the held key.
pub(super) fn write_read_shared(keys: &KeyLayout, sku: &Sku, gathered: &mut Gathered) {
    reply::bulk_parts(&mut gathered.shared, &keys.stock_key_parts(sku));
    gathered.marks.push(gathered.shared.len());
    let [_, held, ..] = keys.side_key_parts(sku);
    reply::bulk_parts(&mut gathered.shared, &held);
}

/// What each read writes of its own: its record key.
pub(super) fn write_read_member(
    keys: &KeyLayout,
    sku: &Sku,
    request_id: &RequestId,
    gathered: &mut Gathered,
) {
    reply::bulk_parts(&mut gathered.parts, &keys.record_key_parts(sku, request_id));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stock::sold_out::{Read, encode_read};

    fn gather(keys: &KeyLayout, sku: &Sku, ids: &[&str]) -> Gathered {
        let mut gathered = Gathered::default();
        write_read_shared(keys, sku, &mut gathered);
        for id in ids {
            let id = RequestId::parse(Bytes::copy_from_slice(id.as_bytes())).unwrap();
            write_read_member(keys, sku, &id, &mut gathered);
            gathered.members += 1;
        }
        gathered
    }

    #[test]
    fn a_flat_reply_splits_into_each_members_own_reply() {
        let v = crate::outcome::SCRIPT_VERSION;
        let frame = Bytes::from(format!(
            "*15\r\n:4\r\n:1\r\n:97\r\n$3\r\nO-1\r\n:{v}\r\n\
             :0\r\n-BADRECORD no\r\n\
             :5\r\n:3\r\n:-1\r\n$0\r\n\r\n:{v}\r\n$3\r\nwhy\r\n\
             :-97\r\n$3\r\nO-2\r\n"
        ));
        let members = split_flat(&frame, 4).unwrap();
        let own = |text: String| Bytes::from(text);
        assert_eq!(
            members,
            [
                own(format!("*4\r\n:1\r\n:97\r\n$3\r\nO-1\r\n:{v}\r\n")),
                own("-BADRECORD no\r\n".to_owned()),
                own(format!(
                    "*5\r\n:3\r\n:-1\r\n$0\r\n\r\n:{v}\r\n$3\r\nwhy\r\n"
                )),
                own(format!("*4\r\n:0\r\n:96\r\n$3\r\nO-2\r\n:{v}\r\n")),
            ]
        );
        // Not as many members as the call had, or not this shape at all.
        assert_eq!(split_flat(&frame, 3), None);
        assert_eq!(split_flat(&Bytes::from_static(b"-BADCALL x\r\n"), 2), None);
        assert_eq!(split_flat(&Bytes::from_static(b"*1\r\n:3\r\n"), 1), None);
    }

    #[test]
    fn a_read_alone_is_its_own_mget_and_reads_together_split_into_their_own() {
        let keys = KeyLayout::new("stock").unwrap();
        let sku = Sku::parse(Bytes::from_static(b"hot")).unwrap();
        let join = ReadJoin { most: 32 };

        let mut alone = BytesMut::new();
        join.write(&gather(&keys, &sku, &["a"]), &mut alone);
        let id = RequestId::parse(Bytes::from_static(b"a")).unwrap();
        let [_, held, ..] = keys.side_key_parts(&sku);
        let mut own = BytesMut::new();
        encode_read(
            [
                &keys.stock_key_parts(&sku),
                &keys.record_key_parts(&sku, &id),
                &held,
            ],
            &mut own,
        );
        assert_eq!(alone, own);

        let mut together = BytesMut::new();
        join.write(&gather(&keys, &sku, &["a", "b", "c"]), &mut together);
        assert_eq!(
            &together[..],
            &crate::reply::encode_command(&[
                b"MGET",
                b"stock:{hot}",
                b"stock:{hot}:held",
                b"stock:{hot}:req:a",
                b"stock:{hot}:req:b",
                b"stock:{hot}:req:c",
            ])[..]
        );
        // Redis's reply: stock 0, held missing, a record for b only.
        let reply = Bytes::from_static(b"*5\r\n$1\r\n0\r\n$-1\r\n$-1\r\n$3\r\nrec\r\n$-1\r\n");
        let parts = join.split(&reply, 3).unwrap();
        let reads: Vec<Read> = parts.iter().map(|p| Read::from_frame(p).unwrap()).collect();
        for (read, record) in reads.iter().zip([None, Some(&b"rec"[..]), None]) {
            assert_eq!(read.stock.as_deref(), Some(&b"0"[..]));
            assert_eq!(read.record.as_deref(), record);
            assert_eq!(read.held, None);
        }
        assert!(join.split(&reply, 2).is_none(), "a count that differs");
        assert!(join.split(&Bytes::from_static(b"-ERR x\r\n"), 3).is_none());
    }
}
