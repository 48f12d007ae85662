//! Quotas: the space and inodes each user, group and project uses in each storage pool.
//!
//! Every metadata home keeps what its inodes use, changed in the same transaction as the
//! inodes (`meta/src/usage.rs`); `weft quota report` sums the homes.

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
}

/// What one user or group uses in one pool: the sizes of its files there, and its inodes (a
/// file counts in its layout's pool, any other inode in its own pattern's pool or the
/// default one). A file's size is its length, holes included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUsage {
    /// User or group.
    pub kind: QuotaKind,
    /// The user or group id.
    pub id: u32,
    /// The pool.
    pub pool: StoragePoolId,
    /// Bytes of its files.
    pub bytes: u64,
    /// Its inodes.
    pub inodes: u64,
}

/// Adds `more` to `into`, row by row (the homes' usage summed).
pub fn add_usage(into: &mut Vec<QuotaUsage>, more: &[QuotaUsage]) {
    for row in more {
        match into
            .iter_mut()
            .find(|r| (r.kind, r.id, r.pool) == (row.kind, row.id, row.pool))
        {
            Some(found) => {
                found.bytes += row.bytes;
                found.inodes += row.inodes;
            }
            None => into.push(*row),
        }
    }
    into.sort_by_key(|r| (r.kind, r.id, r.pool));
}
