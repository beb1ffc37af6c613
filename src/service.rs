//! The stock service: every command that touches stock goes through here,
//! whichever door it came in by. It checks parameters, builds keys, runs
//! the script, maps the reply and records the metrics, once for all.
//!
//! - DEDUCT and REVERT answer with a business code ([`StockReply`]) or a
//!   system fault ([`UpstreamError`]).
//! - `STOCK.GET|SET|ADD|STATUS` are for operators: reading, restocking and
//!   correcting stock, and inspecting one request. SET and ADD change stock
//!   outside the order flow, so they need `--admin-commands`, and each one is
//!   written to the audit log.

use crate::config::{AccessLog, Config, MissingStock};
use crate::deduct::Deduct;
use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::metrics::{CommandLabel, Metrics, ResultLabel};
use crate::outcome::StockReply;
use crate::params::{Delta, InvalidParam, RequestId, Sku, StockLevel};
use crate::reply::Reply;
use crate::revert::Revert;
use crate::script::Scripts;
use crate::upstream::Upstream;
use bytes::Bytes;
use redis::Value;
use std::sync::Arc;
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
    reject_stale_ids: bool,
    admin_commands: bool,
    access_log: AccessLog,
    metrics: Arc<Metrics>,
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
            reject_stale_ids: config.reject_stale_ids,
            admin_commands: config.admin_commands,
            access_log: config.access_log,
            metrics,
        }
    }

    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Serves one command whose arguments (after the name) are `args`, as
    /// the RESP reply. `arrived` is when the request was read.
    pub async fn serve(&self, command: StockCommand, args: &[Bytes], arrived: Instant) -> Reply {
        let result = match command {
            StockCommand::Deduct => self.deduct(args, arrived).await,
            StockCommand::Revert => self.revert(args, arrived).await,
            StockCommand::Get | StockCommand::Set | StockCommand::Add | StockCommand::Status => {
                return self.admin(command, args).await;
            }
        };
        match result {
            Ok(reply) => Reply::Stock(reply),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// DEDUCT, with its metrics.
    pub async fn deduct(&self, args: &[Bytes], arrived: Instant) -> StockResult {
        let result = match Deduct::parse(args, self.max_qty).and_then(|d| self.fresh(d)) {
            Ok(deduct) => self.apply_deduct(&deduct).await,
            Err(invalid) => Ok(StockReply::invalid(invalid.0)),
        };
        self.record(CommandLabel::Deduct, args, &result, arrived);
        result
    }

    /// REVERT, with its metrics.
    pub async fn revert(&self, args: &[Bytes], arrived: Instant) -> StockResult {
        let result = match Revert::parse(args).and_then(|r| self.fresh(r)) {
            Ok(revert) => self.apply_revert(&revert).await,
            Err(invalid) => Ok(StockReply::invalid(invalid.0)),
        };
        self.record(CommandLabel::Revert, args, &result, arrived);
        result
    }

    /// Metrics and the access log for one answered request.
    fn record(
        &self,
        command: CommandLabel,
        args: &[Bytes],
        result: &StockResult,
        arrived: Instant,
    ) {
        let elapsed = arrived.elapsed();
        let label = match result {
            Ok(reply) => ResultLabel::Code(reply.code),
            Err(fault) => {
                self.metrics.record_upstream_error(fault.kind);
                ResultLabel::Error
            }
        };
        self.metrics.record_request(command, label, elapsed);
        let wanted = match self.access_log {
            AccessLog::All => true,
            AccessLog::Errors => result.is_err(),
            AccessLog::Off => false,
        };
        if wanted {
            self.access_log_line(command, args, result, elapsed);
        }
    }

    /// One access-log line, as the design asks: request_id, stock key, qty,
    /// code or error kind, latency. Nothing else the caller sent (no
    /// order_no). Fields are cut at 128 bytes, as valid ones are.
    fn access_log_line(
        &self,
        command: CommandLabel,
        args: &[Bytes],
        result: &StockResult,
        elapsed: Duration,
    ) {
        let field = |i: usize| {
            args.get(i)
                .map(|a| String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned())
        };
        let (request_id, qty) = match command {
            CommandLabel::Deduct => (field(2), field(1)),
            CommandLabel::Revert => (field(1), None),
        };
        let key = field(0).map(|sku| format!("{}:{{{sku}}}", self.keys.prefix()));
        let (code, error) = match result {
            Ok(reply) => (Some(reply.code as i64), None),
            Err(fault) => (None, Some(fault.kind.label())),
        };
        tracing::info!(
            target: "stockgate::access",
            command = command.as_str(),
            request_id,
            key,
            qty,
            code,
            error,
            latency_us = elapsed.as_micros() as u64,
        );
    }

    /// Runs the DEDUCT script for a validated deduction.
    pub async fn apply_deduct(&self, deduct: &Deduct) -> StockResult {
        let keys = self.keys.deduct_keys(&deduct.sku, &deduct.request_id);
        let started = Instant::now();
        let reply = self
            .upstream
            .eval_stock(
                &self.scripts.deduct,
                [&keys.stock, &keys.record],
                &[
                    deduct.qty.as_bytes(),
                    deduct.order_no.as_bytes(),
                    self.retry_window_arg.as_bytes(),
                    self.max_qty_arg.as_bytes(),
                    self.missing_stock.as_arg().as_bytes(),
                ],
            )
            .await;
        self.metrics
            .record_upstream(CommandLabel::Deduct, started.elapsed());
        reply
    }

    /// Runs the REVERT script for a validated revert.
    pub async fn apply_revert(&self, revert: &Revert) -> StockResult {
        let keys = self.keys.deduct_keys(&revert.sku, &revert.request_id);
        let started = Instant::now();
        let reply = self
            .upstream
            .eval_stock(
                &self.scripts.revert,
                [&keys.stock, &keys.record],
                &[
                    self.retry_window_arg.as_bytes(),
                    self.missing_stock.as_arg().as_bytes(),
                ],
            )
            .await;
        self.metrics
            .record_upstream(CommandLabel::Revert, started.elapsed());
        reply
    }

    /// With `--reject-stale-ids`, refuses a time-ordered request_id (ULID,
    /// UUIDv7) made longer ago than the retry window, less a margin for
    /// clock skew: its record may already have expired, so stockgate could
    /// no longer tell a retry from a new request.
    fn fresh<T: HasRequestId>(&self, request: T) -> Result<T, InvalidParam> {
        if !self.reject_stale_ids {
            return Ok(request);
        }
        let Some(made) = request.request_id().embedded_time() else {
            return Ok(request);
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
        Ok(request)
    }

    /// `STOCK.GET|SET|ADD|STATUS`.
    async fn admin(&self, command: StockCommand, args: &[Bytes]) -> Reply {
        if matches!(command, StockCommand::Set | StockCommand::Add) && !self.admin_commands {
            return Reply::error(
                "NOPERM STOCK.SET and STOCK.ADD change stock outside the order flow; start stockgate with --admin-commands to allow them",
            );
        }
        let sku = match Sku::parse(args[0].clone()) {
            Ok(sku) => sku,
            Err(invalid) => return Reply::error(format!("ERR {invalid}")),
        };
        let stock_key = self.keys.stock_key(&sku);
        let result = match command {
            StockCommand::Get => {
                let mut get = redis::cmd("GET");
                get.arg(&stock_key);
                self.upstream.query(&get).await.map(stock_value)
            }
            StockCommand::Set => {
                let level = match StockLevel::parse(&args[1]) {
                    Ok(level) => level,
                    Err(invalid) => return Reply::error(format!("ERR {invalid}")),
                };
                let mut set = redis::cmd("SET");
                set.arg(&stock_key).arg(level.0);
                let result = self.upstream.query(&set).await;
                if result.is_ok() {
                    audit("STOCK.SET", &sku, level.0);
                }
                result.map(|_| Reply::Simple("OK"))
            }
            StockCommand::Add => {
                let delta = match Delta::parse(&args[1]) {
                    Ok(delta) => delta,
                    Err(invalid) => return Reply::error(format!("ERR {invalid}")),
                };
                let result = self
                    .upstream
                    .eval(&self.scripts.stock_add, &[&stock_key], &[&args[1]])
                    .await;
                if result.is_ok() {
                    audit("STOCK.ADD", &sku, delta.0);
                }
                result.map(|value| match value {
                    Value::Int(after) => Reply::Integer(after),
                    other => Reply::error(format!("BADREPLY STOCK.ADD answered {other:?}")),
                })
            }
            StockCommand::Status => {
                let request_id = match RequestId::parse(args[1].clone()) {
                    Ok(id) => id,
                    Err(invalid) => return Reply::error(format!("ERR {invalid}")),
                };
                let keys = self.keys.deduct_keys(&sku, &request_id);
                self.upstream
                    .eval(&self.scripts.status, &[&keys.stock, &keys.record], &[])
                    .await
                    .map(status_reply)
            }
            StockCommand::Deduct | StockCommand::Revert => unreachable!("not an admin command"),
        };
        result.unwrap_or_else(|fault| Reply::Error(fault.reply_text()))
    }
}

/// The request types that carry a request_id.
trait HasRequestId {
    fn request_id(&self) -> &RequestId;
}

impl HasRequestId for Deduct {
    fn request_id(&self) -> &RequestId {
        &self.request_id
    }
}

impl HasRequestId for Revert {
    fn request_id(&self) -> &RequestId {
        &self.request_id
    }
}

/// A stock key's value as a reply: an integer, or nil when missing.
fn stock_value(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Null,
        Value::BulkString(raw) => match std::str::from_utf8(&raw).ok().and_then(|s| s.parse().ok())
        {
            Some(stock) => Reply::Integer(stock),
            None => Reply::error("BADSTOCK stock value is not an integer"),
        },
        other => Reply::error(format!("BADREPLY GET answered {other:?}")),
    }
}

/// The status script's `{state, qty, order_no, ttl_ms, stock}` as a map.
fn status_reply(value: Value) -> Reply {
    let Value::Array(items) = value else {
        return Reply::error("BADREPLY STOCK.STATUS answered an unexpected shape");
    };
    let field = |i: usize| items.get(i).cloned().unwrap_or(Value::Nil);
    let text = |v: Value| match v {
        Value::BulkString(b) => Reply::Bulk(b.into()),
        Value::SimpleString(s) => Reply::Bulk(s.into_bytes().into()),
        _ => Reply::Null,
    };
    let int = |v: Value| match v {
        Value::Int(i) => Reply::Integer(i),
        _ => Reply::Null,
    };
    let stock = match field(4) {
        Value::BulkString(raw) => std::str::from_utf8(&raw)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(Reply::Null, Reply::Integer),
        _ => Reply::Null,
    };
    Reply::Map(vec![
        (Reply::bulk("state"), text(field(0))),
        (Reply::bulk("qty"), int(field(1))),
        (Reply::bulk("order_no"), text(field(2))),
        (Reply::bulk("ttl_ms"), int(field(3))),
        (Reply::bulk("stock"), stock),
    ])
}

/// Stock changed outside the order flow: who, what, by how much, in the
/// audit log (its own target, so it can be routed and kept apart).
fn audit(command: &str, sku: &Sku, value: i64) {
    tracing::info!(
        target: "stockgate::audit",
        command,
        sku = %String::from_utf8_lossy(sku.as_bytes()),
        value,
        "stock changed outside the order flow"
    );
}
