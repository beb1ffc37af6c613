//! A fresh nonce for every script call, written into the record it writes.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh nonce for every script call, written into the record it
/// writes: when a call is sent again (its connection was lost after the
/// write, and the node pipe or the redis crate resends it), the script
/// finds its own nonce and answers what it answered the first time,
/// instead of "duplicate" to the request's first attempt.
///
/// Unique within the process (a counter through a bijective mix), and
/// across sidecars by a random 64-bit salt: two calls of one request_id
/// from two sidecars collide with probability 2^-64.
pub(super) struct Nonces {
    salt: u64,
    next: AtomicU64,
}

impl Nonces {
    pub(super) fn new() -> Nonces {
        Nonces {
            salt: RandomState::new().hash_one(std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    /// 16 hex digits.
    pub(super) fn next(&self) -> [u8; 16] {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // splitmix64's finaliser: a bijection, so distinct counters give
        // distinct nonces, and nearby ones look unrelated.
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let value = z ^ self.salt;
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            let nibble = (value >> (60 - 4 * i)) & 0xf;
            *byte = b"0123456789abcdef"[nibble as usize];
        }
        out
    }
}
