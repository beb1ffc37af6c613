//! The key layout: the one place that knows how stockgate's keys look.
//!
//! ```text
//! stock key           <prefix>:{<sku>}
//! idempotency record  <prefix>:{<sku>}:req:<request_id>
//! operator's change   <prefix>:{<sku>}:op:<op_id>        (STOCK.SET, STOCK.ADD)
//! ```
//!
//! The sku is the Redis Cluster hash tag of both keys, so the two always
//! hash to one slot and one script can touch both. Skus and prefixes may not
//! contain braces (see [`crate::params`]), so the tag is exactly the sku.

use crate::params::{OpId, RequestId, Sku};

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

/// The two keys one deduction touches, in the order the script takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeductKeys {
    pub stock: Vec<u8>,
    pub record: Vec<u8>,
}

/// How keys are named under one `--key-prefix`.
#[derive(Debug, Clone)]
pub struct KeyLayout {
    prefix: String,
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
        let layout = KeyLayout {
            prefix: prefix.to_owned(),
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

    /// `<prefix>:{<sku>}`
    pub fn stock_key(&self, sku: &Sku) -> Vec<u8> {
        self.stock_key_parts(sku).concat()
    }

    /// Both keys of one deduction.
    pub fn deduct_keys(&self, sku: &Sku, request_id: &RequestId) -> DeductKeys {
        DeductKeys {
            stock: self.stock_key(sku),
            record: self.record_key_parts(sku, request_id).concat(),
        }
    }

    /// The stock key and the record of one operator's change.
    pub fn op_keys(&self, sku: &Sku, op_id: &OpId) -> DeductKeys {
        let stock = self.stock_key(sku);
        let record = [&stock[..], b":op:", op_id.as_bytes()].concat();
        DeductKeys { stock, record }
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
            let keys = self.deduct_keys(&sku, &id);
            if slot(&keys.stock) != slot(&keys.record) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_matches_the_documented_shape() {
        let layout = KeyLayout::new("stock").unwrap();
        let keys = layout.deduct_keys(
            &Sku::parse("10086".into()).unwrap(),
            &RequestId::parse("order-1".into()).unwrap(),
        );
        assert_eq!(keys.stock, b"stock:{10086}");
        assert_eq!(keys.record, b"stock:{10086}:req:order-1");
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
            let keys = layout.deduct_keys(&parsed, &RequestId::parse(id.clone().into()).unwrap());
            prop_assert_eq!(slot(&keys.stock), slot(&keys.record));
            // And the slot is the sku's own: the tag is exactly the sku.
            prop_assert_eq!(slot(&keys.stock), crc_whole(sku.as_bytes()));
            prop_assert_eq!(sku_slot(&parsed), slot(&keys.stock));
            prop_assert_eq!(layout.stock_key_parts(&parsed).concat(), keys.stock.clone());
            // An operator's change record too.
            let op = layout.op_keys(&parsed, &OpId::parse(id.clone().into()).unwrap());
            prop_assert_eq!(slot(&op.stock), slot(&op.record));
            prop_assert_eq!(&op.record[op.stock.len()..op.stock.len() + 4], b":op:");
        }
    }
}
