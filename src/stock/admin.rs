//! STOCK.GET, STOCK.SET and STOCK.ADD: an operator's view of stock, and
//! changes to it outside the order flow (restocking, corrections).
//!
//! # Format
//!
//! ```text
//! STOCK.GET <sku>                    the stock (available: units on hold are
//!                                    not in it), or nil when the sku has none
//! STOCK.SET <sku> <qty> <op_id>      [code, stock, "", version]   (--admin-commands)
//! STOCK.ADD <sku> <delta> <op_id>    [code, stock, "", version]   (--admin-commands)
//! STOCK.SET <sku> <qty> <op_id> AT <location> [FLOOR <floor>]
//! STOCK.ADD <sku> <delta> <op_id> AT <location>
//! ```
//!
//! With `AT`, the change is of one location of a SKU kept by location
//! (docs/locations.md; [`super::location`]): the reply's stock is that
//! location's units after it. STOCK.GET of such a SKU answers its total
//! available over all its locations.
//!
//! SET and ADD change stock outside the order flow, so they are refused
//! with `-NOPERM` unless stockgate runs with `--admin-commands`, and each
//! change is written to the `stockgate::audit` log target.
//!
//! A change is as retry-prone as an order: its reply can be lost after it
//! ran and the change sent again, by stockgate's fallback client, by
//! redis-rs after a dropped connection, or by the operator's tool. Added
//! twice is phantom stock, which is overselling; a SET sent again after
//! deductions ran between would sell their units again. So each change
//! names itself with an `op_id`, kept in a record like an order's
//! request_id for the retry window (`lua/stock_set.lua`,
//! `lua/stock_add.lua`): 0 applied now, 1 this op_id was already applied,
//! 2 (ADD) refused because the stock would go below 0, 3 invalid.

use super::command::{Body, Command, Footprint, Http, Serve};
use super::{Answer, Caller, StockResult, StockService};
use crate::auth::Right;
use crate::doc::{ArgSpec, Doc, arg};
use crate::outcome::{Code, HoldEvent, StockReply};
use crate::params::{Delta, InvalidParam, Location, OpId, Sku, StockLevel};
use crate::reply::Reply;
use crate::script::LuaScript;
use bytes::Bytes;
use futures_util::FutureExt;
use redis::Value;
use std::sync::Arc;

static GET_ARGS: [ArgSpec; 1] = [arg("sku", "string")];

pub static GET: Command = Command {
    doc: Doc {
        name: "stock.get",
        arity: 2,
        max_args: None,
        flags: &["fast"],
        group: "stockgate",
        summary: "Returns a sku's stock, or nil when it has none.",
        args: &GET_ARGS,
    },
    answers: &[],
    right: Right::Reader,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, _| get(service, args).map(Answer::Reply).boxed()),
    http: None,
};

pub static SET: Command = Command {
    doc: Doc {
        name: "stock.set",
        arity: -4,
        max_args: Some(8),
        flags: &["write", "admin"],
        group: "stockgate",
        summary: "Sets a sku's stock, once per op_id (needs --admin-commands). Replies [code, stock, \"\", version]: 0 set, 1 this op_id was already applied, 3 invalid.",
        args: &[
            arg("sku", "string"),
            arg("qty", "integer"),
            arg("op_id", "string"),
        ],
    },
    answers: &[],
    right: Right::Operator,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, caller| {
        change(service, Correction::Set, args, caller).boxed()
    }),
    http: Http::post("/v1/stock/set", Body::StockChange),
};

pub static ADD: Command = Command {
    doc: Doc {
        name: "stock.add",
        arity: -4,
        max_args: Some(6),
        flags: &["write", "admin"],
        group: "stockgate",
        summary: "Adds a signed delta to a sku's stock, once per op_id, never below 0 (needs --admin-commands). Replies [code, stock, \"\", version]: 0 added, 1 this op_id was already applied, 2 it would go below 0, 3 invalid.",
        args: &[
            arg("sku", "string"),
            arg("delta", "integer"),
            arg("op_id", "string"),
        ],
    },
    answers: &[],
    right: Right::Operator,
    gives_back: false,
    footprint: Footprint::Sku,
    serve: Serve::Alone(|service, args, caller| {
        change(service, Correction::Add, args, caller).boxed()
    }),
    http: Http::post("/v1/stock/add", Body::StockChange),
};

/// The refusal of SET and ADD without `--admin-commands`.
const NOPERM: &str = "NOPERM STOCK.SET and STOCK.ADD change stock outside the order flow; start stockgate with --admin-commands to allow them";

/// Which change, checked.
enum Change {
    Set(StockLevel),
    Add(Delta),
}

/// The operators' corrections of stock: STOCK.SET and STOCK.ADD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    Set,
    Add,
}

/// `STOCK.GET <sku>`
///
/// A SKU that keeps one number is read by `lua/get.lua`, one kept by
/// location by `lua/allocate.lua`; the first read says when the SKU is of
/// the other kind. A SKU can change kind between the two reads (an
/// operator's first `STOCK.SET ... AT`, or its keys written again behind
/// stockgate's back): then the second read meets the first kind again,
/// says so, and the reads go round again, a few times at most. What either
/// refuses is never read as a stock.
async fn get(service: &Arc<StockService>, args: &[Bytes]) -> Reply {
    let sku = match Sku::parse(args[0].clone()) {
        Ok(sku) => sku,
        Err(invalid) => return Reply::error(format!("ERR {invalid}")),
    };
    for _ in 0..GET_ROUNDS {
        if let Read::Shown(reply) = one_number(service, &sku).await {
            return reply;
        }
        if let Read::Shown(reply) = located_total(service, &sku).await {
            return reply;
        }
    }
    Reply::error("TRYAGAIN the sku changed how it keeps its stock while it was read; read it again")
}

/// How many times STOCK.GET reads a SKU by both kinds before it gives up.
const GET_ROUNDS: usize = 3;

/// What one of STOCK.GET's reads came to.
enum Read {
    /// The reply (the stock, nil, or an error).
    Shown(Reply),
    /// The SKU is of the other kind: the other read's to answer.
    OtherKind,
}

/// STOCK.GET of a SKU that keeps one number (`lua/get.lua`).
async fn one_number(service: &Arc<StockService>, sku: &Sku) -> Read {
    let keys = service.keys.sku_keys(sku);
    let keys = keys.all();
    let settings = &service.settings;
    let args = [
        settings.retry_window_arg.as_bytes(),
        settings.journal_arg.as_bytes(),
    ];
    let upstream = &service.upstream;
    let reply = match service
        .with_journal(sku, service.deadline(), || {
            upstream.eval(&service.scripts.get, &keys, &args)
        })
        .await
    {
        Ok(Value::Array(mut items)) if items.len() >= 4 => {
            count_released(service, &items[3]);
            stock_value(items.swap_remove(0))
        }
        Ok(other) => Reply::error(format!("BADREPLY STOCK.GET answered {other:?}")),
        Err(fault) if fault.is_located() => return Read::OtherKind,
        Err(fault) => Reply::Error(fault.reply_text()),
    };
    Read::Shown(reply)
}

/// STOCK.GET of a SKU kept by location: its total available over all its
/// locations (`lua/allocate.lua` "get", the shape of `lua/get.lua`'s:
/// four elements). A SKU that keeps one number (or none) is refused there
/// with a code 3 reply of more elements, or UNKNOWNSKU: the other kind.
async fn located_total(service: &Arc<StockService>, sku: &Sku) -> Read {
    let reply = match service.read_by_location("get", sku).await {
        Ok(Value::Array(items)) if items.len() == 4 => {
            count_released(service, &items[3]);
            match items[0] {
                Value::Int(total) => Reply::Integer(total),
                _ => Reply::error("BADREPLY STOCK.GET answered a total that is not an integer"),
            }
        }
        Ok(Value::Array(items)) if matches!(items.first(), Some(Value::Int(3))) => {
            return Read::OtherKind;
        }
        Ok(other) => Reply::error(format!("BADREPLY STOCK.GET answered {other:?}")),
        Err(fault) if fault.kind == crate::error::FaultKind::UnknownSku => {
            return Read::OtherKind;
        }
        Err(fault) => Reply::Error(fault.reply_text()),
    };
    Read::Shown(reply)
}

/// Holds a read gave back to stock, counted.
fn count_released(service: &StockService, released: &Value) {
    if let Value::Int(released) = *released
        && released > 0
    {
        service
            .books
            .metrics
            .record_holds(HoldEvent::Expired, released as u64);
    }
}

/// `STOCK.SET <sku> <qty> <op_id>` and `STOCK.ADD <sku> <delta> <op_id>`:
/// [`correct`]'s outcome, or its refusal without `--admin-commands`.
async fn change(
    service: &Arc<StockService>,
    correction: Correction,
    args: &[Bytes],
    caller: &Caller,
) -> Answer {
    match correct(service, correction, args, caller).await {
        Ok(result) => Answer::Stock(result),
        Err(Disabled) => Answer::Refused(NOPERM),
    }
}

/// A STOCK.SET or STOCK.ADD refused: stockgate runs without
/// `--admin-commands`, and nothing ran.
#[derive(Debug)]
pub struct Disabled;

/// STOCK.SET or STOCK.ADD with `args` (after the name, arity checked:
/// `<sku> <amount> <op_id> [AT <location> [FLOOR <floor>]]`), audited when
/// it applied; RESP and HTTP alike.
pub async fn correct(
    service: &StockService,
    correction: Correction,
    args: &[Bytes],
    caller: &Caller,
) -> Result<StockResult, Disabled> {
    if !service.settings.admin_commands {
        return Err(Disabled);
    }
    // Checked in this order: the amount, the sku, the op_id.
    let parsed = (|| -> Result<(Sku, Change, OpId), InvalidParam> {
        let change = match correction {
            Correction::Set => Change::Set(StockLevel::parse(&args[1])?),
            Correction::Add => Change::Add(Delta::parse(&args[1])?),
        };
        Ok((
            Sku::parse(args[0].clone())?,
            change,
            OpId::parse(args[2].clone())?,
        ))
    })();
    let (sku, change, op_id) = match parsed {
        Ok(parsed) => parsed,
        Err(invalid) => return Ok(Ok(StockReply::invalid(invalid.0))),
    };
    if args.len() > 3 {
        let place = match Place::parse(correction, &args[3..]) {
            Ok(place) => place,
            Err(invalid) => return Ok(Ok(StockReply::invalid(invalid.0))),
        };
        let result = service
            .change_location(
                &sku,
                &op_id,
                correction == Correction::Set,
                &args[1],
                &place.location,
                place.floor.as_deref(),
            )
            .await;
        return Ok(changed(result, &sku, change, &op_id, caller));
    }
    let script: &LuaScript = match change {
        Change::Set(_) => &service.scripts.stock_set,
        Change::Add(_) => &service.scripts.stock_add,
    };
    let keys = service.keys.op_keys(&sku, &op_id);
    let keys = keys.all();
    let nonce = service.nonces.next();
    let settings = &service.settings;
    let script_args: [&[u8]; 5] = [
        &args[1],
        settings.retry_window_arg.as_bytes(),
        &nonce,
        settings.replicate_arg.as_bytes(),
        settings.journal_arg.as_bytes(),
    ];
    let result: StockResult = service
        .with_journal(&sku, service.deadline(), || {
            service.upstream.eval_stock(script, &keys, &script_args)
        })
        .await;
    Ok(changed(result, &sku, change, &op_id, caller))
}

/// Where a STOCK.SET or STOCK.ADD of a SKU kept by location goes: `AT
/// <location>`, and for SET `FLOOR <floor>` maybe (docs/locations.md).
struct Place {
    location: Location,
    floor: Option<Bytes>,
}

impl Place {
    /// `rest`: the arguments after the op_id.
    fn parse(correction: Correction, rest: &[Bytes]) -> Result<Place, InvalidParam> {
        let usage = || {
            InvalidParam(match correction {
                Correction::Set => "after the op_id: AT <location> [FLOOR <floor>]".into(),
                Correction::Add => "after the op_id: AT <location>".into(),
            })
        };
        let (location, floor) = match (correction, rest) {
            (_, [at, location]) if at.eq_ignore_ascii_case(b"AT") => (location, None),
            (Correction::Set, [at, location, word, floor])
                if at.eq_ignore_ascii_case(b"AT") && word.eq_ignore_ascii_case(b"FLOOR") =>
            {
                (location, Some(floor))
            }
            _ => return Err(usage()),
        };
        let location = Location::parse(location.clone())?;
        let floor = match floor {
            Some(floor) => {
                StockLevel::parse_floor(floor)?;
                Some(floor.clone())
            }
            None => None,
        };
        Ok(Place { location, floor })
    }
}

/// A change's outcome, audited when it applied.
fn changed(
    result: StockResult,
    sku: &Sku,
    change: Change,
    op_id: &OpId,
    caller: &Caller,
) -> StockResult {
    let reply = result?;
    if reply.code == Code::Ok {
        let (name, amount) = match change {
            Change::Set(level) => ("STOCK.SET", level.0),
            Change::Add(delta) => ("STOCK.ADD", delta.0),
        };
        audit(name, sku, amount, op_id, reply.remain, caller);
    }
    Ok(reply)
}

/// A stock key's value as a reply: an integer, or nil when missing.
fn stock_value(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Null,
        Value::BulkString(raw) => match std::str::from_utf8(&raw).ok().and_then(|s| s.parse().ok())
        {
            Some(stock) => Reply::Integer(stock),
            None => Reply::error("BADSTOCK stock value is not an integer"),
        },
        other => Reply::error(format!("BADREPLY GET answered {other:?}")),
    }
}

/// Stock changed outside the order flow: who, what, by how much, in the
/// audit log (its own target, so it can be routed and kept apart).
fn audit(command: &str, sku: &Sku, amount: i64, op_id: &OpId, after: i64, caller: &Caller) {
    let (qty, delta) = match command {
        "STOCK.SET" => (Some(amount), None),
        _ => (None, Some(amount)),
    };
    tracing::info!(
        target: "stockgate::audit",
        command,
        sku = %String::from_utf8_lossy(sku.as_bytes()),
        qty,
        delta,
        op_id = %String::from_utf8_lossy(op_id.as_bytes()),
        stock_after = after,
        user = caller.user.as_deref().map(crate::auth::Account::name),
        client_id = caller.client_id,
        client_addr = caller.addr.map(|a| a.to_string()),
        client_name = caller.name.as_deref().map(|n| String::from_utf8_lossy(n).into_owned()),
        "stock changed outside the order flow"
    );
}
