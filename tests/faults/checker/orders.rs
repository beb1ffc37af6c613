//! One order's audit: its replies, its intent record and its line records,
//! all lines or none; and the wait, before the audit reads, for
//! stockgate's recovery to end the orders left after an error.

use std::time::{Duration, Instant};
use stockgate::dev::LocalCluster;

use super::audit::Policy;
use super::history::{Attempt, History, Left, Op, Outcome};
use super::state::{FinalState, RecordState};

impl History {
    /// Polls the intents of the orders left after an error until none is
    /// in flight (HOLDING, CONFIRMING, ABORTING, REVERTING) but those
    /// filed nowhere among the orders in flight, which nothing will ever
    /// end; or, at most, until [`Workload::recover_after`] past the last
    /// one's error or now (the fault has healed by now), whichever is
    /// later, and [`Workload::recovery_slack`] more. Whatever is left in
    /// flight then is the audit's to report. How long it waited.
    pub fn await_recovery(&self, cluster: &LocalCluster) -> Duration {
        let started = Instant::now();
        let mut ids: Vec<&str> = self.left.iter().map(|l| &*l.id).collect();
        ids.sort_unstable();
        ids.dedup();
        let Some(last) = self.left.iter().map(|l| l.at).max() else {
            return Duration::ZERO;
        };
        let w = &self.workload;
        let deadline = (last + w.recover_after()).max(started) + w.recovery_slack();
        let name = &w.name;
        let mut at_first = None;
        loop {
            let mut waiting = Vec::new();
            let mut stuck = Vec::new();
            match cluster.cluster_connection() {
                Ok(mut conn) => {
                    for id in &ids {
                        match order_whereabouts(&mut conn, id) {
                            Some((phase, _)) if !in_flight(&phase) => {}
                            Some((phase, true)) => waiting.push(format!("{id} {phase}")),
                            Some((phase, false)) => stuck.push(format!("{id} {phase}")),
                            None => waiting.push(format!("{id} (unreadable)")),
                        }
                    }
                }
                Err(e) => waiting.push(format!("(no cluster connection: {e})")),
            }
            let at_first = *at_first.get_or_insert(waiting.len() + stuck.len());
            if waiting.is_empty() || Instant::now() >= deadline {
                eprintln!(
                    "[{name}] {} orders left after an error, {at_first} of them still in flight when the audit began; waited {} for recovery to end them; {} still in flight and filed: {waiting:?}; {} in flight and filed nowhere: {stuck:?}",
                    ids.len(),
                    crate::harness::ms(started.elapsed()),
                    waiting.len(),
                    stuck.len(),
                );
                return started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A phase an order never rests in: its saga, or recovery, is still to
/// move it on.
fn in_flight(phase: &str) -> bool {
    matches!(phase, "HOLDING" | "CONFIRMING" | "ABORTING" | "REVERTING")
}

/// The shard of the orders in flight that files order `id`
/// (`lua/order_due.lua`).
pub fn orders_in_flight_key(id: &str) -> Vec<u8> {
    let layout = crate::support::layout();
    let id = stockgate::params::RequestId::parse(bytes::Bytes::copy_from_slice(id.as_bytes()))
        .expect("the load's request_ids are valid");
    layout.sweep_shards()[layout.order_shard_index(&id)]
        .orders
        .clone()
}

/// Where order `id` is: its intent's phase ("" without one) and whether
/// it is filed among the orders in flight, in that order of reading: an
/// order is taken out only once it rests, and filed again only by a
/// command or by a recovery of it while filed, so one filed nowhere that
/// is then read in flight was left so for good. None if unreadable.
fn order_whereabouts(
    conn: &mut redis::cluster::ClusterConnection,
    id: &str,
) -> Option<(String, bool)> {
    let filed: Option<f64> = redis::cmd("ZSCORE")
        .arg(orders_in_flight_key(id))
        .arg(id)
        .query(conn)
        .ok()?;
    let phase: Option<String> = redis::cmd("HGET")
        .arg(format!("stock:{{order:{id}}}:intent"))
        .arg("p")
        .query(conn)
        .ok()?;
    Some((phase.unwrap_or_default(), filed.is_some()))
}

/// The prefix of an order's line ids: its lines are records of
/// `~ord:<request_id>` on their skus.
pub(super) const LINE_PREFIX: &str = "~ord:";

/// What one order's audit found.
pub(super) struct OrderAudit {
    /// An acknowledged change is missing (or was made again).
    pub(super) lost: bool,
    /// Σ qty of the lines when the replies say the order is applied and
    /// Redis agrees, else 0.
    pub(super) acked: i64,
    /// Every line applied (true), none (false), or half (None, reported).
    pub(super) applied: Option<bool>,
    /// (sku, qty) of the line records that keep units out of stock.
    pub(super) recorded: Vec<(usize, i64)>,
}

/// Where an order ended, by its intent record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Os {
    /// DONE: every line CONFIRMED (ORDER.HOLD), or DEDUCTED (an ORDER's
    /// lines are taken).
    Applied,
    /// HELD before its expiry: every line HELD.
    Live,
    /// HELD after its expiry: every line HELD (due) or EXPIRED.
    RanOut,
    /// ABORTED, REVERTED, REVOKED: every line given back, revoked or never
    /// placed.
    Undone,
    /// A phase a settled order never rests in.
    InFlight,
    /// No intent record.
    Missing,
}

/// A violation, or an acknowledged change lost when the policy allows it.
fn lossy(policy: Policy, lost: &mut bool, violations: &mut Vec<String>, text: String) {
    *lost = true;
    if !policy.allow_lost_acks {
        violations.push(text);
    }
}

/// One order's replies, its intent record and its line records: all lines
/// or none, agreeing with the replies; and, for one its caller `left`
/// after an error, ended on its own.
pub(super) fn audit_order(
    history: &History,
    state: &FinalState,
    id: &str,
    attempts: &[&Attempt],
    left: Option<&Left>,
    policy: Policy,
    violations: &mut Vec<String>,
) -> OrderAudit {
    let w = &history.workload;
    let lines = attempts[0].lines.clone();
    let line_id = format!("{LINE_PREFIX}{id}");
    let mut lost = false;

    // The intent.
    let intent = state.intents.get(id);
    let field = |f: &str| intent.and_then(|i| i.get(f)).map_or("", |v| v.as_str());
    let phase = field("p");
    // An ORDER's lines are DEDUCTs (kind T); an ORDER.HOLD's (H), and an
    // older stockgate's ORDER's (D), are HOLDs then CONFIRMs.
    let takes = field("k") == "T";
    let expires: i64 = field("e").parse().unwrap_or(0);
    let os = match phase {
        "DONE" => Os::Applied,
        "HELD" if expires > state.now_ms => Os::Live,
        "HELD" => Os::RanOut,
        "ABORTED" | "REVERTED" | "REVOKED" => Os::Undone,
        "" => Os::Missing,
        _ => Os::InFlight,
    };

    // The lines: C (confirmed, or taken), H (held, live), ? (held, but due, or of an
    // order hold that ran out: on its way back, whether or not the
    // sweeper released it yet, as lines on different primaries are read
    // at different instants), - (given back, revoked, expired or never
    // placed).
    let mut recorded = Vec::new();
    let mut marks = Vec::new();
    let mut shown = Vec::new();
    for &(sku, qty) in lines.iter() {
        let name = &w.skus[sku];
        let record = state.records.get(&(name.clone(), line_id.clone()));
        let mark = match record {
            None => '-',
            Some(r) => {
                let want = if r.state == RecordState::Revoked {
                    0
                } else {
                    qty as u64
                };
                let wrong_kind = if takes {
                    matches!(r.state, RecordState::Held | RecordState::Confirmed)
                } else {
                    r.state == RecordState::Deducted
                };
                if r.qty != want || wrong_kind {
                    violations.push(format!(
                        "{name} {line_id}: line record {:?} does not match the order's line ({qty}, intent kind {:?})",
                        r.summary,
                        field("k")
                    ));
                }
                if let Some(wrong) = r.ttl_violation() {
                    violations.push(format!("{name} {line_id}: {wrong}"));
                }
                match r.state {
                    RecordState::Confirmed | RecordState::Held | RecordState::Deducted => {
                        recorded.push((sku, r.qty as i64))
                    }
                    _ => {}
                }
                match r.state {
                    RecordState::Confirmed | RecordState::Deducted => 'C',
                    RecordState::Held
                        if os != Os::RanOut && r.expires.is_some_and(|at| at > state.now_ms) =>
                    {
                        'H'
                    }
                    RecordState::Held => '?',
                    _ => '-',
                }
            }
        };
        marks.push(mark);
        shown.push(format!(
            "{name}={}",
            record.map_or('-', |r| r.state.letter())
        ));
    }
    let mut kinds: Vec<char> = marks.iter().copied().filter(|m| *m != '?').collect();
    kinds.sort_unstable();
    kinds.dedup();
    let applied = match kinds.as_slice() {
        ['C'] | ['H'] => Some(true),
        [] | ['-'] => Some(false),
        _ => None,
    };

    if !matches!(os, Os::Missing) && phase != "REVOKED" {
        let mut sorted: Vec<(&str, u32)> = lines
            .iter()
            .map(|(sku, qty)| (w.skus[*sku].as_str(), *qty))
            .collect();
        sorted.sort_unstable();
        let canonical: Vec<String> = sorted.iter().map(|(s, q)| format!("{s} {q}")).collect();
        if field("l") != canonical.join(" ") {
            violations.push(format!(
                "order {id}: intent lines {:?}, the order sent {:?}",
                field("l"),
                canonical.join(" ")
            ));
        }
    }
    if let Some(left) = left
        && os == Os::InFlight
    {
        // Nobody will retry it: whatever its lines say, it never ended.
        let filed = if state.filed.contains(id) {
            format!(
                "still filed among the orders in flight after the audit waited {} for recovery",
                crate::harness::ms(state.recovery_waited)
            )
        } else {
            "filed nowhere among the orders in flight, so nothing will ever end it".to_owned()
        };
        violations.push(format!(
            "order {id}: unfinished: its caller left it after an error ({:?} at {}) and it never ended on its own: intent {phase:?}, {filed}; lines {}{}",
            left.op,
            history.at(left.at),
            shown.join(" "),
            if applied.is_none() { " (not whole)" } else { "" },
        ));
    } else if applied.is_none() {
        lossy(
            policy,
            &mut lost,
            violations,
            format!(
                "order {id}: half applied: lines {} (intent {phase:?})",
                shown.join(" ")
            ),
        );
    } else {
        let fits = match os {
            Os::Applied => marks.iter().all(|m| *m == 'C'),
            Os::Live => marks.iter().all(|m| *m == 'H'),
            Os::RanOut => marks.iter().all(|m| *m != 'C' && *m != 'H'),
            Os::Undone | Os::Missing => marks.iter().all(|m| *m == '-'),
            Os::InFlight => false,
        };
        // No intent is an end only for an order left after an error: its
        // first command failed before the begin (then no line was placed).
        if !fits || (os == Os::Missing && left.is_none()) {
            let text = format!("order {id}: intent {phase:?}, lines {}", shown.join(" "));
            // An order only rests in flight if a step never settled
            // (reported as such) or a write was lost.
            if !(os == Os::InFlight && history.unsettled.iter().any(|u| &*u.id == id)) {
                lossy(policy, &mut lost, violations, text);
            }
        }
    }

    // The replies, in order.
    let ttl = attempts.iter().map(|a| a.ttl_ms).max().unwrap_or(0);
    let runs_out = attempts[0].started + Duration::from_millis(ttl as u64);
    let mut sent: Vec<Op> = Vec::new();
    let mut answered: Vec<(Op, i64)> = Vec::new();
    let mut answer: Option<(Op, bool)> = None;
    let mut open_after = false;
    // When the first ORDER.CONFIRM went out: a retry of one that timed out
    // may answer 0 after the expiry, because the first attempt moved the
    // order to CONFIRMING in time and the retry only finishes it.
    let mut first_confirm: Option<Instant> = None;
    for a in attempts {
        if a.op == Op::OrderConfirm && first_confirm.is_none() {
            first_confirm = Some(a.started);
        }
        let tag = || format!("{:?} {id} at {}", a.op, history.at(a.started));
        let Outcome::Code {
            code, expires_at, ..
        } = &a.outcome
        else {
            sent.push(a.op);
            open_after = true;
            continue;
        };
        let code = *code;
        let tried = |op: Op| sent.contains(&op);
        let got = |op: Op, c: &[i64]| answered.iter().any(|(o, k)| *o == op && c.contains(k));
        let placed = got(Op::Order, &[0, 1]) || got(Op::OrderHold, &[0, 1]);
        let mut wrong = |why: &str, lossy_ok: bool| {
            let text = format!("{} answered {code}: {why}", tag());
            if lossy_ok {
                lossy(policy, &mut lost, violations, text);
            } else {
                violations.push(text);
            }
        };
        match (a.op, code) {
            (Op::Order | Op::OrderHold, 0) => {
                if tried(Op::OrderRevert) || placed {
                    wrong("applied again after an earlier ack or revert", true);
                }
                answer = Some((a.op, true));
            }
            (Op::Order | Op::OrderHold, 1) => {
                if !tried(a.op) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                answer = Some((a.op, true));
            }
            (Op::Order | Op::OrderHold, 4) => {
                if !tried(Op::OrderRevert) {
                    wrong("reverted, yet no ORDER.REVERT was sent", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderHold, 5) => {
                if runs_out > a.ended() + Duration::from_secs(1) {
                    wrong("expired before its ttl", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderConfirm, 0 | 1) => {
                if code == 1 && !tried(Op::OrderConfirm) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                if code == 0 && got(Op::OrderConfirm, &[0, 1]) {
                    wrong("confirmed twice", true);
                }
                if history.unix_ms(first_confirm.unwrap_or(a.started)) > expires_at + 500 {
                    wrong(
                        "confirmed, though first sent after the order hold's expiry",
                        false,
                    );
                }
                answer = Some((a.op, true));
            }
            (Op::OrderConfirm, 5) => {
                if history.unix_ms(a.ended()) < expires_at - 500 {
                    wrong("expired before the order hold's expiry", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 0) => {
                if !(placed || tried(Op::Order)) || got(Op::OrderRevert, &[0, 1]) {
                    wrong("reverted what was not applied, or twice", true);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 1) => {
                if !tried(Op::OrderRevert) {
                    wrong("a duplicate with no earlier attempt", false);
                }
                answer = Some((a.op, false));
            }
            (Op::OrderRevert, 4) => {
                if placed {
                    wrong("nothing to revert after the order was acknowledged", true);
                }
                answer = Some((a.op, false));
            }
            (_, 2 | 3 | 5) => {} // reported with every reply
            _ => wrong("not a code this step can answer", false),
        }
        if matches!(a.op, Op::OrderHold | Op::OrderConfirm)
            && matches!(code, 0 | 1 | 5)
            && os != Os::Missing
            && *expires_at != expires
        {
            lossy(
                policy,
                &mut lost,
                violations,
                format!(
                    "{} answered expires_at {expires_at}, the intent says {expires}",
                    tag()
                ),
            );
        }
        sent.push(a.op);
        answered.push((a.op, code));
        open_after = false;
    }

    // The last answer against where the order ended.
    let want: &[Os] = match answer {
        // Not one answer: it may never have begun.
        _ if open_after && answered.is_empty() => &[
            Os::Applied,
            Os::Live,
            Os::RanOut,
            Os::Undone,
            Os::InFlight,
            Os::Missing,
        ],
        _ if open_after => &[Os::Applied, Os::Live, Os::RanOut, Os::Undone, Os::InFlight],
        None => &[],
        Some((Op::OrderHold, true)) => &[Os::Live, Os::RanOut],
        Some((_, true)) => &[Os::Applied],
        Some((Op::OrderHold, false)) => &[Os::RanOut, Os::Undone],
        Some((_, false)) => &[Os::Undone],
    };
    if !want.is_empty() && !want.contains(&os) {
        lossy(
            policy,
            &mut lost,
            violations,
            format!("order {id}: replies say {want:?}, the intent is {phase:?} ({os:?})"),
        );
    }
    let qty: i64 = lines.iter().map(|(_, q)| *q as i64).sum();
    let acked = match answer {
        Some((_, true)) if matches!(os, Os::Applied | Os::Live) && !open_after => qty,
        _ => 0,
    };
    OrderAudit {
        lost,
        acked,
        applied: applied.map(|a| a && matches!(os, Os::Applied | Os::Live)),
        recorded,
    }
}
