//! What a stock command is ([`Command`]), which each command's own file
//! says once; the list of them is [`super::StockCommand`].

use super::single::Single;
use super::{Answer, Caller, StockService};
use crate::auth::Right;
use crate::doc::Doc;
use crate::outcome::Code;
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
    /// What a user needs to send it ([`Right`]): its one statement of
    /// who may, read by RESP's dispatch and by HTTP alike.
    pub right: Right,
    /// A compensation: revoked or expired means there was nothing left to
    /// give back, so the caller's intent is met (HTTP 200, as for a
    /// duplicate).
    pub gives_back: bool,
    /// What it touches, for the order of one connection's requests.
    pub footprint: Footprint,
    /// How the service runs it.
    pub serve: Serve,
    /// Its route on the HTTP face, if it has one ([`crate::http`] serves
    /// every route so described).
    pub http: Option<Http>,
}

/// A command's route on the HTTP face: its method and path, and how a
/// request there becomes the command's arguments.
#[derive(Debug, Clone, Copy)]
pub struct Http {
    /// `GET` (a read that changes nothing) rather than `POST`.
    pub read: bool,
    /// The path; a `{...}` segment is the command's first argument.
    pub path: &'static str,
    pub body: Body,
}

/// How an HTTP request becomes a command's arguments, RESP's words.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// A JSON object of the command's fields ([`Single::fields`]), each
    /// under its name (`locations`: a list of them); a field it does not
    /// take is refused when `strict`, else left unread.
    Fields { strict: bool },
    /// No body: the path's segment is the one argument.
    Path,
    /// The path's segment, then a JSON object of these fields.
    PathThen(&'static [super::single::Field]),
    /// An order: `request_id`, its `lines` (each a `sku` and `qty`, and for
    /// a SKU kept by location its `policy` and `locations`), and `ttl_ms`
    /// for ORDER.HOLD (the route is ORDER's).
    Order,
    /// STOCK.SET or STOCK.ADD: `sku`, the amount (`qty` or `delta`),
    /// `op_id`, and `location` (SET: and its `floor`).
    StockChange,
}

impl Http {
    /// `POST <path>` of a JSON object of the command's fields.
    pub const fn fields(path: &'static str, strict: bool) -> Option<Http> {
        Some(Http {
            read: false,
            path,
            body: Body::Fields { strict },
        })
    }

    /// `POST <path>` with the body `body`.
    pub const fn post(path: &'static str, body: Body) -> Option<Http> {
        Some(Http {
            read: false,
            path,
            body,
        })
    }

    /// `GET <path>`, its segment the argument.
    pub const fn get(path: &'static str) -> Option<Http> {
        Some(Http {
            read: true,
            path,
            body: Body::Path,
        })
    }
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
    /// The keys of the SKU its first argument names, by a call its node
    /// pipe alone does not keep in order: it waits for the earlier
    /// requests on that SKU to be done.
    Sku,
    /// An order's intent (its first argument names the order) and the SKUs
    /// of its lines (`<sku> <qty>` pairs from argument `pairs_from` on),
    /// each by a saga of its own. Ordered with the requests on those SKUs
    /// and with the other commands of its order; an order on other SKUs
    /// goes alongside.
    Lines { pairs_from: usize },
    /// [`Footprint::Lines`] when the request names lines (ORDER.CONFIRM's
    /// are optional), [`Footprint::All`] when it names none.
    LinesOrAll { pairs_from: usize },
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

/// What an order command asks of its order's saga ([`super::order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// ORDER: take every line.
    Order,
    /// ORDER.HOLD: hold every line until ORDER.CONFIRM or the ttl.
    Hold,
    /// ORDER.CONFIRM: make a held order final.
    Confirm,
    /// ORDER.REVERT: give every line back.
    Revert,
    /// ORDER.EXTEND: a held order lasts longer, every line with it.
    Extend,
    /// Nobody asks: an order left behind, driven to an end
    /// ([`super::order::recovery`]).
    Recover,
}

/// A command served by a future of its own ([`Serve::Alone`]).
pub type Alone =
    for<'a> fn(&'a Arc<StockService>, &'a [Bytes], &'a Caller) -> BoxFuture<'a, Answer>;

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
    /// A change of a live hold (HOLD.EXTEND, HOLD.SHRINK).
    pub const CHANGES_HOLD: &[Code] = &[Ok, Duplicate, Invalid, Revoked, Expired];
}
