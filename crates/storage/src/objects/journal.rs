//! The crash-test store (`crash_test_discard_unsynced = true`): a wrapper that keeps every
//! change of an object in memory until the object is synced, and only then applies the
//! changes to the store it wraps, in order, and syncs them. Killing the server loses exactly
//! what no sync covered — what a crash may lose at worst — so tests can check that nothing
//! acknowledged as durable was only in a page cache.
//!
//! A replay runs alone per object (its replay lock), and the changes it applies stay pending,
//! seen by every read, length and generation, until all of them are in the wrapped store: no
//! one sees an object between its pending changes and its disk, and a sync that comes during
//! another's replay waits for it, so it answers only once those changes are durable. Applying
//! a pending change again over what it already did changes nothing, which a replay that
//! failed half-way relies on: its changes stay pending for the next sync.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Mutex;

use super::{ObjectError, ObjectId, ObjectStore, Space, Tree};
use weft_proto::ids::InodeId;
use weft_proto::messages::FallocateMode;

/// A change kept in memory until its object is synced.
#[derive(Clone, Debug)]
enum Pending {
    Write {
        offset: u64,
        data: Bytes,
    },
    /// A cut made by truncate `generation` of the file (or, at length 0 of an empty object,
    /// only the generation recorded by its first write).
    Truncate {
        length: u64,
        generation: u64,
    },
}

pub(crate) struct Journal {
    inner: Box<dyn ObjectStore>,
    pending: Mutex<HashMap<ObjectId, Vec<Pending>>>,
    /// Per object stripe: held while an object's changes are applied, and by a removal.
    replays: Vec<Mutex<()>>,
}

/// Replay lock stripes.
const REPLAY_STRIPES: u64 = 64;

impl Journal {
    pub fn new(inner: Box<dyn ObjectStore>) -> Journal {
        Journal {
            inner,
            pending: Mutex::default(),
            replays: (0..REPLAY_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn replay_lock(&self, object: ObjectId) -> std::sync::MutexGuard<'_, ()> {
        self.replays[(object.inode.0 % REPLAY_STRIPES) as usize]
            .lock()
            .expect("replay lock poisoned")
    }

    /// Applies `change` of `object` to the wrapped store, unless the store has it already: a
    /// truncate (or a first write's generation) the object records is done.
    fn apply(&self, object: ObjectId, change: Pending) -> Result<(), ObjectError> {
        match change {
            Pending::Write { offset, data } => self.inner.write(object, offset, data),
            Pending::Truncate { generation, .. }
                if generation <= self.inner.generation(object)? =>
            {
                Ok(())
            }
            // A generation recorded by a first write, before anything reached the disk.
            Pending::Truncate {
                length: 0,
                generation,
            } if !self.inner.exists(object) => self.inner.record_generation(object, generation),
            Pending::Truncate { length, generation } => {
                self.inner.cut(object, length, generation).map(|_| ())
            }
        }
    }

    fn push(&self, object: ObjectId, change: Pending) {
        self.pending
            .lock()
            .expect("journal poisoned")
            .entry(object)
            .or_default()
            .push(change);
    }

    /// The object's pending changes.
    fn changes(&self, object: ObjectId) -> Vec<Pending> {
        self.pending
            .lock()
            .expect("journal poisoned")
            .get(&object)
            .cloned()
            .unwrap_or_default()
    }
}

impl ObjectStore for Journal {
    fn tree(&self) -> &Tree {
        self.inner.tree()
    }

    fn is_direct(&self) -> bool {
        self.inner.is_direct()
    }

    fn exists(&self, object: ObjectId) -> bool {
        let pending = self
            .pending
            .lock()
            .expect("journal poisoned")
            .contains_key(&object);
        pending || self.inner.exists(object)
    }

    fn length(&self, object: ObjectId) -> Result<u64, ObjectError> {
        let on_disk = self.inner.length(object)?;
        Ok(length_after(on_disk, &self.changes(object)))
    }

    fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, ObjectError> {
        let on_disk = self.inner.length(object)?;
        let stored = self.inner.read(object, offset, len)?;
        let changes = self.changes(object);
        if changes.is_empty() {
            return Ok(stored);
        }
        let mut buffer = vec![0u8; len as usize];
        buffer[..stored.len()].copy_from_slice(&stored);
        let end = offset + u64::from(len);
        let mut length = on_disk;
        for change in &changes {
            match change {
                Pending::Write { offset: at, data } => {
                    let start = (*at).max(offset);
                    let stop = (at + data.len() as u64).min(end);
                    if start < stop {
                        buffer[(start - offset) as usize..(stop - offset) as usize]
                            .copy_from_slice(&data[(start - at) as usize..(stop - at) as usize]);
                    }
                    length = length.max(at + data.len() as u64);
                }
                Pending::Truncate { length: cut, .. } => {
                    if *cut < end {
                        let from = cut.saturating_sub(offset) as usize;
                        buffer[from..].fill(0);
                    }
                    length = *cut;
                }
            }
        }
        buffer.truncate(length.saturating_sub(offset).min(u64::from(len)) as usize);
        Ok(Bytes::from(buffer))
    }

    fn write(&self, object: ObjectId, offset: u64, data: Bytes) -> Result<(), ObjectError> {
        self.push(object, Pending::Write { offset, data });
        Ok(())
    }

    fn generation(&self, object: ObjectId) -> Result<u64, ObjectError> {
        let on_disk = self.inner.generation(object)?;
        Ok(self
            .changes(object)
            .iter()
            .filter_map(|change| match change {
                Pending::Truncate { generation, .. } => Some(*generation),
                Pending::Write { .. } => None,
            })
            .fold(on_disk, u64::max))
    }

    fn record_generation(&self, object: ObjectId, generation: u64) -> Result<(), ObjectError> {
        self.push(
            object,
            Pending::Truncate {
                length: 0,
                generation,
            },
        );
        Ok(())
    }

    /// Synced before the answer as on disk: the file's home forgets the truncate once every
    /// target answered it, so a crash must not take it back.
    fn cut(&self, object: ObjectId, length: u64, generation: u64) -> Result<u64, ObjectError> {
        let current = self.length(object)?;
        self.push(
            object,
            Pending::Truncate {
                length: length.min(current),
                generation,
            },
        );
        self.sync(object)?;
        Ok(current)
    }

    /// An allocation is only checked (by the target, against its capacity); a zeroing is
    /// journalled as a write of zeros.
    fn fallocate(
        &self,
        object: ObjectId,
        (offset, len): (u64, u64),
        mode: FallocateMode,
        length: u64,
    ) -> Result<(), ObjectError> {
        if mode == FallocateMode::Zero {
            let end = offset.saturating_add(len).min(length);
            let data = Bytes::from(vec![0u8; end.saturating_sub(offset) as usize]);
            self.push(object, Pending::Write { offset, data });
        }
        Ok(())
    }

    /// The objects on disk and those only in the journal.
    fn list(&self, space: Space) -> Result<Vec<InodeId>, ObjectError> {
        let mut found = self.inner.list(space)?;
        let pending = self.pending.lock().expect("journal poisoned");
        found.extend(
            pending
                .keys()
                .filter(|object| object.space == space)
                .map(|object| object.inode),
        );
        Ok(found)
    }

    fn remove(&self, object: ObjectId) -> Result<(), ObjectError> {
        // Not while a replay may bring the object back.
        let _replay = self.replay_lock(object);
        self.pending
            .lock()
            .expect("journal poisoned")
            .remove(&object);
        self.inner.remove(object)
    }

    /// Applies the object's changes to the wrapped store in the order they were made, then
    /// syncs it there; they stay pending until every one is applied (see the module docs).
    fn sync(&self, object: ObjectId) -> Result<(), ObjectError> {
        let _replay = self.replay_lock(object);
        let changes = self.changes(object);
        let count = changes.len();
        for change in changes {
            self.apply(object, change)?;
        }
        self.inner.sync(object)?;
        // Synced: forget what was applied, keeping what came meanwhile.
        let mut pending = self.pending.lock().expect("journal poisoned");
        if let Some(list) = pending.get_mut(&object) {
            list.drain(..count.min(list.len()));
            if list.is_empty() {
                pending.remove(&object);
            }
        }
        Ok(())
    }

    fn sync_everything(&self) -> Result<(), ObjectError> {
        let pending: Vec<ObjectId> = self
            .pending
            .lock()
            .expect("journal poisoned")
            .keys()
            .copied()
            .collect();
        for object in pending {
            self.sync(object)?;
        }
        self.inner.sync_everything()
    }
}

/// An object's length after `changes`, from `on_disk`.
fn length_after(on_disk: u64, changes: &[Pending]) -> u64 {
    changes.iter().fold(on_disk, |length, change| match change {
        Pending::Write { offset, data } => length.max(offset + data.len() as u64),
        Pending::Truncate { length: cut, .. } => *cut,
    })
}
