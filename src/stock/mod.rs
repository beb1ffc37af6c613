//! The stock service: every command that touches stock goes through here,
//! whichever door it came in by (RESP or HTTP). One file per command, each
//! with its format, its arguments, its script call and its reply:
//!
//! - [`deduct`]: DEDUCT, the hot path.
//! - [`revert`]: REVERT, compensation.
//! - [`admin`]: STOCK.GET, STOCK.SET, STOCK.ADD: reading, restocking and
//!   correcting stock (SET and ADD need `--admin-commands`, are applied
//!   once per op_id, and each is written to the audit log).
//! - [`status`]: STOCK.STATUS: one request's record, for support.
//!
//! What they share lives here: the service's settings, the metrics and the
//! access log of each answered request, and the stale-id check.

pub mod admin;
pub mod deduct;
pub mod revert;
pub mod status;

use crate::config::{AccessLog, Config, MissingStock};
use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::metrics::{CommandLabel, Metrics, ResultLabel};
use crate::outcome::StockReply;
use crate::params::{InvalidParam, RequestId};
use crate::reply::Reply;
use crate::script::Scripts;
use crate::upstream::Upstream;
use bytes::Bytes;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The commands this service serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockCommand {
    Deduct,
    Revert,
    Get,
    Set,
    Add,
    Status,
}

/// Who sent a request: for the audit log of operators' changes. Empty for
/// the commands that don't log it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client_id: Option<u64>,
    pub addr: Option<SocketAddr>,
    pub name: Option<Bytes>,
}

/// What one DEDUCT or REVERT came to.
pub type StockResult = Result<StockReply, UpstreamError>;

pub struct StockService {
    upstream: Arc<Upstream>,
    scripts: Scripts,
    keys: KeyLayout,
    max_qty: u64,
    retry_window: Duration,
    /// Script arguments that never change, spelled once at startup.
    max_qty_arg: String,
    retry_window_arg: String,
    missing_stock: MissingStock,
    /// The scripts' "replicate" argument: "1" with `--wait-replicas`. A
    /// reply that reports an earlier write then writes its record again,
    /// unchanged, so that the WAIT after it confirms that record and not
    /// only what this connection wrote (see `lua/common.lua`).
    replicate_arg: &'static str,
    reject_stale_ids: bool,
    admin_commands: bool,
    access_log: AccessLog,
    metrics: Arc<Metrics>,
    nonces: Nonces,
}

/// A fresh nonce for every script call, written into the record it
/// writes: when a call is sent again (its connection was lost after the
/// write, and the node pipe or the redis crate resends it), the script
/// finds its own nonce and answers what it answered the first time,
/// instead of "duplicate" to the request's first attempt.
///
/// Unique within the process (a counter through a bijective mix), and
/// across sidecars by a random 64-bit salt: two calls of one request_id
/// from two sidecars collide with probability 2^-64.
struct Nonces {
    salt: u64,
    next: AtomicU64,
}

impl Nonces {
    fn new() -> Nonces {
        Nonces {
            salt: RandomState::new().hash_one(std::process::id()),
            next: AtomicU64::new(0),
        }
    }

    /// 16 hex digits.
    fn next(&self) -> [u8; 16] {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // splitmix64's finaliser: a bijection, so distinct counters give
        // distinct nonces, and nearby ones look unrelated.
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let value = z ^ self.salt;
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            let nibble = (value >> (60 - 4 * i)) & 0xf;
            *byte = b"0123456789abcdef"[nibble as usize];
        }
        out
    }
}

impl StockService {
    pub fn new(
        config: &Config,
        upstream: Arc<Upstream>,
        scripts: Scripts,
        metrics: Arc<Metrics>,
    ) -> StockService {
        StockService {
            upstream,
            scripts,
            keys: config.keys.clone(),
            max_qty: config.max_qty,
            retry_window: config.retry_window,
            max_qty_arg: config.max_qty.to_string(),
            retry_window_arg: config.retry_window.as_millis().to_string(),
            missing_stock: config.missing_stock,
            replicate_arg: if config.upstream.durability.is_some() {
                "1"
            } else {
                "0"
            },
            reject_stale_ids: config.reject_stale_ids,
            admin_commands: config.admin_commands,
            access_log: config.access_log,
            metrics,
            nonces: Nonces::new(),
        }
    }

    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Serves one command whose arguments (after the name) are `args`, as
    /// the RESP reply. `arrived` is when the request was read; `caller`
    /// who sent it (the audit log of STOCK.SET and STOCK.ADD names them).
    pub async fn serve(
        &self,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        caller: &Caller,
    ) -> Reply {
        let result = match command {
            StockCommand::Deduct => self.deduct(args, arrived).await,
            StockCommand::Revert => self.revert(args, arrived).await,
            StockCommand::Get => return self.get(args).await,
            StockCommand::Set | StockCommand::Add => {
                return self.change(command, args, caller).await;
            }
            StockCommand::Status => return self.status(args).await,
        };
        match result {
            Ok(reply) => Reply::Stock(reply),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// Metrics and the access log for one answered request.
    fn record(&self, entry: AccessEntry<'_>, result: &StockResult, arrived: Instant) {
        let elapsed = arrived.elapsed();
        let label = match result {
            Ok(reply) => ResultLabel::Code(reply.code),
            Err(fault) => {
                self.metrics.record_upstream_error(fault.kind);
                ResultLabel::Error
            }
        };
        self.metrics.record_request(entry.command, label, elapsed);
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
    /// code or error kind, latency. Nothing else the caller sent (no
    /// order_no). Fields are cut at 128 bytes, as valid ones are.
    fn access_log_line(&self, entry: AccessEntry<'_>, result: &StockResult, elapsed: Duration) {
        let field = |a: Option<&Bytes>| {
            a.map(|a| String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned())
        };
        let key = field(entry.sku).map(|sku| format!("{}:{{{sku}}}", self.keys.prefix()));
        let command = entry.command.as_str();
        let (request_id, qty) = (field(entry.request_id), field(entry.qty));
        let latency_us = elapsed.as_micros() as u64;
        // A fault is a WARN, so `STOCKGATE_LOG=warn` or a collector's level
        // filter keeps exactly the lines an operator must look at; a
        // business code, whatever it is, is an answer and stays INFO.
        match result {
            Ok(reply) => tracing::info!(
                target: "stockgate::access",
                command,
                request_id,
                key,
                qty,
                code = reply.code as i64,
                latency_us,
            ),
            Err(fault) => tracing::warn!(
                target: "stockgate::access",
                command,
                request_id,
                key,
                qty,
                error = fault.kind.label(),
                latency_us,
            ),
        }
    }

    /// With `--reject-stale-ids`, refuses a time-ordered request_id (ULID,
    /// UUIDv7) made longer ago than the retry window, less a margin for
    /// clock skew: its record may already have expired, so stockgate could
    /// no longer tell a retry from a new request.
    fn fresh(&self, request_id: &RequestId) -> Result<(), InvalidParam> {
        if !self.reject_stale_ids {
            return Ok(());
        }
        let Some(made) = request_id.embedded_time() else {
            return Ok(());
        };
        let age = SystemTime::now()
            .duration_since(made)
            .unwrap_or(Duration::ZERO);
        let margin = (self.retry_window / 10).min(Duration::from_secs(300));
        if age > self.retry_window - margin {
            return Err(InvalidParam(format!(
                "request_id is a time-ordered id made {} ago, older than the retry window allows; its record may have expired",
                humantime::format_duration(Duration::from_secs(age.as_secs()))
            )));
        }
        Ok(())
    }
}

/// What the access log says of one request: the arguments as sent (they
/// may be invalid), by meaning.
struct AccessEntry<'a> {
    command: CommandLabel,
    sku: Option<&'a Bytes>,
    request_id: Option<&'a Bytes>,
    qty: Option<&'a Bytes>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_distinct_hex() {
        let nonces = Nonces::new();
        let seen: std::collections::HashSet<[u8; 16]> =
            (0..100_000).map(|_| nonces.next()).collect();
        assert_eq!(seen.len(), 100_000);
        assert!(seen.iter().all(|n| n.iter().all(u8::is_ascii_hexdigit)));
    }
}
