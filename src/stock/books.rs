//! The books of every answered request: its metrics, what holds it moved,
//! and its access-log line.

use super::StockCommand;
use crate::config::AccessLog;
use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::metrics::{Metrics, ResultLabel};
use crate::outcome::{Code, HoldEvent, StockReply};
use std::sync::Arc;
use std::time::Duration;

/// Where every answered request is recorded.
pub(super) struct Books {
    pub(super) metrics: Arc<Metrics>,
    access_log: AccessLog,
    /// For the access log's key names.
    keys: KeyLayout,
}

/// What the access log says of one request: the arguments as sent (they
/// may be invalid), by meaning.
pub(super) struct AccessEntry<'a> {
    pub(super) command: StockCommand,
    pub(super) sku: Option<&'a [u8]>,
    pub(super) request_id: Option<&'a [u8]>,
    pub(super) qty: Option<&'a [u8]>,
    /// The user who sent it, when it logged in as one.
    pub(super) user: Option<&'a str>,
}

impl Books {
    pub(super) fn new(metrics: Arc<Metrics>, access_log: AccessLog, keys: KeyLayout) -> Books {
        Books {
            metrics,
            access_log,
            keys,
        }
    }

    /// What a reply says happened to holds: counted by event, and, for a
    /// CONFIRM of the caller's own hold (`held_time`), the time it was
    /// held. An order's line confirms count as confirmed holds but add no
    /// held time: an ORDER's lines are held for the few ms of its saga,
    /// which would only drag the histogram of customers' holds down.
    pub(super) fn record_holds(&self, reply: &StockReply, held_time: bool) {
        let effects = reply.effects;
        if effects.released > 0 {
            self.metrics
                .record_holds(HoldEvent::Expired, u64::from(effects.released));
        }
        if let Some(event) = effects.event {
            self.metrics.record_holds(event, 1);
            if event == HoldEvent::Confirmed && held_time {
                debug_assert_eq!(reply.code, Code::Ok);
                self.metrics
                    .record_held(Duration::from_millis(u64::from(effects.held_ms)));
            }
        }
    }

    /// Metrics and the access log for one answered request.
    pub(super) fn record(
        &self,
        entry: AccessEntry<'_>,
        result: Result<Code, &UpstreamError>,
        elapsed: Duration,
    ) {
        let label = match result {
            Ok(code) => ResultLabel::Code(code),
            Err(fault) => {
                self.metrics.record_upstream_error(fault.kind);
                ResultLabel::Error
            }
        };
        self.metrics.record_request(entry.command, label, elapsed);
        self.log_access(entry, result, elapsed);
    }

    /// The access-log line of `entry`, if `--access-log` wants it.
    pub(super) fn log_access(
        &self,
        entry: AccessEntry<'_>,
        result: Result<Code, &UpstreamError>,
        elapsed: Duration,
    ) {
        let wanted = match self.access_log {
            AccessLog::All => true,
            AccessLog::Errors => result.is_err(),
            AccessLog::Off => false,
        };
        if wanted {
            self.access_log_line(entry, result, elapsed);
        }
    }

    /// One access-log line, as the design asks: request_id, stock key, qty,
    /// code or error kind, latency, and the user's name. Nothing else the caller sent (no
    /// order_no). Fields are cut at 128 bytes, as valid ones are.
    fn access_log_line(
        &self,
        entry: AccessEntry<'_>,
        result: Result<Code, &UpstreamError>,
        elapsed: Duration,
    ) {
        let field = |a: Option<&[u8]>| {
            a.map(|a| String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned())
        };
        let key = field(entry.sku).map(|sku| format!("{}:{{{sku}}}", self.keys.prefix()));
        let command = entry.command.name();
        let (request_id, qty) = (field(entry.request_id), field(entry.qty));
        let user = entry.user;
        let latency_us = elapsed.as_micros() as u64;
        // A fault is a WARN, so `STOCKGATE_LOG=warn` or a collector's level
        // filter keeps exactly the lines an operator must look at; a
        // business code, whatever it is, is an answer and stays INFO.
        match result {
            Ok(code) => tracing::info!(
                target: "stockgate::access",
                command,
                user,
                request_id,
                key,
                qty,
                code = code as i64,
                latency_us,
            ),
            Err(fault) => tracing::warn!(
                target: "stockgate::access",
                command,
                user,
                request_id,
                key,
                qty,
                error = fault.kind.label(),
                latency_us,
            ),
        }
    }
}
