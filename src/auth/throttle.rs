//! Failed logins, answered later and later: per peer and per user name
//! guessed at, the first [`FREE_FAILURES`] failures in a row are answered
//! at once, each one after them waits [`FIRST_DELAY`], doubled at every
//! further failure, at most [`MAX_DELAY`].
//!
//! A success starts over the count of the user who logged in, from that
//! peer, and no other: on a sidecar every local client shares 127.0.0.1,
//! so the application's own logins (as any user) must not reset what a
//! guesser at another user's password has built up. Names that are no
//! user share one count per peer. [`FORGET_AFTER`] without a failure also
//! starts a count over.
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failures in a row answered at once.
pub const FREE_FAILURES: u32 = 4;
/// The wait of the first failure after the free ones.
pub const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest wait.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// A count without a failure this long starts over.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Counts (a peer and a name) remembered at most; past it the ones quiet
/// longest are forgotten first, so a scan from many addresses, or guesses
/// at many names, cannot grow the table without end.
const MAX_COUNTS: usize = 10_000;

/// How long the `failures`-th failure in a row waits.
pub fn delay_after(failures: u32) -> Duration {
    if failures <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES - 1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

/// Whose failures a count holds: a peer's guesses at one user, or (`None`)
/// at names that are no user.
type Guessed = (IpAddr, Option<Arc<str>>);

struct Failures {
    count: u32,
    last: Instant,
}

/// The failed logins, by peer and user.
#[derive(Default)]
pub struct Throttle {
    counts: Mutex<HashMap<Guessed, Failures>>,
}

impl Throttle {
    /// Counts a failed login from `peer` as `user` (`None`: a name that is
    /// no user): how long its answer waits.
    pub fn failed(&self, peer: IpAddr, user: Option<Arc<str>>) -> Duration {
        let now = Instant::now();
        let key = (peer, user);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= MAX_COUNTS && !counts.contains_key(&key) {
            counts.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if counts.len() >= MAX_COUNTS {
                let oldest = counts
                    .iter()
                    .min_by_key(|(_, f)| f.last)
                    .map(|(key, _)| key.clone());
                if let Some(key) = oldest {
                    counts.remove(&key);
                }
            }
        }
        let entry = counts.entry(key).or_insert(Failures {
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

    /// `user` logged in from `peer`: that count starts over, no other.
    pub fn succeeded(&self, peer: IpAddr, user: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.remove(&(peer, Some(Arc::from(user))));
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
    fn a_success_starts_over_only_its_own_users_count() {
        let throttle = Throttle::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let ops: Arc<str> = "ops".into();
        let dash: Arc<str> = "dash".into();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.failed(a, Some(ops.clone())), Duration::ZERO);
        }
        assert_eq!(throttle.failed(a, Some(ops.clone())), FIRST_DELAY);
        assert_eq!(
            throttle.failed(b, Some(ops.clone())),
            Duration::ZERO,
            "another peer"
        );
        assert_eq!(
            throttle.failed(a, None),
            Duration::ZERO,
            "names that are no user"
        );
        assert_eq!(
            throttle.failed(a, Some(dash.clone())),
            Duration::ZERO,
            "another user"
        );
        // Another user's success, from the same peer, changes nothing.
        throttle.succeeded(a, "dash");
        assert_eq!(throttle.failed(a, Some(ops.clone())), FIRST_DELAY * 2);
        // The guessed user's own success starts it over.
        throttle.succeeded(a, "ops");
        assert_eq!(throttle.failed(a, Some(ops.clone())), Duration::ZERO);
    }

    #[test]
    fn names_that_are_no_user_share_one_count_per_peer() {
        let throttle = Throttle::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.failed(a, None), Duration::ZERO);
        }
        assert_eq!(throttle.failed(a, None), FIRST_DELAY);
    }

    #[test]
    fn the_table_stays_bounded() {
        let throttle = Throttle::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        for n in 0..MAX_COUNTS + 100 {
            throttle.failed(a, Some(format!("user{n}").into()));
        }
        assert!(throttle.counts.lock().unwrap().len() <= MAX_COUNTS);
    }
}
