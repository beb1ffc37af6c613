//! The business code table, and the reply DEDUCT gives for each code.
//!
//! This module is the one place that knows what each code means. A code's
//! meaning never changes once published; new information is added as new
//! reply elements or new codes, never by redefining one.

use bytes::Bytes;

/// The script version this build of stockgate ships (the fourth reply element).
pub const SCRIPT_VERSION: i64 = 1;

/// A business outcome: what happened to the stock. System faults are never
/// a `Code`; they are [`crate::error::UpstreamError`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// Deducted. `remain` is the stock after this call.
    Ok = 0,
    /// This request_id was already applied; nothing changed.
    Duplicate = 1,
    /// Not enough stock; nothing changed.
    Insufficient = 2,
    /// Invalid parameters; nothing changed.
    Invalid = 3,
}

impl Code {
    /// Every code, in numeric order.
    pub const ALL: [Code; 4] = [Code::Ok, Code::Duplicate, Code::Insufficient, Code::Invalid];

    /// The code a script reply carries, if this build knows it.
    pub fn from_wire(code: i64) -> Option<Code> {
        Code::ALL.into_iter().find(|c| *c as i64 == code)
    }

    /// The `result` label of the request metrics.
    pub fn label(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::Duplicate => "duplicate",
            Code::Insufficient => "insufficient",
            Code::Invalid => "invalid",
        }
    }
}

/// The reply to one DEDUCT: `[code, remain, order_no, version]`, plus a
/// human reason for code 3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeductReply {
    pub code: Code,
    /// Stock after the call (code 0), the current stock (codes 1 and 2), or
    /// -1 when not known.
    pub remain: i64,
    /// Code 0: the order_no given; code 1: the one stored by the first call;
    /// otherwise empty.
    pub order_no: Bytes,
    pub version: i64,
    /// Why the parameters were refused (code 3 only).
    pub reason: Option<Bytes>,
}

impl DeductReply {
    /// A code 3 decided by stockgate before anything is sent to Redis.
    pub fn invalid(reason: impl Into<Bytes>) -> Self {
        DeductReply {
            code: Code::Invalid,
            remain: -1,
            order_no: Bytes::new(),
            version: SCRIPT_VERSION,
            reason: Some(reason.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_are_the_published_ones() {
        assert_eq!(Code::from_wire(0), Some(Code::Ok));
        assert_eq!(Code::from_wire(1), Some(Code::Duplicate));
        assert_eq!(Code::from_wire(2), Some(Code::Insufficient));
        assert_eq!(Code::from_wire(3), Some(Code::Invalid));
        assert_eq!(Code::from_wire(4), None);
        assert_eq!(Code::from_wire(-1), None);
    }
}
