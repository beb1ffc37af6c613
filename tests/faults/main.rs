//! Faults under load: stockgate's promises checked while Redis fails, in
//! the manner of Jepsen and Redis's own cluster tests.
//!
//! Each test starts a 3-primary, 3-replica cluster with a short
//! `cluster-node-timeout`, puts stockgate in front of it, drives load with
//! the invariant checker ([`checker`]), injects one fault, lets it heal, and
//! audits the history against what Redis holds at the end. Each prints one
//! summary line, plus what it measured (recovery time, added latency).
//!
//! ```sh
//! cargo test --test faults -- --nocapture          # the CI variants, about 2 minutes
//! STOCKGATE_LONG_FAULTS=1 cargo test --test faults -- --nocapture
//!                                                   # longer load and more rounds
//! STOCKGATE_FAULT_SEED=123 cargo test --test faults # replay one load's random choices
//! ```
//!
//! The tests run one at a time ([`harness::SERIAL`]): they measure times on
//! a 2-core machine. Nothing but 127.0.0.1 is reached; every process a test
//! starts, it stops (Redis servers die with their test thread).

#[path = "../support/mod.rs"]
mod support;

mod checker;
mod harness;
mod relay;

mod clients;
mod durability;
mod failover;
mod limits;
mod network;
mod reshard;
