//! Failed logins from one peer, answered later and later: the first
//! [`FREE_FAILURES`] in a row are answered at once, each one after them
//! waits [`FIRST_DELAY`], doubled at every further failure, at most
//! [`MAX_DELAY`]. A success from the peer, or [`FORGET_AFTER`] without a
//! failure, starts it over.
//!
//! Only the failure waits, on its own connection (or HTTP request): a
//! right password from the same address is answered at once, so an
//! attacker sharing a sidecar's loopback address with the application
//! does not slow the application's logins. That also means a guesser with
//! many connections guesses on each in parallel; `--max-clients` bounds
//! how many.
//!
//! The peer is its IP address; the sidecar's own clock measures the
//! pauses, which expire nothing in Redis.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures in a row answered at once.
pub const FREE_FAILURES: u32 = 4;
/// The wait of the first failure after the free ones.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest wait.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// A peer without a failure this long starts over.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Peers remembered at most; past it the ones quiet longest are forgotten
/// first, so a scan from many addresses cannot grow the table without end.
const MAX_PEERS: usize = 10_000;

/// How long the `failures`-th failure in a row waits.
pub fn delay_after(failures: u32) -> Duration {
    if failures <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES - 1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

struct Failures {
    count: u32,
    last: Instant,
}

/// The failed logins of each peer.
#[derive(Default)]
pub struct Throttle {
    peers: Mutex<HashMap<IpAddr, Failures>>,
}

impl Throttle {
    /// Counts a failed login from `peer`: how long its answer waits.
    pub fn failed(&self, peer: IpAddr) -> Duration {
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if peers.len() >= MAX_PEERS {
                let oldest = peers.iter().min_by_key(|(_, f)| f.last).map(|(ip, _)| *ip);
                if let Some(ip) = oldest {
                    peers.remove(&ip);
                }
            }
        }
        let entry = peers.entry(peer).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now.duration_since(entry.last) >= FORGET_AFTER {
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        delay_after(entry.count)
    }

    /// A login from `peer` succeeded: its count starts over.
    pub fn succeeded(&self, peer: IpAddr) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_fifth_failure_up_to_its_cap() {
        let waits: Vec<u64> = (1..=12)
            .map(|n| delay_after(n).as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [0, 0, 0, 0, 100, 200, 400, 800, 1600, 3200, 5000, 5000]
        );
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn a_success_starts_the_peer_over_and_peers_are_apart() {
        let throttle = Throttle::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.failed(a), Duration::ZERO);
        }
        assert_eq!(throttle.failed(a), FIRST_DELAY);
        assert_eq!(throttle.failed(b), Duration::ZERO, "another peer");
        throttle.succeeded(a);
        assert_eq!(throttle.failed(a), Duration::ZERO);
    }
}
