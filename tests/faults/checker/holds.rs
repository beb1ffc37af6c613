//! One hold's audit: its replies against its state machine
//! (lua/revert.lua), counting expiry and unanswered attempts as things
//! that may have happened meanwhile, and against its record.

use std::time::{Duration, Instant};

use super::audit::Policy;
use super::history::{Attempt, History, Op, Outcome};
use super::load::order_no;
use super::state::{FinalRecord, RecordState};

/// What one hold's audit found.
pub(super) struct HoldAudit {
    /// An acknowledged change is missing (or was made again).
    pub(super) lost: bool,
    /// qty when the replies leave the units out of stock for sure (HELD
    /// or CONFIRMED), else 0.
    pub(super) acked: i64,
}

/// A hold's state, as its record holds it (HELD counts as HELD whether or
/// not its time ran out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hs {
    None,
    Held,
    Confirmed,
    Expired,
    Reverted,
    Revoked,
}

const HS: [Hs; 6] = [
    Hs::None,
    Hs::Held,
    Hs::Confirmed,
    Hs::Expired,
    Hs::Reverted,
    Hs::Revoked,
];

/// A set of [`Hs`], one bit each.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Hset(u8);

impl Hset {
    fn of(states: &[Hs]) -> Hset {
        Hset(states.iter().fold(0, |m, s| m | 1 << *s as u8))
    }
    fn has(self, s: Hs) -> bool {
        self.0 & (1 << s as u8) != 0
    }
    fn states(self) -> impl Iterator<Item = Hs> {
        HS.into_iter().filter(move |s| self.has(*s))
    }
    fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Debug for Hset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.states()).finish()
    }
}

impl Hs {
    fn of_record(record: Option<&FinalRecord>) -> Option<Hs> {
        Some(match record.map(|r| r.state) {
            None => Hs::None,
            Some(RecordState::Held) => Hs::Held,
            Some(RecordState::Confirmed) => Hs::Confirmed,
            Some(RecordState::Expired) => Hs::Expired,
            Some(RecordState::Reverted) => Hs::Reverted,
            Some(RecordState::Revoked) => Hs::Revoked,
            Some(RecordState::Deducted) => return None,
        })
    }

    /// What `op` answers in this state, and the state it leaves: the
    /// columns of lua/revert.lua's table. A HELD whose time ran out answers
    /// as EXPIRED (released by the call): the audit does not know Redis's
    /// clock at each call, so HELD allows both.
    fn step(self, op: Op) -> &'static [(i64, Hs)] {
        use Hs::*;
        match (op, self) {
            (Op::Hold, None) => &[(0, Held)],
            (Op::Hold, Held) => &[(1, Held), (5, Expired)],
            (Op::Hold, Confirmed) => &[(1, Confirmed)],
            (Op::Hold | Op::Confirm, Expired) => &[(5, Expired)],
            (Op::Confirm, None) => &[(4, Revoked)],
            (Op::Confirm, Held) => &[(0, Confirmed), (5, Expired)],
            (Op::Confirm, Confirmed) => &[(1, Confirmed)],
            (Op::Hold | Op::Confirm, Reverted) => &[(4, Reverted)],
            (Op::Hold | Op::Confirm, Revoked) => &[(4, Revoked)],
            (Op::Revert, None) => &[(4, Revoked)],
            (Op::Revert, Held) => &[(0, Reverted), (1, Expired)],
            (Op::Revert, Confirmed) => &[(0, Reverted)],
            (Op::Revert, Expired) => &[(1, Expired)],
            (Op::Revert, Reverted) => &[(1, Reverted)],
            (Op::Revert, Revoked) => &[(1, Revoked)],
            (Op::Deduct, _) => &[],
            (Op::Order | Op::OrderHold | Op::OrderConfirm | Op::OrderRevert, _) => &[],
        }
    }

    /// The states an acknowledged change lost in a failover can take this
    /// one back to: the earlier states on its path.
    fn behind(self) -> &'static [Hs] {
        use Hs::*;
        match self {
            None => &[],
            Held | Revoked => &[None],
            Confirmed | Expired => &[Held, None],
            Reverted => &[Confirmed, Held, None],
        }
    }
}

/// Every state `from` can reach without a reply to show it: a hold
/// running out (when its time can have come) and any attempt in
/// `unanswered` (it may have run, then or later).
fn reachable(from: Hset, unanswered: &[Op], can_expire: bool) -> Hset {
    let mut set = from;
    loop {
        let mut next = set;
        for s in set.states() {
            if s == Hs::Held && can_expire {
                next.0 |= Hset::of(&[Hs::Expired]).0;
            }
            for op in unanswered {
                for (_, to) in s.step(*op) {
                    next.0 |= Hset::of(&[*to]).0;
                }
            }
        }
        if next == set {
            return set;
        }
        set = next;
    }
}

/// `set` and every state behind one of its own (acknowledged changes lost).
fn with_lost(set: Hset) -> Hset {
    let mut all = set;
    for s in set.states() {
        all.0 |= Hset::of(s.behind()).0;
    }
    all
}

/// One hold's replies against its state machine, and against its record.
pub(super) fn audit_hold(
    history: &History,
    id: &str,
    attempts: &[&Attempt],
    record: Option<&FinalRecord>,
    policy: Policy,
    violations: &mut Vec<String>,
) -> HoldAudit {
    let w = &history.workload;
    let sku = w.skus[attempts[0].sku].as_str();
    let order = order_no(id);
    // A hold can run out only once its ttl has passed since its first
    // HOLD was sent (Redis's clock and this one are the same host's; a
    // second of slack).
    let ttl = attempts.iter().map(|a| a.ttl_ms).max().unwrap_or(0);
    let runs_out = attempts[0].started + Duration::from_millis(ttl as u64);
    let can_expire = |by: Instant| runs_out <= by + Duration::from_secs(1);
    let mut possible = Hset::of(&[Hs::None]);
    let mut unanswered: Vec<Op> = Vec::new();
    let mut lost = false;
    let mut expiries: Vec<i64> = Vec::new();
    for a in attempts {
        let tag = || format!("{:?} {sku} {id} at {}", a.op, history.at(a.started));
        let Outcome::Code {
            code,
            order_no: o,
            expires_at,
            ..
        } = &a.outcome
        else {
            unanswered.push(a.op);
            continue;
        };
        let can_expire = can_expire(a.ended());
        let before = reachable(possible, &unanswered, can_expire);
        let after = |from: Hset| {
            let mut to = Hset(0);
            for s in from.states() {
                for (c, next) in s.step(a.op) {
                    if c == code {
                        to.0 |= Hset::of(&[*next]).0;
                    }
                }
            }
            to
        };
        let mut next = after(before);
        if next.is_empty() {
            let lossy = reachable(with_lost(before), &unanswered, can_expire);
            next = after(lossy);
            if next.is_empty() {
                if !matches!(code, 2 | 3) {
                    violations.push(format!(
                        "{} answered {code}, which no state the earlier replies allow ({before:?}) answers",
                        tag()
                    ));
                }
                // Reported: go on from whatever it could mean.
                next = Hset::of(&HS);
            } else {
                lost = true;
                if !policy.allow_lost_acks {
                    violations.push(format!(
                        "{} answered {code}: only possible if an acknowledged change was lost (states allowed before: {before:?})",
                        tag()
                    ));
                }
            }
        }
        possible = next;
        if matches!(code, 0 | 5) && o != &order {
            violations.push(format!("{} code {code} with order_no {o:?}", tag()));
        }
        if matches!(a.op, Op::Hold | Op::Confirm) && matches!(code, 0 | 1 | 5) {
            if *expires_at <= 0 {
                violations.push(format!("{} code {code} without an expiry", tag()));
            } else if !expiries.contains(expires_at) {
                expiries.push(*expires_at);
            }
            // Redis decides by its own clock, which is this host's: a
            // CONFIRM sent after the expiry can't have confirmed, and a 5
            // can't come before it (half a second of slack).
            let slack = 500;
            if a.op == Op::Confirm && *code == 0 && history.unix_ms(a.started) > expires_at + slack
            {
                violations.push(format!(
                    "{} confirmed, though sent {} ms after the hold's expiry",
                    tag(),
                    history.unix_ms(a.started) - expires_at
                ));
            }
            if *code == 5 && history.unix_ms(a.ended()) < expires_at - slack {
                violations.push(format!(
                    "{} answered expired {} ms before the hold's expiry",
                    tag(),
                    expires_at - history.unix_ms(a.ended())
                ));
            }
        }
    }
    if expiries.len() > 1 && !lost {
        violations.push(format!(
            "{sku} {id}: replies name different expiries {expiries:?}"
        ));
    }

    let Some(actual) = Hs::of_record(record) else {
        violations.push(format!("{sku} {id}: a hold's id has a DEDUCTED record"));
        return HoldAudit { lost, acked: 0 };
    };
    if let Some(r) = record {
        let qty = attempts[0].qty;
        let want = match actual {
            Hs::Revoked => "V:0:".to_owned(),
            _ => format!("{}:{qty}:{order}", r.state.letter()),
        };
        if r.summary != want {
            violations.push(format!(
                "{sku} {id}: record {:?} does not match qty {qty}, order_no {order}",
                r.summary
            ));
        }
        if let Some(wrong) = r.ttl_violation() {
            violations.push(format!("{sku} {id}: {wrong}"));
        }
        if let Some(at) = r.expires
            && !expiries.is_empty()
            && !expiries.contains(&at)
            && !lost
        {
            violations.push(format!(
                "{sku} {id}: record expires at {at}, the replies said {expiries:?}"
            ));
        }
    }
    let can_expire = can_expire(Instant::now());
    let allowed = reachable(possible, &unanswered, can_expire);
    if !allowed.has(actual) {
        if reachable(with_lost(allowed), &unanswered, can_expire).has(actual) {
            lost = true;
            if !policy.allow_lost_acks {
                violations.push(format!(
                    "{sku} {id}: replies say {allowed:?}, Redis holds {actual:?} (acknowledged change lost)"
                ));
            }
        } else {
            violations.push(format!(
                "{sku} {id}: replies say {allowed:?}, Redis holds {actual:?}"
            ));
        }
    }
    let out_of_stock = Hset::of(&[Hs::Held, Hs::Confirmed]);
    let acked = if !allowed.is_empty() && allowed.0 & !out_of_stock.0 == 0 {
        attempts[0].qty as i64
    } else {
        0
    };
    HoldAudit { lost, acked }
}
