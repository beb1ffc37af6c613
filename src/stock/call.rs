//! A call on one request (DEDUCT, REVERT, HOLD, CONFIRM, HOLD.EXTEND,
//! HOLD.SHRINK, DEDUCT.AT, HOLD.AT), from the request to its reply: the one
//! owner of its life, whoever waits for it (a client connection's requests
//! in flight, an HTTP request, an order's line).
//!
//! ```text
//!   prepare ──► submit ──► conclude ──► (the reply)
//!      │          │            │
//!      └ code 3   └ refused ───┴──► fallback (the redis crate) ──► (the reply)
//! ```
//!
//! [`StockService::prepare`] checks the request and makes it a call (or
//! answers code 3); [`StockService::submit`] writes it into its SKU's node
//! pipe (a sold-out SKU's DEDUCT as a read of its keys first, a hot SKU's
//! DEDUCTs gathered into one call), with a completion its answer goes to;
//! [`StockService::conclude`] reads the answer; anything unusual goes
//! again through [`StockService::fallback`]. Every end of a call goes
//! through [`StockService::finish`], which records what it came to: its
//! metrics and access log, the holds it moved, the sweep index.
//! [`StockService::run`] is the whole life awaited, for a caller with a
//! task of its own.

use super::books::AccessEntry;
use super::single::{Field, OneRequest, Shape, position};
use super::{StockCommand, StockService, coalesce, sold_out, wire};
use crate::auth::Account;
use crate::error::UpstreamError;
use crate::outcome::{Code, StockReply};
use crate::params::{InvalidParam, RequestId, Sku};
use crate::pipeline::{Answer, Bound, Completion, Gathered, Joinable, LoneMarks, PipeError};
use crate::upstream::Verdict;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// What one call on one request came to.
pub type StockResult = Result<StockReply, UpstreamError>;

/// A call checked and on its way to Redis: what its answer needs to
/// become a reply, and what its slow path needs to send it again. Boxed:
/// it moves from its check to its node pipe's slot and back to its end,
/// and copying its 260 bytes each time cost more than the allocation
/// (callgrind).
pub struct StockCall(Box<Call>);

impl std::ops::Deref for StockCall {
    type Target = Call;

    fn deref(&self) -> &Call {
        &self.0
    }
}

impl std::ops::DerefMut for StockCall {
    fn deref_mut(&mut self) -> &mut Call {
        &mut self.0
    }
}

/// What a [`StockCall`] holds.
pub struct Call {
    pub(super) request: OneRequest,
    /// The call's nonce (see [`super::nonces::Nonces`]); the same in a
    /// fallback resend.
    pub(super) nonce: [u8; 16],
    /// When the request was read.
    arrived: Instant,
    /// When it was handed to Redis: `--timeout` counts from here.
    sent: tokio::time::Instant,
    deadline: tokio::time::Instant,
    /// A DEDUCT on a SKU seen short: read its keys first ([`sold_out`]).
    read_first: bool,
    /// The user who sent it (for the access log): the account, a thin
    /// pointer, which every call moves around.
    user: Option<Arc<Account>>,
    /// Whose call it is, which decides its metrics and its missing-stock
    /// mode.
    pub(super) on_behalf: OnBehalf,
}

/// Whose call it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnBehalf {
    /// A caller's own request: its metrics and access log are its
    /// command's.
    Caller,
    /// One line of an order ([`super::order`]): its metrics are the
    /// order's, and a call that ends the line takes a missing stock key as
    /// zero stock, so that an order that named a SKU with none still ends
    /// (its line there holds nothing to give back). `swept`: a line HOLD
    /// filed in the sweep index (an ORDER.HOLD's lines).
    Line { swept: bool },
}

/// What checking a request came to.
pub enum Prepared {
    /// Answered without Redis (invalid parameters, a stale id), its
    /// metrics recorded.
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

impl StockCall {
    /// When the call's answer is owed at the latest.
    pub fn deadline(&self) -> tokio::time::Instant {
        self.deadline
    }

    /// The SKU the call is on, as sent.
    pub fn sku(&self) -> &[u8] {
        self.request.sku.as_bytes()
    }

    /// A DEDUCT that reads its SKU's keys first ([`sold_out`]): its script,
    /// if the read calls for it, runs later through the slow path, so the
    /// node pipe alone does not keep it in order.
    pub fn reads_first(&self) -> bool {
        self.read_first
    }

    fn entry(&self) -> AccessEntry<'_> {
        AccessEntry {
            command: self.request.command,
            sku: Some(self.request.sku.as_bytes()),
            request_id: Some(self.request.request_id.as_bytes()),
            qty: self.request.field(Field::Qty),
            user: self.user.as_deref().map(Account::name),
        }
    }

    /// Its answer is owed by `deadline` at the latest (an order's saga's).
    pub(super) fn limit_deadline(&mut self, deadline: tokio::time::Instant) {
        self.deadline = self.deadline.min(deadline);
    }

    fn order_line(&self) -> bool {
        matches!(self.on_behalf, OnBehalf::Line { .. })
    }
}

impl StockService {
    /// A call on one request (`args` after `command`'s name), from start to
    /// end, awaited: for the HTTP face and [`StockService::serve`].
    pub async fn call(
        &self,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        user: Option<Arc<Account>>,
    ) -> StockResult {
        match self.prepare(command, args, arrived, user) {
            Some(prepared) => self.run(prepared, Bound::Timer).await,
            None => unreachable!("{command:?} is not a call on one request"),
        }
    }

    /// Checks a call on one request (`args` after `command`'s name) and
    /// makes it a call, or answers it (code 3). `None` for the other stock
    /// commands.
    pub fn prepare(
        &self,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
        user: Option<Arc<Account>>,
    ) -> Option<Prepared> {
        let single = command.single()?;
        let parsed = OneRequest::parse(command, single, args, &self.settings.limits)
            .and_then(|request| self.fresh_request(&request).map(|()| request));
        Some(match parsed {
            Ok(request) => {
                let read_first = match (&self.fast.sold_out, &request.qty) {
                    (Some(memory), Some(qty)) if single.takes => {
                        memory.wants_read(request.sku.as_bytes(), qty.get())
                    }
                    _ => false,
                };
                let mut call = self.call_of(request, arrived, OnBehalf::Caller);
                call.read_first = read_first;
                call.user = user;
                Prepared::Call(call)
            }
            Err(invalid) => {
                let mut reply = StockReply::invalid(invalid.0);
                show(single.reply, &mut reply)
                    .unwrap_or_else(|_| unreachable!("a code 3 shows without an allocation"));
                let field = |f: Field| position(single, f).and_then(|i| args.get(i));
                let entry = AccessEntry {
                    command,
                    sku: args.first().map(|a| &a[..]),
                    request_id: field(Field::RequestId).map(|a| &a[..]),
                    qty: field(Field::Qty).map(|a| &a[..]),
                    user: user.as_deref().map(Account::name),
                };
                self.books.record(entry, Ok(reply.code), arrived.elapsed());
                Prepared::Answered(Ok(reply))
            }
        })
    }

    /// `request` on its way to Redis now, with a fresh nonce: `--timeout`
    /// counts from here.
    pub(super) fn call_of(
        &self,
        request: OneRequest,
        arrived: Instant,
        on_behalf: OnBehalf,
    ) -> StockCall {
        let sent = tokio::time::Instant::now();
        StockCall(Box::new(Call {
            request,
            nonce: self.nonces.next(),
            arrived,
            sent,
            deadline: sent + self.upstream.timeout(),
            read_first: false,
            user: None,
            on_behalf,
        }))
    }

    /// Queues `call` on its key's node pipe; its answer goes to
    /// `completion`. Refused at once (the completion handed back) when no
    /// pipe can take it: conclude the call with the refusal. A HOLD also
    /// marks its SKU in the sweep index ([`super::sweeper`]).
    pub fn submit(
        &self,
        call: &StockCall,
        completion: Completion,
    ) -> Result<(), (PipeError, Completion)> {
        let request = &call.request;
        let (sku, request_id) = (&request.sku, &request.request_id);
        if let Some(ttl) = &request.ttl
            && call.request.single.places_hold
            && call.on_behalf != (OnBehalf::Line { swept: false })
        {
            self.sweeper
                .mark_for_sweep(sku, Duration::from_millis(ttl.get()));
        }
        let keys = &self.keys;
        let slot = crate::keys::sku_slot(sku);
        if call.read_first {
            if let Some(join) = &self.fast.coalesce_reads {
                return self.upstream.submit_joinable(
                    slot,
                    call.deadline,
                    completion,
                    Joinable {
                        key: sku.as_bytes(),
                        join,
                        lone: None::<fn(&mut bytes::BytesMut) -> LoneMarks>,
                        shared: |gathered: &mut Gathered| {
                            coalesce::write_read_shared(keys, sku, gathered)
                        },
                        member: |gathered: &mut Gathered| {
                            coalesce::write_read_member(keys, sku, request_id, gathered)
                        },
                    },
                );
            }
            return self
                .upstream
                .submit_script(slot, call.deadline, completion, |buf| {
                    let [_, held, ..] = keys.side_key_parts(sku);
                    sold_out::encode_read(
                        [
                            &keys.stock_key_parts(sku),
                            &keys.record_key_parts(sku, request_id),
                            &held,
                        ],
                        buf,
                    )
                });
        }
        if request.single.takes
            && let Some(join) = &self.fast.coalesce
        {
            return self.upstream.submit_joinable(
                slot,
                call.deadline,
                completion,
                Joinable {
                    key: sku.as_bytes(),
                    join,
                    // Written as its own call at once: a call no other
                    // DEDUCT joins (nearly every one) is written once.
                    lone: Some(|buf: &mut bytes::BytesMut| {
                        self.wire(call).encode(
                            self.upstream.calling(),
                            keys,
                            request,
                            &call.nonce,
                            buf,
                        )
                    }),
                    shared: |gathered: &mut Gathered| coalesce::write_shared(keys, sku, gathered),
                    member: |gathered: &mut Gathered| {
                        coalesce::write_member(keys, request, &call.nonce, gathered)
                    },
                },
            );
        }
        let wire = self.wire(call);
        self.upstream
            .submit_script(slot, call.deadline, completion, |buf| {
                wire.encode(self.upstream.calling(), keys, request, &call.nonce, buf);
            })
    }

    pub(super) fn wire(&self, call: &StockCall) -> &wire::Wire {
        self.wires.of(call.request.command, call.order_line())
    }

    /// A node pipe's answer to `call` (or why there is none), read: the
    /// reply, or the fallback it calls for.
    pub fn conclude(&self, call: StockCall, answer: Result<Answer, PipeError>) -> Concluded {
        if call.read_first {
            return self.conclude_read(call, answer);
        }
        if let Ok(answer) = &answer
            && call.request.single.takes
            && crate::answer::error_code(&answer.frame) == Some(crate::error::ErrorCode::NoScript)
        {
            self.reload_coalesced(&call.request.sku);
        }
        match self.upstream.verdict(answer) {
            // A DEDUCT or HOLD on a SKU kept by location, which names no
            // location: nothing changed, and no call could change anything.
            Verdict::Settled(Err(fault)) if fault.is_located() => {
                let result = Ok(StockReply::invalid(super::location::NAME_LOCATIONS));
                Concluded::Answered(self.finish(&call, result))
            }
            Verdict::Settled(result) => Concluded::Answered(self.finish(&call, result)),
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
        let reloading = &self.fast.reloading;
        if self.fast.coalesce.is_none() || reloading.swap(true, Ordering::AcqRel) {
            return;
        }
        let upstream = self.upstream.clone();
        let script = self.scripts.deduct_many.clone();
        let keys = self.keys.sku_keys(sku);
        let [window, max_qty, missing] = self.wires.of(StockCommand::Deduct, false).fixed_argv();
        let settings = &self.settings;
        let args: Vec<Vec<u8>> = [
            window,
            max_qty,
            missing,
            settings.replicate_arg.as_bytes(),
            settings.journal_arg.as_bytes(),
        ]
        .map(<[u8]>::to_vec)
        .into();
        let reloading = reloading.clone();
        tokio::spawn(async move {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let named = keys.all();
            if let Err(fault) = upstream.eval(&script, &named, &args).await {
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
        let (Some(qty), Some(memory)) = (&call.request.qty, &self.fast.sold_out) else {
            unreachable!("only DEDUCTs read first, and only with the path on")
        };
        let decision = match &answer {
            Ok(answer) => sold_out::Read::from_frame(&answer.frame)
                .map(|read| sold_out::decide(&read, qty.as_bytes(), self.settings.missing_zero)),
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
                self.books.metrics.record_sold_out_read(true);
                Concluded::Answered(self.finish(&call, result))
            }
            Some(sold_out::Decision::RunScript) | None => {
                self.books.metrics.record_sold_out_read(false);
                memory.forget(call.request.sku.as_bytes());
                call.read_first = false;
                Concluded::Fallback(call)
            }
        }
    }

    /// Whether `command` with `args` (after the name) would read its SKU's
    /// keys first now ([`sold_out`]).
    pub fn would_read_first(&self, command: StockCommand, args: &[Bytes]) -> bool {
        let Some(memory) = &self.fast.sold_out else {
            return false;
        };
        if memory.is_empty() || !command.single().is_some_and(|single| single.takes) {
            return false;
        }
        let [sku, qty, ..] = args else {
            return false;
        };
        std::str::from_utf8(qty)
            .ok()
            .and_then(|q| q.parse::<u64>().ok())
            .is_some_and(|qty| memory.wants_read(sku, qty))
    }

    /// A read-first DEDUCT whose read's answer can't stand (an earlier
    /// request of its connection on its SKU takes effect after the read:
    /// [`super::InFlight`]): its script runs instead, through the slow
    /// path, once that request is done. Counted as a read sent on to the
    /// script.
    pub fn script_instead(&self, mut call: StockCall) -> StockCall {
        if call.read_first {
            self.books.metrics.record_sold_out_read(false);
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
        let request = &call.request;
        let wire = self.wire(call);
        let keys = wire.keys(&self.keys, request);
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let argv = wire.argv(request.single, request, &call.nonce);
        let result = self
            .with_journal(&request.sku, call.deadline, || {
                self.upstream
                    .eval_fallback(&wire.script, &keys, &argv, call.deadline)
            })
            .await;
        match result {
            Err(fault) if fault.is_located() => {
                Ok(StockReply::invalid(super::location::NAME_LOCATIONS))
            }
            result => result,
        }
    }

    /// A prepared call from start to end, awaited: the node pipe's answer
    /// through a oneshot, its wait bounded as `bound` says, the fallback
    /// when it calls for one.
    pub(super) async fn run(&self, prepared: Prepared, bound: Bound) -> StockResult {
        let call = match prepared {
            Prepared::Answered(result) => return result,
            Prepared::Call(call) => call,
        };
        let answer = self.await_answer(&call, bound).await;
        match self.conclude(call, answer) {
            Concluded::Answered(result) => result,
            // Boxed: the redis crate's path is a large future, which every
            // call's own future would otherwise carry (and move) in full.
            Concluded::Fallback(call) => Box::pin(self.fallback(call)).await,
        }
    }

    /// Submits `call` and awaits its node pipe's answer, within its
    /// deadline.
    async fn await_answer(&self, call: &StockCall, bound: Bound) -> Result<Answer, PipeError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        match self.submit(call, Completion::Oneshot(reply)) {
            Ok(()) => crate::pipeline::wait(answer, call.deadline, bound).await,
            Err((refused, _)) => Err(refused),
        }
    }

    /// A call's outcome as its command shows it, with what it came to
    /// recorded: its metrics (an order line's count for its order), its
    /// access-log line, the holds it moved, the sweep index for a hold, and
    /// what a DEDUCT says of its SKU's stock ([`sold_out`]).
    fn finish(&self, call: &StockCall, result: StockResult) -> StockResult {
        let request = &call.request;
        let single = request.single;
        let mut result = result;
        if let Ok(reply) = &mut result
            && let Err(fault) = show(single.reply, reply)
        {
            result = Err(fault);
        }
        let metered = match call.on_behalf {
            OnBehalf::Caller => request.command,
            OnBehalf::Line { .. } => StockCommand::Order,
        };
        // One clock read for both latencies.
        let now = Instant::now();
        let upstream = now.saturating_duration_since(call.sent.into_std());
        self.books.metrics.record_upstream(metered, upstream);
        if let Ok(reply) = &result {
            let caller = call.on_behalf == OnBehalf::Caller;
            self.books.record_holds(reply, single.ends_hold && caller);
            let holds = matches!(reply.code, Code::Ok | Code::Duplicate);
            if single.places_hold && holds && call.on_behalf != (OnBehalf::Line { swept: false }) {
                // A HOLD that holds (0, or 1 for a retry whose first answer
                // may have been lost) files its SKU in the sweep index by
                // the hold's expiry.
                self.sweeper
                    .mark_held(&request.sku, reply.expires_at.unwrap_or(0));
            }
            if single.extends_hold
                && holds
                && let Some(ttl) = &request.ttl
            {
                self.sweeper.mark_extended(
                    &request.sku,
                    Duration::from_millis(ttl.get()),
                    reply.expires_at.unwrap_or(0),
                );
            }
            if single.reply == Shape::Allocation
                && caller
                && reply.code == Code::Ok
                && let (Some(placement), Some(allocation)) = (&request.placement, &reply.allocation)
            {
                self.books
                    .metrics
                    .record_allocation(placement.policy, allocation.len() > 1);
            }
            if single.takes
                && caller
                && let Some(memory) = &self.fast.sold_out
            {
                memory.learn(
                    request.sku.as_bytes(),
                    reply.code,
                    reply.remain,
                    reply.effects.held,
                );
            }
        }
        let code = result.as_ref().map(|reply| reply.code);
        match call.on_behalf {
            OnBehalf::Caller => {
                let elapsed = now.saturating_duration_since(call.arrived);
                self.books.record(call.entry(), code, elapsed)
            }
            // A line's own access-log line names the single command it is
            // on the line's id, key and qty; the order's line names only
            // its request_id, and its metrics are the order's.
            OnBehalf::Line { .. } => {
                let elapsed = now.saturating_duration_since(call.arrived);
                self.books.log_access(call.entry(), code, elapsed)
            }
        }
        result
    }

    /// With `--reject-stale-ids`, refuses a request whose id (its
    /// request_id, or a change's own change_id: [`super::single::Single::fresh`]) is a
    /// time-ordered one made too long ago ([`StockService::fresh_id`]).
    fn fresh_request(&self, request: &OneRequest) -> Result<(), InvalidParam> {
        match request.single.fresh {
            Field::ChangeId => match &request.change_id {
                Some(change_id) => self.fresh_id(
                    "change_id",
                    &RequestId::parse(Bytes::copy_from_slice(change_id.as_bytes()))?,
                ),
                None => Ok(()),
            },
            _ => self.fresh(&request.request_id),
        }
    }

    /// With `--reject-stale-ids`, refuses a time-ordered request_id (ULID,
    /// UUIDv7) made longer ago than the retry window, less a margin for
    /// clock skew: its record may already have expired, so stockgate could
    /// no longer tell a retry from a new request.
    pub(super) fn fresh(&self, request_id: &RequestId) -> Result<(), InvalidParam> {
        self.fresh_id("request_id", request_id)
    }

    /// [`StockService::fresh`] of an id the caller calls `name`.
    pub(super) fn fresh_id(&self, name: &str, request_id: &RequestId) -> Result<(), InvalidParam> {
        if !self.settings.reject_stale_ids {
            return Ok(());
        }
        let Some(made) = request_id.embedded_time() else {
            return Ok(());
        };
        let window = self.settings.retry_window;
        let age = SystemTime::now()
            .duration_since(made)
            .unwrap_or(Duration::ZERO);
        let margin = (window / 10).min(Duration::from_secs(300));
        if age > window - margin {
            return Err(InvalidParam(format!(
                "{name} is a time-ordered id made {} ago, older than the retry window allows; its record may have expired",
                humantime::format_duration(Duration::from_secs(age.as_secs()))
            )));
        }
        Ok(())
    }
}

/// Makes `reply` what a call of `shape` shows: with the hold's expiry or
/// without, and an allocation's always with one (empty for a call that
/// took nothing: a code 3). In place: a reply is a hundred bytes, and this
/// is on every call's path.
fn show(shape: Shape, reply: &mut StockReply) -> Result<(), UpstreamError> {
    reply.show_expiry(shape != Shape::Plain);
    if shape == Shape::Allocation && reply.allocation.is_none() {
        if reply.code != Code::Invalid {
            return Err(UpstreamError::new(
                crate::error::FaultKind::BadReply,
                "lua/allocate.lua answered without an allocation",
            ));
        }
        reply.allocation = Some(Box::default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::nonces::Nonces;
    use super::*;
    use crate::config::Config;
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
            // Each call, and the ARGV its script's header documents (`S`
            // the settings, `N` the nonce), and the keys it names after
            // the request's six (their suffixes to the stock key).
            for (command, args, argv, more_keys) in [
                (
                    StockCommand::Deduct,
                    vec![arg("sku-9"), arg("12"), arg("req-77"), arg("ORD 1")],
                    &["12", "ORD 1", "S", "N"][..],
                    &[][..],
                ),
                (
                    StockCommand::Deduct,
                    vec![arg("s"), arg("1"), arg("r")],
                    &["1", "", "S", "N"],
                    &[],
                ),
                (
                    StockCommand::Revert,
                    vec![arg("sku-9"), arg("req-77")],
                    &["S", "N"],
                    &[":loc"],
                ),
                (
                    StockCommand::Revert,
                    vec![arg("s"), arg("req-77")],
                    &["S", "N"],
                    &[":loc"],
                ),
                (
                    StockCommand::Confirm,
                    vec![arg("s"), arg("h-1")],
                    &["S", "N"],
                    &[":loc"],
                ),
                (
                    StockCommand::Hold,
                    vec![arg("sku-9"), arg("3"), arg("h-1"), arg("900000"), arg("O")],
                    &["3", "O", "900000", "S", "N"],
                    &[],
                ),
                (
                    StockCommand::Hold,
                    vec![arg("s"), arg("1"), arg("h-2"), arg("1000")],
                    &["1", "", "1000", "S", "N"],
                    &[],
                ),
                (
                    StockCommand::Confirm,
                    vec![arg("sku-9"), arg("h-1")],
                    &["S", "N"],
                    &[":loc"],
                ),
                (
                    StockCommand::HoldExtend,
                    vec![arg("s"), arg("h-1"), arg("c-1"), arg("60000")],
                    &["extend", "60000", "S", "N"],
                    &[":loc", ":chg:c-1"],
                ),
                (
                    StockCommand::HoldShrink,
                    vec![arg("s"), arg("h-1"), arg("c-2"), arg("2")],
                    &["shrink", "2", "S", "N"],
                    &[":loc", ":chg:c-2"],
                ),
                (
                    StockCommand::DeductAt,
                    vec![
                        arg("s"),
                        arg("4"),
                        arg("d-1"),
                        arg("SPLIT"),
                        arg("w1"),
                        arg("w2"),
                    ],
                    &["deduct", "S", "N", "4", "SPLIT", "w1", "w2"],
                    &[":loc"],
                ),
                (
                    StockCommand::HoldAt,
                    vec![
                        arg("s"),
                        arg("1"),
                        arg("h-3"),
                        arg("5000"),
                        arg("WHOLE"),
                        arg("w9"),
                    ],
                    &["hold", "S", "N", "1", "WHOLE", "5000", "w9"],
                    &[":loc"],
                ),
            ] {
                let Some(Prepared::Call(mut call)) =
                    service.prepare(command, &args, Instant::now(), None)
                else {
                    panic!("{command:?} {args:?} is a valid call")
                };
                // An order's lines end with `--missing-stock zero`.
                let order_line = matches!(command, StockCommand::Revert | StockCommand::Confirm)
                    && args[0][..] == b"sku-9"[..];
                if order_line {
                    call.on_behalf = OnBehalf::Line { swept: false };
                }
                let mut hot = bytes::BytesMut::new();
                let mut slow = bytes::BytesMut::new();
                let request = &call.request;
                let wire = service.wire(&call);
                wire.encode(calling, &service.keys, request, &call.nonce, &mut hot);
                let keys = wire.keys(&service.keys, request);
                let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let fallback = wire.argv(call.request.single, request, &call.nonce);
                wire.script.write_call(calling, &mut slow, &keys, &fallback);
                assert_eq!(hot, slow, "{command:?}, durable {durable}, {calling:?}");
                // What the script's header documents.
                let documented: Vec<&[u8]> = argv
                    .iter()
                    .map(|a| match *a {
                        "S" => wire.settings_arg(),
                        "N" => &call.nonce[..],
                        other => other.as_bytes(),
                    })
                    .collect();
                assert_eq!(fallback, documented, "{command:?}");
                let request_keys = service.keys.request_keys(&request.sku, &request.request_id);
                let more: Vec<Vec<u8>> = more_keys
                    .iter()
                    .map(|suffix| [&request_keys.stock[..], suffix.as_bytes()].concat())
                    .collect();
                let mut named: Vec<&[u8]> = request_keys.all().to_vec();
                named.extend(more.iter().map(Vec::as_slice));
                assert_eq!(keys, named, "{command:?}");
                let verb = if calling == Calling::Function {
                    &b"FCALL"[..]
                } else {
                    b"EVALSHA"
                };
                assert!(hot.windows(verb.len()).any(|w| w == verb), "{calling:?}");
                // A word of the settings argument (lua/common.lua, settle).
                let zero = hot.windows(6).any(|w| w == b" zero ");
                assert_eq!(zero, order_line, "{command:?}: missing-stock mode");
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
            let join = service.fast.coalesce.as_ref().expect("on by default");
            let arg = |s: &str| Bytes::copy_from_slice(s.as_bytes());
            let calls: Vec<StockCall> = [
                vec![arg("hot"), arg("2"), arg("a"), arg("ORD 1")],
                vec![arg("hot"), arg("1"), arg("b")],
                vec![arg("hot"), arg("3"), arg("a")],
            ]
            .iter()
            .map(
                |args| match service.prepare(StockCommand::Deduct, args, Instant::now(), None) {
                    Some(Prepared::Call(call)) => call,
                    _ => panic!("{args:?} is a valid DEDUCT"),
                },
            )
            .collect();
            let gather = |calls: &[StockCall]| {
                let mut gathered = crate::pipeline::Gathered::default();
                for call in calls {
                    let deduct = &call.request;
                    if gathered.members == 0 {
                        coalesce::write_shared(&service.keys, &deduct.sku, &mut gathered);
                    }
                    coalesce::write_member(&service.keys, deduct, &call.nonce, &mut gathered);
                    gathered.members += 1;
                }
                let mut out = bytes::BytesMut::new();
                join.write(&gathered, &mut out);
                out
            };

            let alone = &calls[1];
            let wire = service.wire(alone);
            let sku = &alone.request.sku;
            let mut own = bytes::BytesMut::new();
            wire.encode(
                shared.upstream.calling(),
                &service.keys,
                &alone.request,
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
                .map(|c| service.keys.request_keys(sku, &c.request.request_id).record)
                .collect();
            let mut keys: Vec<&[u8]> = sku_keys.all().to_vec();
            keys.extend(records.iter().map(Vec::as_slice));
            let [window, max_qty, missing] = wire.fixed_argv();
            let mut argv: Vec<&[u8]> = vec![
                window,
                max_qty,
                missing,
                service.settings.replicate_arg.as_bytes(),
                service.settings.journal_arg.as_bytes(),
            ];
            for call in &calls {
                let caller = call.request.caller_args();
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

            // The first written alone as its own call, then gathered when
            // the second joins: the same one call of all.
            let first = &calls[0];
            let mut lone = bytes::BytesMut::new();
            let marks = service.wire(first).encode(
                shared.upstream.calling(),
                &service.keys,
                &first.request,
                &first.nonce,
                &mut lone,
            );
            let mut own_first = bytes::BytesMut::new();
            join.write(
                &{
                    let mut g = crate::pipeline::Gathered::default();
                    coalesce::write_shared(&service.keys, &first.request.sku, &mut g);
                    coalesce::write_member(&service.keys, &first.request, &first.nonce, &mut g);
                    g.members = 1;
                    g
                },
                &mut own_first,
            );
            assert_eq!(
                lone, own_first,
                "alone, the call is its own, durable {durable}"
            );
            let mut gathered = crate::pipeline::Gathered::default();
            join.gather_lone(&lone, &marks, &mut gathered);
            gathered.members = 1;
            for call in &calls[1..] {
                coalesce::write_member(&service.keys, &call.request, &call.nonce, &mut gathered);
                gathered.members += 1;
            }
            let mut out = bytes::BytesMut::new();
            join.write(&gathered, &mut out);
            assert_eq!(out, one, "gathered from a lone call, durable {durable}");
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
