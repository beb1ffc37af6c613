//! Metric names, labels, buckets, and the Prometheus text they render to.
//!
//! This module is the one place that names a metric. No sku, request_id
//! or order_no is ever a label: labels are drawn from small fixed sets.
//!
//! Each server owns its recorder (not the process-global one), so several
//! servers in one process, as in the tests, keep separate counts. Every
//! series is registered up front: counters show 0 from the first scrape,
//! and recording a request touches a pre-resolved handle, not a registry.

use crate::error::FaultKind;
use crate::outcome::{Code, HoldEvent};
use crate::script::FunctionCommand;
use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const REQUESTS_TOTAL: &str = "stockgate_requests_total";
pub const REQUEST_DURATION: &str = "stockgate_request_duration_seconds";
pub const UPSTREAM_ERRORS_TOTAL: &str = "stockgate_upstream_errors_total";
pub const CLIENT_CONNECTIONS: &str = "stockgate_client_connections";
pub const UPSTREAM_DURATION: &str = "stockgate_upstream_duration_seconds";
pub const UPSTREAM_READY: &str = "stockgate_upstream_ready";
pub const AUTH_FAILURES_TOTAL: &str = "stockgate_auth_failures_total";
pub const AUTH_DELAYED_TOTAL: &str = "stockgate_auth_delayed_total";
pub const COMMANDS_DENIED_TOTAL: &str = "stockgate_commands_denied_total";
pub const USERS_RELOADS_TOTAL: &str = "stockgate_users_reloads_total";
pub const USERS: &str = "stockgate_users";
pub const TLS_RELOADS_TOTAL: &str = "stockgate_tls_reloads_total";
pub const UPSTREAM_READY_CHANGES_TOTAL: &str = "stockgate_upstream_ready_changes_total";
pub const BUILD_INFO: &str = "stockgate_build_info";
pub const HOLDS_TOTAL: &str = "stockgate_holds_total";
pub const HOLD_HELD: &str = "stockgate_hold_held_seconds";
pub const SWEEPS_TOTAL: &str = "stockgate_sweeps_total";
pub const SOLD_OUT_READS_TOTAL: &str = "stockgate_sold_out_reads_total";
pub const ALLOCATIONS_TOTAL: &str = "stockgate_allocations_total";
pub const ALLOCATION_SPLITS_TOTAL: &str = "stockgate_allocation_splits_total";
pub const COALESCED_CALLS_TOTAL: &str = "stockgate_coalesced_calls_total";
pub const COALESCED_DEDUCTS_TOTAL: &str = "stockgate_coalesced_deducts_total";
pub const ORDER_RECOVERIES_TOTAL: &str = "stockgate_order_recoveries_total";
pub const JOURNALS_OPENED_TOTAL: &str = "stockgate_journal_opened_total";
pub const FUNCTION_REFUSALS_TOTAL: &str = "stockgate_function_refusals_total";
/// `stockgate journal sink`'s own series ([`JournalMetrics`]).
pub const JOURNAL_ENTRIES_MOVED_TOTAL: &str = "stockgate_journal_entries_moved_total";
pub const JOURNAL_LAG_SECONDS: &str = "stockgate_journal_lag_seconds";
pub const JOURNAL_LAG_ENTRIES: &str = "stockgate_journal_lag_entries";
pub const JOURNAL_BATCH_DURATION: &str = "stockgate_journal_batch_duration_seconds";
pub const JOURNAL_CONFLICTS_TOTAL: &str = "stockgate_journal_conflicts_total";
pub const JOURNAL_SHARDS_OWNED: &str = "stockgate_journal_shards_owned";
pub const JOURNAL_FAULTS_TOTAL: &str = "stockgate_journal_faults_total";
pub const JOURNAL_UNREPLICATED_TOTAL: &str = "stockgate_journal_unreplicated_total";

/// Latency buckets, in seconds: fine below a millisecond, where a healthy
/// DEDUCT lands, and up to the longest sensible --timeout.
const DURATION_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
];

/// How long holds are held before their CONFIRM, in seconds: from a
/// customer who pays at once to a day-long hold.
const HELD_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 86_400.0,
];

/// A command whose requests are counted: the stock commands, each
/// described in its own file ([`crate::stock::StockCommand`]). The
/// metrics read from it the `command` label and the codes it can answer:
/// a series for each and no other, since a series for a code it never
/// gives would be a permanent 0 that a dashboard or an alert could only
/// misread.
pub trait Metered: Copy + 'static {
    /// Every such command; [`Metered::index`] is its place here.
    const ALL: &'static [Self];
    fn index(self) -> usize;
    /// Its `command` label.
    fn label(self) -> &'static str;
    /// The business codes it can answer; none for a command that gets no
    /// request metrics (it is not a call on request ids).
    fn answers(self) -> &'static [Code];
}

/// A latency histogram of [`DURATION_BUCKETS`], kept as one atomic count
/// per bucket and a sum: a request's two are recorded on every answer,
/// and the exporter's own histograms keep every sample until the next
/// upkeep folds them in, which cost a request about 500 instructions
/// (callgrind). Rendered beside the exporter's series
/// ([`Metrics::render`]), in the same format.
struct Buckets {
    /// The series' labels, as written between the braces.
    labels: String,
    /// Samples at most each bound (not cumulative), then above the last.
    counts: [AtomicU64; DURATION_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// [`DURATION_BUCKETS`] in nanoseconds.
const DURATION_NANOS: [u64; DURATION_BUCKETS.len()] = {
    let mut nanos = [0; DURATION_BUCKETS.len()];
    let mut i = 0;
    while i < nanos.len() {
        nanos[i] = (DURATION_BUCKETS[i] * 1e9) as u64;
        i += 1;
    }
    nanos
};

impl Buckets {
    fn new(labels: String) -> Buckets {
        Buckets {
            labels,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }

    #[inline]
    fn record(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = DURATION_NANOS.partition_point(|&bound| bound < nanos);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// `series` of histogram `name` in the text exposition format.
    fn render<'a>(
        text: &mut String,
        name: &str,
        help: &str,
        series: impl Iterator<Item = &'a Buckets>,
    ) {
        use std::fmt::Write;
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} histogram");
        for buckets in series {
            let labels = &buckets.labels;
            let mut seen = 0;
            for (i, count) in buckets.counts.iter().enumerate() {
                seen += count.load(Ordering::Relaxed);
                let le = match DURATION_BUCKETS.get(i) {
                    Some(bound) => bound.to_string(),
                    None => "+Inf".to_string(),
                };
                let _ = writeln!(text, "{name}_bucket{{{labels},le=\"{le}\"}} {seen}");
            }
            let sum = buckets.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            let _ = writeln!(text, "{name}_sum{{{labels}}} {sum}");
            let _ = writeln!(text, "{name}_count{{{labels}}} {seen}");
        }
        text.push('\n');
    }
}

/// Whether a command that answers `answers` has a series for `result`: a
/// metered command for each code it can answer, and for faults.
fn has_series(answers: &[Code], result: ResultLabel) -> bool {
    !answers.is_empty()
        && match result {
            ResultLabel::Code(code) => answers.contains(&code),
            ResultLabel::Error => true,
        }
}

/// The `result` label: a business code, or `error` for any system fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultLabel {
    Code(Code),
    Error,
}

impl ResultLabel {
    const COUNT: usize = Code::ALL.len() + 1;

    fn all() -> impl Iterator<Item = ResultLabel> {
        Code::ALL
            .into_iter()
            .map(ResultLabel::Code)
            .chain([ResultLabel::Error])
    }

    fn index(self) -> usize {
        match self {
            ResultLabel::Code(code) => code as usize,
            ResultLabel::Error => Code::ALL.len(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ResultLabel::Code(code) => code.label(),
            ResultLabel::Error => "error",
        }
    }
}

struct RequestSeries {
    total: Counter,
    /// `None` for a series never exported.
    duration: Option<Buckets>,
    /// The same count, readable: INFO reports it.
    count: AtomicU64,
}

/// Requests since start: answered with a business code (Redis ran the
/// script), and faults a retry may get past (Redis unreachable, slow,
/// refusing, or answering what stockgate can't read; not the data's
/// faults, which say nothing about the upstream's health).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    pub answered: u64,
    pub faults: u64,
}

/// Every series stockgate exports, resolved once.
pub struct Metrics {
    handle: PrometheusHandle,
    /// The metered commands' labels and codes, by [`Metered::index`].
    commands: Vec<(&'static str, &'static [Code])>,
    requests: Vec<[RequestSeries; ResultLabel::COUNT]>,
    upstream_errors: Vec<(Counter, AtomicU64)>,
    /// Time Redis took per script call, by command (the part of a
    /// request's latency stockgate doesn't add).
    upstream_durations: Vec<Option<Buckets>>,
    client_connections: Gauge,
    /// Client connections closed since start: the upkeep task hands freed
    /// memory back only when some closed (see `server::upkeep`).
    disconnects: AtomicU64,
    upstream_ready: Gauge,
    upstream_ready_changes: Counter,
    /// Kept to register the series of users, which a reload can add.
    recorder: PrometheusRecorder,
    meta: Metadata<'static>,
    auth_delayed: Counter,
    /// Reloads of the users file, applied and refused.
    users_reloads: [Counter; 2],
    users: Gauge,
    /// Reloads of the listeners' TLS files, applied and refused.
    tls_reloads: [Counter; 2],
    /// Holds by what happened to them, in [`HoldEvent::ALL`]'s order.
    holds: Vec<(Counter, AtomicU64)>,
    held: Histogram,
    /// The sweeper's passes, by whether it could finish them.
    sweeps: [Counter; 2],
    /// DEDUCTs that read first ([`crate::stock::sold_out`]): answered from
    /// the read, or sent on to the script.
    sold_out_reads: [Counter; 2],
    /// DEDUCT.AT and HOLD.AT that took units, by policy (SPLIT, WHOLE);
    /// and those that took them from more than one location. No label per
    /// location: a shop's locations are not the metrics' to enumerate.
    allocations: [Counter; 2],
    allocation_splits: Counter,
    /// Script calls that carried several DEDUCTs ([`crate::stock::coalesce`]),
    /// and the DEDUCTs they carried.
    coalesced_calls: Counter,
    coalesced_deducts: Counter,
    /// Orders left behind that this stockgate's recovery looked at
    /// ([`crate::stock::order::recovery`]), by whether it could end them.
    order_recoveries: [Counter; 2],
    /// SKUs whose journal this stockgate opened ([`crate::stock`]'s
    /// journal: a SKU's first call with `--journal` on).
    journals_opened: Counter,
    /// Refusals of the function library that made stockgate call by
    /// EVALSHA, in [`FunctionCommand::ALL`]'s order.
    function_refusals: Vec<Counter>,
}

impl Metrics {
    /// The metrics of a stockgate serving the commands `C` lists.
    pub fn new<C: Metered>() -> Metrics {
        let commands: Vec<(&'static str, &'static [Code])> = C::ALL
            .iter()
            .map(|&command| (command.label(), command.answers()))
            .collect();
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(HOLD_HELD.into()), &HELD_BUCKETS)
            .expect("bucket list is not empty")
            .build_recorder();
        recorder.describe_counter(
            REQUESTS_TOTAL.into(),
            None,
            "Requests answered, by command and result (ok, duplicate, insufficient, invalid, revoked, expired, error).".into(),
        );
        recorder.describe_counter(
            UPSTREAM_ERRORS_TOTAL.into(),
            None,
            "System faults met while serving requests, by kind.".into(),
        );
        recorder.describe_gauge(
            CLIENT_CONNECTIONS.into(),
            None,
            "Client connections open now.".into(),
        );
        recorder.describe_gauge(
            UPSTREAM_READY.into(),
            None,
            "1 when Redis is reachable and the scripts are loaded on every primary, else 0.".into(),
        );
        let meta = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let requests = commands
            .iter()
            .map(|&(name, answers)| {
                let series = ResultLabel::all().map(|result| {
                    if !has_series(answers, result) {
                        // Kept in the table so indexing stays by code, but
                        // never registered, so never exported.
                        return RequestSeries {
                            count: AtomicU64::new(0),
                            total: Counter::noop(),
                            duration: None,
                        };
                    }
                    let labels = vec![
                        Label::new("command", name),
                        Label::new("result", result.as_str()),
                    ];
                    let total =
                        recorder.register_counter(&Key::from_parts(REQUESTS_TOTAL, labels), &meta);
                    total.increment(0);
                    RequestSeries {
                        count: AtomicU64::new(0),
                        total,
                        duration: Some(Buckets::new(format!(
                            "command=\"{name}\",result=\"{}\"",
                            result.as_str()
                        ))),
                    }
                });
                let series: Vec<RequestSeries> = series.collect();
                series
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("one series per result label"))
            })
            .collect();
        let upstream_errors = FaultKind::ALL
            .into_iter()
            .map(|kind| {
                let counter = recorder.register_counter(
                    &Key::from_parts(
                        UPSTREAM_ERRORS_TOTAL,
                        vec![Label::new("kind", kind.label())],
                    ),
                    &meta,
                );
                counter.increment(0);
                (counter, AtomicU64::new(0))
            })
            .collect();
        let upstream_durations = commands
            .iter()
            .map(|&(name, answers)| {
                // None is kept so indexing stays by command; never exported.
                (!answers.is_empty()).then(|| Buckets::new(format!("command=\"{name}\"")))
            })
            .collect();
        let client_connections =
            recorder.register_gauge(&Key::from_name(CLIENT_CONNECTIONS), &meta);
        client_connections.set(0.0);
        let upstream_ready = recorder.register_gauge(&Key::from_name(UPSTREAM_READY), &meta);
        upstream_ready.set(0.0);
        recorder.describe_counter(
            AUTH_FAILURES_TOTAL.into(),
            None,
            "Wrong passwords given by clients (AUTH, HELLO AUTH, HTTP Bearer).".into(),
        );
        recorder.describe_counter(
            AUTH_DELAYED_TOTAL.into(),
            None,
            "Failed logins answered late: their peer had failed several in a row.".into(),
        );
        let auth_delayed = recorder.register_counter(&Key::from_name(AUTH_DELAYED_TOTAL), &meta);
        auth_delayed.increment(0);
        recorder.describe_counter(
            COMMANDS_DENIED_TOTAL.into(),
            None,
            "Commands refused NOPERM: outside the user's rights or SKU prefixes, by user and command.".into(),
        );
        recorder.describe_counter(
            USERS_RELOADS_TOTAL.into(),
            None,
            "Reloads of --users-file, by result: applied, or refused (the users before stay)."
                .into(),
        );
        let users_reloads = ["applied", "refused"].map(|result| {
            let counter = recorder.register_counter(
                &Key::from_parts(USERS_RELOADS_TOTAL, vec![Label::new("result", result)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        recorder.describe_gauge(USERS.into(), None, "Users clients may log in as.".into());
        recorder.describe_counter(
            TLS_RELOADS_TOTAL.into(),
            None,
            "Reloads of the listeners' TLS certificate, key and client CA, by result: applied, or refused (the ones before stay).".into(),
        );
        let tls_reloads = ["applied", "refused"].map(|result| {
            let counter = recorder.register_counter(
                &Key::from_parts(TLS_RELOADS_TOTAL, vec![Label::new("result", result)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        let users = recorder.register_gauge(&Key::from_name(USERS), &meta);
        recorder.describe_counter(
            UPSTREAM_READY_CHANGES_TOTAL.into(),
            None,
            "Times readiness flipped; counts flaps shorter than a scrape, which the gauge can't show.".into(),
        );
        let upstream_ready_changes =
            recorder.register_counter(&Key::from_name(UPSTREAM_READY_CHANGES_TOTAL), &meta);
        upstream_ready_changes.increment(0);
        recorder.describe_gauge(
            BUILD_INFO.into(),
            None,
            "Always 1; the labels say which stockgate and which script set run here.".into(),
        );
        recorder
            .register_gauge(
                &Key::from_parts(
                    BUILD_INFO,
                    vec![
                        Label::new("version", env!("CARGO_PKG_VERSION")),
                        Label::new("script_version", crate::outcome::SCRIPT_VERSION.to_string()),
                    ],
                ),
                &meta,
            )
            .set(1.0);
        recorder.describe_counter(
            HOLDS_TOTAL.into(),
            None,
            "Holds by what happened to them: placed (HOLD), confirmed (CONFIRM), cancelled (REVERT), expired (released by Redis time, by any call or the sweeper), extended (HOLD.EXTEND), shrunk (HOLD.SHRINK gave some units back).".into(),
        );
        let holds = HoldEvent::ALL
            .into_iter()
            .map(|event| {
                let counter = recorder.register_counter(
                    &Key::from_parts(HOLDS_TOTAL, vec![Label::new("event", event.label())]),
                    &meta,
                );
                counter.increment(0);
                (counter, AtomicU64::new(0))
            })
            .collect();
        recorder.describe_histogram(
            HOLD_HELD.into(),
            Some(Unit::Seconds),
            "Time from a HOLD to its CONFIRM, in Redis time.".into(),
        );
        let held = recorder.register_histogram(&Key::from_name(HOLD_HELD), &meta);
        recorder.describe_counter(
            SWEEPS_TOTAL.into(),
            None,
            "Passes of this stockgate's hold sweeper over the shards it sweeps, by result (ok, or error when Redis failed it; the next pass tries again).".into(),
        );
        let sweeps = ["ok", "error"].map(|result| {
            let counter = recorder.register_counter(
                &Key::from_parts(SWEEPS_TOTAL, vec![Label::new("result", result)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        recorder.describe_counter(
            SOLD_OUT_READS_TOTAL.into(),
            None,
            "DEDUCTs on a sku seen short lately that read its keys first, by result (answered: the read gave the script's answer; script: the request could succeed, so the script ran).".into(),
        );
        let sold_out_reads = ["answered", "script"].map(|result| {
            let counter = recorder.register_counter(
                &Key::from_parts(SOLD_OUT_READS_TOTAL, vec![Label::new("result", result)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        recorder.describe_counter(
            ALLOCATIONS_TOTAL.into(),
            None,
            "DEDUCT.AT and HOLD.AT that took units (code 0), by policy.".into(),
        );
        let allocations = ["SPLIT", "WHOLE"].map(|policy| {
            let counter = recorder.register_counter(
                &Key::from_parts(ALLOCATIONS_TOTAL, vec![Label::new("policy", policy)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        recorder.describe_counter(
            ALLOCATION_SPLITS_TOTAL.into(),
            None,
            "DEDUCT.AT and HOLD.AT that took their units from more than one location.".into(),
        );
        let allocation_splits =
            recorder.register_counter(&Key::from_name(ALLOCATION_SPLITS_TOTAL), &meta);
        allocation_splits.increment(0);
        recorder.describe_counter(
            COALESCED_CALLS_TOTAL.into(),
            None,
            "Script calls that carried two or more DEDUCTs of one sku (--coalesce-deducts).".into(),
        );
        recorder.describe_counter(
            COALESCED_DEDUCTS_TOTAL.into(),
            None,
            "DEDUCTs that shared a script call with others of their sku; divided by stockgate_coalesced_calls_total, the mean group.".into(),
        );
        let coalesced_calls =
            recorder.register_counter(&Key::from_name(COALESCED_CALLS_TOTAL), &meta);
        coalesced_calls.increment(0);
        let coalesced_deducts =
            recorder.register_counter(&Key::from_name(COALESCED_DEDUCTS_TOTAL), &meta);
        coalesced_deducts.increment(0);
        recorder.describe_counter(
            ORDER_RECOVERIES_TOTAL.into(),
            None,
            "Orders left unfinished past their saga's time (a stockgate died, or a fault outlasted the request) that this stockgate's recovery looked at, by result (ended: at rest now; error: Redis failed it, tried again later).".into(),
        );
        let order_recoveries = ["ended", "error"].map(|result| {
            let counter = recorder.register_counter(
                &Key::from_parts(ORDER_RECOVERIES_TOTAL, vec![Label::new("result", result)]),
                &meta,
            );
            counter.increment(0);
            counter
        });
        recorder.describe_counter(
            JOURNALS_OPENED_TOTAL.into(),
            None,
            "SKUs whose journal this stockgate listed and made (with --journal, a SKU's first change; the call that found no journal went again).".into(),
        );
        let journals_opened =
            recorder.register_counter(&Key::from_name(JOURNALS_OPENED_TOTAL), &meta);
        journals_opened.increment(0);
        recorder.describe_counter(
            FUNCTION_REFUSALS_TOTAL.into(),
            None,
            "Times a primary refused stockgate the function library (an ACL's NOPERM, a server without FUNCTION) and scripts went to be called by EVALSHA, by the command refused (function_list, function_load, fcall); each refusal counts once, not at every check that meets it again.".into(),
        );
        let function_refusals = FunctionCommand::ALL
            .into_iter()
            .map(|command| {
                let counter = recorder.register_counter(
                    &Key::from_parts(
                        FUNCTION_REFUSALS_TOTAL,
                        vec![Label::new("command", command.label())],
                    ),
                    &meta,
                );
                counter.increment(0);
                counter
            })
            .collect();
        Metrics {
            function_refusals,
            handle: recorder.handle(),
            commands,
            journals_opened,
            coalesced_calls,
            coalesced_deducts,
            order_recoveries,
            holds,
            held,
            sweeps,
            sold_out_reads,
            allocations,
            allocation_splits,
            requests,
            upstream_errors,
            upstream_durations,
            client_connections,
            disconnects: AtomicU64::new(0),
            upstream_ready,
            upstream_ready_changes,
            auth_delayed,
            users_reloads,
            users,
            tls_reloads,
            meta,
            recorder,
        }
    }

    /// Counts one answered request and its latency.
    pub fn record_request(&self, command: impl Metered, result: ResultLabel, elapsed: Duration) {
        let series = &self.requests[command.index()][result.index()];
        series.total.increment(1);
        series.count.fetch_add(1, Ordering::Relaxed);
        if let Some(duration) = &series.duration {
            duration.record(elapsed);
        }
    }

    /// Counts `n` holds that met `event`.
    pub fn record_holds(&self, event: HoldEvent, n: u64) {
        let index = HoldEvent::ALL
            .iter()
            .position(|e| *e == event)
            .expect("every event is registered");
        let (counter, count) = &self.holds[index];
        counter.increment(n);
        count.fetch_add(n, Ordering::Relaxed);
    }

    /// Holds so far, as `(event, count)`.
    pub fn hold_totals(&self) -> Vec<(&'static str, u64)> {
        HoldEvent::ALL
            .into_iter()
            .zip(&self.holds)
            .map(|(event, (_, count))| (event.label(), count.load(Ordering::Relaxed)))
            .collect()
    }

    /// How long a confirmed hold was held.
    pub fn record_held(&self, held: Duration) {
        self.held.record(held.as_secs_f64());
    }

    /// One DEDUCT's read ([`crate::stock::sold_out`]): answered by it, or
    /// sent on to the script.
    pub fn record_sold_out_read(&self, answered: bool) {
        self.sold_out_reads[usize::from(!answered)].increment(1);
    }

    /// One allocation that took units (`split`: from several locations).
    pub fn record_allocation(&self, policy: crate::params::Policy, split: bool) {
        let index = match policy {
            crate::params::Policy::Split => 0,
            crate::params::Policy::Whole => 1,
        };
        self.allocations[index].increment(1);
        if split {
            self.allocation_splits.increment(1);
        }
    }

    /// One script call that carried `deducts` DEDUCTs.
    pub fn record_coalesced(&self, deducts: usize) {
        self.coalesced_calls.increment(1);
        self.coalesced_deducts.increment(deducts as u64);
    }

    /// One order left behind, ended or not (yet).
    pub fn record_order_recovery(&self, ended: bool) {
        self.order_recoveries[usize::from(!ended)].increment(1);
    }

    /// A SKU's journal opened (listed and made).
    pub fn record_journal_opened(&self) {
        self.journals_opened.increment(1);
    }

    /// A refusal of the function library, newly met.
    pub fn record_function_refusal(&self, command: FunctionCommand) {
        let index = FunctionCommand::ALL
            .iter()
            .position(|c| *c == command)
            .expect("every command is registered");
        self.function_refusals[index].increment(1);
    }

    /// One pass of the sweeper, finished or failed.
    pub fn record_sweep(&self, ok: bool) {
        self.sweeps[usize::from(!ok)].increment(1);
    }

    pub fn record_upstream_error(&self, kind: FaultKind) {
        let index = FaultKind::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("every kind is registered");
        let (counter, count) = &self.upstream_errors[index];
        counter.increment(1);
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests answered so far, as `(command, result, count)`.
    pub fn request_totals(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.commands
            .iter()
            .zip(&self.requests)
            .flat_map(|(&(name, answers), series)| {
                ResultLabel::all()
                    .filter(move |result| has_series(answers, *result))
                    .map(move |result| {
                        let series = &series[result.index()];
                        (name, result.as_str(), series.count.load(Ordering::Relaxed))
                    })
            })
            .collect()
    }

    /// How requests have fared so far, read from the counters above
    /// without a lock: the health loop's free signal of how the upstream
    /// is doing (see `upstream::health`).
    pub fn activity(&self) -> Activity {
        let answered = self
            .requests
            .iter()
            .flat_map(|series| {
                ResultLabel::all()
                    .filter(|result| *result != ResultLabel::Error)
                    .map(|result| series[result.index()].count.load(Ordering::Relaxed))
            })
            .sum();
        let faults = FaultKind::ALL
            .into_iter()
            .zip(&self.upstream_errors)
            .filter(|(kind, _)| kind.retry_may_help())
            .map(|(_, (_, count))| count.load(Ordering::Relaxed))
            .sum();
        Activity { answered, faults }
    }

    /// System faults so far, as `(kind, count)`.
    pub fn upstream_error_totals(&self) -> Vec<(&'static str, u64)> {
        FaultKind::ALL
            .into_iter()
            .zip(&self.upstream_errors)
            .map(|(kind, (_, count))| (kind.label(), count.load(Ordering::Relaxed)))
            .collect()
    }

    /// Records how long Redis took for one script call.
    pub fn record_upstream(&self, command: impl Metered, elapsed: Duration) {
        if let Some(duration) = &self.upstream_durations[command.index()] {
            duration.record(elapsed);
        }
    }

    /// Records readiness; `changed` says it flipped since the last check.
    pub fn set_upstream_ready(&self, ready: bool, changed: bool) {
        self.upstream_ready.set(if ready { 1.0 } else { 0.0 });
        if changed {
            self.upstream_ready_changes.increment(1);
        }
    }

    /// Registers the series of every user, so each shows 0 from the
    /// first scrape; a user's name is a label, and only a known user's.
    pub fn know_users<'a>(&self, names: impl Iterator<Item = &'a str>) {
        let mut count = 0;
        for name in names {
            self.user_counter(AUTH_FAILURES_TOTAL, name).increment(0);
            count += 1;
        }
        self.users.set(count as f64);
    }

    fn user_counter(&self, metric: &'static str, user: &str) -> Counter {
        self.recorder.register_counter(
            &Key::from_parts(metric, vec![Label::new("user", user.to_owned())]),
            &self.meta,
        )
    }

    /// A failed login; `user` when it named a known user, else counted
    /// under `user=""` (a name a client makes up is never a label).
    pub fn auth_failed(&self, user: Option<&str>) {
        self.user_counter(AUTH_FAILURES_TOTAL, user.unwrap_or(""))
            .increment(1);
    }

    /// A failed login answered late ([`crate::auth::throttle`]).
    pub fn auth_delayed(&self) {
        self.auth_delayed.increment(1);
    }

    /// A command refused NOPERM.
    pub fn command_denied(&self, user: &str, command: &'static str) {
        self.recorder
            .register_counter(
                &Key::from_parts(
                    COMMANDS_DENIED_TOTAL,
                    vec![
                        Label::new("user", user.to_owned()),
                        Label::new("command", command),
                    ],
                ),
                &self.meta,
            )
            .increment(1);
    }

    /// A reload of the listeners' TLS files, applied or refused.
    pub fn tls_reloaded(&self, applied: bool) {
        self.tls_reloads[usize::from(!applied)].increment(1);
    }

    /// A reload of the users file, applied or refused.
    pub fn users_reloaded(&self, applied: bool) {
        self.users_reloads[usize::from(!applied)].increment(1);
    }

    pub fn client_connected(&self) {
        self.client_connections.increment(1.0);
    }

    pub fn client_disconnected(&self) {
        self.client_connections.decrement(1.0);
        self.disconnects.fetch_add(1, Ordering::Relaxed);
    }

    /// Client connections closed since start.
    pub fn disconnects(&self) -> u64 {
        self.disconnects.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut text = self.handle.render();
        let request = self
            .requests
            .iter()
            .flat_map(|series| series.iter().filter_map(|s| s.duration.as_ref()));
        Buckets::render(
            &mut text,
            REQUEST_DURATION,
            "Time from a request's arrival to its reply, by command and result.",
            request,
        );
        Buckets::render(
            &mut text,
            UPSTREAM_DURATION,
            "Time Redis took to answer one script call (retries and redirects included), by command.",
            self.upstream_durations.iter().flatten(),
        );
        text
    }

    /// Folds recorded histogram samples into buckets. Runs every few
    /// seconds so memory stays flat between scrapes.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }
}

/// Where a fault of the journal's sink came from: its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalSource {
    Redis,
    Database,
    /// An entry the sink cannot read (a newer format, a corrupt field).
    Data,
}

impl JournalSource {
    pub const ALL: [JournalSource; 3] = [
        JournalSource::Redis,
        JournalSource::Database,
        JournalSource::Data,
    ];

    pub fn label(self) -> &'static str {
        match self {
            JournalSource::Redis => "redis",
            JournalSource::Database => "database",
            JournalSource::Data => "data",
        }
    }
}

/// Batch latency buckets, in seconds: one PostgreSQL transaction of up to
/// a few thousand rows, and the trims after it.
const BATCH_BUCKETS: [f64; 12] = [
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The series of `stockgate journal sink`, a process of its own with its
/// own `/metrics` (a recorder of its own, as [`Metrics`]).
pub struct JournalMetrics {
    handle: PrometheusHandle,
    moved: Counter,
    lag_seconds: Gauge,
    lag_entries: Gauge,
    batch: Histogram,
    conflicts: Counter,
    shards: Gauge,
    faults: [Counter; 3],
    unreplicated: Counter,
}

impl JournalMetrics {
    pub fn new() -> JournalMetrics {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(JOURNAL_BATCH_DURATION.into()), &BATCH_BUCKETS)
            .expect("bucket list is not empty")
            .build_recorder();
        let meta = Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let counter = |name: &'static str, help: &'static str| {
            recorder.describe_counter(name.into(), None, help.into());
            let counter = recorder.register_counter(&Key::from_name(name), &meta);
            counter.increment(0);
            counter
        };
        let moved = counter(
            JOURNAL_ENTRIES_MOVED_TOTAL,
            "Journal entries this sink committed to PostgreSQL (re-deliveries, already there, not counted).",
        );
        let conflicts = counter(
            JOURNAL_CONFLICTS_TOTAL,
            "Entries whose id was already in the database with other content (a failover lost the first); kept in stockgate_journal_conflicts. Never 0 for a good reason: look.",
        );
        let unreplicated = counter(
            JOURNAL_UNREPLICATED_TOTAL,
            "Reads of a SKU's journal left for a later round because fewer replicas than --wait-replicas confirmed them.",
        );
        let gauge = |name: &'static str, help: &'static str| {
            recorder.describe_gauge(name.into(), None, help.into());
            let gauge = recorder.register_gauge(&Key::from_name(name), &meta);
            gauge.set(0.0);
            gauge
        };
        let lag_seconds = gauge(
            JOURNAL_LAG_SECONDS,
            "Age of the oldest entry not yet in the database, in this sink's shards, at its last round (Redis time of the entry against this host's clock); while rounds fail or leave shards unread, it grows from the last round that read them all.",
        );
        let lag_entries = gauge(
            JOURNAL_LAG_ENTRIES,
            "Entries still in Redis's journals of this sink's shards at its last round.",
        );
        let shards = gauge(
            JOURNAL_SHARDS_OWNED,
            "Sweep shards whose journals this sink moves now (16 in all, shared among the sinks).",
        );
        recorder.describe_histogram(
            JOURNAL_BATCH_DURATION.into(),
            Some(Unit::Seconds),
            "Time of one batch: its PostgreSQL transaction and the trims after its commit.".into(),
        );
        let batch = recorder.register_histogram(&Key::from_name(JOURNAL_BATCH_DURATION), &meta);
        recorder.describe_counter(
            JOURNAL_FAULTS_TOTAL.into(),
            None,
            "Rounds of the sink cut short by a fault, by source (redis, database, data); the sink retries.".into(),
        );
        let faults = JournalSource::ALL.map(|source| {
            let counter = recorder.register_counter(
                &Key::from_parts(
                    JOURNAL_FAULTS_TOTAL,
                    vec![Label::new("source", source.label())],
                ),
                &meta,
            );
            counter.increment(0);
            counter
        });
        JournalMetrics {
            handle: recorder.handle(),
            moved,
            lag_seconds,
            lag_entries,
            batch,
            conflicts,
            shards,
            faults,
            unreplicated,
        }
    }

    /// A committed batch: how many entries were new, how long it took.
    pub fn record_batch(&self, moved: u64, elapsed: Duration) {
        self.moved.increment(moved);
        self.batch.record(elapsed.as_secs_f64());
    }

    pub fn record_conflicts(&self, n: u64) {
        self.conflicts.increment(n);
    }

    pub fn record_unreplicated(&self) {
        self.unreplicated.increment(1);
    }

    pub fn record_fault(&self, source: JournalSource) {
        self.faults[source as usize].increment(1);
    }

    pub fn set_lag(&self, entries: u64, oldest: Duration) {
        self.lag_entries.set(entries as f64);
        self.lag_seconds.set(oldest.as_secs_f64());
    }

    /// The lag's age alone, when a round could not count the entries.
    pub fn set_lag_seconds(&self, oldest: Duration) {
        self.lag_seconds.set(oldest.as_secs_f64());
    }

    pub fn set_shards(&self, owned: usize) {
        self.shards.set(owned as f64);
    }

    pub fn render(&self) -> String {
        self.handle.render()
    }

    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }
}

impl Default for JournalMetrics {
    fn default() -> Self {
        JournalMetrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two commands as the stock service describes DEDUCT and REVERT.
    #[derive(Debug, Clone, Copy)]
    enum StockCommand {
        Deduct,
        Revert,
    }

    impl Metered for StockCommand {
        const ALL: &'static [StockCommand] = &[StockCommand::Deduct, StockCommand::Revert];

        fn index(self) -> usize {
            self as usize
        }

        fn label(self) -> &'static str {
            match self {
                StockCommand::Deduct => "deduct",
                StockCommand::Revert => "revert",
            }
        }

        fn answers(self) -> &'static [Code] {
            match self {
                StockCommand::Deduct => &[
                    Code::Ok,
                    Code::Duplicate,
                    Code::Insufficient,
                    Code::Invalid,
                    Code::Revoked,
                ],
                StockCommand::Revert => &[Code::Ok, Code::Duplicate, Code::Invalid, Code::Revoked],
            }
        }
    }

    #[test]
    fn every_series_exists_from_the_start() {
        let metrics = Metrics::new::<StockCommand>();
        let text = metrics.render();
        for command in ["deduct", "revert"] {
            for result in [
                "ok",
                "duplicate",
                "insufficient",
                "invalid",
                "revoked",
                "error",
            ] {
                let line = format!(
                    "stockgate_requests_total{{command=\"{command}\",result=\"{result}\"}} 0"
                );
                if (command, result) == ("revert", "insufficient") {
                    // REVERT has no code 2: no series that can only be 0.
                    let series = line.trim_end_matches(" 0");
                    assert!(!text.contains(series), "{series} in\n{text}");
                } else {
                    assert!(text.contains(&line), "missing {line} in\n{text}");
                }
            }
        }
        assert!(text.contains("stockgate_upstream_errors_total{kind=\"timeout\"} 0"));
        assert!(text.contains("stockgate_client_connections 0"));
    }

    #[test]
    fn activity_counts_answers_and_the_faults_a_retry_may_get_past() {
        let metrics = Metrics::new::<StockCommand>();
        assert_eq!(metrics.activity(), Activity::default());
        let elapsed = Duration::from_micros(80);
        for code in [Code::Ok, Code::Insufficient, Code::Revoked] {
            metrics.record_request(StockCommand::Deduct, ResultLabel::Code(code), elapsed);
        }
        metrics.record_request(StockCommand::Revert, ResultLabel::Code(Code::Ok), elapsed);
        for kind in [
            FaultKind::Timeout,
            FaultKind::WritesRefused,
            FaultKind::UnknownSku,
        ] {
            metrics.record_request(StockCommand::Deduct, ResultLabel::Error, elapsed);
            metrics.record_upstream_error(kind);
        }
        // The unknown sku is the data's fault: it says nothing about Redis.
        assert_eq!(
            metrics.activity(),
            Activity {
                answered: 4,
                faults: 2
            }
        );
    }

    #[test]
    fn a_request_lands_in_its_series_and_a_sub_millisecond_bucket() {
        let metrics = Metrics::new::<StockCommand>();
        metrics.record_request(
            StockCommand::Deduct,
            ResultLabel::Code(Code::Duplicate),
            Duration::from_micros(80),
        );
        let text = metrics.render();
        assert!(
            text.contains("stockgate_requests_total{command=\"deduct\",result=\"duplicate\"} 1")
        );
        assert!(text.contains(
            "stockgate_request_duration_seconds_bucket{command=\"deduct\",result=\"duplicate\",le=\"0.0001\"} 1"
        ), "{text}");
        assert!(text.contains(
            "stockgate_request_duration_seconds_bucket{command=\"deduct\",result=\"duplicate\",le=\"0.00005\"} 0"
        ), "{text}");
    }
}
