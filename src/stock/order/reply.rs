//! What an order command answers.

use crate::outcome::{Code, SCRIPT_VERSION};
use crate::reply::Reply;
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
