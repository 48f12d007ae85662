//! The one retry policy of Weft: exponential backoff with jitter-free doubling, bounded in
//! attempts and total time. Only errors that say the peer was not reached (or was busy) are
//! retried; mutating metadata requests carry a mutation id, so a retry of one that did reach
//! the server gets the original answer.

use crate::client::RpcError;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use weft_proto::ErrorCode;

tokio::task_local! {
    /// When the operation this task runs for gives up ([`within`]).
    static DEADLINE: Instant;
}

/// Runs `work` under one deadline, `total` from now, at which every retry loop inside it
/// ends: [`RetryPolicy::run`], and the client's loops around it that ask [`deadline`] (a
/// file's layout fetched again, a truncate applied, a grace period waited out, a busy shard
/// asked again). Inside another such run the outer deadline stands, so however the loops
/// nest, one deadline covers the operation.
///
/// Call it from the task the operation runs in (it looks for an outer deadline at once). The
/// future it answers is `work` itself, or `work` in the deadline's scope: no copy of `work`
/// beside it, as an `async fn` would keep (the loops nest, and each level's future would hold
/// the next one's twice: a debug build's mount overflowed its stack so).
pub fn within<F: Future>(total: Duration, work: F) -> impl Future<Output = F::Output> {
    use futures::future::Either;
    if DEADLINE.try_with(|_| ()).is_ok() {
        return Either::Left(work);
    }
    Either::Right(DEADLINE.scope(Instant::now() + total, work))
}

/// The deadline of the operation this task runs for, if it runs [`within`] one.
pub fn deadline() -> Option<Instant> {
    DEADLINE.try_with(|deadline| *deadline).ok()
}

/// Whether the operation this task runs for has time left for a pause of `pause` (always,
/// outside [`within`]).
pub fn time_left(pause: Duration) -> bool {
    deadline().is_none_or(|deadline| Instant::now() + pause < deadline)
}

/// Longest pause before a request refused for a stale mirror route is sent again.
const STALE_ROUTE_PAUSE: Duration = Duration::from_millis(100);

/// How often and how long to retry.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// First pause between attempts.
    pub initial_backoff: Duration,
    /// Longest pause between attempts.
    pub max_backoff: Duration,
    /// Give up once this much time has passed since the first attempt.
    pub total_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            total_timeout: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// A policy that tries once.
    pub const ONCE: RetryPolicy = RetryPolicy {
        initial_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
        total_timeout: Duration::ZERO,
    };

    /// Runs `operation` until it succeeds, fails with a non-retryable error, or time runs out
    /// (this policy's, or the deadline of the operation it runs [`within`], whichever comes
    /// first).
    ///
    /// # Errors
    /// The last error of `operation`.
    pub async fn run<T, F, Fut>(&self, mut operation: F) -> Result<T, RpcError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let own = Instant::now() + self.total_timeout;
        let end = deadline().map_or(own, |deadline| deadline.min(own));
        let mut backoff = self.initial_backoff;
        loop {
            match operation().await {
                Ok(value) => return Ok(value),
                Err(error) if error.is_retryable() && Instant::now() + backoff < end => {
                    tracing::debug!(%error, ?backoff, "retrying");
                    if error.code() == ErrorCode::StaleRoute {
                        // The server is reachable and a newer route exists or comes soon (a
                        // failover): look again shortly rather than back off.
                        tokio::time::sleep(backoff.min(STALE_ROUTE_PAUSE)).await;
                        continue;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.max_backoff);
                }
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::error::WireError;

    fn unavailable() -> RpcError {
        RpcError::Remote(WireError::new(ErrorCode::Unavailable, "down"))
    }

    // Goal: however the loops of an operation nest, each with its own time, they all end at
    // the operation's one deadline, having retried until then; outside an operation a loop
    // keeps its own time.
    #[tokio::test(start_paused = true)]
    async fn nested_loops_end_at_the_operations_deadline() {
        let patient = RetryPolicy {
            total_timeout: Duration::from_secs(3600),
            ..RetryPolicy::default()
        };
        let started = Instant::now();
        let result: Result<(), RpcError> = within(Duration::from_secs(10), async {
            within(Duration::from_secs(3600), async {
                while time_left(Duration::ZERO) {
                    patient
                        .run(|| async { Err::<(), _>(unavailable()) })
                        .await?;
                }
                Ok(())
            })
            .await
        })
        .await;
        assert!(result.is_err());
        let took = started.elapsed();
        assert!(
            took <= Duration::from_secs(10) && took >= Duration::from_secs(9),
            "retried until the outer deadline, no further: {took:?}"
        );
        assert!(deadline().is_none() && time_left(Duration::from_secs(3600)));
        let quick = RetryPolicy {
            total_timeout: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        let started = Instant::now();
        assert!(quick
            .run(|| async { Err::<(), _>(unavailable()) })
            .await
            .is_err());
        assert!(started.elapsed() <= Duration::from_secs(2));
    }
}
