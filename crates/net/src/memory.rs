//! Memory handed back when a process is idle.
//!
//! Freed memory stays in the allocator's arenas for the next request (see the allocator
//! settings of the `weft` binary): fast under load, but a process that served a burst would
//! keep its peak for ever. [`give_back_when_idle`] returns it to the kernel once the process
//! has moved less than [`IDLE_BYTES`] of requests and answers in [`IDLE_BEFORE_TRIM`]: the
//! heartbeats and map fetches that never stop do not count as load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes of requests and answers this process served or sent, counted by the server loop and
/// the RPC client.
static ACTIVITY: AtomicU64 = AtomicU64::new(0);

/// Bytes moved in [`IDLE_BEFORE_TRIM`] below which the process counts as idle.
pub const IDLE_BYTES: u64 = 1 << 20;

/// How long a process must be idle before it gives memory back.
pub const IDLE_BEFORE_TRIM: Duration = Duration::from_secs(10);

/// Counts `bytes` of a request served or sent, or of its answer.
pub(crate) fn note_activity(bytes: u64) {
    ACTIVITY.fetch_add(bytes, Ordering::Relaxed);
}

/// Runs for ever: after every [`IDLE_BEFORE_TRIM`] with less than [`IDLE_BYTES`] moved, hands
/// the allocator's free memory back to the kernel (once per idle period).
pub async fn give_back_when_idle() {
    let mut seen = ACTIVITY.load(Ordering::Relaxed);
    let mut trimmed = false;
    loop {
        tokio::time::sleep(IDLE_BEFORE_TRIM).await;
        let now = ACTIVITY.load(Ordering::Relaxed);
        let moved = now.wrapping_sub(seen);
        seen = now;
        if moved >= IDLE_BYTES {
            trimmed = false;
            continue;
        }
        if !trimmed {
            trim();
            trimmed = true;
        }
    }
}

/// What else gives free memory back when the process is idle: the binary's own allocator's
/// collection, set once at its start.
static ALSO_ON_IDLE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Has `give_back` run too whenever the process gives memory back (an allocator of its own
/// beside the system's); set once.
pub fn also_on_idle(give_back: fn()) {
    let _ = ALSO_ON_IDLE.set(give_back);
}

fn trim() {
    if let Some(give_back) = ALSO_ON_IDLE.get() {
        give_back();
    }
    system_trim();
}

#[cfg(target_env = "gnu")]
fn system_trim() {
    // SAFETY: malloc_trim has no preconditions; it only returns free memory to the kernel.
    let released = unsafe { libc::malloc_trim(0) };
    tracing::debug!(
        released = released != 0,
        "idle: gave free memory back to the kernel"
    );
}

#[cfg(not(target_env = "gnu"))]
fn system_trim() {}
