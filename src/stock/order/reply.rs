//! What an order command answers, from where its intent rests.

use super::intent::{Intent, Phase};
use super::{Attempt, Line, Want};
use crate::outcome::{Code, SCRIPT_VERSION};
use crate::reply::Reply;
use crate::stock::StockService;
use bytes::Bytes;

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
    pub(super) fn invalid(reason: impl Into<String>) -> OrderReply {
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

impl StockService {
    /// The reply for an order at rest.
    pub(super) fn answer(
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
}
