//! An object moving off its target while its file is in use (`weft entry migrate`, a drain):
//! the source side.
//!
//! The file's metadata server pushes the object to its new target in rounds
//! ([`weft_proto::messages::StorageRequest::Push`]). The first round copies the whole object
//! and starts a [`Watch`] on it: every change made here from then on notes the bytes it
//! touched, and each later round copies only those. The last round *seals* the object: a
//! marker file, synced before anything else, makes every read and change of it refused with
//! `Moved` from then on (across restarts), so a client that still holds the old layout
//! fetches the new one instead of writing where no one will read. The round then copies the
//! changes made before the seal, syncs the copy and drops the object's data; the marker
//! stays as the object's tombstone until its file is removed.
//!
//! A change and a seal exclude each other on the object's stripe lock, so no change lands
//! after the last round looked at the notes. A watch lives in memory only: a restart loses
//! it, and the next round copies the whole object again onto a fresh copy.

use crate::objects::{ObjectId, Space};
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
use weft_proto::ids::InodeId;

/// Lock stripes of the seal locks.
const STRIPES: u64 = 64;

/// Ranges a watch keeps apart before it merges them into one span.
const RANGES_MAX: usize = 1024;

/// What changed of a watched object since the last round looked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Changed {
    /// Everything: a new watch, or a truncate (the copy is made again from nothing).
    Whole,
    /// These byte ranges, `(offset, len)`, unordered and maybe overlapping.
    Ranges(Vec<(u64, u64)>),
}

/// The objects of one target that moved (or are moving) away, and the watches of those
/// being copied.
pub(crate) struct Moves {
    /// `<target>/moved`: one empty file per sealed object.
    dir: PathBuf,
    sealed: RwLock<HashSet<ObjectId>>,
    /// How many objects are sealed or watched: a change of an object of a target with none
    /// looks no further.
    marked: AtomicUsize,
    watches: Mutex<HashMap<ObjectId, Changed>>,
    /// Per object stripe: a change holds it shared from its admission to its note, a seal
    /// and the start of a watch alone.
    stripes: Vec<RwLock<()>>,
}

impl Moves {
    /// The moves of the target at `root`, with the seals of objects moved before.
    pub fn open(root: &Path) -> io::Result<Moves> {
        let dir = root.join("moved");
        std::fs::create_dir_all(&dir)?;
        let mut sealed = HashSet::new();
        for entry in std::fs::read_dir(&dir)? {
            let name = entry?.file_name();
            match name.to_str().and_then(parse_marker) {
                Some(object) => {
                    sealed.insert(object);
                }
                None => tracing::warn!(
                    name = %name.to_string_lossy(),
                    dir = %dir.display(),
                    "a file that is no seal marker among the seal markers: left alone"
                ),
            }
        }
        Ok(Moves {
            dir,
            marked: AtomicUsize::new(sealed.len()),
            sealed: RwLock::new(sealed),
            watches: Mutex::default(),
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        })
    }

    /// Held by a change of `object` from its admission until its note is made.
    pub fn changing(&self, object: ObjectId) -> RwLockReadGuard<'_, ()> {
        self.stripe(object).read().expect("seal lock poisoned")
    }

    fn stripe(&self, object: ObjectId) -> &RwLock<()> {
        &self.stripes[(object.inode.0 % STRIPES) as usize]
    }

    /// Whether `object` is sealed: it moved away, or is making its last move.
    pub fn is_sealed(&self, object: ObjectId) -> bool {
        self.marked.load(Ordering::Acquire) > 0
            && self
                .sealed
                .read()
                .expect("seals poisoned")
                .contains(&object)
    }

    /// Notes that `[offset, offset + len)` of `object` changed, if it is watched. Called
    /// under [`Moves::changing`].
    pub fn note(&self, object: ObjectId, offset: u64, len: u64) {
        if self.marked.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut watches = self.watches.lock().expect("watches poisoned");
        let Some(Changed::Ranges(ranges)) = watches.get_mut(&object) else {
            return;
        };
        ranges.push((offset, len));
        if ranges.len() > RANGES_MAX {
            let start = ranges.iter().map(|r| r.0).min().unwrap_or(0);
            let end = ranges.iter().map(|r| r.0 + r.1).max().unwrap_or(0);
            *ranges = vec![(start, end - start)];
        }
    }

    /// Notes that `object` was cut, if it is watched: the next round copies it all again.
    /// Called under [`Moves::changing`].
    pub fn note_cut(&self, object: ObjectId) {
        if self.marked.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(changed) = self
            .watches
            .lock()
            .expect("watches poisoned")
            .get_mut(&object)
        {
            *changed = Changed::Whole;
        }
    }

    /// What changed of `object` since the last call, and from now on nothing: a new watch
    /// (none ran, or it was lost with a restart) answers [`Changed::Whole`]. With `seal`,
    /// the object is sealed first, durably, and its watch ends.
    pub fn take(&self, object: ObjectId, seal: bool) -> io::Result<Changed> {
        // Alone on the stripe: every change admitted before is noted, none after slips by.
        let _alone = self.stripe(object).write().expect("seal lock poisoned");
        if seal && !self.is_sealed(object) {
            let marker = self.dir.join(marker_name(object));
            std::fs::File::create(&marker)?.sync_all()?;
            weft_service::durable::sync_directory(&self.dir)?;
            self.sealed.write().expect("seals poisoned").insert(object);
            self.marked.fetch_add(1, Ordering::AcqRel);
        }
        let mut watches = self.watches.lock().expect("watches poisoned");
        let changed = if seal {
            let changed = watches.remove(&object);
            if changed.is_some() {
                self.marked.fetch_sub(1, Ordering::AcqRel);
            }
            changed
        } else {
            let changed = watches.insert(object, Changed::Ranges(Vec::new()));
            if changed.is_none() {
                self.marked.fetch_add(1, Ordering::AcqRel);
            }
            changed
        };
        Ok(changed.unwrap_or(Changed::Whole))
    }

    /// Forgets `object`'s seal and watch: its file was removed.
    pub fn forget(&self, object: ObjectId) -> io::Result<()> {
        let _alone = self.stripe(object).write().expect("seal lock poisoned");
        if self
            .watches
            .lock()
            .expect("watches poisoned")
            .remove(&object)
            .is_some()
        {
            self.marked.fetch_sub(1, Ordering::AcqRel);
        }
        if !self.sealed.write().expect("seals poisoned").remove(&object) {
            return Ok(());
        }
        self.marked.fetch_sub(1, Ordering::AcqRel);
        match std::fs::remove_file(self.dir.join(marker_name(object))) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => weft_service::durable::sync_directory(&self.dir),
        }
    }
}

/// Merges ranges into disjoint ones in offset order.
pub(crate) fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (offset, len) in ranges {
        let end = offset.saturating_add(len);
        match out.last_mut() {
            Some((start, span)) if offset <= *start + *span => {
                *span = (*span).max(end - *start);
            }
            _ => out.push((offset, len)),
        }
    }
    out
}

fn marker_name(object: ObjectId) -> String {
    let space = match object.space {
        Space::Plain => "plain",
        Space::Mirrored => "mirrored",
    };
    format!("{space}-{:016x}", object.inode.0)
}

fn parse_marker(name: &str) -> Option<ObjectId> {
    let (space, inode) = name.split_once('-')?;
    let space = match space {
        "plain" => Space::Plain,
        "mirrored" => Space::Mirrored,
        _ => return None,
    };
    let inode = u64::from_str_radix(inode, 16).ok()?;
    Some(ObjectId::new(space, InodeId(inode)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: ranges noted in any order come out disjoint and in order, touching ones joined.
    #[test]
    fn ranges_merge_in_order() {
        assert_eq!(
            merged(vec![(10, 5), (0, 4), (4, 2), (12, 10), (40, 1)]),
            vec![(0, 6), (10, 12), (40, 1)]
        );
        assert_eq!(merged(Vec::new()), Vec::new());
    }

    // Goal: a watch sees every change after it started, a seal survives a reopen, and a
    // watch does not.
    #[test]
    fn seals_last_and_watches_do_not() {
        let dir = tempfile::tempdir().expect("dir");
        let object = ObjectId::new(Space::Plain, InodeId(0x2a));
        let moves = Moves::open(dir.path()).expect("open");
        moves.note(object, 0, 10);
        assert_eq!(moves.take(object, false).expect("take"), Changed::Whole);
        moves.note(object, 100, 10);
        moves.note(object, 5, 1);
        assert_eq!(
            moves.take(object, false).expect("take"),
            Changed::Ranges(vec![(100, 10), (5, 1)])
        );
        moves.note_cut(object);
        assert_eq!(moves.take(object, false).expect("take"), Changed::Whole);
        assert!(!moves.is_sealed(object));
        assert_eq!(
            moves.take(object, true).expect("seal"),
            Changed::Ranges(Vec::new())
        );
        assert!(moves.is_sealed(object));
        drop(moves);
        let moves = Moves::open(dir.path()).expect("reopen");
        assert!(moves.is_sealed(object));
        assert_eq!(moves.take(object, true).expect("seal"), Changed::Whole);
        moves.forget(object).expect("forget");
        assert!(!moves.is_sealed(object));
        let moves = Moves::open(dir.path()).expect("reopen");
        assert!(!moves.is_sealed(object));
    }
}
