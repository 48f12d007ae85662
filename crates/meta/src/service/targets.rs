//! How a home's background work (queued truncates and disposals, moves, checks) treats the
//! storage targets it calls: how long it retries one, how often it tries again, and which
//! refusals end a move.

use std::time::Duration;
use weft_net::retry::RetryPolicy;
use weft_proto::error::WireError;
use weft_proto::ErrorCode;

/// Interval at which queued truncates and disposals are retried when nothing wakes the worker.
pub(super) const WORK_RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// Retries of a truncate or removal on a target before the work is left to the worker loop.
pub(super) const TARGET_RETRY: RetryPolicy = RetryPolicy {
    initial_backoff: Duration::from_millis(50),
    max_backoff: Duration::from_millis(500),
    total_timeout: Duration::from_secs(5),
};

/// Whether a target's refusal of a push (or of a cut of a copy) means the move cannot be made
/// as planned: the target is full, over a quota, gone or poisoned.
pub(super) fn ends_a_move(error: &WireError) -> bool {
    matches!(
        error.code,
        ErrorCode::NoSpace
            | ErrorCode::QuotaExceeded
            | ErrorCode::UnknownTarget
            | ErrorCode::TargetPoisoned
    )
}
