//! Orders: several SKUs, all lines or none, safe to retry through any
//! stockgate. One file per command:
//!
//! - [`deduct`]: `ORDER <request_id> <sku> <qty> [<sku> <qty> ...]`
//! - [`hold`]: `ORDER.HOLD <request_id> <ttl_ms> <sku> <qty> [...]`
//! - [`confirm`]: `ORDER.CONFIRM <request_id>`
//! - [`revert`]: `ORDER.REVERT <request_id>`
//! - [`extend`]: `ORDER.EXTEND <request_id> <change_id> <ttl_ms>`
//!
//! On Redis Cluster each SKU lives in its own slot, so no one script can
//! take them all. An order is a saga instead: an intent record under its
//! own hash tag (`lua/order.lua`, [`crate::keys::KeyLayout::order_key`])
//! says how far it got, and each line is a per-line call of the line id
//! `~ord:<request_id>` on its SKU, all lines of a phase sent to their
//! primaries at once: an ORDER's a DEDUCT (REVERT when it is undone), an
//! ORDER.HOLD's a HOLD (then CONFIRM, or REVERT). Every change of the intent is a
//! compare-and-set in Redis, and every line call is idempotent, so any
//! number of stockgates driving one order converge on one outcome, and a
//! retry resumes whatever phase an earlier attempt (perhaps dead) left.
//!
//! ```text
//!   ORDER:       HOLDING -> DONE            (lines taken in HOLDING)
//!   ORDER.HOLD:  HOLDING -> HELD --ORDER.CONFIRM--> CONFIRMING -> DONE
//!   a line short (2), expired (5), revoked (4) or refused (3):
//!                HOLDING | CONFIRMING -> ABORTING -> ABORTED
//!   ORDER.REVERT: any live phase -> REVERTING -> REVERTED; none -> REVOKED
//!   ORDER.EXTEND: HELD -> HELD, later (every line first)
//! ```
//!
//! Nothing answers 0 before the intent says DONE (or HELD): up to then
//! the order can still be undone, and whoever undoes it first wins the
//! compare-and-set. An ORDER.HOLD's line only ever becomes final
//! (CONFIRMED) in CONFIRMING, and nothing leaves CONFIRMING but DONE
//! (every line confirmed) or ABORTING / REVERTING, which give every line
//! back. An ORDER's lines are taken (DEDUCTED) in HOLDING, the phase an
//! undo starts from like any other: a line REVERT gives a taken line
//! back, and tombstones one not taken yet, so that a late DEDUCT of it
//! answers 4 and takes nothing. An ORDER so needs no CONFIRMING: one
//! round of line calls and one change of the intent fewer than holding
//! and confirming (docs/holds-and-orders.md has the crash argument step
//! by step). Intents of kind `D`, begun by a stockgate
//! older than this one, still hold and confirm their lines.
//!
//! Replies: `[code, version, expires_at_ms, lines, short]`, plus a reason
//! for code 3. `lines` is a flat array `sku, remain, sku, remain, ...`
//! in sku order (remain: the SKU's stock as this call's last line call
//! saw it, -1 when this call made none); `short` the SKUs at fault for a
//! 2 (insufficient) or a 5 (expired); `expires_at_ms` the order hold's
//! expiry (ORDER.HOLD, ORDER.CONFIRM answering 0, 1 or 5; 0 otherwise, as a
//! single HOLD answers).

pub mod confirm;
pub mod deduct;
pub mod extend;
mod filing;
pub mod hold;
mod intent;
pub(crate) mod lines;
pub mod recovery;
mod reply;
pub mod revert;
pub mod status;

pub use intent::Phase;
pub use lines::{Line, canonical, parse_lines};
pub use recovery::recover_shard;
pub use reply::OrderReply;
pub use status::{OrderState, order_state};

use super::books::AccessEntry;
use super::command::{Serve, Want};
use super::{StockCommand, StockService};
use crate::error::{FaultKind, UpstreamError};
use crate::keys::KeyLayout;
use crate::outcome::Code;
use crate::params::{HoldTtl, InvalidParam, RequestId, Sku};
use bytes::Bytes;
use intent::{Intent, IntentOp};
use lines::{LineCall, lines_of};
use std::sync::Arc;
use std::time::Instant;

/// How much longer an ORDER.HOLD's line holds last than the order: the
/// intent's expiry is decided by one primary's clock, each line's by its
/// own, and the lines must not run out before the order does.
pub const LINE_MARGIN_MS: u64 = 2000;

/// The longest request_id of an order: the line ids add `~ord:`.
const MAX_ORDER_ID: usize = crate::params::MAX_FIELD_LEN - crate::keys::ORDER_LINE_PREFIX.len();

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

/// Where an attempt stands with the orders in flight ([`recovery`]): an
/// order command files its order before its first change of the intent,
/// and takes it out once the order rests. Both ride along with a call of
/// the intent script when the shard's orders key lives on the intent's
/// node (`lua/order.lua`), and are calls of their own otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filing {
    /// Not this attempt's to file: a read, or the recovery itself.
    Off,
    /// To be filed by the first intent call that may change it.
    Due,
    /// Filed at this score.
    Filed(i64),
    /// Taken out again.
    Out,
}

/// One attempt at an order: its nonce, the phases it moved it into, the
/// stock each line's last call saw, its filing among the orders in
/// flight, and when its budget ends ([`SAGA_TIMEOUTS`]).
struct Saga<'a> {
    service: &'a StockService,
    id: &'a OrderId,
    nonce: [u8; 16],
    made: Vec<Phase>,
    /// The stock each line's SKU was seen at by this attempt's last call
    /// on it (a handful: a list, not a map).
    remains: Vec<(Sku, i64)>,
    filing: Filing,
    /// The shard of the orders in flight the order is filed in (its
    /// intent key's slot, hashed once).
    shard: usize,
    deadline: tokio::time::Instant,
}

/// Serves ORDER, ORDER.HOLD, ORDER.CONFIRM or ORDER.REVERT (`args` after
/// the name), with its metrics and access log: the one code path of both
/// doors (RESP, and HTTP's `/v1/orders`).
///
/// The saga runs as a task of its own, so a caller that goes away (a
/// closed connection, an HTTP client's timeout) never cancels it between
/// two steps. The caller waits one `--timeout` for it; past that it is
/// told the outcome is unknown, and the saga goes on within its budget,
/// or [`recovery`] ends it.
pub async fn order_call(
    service: &Arc<StockService>,
    command: StockCommand,
    args: &[Bytes],
    arrived: Instant,
    user: Option<&str>,
) -> Result<OrderReply, UpstreamError> {
    let Serve::Order(want) = command.describe().serve else {
        unreachable!("{command:?} is not an order command")
    };
    let timeout = service.upstream.timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut saga = SagaTask {
        task: Some({
            let service = service.clone();
            let args = args.to_vec();
            // Boxed: the saga's future is large, and spawning moved it whole
            // several times.
            tokio::spawn(Box::pin(async move {
                order_result(&service, want, &args).await
            }))
        }),
        bound_at: tokio::time::Instant::now() + filing::saga_bound(service),
    };
    let task = saga.task.as_mut().expect("the saga was just spawned");
    let result = match tokio::time::timeout_at(deadline, task).await {
        Ok(done) => {
            saga.task = None;
            match done {
                Ok(result) => result,
                Err(panicked) => Err(UpstreamError::new(
                    FaultKind::BadReply,
                    format!(
                        "the order's saga ended without an answer ({panicked}); stockgate's recovery ends the order"
                    ),
                )),
            }
        }
        Err(_) => Err(UpstreamError::new(
            FaultKind::Timeout,
            format!(
                "the order did not come to rest within {} ms; it goes on in the background, and stockgate's recovery ends it if nothing else does (ORDER.STATUS shows where it is)",
                timeout.as_millis()
            ),
        )),
    };
    service.books.record(
        AccessEntry {
            command,
            sku: None,
            request_id: args.first().map(|a| &a[..]),
            qty: None,
            user,
        },
        result.as_ref().map(|reply| reply.code),
        arrived.elapsed(),
    );
    result
}

/// An order's saga running as a task of its own, bounded as a whole
/// ([`filing::saga_bound`]): its calls wait for their answers without a
/// timer each (the node pipes answer every call by its deadline), and the
/// bound guards only against a pipe that stopped.
///
/// One timer per order: while its caller waits, the caller's deadline is
/// the only one, and it comes first. A saga still running when its caller
/// stops waiting (the deadline passed, or the caller went away) is
/// watched to its bound from then on, and ended there; whatever it left
/// is [`recovery`]'s.
struct SagaTask {
    task: Option<tokio::task::JoinHandle<Result<OrderReply, UpstreamError>>>,
    bound_at: tokio::time::Instant,
}

impl Drop for SagaTask {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        if task.is_finished() {
            return;
        }
        let abort = task.abort_handle();
        let bound_at = self.bound_at;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if tokio::time::timeout_at(bound_at, task).await.is_err() {
                        tracing::debug!("an order's saga ran past its bound and was ended; stockgate's recovery ends the order");
                        abort.abort();
                    }
                });
            }
            Err(_) => abort.abort(),
        }
    }
}

/// An order command's outcome, not recorded.
async fn order_result(
    service: &StockService,
    want: Want,
    args: &[Bytes],
) -> Result<OrderReply, UpstreamError> {
    let id = match parse_id(&args[0]).and_then(|id| service.fresh(&id.id).map(|()| id)) {
        Ok(id) => id,
        Err(invalid) => return Ok(OrderReply::invalid(invalid.0)),
    };
    // An extension starts and ends HELD, where an order rests: it leaves
    // nothing for the recovery to finish, and files nothing.
    let filing = match want {
        Want::Extend => Filing::Off,
        _ => Filing::Due,
    };
    let mut saga = Saga::new(service, &id, filing);
    let result = saga.order_step(want, args).await;
    // Resting now: out of the orders in flight, unless a call of the saga
    // took it out already. Not awaited: an order left filed is looked at
    // when due, found at rest, and taken out then.
    if result.is_ok()
        && let Filing::Filed(score) = saga.filing
    {
        filing::unmark_order(service, &id.id, saga.shard, score);
    }
    result
}

impl<'a> Saga<'a> {
    fn new(service: &'a StockService, id: &'a OrderId, filing: Filing) -> Saga<'a> {
        Saga {
            service,
            id,
            nonce: service.nonces.next(),
            made: Vec::new(),
            remains: Vec::new(),
            filing,
            shard: service.keys.order_shard_index(&id.id),
            deadline: tokio::time::Instant::now() + filing::saga_budget(service),
        }
    }

    /// A line's SKU was seen at `remain` by this attempt.
    fn saw(&mut self, sku: &Sku, remain: i64) {
        match self.remains.iter_mut().find(|(seen, _)| seen == sku) {
            Some((_, seen)) => *seen = remain,
            None => self.remains.push((sku.clone(), remain)),
        }
    }

    fn made(&self, phase: Phase) -> bool {
        self.made.contains(&phase)
    }

    /// What an order command does with its order, until it rests.
    async fn order_step(
        &mut self,
        want: Want,
        args: &[Bytes],
    ) -> Result<OrderReply, UpstreamError> {
        let settings = &self.service.settings;
        let (max_qty, max_lines) = (settings.limits.max_qty, settings.max_order_lines);
        match want {
            Want::Order => match parse_lines(&args[1..], max_qty, max_lines) {
                Ok(lines) => self.begin(want, &lines, None).await,
                Err(invalid) => Ok(OrderReply::invalid(invalid.0)),
            },
            Want::Hold => {
                let max = settings.limits.max_hold_ms.saturating_sub(LINE_MARGIN_MS);
                let parsed = HoldTtl::parse(args[1].clone(), max)
                    .and_then(|ttl| Ok((ttl, parse_lines(&args[2..], max_qty, max_lines)?)));
                match parsed {
                    Ok((ttl, lines)) => self.begin(want, &lines, Some(ttl)).await,
                    Err(invalid) => Ok(OrderReply::invalid(invalid.0)),
                }
            }
            Want::Confirm if args.len() > 1 => {
                let lines = match parse_lines(&args[1..], max_qty, max_lines) {
                    Ok(lines) => lines,
                    Err(invalid) => return Ok(OrderReply::invalid(invalid.0)),
                };
                let text = canonical(&lines);
                let intent = self
                    .intent(IntentOp::Confirm { lines: Some(&text) })
                    .await?;
                // The script moved nothing: the order has other lines than
                // these (a barrier the connection did not keep for them).
                if intent.phase != Phase::Revoked && intent.lines != text {
                    return Ok(OrderReply::invalid(
                        "the lines named are not the order's (name its ORDER.HOLD's lines, or none)",
                    ));
                }
                self.settle(want, intent, Some((&text, &lines))).await
            }
            Want::Confirm => {
                let intent = self.intent(IntentOp::Confirm { lines: None }).await?;
                self.settle(want, intent, None).await
            }
            Want::Revert => {
                let intent = self.intent(IntentOp::Revert).await?;
                self.settle(want, intent, None).await
            }
            Want::Extend => self.extend(args).await,
            Want::Recover => unreachable!("the recovery drives an order from its intent"),
        }
    }

    /// ORDER and ORDER.HOLD: the intent is made (or found), then driven.
    async fn begin(
        &mut self,
        want: Want,
        lines: &[Line],
        ttl: Option<HoldTtl>,
    ) -> Result<OrderReply, UpstreamError> {
        let text = canonical(lines);
        // An ORDER's lines are taken, not held: the intent need only
        // outlast its saga (the script adds two retry windows).
        let (hold, line_ttl) = match &ttl {
            Some(ttl) => (Some(ttl.get()), self.line_ttl(true, ttl.get())),
            None => (None, filing::saga_budget(self.service).as_millis() as u64),
        };
        let intent = self
            .intent(IntentOp::Begin {
                lines: &text,
                hold,
                line_ttl,
            })
            .await?;
        if intent.phase != Phase::Revoked {
            if intent.is_hold() != (want == Want::Hold) {
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
        self.settle(want, intent, Some((&text, lines))).await
    }

    /// How long the line holds of an order last: an ORDER's
    /// `--order-line-hold`, an ORDER.HOLD's its ttl plus [`LINE_MARGIN_MS`].
    fn line_ttl(&self, hold: bool, ttl_ms: u64) -> u64 {
        let settings = &self.service.settings;
        if hold {
            (ttl_ms + LINE_MARGIN_MS).min(settings.limits.max_hold_ms)
        } else {
            settings.order_line_hold_ms
        }
    }

    /// Drives the order from `intent` until it rests, and answers. `known`:
    /// the lines this command parsed, and their canonical text, which the
    /// intent's lines need not be read back from while they are the same.
    async fn settle(
        &mut self,
        want: Want,
        mut intent: Intent,
        known: Option<(&[u8], &[Line])>,
    ) -> Result<OrderReply, UpstreamError> {
        if want == Want::Confirm && intent.phase != Phase::Revoked && !intent.is_hold() {
            return Ok(OrderReply::invalid(
                "request_id is an ORDER's, which needs no ORDER.CONFIRM",
            ));
        }
        // Each pass moves the order on by at least one phase, or stops;
        // the bound only guards against a bug looping for ever.
        for _ in 0..16 {
            let read;
            let lines: &[Line] = match known {
                Some((text, lines)) if text == &intent.lines[..] => lines,
                _ => {
                    read = lines_of(&intent.lines).unwrap_or_default();
                    &read
                }
            };
            let (from, step) = match intent.phase {
                Phase::Holding => {
                    // A resumed ORDER.HOLD holds its lines for what is left
                    // of the order's time (plus the margin).
                    let left = (intent.expires_at - intent.now).max(0) as u64;
                    let line_ttl = self.line_ttl(intent.is_hold(), left);
                    let call = if intent.takes() {
                        LineCall::Take
                    } else {
                        LineCall::Hold(intent.is_hold())
                    };
                    (Phase::Holding, self.lines(lines, call, line_ttl).await)
                }
                Phase::Confirming => (
                    Phase::Confirming,
                    self.lines(lines, LineCall::Confirm, 0).await,
                ),
                Phase::Aborting => (
                    Phase::Aborting,
                    self.lines(lines, LineCall::Revert, 0).await,
                ),
                Phase::Reverting => (
                    Phase::Reverting,
                    self.lines(lines, LineCall::Revert, 0).await,
                ),
                Phase::Held if want == Want::Confirm => {
                    let named = known.map(|(text, _)| text);
                    intent = self.intent(IntentOp::Confirm { lines: named }).await?;
                    continue;
                }
                _ => return Ok(self.answer(want, &intent, lines)),
            };
            let short;
            let (to, abort) = match (&step, from) {
                (Step::Fault(fault), _) => return Err(fault.clone()),
                (Step::Done, Phase::Holding) if intent.is_hold() => (Phase::Held, None),
                (Step::Done, Phase::Holding) if intent.takes() => (Phase::Done, None),
                (Step::Done, Phase::Holding) => (Phase::Confirming, None),
                (Step::Done, Phase::Confirming) => (Phase::Done, None),
                (Step::Done, Phase::Aborting) => (Phase::Aborted, None),
                (Step::Done, _) => (Phase::Reverted, None),
                (Step::Abort(code, skus), _) => {
                    short = skus.join(&b' ');
                    (Phase::Aborting, Some((*code, &short[..])))
                }
            };
            intent = self.intent(IntentOp::Advance { from, to, abort }).await?;
        }
        Err(UpstreamError::new(
            FaultKind::BadReply,
            "the order did not come to rest; nothing more was done (retry with the same request_id)",
        ))
    }

    /// What the order command answers, from where its intent rests.
    fn answer(&self, want: Want, intent: &Intent, lines: &[Line]) -> OrderReply {
        let short: Vec<Bytes> = intent
            .short
            .split(|b| *b == b' ')
            .filter(|s| !s.is_empty())
            .map(Bytes::copy_from_slice)
            .collect();
        let aborted = || Code::from_wire(intent.code).unwrap_or(Code::Revoked);
        let code = match (want, intent.phase) {
            (Want::Revert, Phase::Revoked) if self.made(Phase::Revoked) => Code::Revoked,
            (Want::Revert, Phase::Reverted) if self.made(Phase::Reverting) => Code::Ok,
            (Want::Revert, _) => Code::Duplicate,
            (_, Phase::Revoked) => Code::Revoked,
            (_, Phase::Reverting | Phase::Reverted) => Code::Revoked,
            (Want::Confirm, Phase::Aborted) if aborted() == Code::Expired => Code::Expired,
            (Want::Confirm, Phase::Aborted) => Code::Revoked,
            (_, Phase::Aborted) => aborted(),
            (Want::Hold, Phase::Held) if intent.ran_out() => Code::Expired,
            (Want::Hold, Phase::Held) if self.made(Phase::Held) => Code::Ok,
            (Want::Hold, _) => Code::Duplicate,
            (_, Phase::Done) if self.made(Phase::Done) => Code::Ok,
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
                "sku {} refused its line: no stock is recorded for it, or it keeps its stock by location and the line names none (<sku>{{<POLICY>:<location>,...}}), or its stock or record is not what stockgate wrote; every line was given back",
                skus.join(", ")
            )
        });
        OrderReply {
            code,
            // As a single HOLD shows it: the hold's expiry when the order
            // holds, held or ran out (0, 1, 5); 0 when it never held (2, 3)
            // or was revoked (4), and for an ORDER, which holds no time.
            expires_at: if intent.is_hold()
                && matches!(code, Code::Ok | Code::Duplicate | Code::Expired)
            {
                intent.expires_at
            } else {
                0
            },
            lines: self.remains_of(lines),
            short: if shown_short { short } else { Vec::new() },
            reason,
        }
    }

    /// Each line's SKU and its stock as this attempt last saw it (-1: no
    /// call of this attempt on it).
    fn remains_of(&self, lines: &[Line]) -> Vec<(Bytes, i64)> {
        lines
            .iter()
            .map(|line| {
                let remain = self
                    .remains
                    .iter()
                    .find(|(sku, _)| *sku == line.sku)
                    .map_or(-1, |(_, remain)| *remain);
                (line.sku.to_bytes(), remain)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_id_leaves_room_for_the_line_prefix() {
        assert!(parse_id(&Bytes::from("x".repeat(123))).is_ok());
        assert!(parse_id(&Bytes::from("x".repeat(124))).is_err());
        let id = parse_id(&Bytes::from("cart-1")).unwrap();
        assert_eq!(id.line_id.as_bytes(), b"~ord:cart-1");
    }
}
