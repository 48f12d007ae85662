//! Write-behind: a write is answered once its data is on its way to the storage servers, with
//! a bounded number of bytes in flight per file, so a single stream keeps several requests
//! going instead of waiting for each. An open file ([`crate::OpenFile`]) answers writes this
//! way, for the mount and for native callers alike. What happens to the file afterwards waits
//! for exactly what it must:
//!
//! - a write that overlaps one still in flight waits for it (order of overlapping writes is
//!   the order the kernel sent them);
//! - a read waits for the in-flight writes it overlaps (a client reads its own writes);
//! - flush (every close), fsync, truncate, fallocate, locks and release wait for them all;
//! - a write that fails makes the file's error sticky before its bytes leave the budget, so
//!   the next write, flush or fsync of that file returns it (a failure while other writes
//!   still wait for budget is seen by them).

use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// The writes of one inode in flight.
pub(crate) struct InFlight {
    ranges: Mutex<Vec<(u64, u64)>>,
    changed: Notify,
    budget: Arc<Semaphore>,
    budget_bytes: u32,
}

/// A write admitted into flight: its range stays registered until [`Admitted::finish`].
pub(crate) struct Admitted {
    inflight: Arc<InFlight>,
    range: (u64, u64),
    _permit: OwnedSemaphorePermit,
}

impl InFlight {
    pub fn new(budget_bytes: u32) -> InFlight {
        InFlight {
            ranges: Mutex::default(),
            changed: Notify::new(),
            budget: Arc::new(Semaphore::new(budget_bytes as usize)),
            budget_bytes,
        }
    }

    fn overlaps(&self, (start, end): (u64, u64)) -> bool {
        self.ranges
            .lock()
            .expect("in-flight ranges poisoned")
            .iter()
            .any(|(s, e)| *s < end && start < *e)
    }

    /// Waits until no write in flight overlaps `[start, end)`.
    pub async fn wait_clear(&self, range: (u64, u64)) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.overlaps(range) {
                return;
            }
            changed.await;
        }
    }

    /// Waits until every write in flight is done.
    pub async fn drain(&self) {
        self.wait_clear((0, u64::MAX)).await;
    }

    /// Admits a write of `[start, end)`: waits for overlapping writes, then for budget.
    pub async fn admit(self: &Arc<InFlight>, (start, end): (u64, u64)) -> Admitted {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut ranges = self.ranges.lock().expect("in-flight ranges poisoned");
                if !ranges.iter().any(|(s, e)| *s < end && start < *e) {
                    ranges.push((start, end));
                    break;
                }
            }
            changed.await;
        }
        let bytes = (end - start).clamp(1, u64::from(self.budget_bytes)) as u32;
        let permit = Arc::clone(&self.budget)
            .acquire_many_owned(bytes)
            .await
            .expect("the write-behind budget is never closed");
        Admitted {
            inflight: Arc::clone(self),
            range: (start, end),
            _permit: permit,
        }
    }
}

impl Admitted {
    /// The write is done (its error, if any, already recorded): others may go on.
    pub fn finish(self) {
        {
            let mut ranges = self
                .inflight
                .ranges
                .lock()
                .expect("in-flight ranges poisoned");
            if let Some(index) = ranges.iter().position(|r| *r == self.range) {
                ranges.swap_remove(index);
            }
        }
        self.inflight.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: overlapping writes go one after the other, disjoint ones together, and a drain
    // waits for all of them.
    #[tokio::test]
    async fn overlapping_writes_wait_and_drain_waits_for_all() {
        let inflight = Arc::new(InFlight::new(1 << 20));
        let first = inflight.admit((0, 100)).await;
        let disjoint = inflight.admit((100, 200)).await;
        let overlapping = {
            let inflight = Arc::clone(&inflight);
            tokio::spawn(async move { inflight.admit((50, 150)).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !overlapping.is_finished(),
            "waits for the writes it overlaps"
        );
        first.finish();
        tokio::task::yield_now().await;
        disjoint.finish();
        let third = overlapping.await.expect("admitted once both are done");
        let drained = {
            let inflight = Arc::clone(&inflight);
            tokio::spawn(async move { inflight.drain().await })
        };
        tokio::task::yield_now().await;
        assert!(
            !drained.is_finished(),
            "a drain waits for the write in flight"
        );
        third.finish();
        drained.await.expect("drained");
    }

    // Goal: the byte budget bounds what is in flight.
    #[tokio::test]
    async fn budget_bounds_bytes_in_flight() {
        let inflight = Arc::new(InFlight::new(100));
        let first = inflight.admit((0, 80)).await;
        let second = {
            let inflight = Arc::clone(&inflight);
            tokio::spawn(async move { inflight.admit((80, 160)).await })
        };
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "no budget left for 80 more bytes");
        first.finish();
        second.await.expect("admitted").finish();
    }
}
