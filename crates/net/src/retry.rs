//! The one retry policy of Weft: exponential backoff with jitter-free doubling, bounded in
//! attempts and total time. Only errors that say the peer was not reached (or was busy) are
//! retried; mutating metadata requests carry a mutation id, so a retry of one that did reach
//! the server gets the original answer.

use crate::client::RpcError;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use weft_proto::ErrorCode;

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

    /// Runs `operation` until it succeeds, fails with a non-retryable error, or time runs out.
    ///
    /// # Errors
    /// The last error of `operation`.
    pub async fn run<T, F, Fut>(&self, mut operation: F) -> Result<T, RpcError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RpcError>>,
    {
        let started = Instant::now();
        let mut backoff = self.initial_backoff;
        loop {
            match operation().await {
                Ok(value) => return Ok(value),
                Err(error)
                    if error.is_retryable() && started.elapsed() + backoff < self.total_timeout =>
                {
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
