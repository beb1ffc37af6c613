//! The HTTP/JSON face, for callers without a Redis client: gateways, retry
//! middleware, monitors. Off unless `--http-listen` is set.
//!
//! Every route is a stock command's, as its own file describes it
//! ([`crate::stock::command::Http`]): its method, its path, and how a
//! request becomes the command's arguments. This module routes them all
//! through one handler ([`handle`]) and owns the JSON conventions:
//!
//! ```text
//! POST /v1/deduct   {"sku": "...", "qty": 1, "request_id": "...", "order_no": "..."}
//! POST /v1/revert   {"sku": "...", "request_id": "..."}
//! POST /v1/hold     {"sku": "...", "qty": 1, "request_id": "...", "ttl_ms": 900000, "order_no": "..."}
//! POST /v1/confirm  {"sku": "...", "request_id": "..."}
//! POST /v1/hold/extend  {"sku": "...", "request_id": "...", "change_id": "...", "ttl_ms": 600000}
//! POST /v1/hold/shrink  {"sku": "...", "request_id": "...", "change_id": "...", "qty": 1}
//! POST /v1/deduct/at  {"sku": "...", "qty": 1, "request_id": "...", "policy": "SPLIT", "locations": ["...", ...]}
//! POST /v1/hold/at    {"sku": "...", "qty": 1, "request_id": "...", "ttl_ms": 900000, "policy": "WHOLE", "locations": [...]}
//! GET  /v1/stock/{sku}/locations
//! POST /v1/stock/set  {"sku": "...", "qty": 10, "op_id": "...", "location": "...", "floor": 2}
//! POST /v1/stock/add  {"sku": "...", "delta": -1, "op_id": "...", "location": "..."}
//! POST /v1/orders   {"request_id": "...", "lines": [{"sku": "...", "qty": 1, "policy": "SPLIT", "locations": [...]}, ...], "ttl_ms": 900000}
//! POST /v1/orders/{request_id}/confirm
//! POST /v1/orders/{request_id}/revert
//! POST /v1/orders/{request_id}/extend  {"change_id": "...", "ttl_ms": 600000}
//! GET  /v1/orders/{request_id}
//! ```
//!
//! - A call on one request takes a JSON object of its fields, each under
//!   its RESP argument's name (`locations`: a list); a field it does not
//!   take is left unread, but for HOLD.EXTEND and HOLD.SHRINK, which
//!   refuse the other's amount. Integers go to the same rule as RESP's, so
//!   one out of range is code 3 with its reason.
//! - `/v1/orders` is ORDER, or ORDER.HOLD when `ttl_ms` is given; a line on
//!   a SKU kept by location names its `policy` and `locations`. confirm and
//!   revert are ORDER.CONFIRM and ORDER.REVERT (no body is read), extend is
//!   ORDER.EXTEND; the GET is ORDER.STATUS (200 with the intent record,
//!   `"phase": "none"` when there is none; an invalid request_id is a 400
//!   `{"error"}`).
//! - `/v1/deduct/at` and `/v1/hold/at` are DEDUCT.AT and HOLD.AT
//!   (docs/locations.md): the outcome as DEDUCT's and HOLD's, with
//!   `"allocation": [{"location", "units"}]`. The GET of a SKU's locations
//!   is STOCK.LOCATIONS (404 `{"error"}` when the SKU has no stock).
//! - `/v1/stock/set` and `/v1/stock/add` are STOCK.SET and STOCK.ADD, `AT`
//!   the `location` when given (and for SET `FLOOR` the `floor`); like
//!   RESP's they need `--admin-commands` (else 403).
//!
//! Requests go through the same door of the [`StockService`] as RESP's
//! ([`StockService::answer`]): one validation, one script call, one set of
//! metrics. The business code says what happened to the stock; the HTTP
//! status lets generic infrastructure route, retry and alert. A business
//! outcome is never a 5xx and a fault is never a 4xx or a 200.
//! `deploy/openapi.yaml` describes it all.
//!
//! | outcome | status |
//! |---|---|
//! | code 0, 1 (`"duplicate": true`) | 200 |
//! | DEDUCT and HOLD (and their `.AT`) code 2, 4 (`"revoked": true`); CONFIRM code 4; STOCK.ADD code 2 | 409 |
//! | HOLD, CONFIRM, HOLD.EXTEND and HOLD.SHRINK code 5 (`"expired": true`) | 409: the hold ran out, its units are back in stock |
//! | HOLD.EXTEND and HOLD.SHRINK code 4 (`"revoked": true`) | 409: nothing changed |
//! | REVERT code 4 (`"revoked": true`) | 200: compensation done, there was nothing to give back |
//! | orders: as the single-line commands (ORDER as DEDUCT, ORDER.HOLD as HOLD, ORDER.CONFIRM as CONFIRM, ORDER.REVERT as REVERT, ORDER.EXTEND as HOLD.EXTEND) | 2, 4, 5: 409; ORDER.REVERT 4: 200 |
//! | code 3 | 400 |
//! | no credentials (`NOAUTH`), or wrong ones (`WRONGPASS`) | 401 `{"error"}` with `WWW-Authenticate: Bearer` |
//! | outside the user's rights or SKU prefixes | 403 `{"error": "NOPERM ..."}`; nothing runs |
//! | malformed JSON, missing field, wrong type, body over 16 KiB (orders: over [`order_body_limit`]) | 400 `{"error"}`; Redis is not called |
//! | no such route | 404 `{"error"}` |
//! | Redis unreachable, timed out, cluster down | 503, `Retry-After`, `{"error", "retry_safe": true}` |
//! | unknown sku, corrupt data, bad script reply, internal fault | 500 `{"error"}` |
//!
//! [`StockService`]: crate::stock::StockService
//! [`StockService::answer`]: crate::stock::StockService::answer

use crate::auth::{Account, Users, WRONGPASS};
use crate::error::{FaultClass, UpstreamError};
use crate::net::Bounded;
use crate::outcome::{Code, StockReply};
use crate::session::hello::Gate;
use crate::state::Shared;
use crate::stock::command::{Body, Http};
use crate::stock::location::locations::Unread;
use crate::stock::order::OrderReply;
use crate::stock::single::{Field, Shape};
use crate::stock::{Answer, Caller, StockCommand};
use crate::tls::{ServerTls, TlsListener};
use axum::Router;
use axum::body::{Body as HttpBody, to_bytes};
use axum::extract::connect_info::Connected;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Largest request body; more is a 400 before anything is parsed.
pub const MAX_BODY: usize = 16 * 1024;

/// Room for one line of an order's body: its sku of up to 128 bytes with
/// every byte escaped (256), a qty of 16 digits as a string, the keys, and
/// a pretty printer's indentation.
const LINE_BODY: usize = 512;

/// Largest body of `POST /v1/orders` when an order may have `max_lines`
/// lines: room for each line beside the others' limit, so that HTTP
/// carries every order the flag allows (RESP's limit is checked against
/// it at start), and an order of a few lines too many is answered code 3,
/// as over RESP, not 400 for its size.
pub fn order_body_limit(max_lines: usize) -> usize {
    MAX_BODY + max_lines * LINE_BODY
}

/// Seconds a 503 asks the caller to wait before retrying.
const RETRY_AFTER_SECS: u64 = 1;

/// Serves until `drain` is cancelled, then finishes the requests in flight.
pub async fn serve(
    listener: Bounded,
    tls: Option<Arc<ServerTls>>,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    let mut app = Router::new();
    for &command in StockCommand::ALL {
        let Some(http) = command.describe().http else {
            continue;
        };
        let handler = move |state, account, segment, request| {
            handle(command, http, state, account, segment, request)
        };
        app = app.route(
            http.path,
            if http.read {
                get(handler)
            } else {
                post(handler)
            },
        );
    }
    let app = app
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route", None) })
        .with_state(shared);
    // The peer's address (failed logins are counted by it) and its
    // certificate's name.
    let app = app.into_make_service_with_connect_info::<Peer>();
    let served = match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(drain.clone().cancelled_owned())
                .await
        }
        Some(tls) => match TlsListener::new(listener, tls, drain.clone()) {
            Ok(listener) => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(drain.cancelled_owned())
                    .await
            }
            Err(err) => Err(err),
        },
    };
    if let Err(err) = served {
        tracing::error!(%err, "http server stopped");
    }
}

/// The HTTP face's plain listener: at most `--http-max-connections`
/// connections at once ([`Bounded`]).
impl axum::serve::Listener for Bounded {
    type Io = crate::net::Counted<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match Bounded::accept(self).await {
                Ok(accepted) => return accepted,
                // Out of descriptors, or a connection reset before its
                // accept: a pause, not a busy loop.
                Err(err) => {
                    tracing::warn!(%err, "accept failed (http)");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Bounded::local_addr(self)
    }
}

/// Who is at the other end of an HTTP connection.
#[derive(Clone, Debug)]
struct Peer {
    addr: SocketAddr,
    /// The name of its verified client certificate (TLS with
    /// `--tls-client-ca`).
    certificate: Option<String>,
}

impl Connected<IncomingStream<'_, Bounded>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Bounded>) -> Peer {
        Peer {
            addr: *stream.remote_addr(),
            certificate: None,
        }
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Peer {
        Peer {
            addr: *stream.remote_addr(),
            certificate: crate::tls::client_name(stream.io().get_ref()),
        }
    }
}

/// One request to `command`'s route: who sent it, its arguments from the
/// path and the body as the route says, then the command through the
/// service's one door, its answer as JSON.
async fn handle(
    command: StockCommand,
    http: Http,
    State(shared): State<Arc<Shared>>,
    Authorized(account, peer): Authorized,
    segment: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let arrived = Instant::now();
    let (command, args) = match arguments(&shared, command, http, segment, request).await {
        Ok(arguments) => arguments,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    if let Err(denial) = command.permitted(&account.grant(), &args) {
        shared
            .metrics
            .command_denied(account.name(), command.name());
        let why = denial.reply(account.name(), command.name());
        return error(StatusCode::FORBIDDEN, &why, None);
    }
    let caller = Caller {
        client_id: None,
        addr: peer,
        name: None,
        user: Some(account),
    };
    let answer = shared
        .service
        .answer(command, &args, arrived, &caller)
        .await;
    answered(command, answer)
}

/// The command a request to `command`'s route runs (ORDER's route runs
/// ORDER.HOLD too) and its arguments, or why the request is malformed.
async fn arguments(
    shared: &Shared,
    command: StockCommand,
    http: Http,
    segment: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<(StockCommand, Vec<Bytes>), String> {
    // The path's segment, when the route has one.
    let mut args = Vec::new();
    if let Some(open) = http.path.find('{') {
        let name = http.path[open + 1..].split('}').next().unwrap_or_default();
        match segment {
            Ok(Path(segment)) => args.push(Bytes::from(segment)),
            Err(rejection) => {
                return Err(format!(
                    "invalid {name} in the path: {}",
                    rejection.body_text()
                ));
            }
        }
    }
    let limit = match http.body {
        Body::Path => return Ok((command, args)),
        Body::Order => order_body_limit(shared.config.max_order_lines),
        _ => MAX_BODY,
    };
    let body = to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| format!("request body is larger than {limit} bytes, or unreadable"))?;
    match http.body {
        Body::Fields { strict } => {
            let single = command.single().ok_or("a route of fields is a call's")?;
            args.extend(fields(single.fields, strict, &body)?);
        }
        Body::PathThen(of) => args.extend(fields(of, false, &body)?),
        Body::Order => return order(&body),
        Body::StockChange => args.extend(stock_change(command, &body)?),
        Body::Path => {}
    }
    Ok((command, args))
}

/// A JSON object's `fields`, as RESP's arguments in their order: strings
/// as they are, integers as their digits ([`integer_text`]), the locations
/// one argument each. A field it does not take is refused when `strict`.
fn fields(fields: &[Field], strict: bool, body: &[u8]) -> Result<Vec<Bytes>, String> {
    let name = |field: &Field| match field {
        Field::Locations => "locations",
        other => other.spec().name,
    };
    let object: HashMap<String, Box<RawValue>> =
        serde_json::from_slice(body).map_err(|err| format!("invalid request body: {err}"))?;
    if strict
        && let Some(unknown) = object
            .keys()
            .find(|k| !fields.iter().any(|f| name(f) == *k))
    {
        let expected: Vec<String> = fields.iter().map(|f| format!("`{}`", name(f))).collect();
        return Err(format!(
            "invalid request body: unknown field `{unknown}`, expected one of {}",
            expected.join(", ")
        ));
    }
    let mut args = Vec::with_capacity(fields.len());
    for field in fields {
        let name = name(field);
        let Some(raw) = object.get(name) else {
            if field.spec().optional {
                continue;
            }
            return Err(format!("invalid request body: missing field `{name}`"));
        };
        match field {
            Field::Qty | Field::TtlMs => args.push(integer_text(raw, name)?),
            Field::Locations => {
                let list: Vec<String> = typed(raw, name, "a list of strings")?;
                args.extend(list.into_iter().map(Bytes::from));
            }
            _ => args.push(Bytes::from(typed::<String>(raw, name, "a string")?)),
        }
    }
    Ok(args)
}

/// `raw` as a `T`, or what it was instead.
fn typed<T: for<'de> Deserialize<'de>>(
    raw: &RawValue,
    name: &str,
    want: &str,
) -> Result<T, String> {
    serde_json::from_str(raw.get()).map_err(|_| {
        format!(
            "invalid request body: invalid type: {}, expected {want} (field `{name}`)",
            found(raw)
        )
    })
}

/// What kind of JSON value `raw` is, for an error.
fn found(raw: &RawValue) -> &'static str {
    match serde_json::from_str::<serde_json::Value>(raw.get()) {
        Ok(serde_json::Value::Null) => "null",
        Ok(serde_json::Value::Bool(_)) => "boolean",
        Ok(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => "integer",
        Ok(serde_json::Value::Number(_)) => "a number with a fraction or an exponent",
        Ok(serde_json::Value::String(_)) => "string",
        Ok(serde_json::Value::Array(_)) => "array",
        Ok(serde_json::Value::Object(_)) => "map",
        Err(_) => "something else",
    }
}

/// An integer field (qty, ttl_ms) a JSON body gave, as the digits RESP
/// would carry. A JSON integer (an optional `-` and digits: JSON allows no
/// `+` and no leading zero) of any size goes to the same rule as RESP's,
/// so one out of range, `0`, `-1` or `18446744073709551616` alike, is code
/// 3 with its reason. Anything else (a string, a fraction, an exponent,
/// null) is a malformed body; the error says what was found.
fn integer_text(raw: &RawValue, field: &str) -> Result<Bytes, String> {
    let text = raw.get();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Bytes::copy_from_slice(text.as_bytes()));
    }
    let shown: String = text.chars().take(64).collect();
    Err(format!(
        "invalid request body: invalid type for {field}: {} `{shown}`, expected an integer",
        found(raw)
    ))
}

/// The body of `/v1/orders`.
#[derive(Deserialize)]
struct OrderBody {
    request_id: String,
    lines: Vec<OrderLineBody>,
    /// Present: ORDER.HOLD. Raw, as HOLD's; `null` is a malformed body,
    /// not an absent field.
    #[serde(default, deserialize_with = "present")]
    ttl_ms: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
struct OrderLineBody {
    sku: String,
    qty: Box<RawValue>,
    /// A line on a SKU kept by location: how it takes its units, and from
    /// where, in the caller's order (RESP's `<sku>{<POLICY>:<location>,...}`).
    #[serde(default, deserialize_with = "present")]
    policy: Option<String>,
    #[serde(default, deserialize_with = "present")]
    locations: Option<Vec<String>>,
}

/// An order's body as ORDER's (or, with `ttl_ms`, ORDER.HOLD's) arguments:
/// its request_id, [ttl_ms,] then `<sku> <qty>` a line, in the order given.
fn order(body: &[u8]) -> Result<(StockCommand, Vec<Bytes>), String> {
    let body: OrderBody =
        serde_json::from_slice(body).map_err(|err| format!("invalid request body: {err}"))?;
    let mut args = Vec::with_capacity(2 + 2 * body.lines.len());
    args.push(Bytes::from(body.request_id));
    let command = match &body.ttl_ms {
        Some(ttl) => {
            args.push(integer_text(ttl, "ttl_ms")?);
            StockCommand::OrderHold
        }
        None => StockCommand::Order,
    };
    for line in body.lines {
        if line.sku.contains(['{', '}']) {
            return Err(
                "invalid request body: a line's sku holds no `{` or `}`: name a line's locations \
                 with `policy` and `locations`"
                    .into(),
            );
        }
        let word = match (line.policy, line.locations) {
            (None, None) => line.sku,
            (Some(policy), Some(locations)) => {
                format!("{}{{{policy}:{}}}", line.sku, locations.join(","))
            }
            _ => {
                return Err(
                    "invalid request body: a line's `policy` and `locations` go together".into(),
                );
            }
        };
        args.extend([Bytes::from(word), integer_text(&line.qty, "qty")?]);
    }
    Ok((command, args))
}

/// The body of `/v1/stock/set` (`qty`, `floor`) and `/v1/stock/add`
/// (`delta`): the numbers raw, as DEDUCT's qty.
#[derive(Deserialize)]
struct StockChangeBody {
    sku: String,
    #[serde(default, deserialize_with = "present")]
    qty: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    delta: Option<Box<RawValue>>,
    op_id: String,
    #[serde(default, deserialize_with = "present")]
    location: Option<String>,
    #[serde(default, deserialize_with = "present")]
    floor: Option<Box<RawValue>>,
}

/// STOCK.SET's (`qty`, and `floor` with a `location`) or STOCK.ADD's
/// (`delta`) arguments: `AT <location> [FLOOR <floor>]` when a location is
/// given; the other command's amount is a malformed body.
fn stock_change(command: StockCommand, body: &[u8]) -> Result<Vec<Bytes>, String> {
    let body: StockChangeBody =
        serde_json::from_slice(body).map_err(|err| format!("invalid request body: {err}"))?;
    let (field, amount, other) = match command {
        StockCommand::Set => ("qty", body.qty, body.delta.map(|_| "delta")),
        _ => (
            "delta",
            body.delta,
            body.qty
                .map(|_| "qty")
                .or(body.floor.as_ref().map(|_| "floor")),
        ),
    };
    let amount = match (amount, other) {
        (_, Some(other)) => {
            return Err(format!(
                "invalid request body: unknown field `{other}`, expected `{field}`"
            ));
        }
        (None, None) => return Err(format!("invalid request body: missing field `{field}`")),
        (Some(raw), None) => integer_text(&raw, field)?,
    };
    let mut args = vec![Bytes::from(body.sku), amount, Bytes::from(body.op_id)];
    match (body.location, &body.floor) {
        (None, Some(_)) => return Err("invalid request body: `floor` needs a `location`".into()),
        (None, None) => {}
        (Some(location), floor) => {
            args.extend([Bytes::from_static(b"AT"), Bytes::from(location)]);
            if let Some(floor) = floor {
                args.extend([Bytes::from_static(b"FLOOR"), integer_text(floor, "floor")?]);
            }
        }
    }
    Ok(args)
}

/// An optional field that, when present, must have its type: absent is
/// `None`, but `null` is a malformed body, as the document says (a bare
/// `Option` would take `null` for absent).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// The account a request logs in as, and its peer's address: the
/// extractor every route starts with. Its rejection is the 401, sent once
/// a failed login's wait is over ([`crate::auth::throttle`]), before the
/// body is read.
struct Authorized(Arc<Account>, Option<SocketAddr>);

impl FromRequestParts<Arc<Shared>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        shared: &Arc<Shared>,
    ) -> Result<Authorized, Response> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .map(|c| c.0.clone());
        match authorize(shared, &parts.headers, peer.as_ref()) {
            Ok(account) => Ok(Authorized(account, peer.map(|p| p.addr))),
            Err(refusal) => {
                let (response, delay) = *refusal;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Err(response)
            }
        }
    }
}

/// The user a request's `Authorization` header logs in as:
/// `Bearer <user>:<password>` (a token whose part before its first `:`
/// names no user is the `default` user's password, whole), or `Basic`
/// with `<user>:<password>` (an empty user is `default`). Without any
/// password configured, every request is the `default` user. Otherwise a
/// 401 (`NOAUTH` without credentials, `WRONGPASS` with wrong ones), and
/// how long it waits: a failed login at a user from a peer that failed
/// many waits first.
fn authorize(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    peer: Option<&Peer>,
) -> Result<Arc<Account>, Box<(Response, Duration)>> {
    if let Some(open) = shared.users.open_account() {
        return Ok(open);
    }
    let header = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let credentials = header.and_then(|h| credentials(&shared.users, h));
    let (why, delay) = match &credentials {
        // No credentials, and a client certificate that names a user: that
        // user.
        None => match peer
            .and_then(|p| p.certificate.as_deref())
            .and_then(|name| shared.users.certified(name))
        {
            Some(account) => return Ok(account),
            None => (
                "NOAUTH send Authorization: Bearer <user>:<password> (or the default user's password alone), or Basic",
                Duration::ZERO,
            ),
        },
        Some((user, password)) => {
            match Gate::of(shared).check(peer.map(|p| p.addr.ip()), user.as_deref(), password) {
                Ok(account) => return Ok(account),
                Err(wait) => (WRONGPASS, wait),
            }
        }
    };
    let mut response = error(StatusCode::UNAUTHORIZED, why, None);
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Err(Box::new((response, delay)))
}

/// The user (none: `default`) and password an `Authorization` header
/// carries, if it is one stockgate reads.
fn credentials(users: &Users, header: &[u8]) -> Option<(Option<Vec<u8>>, Vec<u8>)> {
    if let Some(token) = header.strip_prefix(b"Bearer ") {
        if let Some(colon) = token.iter().position(|&b| b == b':')
            && users.knows(&token[..colon])
        {
            return Some((Some(token[..colon].to_vec()), token[colon + 1..].to_vec()));
        }
        return Some((None, token.to_vec()));
    }
    let encoded = header.strip_prefix(b"Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = (colon > 0).then(|| decoded[..colon].to_vec());
    Some((user, decoded[colon + 1..].to_vec()))
}

/// A command's answer as its HTTP response.
fn answered(command: StockCommand, answer: Answer) -> Response {
    match answer {
        Answer::Stock(Ok(reply)) => outcome(command, reply),
        Answer::Order(Ok(reply)) => order_outcome(command, &reply),
        Answer::Locations(Ok(Some(found))) => json(
            StatusCode::OK,
            &StockLocationsBody {
                total: found.total,
                locations: found
                    .locations
                    .iter()
                    .map(|l| LocationBody {
                        location: text(&l.location),
                        available: l.available,
                        held: l.held,
                        floor: l.floor,
                    })
                    .collect(),
            },
        ),
        Answer::Locations(Ok(None)) => error(
            StatusCode::NOT_FOUND,
            "UNKNOWNSKU no stock recorded for this sku",
            None,
        ),
        Answer::Locations(Err(Unread::Shape)) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, Unread::SHAPE, None)
        }
        Answer::OrderState(Ok(state)) => json(
            StatusCode::OK,
            &OrderStatusBody {
                phase: state.phase,
                kind: state.kind,
                lines: state
                    .lines
                    .iter()
                    .map(|(sku, qty)| OrderLineStatus {
                        sku: text(sku),
                        qty: text(qty).parse().unwrap_or(0),
                    })
                    .collect(),
                expires_at: state.expires_at,
                expired: state.expired,
                code: state.code,
                short: state.short.iter().map(|s| text(s)).collect(),
            },
        ),
        Answer::Stock(Err(fault))
        | Answer::Order(Err(fault))
        | Answer::Locations(Err(Unread::Fault(fault)))
        | Answer::OrderState(Err(fault)) => fault_response(&fault),
        Answer::Invalid(invalid) => error(StatusCode::BAD_REQUEST, &invalid.0, None),
        // As RESP's -NOPERM: the flag, not the user, refuses it.
        Answer::Refused(why) => error(StatusCode::FORBIDDEN, why, None),
        Answer::Reply(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the command has no HTTP answer",
            None,
        ),
    }
}

/// Text stockgate checked or wrote itself (skus, locations: ASCII).
fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or("")
}

/// The HTTP status of a business code: never a 5xx. A status says whether
/// the caller's intent was met, since that is what generic retry middleware
/// acts on: a DEDUCT that was revoked did not deduct (409), but a REVERT
/// that revoked is compensation done, there was nothing to give back (200,
/// as for a duplicate). A hold that expired (5) did not hold or confirm
/// (409); REVERT never answers 5. The order commands follow their
/// single-line counterparts: ORDER.REVERT 4 is compensation done (200).
/// Which commands are compensations is the list's to say
/// ([`crate::stock::command::Command::gives_back`]).
pub fn status_for(command: StockCommand, code: Code) -> StatusCode {
    match code {
        Code::Ok | Code::Duplicate => StatusCode::OK,
        Code::Revoked | Code::Expired if command.describe().gives_back => StatusCode::OK,
        Code::Revoked | Code::Expired => StatusCode::CONFLICT,
        Code::Insufficient => StatusCode::CONFLICT,
        Code::Invalid => StatusCode::BAD_REQUEST,
    }
}

/// The body of every business outcome.
#[derive(Serialize)]
struct OutcomeBody<'a> {
    code: i64,
    remain: i64,
    order_no: &'a str,
    /// Present, and true, only for code 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate: Option<bool>,
    /// Present, and true, only for code 4.
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked: Option<bool>,
    /// Present, and true, only for code 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    expired: Option<bool>,
    version: i64,
    /// The hold's expiry, ms of Redis time (the calls that place, change
    /// or end a hold; 0 when there is no hold to speak of).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
    /// Why the parameters were refused (code 3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    /// DEDUCT.AT's and HOLD.AT's: what each location gave, in the order
    /// taken; empty for codes 2 to 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    allocation: Option<Vec<LocationGave<'a>>>,
}

#[derive(Serialize)]
struct LocationGave<'a> {
    location: &'a str,
    units: i64,
}

/// A business outcome of one SKU: the command's status and body. A
/// command whose call speaks of no hold shows no `expires_at` (DEDUCT.AT's
/// allocation reply carries one, 0).
fn outcome(command: StockCommand, mut reply: StockReply) -> Response {
    let speaks_of_hold = command.single().is_none_or(|single| {
        single.reply == Shape::Expiry || (single.reply == Shape::Allocation && single.places_hold)
    });
    if !speaks_of_hold {
        reply.expires_at = None;
    }
    let body = OutcomeBody {
        code: reply.code as i64,
        remain: reply.remain,
        order_no: text(&reply.order_no),
        duplicate: (reply.code == Code::Duplicate).then_some(true),
        revoked: (reply.code == Code::Revoked).then_some(true),
        expired: (reply.code == Code::Expired).then_some(true),
        version: reply.version,
        expires_at: reply.expires_at,
        reason: reply
            .reason
            .as_deref()
            .and_then(|r| std::str::from_utf8(r).ok()),
        allocation: reply.allocation.as_ref().map(|allocation| {
            allocation
                .iter()
                .map(|(location, units)| LocationGave {
                    location: text(location),
                    units: *units,
                })
                .collect()
        }),
    };
    json(status_for(command, reply.code), &body)
}

/// The body of every order outcome.
#[derive(Serialize)]
struct OrderOutcomeBody<'a> {
    code: i64,
    /// Present, and true, only for code 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate: Option<bool>,
    /// Present, and true, only for code 4.
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked: Option<bool>,
    /// Present, and true, only for code 5.
    #[serde(skip_serializing_if = "Option::is_none")]
    expired: Option<bool>,
    version: i64,
    /// The order hold's expiry, ms of Redis time; 0 for an ORDER.
    expires_at: i64,
    lines: Vec<OrderLineOutcome<'a>>,
    /// The SKUs at fault: code 2 (short) and 5 (ran out) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    short: Option<Vec<&'a str>>,
    /// Why the parameters were refused (code 3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct OrderLineOutcome<'a> {
    sku: &'a str,
    remain: i64,
}

fn order_outcome(command: StockCommand, reply: &OrderReply) -> Response {
    let body = OrderOutcomeBody {
        code: reply.code as i64,
        duplicate: (reply.code == Code::Duplicate).then_some(true),
        revoked: (reply.code == Code::Revoked).then_some(true),
        expired: (reply.code == Code::Expired).then_some(true),
        version: crate::outcome::SCRIPT_VERSION,
        expires_at: reply.expires_at,
        lines: reply
            .lines
            .iter()
            .map(|(sku, remain)| OrderLineOutcome {
                sku: text(sku),
                remain: *remain,
            })
            .collect(),
        short: (!reply.short.is_empty()).then(|| reply.short.iter().map(|s| text(s)).collect()),
        reason: reply.reason.as_deref(),
    };
    json(status_for(command, reply.code), &body)
}

/// The body of `GET /v1/orders/{request_id}`.
#[derive(Serialize)]
struct OrderStatusBody<'a> {
    phase: &'a str,
    kind: &'a str,
    lines: Vec<OrderLineStatus<'a>>,
    expires_at: i64,
    expired: bool,
    code: i64,
    short: Vec<&'a str>,
}

#[derive(Serialize)]
struct OrderLineStatus<'a> {
    sku: &'a str,
    qty: u64,
}

/// The body of `GET /v1/stock/{sku}/locations`.
#[derive(Serialize)]
struct StockLocationsBody<'a> {
    total: i64,
    locations: Vec<LocationBody<'a>>,
}

#[derive(Serialize)]
struct LocationBody<'a> {
    location: &'a str,
    available: i64,
    held: i64,
    floor: i64,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_safe: Option<bool>,
}

/// A fault: 503 with `Retry-After` when a retry may succeed, else 500.
fn fault_response(fault: &UpstreamError) -> Response {
    let text = fault.reply_text();
    match fault.kind.class() {
        FaultClass::Unavailable => {
            let mut response = error(StatusCode::SERVICE_UNAVAILABLE, &text, Some(true));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            response
        }
        FaultClass::BadReply | FaultClass::Data => {
            error(StatusCode::INTERNAL_SERVER_ERROR, &text, None)
        }
    }
}

fn error(status: StatusCode, text: &str, retry_safe: Option<bool>) -> Response {
    json(
        status,
        &ErrorBody {
            error: text,
            retry_safe,
        },
    )
}

/// Serializes `body`; a failure to serialize is a 500, never a business
/// code.
fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            HttpBody::from(bytes),
        )
            .into_response(),
        Err(err) => {
            tracing::error!(%err, "response failed to serialize");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "application/json")],
                HttpBody::from(
                    r#"{"error":"internal error: the response could not be serialized"}"#,
                ),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn business_codes_never_map_to_5xx() {
        for command in [
            StockCommand::Deduct,
            StockCommand::Revert,
            StockCommand::Hold,
            StockCommand::Confirm,
            StockCommand::HoldExtend,
            StockCommand::HoldShrink,
            StockCommand::DeductAt,
            StockCommand::HoldAt,
            StockCommand::Set,
            StockCommand::Add,
            StockCommand::Order,
            StockCommand::OrderHold,
            StockCommand::OrderConfirm,
            StockCommand::OrderRevert,
            StockCommand::OrderExtend,
        ] {
            for code in Code::ALL {
                let status = status_for(command, code);
                assert!(status.is_success() || status.is_client_error());
            }
        }
        assert_eq!(
            status_for(StockCommand::Deduct, Code::Revoked),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status_for(StockCommand::Revert, Code::Revoked),
            StatusCode::OK
        );
        assert_eq!(
            status_for(StockCommand::Confirm, Code::Expired),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status_for(StockCommand::Hold, Code::Revoked),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status_for(StockCommand::OrderRevert, Code::Revoked),
            StatusCode::OK
        );
        for command in [
            StockCommand::DeductAt,
            StockCommand::HoldAt,
            StockCommand::Order,
            StockCommand::OrderHold,
            StockCommand::OrderConfirm,
            StockCommand::HoldExtend,
            StockCommand::HoldShrink,
            StockCommand::OrderExtend,
        ] {
            assert_eq!(status_for(command, Code::Revoked), StatusCode::CONFLICT);
            assert_eq!(status_for(command, Code::Expired), StatusCode::CONFLICT);
        }
    }
}
