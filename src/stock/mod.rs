//! The stock service: every command that touches stock goes through here,
//! whichever door it came in by (RESP or HTTP).
//!
//! In the order a request meets them:
//!
//! - [`command`]: the one list of the stock commands, and what a command
//!   is ([`command::Command`]); each command says it once, in its own
//!   file: [`deduct`], [`revert`], [`hold`], [`confirm`] (calls on one
//!   request, described by a [`single::Single`]), [`order`] (ORDER and
//!   its commands, a saga over several SKUs), [`admin`] (STOCK.GET, SET,
//!   ADD) and [`status`] (STOCK.STATUS).
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
pub mod hold;
mod in_flight;
pub mod journal;
mod nonces;
pub mod order;
pub mod revert;
mod service;
pub mod single;
pub mod sold_out;
pub mod status;
pub mod sweeper;
mod wire;

pub use call::{Concluded, Prepared, StockCall, StockResult};
pub use command::{StockCommand, Touches};
pub use in_flight::InFlight;
pub use service::StockService;
pub use single::{Limits, OneRequest};

use bytes::Bytes;
use std::net::SocketAddr;

/// Who sent a request: for the audit log of operators' changes. Empty for
/// the commands that don't log it.
#[derive(Debug, Clone, Default)]
pub struct Caller {
    pub client_id: Option<u64>,
    pub addr: Option<SocketAddr>,
    pub name: Option<Bytes>,
}
