//! Installing the pinned clients from their registries, and running
//! their drivers and scripts as subprocesses.

use serde_json::{Value as Json, json};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output, Stdio};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// One client library at one exact version.
pub struct Pinned {
    /// Its directory under `<target>/client-envs/` (and, for Node, under
    /// `tests/clients/node/`).
    pub name: &'static str,
    pub runtime: Runtime,
    pub version: &'static str,
    /// What it sends on a new connection before the first command, as
    /// recorded on the wire from the pinned version.
    pub handshake: &'static [&'static [&'static str]],
    /// The class of what a DEDUCT error reply raises or rejects with.
    pub error_class: &'static str,
    /// How it uses connections, where it differs from the plainest client.
    pub habits: Habits,
}

/// What a client does on the wire besides its handshake.
pub struct Habits {
    /// What a connection its pool opens sends first, where that differs
    /// from `handshake` (Jedis: only pooled connections announce
    /// themselves).
    pub pool_handshake: Option<&'static [&'static [&'static str]]>,
    /// A handshake command the client stops sending once stockgate has
    /// refused it (go-redis's "auto" maintenance notifications), so
    /// connections opened after the first refusal lack it.
    pub dropped_once_refused: Option<&'static [&'static str]>,
    /// What its pool sends when it lends a connection, in the `pool` mode.
    pub borrow_ping: BorrowPing,
    /// Whether it keeps many connections open and spreads commands over
    /// them (Redisson); the others send a plan over one connection.
    pub spreads: bool,
}

impl Habits {
    /// One connection, its handshake only.
    pub const PLAIN: Habits = Habits {
        pool_handshake: None,
        dropped_once_refused: None,
        borrow_ping: BorrowPing::None,
        spreads: false,
    };
}

/// The health check a pool runs when it lends a connection out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BorrowPing {
    /// No `pool` mode for this client.
    None,
    /// redis-py's health_check_interval: a PING when it connects, before
    /// the handshake, and before each reuse of a connection left idle
    /// past the interval.
    OnReuse,
    /// commons-pool's testOnBorrow (Jedis): a PING every time the pool
    /// lends the connection, the first time too, after the handshake.
    Always,
}

pub enum Runtime {
    /// A venv from a hash-pinned requirements file in tests/clients/python/.
    Python { requirements: &'static str },
    /// `npm ci` of tests/clients/node/<name>/; `library` is what to require.
    Node {
        library: &'static str,
        min_node: u32,
    },
    /// The Go drivers of tests/clients/go (one binary, go.mod and go.sum
    /// pinning every client), built with examples/go into the shared env
    /// `go`; `library` is the driver's first argument.
    Go { library: &'static str },
    /// A module of the Maven reactor in tests/clients/java, built with the
    /// others and examples/java into the shared env `java`; `main` is the
    /// driver class.
    Java {
        module: &'static str,
        main: &'static str,
    },
}

impl Runtime {
    /// The env under `<target>/client-envs/` this client runs from: its
    /// own for Python and Node, one for all Go and one for all Java
    /// clients, so each of those is fetched and compiled once per run.
    fn env_name(&self, client: &'static str) -> &'static str {
        match self {
            Runtime::Python { .. } | Runtime::Node { .. } => client,
            Runtime::Go { .. } => "go",
            Runtime::Java { .. } => "java",
        }
    }
}

/// How long any one subprocess may run before the test gives up on it: a
/// watchdog against a hung client, far above the few seconds they take.
pub const WATCHDOG: Duration = Duration::from_secs(180);

const PYTHON_HINT: &str =
    "install Python 3.8+ with pip (Debian: apt-get install -y python3 python3-pip python3-venv)";
const NODE_HINT: &str = "install Node.js 20+ with npm (Debian 13: apt-get install -y nodejs npm; Debian 12's Node 18 is too old for ioredis 6 and node-redis 6: use NodeSource's or nvm's Node 20+)";
const GO_HINT: &str = "install Go 1.26+ (go-redis v9.23 needs it; Debian 12's golang-go is 1.19): \
    the official release unpacked in /usr/local/go with /usr/local/go/bin on PATH, or any Go 1.21+ \
    with GOTOOLCHAIN=go1.26.8, which fetches that toolchain through the Go module proxy";
const JAVA_HINT: &str = "install Java 17+ and Maven 3.6.3+ with `deploy/install-deps.sh` \
    (Debian 12: apt-get install -y openjdk-17-jdk-headless maven)";
const REDIS_HINT: &str = "install Redis 7+ with `deploy/install-deps.sh` (Debian: apt-get install -y redis-server redis-tools)";

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// `<target>/client-envs`: beside the build output, so `cargo clean`
/// clears it and CI caches of `target/` keep it.
fn envs_root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is <target>/tmp")
        .join("client-envs")
}

/// A program to start, with its arguments and environment.
#[derive(Clone)]
pub struct Launch {
    program: OsString,
    args: Vec<OsString>,
    vars: Vec<(&'static str, OsString)>,
}

impl Launch {
    fn new(program: impl Into<OsString>) -> Launch {
        Launch {
            program: program.into(),
            args: Vec::new(),
            vars: Vec::new(),
        }
    }

    fn arg(mut self, arg: impl Into<OsString>) -> Launch {
        self.args.push(arg.into());
        self
    }

    fn var(mut self, name: &'static str, value: impl Into<OsString>) -> Launch {
        self.vars.push((name, value.into()));
        self
    }

    pub fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command.args(&self.args);
        command.envs(self.vars.iter().map(|(k, v)| (k, v)));
        command
    }
}

/// An installed client: how to run its driver, and a script or the
/// example built with it.
pub struct ClientEnv {
    /// The driver, up to the port and mode it takes last.
    driver: Launch,
    /// The interpreter with the client importable (Python, Node).
    interpreter: Option<Launch>,
    /// The example built in this env (Go, Java).
    example: Option<Launch>,
    /// The two-warehouse example built in this env (Go, Java).
    warehouses: Option<Launch>,
}

pub struct Driven {
    pub version: String,
    pub replies: Vec<Json>,
    /// Everything the driver printed.
    pub printed: Json,
}

impl ClientEnv {
    /// A command running `script` with this client importable.
    pub fn command(&self, script: &Path) -> tokio::process::Command {
        let mut command = self
            .interpreter
            .as_ref()
            .expect("an interpreted client")
            .command();
        command.arg(script);
        command
    }

    /// A command running the example this env built.
    pub fn example(&self) -> tokio::process::Command {
        self.example
            .as_ref()
            .expect("an env with an example")
            .command()
    }

    /// A command running the two-warehouse example this env built.
    pub fn warehouses(&self) -> tokio::process::Command {
        self.warehouses
            .as_ref()
            .expect("an env with the two-warehouse example")
            .command()
    }

    /// The driver in `mode` against `port`, not started yet.
    pub fn driver(&self, port: u16, mode: &str) -> tokio::process::Command {
        let mut command = self.driver.command();
        command.args([port.to_string().as_str(), mode]);
        command
    }

    /// Runs the driver in `mode` against `port` and parses what it printed.
    pub async fn drive(&self, port: u16, mode: &str, commands: &[Vec<String>]) -> Driven {
        let plan = json!({ "commands": commands }).to_string();
        let out = finish(self.driver(port, mode), plan.as_bytes()).await;
        assert!(
            out.status.success(),
            "driver {mode} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        printed(&out.stdout)
    }
}

/// The one JSON object a driver prints.
pub fn printed(stdout: &[u8]) -> Driven {
    let printed: Json = serde_json::from_slice(stdout).unwrap_or_else(|e| {
        panic!(
            "driver printed no JSON ({e}): {}",
            String::from_utf8_lossy(stdout)
        )
    });
    Driven {
        version: printed["version"].as_str().unwrap().to_owned(),
        replies: printed["replies"].as_array().unwrap().clone(),
        printed,
    }
}

/// Runs `command` to the end with `stdin`, killing it if the test fails
/// or the watchdog fires.
pub async fn finish(mut command: tokio::process::Command, stdin: &[u8]) -> Output {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let program = format!("{:?}", command.as_std().get_program());
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    tokio::time::timeout(WATCHDOG, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} still running after {WATCHDOG:?}: hung?"))
        .unwrap()
}

/// Runs a Redis tool (redis-cli, redis-benchmark) that must be installed.
pub async fn run_with_stdin(tool: &str, args: &[&str], stdin: &[u8]) -> Output {
    if which(tool).is_none() {
        panic!("{tool} not found: {REDIS_HINT}");
    }
    let mut command = tokio::process::Command::new(tool);
    command.args(args);
    finish(command, stdin).await
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// Runs a setup command to the end, failing the test with `hint` when the
/// tool is missing.
fn setup(program: &str, args: &[&str], cwd: &Path, hint: &str) -> Output {
    StdCommand::new(program)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): {hint}"))
}

fn check(out: Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The client's environment under `<target>/client-envs/<name>`, installed
/// from its registry if missing or made from another manifest. Installs
/// go to a staging directory renamed into place when complete, so an
/// interrupted install is never mistaken for a finished one.
pub fn installed(client: &Pinned) -> ClientEnv {
    let name = client.runtime.env_name(client.name);
    type PerEnv = HashMap<&'static str, Arc<Mutex<()>>>;
    static LOCKS: LazyLock<Mutex<PerEnv>> = LazyLock::new(Mutex::default);
    let lock = LOCKS.lock().unwrap().entry(name).or_default().clone();
    let _one_install_at_a_time = lock.lock().unwrap_or_else(|e| e.into_inner());

    // Fail early, with how to install it, when the runtime is missing.
    match client.runtime {
        Runtime::Python { .. } => {
            python_version();
        }
        Runtime::Node { min_node, .. } => {
            let major = node_major();
            assert!(
                major >= min_node,
                "{} needs Node.js {min_node}+, found {major}: {NODE_HINT}",
                client.name
            );
        }
        Runtime::Go { .. } => {
            go_version();
        }
        Runtime::Java { .. } => {
            java_versions();
        }
    }

    let root = envs_root();
    let dir = root.join(name);
    let stamp = stamp(client);
    let current = |dir: &Path| {
        std::fs::read_to_string(dir.join(STAMP)).ok().as_deref() == Some(stamp.as_str())
            && env_at(client, dir).is_some()
    };
    if !current(&dir) {
        let staging = root.join(format!(".staging-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).unwrap();
        match client.runtime {
            Runtime::Python { requirements } => install_python(&staging, requirements),
            Runtime::Node { .. } => install_node(&staging, client.name),
            Runtime::Go { .. } => install_go(&staging),
            Runtime::Java { .. } => install_java(&staging),
        }
        std::fs::write(staging.join(STAMP), &stamp).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(err) = std::fs::rename(&staging, &dir) {
            // Another test process installed the same env meanwhile.
            let _ = std::fs::remove_dir_all(&staging);
            assert!(current(&dir), "cannot move {staging:?} to {dir:?}: {err}");
        }
    }
    env_at(client, &dir).unwrap_or_else(|| panic!("{} installed but not runnable", client.name))
}

/// Written last into a finished env: what it was made from.
const STAMP: &str = ".stockgate-stamp";

/// What the Go env is built from: the drivers' module and the example's.
const GO_SOURCES: &[&str] = &["tests/clients/go", "examples/go"];

/// What the Java env is built from: the reactor (poms and sources) and the
/// example.
const JAVA_SOURCES: &[&str] = &["tests/clients/java", "examples/java"];

/// Every file under `dirs` (relative to the repository) with its content,
/// in a stable order; build output (`target/`) left out.
fn sources(dirs: &[&str]) -> String {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {dir:?}: {e}"))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                if path.file_name() != Some("target".as_ref()) {
                    walk(&path, out);
                }
            } else {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in dirs {
        walk(&repo_path(dir), &mut files);
    }
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("cannot read {path:?}: {e}"));
            format!("== {}\n{text}", path.display())
        })
        .collect()
}

/// What an env was made from: the manifest (for Go and Java every source
/// too), and the interpreter or toolchain it was made with.
fn stamp(client: &Pinned) -> String {
    match client.runtime {
        Runtime::Python { requirements } => format!(
            "{}\n{}",
            read(&format!("tests/clients/python/{requirements}")),
            python_version()
        ),
        Runtime::Node { .. } => {
            let dir = format!("tests/clients/node/{}", client.name);
            format!(
                "{}\n{}",
                read(&format!("{dir}/package.json")),
                read(&format!("{dir}/package-lock.json"))
            )
        }
        Runtime::Go { .. } => format!("{}\n{}", sources(GO_SOURCES), go_version()),
        Runtime::Java { .. } => format!("{}\n{}", sources(JAVA_SOURCES), java_versions()),
    }
}

fn env_at(client: &Pinned, dir: &Path) -> Option<ClientEnv> {
    match client.runtime {
        Runtime::Python { .. } => {
            let driver = repo_path("tests/clients/python/driver.py");
            let venv_python = dir.join("bin/python");
            let interpreter = if venv_python.is_file() {
                Launch::new(venv_python)
            } else if dir.join("site").is_dir() {
                // The --target fallback: the system python, packages on PYTHONPATH.
                Launch::new("python3").var("PYTHONPATH", dir.join("site"))
            } else {
                return None;
            };
            Some(ClientEnv {
                driver: interpreter.clone().arg(driver),
                interpreter: Some(interpreter),
                example: None,
                warehouses: None,
            })
        }
        Runtime::Node { library, .. } => {
            let modules = dir.join("node_modules");
            if !modules.join(library).is_dir() {
                return None;
            }
            let interpreter = Launch::new("node").var("NODE_PATH", modules);
            Some(ClientEnv {
                driver: interpreter
                    .clone()
                    .arg(repo_path("tests/clients/node/driver.js"))
                    .arg(library),
                interpreter: Some(interpreter),
                example: None,
                warehouses: None,
            })
        }
        Runtime::Go { library } => {
            let bin = dir.join("bin");
            let built = ["driver", "deduct-example", "warehouses-example"];
            if !built.iter().all(|name| bin.join(name).is_file()) {
                return None;
            }
            Some(ClientEnv {
                driver: Launch::new(bin.join("driver")).arg(library),
                interpreter: None,
                example: Some(Launch::new(bin.join("deduct-example"))),
                warehouses: Some(Launch::new(bin.join("warehouses-example"))),
            })
        }
        Runtime::Java { module, main } => Some(ClientEnv {
            driver: java_launch(&dir.join("drivers").join(module))?.arg(main),
            interpreter: None,
            example: Some(java_launch(&dir.join("example"))?.arg("Deduct")),
            warehouses: Some(java_launch(&dir.join("example"))?.arg("Warehouses")),
        }),
    }
}

/// `java -cp <build>/classes:<its jars>`, if that build is complete and
/// every jar it lists is still in Maven's local repository.
fn java_launch(build: &Path) -> Option<Launch> {
    let classes = build.join("classes");
    let jars = std::fs::read_to_string(build.join("classpath.txt")).ok()?;
    let jars = jars.trim();
    if !classes.is_dir() || !jars.split(':').all(|jar| Path::new(jar).is_file()) {
        return None;
    }
    let mut classpath = classes.into_os_string();
    classpath.push(":");
    classpath.push(jars);
    Some(
        Launch::new("java")
            // Each driver runs for a second or two: the JVM's quick
            // compiler alone, and the serial collector, start fastest and
            // leave the 2 cores to stockgate and Redis. Neither changes
            // what the client does.
            .arg("-XX:TieredStopAtLevel=1")
            .arg("-XX:+UseSerialGC")
            .arg("-cp")
            .arg(classpath),
    )
}

/// `go version`, failing with how to install Go when it is missing or
/// older than go.mod asks.
fn go_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let out = setup("go", &["version"], Path::new("."), GO_HINT);
        check(out.clone(), "go version");
        let version = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        // "go version go1.26.8 linux/amd64"
        let minor = version
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.strip_prefix("go1."))
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse::<u32>().ok());
        assert!(
            minor.is_some_and(|m| m >= 26),
            "{version} is too old: {GO_HINT}"
        );
        version
    })
}

/// `java -version` and `mvn --version`, failing with how to install them.
fn java_versions() -> &'static str {
    static VERSIONS: OnceLock<String> = OnceLock::new();
    VERSIONS.get_or_init(|| {
        let java = setup("java", &["-version"], Path::new("."), JAVA_HINT);
        check(java.clone(), "java -version");
        let mvn = setup("mvn", &["--version", "-B"], Path::new("."), JAVA_HINT);
        check(mvn.clone(), "mvn --version");
        // java prints its version on stderr; mvn's first line names Maven's.
        let java = String::from_utf8_lossy(&java.stderr).trim().to_owned();
        let mvn = String::from_utf8_lossy(&mvn.stdout);
        format!("{java}\n{}", mvn.lines().next().unwrap_or(""))
    })
}

fn python_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let out = setup(
            "python3",
            &["-c", "import sys; print(sys.version)"],
            Path::new("."),
            PYTHON_HINT,
        );
        check(out.clone(), "python3");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

fn node_major() -> u32 {
    let out = setup("node", &["--version"], Path::new("."), NODE_HINT);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// A venv without pip (fast: no ensurepip), filled by the system pip with
/// `--python`. Where venv is unusable, `pip install --target` instead.
/// Hash-pinned and binary-only, so CI installs exactly what was reviewed.
fn install_python(staging: &Path, requirements: &str) {
    let requirements = repo_path(&format!("tests/clients/python/{requirements}"));
    let requirements = requirements.to_str().unwrap();
    let pip = [
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        "--require-hashes",
        "--only-binary=:all:",
        "-r",
        requirements,
    ];
    let has_pip = setup("python3", &["-m", "pip", "--version"], staging, PYTHON_HINT);
    assert!(
        has_pip.status.success(),
        "python3 has no pip: {PYTHON_HINT}"
    );
    let venv = setup(
        "python3",
        &["-m", "venv", "--without-pip", "."],
        staging,
        PYTHON_HINT,
    );
    if venv.status.success() {
        let mut args = vec!["-m", "pip", "--python", "bin/python"];
        args.extend(pip);
        check(setup("python3", &args, staging, PYTHON_HINT), "pip install");
    } else {
        let mut args = vec!["-m", "pip"];
        args.extend(pip);
        args.extend(["--target", "site"]);
        check(
            setup("python3", &args, staging, PYTHON_HINT),
            "pip install --target",
        );
    }
}

/// `npm ci` from the committed lockfile, no install scripts.
fn install_node(staging: &Path, name: &str) {
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(
            repo_path(&format!("tests/clients/node/{name}/{file}")),
            staging.join(file),
        )
        .unwrap();
    }
    check(
        setup(
            "npm",
            &[
                "ci",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ],
            staging,
            NODE_HINT,
        ),
        "npm ci",
    );
}

/// One `go build` of every Go driver (tests/clients/go), one of each
/// example (examples/go, examples/go/warehouses: one module). `-mod=readonly`: go.sum must already hold every
/// module's hash, so only what was reviewed is fetched (from the Go module
/// proxy, into Go's own module cache) and nothing is re-resolved.
fn install_go(staging: &Path) {
    let bin = staging.join("bin");
    for (module, package, output) in [
        ("tests/clients/go", ".", "driver"),
        ("examples/go", ".", "deduct-example"),
        ("examples/go", "./warehouses", "warehouses-example"),
    ] {
        let output = bin.join(output);
        let out = StdCommand::new("go")
            .args(["build", "-mod=readonly", "-buildvcs=false", "-o"])
            .arg(&output)
            .arg(package)
            .current_dir(repo_path(module))
            // A go.work elsewhere must not change what is built.
            .env("GOWORK", "off")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run go ({e}): {GO_HINT}"));
        check(out, &format!("go build {package} in {module}"));
    }
}

/// One Maven invocation for every Java driver and the example: the
/// reactor in tests/clients/java compiles each module and writes its class
/// path, with the output in `staging`. The jars come from Maven Central
/// into Maven's local repository (~/.m2 unless configured otherwise), the
/// shared cache every Maven build uses, as pip's and npm's caches are for
/// the other envs.
fn install_java(staging: &Path) {
    let mut out_dir = OsString::from("-Dstockgate.out=");
    out_dir.push(staging.join("drivers"));
    let mut example_dir = OsString::from("-Dexample.out=");
    example_dir.push(staging.join("example"));
    let out = StdCommand::new("mvn")
        .args(["-B", "-q", "--no-transfer-progress", "compile"])
        .arg(out_dir)
        .arg(example_dir)
        .current_dir(repo_path("tests/clients/java"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run mvn ({e}): {JAVA_HINT}"));
    check(out, "mvn compile in tests/clients/java");
}
