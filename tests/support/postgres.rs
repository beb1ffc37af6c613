//! A throwaway PostgreSQL for the journal's tests: `initdb` and `pg_ctl`
//! in a temp dir, listening on a free loopback port, stopped on drop.
//!
//! PostgreSQL refuses to run as root; run as root (as in CI's container),
//! the server runs as the `postgres` user that Debian's package creates,
//! and the temp dir is handed to it. A missing binary fails with how to
//! install it.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

const INSTALL_HINT: &str = "install PostgreSQL 15 with `deploy/install-deps.sh test` (Debian: apt-get install -y postgresql)";

/// A PostgreSQL server of its own; `Drop` stops it at once.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    /// (uid, gid) to run as when the tests run as root.
    user: Option<(u32, u32)>,
    /// Server settings beyond the defaults (`-c name=value ...`).
    settings: String,
}

impl Postgres {
    /// initdb (trust authentication on loopback, user `stockgate`), then
    /// start and wait until it accepts connections.
    pub fn start() -> Postgres {
        let postgres = Postgres::init();
        postgres.start_server();
        postgres
    }

    /// As [`Postgres::start`], with TLS on (`ssl=on`): the server's
    /// certificate and key and the CA that signs client certificates are
    /// `server.crt`, `server.key` and `ca.crt` of `certs` (copied into its
    /// own dir, as PostgreSQL wants its key file private to it). Every
    /// user may connect with or without TLS, but `cert_user` only over TLS
    /// with a client certificate (`cert` authentication: its CN names the
    /// user).
    pub fn start_with_tls(certs: &std::path::Path, cert_user: &str) -> Postgres {
        let mut postgres = Postgres::init();
        let own = |file: &str| {
            let to = postgres.dir.path().join(file);
            std::fs::copy(certs.join(file), &to).expect("copy a certificate");
            let path = std::ffi::CString::new(to.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: chmod and chown of a path we made, by its C string.
            unsafe {
                assert_eq!(libc::chmod(path.as_ptr(), 0o600), 0);
                if let Some((uid, gid)) = postgres.user {
                    assert_eq!(libc::chown(path.as_ptr(), uid, gid), 0);
                }
            }
            to.display().to_string()
        };
        postgres.settings = format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
            own("server.crt"),
            own("server.key"),
            own("ca.crt")
        );
        let hba = std::path::Path::new(&postgres.data()).join("pg_hba.conf");
        let trusted = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        // The first line that matches decides.
        std::fs::write(
            &hba,
            format!(
                "hostssl all {user} 127.0.0.1/32 cert\nhost all {user} 127.0.0.1/32 reject\n{trusted}",
                user = cert_user
            ),
        )
        .expect("write pg_hba.conf");
        postgres.start_server();
        postgres
    }

    fn init() -> Postgres {
        let bin = find_bin();
        let dir = tempfile::Builder::new()
            .prefix("stockgate-pg-")
            .tempdir()
            .expect("a temp dir");
        let user = run_as_user();
        if let Some((uid, gid)) = user {
            let path = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: chown of a path we own, by its C string.
            let rc = unsafe { libc::chown(path.as_ptr(), uid, gid) };
            assert_eq!(rc, 0, "cannot hand {} to postgres", dir.path().display());
        }
        let postgres = Postgres {
            port: super::free_port(),
            dir,
            bin,
            user,
            settings: String::new(),
        };
        postgres.pg(
            "initdb",
            &[
                "-D",
                &postgres.data(),
                "-U",
                "stockgate",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        postgres
    }

    /// One server for every test of a binary that asks (each in a
    /// database of its own, [`Postgres::database`]), stopped when the
    /// binary exits.
    pub fn shared() -> &'static Postgres {
        static SHARED: std::sync::OnceLock<Postgres> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let postgres = Postgres::start();
            // SAFETY: registers a plain function, run once at exit.
            unsafe {
                libc::atexit(stop_shared);
            }
            postgres
        })
    }

    /// A new database of its own on this server, for one test.
    pub fn database(&self) -> String {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let name = format!(
            "books_{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut command = Command::new(self.bin.join("psql"));
        command
            .args(["-h", &self.dir.path().display().to_string()])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "stockgate",
                "-d",
                "postgres",
            ])
            .args([
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                &format!("CREATE DATABASE {name}"),
            ]);
        let out = command
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql ({e}): {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "CREATE DATABASE {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        name
    }

    /// `postgres://stockgate@127.0.0.1:<port>/<database>?sslmode=disable`
    pub fn url_of(&self, database: &str) -> String {
        format!(
            "postgres://stockgate@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// `postgres://stockgate@127.0.0.1:<port>/postgres?sslmode=disable`
    pub fn url(&self) -> String {
        format!(
            "postgres://stockgate@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// `postgres://<user>@<host>:<port>/postgres?<params>`
    pub fn url_with(&self, user: &str, host: &str, params: &str) -> String {
        format!("postgres://{user}@{host}:{}/postgres?{params}", self.port)
    }

    fn start_server(&self) {
        // client_connection_check_interval: a backend waiting on a lock
        // notices its client died (a SIGKILLed sink) instead of waiting on.
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off \
             -c client_connection_check_interval=100ms {}",
            self.port,
            self.dir.path().display(),
            self.settings
        );
        let log = self.dir.path().join("server.log").display().to_string();
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }

    /// Restarts it, ending every session at once (`-m fast`: transactions
    /// in flight roll back), as a database failover or restart does.
    pub fn restart(&self) {
        self.pg("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
        self.start_server();
    }

    /// Stops it, for a test of what happens without it; `start_again`
    /// brings it back.
    pub fn stop(&self) {
        self.pg("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"]);
    }

    pub fn start_again(&self) {
        self.start_server();
    }

    /// A client of its own (the connection's task runs on the caller's
    /// runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    fn pg(&self, tool: &str, args: &[&str]) {
        let mut command = Command::new(self.bin.join(tool));
        command.args(args).current_dir(self.dir.path());
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let out = command
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool} ({e}): {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}\nserver log: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }
}

extern "C" fn stop_shared() {
    // Statics are not dropped at exit: the shared server is stopped here.
    let shared = Postgres::shared();
    shared.stop_now();
    let _ = std::fs::remove_dir_all(shared.dir.path());
}

impl Postgres {
    fn stop_now(&self) {
        let mut command = Command::new(self.bin.join("pg_ctl"));
        command.args(["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        let _ = command.output();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The directory of `initdb` and `pg_ctl`: Debian keeps them off PATH in
/// /usr/lib/postgresql/<version>/bin; PATH is the fallback.
fn find_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_ctl").exists())
        .collect();
    versions.sort();
    if let Some(newest) = versions.pop() {
        return newest;
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists());
    on_path.unwrap_or_else(|| panic!("no initdb and pg_ctl found: {INSTALL_HINT}"))
}

/// As root, the `postgres` user's ids (PostgreSQL won't run as root).
fn run_as_user() -> Option<(u32, u32)> {
    // SAFETY: geteuid reads the process's id; getpwnam returns a pointer
    // into static storage, read at once.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let name = c"postgres";
        let entry = libc::getpwnam(name.as_ptr());
        assert!(
            !entry.is_null(),
            "running as root and there is no `postgres` user to run PostgreSQL as: {INSTALL_HINT}"
        );
        Some(((*entry).pw_uid, (*entry).pw_gid))
    }
}
