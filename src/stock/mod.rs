//! The stock service: every command that touches stock goes through here,
//! whichever door it came in by (RESP or HTTP).
//!
//! In the order a request meets them:
//!
//! - [`command`]: the one list of the stock commands, and what a command
//!   is ([`command::Command`]); each command says it once, in its own
//!   file: [`deduct`], [`revert`], [`hold`], [`confirm`], [`extend`],
//!   [`shrink`], and in [`location`] DEDUCT.AT and HOLD.AT (calls on one
//!   request, each described by a [`single::Single`]: its fields, keys,
//!   script arguments and reply), [`order`] (ORDER and its commands, a
//!   saga over several SKUs), [`admin`] (STOCK.GET, SET, ADD), [`status`]
//!   (STOCK.STATUS) and STOCK.LOCATIONS ([`location`], which also says how
//!   a SKU kept by location is read and changed by an operator).
//! - [`in_flight`]: a client connection's requests in flight: the order
//!   they take effect in, and their replies in the order sent.
//! - [`service`]: what every command runs with, and the one door
//!   ([`StockService::serve`]).
//! - [`call`]: a call on one request from its check to its reply, whoever
//!   waits for it; [`wire`] encodes its script call, [`sold_out`] answers
//!   a DEDUCT on a sold-out SKU from one read, [`coalesce`] runs a hot
//!   SKU's DEDUCTs as one call, [`books`] records what each came to.
//! - Beside them: [`journal`] (a SKU's first journaled call), [`sweeper`]
//!   (the expired holds of SKUs no request touches, and the orders left
//!   behind), [`nonces`].

pub mod admin;
mod books;
pub mod call;
mod coalesce;
pub mod command;
pub mod confirm;
pub mod deduct;
pub mod extend;
pub mod hold;
mod in_flight;
pub mod journal;
pub mod location;
mod nonces;
pub mod order;
pub mod revert;
mod service;
pub mod shrink;
pub mod single;
pub mod sold_out;
pub mod status;
mod sweep_index;
pub mod sweeper;
mod wire;

pub use call::{Concluded, Prepared, StockCall, StockResult};
pub use command::Touches;
pub use in_flight::InFlight;
pub use service::{Answer, StockService};
pub use single::{Limits, OneRequest};

use crate::auth::{Denial, Grant};
use crate::metrics::Metered;
use crate::outcome::Code;
use bytes::Bytes;
use command::{Command, Footprint, Serve};
use single::Single;
use std::net::SocketAddr;
use std::sync::Arc;

/// Who sent a request: for the audit log of operators' changes. Empty for
/// the commands that don't log it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client_id: Option<u64>,
    pub addr: Option<SocketAddr>,
    pub name: Option<Bytes>,
    /// The user it logged in as.
    pub user: Option<Arc<crate::auth::Account>>,
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
    Deduct => deduct::COMMAND;
    Revert => revert::COMMAND;
    Hold => hold::COMMAND;
    Confirm => confirm::COMMAND;
    HoldExtend => extend::COMMAND;
    HoldShrink => shrink::COMMAND;
    DeductAt => location::deduct_at::COMMAND;
    HoldAt => location::hold_at::COMMAND;
    Order => order::deduct::COMMAND;
    OrderHold => order::hold::COMMAND;
    OrderConfirm => order::confirm::COMMAND;
    OrderRevert => order::revert::COMMAND;
    OrderExtend => order::extend::COMMAND;
    OrderStatus => order::status::COMMAND;
    Get => admin::GET;
    Set => admin::SET;
    Add => admin::ADD;
    Locations => location::locations::COMMAND;
    Status => status::COMMAND;
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

    /// Whether a user with `grant` may send `self` with `args` (after the
    /// name, arity checked): it holds the command's right, and every SKU
    /// the request touches is under its prefixes. A user limited to
    /// prefixes may not send a command that names no SKU (ORDER.CONFIRM,
    /// ORDER.REVERT, ORDER.STATUS by an order's id alone): its SKUs can't
    /// be checked before it runs.
    pub fn permitted(self, grant: &Grant, args: &[Bytes]) -> Result<(), Denial> {
        if !grant.rights.allows(self.describe().right) {
            return Err(Denial::Command);
        }
        if grant.every_sku() {
            return Ok(());
        }
        let allowed = match self.touches(args) {
            Touches::Piped(sku) | Touches::Sku(sku) => grant.allows_sku(sku),
            Touches::Lines { pairs, .. } => pairs
                .iter()
                .step_by(2)
                .all(|word| grant.allows_sku(order::lines::sku_of(word))),
            Touches::All => false,
        };
        if allowed { Ok(()) } else { Err(Denial::Key) }
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
            Footprint::LinesOrAll { pairs_from } if args.len() > pairs_from => Touches::Lines {
                id: first,
                pairs: &args[pairs_from..],
            },
            Footprint::LinesOrAll { .. } => Touches::All,
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
            assert!(
                matches!(
                    command.describe().footprint,
                    Footprint::Piped | Footprint::Sku
                ),
                "{command:?}"
            );
        }
    }
}
