//! The admin HTTP port: `/metrics`, `/healthz`, `/readyz`.
//!
//! `/healthz` says the process serves (a liveness probe must not depend on
//! Redis: restarting the sidecar doesn't bring Redis back). `/readyz` says
//! Redis is reachable, the scripts are loaded on every primary, and no
//! drain has started.

use crate::state::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared);
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(%err, "admin server stopped");
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.metrics.render(),
    )
}

async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.is_ready() {
        return (StatusCode::OK, "ready\n".to_owned());
    }
    let why = if shared.draining.load(std::sync::atomic::Ordering::Relaxed) {
        "draining".to_owned()
    } else {
        shared
            .upstream
            .problem()
            .unwrap_or_else(|| "connecting to redis".to_owned())
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {why}\n"),
    )
}
