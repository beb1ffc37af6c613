//! Health, in the background: connect, load the scripts on every
//! primary, keep readiness (and `/readyz`) truthful and the node pipes'
//! slot table current, replace a connection a call timed out on (within a
//! [`TICK`]) and a cluster connection that stays stuck, and warn about a
//! risky eviction policy.
//!
//! All of it at a cost a fleet can carry. Every sidecar's background
//! commands add up on the shared cluster (at one full check a second, an
//! idle sidecar in front of 3 primaries sent 16 commands a second, so a
//! fleet of 1,000 sent 16,000), so the loop spends commands only where a
//! signal says they are needed, and reads the free signals often:
//!
//! - a MOVED seen on the hot path ([`crate::pipeline::Pipelines::is_stale`])
//!   rebuilds the slot table within [`TICK`];
//! - a fault a retry may get past (a timeout, a lost connection, a refusal;
//!   [`crate::metrics::Metrics::activity`]) brings the full check forward,
//!   and while not ready it runs every [`RECHECK`], as it always did;
//! - ready and quiet: one CLUSTER SLOTS every [`PROBE`] proves the cluster
//!   answers and keeps the slot table from drifting, unless requests were
//!   answered meanwhile without a fault, which prove as much for free; the
//!   scripts are checked every [`SCRIPTS`], one SCRIPT EXISTS per primary
//!   (a NOSCRIPT on the hot path is recovered inline anyway), and with it
//!   the function library, one FUNCTION LIST of its name per primary (and
//!   a FUNCTION LOAD where it is missing); a `Function not found` on the
//!   hot path loads it again within a [`TICK`] ([`Upstream::ensure_library`]).
//!
//! So an idle sidecar sends 0.2 + 6/60 = 0.3 commands a second to 3
//! primaries (`tests/upstream.rs` counts them in the servers'
//! commandstats), and `/readyz` still turns 503 within a check of a
//! failing request, or within [`PROBE`] plus `--timeout` when idle.
//!
//! Each read of the topology also tells, with `--wait-replicas`, which
//! primaries have fewer replicas than asked (CLUSTER SLOTS lists them; a
//! standalone primary is asked with one ROLE), so that a write there
//! through the redis crate fails fast instead of blocking its connection
//! on WAIT ([`Upstream::replicas_short`]). A `not replicated` answer is a
//! fault, so while writes get it the topology is read again every
//! [`RECHECK`]: a replica that comes back is seen within about a second.

use super::connect::Connection;
use super::{Mode, Node, Upstream};
use crate::config::ScriptCalls;
use crate::error::{ErrorCode, FaultKind, UpstreamError};
use crate::metrics::Activity;
use crate::script::{Calling, FunctionCommand, Library};
use redis::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the loop reads its free signals: no command is sent for it.
const TICK: Duration = Duration::from_millis(100);

/// The full check (scripts on every primary, then the topology) while not
/// ready, and after a fault: at most this often.
const RECHECK: Duration = Duration::from_secs(1);

/// Ready: how often one CLUSTER SLOTS proves the cluster answers, when no
/// answered request has proved it meanwhile. (Standalone: one SCRIPT
/// EXISTS, which proves as much and checks the scripts too.)
const PROBE: Duration = Duration::from_secs(5);

/// Ready: how often the scripts are checked on every primary.
const SCRIPTS: Duration = Duration::from_secs(60);

/// A stale slot table (a MOVED on the hot path) is rebuilt at most this
/// often, so a slot migration's burst of MOVED costs a few CLUSTER SLOTS.
const STALE_REFRESH: Duration = Duration::from_millis(250);

/// How long a cluster connection may fail its health checks before a fresh
/// one is tried in its place (see [`Upstream::maintain`]).
const REPLACE_AFTER: Duration = Duration::from_secs(5);

/// The wait before replacing a connection given up, after a replacement
/// that failed or that was itself given up before it answered anything...
const REPLACE_FIRST: Duration = Duration::from_millis(250);
/// ...doubling each time, up to this.
const REPLACE_MOST: Duration = Duration::from_secs(8);

/// Whether a primary may evict keys stockgate needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// `noeviction`, or no memory limit at all.
    Safe(String),
    /// The policy that can evict.
    Risky(String),
}

/// Why scripts are called by EVALSHA rather than FCALL of the library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ByEval {
    /// `--scripts eval`.
    Asked,
    /// A primary refused `command`; `text` says which primary (when known)
    /// and what it answered.
    Refused {
        command: FunctionCommand,
        text: String,
    },
}

impl ByEval {
    /// The command refused, if any: the log says a refusal once per
    /// command, not again for every check that meets it.
    fn refused(why: Option<&ByEval>) -> Option<FunctionCommand> {
        match why {
            Some(ByEval::Refused { command, .. }) => Some(*command),
            _ => None,
        }
    }
}

impl std::fmt::Display for ByEval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ByEval::Asked => f.write_str("--scripts eval"),
            ByEval::Refused { text, .. } => f.write_str(text),
        }
    }
}

/// What the loop remembers between ticks.
struct Schedule {
    /// The last full check, if any ran yet.
    checked: Option<Instant>,
    /// The last liveness probe (or full check, which is one too).
    probed: Instant,
    /// The last rebuild of the slot table.
    refreshed: Instant,
    /// The counters when they were last looked at by a check or probe.
    seen: Activity,
    /// Since when the cluster connection has failed every check.
    failing_since: Option<Instant>,
    /// The connection given up whose replacement failed so far, if any.
    replacing: Option<u64>,
    /// A connection given up is not replaced before then...
    replace_at: Instant,
    /// ...and the next wait, after a replacement that failed or one that
    /// was given up before it answered anything.
    replace_backoff: Duration,
}

impl Upstream {
    /// Connects, loads the scripts, and keeps readiness and the slot table
    /// up to date until `stop` is cancelled (the schedule is in the module
    /// docs).
    ///
    /// A cluster connection that has failed every check for
    /// [`REPLACE_AFTER`] is replaced by a fresh one, if a fresh one works:
    /// after every node went down and came back, redis-rs's cluster client
    /// can stay stuck answering "No connections found" for good (its slot
    /// refresh retries its own emptied connection map and never goes back
    /// to the seeds), so stockgate would never serve again without a
    /// restart (tests/faults network::whole_upstream_down_then_back, long
    /// variant, about one outage in twenty).
    pub async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let now = Instant::now();
        let mut schedule = Schedule {
            checked: None,
            probed: now,
            refreshed: now,
            seen: self.metrics.activity(),
            failing_since: None,
            replacing: None,
            replace_at: now,
            replace_backoff: REPLACE_FIRST,
        };
        loop {
            self.tick(&mut schedule).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }

    /// One look at the signals, and the one piece of work they call for.
    async fn tick(&self, schedule: &mut Schedule) {
        if self.replace_given_up(schedule).await {
            return;
        }
        if self.recheck.swap(false, Ordering::Relaxed) {
            // A call was refused FCALL and went by EVALSHA: the check
            // learns where, and says so (not ready, with --scripts function).
            self.full_check(schedule, self.metrics.activity()).await;
            return;
        }
        if self.is_ready() && self.library_lost.swap(false, Ordering::Relaxed) {
            // Calls meanwhile go by EVAL (src/upstream/eval.rs); this makes
            // FCALL work again on the node that lost the library. The
            // topology first: the node may be a primary new since the last
            // look (slots moved to a new shard).
            let reloaded = match self.refresh_topology().await {
                Ok(()) => {
                    schedule.refreshed = Instant::now();
                    self.ensure_library().await
                }
                Err(err) => Err(err.to_string()),
            };
            if let Err(problem) = reloaded {
                tracing::debug!(%problem, "could not load the function library again yet");
                self.library_lost.store(true, Ordering::Relaxed);
            }
            return;
        }
        let now = Instant::now();
        let activity = self.metrics.activity();
        let faults = activity.faults > schedule.seen.faults;
        let answered = activity.answered > schedule.seen.answered;
        let ready = self.is_ready();
        let check_due = match schedule.checked {
            None => true,
            Some(at) if !ready || faults => now - at >= RECHECK,
            Some(at) => now - at >= SCRIPTS,
        };
        // A pending fault waits for its check (at most RECHECK away); a
        // probe would only take its place.
        let probe_due = ready && !faults && now - schedule.probed >= PROBE;
        if check_due {
            self.full_check(schedule, activity).await;
        } else if probe_due {
            schedule.probed = now;
            schedule.seen = activity;
            if answered {
                // Requests were answered and none failed: the cluster
                // answers, and the topology has not moved under them (a
                // move would have shown as a MOVED).
                return;
            }
            if self.mode() == Some(Mode::Standalone) {
                // No topology to read: the scripts' check is the probe.
                self.full_check(schedule, activity).await;
                return;
            }
            match self.refresh_topology().await {
                Ok(()) => schedule.refreshed = now,
                // Not answering: find out now, with the full check.
                Err(_) => self.full_check(schedule, activity).await,
            }
        } else if self.pipelines.as_ref().is_some_and(|p| p.is_stale())
            && now - schedule.refreshed >= STALE_REFRESH
        {
            schedule.refreshed = now;
            if let Err(err) = self.refresh_topology().await {
                tracing::debug!(%err, "cannot rebuild the slot table after a MOVED");
            }
        }
    }

    /// Replaces the connection in use if a call timed out on it
    /// ([`Upstream::on_connection`]), when its backoff allows: at once
    /// after one that had answered calls; after [`REPLACE_FIRST`], doubling
    /// to [`REPLACE_MOST`], while replacements fail or are given up before
    /// they answer anything (every flow to a node stuck, or the node
    /// itself). True when it tried.
    async fn replace_given_up(&self, schedule: &mut Schedule) -> bool {
        let Some(current) = self.current() else {
            return false;
        };
        if self.dead.load(Ordering::Relaxed) != current.generation {
            return false;
        }
        let now = Instant::now();
        if schedule.replacing != Some(current.generation) {
            // Newly given up: at once if it had answered calls (the flow
            // stuck, the node may be well); after the backoff if it never
            // did (its predecessor's fault is still there).
            schedule.replacing = Some(current.generation);
            if self.answered.load(Ordering::Relaxed) >= current.generation {
                schedule.replace_backoff = REPLACE_FIRST;
                schedule.replace_at = now;
            } else {
                schedule.replace_at = now + schedule.replace_backoff;
                schedule.replace_backoff = (schedule.replace_backoff * 2).min(REPLACE_MOST);
            }
        }
        if now < schedule.replace_at {
            return false;
        }
        match self.connect().await {
            Ok(()) => {
                schedule.replacing = None;
                tracing::warn!(
                    generation = current.generation,
                    "gave up the redis connection on which a call timed out; a new one serves"
                );
            }
            Err(problem) => {
                let wait = schedule.replace_backoff;
                schedule.replace_at = Instant::now() + wait;
                schedule.replace_backoff = (wait * 2).min(REPLACE_MOST);
                tracing::warn!(
                    %problem,
                    next_try_in = ?wait,
                    "a call timed out on the redis connection, and a new one does not work yet"
                );
            }
        }
        true
    }

    /// Connects (or checks the scripts on every primary), replaces a stuck
    /// cluster connection, rebuilds the topology, and sets readiness.
    async fn full_check(&self, schedule: &mut Schedule, activity: Activity) {
        let now = Instant::now();
        schedule.checked = Some(now);
        schedule.probed = now;
        schedule.seen = activity;
        let outcome = match self.current() {
            None => self.connect().await,
            Some(current) => match self
                .ensure_scripts(current.connection, Some(current.generation))
                .await
            {
                Ok(()) => Ok(()),
                Err(problem) => {
                    let since = *schedule.failing_since.get_or_insert(now);
                    if current.mode == Mode::Cluster && since.elapsed() >= REPLACE_AFTER {
                        match self.connect().await {
                            Ok(()) => {
                                tracing::warn!(
                                    %problem,
                                    "replaced a cluster connection that kept failing while a fresh one works"
                                );
                                Ok(())
                            }
                            Err(_) => Err(problem),
                        }
                    } else {
                        Err(problem)
                    }
                }
            },
        };
        let outcome = match outcome {
            Ok(()) => {
                schedule.failing_since = None;
                // Ready means the topology was read too: the slot table
                // and INFO's primaries are the cluster's now; and the
                // library is on each of those primaries, or stockgate
                // calls by EVALSHA.
                match self.refresh_topology().await {
                    Ok(()) => {
                        schedule.refreshed = Instant::now();
                        self.ensure_library().await
                    }
                    Err(err) => Err(format!("cannot read the cluster's slots: {err}")),
                }
            }
            Err(problem) => Err(problem),
        };
        self.set_ready(outcome);
    }

    fn set_ready(&self, outcome: Result<(), String>) {
        let was_ready = self.ready.swap(outcome.is_ok(), Ordering::Relaxed);
        self.metrics
            .set_upstream_ready(outcome.is_ok(), was_ready != outcome.is_ok());
        let mut last = self.last_problem.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(()) => {
                if !was_ready {
                    tracing::info!(
                        mode = self.mode().map(Mode::as_str),
                        "upstream ready: redis reachable and scripts loaded on every primary"
                    );
                }
                *last = None;
            }
            Err(problem) => {
                // Log a problem when it first appears or changes, not every second.
                if was_ready || last.as_deref() != Some(problem.as_str()) {
                    tracing::warn!(%problem, "upstream not ready");
                }
                *last = Some(problem);
            }
        }
    }

    /// Logs a warning for each primary whose eviction policy can lose data:
    /// `volatile-*` policies evict exactly the idempotency records (the only
    /// keys with a TTL), so a retry would deduct again; `allkeys-*` can evict
    /// stock. `stockgate check` explains the same, as a FAIL.
    pub(super) async fn warn_about_eviction(&self) {
        let Ok(nodes) = self.primaries().await else {
            return;
        };
        for node in nodes {
            match self.eviction(&node).await {
                Ok(Eviction::Safe(_)) => {}
                Ok(Eviction::Risky(policy)) => tracing::warn!(
                    node = %format!("{}:{}", node.host, node.port),
                    policy,
                    "maxmemory-policy can evict idempotency records (volatile-*) or stock (allkeys-*); use noeviction"
                ),
                Err(err) => tracing::debug!(%err, "cannot read maxmemory-policy"),
            }
        }
    }

    /// A primary's eviction settings.
    pub async fn eviction(&self, node: &Node) -> Result<Eviction, UpstreamError> {
        let setting = |name: &'static str| async move {
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg(name);
            let reply = self.query_node(&get, node).await?;
            let value = match reply {
                Value::Array(items) => items.into_iter().nth(1),
                Value::Map(pairs) => pairs.into_iter().next().map(|(_, v)| v),
                _ => None,
            };
            match value {
                Some(Value::BulkString(v)) => Ok(String::from_utf8_lossy(&v).into_owned()),
                _ => Err(UpstreamError::new(
                    FaultKind::BadReply,
                    format!("CONFIG GET {name} answered an unexpected shape"),
                )),
            }
        };
        let policy = setting("maxmemory-policy").await?;
        let maxmemory = setting("maxmemory").await?;
        Ok(if policy == "noeviction" || maxmemory == "0" {
            Eviction::Safe(format!("maxmemory {maxmemory}, maxmemory-policy {policy}"))
        } else {
            Eviction::Risky(policy)
        })
    }

    /// Loads every script on every primary where it is missing: one
    /// SCRIPT EXISTS naming every script, which the cluster client sends to
    /// each primary and answers with one flag per script, each true only if
    /// every primary has it; then SCRIPT LOAD (to every primary) of those
    /// missing somewhere.
    ///
    /// `generation` names the connection when it is the one in use: a
    /// command that gets no reply in time gives it up, as a request's does
    /// ([`Upstream::on_connection`]).
    pub(super) async fn ensure_scripts(
        &self,
        mut connection: Connection,
        generation: Option<u64>,
    ) -> Result<(), String> {
        if self.scripts.is_empty() {
            // The one-shot tools (`stock import|export`) run no script, and
            // SCRIPT EXISTS without a SHA is a syntax error.
            return Ok(());
        }
        let mut exists = redis::cmd("SCRIPT");
        exists.arg("EXISTS");
        for script in &self.scripts {
            exists.arg(&script.sha);
        }
        let given_up = || {
            if let Some(generation) = generation {
                self.dead.fetch_max(generation, Ordering::Relaxed);
            }
        };
        let call = connection.query(&exists);
        let flags = match tokio::time::timeout(self.config.timeout, call).await {
            Ok(Ok(Value::Array(flags))) if flags.len() == self.scripts.len() => flags,
            Ok(Ok(other)) => return Err(format!("SCRIPT EXISTS answered {other:?}")),
            Ok(Err(err)) => {
                if err.is_timeout() {
                    given_up();
                }
                return Err(format!("redis unreachable: {err}"));
            }
            Err(_) => {
                given_up();
                return Err(format!(
                    "redis unreachable: SCRIPT EXISTS got no answer within {} ms",
                    self.config.timeout.as_millis()
                ));
            }
        };
        for (script, flag) in self.scripts.iter().zip(flags) {
            if matches!(flag, Value::Int(1)) {
                continue;
            }
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(&script.body);
            connection.query(&load).await.map_err(|e| {
                if e.is_timeout() {
                    given_up();
                }
                format!("SCRIPT LOAD {} failed: {e}", script.name)
            })?;
            tracing::info!(script = script.name, sha = %script.sha, "script loaded on every primary");
        }
        Ok(())
    }

    /// Loads the function library on every primary where it is missing
    /// (FUNCTION LIST of its name, then FUNCTION LOAD where it is not
    /// listed), and decides how scripts are
    /// called ([`crate::script::Calling`]): FCALL once every primary has
    /// the library and an FCALL of its probe answers; with `--scripts
    /// auto`, EVALSHA where a primary refuses FUNCTION or FCALL (NOPERM
    /// from an ACL, a server without FUNCTION, any error reply), with the refusal
    /// logged and shown by INFO and `stockgate check`; with `--scripts
    /// function`, such a refusal keeps stockgate not ready. A node that
    /// doesn't answer is a problem either way: the check runs again.
    pub(super) async fn ensure_library(&self) -> Result<(), String> {
        let Some(library) = &self.library else {
            return Ok(());
        };
        let before = (self.calling(), self.refused());
        let loaded = self.settle_calling(library, &self.nodes()).await?;
        for node in loaded {
            tracing::info!(library = %library.name, %node, "function library loaded");
        }
        // Said and counted once: a refusal is met again at every check,
        // and the same refusal met on another primary, or by a call
        // first, is no news.
        let after = (self.calling(), self.refused());
        if after != before {
            if let (Calling::Eval, Some(command)) = after {
                self.metrics.record_function_refusal(command);
            }
            let now = self.calling_text();
            match self.calling() {
                Calling::Function => tracing::info!(scripts = %now, "calling scripts with FCALL"),
                Calling::Eval => tracing::warn!(scripts = %now, "calling scripts with EVALSHA"),
            }
        }
        Ok(())
    }

    /// The command a primary refused, when that is why scripts are called
    /// by EVALSHA.
    fn refused(&self) -> Option<FunctionCommand> {
        ByEval::refused(
            self.calling_why
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref(),
        )
    }

    /// A call by FCALL was refused with NOPERM (an ACL that took FCALL
    /// away while stockgate served): calls go by EVALSHA from now on, the
    /// refused one first, and the health loop runs its check within a
    /// [`TICK`], which finds the primary and keeps EVALSHA until FCALL is
    /// allowed again.
    pub(super) fn fcall_refused(&self, answer: &dyn std::fmt::Display) {
        let mut why = self.calling_why.lock().unwrap_or_else(|e| e.into_inner());
        if !self.calling.set(Calling::Eval) {
            return;
        }
        *why = Some(ByEval::Refused {
            command: FunctionCommand::Call,
            text: format!("a primary refuses FCALL: {answer}"),
        });
        drop(why);
        self.metrics.record_function_refusal(FunctionCommand::Call);
        tracing::warn!(
            scripts = %self.calling_text(),
            "a call was refused FCALL; calling scripts with EVALSHA"
        );
        self.recheck.store(true, Ordering::Relaxed);
    }

    /// [`Upstream::ensure_library`] of `library` on `nodes`, saying
    /// nothing (also what `stockgate check` runs, whose upstream has no
    /// scripts of its own, and whose output is its report): the primaries
    /// where it loaded the library.
    pub async fn settle_calling(
        &self,
        library: &Library,
        nodes: &[Node],
    ) -> Result<Vec<String>, String> {
        let mut loaded = Vec::new();
        if self.config.scripts == ScriptCalls::Eval {
            self.calling.set(Calling::Eval);
            *self.calling_why.lock().unwrap_or_else(|e| e.into_inner()) = Some(ByEval::Asked);
            return Ok(loaded);
        }
        // Any error reply means this server will not take the library or
        // the call (an ACL's NOPERM, a server without FUNCTION, a library
        // it cannot compile): EVALSHA still works there. Only a node that
        // doesn't answer is a problem to try again.
        let mut refusal = None;
        let refused =
            |command: FunctionCommand, at: &str, err: &redis::RedisError| ByEval::Refused {
                command,
                text: format!("{at} refuses {}: {err}", command.name()),
            };
        // FCALL in use already: calls prove it is allowed, and one refused
        // goes by EVALSHA at once (`Upstream::fcall_refused`), so the probe
        // is spared.
        let trusted = self.calling() == Calling::Function;
        for node in nodes {
            let at = format!("{}:{}", node.host, node.port);
            // Asked first, as the library is some 80 KB: a fleet's checks
            // would otherwise send it to every primary every minute.
            let mut listed = redis::cmd("FUNCTION");
            listed.arg("LIST").arg("LIBRARYNAME").arg(&library.name);
            let has = match self.ask_node(&listed, node).await {
                Ok(Ok(Value::Array(libraries))) => !libraries.is_empty(),
                Ok(Ok(_)) => false,
                Ok(Err(err)) => {
                    refusal = Some(refused(FunctionCommand::List, &at, &err));
                    break;
                }
                Err(fault) => return Err(format!("FUNCTION LIST on {at}: {fault}")),
            };
            if !has {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg(&library.code);
                match self.ask_node(&load, node).await {
                    Ok(Ok(_)) => loaded.push(at.clone()),
                    Ok(Err(err)) => match ErrorCode::of_redis(&err) {
                        // Another sidecar of this build loaded it meanwhile.
                        Some(ErrorCode::LibraryExists) => {}
                        _ => {
                            refusal = Some(refused(FunctionCommand::Load, &at, &err));
                            break;
                        }
                    },
                    Err(fault) => return Err(format!("FUNCTION LOAD on {at}: {fault}")),
                }
            }
            if trusted {
                continue;
            }
            // Loading may be allowed where calling is not.
            let mut probe = redis::cmd("FCALL");
            probe.arg(&library.probe).arg(0);
            match self.ask_node(&probe, node).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    refusal = Some(refused(FunctionCommand::Call, &at, &err));
                    break;
                }
                Err(fault) => return Err(format!("FCALL on {at}: {fault}")),
            }
        }
        let mut why = self.calling_why.lock().unwrap_or_else(|e| e.into_inner());
        match refusal {
            // A call was refused FCALL while this check ran without its
            // probe: EVALSHA stays, and the next check probes.
            None if trusted && self.calling() == Calling::Eval => Ok(loaded),
            None => {
                *why = None;
                self.calling.set(Calling::Function);
                Ok(loaded)
            }
            Some(refusal) if self.config.scripts == ScriptCalls::Function => {
                self.calling.set(Calling::Eval);
                Err(format!("--scripts function, but {refusal}"))
            }
            Some(refusal) => {
                self.calling.set(Calling::Eval);
                *why = Some(refusal);
                Ok(loaded)
            }
        }
    }
}
