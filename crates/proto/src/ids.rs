//! Identifiers. Every id is a newtype so that two ids of different kinds can never be swapped.
//!
//! An [`InodeId`] names its *home*: the metadata node that owns it sits in the top 16 bits, a
//! per-home counter that is never reused in the low 48 bits. A client can therefore route a
//! request for any inode without asking anyone.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A mirror group, numbered per kind from 1.
pub use weft_mirror::GroupId;
/// A member of a mirror group: a storage target id in a storage group, a metadata node id in
/// a metadata group.
pub use weft_mirror::ServerId as MemberId;
/// A mirror group's version: management bumps it whenever its members, their states or its
/// primary change.
pub use weft_mirror::Version as GroupVersion;

impl From<TargetId> for MemberId {
    fn from(target: TargetId) -> MemberId {
        MemberId(target.0)
    }
}

impl From<MemberId> for TargetId {
    fn from(member: MemberId) -> TargetId {
        TargetId(member.0)
    }
}

impl From<NodeId> for MemberId {
    fn from(node: NodeId) -> MemberId {
        MemberId(node.0)
    }
}

impl From<MemberId> for NodeId {
    fn from(member: MemberId) -> NodeId {
        NodeId(member.0)
    }
}

/// A node (management, metadata or storage server), allocated by management, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// A storage target (one directory on one storage server), allocated by management.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TargetId(pub u32);

/// A storage pool. Pool 1 is the default pool every target joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StoragePoolId(pub u16);

/// A client session registered with management.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientId(pub u64);

/// An inode: home metadata node in the top 16 bits, per-home counter in the low 48 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InodeId(pub u64);

impl StoragePoolId {
    /// The pool every new target joins.
    pub const DEFAULT: StoragePoolId = StoragePoolId(1);
}

/// Bits of an [`InodeId`] that hold the per-home counter.
pub const INODE_COUNTER_BITS: u32 = 48;
/// Largest per-home counter value.
pub const INODE_COUNTER_MAX: u64 = (1 << INODE_COUNTER_BITS) - 1;
/// Largest metadata node id that can be a home (16 bits).
pub const META_HOME_MAX: u32 = u16::MAX as u32;

/// The counter value of the root directory on its home.
const ROOT_COUNTER: u64 = 1;
/// The metadata node that is home to the root directory: the first one management allocates.
pub const ROOT_HOME: NodeId = NodeId(1);

impl InodeId {
    /// The root directory. Its home is [`ROOT_HOME`].
    pub const ROOT: InodeId = InodeId(((ROOT_HOME.0 as u64) << INODE_COUNTER_BITS) | ROOT_COUNTER);

    /// Builds the id of the `counter`-th inode of `home`.
    ///
    /// # Panics
    /// If `home` does not fit 16 bits or `counter` does not fit 48 bits: both are allocated by
    /// Weft itself, so an overflow is a programmer error.
    pub fn new(home: NodeId, counter: u64) -> InodeId {
        assert!(
            home.0 <= META_HOME_MAX,
            "metadata node id {} cannot be a home",
            home.0
        );
        assert!(counter <= INODE_COUNTER_MAX, "inode counter overflow");
        assert!(counter > 0, "inode counter 0 is never allocated");
        InodeId((u64::from(home.0) << INODE_COUNTER_BITS) | counter)
    }

    /// The metadata node that owns this inode.
    pub fn home(self) -> NodeId {
        NodeId((self.0 >> INODE_COUNTER_BITS) as u32)
    }

    /// The per-home counter part.
    pub fn counter(self) -> u64 {
        self.0 & INODE_COUNTER_MAX
    }

    /// The entry id shown to operators, as BeeGFS shows its entry ids.
    pub fn entry_id(self) -> String {
        format!("{:X}-{:X}", self.home().0, self.counter())
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for StoragePoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ClientId {
    /// The session as frames carry it (their `origin`): the low 32 bits of the id, which
    /// management allocates counting up from 1.
    pub fn origin(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Display for InodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.entry_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: an inode id round-trips its home and counter, and the root's home is the first
    // metadata node.
    #[test]
    fn inode_home_round_trip() {
        let id = InodeId::new(NodeId(7), 12345);
        assert_eq!(id.home(), NodeId(7));
        assert_eq!(id.counter(), 12345);
        assert_eq!(InodeId::ROOT.home(), ROOT_HOME);
        assert_eq!(InodeId::ROOT.counter(), 1);
    }
}
