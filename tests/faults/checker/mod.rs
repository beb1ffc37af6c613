//! The invariant checker: drives load through stockgate while a fault is
//! injected, records every request and every reply, then audits the
//! history against what Redis holds at the end (read directly, not through
//! stockgate), in the manner of a Jepsen checker.
//!
//! # The load
//!
//! `clients` tasks, each with its own connection to stockgate and a
//! response timeout well above stockgate's `--timeout`, work through
//! *chains* until stopped. A chain is one request_id on a random sku:
//!
//! - usually DEDUCT (random qty 1..=5), sometimes re-sent once more as a
//!   duplicate, sometimes then REVERTed (itself sometimes re-sent), and
//!   sometimes a late DEDUCT of the same id after its REVERT (the "hanging"
//!   hazard, which must get code 4);
//! - sometimes a REVERT of an id never deducted (empty rollback: code 4),
//!   then a late DEDUCT of it (code 4);
//! - with [`Workload::hold_pct`], sometimes a HOLD instead (random qty; a
//!   long ttl, or a short one of 1–3 s so that some run out during the
//!   load), sometimes re-sent as a duplicate, then a CONFIRM (sometimes
//!   REVERTed after it: a refund), a REVERT (a cancel), or nothing (it
//!   expires). After a short hold the next step waits until half a second
//!   either side of its expiry, so CONFIRMs and REVERTs race it: a CONFIRM
//!   may answer 0 or 5, a REVERT 0 or 1.
//! - with [`Workload::order_pct`], sometimes an order of 2–4 lines over
//!   distinct skus (so different slots): an ORDER (sometimes re-sent: 1;
//!   sometimes ORDER.REVERTed after: 0, re-sent: 1, then perhaps a late
//!   ORDER: 4), an ORDER.REVERT of an order never seen (4) then perhaps
//!   its late ORDER (4), or an ORDER.HOLD (mostly 1–3 s) then its
//!   ORDER.CONFIRM around the expiry (0 or 5) or nothing (it expires).
//!
//! Every step retries on an error with the **same** request_id and a
//! bounded backoff, as the README tells callers to, until it gets a
//! business code. After [`load::Load::stop`], steps still retrying get
//! [`Workload::settle_within`] more to settle.
//!
//! But with [`Workload::unretried_pct`], some order chains have a caller
//! that never retries: when one of their ORDER, ORDER.HOLD, ORDER.CONFIRM
//! or ORDER.REVERT attempts ends in an error (an `UPSTREAM` or `BADREPLY`
//! reply, a client timeout), the chain stops there. It never sends that
//! order again, nor any step after it, and the order is *left after an
//! error* ([`Left`]): stockgate alone must end it.
//!
//! Stock is seeded far above what the load can take and every parameter
//! is valid, so codes 2 (insufficient) and 3 (invalid) can only mean a fault
//! leaked through as a business answer.
//!
//! # The audit
//!
//! - **Conservation**: per sku, initial − final = Σ qty of the records in
//!   state DEDUCTED, CONFIRMED and HELD (REVERTED, REVOKED and EXPIRED
//!   count zero); the sku's `:held` counter is Σ qty of its HELD records,
//!   and its `:holds` set names exactly those, each at its record's expiry
//!   (no hold counted twice, none lost). A hold whose expiry passed but
//!   that nothing released yet is still HELD in all three: the equation is
//!   exact at any instant, sweeper or not.
//! - **Agreement**: each record agrees with the replies its request_id got
//!   (state, qty, order_no); code 0 is answered at most once per id and
//!   operation; a code 1 or 4 has an earlier attempt that explains it. A
//!   hold's replies are checked against its state machine (lua/revert.lua):
//!   each code must follow from the states the earlier replies leave
//!   possible, counting expiry (HELD → EXPIRED at any time) and any
//!   unanswered attempt as things that may have happened meanwhile. So a
//!   HOLD answered 0 ends HELD, CONFIRMED, EXPIRED or REVERTED; a CONFIRM
//!   answered 0 ends CONFIRMED (REVERTED if reverted later); one answered 5
//!   ends EXPIRED; every hold reply's `expires_at` is the record's.
//! - **No negative stock**, and every record has a TTL but the HELD ones,
//!   which have none (a hold's units are in its record).
//! - **No business code for a fault**: any 2 or 3 is a violation (the load
//!   never mixes a DEDUCT and a HOLD under one id, the one legitimate 3 of
//!   the holds' state machine), and so is a 5 for a DEDUCT or a REVERT.
//! - **Bounded unknown outcomes**: every reply is a code or an `UPSTREAM` /
//!   `BADREPLY` error within the client's timeout (a client timeout is a
//!   hang), and every request_id ends in a definite state.
//! - **Orders, all or nothing**: an order's lines are records of
//!   `~ord:<request_id>` on their skus, counted in the books like any
//!   record (DEDUCTED, HELD and CONFIRMED keep units out, the rest count
//!   zero); an ORDER's lines (intent kind T) are DEDUCTs and never holds,
//!   an ORDER.HOLD's are holds and never DEDUCTs. Every line is applied
//!   (all DEDUCTED or CONFIRMED, or all HELD by a live order hold) or none
//!   is (REVERTED, REVOKED, EXPIRED, absent, or HELD past its expiry on its
//!   way back); the intent record (`stock:{order:<id>}:intent`, read
//!   through the cluster) rests in a final phase that says the same as the
//!   lines (DONE, HELD, ABORTED / REVERTED / REVOKED) and names the lines
//!   sent; and the order's last answer agrees (0/1 → applied unless
//!   ORDER.REVERTed after; 2, 4, 5 → none), each code explained by the
//!   steps before it.
//! - **Orders end on their own**: an order left after an error had an
//!   attempt whose outcome is unknown, so it may have ended applied or
//!   not, but it must have ended, with no caller: once stockgate's
//!   recovery had its time (the audit waits for it, [`History::audit`]),
//!   its intent rests in a final phase (DONE, ABORTED, REVERTED, REVOKED,
//!   or HELD for an ORDER.HOLD, its lines held until they run out), its
//!   lines agree with it, and the books are exact; or it has no intent at
//!   all (its first command failed before the begin), and then no line
//!   holds or took units. An intent still HOLDING, CONFIRMING, ABORTING or
//!   REVERTING is a violation whatever the policy.
//! - No record exists that the load did not cause, and none lives on a node
//!   that does not own its slot.
//!
//! Acknowledged writes lost by an asynchronous failover are counted
//! ([`Audit::lost_acks`]); they are violations unless the test allows them
//! ([`Policy::allow_lost_acks`]), since Redis Cluster may lose them by design.
//!
//! # Layout
//!
//! In reading order:
//!
//! - [`load`]: the [`Workload`] and the clients that drive it ([`load::Load`]);
//! - [`history`]: what the load sent and got ([`History`], [`Attempt`],
//!   [`Outcome`]) and the figures the reports draw from it;
//! - [`state`]: what Redis holds at the end, read directly (the final
//!   state);
//! - [`audit`]: the audit itself ([`History::audit`], [`Audit`],
//!   [`Policy`]): every reply, each DEDUCT chain, and conservation per sku
//!   ([`conservation`]);
//! - [`holds`]: one hold's replies against its state machine;
//! - [`orders`]: one order's replies, intent and lines (all or nothing),
//!   and the wait for stockgate's recovery of the orders left after an
//!   error.

mod audit;
mod history;
mod holds;
mod load;
mod orders;
mod state;

pub use audit::{Audit, Policy, conservation};
pub use history::{Attempt, History, Left, Op, Outcome, fault_kind};
pub use load::Workload;
pub use orders::orders_in_flight_key;
