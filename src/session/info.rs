//! INFO: stockgate's figures in Redis's `# Section` and `key:value` lines.
//!
//! # Format
//!
//! ```text
//! INFO [section ...]
//! ```
//!
//! Sections: server, clients, persistence, replication, stats, stockgate
//! (all, everything and default mean every one). ioredis's ready check
//! reads `loading:0`; clients read `redis_version`. The text is a verbatim
//! string in RESP3 and a bulk string in RESP2, as Redis sends it.

use super::REDIS_COMPAT_VERSION;
use crate::command::spec::{CommandSpec, optional, session};
use crate::reply::Reply;
use crate::state::Shared;
use bytes::Bytes;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

pub const INFO: CommandSpec = session(
    "info",
    -1,
    "server",
    "Returns stockgate's figures in INFO sections.",
    &[optional("section", "string")],
    |call| Reply::Verbatim(info(call.shared, call.args).into()),
);

fn info(shared: &Shared, args: &[Bytes]) -> String {
    let wanted = |section: &str| {
        args.is_empty()
            || args.iter().any(|a| {
                a.eq_ignore_ascii_case(section.as_bytes())
                    || a.eq_ignore_ascii_case(b"all")
                    || a.eq_ignore_ascii_case(b"everything")
                    || a.eq_ignore_ascii_case(b"default")
            })
    };
    let mut out = String::new();
    let upstream = &shared.upstream;
    if wanted("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nstockgate_version:{}\r\nredis_mode:standalone\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            shared.local_port,
            shared.started.elapsed().as_secs(),
        );
    }
    if wanted("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\n\r\n",
            shared.clients.load(Ordering::Relaxed)
        );
    }
    if wanted("persistence") {
        out.push_str("# Persistence\r\nloading:0\r\n\r\n");
    }
    if wanted("replication") {
        out.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\r\n");
    }
    if wanted("stats") {
        out.push_str("# Stats\r\n");
        for (command, result, count) in shared.metrics.request_totals() {
            let _ = write!(out, "{command}_{result}:{count}\r\n");
        }
        for (kind, count) in shared.metrics.upstream_error_totals() {
            let _ = write!(out, "upstream_errors_{kind}:{count}\r\n");
        }
        for (event, count) in shared.metrics.hold_totals() {
            let _ = write!(out, "holds_{event}:{count}\r\n");
        }
        out.push_str("\r\n");
    }
    if wanted("stockgate") {
        let _ = write!(
            out,
            "# Stockgate\r\nscript_version:{}\r\nscript_sha:{}\r\nrevert_script_sha:{}\r\nscripts_called_by:{}\r\nupstream_mode:{}\r\nupstream_ready:{}\r\nupstream_seeds:{}\r\nupstream_primaries:{}\r\nkey_prefix:{}\r\nretry_window_seconds:{}\r\n\r\n",
            crate::outcome::SCRIPT_VERSION,
            shared.service.scripts().deduct.sha,
            shared.service.scripts().revert.sha,
            upstream.calling_text(),
            upstream.mode().map_or("unknown", |m| m.as_str()),
            u8::from(upstream.is_ready()),
            upstream.seeds().join(","),
            upstream
                .nodes()
                .iter()
                .map(|n| format!("{}:{}", n.host, n.port))
                .collect::<Vec<_>>()
                .join(","),
            shared.config.keys.prefix(),
            shared.config.retry_window.as_secs(),
        );
    }
    out
}
