//! An order's lines: checked and put in their canonical order, and each
//! phase's call on every line, sent at once.

use super::{Attempt, Step};
use crate::doc::StockCommand;
use crate::error::{FaultKind, UpstreamError};
use crate::outcome::Code;
use crate::params::{HoldTtl, InvalidParam, OrderNo, Qty, Sku};
use crate::stock::{Op, StockResult, StockService};
use crate::upstream::Verdict;
use bytes::Bytes;
use std::time::Instant;

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub sku: Sku,
    pub qty: Qty,
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
pub(super) fn lines_of(text: &[u8]) -> Option<Vec<Line>> {
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

/// The per-line call of a phase.
#[derive(Debug, Clone, Copy)]
pub(super) enum LineCall {
    /// `true` for an ORDER.HOLD's lines, which wait for ORDER.CONFIRM and
    /// run out by themselves: they are filed in the sweep index. An
    /// ORDER's are not: its saga, or the recovery of the orders left
    /// behind, confirms or gives them back long before their saga time
    /// ends (and any call on their SKU releases them after it).
    Hold(bool),
    /// An ORDER's lines (kind `T`): each line a DEDUCT of the line id, the
    /// units taken for good in one call; an abort gives them back with
    /// REVERT, as it gives back held lines.
    Take,
    Confirm,
    Revert,
}

impl StockService {
    /// One phase's call on every line, all sent at once.
    pub(super) async fn lines(
        &self,
        attempt: &mut Attempt<'_>,
        lines: &[Line],
        call: LineCall,
        line_ttl: u64,
    ) -> Step {
        let line_ttl = HoldTtl::parse(
            line_ttl.max(1000).to_string().into(),
            self.limits.max_hold_ms,
        )
        .or_else(|_| {
            HoldTtl::parse(
                self.limits.max_hold_ms.to_string().into(),
                self.limits.max_hold_ms,
            )
        });
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
                LineCall::Hold(_) => Op::Hold(crate::stock::hold::Hold {
                    sku: line.sku.clone(),
                    qty: line.qty.clone(),
                    request_id,
                    ttl: line_ttl.clone(),
                    order_no: OrderNo::default(),
                }),
                LineCall::Take => Op::Deduct(crate::stock::deduct::Deduct {
                    sku: line.sku.clone(),
                    qty: line.qty.clone(),
                    request_id,
                    order_no: OrderNo::default(),
                }),
                LineCall::Confirm => Op::Confirm(crate::stock::confirm::Confirm {
                    sku: line.sku.clone(),
                    request_id,
                }),
                LineCall::Revert => Op::Revert(crate::stock::revert::Revert {
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
                        (LineCall::Hold(_) | LineCall::Take, Code::Insufficient) => short.push(sku),
                        (_, _) => refused.push(sku),
                    }
                }
                // A line HOLD or take that the data refuses (no stock key with
                // `--missing-stock error`, a stock or record stockgate did
                // not write) changed nothing, and a retry would meet the
                // same: the order can't be held, and every line goes back
                // now instead of waiting for a retry that can't help.
                Err(err)
                    if matches!(call, LineCall::Hold(_) | LineCall::Take)
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
        debug_assert!(op.request().1.as_bytes().starts_with(b"~ord:"));
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
        if let Ok(reply) = &result {
            self.record_holds(reply, false);
            if swept {
                self.index_hold(&call.op, reply);
            }
        }
        self.metrics
            .record_upstream(StockCommand::Order, call.sent.elapsed());
        // Each line call has an access-log line of its own, as the single
        // command it is (DEDUCT, HOLD, CONFIRM, REVERT) on the line's id, key and
        // qty: the order's own line names only its request_id.
        self.log_access(
            call.entry(),
            result.as_ref().map(|reply| reply.code),
            call.arrived.elapsed(),
        );
        result
    }
}

pub(super) fn join(skus: &[Bytes]) -> Vec<u8> {
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
}
