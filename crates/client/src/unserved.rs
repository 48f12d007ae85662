//! Requests the mount does not serve (ioctl, poll, lseek, copy_file_range, bmap): each gets
//! its errno at once and quietly. Programs ask them all the time (Python's `open()` asks
//! `isatty` through an ioctl), so a log line each would drown the log; each kind is logged
//! the first time it is seen and counted. The session's heartbeats carry the counts to
//! management, which exports them (`weft_client_unserved_requests_total`), and the mount
//! logs them at unmount.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// How many requests of each unserved kind the kernel sent.
#[derive(Default)]
pub(crate) struct Unserved {
    counts: Mutex<BTreeMap<&'static str, u64>>,
}

impl Unserved {
    /// Counts one request of `kind`, answered with `errno`.
    pub fn note(&self, kind: &'static str, errno: &'static str) {
        let mut counts = self.counts.lock().expect("unserved counts poisoned");
        let count = counts.entry(kind).or_default();
        *count += 1;
        if *count == 1 {
            tracing::info!(
                request = kind,
                errno,
                "the mount does not serve this request; answered with an error (counted, logged once)"
            );
        }
    }

    /// Every kind seen and its count.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.counts
            .lock()
            .expect("unserved counts poisoned")
            .clone()
    }
}
