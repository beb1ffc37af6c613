//! The Lua scripts stockgate runs, embedded in the binary.
//!
//! Each script file in `lua/` starts with its `#!lua` line and a header
//! documenting KEYS, ARGV and every reply, then a `--@common` line where
//! `lua/common.lua` (the helpers every script shares: argument rules, the
//! key layout check, the record format) is spliced in. The SHA is taken of
//! the spliced text, which is what Redis runs.
//!
//! Each script is loaded on every primary at startup (readiness waits for
//! it) and called with EVALSHA. When a node answers NOSCRIPT (after a
//! restart, a failover, or `SCRIPT FLUSH`), the call is sent again as EVAL
//! with the full body to the node that owns the key: that both answers the
//! request and caches the script there again, and it needs no other node,
//! unlike re-loading on every primary, which fails while a failover is under
//! way.

use std::sync::Arc;

const COMMON: &str = include_str!("../lua/common.lua");
const MARKER: &str = "--@common\n";

/// One embedded script: its body and SHA1 digest (what EVALSHA names).
#[derive(Debug)]
pub struct LuaScript {
    pub name: &'static str,
    pub body: String,
    pub sha: String,
}

impl LuaScript {
    fn new(name: &'static str, source: &'static str) -> Arc<Self> {
        assert!(
            source.contains(MARKER),
            "lua/{name}.lua lacks its --@common line"
        );
        let body = source.replacen(MARKER, COMMON, 1);
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Arc::new(LuaScript { name, body, sha })
    }
}

/// Every script stockgate runs.
#[derive(Debug, Clone)]
pub struct Scripts {
    pub deduct: Arc<LuaScript>,
    pub revert: Arc<LuaScript>,
    pub hold: Arc<LuaScript>,
    pub confirm: Arc<LuaScript>,
    /// An order's intent record (ORDER, ORDER.HOLD, ORDER.CONFIRM, ORDER.REVERT).
    pub order: Arc<LuaScript>,
    pub stock_add: Arc<LuaScript>,
    pub stock_set: Arc<LuaScript>,
    pub status: Arc<LuaScript>,
    pub get: Arc<LuaScript>,
    /// The sweeper's: release one SKU's expired holds, mark a SKU in the
    /// sweep index, file and list the index's due SKUs, take the lease
    /// (and learn the active shards), tell the leader a shard is active.
    pub release: Arc<LuaScript>,
    pub due_mark: Arc<LuaScript>,
    pub due_sweep: Arc<LuaScript>,
    pub sweep_lease: Arc<LuaScript>,
    pub sweep_active: Arc<LuaScript>,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            deduct: LuaScript::new("deduct", include_str!("../lua/deduct.lua")),
            revert: LuaScript::new("revert", include_str!("../lua/revert.lua")),
            hold: LuaScript::new("hold", include_str!("../lua/hold.lua")),
            confirm: LuaScript::new("confirm", include_str!("../lua/confirm.lua")),
            order: LuaScript::new("order", include_str!("../lua/order.lua")),
            stock_add: LuaScript::new("stock_add", include_str!("../lua/stock_add.lua")),
            stock_set: LuaScript::new("stock_set", include_str!("../lua/stock_set.lua")),
            status: LuaScript::new("status", include_str!("../lua/status.lua")),
            get: LuaScript::new("get", include_str!("../lua/get.lua")),
            release: LuaScript::new("release", include_str!("../lua/release.lua")),
            due_mark: LuaScript::new("due_mark", include_str!("../lua/due_mark.lua")),
            due_sweep: LuaScript::new("due_sweep", include_str!("../lua/due_sweep.lua")),
            sweep_lease: LuaScript::new("sweep_lease", include_str!("../lua/sweep_lease.lua")),
            sweep_active: LuaScript::new("sweep_active", include_str!("../lua/sweep_active.lua")),
        }
    }

    /// All of them, for loading and checking.
    pub fn all(&self) -> Vec<Arc<LuaScript>> {
        vec![
            self.deduct.clone(),
            self.revert.clone(),
            self.hold.clone(),
            self.confirm.clone(),
            self.order.clone(),
            self.stock_add.clone(),
            self.stock_set.clone(),
            self.status.clone(),
            self.get.clone(),
            self.release.clone(),
            self.due_mark.clone(),
            self.due_sweep.clone(),
            self.sweep_lease.clone(),
            self.sweep_active.clone(),
        ]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::SCRIPT_VERSION;

    #[test]
    fn every_script_declares_itself_a_redis7_script() {
        for script in Scripts::new().all() {
            // Without the shebang, Redis would run it on a replica until its
            // first write, and would not refuse it up front when out of memory.
            assert!(script.body.starts_with("#!lua"), "{}", script.name);
            assert!(!script.body.contains(MARKER), "{}", script.name);
            assert!(
                script.body.contains("local function read_stock"),
                "{}",
                script.name
            );
            assert_eq!(script.sha.len(), 40);
        }
    }

    #[test]
    fn the_scripts_and_stockgate_agree_on_the_version() {
        assert!(COMMON.contains(&format!("local VERSION = {SCRIPT_VERSION}\n")));
    }
}
