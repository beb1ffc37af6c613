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
}

pub enum Runtime {
    /// A venv from a hash-pinned requirements file in tests/clients/python/.
    Python { requirements: &'static str },
    /// `npm ci` of tests/clients/node/<name>/; `library` is what to require.
    Node {
        library: &'static str,
        min_node: u32,
    },
}

/// How long any one subprocess may run before the test gives up on it: a
/// watchdog against a hung client, far above the few seconds they take.
const WATCHDOG: Duration = Duration::from_secs(180);

const PYTHON_HINT: &str =
    "install Python 3.8+ with pip (Debian: apt-get install -y python3 python3-pip python3-venv)";
const NODE_HINT: &str = "install Node.js 20+ with npm (Debian 13: apt-get install -y nodejs npm; Debian 12's Node 18 is too old for ioredis 6 and node-redis 6: use NodeSource's or nvm's Node 20+)";
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

/// An installed client: how to run a script with it.
pub struct ClientEnv {
    program: PathBuf,
    vars: Vec<(&'static str, OsString)>,
    driver: PathBuf,
    /// What the driver takes before the port and mode.
    driver_args: Vec<&'static str>,
}

pub struct Driven {
    pub version: String,
    pub replies: Vec<Json>,
}

impl ClientEnv {
    /// A command running `script` with this client importable.
    pub fn command(&self, script: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command.arg(script);
        command.envs(self.vars.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Runs the driver in `mode` against `port` and parses what it printed.
    pub async fn drive(&self, port: u16, mode: &str, commands: &[Vec<String>]) -> Driven {
        let mut command = self.command(&self.driver);
        command
            .args(&self.driver_args)
            .args([port.to_string().as_str(), mode]);
        let plan = json!({ "commands": commands }).to_string();
        let out = finish(command, plan.as_bytes()).await;
        assert!(
            out.status.success(),
            "driver {mode} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let printed: Json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "driver printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        Driven {
            version: printed["version"].as_str().unwrap().to_owned(),
            replies: printed["replies"].as_array().unwrap().clone(),
        }
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
    type PerClient = HashMap<&'static str, Arc<Mutex<()>>>;
    static LOCKS: LazyLock<Mutex<PerClient>> = LazyLock::new(Mutex::default);
    let lock = LOCKS
        .lock()
        .unwrap()
        .entry(client.name)
        .or_default()
        .clone();
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
    }

    let root = envs_root();
    let dir = root.join(client.name);
    let stamp = stamp(client);
    let current = |dir: &Path| {
        std::fs::read_to_string(dir.join(STAMP)).ok().as_deref() == Some(stamp.as_str())
            && env_at(client, dir).is_some()
    };
    if !current(&dir) {
        let staging = root.join(format!(".staging-{}-{}", client.name, std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).unwrap();
        match client.runtime {
            Runtime::Python { requirements } => install_python(&staging, requirements),
            Runtime::Node { .. } => install_node(&staging, client.name),
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

/// What an env was made from: the manifest, and for Python the
/// interpreter a venv links to.
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
    }
}

fn env_at(client: &Pinned, dir: &Path) -> Option<ClientEnv> {
    match client.runtime {
        Runtime::Python { .. } => {
            let driver = repo_path("tests/clients/python/driver.py");
            let venv_python = dir.join("bin/python");
            if venv_python.is_file() {
                return Some(ClientEnv {
                    program: venv_python,
                    vars: vec![],
                    driver,
                    driver_args: vec![],
                });
            }
            // The --target fallback: the system python, packages on PYTHONPATH.
            dir.join("site").is_dir().then(|| ClientEnv {
                program: "python3".into(),
                vars: vec![("PYTHONPATH", dir.join("site").into_os_string())],
                driver,
                driver_args: vec![],
            })
        }
        Runtime::Node { library, .. } => {
            let modules = dir.join("node_modules");
            modules.join(library).is_dir().then(|| ClientEnv {
                program: "node".into(),
                vars: vec![("NODE_PATH", modules.into_os_string())],
                driver: repo_path("tests/clients/node/driver.js"),
                driver_args: vec![library],
            })
        }
    }
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
