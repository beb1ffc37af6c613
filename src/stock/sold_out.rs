//! The sold-out path of DEDUCT: answering from one read when the script
//! would only say no.
//!
//! A flash sale sells out in seconds, then keeps receiving requests for a
//! SKU that is gone, and retries of the ones that succeeded. The script
//! answers each of them exactly (2 with the stock, 1 for an applied id),
//! but a script call costs Redis about 6 µs even when it only reads; one
//! `MGET` of the stock, the record and the held counter costs under 1 µs.
//! So once a SKU was seen short, its next DEDUCTs first read those three
//! keys (one slot, one node pipe) and [`decide`] answers from them what
//! `lua/deduct.lua` would answer in that state, or says the script must
//! run because the request could succeed, or because the read alone can't
//! tell (the SKU has holds, whose expiry would need the script).
//!
//! What turns the path on is a memory of the stock each SKU was last seen
//! short at ([`Memory`]), from DEDUCT replies: a SKU that answered 2 with
//! no units on hold (the reply says how many: a read could never answer
//! for a SKU with holds, so its DEDUCTs go straight to the script) takes
//! the read for any qty above the stock it showed, until a read finds
//! enough stock for a request (a restock, a REVERT, holds to release):
//! that request runs the script and the SKU is forgotten. No clock is
//! involved, so the path turns off on the first request that could
//! succeed, however soon. A wrong guess costs one read, never a wrong
//! answer: the answer always comes from Redis's state as the read found
//! it, with the script's own rules (a differential test,
//! `tests/sold_out.rs`, runs both on random states).
//!
//! Off with `--sold-out-reads false`, and with `--wait-replicas` (a
//! duplicate's answer must then wait for a replicated write, which only the
//! script makes) and on TLS upstreams (no node pipes).

use crate::error::UpstreamError;
use crate::keys::KEPT_BY_LOCATION;
use crate::outcome::{Code, SCRIPT_VERSION, StockReply};
use crate::record::{RecordView, State};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// SKUs remembered at most; past that the memory starts over (it is only
/// a guess, and a flash sale has few hot SKUs).
const CAPACITY: usize = 4096;

/// What the read says.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// The script's answer in this state, without running it.
    Answer(Result<StockReply, UpstreamError>),
    /// The request could succeed, or only the script can tell: run it.
    RunScript,
}

/// The three values `MGET <stock key> <record key> <held key>` read.
#[derive(Debug, Clone, Default)]
pub struct Read {
    pub stock: Option<Bytes>,
    pub record: Option<Bytes>,
    pub held: Option<Bytes>,
}

impl Read {
    /// The MGET's reply as a node pipe reads it, or `None` for any other
    /// shape (an error reply, a redirect): the script then runs.
    pub fn from_frame(frame: &Bytes) -> Option<Read> {
        use crate::answer::{Item, Shape};
        if crate::answer::shape(frame) != Shape::Array(3) {
            return None;
        }
        let mut items = crate::answer::items(frame).map(|item| match item {
            Item::Text(text) => Some(text),
            _ => None,
        });
        Some(Read {
            stock: items.next()?,
            record: items.next()?,
            held: items.next()?,
        })
    }
}

/// Encodes `MGET <stock key> <record key> <held key>`, each key written
/// from its parts (no key is built: this is the sold-out tail's hot path).
pub fn encode_read(keys: [&[&[u8]]; 3], buf: &mut BytesMut) {
    buf.put_slice(b"*4\r\n$4\r\nMGET\r\n");
    for parts in keys {
        crate::reply::bulk_parts(buf, parts);
    }
}

/// What `lua/deduct.lua` answers a DEDUCT of `qty` (its canonical text)
/// in the state `read` found, when that answer changes nothing; otherwise
/// [`Decision::RunScript`]. The script's steps, in its order: the stock
/// must be an exact integer (BADSTOCK; a SKU kept by location's `loc` runs
/// the script), the record readable (BADRECORD),
/// expired holds are released first (so any hold at all means the script
/// runs), a known request_id answers by its state, a missing stock key is
/// UNKNOWNSKU (or 2 with `--missing-stock zero`), and a short stock is 2.
/// The texts of code 3 and of the errors are the script's, word for word.
pub fn decide(read: &Read, qty: &[u8], missing_zero: bool) -> Decision {
    let stock = match read.stock.as_deref().map(parse_stock) {
        None => None,
        Some(Some(stock)) => Some(stock),
        // A SKU kept by location: the script answers LOCATED and the call
        // goes on by location, which no read stands in for.
        Some(None) if read.stock.as_deref() == Some(KEPT_BY_LOCATION) => {
            return Decision::RunScript;
        }
        Some(None) => {
            return Decision::Answer(Err(UpstreamError::from_server_error(
                "BADSTOCK",
                "stock value is not an integer; nothing was changed",
            )));
        }
    };
    let record = match read.record.as_deref() {
        None => None,
        Some(raw) => match RecordView::parse(raw) {
            Some(record) => Some(record),
            None => {
                return Decision::Answer(Err(UpstreamError::from_server_error(
                    "BADRECORD",
                    "idempotency record has an unknown shape; nothing was changed",
                )));
            }
        },
    };
    if read.held.is_some() && stock.is_some() {
        return Decision::RunScript;
    }
    let reply = |code: Code, order_no: &[u8], reason: Option<String>| {
        Decision::Answer(Ok(StockReply {
            code,
            // The script answers a missing stock key's remain as -1, but 0
            // for the short answer of `--missing-stock zero`.
            remain: stock.unwrap_or(if code == Code::Insufficient { 0 } else { -1 }),
            order_no: Bytes::copy_from_slice(order_no),
            version: SCRIPT_VERSION,
            expires_at: None,
            reason: reason.map(Bytes::from),
            allocation: None,
            effects: Default::default(),
        }))
    };
    if let Some(record) = record {
        return match record.state {
            State::Reverted | State::Revoked => reply(Code::Revoked, b"", None),
            State::Deducted if record.qty != qty => reply(
                Code::Invalid,
                b"",
                Some(format!(
                    "request_id was already used with qty {} on this sku",
                    String::from_utf8_lossy(record.qty)
                )),
            ),
            // The script answers 0 to its own nonce (this very call, sent
            // again); a read comes before any send of the call, so the
            // record is always another call's.
            State::Deducted => reply(Code::Duplicate, record.order_no, None),
            _ => reply(
                Code::Invalid,
                b"",
                Some("request_id holds units on this sku (HOLD); CONFIRM or REVERT it".into()),
            ),
        };
    }
    match stock {
        None if missing_zero => reply(Code::Insufficient, b"", None),
        None => Decision::Answer(Err(UpstreamError::from_server_error(
            "UNKNOWNSKU",
            "no stock is recorded for this sku; nothing was changed",
        ))),
        Some(stock) => match std::str::from_utf8(qty)
            .ok()
            .and_then(|q| q.parse::<i64>().ok())
        {
            Some(qty) if stock < qty => reply(Code::Insufficient, b"", None),
            _ => Decision::RunScript,
        },
    }
}

/// The stock as `parse_stock` in `lua/common.lua` reads it: at most 17
/// bytes of an optional `-` and digits, within ±(2^53 − 1).
fn parse_stock(raw: &[u8]) -> Option<i64> {
    use crate::params::MAX_STOCK as EXACT;
    let digits = raw.strip_prefix(b"-").unwrap_or(raw);
    if raw.len() > 17 || digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: i64 = std::str::from_utf8(raw).ok()?.parse().ok()?;
    (-EXACT..=EXACT).contains(&n).then_some(n)
}

/// Which SKUs were seen short lately, and at what stock.
#[derive(Default)]
pub struct Memory {
    short: Mutex<HashMap<Bytes, i64>>,
    /// Whether `short` has any entry (written under its lock): while none
    /// is short, a DEDUCT costs this memory one load, not a lock and a hash.
    any: AtomicBool,
}

impl Memory {
    /// No SKU is remembered short: one load, no lock.
    pub fn is_empty(&self) -> bool {
        !self.any.load(Ordering::Relaxed)
    }

    /// Whether a DEDUCT of `qty` on `sku` should read first: the SKU was
    /// last seen short at a stock below `qty`.
    pub fn wants_read(&self, sku: &[u8], qty: u64) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        let short = self.short.lock().expect("memory lock");
        match short.get(sku) {
            Some(stock) => i64::try_from(qty).is_ok_and(|q| q > *stock),
            None => false,
        }
    }

    /// Learns from a DEDUCT's reply (from the script or the read): a 2
    /// remembers the SKU short at the stock it gave, unless the SKU had
    /// units on hold (`held`, from the reply): a read can't answer for those
    /// (their expiry needs the script), so its DEDUCTs go straight to the
    /// script on the node pipe; an ok or duplicate reply of a remembered
    /// SKU updates its stock; `forget` drops it.
    pub fn learn(&self, sku: &[u8], code: Code, remain: i64, held: bool) {
        if code != Code::Insufficient && !self.any.load(Ordering::Relaxed) {
            return;
        }
        if code == Code::Insufficient && held {
            if self.any.load(Ordering::Relaxed) {
                self.forget(sku);
            }
            return;
        }
        let mut short = self.short.lock().expect("memory lock");
        match code {
            Code::Insufficient => {
                if let Some(entry) = short.get_mut(sku) {
                    *entry = remain;
                    return;
                }
                if short.len() >= CAPACITY {
                    short.clear();
                }
                short.insert(Bytes::copy_from_slice(sku), remain);
                self.any.store(true, Ordering::Relaxed);
            }
            Code::Ok | Code::Duplicate => {
                if let Some(entry) = short.get_mut(sku) {
                    *entry = remain;
                }
            }
            _ => {}
        }
    }

    /// Forgets `sku`: a read found enough stock for a request. When no SKU
    /// is left, DEDUCTs stop taking the lock again.
    pub fn forget(&self, sku: &[u8]) {
        let mut short = self.short.lock().expect("memory lock");
        short.remove(sku);
        if short.is_empty() {
            self.any.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(stock: Option<&str>, record: Option<&str>, held: Option<&str>) -> Read {
        let b = |s: Option<&str>| s.map(|s| Bytes::copy_from_slice(s.as_bytes()));
        Read {
            stock: b(stock),
            record: b(record),
            held: b(held),
        }
    }

    fn code(decision: Decision) -> Option<i64> {
        match decision {
            Decision::Answer(Ok(reply)) => Some(reply.code as i64),
            _ => None,
        }
    }

    #[test]
    fn a_short_stock_is_2_and_enough_runs_the_script() {
        assert_eq!(
            code(decide(&read(Some("3"), None, None), b"5", false)),
            Some(2)
        );
        assert_eq!(
            decide(&read(Some("5"), None, None), b"5", false),
            Decision::RunScript
        );
        // Any hold at all: only the script can release the expired ones.
        assert_eq!(
            decide(&read(Some("0"), None, Some("2")), b"5", false),
            Decision::RunScript
        );
    }

    #[test]
    fn a_known_id_answers_by_its_record_even_when_sold_out() {
        let dup = decide(&read(Some("0"), Some("3:D:2:ab::ORD"), None), b"2", false);
        match dup {
            Decision::Answer(Ok(reply)) => {
                assert_eq!((reply.code, reply.remain), (Code::Duplicate, 0));
                assert_eq!(&reply.order_no[..], b"ORD");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            code(decide(
                &read(Some("0"), Some("3:D:02:ab::"), None),
                b"2",
                false
            )),
            Some(3)
        );
        assert_eq!(
            code(decide(&read(Some("0"), Some("V:0:"), None), b"2", false)),
            Some(4)
        );
        assert_eq!(
            code(decide(
                &read(Some("0"), Some("3:X:2:ab:9.1:"), None),
                b"2",
                false
            )),
            Some(3)
        );
    }

    #[test]
    fn stored_data_the_script_refuses_is_an_error() {
        for (stock, record) in [(Some("1.5"), None), (Some("0"), Some("3:H:2:ab::"))] {
            assert!(matches!(
                decide(&read(stock, record, None), b"1", false),
                Decision::Answer(Err(_))
            ));
        }
        assert!(matches!(
            decide(&read(None, None, None), b"1", false),
            Decision::Answer(Err(_))
        ));
        assert_eq!(code(decide(&read(None, None, None), b"1", true)), Some(2));
    }

    #[test]
    fn the_memory_reads_only_above_the_stock_it_saw() {
        let memory = Memory::default();
        let sku: &[u8] = b"hot";
        assert!(!memory.wants_read(sku, 1));
        memory.learn(sku, Code::Insufficient, 3, false);
        assert!(memory.wants_read(sku, 5));
        assert!(!memory.wants_read(sku, 3));
        memory.learn(sku, Code::Ok, 0, false);
        assert!(memory.wants_read(sku, 1));
        memory.forget(sku);
        assert!(!memory.wants_read(sku, 5));
        // Short with units on hold: the script must run (their expiry), so
        // no read first.
        memory.learn(sku, Code::Insufficient, 3, true);
        assert!(!memory.wants_read(sku, 5));
        memory.learn(sku, Code::Insufficient, 3, false);
        memory.learn(sku, Code::Insufficient, 1, true);
        assert!(!memory.wants_read(sku, 5), "holds appeared: forgotten");
    }

    #[test]
    fn the_read_is_a_well_formed_mget() {
        let mut buf = BytesMut::new();
        encode_read(
            [&[b"s:{a}"], &[b"s:{a}", b":req:1"], &[b"s:{a}:held"]],
            &mut buf,
        );
        assert_eq!(
            &buf[..],
            b"*4\r\n$4\r\nMGET\r\n$5\r\ns:{a}\r\n$11\r\ns:{a}:req:1\r\n$10\r\ns:{a}:held\r\n"
        );
        let frame = Bytes::from_static(b"*3\r\n$1\r\n0\r\n$-1\r\n$1\r\n2\r\n");
        let read = Read::from_frame(&frame).unwrap();
        assert_eq!(read.stock.as_deref(), Some(&b"0"[..]));
        assert!(read.record.is_none());
        assert_eq!(read.held.as_deref(), Some(&b"2"[..]));
        assert!(Read::from_frame(&Bytes::from_static(b"-MOVED 1 x\r\n")).is_none());
    }
}
