//! An order's lines: checked and put in their canonical order, and each
//! phase's call on every line, sent at once.

use super::{Saga, Step};
use crate::error::{FaultKind, UpstreamError};
use crate::outcome::Code;
use crate::params::{HoldTtl, InvalidParam, Placement, Qty, Sku};
use crate::pipeline::Bound;
use crate::stock::StockCommand;
use crate::stock::call::{OnBehalf, Prepared, StockResult};
use crate::stock::single::{Field, OneRequest};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub sku: Sku,
    pub qty: Qty,
    /// A line on a SKU kept by location: where it takes its units
    /// (`<sku>{<POLICY>:<location>,...}`, docs/locations.md).
    pub placement: Option<Arc<Placement>>,
}

/// The sku a line's first word names: the word, or what comes before its
/// `{`, the line's locations. For what reads the words before the lines
/// are checked (the order of a connection's requests, a user's rights).
pub fn sku_of(word: &[u8]) -> &[u8] {
    match word.iter().position(|b| *b == b'{') {
        Some(brace) => &word[..brace],
        None => word,
    }
}

/// A line's first word, checked: its sku, and its locations when braces
/// follow it.
fn line_sku(word: &[u8]) -> Result<(Sku, Option<Arc<Placement>>), InvalidParam> {
    let sku = sku_of(word);
    let placement = if sku.len() == word.len() {
        None
    } else {
        let inside = word[sku.len() + 1..].strip_suffix(b"}").ok_or_else(|| {
            InvalidParam("a line's locations are <sku>{<POLICY>:<location>,...}".into())
        })?;
        Some(Arc::new(Placement::parse(inside)?))
    };
    Ok((Sku::parse(Bytes::copy_from_slice(sku))?, placement))
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
            let (sku, placement) = line_sku(&pair[0])?;
            Ok(Line {
                sku,
                qty: Qty::parse(pair[1].clone(), max_qty)?,
                placement,
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
    let len = lines
        .iter()
        .map(|l| l.sku.as_bytes().len() + l.qty.as_bytes().len() + 2)
        .sum();
    let mut out = Vec::with_capacity(len);
    for line in lines {
        if !out.is_empty() {
            out.push(b' ');
        }
        out.extend_from_slice(line.sku.as_bytes());
        if let Some(placement) = &line.placement {
            out.push(b'{');
            out.extend_from_slice(&placement.text());
            out.push(b'}');
        }
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
            let (sku, placement) = line_sku(pair[0]).ok()?;
            Some(Line {
                sku,
                qty: Qty::parse(Bytes::copy_from_slice(pair[1]), u64::MAX).ok()?,
                placement,
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
    /// ORDER.EXTEND's: each line's hold lasts at least the line ttl from
    /// now (`lua/change_hold.lua`, an order's line), never less than it
    /// does.
    Extend,
}

impl Saga<'_> {
    /// One phase's call on every line, all sent at once.
    pub(super) async fn lines(&mut self, lines: &[Line], call: LineCall, line_ttl: u64) -> Step {
        let max_hold_ms = self.service.settings.limits.max_hold_ms;
        let line_ttl = HoldTtl::parse(line_ttl.max(1000).to_string().into(), max_hold_ms)
            .or_else(|_| HoldTtl::parse(max_hold_ms.to_string().into(), max_hold_ms));
        let Ok(line_ttl) = line_ttl else {
            return Step::Fault(UpstreamError::new(
                FaultKind::BadReply,
                "no line hold ttl fits --max-hold",
            ));
        };
        let swept = matches!(call, LineCall::Hold(true));
        let results = futures_util::future::join_all(lines.iter().map(|line| {
            // A line kept by location takes its units where it names: its
            // HOLD or take is an allocation; its later calls read its
            // record.
            let located = line.placement.is_some();
            let command = match call {
                LineCall::Hold(_) if located => StockCommand::HoldAt,
                LineCall::Hold(_) => StockCommand::Hold,
                LineCall::Take if located => StockCommand::DeductAt,
                LineCall::Take => StockCommand::Deduct,
                LineCall::Confirm => StockCommand::Confirm,
                LineCall::Revert => StockCommand::Revert,
                LineCall::Extend => StockCommand::HoldExtend,
            };
            let mut request = OneRequest::on(command, line.sku.clone(), self.id.line_id.clone());
            if request.single.fields.contains(&Field::Qty) {
                request.qty = Some(line.qty.clone());
            }
            if request.single.fields.contains(&Field::TtlMs) {
                request.ttl = Some(line_ttl.clone());
            }
            if request.single.fields.contains(&Field::Locations) {
                request.placement = line.placement.clone();
            }
            self.line(request, swept)
        }))
        .await;
        self.step(lines, call, results)
    }

    /// What one phase's line calls came to, by the first kind of trouble
    /// (revoked, expired, short, refused) and then faults.
    fn step(&mut self, lines: &[Line], call: LineCall, results: Vec<StockResult>) -> Step {
        let (mut revoked, mut expired, mut short, mut refused) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut fault = None;
        for (line, result) in lines.iter().zip(results) {
            let sku = line.sku.to_bytes();
            match result {
                Ok(reply) => {
                    if reply.remain >= 0 {
                        self.saw(&line.sku, reply.remain);
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

    /// One line's call, through the call's one life
    /// ([`crate::stock::StockService::run`]), within `--timeout` and the
    /// saga's deadline; a line hold filed in the sweep index when `swept`.
    async fn line(&self, request: OneRequest, swept: bool) -> StockResult {
        debug_assert!(
            request
                .request_id
                .as_bytes()
                .starts_with(crate::keys::ORDER_LINE_PREFIX.as_bytes())
        );
        let service = self.service;
        let mut call = service.call_of(request, Instant::now(), OnBehalf::Line { swept });
        if tokio::time::Instant::now() >= self.deadline {
            return Err(UpstreamError::timeout(service.upstream.timeout()));
        }
        call.limit_deadline(self.deadline);
        // The saga is bounded as a whole ([`super::order_call`]).
        service.run(Prepared::Call(call), Bound::Caller).await
    }
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
    fn a_line_may_name_its_locations_after_its_sku() {
        let lines = parse_lines(&args(&["b{WHOLE:w2,w1}", "2", "a", "1"]), 10, 100).unwrap();
        assert_eq!(canonical(&lines), b"a 1 b{WHOLE:w2,w1} 2");
        assert_eq!(lines_of(b"a 1 b{WHOLE:w2,w1} 2").unwrap(), lines);
        let placement = lines[1].placement.as_deref().unwrap();
        assert_eq!(placement.policy, crate::params::Policy::Whole);
        assert_eq!(placement.locations[0].as_bytes(), b"w2");
        assert_eq!(sku_of(b"b{WHOLE:w2,w1}"), b"b");
        assert_eq!(sku_of(b"b"), b"b");
        for bad in [
            "b{WHOLE:w2",
            "b{FIRST:w1}",
            "b{SPLIT:}",
            "b{SPLIT:w1,w1}",
            "b{SPLIT:w:1}",
            "{SPLIT:w1}",
        ] {
            assert!(parse_lines(&args(&[bad, "1"]), 10, 100).is_err(), "{bad}");
        }
        // One sku once, whatever its locations.
        assert!(parse_lines(&args(&["b{SPLIT:w1}", "1", "b", "1"]), 10, 100).is_err());
    }
}
