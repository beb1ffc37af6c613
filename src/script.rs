//! The Lua scripts stockgate runs, embedded in the binary.
//!
//! Each script is loaded on every primary at startup (readiness waits for
//! it) and called with EVALSHA. When a node answers NOSCRIPT (after a
//! restart, a failover, or `SCRIPT FLUSH`), the call is sent again as EVAL
//! with the full body to the node that owns the key: that both answers the
//! request and caches the script there again, and it needs no other node,
//! unlike re-loading on every primary, which fails while a failover is under
//! way.

/// One embedded script: its body and SHA1 digest (what EVALSHA names).
#[derive(Debug)]
pub struct LuaScript {
    pub name: &'static str,
    pub body: &'static str,
    pub sha: String,
}

impl LuaScript {
    fn new(name: &'static str, body: &'static str) -> Self {
        LuaScript {
            name,
            body,
            sha: redis::Script::new(body).get_hash().to_owned(),
        }
    }

    /// `lua/deduct.lua`: see its header for KEYS, ARGV and replies.
    pub fn deduct() -> Self {
        LuaScript::new("deduct", include_str!("../lua/deduct.lua"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_declares_itself_a_redis7_script() {
        let script = LuaScript::deduct();
        // Without the shebang, Redis would run it on a replica until its
        // first write, and would not refuse it up front when out of memory.
        assert_eq!(script.body.lines().next(), Some("#!lua"));
        assert_eq!(script.sha.len(), 40);
    }
}
