//! The key layout: the one place that knows how stockgate's keys look.
//!
//! ```text
//! stock key           <prefix>:{<sku>}
//! idempotency record  <prefix>:{<sku>}:req:<request_id>
//! operator's change   <prefix>:{<sku>}:op:<op_id>        (STOCK.SET, STOCK.ADD)
//! change of a hold    <prefix>:{<sku>}:chg:<change_id>   (HOLD.EXTEND, HOLD.SHRINK)
//! holds               <prefix>:{<sku>}:holds             sorted set: request_id by expiry
//! units held          <prefix>:{<sku>}:held              integer
//! locations           <prefix>:{<sku>}:loc               hash: <location>, <location>:held, <location>:floor
//! journal             <prefix>:{<sku>}:journal           stream (crate::journal)
//! journal marker      <prefix>:{<sku>}:journal:on        "1" while the journal exists
//! sink's last read    <prefix>:{<sku>}:journal:sunk      stream id (--wait-replicas)
//!
//! sweep index         <prefix>:{<shard tag>}:due         sorted set: sku by when to look
//! sweep marks         <prefix>:{<shard tag>}:marks       hash: sku -> when it was marked
//! sweep lease         <prefix>:{sweep}:lease             the sweeping stockgate's id
//! active shards       <prefix>:{sweep}:active            sorted set: shard by until when
//!
//! order intent        <prefix>:{order:<request_id>}:intent   hash (lua/order.lua)
//! orders in flight    <prefix>:{<shard tag>}:orders      sorted set: order request_id by when to look
//! ```
//!
//! The sku is the Redis Cluster hash tag of a SKU's keys, so they always
//! hash to one slot and one script can touch them all. Skus and prefixes
//! may not contain braces (see [`crate::params`]), so the tag is exactly
//! the sku.
//!
//! The sweep index ([`crate::stock::sweeper`]) has [`SWEEP_SHARDS`]
//! shards; shard `k` indexes the skus whose slots fall in the k-th
//! [`SWEEP_SHARD_SLOTS`] slots, and its tag is chosen to hash into that
//! range too, so on a cluster whose primaries own ranges of slots the
//! index of a SKU lives on the SKU's own primary. The orders in flight
//! ([`crate::stock::order::recovery`]) are indexed in the same shards, by
//! the slot of each order's intent record.

use crate::params::{ChangeId, OpId, RequestId, Sku};

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster slot of a key, by CRC16 and hash tags as the cluster spec
/// defines them.
pub fn slot(key: &[u8]) -> u16 {
    redis_protocol::redis_keyslot(key)
}

/// The slot of every key of `sku`: the sku is their hash tag, and holds no
/// brace (see [`crate::params`]), so it hashes to the same slot alone.
pub fn sku_slot(sku: &Sku) -> u16 {
    slot(sku.as_bytes())
}

/// Shards of the sweep index, and the slots each covers.
pub const SWEEP_SHARDS: usize = 16;
pub const SWEEP_SHARD_SLOTS: u16 = SLOTS / SWEEP_SHARDS as u16;

/// The keys a call on one request names (DEDUCT, REVERT, HOLD, CONFIRM,
/// STOCK.STATUS; STOCK.SET and STOCK.ADD with their op record as the
/// record), in the order the scripts take them: the stock key, the record
/// key, then the SKU's keys the call may touch besides (its holds, its
/// held units, its journal's marker, its journal), declared so that a
/// cluster checks them before the call runs (lua/common.lua,
/// `request_fault`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestKeys {
    pub stock: Vec<u8>,
    pub record: Vec<u8>,
    pub holds: Vec<u8>,
    pub held: Vec<u8>,
    pub marker: Vec<u8>,
    pub journal: Vec<u8>,
}

impl RequestKeys {
    pub fn all(&self) -> [&[u8]; 6] {
        [
            &self.stock,
            &self.record,
            &self.holds,
            &self.held,
            &self.marker,
            &self.journal,
        ]
    }
}

/// The keys of a SKU that a call on the SKU alone declares (STOCK.GET, the
/// sweeper's release, a coalesced DEDUCT before its records): its stock,
/// holds, held units, journal's marker and journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuKeys {
    pub stock: Vec<u8>,
    pub holds: Vec<u8>,
    pub held: Vec<u8>,
    pub marker: Vec<u8>,
    pub journal: Vec<u8>,
}

impl SkuKeys {
    pub fn all(&self) -> [&[u8]; 5] {
        [
            &self.stock,
            &self.holds,
            &self.held,
            &self.marker,
            &self.journal,
        ]
    }
}

/// One shard of the sweep index: the keys its scripts take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepShard {
    pub due: Vec<u8>,
    pub marks: Vec<u8>,
    /// The orders in flight whose intent lives in this shard's slots.
    pub orders: Vec<u8>,
    /// The SKUs of this shard's slots that have a journal
    /// ([`KeyLayout::journal_key`]): a set, how the sink finds every
    /// journal without scanning the keyspace.
    pub journals: Vec<u8>,
}

/// What every order line's request_id starts with ([`KeyLayout::order_line_id`]).
pub const ORDER_LINE_PREFIX: &str = "~ord:";

/// What the stock key is followed by in its SKU's holds, held units,
/// journal marker and journal.
const HOLDS: &[u8] = b":holds";
const HELD: &[u8] = b":held";
const MARKER: &[u8] = b":journal:on";
const JOURNAL: &[u8] = b":journal";
/// A SKU kept by location: its locations' units, held units and floors,
/// one hash (docs/locations.md; `lua/allocate.lua` reads and writes it).
const LOCATIONS: &[u8] = b":loc";

/// What the stock key of a SKU kept by location holds instead of a number
/// (docs/locations.md; `LOCATED` in lua/common.lua, the scripts' side): its
/// units are in [`KeyLayout::locations_key`].
pub const KEPT_BY_LOCATION: &[u8] = b"loc";

/// One field of a SKU's locations hash ([`KeyLayout::locations_key`]):
/// `<location>` its available units, `<location>:held` its units on hold
/// (absent: 0), `<location>:floor` its floor (absent: 0). A location's
/// name holds no `:`, so the field says which it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationField<'a> {
    Available(&'a str),
    Held(&'a str),
    Floor(&'a str),
}

impl<'a> LocationField<'a> {
    /// None for a field of another shape.
    pub fn parse(field: &'a str) -> Option<LocationField<'a>> {
        let field = match field.split_once(':') {
            None => LocationField::Available(field),
            Some((location, "held")) => LocationField::Held(location),
            Some((location, "floor")) => LocationField::Floor(location),
            Some(_) => return None,
        };
        let (LocationField::Available(location)
        | LocationField::Held(location)
        | LocationField::Floor(location)) = field;
        (!location.is_empty()).then_some(field)
    }
}

/// How keys are named under one `--key-prefix`. Cloned for every task
/// that names keys (each hold's mark in the sweep index among them), so a
/// clone shares its names rather than copying its 4 × 64 shard keys.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    prefix: std::sync::Arc<str>,
    /// The sweep index's shards, by shard number.
    shards: std::sync::Arc<[SweepShard]>,
}

impl KeyLayout {
    /// Checks the prefix: 1 to 64 printable ASCII bytes, no whitespace and no
    /// braces (a brace would become the hash tag instead of the sku).
    pub fn new(prefix: &str) -> Result<KeyLayout, String> {
        let ok = (1..=64).contains(&prefix.len())
            && prefix
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}');
        if !ok {
            return Err(format!(
                "key prefix {prefix:?} must be 1 to 64 printable ASCII bytes without whitespace, '{{' or '}}'"
            ));
        }
        let shards: Vec<SweepShard> = (0..SWEEP_SHARDS)
            .map(|k| {
                let tag = shard_tag(k);
                SweepShard {
                    due: format!("{prefix}:{{{tag}}}:due").into_bytes(),
                    marks: format!("{prefix}:{{{tag}}}:marks").into_bytes(),
                    orders: format!("{prefix}:{{{tag}}}:orders").into_bytes(),
                    journals: format!("{prefix}:{{{tag}}}:journals").into_bytes(),
                }
            })
            .collect();
        let layout = KeyLayout {
            prefix: prefix.into(),
            shards: shards.into(),
        };
        layout.verify_one_slot()?;
        Ok(layout)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>:{<sku>}`, as the parts it is made of: the hot path writes
    /// them straight into the EVALSHA it sends, with no key built between.
    pub fn stock_key_parts<'a>(&'a self, sku: &'a Sku) -> [&'a [u8]; 4] {
        [self.prefix.as_bytes(), b":{", sku.as_bytes(), b"}"]
    }

    /// `<prefix>:{<sku>}:req:<request_id>`, as its parts.
    pub fn record_key_parts<'a>(
        &'a self,
        sku: &'a Sku,
        request_id: &'a RequestId,
    ) -> [&'a [u8]; 5] {
        [
            self.prefix.as_bytes(),
            b":{",
            sku.as_bytes(),
            b"}:req:",
            request_id.as_bytes(),
        ]
    }

    /// `<prefix>:{<sku>}:holds`, `:held`, `:journal:on` and `:journal`:
    /// the keys a call on one of the SKU's requests names after its stock
    /// and record keys ([`RequestKeys`]), as parts.
    pub fn side_key_parts<'a>(&'a self, sku: &'a Sku) -> [[&'a [u8]; 5]; 4] {
        // Written out: an array `map` here is a call of its own on the hot
        // path (callgrind).
        let [prefix, open, sku, close] = self.stock_key_parts(sku);
        [
            [prefix, open, sku, close, HOLDS],
            [prefix, open, sku, close, HELD],
            [prefix, open, sku, close, MARKER],
            [prefix, open, sku, close, JOURNAL],
        ]
    }

    /// `<prefix>:{<sku>}`
    pub fn stock_key(&self, sku: &Sku) -> Vec<u8> {
        self.stock_key_parts(sku).concat()
    }

    /// The keys of one request.
    pub fn request_keys(&self, sku: &Sku, request_id: &RequestId) -> RequestKeys {
        self.keys_with_record(sku, self.record_key_parts(sku, request_id).concat())
    }

    fn keys_with_record(&self, sku: &Sku, record: Vec<u8>) -> RequestKeys {
        let SkuKeys {
            stock,
            holds,
            held,
            marker,
            journal,
        } = self.sku_keys(sku);
        RequestKeys {
            stock,
            record,
            holds,
            held,
            marker,
            journal,
        }
    }

    /// The keys of a SKU itself: its stock and its holds.
    pub fn sku_keys(&self, sku: &Sku) -> SkuKeys {
        let [holds, held, marker, journal] = self.side_key_parts(sku);
        SkuKeys {
            stock: self.stock_key(sku),
            holds: holds.concat(),
            held: held.concat(),
            marker: marker.concat(),
            journal: journal.concat(),
        }
    }

    /// The number of the sweep index's shard that indexes `sku`.
    pub fn sweep_shard_index(&self, sku: &Sku) -> usize {
        (sku_slot(sku) / SWEEP_SHARD_SLOTS) as usize
    }

    /// The number of the shard that indexes an order in flight: by the
    /// slot of its intent record, as a SKU is by its own.
    pub fn order_shard_index(&self, request_id: &RequestId) -> usize {
        (slot(&self.order_key(request_id)) / SWEEP_SHARD_SLOTS) as usize
    }

    /// Every shard of the sweep index.
    pub fn sweep_shards(&self) -> &[SweepShard] {
        &self.shards
    }

    /// `<prefix>:{<sku>}:journal`: the SKU's journal, a stream of every
    /// change of its stock or records ([`crate::journal`]), in the SKU's
    /// slot so that the script that makes a change appends its entry.
    pub fn journal_key(&self, sku: &Sku) -> Vec<u8> {
        let [prefix, open, sku, close] = self.stock_key_parts(sku);
        [prefix, open, sku, close, JOURNAL].concat()
    }

    /// `<prefix>:{<sku>}:loc`: the units of a SKU kept by location, a
    /// hash of [`LocationField`]s, in the SKU's slot so that one script
    /// allocates over all its locations.
    pub fn locations_key_parts<'a>(&'a self, sku: &'a Sku) -> [&'a [u8]; 5] {
        let [prefix, open, sku, close] = self.stock_key_parts(sku);
        [prefix, open, sku, close, LOCATIONS]
    }

    /// [`KeyLayout::locations_key_parts`], as one key.
    pub fn locations_key(&self, sku: &Sku) -> Vec<u8> {
        let [prefix, open, sku, close] = self.stock_key_parts(sku);
        [prefix, open, sku, close, LOCATIONS].concat()
    }

    /// `<prefix>:{<sku>}:journal:sunk`: the last journal id a sink with
    /// `--wait-replicas` read of the SKU, a small write in its slot that
    /// the sink's WAIT then confirms ([`crate::journal::stream::replicated`]);
    /// it expires a minute after its last write.
    pub fn journal_sunk_key(&self, sku: &Sku) -> Vec<u8> {
        [self.journal_key(sku).as_slice(), b":sunk"].concat()
    }

    /// `<prefix>:{sweep}:lease`: who sweeps now.
    pub fn sweep_lease(&self) -> Vec<u8> {
        format!("{}:{{sweep}}:lease", self.prefix).into_bytes()
    }

    /// `<prefix>:{sweep}:active`: the shards with holds to watch.
    pub fn sweep_active(&self) -> Vec<u8> {
        format!("{}:{{sweep}}:active", self.prefix).into_bytes()
    }

    /// `<prefix>:{order:<request_id>}:intent`: one order's intent record
    /// (`lua/order.lua`), under its own hash tag. No SKU's keys end in
    /// `:intent`, so it can't be mistaken for one, even of a sku named
    /// `order:<request_id>`.
    pub fn order_key(&self, request_id: &RequestId) -> Vec<u8> {
        [
            self.prefix.as_bytes(),
            b":{order:",
            request_id.as_bytes(),
            b"}:intent",
        ]
        .concat()
    }

    /// The request_id of an order's line on each of its SKUs: the order's
    /// request_id behind the reserved prefix [`ORDER_LINE_PREFIX`], which
    /// the single-line commands refuse, so a caller's own DEDUCT or HOLD
    /// can never name (or REVERT) an order's line. `None` when the
    /// order's request_id is too long to carry the prefix.
    pub fn order_line_id(request_id: &RequestId) -> Option<RequestId> {
        let id = [ORDER_LINE_PREFIX.as_bytes(), request_id.as_bytes()].concat();
        RequestId::parse(id.into()).ok()
    }

    /// The keys of one operator's change: a request's, with its op record
    /// in the record's place.
    pub fn op_keys(&self, sku: &Sku, op_id: &OpId) -> RequestKeys {
        let record = [&self.stock_key(sku)[..], b":op:", op_id.as_bytes()].concat();
        self.keys_with_record(sku, record)
    }

    /// `<prefix>:{<sku>}:chg:<change_id>`: the record of a change of a hold
    /// (HOLD.EXTEND, HOLD.SHRINK), which `lua/change_hold.lua` takes after
    /// the hold's request's six keys; as its parts.
    pub fn change_key_parts<'a>(&'a self, sku: &'a Sku, change_id: &'a ChangeId) -> [&'a [u8]; 6] {
        let [prefix, open, sku, close] = self.stock_key_parts(sku);
        [prefix, open, sku, close, b":chg:", change_id.as_bytes()]
    }

    /// Checks, with CRC16, that the two key shapes map to one slot. It holds
    /// by construction; this catches a future change to the layout that
    /// breaks it, at startup rather than as CROSSSLOT errors in production.
    fn verify_one_slot(&self) -> Result<(), String> {
        for (sku, id) in [
            ("probe", "probe-request"),
            ("SKU:10086", "order-20261129-001"),
        ] {
            let sku = Sku::parse(sku.into()).expect("probe sku is valid");
            let id = RequestId::parse(id.into()).expect("probe request_id is valid");
            let keys = self.request_keys(&sku, &id);
            if keys.all().iter().any(|key| slot(key) != slot(&keys.stock)) {
                return Err(format!(
                    "key layout error: {:?} and {:?} hash to different slots",
                    String::from_utf8_lossy(&keys.stock),
                    String::from_utf8_lossy(&keys.record)
                ));
            }
        }
        Ok(())
    }
}

/// A hash tag for sweep shard `k` that hashes into the shard's slot range:
/// `sweep-<k>-<n>` for the first `n` that does. The same on every
/// stockgate, since it depends on nothing but `k`.
fn shard_tag(k: usize) -> String {
    let range = k as u16 * SWEEP_SHARD_SLOTS..(k as u16 + 1) * SWEEP_SHARD_SLOTS;
    (0u32..)
        .map(|n| format!("sweep-{k}-{n}"))
        .find(|tag| range.contains(&slot(tag.as_bytes())))
        .expect("CRC16 reaches every range")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_matches_the_documented_shape() {
        let layout = KeyLayout::new("stock").unwrap();
        let keys = layout.request_keys(
            &Sku::parse("10086".into()).unwrap(),
            &RequestId::parse("order-1".into()).unwrap(),
        );
        assert_eq!(keys.stock, b"stock:{10086}");
        assert_eq!(keys.record, b"stock:{10086}:req:order-1");
        let sku = layout.sku_keys(&Sku::parse("10086".into()).unwrap());
        assert_eq!(sku.holds, b"stock:{10086}:holds");
        assert_eq!(sku.held, b"stock:{10086}:held");
        assert_eq!(
            layout.locations_key(&Sku::parse("10086".into()).unwrap()),
            b"stock:{10086}:loc"
        );
        assert_eq!(layout.sweep_lease(), b"stock:{sweep}:lease");
        let order = RequestId::parse("cart-7".into()).unwrap();
        assert_eq!(layout.order_key(&order), b"stock:{order:cart-7}:intent");
        assert_eq!(
            KeyLayout::order_line_id(&order).unwrap().as_bytes(),
            b"~ord:cart-7"
        );
        let longest = RequestId::parse("x".repeat(123).into()).unwrap();
        assert!(KeyLayout::order_line_id(&longest).is_some());
        let too_long = RequestId::parse("x".repeat(124).into()).unwrap();
        assert!(KeyLayout::order_line_id(&too_long).is_none());
    }

    #[test]
    fn a_locations_field_says_which_it_is() {
        assert_eq!(
            LocationField::parse("w1"),
            Some(LocationField::Available("w1"))
        );
        assert_eq!(
            LocationField::parse("w1:held"),
            Some(LocationField::Held("w1"))
        );
        assert_eq!(
            LocationField::parse("w1:floor"),
            Some(LocationField::Floor("w1"))
        );
        for other in ["w1:other", "w1:held:x", ":held", "", "w1:"] {
            assert_eq!(LocationField::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn each_sweep_shard_lives_in_the_slots_it_indexes() {
        let layout = KeyLayout::new("stock").unwrap();
        assert_eq!(layout.sweep_shards().len(), SWEEP_SHARDS);
        for (k, shard) in layout.sweep_shards().iter().enumerate() {
            let first = k as u16 * SWEEP_SHARD_SLOTS;
            assert!((first..first + SWEEP_SHARD_SLOTS).contains(&slot(&shard.due)));
            assert_eq!(slot(&shard.due), slot(&shard.marks));
        }
        let sku = Sku::parse("10086".into()).unwrap();
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
        assert_eq!(
            slot(&shard.due) / SWEEP_SHARD_SLOTS,
            sku_slot(&sku) / SWEEP_SHARD_SLOTS
        );
    }

    #[test]
    fn slot_agrees_with_the_cluster_spec_examples() {
        // From the Redis Cluster specification: "{user1000}.following" and
        // "{user1000}.followers" share the slot of "user1000".
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // `redis-cli cluster keyslot foo` answers 12182.
        assert_eq!(slot(b"foo"), 12182);
        // An empty tag "{}" is not a tag: the whole key is hashed.
        assert_eq!(slot(b"{}x"), crc_whole(b"{}x"));
    }

    fn crc_whole(key: &[u8]) -> u16 {
        // CRC16-XMODEM, bit by bit, as in the cluster spec's reference code.
        let mut crc: u16 = 0;
        for &byte in key {
            crc ^= (byte as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc % SLOTS
    }

    #[test]
    fn bad_prefixes_are_refused() {
        for bad in ["", "a b", "st{ock", "st}ock", &"p".repeat(65)] {
            assert!(KeyLayout::new(bad).is_err(), "{bad:?}");
        }
    }

    fn token() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[!-z|~]{1,128}").unwrap()
    }

    proptest! {
        #[test]
        fn both_keys_share_a_slot(prefix in "[!-z|~]{1,64}", sku in token(), id in token()) {
            let layout = KeyLayout::new(&prefix).unwrap();
            let parsed = Sku::parse(sku.clone().into()).unwrap();
            let keys = layout.request_keys(&parsed, &RequestId::parse(id.clone().into()).unwrap());
            for key in keys.all() {
                prop_assert_eq!(slot(key), slot(&keys.stock));
            }
            // And the slot is the sku's own: the tag is exactly the sku.
            prop_assert_eq!(slot(&keys.stock), crc_whole(sku.as_bytes()));
            prop_assert_eq!(sku_slot(&parsed), slot(&keys.stock));
            prop_assert_eq!(layout.stock_key_parts(&parsed).concat(), keys.stock.clone());
            prop_assert_eq!(slot(&layout.locations_key(&parsed)), slot(&keys.stock));
            // An operator's change record too.
            let op = layout.op_keys(&parsed, &OpId::parse(id.clone().into()).unwrap());
            prop_assert_eq!(slot(&op.stock), slot(&op.record));
            prop_assert_eq!(&op.record[op.stock.len()..op.stock.len() + 4], b":op:");
        }
    }
}
