//! What the load sent and got: every attempt and its outcome, the steps
//! that never settled, the orders left after an error, and the figures the
//! reports draw from them (latency, counts by outcome, error spans).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Deduct,
    Revert,
    Hold,
    Confirm,
    Order,
    OrderHold,
    OrderConfirm,
    OrderRevert,
}

impl Op {
    /// One of the four order commands.
    pub fn is_order(self) -> bool {
        matches!(
            self,
            Op::Order | Op::OrderHold | Op::OrderConfirm | Op::OrderRevert
        )
    }
}

/// An order's lines: (sku index, qty), in the order sent.
pub type Lines = Arc<[(usize, u32)]>;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A business code.
    Code {
        code: i64,
        remain: i64,
        order_no: String,
        /// HOLD's and CONFIRM's 5th element (0 for DEDUCT and REVERT); an
        /// order reply's expires_at_ms.
        expires_at: i64,
    },
    /// An error reply: its first word (`UPSTREAM`, `BADREPLY`, ...) and text.
    Fault { word: String, text: String },
    /// The client's own timeout fired: stockgate did not answer in time.
    ClientTimeout,
    /// The connection to stockgate failed.
    ClientIo(String),
    /// A reply that is neither a code array nor an error.
    Malformed(String),
}

impl Outcome {
    pub fn is_code(&self) -> bool {
        matches!(self, Outcome::Code { .. })
    }

    pub fn code(&self) -> Option<i64> {
        match self {
            Outcome::Code { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A short label for the summary: `code 0`, `timeout`, `cluster`, ...
    pub fn label(&self) -> String {
        match self {
            Outcome::Code { code, .. } => format!("code {code}"),
            Outcome::Fault { word, text } => fault_kind(word, text).to_owned(),
            Outcome::ClientTimeout => "CLIENT TIMEOUT".into(),
            Outcome::ClientIo(_) => "CLIENT IO".into(),
            Outcome::Malformed(_) => "MALFORMED".into(),
        }
    }
}

/// The kind of an error reply, from stockgate's wording.
pub fn fault_kind(word: &str, text: &str) -> &'static str {
    let text = text.to_ascii_lowercase();
    let has = |s: &str| text.contains(s);
    match word {
        "UPSTREAM" if has("not connected") => "not_ready",
        "UPSTREAM" if has("no reply from redis within") || has("timed out") => "timeout",
        "UPSTREAM" if has("busy") => "busy",
        "UPSTREAM" if has("out of memory") => "oom",
        "UPSTREAM" if has("not replicated") => "not_replicated",
        "UPSTREAM" if has("unreachable") => "connection",
        "UPSTREAM" if has("tryagain") => "tryagain",
        "UPSTREAM" if has("clusterdown") || has("cluster is down") => "clusterdown",
        "UPSTREAM" if has("moved") || has("ask") => "redirect",
        "UPSTREAM" if has("readonly") => "readonly",
        "UPSTREAM" => "upstream_other",
        "BADREPLY" => "badreply",
        _ => "UNDOCUMENTED",
    }
}

/// One request sent, and what came back.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub client: usize,
    pub op: Op,
    /// The sku (an order's: its first line's).
    pub sku: usize,
    /// An order's lines (empty for the single-line operations).
    pub lines: Lines,
    pub id: Arc<str>,
    pub qty: u32,
    /// A HOLD's ttl_ms (0 for the other operations).
    pub ttl_ms: u32,
    /// Retries of this step before this attempt (0: the first send).
    pub retry: u32,
    pub started: Instant,
    pub took: Duration,
    pub outcome: Outcome,
}

impl Attempt {
    pub fn ended(&self) -> Instant {
        self.started + self.took
    }
}

/// A step that never got a business code.
#[derive(Debug, Clone)]
pub struct Unsettled {
    pub op: Op,
    pub sku: usize,
    pub id: Arc<str>,
}

/// An order its caller left after an error, never to send it again.
#[derive(Debug, Clone)]
pub struct Left {
    /// The step whose attempt failed.
    pub op: Op,
    pub id: Arc<str>,
    /// When that attempt ended.
    pub at: Instant,
}

/// Everything the load sent and got.
pub struct History {
    pub workload: Workload,
    pub started: Instant,
    /// `started` on the wall clock, in ms since the epoch: Redis's TIME on
    /// this host, for comparing with a hold's expiry.
    pub started_unix_ms: i64,
    /// Every attempt, by start time.
    pub attempts: Vec<Attempt>,
    pub unsettled: Vec<Unsettled>,
    /// The orders left after an error by callers that never retry, by
    /// when.
    pub left: Vec<Left>,
}

/// Latency figures of a set of attempts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={} p99={} max={}",
            self.count,
            crate::harness::ms(self.p50),
            crate::harness::ms(self.p99),
            crate::harness::ms(self.max)
        )
    }
}

impl History {
    /// `t` on the wall clock, ms since the epoch.
    pub fn unix_ms(&self, t: Instant) -> i64 {
        if t >= self.started {
            self.started_unix_ms + (t - self.started).as_millis() as i64
        } else {
            self.started_unix_ms - (self.started - t).as_millis() as i64
        }
    }

    pub fn sku_name(&self, sku: usize) -> &str {
        &self.workload.skus[sku]
    }

    /// The attempts on skus for which `on` holds.
    pub fn on<'a>(
        &'a self,
        on: impl Fn(&str) -> bool + 'a,
    ) -> impl Iterator<Item = &'a Attempt> + 'a {
        self.attempts
            .iter()
            .filter(move |a| on(&self.workload.skus[a.sku]))
    }

    /// The first attempt that got a code and ended at or after `after`.
    pub fn first_code_after<'a>(
        &'a self,
        after: Instant,
        on: impl Fn(&str) -> bool + 'a,
    ) -> Option<&'a Attempt> {
        self.on(on)
            .filter(|a| a.outcome.is_code() && a.ended() >= after)
            .min_by_key(|a| a.ended())
    }

    /// The last attempt that got a code and ended before `before`.
    pub fn last_code_before<'a>(
        &'a self,
        before: Instant,
        on: impl Fn(&str) -> bool + 'a,
    ) -> Option<&'a Attempt> {
        self.on(on)
            .filter(|a| a.outcome.is_code() && a.ended() < before)
            .max_by_key(|a| a.ended())
    }

    /// Latency of the attempts that `keep` selects.
    pub fn latency<'a>(&self, attempts: impl Iterator<Item = &'a Attempt>) -> Latency {
        let mut took: Vec<Duration> = attempts.map(|a| a.took).collect();
        took.sort_unstable();
        let at = |q: f64| {
            took.get(((took.len() as f64 * q) as usize).min(took.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Latency {
            count: took.len(),
            p50: at(0.50),
            p99: at(0.99),
            max: took.last().copied().unwrap_or_default(),
        }
    }

    /// Counts by outcome label.
    pub fn by_label<'a>(
        &self,
        attempts: impl Iterator<Item = &'a Attempt>,
    ) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for a in attempts {
            *counts.entry(a.outcome.label()).or_default() += 1;
        }
        counts
    }

    /// Each error kind: how many, and when the first and the last ended,
    /// relative to `origin`.
    pub fn error_spans(&self, origin: Instant) -> String {
        let mut spans: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        for a in self.attempts.iter().filter(|a| !a.outcome.is_code()) {
            let at = if a.ended() >= origin {
                (a.ended() - origin).as_secs_f64()
            } else {
                -(origin - a.ended()).as_secs_f64()
            } * 1000.0;
            let span = spans.entry(a.outcome.label()).or_insert((0, at, at));
            span.0 += 1;
            span.1 = span.1.min(at);
            span.2 = span.2.max(at);
        }
        let parts: Vec<String> = spans
            .iter()
            .map(|(k, (n, lo, hi))| format!("{k}={n} [{lo:+.0}..{hi:+.0} ms]"))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// Seconds since the load started, for the reports.
    pub fn at(&self, t: Instant) -> String {
        format!(
            "t+{:.3}s",
            t.saturating_duration_since(self.started).as_secs_f64()
        )
    }
}
