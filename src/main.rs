//! The `stockgate` binary: parse the config, start logging, bind, and run
//! until a signal. See the crate docs (`src/lib.rs`) for the module map.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use stockgate::config::{
    CheckArgs, Cli, Command, Config, ExportArgs, ImportArgs, LogFormat, ProxyArgs, ScriptCalls,
    StockAction, UpstreamArgs, UpstreamMode,
};
use stockgate::dev::{LocalCluster, RedisOptions};
use stockgate::metrics::Metrics;
use stockgate::redact::SecretUrl;
use stockgate::server::{self, Server};
use stockgate::upstream::Upstream;

// The books' commands, apart so their imports stay together.
use stockgate::config::{JournalAction, ReconcileArgs, RetireArgs, SinkArgs};

fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_files_limit();
    let threads = match &cli.command {
        Command::Serve(args) => args.proxy.worker_threads,
        Command::Dev(args) => args.proxy.worker_threads,
        _ => 1,
    };
    // reconcile's exit code is its verdict: 2 also when it could not start.
    let could_not_check = matches!(cli.command, Command::Reconcile(_));
    // One thread: every task on one core, so a client's task and the Redis
    // connection's task never wake each other across threads.
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("stockgate: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<ExitCode, String> = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => {
                let _logs = init_logging(args.proxy.log_format);
                let config = args.proxy.validate(args.upstream)?;
                serve(config).await
            }
            Command::Dev(args) => {
                dev(args.proxy, args.masters, args.redis_server, args.books).await
            }
            Command::Check(args) => {
                let _logs = init_logging(LogFormat::Text);
                check(args).await
            }
            Command::Stock(StockAction::Import(args)) => {
                let _logs = init_logging(LogFormat::Text);
                import(args).await
            }
            Command::Stock(StockAction::Export(args)) => {
                let _logs = init_logging(LogFormat::Text);
                export(args).await
            }
            Command::Journal(JournalAction::Sink(args)) => {
                let _logs = init_logging(args.log_format);
                sink(args).await
            }
            Command::Journal(JournalAction::Retire(args)) => {
                let _logs = init_logging(LogFormat::Text);
                return retire(args).await;
            }
            Command::Reconcile(args) => {
                let _logs = init_logging(LogFormat::Text);
                return reconcile(args).await;
            }
        }
        .map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("stockgate: {err}");
            if could_not_check {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Logs go to stderr through a writer thread: the request path only
/// formats a line and queues it, and never waits on the terminal or the log
/// collector. When the queue is full, lines are dropped rather than slowing
/// requests down. Keep the guard alive: dropping it flushes the queue.
/// Raises the soft limit on open files to the hard limit. Container
/// runtimes start processes at 1,024, which would cap stockgate at about a
/// thousand clients (accept fails with EMFILE); the hard limit is what the
/// operator allowed.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Logs to stderr through writer threads: lossy for request-path lines,
/// lossless for the audit target (see `stockgate::logging`).
fn init_logging(format: LogFormat) -> stockgate::logging::LogGuards {
    stockgate::logging::init(format)
}

async fn serve(config: Config) -> Result<(), String> {
    let grace = config.shutdown_grace;
    let server = server::start(config).await.map_err(|e| e.to_string())?;
    let signal = wait_for_signal().await;
    stop(server, signal, grace).await;
    Ok(())
}

/// SIGTERM drains: readiness off, no new connections, every request
/// already read answered, then exit, within `grace`. SIGINT (Ctrl-C) stops
/// at once. A second signal during a drain exits at once too.
async fn stop(server: Server, signal: Signal, grace: Duration) {
    if signal == Signal::Interrupt {
        tracing::info!("SIGINT: stopping now");
        server.stop_now();
        return;
    }
    tracing::info!(grace = ?grace, "SIGTERM: draining; no new connections, answering requests already read");
    tokio::select! {
        finished = server.drain(grace) => {
            if finished {
                tracing::info!("drained; bye");
            }
        }
        _ = wait_for_signal() => tracing::warn!("second signal: exiting now"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Terminate,
    Interrupt,
}

async fn wait_for_signal() -> Signal {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    tokio::select! {
        _ = term.recv() => Signal::Terminate,
        _ = int.recv() => Signal::Interrupt,
    }
}

/// `stockgate dev`: a throwaway cluster, demo stock, and the proxy.
async fn dev(
    proxy: ProxyArgs,
    masters: usize,
    redis_server: std::path::PathBuf,
    books: Option<SecretUrl>,
) -> Result<(), String> {
    let _logs = init_logging(proxy.log_format);
    // The file holds the password only when --requirepass does not, as
    // validate reads them.
    let requirepass_file = proxy
        .requirepass_file
        .clone()
        .filter(|_| proxy.requirepass.is_none());
    let options = RedisOptions {
        redis_server,
        ..RedisOptions::default()
    };
    eprintln!("starting a throwaway {masters}-primary Redis Cluster on loopback...");
    let cluster = LocalCluster::start(masters, 0, &options).map_err(|e| e.to_string())?;
    let seeds: Vec<SecretUrl> = cluster.seeds().into_iter().map(SecretUrl::from).collect();
    let config = proxy.validate(UpstreamArgs {
        upstream: seeds.clone(),
        upstream_mode: UpstreamMode::Cluster,
        scripts: ScriptCalls::Auto,
    })?;
    let login = DevLogin::of(&config, requirepass_file);
    let mut conn = cluster.cluster_connection().map_err(|e| e.to_string())?;
    for (sku, stock) in DEMO_STOCK {
        let sku = stockgate::params::Sku::parse(sku.into()).expect("demo sku is valid");
        redis::cmd("SET")
            .arg(config.keys.stock_key(&sku))
            .arg(stock)
            .query::<()>(&mut conn)
            .map_err(|e| format!("seeding demo stock: {e}"))?;
    }
    let grace = config.shutdown_grace;
    let server = server::start(config).await.map_err(|e| e.to_string())?;
    if !server.wait_ready(Duration::from_secs(10)).await {
        return Err("the proxy did not become ready within 10s".into());
    }
    println!("{}", dev_banner(&server, &seeds, books.as_ref(), &login));
    let signal = wait_for_signal().await;
    stop(server, signal, grace).await;
    drop(cluster);
    eprintln!("cluster stopped");
    Ok(())
}

/// How the dev banner's commands log in, when `stockgate dev` was given
/// `--requirepass` (or its file) or `--users-file`: without a login they
/// would answer NOAUTH.
///
/// The banner never prints a password, not even the `--requirepass` the
/// operator typed: it may as well have come from `STOCKGATE_REQUIREPASS`,
/// and what the banner prints ends up in terminals' scrollback and CI
/// logs. It has redis-cli read the password from `REDISCLI_AUTH`, set by a
/// line with a placeholder to fill in, or by one that reads
/// `--requirepass-file` itself (a file's path is no secret); the commands
/// stay as they are, with no `-a`, which would put the password in the
/// shell's history and the process list too.
enum DevLogin {
    /// No password anywhere: every connection is `default`, every right.
    Open,
    /// `default`, with the password of `--requirepass`, or in this file.
    Requirepass(Option<PathBuf>),
    /// A user of `--users-file` who may send the banner's commands.
    User(String),
    /// No user of `--users-file` may: their commands would answer NOPERM.
    Nobody(PathBuf),
}

impl DevLogin {
    /// `--requirepass`'s `default` first (every right on every SKU);
    /// else the first user of the file, in its order, that has a password
    /// and may DEDUCT and REVERT the demo SKUs.
    fn of(config: &Config, requirepass_file: Option<PathBuf>) -> DevLogin {
        use stockgate::stock::StockCommand;
        if config.password.is_some() {
            return DevLogin::Requirepass(requirepass_file);
        }
        let Some(file) = &config.users else {
            return DevLogin::Open;
        };
        let may = |user: &stockgate::auth::UserSpec| {
            let rights = [StockCommand::Deduct, StockCommand::Revert]
                .iter()
                .all(|c| user.grant.rights.allows(c.describe().right));
            let skus = DEMO_STOCK
                .iter()
                .all(|(sku, _)| user.grant.allows_sku(sku.as_bytes()));
            !user.passwords.is_empty() && rights && skus
        };
        match file.users.iter().find(|u| may(u)) {
            Some(user) => DevLogin::User(user.name.clone()),
            None => DevLogin::Nobody(file.path.clone()),
        }
    }

    /// The "Try it" heading, and the line that gives redis-cli the
    /// password.
    fn heading(&self) -> String {
        let (who, password) = match self {
            DevLogin::Open => return "Try it:\n".into(),
            DevLogin::Requirepass(None) => (
                "as default".to_owned(),
                "'<the --requirepass password>'".to_owned(),
            ),
            DevLogin::Requirepass(Some(file)) => {
                // Absolute: dev.sh runs stockgate from the repository's root.
                let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
                let quoted = file.display().to_string().replace('\'', r"'\''");
                ("as default".to_owned(), format!("\"$(cat '{quoted}')\""))
            }
            DevLogin::User(name) => (
                format!("as {name} of --users-file"),
                format!("'<the password of {name}>'"),
            ),
            DevLogin::Nobody(file) => (
                format!(
                    "once a user of {} has a password and may DEDUCT and REVERT the demo SKUs \
                     (until then these answer NOAUTH or NOPERM)",
                    file.display()
                ),
                "'<its password>'".to_owned(),
            ),
        };
        format!("Try it, {who}:\n  export REDISCLI_AUTH={password}\n")
    }

    /// What each redis-cli command needs after `-p <port>`: the user to
    /// log in as, when it is not `default`.
    fn user_flag(&self) -> String {
        match self {
            DevLogin::User(name) => format!(" --user {name}"),
            DevLogin::Nobody(_) => " --user <user>".into(),
            DevLogin::Open | DevLogin::Requirepass(_) => String::new(),
        }
    }

    /// How an HTTP request logs in, when it must.
    fn bearer(&self) -> Option<String> {
        match self {
            DevLogin::Open => None,
            DevLogin::Requirepass(_) => Some("Bearer <password>".into()),
            DevLogin::User(name) => Some(format!("Bearer {name}:<password>")),
            DevLogin::Nobody(_) => Some("Bearer <user>:<password>".into()),
        }
    }
}

/// What `stockgate dev` seeds, and what its banner's commands take.
const DEMO_STOCK: [(&str, i64); 3] = [("demo-1", 100), ("demo-2", 5), ("demo-3", 0)];

/// What `stockgate dev` prints once it serves: where, what to type, and how
/// the other tools reach the same cluster. The README shows it, and its
/// test compares the two, so keep them in step. The request ids are the
/// README walkthrough's own (order-1001 to order-1003); other examples use
/// others, so everything the README and the docs/ pages show works on one
/// dev cluster. The URLs print as any URL does: a password in `--books`
/// shows as `***`, to be typed in by hand.
fn dev_banner(
    server: &Server,
    seeds: &[SecretUrl],
    books: Option<&SecretUrl>,
    login: &DevLogin,
) -> String {
    let cli = format!("redis-cli -p {}{}", server.addr.port(), login.user_flag());
    let seeds: Vec<String> = seeds.iter().map(ToString::to_string).collect();
    let mut text = format!(
        "\nstockgate is serving DEDUCT on {addr} in front of a local cluster ({seeds}).\n",
        addr = server.addr,
        seeds = seeds.join(", "),
    );
    if let Some(http) = server.http_addr {
        let auth = login
            .bearer()
            .map(|token| format!(", with Authorization: {token}"))
            .unwrap_or_default();
        text.push_str(&format!(
            "HTTP/JSON API: POST http://{http}/v1/deduct, /v1/revert, /v1/hold, /v1/confirm and /v1/orders{auth}.\n"
        ));
    }
    text.push_str(&format!(
        "Demo stock: {demo}. Metrics: http://{admin}/metrics\n\n\
         {heading}  \
           {cli} DEDUCT demo-1 2 order-1001 ORD-1001   # 0: deducted, remain 98\n  \
           {cli} DEDUCT demo-1 2 order-1001 ORD-1001   # 1: duplicate, nothing changed\n  \
           {cli} DEDUCT demo-3 1 order-1002            # 2: insufficient stock\n  \
           {cli} DEDUCT demo-1 0 order-1003            # 3: invalid qty\n  \
           {cli} REVERT demo-1 order-1001              # 0: given back, remain 100\n\n\
         For `stockgate check` and `stockgate stock import|export` in another terminal:\n  \
           export STOCKGATE_UPSTREAM={upstream}\n\n",
        demo = DEMO_STOCK
            .map(|(sku, stock)| format!("{sku} = {stock}"))
            .join(", "),
        admin = server.admin_addr,
        heading = login.heading(),
        upstream = seeds.join(","),
    ));
    if let Some(url) = books {
        // Here, not before cargo's output, where it scrolled away.
        text.push_str(&format!(
            "The journal is on; the books' database is {url}\n\
             To move the journal there and compare, in that terminal (docs/books.md):\n  \
               export STOCKGATE_DATABASE='{url}'\n  \
               stockgate journal sink --drain    # move what is journaled, then stop\n  \
               stockgate reconcile               # 0: Redis and the books agree\n\n"
        ));
    }
    text.push_str("Ctrl-C stops stockgate and the cluster.");
    text
}

/// Connects to Redis for a one-shot tool.
async fn connect(
    upstream: UpstreamArgs,
    redis: stockgate::config::RedisArgs,
) -> Result<(std::sync::Arc<Upstream>, stockgate::keys::KeyLayout), String> {
    let (config, keys) = redis.validate(upstream)?;
    let upstream = Upstream::new(
        config,
        vec![],
        std::sync::Arc::new(Metrics::new::<stockgate::stock::StockCommand>()),
    );
    upstream.connect_once().await?;
    Ok((upstream, keys))
}

/// `stockgate stock import <file.csv>`
async fn import(args: ImportArgs) -> Result<(), String> {
    let (upstream, keys) = connect(args.upstream, args.redis).await?;
    let writing = match (args.dry_run, args.journal) {
        (true, _) => stockgate::bulk::Writing::DryRun,
        (false, false) => stockgate::bulk::Writing::Plain,
        (false, true) => stockgate::bulk::Writing::Journaled,
    };
    let report =
        stockgate::bulk::import(&upstream, &keys, &args.file, writing, args.concurrency).await?;
    let secs = report.elapsed.as_secs_f64();
    eprintln!(
        "{}: {} rows read, {} {}, {} skipped as invalid, {} failed to write, in {secs:.1}s ({:.0} rows/s)",
        args.file.display(),
        report.rows,
        if args.dry_run {
            report.rows - report.invalid
        } else {
            report.written
        },
        if args.dry_run {
            "would be written (dry run)"
        } else {
            "written"
        },
        report.invalid,
        report.failed,
        report.rows as f64 / secs.max(0.001),
    );
    if report.is_clean() {
        Ok(())
    } else if args.dry_run {
        // Nothing is imported in a dry run, so say what a real run would do.
        Err("some rows would not be imported; see the lines above".into())
    } else {
        Err("some rows were not imported; see the lines above".into())
    }
}

/// `stockgate stock export`
async fn export(args: ExportArgs) -> Result<(), String> {
    let (upstream, keys) = connect(args.upstream, args.redis).await?;
    let exported = match &args.output {
        Some(path) => {
            let file =
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            stockgate::bulk::export(&upstream, &keys, std::io::BufWriter::new(file)).await?
        }
        None => stockgate::bulk::export(&upstream, &keys, std::io::stdout().lock()).await?,
    };
    if exported.located > 0 {
        eprintln!(
            "exported {} skus ({} kept by location, in {} rows)",
            exported.rows + exported.located,
            exported.located,
            exported.located_rows
        );
    } else {
        eprintln!("exported {} skus", exported.rows);
    }
    Ok(())
}

/// `stockgate check`
async fn check(args: CheckArgs) -> Result<(), String> {
    let timeout = args.redis.timeout;
    let (config, keys) = args.redis.validate(args.upstream)?;
    println!(
        "stockgate check: {}",
        config
            .urls
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let upstream = Upstream::new(
        config,
        vec![],
        std::sync::Arc::new(Metrics::new::<stockgate::stock::StockCommand>()),
    );
    let mut findings = match &args.users_file {
        Some(path) => stockgate::check::users(path),
        None => Vec::new(),
    };
    findings.extend(stockgate::check::run(&upstream, &keys, timeout).await);
    let count = |v| findings.iter().filter(|f| f.verdict == v).count();
    let (warns, fails) = (
        count(stockgate::check::Verdict::Warn),
        count(stockgate::check::Verdict::Fail),
    );
    println!(
        "{} checks: {} passed, {warns} warnings, {fails} failures",
        findings.len(),
        findings.len() - warns - fails
    );
    if fails > 0 {
        Err(format!("{fails} check(s) failed"))
    } else {
        Ok(())
    }
}

/// `stockgate journal sink`: until SIGTERM or SIGINT, which stop it
/// between statements (a transaction cut short rolls back; nothing was
/// trimmed for it).
async fn sink(args: SinkArgs) -> Result<(), String> {
    if args.batch == 0 || args.batch > 100_000 {
        return Err("--batch must be from 1 to 100000".into());
    }
    if args.poll < Duration::from_millis(1) {
        // An idle sink would ask Redis for nothing, as fast as it can.
        return Err("--poll must be at least 1ms".into());
    }
    let timeout = args.redis.timeout;
    let durability = (args.wait_replicas > 0).then_some(stockgate::config::Durability {
        replicas: args.wait_replicas,
        timeout: args.wait_timeout,
    });
    if durability.is_some() && args.wait_timeout >= timeout {
        return Err(format!(
            "--wait-timeout {} must be below --timeout {}: WAIT runs within the call's deadline",
            humantime::format_duration(args.wait_timeout),
            humantime::format_duration(timeout)
        ));
    }
    let database = stockgate::journal::database::Target::parse(args.database.database.expose())
        .map_err(|e| format!("--database {e}"))?
        .in_schema(args.database.database_schema)?;
    tracing::info!(
        database = database.shown(),
        schema = database.schema().unwrap_or("(the session's)"),
        tls = %database.tls().describe(),
        "the books' database"
    );
    let (upstream, keys) = connect(args.upstream, args.redis).await?;
    let metrics = std::sync::Arc::new(stockgate::metrics::JournalMetrics::new());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut sink = stockgate::journal::sink::Sink::new(
        stockgate::journal::sink::SinkConfig {
            database,
            batch: args.batch,
            poll: args.poll,
            durability,
        },
        keys,
        upstream.clone(),
        metrics.clone(),
    );
    sink.start().await.map_err(|e| e.to_string())?;
    if args.drain {
        let moved = sink.drain().await.map_err(|e| e.to_string())?;
        println!("moved {moved} entries; nothing left to move");
        return Ok(());
    }
    let admin = tokio::net::TcpListener::bind(args.admin_listen)
        .await
        .map_err(|e| format!("--admin-listen {}: {e}", args.admin_listen))?;
    let admin_addr = admin.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(upstream.clone().maintain(stop.clone()));
    tokio::spawn(stockgate::journal::sink::serve_admin(
        admin,
        metrics,
        stop.clone(),
    ));
    tracing::info!(admin = %admin_addr, "journal sink running");
    let running = tokio::spawn(sink.run(stop.clone()));
    let signal = wait_for_signal().await;
    tracing::info!(?signal, "stopping the journal sink");
    stop.cancel();
    let _ = running.await;
    Ok(())
}

/// `stockgate journal retire`: 0 every journal gone, 1 some still hold
/// entries.
async fn retire(args: RetireArgs) -> Result<ExitCode, String> {
    let (upstream, keys) = connect(args.upstream, args.redis).await?;
    let done = stockgate::journal::retire::run(&upstream, &keys, &args.skus)
        .await
        .map_err(|e| format!("cannot retire the journals: {e}"))?;
    print!("{}", done.render());
    Ok(if done.holding.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `stockgate reconcile`: 0 all agree, 1 drift, 2 could not check.
async fn reconcile(args: ReconcileArgs) -> Result<ExitCode, String> {
    let database = stockgate::journal::database::Target::parse(args.database.database.expose())
        .map_err(|e| format!("--database {e}"))?
        .in_schema(args.database.database_schema)?;
    let (upstream, keys) = connect(args.upstream, args.redis).await?;
    let mut books = stockgate::journal::database::Books::connect(&database)
        .await
        .map_err(|e| e.to_string())?;
    let report = stockgate::journal::reconcile::run(&upstream, &keys, &mut books, &args.skus)
        .await
        .map_err(|e| format!("cannot list the skus: {e}"))?;
    print!("{}", stockgate::journal::reconcile::render(&report));
    Ok(ExitCode::from(report.exit_code()))
}
