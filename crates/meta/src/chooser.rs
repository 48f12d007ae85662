//! Chooses the storage targets of a new file from the cluster map.

use crate::config::TargetChooser;
use rand::seq::SliceRandom;
use std::sync::atomic::{AtomicUsize, Ordering};
use weft_proto::ids::TargetId;
use weft_proto::layout::StripePattern;
use weft_proto::messages::{ClusterMap, Reachability};

/// Bytes below which a target counts as full and new files avoid it.
const TARGET_FREE_BYTES_MIN: u64 = 16 * 1024 * 1024;

pub(crate) struct Chooser {
    kind: TargetChooser,
    next: AtomicUsize,
}

impl Chooser {
    pub fn new(kind: TargetChooser) -> Chooser {
        Chooser {
            kind,
            next: AtomicUsize::new(0),
        }
    }

    /// Up to `pattern.num_targets` distinct targets of the pattern's pool, reachable ones first
    /// and full ones last; empty when the pool has no target at all.
    pub fn choose(&self, map: &ClusterMap, pattern: &StripePattern) -> Vec<TargetId> {
        let mut candidates: Vec<_> = map
            .targets
            .iter()
            .filter(|t| t.pool == pattern.pool && t.reachability != Reachability::Offline)
            .collect();
        candidates.sort_by_key(|t| t.id);
        let (roomy, full): (Vec<_>, Vec<_>) = candidates
            .into_iter()
            .partition(|t| t.usage.total_bytes == 0 || t.usage.free_bytes >= TARGET_FREE_BYTES_MIN);
        let mut ordered: Vec<TargetId> = roomy.iter().map(|t| t.id).collect();
        match self.kind {
            TargetChooser::Randomized => ordered.shuffle(&mut rand::thread_rng()),
            TargetChooser::Roundrobin => {
                if !ordered.is_empty() {
                    let start = self.next.fetch_add(1, Ordering::Relaxed) % ordered.len();
                    ordered.rotate_left(start);
                }
            }
        }
        ordered.extend(full.iter().map(|t| t.id));
        ordered.truncate(usize::from(pattern.num_targets));
        debug_assert!(ordered.len() <= usize::from(pattern.num_targets));
        ordered
    }
}
