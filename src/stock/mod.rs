//! The stock service: every command that touches stock goes through here,
//! whichever door it came in by (RESP or HTTP). One file per command, each
//! with its format, its arguments, its script call and its reply:
//!
//! - [`deduct`]: DEDUCT, the hot path.
//! - [`revert`]: REVERT, compensation (of a deduction or a hold).
//! - [`hold`]: HOLD, units set aside until CONFIRM or their expiry.
//! - [`confirm`]: CONFIRM, a hold made final.
//! - [`admin`]: STOCK.GET, STOCK.SET, STOCK.ADD: reading, restocking and
//!   correcting stock (SET and ADD need `--admin-commands`, are applied
//!   once per op_id, and each is written to the audit log).
//! - [`status`]: STOCK.STATUS: one request's record, for support.
//!
//! Each of the four commands on one request says in its file what it is
//! ([`single::Single`]: its parse, script and settings, reply shape and
//! access-log fields); the service reads nothing else about it. Beside
//! them, [`wire`] encodes the script calls those four make, [`sold_out`] answers DEDUCTs on a sold-out SKU from one
//! read, [`coalesce`] runs a hot SKU's DEDUCTs (and their reads) that wait
//! for its primary together as one call, and [`sweeper`] gives back the
//! expired holds of SKUs no request touches.
//!
//! What they share lives here: the service's settings, the metrics and the
//! access log of each answered request, and the stale-id check.

pub mod admin;
mod books;
mod coalesce;
pub mod confirm;
pub mod deduct;
pub mod hold;
pub mod journal;
mod nonces;
pub mod order;
pub mod revert;
mod single;
pub mod sold_out;
pub mod status;
pub mod sweeper;
mod wire;

use crate::config::{AccessLog, Config};
pub use crate::doc::StockCommand;
use crate::error::UpstreamError;
use crate::keys::KeyLayout;
use crate::metrics::Metrics;
use crate::outcome::{Code, StockReply};
use crate::params::{InvalidParam, RequestId, Sku};
use crate::pipeline::{Answer, Completion, Join, Joinable, PipeError};
use crate::reply::Reply;
use crate::script::Scripts;
use crate::upstream::Upstream;
use crate::upstream::Verdict;
use books::AccessEntry;
use bytes::Bytes;
use nonces::Nonces;
use order::OrderCommand;
use single::{CallerArgs, Limits, OneRequest, Setting, Single};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// What a stock command touches in Redis, for the order of one client
/// connection's requests ([`crate::connection`]): commands on different
/// SKUs commute, so only those that share a SKU (or span several) must
/// take effect in the order sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touches<'a> {
    /// One SKU's keys (its name as sent), by a script call that its node
    /// pipe keeps in order behind the earlier ones of that SKU.
    Piped(&'a [u8]),
    /// One SKU's keys, by a path of its own (the redis crate).
    Sku(&'a [u8]),
    /// An ORDER or ORDER.HOLD: its order's intent (`id`) and the SKUs of
    /// its lines (`pairs`: `<sku> <qty> ...` as sent), each by a saga of
    /// its own. Ordered with the requests on those SKUs and with the other
    /// commands of its order; an ORDER on other SKUs goes alongside.
    Lines { id: &'a [u8], pairs: &'a [Bytes] },
    /// An order command that names no SKU (ORDER.CONFIRM, ORDER.REVERT,
    /// ORDER.STATUS): ordered with everything.
    All,
}

impl StockCommand {
    /// What `self` with `args` (after the name, arity checked) touches.
    pub fn touches(self, args: &[Bytes]) -> Touches<'_> {
        let sku = || args.first().map_or(&[][..], |sku| &sku[..]);
        match self {
            StockCommand::Deduct
            | StockCommand::Revert
            | StockCommand::Hold
            | StockCommand::Confirm => Touches::Piped(sku()),
            StockCommand::Get | StockCommand::Set | StockCommand::Add | StockCommand::Status => {
                Touches::Sku(sku())
            }
            StockCommand::Order => Touches::Lines {
                id: sku(),
                pairs: args.get(1..).unwrap_or_default(),
            },
            StockCommand::OrderHold => Touches::Lines {
                id: sku(),
                pairs: args.get(2..).unwrap_or_default(),
            },
            StockCommand::OrderConfirm | StockCommand::OrderRevert | StockCommand::OrderStatus => {
                Touches::All
            }
        }
    }
}

/// Who sent a request: for the audit log of operators' changes. Empty for
/// the commands that don't log it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client_id: Option<u64>,
    pub addr: Option<SocketAddr>,
    pub name: Option<Bytes>,
}

/// What one DEDUCT, REVERT, HOLD or CONFIRM came to.
pub type StockResult = Result<StockReply, UpstreamError>;

/// A DEDUCT, REVERT, HOLD or CONFIRM checked and on its way to Redis: what its answer
/// needs to become a reply, and what its slow path needs to send it again.
///
/// A client connection doesn't await each call: it [`prepare`]s it,
/// [`submit`]s it to the key's node pipe with its mailbox as the
/// completion, and [`conclude`]s it when the answer arrives; only a call
/// whose answer calls for the redis crate ([`Concluded::Fallback`]) becomes
/// a future ([`StockService::fallback`]).
///
/// [`prepare`]: StockService::prepare
/// [`submit`]: StockService::submit
/// [`conclude`]: StockService::conclude
pub struct StockCall {
    op: Op,
    /// The call's nonce (see [`Nonces`]); the same in a fallback resend.
    nonce: [u8; 16],
    /// When the request was read.
    arrived: Instant,
    /// When it was handed to Redis: `--timeout` counts from here.
    sent: tokio::time::Instant,
    deadline: tokio::time::Instant,
    /// A DEDUCT on a SKU seen short: read its keys first ([`sold_out`]).
    read_first: bool,
    /// One line of an order ([`order`]): its CONFIRM and REVERT take a
    /// missing stock key as zero stock, so that an order that named a SKU
    /// with none still ends (its line there holds nothing to give back).
    order_line: bool,
    /// A HOLD filed in the sweep index ([`sweeper`]): all but an ORDER's
    /// lines.
    swept: bool,
}

/// The command a [`StockCall`] carries, checked.
enum Op {
    Deduct(deduct::Deduct),
    Revert(revert::Revert),
    Hold(hold::Hold),
    Confirm(confirm::Confirm),
}

/// `$body` with `$x` bound to whichever command `$op` carries.
macro_rules! on_op {
    ($op:expr, $x:ident => $body:expr) => {
        match $op {
            Op::Deduct($x) => $body,
            Op::Revert($x) => $body,
            Op::Hold($x) => $body,
            Op::Confirm($x) => $body,
        }
    };
}

impl Op {
    /// What its own file says of it.
    fn single(&self) -> &'static Single {
        match self {
            Op::Deduct(_) => &deduct::CALL,
            Op::Revert(_) => &revert::CALL,
            Op::Hold(_) => &hold::CALL,
            Op::Confirm(_) => &confirm::CALL,
        }
    }

    fn command(&self) -> StockCommand {
        self.single().command
    }

    fn request(&self) -> (&Sku, &RequestId) {
        on_op!(self, x => x.request())
    }

    fn caller_args(&self) -> CallerArgs<'_> {
        on_op!(self, x => x.caller_args())
    }

    fn qty(&self) -> Option<&[u8]> {
        on_op!(self, x => x.qty())
    }
}

impl Single {
    /// The description of `command`, if it is a call on one request: the
    /// one list of which commands are, read from their own files.
    fn of(command: StockCommand) -> Option<&'static Single> {
        match command {
            StockCommand::Deduct => Some(&deduct::CALL),
            StockCommand::Revert => Some(&revert::CALL),
            StockCommand::Hold => Some(&hold::CALL),
            StockCommand::Confirm => Some(&confirm::CALL),
            StockCommand::Order
            | StockCommand::OrderHold
            | StockCommand::OrderConfirm
            | StockCommand::OrderRevert
            | StockCommand::OrderStatus
            | StockCommand::Get
            | StockCommand::Set
            | StockCommand::Add
            | StockCommand::Status => None,
        }
    }

    /// The access-log fields of a request as sent (it may be invalid).
    fn entry<'a>(&self, args: &'a [Bytes]) -> AccessEntry<'a> {
        let field = |i: usize| args.get(i).map(|a| &a[..]);
        AccessEntry {
            command: self.command,
            sku: field(0),
            request_id: field(self.request_id_at),
            qty: self.qty_at.and_then(field),
        }
    }
}

impl StockCall {
    /// When the call's answer is owed at the latest.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// The SKU the call is on, as sent.
    pub fn sku(&self) -> &[u8] {
        self.op.request().0.as_bytes()
    }

    /// A DEDUCT that reads its SKU's keys first ([`sold_out`]): its script,
    /// if the read calls for it, runs later through the slow path, so the
    /// node pipe alone does not keep it in order.
    pub fn reads_first(&self) -> bool {
        self.read_first
    }

    fn entry(&self) -> AccessEntry<'_> {
        let (sku, request_id) = self.op.request();
        AccessEntry {
            command: self.op.command(),
            sku: Some(sku.as_bytes()),
            request_id: Some(request_id.as_bytes()),
            qty: self.op.qty(),
        }
    }
}

/// What checking a request came to.
pub enum Prepared {
    /// Answered without Redis (invalid parameters, a stale id), its metrics
    /// recorded.
    Answered(StockResult),
    /// Ready to send.
    Call(StockCall),
}

/// What a node pipe's answer to a call came to.
pub enum Concluded {
    /// The reply or fault, its metrics recorded.
    Answered(StockResult),
    /// Send it again through the redis crate ([`StockService::fallback`]).
    Fallback(StockCall),
}

pub struct StockService {
    upstream: Arc<Upstream>,
    scripts: Scripts,
    keys: KeyLayout,
    /// What `parse` checks against ([`single::Limits`]).
    limits: Limits,
    max_order_lines: usize,
    /// `--order-line-hold` (at most `--max-hold`), in ms.
    order_line_hold_ms: u64,
    retry_window: Duration,
    /// Script arguments that never change, spelled once at startup.
    retry_window_arg: String,
    /// The scripts' "replicate" argument: "1" with `--wait-replicas`. A
    /// reply that reports an earlier write then writes its record again,
    /// unchanged, so that the WAIT after it confirms that record and not
    /// only what this connection wrote (see `lua/common.lua`).
    replicate_arg: &'static str,
    /// The scripts' "journal" argument: "1" with `--journal` (each change
    /// appended to its SKU's journal in the same call, [`journal`]).
    journal_arg: &'static str,
    reject_stale_ids: bool,
    admin_commands: bool,
    access_log: AccessLog,
    metrics: Arc<Metrics>,
    nonces: Nonces,
    wires: Wires,
    /// What this stockgate told the sweep leader lately ([`sweeper`]).
    sweep_hints: Arc<sweeper::Hints>,
    /// SKUs seen short lately ([`sold_out`]); `None` with the path off.
    sold_out: Option<sold_out::Memory>,
    /// Writes a hot SKU's DEDUCTs as one call ([`coalesce`]); `None` with
    /// `--coalesce-deducts 1`.
    coalesce: Option<Arc<dyn Join>>,
    /// The same for the sold-out reads ([`coalesce::ReadJoin`]).
    coalesce_reads: Option<Arc<dyn Join>>,
    /// A load of `lua/deduct_many.lua` is under way after a NOSCRIPT.
    reloading: Arc<AtomicBool>,
    /// `--sweeper`: the background passes give expired holds back (they
    /// always recover the orders left behind).
    sweep_holds: bool,
    missing_zero: bool,
}

/// The pre-encoded script call of each command on one request, by
/// [`StockCommand`]: as the flags say, and for an order's lines
/// (`--missing-stock zero` whatever the flag says, [`StockCall::order_line`]).
struct Wires {
    plain: Vec<Option<wire::Wire>>,
    line: Vec<Option<wire::Wire>>,
}

impl Wires {
    fn of(&self, command: StockCommand, order_line: bool) -> &wire::Wire {
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
        // then the nonce and the replicate and journal flags (see `wire`, and each lua/
        // header).
        let wires_with = |line: bool| -> Vec<Option<wire::Wire>> {
            StockCommand::ALL
                .iter()
                .map(|&command| {
                    let single = Single::of(command)?;
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
                    Some(wire::Wire::new(
                        (single.script)(&scripts),
                        single.caller_args,
                        &settings,
                        [replicate, journal_arg.as_bytes()],
                    ))
                })
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
        StockService {
            upstream,
            scripts,
            keys: config.keys.clone(),
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
            access_log: config.access_log,
            metrics,
            nonces: Nonces::new(),
            wires,
            sweep_hints: Arc::default(),
            // A duplicate's answer under --wait-replicas must wait for a
            // replicated write, which only the script makes.
            sold_out: (config.sold_out_reads && config.upstream.durability.is_none())
                .then(sold_out::Memory::default),
            missing_zero: config.missing_stock.as_arg() == "zero",
            coalesce,
            coalesce_reads: (config.coalesce_deducts > 1).then(|| {
                Arc::new(coalesce::ReadJoin {
                    most: config.coalesce_deducts,
                }) as Arc<dyn Join>
            }),
            reloading: Arc::default(),
            sweep_holds: config.sweeper,
        }
    }

    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// Serves one command whose arguments (after the name) are `args`, as
    /// the RESP reply. `arrived` is when the request was read; `caller`
    /// who sent it (the audit log of STOCK.SET and STOCK.ADD names them).
    pub async fn serve(
        self: &Arc<Self>,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        caller: &Caller,
    ) -> Reply {
        let result = match command {
            StockCommand::Deduct
            | StockCommand::Revert
            | StockCommand::Hold
            | StockCommand::Confirm => self.call(command, args, arrived).await,
            StockCommand::Order => return self.order(OrderCommand::Order, args, arrived).await,
            StockCommand::OrderHold => return self.order(OrderCommand::Hold, args, arrived).await,
            StockCommand::OrderConfirm => {
                return self.order(OrderCommand::Confirm, args, arrived).await;
            }
            StockCommand::OrderRevert => {
                return self.order(OrderCommand::Revert, args, arrived).await;
            }
            StockCommand::Get => return self.get(args).await,
            StockCommand::Set => return self.change(admin::Correction::Set, args, caller).await,
            StockCommand::Add => return self.change(admin::Correction::Add, args, caller).await,
            StockCommand::Status => return self.status(args).await,
            StockCommand::OrderStatus => return self.order_status(args).await,
        };
        match result {
            Ok(reply) => Reply::Stock(reply),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// A DEDUCT, REVERT, HOLD or CONFIRM (`args` after the name), awaited,
    /// with its metrics and access log: for the HTTP face and [`Self::serve`].
    pub async fn call(
        &self,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
    ) -> StockResult {
        match self.prepare(command, args, arrived) {
            Some(prepared) => self.run(prepared).await,
            None => unreachable!("{command:?} is not a call on one request"),
        }
    }

    /// Checks a DEDUCT, REVERT, HOLD or CONFIRM (`args` after the name)
    /// and makes it a call, or answers it (code 3). `None` for the other
    /// stock commands, which run as futures ([`StockService::serve`]).
    pub fn prepare(
        &self,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
    ) -> Option<Prepared> {
        let single = Single::of(command)?;
        let parsed = (single.parse)(args, &self.limits)
            .and_then(|op| not_an_order_line(op.request().1).map(|()| op))
            .and_then(|op| self.fresh(op.request().1).map(|()| op));
        Some(match parsed {
            Ok(op) => {
                let read_first = match (&op, &self.sold_out) {
                    (Op::Deduct(deduct), Some(memory)) => {
                        memory.wants_read(deduct.sku.as_bytes(), deduct.qty.get())
                    }
                    _ => false,
                };
                let mut call = self.call_of(op, arrived);
                call.read_first = read_first;
                Prepared::Call(call)
            }
            Err(invalid) => {
                let reply = StockReply::invalid(invalid.0).with_expiry(single.shows_expiry);
                self.record(single.entry(args), Ok(reply.code), arrived);
                let result = Ok(reply);
                Prepared::Answered(result)
            }
        })
    }

    /// `op` on its way to Redis now, with a fresh nonce: `--timeout`
    /// counts from here.
    fn call_of(&self, op: Op, arrived: Instant) -> StockCall {
        let sent = tokio::time::Instant::now();
        StockCall {
            op,
            nonce: self.nonces.next(),
            arrived,
            sent,
            deadline: sent + self.upstream.timeout(),
            read_first: false,
            order_line: false,
            swept: true,
        }
    }

    /// Queues `call` on its key's node pipe; its answer goes to
    /// `completion`. Refused at once (the completion handed back) when no
    /// pipe can take it: conclude the call with the refusal. A HOLD also
    /// marks its SKU in the sweep index ([`sweeper`]).
    pub fn submit(
        &self,
        call: &StockCall,
        completion: Completion,
    ) -> Result<(), (PipeError, Completion)> {
        let (sku, request_id) = call.op.request();
        if let Op::Hold(hold) = &call.op
            && call.swept
        {
            self.mark_for_sweep(sku, Duration::from_millis(hold.ttl.get()));
        }
        if call.read_first
            && let Some(join) = &self.coalesce_reads
        {
            let keys = &self.keys;
            return self.upstream.submit_joinable(
                crate::keys::sku_slot(sku),
                call.deadline,
                completion,
                Joinable {
                    key: sku.as_bytes(),
                    join,
                },
                |gathered| coalesce::write_read_shared(keys, sku, gathered),
                |gathered| coalesce::write_read_member(keys, sku, request_id, gathered),
            );
        }
        if call.read_first {
            let keys = &self.keys;
            return self.upstream.submit_script(
                crate::keys::sku_slot(sku),
                call.deadline,
                completion,
                |buf| {
                    let [_, held] = keys.hold_key_parts(sku);
                    sold_out::encode_read(
                        [
                            &keys.stock_key_parts(sku),
                            &keys.record_key_parts(sku, request_id),
                            &held,
                        ],
                        buf,
                    )
                },
            );
        }
        if let (Op::Deduct(deduct), Some(join)) = (&call.op, &self.coalesce) {
            let keys = &self.keys;
            return self.upstream.submit_joinable(
                crate::keys::sku_slot(sku),
                call.deadline,
                completion,
                Joinable {
                    key: sku.as_bytes(),
                    join,
                },
                |gathered| coalesce::write_shared(keys, sku, gathered),
                |gathered| coalesce::write_member(keys, deduct, request_id, &call.nonce, gathered),
            );
        }
        let wire = self.wire(call);
        self.upstream.submit_script(
            crate::keys::sku_slot(sku),
            call.deadline,
            completion,
            |buf| {
                let caller = call.op.caller_args();
                wire.encode(
                    self.upstream.calling(),
                    &self.keys,
                    sku,
                    request_id,
                    caller.as_slice(),
                    &call.nonce,
                    buf,
                )
            },
        )
    }

    fn wire(&self, call: &StockCall) -> &wire::Wire {
        self.wires.of(call.op.command(), call.order_line)
    }

    /// A node pipe's answer to `call` (or why there is none), read: the
    /// reply, or the fallback it calls for.
    pub fn conclude(&self, call: StockCall, answer: Result<Answer, PipeError>) -> Concluded {
        if call.read_first {
            return self.conclude_read(call, answer);
        }
        if let (Op::Deduct(deduct), Ok(answer)) = (&call.op, &answer)
            && answer.frame.starts_with(b"-NOSCRIPT")
        {
            self.reload_coalesced(&deduct.sku);
        }
        match self.upstream.verdict(answer) {
            Verdict::Settled(result) => {
                let result = self.finish(&call, result);
                Concluded::Answered(result)
            }
            Verdict::Fallback => Concluded::Fallback(call),
        }
    }

    /// A DEDUCT met NOSCRIPT: the node lost its scripts (a restart, a
    /// failover, SCRIPT FLUSH). The DEDUCT itself goes again through the
    /// redis crate, whose EVAL caches `lua/deduct.lua` there again; this
    /// caches `lua/deduct_many.lua` too, with an EVAL of a call with no
    /// members (it reads and writes nothing), so the SKU's next gathered
    /// calls don't all take the slow path until the health loop's next
    /// script check. One at a time.
    fn reload_coalesced(&self, sku: &Sku) {
        if self.coalesce.is_none() || self.reloading.swap(true, Ordering::AcqRel) {
            return;
        }
        let upstream = self.upstream.clone();
        let script = self.scripts.deduct_many.clone();
        let keys = self.keys.sku_keys(sku);
        let [window, max_qty, missing] = self.wires.of(StockCommand::Deduct, false).fixed_argv();
        let args: Vec<Vec<u8>> = [
            window,
            max_qty,
            missing,
            self.replicate_arg.as_bytes(),
            self.journal_arg.as_bytes(),
        ]
        .map(<[u8]>::to_vec)
        .into();
        let reloading = self.reloading.clone();
        tokio::spawn(async move {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            if let Err(fault) = upstream.eval(&script, &keys.all(), &args).await {
                tracing::debug!(%fault, "could not load the coalesced DEDUCT script again");
            }
            reloading.store(false, Ordering::Release);
        });
    }

    /// The answer to a call's read ([`sold_out`]): the script's answer in
    /// the state it found, or the script itself, sent through the slow path
    /// (a read that finds enough stock ends the SKU's sold-out spell, so
    /// this is rare).
    fn conclude_read(&self, mut call: StockCall, answer: Result<Answer, PipeError>) -> Concluded {
        let (Op::Deduct(deduct), Some(memory)) = (&call.op, &self.sold_out) else {
            unreachable!("only DEDUCTs read first, and only with the path on")
        };
        let decision = match &answer {
            Ok(answer) => sold_out::Read::from_frame(&answer.frame)
                .map(|read| sold_out::decide(&read, deduct.qty.as_bytes(), self.missing_zero)),
            Err(PipeError::Lost) => None,
            Err(PipeError::Timeout | PipeError::Overloaded) => {
                // Not a read's failing alone: the node is slow or full, as it
                // would be for the script.
                call.read_first = false;
                return self.conclude(call, answer);
            }
        };
        match decision {
            Some(sold_out::Decision::Answer(result)) => {
                self.metrics.record_sold_out_read(true);
                Concluded::Answered(self.finish(&call, result))
            }
            Some(sold_out::Decision::RunScript) | None => {
                self.metrics.record_sold_out_read(false);
                memory.forget(deduct.sku.as_bytes());
                call.read_first = false;
                Concluded::Fallback(call)
            }
        }
    }

    /// Whether a DEDUCT with `args` (after the name) would read its SKU's
    /// keys first now ([`sold_out`]); false for anything else.
    pub fn would_read_first(&self, command: StockCommand, args: &[Bytes]) -> bool {
        let (StockCommand::Deduct, Some(memory), [sku, qty, ..]) = (command, &self.sold_out, args)
        else {
            return false;
        };
        if memory.is_empty() {
            return false;
        }
        std::str::from_utf8(qty)
            .ok()
            .and_then(|q| q.parse::<u64>().ok())
            .is_some_and(|qty| memory.wants_read(sku, qty))
    }

    /// A read-first DEDUCT whose read's answer can't stand (an earlier
    /// request of its connection on its SKU takes effect after the read:
    /// [`crate::connection`]): its script runs instead, through the slow
    /// path, once that request is done. Counted as a read sent on to the
    /// script.
    pub fn script_instead(&self, mut call: StockCall) -> StockCall {
        if call.read_first {
            self.metrics.record_sold_out_read(false);
            call.read_first = false;
        }
        call
    }

    /// The slow path of a call: the redis crate, within what is left of its
    /// deadline.
    pub async fn fallback(&self, call: StockCall) -> StockResult {
        let result = self.resend(&call).await;
        self.finish(&call, result)
    }

    /// `call` sent again through the redis crate, its outcome not yet
    /// recorded.
    async fn resend(&self, call: &StockCall) -> StockResult {
        let (sku, request_id) = call.op.request();
        let keys = self.keys.request_keys(sku, request_id);
        let wire = self.wire(call);
        let caller = call.op.caller_args();
        let argv = wire.argv(caller.as_slice(), &call.nonce);
        let keys = keys.all();
        self.with_journal(sku, call.deadline, || {
            self.upstream
                .eval_fallback(&wire.script, &keys, &argv, call.deadline)
        })
        .await
    }

    /// A call from start to end, awaited: for the HTTP face, which serves
    /// one request per task.
    async fn run(&self, prepared: Prepared) -> StockResult {
        let call = match prepared {
            Prepared::Answered(result) => return result,
            Prepared::Call(call) => call,
        };
        let answer = self.await_answer(&call).await;
        match self.conclude(call, answer) {
            Concluded::Answered(result) => result,
            Concluded::Fallback(call) => self.fallback(call).await,
        }
    }

    /// Submits `call` and awaits its node pipe's answer, within its
    /// deadline.
    async fn await_answer(&self, call: &StockCall) -> Result<Answer, PipeError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.submit(call, Completion::Oneshot(reply)) {
            Ok(()) => match tokio::time::timeout_at(call.deadline, answer).await {
                Ok(answer) => answer.unwrap_or(Err(PipeError::Lost)),
                Err(_) => Err(PipeError::Timeout),
            },
            Err((refused, _)) => Err(refused),
        }
    }

    /// A call's outcome as its command shows it, with its metrics and
    /// access log recorded.
    fn finish(&self, call: &StockCall, result: StockResult) -> StockResult {
        let single = call.op.single();
        let command = single.command;
        let result = result.map(|reply| reply.with_expiry(single.shows_expiry));
        self.metrics.record_upstream(command, call.sent.elapsed());
        if let Ok(reply) = &result {
            self.record_holds(reply, command == StockCommand::Confirm);
            self.index_hold(&call.op, reply);
            if let (Op::Deduct(deduct), Some(memory)) = (&call.op, &self.sold_out) {
                memory.learn(
                    deduct.sku.as_bytes(),
                    reply.code,
                    reply.remain,
                    reply.effects.held,
                );
            }
        }
        self.record(
            call.entry(),
            result.as_ref().map(|reply| reply.code),
            call.arrived,
        );
        result
    }

    /// A HOLD that holds (0, or 1 for a retry whose first answer may have
    /// been lost) files its SKU in the sweep index by the hold's expiry
    /// ([`sweeper`]).
    fn index_hold(&self, op: &Op, reply: &StockReply) {
        if let Op::Hold(hold) = op
            && matches!(reply.code, Code::Ok | Code::Duplicate)
        {
            self.mark_held(&hold.sku, reply.expires_at.unwrap_or(0));
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

/// The single-line commands refuse the request_ids of order lines (code
/// 3): only an order's own saga may hold, confirm or give back its lines,
/// or the order would no longer be all or nothing.
fn not_an_order_line(request_id: &RequestId) -> Result<(), InvalidParam> {
    if request_id
        .as_bytes()
        .starts_with(crate::keys::ORDER_LINE_PREFIX.as_bytes())
    {
        return Err(InvalidParam(format!(
            "request_id may not start with {:?}: it names the lines of an ORDER",
            crate::keys::ORDER_LINE_PREFIX
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::Calling;

    /// A stockgate's shared state with default settings, `--wait-replicas
    /// 1` when `durable` (no Redis needed: nothing is sent).
    fn shared_state(durable: bool) -> crate::state::Shared {
        let mut config = Config::for_upstream(vec!["redis://127.0.0.1:1".into()]);
        if durable {
            config.upstream.durability = Some(crate::config::Durability {
                replicas: 1,
                timeout: Duration::from_millis(100),
            });
        }
        crate::state::Shared::new(config, 0)
    }

    #[test]
    fn the_hot_path_writes_exactly_the_call_the_fallback_sends() {
        // The node pipes get each call's FCALL or EVALSHA from pre-encoded
        // parts; the redis-rs fallback from the argument lists. They must
        // agree.
        for (durable, calling) in [false, true]
            .into_iter()
            .flat_map(|d| [(d, Calling::Function), (d, Calling::Eval)])
        {
            let shared = shared_state(durable);
            let service = &shared.service;
            let arg = |s: &str| Bytes::copy_from_slice(s.as_bytes());
            for (command, args) in [
                (
                    StockCommand::Deduct,
                    vec![arg("sku-9"), arg("12"), arg("req-77"), arg("ORD 1")],
                ),
                (StockCommand::Deduct, vec![arg("s"), arg("1"), arg("r")]),
                (StockCommand::Revert, vec![arg("sku-9"), arg("req-77")]),
                (StockCommand::Revert, vec![arg("s"), arg("req-77")]),
                (StockCommand::Confirm, vec![arg("s"), arg("h-1")]),
                (
                    StockCommand::Hold,
                    vec![arg("sku-9"), arg("3"), arg("h-1"), arg("900000"), arg("O")],
                ),
                (
                    StockCommand::Hold,
                    vec![arg("s"), arg("1"), arg("h-2"), arg("1000")],
                ),
                (StockCommand::Confirm, vec![arg("sku-9"), arg("h-1")]),
            ] {
                let Some(Prepared::Call(mut call)) =
                    service.prepare(command, &args, Instant::now())
                else {
                    panic!("{command:?} {args:?} is a valid call")
                };
                // An order's lines end with `--missing-stock zero`.
                call.order_line = matches!(command, StockCommand::Revert | StockCommand::Confirm)
                    && args[0][..] == b"sku-9"[..];
                let mut hot = bytes::BytesMut::new();
                let mut slow = bytes::BytesMut::new();
                let (sku, request_id) = call.op.request();
                let wire = service.wire(&call);
                let caller = call.op.caller_args();
                let caller = caller.as_slice();
                wire.encode(
                    calling,
                    &service.keys,
                    sku,
                    request_id,
                    caller,
                    &call.nonce,
                    &mut hot,
                );
                let keys = service.keys.request_keys(sku, request_id);
                wire.script.write_call(
                    calling,
                    &mut slow,
                    &keys.all(),
                    &wire.argv(caller, &call.nonce),
                );
                assert_eq!(hot, slow, "{command:?}, durable {durable}, {calling:?}");
                let verb = if calling == Calling::Function {
                    &b"FCALL"[..]
                } else {
                    b"EVALSHA"
                };
                assert!(hot.windows(verb.len()).any(|w| w == verb), "{calling:?}");
                // A word of the settings argument (lua/common.lua, settle).
                let zero = hot.windows(6).any(|w| w == b" zero ");
                assert_eq!(zero, call.order_line, "{command:?}: missing-stock mode");
            }
        }
    }

    #[test]
    fn a_coalesced_call_writes_its_members_own_calls_or_one_call_of_all() {
        // Alone, a DEDUCT gathered for coalescing is the plain EVALSHA of
        // lua/deduct.lua, byte for byte; together, one EVALSHA of
        // lua/deduct_many.lua whose keys and arguments are each member's
        // own, in order, after what they share.
        for durable in [false, true] {
            let shared = shared_state(durable);
            let service = &shared.service;
            let join = service.coalesce.as_ref().expect("on by default");
            let arg = |s: &str| Bytes::copy_from_slice(s.as_bytes());
            let calls: Vec<StockCall> = [
                vec![arg("hot"), arg("2"), arg("a"), arg("ORD 1")],
                vec![arg("hot"), arg("1"), arg("b")],
                vec![arg("hot"), arg("3"), arg("a")],
            ]
            .iter()
            .map(
                |args| match service.prepare(StockCommand::Deduct, args, Instant::now()) {
                    Some(Prepared::Call(call)) => call,
                    _ => panic!("{args:?} is a valid DEDUCT"),
                },
            )
            .collect();
            let gather = |calls: &[StockCall]| {
                let mut gathered = crate::pipeline::Gathered::default();
                for call in calls {
                    let Op::Deduct(deduct) = &call.op else {
                        unreachable!()
                    };
                    if gathered.members == 0 {
                        coalesce::write_shared(&service.keys, &deduct.sku, &mut gathered);
                    }
                    let (_, request_id) = call.op.request();
                    coalesce::write_member(
                        &service.keys,
                        deduct,
                        request_id,
                        &call.nonce,
                        &mut gathered,
                    );
                    gathered.members += 1;
                }
                let mut out = bytes::BytesMut::new();
                join.write(&gathered, &mut out);
                out
            };

            let alone = &calls[1];
            let wire = service.wire(alone);
            let (sku, request_id) = alone.op.request();
            let mut own = bytes::BytesMut::new();
            let caller = alone.op.caller_args();
            wire.encode(
                shared.upstream.calling(),
                &service.keys,
                sku,
                request_id,
                caller.as_slice(),
                &alone.nonce,
                &mut own,
            );
            assert_eq!(
                gather(std::slice::from_ref(alone)),
                own,
                "durable {durable}"
            );

            let sku_keys = service.keys.sku_keys(sku);
            let records: Vec<Vec<u8>> = calls
                .iter()
                .map(|c| service.keys.request_keys(sku, c.op.request().1).record)
                .collect();
            let mut keys: Vec<&[u8]> = sku_keys.all().to_vec();
            keys.extend(records.iter().map(Vec::as_slice));
            let [window, max_qty, missing] = wire.fixed_argv();
            let mut argv: Vec<&[u8]> = vec![
                window,
                max_qty,
                missing,
                service.replicate_arg.as_bytes(),
                service.journal_arg.as_bytes(),
            ];
            for call in &calls {
                let caller = call.op.caller_args();
                argv.extend_from_slice(caller.as_slice());
                argv.push(&call.nonce);
            }
            let mut one = bytes::BytesMut::new();
            service.scripts.deduct_many.write_call(
                shared.upstream.calling(),
                &mut one,
                &keys,
                &argv,
            );
            assert_eq!(gather(&calls), one, "durable {durable}");
        }
    }

    #[test]
    fn nonces_are_distinct_hex() {
        let nonces = Nonces::new();
        let seen: std::collections::HashSet<[u8; 16]> =
            (0..100_000).map(|_| nonces.next()).collect();
        assert_eq!(seen.len(), 100_000);
        assert!(seen.iter().all(|n| n.iter().all(u8::is_ascii_hexdigit)));
    }
}
