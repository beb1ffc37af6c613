//! An order's time: how long its saga may run, and its filing among the
//! orders in flight (`lua/order_due.lua`) from its command's first change
//! of the intent until it rests, so that [`super::recovery`] finds it if
//! it is left behind.

use crate::error::UpstreamError;
use crate::params::RequestId;
use crate::stock::StockService;
use redis::Value;
use std::time::Duration;

/// How long an order's saga may run, in `--timeout`s. Its caller waits
/// one `--timeout` for the answer; past it, the saga goes on in the
/// background for the rest of this budget (no step starts later), and
/// whatever it leaves unfinished is [`super::recovery`]'s.
const SAGA_TIMEOUTS: u32 = 4;

/// How much longer than a saga's budget an order waits to be recovered.
const MARGIN: Duration = Duration::from_secs(5);
/// How long an order's saga may run ([`SAGA_TIMEOUTS`]).
/// How long an order's saga may take at most, as one bound over all its
/// waits: its budget, and one `--timeout` for the step that started last.
/// Its calls wait for their answers without a timer each: the node pipes
/// answer every call by its deadline, and this guards only against a pipe
/// that stopped.
pub(super) fn saga_bound(service: &StockService) -> Duration {
    saga_budget(service) + service.upstream.timeout()
}

/// What a saga that ran past [`saga_bound`] answers.
pub(super) fn saga_overrun(bound: Duration) -> UpstreamError {
    UpstreamError::new(
        crate::error::FaultKind::Timeout,
        format!(
            "the order's saga did not come to rest within {} ms; stockgate's recovery ends the order",
            bound.as_millis()
        ),
    )
}

pub(super) fn saga_budget(service: &StockService) -> Duration {
    service.upstream.timeout() * SAGA_TIMEOUTS
}

/// How long after an order command its order counts as left behind:
/// the saga's whole budget (it goes on after its caller's deadline),
/// and a margin.
pub fn recover_after(service: &StockService) -> Duration {
    saga_budget(service) + MARGIN
}

/// Before an order is filed: this stockgate looks at the order's shard
/// until it is due and a while after, and the sweep leader is told of
/// the shard.
pub(super) fn watch_order(service: &StockService, shard: usize) {
    service.sweeper.watch_shard(shard, recover_after(service));
}

/// Files an order among the orders in flight, before its command
/// changes its intent, when that can't ride along with the intent
/// call (`lua/order.lua`): the score it was filed at.
pub(super) async fn mark_order(
    service: &StockService,
    id: &RequestId,
    shard: usize,
) -> Result<i64, UpstreamError> {
    let shard = &service.keys.sweep_shards()[shard];
    let after = recover_after(service).as_millis().to_string();
    match service
        .upstream
        .eval_piped(
            &service.scripts.order_due,
            &[&shard.orders],
            &[b"mark", id.as_bytes(), after.as_bytes()],
            tokio::time::Instant::now() + service.upstream.timeout(),
        )
        .await?
    {
        Value::Int(score) => Ok(score),
        other => Err(crate::stock::sweep_index::bad_reply("order_due", &other)),
    }
}

/// Takes an order that rests out of the orders in flight, unless an
/// attempt filed it again since (`score`). Not awaited: an order left
/// filed is looked at when due, found at rest, and taken out then.
pub(super) fn unmark_order(service: &StockService, id: &RequestId, shard: usize, score: i64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let upstream = service.upstream.clone();
    let script = service.scripts.order_due.clone();
    let shard = service.keys.sweep_shards()[shard].clone();
    let id = id.as_bytes().to_vec();
    runtime.spawn(async move {
        let score = score.to_string();
        let deadline = tokio::time::Instant::now() + upstream.timeout();
        if let Err(fault) = upstream
            .eval_piped(
                &script,
                &[&shard.orders],
                &[b"done", &id, score.as_bytes()],
                deadline,
            )
            .await
        {
            tracing::debug!(error = %fault, "could not take a finished order out of the orders in flight; recovery will");
        }
    });
}
