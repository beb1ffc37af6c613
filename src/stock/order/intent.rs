//! An order's intent record, as `lua/order.lua` keeps it: its phases, and
//! the one call that reads or changes it.

use super::{Filing, Saga, filing};
use crate::error::{FaultKind, UpstreamError};
use crate::outcome::Code;
use crate::pipeline::Bound;
use crate::upstream::Piped;
use bytes::Bytes;
use redis::Value;

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
    pub(super) fn from_script(word: &[u8]) -> Option<Phase> {
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

    /// A phase an order rests in: nothing moves it on but a command.
    pub fn rests(self) -> bool {
        matches!(
            self,
            Phase::Done | Phase::Held | Phase::Aborted | Phase::Reverted | Phase::Revoked
        )
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
pub(super) struct Intent {
    /// This call made the change it asked for.
    pub(super) changed: bool,
    pub(super) phase: Phase,
    /// `T` (ORDER), `H` (ORDER.HOLD), `D` (an ORDER an older stockgate
    /// began: its lines held, then confirmed); empty for REVOKED.
    pub(super) kind: Bytes,
    pub(super) lines: Bytes,
    pub(super) expires_at: i64,
    /// Why it aborted (ABORTING, ABORTED).
    pub(super) code: i64,
    pub(super) short: Bytes,
    /// Redis time when the script ran.
    pub(super) now: i64,
    /// What became of a filing that rode along: the score it was filed
    /// at, 1 when taken out, else 0.
    pub(super) filing: i64,
    /// What an extension (`try_extend`, `extend`) came to; `None` for the
    /// other ops.
    pub(super) extension: Option<Extension>,
}

/// What the intent script says of an extension of the order.
#[derive(Debug, Clone)]
pub(super) struct Extension {
    /// The code ORDER.EXTEND answers, as the script decided it.
    pub(super) code: i64,
    /// The order's expiry it answers with: the new one for a 0 and a
    /// recorded change's 1.
    pub(super) expires_at: i64,
    /// Why, for a 3.
    pub(super) reason: Bytes,
}

impl Intent {
    pub(super) fn from_script(value: Value) -> Result<Intent, UpstreamError> {
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
            filing: int(9).ok_or_else(bad)?,
            extension: match items.len() {
                10 => None,
                _ => Some(Extension {
                    code: int(10).ok_or_else(bad)?,
                    expires_at: int(11).ok_or_else(bad)?,
                    reason: text(12).ok_or_else(bad)?,
                }),
            },
        })
    }

    /// The intent as the node pipe read it, in one pass over its bytes:
    /// `{changed, phase, kind, lines, expires_at, code, short, now,
    /// version, filing}`; `None` for any other shape (the careful reading
    /// then says what is wrong).
    pub(super) fn from_frame(frame: &Bytes) -> Option<Intent> {
        let mut reply = crate::answer::flat(frame)?;
        if reply.left < 10 {
            return None;
        }
        let changed = reply.int()? == 1;
        let phase = Phase::from_script(&frame[reply.text()?])?;
        let kind = frame.slice(reply.text()?);
        let lines = frame.slice(reply.text()?);
        let expires_at = reply.int()?;
        let code = reply.int()?;
        let short = frame.slice(reply.text()?);
        let now = reply.int()?;
        let _version = reply.int()?;
        let filing = reply.int()?;
        let extension = match reply.left {
            0 => None,
            _ => Some(Extension {
                code: reply.int()?,
                expires_at: reply.int()?,
                reason: frame.slice(reply.text()?),
            }),
        };
        Some(Intent {
            changed,
            phase,
            kind,
            lines,
            expires_at,
            code,
            short,
            now,
            filing,
            extension,
        })
    }

    pub(super) fn is_hold(&self) -> bool {
        &self.kind[..] == b"H"
    }

    /// An ORDER whose lines are taken (DEDUCT) rather than held.
    pub(super) fn takes(&self) -> bool {
        &self.kind[..] == b"T"
    }

    /// A HELD order whose expiry has passed (by Redis time).
    pub(super) fn ran_out(&self) -> bool {
        self.phase == Phase::Held && self.now >= self.expires_at
    }
}

/// What one call of the intent script asks (`lua/order.lua`'s ops).
#[derive(Debug, Clone, Copy)]
pub(super) enum IntentOp<'a> {
    /// The record as it is.
    Read,
    /// Make the record (ORDER, ORDER.HOLD), or find it: the canonical line
    /// set; `hold` the order hold's ttl (ORDER.HOLD; an ORDER, whose lines
    /// are taken, has none); how long the line holds last.
    Begin {
        lines: &'a [u8],
        hold: Option<u64>,
        line_ttl: u64,
    },
    /// Move the order from one phase to the next, a compare-and-set; an
    /// abort says why and names the SKUs at fault (space-separated).
    Advance {
        from: Phase,
        to: Phase,
        abort: Option<(Code, &'a [u8])>,
    },
    /// ORDER.CONFIRM's move; `lines`, the canonical line set its request
    /// named, if it named any: the move is made only when they are the
    /// order's.
    Confirm { lines: Option<&'a [u8]> },
    /// ORDER.REVERT's move.
    Revert,
    /// What an ORDER.EXTEND of `ttl` under `change_id` would come to now,
    /// changing nothing: the order may hold `max` from its start.
    TryExtend {
        change_id: &'a [u8],
        ttl: &'a [u8],
        max: u64,
    },
    /// ORDER.EXTEND's compare-and-set, once its lines hold until
    /// `expires_at` (the one [`IntentOp::TryExtend`] answered) and
    /// `line_margin` more.
    Extend {
        change_id: &'a [u8],
        ttl: &'a [u8],
        expires_at: i64,
        line_margin: u64,
    },
}

impl IntentOp<'_> {
    fn word(&self) -> &'static [u8] {
        match self {
            IntentOp::Read => b"read",
            IntentOp::Begin { .. } => b"begin",
            IntentOp::Advance { .. } => b"advance",
            IntentOp::Confirm { .. } => b"confirm",
            IntentOp::Revert => b"revert",
            IntentOp::TryExtend { .. } => b"try_extend",
            IntentOp::Extend { .. } => b"extend",
        }
    }

    /// Its own arguments, after the op, the window and the nonce, into
    /// `args` (the numbers spelled in `digits`): at most four.
    fn args<'a>(&'a self, digits: &'a mut [itoa::Buffer; 3], args: &mut Vec<&'a [u8]>) {
        match self {
            IntentOp::Read | IntentOp::Revert | IntentOp::Confirm { lines: None } => {}
            IntentOp::Confirm { lines: Some(lines) } => args.push(lines),
            IntentOp::Begin {
                lines,
                hold,
                line_ttl,
            } => {
                let [hold_digits, line_digits, _] = digits;
                args.extend_from_slice(&[
                    if hold.is_some() { b"H" } else { b"T" },
                    lines,
                    hold_digits.format(hold.unwrap_or(0)).as_bytes(),
                    line_digits.format(*line_ttl).as_bytes(),
                ]);
            }
            IntentOp::TryExtend {
                change_id,
                ttl,
                max,
            } => {
                let [max_digits, ..] = digits;
                args.extend_from_slice(&[change_id, ttl, max_digits.format(*max).as_bytes()]);
            }
            IntentOp::Extend {
                change_id,
                ttl,
                expires_at,
                line_margin,
            } => {
                let [expiry_digits, margin_digits, _] = digits;
                args.extend_from_slice(&[
                    change_id,
                    ttl,
                    expiry_digits.format(*expires_at).as_bytes(),
                    margin_digits.format(*line_margin).as_bytes(),
                ]);
            }
            IntentOp::Advance { from, to, abort } => {
                args.extend_from_slice(&[from.as_str().as_bytes(), to.as_str().as_bytes()]);
                match abort {
                    Some((code, short)) => {
                        let [code_digits, ..] = digits;
                        args.push(code_digits.format(*code as i64).as_bytes());
                        args.push(short);
                    }
                    None => args.extend_from_slice(&[b"", b""]),
                }
            }
        }
    }
}

/// A change of the attempt's filing that rides along with an intent call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ride {
    File,
    Unfile(i64),
}

impl Saga<'_> {
    /// One call of the intent script, with the attempt's filing among the
    /// orders in flight riding along when it is due: filed by the first
    /// call that may change the intent, taken out by a move into a phase
    /// the order rests in. Where the shard's orders key is on another
    /// node, the script refuses before writing anything, and the filing
    /// is a call of its own (before the intent call; a taking out is left
    /// to the end of the command, [`super::recovery`]). A phase the call
    /// moved the order into is this attempt's ([`Saga::made`]).
    pub(super) async fn intent(&mut self, op: IntentOp<'_>) -> Result<Intent, UpstreamError> {
        let intent = self.intent_filed(op).await?;
        if intent.changed {
            self.made.push(intent.phase);
        }
        Ok(intent)
    }

    async fn intent_filed(&mut self, op: IntentOp<'_>) -> Result<Intent, UpstreamError> {
        let moves_to_rest = matches!(op, IntentOp::Advance { to, .. } if to.rests());
        let ride = match self.filing {
            Filing::Due if !matches!(op, IntentOp::Read) => Some(Ride::File),
            Filing::Filed(score) if moves_to_rest => Some(Ride::Unfile(score)),
            _ => None,
        };
        if let Some(ride) = ride {
            if ride == Ride::File {
                filing::watch_order(self.service, self.shard);
            }
            match self.intent_call(op, Some(ride)).await {
                Ok(intent) => {
                    self.filing = match ride {
                        Ride::File => Filing::Filed(intent.filing),
                        Ride::Unfile(_) if intent.filing == 1 => Filing::Out,
                        Ride::Unfile(score) => Filing::Filed(score),
                    };
                    return Ok(intent);
                }
                Err(fault) if fault.is_non_local_key() => {
                    if ride == Ride::File {
                        let score =
                            filing::mark_order(self.service, &self.id.id, self.shard).await?;
                        self.filing = Filing::Filed(score);
                    }
                }
                Err(fault) => return Err(fault),
            }
        }
        self.intent_call(op, None).await
    }

    async fn intent_call(
        &self,
        op: IntentOp<'_>,
        ride: Option<Ride>,
    ) -> Result<Intent, UpstreamError> {
        let service = self.service;
        let keys = &service.keys;
        let key = keys.order_key(&self.id.id);
        let mut digits: [itoa::Buffer; 3] = Default::default();
        let mut filing_digits = itoa::Buffer::new();
        let mut args: Vec<&[u8]> = Vec::with_capacity(10);
        args.extend_from_slice(&[
            op.word(),
            service.settings.retry_window_arg.as_bytes(),
            &self.nonce,
        ]);
        op.args(&mut digits, &mut args);
        if let Some(ride) = ride {
            let shard = &keys.sweep_shards()[self.shard];
            args.resize(7, b"");
            let (word, number): (&[u8], i64) = match ride {
                Ride::File => (b"file", filing::recover_after(service).as_millis() as i64),
                Ride::Unfile(score) => (b"unfile", score),
            };
            args.extend_from_slice(&[word, &shard.orders, filing_digits.format(number).as_bytes()]);
        }
        let script = &service.scripts.order;
        match service
            .upstream
            // The saga is bounded as a whole ([`super::order_call`]).
            .eval_piped_frame(script, &[&key], &args, self.deadline, Bound::Caller)
            .await?
        {
            Piped::Frame(frame) => match Intent::from_frame(&frame) {
                Some(intent) => Ok(intent),
                None => Intent::from_script(service.upstream.value_of(script, &frame)?),
            },
            Piped::Value(value) => Intent::from_script(value),
        }
    }
}
