//! The books (issue 26): `stockgate journal sink` moves each SKU's journal
//! into a real PostgreSQL 15 or MariaDB 10.11 exactly once, whatever is
//! killed when, and `stockgate reconcile` proves Redis and the database
//! agree.
//!
//! Most tests run on both databases ([`both!`]: `<test>::postgres` and
//! `<test>::mariadb`). Each starts a 3-primary Redis Cluster and a
//! PostgreSQL of its own, or a database of its own on the MariaDB server
//! this binary shares (a server of its own when it restarts or stops it),
//! and the stockgate binary as child processes it stops. The journals are
//! written here by hand, as the scripts write them (an XADD of the entry's
//! one field, the SKU listed in its shard's set first, the stock and held
//! keys moved to match), under SKUs no other test uses, so the tests hold
//! when the scripts write entries of their own.
//!
//! No assertion is timed: a test waits for a state (a metric, a row count,
//! a backend waiting on a lock) with a generous bound that only a state
//! that never comes reaches.

mod support;

use redis::Commands;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use stockgate::dev::LocalCluster;
use stockgate::journal::Entry;
use stockgate::keys::KeyLayout;
use stockgate::params::Sku;
use support::books_db::{BooksDb, Engine, Session};
use support::postgres::Postgres;

const WITHIN: Duration = Duration::from_secs(60);

/// Runs a books test body on each database: `both! { async fn name }`
/// adds `name::postgres` and `name::mariadb`, each calling `name(engine)`.
macro_rules! both {
    (async fn $name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Engine::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mariadb() {
                super::$name(super::Engine::Mariadb).await
            }
        }
    };
}

/// A test's part of Redis: the binary's shared 3-primary cluster under a
/// key prefix of the test's own, so that its journals, shard sets and
/// sinks never meet another test's; or a cluster of its own (a failover,
/// replicas), under a prefix of its own all the same.
struct Stage {
    cluster: StageCluster,
    keys: KeyLayout,
}

enum StageCluster {
    Shared(&'static LocalCluster),
    Own(LocalCluster),
}

impl Stage {
    fn shared() -> Stage {
        Stage::on(StageCluster::Shared(support::shared_cluster()))
    }

    fn own(cluster: LocalCluster) -> Stage {
        Stage::on(StageCluster::Own(cluster))
    }

    fn on(cluster: StageCluster) -> Stage {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Stage {
            cluster,
            keys: KeyLayout::new(&format!("bk{n}")).unwrap(),
        }
    }

    /// `--key-prefix <its prefix>`, for every stockgate command.
    fn prefix_args(&self) -> [&str; 2] {
        ["--key-prefix", self.keys.prefix()]
    }
}

impl std::ops::Deref for Stage {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        match &self.cluster {
            StageCluster::Shared(cluster) => cluster,
            StageCluster::Own(cluster) => cluster,
        }
    }
}

impl std::ops::DerefMut for Stage {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        match &mut self.cluster {
            StageCluster::Shared(_) => panic!("only a cluster of the test's own is changed"),
            StageCluster::Own(cluster) => cluster,
        }
    }
}

/// A running `stockgate journal sink`; killed (SIGKILL) on drop.
struct SinkProcess {
    child: Child,
    admin_port: u16,
}

impl SinkProcess {
    fn start(cluster: &Stage, db: &BooksDb, extra: &[&str]) -> SinkProcess {
        let admin_port = support::free_port();
        let admin = format!("127.0.0.1:{admin_port}");
        let mut command = Command::new(support::stockgate_bin());
        // SAFETY: prctl in the child before exec touches nothing else.
        // The sink dies with this test even when the test process is
        // killed and no Drop runs (a cut pipe, a timeout).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(["journal", "sink", "--database", &db.url()])
            .args(["--upstream", &cluster.seeds().join(",")])
            .args(cluster.prefix_args())
            .args(["--admin-listen", &admin, "--batch", "40", "--poll", "20ms"])
            .args(extra)
            .env("RUST_LOG", "stockgate=debug")
            .stdout(Stdio::null())
            // BOOKS_SINK_LOG=1 shows the sinks' logs, for a failing test.
            .stderr(if std::env::var_os("BOOKS_SINK_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("start the sink");
        SinkProcess { child, admin_port }
    }

    /// One series of its /metrics, None until it answers.
    fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = support::http_get(self.admin_port, "/metrics").ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Its whole /metrics text.
    fn metrics_text(&self) -> String {
        support::http_get(self.admin_port, "/metrics").unwrap().1
    }

    fn wait_metric(&self, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
        wait(|| self.metric(series).filter(|v| ok(*v)))
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SinkProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait<T>(mut check: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < WITHIN, "not there after {WITHIN:?}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// KEYS stock, held, journal; ARGV stock, held, the entry's text.
const APPEND: &str = "redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[2]) \
     return redis.call('XADD', KEYS[3], '*', 'e', ARGV[3])";

/// An entry's one field as the scripts write it (`src/journal/mod.rs` owns
/// the shape): read back through [`Entry::parse`] here, so a change of
/// the shape fails these tests at once instead of feeding the sink
/// entries it no longer reads.
fn entry_text(event: &str, id: &str, order_no: &str, ds: i64, dh: i64, st: i64, hd: i64) -> String {
    let text = format!("1 {event} {id} {ds} {dh} {st} {hd} {order_no}");
    let entry = Entry::parse("1-1", &[("e".to_owned(), text.clone())]).expect("the shape parses");
    assert_eq!(
        (
            entry.event.name(),
            entry.id.as_str(),
            entry.order_no.as_str()
        ),
        (event, id, order_no)
    );
    assert_eq!(
        (
            entry.stock_change,
            entry.held_change,
            entry.stock,
            entry.held
        ),
        (ds, dh, st, hd)
    );
    text
}

/// The journals written by hand: each SKU's stock and held units kept in
/// step, every entry remembered as (sku, stream id, event, stock change).
struct Journals {
    conn: redis::cluster::ClusterConnection,
    layout: KeyLayout,
    state: BTreeMap<String, (i64, i64)>,
    written: Vec<(String, String, &'static str, i64)>,
}

impl Journals {
    fn new(cluster: &Stage) -> Journals {
        Journals {
            conn: cluster.cluster_connection().unwrap(),
            layout: cluster.keys.clone(),
            state: BTreeMap::new(),
            written: Vec::new(),
        }
    }

    /// Appends one entry the way a script does, and moves the SKU's keys.
    fn append(
        &mut self,
        sku: &str,
        event: &'static str,
        id: &str,
        order_no: &str,
        ds: i64,
        dh: i64,
    ) {
        let layout = self.layout.clone();
        let parsed = Sku::parse(sku.to_owned().into()).unwrap();
        if !self.state.contains_key(sku) {
            let shard = &layout.sweep_shards()[layout.sweep_shard_index(&parsed)];
            let _: i64 = self.conn.sadd(&shard.journals, sku).unwrap();
        }
        let (stock, held) = self.state.entry(sku.to_owned()).or_insert((0, 0));
        // A set's `ds` here is the stock it sets; its entry's ds the change.
        let ds = if event == "set" { ds - *stock } else { ds };
        *stock += ds;
        *held += dh;
        let (st, hd) = (*stock, *held);
        // The stock, the held units and the entry in one atomic call, as a
        // stockgate script changes them: a reader never sees one without
        // the others.
        let id_at: String = redis::cmd("EVAL")
            .arg(APPEND)
            .arg(3)
            .arg(layout.stock_key(&parsed))
            .arg(layout.sku_keys(&parsed).held)
            .arg(layout.journal_key(&parsed))
            .arg(st)
            .arg(hd)
            .arg(entry_text(event, id, order_no, ds, dh, st, hd))
            .query(&mut self.conn)
            .unwrap();
        self.written.push((sku.to_owned(), id_at, event, ds));
    }

    /// A day of one SKU: its stock set, sales, a hold and its fates.
    fn day(&mut self, sku: &str, n: usize) {
        self.append(sku, "set", &format!("{sku}-op"), "", 1000, 0);
        for i in 0..n {
            match i % 5 {
                0 | 1 => self.append(
                    sku,
                    "deduct",
                    &format!("{sku}-d{i}"),
                    &format!("ORD-{sku}-{i}"),
                    -2,
                    0,
                ),
                2 => self.append(sku, "hold", &format!("{sku}-h{i}"), "", -3, 3),
                3 => self.append(sku, "expire", &format!("{sku}-h{}", i - 1), "", 3, -3),
                _ => self.append(sku, "add", &format!("{sku}-a{i}"), "", 5, 0),
            }
        }
    }

    fn journal_len(&mut self, sku: &str) -> i64 {
        let parsed = Sku::parse(sku.to_owned().into()).unwrap();
        redis::cmd("XLEN")
            .arg(self.layout.journal_key(&parsed))
            .query(&mut self.conn)
            .unwrap()
    }

    fn pending(&mut self) -> i64 {
        let skus: Vec<String> = self.state.keys().cloned().collect();
        skus.iter().map(|sku| self.journal_len(sku)).sum()
    }
}

/// SKUs spread over many shards (and so over the three primaries).
fn skus(tag: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("jr-{tag}-{i}")).collect()
}

/// What the database holds: (sku, stream id, event, stock change), sorted.
async fn books(db: &BooksDb) -> Vec<(String, String, String, i64)> {
    books_in(db, None).await
}

/// What the database holds in `schema` (where the URL's session puts
/// tables when None).
async fn books_in(db: &BooksDb, schema: Option<&str>) -> Vec<(String, String, String, i64)> {
    let table = match schema {
        Some(schema) => format!("{schema}.stockgate_journal"),
        None => "stockgate_journal".to_owned(),
    };
    db.rows(&format!(
        "SELECT sku, CONCAT(entry_ms, '-', entry_seq), event, stock_change FROM {table}"
    ))
    .await
    .into_iter()
    .map(|row| {
        let text = |i: usize| row[i].clone().unwrap();
        (text(0), text(1), text(2), text(3).parse().unwrap())
    })
    .collect::<std::collections::BTreeSet<_>>()
    .into_iter()
    .collect()
}

fn expected_books(journals: &Journals) -> Vec<(String, String, String, i64)> {
    let mut all: Vec<_> = journals
        .written
        .iter()
        .map(|(sku, id, event, ds)| (sku.clone(), id.clone(), event.to_string(), *ds))
        .collect();
    all.sort();
    all
}

/// `stockgate reconcile`: its exit code and what it printed.
fn reconcile(cluster: &Stage, database: &str, skus: &[&str]) -> (i32, String) {
    reconcile_with(cluster, database, skus, &[])
}

fn reconcile_with(cluster: &Stage, database: &str, skus: &[&str], extra: &[&str]) -> (i32, String) {
    let mut command = Command::new(support::stockgate_bin());
    command
        .args(["reconcile", "--database", database])
        .args(extra)
        .args(["--upstream", &cluster.seeds().join(",")])
        .args(cluster.prefix_args());
    for sku in skus {
        command.args(["--sku", sku]);
    }
    let out = command.output().expect("run reconcile");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("an exit code"), text)
}

/// Takes a lock on the journal table that the sink's next batch waits
/// behind, inside its transaction: PostgreSQL's `LOCK TABLE` in an open
/// transaction, MariaDB's `LOCK TABLES ... WRITE` (a metadata lock).
async fn lock_the_table(db: &BooksDb) -> Session {
    let mut locker = db.session().await;
    locker
        .try_execute(db.sql(
            "BEGIN; LOCK TABLE stockgate_journal IN ACCESS EXCLUSIVE MODE",
            "LOCK TABLES stockgate_journal WRITE",
        ))
        .await
        .unwrap();
    locker
}

async fn unlock_the_table(db: &BooksDb, locker: &mut Session) {
    locker
        .try_execute(db.sql("ROLLBACK", "UNLOCK TABLES"))
        .await
        .unwrap();
}

/// Sessions waiting behind that lock on the journal table.
fn blocked_sql(db: &BooksDb) -> &'static str {
    db.sql(
        "SELECT count(*) FROM pg_stat_activity
          WHERE wait_event_type = 'Lock' AND query LIKE '%stockgate_journal%'",
        "SELECT count(*) FROM information_schema.processlist
          WHERE state LIKE 'Waiting for table metadata lock' AND info LIKE '%stockgate_journal%'",
    )
}

/// Waits until a session of the sink waits on the table's lock: the sink
/// is mid-batch, its transaction open.
async fn wait_blocked_batch(db: &BooksDb) {
    let sql = blocked_sql(db);
    support::loop_until_async(WITHIN, || async {
        (db.count(sql).await == 1).then_some(())
    })
    .await;
}

both! { async fn entries_land_once_and_leave_redis_only_after_their_commit }
/// Every entry lands once, the journals are trimmed only after the commit,
/// a re-delivered entry changes nothing, and one whose id comes back with
/// other content is kept as a conflict, counted, never dropped.
async fn entries_land_once_and_leave_redis_only_after_their_commit(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let first = SinkProcess::start(&cluster, &db, &[]);
    // Its schema is in once it owns every shard.
    first.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);

    // The table locked: the sink's first batch waits inside its transaction.
    let mut locker = lock_the_table(&db).await;
    let mut journals = Journals::new(&cluster);
    for sku in skus("once", 12) {
        journals.day(&sku, 23);
    }
    let total = journals.written.len() as i64;
    wait_blocked_batch(&db).await;
    assert_eq!(
        journals.pending(),
        total,
        "nothing may leave Redis while its transaction is open"
    );
    unlock_the_table(&db, &mut locker).await;

    first.wait_metric("stockgate_journal_entries_moved_total", |v| {
        v == total as f64
    });
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db).await, expected_books(&journals));
    assert_eq!(
        db.count("SELECT count(*) FROM stockgate_journal_conflicts")
            .await,
        0
    );
    // For the record, not asserted: the rate inside the sink's batches
    // (its transactions and trims; batches of 40 here, on a shared host).
    let batch_seconds = first
        .metric("stockgate_journal_batch_duration_seconds_sum")
        .unwrap();
    eprintln!(
        "sink into {engine}: {total} entries in {batch_seconds:.3}s of batches, {:.0} entries/s",
        total as f64 / batch_seconds
    );
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("12 skus: 12 agree, 0 drift"), "{text}");

    // A sink killed between commit and trim delivers again: the journal
    // of one SKU written back with the same ids and content.
    first.kill();
    let sku = "jr-once-3";
    let parsed = Sku::parse(sku.to_owned().into()).unwrap();
    let key = cluster.keys.journal_key(&parsed);
    let moved: Vec<_> = books(&db)
        .await
        .into_iter()
        .filter(|row| row.0 == sku)
        .collect();
    let mut conn = cluster.cluster_connection().unwrap();
    let original: Vec<(String, Entry)> = db
        .entries()
        .await
        .into_iter()
        .filter(|(of, _)| of == sku)
        .map(|(_, entry)| (entry.stream_id(), entry))
        .collect();
    assert_eq!(original.len(), moved.len());
    let _: () = conn.del(&key).unwrap();
    let text_of = |e: &Entry| {
        entry_text(
            e.event.name(),
            &e.id,
            &e.order_no,
            e.stock_change,
            e.held_change,
            e.stock,
            e.held,
        )
    };
    for (id, entry) in &original {
        let _: String = redis::cmd("XADD")
            .arg(&key)
            .arg(id)
            .arg("e")
            .arg(text_of(entry))
            .query(&mut conn)
            .unwrap();
    }
    // ...and one id given again with other content, as after a failover
    // that lost the entry first given it.
    let mut other = original[5].1.clone();
    other.stock_change = -7;
    let other_sku = "jr-once-4";
    let other_key = cluster
        .keys
        .journal_key(&Sku::parse(other_sku.to_owned().into()).unwrap());
    let reused = db
        .entries()
        .await
        .into_iter()
        .filter(|(of, _)| of == other_sku)
        .nth(5)
        .unwrap()
        .1
        .stream_id();
    let _: () = conn.del(&other_key).unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&other_key)
        .arg(&reused)
        .arg("e")
        .arg(text_of(&other))
        .query(&mut conn)
        .unwrap();

    let second = SinkProcess::start(&cluster, &db, &[]);
    second.wait_metric("stockgate_journal_conflicts_total", |v| v == 1.0);
    wait(|| (journals.journal_len(sku) == 0 && journals.journal_len(other_sku) == 0).then_some(()));
    assert_eq!(
        second.metric("stockgate_journal_entries_moved_total"),
        Some(0.0),
        "a re-delivery is not a move"
    );
    assert_eq!(
        books(&db).await,
        expected_books(&journals),
        "the books unchanged"
    );
    let conflict = db
        .rows(&format!(
            "SELECT sku, stock_change FROM stockgate_journal_conflicts
              WHERE CONCAT(entry_ms, '-', entry_seq) = '{reused}'"
        ))
        .await;
    assert_eq!(
        conflict,
        [[Some(other_sku.to_owned()), Some("-7".to_owned())]]
    );
}

both! { async fn reconcile_says_agree_drift_or_could_not_check }
/// reconcile: 0 when the books agree (entries not moved yet included), 1
/// on a planted drift, naming the SKU, and 2 when it cannot check.
async fn reconcile_says_agree_drift_or_could_not_check(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let mut journals = Journals::new(&cluster);
    for sku in skus("rec", 4) {
        journals.day(&sku, 11);
    }
    let sink = SinkProcess::start(&cluster, &db, &[]);
    let total = journals.written.len() as f64;
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == total);
    sink.kill();
    // Not moved yet: the journal's tail explains Redis's state.
    journals.day("jr-rec-1", 3);
    journals.day("jr-rec-new", 4);
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("5 skus: 5 agree, 0 drift"), "{text}");

    // A write around stockgate: 5 units that no entry explains.
    let mut conn = cluster.cluster_connection().unwrap();
    let drifted = Sku::parse("jr-rec-2".to_owned().into()).unwrap();
    let _: i64 = conn.incr(cluster.keys.stock_key(&drifted), 5).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("jr-rec-2: DRIFT"), "{text}");
    assert!(text.contains("stock off by 5"), "{text}");
    assert!(text.contains("4 agree, 1 drift"), "{text}");
    let (code, text) = reconcile(&cluster, &db.url(), &["jr-rec-1"]);
    assert_eq!((code, text.contains("1 agree")), (0, true), "{text}");

    // An entry that does not follow from the one before is named: its
    // stock after changed (the first `add` of jr-rec-3), and the first
    // deduct's change, so the account is off by one too.
    for (column, event) in [("stock_after", "add"), ("stock_change", "deduct")] {
        let changed = db
            .execute(db.sql(
                &format!(
                    "UPDATE stockgate_journal SET {column} = {column} + 1
                      WHERE sku = 'jr-rec-3' AND event = '{event}'
                        AND (entry_ms, entry_seq) = (SELECT entry_ms, entry_seq FROM stockgate_journal
                              WHERE sku = 'jr-rec-3' AND event = '{event}'
                              ORDER BY entry_ms, entry_seq LIMIT 1)"
                ),
                &format!(
                    "UPDATE stockgate_journal SET {column} = {column} + 1
                      WHERE sku = 'jr-rec-3' AND event = '{event}'
                      ORDER BY entry_ms, entry_seq LIMIT 1"
                ),
            ))
            .await;
        assert_eq!(changed, 1);
    }
    let (code, text) = reconcile(&cluster, &db.url(), &["jr-rec-3"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("does not follow from the entry before it"),
        "{text}"
    );

    // No database: nothing can be checked.
    let (code, text) = reconcile(&cluster, &db.unreachable_url(), &[]);
    assert_eq!(code, 2, "{text}");
}

both! { async fn a_killed_sink_and_a_restarted_database_lose_and_double_nothing }
/// A sink SIGKILLed mid-batch, then the database restarted under the next
/// one mid-transaction: every entry lands exactly once, and Redis keeps
/// each until its commit.
async fn a_killed_sink_and_a_restarted_database_lose_and_double_nothing(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start_own(engine);
    let first = SinkProcess::start(&cluster, &db, &[]);
    first.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    let mut locker = lock_the_table(&db).await;
    let mut journals = Journals::new(&cluster);
    for sku in skus("kill", 10) {
        journals.day(&sku, 30);
    }
    let total = journals.written.len() as i64;
    wait_blocked_batch(&db).await;
    first.kill();
    if engine == Engine::Mariadb {
        // A MariaDB session waiting on a metadata lock notices its client
        // gone only once it runs again: given the lock, it runs its
        // statement, finds no client, and rolls back.
        unlock_the_table(&db, &mut locker).await;
    }
    // Its session ends, and its transaction with it: nothing of it stays.
    // (Watched from a session of its own: PostgreSQL's dying backend
    // waited for as long as the lock's holder ran queries.)
    let locker_id = locker
        .count(db.sql("SELECT pg_backend_pid()", "SELECT CONNECTION_ID()"))
        .await;
    let others = format!(
        "{} <> {locker_id}",
        db.sql(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()
                AND backend_type = 'client backend' AND pid",
            "SELECT count(*) FROM information_schema.processlist
              WHERE db = DATABASE() AND id <> CONNECTION_ID() AND id",
        )
    );
    support::loop_until_async(WITHIN, || async {
        (db.count(&others).await == 0).then_some(())
    })
    .await;
    assert_eq!(
        locker.count("SELECT count(*) FROM stockgate_journal").await,
        0
    );
    assert_eq!(journals.pending(), total);
    if engine == Engine::Mariadb {
        locker = lock_the_table(&db).await;
    }

    let second = SinkProcess::start(&cluster, &db, &[]);
    wait_blocked_batch(&db).await;
    // Mid-transaction, the database goes away and comes back.
    db.restart();
    drop(locker);
    second.wait_metric("stockgate_journal_entries_moved_total", |v| {
        v == total as f64
    });
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db).await, expected_books(&journals));
    assert!(
        second
            .metric("stockgate_journal_faults_total{source=\"database\"}")
            .unwrap()
            >= 1.0
    );
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
}

both! { async fn two_sinks_share_the_shards_and_write_each_entry_once }
/// Two sinks at once share the 16 shards (neither starves) and write each
/// entry once between them.
async fn two_sinks_share_the_shards_and_write_each_entry_once(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let first = SinkProcess::start(&cluster, &db, &[]);
    first.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    let second = SinkProcess::start(&cluster, &db, &[]);
    // The first gives half back; the second takes it.
    second.wait_metric("stockgate_journal_shards_owned", |v| v == 8.0);
    first.wait_metric("stockgate_journal_shards_owned", |v| v == 8.0);

    let mut journals = Journals::new(&cluster);
    for sku in skus("two", 40) {
        journals.day(&sku, 9);
    }
    let total = journals.written.len() as f64;
    wait(|| {
        let moved = first.metric("stockgate_journal_entries_moved_total")?
            + second.metric("stockgate_journal_entries_moved_total")?;
        (moved == total).then_some(())
    });
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db).await, expected_books(&journals));
    assert!(
        first
            .metric("stockgate_journal_entries_moved_total")
            .unwrap()
            > 0.0
    );
    assert!(
        second
            .metric("stockgate_journal_entries_moved_total")
            .unwrap()
            > 0.0
    );
    assert_eq!(
        db.count("SELECT count(*) FROM stockgate_journal_conflicts")
            .await,
        0
    );
    // Every series the journal's alerts and dashboard read is one a live
    // sink exports.
    let text = first.metrics_text();
    let mut used = String::new();
    for file in [
        "deploy/prometheus/stockgate-journal.rules.yml",
        "deploy/grafana/stockgate-journal-dashboard.json",
    ] {
        used.push_str(&std::fs::read_to_string(support::in_repo(file)).unwrap());
    }
    let names: std::collections::BTreeSet<&str> = used
        .match_indices("stockgate_journal_")
        .map(|(at, _)| {
            let rest = &used[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches("_bucket")
        })
        // Table names in the annotations, not series.
        .filter(|name| {
            name.ends_with("_total")
                || name.ends_with("_seconds")
                || name.ends_with("_entries")
                || name.ends_with("_owned")
        })
        .collect();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} is not in a sink's /metrics"
        );
    }
}

both! { async fn the_sinks_of_two_databases_on_one_server_each_move_every_shard }
/// Two deployments, each with its books in a database of its own on one
/// database server: each sink is its deployment's only one and moves all
/// 16 shards. (A PostgreSQL sink once counted the other database's sink
/// as one of its own, from `pg_locks`, which lists every database's
/// locks: each took 8 shards and left 8 unmoved.)
async fn the_sinks_of_two_databases_on_one_server_each_move_every_shard(engine: Engine) {
    let (a, b) = (Stage::shared(), Stage::shared());
    let (db_a, db_b) = (BooksDb::start(engine), BooksDb::start(engine));
    assert_ne!(db_a.url(), db_b.url(), "two databases");
    let first = SinkProcess::start(&a, &db_a, &[]);
    first.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    let second = SinkProcess::start(&b, &db_b, &[]);
    second.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    let mut journals = Journals::new(&a);
    for sku in skus("solo", 16) {
        journals.day(&sku, 3);
    }
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db_a).await, expected_books(&journals));
    assert_eq!(first.metric("stockgate_journal_shards_owned"), Some(16.0));
}

/// promtool accepts the journal's alert rules and their unit tests.
#[test]
fn promtool_accepts_the_journal_rules_and_their_unit_tests() {
    for args in [
        ["check", "rules", "stockgate-journal.rules.yml"],
        ["test", "rules", "stockgate-journal.rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(support::in_repo("deploy/prometheus"))
            .output()
            .expect("promtool: install it with deploy/install-deps.sh test (Debian: apt-get install -y prometheus)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("SUCCESS"),
            "{args:?}: {text}"
        );
    }
}

both! { async fn two_deployments_keep_apart_in_one_database }
/// Two deployments (two key prefixes, the same SKU names) keep their books
/// in one database, each in a schema of its own (`--database-schema`):
/// each sink takes all 16 of its own deployment's shards (their locks
/// apart), each schema holds its deployment's entries and no other's, and
/// each reconciles clean, again and again, while the other writes.
async fn two_deployments_keep_apart_in_one_database(engine: Engine) {
    let db = BooksDb::start(engine);
    let deployments = [("east", Stage::shared()), ("west", Stage::shared())];
    let sinks: Vec<SinkProcess> = deployments
        .iter()
        .map(|(schema, stage)| SinkProcess::start(stage, &db, &["--database-schema", schema]))
        .collect();
    for sink in &sinks {
        sink.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    }
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writers: Vec<_> = deployments
        .iter()
        .map(|(_, stage)| {
            let mut journals = Journals::new(stage);
            let writing = writing.clone();
            std::thread::spawn(move || {
                let mut round = 0;
                while writing.load(std::sync::atomic::Ordering::Relaxed) || round < 2 {
                    for sku in skus("dep", 6) {
                        journals.day(&sku, 3);
                    }
                    round += 1;
                }
                journals
            })
        })
        .collect();
    for _ in 0..3 {
        for (schema, stage) in &deployments {
            let (code, text) =
                reconcile_with(stage, &db.url(), &[], &["--database-schema", schema]);
            assert_eq!(code, 0, "{schema}: {text}");
            assert!(text.contains("6 skus: 6 agree"), "{schema}: {text}");
        }
    }
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    for (((schema, _), sink), writer) in deployments.iter().zip(&sinks).zip(writers) {
        let mut journals = writer.join().unwrap();
        let total = journals.written.len() as f64;
        sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == total);
        wait(|| (journals.pending() == 0).then_some(()));
        assert_eq!(
            books_in(&db, Some(schema)).await,
            expected_books(&journals),
            "{schema}"
        );
    }
}

both! { async fn unreplicated_entries_are_not_moved }
/// With --wait-replicas, entries no replica confirmed stay in Redis and
/// out of the database (this cluster has no replicas at all).
async fn unreplicated_entries_are_not_moved(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let mut journals = Journals::new(&cluster);
    journals.day("jr-wait-0", 5);
    let sink = SinkProcess::start(
        &cluster,
        &db,
        &["--wait-replicas", "1", "--wait-timeout", "20ms"],
    );
    sink.wait_metric("stockgate_journal_unreplicated_total", |v| v >= 2.0);
    assert_eq!(db.count("SELECT count(*) FROM stockgate_journal").await, 0);
    assert_eq!(journals.pending(), journals.written.len() as i64);
}

both! { async fn an_unreadable_entry_holds_back_only_its_own_sku }
/// An entry the sink cannot read (a newer format) holds back its own SKU's
/// journal, counted as a data fault, and no other SKU's.
async fn an_unreadable_entry_holds_back_only_its_own_sku(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let mut journals = Journals::new(&cluster);
    for sku in skus("bad", 6) {
        journals.day(&sku, 7);
    }
    let good = journals.written.len() as f64;
    let bad = "jr-bad-3";
    let key = cluster
        .keys
        .journal_key(&Sku::parse(bad.to_owned().into()).unwrap());
    let mut conn = cluster.cluster_connection().unwrap();
    let unreadable: String = redis::cmd("XADD")
        .arg(&key)
        .arg("*")
        .arg("e")
        .arg("9 deduct from-a-newer-stockgate 0 0 0 0")
        .query(&mut conn)
        .unwrap();
    // One more after it, which must wait behind it.
    journals.append(bad, "deduct", "after-the-bad-one", "", -1, 0);
    let behind = journals.written.pop().unwrap();
    let sink = SinkProcess::start(&cluster, &db, &[]);
    sink.wait_metric("stockgate_journal_faults_total{source=\"data\"}", |v| {
        v >= 1.0
    });
    // Everything before the bad entry moves, the other SKUs' too.
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == good);
    assert_eq!(books(&db).await, expected_books(&journals));
    // The bad SKU's journal stops at its bad entry: it and what follows
    // stay in Redis, out of the database.
    let left: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let ids: Vec<&str> = left.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, [unreadable.as_str(), behind.1.as_str()]);
    assert_eq!(journals.pending(), 2);
}

both! { async fn reconcile_agrees_while_entries_are_written_and_moved }
/// reconcile run again and again while entries are written and moved:
/// its one atomic read per SKU, and the account as of the last id that
/// read saw, never mistake a change in flight for drift.
async fn reconcile_agrees_while_entries_are_written_and_moved(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let sink = SinkProcess::start(&cluster, &db, &[]);
    sink.wait_metric("stockgate_journal_shards_owned", |v| v == 16.0);
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let mut journals = Journals::new(&cluster);
        let writing = writing.clone();
        std::thread::spawn(move || {
            let mut round = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) || round < 3 {
                for sku in skus("live", 6) {
                    journals.day(&sku, 4);
                }
                round += 1;
            }
            journals
        })
    };
    let mut runs = 0;
    while runs < 6 {
        let (code, text) = reconcile(&cluster, &db.url(), &[]);
        assert_eq!(code, 0, "run {runs}: {text}");
        runs += 1;
    }
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut journals = writer.join().unwrap();
    let total = journals.written.len() as f64;
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == total);
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db).await, expected_books(&journals));
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
}

both! { async fn replicated_entries_move_with_wait_replicas }
/// With replicas behind each primary, --wait-replicas 1 moves what they
/// confirmed: the check that held entries back above is not a wall.
async fn replicated_entries_move_with_wait_replicas(engine: Engine) {
    let cluster = Stage::own(
        LocalCluster::start(3, 1, &stockgate::dev::RedisOptions::default())
            .expect("a 3-primary cluster with a replica each"),
    );
    let db = BooksDb::start(engine);
    let mut journals = Journals::new(&cluster);
    for sku in skus("repl", 5) {
        journals.day(&sku, 6);
    }
    let sink = SinkProcess::start(
        &cluster,
        &db,
        &["--wait-replicas", "1", "--wait-timeout", "500ms"],
    );
    let total = journals.written.len() as f64;
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == total);
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(books(&db).await, expected_books(&journals));
    // The mark WAIT confirmed, per SKU, goes by itself once idle.
    let layout = cluster.keys.clone();
    let mut conn = cluster.cluster_connection().unwrap();
    for sku in skus("repl", 5) {
        let sku = stockgate::params::Sku::parse(sku.into()).unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(layout.journal_sunk_key(&sku))
            .query(&mut conn)
            .unwrap();
        assert!(
            (1..=60_000).contains(&ttl),
            "the sunk mark of {sku:?} expires within a minute: PTTL {ttl}"
        );
    }
}

both! { async fn changes_through_stockgate_reach_the_books_and_reconcile }
/// End to end: changes made through stockgate with --journal (every kind
/// once, a SKU seeded around stockgate among them) reach the database
/// through the sink; reconcile agrees, the account equals Redis's stock,
/// and the order query of docs/books.md tells an order's units.
async fn changes_through_stockgate_reach_the_books_and_reconcile(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    // Seeded with a plain SET, as `stockgate dev` seeds its demo stock:
    // its account opens where its first entry finds it.
    let seeded = Sku::parse("e2e-seeded".into()).unwrap();
    let _: () = cluster
        .cluster_connection()
        .unwrap()
        .set(cluster.keys.stock_key(&seeded), 100)
        .unwrap();
    let server = support::proxy(cluster.seeds(), |c| {
        c.keys = cluster.keys.clone();
        c.journal = true;
        c.admin_commands = true;
        c.sweeper = false;
    })
    .await;
    let mut conn = support::client(&server, false).await;
    let calls: &[&[&str]] = &[
        &["STOCK.SET", "e2e-1", "50", "e2e-op-set"],
        &["DEDUCT", "e2e-1", "3", "e2e-d1", "ORD-E1"],
        &["DEDUCT", "e2e-1", "2", "e2e-d2", "ORD-E2"],
        &["REVERT", "e2e-1", "e2e-d2"],
        &["HOLD", "e2e-1", "5", "e2e-h1", "60000", "ORD-E1"],
        &["CONFIRM", "e2e-1", "e2e-h1"],
        &["HOLD", "e2e-1", "4", "e2e-h2", "60000", "ORD-E3"],
        &["STOCK.ADD", "e2e-1", "7", "e2e-op-add"],
        &["DEDUCT", "e2e-seeded", "2", "e2e-d3", "ORD-E4"],
    ];
    for args in calls {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let reply: redis::Value = cmd.query_async(&mut conn).await.unwrap();
        let redis::Value::Array(items) = &reply else {
            panic!("{args:?}: {reply:?}")
        };
        assert_eq!(items[0], redis::Value::Int(0), "{args:?}: {reply:?}");
    }
    let mut plain = cluster.cluster_connection().unwrap();
    let journal_len = |conn: &mut redis::cluster::ClusterConnection, sku: &str| -> i64 {
        redis::cmd("XLEN")
            .arg(
                cluster
                    .keys
                    .journal_key(&Sku::parse(sku.to_owned().into()).unwrap()),
            )
            .query(conn)
            .unwrap()
    };
    let written = journal_len(&mut plain, "e2e-1") + journal_len(&mut plain, "e2e-seeded");
    assert_eq!(written, 9, "one entry per change");

    let sink = SinkProcess::start(&cluster, &db, &[]);
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| {
        v == written as f64
    });
    wait(|| {
        (journal_len(&mut plain, "e2e-1") + journal_len(&mut plain, "e2e-seeded") == 0)
            .then_some(())
    });
    for sku in ["e2e-1", "e2e-seeded"] {
        let row = &db
            .rows(&format!(
                "SELECT stock, held, from_baseline FROM stockgate_account WHERE sku = '{sku}'"
            ))
            .await[0];
        let text = |i: usize| row[i].clone().unwrap();
        let account: (i64, i64, bool) = (
            text(0).parse().unwrap(),
            text(1).parse().unwrap(),
            // PostgreSQL's boolean reads "t", MariaDB's "1".
            matches!(text(2).as_str(), "t" | "1"),
        );
        let stock: i64 = plain
            .get(
                cluster
                    .keys
                    .stock_key(&Sku::parse(sku.to_owned().into()).unwrap()),
            )
            .unwrap();
        let held_key = cluster
            .keys
            .sku_keys(&Sku::parse(sku.to_owned().into()).unwrap())
            .held;
        let held: Option<i64> = plain.get(held_key).unwrap();
        assert_eq!(
            (account.0, account.1, account.2),
            (stock, held.unwrap_or(0), sku == "e2e-1"),
            "{sku}"
        );
    }
    // ORD-E1: 3 deducted and 5 held then confirmed: 8 taken, none held.
    // docs/books.md's query, the same SQL on both databases.
    let order = db
        .rows(
            "SELECT sku,
                    -sum(stock_change)                    AS units_out_of_stock,
                    sum(held_change)                      AS units_on_hold,
                    -sum(stock_change) - sum(held_change) AS units_taken
               FROM stockgate_journal
              WHERE order_no = 'ORD-E1'
              GROUP BY sku",
        )
        .await;
    let units: Vec<Vec<Option<String>>> = ["e2e-1", "8", "0", "8"]
        .iter()
        .map(|v| Some(v.to_string()))
        .collect::<Vec<_>>()
        .chunks(4)
        .map(<[_]>::to_vec)
        .collect();
    assert_eq!(order, units);
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 skus: 2 agree"), "{text}");
    drop(sink);
    a_rolling_restart_turns_the_journal_on(&cluster, &db).await;
}

/// docs/books.md's rolling restart that turns the journal on, run as
/// written on the cluster and database of the test above: a fleet of two
/// sidecars with the journal off; one restarted with it on, which opens
/// a SKU's journal at its first change; the other, still off, then makes
/// every kind of change on that SKU (a DEDUCT, an ORDER's line, a HOLD and
/// its CONFIRM, a hold that runs out, a REVERT, STOCK.ADD), and each is an
/// entry; then it too restarts with the journal on. Once the sink has
/// moved the entries, reconcile agrees on both SKUs. (Before a SKU with
/// a journal was journaled by every call, the sidecar still off made its
/// changes outside the journal, and reconcile said so: exit 1, for good.)
async fn a_rolling_restart_turns_the_journal_on(cluster: &Stage, db: &BooksDb) {
    let sidecar = |journal: bool| {
        support::proxy(cluster.seeds(), move |c| {
            c.keys = cluster.keys.clone();
            c.journal = journal;
            c.admin_commands = true;
            c.sweeper = false;
        })
    };
    async fn call(conn: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> i64 {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let reply: redis::Value = cmd.query_async(conn).await.unwrap();
        match &reply {
            redis::Value::Array(items) => match items[0] {
                redis::Value::Int(code) => code,
                _ => panic!("{args:?}: {reply:?}"),
            },
            _ => panic!("{args:?}: {reply:?}"),
        }
    }
    let (sku, other) = ("roll-1", "roll-2");

    // 1. The fleet as it was: every sidecar with the journal off.
    let a = sidecar(false).await;
    let b = sidecar(false).await;
    let mut to_a = support::client(&a, false).await;
    let mut to_b = support::client(&b, false).await;
    for (s, op) in [(sku, "roll-op-1"), (other, "roll-op-2")] {
        assert_eq!(call(&mut to_a, &["STOCK.SET", s, "100", op]).await, 0);
    }
    assert_eq!(call(&mut to_b, &["DEDUCT", sku, "1", "roll-d0"]).await, 0);

    // 2. b restarts with the journal on; its first change opens the SKU's
    // journal. a, still off, journals every change of that SKU from then on.
    b.stop_now();
    let b = sidecar(true).await;
    let mut to_b = support::client(&b, false).await;
    assert_eq!(call(&mut to_b, &["DEDUCT", sku, "2", "roll-d1"]).await, 0);
    let changes: &[&[&str]] = &[
        &["DEDUCT", sku, "3", "roll-d2", "ORD-R2"],
        &["ORDER", "roll-o1", sku, "1", other, "1"],
        &["HOLD", sku, "4", "roll-h1", "60000"],
        &["CONFIRM", sku, "roll-h1"],
        &["HOLD", sku, "5", "roll-h2", "1000"],
        &["REVERT", sku, "roll-d2"],
        &["STOCK.ADD", sku, "7", "roll-op-add"],
    ];
    for args in changes {
        assert_eq!(call(&mut to_a, args).await, 0, "{args:?}");
    }
    // roll-h2 runs out (Redis time); a's next DEDUCT gives it back first.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(call(&mut to_a, &["DEDUCT", sku, "1", "roll-d3"]).await, 0);

    // 3. a restarts with the journal on: the other SKU gets its journal at
    // its next change.
    a.stop_now();
    let a = sidecar(true).await;
    let mut to_a = support::client(&a, false).await;
    assert_eq!(
        call(&mut to_a, &["ORDER", "roll-o2", sku, "1", other, "1"]).await,
        0
    );

    // 4. The sink moves them; the books agree.
    let expected = [
        "deduct roll-d1",
        "deduct roll-d2",
        "deduct ~ord:roll-o1",
        "hold roll-h1",
        "confirm roll-h1",
        "hold roll-h2",
        "revert roll-d2",
        "add roll-op-add",
        "expire roll-h2",
        "deduct roll-d3",
        "deduct ~ord:roll-o2",
    ];
    let mut sink = SinkProcess::start(cluster, db, &["--drain"]);
    let drained = wait(|| sink.child.try_wait().unwrap());
    assert!(drained.success(), "the sink's drain: {drained:?}");
    let events = |sku: &'static str| async move {
        db.rows(&format!(
            "SELECT CONCAT_WS(' ', event, request_id) FROM stockgate_journal
              WHERE sku = '{sku}' ORDER BY entry_ms, entry_seq"
        ))
        .await
        .into_iter()
        .map(|row| row[0].clone().expect("an event"))
        .collect::<Vec<_>>()
    };
    assert_eq!(events(sku).await, expected);
    assert_eq!(events(other).await, ["deduct ~ord:roll-o2"]);
    let (code, text) = reconcile(cluster, &db.url(), &[sku, other]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 skus: 2 agree"), "{text}");

    // Turning it off (docs/books.md): every sidecar off, yet a change of a
    // SKU with a journal is an entry; a retire leaves that journal and
    // says so, and after a drain takes both away. From then on the
    // sidecars journal nothing there.
    a.stop_now();
    b.stop_now();
    let a = sidecar(false).await;
    let mut to_a = support::client(&a, false).await;
    assert_eq!(call(&mut to_a, &["DEDUCT", sku, "1", "roll-d5"]).await, 0);
    let retire = || {
        let mut command = Command::new(support::stockgate_bin());
        command
            .args(["journal", "retire", "--sku", sku, "--sku", other])
            .args(["--upstream", &cluster.seeds().join(",")])
            .args(cluster.prefix_args());
        let out = command.output().expect("run retire");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code().expect("an exit code"), text)
    };
    let (code, text) = retire();
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("1 journals retired; 1 still hold") && text.contains("roll-1: 1 entries"),
        "{text}"
    );
    let mut sink = SinkProcess::start(cluster, db, &["--drain"]);
    assert!(wait(|| sink.child.try_wait().unwrap()).success());
    // roll-2's, retired already, is retired again: nothing to do.
    assert_eq!(retire(), (0, "2 journals retired; none left\n".to_owned()));
    assert_eq!(call(&mut to_a, &["DEDUCT", sku, "1", "roll-d6"]).await, 0);
    let mut plain = cluster.cluster_connection().unwrap();
    for name in [sku, other] {
        let parsed = Sku::parse(name.to_owned().into()).unwrap();
        let layout = &cluster.keys;
        let exists: i64 = plain.exists(layout.journal_key(&parsed)).unwrap();
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&parsed)];
        let listed: bool = plain.sismember(&shard.journals, name).unwrap();
        assert_eq!((exists, listed), (0, false), "{name}");
    }
    a.stop_now();
}

/// KEYS stock, held, journal; ARGV event, ds (a set's: the new stock),
/// dh, id. Moves the SKU from what Redis holds, so the state stays whole
/// whatever a failover loses.
const APPEND_LIVE: &str = "local st = tonumber(redis.call('GET', KEYS[1]) or '0') \
     local hd = tonumber(redis.call('GET', KEYS[2]) or '0') \
     local ds, dh = tonumber(ARGV[2]), tonumber(ARGV[3]) \
     if ARGV[1] == 'set' then ds = ds - st end \
     st = st + ds hd = hd + dh \
     redis.call('SET', KEYS[1], st) redis.call('SET', KEYS[2], hd) \
     return redis.call('XADD', KEYS[3], '*', 'e', '1 ' .. ARGV[1] .. ' ' .. ARGV[4] .. ' ' .. \
       ds .. ' ' .. dh .. ' ' .. st .. ' ' .. hd .. ' ')";

both! { async fn a_primary_failover_under_the_sink_leaves_the_books_whole }
/// A primary killed while entries are written and moved, the sink with
/// --wait-replicas 1: it goes on after the failover, and the database
/// holds exactly what the surviving Redis does (reconcile agrees, no
/// conflict): nothing the failover lost from Redis is in the books.
async fn a_primary_failover_under_the_sink_leaves_the_books_whole(engine: Engine) {
    let options = stockgate::dev::RedisOptions {
        node_timeout_ms: 1000,
        ..stockgate::dev::RedisOptions::default()
    };
    let mut cluster =
        Stage::own(LocalCluster::start(3, 1, &options).expect("a cluster with replicas"));
    let db = BooksDb::start(engine);
    let layout = cluster.keys.clone();
    let names = skus("fail", 12);
    let mut conn = cluster.cluster_connection().unwrap();
    for sku in &names {
        let parsed = Sku::parse(sku.clone().into()).unwrap();
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&parsed)];
        let _: i64 = conn.sadd(&shard.journals, sku).unwrap();
    }
    let sink = SinkProcess::start(
        &cluster,
        &db,
        &["--wait-replicas", "1", "--wait-timeout", "300ms"],
    );
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (writing, written, names) = (writing.clone(), written.clone(), names.clone());
        let mut conn = cluster.cluster_connection().unwrap();
        let layout = cluster.keys.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                let sku = &names[(n as usize) % names.len()];
                let parsed = Sku::parse(sku.clone().into()).unwrap();
                let (event, ds, dh) = match n % 4 {
                    0 => ("set", 500, 0),
                    1 => ("deduct", -2, 0),
                    2 => ("hold", -3, 3),
                    _ => ("expire", 3, -3),
                };
                let appended: redis::RedisResult<String> = redis::cmd("EVAL")
                    .arg(APPEND_LIVE)
                    .arg(3)
                    .arg(layout.stock_key(&parsed))
                    .arg(layout.sku_keys(&parsed).held)
                    .arg(layout.journal_key(&parsed))
                    .arg(event)
                    .arg(ds)
                    .arg(dh)
                    .arg(format!("f-{n}"))
                    .query(&mut conn);
                match appended {
                    Ok(_) => {
                        written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // The failover: try the next one a moment later.
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // Some entries moved before the fault.
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v >= 50.0);
    let slot = stockgate::keys::sku_slot(&Sku::parse(names[0].clone().into()).unwrap());
    let victim_port = cluster.primary_for_slot(slot).unwrap().port;
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.port == victim_port)
        .unwrap();
    cluster.nodes[victim].kill();
    wait(|| {
        cluster
            .primary_for_slot(slot)
            .filter(|primary| primary.port != victim_port)
            .map(|_| ())
    });
    // The old primary comes back as the new one's replica: until then
    // no replica confirms that slot's entries, and they wait in Redis.
    cluster.nodes[victim].restart().unwrap();
    // Entries written after the failover move too.
    let after = written.load(std::sync::atomic::Ordering::Relaxed);
    wait(|| (written.load(std::sync::atomic::Ordering::Relaxed) >= after + 100).then_some(()));
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();

    let mut journals = Journals::new(&cluster);
    for sku in &names {
        journals.state.insert(sku.clone(), (0, 0));
    }
    wait(|| (journals.pending() == 0).then_some(()));
    assert_eq!(
        db.count("SELECT count(*) FROM stockgate_journal_conflicts")
            .await,
        0
    );
    assert!(
        sink.metric("stockgate_journal_faults_total{source=\"redis\"}")
            .unwrap()
            >= 1.0
    );
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("12 skus: 12 agree"), "{text}");
}

both! { async fn the_lag_grows_while_the_database_is_down_and_clears_after }
/// While the database is down the sink moves nothing, and the lag it
/// reports grows (so the lag alert fires on an outage); back up, it
/// catches up and the lag returns to 0.
async fn the_lag_grows_while_the_database_is_down_and_clears_after(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start_own(engine);
    let mut journals = Journals::new(&cluster);
    journals.day("jr-lag-0", 5);
    let sink = SinkProcess::start(&cluster, &db, &[]);
    let first = journals.written.len() as f64;
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == first);
    db.stop();
    journals.day("jr-lag-1", 5);
    sink.wait_metric("stockgate_journal_faults_total{source=\"database\"}", |v| {
        v >= 2.0
    });
    let growing = sink.wait_metric("stockgate_journal_lag_seconds", |v| v > 0.0);
    assert_eq!(
        journals.journal_len("jr-lag-1"),
        6,
        "nothing moved meanwhile"
    );
    db.start_again();
    let total = journals.written.len() as f64;
    sink.wait_metric("stockgate_journal_entries_moved_total", |v| v == total);
    sink.wait_metric("stockgate_journal_lag_seconds", |v| v == 0.0);
    assert!(growing > 0.0);
    assert_eq!(journals.pending(), 0);
}

both! { async fn a_drain_moves_what_is_there_and_stops }
/// `stockgate journal sink --drain` moves what is there and stops: it
/// says how many entries it moved, the journals are empty after it, a
/// second drain moves nothing, and reconcile agrees.
async fn a_drain_moves_what_is_there_and_stops(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let server = support::proxy(cluster.seeds(), |c| {
        c.keys = cluster.keys.clone();
        c.journal = true;
        c.admin_commands = true;
    })
    .await;
    let mut conn = support::client(&server, false).await;
    for args in [
        &["STOCK.SET", "drain-1", "20", "drain-op"][..],
        &["DEDUCT", "drain-1", "3", "drain-d1"],
        &["HOLD", "drain-1", "2", "drain-h1", "60000"],
    ] {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
    }
    let drain = || drain(&cluster, &db);
    assert_eq!(
        drain(),
        (
            Some(0),
            "moved 3 entries; nothing left to move\n".to_owned()
        )
    );
    assert_eq!(
        drain(),
        (
            Some(0),
            "moved 0 entries; nothing left to move\n".to_owned()
        )
    );
    assert_eq!(
        db.count("SELECT count(*) FROM stockgate_journal WHERE sku = 'drain-1'")
            .await,
        3
    );
    let (code, out) = reconcile(&cluster, &db.url(), &["drain-1"]);
    assert_eq!(code, 0, "{out}");
    if engine == Engine::Postgres {
        // A URL that asks for TLS never falls back to plaintext: this
        // server has none.
        let require = db.url().replace("sslmode=disable", "sslmode=require");
        let (code, out) = reconcile(&cluster, &require, &["drain-1"]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains("server does not support TLS"), "{out}");
    }
}

/// `stockgate journal sink --drain`: its exit code and what it printed.
fn drain(cluster: &Stage, db: &BooksDb) -> (Option<i32>, String) {
    let out = std::process::Command::new(support::stockgate_bin())
        .args(["journal", "sink", "--drain"])
        .args(["--database", &db.url()])
        .args(["--upstream", &cluster.seeds().join(",")])
        .args(cluster.prefix_args())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// KEYS stock, locations, journal, held units; ARGV the SKU's held units
/// after the call, the count of field/value words for the locations hash,
/// those words, then the entries' texts. A SKU kept by location as a
/// script changes it: the stock key says so, the locations and the SKU's
/// held units (their sum) move and their entries are appended in one
/// atomic call.
const APPEND_AT: &str = "redis.call('SET', KEYS[1], 'loc')
redis.call('SET', KEYS[4], ARGV[1])
local n = tonumber(ARGV[2])
if n > 0 then redis.call('HSET', KEYS[2], unpack(ARGV, 3, n + 2)) end
local ids = {}
for i = n + 3, #ARGV do ids[#ids + 1] = redis.call('XADD', KEYS[3], '*', 'e', ARGV[i]) end
return ids";

/// The journal of a SKU kept by location, written by hand in format 2
/// (`src/journal/mod.rs`): each location's available and held units kept
/// in step in the SKU's locations hash, every entry remembered as read
/// back through [`Entry::parse`].
struct LocatedJournal {
    sku: Sku,
    units: BTreeMap<&'static str, (i64, i64)>,
    written: Vec<Entry>,
}

impl LocatedJournal {
    fn new(cluster: &Stage, conn: &mut redis::cluster::ClusterConnection, sku: &str) -> Self {
        let sku = Sku::parse(sku.to_owned().into()).unwrap();
        let layout = &cluster.keys;
        let shard = &layout.sweep_shards()[layout.sweep_shard_index(&sku)];
        let _: i64 = conn.sadd(&shard.journals, sku.as_bytes()).unwrap();
        LocatedJournal {
            sku,
            units: BTreeMap::new(),
            written: Vec::new(),
        }
    }

    /// One call: for each (location, stock change, held change), an entry
    /// of `event` and `id` (a `set`'s stock change is the stock it sets).
    fn call(
        &mut self,
        cluster: &Stage,
        conn: &mut redis::cluster::ClusterConnection,
        event: &str,
        id: &str,
        order_no: &str,
        changes: &[(&'static str, i64, i64)],
    ) {
        let (mut fields, mut texts) = (Vec::new(), Vec::new());
        for &(location, ds, dh) in changes {
            let (stock, held) = self.units.entry(location).or_insert((0, 0));
            let ds = if event == "set" { ds - *stock } else { ds };
            *stock += ds;
            *held += dh;
            fields.extend([location.to_owned(), stock.to_string()]);
            fields.extend([format!("{location}:held"), held.to_string()]);
            texts.push(format!(
                "2 {event} {id} {ds} {dh} {stock} {held} {location} {order_no}"
            ));
        }
        let layout = &cluster.keys;
        let held: i64 = self.units.values().map(|(_, held)| held).sum();
        let ids: Vec<String> = redis::cmd("EVAL")
            .arg(APPEND_AT)
            .arg(4)
            .arg(layout.stock_key(&self.sku))
            .arg(layout.locations_key(&self.sku))
            .arg(layout.journal_key(&self.sku))
            .arg(layout.sku_keys(&self.sku).held)
            .arg(held)
            .arg(fields.len())
            .arg(&fields)
            .arg(&texts)
            .query(conn)
            .unwrap();
        for (at, text) in ids.iter().zip(texts) {
            let entry = Entry::parse(at, &[("e".to_owned(), text)]).expect("the shape parses");
            assert_eq!((entry.format, entry.order_no.as_str()), (2, order_no));
            self.written.push(entry);
        }
    }
}

/// Each row of `stockgate_account` of `skus`, as (sku, location, stock,
/// held, from a baseline), sorted.
async fn accounts_of(db: &BooksDb, skus: &[&str]) -> Vec<(String, String, i64, i64, bool)> {
    let rows = db
        .rows(&format!(
            "SELECT sku, location, stock, held, from_baseline FROM stockgate_account
              WHERE sku IN ('{}') ORDER BY sku, location",
            skus.join("', '")
        ))
        .await;
    rows.iter()
        .map(|row| {
            let text = |i: usize| row[i].clone().unwrap();
            (
                text(0),
                text(1),
                text(2).parse().unwrap(),
                text(3).parse().unwrap(),
                // PostgreSQL's boolean reads "t", MariaDB's "1".
                matches!(text(4).as_str(), "t" | "1"),
            )
        })
        .collect()
}

both! { async fn located_entries_keep_an_account_per_location }
/// A SKU kept by location (docs/locations.md): its format 2 entries land
/// with their location, the database keeps an account per (sku,
/// location) beside a SKU that keeps one number (location ''), the
/// migration that added the location runs again unharmed, and reconcile
/// compares each location with the SKU's locations hash (entries not
/// moved yet included) and names the location that drifts.
async fn located_entries_keep_an_account_per_location(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let mut conn = cluster.cluster_connection().unwrap();
    let mut plain = Journals::new(&cluster);
    plain.day("loc-plain", 6);
    let mut located = LocatedJournal::new(&cluster, &mut conn, "loc-1");
    let mut call = |event, id, order_no, changes: &[(&'static str, i64, i64)]| {
        located.call(&cluster, &mut conn, event, id, order_no, changes)
    };
    call("set", "op-w1", "", &[("w1", 20, 0)]);
    call("set", "op-w2", "", &[("w2", 10, 0)]);
    // An allocation split over both, a hold over both and its confirm, a
    // hold at one: their entries interleave in the SKU's one stream.
    call("deduct", "d-1", "ORD-L1", &[("w1", -5, 0)]);
    call("hold", "h-1", "ORD-L2", &[("w1", -3, 3), ("w2", -2, 2)]);
    call("confirm", "h-1", "ORD-L2", &[("w1", 0, -3), ("w2", 0, -2)]);
    call("deduct", "d-2", "ORD L3", &[("w2", -4, 0), ("w1", -1, 0)]);
    call("hold", "h-2", "", &[("w2", -1, 1)]);
    // A floor is no units: reconcile passes it by.
    let locations_key = cluster.keys.locations_key(&located.sku);
    let _: i64 = conn.hset(&locations_key, "w1:floor", 2).unwrap();

    let moved = located.written.len() + plain.written.len();
    assert_eq!(
        drain(&cluster, &db),
        (
            Some(0),
            format!(
                "moved {moved} entries; nothing left to move
"
            )
        )
    );
    let stored: Vec<Entry> = db
        .entries()
        .await
        .into_iter()
        .filter_map(|(sku, entry)| (sku == "loc-1").then_some(entry))
        .collect();
    assert_eq!(stored, located.written, "every entry with its location");
    let (stock, held) = plain.state["loc-plain"];
    let expected = |located: &LocatedJournal| {
        let mut rows = vec![("loc-plain".to_owned(), String::new(), stock, held, true)];
        rows.splice(
            0..0,
            located.units.iter().map(|(location, (stock, held))| {
                (
                    "loc-1".to_owned(),
                    location.to_string(),
                    *stock,
                    *held,
                    true,
                )
            }),
        );
        rows
    };
    assert_eq!(
        accounts_of(&db, &["loc-1", "loc-plain"]).await,
        expected(&located)
    );

    // The migration again, as a sink that died before recording it
    // would apply it: nothing changes.
    let version = db.sql("3", "2");
    db.execute(&format!(
        "DELETE FROM stockgate_migrations WHERE version = {version}"
    ))
    .await;
    assert_eq!(
        drain(&cluster, &db),
        (
            Some(0),
            "moved 0 entries; nothing left to move
"
            .to_owned()
        )
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM stockgate_migrations WHERE version = {version}"
        ))
        .await,
        1
    );
    assert_eq!(
        accounts_of(&db, &["loc-1", "loc-plain"]).await,
        expected(&located)
    );

    // Not moved yet: the journal's tail explains each location.
    let mut call = |event, id, order_no, changes: &[(&'static str, i64, i64)]| {
        located.call(&cluster, &mut conn, event, id, order_no, changes)
    };
    call("cancel", "h-2", "", &[("w2", 1, -1)]);
    call("deduct", "d-4", "", &[("w1", -2, 0)]);
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 skus: 2 agree, 0 drift"), "{text}");

    // Writes around stockgate: 2 units more at w2, and a unit held at w1
    // that no entry explains.
    let _: i64 = conn.hincr(&locations_key, "w2", 2).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &["loc-1"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("loc-1 location w2: DRIFT: redis stock") && text.contains("stock off by 2"),
        "{text}"
    );
    assert!(!text.contains("location w1"), "{text}");
    // Each location's entries follow from that location's before them,
    // however the locations interleave.
    assert!(
        text.contains("every entry follows from the one before")
            && !text.contains("does not follow"),
        "{text}"
    );
    let _: i64 = conn.hincr(&locations_key, "w1:held", 1).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("loc-1 location w1: DRIFT:") && text.contains("held off by 1"),
        "{text}"
    );
    assert!(text.contains("loc-1 location w2: DRIFT:"), "{text}");
    // That held unit is in no `:held` either: the SKU's own sum is off.
    assert!(
        text.contains("loc-1: DRIFT: redis held 0 over the sku, its locations hold 1"),
        "{text}"
    );
    assert!(text.contains("1 agree, 1 drift"), "{text}");
}

both! { async fn allocations_through_stockgate_reach_the_books_per_location }
/// End to end for a SKU kept by location (docs/locations.md): every change
/// made through stockgate with --journal (locations set and added to, a
/// split allocation, a hold shrunk and confirmed, a revert) lands in the
/// database with its location, the account per (sku, location) equals
/// each location's units and held units in Redis, and reconcile agrees;
/// the SKU's held units made other than its locations' summed, by a raw
/// write, are a drift.
async fn allocations_through_stockgate_reach_the_books_per_location(engine: Engine) {
    let cluster = Stage::shared();
    let db = BooksDb::start(engine);
    let server = support::proxy(cluster.seeds(), |c| {
        c.keys = cluster.keys.clone();
        c.journal = true;
        c.admin_commands = true;
        c.sweeper = false;
    })
    .await;
    let mut conn = support::client(&server, false).await;
    let calls: &[&[&str]] = &[
        &[
            "STOCK.SET",
            "loc-e2e",
            "10",
            "le-op1",
            "AT",
            "w1",
            "FLOOR",
            "1",
        ],
        &["STOCK.SET", "loc-e2e", "6", "le-op2", "AT", "w2"],
        &["DEDUCT.AT", "loc-e2e", "12", "le-d1", "SPLIT", "w1", "w2"],
        &[
            "HOLD.AT", "loc-e2e", "2", "le-h1", "60000", "WHOLE", "w1", "w2",
        ],
        &["HOLD.SHRINK", "loc-e2e", "le-h1", "le-c1", "1"],
        &["CONFIRM", "loc-e2e", "le-h1"],
        &["REVERT", "loc-e2e", "le-d1"],
        &["STOCK.ADD", "loc-e2e", "4", "le-op3", "AT", "w2"],
        &[
            "HOLD.AT", "loc-e2e", "3", "le-h2", "60000", "SPLIT", "w2", "w1",
        ],
    ];
    for args in calls {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        let reply: redis::Value = cmd.query_async(&mut conn).await.unwrap();
        let redis::Value::Array(items) = &reply else {
            panic!("{args:?}: {reply:?}")
        };
        assert_eq!(items[0], redis::Value::Int(0), "{args:?}: {reply:?}");
    }
    let sku = Sku::parse("loc-e2e".into()).unwrap();
    let mut plain = cluster.cluster_connection().unwrap();
    let entries: i64 = redis::cmd("XLEN")
        .arg(cluster.keys.journal_key(&sku))
        .query(&mut plain)
        .unwrap();
    // Two sets, two splits of the DEDUCT.AT, the hold, its shrink, its
    // confirm, the revert's two, the add, and the last hold's one.
    assert_eq!(entries, 11, "one entry per location a change moved");
    let (code, text) = drain(&cluster, &db);
    assert_eq!(code, Some(0), "{text}");
    let fields: Vec<Option<i64>> = redis::cmd("HMGET")
        .arg(cluster.keys.locations_key(&sku))
        .arg(&["w1", "w1:held", "w2", "w2:held"])
        .query(&mut plain)
        .unwrap();
    let redis_side: Vec<(String, String, i64, i64, bool)> = ["w1", "w2"]
        .iter()
        .enumerate()
        .map(|(i, location)| {
            (
                "loc-e2e".to_owned(),
                location.to_string(),
                fields[2 * i].unwrap(),
                fields[2 * i + 1].unwrap_or(0),
                true,
            )
        })
        .collect();
    assert_eq!(accounts_of(&db, &["loc-e2e"]).await, redis_side);
    // w1 10 (floor 1) and w2 6 gave 9 and 3; w2 then held 2, shrunk to 1,
    // confirmed; the DEDUCT.AT's 12 came back where they came from; w2 got
    // 4, then held 3.
    assert_eq!(
        (
            redis_side[0].2,
            redis_side[0].3,
            redis_side[1].2,
            redis_side[1].3
        ),
        (10, 0, 6, 3)
    );
    let (code, text) = reconcile(&cluster, &db.url(), &["loc-e2e"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 agree, 0 drift"), "{text}");

    // A write around stockgate: the SKU's held units one more than its
    // locations hold. Every location still agrees with its books; the
    // SKU's own sum does not.
    let held_key = cluster.keys.sku_keys(&sku).held;
    let _: i64 = plain.incr(&held_key, 1).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &["loc-e2e"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(
            "loc-e2e: DRIFT: redis held 4 over the sku, its locations hold 3 (held off by 1)"
        ),
        "{text}"
    );
    assert!(!text.contains("location w"), "{text}");
    assert!(text.contains("1 skus: 0 agree, 1 drift"), "{text}");
    // The same units missing from `:held`: a drift the other way.
    let _: i64 = plain.decr(&held_key, 2).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &["loc-e2e"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("held off by -1"), "{text}");
    let _: i64 = plain.incr(&held_key, 1).unwrap();
    let (code, text) = reconcile(&cluster, &db.url(), &["loc-e2e"]);
    assert_eq!(code, 0, "{text}");
}

/// What a URL gets: the TLS version the server sees the session run
/// over (None in plaintext), or the error that stopped it.
async fn tls_of(url: &str) -> Result<Option<String>, String> {
    let target = stockgate::journal::database::Target::parse(url)?;
    let mut books = stockgate::journal::database::Books::connect(&target)
        .await
        .map_err(|e| e.to_string())?;
    books.tls_in_use().await.map_err(|e| e.to_string())
}

/// PostgreSQL over TLS with libpq's meanings, against a server with
/// `ssl=on` and certificates made here (the server's for `localhost`
/// only): verify-full checks the name (127.0.0.1 is another one) and the
/// CA, verify-ca the CA alone, require and the default on loopback
/// encrypt without checking, a client certificate is presented when the
/// server asks for one, a password never shows in an error; and the sink
/// and reconcile work through verify-full with a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_go_to_postgresql_over_verified_tls() {
    let certs = support::certs::Certs::make();
    let pg = Postgres::start_with_tls(certs.dir(), support::certs::CLIENT_USER);
    let admin = pg.client().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {user} LOGIN; GRANT ALL ON SCHEMA public TO {user}",
            user = support::certs::CLIENT_USER
        ))
        .await
        .unwrap();
    let (ca, other_ca) = (certs.param("ca.crt"), certs.param("other-ca.crt"));
    let client = format!(
        "sslcert={}&sslkey={}",
        certs.param("client.crt"),
        certs.param("client.key")
    );
    let user = support::certs::CLIENT_USER;
    let encrypted = |got: Result<Option<String>, String>, what: &str| match got {
        Ok(Some(version)) => assert!(version.starts_with("TLS"), "{what}: {version}"),
        other => panic!("{what}: encrypted expected, got {other:?}"),
    };
    let refused = |got: Result<Option<String>, String>, what: &str, says: &str| match got {
        Err(err) => assert!(err.contains(says), "{what}: {err:?} should say {says:?}"),
        Ok(tls) => panic!("{what}: refused expected, got a session ({tls:?})"),
    };

    assert_eq!(
        tls_of(&pg.url_with("stockgate", "127.0.0.1", "sslmode=disable")).await,
        Ok(None)
    );
    encrypted(
        tls_of(&format!(
            "postgres://stockgate@127.0.0.1:{}/postgres",
            pg.port
        ))
        .await,
        "no sslmode, on loopback: prefer",
    );
    encrypted(
        tls_of(&pg.url_with("stockgate", "127.0.0.1", "sslmode=require")).await,
        "require",
    );
    encrypted(
        tls_of(&pg.url_with(
            "stockgate",
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ))
        .await,
        "verify-full of the name on the certificate",
    );
    refused(
        tls_of(&pg.url_with(
            "stockgate",
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ))
        .await,
        "verify-full of a name the certificate lacks",
        "certificate not valid for name \"127.0.0.1\"",
    );
    encrypted(
        tls_of(&pg.url_with(
            "stockgate",
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={ca}"),
        ))
        .await,
        "verify-ca: the chain, whatever the name",
    );
    for mode in ["verify-ca", "verify-full"] {
        refused(
            tls_of(&pg.url_with(
                "stockgate",
                "localhost",
                &format!("sslmode={mode}&sslrootcert={other_ca}"),
            ))
            .await,
            &format!("{mode} against another CA"),
            "invalid peer certificate: UnknownIssuer",
        );
    }
    encrypted(
        tls_of(&pg.url_with(
            user,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}&{client}"),
        ))
        .await,
        "a client certificate the server asks for",
    );
    refused(
        tls_of(&pg.url_with(
            user,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ))
        .await,
        "no client certificate where the server asks for one",
        "certificate",
    );
    let secret = format!(
        "postgres://stockgate:hunter2@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
        pg.port
    );
    let err = tls_of(&secret).await.unwrap_err();
    assert!(
        !err.contains("hunter2") && err.contains("stockgate:***@"),
        "{err}"
    );

    // The sink and reconcile, through verify-full and a client certificate.
    let cluster = Stage::shared();
    let mut journals = Journals::new(&cluster);
    for sku in skus("tls", 3) {
        journals.day(&sku, 6);
    }
    let url = pg.url_with(
        user,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}&{client}"),
    );
    let out = Command::new(support::stockgate_bin())
        .args(["journal", "sink", "--drain", "--database", &url])
        .args(["--upstream", &cluster.seeds().join(",")])
        .args(cluster.prefix_args())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "moved {} entries; nothing left to move\n",
            journals.written.len()
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let moved: i64 = admin
        .query_one("SELECT count(*) FROM stockgate_journal", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(moved as usize, journals.written.len());
    let (code, text) = reconcile(&cluster, &url, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("3 skus: 3 agree"), "{text}");
}

/// MariaDB over TLS with the MySQL client's `ssl-mode`, against the
/// shared server (TLS on, its certificate for `localhost` only):
/// VERIFY_IDENTITY checks the name and the CA, VERIFY_CA the CA alone,
/// REQUIRED and the default on loopback encrypt without checking, a
/// client certificate is presented where the user must have one, a
/// server without TLS fails REQUIRED; and the sink and reconcile work
/// through VERIFY_IDENTITY with a client certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_books_go_to_mariadb_over_verified_tls() {
    let (server, certs) = support::mariadb::MariaDb::shared();
    let database = server.database();
    let (ca, other_ca) = (certs.param("ca.crt"), certs.param("other-ca.crt"));
    let client = format!(
        "ssl-cert={}&ssl-key={}",
        certs.param("client.crt"),
        certs.param("client.key")
    );
    let user = support::certs::CLIENT_USER;
    let url = |user: &str, host: &str, params: &str| server.url_with(user, host, &database, params);
    let encrypted = |got: Result<Option<String>, String>, what: &str| match got {
        Ok(Some(version)) => assert!(version.starts_with("TLS"), "{what}: {version}"),
        other => panic!("{what}: encrypted expected, got {other:?}"),
    };
    let refused = |got: Result<Option<String>, String>, what: &str, says: &str| match got {
        Err(err) => assert!(err.contains(says), "{what}: {err:?} should say {says:?}"),
        Ok(tls) => panic!("{what}: refused expected, got a session ({tls:?})"),
    };

    assert_eq!(
        tls_of(&url("stockgate", "127.0.0.1", "ssl-mode=DISABLED")).await,
        Ok(None)
    );
    encrypted(
        tls_of(&format!(
            "mysql://stockgate@127.0.0.1:{}/{database}",
            server.port
        ))
        .await,
        "no ssl-mode, on loopback: PREFERRED",
    );
    encrypted(
        tls_of(&url("stockgate", "127.0.0.1", "ssl-mode=REQUIRED")).await,
        "REQUIRED",
    );
    encrypted(
        tls_of(&url(
            "stockgate",
            "localhost",
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        ))
        .await,
        "VERIFY_IDENTITY of the name on the certificate",
    );
    refused(
        tls_of(&url(
            "stockgate",
            "127.0.0.1",
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        ))
        .await,
        "VERIFY_IDENTITY of a name the certificate lacks",
        "certificate not valid for name \"127.0.0.1\"",
    );
    encrypted(
        tls_of(&url(
            "stockgate",
            "127.0.0.1",
            &format!("ssl-mode=VERIFY_CA&ssl-ca={ca}"),
        ))
        .await,
        "VERIFY_CA: the chain, whatever the name",
    );
    for mode in ["VERIFY_CA", "VERIFY_IDENTITY"] {
        refused(
            tls_of(&url(
                "stockgate",
                "localhost",
                &format!("ssl-mode={mode}&ssl-ca={other_ca}"),
            ))
            .await,
            &format!("{mode} against another CA"),
            "UnknownIssuer",
        );
    }
    encrypted(
        tls_of(&url(
            user,
            "localhost",
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&{client}"),
        ))
        .await,
        "a client certificate the user must present",
    );
    refused(
        tls_of(&url(
            user,
            "localhost",
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        ))
        .await,
        "no client certificate where the user must present one",
        "Access denied",
    );
    let err = tls_of(&format!(
        "mysql://stockgate:hunter2@127.0.0.1:{}/{database}?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}",
        server.port
    ))
    .await
    .unwrap_err();
    assert!(
        !err.contains("hunter2") && err.contains("stockgate:***@"),
        "{err}"
    );
    // A server without TLS: REQUIRED never falls back to plaintext.
    let plain = support::mariadb::MariaDb::start();
    let plain_database = plain.database();
    refused(
        tls_of(&plain.url_with(
            "stockgate",
            "127.0.0.1",
            &plain_database,
            "ssl-mode=REQUIRED",
        ))
        .await,
        "REQUIRED against a server without TLS",
        "Client asked for SSL but server does not have this capability",
    );
    assert_eq!(
        tls_of(&plain.url_with("stockgate", "127.0.0.1", &plain_database, "")).await,
        Ok(None),
        "PREFERRED goes without TLS where the server has none"
    );
    drop(plain);

    // The sink and reconcile, through VERIFY_IDENTITY and a client
    // certificate.
    let cluster = Stage::shared();
    let mut journals = Journals::new(&cluster);
    for sku in skus("mtls", 3) {
        journals.day(&sku, 6);
    }
    let url = url(
        user,
        "localhost",
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}&{client}"),
    );
    let out = Command::new(support::stockgate_bin())
        .args(["journal", "sink", "--drain", "--database", &url])
        .args(["--upstream", &cluster.seeds().join(",")])
        .args(cluster.prefix_args())
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "moved {} entries; nothing left to move\n",
            journals.written.len()
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, text) = reconcile(&cluster, &url, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("3 skus: 3 agree"), "{text}");
}
