//! Faults under load: stockgate's promises checked while Redis fails, in
//! the manner of Jepsen and Redis's own cluster tests.
//!
//! Each test starts a 3-primary, 3-replica cluster with a short
//! `cluster-node-timeout`, puts stockgate in front of it, drives load with
//! the invariant checker ([`checker`]), injects one fault, lets it heal, and
//! audits the history against what Redis holds at the end. Each prints one
//! summary line per load, plus what it measured (recovery time, added
//! latency, acknowledged writes lost).
//!
//! ```sh
//! cargo test --test faults -- --nocapture     # what CI runs, about 10 minutes on 2 cores
//! STOCKGATE_LONG_FAULTS=1 cargo test --test faults -- --nocapture
//!                                              # longer phases, more slots moved, more rounds
//! STOCKGATE_FAULT_WAIT=1 cargo test --test faults
//!                                              # every fault with --wait-replicas 1
//! STOCKGATE_FAULT_SEED=123 cargo test --test faults
//!                                              # replay one load's random choices
//! cargo test --test faults valkey             # the Valkey half of the upstream matrix
//! ```
//!
//! The upstream matrix: the checker's own test ([`baseline`]), the failover
//! faults ([`failover`]), the resharding faults ([`reshard`]), the
//! function library's ([`functions`]) and those of SKUs kept by location
//! ([`locations`]) run against Redis 7.0, Redis 8.2, Valkey 8.0 and
//! Valkey 9.1, as `<test>::redis7`, `::redis8`, `::valkey8` and
//! `::valkey9` (`support::matrix!`); the other faults run against Redis
//! 7.0 only. CI runs every cell.
//!
//! | module | faults |
//! |---|---|
//! | [`baseline`] | none: the checker itself, green on a quiet load, and catching planted violations |
//! | [`failover`] | 1: a primary killed; 2: `CLUSTER FAILOVER`; 4: `SCRIPT FLUSH`, a promoted replica without the script (`--scripts eval`); a primary killed mid-sweep of expired holds |
//! | [`functions`] | 4, with FCALL: `FUNCTION FLUSH` under load; a new primary, without the library, taking busy slots |
//! | [`reshard`] | 3: live slot migration of busy skus (ASK, TRYAGAIN, MOVED); one line's slot migrating under a load of orders |
//! | [`network`] | 5: a node behind a faulty relay (latency, black hole, lost replies); 6: the whole upstream down and back |
//! | [`limits`] | 7: out of memory; 8: BUSY |
//! | [`clients`] | 9: clients leaving mid-request, 1,000-client churn (stockgate as a process) |
//! | [`durability`] | acknowledged deductions lost in a failover, with and without `--wait-replicas` |
//! | [`books`] | not a fault: the database as the third book (PostgreSQL, or MariaDB in the Valkey 8.0 cells), a sink killed and the database restarted mid-load, carried by the baseline, the killed primary and live resharding |
//! | [`linear`] | not a fault: the linearizability lane that the killed primary, the manual failover and live resharding carry |
//! | [`locations`] | 1 and 3 on SKUs kept by location: a primary killed mid-allocation; the SKU's own slot moving under its allocations, and back with an expired hold's record left behind (per-location books, and the journal's format 2 entries) |
//! | [`stuck`] | a node's open connections stuck for good (a black-holed flow) while new ones work: standalone and in a cluster |
//!
//! Linearizability (issue 23): beside its own load, each of
//! `failover::killed_primary_replica_promoted_stockgate_recovers`,
//! `failover::manual_failover_old_primary_redirects_and_nothing_is_lost`
//! and `reshard::live_resharding_of_busy_slots`, on Redis and Valkey,
//! records 8 clients' DEDUCT, retried DEDUCT, REVERT, HOLD, CONFIRM and
//! STOCK.GET on 4 skus of the faulted shard (or slots) through two
//! stockgates of their own, across the fault, and porcupine checks the
//! history against the contract's sequential model once the fault healed
//! ([`linear`]), then shows that one impossible answer after the fault is
//! caught. The failover and the resharding lose nothing, so their whole
//! history is checked. The kill runs with `--wait-replicas 1` (without it
//! an acknowledged write may be lost, and no history is linearizable),
//! and leaves out only what WAIT does not cover: the reads, 2s and 3s on
//! the victim's skus sent before the kill, which the old primary may have
//! answered from a write it then lost (a dirty read).
//!
//! The books (issue 26): every stockgate here journals (`--journal`), and
//! the audit replays each SKU's journal from its initial stock to what
//! Redis holds. The baseline, the killed primary and live resharding, on
//! all four servers, also run a `stockgate journal sink --wait-replicas 1`
//! into a throwaway database through the load (MariaDB 10.11 in each
//! test's Valkey 8.0 cell, PostgreSQL 15 in the others), kill it (SIGKILL)
//! and start another, restart the database, then drain it, and the audit reads
//! each SKU's account from the database (what Redis journaled after the
//! drain appended) instead: exact, with no conflicts ([`books`]). The
//! baseline plants an entry lost from the database and a conflict, and
//! both are found.
//!
//! The tests run one at a time ([`harness::SERIAL`]): they measure times on
//! a 2-core machine. Nothing but 127.0.0.1 is reached; every process a test
//! starts, it stops (Redis servers and the stockgate process die with their
//! test thread).

#[path = "../support/mod.rs"]
mod support;

mod books;
mod checker;
mod harness;
mod linear;
mod relay;

mod baseline;
mod clients;
mod durability;
mod failover;
mod functions;
mod limits;
mod locations;
mod network;
mod reshard;
mod stuck;
