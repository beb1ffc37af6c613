//! What a command is, as `COMMAND DOCS` and `HELP` describe it: its name,
//! arity, flags and arguments. A leaf: the stock commands describe
//! themselves with a [`Doc`] in their own files without depending on how
//! commands are dispatched ([`crate::command::spec::stock`] pairs each with
//! who serves it), so the command table can name the stock service without
//! an import circle.

use crate::outcome::Code;

/// One argument, as `COMMAND DOCS` and `HELP` describe it.
pub struct ArgSpec {
    pub name: &'static str,
    /// `string`, `integer` or `key`, as in Redis's docs.
    pub kind: &'static str,
    pub optional: bool,
    /// It may be given any number of times (`COMMAND INFO [name ...]`).
    pub multiple: bool,
}

pub const fn arg(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: false,
        multiple: false,
    }
}

pub const fn optional(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
        multiple: false,
    }
}

/// An optional argument that may be repeated.
pub const fn optional_many(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
        multiple: true,
    }
}

/// A command without subcommands, as its own file describes it.
pub struct Doc {
    /// Lowercase, as Redis lists commands.
    pub name: &'static str,
    /// Redis arity: the name included; negative means "at least".
    pub arity: i64,
    /// Most arguments, the name included (Redis arity can't say "4 or 5").
    pub max_args: Option<usize>,
    pub flags: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
    pub args: &'static [ArgSpec],
}

impl Doc {
    /// Whether `count` words (the name included) fit the arity.
    pub fn arity_ok(&self, count: usize) -> bool {
        arity_fits(self.arity, self.max_args, count)
    }
}

/// Whether `count` words (the name included) fit a Redis arity and an
/// optional most.
pub fn arity_fits(arity: i64, max_args: Option<usize>, count: usize) -> bool {
    let count = count as i64;
    let fits = if arity >= 0 {
        count == arity
    } else {
        count >= -arity
    };
    fits && max_args.is_none_or(|max| count <= max as i64)
}

/// What the list of stock commands says of each: the facts that the
/// dispatch, the metrics and the HTTP face read, spelled once here.
pub struct About {
    /// Lowercase, as `COMMAND` lists it; also its `command` metric label.
    pub name: &'static str,
    /// The business codes it can answer, none for a command that is not a
    /// call on request ids (it gets no request metrics): the metrics make
    /// a series for each and no other, since a series for a code it never gives would
    /// be a permanent 0 that a dashboard or an alert could only misread.
    pub answers: &'static [Code],
    /// A compensation: revoked or expired means there was nothing left to
    /// give back, so the caller's intent is met (HTTP 200, as for a
    /// duplicate).
    pub gives_back: bool,
}

/// Declares [`StockCommand`] from one line per command.
macro_rules! stock_commands {
    ($($(#[$meta:meta])* $variant:ident => $about:expr;)*) => {
        /// The commands the stock service serves, each described by its
        /// own file under [`crate::stock`]; this is the one list of them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum StockCommand {
            $($(#[$meta])* $variant,)*
        }

        impl StockCommand {
            /// Every stock command, in `COMMAND`'s order.
            pub const ALL: &[StockCommand] = &[$(StockCommand::$variant),*];

            /// What the list says of it.
            pub const fn about(self) -> &'static About {
                match self {
                    $(StockCommand::$variant => {
                        const ABOUT: About = $about;
                        &ABOUT
                    })*
                }
            }
        }
    };
}

use Code::Revoked as REV;
use Code::{Duplicate as DUP, Expired as EXP, Insufficient as SHORT, Invalid as INV, Ok as OK};

/// A call on one request that neither looks at the stock level nor speaks
/// of a hold's expiry.
const PLAIN: &[Code] = &[OK, DUP, INV, REV];

const fn metered(name: &'static str, answers: &'static [Code]) -> About {
    About {
        name,
        answers,
        gives_back: false,
    }
}

/// A command that reads or corrects stock, or reports: no request metrics.
const fn unmetered(name: &'static str) -> About {
    About {
        name,
        answers: &[],
        gives_back: false,
    }
}

stock_commands! {
    Deduct => metered("deduct", &[OK, DUP, SHORT, INV, REV]);
    Revert => About { gives_back: true, ..metered("revert", PLAIN) };
    Hold => metered("hold", &[OK, DUP, SHORT, INV, REV, EXP]);
    Confirm => metered("confirm", &[OK, DUP, INV, REV, EXP]);
    Order => metered("order", &[OK, DUP, SHORT, INV, REV, EXP]);
    OrderHold => metered("order.hold", &[OK, DUP, SHORT, INV, REV, EXP]);
    OrderConfirm => metered("order.confirm", &[OK, DUP, INV, REV, EXP]);
    OrderRevert => About { gives_back: true, ..metered("order.revert", PLAIN) };
    OrderStatus => unmetered("order.status");
    Get => unmetered("stock.get");
    Set => unmetered("stock.set");
    Add => unmetered("stock.add");
    Status => unmetered("stock.status");
}

impl About {
    /// It gets request metrics (`stockgate_requests_total`, ...): a call on
    /// request ids whose answer is a business code.
    pub const fn metered(&self) -> bool {
        !self.answers.is_empty()
    }
}

impl StockCommand {
    /// Its name, lowercase (`COMMAND`'s, and its metric label).
    pub const fn name(self) -> &'static str {
        self.about().name
    }
}
