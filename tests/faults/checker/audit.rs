//! The audit: every reply, each DEDUCT chain against its record, records
//! nobody asked for, and conservation per sku; holds and orders are
//! audited in [`super::holds`] and [`super::orders`].

use std::collections::{BTreeMap, HashMap};
use stockgate::dev::LocalCluster;

use super::history::{Attempt, History, Op, Outcome, fault_kind};
use super::holds::audit_hold;
use super::load::{Workload, order_no};
use super::orders::{LINE_PREFIX, audit_order};
use super::state::{FinalRecord, FinalState, RecordState};

impl History {
    /// Reads the final state from the cluster and checks every invariant.
    /// First, if callers left orders after an error, waits for stockgate's
    /// recovery to end them ([`History::await_recovery`]).
    pub fn audit(&self, cluster: &LocalCluster, policy: Policy) -> Audit {
        crate::harness::wait_stable(cluster);
        let waited = self.await_recovery(cluster);
        let mut state = FinalState::read(cluster, &self.workload);
        state.read_intents(cluster, self);
        state.recovery_waited = waited;
        audit(self, &state, policy)
    }
}

impl History {
    /// [`History::audit`], with the database as the third book (issue 26):
    /// each sku's journal is what `database` holds, followed by what Redis
    /// still journals after it ([`FinalState::with_database`]).
    pub fn audit_with_database(
        &self,
        cluster: &LocalCluster,
        policy: Policy,
        database: &crate::books::Database,
    ) -> Audit {
        crate::harness::wait_stable(cluster);
        let waited = self.await_recovery(cluster);
        let mut state = FinalState::read(cluster, &self.workload);
        state.read_intents(cluster, self);
        state.recovery_waited = waited;
        state.with_database(database, &self.workload.skus);
        audit(self, &state, policy)
    }
}

/// Conservation alone, for skus changed by requests the test did not
/// record (clients that left mid-request, holds placed by a test itself):
/// per sku, `initial` − final = Σ qty of DEDUCTED, CONFIRMED and HELD
/// records, the `:held` counter is Σ qty of the HELD ones and the `:holds`
/// set names exactly those. The violations, if any.
pub fn conservation(
    cluster: &LocalCluster,
    name: &str,
    skus: &[String],
    initial: i64,
) -> Vec<String> {
    let mut workload = Workload::new(name, skus.to_vec(), crate::harness::TIMEOUT);
    workload.initial_stock = initial;
    let state = FinalState::read(cluster, &workload);
    let mut violations = state.violations.clone();
    for sku in skus {
        let taken: i64 = state
            .records
            .iter()
            .filter(|((s, _), _)| s == sku)
            .filter(|(_, r)| {
                matches!(
                    r.state,
                    RecordState::Deducted | RecordState::Confirmed | RecordState::Held
                )
            })
            .map(|(_, r)| r.qty as i64)
            .sum();
        violations.extend(state.books(sku, initial, taken));
    }
    violations
}

/// The records of one sku in state HELD, from `records`: request_id ->
/// (qty, expiry).
fn held_records<'a>(
    records: &'a HashMap<(String, String), FinalRecord>,
    sku: &'a str,
) -> impl Iterator<Item = (&'a str, &'a FinalRecord)> + 'a {
    records
        .iter()
        .filter(move |((s, _), r)| s == sku && r.state == RecordState::Held)
        .map(|((_, id), r)| (id.as_str(), r))
}

/// What the audit tolerates.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    /// An acknowledged change missing after a failover (asynchronous
    /// replication) is counted, not failed.
    pub allow_lost_acks: bool,
}

impl FinalState {
    /// One sku's books: no negative stock; `initial` − final = `taken`
    /// (Σ qty of the records that keep units out of stock); the `:held`
    /// counter is Σ qty of the HELD records; the `:holds` set names exactly
    /// the HELD records, each at its expiry.
    fn books(&self, sku: &str, initial: i64, taken: i64) -> Vec<String> {
        let mut violations = Vec::new();
        match self.stock.get(sku) {
            None => violations.push(format!("{sku}: stock key missing at the end")),
            Some(&stock) => {
                if stock < 0 {
                    violations.push(format!("{sku}: negative stock {stock}"));
                }
                if initial - stock != taken {
                    violations.push(format!(
                        "{sku}: conservation broken: stock went down by {}, DEDUCTED, CONFIRMED and HELD records hold {taken}",
                        initial - stock
                    ));
                }
            }
        }
        let held: i64 = held_records(&self.records, sku)
            .map(|(_, r)| r.qty as i64)
            .sum();
        let counter = self.held.get(sku).copied().unwrap_or(0);
        if counter != held {
            violations.push(format!(
                "{sku}: the held counter says {counter}, HELD records hold {held}"
            ));
        }
        violations.extend(self.journal_books(sku, initial, counter));
        let empty = HashMap::new();
        let set = self.holds.get(sku).unwrap_or(&empty);
        for (id, record) in held_records(&self.records, sku) {
            match set.get(id) {
                None => violations.push(format!(
                    "{sku} {id}: HELD, but not in the holds set (its units would never come back)"
                )),
                Some(at) if Some(*at) != record.expires => violations.push(format!(
                    "{sku} {id}: in the holds set at {at}, its record expires at {:?}",
                    record.expires
                )),
                Some(_) => {}
            }
        }
        for id in set.keys() {
            let state = self
                .records
                .get(&(sku.to_owned(), id.clone()))
                .map(|r| r.state);
            if state != Some(RecordState::Held) {
                violations.push(format!(
                    "{sku} {id}: in the holds set, but its record is {state:?} (a hold still counted after it ended)"
                ));
            }
        }
        violations
    }
}

impl FinalState {
    /// Each of `skus`' journals as the database holds it, followed by the
    /// entries Redis journaled after the database's last (the sweeper's,
    /// order recovery's, after the drain). An entry Redis still holds that
    /// the database also holds (moved, not trimmed yet) must be the same;
    /// one older than the database's last that the database lacks was
    /// skipped by the sink; a conflict means an id was given twice.
    pub(super) fn with_database(&mut self, database: &crate::books::Database, skus: &[String]) {
        if database.conflicts != 0 {
            self.violations.push(format!(
                "the database holds {} conflicting entries (an id Redis gave twice)",
                database.conflicts
            ));
        }
        for sku in skus {
            let mut book = database.entries.get(sku).cloned().unwrap_or_default();
            let last = book.last().map(|e| e.at);
            for entry in self.journals.remove(sku).unwrap_or_default() {
                if Some(entry.at) > last {
                    book.push(entry);
                    continue;
                }
                match book.iter().find(|moved| moved.at == entry.at) {
                    Some(moved) if *moved == entry => {}
                    Some(moved) => self.violations.push(format!(
                        "{sku}: entry {} is {moved:?} in the database and {entry:?} in Redis",
                        entry.stream_id()
                    )),
                    None => self.violations.push(format!(
                        "{sku}: entry {} ({:?} {}) is in Redis, older than the database's last, and not in the database",
                        entry.stream_id(),
                        entry.event,
                        entry.id
                    )),
                }
            }
            if !book.is_empty() {
                self.journals.insert(sku.clone(), book);
            }
        }
    }

    /// The third book (issue 26), when the load ran with `--journal`: the
    /// sku's journal starts from `initial` stock and nothing held, each
    /// entry moves the account by its changes to what it says it left,
    /// and the last is the stock and held units Redis holds. Each change
    /// and its entry are one script call, so this holds exactly through a
    /// failover or a reshard as well.
    fn journal_books(&self, sku: &str, initial: i64, held: i64) -> Vec<String> {
        let Some(entries) = self.journals.get(sku) else {
            return Vec::new();
        };
        let mut violations = Vec::new();
        let mut account = (initial, 0);
        for entry in entries {
            let moved = if entry.event == stockgate::journal::Event::Set {
                (entry.stock, entry.held)
            } else {
                (
                    account.0 + entry.stock_change,
                    account.1 + entry.held_change,
                )
            };
            if moved != (entry.stock, entry.held) {
                violations.push(format!(
                    "{sku}: journal entry {} ({:?} {}) says stock {} held {}, the account before it moves to {moved:?}",
                    entry.stream_id(),
                    entry.event,
                    entry.id,
                    entry.stock,
                    entry.held
                ));
            }
            account = (entry.stock, entry.held);
        }
        let stock = self.stock.get(sku).copied().unwrap_or(0);
        if account != (stock, held) {
            violations.push(format!(
                "{sku}: the journal's account ends at stock {} held {}, Redis holds stock {stock} held {held}",
                account.0, account.1
            ));
        }
        violations
    }
}

/// A request's state, as a record holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    None,
    Deducted,
    Reverted,
    Revoked,
}

impl State {
    fn of_record(value: Option<&str>, qty: u32, order: &str) -> Result<State, String> {
        match value {
            None => Ok(State::None),
            Some(v) if v == format!("D:{qty}:{order}") => Ok(State::Deducted),
            Some(v) if v == format!("R:{qty}:{order}") => Ok(State::Reverted),
            Some("V:0:") => Ok(State::Revoked),
            Some(v) => Err(format!(
                "record {v:?} does not match qty {qty}, order_no {order}"
            )),
        }
    }

    /// How far along the state machine (none → DEDUCTED → REVERTED; none →
    /// REVOKED): a record "behind" a state the replies allow lost an
    /// acknowledged write. (After a DEDUCT 4, say, the replies allow REVERTED
    /// or REVOKED; a DEDUCTED record is behind the first: the REVERT was
    /// acknowledged, then lost.)
    fn is_behind(self, expected: &[State]) -> bool {
        expected.iter().any(|e| {
            matches!(
                (self, e),
                (
                    State::None,
                    State::Deducted | State::Reverted | State::Revoked
                ) | (State::Deducted, State::Reverted)
            )
        })
    }
}

/// The audit's findings.
pub struct Audit {
    pub name: String,
    pub violations: Vec<String>,
    /// Acknowledged changes missing from the final state (or re-applied
    /// after they went missing).
    pub lost_acks: usize,
    pub requests: usize,
    pub ids: usize,
    pub retries: usize,
    pub by_label: BTreeMap<String, usize>,
    /// Σ qty of the ids the replies say are deducted now.
    pub units_acked: i64,
    /// Σ (initial − final) over the skus.
    pub units_taken: i64,
    /// Σ qty of DEDUCTED, CONFIRMED and HELD records.
    pub units_recorded: i64,
    /// Σ qty of HELD records, and of CONFIRMED ones.
    pub units_held: i64,
    pub units_confirmed: i64,
    /// Holds that ran out and were released (EXPIRED records), and holds
    /// that ran out by Redis time but that nothing had released yet when
    /// the audit read them (still HELD, and counted so).
    pub holds_expired: usize,
    pub holds_due: usize,
    /// Orders sent; those that ended applied (every line CONFIRMED, or
    /// HELD by a live order hold), and those that ended with no line
    /// applied.
    pub orders: usize,
    pub orders_applied: usize,
    pub orders_undone: usize,
    /// Orders their callers left after an error, never retried; those
    /// that ended applied, and those that ended with no line applied.
    pub orders_left: usize,
    pub left_applied: usize,
    pub left_undone: usize,
    pub unsettled: usize,
    /// One error text per kind, for the report.
    pub samples: BTreeMap<String, String>,
}

impl Audit {
    /// The one-line summary.
    pub fn summary(&self) -> String {
        let errors: Vec<String> = self
            .by_label
            .iter()
            .filter(|(k, _)| !k.starts_with("code"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let codes: Vec<String> = self
            .by_label
            .iter()
            .filter(|(k, _)| k.starts_with("code"))
            .map(|(k, v)| format!("{}={v}", k.trim_start_matches("code ")))
            .collect();
        format!(
            "[{}] requests={} ids={} retries={} codes{{{}}} errors{{{}}} unsettled={} units deducted={} accounted={} recorded={} (held={} confirmed={}) holds expired={} due={} orders={} (applied={} undone={}) left after an error={} (applied={} undone={}) lost_acks={} violations={}",
            self.name,
            self.requests,
            self.ids,
            self.retries,
            codes.join(","),
            errors.join(","),
            self.unsettled,
            self.units_acked,
            self.units_taken,
            self.units_recorded,
            self.units_held,
            self.units_confirmed,
            self.holds_expired,
            self.holds_due,
            self.orders,
            self.orders_applied,
            self.orders_undone,
            self.orders_left,
            self.left_applied,
            self.left_undone,
            self.lost_acks,
            self.violations.len()
        )
    }

    /// Prints the summary and fails the test on any violation.
    pub fn assert_green(&self) {
        eprintln!("{}", self.summary());
        for (kind, text) in &self.samples {
            eprintln!("[{}]   {kind}: {text}", self.name);
        }
        if !self.violations.is_empty() {
            let shown: Vec<&String> = self.violations.iter().take(25).collect();
            panic!(
                "[{}] {} invariant violations, first ones:\n  {}",
                self.name,
                self.violations.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
        }
    }
}

fn audit(history: &History, state: &FinalState, policy: Policy) -> Audit {
    let w = &history.workload;
    let mut violations = state.violations.clone();
    let mut lost_acks = 0;
    let bound = w.client_timeout;

    // Every reply: a valid code or a documented error, in time.
    for a in &history.attempts {
        let what = || {
            format!(
                "{:?} {} {} (client {}, retry {}) at {}",
                a.op,
                w.skus[a.sku],
                a.id,
                a.client,
                a.retry,
                history.at(a.started)
            )
        };
        match &a.outcome {
            Outcome::Code { code, remain, .. } => {
                let expiry_answer = *code == 5
                    && matches!(
                        a.op,
                        Op::Hold | Op::Confirm | Op::OrderHold | Op::OrderConfirm
                    );
                if !((0..=4).contains(code) || expiry_answer) || *code == 2 || *code == 3 {
                    violations.push(format!(
                        "{} got business code {code} during a fault",
                        what()
                    ));
                }
                if *remain < 0 {
                    violations.push(format!("{} reports negative remain {remain}", what()));
                }
            }
            Outcome::Fault { word, text } => {
                if fault_kind(word, text) == "UNDOCUMENTED" {
                    violations.push(format!(
                        "{} got an undocumented error: {word} {text}",
                        what()
                    ));
                } else if a.took > bound {
                    violations.push(format!("{} error after {:?}", what(), a.took));
                }
            }
            Outcome::ClientTimeout => violations.push(format!(
                "{} hung: no reply within the client's {:?}",
                what(),
                bound
            )),
            Outcome::ClientIo(e) => {
                violations.push(format!("{} lost its connection to stockgate: {e}", what()))
            }
            Outcome::Malformed(v) => violations.push(format!("{} malformed reply {v}", what())),
        }
    }
    for u in &history.unsettled {
        violations.push(format!(
            "{:?} {} {} never got a business code (outcome left unknown)",
            u.op, w.skus[u.sku], u.id
        ));
    }

    // Per request_id: replies agree with each other and with the record.
    let mut by_id: HashMap<&str, Vec<&Attempt>> = HashMap::new();
    for a in &history.attempts {
        by_id.entry(&a.id).or_default().push(a);
    }
    let mut units_acked = 0i64;
    let mut units_recorded_by_sku: HashMap<&str, i64> = HashMap::new();
    let (mut units_held, mut units_confirmed, mut holds_expired, mut holds_due) = (0, 0, 0, 0);
    let (mut orders, mut orders_applied, mut orders_undone) = (0, 0, 0);
    let (mut orders_left, mut left_applied, mut left_undone) = (0, 0, 0);
    for (id, attempts) in &by_id {
        let sku = w.skus[attempts[0].sku].as_str();
        let qty = attempts[0].qty;
        let order = order_no(id);
        if attempts[0].op.is_order() {
            let left = history.left.iter().find(|l| &*l.id == *id);
            let found = audit_order(history, state, id, attempts, left, policy, &mut violations);
            orders += 1;
            match found.applied {
                Some(true) => orders_applied += 1,
                Some(false) => orders_undone += 1,
                None => {}
            }
            if left.is_some() {
                orders_left += 1;
                match found.applied {
                    Some(true) => left_applied += 1,
                    Some(false) => left_undone += 1,
                    None => {}
                }
            }
            if found.lost {
                lost_acks += 1;
            }
            units_acked += found.acked;
            for (sku, units) in found.recorded {
                *units_recorded_by_sku
                    .entry(w.skus[sku].as_str())
                    .or_default() += units;
            }
            continue;
        }
        if attempts.iter().any(|a| a.op == Op::Hold) {
            let record = state.records.get(&(sku.to_owned(), id.to_string()));
            let held = audit_hold(history, id, attempts, record, policy, &mut violations);
            if held.lost {
                lost_acks += 1;
            }
            units_acked += held.acked;
            if let Some(r) = record
                && matches!(r.state, RecordState::Held | RecordState::Confirmed)
            {
                *units_recorded_by_sku.entry(sku).or_default() += r.qty as i64;
                match r.state {
                    RecordState::Held => units_held += r.qty as i64,
                    _ => units_confirmed += r.qty as i64,
                }
                if r.state == RecordState::Held && r.expires.is_some_and(|at| at <= state.now_ms) {
                    holds_due += 1;
                }
            }
            if record.is_some_and(|r| r.state == RecordState::Expired) {
                holds_expired += 1;
            }
            continue;
        }
        let mut sent_deduct = false;
        let mut sent_revert = false;
        let mut deduct_acked = false;
        let mut revert_zero = false;
        let mut expected: Option<Vec<State>> = None;
        let mut lost_here = false;
        for a in attempts {
            let tag = || format!("{:?} {sku} {id} at {}", a.op, history.at(a.started));
            if let Outcome::Code {
                code, order_no: o, ..
            } = &a.outcome
            {
                match (a.op, code) {
                    (Op::Deduct, 0) => {
                        if deduct_acked || revert_zero || sent_revert {
                            // Acked before (or reverted), and now deducted
                            // again: only possible if the earlier ack was lost.
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} deducted again (code 0) after an earlier ack or revert",
                                    tag()
                                ));
                            }
                        }
                        if o != &order {
                            violations.push(format!("{} code 0 with order_no {o:?}", tag()));
                        }
                        deduct_acked = true;
                        expected = Some(vec![State::Deducted]);
                    }
                    (Op::Deduct, 1) => {
                        if !sent_deduct {
                            violations
                                .push(format!("{} code 1 for an id never sent before", tag()));
                        }
                        if o != &order {
                            violations.push(format!("{} code 1 with order_no {o:?}", tag()));
                        }
                        if revert_zero || expected.as_deref() == Some(&[State::Revoked]) {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} code 1 (deducted) after its revert was acknowledged",
                                    tag()
                                ));
                            }
                        }
                        deduct_acked = true;
                        expected = Some(vec![State::Deducted]);
                    }
                    (Op::Deduct, 4) => {
                        if !sent_revert {
                            violations
                                .push(format!("{} code 4 but no REVERT was ever sent", tag()));
                        }
                        expected = Some(vec![State::Reverted, State::Revoked]);
                    }
                    (Op::Revert, 0) => {
                        if !sent_deduct {
                            violations.push(format!("{} gave back a deduction never sent", tag()));
                        }
                        if revert_zero {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations
                                    .push(format!("{} gave back twice (code 0 again)", tag()));
                            }
                        }
                        if o != &order {
                            violations.push(format!("{} REVERT 0 with order_no {o:?}", tag()));
                        }
                        revert_zero = true;
                        expected = Some(vec![State::Reverted]);
                    }
                    (Op::Revert, 1) => {
                        if !sent_revert {
                            violations
                                .push(format!("{} code 1 for a REVERT never sent before", tag()));
                        }
                        expected = Some(vec![State::Reverted, State::Revoked]);
                    }
                    (Op::Revert, 4) => {
                        if deduct_acked {
                            lost_here = true;
                            if !policy.allow_lost_acks {
                                violations.push(format!(
                                    "{} found nothing to give back after the DEDUCT was acknowledged",
                                    tag()
                                ));
                            }
                        }
                        expected = Some(vec![State::Revoked]);
                    }
                    _ => {} // 2, 3 and others: reported above
                }
            }
            match a.op {
                Op::Deduct => sent_deduct = true,
                Op::Revert => sent_revert = true,
                _ => {} // never in a DEDUCT's chain
            }
        }
        let record = state.records.get(&(sku.to_owned(), id.to_string()));
        let actual = match State::of_record(record.map(|r| r.summary.as_str()), qty, &order) {
            Ok(s) => s,
            Err(e) => {
                violations.push(format!("{sku} {id}: {e}"));
                continue;
            }
        };
        if let Some(r) = record
            && let Some(wrong) = r.ttl_violation()
        {
            violations.push(format!("{sku} {id}: {wrong}"));
        }
        if actual == State::Deducted {
            *units_recorded_by_sku.entry(sku).or_default() += qty as i64;
        }
        match &expected {
            Some(exp) if exp.contains(&actual) => {}
            Some(exp) => {
                if actual.is_behind(exp) {
                    lost_here = true;
                    if !policy.allow_lost_acks {
                        violations.push(format!(
                            "{sku} {id}: replies say {exp:?}, Redis holds {actual:?} (acknowledged change lost)"
                        ));
                    }
                } else {
                    violations.push(format!(
                        "{sku} {id}: replies say {exp:?}, Redis holds {actual:?}"
                    ));
                }
            }
            // Never settled (reported above): any state a send could cause.
            None => {
                if !(actual == State::None
                    || (actual == State::Deducted && sent_deduct)
                    || (actual == State::Revoked && sent_revert))
                {
                    violations.push(format!("{sku} {id}: unsettled, yet Redis holds {actual:?}"));
                }
            }
        }
        if expected.as_deref() == Some(&[State::Deducted]) {
            units_acked += qty as i64;
        }
        if lost_here {
            lost_acks += 1;
        }
    }

    // Records nobody asked for.
    for (sku, id) in state.records.keys() {
        let request_id = id.strip_prefix(LINE_PREFIX).unwrap_or(id);
        let asked = by_id
            .get(request_id)
            .is_some_and(|a| a[0].op.is_order() == id.starts_with(LINE_PREFIX));
        if !asked {
            violations.push(format!("{sku} {id}: a record for a request_id never sent"));
        }
    }

    // Conservation, the hold books and no negative stock, per sku.
    let mut units_taken = 0;
    let mut units_recorded = 0;
    for sku in &w.skus {
        let recorded = units_recorded_by_sku
            .get(sku.as_str())
            .copied()
            .unwrap_or(0);
        violations.extend(state.books(sku, w.initial_stock, recorded));
        if let Some(stock) = state.stock.get(sku) {
            units_taken += w.initial_stock - stock;
        }
        units_recorded += recorded;
    }

    Audit {
        name: w.name.clone(),
        violations,
        lost_acks,
        requests: history.attempts.len(),
        ids: by_id.len(),
        retries: history.attempts.iter().filter(|a| a.retry > 0).count(),
        by_label: history.by_label(history.attempts.iter()),
        units_acked,
        units_taken,
        units_recorded,
        units_held,
        units_confirmed,
        holds_expired,
        holds_due,
        orders,
        orders_applied,
        orders_undone,
        orders_left,
        left_applied,
        left_undone,
        unsettled: history.unsettled.len(),
        samples: history
            .attempts
            .iter()
            .filter_map(|a| match &a.outcome {
                Outcome::Fault { word, text } => {
                    Some((a.outcome.label(), format!("-{word} {text}")))
                }
                _ => None,
            })
            .collect(),
    }
}
