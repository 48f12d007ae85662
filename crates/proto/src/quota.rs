//! Quotas: the space and inodes each user, group and project uses in each storage pool, and
//! the limits on them. A project is a directory tree: its inodes carry its id, which new
//! inodes take from their directory (`weft quota project DIR ID` sets it on a tree).
//!
//! Every metadata home keeps what its inodes use, changed in the same transaction as the
//! inodes (`meta/src/schema/usage.rs`), and reports it with its heartbeats. Management keeps the
//! limits, sums the homes, runs the grace periods of soft limits, and publishes in the cluster
//! map who is blocked ([`QuotaBlock`]): metadata servers then refuse their new inodes, storage
//! servers the writes that grow their files, with `QuotaExceeded` (EDQUOT).

use crate::ids::StoragePoolId;
use crate::wire::Wire;
use serde::{Deserialize, Serialize};

/// Whose use a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[wire(rename_all = "snake_case")]
pub enum QuotaKind {
    /// A user id: the files it owns.
    #[wire(tag = 0)]
    User,
    /// A group id: the files of that group.
    #[wire(tag = 1)]
    Group,
    /// A project id: the inodes of a directory tree.
    #[wire(tag = 2, since = 5)]
    Project,
}

impl QuotaKind {
    /// Its number in the keys of stored tables (the metadata servers' usage, management's
    /// rules): the same as its wire tag, and never changed.
    pub fn key(self) -> u8 {
        match self {
            QuotaKind::User => 0,
            QuotaKind::Group => 1,
            QuotaKind::Project => 2,
        }
    }

    /// The kind a stored key names, if any.
    pub fn from_key(key: u8) -> Option<QuotaKind> {
        [QuotaKind::User, QuotaKind::Group, QuotaKind::Project]
            .into_iter()
            .find(|kind| kind.key() == key)
    }
}

/// Whose quotas an inode counts in: its owner, its group and its project (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// The owner.
    pub uid: u32,
    /// The group.
    pub gid: u32,
    /// The project, 0 for none.
    pub project: u32,
}

impl Owner {
    /// The ids of each kind that count the inode: user, group, and the project if it has one.
    pub fn ids(self) -> impl Iterator<Item = (QuotaKind, u32)> {
        [
            Some((QuotaKind::User, self.uid)),
            Some((QuotaKind::Group, self.gid)),
            (self.project != 0).then_some((QuotaKind::Project, self.project)),
        ]
        .into_iter()
        .flatten()
    }
}

/// What one user, group or project uses in one pool: the sizes of its files there, and its
/// inodes (a file counts in its layout's pool, any other inode in its own pattern's pool or
/// the default one). A file's size is its length, holes included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUsage {
    /// User, group or project.
    pub kind: QuotaKind,
    /// The user, group or project id.
    pub id: u32,
    /// The pool.
    pub pool: StoragePoolId,
    /// Bytes of its files.
    pub bytes: u64,
    /// Its inodes.
    pub inodes: u64,
}

/// Adds `more` to `into`, row by row (the homes' usage summed), in (kind, id, pool) order.
pub fn add_usage(into: &mut Vec<QuotaUsage>, more: &[QuotaUsage]) {
    let mut rows = std::collections::BTreeMap::new();
    for row in into.drain(..).chain(more.iter().copied()) {
        rows.entry((row.kind, row.id, row.pool))
            .and_modify(|sum: &mut QuotaUsage| {
                sum.bytes += row.bytes;
                sum.inodes += row.inodes;
            })
            .or_insert(row);
    }
    into.extend(rows.into_values());
}

/// The limits of one user, group or project in one pool; 0 is no limit. Over a hard limit, or
/// over a soft one for longer than the grace period, new inodes (for the inode limits) or
/// writes that grow files (for the byte limits) are refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLimits {
    /// Bytes that start the grace period.
    pub soft_bytes: u64,
    /// Bytes at which growth is refused.
    pub hard_bytes: u64,
    /// Inodes that start the grace period.
    pub soft_inodes: u64,
    /// Inodes at which new ones are refused.
    pub hard_inodes: u64,
}

impl QuotaLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == QuotaLimits::default()
    }
}

/// The limits set on one user, group or project in one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRule {
    /// User, group or project.
    pub kind: QuotaKind,
    /// The user, group or project id.
    pub id: u32,
    /// The pool.
    pub pool: StoragePoolId,
    /// The limits (all 0: the rule is removed).
    pub limits: QuotaLimits,
}

/// A rule with what its user, group or project uses and where it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaState {
    /// The rule.
    pub rule: QuotaRule,
    /// Bytes used, summed over the metadata homes as they last reported.
    pub bytes: u64,
    /// Inodes used.
    pub inodes: u64,
    /// When the grace period of the soft byte limit ends (Unix seconds), while over it.
    pub bytes_grace_ends: Option<u64>,
    /// When the grace period of the soft inode limit ends, while over it.
    pub inodes_grace_ends: Option<u64>,
    /// Whether writes that grow its files are refused.
    pub bytes_blocked: bool,
    /// Whether new inodes are refused.
    pub inodes_blocked: bool,
}

/// A user, group or project that may not grow its use in a pool, as the cluster map lists
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QuotaBlock {
    /// User, group or project.
    pub kind: QuotaKind,
    /// The user, group or project id.
    pub id: u32,
    /// The pool.
    pub pool: StoragePoolId,
    /// Writes that grow its files are refused.
    pub bytes: bool,
    /// New inodes are refused.
    pub inodes: bool,
}

/// Whose use in which pool: a quota's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QuotaKey {
    /// User, group or project.
    pub kind: QuotaKind,
    /// The user, group or project id.
    pub id: u32,
    /// The pool.
    pub pool: StoragePoolId,
}

impl std::fmt::Display for QuotaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} in storage pool {}",
            <&str>::from(self.kind),
            self.id,
            self.pool
        )
    }
}

/// The hard limits of one user, group or project in one pool (0: none), as the cluster map
/// lists them: the metadata homes hold grants of them from management, and let their inodes
/// and their writers' room grow only within what they hold, so every home's use together
/// stays within the limit (docs/design/quotas.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaHard {
    /// Whose limits.
    pub key: QuotaKey,
    /// Hard byte limit.
    pub bytes: u64,
    /// Hard inode limit.
    pub inodes: u64,
}

/// What a quota refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// A new inode.
    Inode,
    /// More bytes.
    Bytes,
}

impl crate::messages::ClusterMap {
    /// Why a change of `growth` of an inode of `owner` in `pool` is refused, if it is: its
    /// user, group or project is blocked for it.
    pub fn quota_refusal(
        &self,
        owner: Owner,
        pool: StoragePoolId,
        growth: Growth,
    ) -> Option<crate::error::WireError> {
        owner
            .ids()
            .find_map(|(kind, id)| self.quota_refusal_of(kind, id, pool, growth))
    }

    /// Why a change of `growth` by the user, group or project `id` in `pool` is refused, if
    /// it is.
    pub fn quota_refusal_of(
        &self,
        kind: QuotaKind,
        id: u32,
        pool: StoragePoolId,
        growth: Growth,
    ) -> Option<crate::error::WireError> {
        let blocked = self.quota_blocked.iter().find(|block| {
            block.pool == pool
                && block.kind == kind
                && block.id == id
                && match growth {
                    Growth::Inode => block.inodes,
                    Growth::Bytes => block.bytes,
                }
        })?;
        Some(crate::error::WireError::new(
            crate::error::ErrorCode::QuotaExceeded,
            format!(
                "{} {} is over its {} quota in storage pool {} (weft quota report --{} {})",
                <&str>::from(blocked.kind),
                blocked.id,
                match growth {
                    Growth::Inode => "inode",
                    Growth::Bytes => "space",
                },
                pool,
                <&str>::from(blocked.kind),
                blocked.id
            ),
        ))
    }
}

impl crate::messages::ClusterMap {
    /// The hard limits that count a growth of `owner`'s use in `pool`: its user's, group's
    /// and project's, those that have one.
    pub fn hard_limits(&self, owner: Owner, pool: StoragePoolId) -> Vec<QuotaHard> {
        if self.quota_hard.is_empty() {
            return Vec::new();
        }
        owner
            .ids()
            .filter_map(|(kind, id)| {
                let key = QuotaKey { kind, id, pool };
                self.quota_hard.iter().find(|hard| hard.key == key).copied()
            })
            .collect()
    }

    /// Whether a growth of `owner`'s files in `pool` by `growth` counts against a hard limit.
    pub fn hard_limited(&self, owner: Owner, pool: StoragePoolId, growth: Growth) -> bool {
        self.hard_limits(owner, pool)
            .iter()
            .any(|hard| match growth {
                Growth::Bytes => hard.bytes > 0,
                Growth::Inode => hard.inodes > 0,
            })
    }
}

/// A row of quota figures or rules, of one kind.
pub trait QuotaRow {
    /// Whose row it is.
    fn kind(&self) -> QuotaKind;
}

impl QuotaRow for QuotaUsage {
    fn kind(&self) -> QuotaKind {
        self.kind
    }
}

impl QuotaRow for QuotaBlock {
    fn kind(&self) -> QuotaKind {
        self.kind
    }
}

impl QuotaRow for QuotaState {
    fn kind(&self) -> QuotaKind {
        self.rule.kind
    }
}

/// Whether a peer of the protocol version being encoded reads rows of `kind`: one of
/// version 4 knows no projects, and neither counts nor enforces them.
fn spoken(kind: QuotaKind) -> bool {
    kind != QuotaKind::Project || crate::wire::version() >= 5
}

/// Quota rows as the peer reads them: those of projects are left out for a peer of version
/// 4 (its map, its heartbeats and its answers go on without them).
pub mod spoken_rows {
    use super::QuotaRow;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Encodes the rows the peer reads.
    ///
    /// # Errors
    /// As the rows' own encoding.
    pub fn serialize<T: Serialize + QuotaRow, S: Serializer>(
        rows: &[T],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let spoken: Vec<&T> = rows
            .iter()
            .filter(|row| super::spoken(row.kind()))
            .collect();
        spoken.serialize(serializer)
    }

    /// Decodes the rows.
    ///
    /// # Errors
    /// As the rows' own decoding.
    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<T>, D::Error> {
        Vec::deserialize(deserializer)
    }
}

/// [`spoken_rows`] of each of a server's metadata homes.
pub mod spoken_rows_per_home {
    use super::QuotaRow;
    use crate::ids::NodeId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Encodes the rows the peer reads, home by home.
    ///
    /// # Errors
    /// As the rows' own encoding.
    pub fn serialize<T: Serialize + QuotaRow, S: Serializer>(
        homes: &[(NodeId, Vec<T>)],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let spoken: Vec<(&NodeId, Vec<&T>)> = homes
            .iter()
            .map(|(home, rows)| {
                let rows = rows
                    .iter()
                    .filter(|row| super::spoken(row.kind()))
                    .collect();
                (home, rows)
            })
            .collect();
        spoken.serialize(serializer)
    }

    /// Decodes the rows.
    ///
    /// # Errors
    /// As the rows' own decoding.
    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<(NodeId, Vec<T>)>, D::Error> {
        Vec::deserialize(deserializer)
    }
}
