//! The database as the third book (issue 26), under the faults of the
//! tests that carry it.
//!
//! A [`Books`] is a throwaway database and a `stockgate journal sink`
//! (the real binary, `--wait-replicas 1`) moving the journals of the
//! fault's cluster while the load runs: MariaDB 10.11 in the Valkey 8.0
//! cell of each test that carries the books, PostgreSQL 15 in the others
//! ([`engine_for`]). [`Books::upset`] kills the sink with SIGKILL
//! (whatever batch it was in) and starts another, then restarts the
//! database (PostgreSQL `pg_ctl -m fast`, MariaDB SIGKILL: the transaction
//! in flight rolls back); the test around it adds its own fault (a primary
//! killed, slots moved). After the load, [`Books::drain`] stops the live sink, runs
//! `journal sink --drain` until it finds nothing left, and reads every
//! entry the database holds; the audit ([`crate::checker`]) then checks
//! each SKU's account in the database, followed by whatever Redis still
//! journaled after the drain (the sweeper, order recovery), from the
//! initial stock to Redis's final stock and held units, exactly.
//!
//! `--wait-replicas 1` is what makes the database exact through a killed
//! primary: the sink moves only entries a replica has, so the promoted
//! replica never lacks one the database holds (docs/books.md says what
//! can be lost without it: the conflicts table, which must stay empty
//! here).

use crate::support::ServerKind;
use crate::support::books_db::{BooksDb, Engine};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stockgate::dev::LocalCluster;
use stockgate::journal::Entry;

/// What the database holds after the drain.
pub struct Database {
    /// sku -> its entries, oldest first.
    pub entries: HashMap<String, Vec<Entry>>,
    /// Rows of `stockgate_journal_conflicts`.
    pub conflicts: i64,
}

/// Which database keeps the books under `kind`: MariaDB in one cell of
/// each test (Valkey 8.0's, in CI), PostgreSQL in the rest, so both
/// databases meet every fault that carries the books at no extra run.
pub fn engine_for(kind: ServerKind) -> Engine {
    match kind {
        ServerKind::Valkey8 => Engine::Mariadb,
        _ => Engine::Postgres,
    }
}

/// A database and the sink moving the cluster's journals into it.
pub struct Books {
    db: BooksDb,
    seeds: Vec<String>,
    sink: Option<Child>,
    name: String,
}

impl Books {
    /// Starts the database of `kind`'s cell ([`engine_for`]) and a sink.
    pub fn start(cluster: &LocalCluster, name: &str, kind: ServerKind) -> Books {
        let mut books = Books {
            db: BooksDb::start_own(engine_for(kind)),
            seeds: cluster.seeds(),
            sink: None,
            name: name.to_owned(),
        };
        books.sink = Some(books.spawn(false));
        books
    }

    fn spawn(&self, drain: bool) -> Child {
        let mut command = Command::new(crate::support::stockgate_bin());
        // SAFETY: prctl in the child before exec touches nothing else:
        // the sink dies with the test even when no Drop runs.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
            .args(["journal", "sink", "--database", &self.db.url()])
            .args(["--upstream", &self.seeds.join(",")])
            .args(["--wait-replicas", "1", "--batch", "50", "--poll", "20ms"])
            .args([
                "--admin-listen",
                &format!("127.0.0.1:{}", crate::support::free_port()),
            ])
            .env_remove("STOCKGATE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // FAULT_SINK_LOG=1 shows the sinks' logs, for a failing test.
            .stderr(if std::env::var_os("FAULT_SINK_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        if drain {
            command.arg("--drain");
        }
        command.spawn().expect("start stockgate journal sink")
    }

    /// Mid-load: the sink killed (SIGKILL) and another started, then,
    /// `pause` later, the database restarted under it.
    pub async fn upset(&mut self, pause: Duration) {
        let moved_before = self.moved().await;
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.kill();
            let _ = sink.wait();
        }
        self.sink = Some(self.spawn(false));
        tokio::time::sleep(pause).await;
        let restarted = Instant::now();
        tokio::task::block_in_place(|| self.db.restart());
        eprintln!(
            "[{}] books: the sink killed with {moved_before} entries moved, another started; {} restarted in {:.0?}",
            self.name,
            self.db.engine,
            restarted.elapsed()
        );
    }

    /// Entries in the database so far (0 before the sink made its table).
    async fn moved(&self) -> i64 {
        let mut session = self.db.session().await;
        match session
            .try_execute("SELECT 1 FROM stockgate_journal LIMIT 1")
            .await
        {
            Ok(()) => {
                session
                    .count("SELECT count(*) FROM stockgate_journal")
                    .await
            }
            Err(_) => 0,
        }
    }

    /// Stops the live sink, drains what is left, and reads the database.
    pub async fn drain(&mut self) -> Database {
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.kill();
            let _ = sink.wait();
        }
        let started = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            let mut drain = self.spawn(true);
            let status =
                tokio::task::block_in_place(|| drain.wait()).expect("the draining sink runs");
            if status.success() {
                break;
            }
            // A shard whose node is still settling after the fault: the
            // drain stops with 1, and goes again.
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "[{}] journal sink --drain still failing after {tries} tries ({status})",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let database = self.read().await;
        let total = database.entries.values().map(Vec::len).sum::<usize>();
        eprintln!(
            "[{}] books: drained in {:.0?} ({tries} run(s)); the database holds {total} entries of {} skus, {} conflicts",
            self.name,
            started.elapsed(),
            database.entries.len(),
            database.conflicts
        );
        assert!(total > 0, "[{}] the sink moved nothing", self.name);
        database
    }
}

impl Books {
    /// Every entry the database holds, and its conflicts.
    pub async fn read(&self) -> Database {
        let mut entries: HashMap<String, Vec<Entry>> = HashMap::new();
        for (sku, entry) in self.db.entries().await {
            entries.entry(sku).or_default().push(entry);
        }
        let conflicts = self
            .db
            .count("SELECT count(*) FROM stockgate_journal_conflicts")
            .await;
        Database { entries, conflicts }
    }

    /// The database, to plant what the audit must find.
    pub fn db(&self) -> &BooksDb {
        &self.db
    }
}

impl Drop for Books {
    fn drop(&mut self) {
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.kill();
            let _ = sink.wait();
        }
    }
}
