//! A simulated storage server's data: what its page cache holds, what reached its disk, and
//! the durable records beside them (what absent members missed, the seals of moved chunks).

use std::collections::{BTreeMap, BTreeSet};
use weft_mirror::{Bytes, Change, ChunkId, GroupId, ServerId};

/// A server's data: what the page cache holds (`volatile`) and what reached the disk
/// (`durable`). A crash keeps only `durable`. The records of what absent members missed are
/// written durably before the writes they cover are acknowledged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    /// Every chunk as reads see it.
    pub volatile: BTreeMap<(GroupId, ChunkId), Bytes>,
    /// Every chunk as it is on disk.
    pub durable: BTreeMap<(GroupId, ChunkId), Bytes>,
    /// The chunks each absent member misses, per (group, member); durable.
    pub missed: BTreeMap<(GroupId, ServerId), BTreeSet<ChunkId>>,
    /// The chunks sealed (moved to another group), whose bytes are gone; durable as soon as
    /// they are sealed, as a storage target's seal is.
    pub sealed: BTreeSet<(GroupId, ChunkId)>,
}

impl Store {
    /// A crash: what was not synced is gone.
    pub fn crash(&mut self) {
        self.volatile = self.durable.clone();
    }

    pub(super) fn sync(&mut self, group: GroupId) {
        self.durable.retain(|(g, _), _| *g != group);
        for (key, data) in self.volatile.range((group, 0)..=(group, ChunkId::MAX)) {
            self.durable.insert(*key, data.clone());
        }
    }

    pub(super) fn sync_chunk(&mut self, key: (GroupId, ChunkId)) {
        match self.volatile.get(&key) {
            Some(data) => self.durable.insert(key, data.clone()),
            None => self.durable.remove(&key),
        };
    }

    /// Applies `change` to its chunk of `group`: a seal (a member's, at its primary's word)
    /// marks the chunk sealed and takes its bytes, durably.
    pub(super) fn apply(&mut self, group: GroupId, change: &Change) {
        if let Change::Seal { chunk } = change {
            self.seal((group, *chunk));
            self.retire((group, *chunk));
            return;
        }
        change.apply_to(&mut self.volatile, group);
    }

    /// Marks a chunk sealed, durably: it takes no change and serves no read from now on.
    pub(super) fn seal(&mut self, key: (GroupId, ChunkId)) {
        self.sealed.insert(key);
    }

    /// Drops a sealed chunk's bytes, durably: it lives in another group now.
    pub(super) fn retire(&mut self, key: (GroupId, ChunkId)) {
        self.volatile.remove(&key);
        self.durable.remove(&key);
    }

    pub(super) fn chunks(&self, group: GroupId) -> impl Iterator<Item = ChunkId> + '_ {
        self.volatile
            .range((group, 0)..=(group, ChunkId::MAX))
            .map(|((_, chunk), _)| *chunk)
    }
}
