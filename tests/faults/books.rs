//! The database as the third book (issue 26), under the faults of the
//! tests that carry it.
//!
//! A [`Books`] is a throwaway PostgreSQL and a `stockgate journal sink`
//! (the real binary, `--wait-replicas 1`) moving the journals of the
//! fault's cluster while the load runs. [`Books::upset`] kills the sink
//! with SIGKILL (whatever batch it was in) and starts another, then
//! restarts PostgreSQL (`pg_ctl -m fast`: the transaction in flight rolls
//! back); the test around it adds its own fault (a primary killed, slots
//! moved). After the load, [`Books::drain`] stops the live sink, runs
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

use crate::support::postgres::Postgres;
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

/// A PostgreSQL and the sink moving the cluster's journals into it.
pub struct Books {
    pg: Postgres,
    seeds: Vec<String>,
    sink: Option<Child>,
    name: String,
}

impl Books {
    /// Starts PostgreSQL and a sink.
    pub fn start(cluster: &LocalCluster, name: &str) -> Books {
        let mut books = Books {
            pg: Postgres::start(),
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
            .args(["journal", "sink", "--database", &self.pg.url()])
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
    /// `pause` later, PostgreSQL restarted under it.
    pub async fn upset(&mut self, pause: Duration) {
        let moved_before = self.moved().await;
        if let Some(mut sink) = self.sink.take() {
            let _ = sink.kill();
            let _ = sink.wait();
        }
        self.sink = Some(self.spawn(false));
        tokio::time::sleep(pause).await;
        let restarted = Instant::now();
        tokio::task::block_in_place(|| self.pg.restart());
        eprintln!(
            "[{}] books: the sink killed with {moved_before} entries moved, another started; PostgreSQL restarted in {:.0?}",
            self.name,
            restarted.elapsed()
        );
    }

    /// Entries in the database so far (0 before the sink made its table).
    async fn moved(&self) -> i64 {
        let client = self.pg.client().await;
        match client
            .query_one("SELECT count(*) FROM stockgate_journal", &[])
            .await
        {
            Ok(row) => row.get(0),
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
        let client = self.pg.client().await;
        let rows = client
            .query(
                "SELECT sku, entry_ms, entry_seq, format, event, request_id, order_no, \
                 stock_change, held_change, stock_after, held_after \
                 FROM stockgate_journal ORDER BY sku, entry_ms, entry_seq",
                &[],
            )
            .await
            .expect("read the journal table");
        let mut entries: HashMap<String, Vec<Entry>> = HashMap::new();
        for row in rows {
            let entry = stockgate::journal::database::postgres::entry_of(&row, 1)
                .unwrap_or_else(|| panic!("an event stockgate knows: {row:?}"));
            entries.entry(row.get(0)).or_default().push(entry);
        }
        let conflicts: i64 = client
            .query_one("SELECT count(*) FROM stockgate_journal_conflicts", &[])
            .await
            .expect("count the conflicts")
            .get(0);
        Database { entries, conflicts }
    }

    /// A client of the database, to plant what the audit must find.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.pg.client().await
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
