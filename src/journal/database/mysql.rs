//! The books in MySQL 8 and MariaDB 10.11: the schema
//! (`migrations/mysql/`), a batch in one transaction, the shard locks as
//! named locks (`GET_LOCK`), and each (SKU, location)'s account as of an
//! entry.
//!
//! One connection does everything, as in PostgreSQL: a named lock
//! belongs to the session that took it, so the shard locks live and die
//! with the connection that writes. Named locks are the server's, not a
//! database's: their names carry the database's ([`LockNames`]), so two
//! deployments in two databases of one server never share one.
//!
//! MySQL has no `INSERT ... RETURNING` (MariaDB has) and no
//! `ON CONFLICT DO NOTHING` that says which rows were new, so a batch
//! first reads which of its ids the table holds, then inserts the rest.
//! A second sink inserting one of those ids meanwhile (two sinks on a
//! shard for a moment) makes the insert fail on the key: the transaction
//! rolls back, and the next round finds the entry there.

use super::super::fault::JournalFault;
use super::super::{Entry, Event};
use super::target::MysqlTarget;
use super::tls::{Roots, TlsMode, TlsSettings};
use super::{Account, Accounts, Committed, SkuEntry};
use crate::metrics::JournalSource;
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{ClientIdentity, Conn, OptsBuilder, Params, Row, SslOpts, Value};
use std::collections::{HashMap, HashSet};

/// The schema, in order; each applied once, recorded in
/// `stockgate_migrations`.
const MIGRATIONS: [(i32, &str); 2] = [
    (
        1,
        include_str!("../../../migrations/mysql/0001_journal.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/mysql/0002_location.sql"),
    ),
];

/// Rows per INSERT or lookup: 12 placeholders a row, far below the
/// protocol's 65,535 a statement.
const ROWS_PER_STATEMENT: usize = 1000;

/// How many sinks can count themselves, each holding one member lock:
/// past 16 sinks each takes one shard of the 16 anyway.
const MEMBER_SLOTS: usize = 16;

/// Set on every session: strict, so a value that does not fit fails its
/// batch instead of being cut to fit (the same entry must read back the
/// same), and UTC, so `sunk_at` reads alike from any client.
const SESSION: &str =
    "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'";

/// The names of the sinks' locks in one database. GET_LOCK's names are
/// the server's (at most 64 characters), so each starts with the
/// database's.
#[derive(Debug, Clone)]
pub struct LockNames {
    prefix: String,
}

impl LockNames {
    pub fn of(database: &str) -> LockNames {
        LockNames {
            prefix: format!("stockgate/{database}/"),
        }
    }

    fn migrate(&self) -> String {
        format!("{}migrate", self.prefix)
    }

    fn member(&self, slot: usize) -> String {
        format!("{}sink{slot}", self.prefix)
    }

    fn shard(&self, shard: usize) -> String {
        format!("{}s{shard}", self.prefix)
    }
}

pub struct MysqlBooks {
    conn: Conn,
    locks: LockNames,
    /// `--database-schema`, and whether the session is in it (`USE`): a
    /// schema no sink has made yet is made by the first sink's
    /// migration, and until then nothing else reads it.
    schema: Option<String>,
    in_schema: bool,
}

fn database(err: mysql_async::Error) -> JournalFault {
    JournalFault::mysql(err)
}

impl MysqlBooks {
    /// Connects with `target`'s TLS. `PREFERRED` goes without TLS only
    /// when the server offers none.
    pub async fn connect(target: &MysqlTarget) -> Result<MysqlBooks, JournalFault> {
        let base = OptsBuilder::default()
            .ip_or_hostname(target.host.clone())
            .tcp_port(target.port)
            .user(Some(target.user.clone()))
            .pass(target.password.clone())
            .db_name(Some(target.database.clone()))
            // The host named, over TCP (and its TLS): never a Unix
            // socket found by asking the server.
            .prefer_socket(false)
            .init(vec![SESSION]);
        let conn = match target.tls.mode {
            TlsMode::Disable => Conn::new(base).await,
            TlsMode::Prefer => {
                let tls = base.clone().ssl_opts(ssl_opts(&target.tls)?);
                match Conn::new(tls).await {
                    Err(mysql_async::Error::Driver(
                        mysql_async::DriverError::NoClientSslFlagFromServer,
                    )) => Conn::new(base).await,
                    other => other,
                }
            }
            _ => Conn::new(base.ssl_opts(ssl_opts(&target.tls)?)).await,
        }
        .map_err(database)?;
        let mut books = MysqlBooks {
            conn,
            locks: LockNames::of(target.schema.as_deref().unwrap_or(&target.database)),
            schema: target.schema.clone(),
            in_schema: target.schema.is_none(),
        };
        if let Some(schema) = &target.schema {
            match books.conn.query_drop(format!("USE `{schema}`")).await {
                Ok(()) => books.in_schema = true,
                // ER_BAD_DB_ERROR: the first sink's migration makes it.
                Err(mysql_async::Error::Server(err)) if err.code == 1049 => {}
                Err(err) => return Err(database(err)),
            }
        }
        Ok(books)
    }

    /// Fails unless the session is in the books' schema.
    fn require_schema(&self) -> Result<(), JournalFault> {
        match &self.schema {
            Some(schema) if !self.in_schema => Err(JournalFault::new(
                JournalSource::Database,
                true,
                format!(
                    "schema {schema} does not exist yet: the sink makes it when it starts \
                     (or check --database-schema)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The first column of the first row of `sql`'s answer, an integer
    /// (None for no row or NULL).
    async fn number(
        &mut self,
        sql: impl AsRef<str>,
        params: impl Into<Params> + Send,
    ) -> Result<Option<i64>, JournalFault> {
        let row: Option<Row> = self
            .conn
            .exec_first(sql.as_ref(), params)
            .await
            .map_err(database)?;
        match row {
            Some(row) => column::<Option<i64>>(&row, 0),
            None => Ok(None),
        }
    }

    pub async fn tls_in_use(&mut self) -> Result<Option<String>, JournalFault> {
        let row: Option<Row> = self
            .conn
            .query_first("SHOW SESSION STATUS LIKE 'Ssl_version'")
            .await
            .map_err(database)?;
        Ok(match row {
            Some(row) => Some(column::<String>(&row, 1)?).filter(|v| !v.is_empty()),
            None => None,
        })
    }

    /// Applies the migrations not applied yet, one statement at a time,
    /// under a named lock: MySQL commits each DDL statement by itself, so
    /// the lock (not a transaction) keeps sinks starting together from
    /// applying one twice at once, and every statement can run again.
    pub async fn migrate(&mut self) -> Result<(), JournalFault> {
        let lock = self.locks.migrate();
        let got = self
            .number("SELECT GET_LOCK(?, 60)", (lock.as_str(),))
            .await?;
        if got != Some(1) {
            return Err(JournalFault::new(
                JournalSource::Database,
                true,
                format!("another sink held the lock {lock} for a minute while migrating"),
            ));
        }
        let applied = self.apply_migrations().await;
        let released = self
            .conn
            .exec_drop("SELECT RELEASE_LOCK(?)", (lock.as_str(),))
            .await
            .map_err(database);
        applied.and(released)
    }

    async fn apply_migrations(&mut self) -> Result<(), JournalFault> {
        if let (Some(schema), false) = (&self.schema, self.in_schema) {
            self.conn
                .query_drop(format!(
                    "CREATE SCHEMA IF NOT EXISTS `{schema}` \
                     DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                ))
                .await
                .map_err(database)?;
            self.conn
                .query_drop(format!("USE `{schema}`"))
                .await
                .map_err(database)?;
            self.in_schema = true;
        }
        self.conn
            .query_drop(
                "CREATE TABLE IF NOT EXISTS stockgate_migrations (
                     version INT PRIMARY KEY,
                     applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                 ) ENGINE = InnoDB",
            )
            .await
            .map_err(database)?;
        for (version, sql) in MIGRATIONS {
            let applied = self
                .number(
                    "SELECT 1 FROM stockgate_migrations WHERE version = ?",
                    (version,),
                )
                .await?;
            if applied.is_some() {
                continue;
            }
            for statement in statements(sql) {
                self.conn.query_drop(statement).await.map_err(database)?;
            }
            self.conn
                .exec_drop(
                    "INSERT INTO stockgate_migrations (version) VALUES (?)",
                    (version,),
                )
                .await
                .map_err(database)?;
            tracing::info!(version, "applied migration");
        }
        Ok(())
    }

    /// Takes the first free member lock: each sink counts itself so.
    pub async fn join_sinks(&mut self) -> Result<(), JournalFault> {
        for slot in 0..MEMBER_SLOTS {
            let name = self.locks.member(slot);
            if self.number("SELECT GET_LOCK(?, 0)", (name,)).await? == Some(1) {
                return Ok(());
            }
        }
        // Every slot taken: sixteen sinks or more, one shard each anyway.
        Ok(())
    }

    pub async fn sinks(&mut self) -> Result<usize, JournalFault> {
        let slots: Vec<Value> = (0..MEMBER_SLOTS)
            .map(|slot| Value::from(self.locks.member(slot)))
            .collect();
        let sql = format!(
            "SELECT {}",
            vec!["(IS_USED_LOCK(?) IS NOT NULL)"; MEMBER_SLOTS].join(" + ")
        );
        let count = self.number(sql, Params::Positional(slots)).await?;
        Ok(count.unwrap_or(0).max(1) as usize)
    }

    pub async fn claim(&mut self, shard: usize) -> Result<bool, JournalFault> {
        let name = self.locks.shard(shard);
        Ok(self.number("SELECT GET_LOCK(?, 0)", (name,)).await? == Some(1))
    }

    pub async fn release(&mut self, shard: usize) -> Result<(), JournalFault> {
        self.conn
            .exec_drop("SELECT RELEASE_LOCK(?)", (self.locks.shard(shard),))
            .await
            .map_err(database)
    }

    /// One transaction: which of the batch's ids the table holds, the
    /// rest inserted, those held with other content kept as conflicts.
    pub async fn commit(&mut self, batch: &[SkuEntry]) -> Result<Committed, JournalFault> {
        self.require_schema()?;
        for item in batch {
            check_fits(item)?;
        }
        self.conn
            .query_drop("START TRANSACTION")
            .await
            .map_err(database)?;
        let committed = self.write(batch).await;
        match committed {
            Ok(committed) => {
                self.conn.query_drop("COMMIT").await.map_err(database)?;
                Ok(committed)
            }
            // The connection is dropped after any database fault (the
            // sink connects again), which rolls the transaction back.
            Err(fault) => Err(fault),
        }
    }

    async fn write(&mut self, batch: &[SkuEntry]) -> Result<Committed, JournalFault> {
        let mut stored: HashMap<(String, i64, i64), Option<Entry>> = HashMap::new();
        for chunk in batch.chunks(ROWS_PER_STATEMENT) {
            // The batch's ids as a derived table joined on the key: one
            // primary-key lookup each. A `(sku, entry_ms, entry_seq) IN
            // (...)` of as many rows took MariaDB 0.7-1.7 s a batch to plan
            // (its range optimizer), against 0.04 s for this.
            let sql = format!(
                "SELECT j.sku, j.entry_ms, j.entry_seq, j.format, j.event, j.request_id,
                        j.order_no, j.stock_change, j.held_change, j.stock_after, j.held_after,
                        j.location
                   FROM ({}) w
                   JOIN stockgate_journal j
                     ON j.sku = w.sku COLLATE utf8mb4_bin
                    AND j.entry_ms = w.entry_ms AND j.entry_seq = w.entry_seq",
                std::iter::once("SELECT ? AS sku, ? AS entry_ms, ? AS entry_seq")
                    .chain(std::iter::repeat_n("SELECT ?, ?, ?", chunk.len() - 1))
                    .collect::<Vec<_>>()
                    .join(" UNION ALL ")
            );
            let keys: Vec<Value> = chunk
                .iter()
                .flat_map(|item| {
                    let (sku, ms, seq) = key(item);
                    [Value::from(sku), Value::from(ms), Value::from(seq)]
                })
                .collect();
            let rows: Vec<Row> = self
                .conn
                .exec(sql, Params::Positional(keys))
                .await
                .map_err(database)?;
            for row in rows {
                // The key from its own columns: a row whose event this
                // stockgate doesn't know has no entry, and still its id.
                let key = (column(&row, 0)?, column(&row, 1)?, column(&row, 2)?);
                stored.insert(key, entry_of(&row, 1));
            }
        }
        let mut committed = Committed::default();
        let (mut new, mut differing) = (Vec::new(), Vec::new());
        let mut seen = HashSet::new();
        for item in batch {
            let k = key(item);
            match stored.get(&k) {
                None if seen.insert(k.clone()) => new.push(item),
                // The same id twice in one batch: the stream gives each
                // once, so this is the first's copy.
                None => committed.already += 1,
                Some(Some(entry)) if *entry == item.entry => committed.already += 1,
                Some(_) => {
                    tracing::error!(
                        sku = item.sku,
                        id = item.entry.stream_id(),
                        "journal conflict: this id is in the database with other content \
                         (a failover lost an entry and Redis gave its id again); kept in \
                         stockgate_journal_conflicts"
                    );
                    differing.push(item);
                }
            }
        }
        for chunk in new.chunks(ROWS_PER_STATEMENT) {
            committed.moved += self.insert("stockgate_journal", chunk, "").await?;
        }
        for chunk in differing.chunks(ROWS_PER_STATEMENT) {
            // A conflict already recorded (the batch sent again) stays
            // as it was.
            committed.conflicts += self
                .insert(
                    "stockgate_journal_conflicts",
                    chunk,
                    " ON DUPLICATE KEY UPDATE sku = sku",
                )
                .await?;
        }
        Ok(committed)
    }

    /// Inserts `rows` into `table`; the rows it added.
    async fn insert(
        &mut self,
        table: &str,
        rows: &[&SkuEntry],
        tail: &str,
    ) -> Result<u64, JournalFault> {
        let sql = format!(
            "INSERT INTO {table} (sku, entry_ms, entry_seq, format, event, request_id, order_no,
                                  stock_change, held_change, stock_after, held_after, location)
             VALUES {}{tail}",
            vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ")
        );
        let values: Vec<Value> = rows
            .iter()
            .flat_map(|item| {
                let (sku, ms, seq) = key(item);
                let e = &item.entry;
                [
                    Value::from(sku),
                    Value::from(ms),
                    Value::from(seq),
                    Value::from(e.format),
                    Value::from(e.event.name()),
                    Value::from(e.id.as_str()),
                    Value::from(e.order_no.as_str()),
                    Value::from(e.stock_change),
                    Value::from(e.held_change),
                    Value::from(e.stock),
                    Value::from(e.held),
                    Value::from(e.location.as_str()),
                ]
            })
            .collect();
        self.conn
            .exec_drop(sql, Params::Positional(values))
            .await
            .map_err(database)?;
        Ok(self.conn.affected_rows())
    }

    pub async fn skus(&mut self) -> Result<Vec<String>, JournalFault> {
        self.require_schema()?;
        let rows: Vec<Row> = self
            .conn
            .query("SELECT DISTINCT sku FROM stockgate_journal ORDER BY sku")
            .await
            .map_err(database)?;
        rows.iter().map(|row| column(row, 0)).collect()
    }

    /// The accounts of `wanted`, each SKU's as of its entry, in one
    /// query: the view's computation over the entries up to each SKU's.
    pub async fn accounts(
        &mut self,
        wanted: &[(String, Option<(u64, u64)>)],
    ) -> Result<HashMap<String, Accounts>, JournalFault> {
        self.require_schema()?;
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let sql = format!(
            "WITH wanted (sku, up_ms, up_seq) AS ({}),
             upto AS (
                 SELECT j.* FROM stockgate_journal j
                   JOIN wanted w ON j.sku = w.sku COLLATE utf8mb4_bin
                  WHERE j.entry_ms < w.up_ms OR (j.entry_ms = w.up_ms AND j.entry_seq <= w.up_seq)
             ),
             ranked AS (
                 SELECT sku, location, entry_ms, entry_seq, baseline, stock_change, held_change,
                        stock_after - stock_change AS opening_stock,
                        held_after - held_change AS opening_held,
                        ROW_NUMBER() OVER (PARTITION BY sku, location
                            ORDER BY baseline DESC,
                                     CASE WHEN baseline THEN entry_ms END DESC,
                                     CASE WHEN baseline THEN entry_seq END DESC,
                                     entry_ms, entry_seq) AS anchor_rank,
                        ROW_NUMBER() OVER (PARTITION BY sku, location
                            ORDER BY entry_ms DESC, entry_seq DESC) AS newest_rank
                   FROM upto
             )
             SELECT a.sku, a.baseline,
                    CAST(a.opening_stock + SUM(u.stock_change) AS SIGNED),
                    CAST(a.opening_held + SUM(u.held_change) AS SIGNED),
                    COUNT(*), n.entry_ms, n.entry_seq, a.location
               FROM ranked a
               JOIN ranked n ON n.sku = a.sku AND n.location = a.location AND n.newest_rank = 1
               JOIN ranked u ON u.sku = a.sku AND u.location = a.location
                          AND (u.entry_ms > a.entry_ms
                               OR (u.entry_ms = a.entry_ms AND u.entry_seq >= a.entry_seq))
              WHERE a.anchor_rank = 1
              GROUP BY a.sku, a.location, a.baseline, a.entry_ms, a.entry_seq, a.opening_stock,
                       a.opening_held, n.entry_ms, n.entry_seq",
            vec!["SELECT ?, ?, ?"; wanted.len()].join(" UNION ALL ")
        );
        let params: Vec<Value> = wanted
            .iter()
            .flat_map(|(sku, up_to)| {
                let (ms, seq) = super::up_to_columns(*up_to);
                [Value::from(sku.as_str()), Value::from(ms), Value::from(seq)]
            })
            .collect();
        let rows: Vec<Row> = self
            .conn
            .exec(sql, Params::Positional(params))
            .await
            .map_err(database)?;
        let mut accounts: HashMap<String, Accounts> = HashMap::new();
        for row in &rows {
            accounts.entry(column(row, 0)?).or_default().insert(
                column(row, 7)?,
                Account {
                    from_baseline: column(row, 1)?,
                    stock: column(row, 2)?,
                    held: column(row, 3)?,
                    entries: column(row, 4)?,
                    last: (column::<i64>(row, 5)? as u64, column::<i64>(row, 6)? as u64),
                },
            );
        }
        Ok(accounts)
    }

    pub async fn breaks(
        &mut self,
        sku: &str,
        location: &str,
        limit: i64,
    ) -> Result<Vec<Entry>, JournalFault> {
        self.require_schema()?;
        let rows: Vec<Row> = self
            .conn
            .exec(
                "SELECT * FROM (
                     SELECT sku, entry_ms, entry_seq, format, event, request_id, order_no,
                            stock_change, held_change, stock_after, held_after, location,
                            LAG(stock_after) OVER w AS stock_before,
                            LAG(held_after) OVER w AS held_before
                       FROM stockgate_journal WHERE sku = ? AND location = ?
                     WINDOW w AS (ORDER BY entry_ms, entry_seq)) chain
                  WHERE event <> 'set' AND stock_before IS NOT NULL
                    AND (stock_after - stock_change <> stock_before
                         OR held_after - held_change <> held_before)
                  ORDER BY entry_ms DESC, entry_seq DESC LIMIT ?",
                (sku, location, limit),
            )
            .await
            .map_err(database)?;
        Ok(rows.iter().filter_map(|row| entry_of(row, 1)).collect())
    }
}

/// mysql_async's TLS options for `tls` (any mode but disabled). The roots
/// are stockgate's alone: mysql_async's built-in ones (webpki-roots) are
/// off, so `ssl-ca` means that CA and `system` the system's store.
fn ssl_opts(tls: &TlsSettings) -> Result<SslOpts, JournalFault> {
    let bad = |e: String| JournalFault::new(JournalSource::Database, false, e);
    let mut opts = SslOpts::default().with_disable_built_in_roots(true);
    if let Some(client) = &tls.client {
        opts = opts.with_client_identity(Some(ClientIdentity::new(
            client.cert.clone().into(),
            client.key.clone().into(),
        )));
    }
    let roots = |roots: &Option<Roots>| {
        let roots = roots
            .as_ref()
            .ok_or_else(|| bad("no roots to verify the server's certificate against".into()))?;
        Ok::<_, JournalFault>(
            super::tls::root_certs(roots)
                .map_err(bad)?
                .into_iter()
                .map(|der| der.to_vec().into())
                .collect(),
        )
    };
    Ok(match tls.mode {
        // mysql_async builds its verifier even when it checks nothing, and
        // refuses an empty root store: its built-in roots fill it, unused.
        TlsMode::Disable | TlsMode::Prefer | TlsMode::Require => opts
            .with_disable_built_in_roots(false)
            .with_danger_accept_invalid_certs(true),
        TlsMode::VerifyCa => opts
            .with_root_certs(roots(&tls.roots)?)
            .with_danger_skip_domain_validation(true)
            // mysql_async 0.37.1 skips a name mismatch only when the
            // error's text contains "NotValidForName", which rustls 0.23
            // no longer writes (mysql_async#404). The name it checks
            // against is this one, which the error then quotes; rustls
            // checks the chain before any name, so only a certificate
            // whose chain passed meets this name check at all.
            .with_danger_tls_hostname_override(Some("NotValidForName.invalid")),
        TlsMode::VerifyFull => opts.with_root_certs(roots(&tls.roots)?),
    })
}

/// The statements of a migration file: each ends with `;` at a line's
/// end; `--` comment lines are dropped.
fn statements(sql: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        if line.trim_start().starts_with("--") {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if line.trim_end().ends_with(';') {
            statements.push(current.trim().trim_end_matches(';').to_owned());
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        statements.push(current.trim().to_owned());
    }
    statements
}

/// Column `index` of `row`, converted, or why not: mysql_async's own
/// conversions (`Row::get`, typed rows) panic on a value of another type.
fn column<T: FromValue>(row: &Row, index: usize) -> Result<T, JournalFault> {
    match row.get_opt::<T, usize>(index) {
        Some(Ok(value)) => Ok(value),
        Some(Err(err)) => Err(JournalFault::new(
            JournalSource::Database,
            true,
            format!("column {index} of a row: {err}"),
        )),
        None => Err(JournalFault::new(
            JournalSource::Database,
            true,
            format!("no column {index} in a row"),
        )),
    }
}

fn key(item: &SkuEntry) -> (String, i64, i64) {
    (
        item.sku.clone(),
        item.entry.at.0 as i64,
        item.entry.at.1 as i64,
    )
}

/// An entry's id and format must fit the table's BIGINT and INT columns.
fn check_fits(item: &SkuEntry) -> Result<(), JournalFault> {
    let entry = &item.entry;
    if i64::try_from(entry.at.0).is_ok()
        && i64::try_from(entry.at.1).is_ok()
        && i32::try_from(entry.format).is_ok()
    {
        return Ok(());
    }
    Err(JournalFault::new(
        JournalSource::Data,
        false,
        format!(
            "journal entry {} of {}: its id or format does not fit the table",
            entry.stream_id(),
            item.sku
        ),
    ))
}

/// An entry from a row whose columns from `first` are entry_ms,
/// entry_seq, format, event, request_id, order_no, stock_change,
/// held_change, stock_after, held_after, location. None for an event
/// this stockgate doesn't know (the table's CHECK allows none).
pub fn entry_of(row: &Row, first: usize) -> Option<Entry> {
    let int = |i: usize| column::<i64>(row, first + i).ok();
    let text = |i: usize| column::<String>(row, first + i).ok();
    let ms = int(0)? as u64;
    Some(Entry {
        at: (ms, int(1)? as u64),
        format: int(2)? as u32,
        event: Event::parse(&text(3)?)?,
        id: text(4)?,
        location: text(10)?,
        order_no: text(5)?,
        stock_change: int(6)?,
        held_change: int(7)?,
        stock: int(8)?,
        held: int(9)?,
        time_ms: ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_migration_splits_into_its_statements() {
        let sql = "-- a comment; with a semicolon\nCREATE TABLE a (\n  x INT\n);\n\nCREATE VIEW v AS\nSELECT 1;\n";
        assert_eq!(
            statements(sql),
            ["CREATE TABLE a (\n  x INT\n)", "CREATE VIEW v AS\nSELECT 1"]
        );
        assert_eq!(statements(MIGRATIONS[0].1).len(), 3);
        // Each column added by its SET, PREPARE, EXECUTE and DEALLOCATE,
        // then the view.
        assert_eq!(statements(MIGRATIONS[1].1).len(), 9);
        assert!(
            LockNames::of(&"d".repeat(super::super::target::MOST_DATABASE_NAME))
                .migrate()
                .len()
                <= 64
        );
        assert!(
            LockNames::of(&"d".repeat(super::super::target::MOST_DATABASE_NAME))
                .member(15)
                .len()
                <= 64
        );
    }
}
