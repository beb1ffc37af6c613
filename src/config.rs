//! Command line and environment (`STOCKGATE_*`), validated into one
//! [`Config`] before anything binds or connects.

use crate::auth::{Password, UserSpec};
use crate::keys::KeyLayout;
use crate::redact::SecretUrl;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The shortest `--retry-window` stockgate accepts.
pub const MIN_RETRY_WINDOW: Duration = Duration::from_secs(60);

/// Largest `--max-qty`: the script does arithmetic in Lua doubles, exact
/// up to 2^53.
pub const MAX_MAX_QTY: u64 = 1_000_000_000_000_000;

/// Most DEDUCTs one coalesced call may carry (`--coalesce-deducts`): a
/// script blocks Redis while it runs, about 10 µs per deduction on the
/// benchmark's machine, so 256 of them hold it for some 2.5 ms.
pub const MAX_COALESCE: usize = 256;

#[derive(Debug, Parser)]
#[command(
    name = "stockgate",
    version,
    about = "Retry-safe stock deduction on Redis: DEDUCT over RESP becomes one atomic, idempotent Lua call"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve DEDUCT on --listen, in front of the Redis given by --upstream.
    Serve(ServeArgs),
    /// Start a throwaway 3-primary Redis Cluster on loopback, seed demo SKUs,
    /// and serve DEDUCT in front of it until Ctrl-C.
    Dev(DevArgs),
    /// Check the upstream before a deploy: version, cluster state, slots,
    /// scripts, key slots, eviction policy, timeouts. Exits 1 on any FAIL.
    Check(CheckArgs),
    /// Load or dump stock in bulk (CSV `sku,qty`).
    #[command(subcommand)]
    Stock(StockAction),
    /// The books: each SKU's journal of changes, moved into PostgreSQL,
    /// MySQL or MariaDB.
    #[command(subcommand)]
    Journal(JournalAction),
    /// Compare every SKU's stock and held units in Redis with its account
    /// in the books' database plus the entries not moved yet. Exits 0 when
    /// all agree, 1 on drift, 2 when it could not check.
    Reconcile(ReconcileArgs),
}

#[derive(Debug, Subcommand)]
pub enum JournalAction {
    /// Move journal entries into the books' database, exactly once, and
    /// trim what the database holds; runs until SIGTERM or SIGINT.
    Sink(SinkArgs),
    /// Delete the journals that hold no entry and unlist their SKUs, once
    /// no sidecar has the journal on (docs/books.md, Turning the journal
    /// off). Exits 0 when every journal is gone, 1 when some still hold
    /// entries the sink has not moved.
    Retire(RetireArgs),
}

#[derive(Debug, Args)]
pub struct RetireArgs {
    /// Only these SKUs (repeat the flag); every SKU with a journal when
    /// absent.
    #[arg(long = "sku")]
    pub skus: Vec<String>,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

/// Where the books are: a PostgreSQL URL with its TLS settings as libpq
/// reads them, or a MySQL/MariaDB URL with the MySQL client's
/// (docs/books.md, "TLS to the database").
#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// postgres://user[:password]@host[:port]/dbname[?sslmode=verify-full&sslrootcert=<ca.pem>|system&sslcert=<file>&sslkey=<file>],
    /// or mysql://user[:password]@host[:port]/database[?ssl-mode=VERIFY_IDENTITY&ssl-ca=<ca.pem>|system&ssl-cert=<file>&ssl-key=<file>]
    /// (mariadb:// alike). A host other than loopback must name its TLS mode
    /// (sslmode=disable or ssl-mode=DISABLED to mean plaintext).
    #[arg(long, env = "STOCKGATE_DATABASE", hide_env_values = true)]
    pub database: SecretUrl,

    /// Keep the books in this schema (created if missing; in MySQL and
    /// MariaDB a schema is a database): its tables, its migrations record
    /// and its sinks' locks, apart from another deployment's sharing the
    /// database. Default: where the URL's session puts them, as before.
    #[arg(long, env = "STOCKGATE_DATABASE_SCHEMA")]
    pub database_schema: Option<String>,
}

#[derive(Debug, Args)]
pub struct SinkArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Where /metrics and /healthz listen.
    #[arg(
        long,
        env = "STOCKGATE_SINK_ADMIN_LISTEN",
        default_value = "127.0.0.1:9391"
    )]
    pub admin_listen: SocketAddr,

    /// Most entries one PostgreSQL transaction carries.
    #[arg(long, env = "STOCKGATE_SINK_BATCH", default_value_t = 1000)]
    pub batch: usize,

    /// How long to wait after a round that found nothing to move.
    #[arg(long, env = "STOCKGATE_SINK_POLL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub poll: Duration,

    /// Move what is there, then stop (0 when a round found nothing left;
    /// 1 on a fault) instead of running until a signal: for a
    /// walkthrough, or a catch-up before a cut-over.
    #[arg(long)]
    pub drain: bool,

    /// Move only entries at least this many replicas confirmed (a WAIT
    /// after each read): an entry a failover then loses from Redis is
    /// never in the database. 0: move what the primary has.
    #[arg(long, env = "STOCKGATE_WAIT_REPLICAS", default_value_t = 0)]
    pub wait_replicas: u32,

    /// How long that WAIT may take; below --timeout.
    #[arg(long, env = "STOCKGATE_WAIT_TIMEOUT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub wait_timeout: Duration,

    #[arg(long, env = "STOCKGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Only these SKUs (repeat the flag); every SKU with a journal or an
    /// account when absent.
    #[arg(long = "sku")]
    pub skus: Vec<String>,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

#[derive(Debug, Subcommand)]
pub enum StockAction {
    /// Load `sku,qty` rows from a CSV file into Redis, pipelined by slot.
    Import(ImportArgs),
    /// Write every sku's stock under the key prefix as `sku,qty` CSV.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The CSV file: a `sku,qty` row per SKU that keeps one number, a
    /// `sku,qty,location[,floor]` row per location of a SKU kept by location
    /// (as `stock export` writes them), an optional header naming the columns.
    pub file: PathBuf,

    /// Check every row and report, but write nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Slots written at once (each slot's rows one call after another, in
    /// file order).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,

    /// Write each row as a STOCK.SET that journals a `set` entry, where the
    /// SKU's account starts in the books (docs/books.md); plain SETs, which
    /// journal nothing, when false. Follows the sidecars' own
    /// `STOCKGATE_JOURNAL`.
    #[arg(long, env = "STOCKGATE_JOURNAL", default_value_t = false, action = clap::ArgAction::Set)]
    pub journal: bool,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The users file the sidecars read: each user's rights, SKU prefixes
    /// and how many passwords it has are shown (never a password).
    #[arg(long, env = "STOCKGATE_USERS_FILE")]
    pub users_file: Option<PathBuf>,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Where to write the CSV (standard output when absent).
    #[arg(long)]
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub redis: RedisArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UpstreamMode {
    /// Ask the first reachable seed (`INFO cluster`).
    Auto,
    Cluster,
    Standalone,
}

/// How stockgate calls its scripts (`src/script.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScriptCalls {
    /// FCALL of stockgate's function library where every primary takes it
    /// (Redis 7.0+, Valkey 7.2+, an ACL allowing FUNCTION LOAD and FCALL),
    /// EVALSHA otherwise.
    Auto,
    /// FCALL only: not ready while a primary refuses the library.
    Function,
    /// EVALSHA only: no library is loaded.
    Eval,
}

/// What a DEDUCT of a sku with no stock key gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MissingStock {
    /// An `UNKNOWNSKU` error reply: a missing key is a data fault.
    Error,
    /// Code 2 with remain 0: a missing key means no stock.
    Zero,
}

impl MissingStock {
    /// The script's ARGV spelling.
    pub fn as_arg(self) -> &'static str {
        match self {
            MissingStock::Error => "error",
            MissingStock::Zero => "zero",
        }
    }
}

/// Which requests get an access-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccessLog {
    /// Every DEDUCT and REVERT.
    All,
    /// Only those that ended in a system fault.
    Errors,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Where Redis is.
#[derive(Debug, Args, Clone)]
pub struct UpstreamArgs {
    /// Redis seed URLs, comma-separated: redis://[user:password@]host:port
    /// or rediss:// for TLS.
    #[arg(
        long,
        env = "STOCKGATE_UPSTREAM",
        hide_env_values = true,
        value_delimiter = ',',
        required = true
    )]
    pub upstream: Vec<SecretUrl>,

    /// Cluster or a single non-cluster Redis; `auto` asks the first seed.
    #[arg(long, env = "STOCKGATE_UPSTREAM_MODE", value_enum, default_value_t = UpstreamMode::Auto)]
    pub upstream_mode: UpstreamMode,

    /// How scripts are called: `function` (FCALL of one function library,
    /// loaded on every primary), `eval` (EVALSHA), or `auto`: FCALL where
    /// the servers and the ACL allow it, EVALSHA elsewhere.
    #[arg(long, env = "STOCKGATE_SCRIPTS", value_enum, default_value_t = ScriptCalls::Auto)]
    pub scripts: ScriptCalls,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub upstream: UpstreamArgs,

    #[command(flatten)]
    pub proxy: ProxyArgs,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// How many primaries the throwaway cluster gets.
    #[arg(long, default_value_t = 3)]
    pub masters: usize,

    /// The redis-server binary to run.
    #[arg(long, env = "STOCKGATE_REDIS_SERVER", default_value = "redis-server")]
    pub redis_server: PathBuf,

    /// The books' database URL, to print with the commands that move the
    /// journal there and reconcile (`deploy/dev.sh --postgres` and
    /// `--mysql` pass the one they start). Connects to nothing itself.
    #[arg(long, value_name = "URL")]
    pub books: Option<SecretUrl>,

    #[command(flatten)]
    pub proxy: ProxyArgs,
}

/// How stockgate names keys and talks to Redis: every command that reaches
/// Redis shares these.
#[derive(Debug, Args, Clone)]
pub struct RedisArgs {
    /// First part of every key stockgate builds: <prefix>:{<sku>}.
    #[arg(long, env = "STOCKGATE_KEY_PREFIX", default_value = "stock")]
    pub key_prefix: String,

    /// Overall deadline of one request to Redis, retries and redirects
    /// included. Past it the caller gets an UPSTREAM error.
    #[arg(long, env = "STOCKGATE_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// CA certificate (PEM) that signs the Redis servers' certificates, for
    /// rediss:// upstreams; the system's roots when absent.
    #[arg(long, env = "STOCKGATE_UPSTREAM_TLS_CA")]
    pub upstream_tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for Redis servers that require one
    /// (tls-auth-clients yes); needs --upstream-tls-key.
    #[arg(
        long,
        env = "STOCKGATE_UPSTREAM_TLS_CERT",
        requires = "upstream_tls_key"
    )]
    pub upstream_tls_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "STOCKGATE_UPSTREAM_TLS_KEY",
        requires = "upstream_tls_cert"
    )]
    pub upstream_tls_key: Option<PathBuf>,

    /// Deadline for opening one connection to a Redis node.
    #[arg(long, env = "STOCKGATE_CONNECT_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
}

/// The flags `serve` and `dev` share.
#[derive(Debug, Args, Clone)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub redis: RedisArgs,

    /// RESP address the applications connect to.
    #[arg(long, env = "STOCKGATE_LISTEN", default_value = "127.0.0.1:6390")]
    pub listen: SocketAddr,

    /// Serve the HTTP/JSON API (POST /v1/deduct, /v1/revert, /v1/hold,
    /// /v1/confirm) here. Off
    /// unless given; the bare flag means 127.0.0.1:8390.
    #[arg(long, env = "STOCKGATE_HTTP_LISTEN", num_args = 0..=1, default_missing_value = "127.0.0.1:8390")]
    pub http_listen: Option<SocketAddr>,

    /// HTTP connections served at once, counted from their accept (a TLS
    /// one's handshake included). Past it no connection is accepted until
    /// one closes: the next wait in the kernel's listen queue.
    #[arg(long, env = "STOCKGATE_HTTP_MAX_CONNECTIONS", default_value_t = 1024)]
    pub http_max_connections: usize,

    /// HTTP address of /metrics, /healthz and /readyz.
    #[arg(long, env = "STOCKGATE_ADMIN_LISTEN", default_value = "127.0.0.1:9390")]
    pub admin_listen: SocketAddr,

    /// TTL of every idempotency record. It must cover the callers' longest
    /// retry and compensation window (90s, 15m, 24h, 7d, ...).
    #[arg(long, env = "STOCKGATE_RETRY_WINDOW", default_value = "24h", value_parser = humantime::parse_duration)]
    pub retry_window: Duration,

    /// Largest qty one DEDUCT may take.
    #[arg(long, env = "STOCKGATE_MAX_QTY", default_value_t = 1_000_000)]
    pub max_qty: u64,

    /// Longest hold a HOLD may ask for (its ttl_ms): from 1s up. A hold's
    /// record lasts its ttl plus --retry-window.
    #[arg(long, env = "STOCKGATE_MAX_HOLD", default_value = "24h", value_parser = humantime::parse_duration)]
    pub max_hold: Duration,

    /// Most lines one ORDER or ORDER.HOLD may have (1 to 1000); the largest
    /// such order must fit in --max-request-bytes (checked at start).
    #[arg(long, env = "STOCKGATE_MAX_ORDER_LINES", default_value_t = 100)]
    pub max_order_lines: usize,

    /// How long the line holds of an ORDER begun by an older stockgate
    /// (intent kind D: lines held, then confirmed) last when this one
    /// resumes it, at most --max-hold, from 1s. Today's ORDERs take their
    /// lines with DEDUCT and hold nothing: this matters only across that
    /// upgrade.
    #[arg(long, env = "STOCKGATE_ORDER_LINE_HOLD", default_value = "5m", value_parser = humantime::parse_duration)]
    pub order_line_hold: Duration,

    /// Journal every change of stock or of a record's state: the script
    /// that makes a change appends an entry to the SKU's journal (a Redis
    /// stream under its hash tag) in the same atomic call, for `stockgate
    /// journal sink` to move into PostgreSQL. Off by default: nothing
    /// trims a journal but the sink, so turn it on with the sink running
    /// (docs/books.md).
    #[arg(long, env = "STOCKGATE_JOURNAL", default_value_t = false, action = clap::ArgAction::Set)]
    pub journal: bool,

    /// Run the hold sweeper, which gives back the expired holds of SKUs no
    /// request touches. Correctness never depends on it (every call on a
    /// SKU releases its expired holds first); with it off, such units come
    /// back only with the next call on their SKU (exactly once, however
    /// late). Orders left behind are recovered either way.
    #[arg(long, env = "STOCKGATE_SWEEPER", default_value_t = true, action = clap::ArgAction::Set)]
    pub sweeper: bool,

    /// Answer a DEDUCT on a sku seen short lately from one read (MGET of
    /// its stock, record and held units) when that read shows the script
    /// would refuse it: the same answer, at a fraction of Redis's cost (the
    /// sold-out tail of a flash sale). Off with --wait-replicas.
    #[arg(long, env = "STOCKGATE_SOLD_OUT_READS", default_value_t = true, action = clap::ArgAction::Set)]
    pub sold_out_reads: bool,

    /// Most DEDUCTs of one sku that may run as one script call: those
    /// waiting for its primary at the same moment (a hot sku) share the
    /// call's fixed cost, each with its own record and reply. 1 turns
    /// coalescing off.
    #[arg(long, env = "STOCKGATE_COALESCE_DEDUCTS", default_value_t = 32)]
    pub coalesce_deducts: usize,

    /// What a DEDUCT of a sku without a stock key gets.
    #[arg(long, env = "STOCKGATE_MISSING_STOCK", value_enum, default_value_t = MissingStock::Error)]
    pub missing_stock: MissingStock,

    /// Largest request one client may send, in bytes; bigger is a protocol
    /// error and closes the connection.
    #[arg(long, env = "STOCKGATE_MAX_REQUEST_BYTES", default_value_t = 64 * 1024)]
    pub max_request_bytes: usize,

    /// Requests one connection may have in flight; past it stockgate stops
    /// reading that connection until replies drain.
    #[arg(long, env = "STOCKGATE_MAX_PIPELINE", default_value_t = 1024)]
    pub max_pipeline: usize,

    /// How long in-flight requests get to finish after Ctrl-C or SIGTERM.
    #[arg(long, env = "STOCKGATE_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Confirm that each write (a deduction, a revert) reached this many
    /// replicas before answering: WAIT is sent after the script, on the same
    /// node, in one pipeline. Fewer in time is an UPSTREAM error (retry with
    /// the same request_id). 0 turns it off.
    #[arg(long, env = "STOCKGATE_WAIT_REPLICAS", default_value_t = 0)]
    pub wait_replicas: u32,

    /// How long WAIT may wait for the replicas (within --timeout).
    #[arg(long, env = "STOCKGATE_WAIT_TIMEOUT", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub wait_timeout: Duration,

    /// Password clients must give (AUTH, HELLO ... AUTH, or HTTP
    /// `Authorization: Bearer`). Prefer --requirepass-file or the
    /// environment: a flag shows in the process list.
    #[arg(
        long,
        env = "STOCKGATE_REQUIREPASS",
        hide_env_values = true,
        conflicts_with = "requirepass_file"
    )]
    pub requirepass: Option<String>,

    /// A file holding the client password (a trailing newline is ignored),
    /// e.g. a mounted Kubernetes Secret.
    #[arg(long, env = "STOCKGATE_REQUIREPASS_FILE")]
    pub requirepass_file: Option<PathBuf>,

    /// Named users with rights (TOML, see docs/operations.md#security):
    /// re-read on SIGHUP and when its content changes (checked every
    /// second). A file with a mistake is refused at start, and on a reload
    /// the users before it stay.
    #[arg(long, env = "STOCKGATE_USERS_FILE")]
    pub users_file: Option<PathBuf>,

    /// Serve the RESP and HTTP listeners over TLS (1.2 and 1.3) with this
    /// PEM certificate chain; needs --tls-key. Re-read when it changes.
    #[arg(long, env = "STOCKGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "STOCKGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates signed by this PEM CA (mTLS); a
    /// certificate whose name is a user of --users-file logs in as it.
    #[arg(long, env = "STOCKGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Listen on a non-loopback address without a client password. Without
    /// this flag stockgate refuses to, as Redis's protected mode does.
    #[arg(long, env = "STOCKGATE_ALLOW_UNAUTHENTICATED_REMOTE", action = clap::ArgAction::SetTrue)]
    pub allow_unauthenticated_remote: bool,

    /// Client connections served at once; one more is told `-ERR max number
    /// of clients reached` and closed.
    #[arg(long, env = "STOCKGATE_MAX_CLIENTS", default_value_t = 16_384)]
    pub max_clients: usize,

    /// Close a client connection idle this long (nothing sent, nothing in
    /// flight). 0 keeps idle connections open, as Redis does by default.
    #[arg(long, env = "STOCKGATE_IDLE_TIMEOUT", default_value = "0s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Allow STOCK.SET and STOCK.ADD, which change stock outside the order
    /// flow (restocking, corrections). Off by default.
    #[arg(long, env = "STOCKGATE_ADMIN_COMMANDS", action = clap::ArgAction::SetTrue)]
    pub admin_commands: bool,

    /// Refuse (code 3) time-ordered request_ids (ULID, UUIDv7) older than
    /// the retry window: their record may have expired.
    #[arg(long, env = "STOCKGATE_REJECT_STALE_IDS", action = clap::ArgAction::SetTrue)]
    pub reject_stale_ids: bool,

    /// Threads serving clients and Redis. 1 (the default) runs everything
    /// on one thread: the side-by-side benchmark measured 27% less CPU per
    /// DEDUCT than 2 threads at the same throughput, since a client's task
    /// and a node pipe's task then never wake each other across threads.
    /// A sidecar's CPU limit is usually one core or less anyway.
    #[arg(long, env = "STOCKGATE_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,

    /// Log format; `text` is for humans, `json` for collectors. The level
    /// comes from STOCKGATE_LOG (info by default; e.g. debug, or
    /// stockgate=debug,stockgate::access=info).
    #[arg(long, env = "STOCKGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// An access-log line (request_id, stock key, qty, code or error kind,
    /// latency) for every DEDUCT and REVERT, only the faulty ones, or none.
    #[arg(long, env = "STOCKGATE_ACCESS_LOG", value_enum, default_value_t = AccessLog::Errors)]
    pub access_log: AccessLog,
}

/// Where Redis is and how to talk to it.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub urls: Vec<SecretUrl>,
    pub mode: UpstreamMode,
    /// `--scripts`.
    pub scripts: ScriptCalls,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// `--wait-replicas`, when on.
    pub durability: Option<Durability>,
    /// Certificates for rediss:// upstreams, from the --upstream-tls-* files.
    pub tls: Option<TlsFiles>,
}

/// The upstream TLS material; `Debug` never shows it (a client key is a
/// secret).
#[derive(Clone)]
pub struct TlsFiles(pub redis::TlsCertificates);

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TlsFiles {{ ca: {}, client certificate: {} }}",
            self.0.root_cert.is_some(),
            self.0.client_tls.is_some()
        )
    }
}

/// How many replicas must confirm a write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    pub replicas: u32,
    pub timeout: Duration,
}

/// Everything the proxy needs, checked.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub http_listen: Option<SocketAddr>,
    pub http_max_connections: usize,
    pub upstream: UpstreamConfig,
    pub keys: KeyLayout,
    pub retry_window: Duration,
    pub max_qty: u64,
    pub max_hold: Duration,
    pub max_order_lines: usize,
    /// `--order-line-hold`, at most `--max-hold`.
    pub order_line_hold: Duration,
    /// `--journal`: every change appended to its SKU's journal.
    pub journal: bool,
    pub sweeper: bool,
    pub sold_out_reads: bool,
    pub coalesce_deducts: usize,
    pub missing_stock: MissingStock,
    pub max_request_bytes: usize,
    pub max_pipeline: usize,
    pub shutdown_grace: Duration,
    pub admin_commands: bool,
    pub reject_stale_ids: bool,
    pub access_log: AccessLog,
    /// The password clients must give; none means no authentication.
    pub password: Option<Password>,
    /// `--users-file`, as read at start.
    pub users: Option<UsersFile>,
    /// `--tls-cert`, `--tls-key`, `--tls-client-ca`: TLS on the listeners.
    pub tls: Option<ListenerTls>,
    pub max_clients: usize,
    /// Close connections idle this long; `None` never does.
    pub idle_timeout: Option<Duration>,
}

impl RedisArgs {
    /// Checks the upstream URLs, timeouts and key prefix.
    pub fn validate(self, upstream: UpstreamArgs) -> Result<(UpstreamConfig, KeyLayout), String> {
        if self.timeout < Duration::from_millis(1)
            || self.connect_timeout < Duration::from_millis(1)
        {
            return Err("--timeout and --connect-timeout must be at least 1ms".into());
        }
        if upstream.upstream.is_empty() {
            return Err("--upstream needs at least one redis:// or rediss:// URL".into());
        }
        for url in &upstream.upstream {
            let text = url.expose();
            if !(text.starts_with("redis://") || text.starts_with("rediss://")) {
                return Err(format!(
                    "--upstream {url:?} is not a redis:// or rediss:// URL (the list is \
                     comma-separated: a password's `,` is %2C)"
                ));
            }
        }
        for url in &upstream.upstream {
            crate::redact::check_userinfo(url.expose())
                .map_err(|why| format!("--upstream {url}: {why}"))?;
        }
        let keys = KeyLayout::new(&self.key_prefix).map_err(|e| format!("--key-prefix: {e}"))?;
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
        };
        let tls = if self.upstream_tls_ca.is_some() || self.upstream_tls_cert.is_some() {
            let client_tls = match (&self.upstream_tls_cert, &self.upstream_tls_key) {
                (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                    client_cert: read("--upstream-tls-cert", cert)?,
                    client_key: read("--upstream-tls-key", key)?,
                }),
                _ => None,
            };
            let root_cert = match &self.upstream_tls_ca {
                Some(ca) => Some(read("--upstream-tls-ca", ca)?),
                None => None,
            };
            Some(TlsFiles(redis::TlsCertificates {
                client_tls,
                root_cert,
            }))
        } else {
            None
        };
        if tls.is_some()
            && !upstream
                .upstream
                .iter()
                .all(|u| u.expose().starts_with("rediss://"))
        {
            return Err("--upstream-tls-* need rediss:// upstream URLs".into());
        }
        let config = UpstreamConfig {
            urls: upstream.upstream,
            mode: upstream.upstream_mode,
            scripts: upstream.scripts,
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            durability: None,
            tls,
        };
        Ok((config, keys))
    }
}

impl ProxyArgs {
    /// Checks every value and says what is wrong and why it matters.
    pub fn validate(self, upstream: UpstreamArgs) -> Result<Config, String> {
        if self.retry_window < MIN_RETRY_WINDOW {
            return Err(format!(
                "--retry-window {} is shorter than 1 minute. Every idempotency record lives this long; \
                 a retry that arrives after its record expired is deducted again. Set it to cover the \
                 callers' longest retry and compensation window (24h when payment callbacks can be a day late).",
                humantime::format_duration(self.retry_window)
            ));
        }
        if self.retry_window.as_millis() > i64::MAX as u128 {
            return Err("--retry-window is too long".into());
        }
        if !(1..=MAX_MAX_QTY).contains(&self.max_qty) {
            return Err(format!(
                "--max-qty must be from 1 to {MAX_MAX_QTY} (the script's arithmetic is exact up to 2^53)"
            ));
        }
        if self.max_hold < Duration::from_secs(1)
            || self.max_hold > Duration::from_secs(366 * 86_400)
        {
            return Err(format!(
                "--max-hold {} must be from 1s to 366d: HOLD's ttl_ms runs from 1000 to it",
                humantime::format_duration(self.max_hold)
            ));
        }
        if self.order_line_hold < Duration::from_secs(1) {
            return Err(format!(
                "--order-line-hold {} must be at least 1s, as any hold's",
                humantime::format_duration(self.order_line_hold)
            ));
        }
        // Shorter than the saga's budget is allowed (a `--max-hold` below it
        // always was): a saga slower than its lines' hold then finds a line
        // run out, and the order aborts with 5, every line given back.
        let order_line_hold = self.order_line_hold.min(self.max_hold);
        if !(1..=1000).contains(&self.max_order_lines) {
            return Err(format!(
                "--max-order-lines {} must be from 1 to 1000",
                self.max_order_lines
            ));
        }
        if !(1..=MAX_COALESCE).contains(&self.coalesce_deducts) {
            return Err(format!(
                "--coalesce-deducts {} must be from 1 (off) to {MAX_COALESCE}: one call blocks Redis for all of them",
                self.coalesce_deducts
            ));
        }
        if !(512..=16 * 1024 * 1024).contains(&self.max_request_bytes) {
            return Err("--max-request-bytes must be from 512 to 16777216".into());
        }
        // Every order the flag allows must reach stockgate whole over RESP
        // (HTTP's body limit follows the flag: `http::order_body_limit`).
        let largest_order =
            largest_order_request(self.max_order_lines, self.max_qty, self.max_hold);
        if largest_order > self.max_request_bytes {
            return Err(format!(
                "--max-order-lines {} needs --max-request-bytes {largest_order} or more, not {}: \
                 an ORDER.HOLD of that many lines, with skus and request_id of 128 bytes and \
                 qty up to --max-qty, takes that many bytes; raise --max-request-bytes, or \
                 lower --max-order-lines",
                self.max_order_lines, self.max_request_bytes
            ));
        }
        if self.max_pipeline == 0 {
            return Err("--max-pipeline must be at least 1".into());
        }
        if self.wait_replicas > 0 && self.wait_timeout >= self.redis.timeout {
            return Err(format!(
                "--wait-timeout ({}) must be shorter than --timeout ({}): WAIT runs within the request's deadline",
                humantime::format_duration(self.wait_timeout),
                humantime::format_duration(self.redis.timeout)
            ));
        }
        let password = match (&self.requirepass, &self.requirepass_file) {
            (Some(pw), _) => Password::new(pw.as_bytes()),
            (None, Some(path)) => {
                let text = std::fs::read(path)
                    .map_err(|e| format!("--requirepass-file {}: {e}", path.display()))?;
                let trimmed = text.strip_suffix(b"\n").unwrap_or(&text);
                let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
                Some(Password::new(trimmed).ok_or("--requirepass-file is empty")?)
            }
            (None, None) => None,
        };
        let users = self
            .users_file
            .as_deref()
            .map(UsersFile::read)
            .transpose()?;
        if let Some(file) = &users {
            // Both naming `default` is refused here, not first at start.
            crate::auth::Users::new(password.clone(), Some(file.users.clone()))
                .map_err(|e| format!("--users-file {}: {e}", file.path.display()))?;
        }
        // Protected mode, as Redis has it: a stock service reachable from
        // the network without a password lets anyone deduct.
        if password.is_none() && users.is_none() && !self.allow_unauthenticated_remote {
            let exposed = std::iter::once(("--listen", self.listen))
                .chain(self.http_listen.map(|a| ("--http-listen", a)))
                .find(|(_, addr)| !addr.ip().is_loopback());
            if let Some((flag, addr)) = exposed {
                return Err(format!(
                    "refusing to serve {flag} {addr} without a client password: anyone who can reach it \
                     could deduct stock. Set --requirepass-file (or --requirepass), listen on a loopback \
                     address, or pass --allow-unauthenticated-remote if the network is trusted"
                ));
            }
        }
        if self.http_max_connections == 0 {
            return Err("--http-max-connections must be at least 1".into());
        }
        if self.max_clients == 0 {
            return Err("--max-clients must be at least 1".into());
        }
        let (mut upstream, keys) = self.redis.validate(upstream)?;
        upstream.durability = (self.wait_replicas > 0).then_some(Durability {
            replicas: self.wait_replicas,
            timeout: self.wait_timeout,
        });
        Ok(Config {
            listen: self.listen,
            admin_listen: self.admin_listen,
            http_listen: self.http_listen,
            http_max_connections: self.http_max_connections,
            upstream,
            keys,
            retry_window: self.retry_window,
            max_qty: self.max_qty,
            max_hold: self.max_hold,
            max_order_lines: self.max_order_lines,
            order_line_hold,
            journal: self.journal,
            sweeper: self.sweeper,
            sold_out_reads: self.sold_out_reads,
            coalesce_deducts: self.coalesce_deducts,
            missing_stock: self.missing_stock,
            max_request_bytes: self.max_request_bytes,
            max_pipeline: self.max_pipeline,
            shutdown_grace: self.shutdown_grace,
            admin_commands: self.admin_commands,
            reject_stale_ids: self.reject_stale_ids,
            access_log: self.access_log,
            password,
            users,
            tls: match (self.tls_cert, self.tls_key) {
                (Some(cert), Some(key)) => Some(ListenerTls {
                    cert,
                    key,
                    client_ca: self.tls_client_ca,
                }),
                _ => None,
            },
            max_clients: self.max_clients,
            idle_timeout: (!self.idle_timeout.is_zero()).then_some(self.idle_timeout),
        })
    }
}

impl Config {
    /// A configuration for tests and embedding: loopback listeners on free
    /// ports and every default, in front of `upstream`.
    pub fn for_upstream(urls: Vec<String>) -> Config {
        let args = ProxyArgs::parse_from_defaults();
        let upstream = UpstreamArgs {
            upstream: urls.into_iter().map(SecretUrl::from).collect(),
            upstream_mode: UpstreamMode::Auto,
            scripts: ScriptCalls::Auto,
        };
        let mut config = args.validate(upstream).expect("defaults are valid");
        config.listen = "127.0.0.1:0".parse().expect("literal address");
        config.admin_listen = "127.0.0.1:0".parse().expect("literal address");
        config
    }
}

/// The most bytes a valid ORDER.HOLD of `lines` lines (ORDER with a
/// ttl_ms: the longer of the two) takes as a RESP request: its
/// request_id and skus as long as a token may be, its ttl_ms and qtys of
/// as many digits as `--max-hold` and `--max-qty` allow.
fn largest_order_request(lines: usize, max_qty: u64, max_hold: Duration) -> usize {
    let digits = |n: u64| n.checked_ilog10().map_or(1, |log| log as usize + 1);
    // `*N\r\n` or `$N\r\n`, and a bulk of `len` bytes after its header.
    let header = |n: usize| 1 + digits(n as u64) + 2;
    let bulk = |len: usize| header(len) + len + 2;
    let token = bulk(crate::params::MAX_FIELD_LEN);
    let max_hold_ms = u64::try_from(max_hold.as_millis()).unwrap_or(u64::MAX);
    header(3 + 2 * lines)
        + bulk("ORDER.HOLD".len())
        + token
        + bulk(digits(max_hold_ms))
        + lines * (token + bulk(digits(max_qty)))
}

/// The files of the listeners' TLS.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl ListenerTls {
    /// The files, in the order they are read: cert, key, client CA.
    pub fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key].into_iter().chain(&self.client_ca)
    }
}

/// The users file and the users it held when read.
#[derive(Debug, Clone)]
pub struct UsersFile {
    pub path: PathBuf,
    pub users: Vec<UserSpec>,
}

impl UsersFile {
    /// Reads and checks the file; the error names the file and the line.
    pub fn read(path: &std::path::Path) -> Result<UsersFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--users-file {}: {e}", path.display()))?;
        let users = crate::auth::file::parse(&text)
            .map_err(|e| format!("--users-file {}: {e}", path.display()))?;
        Ok(UsersFile {
            path: path.to_owned(),
            users,
        })
    }
}

impl ProxyArgs {
    /// The defaults, as if no flag and no environment variable were given.
    fn parse_from_defaults() -> ProxyArgs {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            proxy: ProxyArgs,
        }
        // Parse without the environment, so a STOCKGATE_* variable in the
        // test's environment can't change the defaults.
        let mut cmd = <Only as clap::CommandFactory>::command();
        for arg in cmd
            .get_arguments()
            .map(|a| a.get_id().clone())
            .collect::<Vec<_>>()
        {
            cmd = cmd.mut_arg(arg, |a| a.env(None::<&str>));
        }
        let matches = cmd
            .try_get_matches_from(["stockgate"])
            .expect("defaults parse");
        <Only as clap::FromArgMatches>::from_arg_matches(&matches)
            .expect("defaults parse")
            .proxy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["stockgate", "serve", "--upstream", "redis://127.0.0.1:7000"];
        argv.extend_from_slice(extra);
        let Cli {
            command: Command::Serve(serve),
        } = Cli::try_parse_from(argv).map_err(|e| e.to_string())?
        else {
            unreachable!("serve was given")
        };
        serve.proxy.validate(serve.upstream)
    }

    #[test]
    fn retry_window_accepts_human_durations() {
        for (text, secs) in [("90s", 90), ("15m", 900), ("24h", 86_400), ("7d", 604_800)] {
            let config = args(&["--retry-window", text]).unwrap();
            assert_eq!(config.retry_window, Duration::from_secs(secs));
        }
    }

    #[test]
    fn a_retry_window_under_a_minute_is_refused_with_the_reason() {
        let err = args(&["--retry-window", "59s"]).unwrap_err();
        assert!(err.contains("shorter than 1 minute"), "{err}");
        assert!(err.contains("deducted again"), "{err}");
    }

    #[test]
    fn defaults() {
        let config = args(&[]).unwrap();
        assert_eq!(config.retry_window, Duration::from_secs(86_400));
        assert_eq!(config.keys.prefix(), "stock");
        assert_eq!(config.max_qty, 1_000_000);
        assert_eq!(config.missing_stock, MissingStock::Error);
        assert!(config.listen.ip().is_loopback());
        assert_eq!(
            Config::for_upstream(vec!["redis://x:1".into()]).max_qty,
            1_000_000
        );
    }

    #[test]
    fn an_orders_line_holds_fit_max_hold() {
        assert_eq!(args(&[]).unwrap().order_line_hold, Duration::from_secs(300));
        let config = args(&["--order-line-hold", "1h", "--max-hold", "10m"]).unwrap();
        assert_eq!(config.order_line_hold, Duration::from_secs(600));
        let config = args(&["--max-hold", "4s"]).unwrap();
        assert_eq!(config.order_line_hold, Duration::from_secs(4));
        let err = args(&["--order-line-hold", "500ms"]).unwrap_err();
        assert!(err.contains("at least 1s"), "{err}");
    }

    #[test]
    fn the_largest_order_the_flag_allows_fits_a_request() {
        // The largest valid ORDER.HOLD, written as a client writes it,
        // against the formula: a request of exactly that size is framed,
        // one byte less of room refuses it.
        let (lines, max_qty, max_hold) = (3, 1_000_000, Duration::from_secs(86_400));
        let token = "k".repeat(crate::params::MAX_FIELD_LEN);
        let mut order = vec![
            "ORDER.HOLD".to_owned(),
            token.clone(),
            max_hold.as_millis().to_string(),
        ];
        for _ in 0..lines {
            order.extend([token.clone(), max_qty.to_string()]);
        }
        let mut request = format!("*{}\r\n", order.len());
        for arg in &order {
            request += &format!("${}\r\n{arg}\r\n", arg.len());
        }
        let size = largest_order_request(lines, max_qty, max_hold);
        assert_eq!(size, request.len());
        use tokio_util::codec::Decoder;
        let framed = crate::frame::RequestDecoder::new(size)
            .decode(&mut bytes::BytesMut::from(request.as_bytes()))
            .unwrap()
            .expect("the whole request");
        assert_eq!(framed.args.len(), order.len());
        assert!(
            crate::frame::RequestDecoder::new(size - 1)
                .decode(&mut bytes::BytesMut::from(request.as_bytes()))
                .is_err()
        );

        // At start: the default 100 lines fit the default 64 KiB; 1000
        // lines need more, and say how much.
        assert!(args(&[]).is_ok());
        let err = args(&["--max-order-lines", "1000"]).unwrap_err();
        let needed = largest_order_request(1000, 1_000_000, Duration::from_secs(86_400));
        assert!(
            err.contains(&format!(
                "--max-order-lines 1000 needs --max-request-bytes {needed}"
            )),
            "{err}"
        );
        // docs/operations.md's figures, with the other defaults.
        assert!(args(&["--max-order-lines", "438"]).is_ok());
        assert!(args(&["--max-order-lines", "439"]).is_err());
        assert_eq!(needed, 149_174);
        assert_eq!(
            largest_order_request(100, 1_000_000, Duration::from_secs(86_400)),
            15_073
        );
        let enough = needed.to_string();
        let config = args(&["--max-order-lines", "1000", "--max-request-bytes", &enough]).unwrap();
        assert_eq!(config.max_order_lines, 1000);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(args(&["--key-prefix", "a{b"]).is_err());
        assert!(args(&["--max-qty", "0"]).is_err());
        let err = Cli::try_parse_from(["stockgate", "serve", "--upstream", "http://x"])
            .map(|cli| match cli.command {
                Command::Serve(s) => s.proxy.validate(s.upstream),
                _ => unreachable!(),
            })
            .unwrap()
            .unwrap_err();
        assert!(err.contains("not a redis:// or rediss:// URL"), "{err}");
    }
}
