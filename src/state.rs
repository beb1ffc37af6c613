//! What every connection and every face (RESP, HTTP, admin) shares: the
//! configuration, the upstream, the stock service, the metrics.
//!
//! It lives apart from [`crate::server`], which starts the listeners that
//! use it, so that the connection, command and HTTP modules depend on it
//! without depending back on the server that spawns them.

use crate::auth::{Users, throttle::Throttle};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::script::Scripts;
use crate::stock::StockService;
use crate::upstream::Upstream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

/// What every connection shares.
pub struct Shared {
    pub config: Config,
    pub upstream: Arc<Upstream>,
    /// Shared with the order sagas, which outlive the request that
    /// started them (`stock::order`).
    pub service: Arc<StockService>,
    pub metrics: Arc<Metrics>,
    /// Who may log in, and what each may do; replaced on a reload.
    pub users: Users,
    /// Failed logins by peer.
    pub throttle: Throttle,
    pub started: Instant,
    /// The RESP port, as bound (for INFO).
    pub local_port: u16,
    /// Client connections open now.
    pub clients: AtomicUsize,
    next_client_id: AtomicU64,
    /// Set when the drain starts: `/readyz` turns false at once.
    pub draining: AtomicBool,
}

impl Shared {
    /// Everything a connection needs, for `config`, before anything
    /// connects: the upstream task is not started, so stock commands answer
    /// `NOTREADY`-class errors until [`Upstream::maintain`] runs. `start`
    /// builds its state with this; the fuzz target runs commands against it
    /// without a Redis.
    pub fn new(config: Config, local_port: u16) -> Shared {
        let scripts = Scripts::new();
        let metrics = Arc::new(Metrics::new::<crate::stock::StockCommand>());
        let upstream = Upstream::new(config.upstream.clone(), scripts.all(), metrics.clone());
        let service = Arc::new(StockService::new(
            &config,
            upstream.clone(),
            scripts,
            metrics.clone(),
        ));
        let users = Users::new(
            config.password.clone(),
            config.users.as_ref().map(|f| f.users.clone()),
        )
        .unwrap_or_else(|e| panic!("users refused at start (config validation checks this): {e}"));
        metrics.know_users(users.list().iter().map(|(name, _, _)| name.as_str()));
        Shared {
            users,
            throttle: Throttle::default(),
            config,
            upstream,
            service,
            metrics,
            started: Instant::now(),
            local_port,
            clients: AtomicUsize::new(0),
            next_client_id: AtomicU64::new(1),
            draining: AtomicBool::new(false),
        }
    }

    pub fn next_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Ready to take traffic: upstream reachable, scripts loaded, not draining.
    pub fn is_ready(&self) -> bool {
        self.upstream.is_ready() && !self.draining.load(Ordering::Relaxed)
    }
}
