//! A throwaway MariaDB for the books' tests: Debian's `mariadb-server`
//! (10.11), its data directory made by `mariadb-install-db` and `mariadbd`
//! run on a free loopback port with its own socket, stopped by the test.
//!
//! `mariadb-install-db` takes about 4 s, so it runs once: its data
//! directory is kept as a template under `target/mariadb-template/`
//! (per server version), and each server starts on a copy of it. A test
//! binary shares one server among its tests ([`MariaDb::shared`]), each
//! test in a database of its own; a test that restarts or stops the
//! server starts its own ([`MariaDb::start`]).
//!
//! Both have the user `stockgate` (no password, every privilege), and
//! with TLS ([`MariaDb::start_with_tls`]) the user
//! [`super::certs::CLIENT_USER`], who must present a client certificate
//! (`REQUIRE X509`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "install MariaDB 10.11 with `deploy/install-deps.sh test` (Debian: apt-get install -y mariadb-server)";

/// A MariaDB server of its own; `Drop` stops it.
pub struct MariaDb {
    dir: tempfile::TempDir,
    pub port: u16,
    server: Mutex<Option<Child>>,
    /// `mariadbd`'s arguments beyond the common ones (TLS).
    extra: Vec<String>,
}

/// The server binaries, or a panic saying how to get them.
fn binaries() -> (PathBuf, PathBuf) {
    let find = |name: &str, dirs: &[&str]| {
        dirs.iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|path| path.is_file())
            .unwrap_or_else(|| panic!("no {name}: {INSTALL_HINT}"))
    };
    (
        find("mariadbd", &["/usr/sbin", "/usr/bin", "/usr/local/sbin"]),
        find("mariadb-install-db", &["/usr/bin", "/usr/local/bin"]),
    )
}

/// Options every run shares with the template's: small, unsynced InnoDB
/// files (a crash of the test's server loses nothing a test keeps), no
/// host name lookups.
const COMMON: &[&str] = &[
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=64M",
    "--innodb-flush-method=nosync",
    "--innodb-doublewrite=0",
    "--skip-name-resolve",
];

/// As root (as in CI's container) mariadbd must be told to stay root.
fn user_args() -> Vec<String> {
    // SAFETY: geteuid reads the process's id.
    if unsafe { libc::geteuid() } == 0 {
        vec!["--user=root".into()]
    } else {
        Vec::new()
    }
}

/// The template data directory for this server version, made once.
fn template(mariadbd: &Path, install_db: &Path) -> PathBuf {
    let version = Command::new(mariadbd)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run mariadbd ({e}): {INSTALL_HINT}"));
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version
        .split_whitespace()
        .find(|word| word.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or("unknown")
        .to_owned();
    let root = super::in_repo("target/mariadb-template");
    let done = root.join(&version);
    // One maker at a time in this process (its tests start servers in
    // parallel); another process's maker may race, and either's is whole.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if done.join("data/mysql").is_dir() {
        return done;
    }
    std::fs::create_dir_all(&root).expect("target/mariadb-template");
    let making = tempfile::Builder::new()
        .prefix("making-")
        .tempdir_in(&root)
        .expect("a temp dir under target/mariadb-template");
    let data = making.path().join("data");
    let out = Command::new(install_db)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .args(user_args())
        .args(COMMON)
        .output()
        .unwrap_or_else(|e| panic!("cannot run mariadb-install-db ({e}): {INSTALL_HINT}"));
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test binary may have made it meanwhile: either is whole.
    let kept = making.keep();
    if std::fs::rename(&kept, &done).is_err() {
        let _ = std::fs::remove_dir_all(&kept);
    }
    done
}

/// Every copy of `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

impl MariaDb {
    /// A server of this test's own, plain.
    pub fn start() -> MariaDb {
        MariaDb::launch(Vec::new(), None)
    }

    /// A server with TLS: the server certificate, key and CA of `certs`
    /// (`server.crt`, `server.key`, `ca.crt`), and `cert_user` who must
    /// connect over TLS with a client certificate that CA signed.
    pub fn start_with_tls(certs: &Path, cert_user: &str) -> MariaDb {
        let file = |name: &str| certs.join(name).display().to_string();
        MariaDb::launch(
            vec![
                format!("--ssl-ca={}", file("ca.crt")),
                format!("--ssl-cert={}", file("server.crt")),
                format!("--ssl-key={}", file("server.key")),
            ],
            Some(cert_user),
        )
    }

    fn launch(extra: Vec<String>, cert_user: Option<&str>) -> MariaDb {
        let (mariadbd, install_db) = binaries();
        let template = template(&mariadbd, &install_db);
        let dir = tempfile::Builder::new()
            .prefix("stockgate-mariadb-")
            .tempdir()
            .expect("a temp dir");
        copy_dir(&template.join("data"), &dir.path().join("data"));
        let db = MariaDb {
            dir,
            port: super::free_port(),
            server: Mutex::new(None),
            extra,
        };
        db.start_server();
        let mut setup = String::from(
            "CREATE USER 'stockgate'@'127.0.0.1'; \
             GRANT ALL ON *.* TO 'stockgate'@'127.0.0.1' WITH GRANT OPTION;",
        );
        if let Some(user) = cert_user {
            setup.push_str(&format!(
                "CREATE USER '{user}'@'127.0.0.1' REQUIRE X509; \
                 GRANT ALL ON *.* TO '{user}'@'127.0.0.1';"
            ));
        }
        db.root_sql(&setup);
        db
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("mariadb.sock")
    }

    fn start_server(&self) {
        let (mariadbd, _) = binaries();
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("server.log");
        let child = Command::new(&mariadbd)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("mariadb.pid").display()
            ))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .args(user_args())
            .args(COMMON)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run mariadbd ({e}): {INSTALL_HINT}"));
        *self.server.lock().unwrap() = Some(child);
        // Up when its socket file answers a client: the server accepts
        // only once it is ready.
        let started = Instant::now();
        loop {
            if self.socket().exists()
                && self
                    .client()
                    .arg("-e")
                    .arg("SELECT 1")
                    .output()
                    .is_ok_and(|out| out.status.success())
            {
                return;
            }
            if let Some(status) = self
                .server
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "mariadbd exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "mariadbd on port {} not up within 60 s: {}",
                self.port,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `mariadb` client as root, over the server's own socket.
    fn client(&self) -> Command {
        let mut command = Command::new("mariadb");
        command
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-u", "root", "--batch", "--skip-column-names"]);
        command
    }

    /// Runs `sql` as root; panics on an error.
    pub fn root_sql(&self, sql: &str) -> String {
        let out = self
            .client()
            .arg("-e")
            .arg(sql)
            .output()
            .unwrap_or_else(|e| panic!("cannot run the mariadb client ({e}): {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new database of its own on this server, for one test.
    pub fn database(&self) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("books_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.root_sql(&format!("CREATE DATABASE {name}"));
        name
    }

    /// `mysql://stockgate@127.0.0.1:<port>/<database>?ssl-mode=DISABLED`
    pub fn url(&self, database: &str) -> String {
        self.url_with("stockgate", "127.0.0.1", database, "ssl-mode=DISABLED")
    }

    pub fn url_with(&self, user: &str, host: &str, database: &str, params: &str) -> String {
        format!("mysql://{user}@{host}:{}/{database}?{params}", self.port)
    }

    /// Stops it at once (SIGKILL: InnoDB rolls back what was in flight
    /// when it starts again), as a crash of the database host.
    pub fn stop(&self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    pub fn start_again(&self) {
        self.start_server();
    }

    /// Killed and started again: every session ends at once and the
    /// transactions in flight roll back.
    pub fn restart(&self) {
        self.stop();
        self.start_server();
    }

    /// One server for every test of this binary, with TLS (the
    /// certificates of [`super::certs::Certs`], made once). Stopped when
    /// the test binary exits.
    pub fn shared() -> &'static (MariaDb, super::certs::Certs) {
        static SHARED: std::sync::OnceLock<(MariaDb, super::certs::Certs)> =
            std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let certs = super::certs::Certs::make();
            let db = MariaDb::start_with_tls(certs.dir(), super::certs::CLIENT_USER);
            // SAFETY: registers a plain function, run once at exit.
            unsafe {
                libc::atexit(stop_shared);
            }
            (db, certs)
        })
    }
}

extern "C" fn stop_shared() {
    // Statics are not dropped at exit: the shared server is stopped here,
    // and its temp dirs removed.
    let (db, certs) = MariaDb::shared();
    db.stop();
    let _ = std::fs::remove_dir_all(db.dir.path());
    let _ = std::fs::remove_dir_all(certs.dir());
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.stop();
    }
}
