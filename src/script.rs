//! The Lua scripts stockgate runs, embedded in the binary.
//!
//! Each script file in `lua/` starts with its `#!lua` line and a header
//! documenting KEYS, ARGV and every reply, then a `--@common` line where
//! `lua/common.lua` (the helpers every script shares: argument rules, the
//! key layout check, the record format) is spliced in. The SHA is taken of
//! the spliced text, which is what Redis runs.
//!
//! Each script is loaded on every primary at startup (readiness waits for
//! it). Where the server allows Redis Functions (Redis 7.0+, Valkey 7.2+,
//! and an ACL that lets stockgate use FUNCTION LOAD and FCALL), all of them
//! are also loaded as one function library ([`Library`]) and called with
//! FCALL; elsewhere, or with `--scripts eval`, with EVALSHA ([`Calling`]).
//! This module owns how a call is written, whichever it is; the upstream
//! (`src/upstream/eval.rs`) owns what happens when a node has lost it:
//! when a node answers NOSCRIPT or `Function not found` (after a restart, a
//! failover, a new primary, `SCRIPT FLUSH` or `FUNCTION FLUSH`), the call
//! is sent again as EVAL with the full body to the node that owns the key:
//! that both answers the request and caches the script there again, and it
//! needs no other node, unlike re-loading on every primary, which fails
//! while a failover is under way. The library is loaded again in the
//! background.

use std::sync::Arc;

const COMMON: &str = include_str!("../lua/common.lua");
const MARKER: &str = "--@common\n";

/// One embedded script: its body and SHA1 digest (what EVALSHA names), and
/// its function in stockgate's library (what FCALL names).
#[derive(Debug)]
pub struct LuaScript {
    pub name: &'static str,
    pub body: String,
    pub sha: String,
    /// `<library>_<name>`: function names are global on a server, so each
    /// carries its library's versioned name too.
    pub function: String,
    /// The shebang's flags (`#!lua flags=no-writes`), which the library
    /// registers its function with, so that a replica, a server out of
    /// memory or a cluster treat an FCALL as they treat the EVALSHA.
    flags: Vec<&'static str>,
    /// The script's own code, after the helpers, without its last line:
    /// its private helpers and its function, which the library registers.
    own: &'static str,
    /// The name of that function: the script's last line is `return
    /// <entry>(KEYS, ARGV)`, what an EVALSHA of the body runs.
    entry: &'static str,
    /// Whether its answer acknowledges a write a caller relies on (a
    /// deduction, a hold, an order's step, an operator's change, an order
    /// filed for recovery): with `--wait-replicas` such an answer stands
    /// only once replicas confirmed the write, so a WAIT follows the call.
    /// The others are reads and the sweeper's bookkeeping: what they write
    /// (expired holds given back, sweep index marks, the sweep lease) any
    /// later call or pass redoes from Redis time, so a failover that loses
    /// it loses nothing a caller was told. A WAIT after them would confirm
    /// nothing anyone needs, and it blocks the connection it is sent on for
    /// up to `--wait-timeout`.
    pub needs_replicas: bool,
}

impl LuaScript {
    /// A script whose answers acknowledge writes ([`LuaScript::needs_replicas`]).
    fn new(name: &'static str, source: &'static str) -> Self {
        LuaScript::build(name, source, true)
    }

    /// A read, or the sweeper's bookkeeping ([`LuaScript::needs_replicas`]).
    fn without_replicas(name: &'static str, source: &'static str) -> Self {
        LuaScript::build(name, source, false)
    }

    fn build(name: &'static str, source: &'static str, needs_replicas: bool) -> Self {
        let (_, after) = source
            .split_once(MARKER)
            .unwrap_or_else(|| panic!("lua/{name}.lua lacks its --@common line"));
        let (own, last) = after
            .trim_end()
            .rsplit_once('\n')
            .unwrap_or_else(|| panic!("lua/{name}.lua has no code"));
        let entry = last
            .strip_prefix("return ")
            .and_then(|call| call.strip_suffix("(KEYS, ARGV)"))
            .filter(|entry| entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or_else(|| {
                panic!("lua/{name}.lua must end with `return <its function>(KEYS, ARGV)`: {last}")
            });
        let shebang = source.lines().next().unwrap_or_default();
        assert!(shebang.starts_with("#!lua"), "lua/{name}.lua: {shebang}");
        let flags = shebang
            .split_whitespace()
            .find_map(|word| word.strip_prefix("flags="))
            .map(|flags| flags.split(',').filter(|f| !f.is_empty()).collect())
            .unwrap_or_default();
        let body = body_of(COMMON, source);
        let sha = redis::Script::new(&body).get_hash().to_owned();
        LuaScript {
            name,
            body,
            sha,
            function: String::new(),
            flags,
            own,
            entry,
            needs_replicas,
        }
    }

    /// Whether the script may touch keys of other slots by design (its
    /// shebang's `allow-cross-slot-keys`: `lua/order.lua`'s filing). For
    /// any other script, a "non local key" refusal can only mean its own
    /// slot is moving ([`crate::error::UpstreamError::is_non_local_key`]).
    pub fn crosses_slots(&self) -> bool {
        self.flags.contains(&"allow-cross-slot-keys")
    }

    /// A script given whole, as Redis runs it: an older release's (the
    /// benchmark's and the upgrade tests' `tests/compat/`). Not in any
    /// library: call it with [`Calling::Eval`].
    pub fn from_body(name: &'static str, body: String, needs_replicas: bool) -> Self {
        let sha = redis::Script::new(&body).get_hash().to_owned();
        LuaScript {
            name,
            body,
            sha,
            function: String::new(),
            flags: Vec::new(),
            own: "",
            entry: "",
            needs_replicas,
        }
    }

    /// The same script, for calls of it whose answers acknowledge no write
    /// ([`LuaScript::needs_replicas`] false): one script that serves both
    /// writes and reads.
    fn without_replicas_copy(&self) -> LuaScript {
        LuaScript {
            name: self.name,
            body: self.body.clone(),
            sha: self.sha.clone(),
            function: self.function.clone(),
            flags: self.flags.clone(),
            own: self.own,
            entry: self.entry,
            needs_replicas: false,
        }
    }

    /// Writes the head of a call of this script with `keys` keys and `args`
    /// arguments, as `calling` says: `FCALL <function> <numkeys>` or
    /// `EVALSHA <sha> <numkeys>` (the same shape). The keys and arguments
    /// follow, with [`crate::reply::bulk_of`] and [`crate::reply::bulk_parts`].
    pub fn write_head(
        &self,
        calling: Calling,
        dst: &mut bytes::BytesMut,
        keys: usize,
        args: usize,
    ) {
        let (verb, name) = self.named(calling);
        crate::reply::script_call_start(dst, verb.as_bytes(), name, keys, args);
    }

    /// A whole call, keys and arguments written as they are.
    pub fn write_call(
        &self,
        calling: Calling,
        dst: &mut bytes::BytesMut,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) {
        self.write_head(calling, dst, keys.len(), args.len());
        for part in keys.iter().chain(args) {
            crate::reply::bulk_of(dst, part);
        }
    }

    /// The same call as a command for the redis crate; `Calling::Eval`
    /// with the body itself (`EVAL`) when `with_body`.
    pub fn command(
        &self,
        calling: Calling,
        with_body: bool,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> redis::Cmd {
        let (verb, name) = if with_body {
            ("EVAL", self.body.as_str())
        } else {
            self.named(calling)
        };
        let mut cmd = redis::cmd(verb);
        cmd.arg(name).arg(keys.len());
        for part in keys.iter().chain(args) {
            cmd.arg(*part);
        }
        cmd
    }

    /// The verb and what it names: `("FCALL", function)` or `("EVALSHA",
    /// sha)`.
    pub fn named(&self, calling: Calling) -> (&'static str, &str) {
        match calling {
            Calling::Function => ("FCALL", &self.function),
            Calling::Eval => ("EVALSHA", &self.sha),
        }
    }
}

/// How stockgate calls its scripts on the upstream now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calling {
    /// FCALL of the script's function in stockgate's library: the helpers
    /// are made once, when the library is loaded, not on every call, and
    /// the library is persisted and replicated like data, so a promoted
    /// replica has it.
    Function,
    /// EVALSHA of the script's body: servers or ACLs that refuse FUNCTION,
    /// and `--scripts eval`.
    Eval,
}

impl Calling {
    /// As `stockgate check` and INFO name it.
    pub fn verb(self) -> &'static str {
        match self {
            Calling::Function => "FCALL",
            Calling::Eval => "EVALSHA",
        }
    }
}

/// The [`Calling`] in use, shared by the upstream, which decides it (see
/// `src/upstream/health.rs`), and everything that writes calls. EVALSHA
/// until the library is known to be loaded and FCALL allowed.
#[derive(Debug, Default)]
pub struct CallingNow(std::sync::atomic::AtomicBool);

impl CallingNow {
    pub fn get(&self) -> Calling {
        if self.0.load(std::sync::atomic::Ordering::Relaxed) {
            Calling::Function
        } else {
            Calling::Eval
        }
    }

    /// Sets it; true when that changed it.
    pub fn set(&self, calling: Calling) -> bool {
        let function = calling == Calling::Function;
        self.0.swap(function, std::sync::atomic::Ordering::Relaxed) != function
    }
}

/// The commands the function library needs, any of which a server or an
/// ACL may refuse (stockgate then calls by EVALSHA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionCommand {
    List,
    Load,
    Call,
}

impl FunctionCommand {
    pub const ALL: [FunctionCommand; 3] = [
        FunctionCommand::List,
        FunctionCommand::Load,
        FunctionCommand::Call,
    ];

    /// As Redis names it.
    pub fn name(self) -> &'static str {
        match self {
            FunctionCommand::List => "FUNCTION LIST",
            FunctionCommand::Load => "FUNCTION LOAD",
            FunctionCommand::Call => "FCALL",
        }
    }

    /// The `command` label of `stockgate_function_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            FunctionCommand::List => "function_list",
            FunctionCommand::Load => "function_load",
            FunctionCommand::Call => "fcall",
        }
    }
}

/// Bumped when the way [`Library::of`] writes the library changes, so that
/// the same scripts written another way get another name.
const LIBRARY_FORMAT: u32 = 2;

/// Every script as one function library: `lua/common.lua` once at its top
/// level, then each script's own code in a block of its own (its private
/// helpers and its function, which is registered under
/// [`LuaScript::function`]). All of it runs once, at FUNCTION LOAD: a call
/// runs only the script's function, which makes no closure.
///
/// Its name is `stockgate_v<VERSION>_<digest>`: the scripts' version and a
/// digest of every body, so that two stockgate builds whose scripts differ
/// in any byte load two libraries side by side, and each calls its own
/// during a rolling upgrade; none replaces the other's (FUNCTION LOAD
/// without REPLACE).
#[derive(Debug, Clone)]
pub struct Library {
    pub name: String,
    pub code: String,
    /// A function of no keys that answers the library's name: what a
    /// probe FCALLs to learn that FCALL is allowed and the library there.
    pub probe: String,
}

impl Library {
    /// The library of `scripts`, which [`Scripts::new`] named with
    /// [`library_name`]; `None` for none (the one-shot tools).
    pub fn of(scripts: &[Arc<LuaScript>]) -> Option<Library> {
        let name = library_name(scripts.iter().map(|s| s.sha.as_str()))?;
        let probe = format!("{name}_probe");
        let mut code = format!("#!lua name={name}\n{COMMON}");
        for script in scripts {
            debug_assert_eq!(script.function, format!("{name}_{}", script.name));
            let flags: Vec<String> = script.flags.iter().map(|f| format!("'{f}'")).collect();
            code.push_str(&format!(
                "\ndo\n{own}\nredis.register_function{{function_name='{function}', \
                 callback={entry}, flags={{{flags}}}}}\nend\n",
                own = script.own,
                entry = script.entry,
                function = script.function,
                flags = flags.join(", "),
            ));
        }
        code.push_str(&format!(
            "\nredis.register_function{{function_name='{probe}', \
             callback=function() return '{name}' end, flags={{'no-writes', 'allow-stale', 'allow-oom'}}}}\n"
        ));
        Some(Library { name, code, probe })
    }
}

/// `stockgate_v<VERSION>_<first 10 hex digits of a SHA-1 of the scripts'
/// SHAs>`; `None` for no scripts.
fn library_name<'a>(shas: impl Iterator<Item = &'a str>) -> Option<String> {
    let shas: String = shas.collect();
    if shas.is_empty() {
        return None;
    }
    // The redis crate's SHA-1, as for the scripts' own SHAs.
    let digest = redis::Script::new(&format!("{LIBRARY_FORMAT}:{shas}"))
        .get_hash()
        .to_owned();
    Some(format!(
        "stockgate_v{}_{}",
        crate::outcome::SCRIPT_VERSION,
        &digest[..10]
    ))
}

/// A script's body as an EVALSHA runs it: `source` with the helpers of
/// `common` it names spliced in where it says `--@common`. Every embedded
/// script's is `lua/common.lua`'s; the benchmark builds an earlier
/// release's scripts with their own.
pub fn body_of(common: &str, source: &str) -> String {
    source.replacen(MARKER, &helpers_for(common, source), 1)
}

/// `common` as `script` needs it: its opening comment, then only
/// the helpers the script names, and those they name in turn, in the
/// file's order.
///
/// Why not all of it: Redis runs a script's whole chunk on every call, and
/// every `local function` there makes a new closure each time. Measured on
/// Redis 7.0 (`INFO commandstats`, a DEDUCT duplicate at pipeline 16): 13
/// unused helpers cost 1.6 µs per call, a fifth of the script. A DEDUCT
/// now defines what it may call, and the helpers of holds cost a SKU
/// without holds nothing but their definitions.
fn helpers_for(common: &str, script: &str) -> String {
    let (opening, helpers) = split_helpers(common);
    let mut wanted: std::collections::HashSet<&str> = names_in(script).collect();
    let mut taken = vec![false; helpers.len()];
    loop {
        let mut grew = false;
        for (helper, taken) in helpers.iter().zip(taken.iter_mut()) {
            if !*taken && helper.defines.iter().any(|name| wanted.contains(name)) {
                *taken = true;
                grew = true;
                wanted.extend(names_in(helper.text));
            }
        }
        if !grew {
            break;
        }
    }
    let mut out = opening.to_owned();
    for (helper, _) in helpers.iter().zip(&taken).filter(|(_, taken)| **taken) {
        out.push_str(helper.text);
    }
    out
}

/// One top-level definition of `lua/common.lua`, with the comment lines
/// right above it.
struct Helper<'a> {
    text: &'a str,
    defines: Vec<&'a str>,
}

/// Splits `common` into its opening (everything before the first
/// definition's comment) and its definitions: every line that starts with
/// `local ` at column 0 begins one, and it runs to the next.
fn split_helpers(common: &str) -> (&str, Vec<Helper<'_>>) {
    let mut starts = Vec::new();
    let mut offset = 0;
    let mut comment_from = None;
    for line in common.split_inclusive('\n') {
        if line.starts_with("local ") {
            starts.push(comment_from.unwrap_or(offset));
            comment_from = None;
        } else if line.starts_with("--") {
            comment_from.get_or_insert(offset);
        } else {
            comment_from = None;
        }
        offset += line.len();
    }
    let opening = &common[..starts.first().copied().unwrap_or(common.len())];
    let ends = starts.iter().skip(1).copied().chain([common.len()]);
    let helpers = starts
        .iter()
        .zip(ends)
        .map(|(&start, end)| {
            let text = &common[start..end];
            let head = text
                .lines()
                .find(|l| l.starts_with("local "))
                .expect("a definition")
                .trim_start_matches("local ");
            let defines = match head.strip_prefix("function ") {
                Some(rest) => vec![rest.split('(').next().unwrap_or(rest).trim()],
                None => head
                    .split('=')
                    .next()
                    .unwrap_or(head)
                    .split(',')
                    .map(str::trim)
                    .collect(),
            };
            Helper { text, defines }
        })
        .collect();
    (opening, helpers)
}

/// The identifiers Lua code uses, outside its comments (`--[[ ... ]]` and
/// `-- ...`). Words inside strings count too: at worst a helper is spliced
/// in that was not needed.
fn names_in(code: &str) -> impl Iterator<Item = &str> {
    let mut rest = code;
    let mut parts = Vec::new();
    while let Some(open) = rest.find("--[[") {
        parts.push(&rest[..open]);
        rest = rest[open..]
            .find("]]")
            .map_or("", |close| &rest[open + close + 2..]);
    }
    parts.push(rest);
    parts
        .into_iter()
        .flat_map(str::lines)
        .map(|line| line.split("--").next().unwrap_or(line))
        .flat_map(|line| line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|word| !word.is_empty())
}

/// Declares [`Scripts`] from one line per script: its name (its file is
/// `lua/<name>.lua`), and whether its answers acknowledge writes (`new`,
/// followed by a WAIT with `--wait-replicas`) or not (`without_replicas`).
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident: $make:ident;)*) => {
        /// Every script stockgate runs.
        #[derive(Debug, Clone)]
        pub struct Scripts {
            $($(#[$doc])* pub $name: Arc<LuaScript>,)*
            /// `allocate`, for the calls of it that only read or give
            /// expired holds back (STOCK.GET, STOCK.LOCATIONS and the
            /// sweeper's release of a SKU kept by location): their answers
            /// acknowledge no write, as `get`'s and `release`'s don't.
            pub allocate_reads: Arc<LuaScript>,
        }

        impl Scripts {
            pub fn new() -> Scripts {
                let mut scripts = [$(LuaScript::$make(
                    stringify!($name),
                    include_str!(concat!("../lua/", stringify!($name), ".lua")),
                ),)*];
                let library = library_name(scripts.iter().map(|s| s.sha.as_str())).expect("scripts");
                for script in &mut scripts {
                    script.function = format!("{library}_{}", script.name);
                }
                let allocate_reads = scripts
                    .iter()
                    .find(|script| script.name == "allocate")
                    .expect("the allocate script")
                    .without_replicas_copy();
                let allocate_reads = Arc::new(allocate_reads);
                let [$($name,)*] = scripts.map(Arc::new);
                Scripts { $($name,)* allocate_reads }
            }

            /// All of them, for loading and checking.
            pub fn all(&self) -> Vec<Arc<LuaScript>> {
                vec![$(self.$name.clone(),)*]
            }
        }
    };
}

scripts! {
    deduct: new;
    /// A hot SKU's DEDUCTs in one call (`src/stock/coalesce.rs`).
    deduct_many: new;
    revert: new;
    hold: new;
    confirm: new;
    /// HOLD.EXTEND and HOLD.SHRINK (`src/stock/extend.rs`, `src/stock/shrink.rs`).
    change_hold: new;
    /// Every call on a SKU kept by location (`src/stock/location/`).
    allocate: new;
    /// An order's intent record (ORDER, ORDER.HOLD, ORDER.CONFIRM, ORDER.REVERT).
    order: new;
    stock_add: new;
    stock_set: new;
    /// A plain import's rows of one slot (`src/bulk.rs`).
    import_stock: new;
    status: without_replicas;
    get: without_replicas;
    /// The sweeper's: release one SKU's expired holds, mark a SKU in the
    /// sweep index, file and list the index's due SKUs, take the lease
    /// (and learn the active shards), tell the leader a shard is active.
    release: without_replicas;
    due_mark: without_replicas;
    due_sweep: without_replicas;
    sweep_lease: without_replicas;
    sweep_active: without_replicas;
    /// The orders in flight, for their recovery (`src/stock/order/recovery.rs`).
    order_due: new;
    /// A SKU's journal opened before its first entry (`src/stock/journal.rs`).
    journal_open: new;
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `--wait-replicas`, a WAIT follows exactly the scripts whose
    /// answers acknowledge writes: a read that waited blocked the shared
    /// connection for nothing, and a write that didn't could
    /// be acknowledged and then lost in a failover.
    #[test]
    fn only_the_scripts_that_acknowledge_writes_wait_for_replicas() {
        let scripts = Scripts::new();
        let waiting: Vec<&str> = scripts
            .all()
            .iter()
            .filter(|s| s.needs_replicas)
            .map(|s| s.name)
            .collect();
        assert_eq!(
            waiting,
            [
                "deduct",
                "deduct_many",
                "revert",
                "hold",
                "confirm",
                "change_hold",
                "allocate",
                "order",
                "stock_add",
                "stock_set",
                "import_stock",
                "order_due",
                "journal_open"
            ]
        );
    }
    use crate::outcome::SCRIPT_VERSION;

    #[test]
    fn every_script_declares_itself_a_redis7_script() {
        for script in Scripts::new().all() {
            // Without the shebang, Redis would run it on a replica until its
            // first write, and would not refuse it up front when out of memory.
            assert!(script.body.starts_with("#!lua"), "{}", script.name);
            assert!(!script.body.contains(MARKER), "{}", script.name);
            assert_eq!(script.sha.len(), 40);
        }
    }

    /// Every helper a script names, directly or through another helper, is
    /// spliced in; the others are not.
    #[test]
    fn each_script_gets_exactly_the_helpers_it_names() {
        let (_, helpers) = split_helpers(COMMON);
        let defined: Vec<&str> = helpers.iter().flat_map(|h| h.defines.clone()).collect();
        for name in [
            "VERSION",
            "settle",
            "release_due",
            "answer",
            "parse_op",
            "BADSTOCK",
        ] {
            assert!(defined.contains(&name), "{name} is a helper");
        }
        let deduct = Scripts::new().deduct;
        for helper in [
            "local function release_due",
            "local function release_one",
            "local function answer",
        ] {
            assert!(deduct.body.contains(helper), "DEDUCT needs {helper}");
        }
        // STOCK.ADD's op records are not DEDUCT's business.
        assert!(!deduct.body.contains("local function parse_op"));
        for script in Scripts::new().all() {
            let spliced: Vec<&Helper> = helpers
                .iter()
                .filter(|h| script.body.contains(h.text))
                .collect();
            let used: std::collections::HashSet<&str> = names_in(&script.body).collect();
            for helper in &helpers {
                let is_spliced = spliced.iter().any(|s| std::ptr::eq(*s, helper));
                // A name used but not spliced would be a nil at run time.
                let named = helper.defines.iter().any(|d| used.contains(d));
                assert_eq!(is_spliced, named, "{}: {:?}", script.name, helper.defines);
            }
        }
    }

    #[test]
    fn the_scripts_and_stockgate_agree_on_the_version() {
        assert!(COMMON.contains(&format!("local VERSION = {SCRIPT_VERSION}\n")));
    }
}
