//! The stock commands: the one list of them ([`StockCommand`]), and what a
//! command is ([`Command`]), which each command's own file says once.
//!
//! Adding a command is its file (its [`Command`]: what `COMMAND DOCS`
//! says, the codes it answers, what it touches and how it is served), its
//! script under `lua/`, one line in [`stock_commands!`]'s list below, and
//! its HTTP route if it has one.

use super::order::Want;
use super::single::Single;
use super::{Caller, StockService};
use crate::doc::Doc;
use crate::metrics::Metered;
use crate::outcome::Code;
use crate::reply::Reply;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// One stock command, as its own file describes it: everything the
/// service, the dispatch, the metrics and the HTTP face read of it.
pub struct Command {
    /// What `COMMAND DOCS` and `HELP` say of it. Its name is also its
    /// `command` metric label and its name in the access log.
    pub doc: Doc,
    /// The business codes it can answer; none for a command that is not a
    /// call on request ids (it gets no request metrics).
    pub answers: &'static [Code],
    /// A compensation: revoked or expired means there was nothing left to
    /// give back, so the caller's intent is met (HTTP 200, as for a
    /// duplicate).
    pub gives_back: bool,
    /// What it touches, for the order of one connection's requests.
    pub footprint: Footprint,
    /// How the service runs it.
    pub serve: Serve,
}

/// What a command touches in Redis, for the order in which one client
/// connection's requests take effect ([`super::InFlight`]): commands on
/// different SKUs commute, so only those that share a SKU (or span
/// several) must take effect in the order sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Footprint {
    /// The keys of the SKU its first argument names, by a script call that
    /// its node pipe keeps in order behind the earlier ones of that SKU.
    Piped,
    /// The keys of the SKU its first argument names, by a path of its own
    /// (the redis crate).
    Sku,
    /// An order's intent (its first argument names the order) and the SKUs
    /// of its lines (`<sku> <qty>` pairs from argument `pairs_from` on),
    /// each by a saga of its own. Ordered with the requests on those SKUs
    /// and with the other commands of its order; an order on other SKUs
    /// goes alongside.
    Lines { pairs_from: usize },
    /// Everything: an order command that names no SKU.
    All,
}

/// How the service runs a command.
pub enum Serve {
    /// A call of one script on one request.
    Single(Single),
    /// An order command: what it asks of the order's saga.
    Order(Want),
    /// A future of its own, from the arguments after the name to the reply;
    /// the caller named for the audit log of the operators' changes.
    Alone(Alone),
}

/// A command served by a future of its own ([`Serve::Alone`]).
pub type Alone = for<'a> fn(&'a Arc<StockService>, &'a [Bytes], &'a Caller) -> BoxFuture<'a, Reply>;

/// What one request of a command touches ([`Footprint`], with the names
/// from its arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touches<'a> {
    /// One SKU's keys (its name as sent), in its node pipe's order.
    Piped(&'a [u8]),
    /// One SKU's keys, by a path of its own.
    Sku(&'a [u8]),
    /// An order's intent (`id`) and its lines (`pairs`: `<sku> <qty> ...`
    /// as sent).
    Lines {
        id: &'a [u8],
        pairs: &'a [Bytes],
    },
    All,
}

/// Declares [`StockCommand`] from one line per command: its variant and
/// the [`Command`] its file describes it with.
macro_rules! stock_commands {
    ($($variant:ident => $command:path;)*) => {
        /// The commands the stock service serves, each described by its
        /// own file under [`crate::stock`]; this is the one list of them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum StockCommand {
            $($variant,)*
        }

        impl StockCommand {
            /// Every stock command, in `COMMAND`'s order.
            pub const ALL: &[StockCommand] = &[$(StockCommand::$variant),*];

            /// What its own file says of it.
            pub const fn describe(self) -> &'static Command {
                match self {
                    $(StockCommand::$variant => &$command,)*
                }
            }
        }
    };
}

stock_commands! {
    Deduct => super::deduct::COMMAND;
    Revert => super::revert::COMMAND;
    Hold => super::hold::COMMAND;
    Confirm => super::confirm::COMMAND;
    Order => super::order::deduct::COMMAND;
    OrderHold => super::order::hold::COMMAND;
    OrderConfirm => super::order::confirm::COMMAND;
    OrderRevert => super::order::revert::COMMAND;
    OrderStatus => super::order::status::COMMAND;
    Get => super::admin::GET;
    Set => super::admin::SET;
    Add => super::admin::ADD;
    Status => super::status::COMMAND;
}

impl StockCommand {
    /// Its name, lowercase (`COMMAND`'s, and its metric label).
    pub const fn name(self) -> &'static str {
        self.describe().doc.name
    }

    /// It gets request metrics (`stockgate_requests_total`, ...): a call on
    /// request ids whose answer is a business code.
    pub const fn metered(self) -> bool {
        !self.describe().answers.is_empty()
    }

    /// Its call on one request, if it is one.
    pub fn single(self) -> Option<&'static Single> {
        match &self.describe().serve {
            Serve::Single(single) => Some(single),
            Serve::Order(_) | Serve::Alone(_) => None,
        }
    }

    /// What `self` with `args` (after the name, arity checked) touches.
    pub fn touches(self, args: &[Bytes]) -> Touches<'_> {
        let first = args.first().map_or(&[][..], |first| &first[..]);
        match self.describe().footprint {
            Footprint::Piped => Touches::Piped(first),
            Footprint::Sku => Touches::Sku(first),
            Footprint::Lines { pairs_from } => Touches::Lines {
                id: first,
                pairs: args.get(pairs_from..).unwrap_or_default(),
            },
            Footprint::All => Touches::All,
        }
    }
}

impl Metered for StockCommand {
    const ALL: &'static [StockCommand] = StockCommand::ALL;

    fn index(self) -> usize {
        self as usize
    }

    fn label(self) -> &'static str {
        self.name()
    }

    fn answers(self) -> &'static [Code] {
        self.describe().answers
    }
}

/// The codes a call on one request can answer, as the command files list
/// them.
pub mod codes {
    use crate::outcome::Code::{self, *};

    /// A call that neither looks at the stock level nor speaks of a hold's
    /// expiry.
    pub const PLAIN: &[Code] = &[Ok, Duplicate, Invalid, Revoked];
    /// DEDUCT's: [`PLAIN`] and a short stock.
    pub const TAKES: &[Code] = &[Ok, Duplicate, Insufficient, Invalid, Revoked];
    /// A call that takes or holds stock with a hold's expiry in play.
    pub const HOLDS: &[Code] = &[Ok, Duplicate, Insufficient, Invalid, Revoked, Expired];
    /// A call that ends a hold.
    pub const ENDS_HOLD: &[Code] = &[Ok, Duplicate, Invalid, Revoked, Expired];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_its_own_lowercase_name() {
        let mut names: Vec<&str> = StockCommand::ALL.iter().map(|c| c.name()).collect();
        assert!(names.iter().all(|n| *n == n.to_ascii_lowercase()));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), StockCommand::ALL.len());
        for (i, command) in StockCommand::ALL.iter().enumerate() {
            assert_eq!(command.index(), i, "{command:?}");
        }
    }

    #[test]
    fn a_call_on_one_request_takes_its_fields_in_its_documented_order() {
        for &command in StockCommand::ALL {
            let Some(single) = command.single() else {
                continue;
            };
            let doc = &command.describe().doc;
            let names: Vec<&str> = doc.args.iter().map(|a| a.name).collect();
            let fields: Vec<&str> = single.fields.iter().map(|f| f.spec().name).collect();
            assert_eq!(names, fields, "{command:?}");
            assert_eq!(
                command.describe().footprint,
                Footprint::Piped,
                "{command:?}"
            );
        }
    }
}
