//! stockgate: retry-safe stock deduction on Redis.
//!
//! Legacy applications send `DEDUCT <sku> <qty> <request_id> [order_no]`
//! with the Redis client they already have. stockgate validates it, builds
//! both keys under one hash tag, and runs one atomic Lua script that checks
//! idempotency and changes stock, answering with a business code whose
//! meaning never changes: 0 ok, 1 duplicate, 2 insufficient stock,
//! 3 invalid parameters. System faults are error replies, never codes.
//!
//! # Layout
//!
//! In the order one DEDUCT flows from the socket to Redis and back:
//!
//! - [`server`]: listeners, the accept loop, graceful drain.
//! - [`state`]: what every connection and face shares.
//! - [`connection`]: one client; pipelined requests in, ordered replies out.
//! - [`transport`]: what a connection reads and writes, plain TCP or TLS:
//!   one socket per client either way.
//! - [`net`]: socket reads without the `recv` that only says "empty".
//! - [`frame`]: RESP framing of requests (bounded, flat).
//! - [`dispatch`]: the command table, the password gate, arity, dispatch.
//! - [`session`]: connection-level commands (HELLO, AUTH, CLIENT, INFO,
//!   COMMAND, PING, ...), answered on the spot.
//! - [`command`]: what a command is and who answers it; the connection's
//!   [`command::Session`] that the connection-level commands change.
//! - [`doc`]: what a command is (name, arity, arguments), as each command's
//!   own file describes it.
//! - [`stock`]: the stock service, one file per stock command (DEDUCT,
//!   REVERT, STOCK.*): validate, build keys, run the script, map the
//!   reply, record metrics.
//! - [`params`]: the parameter rules (sku, qty, request_id, order_no, ...).
//! - [`keys`]: the key layout and hash tags; cluster slots.
//! - [`record`]: the idempotency record's shapes, as Rust reads them.
//! - [`script`]: the embedded Lua scripts (`lua/`), with the state machine
//!   of a request in `lua/revert.lua`; the function library they make, and
//!   how a call is written (FCALL or EVALSHA).
//! - [`upstream`]: the Redis Cluster or standalone client, timeouts,
//!   NOSCRIPT and `Function not found` recovery, which way scripts are
//!   called, readiness.
//! - [`pipeline`]: the hot path to Redis, one pipelined connection per
//!   primary, falling back to [`upstream`]'s client on anything unusual.
//! - [`answer`]: Redis's replies as the node pipes read them (raw bytes).
//! - [`outcome`]: the business code table and the DEDUCT reply.
//! - [`reply`]: replies (and commands to Redis) written as exact RESP bytes.
//! - [`error`]: system faults, by source and whether a retry helps; Redis's
//!   error replies, read once into the code every decision reads.
//!
//! Around it:
//!
//! - [`config`]: flags and `STOCKGATE_*` variables, validated.
//! - [`redact`]: the one way a URL is printed, its password masked (logs,
//!   errors, INFO, `check`).
//! - [`logging`]: stderr through writer threads; the audit lines lossless.
//! - [`metrics`]: metric names and the Prometheus exposition.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`auth`]: who may log in (users, passwords) and what each may do
//!   (rights, SKU prefixes); the users file; failed-login throttling.
//! - [`http`]: the HTTP/JSON API, through the same stock service.
//! - [`tls`]: TLS on the RESP and HTTP listeners, reloaded as its files
//!   change; client certificates as users.
//! - [`dev`]: throwaway local Redis servers and clusters, and the upstream
//!   matrix they run (Redis 7.0 and 8.2, Valkey 8.0 and 9.1).
//! - [`bulk`]: `stockgate stock import|export`.
//! - [`journal`]: the books: each SKU's journal of changes, its entry
//!   shape, and how it reaches PostgreSQL, MySQL or MariaDB.
//! - [`check`]: `stockgate check`, the doctor.

pub mod admin;
pub mod answer;
pub mod auth;
pub mod bulk;
pub mod check;
pub mod command;
pub mod config;
pub mod connection;
pub mod dev;
pub mod dispatch;
pub mod doc;
pub mod error;
pub mod frame;
pub mod http;
pub mod journal;
pub mod keys;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod outcome;
pub mod params;
pub mod pipeline;
pub mod record;
pub mod redact;
pub mod reply;
pub mod script;
pub mod server;
pub mod session;
pub mod state;
pub mod stock;
pub mod tls;
pub mod transport;
pub mod upstream;
