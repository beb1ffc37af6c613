//! The HTTP/JSON face, for callers without a Redis client: gateways, retry
//! middleware, monitors. Off unless `--http-listen` is set.
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
//! POST /v1/orders   {"request_id": "...", "lines": [{"sku": "...", "qty": 1}, ...], "ttl_ms": 900000}
//! POST /v1/orders/{request_id}/confirm
//! POST /v1/orders/{request_id}/revert
//! POST /v1/orders/{request_id}/extend  {"change_id": "...", "ttl_ms": 600000}
//! GET  /v1/orders/{request_id}
//! ```
//!
//! `/v1/orders` is ORDER, or ORDER.HOLD when `ttl_ms` is given; confirm and
//! revert are ORDER.CONFIRM and ORDER.REVERT (no body is read), extend is
//! ORDER.EXTEND; the GET is
//! ORDER.STATUS (200 with the intent record, `"phase": "none"` when there
//! is none; an invalid request_id is a 400 `{"error"}`).
//!
//! `/v1/deduct/at` and `/v1/hold/at` are DEDUCT.AT and HOLD.AT
//! (docs/locations.md): the outcome as DEDUCT's and HOLD's, with
//! `"allocation": [{"location", "units"}]`. The GET of a SKU's locations
//! is STOCK.LOCATIONS (404 `{"error"}` when the SKU has no stock).
//! `/v1/stock/set` and `/v1/stock/add` are STOCK.SET and STOCK.ADD, `AT`
//! the `location` when given (and for SET `FLOOR` the `floor`); like RESP's
//! they need `--admin-commands` (else 403).
//!
//! Requests go through the same [`StockService`] as RESP: one validation,
//! one script call, one set of metrics. The business code says what happened
//! to the stock; the HTTP status lets generic infrastructure route, retry
//! and alert. A business outcome is never a 5xx and a fault is never a 4xx
//! or a 200. `deploy/openapi.yaml` describes it all.
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
//! | no or wrong credentials | 401 `{"error"}` with `WWW-Authenticate: Bearer` |
//! | outside the user's rights or SKU prefixes | 403 `{"error": "NOPERM ..."}`; nothing runs |
//! | malformed JSON, missing field, wrong type, body over 16 KiB (orders: over [`order_body_limit`]) | 400 `{"error"}`; Redis is not called |
//! | Redis unreachable, timed out, cluster down | 503, `Retry-After`, `{"error", "retry_safe": true}` |
//! | unknown sku, corrupt data, bad script reply, internal fault | 500 `{"error"}` |
//!
//! [`StockService`]: crate::stock::StockService

use crate::auth::{Account, Users};
use crate::error::{FaultClass, UpstreamError};
use crate::outcome::{Code, StockReply};
use crate::session::hello::Gate;
use crate::state::Shared;
use crate::stock::admin::{Correction, Uncorrected};
use crate::stock::location::locations::{self, Unread};
use crate::stock::order::OrderReply;
use crate::stock::order::{order_call, order_state};
use crate::stock::{Caller, StockCommand};
use crate::tls::{ServerTls, TlsListener};
use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::connect_info::Connected;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
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
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    let app = Router::new()
        .route("/v1/deduct", post(deduct))
        .route("/v1/revert", post(revert))
        .route("/v1/hold", post(hold))
        .route("/v1/confirm", post(confirm))
        .route("/v1/hold/extend", post(hold_extend))
        .route("/v1/hold/shrink", post(hold_shrink))
        .route("/v1/deduct/at", post(deduct_at))
        .route("/v1/hold/at", post(hold_at))
        .route("/v1/stock/{sku}/locations", get(stock_locations))
        .route("/v1/stock/set", post(stock_set))
        .route("/v1/stock/add", post(stock_add))
        .route("/v1/orders", post(order))
        .route("/v1/orders/{request_id}/confirm", post(order_confirm))
        .route("/v1/orders/{request_id}/revert", post(order_revert))
        .route("/v1/orders/{request_id}/extend", post(order_extend))
        .route("/v1/orders/{request_id}", get(order_status))
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

/// Who is at the other end of an HTTP connection.
#[derive(Clone, Debug)]
struct Peer {
    addr: SocketAddr,
    /// The name of its verified client certificate (TLS with
    /// `--tls-client-ca`).
    certificate: Option<String>,
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Peer {
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
            certificate: crate::tls::client_name(stream.io()),
        }
    }
}

#[derive(Deserialize)]
struct DeductBody {
    sku: String,
    /// Kept as the JSON text: a `u64` would turn an integer past 2^64 into
    /// a serde type error, where the contract says an out-of-range integer
    /// is code 3. See [`integer_text`].
    qty: Box<RawValue>,
    request_id: String,
    #[serde(default, deserialize_with = "present")]
    order_no: Option<String>,
}

/// The body of REVERT and CONFIRM.
#[derive(Deserialize)]
struct RevertBody {
    sku: String,
    request_id: String,
}

#[derive(Deserialize)]
struct HoldBody {
    sku: String,
    /// Raw, as DEDUCT's qty; so is ttl_ms.
    qty: Box<RawValue>,
    request_id: String,
    ttl_ms: Box<RawValue>,
    #[serde(default, deserialize_with = "present")]
    order_no: Option<String>,
}

/// The body of `/v1/hold/extend` (`ttl_ms`) and `/v1/hold/shrink`
/// (`qty`): the change's amount raw, as HOLD's numbers.
#[derive(Deserialize)]
struct HoldChangeBody {
    sku: String,
    request_id: String,
    change_id: String,
    #[serde(default, deserialize_with = "present")]
    ttl_ms: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    qty: Option<Box<RawValue>>,
}

/// The body of `/v1/deduct/at`.
#[derive(Deserialize)]
struct DeductAtBody {
    sku: String,
    /// Raw, as DEDUCT's.
    qty: Box<RawValue>,
    request_id: String,
    /// `SPLIT` or `WHOLE`; any other string is code 3, as over RESP.
    policy: String,
    /// The caller's priority order.
    locations: Vec<String>,
}

/// The body of `/v1/hold/at`.
#[derive(Deserialize)]
struct HoldAtBody {
    sku: String,
    /// Raw, as HOLD's; so is ttl_ms.
    qty: Box<RawValue>,
    request_id: String,
    ttl_ms: Box<RawValue>,
    policy: String,
    locations: Vec<String>,
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

/// The body of `/v1/orders/{request_id}/extend`: ttl_ms raw, as HOLD's.
#[derive(Deserialize)]
struct OrderExtendBody {
    change_id: String,
    ttl_ms: Box<RawValue>,
}

#[derive(Deserialize)]
struct OrderLineBody {
    sku: String,
    qty: Box<RawValue>,
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
    /// The hold's expiry, ms of Redis time (HOLD and CONFIRM; 0 when there
    /// is no hold to speak of).
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<i64>,
    /// Why the parameters were refused (code 3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// The body of a DEDUCT.AT or HOLD.AT outcome: the outcome as DEDUCT's
/// and HOLD's, and what each location gave.
#[derive(Serialize)]
struct AllocationOutcomeBody<'a> {
    #[serde(flatten)]
    outcome: OutcomeBody<'a>,
    /// In the order taken; empty for codes 2 to 5.
    allocation: Vec<LocationGave<'a>>,
}

#[derive(Serialize)]
struct LocationGave<'a> {
    location: &'a str,
    units: i64,
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

/// The user a request's `Authorization` header logs in as:
/// `Bearer <user>:<password>` (a token whose part before its first `:`
/// names no user is the `default` user's password, whole), or `Basic`
/// with `<user>:<password>` (an empty user is `default`). Without any
/// password configured, every request is the `default` user. Otherwise
/// 401, before the body is read; a failed login from a peer that failed
/// many waits first ([`crate::auth::throttle`]).
fn authorize(shared: &Shared, request: &Request) -> Result<Arc<Account>, Box<Refusal>> {
    if let Some(open) = shared.users.open_account() {
        return Ok(open);
    }
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let credentials = header.and_then(|h| credentials(&shared.users, h));
    let connected = request.extensions().get::<ConnectInfo<Peer>>();
    // No credentials, and a client certificate that names a user: that user.
    if credentials.is_none()
        && let Some(account) = connected
            .and_then(|c| c.0.certificate.as_deref())
            .and_then(|name| shared.users.certified(name))
    {
        return Ok(account);
    }
    let peer = connected.map(|c| c.0.addr.ip());
    let mut delay = Duration::ZERO;
    if let Some((user, password)) = &credentials {
        match Gate::of(shared).check(peer, user.as_deref(), password) {
            Ok(account) => return Ok(account),
            Err(wait) => delay = wait,
        }
    }
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        "NOAUTH send Authorization: Bearer <user>:<password> (or the default user's password alone), or Basic",
        None,
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Err(Box::new(Refusal { response, delay }))
}

/// A 401, and how long it waits before it is sent.
struct Refusal {
    response: Response,
    delay: Duration,
}

impl Refusal {
    async fn send(self) -> Response {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.response
    }
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

/// A 403 when `account` may not send `command` with `args`: outside its
/// rights or its SKU prefixes, worded as RESP's NOPERM. Nothing is run.
fn permit(
    shared: &Shared,
    account: &Account,
    command: StockCommand,
    args: &[Bytes],
) -> Option<Response> {
    command
        .permitted(&account.grant(), args)
        .err()
        .map(|denial| {
            shared
                .metrics
                .command_denied(account.name(), command.name());
            error(
                StatusCode::FORBIDDEN,
                &denial.reply(account.name(), command.name()),
                None,
            )
        })
}

async fn deduct(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: DeductBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let qty = match integer_text(&body.qty, "qty") {
        Ok(qty) => qty,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let mut args = vec![Bytes::from(body.sku), qty, Bytes::from(body.request_id)];
    args.extend(body.order_no.map(Bytes::from));
    if let Some(denied) = permit(&shared, &account, StockCommand::Deduct, &args) {
        return denied;
    }
    respond(
        StockCommand::Deduct,
        shared
            .service
            .call(StockCommand::Deduct, &args, arrived, Some(account.clone()))
            .await,
    )
}

async fn hold(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: HoldBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let numbers = integer_text(&body.qty, "qty")
        .and_then(|qty| Ok((qty, integer_text(&body.ttl_ms, "ttl_ms")?)));
    let (qty, ttl) = match numbers {
        Ok(numbers) => numbers,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let mut args = vec![
        Bytes::from(body.sku),
        qty,
        Bytes::from(body.request_id),
        ttl,
    ];
    args.extend(body.order_no.map(Bytes::from));
    if let Some(denied) = permit(&shared, &account, StockCommand::Hold, &args) {
        return denied;
    }
    respond(
        StockCommand::Hold,
        shared
            .service
            .call(StockCommand::Hold, &args, arrived, Some(account.clone()))
            .await,
    )
}

async fn hold_extend(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_hold_change(shared, request, StockCommand::HoldExtend).await
}

async fn hold_shrink(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_hold_change(shared, request, StockCommand::HoldShrink).await
}

/// HOLD.EXTEND (`ttl_ms`) and HOLD.SHRINK (`qty`): the body's fields become
/// the RESP arguments; the other command's amount is a malformed body.
async fn on_hold_change(shared: Arc<Shared>, request: Request, command: StockCommand) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: HoldChangeBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let (field, amount, other) = match command {
        StockCommand::HoldExtend => ("ttl_ms", body.ttl_ms, body.qty.map(|_| "qty")),
        _ => ("qty", body.qty, body.ttl_ms.map(|_| "ttl_ms")),
    };
    let amount = match (amount, other) {
        (_, Some(other)) => Err(format!(
            "invalid request body: unknown field `{other}`, expected `{field}`"
        )),
        (None, None) => Err(format!("invalid request body: missing field `{field}`")),
        (Some(raw), None) => integer_text(&raw, field),
    };
    let amount = match amount {
        Ok(amount) => amount,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let args = [
        Bytes::from(body.sku),
        Bytes::from(body.request_id),
        Bytes::from(body.change_id),
        amount,
    ];
    if let Some(denied) = permit(&shared, &account, command, &args) {
        return denied;
    }
    let user = Some(account.clone());
    respond(
        command,
        shared.service.call(command, &args, arrived, user).await,
    )
}

async fn confirm(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_request(shared, request, StockCommand::Confirm).await
}

async fn revert(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_request(shared, request, StockCommand::Revert).await
}

/// CONFIRM and REVERT: a body of `{"sku", "request_id"}`.
async fn on_request(shared: Arc<Shared>, request: Request, command: StockCommand) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: RevertBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let args = [Bytes::from(body.sku), Bytes::from(body.request_id)];
    if let Some(denied) = permit(&shared, &account, command, &args) {
        return denied;
    }
    let user = Some(account.clone());
    respond(
        command,
        shared.service.call(command, &args, arrived, user).await,
    )
}

/// `POST /v1/deduct/at`: DEDUCT.AT, the locations in the order given.
async fn deduct_at(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: DeductAtBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let qty = match integer_text(&body.qty, "qty") {
        Ok(qty) => qty,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let mut args = vec![
        Bytes::from(body.sku),
        qty,
        Bytes::from(body.request_id),
        Bytes::from(body.policy),
    ];
    args.extend(body.locations.into_iter().map(Bytes::from));
    allocate(&shared, &account, false, &args, arrived).await
}

/// `POST /v1/hold/at`: HOLD.AT, the locations in the order given.
async fn hold_at(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let body: HoldAtBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let numbers = integer_text(&body.qty, "qty")
        .and_then(|qty| Ok((qty, integer_text(&body.ttl_ms, "ttl_ms")?)));
    let (qty, ttl) = match numbers {
        Ok(numbers) => numbers,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let mut args = vec![
        Bytes::from(body.sku),
        qty,
        Bytes::from(body.request_id),
        ttl,
        Bytes::from(body.policy),
    ];
    args.extend(body.locations.into_iter().map(Bytes::from));
    allocate(&shared, &account, true, &args, arrived).await
}

/// DEDUCT.AT (`hold` false) or HOLD.AT with the RESP arguments a body
/// made: the same call as RESP's. No locations is code 3 there, as over
/// RESP.
async fn allocate(
    shared: &Shared,
    account: &Arc<Account>,
    hold: bool,
    args: &[Bytes],
    arrived: Instant,
) -> Response {
    let command = if hold {
        StockCommand::HoldAt
    } else {
        StockCommand::DeductAt
    };
    if let Some(denied) = permit(shared, account, command, args) {
        return denied;
    }
    let user = Some(account.clone());
    respond(
        command,
        shared.service.call(command, args, arrived, user).await,
    )
}

/// `GET /v1/stock/{sku}/locations`: STOCK.LOCATIONS, changing nothing (but
/// giving the SKU's expired holds back first, as every call on it does).
/// A SKU that keeps one number shows its stock as `total` and no
/// locations; one with no stock is a 404.
async fn stock_locations(
    State(shared): State<Arc<Shared>>,
    sku: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let sku = match sku {
        Ok(Path(sku)) => Bytes::from(sku),
        Err(rejection) => {
            let why = format!("invalid sku in the path: {}", rejection.body_text());
            return error(StatusCode::BAD_REQUEST, &why, None);
        }
    };
    let command = StockCommand::Locations;
    if let Some(denied) = permit(&shared, &account, command, std::slice::from_ref(&sku)) {
        return denied;
    }
    let sku = match crate::params::Sku::parse(sku) {
        Ok(sku) => sku,
        Err(invalid) => return error(StatusCode::BAD_REQUEST, &invalid.0, None),
    };
    let found = match locations::read(&shared.service, &sku).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "UNKNOWNSKU no stock recorded for this sku",
                None,
            );
        }
        Err(Unread::Shape) => {
            return error(StatusCode::INTERNAL_SERVER_ERROR, Unread::SHAPE, None);
        }
        Err(Unread::Fault(fault)) => return fault_response(&fault),
    };
    let body = StockLocationsBody {
        total: found.total,
        locations: found
            .locations
            .iter()
            .map(|l| LocationBody {
                location: std::str::from_utf8(&l.location).unwrap_or(""),
                available: l.available,
                held: l.held,
                floor: l.floor,
            })
            .collect(),
    };
    json(StatusCode::OK, &body)
}

async fn stock_set(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_stock_change(shared, request, Correction::Set).await
}

async fn stock_add(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    on_stock_change(shared, request, Correction::Add).await
}

/// STOCK.SET (`qty`, and `floor` with a `location`) and STOCK.ADD
/// (`delta`): the body's fields become the RESP arguments, `AT <location>
/// [FLOOR <floor>]` when a location is given; the other command's amount
/// is a malformed body. The audit log names the HTTP peer.
async fn on_stock_change(
    shared: Arc<Shared>,
    request: Request,
    correction: Correction,
) -> Response {
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.addr);
    let body: StockChangeBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let (field, amount, other) = match correction {
        Correction::Set => ("qty", body.qty, body.delta.map(|_| "delta")),
        Correction::Add => (
            "delta",
            body.delta,
            body.qty
                .map(|_| "qty")
                .or(body.floor.as_ref().map(|_| "floor")),
        ),
    };
    let amount = match (amount, other) {
        (_, Some(other)) => Err(format!(
            "invalid request body: unknown field `{other}`, expected `{field}`"
        )),
        (None, None) => Err(format!("invalid request body: missing field `{field}`")),
        (Some(raw), None) => integer_text(&raw, field),
    };
    let amount = match amount {
        Ok(amount) => amount,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let mut args = vec![Bytes::from(body.sku), amount, Bytes::from(body.op_id)];
    match (body.location, &body.floor) {
        (None, Some(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid request body: `floor` needs a `location`",
                None,
            );
        }
        (None, None) => {}
        (Some(location), floor) => {
            args.extend([Bytes::from_static(b"AT"), Bytes::from(location)]);
            if let Some(floor) = floor {
                match integer_text(floor, "floor") {
                    Ok(floor) => args.extend([Bytes::from_static(b"FLOOR"), floor]),
                    Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
                }
            }
        }
    }
    let command = match correction {
        Correction::Set => StockCommand::Set,
        Correction::Add => StockCommand::Add,
    };
    if let Some(denied) = permit(&shared, &account, command, &args) {
        return denied;
    }
    let caller = Caller {
        client_id: None,
        addr: peer,
        name: None,
        user: Some(account),
    };
    match crate::stock::admin::correct(&shared.service, correction, &args, &caller).await {
        Ok(reply) => json(status_for(command, reply.code), &outcome_body(&reply)),
        // As RESP's -NOPERM: the flag, not the user, refuses it.
        Err(Uncorrected::Disabled) => error(StatusCode::FORBIDDEN, Uncorrected::DISABLED, None),
        Err(Uncorrected::Fault(fault)) => fault_response(&fault),
    }
}

/// `POST /v1/orders`: ORDER, or ORDER.HOLD with `ttl_ms`, through the
/// same [`order_call`]
/// as RESP. The lines become the RESP arguments, in the order given.
async fn order(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let limit = order_body_limit(shared.config.max_order_lines);
    let body: OrderBody = match read_json(request, limit).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let mut args = Vec::with_capacity(2 + 2 * body.lines.len());
    args.push(Bytes::from(body.request_id));
    let command = match &body.ttl_ms {
        Some(ttl) => match integer_text(ttl, "ttl_ms") {
            Ok(ttl) => {
                args.push(ttl);
                StockCommand::OrderHold
            }
            Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
        },
        None => StockCommand::Order,
    };
    for line in body.lines {
        match integer_text(&line.qty, "qty") {
            Ok(qty) => args.extend([Bytes::from(line.sku), qty]),
            Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
        }
    }
    if let Some(denied) = permit(&shared, &account, command, &args) {
        return denied;
    }
    respond_order(
        command,
        order_call(
            &shared.service,
            command,
            &args,
            arrived,
            Some(account.name()),
        )
        .await,
    )
}

/// `POST /v1/orders/{request_id}/confirm`: ORDER.CONFIRM.
async fn order_confirm(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    order_by_id(&shared, id, request, StockCommand::OrderConfirm).await
}

/// `POST /v1/orders/{request_id}/revert`: ORDER.REVERT.
async fn order_revert(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    order_by_id(&shared, id, request, StockCommand::OrderRevert).await
}

/// `POST /v1/orders/{request_id}/extend`: ORDER.EXTEND, the change_id
/// and ttl_ms from the body.
async fn order_extend(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let arrived = Instant::now();
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let id = match path_id(id) {
        Ok(id) => id,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let body: OrderExtendBody = match read_json(request, MAX_BODY).await {
        Ok(body) => body,
        Err(response) => return response,
    };
    let ttl = match integer_text(&body.ttl_ms, "ttl_ms") {
        Ok(ttl) => ttl,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let args = [Bytes::from(id), Bytes::from(body.change_id), ttl];
    let command = StockCommand::OrderExtend;
    if let Some(denied) = permit(&shared, &account, command, &args) {
        return denied;
    }
    respond_order(
        command,
        order_call(
            &shared.service,
            command,
            &args,
            arrived,
            Some(account.name()),
        )
        .await,
    )
}

/// ORDER.CONFIRM or ORDER.REVERT of the (percent-decoded) request_id in
/// the path. A path that does not decode to UTF-8 is a malformed request.
async fn order_by_id(
    shared: &Shared,
    id: Result<Path<String>, PathRejection>,
    request: Request,
    command: StockCommand,
) -> Response {
    let arrived = Instant::now();
    let account = match authorize(shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let id = match path_id(id) {
        Ok(id) => id,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let args = [Bytes::from(id)];
    if let Some(denied) = permit(shared, &account, command, &args) {
        return denied;
    }
    respond_order(
        command,
        order_call(
            &shared.service,
            command,
            &args,
            arrived,
            Some(account.name()),
        )
        .await,
    )
}

/// The (percent-decoded) request_id in an order's path, or why a path
/// that does not decode to UTF-8 is a malformed request.
fn path_id(id: Result<Path<String>, PathRejection>) -> Result<String, String> {
    id.map(|Path(id)| id)
        .map_err(|rejection| format!("invalid request_id in the path: {}", rejection.body_text()))
}

/// `GET /v1/orders/{request_id}`: ORDER.STATUS, changing nothing.
async fn order_status(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    let account = match authorize(&shared, &request) {
        Ok(account) => account,
        Err(refused) => return refused.send().await,
    };
    let id = match path_id(id) {
        Ok(id) => id,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why, None),
    };
    let id = Bytes::from(id);
    if let Some(denied) = permit(
        &shared,
        &account,
        StockCommand::OrderStatus,
        std::slice::from_ref(&id),
    ) {
        return denied;
    }
    let state = match order_state(&shared.service, &id).await {
        Ok(Ok(state)) => state,
        Ok(Err(invalid)) => return error(StatusCode::BAD_REQUEST, &invalid.0, None),
        Err(fault) => return fault_response(&fault),
    };
    fn text(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap_or("")
    }
    let body = OrderStatusBody {
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
    };
    json(StatusCode::OK, &body)
}

/// An integer field (qty, ttl_ms) a JSON body gave, as the digits RESP
/// would carry. A JSON integer
/// (an optional `-` and digits: JSON allows no `+` and no leading zero) of
/// any size goes to the same rule as RESP's, so one out of range, `0`,
/// `-1` or `18446744073709551616` alike, is code 3 with its reason. Anything
/// else (a string, a fraction, an exponent, null) is a malformed body; the
/// error says what was found.
fn integer_text(raw: &RawValue, field: &str) -> Result<Bytes, String> {
    let text = raw.get();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Bytes::copy_from_slice(text.as_bytes()));
    }
    let found = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Null) => "null",
        Ok(serde_json::Value::Bool(_)) => "boolean",
        Ok(serde_json::Value::Number(_)) => "a number with a fraction or an exponent",
        Ok(serde_json::Value::String(_)) => "string",
        Ok(serde_json::Value::Array(_)) => "array",
        Ok(serde_json::Value::Object(_)) => "map",
        Err(_) => "something else",
    };
    let shown: String = text.chars().take(64).collect();
    Err(format!(
        "invalid request body: invalid type for {field}: {found} `{shown}`, expected an integer"
    ))
}

/// Reads at most `limit` bytes and parses them; anything wrong is a 400
/// with the reason, and the stock service is never called.
async fn read_json<T: for<'de> Deserialize<'de>>(
    request: Request,
    limit: usize,
) -> Result<T, Response> {
    let bytes = to_bytes(request.into_body(), limit).await.map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("request body is larger than {limit} bytes, or unreadable"),
            None,
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|err| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("invalid request body: {err}"),
            None,
        )
    })
}

/// The HTTP status of a business code: never a 5xx. A status says whether
/// the caller's intent was met, since that is what generic retry middleware
/// acts on: a DEDUCT that was revoked did not deduct (409), but a REVERT
/// that revoked is compensation done, there was nothing to give back (200,
/// as for a duplicate). A hold that expired (5) did not hold or confirm
/// (409); REVERT never answers 5. The order commands follow their
/// single-line counterparts: ORDER.REVERT 4 is compensation done (200).
/// Which commands are compensations is the list's to say
/// ([`crate::doc::About::gives_back`]).
pub fn status_for(command: StockCommand, code: Code) -> StatusCode {
    match code {
        Code::Ok | Code::Duplicate => StatusCode::OK,
        Code::Revoked | Code::Expired if command.describe().gives_back => StatusCode::OK,
        Code::Revoked | Code::Expired => StatusCode::CONFLICT,
        Code::Insufficient => StatusCode::CONFLICT,
        Code::Invalid => StatusCode::BAD_REQUEST,
    }
}

fn respond(command: StockCommand, result: Result<StockReply, UpstreamError>) -> Response {
    let mut reply = match result {
        Ok(reply) => reply,
        Err(fault) => return fault_response(&fault),
    };
    // A DEDUCT.AT's body is DEDUCT's, without an expiry; HOLD.AT's has
    // HOLD's `expires_at`, a refusal's too (0).
    if command == StockCommand::DeductAt {
        reply.expires_at = None;
    }
    let status = status_for(command, reply.code);
    match &reply.allocation {
        None => json(status, &outcome_body(&reply)),
        Some(allocation) => json(
            status,
            &AllocationOutcomeBody {
                outcome: outcome_body(&reply),
                allocation: allocation
                    .iter()
                    .map(|(location, units)| LocationGave {
                        // Locations are ASCII: the script took only names
                        // that passed Location::parse.
                        location: std::str::from_utf8(location).unwrap_or(""),
                        units: *units,
                    })
                    .collect(),
            },
        ),
    }
}

/// The body of a business outcome of one line.
fn outcome_body(reply: &StockReply) -> OutcomeBody<'_> {
    OutcomeBody {
        code: reply.code as i64,
        remain: reply.remain,
        order_no: std::str::from_utf8(&reply.order_no).unwrap_or(""),
        duplicate: (reply.code == Code::Duplicate).then_some(true),
        revoked: (reply.code == Code::Revoked).then_some(true),
        expired: (reply.code == Code::Expired).then_some(true),
        version: reply.version,
        expires_at: reply.expires_at,
        reason: reply
            .reason
            .as_deref()
            .and_then(|r| std::str::from_utf8(r).ok()),
    }
}

fn respond_order(command: StockCommand, result: Result<OrderReply, UpstreamError>) -> Response {
    let reply = match result {
        Ok(reply) => reply,
        Err(fault) => return fault_response(&fault),
    };
    fn text(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap_or("")
    }
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
            Body::from(bytes),
        )
            .into_response(),
        Err(err) => {
            tracing::error!(%err, "response failed to serialize");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(r#"{"error":"internal error: the response could not be serialized"}"#),
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
