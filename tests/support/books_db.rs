//! The books' database as a test sees it, whichever it is: a database of
//! the test's own on the test binary's shared PostgreSQL or MariaDB, or on
//! a server of the test's own when it restarts or stops it.
//! Queries go as text and come back as text, so one test body reads
//! both; what differs between the two SQLs, a test writes twice
//! ([`BooksDb::sql`]).

use super::mariadb::MariaDb;
use super::postgres::Postgres;
use stockgate::journal::Entry;

/// Which database keeps the books.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    Mariadb,
}

impl std::fmt::Display for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Postgres => "postgres",
            Engine::Mariadb => "mariadb",
        })
    }
}

pub struct BooksDb {
    pub engine: Engine,
    server: Server,
}

enum Server {
    SharedPostgres(&'static Postgres, String),
    Postgres(Postgres),
    SharedMariadb(&'static MariaDb, String),
    OwnMariadb(MariaDb, String),
}

/// A session held open (a lock a test takes and gives back).
pub enum Session {
    Postgres(tokio_postgres::Client),
    Mariadb(mysql_async::Conn),
}

impl BooksDb {
    /// A new database for one test on the binary's shared server.
    pub fn start(engine: Engine) -> BooksDb {
        let server = match engine {
            Engine::Postgres => {
                let shared = Postgres::shared();
                Server::SharedPostgres(shared, shared.database())
            }
            Engine::Mariadb => {
                let (shared, _) = MariaDb::shared();
                Server::SharedMariadb(shared, shared.database())
            }
        };
        BooksDb { engine, server }
    }

    /// A database on a server of the test's own, which it may restart or
    /// stop.
    pub fn start_own(engine: Engine) -> BooksDb {
        let server = match engine {
            Engine::Postgres => Server::Postgres(Postgres::start()),
            Engine::Mariadb => {
                let own = MariaDb::start();
                let database = own.database();
                Server::OwnMariadb(own, database)
            }
        };
        BooksDb { engine, server }
    }

    /// The URL the sink and reconcile get (plaintext, on loopback).
    pub fn url(&self) -> String {
        match &self.server {
            Server::SharedPostgres(pg, name) => pg.url_of(name),
            Server::Postgres(pg) => pg.url(),
            Server::SharedMariadb(db, name) => db.url(name),
            Server::OwnMariadb(db, name) => db.url(name),
        }
    }

    /// A URL to this engine where nothing listens.
    pub fn unreachable_url(&self) -> String {
        let port = super::free_port();
        match self.engine {
            Engine::Postgres => {
                format!("postgres://stockgate@127.0.0.1:{port}/postgres?sslmode=disable")
            }
            Engine::Mariadb => {
                format!("mysql://stockgate@127.0.0.1:{port}/books?ssl-mode=DISABLED")
            }
        }
    }

    /// `postgres` or `mariadb`: the one for this engine.
    pub fn sql<'a>(&self, postgres: &'a str, mariadb: &'a str) -> &'a str {
        match self.engine {
            Engine::Postgres => postgres,
            Engine::Mariadb => mariadb,
        }
    }

    fn own_mariadb(&self) -> &MariaDb {
        match &self.server {
            Server::OwnMariadb(db, _) => db,
            _ => panic!("only a server of the test's own (BooksDb::start_own) stops"),
        }
    }

    fn own_postgres(&self) -> &Postgres {
        match &self.server {
            Server::Postgres(pg) => pg,
            _ => panic!("only a server of the test's own (BooksDb::start_own) stops"),
        }
    }

    /// Killed and started again (PostgreSQL `-m fast`, MariaDB SIGKILL):
    /// the sessions end, the transactions in flight roll back.
    pub fn restart(&self) {
        match self.engine {
            Engine::Postgres => self.own_postgres().restart(),
            Engine::Mariadb => self.own_mariadb().restart(),
        }
    }

    pub fn stop(&self) {
        match self.engine {
            Engine::Postgres => self.own_postgres().stop(),
            Engine::Mariadb => self.own_mariadb().stop(),
        }
    }

    pub fn start_again(&self) {
        match self.engine {
            Engine::Postgres => self.own_postgres().start_again(),
            Engine::Mariadb => self.own_mariadb().start_again(),
        }
    }

    /// A session of its own.
    pub async fn session(&self) -> Session {
        match &self.server {
            Server::Postgres(pg) => Session::Postgres(pg.client().await),
            Server::SharedPostgres(pg, name) => {
                let (client, connection) =
                    tokio_postgres::connect(&pg.url_of(name), tokio_postgres::NoTls)
                        .await
                        .expect("connect to the test PostgreSQL");
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Session::Postgres(client)
            }
            Server::SharedMariadb(_, name) | Server::OwnMariadb(_, name) => {
                let port = match &self.server {
                    Server::SharedMariadb(db, _) => db.port,
                    Server::OwnMariadb(db, _) => db.port,
                    _ => unreachable!(),
                };
                let url = format!("mysql://stockgate@127.0.0.1:{port}/{name}");
                let conn = mysql_async::Conn::from_url(url)
                    .await
                    .expect("connect to the test MariaDB");
                Session::Mariadb(conn)
            }
        }
    }

    /// Every row `sql` gives, each column as text (None for NULL).
    pub async fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.session().await.rows(sql).await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.session().await.count(sql).await
    }

    /// Runs `sql`; the rows it changed.
    pub async fn execute(&self, sql: &str) -> u64 {
        self.session().await.execute(sql).await
    }

    /// Every entry of `stockgate_journal`, by sku, oldest first: read
    /// as the sink's own code reads a row.
    pub async fn entries(&self) -> Vec<(String, Entry)> {
        const COLUMNS: &str = "SELECT sku, entry_ms, entry_seq, format, event, request_id, \
             order_no, stock_change, held_change, stock_after, held_after, location \
             FROM stockgate_journal ORDER BY sku, entry_ms, entry_seq";
        match self.session().await {
            Session::Postgres(client) => client
                .query(COLUMNS, &[])
                .await
                .expect("read the journal table")
                .iter()
                .map(|row| {
                    let entry = stockgate::journal::database::postgres::entry_of(row, 1)
                        .unwrap_or_else(|| panic!("an event stockgate knows: {row:?}"));
                    (row.get(0), entry)
                })
                .collect(),
            Session::Mariadb(mut conn) => {
                use mysql_async::prelude::Queryable;
                let rows: Vec<mysql_async::Row> =
                    conn.query(COLUMNS).await.expect("read the journal table");
                rows.iter()
                    .map(|row| {
                        let entry = stockgate::journal::database::mysql::entry_of(row, 1)
                            .unwrap_or_else(|| panic!("an event stockgate knows: {row:?}"));
                        (row.get(0).unwrap(), entry)
                    })
                    .collect()
            }
        }
    }
}

impl Session {
    pub async fn rows(&mut self, sql: &str) -> Vec<Vec<Option<String>>> {
        match self {
            Session::Postgres(client) => client
                .simple_query(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .into_iter()
                .filter_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).map(str::to_owned))
                            .collect(),
                    ),
                    _ => None,
                })
                .collect(),
            Session::Mariadb(conn) => {
                use mysql_async::prelude::Queryable;
                let rows: Vec<mysql_async::Row> = conn
                    .query(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                rows.into_iter()
                    .map(|row| {
                        row.unwrap()
                            .into_iter()
                            .map(|value| match value {
                                mysql_async::Value::NULL => None,
                                mysql_async::Value::Bytes(bytes) => {
                                    Some(String::from_utf8_lossy(&bytes).into_owned())
                                }
                                other => Some(other.as_sql(true)),
                            })
                            .collect()
                    })
                    .collect()
            }
        }
    }

    /// The one number `sql` gives.
    pub async fn count(&mut self, sql: &str) -> i64 {
        let rows = self.rows(sql).await;
        rows.first()
            .and_then(|row| row.first().cloned().flatten())
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("{sql}: not one number: {rows:?}"))
    }

    pub async fn execute(&mut self, sql: &str) -> u64 {
        match self {
            Session::Postgres(client) => client
                .execute(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            Session::Mariadb(conn) => {
                use mysql_async::prelude::Queryable;
                conn.query_drop(sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                conn.affected_rows()
            }
        }
    }

    /// Runs `sql`, an error allowed (a statement meant to fail).
    pub async fn try_execute(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Session::Postgres(client) => client.batch_execute(sql).await.map_err(|e| e.to_string()),
            Session::Mariadb(conn) => {
                use mysql_async::prelude::Queryable;
                conn.query_drop(sql).await.map_err(|e| e.to_string())
            }
        }
    }
}
