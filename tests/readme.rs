//! The README and the docs/ pages, run: every command they show with its
//! output is run here, page after page in [`PAGES`] order and top to bottom
//! within a page, against one `stockgate dev`, and what it prints must
//! match what the page says it prints. A newcomer reads the README, then
//! the pages it links, on one dev cluster; so does this test, so an example
//! that breaks a later one (by reusing its ids, or keeping a SKU's units,
//! say) fails here first. A failure is reported as `page:line`.
//!
//! # The convention (for anyone adding a section or a page)
//!
//! - [`PAGES`] lists the pages in the order a newcomer reads them, the
//!   README first. A Markdown page under `docs/` (or `README.md`) with a
//!   console block, or a `$ ` line in any fenced block, that is missing
//!   from it fails this test: add a new page where a reader meets it.
//! - A block fenced as ```` ```console ```` is run. Each line starting with
//!   `$ ` is a command, run with bash in a scratch directory (so `> file`,
//!   pipes and quotes work as typed); a command ending in `\` continues on
//!   the next line. The lines after it, up to the next `$ ` or the fence,
//!   are its expected output: stdout and stderr together, in the order
//!   written, as a terminal shows them.
//! - A line `? N` right after a command says it exits with status N
//!   (trycmd's spelling); without one, it must exit 0.
//! - Placeholders, as trycmd and snapbox spell them: `[..]` matches any text
//!   within one line, and a line that is only `...` matches any number of
//!   lines (none included). Use them for what legitimately varies: ports of
//!   the cluster, timings, SHAs, counts that other sections change.
//! - The default ports `6390` (RESP), `8390` (HTTP) and `9390` (admin)
//!   stand for the ports this test picks: write them as a user types them.
//!   So do `6391` and `9392`, a second stockgate's (docs/operations.md's
//!   users walkthrough starts one beside the dev cluster).
//! - A command may start a server in the background (`... > log 2>&1 &`,
//!   its output to a file, or this test waits for the pipe to close); the
//!   page stops it, and this test stops whatever a command left running
//!   once the pages are done, failed or not.
//!   `STOCKGATE_UPSTREAM` is set to the dev cluster's seeds, as the dev
//!   start-up message tells the user to do, so `stockgate check` and
//!   `stockgate stock ...` need no `--upstream`.
//! - The dev cluster runs with `--admin-commands` (docs/locations.md's
//!   walkthrough asks for it), and with the journal on, and `STOCKGATE_DATABASE`
//!   points at a throwaway PostgreSQL this test starts (and stops), as
//!   `deploy/dev.sh --postgres` sets them up (docs/books.md). A throwaway
//!   MariaDB with the database `books` stands for `deploy/dev.sh
//!   --mysql`'s: its port, `3307` in the pages, is one this test picks.
//! - `stockgate` is the binary this build made; `redis-cli` and `curl`
//!   are the system's. redis-cli runs with `--no-raw`, so its output reads
//!   as on a terminal (`1) (integer) 0`) although it goes to a pipe here.
//! - One block is fenced ```` ```console dev ````: its command is
//!   `deploy/dev.sh [args]`, which this test runs as `stockgate dev [args]`
//!   on free ports (a bare `--http-listen` gets one too), comparing what it
//!   prints on stdout up to "Ctrl-C stops ..." with the block. It must come
//!   before every other console block, so it is the README's.
//! - A block that shows a command with output but can't run here (it needs
//!   production hosts, say `--upstream redis://10.0.0.5:6379`) is fenced
//!   ```` ```console norun ````; it renders the same. A `$ ` line in a block
//!   fenced any other way fails this test, so no example is left unchecked
//!   by forgetting the tag. Commands shown without output go in ```` ```sh ````
//!   blocks without a `$ `.
//! - Use request ids (and skus, when the stock matters) of your own, or
//!   give the units back: every page runs on one cluster, in order.
//! - Every link between the pages leads to a file, and with a `#` to one of
//!   its headings (GitHub's anchors).
//!
//! # Why a harness of its own, not trycmd or snapbox
//!
//! trycmd reads the same Markdown shape and is where the placeholder
//! spellings come from, but it runs each command without a shell, and
//! substitutes variables only in the expected output, never in the command
//! line: `redis-cli -p 6390` can't be pointed at a port picked at run time,
//! and `printf ... > stock.csv` or `| sort` can't run at all. It also wants
//! each case to own its binaries and state, where these pages are one story
//! on one live cluster. What is left to write is a Markdown walk and a line
//! matcher, about 150 lines here, against a dev-dependency tree (trycmd,
//! snapbox, toml_edit, ...) that every build would compile.

mod support;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// The pages run, in the order a newcomer reads them: the README, then the
/// pages its "Read next" table links, as it lists them.
const PAGES: &[&str] = &[
    "README.md",
    "docs/holds-and-orders.md",
    "docs/locations.md",
    "docs/books.md",
    "docs/interfaces.md",
    "docs/operations.md",
    "docs/design.md",
    "docs/testing.md",
    "docs/performance.md",
];

/// A command that runs longer than this is stopped and reported: a
/// watchdog against a hang, far above anything the pages run.
const COMMAND_WATCHDOG_SECS: u32 = 120;
/// The dev cluster and proxy must be up within this long: another watchdog.
const DEV_WATCHDOG: Duration = Duration::from_secs(90);

/// The pages' default ports, each replaced by a port this test picks.
const RESP_PORT: u16 = 6390;
const HTTP_PORT: u16 = 8390;
const ADMIN_PORT: u16 = 9390;
/// A second stockgate's, beside the dev cluster (docs/operations.md).
const SECOND_RESP_PORT: u16 = 6391;
const SECOND_ADMIN_PORT: u16 = 9392;
/// `deploy/dev.sh --mysql`'s MariaDB.
const MARIADB_PORT: u16 = 3307;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// ```` ```console ````: run it.
    Run,
    /// ```` ```console dev ````: start the dev cluster with it.
    Dev,
}

/// Where a line is: the page (as [`PAGES`] names it) and its 1-based line.
#[derive(Debug, Clone, Copy)]
struct At<'a> {
    page: &'a str,
    line: usize,
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.page, self.line)
    }
}

#[derive(Debug)]
struct Step<'a> {
    /// Where the `$ ` line is.
    at: At<'a>,
    command: String,
    status: i32,
    expected: Vec<String>,
}

#[derive(Debug)]
struct Block<'a> {
    kind: Kind,
    steps: Vec<Step<'a>>,
}

/// What a page holds (or the pages, appended in order), by the convention
/// above.
#[derive(Default)]
struct Pages<'a> {
    blocks: Vec<Block<'a>>,
    /// Fence lines of ```` ```console norun ```` blocks.
    norun: Vec<At<'a>>,
    /// `$ ` lines found in blocks that are neither: mistakes.
    stray: Vec<(At<'a>, String)>,
}

impl<'a> Pages<'a> {
    /// Whether the page has anything this test runs, or should.
    fn has_console(&self) -> bool {
        !(self.blocks.is_empty() && self.norun.is_empty() && self.stray.is_empty())
    }

    fn append(&mut self, mut other: Pages<'a>) {
        self.blocks.append(&mut other.blocks);
        self.norun.append(&mut other.norun);
        self.stray.append(&mut other.stray);
    }
}

/// A block being read: its fence's indentation, what it is, its lines
/// (with their line numbers on the page).
struct OpenBlock {
    indent: usize,
    fence: Fence,
    lines: Vec<(usize, String)>,
}

/// What a fence's info string makes of its block.
enum Fence {
    Runs(Kind),
    /// ```` ```console norun ````: shown, deliberately not run.
    NoRun,
    /// Anything else: code, syntax, commands without output.
    Other,
}

fn parse_page<'a>(page: &'a str, text: &str) -> Pages<'a> {
    let mut readme = Pages::default();
    let mut open: Option<OpenBlock> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = raw.trim_start();
        let indent = raw.len() - trimmed.len();
        let is_fence = trimmed.starts_with("```");
        match &mut open {
            None if is_fence => {
                let words: Vec<&str> = trimmed[3..].split_whitespace().collect();
                let fence = match words.as_slice() {
                    ["console"] => Fence::Runs(Kind::Run),
                    ["console", "dev"] => Fence::Runs(Kind::Dev),
                    ["console", "norun"] => {
                        readme.norun.push(At { page, line: number });
                        Fence::NoRun
                    }
                    _ => Fence::Other,
                };
                open = Some(OpenBlock {
                    indent,
                    fence,
                    lines: Vec::new(),
                });
            }
            None => {}
            Some(OpenBlock { fence, lines, .. })
                if is_fence && trimmed.trim_end().trim_matches('`').is_empty() =>
            {
                match fence {
                    Fence::Runs(kind) => readme.blocks.push(Block {
                        kind: *kind,
                        steps: steps(page, lines),
                    }),
                    Fence::NoRun => {}
                    Fence::Other => readme.stray.extend(
                        lines
                            .drain(..)
                            .filter(|(_, l)| l.starts_with("$ "))
                            .map(|(line, l)| (At { page, line }, l)),
                    ),
                }
                open = None;
            }
            Some(OpenBlock {
                indent: fence_indent,
                lines,
                ..
            }) => {
                // Inside a list item the block is indented; its lines are
                // what follows that indentation.
                let content = raw.get((*fence_indent).min(indent)..).unwrap_or("");
                lines.push((number, content.to_owned()));
            }
        }
    }
    readme
}

/// The commands of one console block, each with its expected output.
fn steps<'a>(page: &'a str, lines: &[(usize, String)]) -> Vec<Step<'a>> {
    let mut steps: Vec<Step> = Vec::new();
    let mut iter = lines.iter().peekable();
    while let Some((number, line)) = iter.next() {
        if let Some(command) = line.strip_prefix("$ ") {
            let mut command = command.to_owned();
            while command.ends_with('\\') {
                let Some((_, next)) = iter.next() else { break };
                command.push('\n');
                command.push_str(next);
            }
            let mut status = 0;
            if let Some((_, next)) = iter.peek()
                && let Some(code) = next.strip_prefix("? ")
            {
                status = code.trim().parse().unwrap_or_else(|_| {
                    panic!("{page}:{}: `? {code}` is not an exit status", number + 1)
                });
                iter.next();
            }
            steps.push(Step {
                at: At {
                    page,
                    line: *number,
                },
                command,
                status,
                expected: Vec::new(),
            });
        } else if let Some(step) = steps.last_mut() {
            step.expected.push(line.clone());
        } else if !line.trim().is_empty() {
            panic!("{page}:{number}: a console block must start with a `$ ` command line");
        }
    }
    steps
}

/// `[..]` matches any text within a line.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("[..]").collect();
    if parts.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &line[first.len()..];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// A line of only `...` matches any number of lines.
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, more)| line_matches(first, line) && lines_match(rest, more)),
    }
}

/// Lines to compare: trailing whitespace (and `\r`) and trailing blank
/// lines don't count.
fn normalize<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = lines.map(|l| l.trim_end().to_owned()).collect();
    while out.last().is_some_and(String::is_empty) {
        out.pop();
    }
    out
}

/// Replaces the port `from` where it stands as a number of its own (not
/// inside 16390 or 63901).
fn replace_port(text: &str, from: u16, to: u16) -> String {
    let (from, to) = (from.to_string(), to.to_string());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&from) {
        let (before, after) = (&rest[..at], &rest[at + from.len()..]);
        let digit_before = before
            .chars()
            .last()
            .or_else(|| out.chars().last())
            .is_some_and(|c| c.is_ascii_digit());
        let digit_after = after.starts_with(|c: char| c.is_ascii_digit());
        out.push_str(before);
        out.push_str(if digit_before || digit_after {
            &from
        } else {
            &to
        });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The ports this run uses in place of the README's.
struct Ports(Vec<(u16, u16)>);

impl Ports {
    fn pick() -> Ports {
        let mut picked: Vec<u16> = Vec::new();
        while picked.len() < 5 {
            let port = free_port();
            if !picked.contains(&port) {
                picked.push(port);
            }
        }
        Ports(vec![
            (RESP_PORT, picked[0]),
            (HTTP_PORT, picked[1]),
            (ADMIN_PORT, picked[2]),
            (SECOND_RESP_PORT, picked[3]),
            (SECOND_ADMIN_PORT, picked[4]),
        ])
    }

    /// New free ports in place of these README ports'.
    fn pick_again(&mut self, readme_ports: &[u16]) {
        for readme_port in readme_ports {
            let port = loop {
                let port = free_port();
                if self.0.iter().all(|(_, taken)| *taken != port) {
                    break port;
                }
            };
            if let Some(entry) = self.0.iter_mut().find(|(r, _)| r == readme_port) {
                entry.1 = port;
            }
        }
    }

    fn real(&self, readme_port: u16) -> u16 {
        self.0.iter().find(|(r, _)| *r == readme_port).unwrap().1
    }

    fn apply(&self, text: &str) -> String {
        self.0.iter().fold(text.to_owned(), |t, (from, to)| {
            replace_port(&t, *from, *to)
        })
    }

    /// The other way, for reports: what was printed, as the README would
    /// show it, ready to paste.
    fn unapply(&self, text: &str) -> String {
        self.0.iter().fold(text.to_owned(), |t, (to, from)| {
            replace_port(&t, *from, *to)
        })
    }
}

/// Stops `stockgate dev` like Ctrl-C (SIGKILL if it has not exited 30 s
/// later; its Redis nodes die with it, see `src/dev.rs`): its log.
fn stop_dev(mut dev: Stockgate) -> String {
    dev.signal(libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.exited().is_none() {
        if Instant::now() > deadline {
            return dev.kill().1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    dev.wait().1
}

/// Starts the dev block's `deploy/dev.sh [args]` as `stockgate dev` on free
/// ports, and returns them, it, and what it printed up to "Ctrl-C stops".
/// A port picked free can be taken before stockgate binds it (by another
/// test, or by one of the dev cluster's own Redis nodes): then it starts
/// again on others.
fn start_dev_on_free_ports(step: &Step) -> (Ports, Stockgate, Vec<String>) {
    for _ in 0..3 {
        let ports = Ports::pick();
        match start_dev(step, &ports) {
            Ok((dev, printed)) => return (ports, dev, printed),
            Err(log) if log.contains("Address already in use") => continue,
            Err(log) => panic!("{log}"),
        }
    }
    panic!("stockgate dev lost a port race three times running");
}

/// One try of [`start_dev_on_free_ports`]; the failure's report otherwise.
fn start_dev(step: &Step, ports: &Ports) -> Result<(Stockgate, Vec<String>), String> {
    let command = ports.apply(&step.command);
    let mut words = command.split_whitespace();
    assert_eq!(
        words.next(),
        Some("deploy/dev.sh"),
        "{}: the dev block runs deploy/dev.sh",
        step.at
    );
    let mut args: Vec<String> = Vec::new();
    let given: Vec<String> = words.map(str::to_owned).collect();
    for (i, arg) in given.iter().enumerate() {
        args.push(arg.clone());
        let bare = given.get(i + 1).is_none_or(|next| next.starts_with("--"));
        if arg == "--http-listen" && bare {
            args.push(format!("127.0.0.1:{}", ports.real(HTTP_PORT)));
        }
    }
    let on = |port| ([127, 0, 0, 1], ports.real(port)).into();
    let mut dev = Launch::new("dev")
        .args(&args)
        // In the environment, so a --listen or --admin-listen the README
        // gives wins.
        .listen(on(RESP_PORT))
        .admin_listen(on(ADMIN_PORT))
        .ports_in_env()
        .env_remove("STOCKGATE_LOG")
        // As `deploy/dev.sh --postgres` runs it: the books' walkthrough
        // (docs/books.md) needs the journal.
        .env("STOCKGATE_JOURNAL", "true")
        // As docs/locations.md has the reader start it (`--admin-commands`):
        // its walkthrough stocks two warehouses with STOCK.SET.
        .env("STOCKGATE_ADMIN_COMMANDS", "true")
        .printed()
        .unready()
        .start();
    let deadline = Instant::now() + DEV_WATCHDOG;
    loop {
        // Whole lines only: the last may still be on its way.
        let text = dev.printed();
        let lines: Vec<&str> = text
            .split_inclusive('\n')
            .filter_map(|l| l.strip_suffix('\n'))
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .collect();
        if let Some(last) = lines.iter().position(|l| l.starts_with("Ctrl-C stops")) {
            let printed = lines[..=last].iter().map(|l| l.to_string()).collect();
            return Ok((dev, printed));
        }
        // Exited, or hung past the watchdog.
        if dev.exited().is_some() || Instant::now() > deadline {
            return Err(format!(
                "stockgate dev {} did not finish its start-up message:\n{}\nstderr:\n{}",
                args.join(" "),
                lines.join("\n"),
                stop_dev(dev)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The process groups of the pages' commands that left something running
/// when they ended (a server started with `&`; `timeout` leads a group per
/// command): whatever is still there is stopped when the walk ends, passed
/// or failed, so a page that fails before stopping its server leaves none.
#[derive(Default)]
struct Leftovers(Vec<i32>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for &group in &self.0 {
            // A group whose processes all ended is gone: ESRCH, and nothing.
            unsafe {
                libc::kill(-group, libc::SIGTERM);
            }
        }
    }
}

/// Runs one command of a page as a user would in a shell, stdout and stderr
/// together.
fn run_step(
    command: &str,
    dir: &Path,
    env: &HashMap<&str, String>,
    leftovers: &mut Leftovers,
) -> (i32, String) {
    // --no-raw: redis-cli prints raw replies when stdout is not a terminal;
    // the README shows what a terminal shows.
    let script = format!(
        "set -o pipefail\nexec 2>&1\nredis-cli() {{ command redis-cli --no-raw \"$@\"; }}\n{command}\n"
    );
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", &COMMAND_WATCHDOG_SECS.to_string(), "bash", "-c"])
        .arg(script)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("STOCKGATE_") {
            cmd.env_remove(&name);
        }
    }
    cmd.envs(env);
    let mut child = cmd.spawn().expect("runs bash");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    let group = child.id() as i32;
    if unsafe { libc::kill(-group, 0) } == 0 {
        leftovers.0.push(group);
    }
    out.push_str(&err);
    (status.code().unwrap_or(-1), out)
}

/// A failed step as its page has it, and what it printed written the
/// pages' way (their ports), so a changed output can be pasted in.
fn describe(ports: &Ports, step: &Step, got: (i32, &str)) -> String {
    let indent = |text: &str| {
        text.lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "{}: $ {}\n  exit status: expected {}, got {}\n  expected (as the page has it):\n{}\n  got (with the pages' ports):\n{}",
        step.at,
        step.command,
        step.status,
        got.0,
        indent(&step.expected.join("\n")),
        indent(&ports.unapply(got.1))
    )
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_page(page: &str) -> String {
    std::fs::read_to_string(repo().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

/// Every page of [`PAGES`], parsed and appended in order.
fn parse_pages() -> Pages<'static> {
    let mut pages = Pages::default();
    for page in PAGES {
        pages.append(parse_page(page, &read_page(page)));
    }
    pages
}

/// `README.md` and every Markdown file under `docs/`, as paths from the
/// repository root.
fn markdown_pages() -> Vec<String> {
    let mut found = vec!["README.md".to_owned()];
    let mut pending = vec![repo().join("docs")];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let relative = path.strip_prefix(repo()).unwrap();
                found.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn the_readme_runs_top_to_bottom_on_one_dev_cluster() {
    for tool in ["redis-cli", "curl", "bash", "timeout", "psql", "mariadb"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        assert!(
            found.status.success(),
            "{tool} is needed to run the README: deploy/install-deps.sh test installs it"
        );
    }
    let readme = parse_pages();
    assert!(
        readme.stray.is_empty(),
        "`$ ` command lines outside a ```console block (fence it as console to run it, or \
         console norun if it can't run here):\n{:#?}",
        readme.stray
    );
    let (dev_block, rest) = readme
        .blocks
        .split_first()
        .expect("the pages have console blocks");
    assert_eq!(
        dev_block.kind,
        Kind::Dev,
        "the first console block (the README's) must be the ```console dev one"
    );
    assert_eq!(dev_block.steps.len(), 1, "the dev block has one command");
    assert!(
        rest.iter().all(|b| b.kind == Kind::Run),
        "only one ```console dev block"
    );

    let dev_step = &dev_block.steps[0];
    let postgres = support::postgres::Postgres::start();
    let mariadb = support::mariadb::MariaDb::start();
    mariadb.root_sql("CREATE DATABASE books");
    let (mut ports, dev, printed) = start_dev_on_free_ports(dev_step);
    ports.0.push((MARIADB_PORT, mariadb.port));
    let mut failures = Vec::new();
    let expected: Vec<String> = dev_step.expected.iter().map(|l| ports.apply(l)).collect();
    let printed = normalize(printed.iter().map(String::as_str));
    let expected = normalize(expected.iter().map(String::as_str));
    if !lines_match(&expected, &printed) {
        failures.push(describe(&ports, dev_step, (0, &printed.join("\n"))));
    }
    // The start-up message says how the other tools reach the cluster; use
    // exactly that, as the README tells the user to.
    let upstream = printed
        .iter()
        .find_map(|l| l.trim().strip_prefix("export STOCKGATE_UPSTREAM="))
        .unwrap_or_else(|| {
            panic!(
                "no `export STOCKGATE_UPSTREAM=` in:\n{}",
                printed.join("\n")
            )
        })
        .to_owned();

    let scratch = tempfile::tempdir().unwrap();
    let bin = scratch.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(stockgate_bin(), bin.join("stockgate")).unwrap();
    let work = scratch.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let env = HashMap::from([
        (
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("STOCKGATE_UPSTREAM", upstream),
        ("STOCKGATE_DATABASE", postgres.url()),
    ]);

    let mut commands = 0;
    let mut leftovers = Leftovers::default();
    for block in rest {
        for step in &block.steps {
            // The second stockgate's ports, picked free right before it
            // starts: picked with the others, minutes earlier, another
            // test's server may have taken one by then.
            if step.command.contains("stockgate serve")
                && step.command.contains(&SECOND_RESP_PORT.to_string())
            {
                ports.pick_again(&[SECOND_RESP_PORT, SECOND_ADMIN_PORT]);
            }
            let command = ports.apply(&step.command);
            let (status, output) = run_step(&command, &work, &env, &mut leftovers);
            commands += 1;
            let got = normalize(output.lines());
            let want: Vec<String> = step.expected.iter().map(|l| ports.apply(l)).collect();
            let want = normalize(want.iter().map(String::as_str));
            if status != step.status || !lines_match(&want, &got) {
                failures.push(describe(&ports, step, (status, &got.join("\n"))));
            }
        }
    }
    drop(leftovers);
    let log = stop_dev(dev);
    let norun: Vec<String> = readme.norun.iter().map(At::to_string).collect();
    println!(
        "{} pages: {commands} commands run in {} console blocks after the dev block; {} console norun blocks ({})",
        PAGES.len(),
        rest.len(),
        norun.len(),
        norun.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} example(s) don't do what their page says:\n\n{}\n\nstockgate dev's log:\n{log}",
        failures.len(),
        failures.join("\n\n")
    );
    // A parse that found next to nothing would pass vacuously.
    assert!(
        commands >= 10,
        "only {commands} commands found in the pages"
    );
}

/// A page with console blocks that this test doesn't walk would go
/// unchecked: every Markdown page under docs/ (and the README) that has
/// one, or a `$ ` line in any block, is in [`PAGES`], and every page
/// listed exists.
#[test]
fn every_page_with_console_blocks_is_walked() {
    let mut missing = Vec::new();
    for page in markdown_pages() {
        let listed = PAGES.contains(&page.as_str());
        if !listed && parse_page(&page, &read_page(&page)).has_console() {
            missing.push(page);
        }
    }
    assert!(
        missing.is_empty(),
        "pages with console blocks that tests/readme.rs does not walk (add them to PAGES, \
         where a newcomer reads them): {missing:?}"
    );
    for page in PAGES {
        assert!(
            repo().join(page).is_file(),
            "PAGES lists {page}, which is missing"
        );
    }
}

/// The page that shows the runnable examples.
const EXAMPLES_PAGE: &str = "docs/interfaces.md";

/// Every example under examples/ is on the interfaces page with the
/// command that runs it.
#[test]
fn the_docs_say_how_to_run_every_example() {
    let text = read_page(EXAMPLES_PAGE);
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let how = match name.strip_suffix(".rs") {
            Some(example) => format!("cargo run --example {example}"),
            None => format!("examples/{name}"),
        };
        if !text.contains(&how) {
            missing.push(how);
        }
    }
    assert!(missing.is_empty(), "{EXAMPLES_PAGE} lacks {missing:?}");
}

#[test]
fn placeholders_match_what_they_promise() {
    assert!(line_matches("a [..] c", "a b c"));
    assert!(line_matches("[..]", ""));
    assert!(line_matches("x[..]y[..]z", "x1y2y3z"));
    assert!(!line_matches("a [..] c", "a b d"));
    assert!(!line_matches("ab[..]ba", "aba"));
    let lines = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(
        &lines(&["...", "end"]),
        &lines(&["a", "b", "end"])
    ));
    assert!(lines_match(&lines(&["...", "end"]), &lines(&["end"])));
    assert!(!lines_match(
        &lines(&["...", "end"]),
        &lines(&["end", "more"])
    ));
    assert!(!lines_match(&lines(&["one"]), &lines(&["one", "two"])));
    assert_eq!(
        replace_port("-p 6390 :6390/ 16390 63901", 6390, 41000),
        "-p 41000 :41000/ 16390 63901"
    );
}

/// `stockgate dev` started with a password (`--requirepass`, its file) or
/// a users file prints "Try it" commands that log in: run as printed, the
/// placeholder filled in with the password as its user would, each answers
/// the code its comment says (never NOAUTH or NOPERM), and no password is
/// in what it prints.
#[test]
fn the_dev_start_up_commands_log_in() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let (typed, in_file, reader, caller) = (
        "typed-in-secret-1",
        "filed-secret-2",
        "reader-secret-3",
        "caller-secret-4",
    );
    let file = dir.join("requirepass");
    std::fs::write(&file, format!("{in_file}\n")).unwrap();
    // The reader comes first: it may not DEDUCT, so the message must pass
    // it over for the caller.
    let users = dir.join("users.toml");
    std::fs::write(
        &users,
        format!(
            "[users.dashboard]\npasswords = [\"{reader}\"]\nrights = [\"reader\"]\n\n\
             [users.checkout]\npasswords = [\"{caller}\"]\nrights = [\"caller\"]\n"
        ),
    )
    .unwrap();
    // The arguments, and the placeholder its user replaces with the
    // password (none: the line reads the file itself).
    let cases = [
        (
            format!("--requirepass {typed}"),
            Some(("'<the --requirepass password>'", typed)),
        ),
        (format!("--requirepass-file {}", file.display()), None),
        (
            format!("--users-file {}", users.display()),
            Some(("'<the password of checkout>'", caller)),
        ),
    ];
    let mut leftovers = Leftovers::default();
    let mut failures = Vec::new();
    for (args, placeholder) in cases {
        let step = Step {
            at: At {
                page: "the dev start-up message",
                line: 0,
            },
            command: format!("deploy/dev.sh {args}"),
            status: 0,
            expected: Vec::new(),
        };
        let (_, dev, printed) = start_dev_on_free_ports(&step);
        let printed = printed.join("\n");
        for secret in [typed, in_file, reader, caller] {
            assert!(
                !printed.contains(secret),
                "{args}: a password is printed:\n{printed}"
            );
        }
        let try_it: Vec<&str> = printed
            .lines()
            .skip_while(|l| !l.starts_with("Try it"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .map(str::trim)
            .collect();
        let (login, commands) = try_it.split_first().expect("a Try it section");
        assert!(
            login.starts_with("export REDISCLI_AUTH="),
            "{args}: no line logs redis-cli in:\n{printed}"
        );
        let login = match placeholder {
            Some((placeholder, password)) => {
                assert!(login.contains(placeholder), "{args}: {login}");
                login.replace(placeholder, &format!("'{password}'"))
            }
            None => login.to_string(),
        };
        assert_eq!(commands.len(), 5, "{args}:\n{printed}");
        for command in commands {
            let (_, said) = command.split_once("# ").expect("each says its code");
            let code = said.split(':').next().unwrap();
            let (status, output) = run_step(
                &format!("{login}\n{command}"),
                dir,
                &HashMap::new(),
                &mut leftovers,
            );
            let first = output.lines().next().unwrap_or("");
            if status != 0 || first != format!("1) (integer) {code}") {
                failures.push(format!("{args}: $ {command}\n{output}"));
            }
        }
        stop_dev(dev);
    }
    assert!(
        failures.is_empty(),
        "the dev start-up message's commands don't answer as it says:\n\n{}",
        failures.join("\n\n")
    );
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped
/// (hyphens and underscores kept), spaces as hyphens.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// A page's lines outside fenced blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut prose = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push((index + 1, line));
        }
    }
    prose
}

/// Every link between the pages (the README, docs/, and the files they
/// name) leads somewhere: its file exists, and its anchor is a heading of
/// that page. Sections move between pages; a link left behind fails here.
#[test]
fn every_link_between_the_pages_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in markdown_pages() {
        let text = read_page(&page);
        for (number, line) in prose_lines(&text) {
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    repo().join(&page)
                } else {
                    repo().join(&page).parent().unwrap().join(path)
                };
                let at = format!("{page}:{number}: ({target})");
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                let headings: Vec<String> = prose_lines(&std::fs::read_to_string(&file).unwrap())
                    .into_iter()
                    .filter_map(|(_, l)| l.strip_prefix('#'))
                    .map(|l| anchor_of(l.trim_start_matches('#')))
                    .collect();
                if !headings.iter().any(|h| h == anchor) {
                    broken.push(format!("{at}: no heading of that anchor"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
    // A parse that found next to nothing would pass vacuously.
    assert!(checked >= 100, "only {checked} links found");
}
