//! Running scripts: DEDUCT and REVERT through the node pipes when they
//! can, and through the redis crate (redirects, retries, a lost script or
//! function → EVAL, a refused FCALL → EVALSHA, `--wait-replicas` per
//! request, for the scripts whose answers acknowledge writes) when they
//! can't, always within the request's one `--timeout`. Every call is
//! written as
//! [`crate::script::LuaScript`] says for the [`Calling`] in use.

use super::Upstream;
use crate::config::Durability;
use crate::error::{ErrorCode, ErrorReply, FaultKind, UpstreamError};
use crate::outcome::StockReply;
use crate::pipeline::{Answer, Bound, Completion, Gathered, Joinable, LoneMarks, PipeError};
use crate::script::{Calling, LuaScript};
use bytes::BytesMut;
use redis::{RedisError, Value};
use std::time::Duration;

/// What a node pipe's answer to a script call comes to.
pub enum Verdict {
    /// The call's outcome: a business reply, or a fault to report.
    Settled(Result<StockReply, UpstreamError>),
    /// Out of the ordinary (a redirect, a lost script, a lost connection, no
    /// pipe at all): send it again through the redis crate, within what is
    /// left of the deadline. Safe: a resend of the same call answers as the
    /// first send did.
    Fallback,
}

/// What a piped script call answered ([`Upstream::eval_piped_frame`]).
pub enum Piped {
    /// The reply's bytes, as the node pipe read them.
    Frame(bytes::Bytes),
    /// The redis crate's reading of it (the call took the slow path).
    Value(Value),
}

impl Upstream {
    /// Queues a script call on the node pipe of `slot`: `encode` writes its
    /// EVALSHA into the pipe's next batch, and the answer goes to
    /// `completion`. Refused at once, with the completion handed back, when
    /// there are no node pipes (TLS upstreams) or the pipe can't take it.
    pub fn submit_script(
        &self,
        slot: u16,
        deadline: tokio::time::Instant,
        completion: Completion,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<(), (PipeError, Completion)> {
        match &self.pipelines {
            Some(pipelines) => pipelines.submit(slot, deadline, completion, encode),
            None => Err((PipeError::Lost, completion)),
        }
    }

    /// [`Upstream::submit_script`] of a call that may share one script call
    /// with others ([`crate::pipeline::Pipelines::submit_joinable`]).
    pub fn submit_joinable(
        &self,
        slot: u16,
        deadline: tokio::time::Instant,
        completion: Completion,
        joinable: Joinable<
            '_,
            impl FnOnce(&mut BytesMut) -> LoneMarks,
            impl FnOnce(&mut Gathered),
            impl FnOnce(&mut Gathered),
        >,
    ) -> Result<(), (PipeError, Completion)> {
        match &self.pipelines {
            Some(pipelines) => pipelines.submit_joinable(slot, deadline, completion, joinable),
            None => Err((PipeError::Lost, completion)),
        }
    }

    /// Reads a node pipe's answer to a DEDUCT-shaped script call.
    pub fn verdict(&self, answer: Result<Answer, PipeError>) -> Verdict {
        // DEDUCT-shaped scripts touch their SKU's slot only.
        match self.answered(answer, false) {
            None => Verdict::Fallback,
            Some(Err(fault)) => Verdict::Settled(Err(fault)),
            Some(Ok(answer)) => {
                Verdict::Settled(StockReply::from_raw(&answer.frame).and_then(|reply| {
                    self.check_replicated(reply.code as i64, answer.replicas)?;
                    Ok(reply)
                }))
            }
        }
    }

    /// A node pipe's answer to any script call, read as far as every
    /// script's answer reads alike: a reply that is not an error, an error
    /// or fault to report, or `None` when the call must go again through
    /// the redis crate (a redirect, a lost script, a lost connection, no
    /// pipe at all, or a script of one slot (not `crosses_slots`) refused
    /// a key of its slot that is moving away).
    fn answered(
        &self,
        answer: Result<Answer, PipeError>,
        crosses_slots: bool,
    ) -> Option<Result<Answer, UpstreamError>> {
        match answer {
            Ok(answer) => match crate::answer::error_reply(&answer.frame) {
                None => Some(Ok(answer)),
                Some(reply) => match reply.code {
                    // The SKU's journal is not open yet: the script changed
                    // nothing, and the slow path opens it and goes again
                    // (`StockService::resend`).
                    ErrorCode::NoJournal => None,
                    // Its slot is moving: the slow path asks again, as for
                    // TRYAGAIN, until the move ends or the deadline passes.
                    ErrorCode::NonLocalKey if !crosses_slots => None,
                    ErrorCode::FunctionNotFound => {
                        // The call did not run: the slow path answers it
                        // with EVAL, and the library is loaded again.
                        self.function_lost();
                        None
                    }
                    // An ACL refused the call, which did not run: the slow
                    // path knows what it sends, and sends an FCALL refused
                    // so again by EVALSHA (`Upstream::call_script`).
                    ErrorCode::NoPerm => None,
                    ErrorCode::Moved => {
                        if let Some(pipelines) = &self.pipelines {
                            pipelines.mark_stale();
                        }
                        None
                    }
                    code if code.is_redirect() => None,
                    _ => Some(Err(UpstreamError::from_reply(reply))),
                },
            },
            Err(PipeError::Timeout) => Some(Err(UpstreamError::timeout(self.config.timeout))),
            // Not sent, and the slow path would queue on the same node.
            Err(PipeError::Overloaded) => Some(Err(UpstreamError::new(
                FaultKind::Overloaded,
                "the node's queue is full (it is not keeping up); this request was not sent",
            ))),
            Err(PipeError::Lost) => None,
        }
    }

    /// A node lacks the library: the health loop loads it again.
    fn function_lost(&self) {
        if !self
            .library_lost
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::debug!(
                "Function not found; sending the body with EVAL, loading the library again"
            );
        }
    }

    /// With `--wait-replicas`, what the batch's WAIT (`replicas`) says of a
    /// reply whose first element is `code` ([`replicated`]).
    fn check_replicated(&self, code: i64, replicas: Option<i64>) -> Result<(), UpstreamError> {
        match (self.config.durability, replicas) {
            (Some(durability), Some(confirmed)) => {
                replicated(code, confirmed, durability, Shortfall::Confirmed)
            }
            _ => Ok(()),
        }
    }

    /// Any script call through the node pipe of `keys[0]`'s slot, awaited
    /// within `deadline` (and never more than `--timeout`), its reply read
    /// as the redis crate reads one; the redis crate itself when the
    /// answer calls for it ([`Upstream::eval_by`]). For the order's intent
    /// and the orders in flight, whose calls cost the redis crate's
    /// general path about 20 µs of stockgate's CPU each, against about
    /// one here.
    pub async fn eval_piped(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        deadline: tokio::time::Instant,
    ) -> Result<Value, UpstreamError> {
        match self
            .eval_piped_frame(script, keys, args, deadline, Bound::Timer)
            .await?
        {
            Piped::Value(value) => Ok(value),
            Piped::Frame(frame) => self.value_of(script, &frame),
        }
    }

    /// [`Upstream::eval_piped`], its answer as the node pipe read it (its
    /// raw bytes) when the pipe answered, for a caller that reads them
    /// itself; the redis crate's reading otherwise.
    pub async fn eval_piped_frame(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        deadline: tokio::time::Instant,
        bound: Bound,
    ) -> Result<Piped, UpstreamError> {
        let deadline = deadline.min(tokio::time::Instant::now() + self.config.timeout);
        let answer = self.piped(script, keys, args, deadline, bound).await;
        let answer = match self.answered(answer, script.crosses_slots()) {
            None => {
                // Boxed: the redis crate's path is a large future, which
                // every piped call's own would otherwise carry in full.
                return Box::pin(self.eval_by(script, keys, args, deadline))
                    .await
                    .map(Piped::Value);
            }
            Some(answer) => answer?,
        };
        if script.needs_replicas {
            match crate::answer::flat(&answer.frame).and_then(|mut reply| reply.int()) {
                Some(code) => self.check_replicated(code, answer.replicas)?,
                // Not the usual shape: read the whole reply, as before.
                None => {
                    self.value_of(script, &answer.frame)?;
                }
            }
        }
        Ok(Piped::Frame(answer.frame))
    }

    /// A reply's raw bytes as the redis crate's [`Value`].
    pub fn value_of(
        &self,
        script: &LuaScript,
        frame: &bytes::Bytes,
    ) -> Result<Value, UpstreamError> {
        let value = match crate::answer::value(frame) {
            Some(value) => value,
            None => redis::parse_redis_value(frame).map_err(|err| {
                UpstreamError::new(
                    FaultKind::BadReply,
                    format!("{} answered what stockgate can't read: {err}", script.name),
                )
            })?,
        };
        Ok(value)
    }

    /// One call (FCALL or EVALSHA) on the node pipe of `keys[0]`'s slot,
    /// awaited until `deadline`: the answer as the pipe read it.
    async fn piped(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        deadline: tokio::time::Instant,
        bound: Bound,
    ) -> Result<Answer, PipeError> {
        match &self.pipelines {
            Some(pipelines) => {
                pipelines
                    .call(crate::keys::slot(keys[0]), deadline, bound, |buf| {
                        script.write_call(self.calling(), buf, keys, args)
                    })
                    .await
            }
            None => Err(PipeError::Lost),
        }
    }

    /// The slow path of a script call first tried on a node pipe: the redis
    /// crate, with what is left until the call's `deadline`.
    pub async fn eval_fallback(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        deadline: tokio::time::Instant,
    ) -> Result<StockReply, UpstreamError> {
        let value = self.eval_by(script, keys, args, deadline).await?;
        StockReply::from_script(value)
    }

    /// [`Upstream::eval`], within what is left until `deadline` (and never
    /// more than `--timeout`): for the steps of a request that has one
    /// deadline for all of them (an order, a fallback).
    pub async fn eval_by(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        deadline: tokio::time::Instant,
    ) -> Result<Value, UpstreamError> {
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(self.config.timeout);
        if left.is_zero() {
            return Err(UpstreamError::timeout(self.config.timeout));
        }
        self.eval_within(script, keys, args, left).await
    }

    /// A DEDUCT-shaped script call, awaited: the node pipe of the key's
    /// slot, and the fallback when the answer calls for it. For callers
    /// that wait on one call at a time (the HTTP face, operators'
    /// commands); client connections use [`Upstream::submit_script`].
    pub async fn eval_stock(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<StockReply, UpstreamError> {
        let started = tokio::time::Instant::now();
        let answer = self
            .piped(
                script,
                keys,
                args,
                started + self.config.timeout,
                Bound::Timer,
            )
            .await;
        match self.verdict(answer) {
            Verdict::Settled(result) => result,
            Verdict::Fallback => {
                self.eval_fallback(script, keys, args, started + self.config.timeout)
                    .await
            }
        }
    }

    /// Runs `script` with FCALL or EVALSHA ([`Calling`]) on the node that
    /// owns `keys[0]`, falling back to EVAL there on `Function not found`
    /// or NOSCRIPT, all within `--timeout`.
    pub async fn eval(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, UpstreamError> {
        self.eval_within(script, keys, args, self.config.timeout)
            .await
    }

    /// `eval`, within `budget`.
    async fn eval_within(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        budget: Duration,
    ) -> Result<Value, UpstreamError> {
        // A read, or the sweeper's bookkeeping, has nothing to make durable
        // (`LuaScript::needs_replicas`): no WAIT to block the shared
        // connection behind it.
        if let Some(durability) = self.config.durability
            && script.needs_replicas
        {
            return self
                .eval_durably(script, keys, args, durability, budget)
                .await;
        }
        self.eval_plain(script, keys, args, budget).await
    }

    /// A script call without WAIT, within `budget`.
    async fn eval_plain(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        budget: Duration,
    ) -> Result<Value, UpstreamError> {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(UpstreamError::timeout(self.config.timeout));
            }
            let sent = self
                .on_connection(left, async |connection| {
                    match self.call_script(connection, script, keys, args).await {
                        Ok(value) => Ok(Ok(value)),
                        Err(err) if slot_moving(script, &err) => Ok(Err(err)),
                        Err(err) => Err(err),
                    }
                })
                .await?;
            match sent {
                Ok(value) => return Ok(value),
                // The redis crate counts hops, and while a slot moves a call
                // that is new to the target goes source (ASK), target
                // (TRYAGAIN: its record isn't there), and round again, so
                // its count can run out long before the deadline (seen as
                // `-UPSTREAM redis answered ASK` a few hundred ms into a 600
                // ms move under load). The deadline decides: ask again after
                // a pause. Safe, as every resend of a call answers as its
                // first send. (The pause is outside the call: a deadline
                // that passes in it is no sign of a stuck connection.)
                Err(_moving) => {
                    tokio::time::sleep_until(
                        (tokio::time::Instant::now() + SLOT_MOVE_PAUSE).min(deadline),
                    )
                    .await
                }
            }
        }
    }

    /// One call of `script` on `connection`, as the [`Calling`] in use
    /// says, and again where the node's answer calls for it: by EVALSHA
    /// when FCALL was refused with NOPERM (an ACL took it away; from then
    /// on every call goes by EVALSHA, [`Upstream::fcall_refused`]), with
    /// EVAL and the body when the node lacks the script or the function.
    /// Neither refusal ran anything.
    async fn call_script(
        &self,
        connection: &mut super::connect::Connection,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        let mut calling = self.calling();
        loop {
            let call = script.command(calling, false, keys, args);
            match connection.query(&call).await {
                Err(err) if calling == Calling::Function && is_refused(&err) => {
                    self.fcall_refused(&err);
                    calling = Calling::Eval;
                }
                Err(err) if self.is_lost(&err) => {
                    tracing::debug!(script = script.name, %err, "sending the body with EVAL");
                    let eval = script.command(Calling::Eval, true, keys, args);
                    return connection.query(&eval).await;
                }
                other => return other,
            }
        }
    }

    /// `eval`, then WAIT on the same node in the same pipeline: a reply that
    /// states the request's record (codes 0, 1 and 4: it wrote it now, or
    /// reports what an earlier call wrote) stands only once `replicas`
    /// replicas confirmed it. Codes 2 and 3 state nothing and pass.
    ///
    /// A duplicate (1) must wait too: the retry of a write answered `not
    /// replicated` finds the record on the primary and would otherwise be
    /// acknowledged while no replica has it, and a failover then loses an
    /// acknowledged deduction. WAIT covers the writes this connection made,
    /// and every call to a node shares one connection, so it covers the
    /// earlier call's write unless that came through another connection.
    ///
    /// Where the primary is known to have fewer replicas than asked
    /// ([`Upstream::replicas_short`]), the script goes alone and its reply
    /// is judged as a WAIT would have answered: no replica can confirm the
    /// write, and WAIT blocks the connection it is sent on, shared by every
    /// call through the redis crate, for the whole `--wait-timeout`. Each
    /// write then held all the others up, and most timed out one by one.
    async fn eval_durably(
        &self,
        script: &LuaScript,
        keys: &[&[u8]],
        args: &[&[u8]],
        durability: crate::config::Durability,
        budget: Duration,
    ) -> Result<Value, UpstreamError> {
        if let Some(replicas) = keys
            .first()
            .and_then(|key| self.replicas_short(crate::keys::slot(key)))
        {
            let reply = self.eval_plain(script, keys, args, budget).await?;
            if let Value::Array(items) = &reply
                && let Some(Value::Int(code)) = items.first()
            {
                replicated(*code, replicas, durability, Shortfall::Connected)?;
            }
            return Ok(reply);
        }
        let wait_ms = durability.timeout.as_millis() as u64;
        // As `call_script`, each call with its WAIT: again by EVALSHA when
        // FCALL is refused, with the body when the node lacks the script.
        let call = async |connection: &mut super::connect::Connection| {
            let mut calling = self.calling();
            let mut with_body = false;
            loop {
                let mut pipe = redis::pipe();
                pipe.add_command(script.command(calling, with_body, keys, args))
                    .cmd("WAIT")
                    .arg(durability.replicas)
                    .arg(wait_ms);
                let replies = connection.packed(&pipe, 2).await?;
                let Some(Value::ServerError(e)) = replies.first().filter(|_| !with_body) else {
                    return Ok::<_, RedisError>(replies);
                };
                match ErrorCode::of_server_error(e) {
                    ErrorCode::NoPerm if calling == Calling::Function => {
                        self.fcall_refused(e);
                        calling = Calling::Eval;
                    }
                    ErrorCode::NoScript | ErrorCode::FunctionNotFound => {
                        if calling == Calling::Function {
                            self.function_lost();
                        }
                        with_body = true;
                    }
                    _ => return Ok(replies),
                }
            }
        };
        // What is left of the request's deadline, not a fresh --timeout: a
        // fallback after a node pipe's attempt must not take twice as long.
        let replies = self.on_connection(budget, call).await?;
        let mut replies = replies.into_iter();
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(UpstreamError::new(
                FaultKind::BadReply,
                "the script and WAIT pipeline answered too few replies",
            ));
        };
        let reply = reply.extract_error().map_err(|e| {
            if slot_moving(script, &e) {
                // As a TRYAGAIN here: the caller may retry once it moved.
                let fault =
                    UpstreamError::new(FaultKind::ClusterDown, format!("a slot is moving: {e}"));
                match ErrorReply::of_redis(&e) {
                    Some(reply) => fault.with_reply(reply),
                    None => fault,
                }
            } else {
                UpstreamError::from_redis(&e)
            }
        })?;
        if let Value::Array(items) = &reply
            && let Some(Value::Int(code)) = items.first()
        {
            let confirmed = match acks {
                Value::Int(n) => n,
                // WAIT itself failed: nothing is confirmed.
                _ => -1,
            };
            replicated(*code, confirmed, durability, Shortfall::Confirmed)?;
        }
        Ok(reply)
    }
}

impl Upstream {
    /// Whether the node answered that it lacks the script or the function
    /// called: the call did not run, and EVAL with the body both answers
    /// it and caches the script there.
    fn is_lost(&self, err: &RedisError) -> bool {
        match ErrorCode::of_redis(err) {
            Some(ErrorCode::NoScript) => true,
            Some(ErrorCode::FunctionNotFound) => {
                self.function_lost();
                true
            }
            _ => false,
        }
    }
}

/// Whether an ACL refused the call (NOPERM): it did not run.
fn is_refused(err: &RedisError) -> bool {
    ErrorCode::of_redis(err) == Some(ErrorCode::NoPerm)
}

/// Between the fallback's attempts while a slot moves.
const SLOT_MOVE_PAUSE: Duration = Duration::from_millis(20);

/// Whether a call of `script` failed only because a slot is moving: the
/// redis crate gave up (its redirects or TRYAGAINs outnumbered its
/// retries), or the script, of one slot, was refused a key of it that had
/// moved away already ([`UpstreamError::is_non_local_key`]).
fn slot_moving(script: &LuaScript, err: &RedisError) -> bool {
    match ErrorCode::of_redis(err) {
        Some(ErrorCode::Ask | ErrorCode::Moved | ErrorCode::TryAgain) => true,
        Some(ErrorCode::NonLocalKey) => !script.crosses_slots(),
        _ => false,
    }
}

/// How a write came to lack its replicas.
#[derive(Clone, Copy)]
enum Shortfall {
    /// WAIT answered: this many confirmed it in time.
    Confirmed,
    /// No WAIT was sent: this many replicas were connected to the primary
    /// at the health loop's last look, fewer than asked.
    Connected,
}

/// With `--wait-replicas`, a reply that reports the request's record
/// (code 0: written now; 1 and 4: written before, perhaps through another
/// connection, perhaps lost in a failover since) stands only once enough
/// replicas confirmed it. Codes 2 and 3 wrote nothing and pass.
fn replicated(
    code: i64,
    replicas: i64,
    durability: Durability,
    shortfall: Shortfall,
) -> Result<(), UpstreamError> {
    if !matches!(code, 0 | 1 | 4) || replicas >= i64::from(durability.replicas) {
        return Ok(());
    }
    let why = match shortfall {
        Shortfall::Confirmed => format!(
            "confirmed the write within {} ms",
            durability.timeout.as_millis()
        ),
        Shortfall::Connected => "are connected to its primary".to_owned(),
    };
    Err(UpstreamError::new(
        FaultKind::NotReplicated,
        format!(
            "not replicated: {} of {} replicas {why}, so it may be lost if its primary fails",
            replicas.max(0),
            durability.replicas,
        ),
    ))
}
