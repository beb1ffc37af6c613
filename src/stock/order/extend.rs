//! ORDER.EXTEND: a held order lasts longer, every line with it, while a
//! slow payment completes.
//!
//! # Format
//!
//! ```text
//! ORDER.EXTEND <request_id> <change_id> <ttl_ms>
//! ```
//!
//! The ORDER.HOLD of `request_id` now lasts until `ttl_ms` from now, by
//! Redis time (the intent's primary); never earlier than it lasts already
//! (code 3), and at most `--max-hold` less the lines' 2 s from the order's
//! start (code 3). Each extension names itself with a `change_id`: the same
//! one again answers 1 with the expiry it set. Replies `[code, version,
//! expires_at_ms, lines, short]` (see [`super`]): 0 extended, 1 this
//! change_id was applied (or the order is confirmed), 3 invalid (no such
//! ORDER.HOLD, past the bound, not later, or an order held by an older
//! stockgate, which kept no start time), 4 reverted or revoked, 5 the
//! order's hold ran out (or a line's did: `short` names it).
//!
//! The saga: the intent says what the extension would come to
//! (`try_extend`, changing nothing); every line's hold then lasts
//! `ttl_ms` plus [`LINE_MARGIN_MS`] from now (`lua/change_hold.lua`, an
//! order's line); and the intent's compare-and-set (`extend`) moves the
//! order's expiry to the one `try_extend` answered, so each line holds
//! past it by the margin. A crash or a refusal between the two leaves the
//! lines held longer than the order, which is safe: ORDER.CONFIRM and
//! ORDER.REVERT decide by the intent and end every line however long it
//! holds, and a line nobody ends runs out by itself at its own expiry,
//! its units back once (docs/holds-and-orders.md).

use super::intent::{Extension, IntentOp};
use super::lines::{LineCall, lines_of};
use super::{LINE_MARGIN_MS, OrderReply, Saga, Step};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::error::{FaultKind, UpstreamError};
use crate::outcome::Code;
use crate::params::{ChangeId, HoldTtl, InvalidParam, RequestId};
use crate::stock::command::{Body, Command, Footprint, Http, Serve, Want, codes};
use crate::stock::single::Field;
use bytes::Bytes;

static ARGS: [ArgSpec; 3] = [
    arg("request_id", "string"),
    arg("change_id", "string"),
    arg("ttl_ms", "integer"),
];

pub static COMMAND: Command = Command {
    doc: Doc {
        name: "order.extend",
        arity: 4,
        max_args: None,
        flags: &["write", "denyoom"],
        group: "stockgate",
        summary: "Moves a held order's expiry, every line with it, to ttl_ms from now (Redis time), at most --max-hold less 2 s from its start, once per change_id. Replies [code, version, expires_at_ms, lines, short]: 0 extended, 1 already applied (or confirmed), 3 invalid, 4 revoked, 5 expired.",
        args: &ARGS,
    },
    answers: codes::CHANGES_HOLD,
    right: Right::Caller,
    gives_back: false,
    footprint: Footprint::All,
    serve: Serve::Order(Want::Extend),
    http: Http::post(
        "/v1/orders/{request_id}/extend",
        Body::PathThen(&[Field::ChangeId, Field::TtlMs]),
    ),
};

impl Saga<'_> {
    /// ORDER.EXTEND with `args` (after the name: request_id, change_id,
    /// ttl_ms), the request_id checked.
    pub(super) async fn extend(&mut self, args: &[Bytes]) -> Result<OrderReply, UpstreamError> {
        let service = self.service;
        // The order's own ttl_ms runs as ORDER.HOLD's: its lines hold the
        // margin longer, within --max-hold.
        let max = service
            .settings
            .limits
            .max_hold_ms
            .saturating_sub(LINE_MARGIN_MS);
        let checked = ChangeId::parse(args[1].clone()).and_then(|change_id| {
            let ttl = HoldTtl::parse(args[2].clone(), max)?;
            // A change_id whose record may have gone could apply again.
            service.fresh_id("change_id", &RequestId::parse(args[1].clone())?)?;
            Ok::<_, InvalidParam>((change_id, ttl))
        });
        let (change_id, ttl) = match checked {
            Ok(checked) => checked,
            Err(invalid) => return Ok(OrderReply::invalid(invalid.0)),
        };
        let (change_id, ttl_text) = (change_id.as_bytes(), ttl.as_bytes());
        let tried = self
            .intent(IntentOp::TryExtend {
                change_id,
                ttl: ttl_text,
                max,
            })
            .await?;
        let lines = lines_of(&tried.lines).unwrap_or_default();
        let verdict = verdict(&tried.extension)?;
        if verdict.code != Code::Ok as i64 {
            return Ok(self.extended(verdict, &lines, Vec::new()));
        }
        let line_ttl = ttl.get() + LINE_MARGIN_MS;
        match self.lines(&lines, LineCall::Extend, line_ttl).await {
            Step::Done => {}
            Step::Fault(fault) => return Err(fault),
            // A line that ran out or was revoked before its order (a
            // failover lost its write, or the clocks are apart by more
            // than the margin): the order can't last, and is left as it
            // is; its ORDER.CONFIRM gives every line back.
            Step::Abort(code, skus) => {
                let reason = (code == Code::Invalid).then(|| {
                    format!(
                        "sku {} has no hold of this order's line to extend; the order is left as it was",
                        skus.iter()
                            .map(|s| String::from_utf8_lossy(s).into_owned())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                });
                let mut reply = self.extended(
                    &Extension {
                        code: code as i64,
                        expires_at: if code == Code::Expired {
                            tried.expires_at
                        } else {
                            0
                        },
                        reason: Bytes::new(),
                    },
                    &lines,
                    skus,
                );
                reply.reason = reason;
                return Ok(reply);
            }
        }
        let done = self
            .intent(IntentOp::Extend {
                change_id,
                ttl: ttl_text,
                expires_at: verdict.expires_at,
                line_margin: LINE_MARGIN_MS,
            })
            .await?;
        let verdict = self::verdict(&done.extension)?;
        Ok(self.extended(verdict, &lines, Vec::new()))
    }

    /// The reply to an extension, as the intent script decided it.
    fn extended(
        &self,
        verdict: &Extension,
        lines: &[super::Line],
        short: Vec<Bytes>,
    ) -> OrderReply {
        let code = Code::from_wire(verdict.code).unwrap_or(Code::Invalid);
        OrderReply {
            code,
            expires_at: verdict.expires_at,
            lines: self.remains_of(lines),
            short,
            reason: (code == Code::Invalid)
                .then(|| String::from_utf8_lossy(&verdict.reason).into_owned()),
        }
    }
}

/// The extension's outcome an extend op answers with.
fn verdict(extension: &Option<Extension>) -> Result<&Extension, UpstreamError> {
    extension.as_ref().ok_or_else(|| {
        UpstreamError::new(
            FaultKind::BadReply,
            "the order script answered an extension without its outcome",
        )
    })
}
