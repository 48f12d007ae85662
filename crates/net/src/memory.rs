//! Memory handed back when a process is idle.
//!
//! Freed memory stays in the allocator's arenas for the next request (see the allocator
//! settings of the `weft` binary): fast under load, but a process that served a burst would
//! keep its peak for ever. [`give_back_when_idle`] returns it to the kernel once the process
//! has neither served nor sent a request for [`IDLE_BEFORE_TRIM`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Requests served and sent by this process, counted by the server loop and the RPC client.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// How long a process must be idle before it gives memory back.
pub const IDLE_BEFORE_TRIM: Duration = Duration::from_secs(10);

/// Counts a request served or sent.
pub(crate) fn note_activity() {
    ACTIVITY.fetch_add(1, Ordering::Relaxed);
}

/// Runs for ever: every [`IDLE_BEFORE_TRIM`] without a request, hands the allocator's free
/// memory back to the kernel (once per idle period).
pub async fn give_back_when_idle() {
    let mut seen = ACTIVITY.load(Ordering::Relaxed);
    let mut trimmed = false;
    loop {
        tokio::time::sleep(IDLE_BEFORE_TRIM).await;
        let now = ACTIVITY.load(Ordering::Relaxed);
        if now != seen {
            (seen, trimmed) = (now, false);
            continue;
        }
        if !trimmed {
            trim();
            trimmed = true;
        }
    }
}

#[cfg(target_env = "gnu")]
fn trim() {
    // SAFETY: malloc_trim has no preconditions; it only returns free memory to the kernel.
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released = released != 0,
        "idle: gave free memory back to the kernel"
    );
}

#[cfg(not(target_env = "gnu"))]
fn trim() {}
