//! The stock service: what every stock command runs with (the upstream,
//! the scripts, the key layout, the settings, the books), built once from
//! the configuration, and the one door every stock command comes in by
//! ([`StockService::serve`]).

use super::books::Books;
use super::command::Serve;
use super::single::{Limits, Setting, Single};
use super::sweep_index::SweepIndex;
use super::{
    Caller, StockCommand, StockResult, coalesce, location, nonces::Nonces, order, sold_out, wire,
};
use crate::config::Config;
use crate::error::{FaultKind, UpstreamError};
use crate::metrics::Metrics;
use crate::params::Sku;
use crate::pipeline::Join;
use crate::reply::Reply;
use crate::script::Scripts;
use crate::upstream::Upstream;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

pub struct StockService {
    pub(super) upstream: Arc<Upstream>,
    pub(super) scripts: Scripts,
    pub(super) keys: crate::keys::KeyLayout,
    pub(super) settings: Settings,
    /// The metrics and the access log of each answered request.
    pub(super) books: Books,
    pub(super) nonces: Nonces,
    pub(super) wires: Wires,
    /// Files held SKUs in the sweep index ([`super::sweep_index`]).
    pub(super) sweeper: SweepIndex,
    pub(super) fast: FastPaths,
}

/// What the flags say, in the form the calls use.
pub(super) struct Settings {
    /// What the fields are checked against.
    pub(super) limits: Limits,
    pub(super) max_order_lines: usize,
    /// `--order-line-hold` (at most `--max-hold`), in ms.
    pub(super) order_line_hold_ms: u64,
    pub(super) retry_window: Duration,
    /// Script arguments that never change, spelled once at startup.
    pub(super) retry_window_arg: String,
    /// The scripts' "replicate" argument: "1" with `--wait-replicas`. A
    /// reply that reports an earlier write then writes its record again,
    /// unchanged, so that the WAIT after it confirms that record and not
    /// only what this connection wrote (see `lua/common.lua`).
    pub(super) replicate_arg: &'static str,
    /// The scripts' "journal" argument: "1" with `--journal` (each change
    /// appended to its SKU's journal in the same call, [`super::journal`]).
    pub(super) journal_arg: &'static str,
    pub(super) reject_stale_ids: bool,
    pub(super) admin_commands: bool,
    pub(super) missing_zero: bool,
}

/// The paths a flash sale takes: a SKU seen short answers from one read,
/// a hot SKU's DEDUCTs share one call.
pub(super) struct FastPaths {
    /// SKUs seen short lately ([`sold_out`]); `None` with the path off.
    pub(super) sold_out: Option<sold_out::Memory>,
    /// Writes a hot SKU's DEDUCTs as one call ([`coalesce`]); `None` with
    /// `--coalesce-deducts 1`.
    pub(super) coalesce: Option<Arc<dyn Join>>,
    /// The same for the sold-out reads ([`coalesce::ReadJoin`]).
    pub(super) coalesce_reads: Option<Arc<dyn Join>>,
    /// A load of `lua/deduct_many.lua` is under way after a NOSCRIPT.
    pub(super) reloading: Arc<AtomicBool>,
}

/// The pre-encoded script call of each command on one request, by
/// [`StockCommand`]: as the flags say, and for an order's lines
/// (`--missing-stock zero` whatever the flag says, for the calls that end
/// a line).
pub(super) struct Wires {
    plain: Vec<Option<wire::Wire>>,
    line: Vec<Option<wire::Wire>>,
}

impl Wires {
    pub(super) fn of(&self, command: StockCommand, order_line: bool) -> &wire::Wire {
        let wires = if order_line { &self.line } else { &self.plain };
        wires[command as usize]
            .as_ref()
            .unwrap_or_else(|| unreachable!("{command:?} is a call on one request"))
    }
}

impl StockService {
    pub fn new(
        config: &Config,
        upstream: Arc<Upstream>,
        scripts: Scripts,
        metrics: Arc<Metrics>,
    ) -> StockService {
        let max_qty_arg = config.max_qty.to_string();
        let max_hold_ms = config.max_hold.as_millis() as u64;
        let max_hold_arg = max_hold_ms.to_string();
        let retry_window_arg = config.retry_window.as_millis().to_string();
        let window = retry_window_arg.as_bytes();
        let missing = config.missing_stock.as_arg().as_bytes();
        let replicate_arg = if config.upstream.durability.is_some() {
            "1"
        } else {
            "0"
        };
        let replicate = replicate_arg.as_bytes();
        let journal_arg = if config.journal { "1" } else { "0" };
        // Each script's ARGV: the caller's arguments, then its settings,
        // then the nonce and the replicate and journal flags (see `wire`,
        // and each lua/ header).
        let wire_of = |single: &Single, line: bool| {
            let missing: &[u8] = if line && single.ends_line {
                b"zero"
            } else {
                missing
            };
            let setting = |setting: &Setting| -> &[u8] {
                match setting {
                    Setting::RetryWindow => window,
                    Setting::MaxQty => max_qty_arg.as_bytes(),
                    Setting::MaxHoldMs => max_hold_arg.as_bytes(),
                    Setting::MissingStock => missing,
                }
            };
            let settings: Vec<&[u8]> = single.settings.iter().map(setting).collect();
            wire::Wire::new(
                single,
                &scripts,
                &settings,
                [replicate, journal_arg.as_bytes()],
            )
        };
        let wires_with = |line: bool| -> Vec<Option<wire::Wire>> {
            StockCommand::ALL
                .iter()
                .map(|&command| Some(wire_of(command.single()?, line)))
                .collect()
        };
        let wires = Wires {
            plain: wires_with(false),
            line: wires_with(true),
        };
        let coalesce = (config.coalesce_deducts > 1).then(|| {
            Arc::new(coalesce::DeductJoin::new(
                wires.of(StockCommand::Deduct, false),
                &scripts.deduct_many,
                upstream.calling_now(),
                config.coalesce_deducts,
                metrics.clone(),
            )) as Arc<dyn Join>
        });
        let keys = config.keys.clone();
        StockService {
            sweeper: SweepIndex::new(
                config.sweeper,
                upstream.clone(),
                scripts.clone(),
                keys.clone(),
            ),
            upstream,
            scripts,
            keys: keys.clone(),
            settings: Settings {
                limits: Limits {
                    max_qty: config.max_qty,
                    max_hold_ms,
                },
                max_order_lines: config.max_order_lines,
                order_line_hold_ms: config.order_line_hold.as_millis() as u64,
                retry_window: config.retry_window,
                retry_window_arg,
                replicate_arg,
                journal_arg,
                reject_stale_ids: config.reject_stale_ids,
                admin_commands: config.admin_commands,
                missing_zero: config.missing_stock.as_arg() == "zero",
            },
            books: Books::new(metrics, config.access_log, keys),
            nonces: Nonces::new(),
            wires,
            fast: FastPaths {
                // A duplicate's answer under --wait-replicas must wait for a
                // replicated write, which only the script makes.
                sold_out: (config.sold_out_reads && config.upstream.durability.is_none())
                    .then(sold_out::Memory::default),
                coalesce,
                coalesce_reads: (config.coalesce_deducts > 1).then(|| {
                    Arc::new(coalesce::ReadJoin {
                        most: config.coalesce_deducts,
                    }) as Arc<dyn Join>
                }),
                reloading: Arc::default(),
            },
        }
    }

    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Serves one command whose arguments (after the name) are `args`,
    /// however its own file says it is served: the one door of both faces
    /// (RESP writes the answer as its reply, HTTP as its JSON). `arrived`
    /// is when the request was read; `caller` who sent it (the audit log of
    /// STOCK.SET and STOCK.ADD names them).
    pub async fn answer(
        self: &Arc<Self>,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        caller: &Caller,
    ) -> Answer {
        match &command.describe().serve {
            Serve::Single(_) => {
                Answer::Stock(self.call(command, args, arrived, caller.user.clone()).await)
            }
            Serve::Order(_) => {
                let user = caller.user.as_deref().map(crate::auth::Account::name);
                Answer::Order(order::order_call(self, command, args, arrived, user).await)
            }
            Serve::Alone(serve) => serve(self, args, caller).await,
        }
    }

    /// [`StockService::answer`], as the RESP reply.
    pub async fn serve(
        self: &Arc<Self>,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        caller: &Caller,
    ) -> Reply {
        self.answer(command, args, arrived, caller)
            .await
            .into_reply()
    }

    /// A deadline one `--timeout` from now.
    pub(super) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.upstream.timeout()
    }

    /// Runs `call`; when it changed nothing because the SKU has no journal
    /// yet (NOJOURNAL, with `--journal`), opens the SKU's journal and runs
    /// it again. The second run meets the journal: a SKU's journal is only
    /// ever opened, never closed.
    pub(super) async fn with_journal<T, F, Fut>(
        &self,
        sku: &Sku,
        deadline: tokio::time::Instant,
        call: F,
    ) -> Result<T, UpstreamError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        match call().await {
            Err(fault) if fault.kind == FaultKind::NoJournal => {
                super::journal::open(&self.upstream, &self.scripts, &self.keys, sku, deadline)
                    .await?;
                self.books.metrics.record_journal_opened();
                call().await
            }
            other => other,
        }
    }
}

/// A call's result as its RESP reply.
pub(super) fn stock_reply(result: StockResult) -> Reply {
    match result {
        Ok(reply) => Reply::Stock(reply),
        Err(fault) => Reply::Error(fault.reply_text()),
    }
}

/// What one stock command came to, as both faces read it: RESP writes it
/// as its reply ([`Answer::into_reply`]), HTTP as its JSON.
#[derive(Debug)]
pub enum Answer {
    /// A business outcome or a fault: a call on one request, STOCK.SET,
    /// STOCK.ADD.
    Stock(StockResult),
    /// An order command's.
    Order(Result<order::OrderReply, UpstreamError>),
    /// STOCK.LOCATIONS's: `None` when the SKU has no stock.
    Locations(Result<Option<location::locations::StockLocations>, location::locations::Unread>),
    /// ORDER.STATUS's.
    OrderState(Result<order::status::OrderState, UpstreamError>),
    /// A name in the request breaks its rule before anything ran (`-ERR
    /// <reason>` over RESP, 400 over HTTP).
    Invalid(crate::params::InvalidParam),
    /// Refused by the configuration before anything ran, with the error
    /// RESP answers (`-NOPERM ...`; 403 over HTTP).
    Refused(&'static str),
    /// The reply of a command only RESP serves (STOCK.GET, STOCK.STATUS).
    Reply(Reply),
}

impl Answer {
    /// The answer as the RESP reply.
    pub fn into_reply(self) -> Reply {
        match self {
            Answer::Stock(result) => stock_reply(result),
            Answer::Order(Ok(reply)) => reply.to_reply(),
            Answer::Locations(Ok(None)) => Reply::Null,
            Answer::Locations(Ok(Some(found))) => found.to_reply(),
            Answer::Locations(Err(location::locations::Unread::Shape)) => {
                Reply::error(location::locations::Unread::SHAPE)
            }
            Answer::Locations(Err(location::locations::Unread::Fault(fault)))
            | Answer::Order(Err(fault))
            | Answer::OrderState(Err(fault)) => Reply::Error(fault.reply_text()),
            Answer::OrderState(Ok(state)) => state.to_reply(),
            Answer::Invalid(invalid) => Reply::error(format!("ERR {invalid}")),
            Answer::Refused(text) => Reply::error(text),
            Answer::Reply(reply) => reply,
        }
    }
}
