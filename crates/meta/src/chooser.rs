//! Chooses the storage targets of a new file from the cluster map.

use crate::config::TargetChooser;
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use weft_proto::ids::{NodeId, TargetId};
use weft_proto::layout::{PatternKind, Slot, StripePattern};
use weft_proto::messages::{ClusterMap, MirrorKind, Reachability, TargetInfo};
use weft_proto::pools::CapacityClass;

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
            TargetChooser::Balanced => by_fewest_inodes(map, &homes),
            TargetChooser::Roundrobin => self.next.fetch_add(1, Ordering::Relaxed) % homes.len(),
        };
        homes.rotate_left(first);
        homes.truncate(count);
        homes
    }

    /// Up to `pattern.num_targets` distinct slots of the pattern's pool, reachable ones only
    /// and none being drained,
    /// from the pool's normal targets first, then its low ones, then those in emergency
    /// (capacity classes by the pool's limits, `weft_proto::pools`); empty when the pool has
    /// none reachable. A slot is a target, or for a mirrored pattern a storage mirror group,
    /// reachable by its primary and as full as its fullest member.
    pub fn choose(&self, map: &ClusterMap, pattern: &StripePattern) -> Vec<Slot> {
        // Each candidate with its class and what it is otherwise judged by: a target's own
        // state, a group's primary's.
        let slots: Vec<(Slot, &TargetInfo, CapacityClass)> = match pattern.kind {
            PatternKind::Raid0 => map
                .targets
                .iter()
                .map(|target| (Slot::Target(target.id), target, map.capacity_class(target)))
                .collect(),
            PatternKind::Mirrored => map
                .mirror_groups
                .iter()
                .filter(|group| group.kind == MirrorKind::Storage)
                .filter_map(|group| {
                    let primary = map.target(TargetId::from(group.primary))?;
                    let fullest = group
                        .members
                        .iter()
                        .filter_map(|m| map.target(TargetId::from(m.id)))
                        .map(|member| map.capacity_class(member))
                        .max()
                        .unwrap_or(CapacityClass::Normal);
                    Some((Slot::Group(group.id), primary, fullest))
                })
                .collect(),
        };
        let mut candidates: Vec<_> = slots
            .into_iter()
            .filter(|(slot, t, _)| {
                t.reachability != Reachability::Offline
                    && map.slot_placement(*slot) == Some((pattern.pool, false))
            })
            .collect();
        candidates.sort_by_key(|(slot, _, _)| *slot);
        let mut ordered = Vec::with_capacity(candidates.len());
        for class in [
            CapacityClass::Normal,
            CapacityClass::Low,
            CapacityClass::Emergency,
        ] {
            let of_class: Vec<(Slot, &TargetInfo)> = candidates
                .iter()
                .filter(|(_, _, c)| *c == class)
                .map(|(slot, target, _)| (*slot, *target))
                .collect();
            ordered.extend(self.in_policy_order(&of_class));
            if ordered.len() >= usize::from(pattern.num_targets) {
                break;
            }
        }
        ordered.truncate(usize::from(pattern.num_targets));
        ordered
    }

    /// Slots of one class in the order the policy takes them.
    fn in_policy_order(&self, slots: &[(Slot, &TargetInfo)]) -> Vec<Slot> {
        let mut ordered: Vec<Slot> = slots.iter().map(|(slot, _)| *slot).collect();
        match self.kind {
            TargetChooser::Randomized => ordered.shuffle(&mut rand::thread_rng()),
            TargetChooser::Balanced => ordered = by_free_space(slots),
            TargetChooser::Roundrobin => {
                if !ordered.is_empty() {
                    let start = self.next.fetch_add(1, Ordering::Relaxed) % ordered.len();
                    ordered.rotate_left(start);
                }
            }
        }
        ordered
    }
}

/// The index in `homes` of a home drawn with a weight of how far it is below the fullest
/// (by the inodes its server reports), plus a share of the mean so none is left out: a
/// server that joined empty gets most new directories until it catches up, not all of them.
fn by_fewest_inodes(map: &ClusterMap, homes: &[NodeId]) -> usize {
    let used: Vec<u64> = homes
        .iter()
        .map(|home| {
            map.node(weft_proto::messages::NodeKind::Meta, *home)
                .and_then(|node| node.meta_inodes_used)
                .unwrap_or(0)
        })
        .collect();
    let most = used.iter().copied().max().unwrap_or(0);
    let share = used.iter().sum::<u64>() / (2 * used.len().max(1) as u64) + 1;
    let weights = used.iter().map(|used| (most - used + share) as f64);
    match rand::distributions::WeightedIndex::new(weights) {
        Ok(index) => rand::thread_rng().sample(index),
        Err(_) => 0,
    }
}

/// The slots in a random order in which each comes before the rest with a chance that grows
/// with its free bytes (sampling without replacement, weighted). A target that has not
/// reported its size yet weighs as much as the emptiest one that has.
fn by_free_space(slots: &[(Slot, &TargetInfo)]) -> Vec<Slot> {
    let known = |t: &TargetInfo| t.usage.total_bytes > 0;
    let most_free = slots
        .iter()
        .filter(|(_, t)| known(t))
        .map(|(_, t)| t.usage.free_bytes)
        .max()
        .unwrap_or(1);
    let weight = |t: &TargetInfo| {
        // Never zero: a slot that is merely roomy still gets a file now and then.
        let free = if known(t) {
            t.usage.free_bytes
        } else {
            most_free
        };
        free.max(1) as f64
    };
    match slots.choose_multiple_weighted(&mut rand::thread_rng(), slots.len(), |(_, t)| weight(t)) {
        Ok(chosen) => chosen.map(|(slot, _)| *slot).collect(),
        // Weights are positive and finite, so this is not reached; the plain order serves.
        Err(_) => slots.iter().map(|(slot, _)| *slot).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::ids::StoragePoolId;
    use weft_proto::messages::SpaceUsage;

    fn target(id: u32, free_gib: u64) -> TargetInfo {
        TargetInfo {
            id: TargetId(id),
            node: NodeId(1),
            pool: StoragePoolId::DEFAULT,
            reachability: Reachability::Online,
            usage: SpaceUsage {
                total_bytes: 100 << 30,
                free_bytes: free_gib << 30,
                total_inodes: 1 << 20,
                free_inodes: 1 << 20,
            },
            draining: false,
        }
    }

    // Goal: with the balanced chooser, new files land on the emptier targets of targets
    // filled unevenly, in proportion to their free space, while every roomy target still gets
    // some; the other choosers ignore fill. Method: the chooser the metadata server runs, over
    // a map of four targets with 90, 30, 10 and 10 GiB free, 4,000 one-target files.
    #[test]
    fn balanced_placement_sends_new_files_to_the_emptier_targets() {
        let map = ClusterMap {
            nodes: Vec::new(),
            targets: vec![target(1, 90), target(2, 30), target(3, 10), target(4, 10)],
            ..ClusterMap::default()
        };
        let pattern = StripePattern::raid0(1 << 20, 1, StoragePoolId::DEFAULT).expect("pattern");
        let count = |kind: TargetChooser| {
            let chooser = Chooser::new(kind);
            let mut files = [0u32; 4];
            for _ in 0..4_000 {
                match chooser.choose(&map, &pattern)[..] {
                    [Slot::Target(TargetId(id))] => files[id as usize - 1] += 1,
                    ref other => panic!("one target per file, got {other:?}"),
                }
            }
            files
        };
        let balanced = count(TargetChooser::Balanced);
        // 90 of 140 GiB free is 64 % of the files; 10 of 140 is 7 %.
        assert!(
            balanced[0] > 2_200,
            "the emptiest target gets most: {balanced:?}"
        );
        assert!(
            balanced[1] > balanced[2] && balanced[1] > balanced[3],
            "{balanced:?}"
        );
        assert!(
            balanced[2] > 100 && balanced[3] > 100,
            "fuller ones still get some: {balanced:?}"
        );
        let even = count(TargetChooser::Randomized);
        assert!(even.iter().all(|&n| (700..1_300).contains(&n)), "{even:?}");
    }

    // Goal: with the balanced directory chooser, a metadata server that joined empty gets
    // most new directories, but not all, until it holds as many inodes as the others.
    // Method: the chooser the metadata server runs, over a map of three servers holding
    // 1,000,000 inodes each and one holding none, 4,000 new directories.
    #[test]
    fn balanced_directories_go_mostly_to_the_emptier_server() {
        let node = |id: u32, inodes: u64| weft_proto::messages::NodeInfo {
            id: NodeId(id),
            kind: weft_proto::messages::NodeKind::Meta,
            alias: format!("meta-{id}"),
            addresses: vec![format!("127.0.0.1:{}", 9000 + id)],
            reachability: Reachability::Online,
            meta_usage: None,
            meta_inodes_used: Some(inodes),
        };
        let map = ClusterMap {
            nodes: vec![
                node(1, 1_000_000),
                node(2, 1_000_000),
                node(3, 1_000_000),
                node(4, 0),
            ],
            ..ClusterMap::default()
        };
        let chooser = Chooser::new(TargetChooser::Balanced);
        let mut dirs = [0u32; 4];
        for _ in 0..4_000 {
            let home = chooser.choose_meta(&map, NodeId(1));
            dirs[home.0 as usize - 1] += 1;
        }
        // Weights 375,001 : 375,001 : 375,001 : 1,375,001: the new one gets 55 %.
        assert!(dirs[3] > 1_900 && dirs[3] < 2_500, "{dirs:?}");
        assert!(dirs[..3].iter().all(|&n| n > 200), "{dirs:?}");
        let even = ClusterMap {
            nodes: vec![node(1, 500), node(2, 500), node(3, 500), node(4, 500)],
            ..ClusterMap::default()
        };
        let mut dirs = [0u32; 4];
        for _ in 0..4_000 {
            dirs[chooser.choose_meta(&even, NodeId(1)).0 as usize - 1] += 1;
        }
        assert!(dirs.iter().all(|&n| (800..1_200).contains(&n)), "{dirs:?}");
    }

    // Goal: new files avoid a pool's low targets while it has normal ones, and its targets in
    // emergency while it has anything else, whatever the policy; a file wider than the
    // normal targets takes the low ones next. Method: the chooser the metadata server runs,
    // over a pool whose limits make targets 1 and 2 normal, 3 low and 4 in emergency.
    #[test]
    fn new_files_avoid_low_and_emergency_targets() {
        let mut pool = weft_proto::pools::PoolInfo::default_pool();
        pool.low.free_bytes = 20 << 30;
        pool.emergency.free_bytes = 5 << 30;
        let map = ClusterMap {
            targets: vec![target(1, 90), target(2, 30), target(3, 10), target(4, 1)],
            pools: vec![pool],
            ..ClusterMap::default()
        };
        for kind in [
            TargetChooser::Randomized,
            TargetChooser::Balanced,
            TargetChooser::Roundrobin,
        ] {
            let chooser = Chooser::new(kind);
            for width in 1..=4u64 {
                let pattern =
                    StripePattern::raid0(1 << 20, width, StoragePoolId::DEFAULT).expect("pattern");
                for _ in 0..50 {
                    let mut chosen: Vec<u32> = chooser
                        .choose(&map, &pattern)
                        .iter()
                        .map(|slot| match slot {
                            Slot::Target(TargetId(id)) => *id,
                            Slot::Group(_) => panic!("a raid0 file has targets"),
                        })
                        .collect();
                    chosen.sort_unstable();
                    let expected: Vec<u32> = match width {
                        1 => vec![chosen[0]],
                        2 => vec![1, 2],
                        3 => vec![1, 2, 3],
                        _ => vec![1, 2, 3, 4],
                    };
                    assert_eq!(chosen, expected, "{width} targets by {kind:?}");
                    assert!(chosen[0] <= 2, "{width} targets by {kind:?}: {chosen:?}");
                }
            }
        }
    }
}
