//! Storage pools: named sets of targets (and of the storage mirror groups over them) that a
//! directory's stripe pattern sends its new files to, each with the free-space and free-inode
//! limits that put its targets in a capacity class.
//!
//! Management keeps the pools and publishes them in the cluster map; a metadata server's
//! target chooser reads a target's class from them ([`ClusterMap::capacity_class`]), and
//! `weft pool list` and the web page show the same classes.

use crate::ids::StoragePoolId;
use crate::messages::{ClusterMap, MirrorKind, SpaceUsage, TargetInfo};
use serde::{Deserialize, Serialize};

/// Longest pool name, in bytes.
pub const POOL_NAME_MAX: usize = 64;

/// The name of pool 1, which every new target joins.
pub const DEFAULT_POOL_NAME: &str = "default";

/// Free space and free inodes below which a target leaves a capacity class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityLimits {
    /// Free bytes below this put the target in the class.
    pub free_bytes: u64,
    /// Free inodes below this put the target in the class (ignored for a target that reports
    /// no inode count).
    pub free_inodes: u64,
}

/// A pool as management publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    /// The pool's id; pool 1 is the default pool.
    pub id: StoragePoolId,
    /// The name operators call it by, unique in the cluster.
    pub name: String,
    /// Below these a target is low: new files go to normal targets while the pool has any.
    pub low: CapacityLimits,
    /// Below these a target is in emergency: new files go to it only when the pool has
    /// nothing else.
    pub emergency: CapacityLimits,
}

impl PoolInfo {
    /// The limits a new pool starts with (as BeeGFS's defaults, scaled for small targets):
    /// low below 1 GiB or 65,536 inodes free, emergency below 64 MiB or 1,024.
    pub fn new(id: StoragePoolId, name: String) -> PoolInfo {
        PoolInfo {
            id,
            name,
            low: CapacityLimits {
                free_bytes: 1 << 30,
                free_inodes: 65_536,
            },
            emergency: CapacityLimits {
                free_bytes: 64 << 20,
                free_inodes: 1_024,
            },
        }
    }

    /// The default pool, as it is before anyone changes its limits.
    pub fn default_pool() -> PoolInfo {
        PoolInfo::new(StoragePoolId::DEFAULT, DEFAULT_POOL_NAME.to_string())
    }

    /// The class of a target of this pool with `usage`: a target that has not reported its
    /// size yet is normal.
    pub fn class_of(&self, usage: &SpaceUsage) -> CapacityClass {
        let below = |limits: &CapacityLimits| {
            usage.total_bytes > 0
                && (usage.free_bytes < limits.free_bytes
                    || (usage.total_inodes > 0 && usage.free_inodes < limits.free_inodes))
        };
        if below(&self.emergency) {
            CapacityClass::Emergency
        } else if below(&self.low) {
            CapacityClass::Low
        } else {
            CapacityClass::Normal
        }
    }
}

/// How full a target is, by its pool's limits. New files prefer the first class.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
pub enum CapacityClass {
    /// Above the pool's low limits.
    Normal,
    /// Below the low limits, above the emergency ones.
    Low,
    /// Below the emergency limits.
    Emergency,
}

/// Whether `name` may name a pool: 1 to [`POOL_NAME_MAX`] letters, digits, `-`, `_` or `.`,
/// not all digits (a number names a pool by id).
pub fn valid_pool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= POOL_NAME_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.bytes().all(|b| b.is_ascii_digit())
}

impl ClusterMap {
    /// The pool `id`: the published one, or for the default pool its defaults when
    /// management publishes none (an older management).
    pub fn pool(&self, id: StoragePoolId) -> Option<PoolInfo> {
        match self.pools.iter().find(|pool| pool.id == id) {
            Some(pool) => Some(pool.clone()),
            None if id == StoragePoolId::DEFAULT => Some(PoolInfo::default_pool()),
            None => None,
        }
    }

    /// The pool called `name`, or numbered `name`.
    pub fn pool_named(&self, name: &str) -> Option<PoolInfo> {
        if let Ok(id) = name.parse::<u16>() {
            return self.pool(StoragePoolId(id));
        }
        let named = self.pools.iter().find(|pool| pool.name == name).cloned();
        named.or_else(|| (name == DEFAULT_POOL_NAME).then(PoolInfo::default_pool))
    }

    /// Every pool, the default one first, then by id.
    pub fn all_pools(&self) -> Vec<PoolInfo> {
        let mut pools = self.pools.clone();
        if !pools.iter().any(|pool| pool.id == StoragePoolId::DEFAULT) {
            pools.push(PoolInfo::default_pool());
        }
        pools.sort_by_key(|pool| pool.id);
        pools
    }

    /// A target's capacity class by its pool's limits (normal if its pool is unknown). Read
    /// for every target at every file create: the pool is borrowed, not copied.
    pub fn capacity_class(&self, target: &TargetInfo) -> CapacityClass {
        match self.pools.iter().find(|pool| pool.id == target.pool) {
            Some(pool) => pool.class_of(&target.usage),
            None => self
                .pool(target.pool)
                .map_or(CapacityClass::Normal, |pool| pool.class_of(&target.usage)),
        }
    }

    /// The targets of pool `id`.
    pub fn pool_targets(&self, id: StoragePoolId) -> impl Iterator<Item = &TargetInfo> {
        self.targets.iter().filter(move |target| target.pool == id)
    }

    /// How many slots a pattern of `kind` has in pool `id`: its targets, or for a mirrored
    /// pattern its storage mirror groups (a group belongs to its members' pool).
    pub fn pool_slots(&self, id: StoragePoolId, mirrored: bool) -> usize {
        if !mirrored {
            return self.pool_targets(id).count();
        }
        self.mirror_groups
            .iter()
            .filter(|group| group.kind == MirrorKind::Storage)
            .filter(|group| {
                self.target(crate::ids::TargetId::from(group.primary))
                    .is_some_and(|target| target.pool == id)
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(free_gib: u64, free_inodes: u64) -> SpaceUsage {
        SpaceUsage {
            total_bytes: 100 << 30,
            free_bytes: free_gib << 30,
            total_inodes: 1 << 20,
            free_inodes,
        }
    }

    // Goal: a target's class follows its pool's limits, on space and on inodes alike, and a
    // target that has not reported is not held back.
    #[test]
    fn classes_follow_the_pool_limits() {
        let mut pool = PoolInfo::default_pool();
        pool.low.free_bytes = 10 << 30;
        pool.emergency.free_bytes = 2 << 30;
        assert_eq!(pool.class_of(&usage(50, 500_000)), CapacityClass::Normal);
        assert_eq!(pool.class_of(&usage(5, 500_000)), CapacityClass::Low);
        assert_eq!(pool.class_of(&usage(1, 500_000)), CapacityClass::Emergency);
        assert_eq!(pool.class_of(&usage(50, 10_000)), CapacityClass::Low);
        assert_eq!(pool.class_of(&usage(50, 10)), CapacityClass::Emergency);
        assert_eq!(pool.class_of(&SpaceUsage::default()), CapacityClass::Normal);
    }

    #[test]
    fn pool_names() {
        assert!(valid_pool_name("fast-nvme_1.a"));
        assert!(!valid_pool_name(""));
        assert!(!valid_pool_name("12"));
        assert!(!valid_pool_name("a b"));
        assert!(!valid_pool_name(&"x".repeat(POOL_NAME_MAX + 1)));
    }
}
