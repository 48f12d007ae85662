//! Chooses the storage targets of a new file from the cluster map.

use crate::config::TargetChooser;
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use weft_proto::ids::{NodeId, TargetId};
use weft_proto::layout::{PatternKind, Slot, StripePattern};
use weft_proto::messages::{ClusterMap, MirrorKind, Reachability, TargetInfo};

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

    /// The metadata node a new directory goes to: any not known to be offline (heartbeats run
    /// late under load), by the same policy.
    pub fn choose_meta(&self, map: &ClusterMap, fallback: NodeId) -> NodeId {
        self.choose_metas(map, 1)
            .first()
            .copied()
            .unwrap_or(fallback)
    }

    /// Up to `count` distinct metadata nodes for a spread directory: the first by policy (the
    /// directory's home), the others after it in id order.
    pub fn choose_metas(&self, map: &ClusterMap, count: usize) -> Vec<NodeId> {
        let mut homes: Vec<NodeId> = map
            .meta_homes()
            .into_iter()
            .filter(|id| id.0 <= weft_proto::ids::META_HOME_MAX)
            .collect();
        if homes.is_empty() {
            return homes;
        }
        let first = match self.kind {
            TargetChooser::Randomized => rand::thread_rng().gen_range(0..homes.len()),
            TargetChooser::Roundrobin => self.next.fetch_add(1, Ordering::Relaxed) % homes.len(),
        };
        homes.rotate_left(first);
        homes.truncate(count);
        homes
    }

    /// Up to `pattern.num_targets` distinct slots of the pattern's pool, reachable ones first
    /// and full ones last; empty when the pool has none at all. A slot is a target, or for a
    /// mirrored pattern a storage mirror group, judged by its primary.
    pub fn choose(&self, map: &ClusterMap, pattern: &StripePattern) -> Vec<Slot> {
        // Each candidate with what it is judged by: a target's own state, a group's primary's.
        let slots: Vec<(Slot, &TargetInfo)> = match pattern.kind {
            PatternKind::Raid0 => map
                .targets
                .iter()
                .map(|target| (Slot::Target(target.id), target))
                .collect(),
            PatternKind::Mirrored => map
                .mirror_groups
                .iter()
                .filter(|group| group.kind == MirrorKind::Storage)
                .filter_map(|group| {
                    let primary = map.target(TargetId::from(group.primary))?;
                    Some((Slot::Group(group.id), primary))
                })
                .collect(),
        };
        let mut candidates: Vec<_> = slots
            .into_iter()
            .filter(|(_, t)| t.pool == pattern.pool && t.reachability != Reachability::Offline)
            .collect();
        candidates.sort_by_key(|(slot, _)| *slot);
        let (roomy, full): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|(_, t)| {
            t.usage.total_bytes == 0 || t.usage.free_bytes >= TARGET_FREE_BYTES_MIN
        });
        let mut ordered: Vec<Slot> = roomy.iter().map(|(slot, _)| *slot).collect();
        match self.kind {
            TargetChooser::Randomized => ordered.shuffle(&mut rand::thread_rng()),
            TargetChooser::Roundrobin => {
                if !ordered.is_empty() {
                    let start = self.next.fetch_add(1, Ordering::Relaxed) % ordered.len();
                    ordered.rotate_left(start);
                }
            }
        }
        ordered.extend(full.iter().map(|(slot, _)| *slot));
        ordered.truncate(usize::from(pattern.num_targets));
        debug_assert!(ordered.len() <= usize::from(pattern.num_targets));
        ordered
    }
}
