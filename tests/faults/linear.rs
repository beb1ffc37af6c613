//! A recorded linearizability lane beside a fault's own load (issue 23,
//! part 3): a few clients send DEDUCT, retried DEDUCT, REVERT, HOLD,
//! CONFIRM and STOCK.GET on skus of their own (`lin-<test>-<i>`, which no
//! audit's `<test>-*` pattern matches), through two stockgates of
//! their own, across the whole fault, and porcupine checks the history
//! (`support::history`, `tests/linearizability/`) once the fault healed.
//!
//! The lane is a second load in a test that already runs, rather than a
//! test of its own: a fault costs a cluster, a failure detector's seconds
//! and a recovery, and the lane shares them for about the price of its
//! check. Its skus are its own, so neither load's audit reads the other's
//! requests.
//!
//! Small on purpose: porcupine's search grows with the requests whose
//! outcome is unknown (each may have taken effect at any point after its
//! call, or never), and a fault makes many of them. Eight clients, each
//! pausing 25 ms between requests, make histories of 300 to 1,100
//! requests (up to 90 of them unknown under a kill) that it checks in
//! under a second.

use crate::harness::stockgate_with;
use crate::support::history::{self, History, Load, Recording};
use std::time::{Duration, Instant};
use stockgate::config::Durability;
use stockgate::dev::LocalCluster;
use stockgate::server::Server;

/// The lane's stock per sku: low enough that DEDUCTs and HOLDs meet a
/// shortage (a 2 checks the stock it reports), high enough that most
/// succeed.
const INITIAL_STOCK: i64 = 60;

/// A running lane.
pub struct Lane {
    name: String,
    skus: Vec<String>,
    servers: Vec<Server>,
    recording: Recording,
}

/// Seeds `skus` and starts the lane on them through two new stockgates
/// (`--timeout` as the fault's own, `--wait-replicas` as `durability`).
pub async fn start(
    cluster: &LocalCluster,
    name: &str,
    skus: Vec<String>,
    seed: u64,
    durability: Option<Durability>,
) -> Lane {
    crate::harness::seed(cluster, &skus, INITIAL_STOCK);
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(stockgate_with(cluster.seeds(), crate::harness::TIMEOUT, durability).await);
    }
    let load = Load {
        skus: skus.clone(),
        initial_stock: INITIAL_STOCK,
        clients: 8,
        // A bound, not the length: the test stops the lane once the fault
        // healed, long before a client could send this many.
        ops_per_client: 1500,
        pause: Duration::from_millis(25),
        seed,
    };
    let addrs: Vec<_> = servers.iter().map(|s| s.addr).collect();
    eprintln!(
        "[{name}] linearizability lane: {} clients over {} skus through two stockgates{}, seed {seed}",
        load.clients,
        skus.len(),
        if durability.is_some() {
            " with --wait-replicas 1"
        } else {
            ""
        }
    );
    Lane {
        name: name.to_owned(),
        skus,
        servers,
        recording: history::start(&addrs, &load),
    }
}

/// A lane's history, once stopped.
pub struct Recorded {
    pub name: String,
    pub skus: Vec<String>,
    pub history: History,
}

impl Lane {
    /// Once the fault healed (at `healed`): waits until the lane has 50
    /// answers to requests sent since, so that its history goes on past
    /// the fault (the bound is for a lane that never answers again).
    pub async fn run_past(&self, healed: Instant) {
        let (waiting, bound) = (Instant::now(), Instant::now() + Duration::from_secs(30));
        while self.recording.answered_after(healed) < 50 {
            assert!(
                Instant::now() < bound,
                "[{}] the lane got {} answers in 30 s after the fault healed",
                self.name,
                self.recording.answered_after(healed)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!(
            "[{}] the lane ran on {} for 50 answers to requests sent after the fault healed",
            self.name,
            crate::harness::ms(waiting.elapsed())
        );
    }

    /// Stops the clients (those in flight end first) and the lane's
    /// stockgates.
    pub async fn stop(self) -> Recorded {
        let stopping = Instant::now();
        let history = self.recording.stop().await;
        for server in self.servers {
            server.stop_now();
        }
        eprintln!(
            "[{}] the lane stopped in {}",
            self.name,
            crate::harness::ms(stopping.elapsed())
        );
        Recorded {
            name: self.name,
            skus: self.skus,
            history,
        }
    }
}

impl Recorded {
    /// The lane's requests (on `sku`, or on any) in flight at some point
    /// between `from` and `to`: how many met the fault itself.
    pub fn overlapping(&self, from: Instant, to: Instant, sku: Option<&str>) -> usize {
        let (from, to) = (self.history.at(from), self.history.at(to));
        self.history
            .ops
            .iter()
            .filter(|o| sku.is_none_or(|s| o.sku == s))
            .filter(|o| o.call_ns <= to && (o.ret_ns >= from || o.answer.is_none()))
            .count()
    }

    /// Checks `history` (this lane's, or a copy with what the fault's
    /// server never promised left out: `left_out` requests, `why`), after
    /// asserting the lane spans the fault: answers before `fault` and
    /// after `healed`, so the check covers both sides of it.
    pub fn assert_linearizable(
        &self,
        history: &History,
        fault: Instant,
        healed: Instant,
        left_out: (usize, &str),
    ) {
        let (fault_ns, healed_ns) = (history.at(fault), history.at(healed));
        let answered = |o: &&history::Op| o.answer.is_some();
        let before = history
            .ops
            .iter()
            .filter(answered)
            .filter(|o| o.ret_ns < fault_ns)
            .count();
        let after = history
            .ops
            .iter()
            .filter(answered)
            .filter(|o| o.call_ns > healed_ns)
            .count();
        let name = &self.name;
        assert!(
            before > 0 && after > 0,
            "[{name}] the lane must span the fault: {before} answers before it, {after} after it healed"
        );
        let checking = Instant::now();
        history.assert_linearizable(&format!("{name}-lin"));
        let took = checking.elapsed();
        // Not a rubber stamp, even with the fault's unknown outcomes
        // around: one answer after the fault made impossible is caught.
        let flipped = history
            .with_a_first_request_answered_duplicate(healed_ns)
            .unwrap_or_else(|| {
                panic!("[{name}] no DEDUCT or HOLD of a new request_id answered after the fault")
            });
        assert!(
            matches!(
                flipped.check(&format!("{name}-lin-flipped")),
                history::Verdict::Illegal(_)
            ),
            "[{name}] a new request_id answered as a duplicate after the fault must make the history illegal"
        );
        // The errors behind the unknown outcomes, by their first words.
        let errors = history.ops.iter().filter_map(|o| o.error.as_deref()).fold(
            std::collections::BTreeMap::<String, usize>::new(),
            |mut m, e| {
                let words: Vec<&str> = e.split_whitespace().take(4).collect();
                *m.entry(words.join(" ")).or_default() += 1;
                m
            },
        );
        eprintln!(
            "[{name}] linearizable: {} requests on {} skus, {} with an unknown outcome {errors:?}, {} answered before the fault and {} called after it healed{}; answers {:?}; checked in {}",
            history.ops.len(),
            self.skus.len(),
            history.unknown(),
            before,
            after,
            match left_out {
                (0, _) => String::new(),
                (n, why) => format!("; {n} left out ({why})"),
            },
            history.answers(),
            crate::harness::ms(took),
        );
    }
}
