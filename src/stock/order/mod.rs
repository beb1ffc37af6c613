//! Orders: several SKUs, all lines or none, safe to retry through any
//! stockgate. One file per command:
//!
//! - [`deduct`]: `ORDER <request_id> <sku> <qty> [<sku> <qty> ...]`
//! - [`hold`]: `ORDER.HOLD <request_id> <ttl_ms> <sku> <qty> [...]`
//! - [`confirm`]: `ORDER.CONFIRM <request_id>`
//! - [`revert`]: `ORDER.REVERT <request_id>`
//!
//! On Redis Cluster each SKU lives in its own slot, so no one script can
//! take them all. An order is a saga instead: an intent record under its
//! own hash tag (`lua/order.lua`, [`crate::keys::KeyLayout::order_key`])
//! says how far it got, and each line is a per-line HOLD (then CONFIRM, or
//! REVERT) of the line id `~ord:<request_id>` on its SKU, all lines of a
//! phase sent to their primaries at once. Every change of the intent is a
//! compare-and-set in Redis, and every line call is idempotent, so any
//! number of stockgates driving one order converge on one outcome, and a
//! retry resumes whatever phase an earlier attempt (perhaps dead) left.
//!
//! ```text
//!   ORDER:       HOLDING -> CONFIRMING -> DONE
//!   ORDER.HOLD:  HOLDING -> HELD --ORDER.CONFIRM--> CONFIRMING -> DONE
//!   a line short (2), expired (5), revoked (4) or refused (3):
//!                HOLDING | CONFIRMING -> ABORTING -> ABORTED
//!   ORDER.REVERT: any live phase -> REVERTING -> REVERTED; none -> REVOKED
//! ```
//!
//! Nothing answers 0 before the intent says DONE (or HELD): up to then
//! the order can still be undone, and whoever undoes it first wins the
//! compare-and-set. A line only ever becomes final (CONFIRMED) in
//! CONFIRMING, and nothing leaves CONFIRMING but DONE (every line
//! confirmed) or ABORTING / REVERTING, which give every line back.
//!
//! Replies: `[code, version, expires_at_ms, lines, short]`, plus a reason
//! for code 3. `lines` is a flat array `sku, remain, sku, remain, ...`
//! in sku order (remain: the SKU's stock as this call's last line call
//! saw it, -1 when this call made none); `short` the SKUs at fault for a
//! 2 (insufficient) or a 5 (expired); `expires_at_ms` the order hold's
//! expiry (ORDER.HOLD, ORDER.CONFIRM; 0 for ORDER).

pub mod confirm;
pub mod deduct;
pub mod hold;
pub mod recovery;
pub mod revert;
pub mod status;

use super::{AccessEntry, Op, StockCommand, StockResult, StockService};
use crate::error::{FaultKind, UpstreamError};
use crate::keys::KeyLayout;
use crate::metrics::CommandLabel;
use crate::outcome::{Code, SCRIPT_VERSION};
use crate::params::{HoldTtl, InvalidParam, OrderNo, Qty, RequestId, Sku};
use crate::reply::Reply;
use crate::upstream::Verdict;
use bytes::Bytes;
use redis::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How much longer an ORDER.HOLD's line holds last than the order: the
/// intent's expiry is decided by one primary's clock, each line's by its
/// own, and the lines must not run out before the order does.
pub const LINE_MARGIN_MS: u64 = 2000;

/// How long an ORDER's line holds last (at most `--max-hold`): the time
/// the saga has to confirm them, and how soon the units of a saga whose
/// stockgate died come back by themselves.
pub const SAGA_TTL_MS: u64 = 300_000;

/// How long an order's saga may run, in `--timeout`s. Its caller waits
/// one `--timeout` for the answer; past it, the saga goes on in the
/// background for the rest of this budget (no step starts later), and
/// whatever it leaves unfinished is [`recovery`]'s.
const SAGA_TIMEOUTS: u32 = 4;

/// The longest request_id of an order: the line ids add `~ord:`.
const MAX_ORDER_ID: usize = crate::params::MAX_FIELD_LEN - crate::keys::ORDER_LINE_PREFIX.len();

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub sku: Sku,
    pub qty: Qty,
}

/// An order's request_id and the id its lines carry.
#[derive(Debug, Clone)]
pub struct OrderId {
    pub id: RequestId,
    pub line_id: RequestId,
}

/// Checks an order's request_id.
pub fn parse_id(arg: &Bytes) -> Result<OrderId, InvalidParam> {
    let id = RequestId::parse(arg.clone())?;
    match KeyLayout::order_line_id(&id) {
        Some(line_id) if id.as_bytes().len() <= MAX_ORDER_ID => Ok(OrderId { id, line_id }),
        _ => Err(InvalidParam(format!(
            "an order's request_id must be at most {MAX_ORDER_ID} bytes"
        ))),
    }
}

/// Checks `<sku> <qty> [<sku> <qty> ...]`: at least one line, at most
/// `max_lines`, no SKU twice. Returns them sorted by sku: the canonical
/// line set a retry must match.
pub fn parse_lines(
    args: &[Bytes],
    max_qty: u64,
    max_lines: usize,
) -> Result<Vec<Line>, InvalidParam> {
    if args.is_empty() || !args.len().is_multiple_of(2) {
        return Err(InvalidParam(
            "an order needs one or more <sku> <qty> pairs".into(),
        ));
    }
    if args.len() / 2 > max_lines {
        return Err(InvalidParam(format!(
            "an order may have at most {max_lines} lines"
        )));
    }
    let mut lines = args
        .chunks(2)
        .map(|pair| {
            Ok(Line {
                sku: Sku::parse(pair[0].clone())?,
                qty: Qty::parse(pair[1].clone(), max_qty)?,
            })
        })
        .collect::<Result<Vec<Line>, InvalidParam>>()?;
    lines.sort_by(|a, b| a.sku.as_bytes().cmp(b.sku.as_bytes()));
    if lines.windows(2).any(|w| w[0].sku == w[1].sku) {
        return Err(InvalidParam(
            "a sku may appear only once in an order".into(),
        ));
    }
    Ok(lines)
}

/// The canonical text of a line set: `sku qty sku qty ...`, by sku.
pub fn canonical(lines: &[Line]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in lines {
        if !out.is_empty() {
            out.push(b' ');
        }
        out.extend_from_slice(line.sku.as_bytes());
        out.push(b' ');
        out.extend_from_slice(line.qty.as_bytes());
    }
    out
}

/// The lines an intent record stores, read back.
fn lines_of(text: &[u8]) -> Option<Vec<Line>> {
    let words: Vec<&[u8]> = text.split(|b| *b == b' ').collect();
    if !words.len().is_multiple_of(2) {
        return None;
    }
    words
        .chunks(2)
        .map(|pair| {
            Some(Line {
                sku: Sku::parse(Bytes::copy_from_slice(pair[0])).ok()?,
                qty: Qty::parse(Bytes::copy_from_slice(pair[1]), u64::MAX).ok()?,
            })
        })
        .collect()
}

/// Where an order is (`lua/order.lua` has each phase's meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    None,
    Holding,
    Held,
    Confirming,
    Done,
    Aborting,
    Aborted,
    Reverting,
    Reverted,
    Revoked,
}

impl Phase {
    fn from_script(word: &[u8]) -> Option<Phase> {
        Some(match word {
            b"" => Phase::None,
            b"HOLDING" => Phase::Holding,
            b"HELD" => Phase::Held,
            b"CONFIRMING" => Phase::Confirming,
            b"DONE" => Phase::Done,
            b"ABORTING" => Phase::Aborting,
            b"ABORTED" => Phase::Aborted,
            b"REVERTING" => Phase::Reverting,
            b"REVERTED" => Phase::Reverted,
            b"REVOKED" => Phase::Revoked,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::None => "",
            Phase::Holding => "HOLDING",
            Phase::Held => "HELD",
            Phase::Confirming => "CONFIRMING",
            Phase::Done => "DONE",
            Phase::Aborting => "ABORTING",
            Phase::Aborted => "ABORTED",
            Phase::Reverting => "REVERTING",
            Phase::Reverted => "REVERTED",
            Phase::Revoked => "REVOKED",
        }
    }
}

/// The intent record as the script answered it.
#[derive(Debug, Clone)]
struct Intent {
    /// This call made the change it asked for.
    changed: bool,
    phase: Phase,
    /// `D` (ORDER) or `H` (ORDER.HOLD); empty for REVOKED.
    kind: Bytes,
    lines: Bytes,
    expires_at: i64,
    /// Why it aborted (ABORTING, ABORTED).
    code: i64,
    short: Bytes,
    /// Redis time when the script ran.
    now: i64,
}

impl Intent {
    fn from_script(value: Value) -> Result<Intent, UpstreamError> {
        let bad = || {
            UpstreamError::new(
                FaultKind::BadReply,
                format!("the order script answered an unexpected shape: {value:?}"),
            )
        };
        let Value::Array(items) = &value else {
            return Err(bad());
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        let text = |i: usize| match items.get(i) {
            Some(Value::BulkString(b)) => Some(Bytes::copy_from_slice(b)),
            Some(Value::SimpleString(s)) => Some(Bytes::copy_from_slice(s.as_bytes())),
            _ => None,
        };
        Ok(Intent {
            changed: int(0).ok_or_else(bad)? == 1,
            phase: text(1)
                .and_then(|p| Phase::from_script(&p))
                .ok_or_else(bad)?,
            kind: text(2).ok_or_else(bad)?,
            lines: text(3).ok_or_else(bad)?,
            expires_at: int(4).ok_or_else(bad)?,
            code: int(5).ok_or_else(bad)?,
            short: text(6).ok_or_else(bad)?,
            now: int(7).ok_or_else(bad)?,
        })
    }

    fn is_hold(&self) -> bool {
        &self.kind[..] == b"H"
    }

    /// A HELD order whose expiry has passed (by Redis time).
    fn ran_out(&self) -> bool {
        self.phase == Phase::Held && self.now >= self.expires_at
    }
}

/// What one order command answers.
#[derive(Debug, Clone)]
pub struct OrderReply {
    pub code: Code,
    pub expires_at: i64,
    /// `(sku, remain)` per line, by sku.
    pub lines: Vec<(Bytes, i64)>,
    pub short: Vec<Bytes>,
    pub reason: Option<String>,
}

impl OrderReply {
    fn invalid(reason: impl Into<String>) -> OrderReply {
        OrderReply {
            code: Code::Invalid,
            expires_at: 0,
            lines: Vec::new(),
            short: Vec::new(),
            reason: Some(reason.into()),
        }
    }

    pub fn to_reply(&self) -> Reply {
        let mut items = vec![
            Reply::Integer(self.code as i64),
            Reply::Integer(SCRIPT_VERSION),
            Reply::Integer(self.expires_at),
            Reply::Array(
                self.lines
                    .iter()
                    .flat_map(|(sku, remain)| [Reply::Bulk(sku.clone()), Reply::Integer(*remain)])
                    .collect(),
            ),
            Reply::Array(self.short.iter().cloned().map(Reply::Bulk).collect()),
        ];
        if let Some(reason) = &self.reason {
            items.push(Reply::bulk(reason.clone()));
        }
        Reply::Array(items)
    }
}

/// An order's intent record, as ORDER.STATUS shows it.
#[derive(Debug, Clone)]
pub struct OrderState {
    /// `none` (no record), `HOLDING`, `HELD`, ... (see [`Phase`]).
    pub phase: &'static str,
    /// `order`, `hold`, or empty (none, REVOKED).
    pub kind: &'static str,
    /// `(sku, qty)` per line, by sku.
    pub lines: Vec<(Bytes, Bytes)>,
    /// The order hold's expiry, ms of Redis time; 0 for an ORDER.
    pub expires_at: i64,
    /// A HELD order whose expiry has passed.
    pub expired: bool,
    /// Why it aborted (2, 3, 4 or 5); else 0.
    pub code: i64,
    pub short: Vec<Bytes>,
}

/// What the order commands ask of the saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Order,
    Hold,
    Confirm,
    Revert,
    /// Nobody asks: an order left behind, driven to an end ([`recovery`]).
    Recover,
}

/// What one phase's line calls came to.
enum Step {
    /// Every line did it.
    Done,
    /// The order must be undone: the code and the SKUs at fault.
    Abort(Code, Vec<Bytes>),
    /// A line's outcome is unknown: the order stays where it is, and a
    /// retry resumes it.
    Fault(UpstreamError),
}

/// The per-line call of a phase.
#[derive(Debug, Clone, Copy)]
enum LineCall {
    /// `true` for an ORDER.HOLD's lines, which wait for ORDER.CONFIRM and
    /// run out by themselves: they are filed in the sweep index. An
    /// ORDER's are not: its saga, or the recovery of the orders left
    /// behind, confirms or gives them back long before their saga time
    /// ends (and any call on their SKU releases them after it).
    Hold(bool),
    Confirm,
    Revert,
}

/// One attempt at an order: its nonce, the phases it moved it into, and
/// when its budget ends ([`SAGA_TIMEOUTS`]).
struct Attempt<'a> {
    id: &'a OrderId,
    nonce: [u8; 16],
    made: Vec<Phase>,
    remains: HashMap<Bytes, i64>,
    deadline: tokio::time::Instant,
}

impl Attempt<'_> {
    fn made(&self, phase: Phase) -> bool {
        self.made.contains(&phase)
    }
}

impl StockService {
    /// Serves ORDER, ORDER.HOLD, ORDER.CONFIRM or ORDER.REVERT, with its
    /// metrics and access log, as the RESP reply.
    pub(super) async fn order(
        self: &Arc<Self>,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
    ) -> Reply {
        match self.order_call(command, args, arrived).await {
            Ok(reply) => reply.to_reply(),
            Err(fault) => Reply::Error(fault.reply_text()),
        }
    }

    /// Serves ORDER, ORDER.HOLD, ORDER.CONFIRM or ORDER.REVERT (`args`
    /// after the name, as RESP carries them: `<request_id> [<ttl_ms>]
    /// <sku> <qty> ...`), with its metrics and access log: the one code
    /// path of both doors (RESP, and HTTP's `/v1/orders`).
    ///
    /// The saga runs as a task of its own, so a caller that goes away (a
    /// closed connection, an HTTP client's timeout) never cancels it
    /// between two steps. The caller waits one `--timeout` for it; past
    /// that it is told the outcome is unknown, and the saga goes on within
    /// its budget, or [`recovery`] ends it.
    pub async fn order_call(
        self: &Arc<Self>,
        command: StockCommand,
        args: &[Bytes],
        arrived: Instant,
    ) -> Result<OrderReply, UpstreamError> {
        let timeout = self.upstream.timeout();
        let deadline = tokio::time::Instant::now() + timeout;
        let saga = {
            let service = self.clone();
            let args = args.to_vec();
            tokio::spawn(async move { service.order_result(command, &args).await })
        };
        let result = match tokio::time::timeout_at(deadline, saga).await {
            Ok(Ok(result)) => result,
            Ok(Err(panicked)) => Err(UpstreamError::new(
                FaultKind::BadReply,
                format!(
                    "the order's saga ended without an answer ({panicked}); stockgate's recovery ends the order"
                ),
            )),
            Err(_) => Err(UpstreamError::new(
                FaultKind::Timeout,
                format!(
                    "the order did not come to rest within {} ms; it goes on in the background, and stockgate's recovery ends it if nothing else does (ORDER.STATUS shows where it is)",
                    timeout.as_millis()
                ),
            )),
        };
        let label = command.label();
        self.record(
            AccessEntry {
                command: label,
                sku: None,
                request_id: args.first().map(|a| &a[..]),
                qty: None,
            },
            result.as_ref().map(|reply| reply.code),
            arrived,
        );
        result
    }

    /// An order command's outcome, not recorded.
    async fn order_result(
        &self,
        command: StockCommand,
        args: &[Bytes],
    ) -> Result<OrderReply, UpstreamError> {
        let id = match parse_id(&args[0]).and_then(|id| self.fresh(&id.id).map(|()| id)) {
            Ok(id) => id,
            Err(invalid) => return Ok(OrderReply::invalid(invalid.0)),
        };
        match command {
            StockCommand::Order => {
                match parse_lines(&args[1..], self.max_qty, self.max_order_lines) {
                    Ok(lines) => {
                        self.moving(&id, self.begin(&id, Want::Order, &lines, None))
                            .await
                    }
                    Err(invalid) => Ok(OrderReply::invalid(invalid.0)),
                }
            }
            StockCommand::OrderHold => {
                let max = self.max_hold_ms.saturating_sub(LINE_MARGIN_MS);
                let parsed = HoldTtl::parse(args[1].clone(), max).and_then(|ttl| {
                    Ok((
                        ttl,
                        parse_lines(&args[2..], self.max_qty, self.max_order_lines)?,
                    ))
                });
                match parsed {
                    Ok((ttl, lines)) => {
                        self.moving(&id, self.begin(&id, Want::Hold, &lines, Some(ttl)))
                            .await
                    }
                    Err(invalid) => Ok(OrderReply::invalid(invalid.0)),
                }
            }
            StockCommand::OrderConfirm => {
                self.moving(&id, async {
                    let mut attempt = self.attempt(&id);
                    let intent = self.intent(&attempt, &[b"confirm"]).await?;
                    self.settle(&mut attempt, Want::Confirm, intent).await
                })
                .await
            }
            StockCommand::OrderRevert => {
                self.moving(&id, async {
                    let mut attempt = self.attempt(&id);
                    let intent = self.intent(&attempt, &[b"revert"]).await?;
                    self.settle(&mut attempt, Want::Revert, intent).await
                })
                .await
            }
            other => unreachable!("{other:?} is not an order command that moves an order"),
        }
    }

    /// Runs an order command that may move its order (`step`), filed among
    /// the orders in flight ([`recovery`]) from before its first change of
    /// the intent until the order rests again.
    async fn moving(
        &self,
        id: &OrderId,
        step: impl std::future::Future<Output = Result<OrderReply, UpstreamError>>,
    ) -> Result<OrderReply, UpstreamError> {
        let filed = self.mark_order(&id.id).await?;
        let result = step.await;
        if result.is_ok() {
            self.unmark_order(&id.id, filed);
        }
        result
    }

    /// How long an order's saga may run ([`SAGA_TIMEOUTS`]).
    fn saga_budget(&self) -> Duration {
        self.upstream.timeout() * SAGA_TIMEOUTS
    }

    fn attempt<'a>(&self, id: &'a OrderId) -> Attempt<'a> {
        Attempt {
            id,
            nonce: self.nonces.next(),
            made: Vec::new(),
            remains: HashMap::new(),
            deadline: tokio::time::Instant::now() + self.saga_budget(),
        }
    }

    /// ORDER and ORDER.HOLD: the intent is made (or found), then driven.
    async fn begin(
        &self,
        id: &OrderId,
        want: Want,
        lines: &[Line],
        ttl: Option<HoldTtl>,
    ) -> Result<OrderReply, UpstreamError> {
        let mut attempt = self.attempt(id);
        let text = canonical(lines);
        let (kind, ttl_arg, line_ttl) = match &ttl {
            Some(ttl) => ("H", ttl.get().to_string(), self.line_ttl(true, ttl.get())),
            None => ("D", "0".to_string(), self.line_ttl(false, 0)),
        };
        let line_ttl = line_ttl.to_string();
        let intent = self
            .intent(
                &attempt,
                &[
                    b"begin",
                    kind.as_bytes(),
                    &text,
                    ttl_arg.as_bytes(),
                    line_ttl.as_bytes(),
                ],
            )
            .await?;
        if intent.phase != Phase::Revoked {
            if &intent.kind[..] != kind.as_bytes() {
                let other = if intent.is_hold() {
                    "ORDER.HOLD"
                } else {
                    "ORDER"
                };
                return Ok(OrderReply::invalid(format!(
                    "request_id was used by an {other}"
                )));
            }
            if intent.lines != text {
                return Ok(OrderReply::invalid(
                    "request_id was already used with another set of lines",
                ));
            }
        }
        self.settle(&mut attempt, want, intent).await
    }

    /// How long the line holds of an order last: an ORDER's the saga's
    /// time, an ORDER.HOLD's its ttl plus [`LINE_MARGIN_MS`].
    fn line_ttl(&self, hold: bool, ttl_ms: u64) -> u64 {
        if hold {
            (ttl_ms + LINE_MARGIN_MS).min(self.max_hold_ms)
        } else {
            SAGA_TTL_MS.min(self.max_hold_ms)
        }
    }

    /// ORDER.STATUS: the intent record, read, as the RESP reply.
    pub(crate) async fn order_status(&self, args: &[Bytes]) -> Reply {
        let state = match self.order_state(&args[0]).await {
            Ok(Ok(state)) => state,
            Ok(Err(invalid)) => return Reply::error(format!("ERR {invalid}")),
            Err(fault) => return Reply::Error(fault.reply_text()),
        };
        let flat = |words: &[Bytes]| Reply::Array(words.iter().cloned().map(Reply::Bulk).collect());
        let lines: Vec<Bytes> = state
            .lines
            .iter()
            .flat_map(|(sku, qty)| [sku.clone(), qty.clone()])
            .collect();
        Reply::Map(vec![
            (Reply::bulk("phase"), Reply::bulk(state.phase)),
            (Reply::bulk("kind"), Reply::bulk(state.kind)),
            (Reply::bulk("lines"), flat(&lines)),
            (Reply::bulk("expires_at"), Reply::Integer(state.expires_at)),
            (
                Reply::bulk("expired"),
                Reply::Integer(i64::from(state.expired)),
            ),
            (Reply::bulk("code"), Reply::Integer(state.code)),
            (Reply::bulk("short"), flat(&state.short)),
        ])
    }

    /// ORDER.STATUS of `request_id` (RESP, and HTTP's
    /// `GET /v1/orders/{request_id}`): the intent record, read, changing
    /// nothing; the inner error for a request_id that is not one.
    pub async fn order_state(
        &self,
        request_id: &Bytes,
    ) -> Result<Result<OrderState, InvalidParam>, UpstreamError> {
        let id = match parse_id(request_id) {
            Ok(id) => id,
            Err(invalid) => return Ok(Err(invalid)),
        };
        let attempt = self.attempt(&id);
        let intent = self.intent(&attempt, &[b"read"]).await?;
        let words = |text: &Bytes| -> Vec<Bytes> {
            text.split(|b| *b == b' ')
                .filter(|w| !w.is_empty())
                .map(Bytes::copy_from_slice)
                .collect()
        };
        let kind = match &intent.kind[..] {
            b"D" => "order",
            b"H" => "hold",
            _ => "",
        };
        let phase = match intent.phase {
            Phase::None => "none",
            phase => phase.as_str(),
        };
        let lines = words(&intent.lines)
            .chunks(2)
            .filter(|pair| pair.len() == 2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        Ok(Ok(OrderState {
            phase,
            kind,
            lines,
            expires_at: intent.expires_at,
            expired: intent.ran_out(),
            code: intent.code,
            short: words(&intent.short),
        }))
    }

    /// One call of the intent script.
    async fn intent(&self, attempt: &Attempt<'_>, op: &[&[u8]]) -> Result<Intent, UpstreamError> {
        let key = self.keys.order_key(&attempt.id.id);
        let mut args: Vec<&[u8]> = vec![op[0], self.retry_window_arg.as_bytes(), &attempt.nonce];
        args.extend_from_slice(&op[1..]);
        let value = self
            .upstream
            .eval_by(&self.scripts.order, &[&key], &args, attempt.deadline)
            .await?;
        Intent::from_script(value)
    }

    /// Drives the order from `intent` until it rests, and answers.
    async fn settle(
        &self,
        attempt: &mut Attempt<'_>,
        want: Want,
        mut intent: Intent,
    ) -> Result<OrderReply, UpstreamError> {
        if intent.changed {
            attempt.made.push(intent.phase);
        }
        if want == Want::Confirm && intent.phase != Phase::Revoked && !intent.is_hold() {
            return Ok(OrderReply::invalid(
                "request_id is an ORDER's, which needs no ORDER.CONFIRM",
            ));
        }
        // Each pass moves the order on by at least one phase, or stops;
        // the bound only guards against a bug looping for ever.
        for _ in 0..16 {
            let lines = lines_of(&intent.lines).unwrap_or_default();
            let (from, step) = match intent.phase {
                Phase::Holding => {
                    // A resumed ORDER.HOLD holds its lines for what is left
                    // of the order's time (plus the margin).
                    let left = (intent.expires_at - intent.now).max(0) as u64;
                    let line_ttl = self.line_ttl(intent.is_hold(), left);
                    (
                        Phase::Holding,
                        self.lines(attempt, &lines, LineCall::Hold(intent.is_hold()), line_ttl)
                            .await,
                    )
                }
                Phase::Confirming => (
                    Phase::Confirming,
                    self.lines(attempt, &lines, LineCall::Confirm, 0).await,
                ),
                Phase::Aborting => (
                    Phase::Aborting,
                    self.lines(attempt, &lines, LineCall::Revert, 0).await,
                ),
                Phase::Reverting => (
                    Phase::Reverting,
                    self.lines(attempt, &lines, LineCall::Revert, 0).await,
                ),
                Phase::Held if want == Want::Confirm => {
                    intent = self.intent(attempt, &[b"confirm"]).await?;
                    if intent.changed {
                        attempt.made.push(intent.phase);
                    }
                    continue;
                }
                _ => return Ok(self.answer(attempt, want, &intent, &lines)),
            };
            let to = match (&step, from) {
                (Step::Fault(fault), _) => return Err(fault.clone()),
                (Step::Done, Phase::Holding) if intent.is_hold() => (Phase::Held, None),
                (Step::Done, Phase::Holding) => (Phase::Confirming, None),
                (Step::Done, Phase::Confirming) => (Phase::Done, None),
                (Step::Done, Phase::Aborting) => (Phase::Aborted, None),
                (Step::Done, _) => (Phase::Reverted, None),
                (Step::Abort(code, short), _) => (Phase::Aborting, Some((*code, short.clone()))),
            };
            let (code, short) = match &to.1 {
                Some((code, short)) => ((*code as i64).to_string(), join(short)),
                None => (String::new(), Vec::new()),
            };
            intent = self
                .intent(
                    attempt,
                    &[
                        b"advance",
                        from.as_str().as_bytes(),
                        to.0.as_str().as_bytes(),
                        code.as_bytes(),
                        &short,
                    ],
                )
                .await?;
            if intent.changed {
                attempt.made.push(intent.phase);
            }
        }
        Err(UpstreamError::new(
            FaultKind::BadReply,
            "the order did not come to rest; nothing more was done (retry with the same request_id)",
        ))
    }

    /// The reply for an order at rest.
    fn answer(
        &self,
        attempt: &Attempt<'_>,
        want: Want,
        intent: &Intent,
        lines: &[Line],
    ) -> OrderReply {
        let short: Vec<Bytes> = intent
            .short
            .split(|b| *b == b' ')
            .filter(|s| !s.is_empty())
            .map(Bytes::copy_from_slice)
            .collect();
        let aborted = || Code::from_wire(intent.code).unwrap_or(Code::Revoked);
        let code = match (want, intent.phase) {
            (Want::Revert, Phase::Revoked) if attempt.made(Phase::Revoked) => Code::Revoked,
            (Want::Revert, Phase::Reverted) if attempt.made(Phase::Reverting) => Code::Ok,
            (Want::Revert, _) => Code::Duplicate,
            (_, Phase::Revoked) => Code::Revoked,
            (_, Phase::Reverting | Phase::Reverted) => Code::Revoked,
            (Want::Confirm, Phase::Aborted) if aborted() == Code::Expired => Code::Expired,
            (Want::Confirm, Phase::Aborted) => Code::Revoked,
            (_, Phase::Aborted) => aborted(),
            (Want::Hold, Phase::Held) if intent.ran_out() => Code::Expired,
            (Want::Hold, Phase::Held) if attempt.made(Phase::Held) => Code::Ok,
            (Want::Hold, _) => Code::Duplicate,
            (_, Phase::Done) if attempt.made(Phase::Done) => Code::Ok,
            _ => Code::Duplicate,
        };
        // A 3 of an order that was begun: a line's SKU refused its HOLD
        // (see `lines`), and every line was given back.
        let refused = code == Code::Invalid && intent.phase == Phase::Aborted;
        let shown_short = matches!(code, Code::Insufficient | Code::Expired) || refused;
        let reason = refused.then(|| {
            let skus: Vec<String> = short
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            format!(
                "no stock is recorded for sku {} (or its stock or record is not what stockgate wrote); every line was given back",
                skus.join(", ")
            )
        });
        OrderReply {
            code,
            expires_at: if intent.is_hold() {
                intent.expires_at
            } else {
                0
            },
            lines: lines
                .iter()
                .map(|line| {
                    let sku = Bytes::copy_from_slice(line.sku.as_bytes());
                    let remain = attempt.remains.get(&sku).copied().unwrap_or(-1);
                    (sku, remain)
                })
                .collect(),
            short: if shown_short { short } else { Vec::new() },
            reason,
        }
    }

    /// One phase's call on every line, all sent at once.
    async fn lines(
        &self,
        attempt: &mut Attempt<'_>,
        lines: &[Line],
        call: LineCall,
        line_ttl: u64,
    ) -> Step {
        let line_ttl = HoldTtl::parse(line_ttl.max(1000).to_string().into(), self.max_hold_ms)
            .or_else(|_| HoldTtl::parse(self.max_hold_ms.to_string().into(), self.max_hold_ms));
        let Ok(line_ttl) = line_ttl else {
            return Step::Fault(UpstreamError::new(
                FaultKind::BadReply,
                "no line hold ttl fits --max-hold",
            ));
        };
        let line_id = &attempt.id.line_id;
        let results = futures_util::future::join_all(lines.iter().map(|line| {
            let request_id = line_id.clone();
            let op = match call {
                LineCall::Hold(_) => Op::Hold(super::hold::Hold {
                    sku: line.sku.clone(),
                    qty: line.qty.clone(),
                    request_id,
                    ttl: line_ttl.clone(),
                    order_no: OrderNo::default(),
                }),
                LineCall::Confirm => Op::Confirm(super::confirm::Confirm {
                    sku: line.sku.clone(),
                    request_id,
                }),
                LineCall::Revert => Op::Revert(super::revert::Revert {
                    sku: line.sku.clone(),
                    request_id,
                }),
            };
            self.line(op, attempt.deadline, matches!(call, LineCall::Hold(true)))
        }))
        .await;
        let (mut revoked, mut expired, mut short, mut refused) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut fault = None;
        for (line, result) in lines.iter().zip(results) {
            let sku = Bytes::copy_from_slice(line.sku.as_bytes());
            match result {
                Ok(reply) => {
                    if reply.remain >= 0 {
                        attempt.remains.insert(sku.clone(), reply.remain);
                    }
                    match (call, reply.code) {
                        (_, Code::Ok | Code::Duplicate) => {}
                        (LineCall::Revert, _) => {}
                        (_, Code::Revoked) => revoked.push(sku),
                        (_, Code::Expired) => expired.push(sku),
                        (LineCall::Hold(_), Code::Insufficient) => short.push(sku),
                        (_, _) => refused.push(sku),
                    }
                }
                // A line HOLD that the data refuses (no stock key with
                // `--missing-stock error`, a stock or record stockgate did
                // not write) changed nothing, and a retry would meet the
                // same: the order can't be held, and every line goes back
                // now instead of waiting for a retry that can't help.
                Err(err)
                    if matches!(call, LineCall::Hold(_))
                        && matches!(err.kind, FaultKind::UnknownSku | FaultKind::BadData) =>
                {
                    refused.push(sku)
                }
                Err(err) => {
                    fault.get_or_insert(err);
                }
            }
        }
        if !revoked.is_empty() {
            Step::Abort(Code::Revoked, revoked)
        } else if !expired.is_empty() {
            Step::Abort(Code::Expired, expired)
        } else if !short.is_empty() {
            Step::Abort(Code::Insufficient, short)
        } else if !refused.is_empty() {
            Step::Abort(Code::Invalid, refused)
        } else if let Some(fault) = fault {
            Step::Fault(fault)
        } else {
            Step::Done
        }
    }

    /// One line's script call: through its node pipe, and the fallback
    /// when the answer calls for it, within `--timeout` and the saga's
    /// `deadline`; a line hold filed in the sweep index when `swept`. Its
    /// metrics are the order's, not a HOLD's or a CONFIRM's.
    async fn line(&self, op: Op, deadline: tokio::time::Instant, swept: bool) -> StockResult {
        if let Op::Hold(hold) = &op {
            debug_assert!(hold.request_id.as_bytes().starts_with(b"~ord:"));
        }
        let mut call = self.call_of(op, Instant::now());
        if call.sent >= deadline {
            return Err(UpstreamError::timeout(self.upstream.timeout()));
        }
        call.deadline = call.deadline.min(deadline);
        call.order_line = true;
        call.swept = swept;
        let answer = self.await_answer(&call).await;
        let result = match self.upstream.verdict(answer) {
            Verdict::Settled(result) => result,
            Verdict::Fallback => self.resend(&call).await,
        };
        if let Ok(reply) = &result
            && swept
        {
            self.index_hold(&call.op, reply);
        }
        self.metrics
            .record_upstream(CommandLabel::Order, call.sent.elapsed());
        result
    }
}

fn join(skus: &[Bytes]) -> Vec<u8> {
    skus.join(&b' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<Bytes> {
        list.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn lines_are_checked_and_sorted() {
        let lines = parse_lines(&args(&["b", "2", "a", "1"]), 10, 100).unwrap();
        assert_eq!(canonical(&lines), b"a 1 b 2");
        assert_eq!(lines_of(b"a 1 b 2").unwrap(), lines);
        for bad in [
            &[][..],
            &["a"][..],
            &["a", "1", "b"][..],
            &["a", "1", "a", "2"][..],
            &["a", "0"][..],
            &["a", "11"][..],
            &["a{", "1"][..],
        ] {
            assert!(parse_lines(&args(bad), 10, 100).is_err(), "{bad:?}");
        }
        assert!(parse_lines(&args(&["a", "1", "b", "1"]), 10, 1).is_err());
    }

    #[test]
    fn an_order_id_leaves_room_for_the_line_prefix() {
        assert!(parse_id(&Bytes::from("x".repeat(123))).is_ok());
        assert!(parse_id(&Bytes::from("x".repeat(124))).is_err());
        let id = parse_id(&Bytes::from("cart-1")).unwrap();
        assert_eq!(id.line_id.as_bytes(), b"~ord:cart-1");
    }
}
