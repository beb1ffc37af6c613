//! The books in PostgreSQL: the schema (`migrations/postgres/`), a batch
//! in one transaction (the rows as arrays, `UNNEST`ed), the shard locks as
//! session advisory locks, and each (SKU, location)'s account as
//! `stockgate_account_at` keeps it.
//!
//! One connection does everything, so the shard locks and the writes they
//! guard live and die together: when PostgreSQL restarts or the
//! connection breaks, the sink loses both at once, reconnects and claims
//! again.

use super::super::fault::JournalFault;
use super::super::{Entry, Event};
use super::target::PgTarget;
use super::tls::TlsMode;
use super::{Account, Accounts, Committed, SkuEntry};
use crate::metrics::JournalSource;
use std::collections::HashMap;
use tokio_postgres::{Client, NoTls};

/// The schema, in order; each applied once, recorded in
/// `stockgate_migrations`.
const MIGRATIONS: [(i32, &str); 3] = [
    (
        1,
        include_str!("../../../migrations/postgres/0001_journal.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_account_search_path.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_location.sql"),
    ),
];

/// `pg_advisory_xact_lock` key held while migrating: sinks starting
/// together apply the schema one after another.
const MIGRATION_LOCK: i64 = 0x5354_4F43_4B4D_4947; // "STOCKMIG"

/// The advisory lock space of the sweep shards (`pg_try_advisory_lock(
/// SHARD_LOCKS, shard)`): the sink holding one moves its journals.
pub const SHARD_LOCKS: i32 = 0x534B_4A31; // "SKJ1"

/// Every running sink holds `(SINK_MEMBERS, 0)` shared, so each can count
/// the others in `pg_locks` and take no more than its share of shards.
pub const SINK_MEMBERS: i32 = 0x534B_4A32; // "SKJ2"

/// The advisory lock keys of one deployment. Advisory locks are the
/// database's, whatever the schema: a deployment in a schema of its own
/// (`--database-schema`) takes keys derived from the schema's name, so
/// two deployments sharing a database never share a lock. Without one,
/// the constants above, as every sink before schemas took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgLocks {
    pub migrate: i64,
    pub shards: i32,
    pub members: i32,
}

impl PgLocks {
    pub fn of(schema: Option<&str>) -> PgLocks {
        let Some(schema) = schema else {
            return PgLocks {
                migrate: MIGRATION_LOCK,
                shards: SHARD_LOCKS,
                members: SINK_MEMBERS,
            };
        };
        let key = |what: &str| crc32fast::hash(format!("stockgate {what} {schema}").as_bytes());
        PgLocks {
            migrate: (i64::from(key("migrate")) << 32) | i64::from(key("migrate, again")),
            shards: key("shards") as i32,
            members: key("sinks") as i32,
        }
    }
}

pub struct PgBooks {
    client: Client,
    locks: PgLocks,
    schema: Option<String>,
}

fn database(err: tokio_postgres::Error) -> JournalFault {
    JournalFault::database(err)
}

impl PgBooks {
    /// Connects as the target says (TLS by its mode, through rustls). The
    /// connection's task ends when it breaks; every call after that
    /// fails, and the caller connects again.
    pub async fn connect(target: &PgTarget) -> Result<PgBooks, JournalFault> {
        Ok(PgBooks {
            client: connect_postgres(target).await?,
            locks: PgLocks::of(target.schema.as_deref()),
            schema: target.schema.clone(),
        })
    }

    /// The TLS version the session runs over, as the server sees it (None
    /// in plaintext): the sink logs it, so an operator sees what the URL
    /// got.
    pub async fn tls_in_use(&self) -> Result<Option<String>, JournalFault> {
        let row = self
            .client
            .query_opt(
                "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
                &[],
            )
            .await
            .map_err(database)?;
        Ok(row.map(|row| row.get(0)))
    }

    /// True once the connection broke.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Applies the migrations not applied yet, in one transaction under
    /// an advisory lock: idempotent, and safe with sinks starting at once.
    pub async fn migrate(&mut self) -> Result<(), JournalFault> {
        let tx = self.client.transaction().await.map_err(database)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&self.locks.migrate])
            .await
            .map_err(database)?;
        if let Some(schema) = &self.schema {
            // The session's search_path names it (connect_postgres): the
            // tables below are made in it.
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .await
                .map_err(database)?;
        }
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS stockgate_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .map_err(database)?;
        for (version, sql) in MIGRATIONS {
            let applied = tx
                .query_opt(
                    "SELECT 1 FROM stockgate_migrations WHERE version = $1",
                    &[&version],
                )
                .await
                .map_err(database)?
                .is_some();
            if !applied {
                tx.batch_execute(sql).await.map_err(database)?;
                tx.execute(
                    "INSERT INTO stockgate_migrations (version) VALUES ($1)",
                    &[&version],
                )
                .await
                .map_err(database)?;
                tracing::info!(version, "applied migration");
            }
        }
        tx.commit().await.map_err(database)
    }

    /// Joins the sinks: holds the shared member lock for as long as this
    /// connection lives.
    pub async fn join_sinks(&self) -> Result<(), JournalFault> {
        self.client
            .execute(
                "SELECT pg_advisory_lock_shared($1, 0)",
                &[&self.locks.members],
            )
            .await
            .map_err(database)?;
        Ok(())
    }

    /// How many sinks are connected now (this one included). `pg_locks`
    /// lists the locks of every database on the server, and an advisory
    /// lock is its database's own: counted without the database, the
    /// sinks of two databases on one server would each take half the
    /// shards, and leave the other half unmoved.
    pub async fn sinks(&self) -> Result<usize, JournalFault> {
        let row = self
            .client
            .query_one(
                "SELECT count(*) FROM pg_locks
                  WHERE locktype = 'advisory' AND granted
                    AND database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                    AND classid = $1::int4::oid AND objid = 0 AND objsubid = 2",
                &[&self.locks.members],
            )
            .await
            .map_err(database)?;
        Ok(row.get::<_, i64>(0).max(1) as usize)
    }

    /// Takes shard `shard`'s lock if no other sink has it.
    pub async fn claim(&self, shard: usize) -> Result<bool, JournalFault> {
        let row = self
            .client
            .query_one(
                "SELECT pg_try_advisory_lock($1, $2)",
                &[&self.locks.shards, &(shard as i32)],
            )
            .await
            .map_err(database)?;
        Ok(row.get(0))
    }

    /// Gives shard `shard` back, for another sink to take.
    pub async fn release(&self, shard: usize) -> Result<(), JournalFault> {
        self.client
            .execute(
                "SELECT pg_advisory_unlock($1, $2)",
                &[&self.locks.shards, &(shard as i32)],
            )
            .await
            .map_err(database)?;
        Ok(())
    }

    /// Writes `batch` in one transaction: new entries once, a re-delivered
    /// one as nothing, and one whose id is taken by other content into the
    /// conflicts table. Nothing is trimmed in Redis before this returns Ok.
    pub async fn commit(&mut self, batch: &[SkuEntry]) -> Result<Committed, JournalFault> {
        let mut columns = Columns::default();
        for item in batch {
            columns.push(item)?;
        }
        let tx = self.client.transaction().await.map_err(database)?;
        let inserted = tx
            .query(
                "INSERT INTO stockgate_journal
                     (sku, entry_ms, entry_seq, format, event, request_id, order_no,
                      stock_change, held_change, stock_after, held_after, location)
                 SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int4[],
                      $5::text[], $6::text[], $7::text[], $8::int8[], $9::int8[],
                      $10::int8[], $11::int8[], $12::text[])
                 ON CONFLICT (sku, entry_ms, entry_seq) DO NOTHING
                 RETURNING sku, entry_ms, entry_seq",
                &columns.params(),
            )
            .await
            .map_err(database)?;
        let new: std::collections::HashSet<(String, i64, i64)> = inserted
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let mut committed = Committed {
            moved: new.len() as u64,
            ..Committed::default()
        };
        let mut taken = Columns::default();
        for item in batch {
            let key = (
                item.sku.clone(),
                item.entry.at.0 as i64,
                item.entry.at.1 as i64,
            );
            if !new.contains(&key) {
                taken.push(item)?;
            }
        }
        if !taken.sku.is_empty() {
            let stored = tx
                .query(
                    "SELECT sku, entry_ms, entry_seq, format, event, request_id, order_no,
                            stock_change, held_change, stock_after, held_after, location
                       FROM stockgate_journal
                      WHERE (sku, entry_ms, entry_seq) IN
                            (SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[]))",
                    &[&taken.sku, &taken.ms, &taken.seq],
                )
                .await
                .map_err(database)?;
            let stored: std::collections::HashMap<(String, i64, i64), Option<Entry>> = stored
                .iter()
                .map(|row| {
                    let key = (row.get(0), row.get(1), row.get(2));
                    (key, entry_of(row, 1))
                })
                .collect();
            let mut differing = Columns::default();
            for item in batch {
                let key = (
                    item.sku.clone(),
                    item.entry.at.0 as i64,
                    item.entry.at.1 as i64,
                );
                if new.contains(&key) {
                    continue;
                }
                match stored.get(&key) {
                    Some(Some(entry)) if *entry == item.entry => committed.already += 1,
                    _ => {
                        tracing::error!(
                            sku = item.sku,
                            id = item.entry.stream_id(),
                            "journal conflict: this id is in the database with other content \
                             (a failover lost an entry and Redis gave its id again); kept in \
                             stockgate_journal_conflicts"
                        );
                        differing.push(item)?;
                    }
                }
            }
            if !differing.sku.is_empty() {
                let recorded = tx
                    .execute(
                        "INSERT INTO stockgate_journal_conflicts
                             (sku, entry_ms, entry_seq, format, event, request_id, order_no,
                              stock_change, held_change, stock_after, held_after, location)
                         SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[], $4::int4[],
                              $5::text[], $6::text[], $7::text[], $8::int8[], $9::int8[],
                              $10::int8[], $11::int8[], $12::text[])
                         ON CONFLICT (sku, entry_ms, entry_seq) DO NOTHING",
                        &differing.params(),
                    )
                    .await
                    .map_err(database)?;
                committed.conflicts = recorded;
            }
        }
        tx.commit().await.map_err(database)?;
        Ok(committed)
    }

    /// Every SKU the database has an account for.
    pub async fn skus(&self) -> Result<Vec<String>, JournalFault> {
        let rows = self
            .client
            .query(
                "SELECT DISTINCT sku FROM stockgate_journal ORDER BY sku",
                &[],
            )
            .await
            .map_err(database)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// The accounts of `wanted`, each SKU's as of its entry, in one query.
    pub async fn accounts(
        &self,
        wanted: &[(String, Option<(u64, u64)>)],
    ) -> Result<HashMap<String, Accounts>, JournalFault> {
        let skus: Vec<&str> = wanted.iter().map(|(sku, _)| sku.as_str()).collect();
        let (ms, seq): (Vec<i64>, Vec<i64>) = wanted
            .iter()
            .map(|(_, up_to)| super::up_to_columns(*up_to))
            .unzip();
        let rows = self
            .client
            .query(
                "SELECT a.sku, a.from_baseline, a.stock, a.held, a.entries, a.last_ms, a.last_seq,
                        a.location
                   FROM UNNEST($1::text[], $2::int8[], $3::int8[]) AS w(sku, up_ms, up_seq),
                        LATERAL stockgate_account_at(w.sku, w.up_ms, w.up_seq) a",
                &[&skus, &ms, &seq],
            )
            .await
            .map_err(database)?;
        let mut accounts: HashMap<String, Accounts> = HashMap::new();
        for row in &rows {
            accounts.entry(row.get(0)).or_default().insert(
                row.get(7),
                Account {
                    from_baseline: row.get(1),
                    stock: row.get(2),
                    held: row.get(3),
                    entries: row.get(4),
                    last: (row.get::<_, i64>(5) as u64, row.get::<_, i64>(6) as u64),
                },
            );
        }
        Ok(accounts)
    }

    /// The entries of `sku` at `location` that don't follow from the one
    /// before them there, newest first: where an account's history broke.
    pub async fn breaks(
        &self,
        sku: &str,
        location: &str,
        limit: i64,
    ) -> Result<Vec<Entry>, JournalFault> {
        let rows = self
            .client
            .query(
                "SELECT * FROM (
                     SELECT sku, entry_ms, entry_seq, format, event, request_id, order_no,
                            stock_change, held_change, stock_after, held_after, location,
                            lag(stock_after) OVER w AS stock_before,
                            lag(held_after) OVER w AS held_before
                       FROM stockgate_journal WHERE sku = $1 AND location = $3
                     WINDOW w AS (ORDER BY entry_ms, entry_seq)) chain
                  WHERE event <> 'set' AND stock_before IS NOT NULL
                    AND (stock_after - stock_change <> stock_before
                         OR held_after - held_change <> held_before)
                  ORDER BY entry_ms DESC, entry_seq DESC LIMIT $2",
                &[&sku, &limit, &location],
            )
            .await
            .map_err(database)?;
        Ok(rows.iter().filter_map(|row| entry_of(row, 1)).collect())
    }
}

/// A PostgreSQL session with `pg`'s TLS: tokio-postgres's `prefer` and
/// `require` negotiate it (`require` and the verify modes refuse a server
/// without TLS), and the rustls configuration checks what the mode asks.
async fn connect_postgres(pg: &PgTarget) -> Result<Client, JournalFault> {
    use tokio_postgres::config::SslMode;
    let mut config = pg.config.clone();
    if let Some(schema) = &pg.schema {
        // Every statement of the session reads and writes the schema's
        // tables: the SQL stays the same, and a reader (reconcile) needs
        // nothing more. The name is a checked plain identifier.
        let options = match config.get_options() {
            Some(given) => format!("{given} -c search_path={schema}"),
            None => format!("-c search_path={schema}"),
        };
        config.options(&options);
    }
    let tls_fault = |e: String| JournalFault::new(JournalSource::Database, true, e);
    fn spawn<T>(connection: tokio_postgres::Connection<tokio_postgres::Socket, T>)
    where
        T: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
    {
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, "database connection ended");
            }
        });
    }
    if pg.tls.mode == TlsMode::Disable {
        config.ssl_mode(SslMode::Disable);
        let (client, connection) = config.connect(NoTls).await.map_err(database)?;
        spawn(connection);
        return Ok(client);
    }
    config.ssl_mode(if pg.tls.mode == TlsMode::Prefer {
        SslMode::Prefer
    } else {
        SslMode::Require
    });
    let tls =
        tokio_postgres_rustls::MakeRustlsConnect::new(pg.tls.client_config().map_err(tls_fault)?);
    let (client, connection) = config.connect(tls).await.map_err(database)?;
    spawn(connection);
    Ok(client)
}

/// An entry from a row whose columns from `first` are entry_ms, entry_seq,
/// format, event, request_id, order_no, stock_change, held_change,
/// stock_after, held_after, location. None for an event this stockgate
/// doesn't know (the table's CHECK allows none).
pub fn entry_of(row: &tokio_postgres::Row, first: usize) -> Option<Entry> {
    Some(Entry {
        at: (
            row.get::<_, i64>(first) as u64,
            row.get::<_, i64>(first + 1) as u64,
        ),
        format: row.get::<_, i32>(first + 2) as u32,
        event: Event::parse(row.get(first + 3))?,
        id: row.get(first + 4),
        location: row.get(first + 10),
        order_no: row.get(first + 5),
        stock_change: row.get(first + 6),
        held_change: row.get(first + 7),
        stock: row.get(first + 8),
        held: row.get(first + 9),
        time_ms: row.get::<_, i64>(first) as u64,
    })
}

/// A batch as PostgreSQL arrays, one per column, for UNNEST.
#[derive(Default)]
struct Columns {
    sku: Vec<String>,
    ms: Vec<i64>,
    seq: Vec<i64>,
    format: Vec<i32>,
    event: Vec<&'static str>,
    id: Vec<String>,
    order_no: Vec<String>,
    stock_change: Vec<i64>,
    held_change: Vec<i64>,
    stock: Vec<i64>,
    held: Vec<i64>,
    location: Vec<String>,
}

impl Columns {
    fn push(&mut self, item: &SkuEntry) -> Result<(), JournalFault> {
        let entry = &item.entry;
        let (Ok(ms), Ok(seq), Ok(format)) = (
            i64::try_from(entry.at.0),
            i64::try_from(entry.at.1),
            i32::try_from(entry.format),
        ) else {
            return Err(JournalFault::new(
                JournalSource::Data,
                false,
                format!(
                    "journal entry {} of {}: its id or format does not fit the table",
                    entry.stream_id(),
                    item.sku
                ),
            ));
        };
        self.sku.push(item.sku.clone());
        self.ms.push(ms);
        self.seq.push(seq);
        self.format.push(format);
        self.event.push(entry.event.name());
        self.id.push(entry.id.clone());
        self.order_no.push(entry.order_no.clone());
        self.stock_change.push(entry.stock_change);
        self.held_change.push(entry.held_change);
        self.stock.push(entry.stock);
        self.held.push(entry.held);
        self.location.push(entry.location.clone());
        Ok(())
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 12] {
        [
            &self.sku,
            &self.ms,
            &self.seq,
            &self.format,
            &self.event,
            &self.id,
            &self.order_no,
            &self.stock_change,
            &self.held_change,
            &self.stock,
            &self.held,
            &self.location,
        ]
    }
}
