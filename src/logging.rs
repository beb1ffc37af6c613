//! Logs to stderr, through writer threads so that a request never waits on
//! the terminal or a log collector.
//!
//! Two writers, split by target:
//!
//! - everything but the audit target goes through a **lossy** writer: when
//!   its queue is full (stderr is not being read), lines are dropped rather
//!   than slowing requests down. Access logs and faults are per request;
//!   each request's fate is kept in its record and the metrics anyway;
//! - the audit target ([`AUDIT_TARGET`]: STOCK.SET and STOCK.ADD, stock
//!   changed outside the order flow) goes through a **lossless** writer of
//!   its own: when its queue is full, the command that logs waits until
//!   there is room. Those lines are the only trace of who changed stock by
//!   hand, and they are rare, so waiting costs nothing the order path sees.
//!
//! `STOCKGATE_LOG` filters both alike (`info` by default).

use crate::config::LogFormat;
use std::io::Write;
use tracing::Subscriber;
use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// The target of the operators' stock changes (`src/stock/admin.rs`).
pub const AUDIT_TARGET: &str = "stockgate::audit";

/// Lines the lossy writer queues before it drops: tracing-appender's
/// default.
const QUEUED_LINES: usize = 128_000;

/// Lines the audit writer queues before the command that logs waits.
/// Audit lines come one per operator's change, so a short queue never
/// fills while stderr is read; and the queue is allocated and touched
/// whole at start (a crossbeam array channel: 128,000 slots were 4 MiB of
/// RSS, measured with the memory benchmark).
const QUEUED_AUDIT_LINES: usize = 1024;

/// Keeps the writer threads; dropping it flushes what they still hold
/// (each waits up to a second for its thread, as tracing-appender does).
pub struct LogGuards {
    _lossy: WorkerGuard,
    _audit: WorkerGuard,
}

/// Installs the process's logger: text or JSON, to stderr.
pub fn init(format: LogFormat) -> LogGuards {
    use std::io::IsTerminal;
    let (lossy, lossy_guard) = writer(std::io::stderr(), true, QUEUED_LINES);
    let (audit, audit_guard) = writer(std::io::stderr(), false, QUEUED_AUDIT_LINES);
    let directives = std::env::var("STOCKGATE_LOG").unwrap_or_else(|_| "info".into());
    subscriber(
        format,
        std::io::stderr().is_terminal(),
        &directives,
        lossy,
        audit,
    )
    .init();
    LogGuards {
        _lossy: lossy_guard,
        _audit: audit_guard,
    }
}

/// A writer thread for `out`: `lossy` drops lines when `queued` are
/// waiting, otherwise the logging call waits for room.
pub fn writer<W: Write + Send + 'static>(
    out: W,
    lossy: bool,
    queued: usize,
) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(lossy)
        .buffered_lines_limit(queued)
        .thread_name(if lossy {
            "stockgate-log"
        } else {
            "stockgate-audit-log"
        })
        .finish(out)
}

/// The subscriber: audit lines to `audit`, every other line to `rest`,
/// both filtered by `directives` (`STOCKGATE_LOG`'s syntax; an invalid
/// one falls back to `info`, as before).
pub fn subscriber<R, A>(
    format: LogFormat,
    ansi: bool,
    directives: &str,
    rest: R,
    audit: A,
) -> impl Subscriber + Send + Sync + for<'a> LookupSpan<'a>
where
    R: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    A: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = || EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let is_audit = || filter_fn(|meta| meta.target() == AUDIT_TARGET);
    tracing_subscriber::registry()
        .with(fmt_layer(format, ansi, rest).with_filter(filter().and(is_audit().not())))
        .with(fmt_layer(format, ansi, audit).with_filter(filter().and(is_audit())))
}

fn fmt_layer<S, W>(format: LogFormat, ansi: bool, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Json => layer.json().boxed(),
        LogFormat::Text => layer.boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    /// Bytes written, shared with the test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;
        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    /// A destination that takes nothing until it is opened: stderr that
    /// nobody reads.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        out: Captured,
    }

    impl Gate {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (lock, opened) = &*self.open;
            let _open = opened
                .wait_while(lock.lock().unwrap(), |open| !*open)
                .unwrap();
            self.out.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn audit_lines_go_to_their_own_writer_and_nothing_else_does() {
        let (rest, audit) = (Captured::default(), Captured::default());
        let subscriber = subscriber(LogFormat::Json, false, "info", rest.clone(), audit.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "stockgate::audit", command = "STOCK.ADD", "stock changed");
            tracing::info!(target: "stockgate::access", code = 0, "answered");
            tracing::warn!("upstream not ready");
            tracing::debug!(target: "stockgate::audit", "below the level: filtered out");
        });
        let audit = audit.lines();
        assert_eq!(audit.len(), 1, "{audit:?}");
        assert!(
            audit[0].contains("\"target\":\"stockgate::audit\""),
            "{audit:?}"
        );
        assert!(audit[0].contains("STOCK.ADD"), "{audit:?}");
        let rest = rest.lines();
        assert_eq!(rest.len(), 2, "{rest:?}");
        assert!(
            rest.iter().all(|l| !l.contains("stockgate::audit")),
            "{rest:?}"
        );
    }

    /// Sends `lines` audit lines through a writer of `lossy` kind whose
    /// destination takes nothing until `open_after` lines were logged;
    /// returns the lines that arrived and the writer's count of dropped ones.
    fn through_a_stalled_destination(
        lossy: bool,
        lines: usize,
        open_after: usize,
    ) -> (Vec<String>, usize) {
        let gate = Gate::default();
        let (audit, guard) = writer(gate.clone(), lossy, QUEUE);
        let dropped = audit.error_counter();
        let subscriber = subscriber(LogFormat::Text, false, "info", Captured::default(), audit);
        let logged = Arc::new(AtomicUsize::new(0));
        let logger = std::thread::spawn({
            let logged = logged.clone();
            move || {
                tracing::subscriber::with_default(subscriber, || {
                    for n in 0..lines {
                        tracing::info!(target: "stockgate::audit", n, "stock changed");
                        logged.fetch_add(1, Ordering::SeqCst);
                    }
                })
            }
        });
        // A wait for a state, not a timing: the deadline only turns a hang
        // into a failure.
        let deadline = Instant::now() + Duration::from_secs(30);
        while logged.load(Ordering::SeqCst) < open_after {
            assert!(Instant::now() < deadline, "the logger never got that far");
            std::thread::sleep(Duration::from_millis(1));
        }
        gate.open();
        logger.join().unwrap();
        drop(guard);
        (gate.out.lines(), dropped.dropped_lines())
    }

    /// Lines a test writer queues: the writer thread holds one more, the
    /// one it is stuck writing.
    const QUEUE: usize = 4;

    #[test]
    fn audit_lines_wait_for_a_stalled_stderr_instead_of_being_dropped() {
        // With stderr stalled the writer accepts QUEUE + 1 lines; a lossless
        // one then holds the logger until stderr takes lines again.
        let (arrived, dropped) = through_a_stalled_destination(false, 100, QUEUE + 1);
        assert_eq!((arrived.len(), dropped), (100, 0), "{arrived:?}");
        for (n, line) in arrived.iter().enumerate() {
            assert!(line.ends_with(&format!("stock changed n={n}")), "{line}");
        }
        // The lossy writer every other line goes through runs past the
        // stall and drops what does not fit: what audit lines are kept from.
        let (arrived, dropped) = through_a_stalled_destination(true, 100, QUEUE + 2);
        assert!(dropped > 0 && arrived.len() < 100, "{}", arrived.len());
    }
}
