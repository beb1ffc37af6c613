//! The deploy/ directory, checked with the tools it is written for.
//!
//! - Every YAML and JSON file parses; the PrometheusRule wraps exactly the
//!   plain rules file.
//! - `promtool check rules` and `promtool test rules` accept the rules.
//! - The Kubernetes manifests meet the "restricted" Pod Security profile,
//!   and their parts agree with each other and with the binary (probes,
//!   ports, ConfigMap keys, Secret, PodMonitor, grace periods, Dockerfile).
//! - The ConfigMap's settings start the real binary, which serves, becomes
//!   ready and exits 0 on SIGTERM.
//! - A live stockgate's /metrics passes `promtool check metrics`; a real
//!   Prometheus scrapes it, its counters match what the test did, the
//!   rules evaluate without error, and every dashboard query answers.
//!
//! `prometheus` and `promtool` come from `deploy/install-deps.sh`; when
//! they are missing the tests fail and say so. Every server a test starts
//! listens on 127.0.0.1 and is stopped when the test ends.

mod support;

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;
use yaml_rust2::{Yaml, YamlLoader};

const TOOLS_HINT: &str = "install it with `deploy/install-deps.sh` (Debian: apt-get install -y --no-install-recommends prometheus, which brings promtool too)";

// ---------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy_dir() -> PathBuf {
    repo().join("deploy")
}

/// Every file under `dir` whose name ends with one of `extensions`.
fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| extensions.contains(&e))
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of a YAML file, as JSON values (so YAML and JSON files
/// are inspected alike).
fn yaml_documents(path: &Path) -> Vec<Value> {
    let docs = YamlLoader::load_from_str(&read(path))
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()));
    docs.iter().map(|doc| yaml_to_json(doc, path)).collect()
}

fn yaml_to_json(yaml: &Yaml, path: &Path) -> Value {
    match yaml {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(_) => Value::from(yaml.as_f64().expect("a real is a float")),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(items.iter().map(|i| yaml_to_json(i, path)).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let key = match key {
                        Yaml::String(s) => s.clone(),
                        other => panic!("{}: non-string key {other:?}", path.display()),
                    };
                    (key, yaml_to_json(value, path))
                })
                .collect::<Map<_, _>>(),
        ),
        Yaml::Alias(_) | Yaml::BadValue => panic!("{}: unresolved YAML value", path.display()),
    }
}

/// The only document of a YAML file.
fn yaml_document(path: &Path) -> Value {
    let mut docs = yaml_documents(path);
    assert_eq!(docs.len(), 1, "{}: one document expected", path.display());
    docs.remove(0)
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&read(path))
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

/// `value` at a JSON pointer, or a panic that names what is missing.
fn at<'a>(value: &'a Value, pointer: &str) -> &'a Value {
    value
        .pointer(pointer)
        .unwrap_or_else(|| panic!("missing {pointer} in {value:#}"))
}

fn text_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    at(value, pointer)
        .as_str()
        .unwrap_or_else(|| panic!("{pointer} is not a string in {value:#}"))
}

fn kubernetes(name: &str) -> Value {
    yaml_document(&deploy_dir().join("kubernetes").join(name))
}

fn rules_path() -> PathBuf {
    deploy_dir().join("prometheus/stockgate.rules.yml")
}

fn dashboard_path() -> PathBuf {
    deploy_dir().join("grafana/stockgate-dashboard.json")
}

// ---------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------

/// Checks that `binary` runs; fails the test with how to install it.
fn require_tool(binary: &str) {
    match Command::new(binary).arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("`{binary} --version` failed ({out:?}); {TOOLS_HINT}"),
        Err(e) => panic!("cannot run {binary} ({e}): {TOOLS_HINT}"),
    }
}

/// Runs `promtool args...` (with `stdin` piped in, if given) and fails
/// the test with its output unless it succeeds.
fn promtool(args: &[&str], stdin: Option<&str>) -> String {
    require_tool("promtool");
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}): {TOOLS_HINT}"));
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Makes the kernel kill the child when the spawning thread (this test)
/// goes away without running Drop, as the dev servers do.
fn die_with_test(cmd: &mut Command) -> &mut Command {
    // SAFETY: prctl is async-signal-safe; nothing else runs in pre_exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

/// A child process that is killed when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------
// Prometheus' query strings, and waiting
// ---------------------------------------------------------------------

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Retries `f` until it returns Ok or `within` passes; then panics with
/// the last Err.
fn poll<T>(within: Duration, what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match f() {
            Ok(value) => return value,
            Err(last) if Instant::now() > deadline => {
                panic!("gave up after {within:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

// ---------------------------------------------------------------------
// Parsing, syntax, and the two rules files
// ---------------------------------------------------------------------

#[test]
fn every_yaml_and_json_file_under_deploy_parses() {
    let yaml = files_under(&deploy_dir(), &["yml", "yaml"]);
    let json = files_under(&deploy_dir(), &["json"]);
    // So that moving the directory can't make this test pass vacuously.
    assert!(
        yaml.len() >= 8,
        "expected the manifests and rules, found {yaml:?}"
    );
    assert!(!json.is_empty(), "expected the dashboard");
    for path in &yaml {
        let docs = yaml_documents(path);
        assert!(!docs.is_empty(), "{}: no document", path.display());
        for doc in docs {
            assert!(
                doc.is_object(),
                "{}: a document is not a mapping",
                path.display()
            );
        }
        // yaml-rust2 reads YAML 1.2; Kubernetes reads YAML 1.1, where a
        // bare yes/no/on/off is a boolean. Quote them.
        for (n, line) in read(path).lines().enumerate() {
            let value = line
                .split_once(": ")
                .map(|(_, v)| v)
                .or_else(|| line.trim_start().strip_prefix("- "))
                .unwrap_or("")
                .trim();
            assert!(
                !matches!(
                    value.to_ascii_lowercase().as_str(),
                    "yes" | "no" | "on" | "off" | "y" | "n"
                ),
                "{}:{}: quote {value:?}, YAML 1.1 reads it as a boolean",
                path.display(),
                n + 1
            );
        }
    }
    for path in &json {
        assert!(json_file(path).is_object(), "{}", path.display());
    }
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests() {
    let checked = promtool(
        &["check", "rules", "deploy/prometheus/stockgate.rules.yml"],
        None,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(
        &[
            "test",
            "rules",
            "deploy/prometheus/stockgate.rules.test.yml",
        ],
        None,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_prometheus_rule_wraps_exactly_the_plain_rules() {
    let plain = yaml_document(&rules_path());
    let crd = kubernetes("prometheusrule.yaml");
    assert_eq!(text_at(&crd, "/apiVersion"), "monitoring.coreos.com/v1");
    assert_eq!(text_at(&crd, "/kind"), "PrometheusRule");
    assert!(
        at(&crd, "/spec/groups") == at(&plain, "/groups"),
        "deploy/kubernetes/prometheusrule.yaml and deploy/prometheus/stockgate.rules.yml differ: \
         run deploy/prometheus/sync-prometheusrule.sh"
    );
    // And byte for byte what the generator writes, so its header and
    // comments aren't hand-edited either.
    let dir = tempfile::tempdir().unwrap();
    let generated = dir.path().join("prometheusrule.yaml");
    let out = Command::new("bash")
        .arg(deploy_dir().join("prometheus/sync-prometheusrule.sh"))
        .arg(&generated)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        read(&generated) == read(&deploy_dir().join("kubernetes/prometheusrule.yaml")),
        "deploy/kubernetes/prometheusrule.yaml is not what deploy/prometheus/sync-prometheusrule.sh writes: run it"
    );
}

#[test]
fn every_alert_says_how_bad_what_and_what_to_check_and_is_unit_tested() {
    let rules = yaml_document(&rules_path());
    let unit_tests = read(&deploy_dir().join("prometheus/stockgate.rules.test.yml"));
    let mut alerts = 0;
    for group in at(&rules, "/groups").as_array().unwrap() {
        for rule in at(group, "/rules").as_array().unwrap() {
            let Some(name) = rule.get("alert").and_then(Value::as_str) else {
                continue;
            };
            alerts += 1;
            let severity = text_at(rule, "/labels/severity");
            assert!(
                ["critical", "warning"].contains(&severity),
                "{name}: severity {severity}"
            );
            for annotation in ["summary", "description", "runbook"] {
                let text = text_at(rule, &format!("/annotations/{annotation}"));
                assert!(text.len() > 20, "{name}: {annotation} says too little");
            }
            assert!(
                unit_tests.contains(&format!("alertname=\"{name}\""))
                    || unit_tests.contains(&format!("alertname: {name}")),
                "{name} has no test in stockgate.rules.test.yml"
            );
        }
    }
    assert!(alerts >= 8, "{alerts} alerts");
}

// ---------------------------------------------------------------------
// Kubernetes manifests
// ---------------------------------------------------------------------

const DEPLOYMENTS: [&str; 2] = [
    "deployment-native-sidecar.yaml",
    "deployment-classic-sidecar.yaml",
];

fn containers(pod: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|list| pod.get(list).and_then(Value::as_array))
        .flatten()
        .collect()
}

fn stockgate_container(pod: &Value) -> &Value {
    containers(pod)
        .into_iter()
        .find(|c| c["name"] == "stockgate")
        .expect("a container named stockgate")
}

/// A container setting, or the pod's when the container has none.
fn effective<'a>(pod: &'a Value, container: &'a Value, field: &str) -> Option<&'a Value> {
    container
        .pointer(&format!("/securityContext/{field}"))
        .or_else(|| pod.pointer(&format!("/securityContext/{field}")))
}

fn configmap() -> BTreeMap<String, String> {
    let cm = kubernetes("configmap.yaml");
    at(&cm, "/data")
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .unwrap_or_else(|| panic!("ConfigMap value {k} must be a string"));
            (k.clone(), v.to_owned())
        })
        .collect()
}

fn duration_setting(config: &BTreeMap<String, String>, key: &str) -> Duration {
    humantime::parse_duration(&config[key]).unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// The checks of the "restricted" Pod Security Standard (Kubernetes 1.29+)
/// that a pod spec can fail, plus a read-only root filesystem.
#[test]
fn every_pod_meets_the_restricted_pod_security_profile() {
    for file in DEPLOYMENTS {
        let deployment = kubernetes(file);
        let pod = at(&deployment, "/spec/template/spec");
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            assert_ne!(pod.get(host), Some(&Value::Bool(true)), "{file}: {host}");
        }
        for volume in pod
            .get("volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let allowed = [
                "configMap",
                "csi",
                "downwardAPI",
                "emptyDir",
                "ephemeral",
                "persistentVolumeClaim",
                "projected",
                "secret",
            ];
            for kind in volume.as_object().unwrap().keys().filter(|k| *k != "name") {
                assert!(
                    allowed.contains(&kind.as_str()),
                    "{file}: volume type {kind}"
                );
            }
        }
        for container in containers(pod) {
            let name = format!("{file}: container {}", container["name"]);
            let sc = at(container, "/securityContext");
            assert_ne!(sc.get("privileged"), Some(&Value::Bool(true)), "{name}");
            assert_eq!(
                sc.get("allowPrivilegeEscalation"),
                Some(&Value::Bool(false)),
                "{name}: allowPrivilegeEscalation must be false"
            );
            let dropped = at(sc, "/capabilities/drop").as_array().unwrap();
            assert!(dropped.contains(&Value::from("ALL")), "{name}: drop ALL");
            for added in sc
                .pointer("/capabilities/add")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                assert_eq!(added, "NET_BIND_SERVICE", "{name}: adds {added}");
            }
            assert_eq!(
                effective(pod, container, "runAsNonRoot"),
                Some(&Value::Bool(true)),
                "{name}: runAsNonRoot"
            );
            if let Some(uid) = effective(pod, container, "runAsUser") {
                assert_ne!(uid.as_i64(), Some(0), "{name}: runs as root");
            }
            let seccomp = effective(pod, container, "seccompProfile")
                .unwrap_or_else(|| panic!("{name}: no seccompProfile"));
            assert!(
                ["RuntimeDefault", "Localhost"].contains(&text_at(seccomp, "/type")),
                "{name}: seccompProfile {seccomp}"
            );
            for port in container
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                assert!(
                    port.get("hostPort").is_none_or(|p| p == 0),
                    "{name}: hostPort"
                );
            }
            assert_eq!(
                sc.get("readOnlyRootFilesystem"),
                Some(&Value::Bool(true)),
                "{name}: readOnlyRootFilesystem"
            );
            assert!(
                sc.get("procMount").is_none() && sc.get("sysctls").is_none(),
                "{name}"
            );
        }
    }
}

#[test]
fn the_sidecar_manifests_agree_with_each_other_and_with_stockgate() {
    let config = configmap();
    let cm = kubernetes("configmap.yaml");
    let secret = kubernetes("secret.example.yaml");
    let podmonitor = kubernetes("podmonitor.yaml");
    let dockerfile = read(&deploy_dir().join("Dockerfile"));

    let listen: SocketAddr = config["STOCKGATE_LISTEN"].parse().unwrap();
    assert!(
        listen.ip().is_loopback(),
        "the RESP port has no authentication: it must stay on loopback"
    );
    let admin: SocketAddr = config["STOCKGATE_ADMIN_LISTEN"].parse().unwrap();
    assert!(
        admin.ip().is_unspecified(),
        "kubelet probes and Prometheus reach the pod IP, not loopback"
    );
    let grace = duration_setting(&config, "STOCKGATE_SHUTDOWN_GRACE");

    for file in DEPLOYMENTS {
        let deployment = kubernetes(file);
        let template = at(&deployment, "/spec/template");
        let pod = at(template, "/spec");
        let sidecar = stockgate_container(pod);
        let native = pod["initContainers"]
            .as_array()
            .is_some_and(|list| list.contains(sidecar));

        // The admin port, named as the probes and the PodMonitor use it.
        let ports = at(sidecar, "/ports").as_array().unwrap();
        let admin_port = ports
            .iter()
            .find(|p| p["name"] == "admin")
            .unwrap_or_else(|| panic!("{file}: no port named admin"));
        assert_eq!(at(admin_port, "/containerPort"), admin.port(), "{file}");
        assert!(
            ports.iter().all(|p| p["containerPort"] != listen.port()),
            "{file}: the loopback RESP port is not a pod port"
        );
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = at(sidecar, &format!("/{probe}/httpGet"));
            assert_eq!(text_at(get, "/path"), path, "{file}: {probe}");
            assert_eq!(text_at(get, "/port"), "admin", "{file}: {probe}");
        }

        // Configuration: the ConfigMap, and the upstream URL from the Secret.
        let env_from = at(sidecar, "/envFrom/0/configMapRef/name");
        assert_eq!(env_from, at(&cm, "/metadata/name"), "{file}");
        let upstream = at(sidecar, "/env")
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "STOCKGATE_UPSTREAM")
            .unwrap_or_else(|| panic!("{file}: STOCKGATE_UPSTREAM not set"));
        let secret_ref = at(upstream, "/valueFrom/secretKeyRef");
        assert_eq!(at(secret_ref, "/name"), at(&secret, "/metadata/name"));
        let key = text_at(secret_ref, "/key");
        assert!(
            at(&secret, "/stringData").get(key).is_some(),
            "{file}: the Secret has no key {key}"
        );

        // Sized resources, both requests and limits.
        for kind in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                at(sidecar, &format!("/resources/{kind}/{resource}"));
            }
        }

        // The app talks to stockgate where it listens.
        let app = at(pod, "/containers")
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "app")
            .unwrap();
        let app_addr = at(app, "/env")
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "STOCKGATE_ADDR")
            .unwrap();
        assert_eq!(text_at(app_addr, "/value"), config["STOCKGATE_LISTEN"]);

        // Image user = pod user.
        let user_line = dockerfile
            .lines()
            .rfind(|l| l.starts_with("USER "))
            .expect("the Dockerfile sets USER");
        let uid: i64 = user_line[5..].split(':').next().unwrap().parse().unwrap();
        assert!(uid > 0);
        assert_eq!(at(pod, "/securityContext/runAsUser"), uid, "{file}");

        // Shutdown order and grace.
        let termination =
            Duration::from_secs(at(pod, "/terminationGracePeriodSeconds").as_u64().unwrap());
        if native {
            assert_eq!(text_at(sidecar, "/restartPolicy"), "Always", "{file}");
            assert!(
                grace < termination,
                "{file}: the drain must fit the grace period"
            );
        } else {
            assert!(sidecar.get("restartPolicy").is_none(), "{file}");
            let command = at(sidecar, "/lifecycle/preStop/exec/command")
                .as_array()
                .unwrap();
            let sleep = command[0].as_str().unwrap();
            assert!(
                dockerfile.contains(&format!("/out/sleep {sleep}")),
                "{file}: the image must ship {sleep}"
            );
            let seconds: u64 = command[1].as_str().unwrap().parse().unwrap();
            assert!(
                Duration::from_secs(seconds) + grace < termination,
                "{file}: preStop sleep + STOCKGATE_SHUTDOWN_GRACE must fit terminationGracePeriodSeconds"
            );
        }

        // The PodMonitor finds this pod, its admin port, and its job name.
        let labels = at(template, "/metadata/labels").as_object().unwrap();
        for (key, value) in at(&podmonitor, "/spec/selector/matchLabels")
            .as_object()
            .unwrap()
        {
            assert_eq!(
                labels.get(key),
                Some(value),
                "{file}: PodMonitor selector {key}"
            );
        }
        assert!(labels.contains_key(text_at(&podmonitor, "/spec/jobLabel")));
        assert_eq!(
            text_at(&podmonitor, "/spec/podMetricsEndpoints/0/port"),
            "admin"
        );
    }
}

#[test]
fn the_dockerfile_context_holds_everything_the_build_reads() {
    let dockerfile = read(&deploy_dir().join("Dockerfile"));
    let ignore = read(&deploy_dir().join("Dockerfile.dockerignore"));
    let mut copied = Vec::new();
    for line in dockerfile.lines().filter(|l| l.starts_with("COPY ")) {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        if words.iter().any(|w| w.starts_with("--from")) {
            continue;
        }
        for source in &words[..words.len() - 1] {
            assert!(repo().join(source).exists(), "COPY {source}: no such path");
            let unignored = format!("!{}", source.trim_end_matches('/'));
            assert!(
                ignore.lines().any(|l| l.trim_end_matches('/') == unignored),
                "Dockerfile.dockerignore filters out {source}"
            );
            copied.push(repo().join(source));
        }
    }
    assert!(dockerfile.contains("cargo build --release --locked"));
    // Files compiled in with include_str!/include_bytes! must be in the
    // context too.
    for source in files_under(&repo().join("src"), &["rs"]) {
        let text = read(&source);
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(macro_name) {
                let rest = &text[at + macro_name.len()..];
                let relative = &rest[..rest.find('"').unwrap()];
                let included = source.parent().unwrap().join(relative);
                let included = included.canonicalize().unwrap_or(included);
                assert!(
                    copied.iter().any(|c| included.starts_with(c)),
                    "{} includes {}, which the Dockerfile doesn't copy",
                    source.display(),
                    included.display()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------
// The ConfigMap, run by the real binary
// ---------------------------------------------------------------------

/// Every key of the ConfigMap is a variable stockgate reads: clap ignores
/// unknown ones, so a misspelt key would silently leave a default.
#[test]
fn every_configmap_key_is_a_variable_stockgate_reads() {
    let help = run(stockgate_bin().to_str().unwrap(), &["serve", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for key in configmap().keys() {
        // STOCKGATE_LOG is read by the log filter, not by a flag.
        if key == "STOCKGATE_LOG" {
            continue;
        }
        assert!(
            help.contains(&format!("[env: {key}=")),
            "ConfigMap key {key} is not a variable of `stockgate serve`"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configmap_settings_start_the_real_binary_which_drains_on_sigterm() {
    let cluster = cluster();
    let config = configmap();
    let layout = stockgate::keys::KeyLayout::new(&config["STOCKGATE_KEY_PREFIX"]).unwrap();
    let sku = stockgate::params::Sku::parse(b"cm-sku".to_vec().into()).unwrap();
    redis::cmd("SET")
        .arg(layout.stock_key(&sku))
        .arg(10)
        .query::<()>(&mut cluster.cluster_connection().unwrap())
        .unwrap();

    let mut gate = Launch::new("serve")
        .env_clear()
        .envs(&config)
        // Same settings, but on free loopback ports: the test opens
        // nothing beyond 127.0.0.1.
        .ports_in_env()
        .env("STOCKGATE_UPSTREAM", cluster.seeds().join(","))
        .dies_with_thread()
        .start();
    let (addr, admin) = (gate.addr, gate.admin.port());

    // STOCKGATE_LOG_FORMAT=json: the listening line says where.
    let listening = poll(
        Duration::from_secs(20),
        "the 'stockgate listening' log line",
        || {
            let log = gate.log();
            for line in log.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
                let entry: Value = serde_json::from_str(line)
                    .map_err(|e| format!("not a JSON log line ({e}): {line}"))?;
                if entry.pointer("/fields/message") == Some(&Value::from("stockgate listening")) {
                    return Ok(entry);
                }
            }
            Err(format!("log so far: {log}"))
        },
    );
    let field = |name: &str| text_at(&listening, &format!("/fields/{name}")).to_owned();
    assert_eq!(
        (field("addr"), field("admin_addr")),
        (addr.to_string(), gate.admin.to_string())
    );
    assert_eq!(http_get(admin, "/healthz").unwrap().0, 200);
    let mut conn = redis::Client::open(format!("redis://{addr}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let reply = parse(
        deduct(&mut conn, "cm-sku", "3", "cm-1", None)
            .await
            .unwrap(),
    );
    assert_eq!((reply.code, reply.remain), (0, 7));
    drop(conn);

    // SIGTERM: a clean drain, exit status 0.
    gate.signal(libc::SIGTERM);
    let status = poll(
        Duration::from_secs(30),
        "stockgate to exit after SIGTERM",
        || gate.exited().ok_or_else(|| "still running".to_owned()),
    );
    assert!(
        status.success(),
        "exit status {status}; log: {}",
        gate.log()
    );
}

// ---------------------------------------------------------------------
// A real Prometheus scraping a live stockgate
// ---------------------------------------------------------------------

/// A Prometheus server on a free loopback port with its own temp
/// storage; killed when dropped.
struct Prometheus {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    _process: Reaped,
}

impl Prometheus {
    /// Starts one with `config` (prometheus.yml text) and waits until it
    /// answers /-/ready.
    fn start(config: &str) -> Prometheus {
        require_tool("prometheus");
        let dir = tempfile::Builder::new()
            .prefix("stockgate-prometheus-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let mut last = String::new();
        // The free port can be taken between the probe and the bind:
        // try a few.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let mut cmd = Command::new("prometheus");
            cmd.arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
            let mut process = Reaped(
                die_with_test(&mut cmd)
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot run prometheus ({e}): {TOOLS_HINT}")),
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(status)) = process.0.try_wait() {
                    last = format!(
                        "exited with {status}: {}",
                        read(&dir.path().join("prometheus.log"))
                    );
                    break;
                }
                if let Ok((200, _)) = http_get(addr.port(), "/-/ready") {
                    return Prometheus {
                        addr,
                        dir,
                        _process: process,
                    };
                }
                if Instant::now() > deadline {
                    panic!(
                        "prometheus not ready within 30s: {}",
                        read(&dir.path().join("prometheus.log"))
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("prometheus did not start: {last}");
    }

    fn log(&self) -> String {
        read(&self.dir.path().join("prometheus.log"))
    }

    /// GET an API path; its `data`, or an error with the body.
    fn api(&self, target: &str) -> Result<Value, String> {
        let (status, body) = http_get(self.addr.port(), target).map_err(|e| e.to_string())?;
        let reply: Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {status}: {e}: {body}"))?;
        if reply["status"] != "success" {
            return Err(format!("HTTP {status}: {body}"));
        }
        Ok(reply["data"].clone())
    }

    /// An instant query's result vector.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&format!("/api/v1/query?query={}", percent_encode(expr)))?;
        data["result"]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("no result vector: {data}"))
    }
}

/// A sample's value as a number ("NaN" and "+Inf" included).
fn sample_value(sample: &Value) -> f64 {
    text_at(sample, "/value/1").parse().unwrap()
}

/// Each series' value, keyed by its `label`.
fn by_label(samples: &[Value], label: &str) -> BTreeMap<String, f64> {
    samples
        .iter()
        .map(|s| {
            (
                text_at(s, &format!("/metric/{label}")).to_owned(),
                sample_value(s),
            )
        })
        .collect()
}

/// Metric names (`stockgate_...`, not recording rules) that `expr` reads,
/// histogram suffixes removed.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.match_indices("stockgate_")
        .filter(|(at, _)| {
            !expr[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        })
        .map(|(at, _)| {
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .map(str::to_owned)
                .unwrap_or(name)
        })
        .collect()
}

/// Values that `expr` matches `label` against (`label="a"`, `label=~"a|b"`).
fn label_values(expr: &str, label: &str) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    for op in ["=\"", "=~\""] {
        let pattern = format!("{label}{op}");
        for (at, _) in expr.match_indices(&pattern) {
            let rest = &expr[at + pattern.len()..];
            let value = &rest[..rest.find('"').unwrap()];
            values.extend(value.split('|').map(str::to_owned));
        }
    }
    values
}

/// Every expression of the rules file (records and alerts).
fn rule_exprs() -> Vec<String> {
    let rules = yaml_document(&rules_path());
    at(&rules, "/groups")
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| at(g, "/rules").as_array().unwrap().clone())
        .map(|r| text_at(&r, "/expr").to_owned())
        .collect()
}

/// Every query of the dashboard, with Grafana's variables replaced by
/// what "All" and a short range would give.
fn dashboard_exprs() -> Vec<(String, String)> {
    let dashboard = json_file(&dashboard_path());
    let mut exprs = Vec::new();
    for panel in at(&dashboard, "/panels").as_array().unwrap() {
        let title = text_at(panel, "/title");
        for target in panel
            .get("targets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let expr = text_at(target, "/expr")
                .replace("$__rate_interval", "1m")
                .replace("$namespace", ".*")
                .replace("$job", ".*")
                .replace("$pod", ".*");
            assert!(
                !expr.contains('$'),
                "{title}: unreplaced variable in {expr}"
            );
            exprs.push((title.to_owned(), expr));
        }
    }
    exprs
}

#[test]
fn the_dashboard_has_the_panels_an_operator_needs() {
    let dashboard = json_file(&dashboard_path());
    let panels = at(&dashboard, "/panels").as_array().unwrap();
    let titles: Vec<&str> = panels.iter().map(|p| text_at(p, "/title")).collect();
    for needed in [
        "Requests by result",
        "Result distribution",
        "Error ratio",
        "Duplicate ratio vs its baseline",
        "Request latency (stockgate)",
        "Upstream latency (Redis)",
        "Client connections",
        "Upstream errors by kind",
        "Sidecars ready",
        "Readiness changes",
    ] {
        assert!(
            titles.contains(&needed),
            "no panel {needed:?} in {titles:?}"
        );
    }
    let by_result = panels
        .iter()
        .find(|p| p["title"] == "Requests by result")
        .unwrap();
    assert_eq!(
        text_at(by_result, "/fieldConfig/defaults/custom/stacking/mode"),
        "normal"
    );
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(
            text_at(panel, "/datasource/uid"),
            "${datasource}",
            "{}: every panel reads the chosen data source",
            panel["title"]
        );
    }
    let variables: Vec<&str> = at(&dashboard, "/templating/list")
        .as_array()
        .unwrap()
        .iter()
        .map(|v| text_at(v, "/name"))
        .collect();
    assert_eq!(variables, ["datasource", "namespace", "job", "pod"]);
    // Grafana panel ids must be unique.
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_a_live_stockgate_and_the_rules_and_dashboard_work() {
    require_tool("prometheus");
    require_tool("promtool");
    let cluster = cluster();
    set_stock(&cluster, "live-sku", 1_000);
    set_stock(&cluster, "live-scarce", 1);
    let server = proxy(cluster.seeds(), |_| {}).await;
    let mut conn = client(&server, false).await;

    // Every result, with counts the test keeps itself.
    let mut expected: BTreeMap<&str, f64> = BTreeMap::new();
    let mut request = 0;
    let mut traffic = async |expected: &mut BTreeMap<&str, f64>| {
        for _ in 0..3 {
            request += 1;
            let id = format!("live-{request}");
            let ok = parse(deduct(&mut conn, "live-sku", "1", &id, None).await.unwrap());
            assert_eq!(ok.code, 0);
            let again = parse(deduct(&mut conn, "live-sku", "1", &id, None).await.unwrap());
            assert_eq!(again.code, 1);
            let scarce = parse(
                deduct(&mut conn, "live-scarce", "5", &id, None)
                    .await
                    .unwrap(),
            );
            assert_eq!(scarce.code, 2);
            let invalid = parse(deduct(&mut conn, "live-sku", "0", &id, None).await.unwrap());
            assert_eq!(invalid.code, 3);
            let err = deduct(&mut conn, "live-unknown", "1", &id, None)
                .await
                .unwrap_err();
            assert_eq!(err.code(), Some("UNKNOWNSKU"), "{err:?}");
            for result in ["ok", "duplicate", "insufficient", "invalid", "error"] {
                *expected.entry(result).or_default() += 1.0;
            }
        }
    };
    traffic(&mut expected).await;

    // promtool lints the exposition, with histograms holding samples.
    let (status, metrics) = http_get(server.admin_addr.port(), "/metrics").unwrap();
    assert_eq!(status, 200);
    promtool(&["check", "metrics"], Some(&metrics));

    // Everything the rules and the dashboard read exists, with the label
    // values they match on.
    let mut exprs = rule_exprs();
    exprs.extend(dashboard_exprs().into_iter().map(|(_, e)| e));
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(
                metrics.contains(&format!("# TYPE {name} ")),
                "{name} (in {expr}) is not in /metrics"
            );
        }
        for label in ["result", "kind", "command"] {
            for value in label_values(expr, label) {
                assert!(
                    metrics.contains(&format!("{label}=\"{value}\"")),
                    "{label}=\"{value}\" (in {expr}) is not in /metrics"
                );
            }
        }
    }

    // A Prometheus scraping this stockgate every second, with the rules
    // loaded, and the labels the PodMonitor would add.
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n  - job_name: orders\n    static_configs:\n      - targets: ['{target}']\n        \
         labels: {{namespace: shop, pod: orders-0, container: stockgate}}\n",
        rules = rules_path().display(),
        target = server.admin_addr,
    );
    let prometheus = Prometheus::start(&config);
    let diagnose = |what: &str| format!("{what}\nprometheus log:\n{}", prometheus.log());

    // Once Prometheus has a first sample, more traffic, so rates and the
    // latency quantile have an increase to work with.
    poll(
        Duration::from_secs(60),
        "a first scrape",
        || match prometheus.query("up{job=\"orders\"} == 1") {
            Ok(up) if up.len() == 1 => Ok(()),
            other => Err(diagnose(&format!("{other:?}"))),
        },
    );
    traffic(&mut expected).await;

    // Exactly what the test did, per result; any other result series
    // (one added to stockgate later) must have stayed at 0.
    poll(
        Duration::from_secs(60),
        "Prometheus' counters to match the requests made",
        || {
            let samples = prometheus
                .query("stockgate_requests_total{job=\"orders\",command=\"deduct\"}")
                .map_err(|e| diagnose(&e))?;
            let counted = by_label(&samples, "result");
            let matches = expected
                .iter()
                .all(|(result, n)| counted.get(*result) == Some(n))
                && counted
                    .iter()
                    .all(|(result, n)| expected.contains_key(result.as_str()) || *n == 0.0);
            if matches {
                Ok(())
            } else {
                Err(format!("got {counted:?}, want {expected:?}"))
            }
        },
    );

    let p99 = poll(Duration::from_secs(60), "a p99 latency", || {
        let samples = prometheus
            .query(
                "histogram_quantile(0.99, sum by (le) (rate(stockgate_request_duration_seconds_bucket[1m])))",
            )
            .map_err(|e| diagnose(&e))?;
        match samples.as_slice() {
            [sample] if sample_value(sample).is_finite() => Ok(sample_value(sample)),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(p99 > 0.0, "{p99}");

    // Every rule has been evaluated, and none failed.
    poll(
        Duration::from_secs(60),
        "every rule evaluated without error",
        || {
            let data = prometheus.api("/api/v1/rules").map_err(|e| diagnose(&e))?;
            let rules: Vec<&Value> = data["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap())
                .collect();
            if rules.len() != rule_exprs().len() {
                return Err(format!("{} rules loaded", rules.len()));
            }
            let unhealthy: Vec<String> = rules
                .iter()
                .filter(|r| r["health"] != "ok")
                .map(|r| format!("{} {} {}", r["name"], r["health"], r["lastError"]))
                .collect();
            if unhealthy.is_empty() {
                Ok(())
            } else {
                Err(unhealthy.join("; "))
            }
        },
    );

    // Every dashboard query is valid PromQL and finds data (the duplicate
    // baseline needs 30 minutes of history, so it may be empty here).
    for (title, expr) in dashboard_exprs() {
        poll(
            Duration::from_secs(30),
            &format!("data for dashboard panel {title:?}: {expr}"),
            || {
                let samples = prometheus.query(&expr).map_err(|e| {
                    // A query Prometheus can't parse won't get better.
                    assert!(!e.contains("bad_data"), "panel {title:?}: {e}");
                    diagnose(&e)
                })?;
                if samples.is_empty() && !expr.contains("avg6h_offset30m") {
                    Err("no series".to_owned())
                } else {
                    Ok(())
                }
            },
        );
    }
}
