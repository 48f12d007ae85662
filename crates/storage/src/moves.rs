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
//! after the last round looked at the notes. The watches are the shared machine of
//! [`weft_mirror::watch`]; they live in memory only: a restart loses them, and the next round
//! copies the whole object again onto a fresh copy.

use crate::objects::{ObjectId, Space};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard};
pub(crate) use weft_mirror::watch::Watched;
use weft_mirror::watch::Watches;
use weft_proto::ids::InodeId;

/// Lock stripes of the seal locks.
const STRIPES: u64 = 64;

/// What a seal records (in its marker file): the verifier a sync of the object answers from
/// then on, and for a mirrored object the storage mirror group it moved off. A target is in
/// one group at a time, so a seal of another group than the one a request comes through is
/// of a group that was removed since ([`Moves::forget_stale`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealMark {
    pub verifier: u64,
    pub group: Option<u32>,
}

impl SealMark {
    fn encode(self) -> Vec<u8> {
        let mut bytes = self.verifier.to_le_bytes().to_vec();
        if let Some(group) = self.group {
            bytes.extend_from_slice(&group.to_le_bytes());
        }
        bytes
    }

    /// A marker's bytes; a marker written before seals named groups has the verifier alone.
    fn decode(bytes: &[u8]) -> SealMark {
        let verifier = bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        let group = bytes
            .get(8..12)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes);
        SealMark { verifier, group }
    }
}

/// The objects of one target that moved (or are moving) away, and the watches of those
/// being copied.
pub(crate) struct Moves {
    /// `<target>/moved`: one empty file per sealed object.
    dir: PathBuf,
    /// Per sealed object, its mark: the verifier this server answered its writes with when it
    /// was sealed (a sync of it answers that one, so a client's fsync after the move tells a
    /// write lost before the copy, this server restarted before the seal, from none), and the
    /// group a mirrored object moved off.
    sealed: RwLock<HashMap<ObjectId, SealMark>>,
    /// How many objects are sealed or watched: a change of an object of a target with none
    /// looks no further.
    marked: AtomicUsize,
    watches: Mutex<Watches<ObjectId>>,
    /// Per object stripe: a change holds it shared from its admission to its note, a seal
    /// and the start of a watch alone.
    stripes: Vec<RwLock<()>>,
}

impl Moves {
    /// The moves of the target at `root`, with the seals of objects moved before.
    pub fn open(root: &Path) -> io::Result<Moves> {
        let dir = root.join("moved");
        std::fs::create_dir_all(&dir)?;
        let mut sealed = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            match name.to_str().and_then(parse_marker) {
                Some(object) => {
                    let bytes = std::fs::read(entry.path())?;
                    sealed.insert(object, SealMark::decode(&bytes));
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
                .contains_key(&object)
    }

    /// The verifier a sealed object's writes were answered with when it was sealed.
    pub fn sealed_verifier(&self, object: ObjectId) -> Option<u64> {
        if self.marked.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.sealed
            .read()
            .expect("seals poisoned")
            .get(&object)
            .map(|mark| mark.verifier)
    }

    /// Forgets the seal of `object` if it is of another storage mirror group than `group`,
    /// through which a request for it came, and that group was `removed`: this target is a
    /// member of a new one, where the file may live again. A seal of a group that still
    /// exists stays whatever a request names. Answers whether it did.
    pub fn forget_stale(
        &self,
        object: ObjectId,
        group: u32,
        removed: impl Fn(u32) -> bool,
    ) -> io::Result<bool> {
        let stale = self.marked.load(Ordering::Acquire) > 0
            && self
                .sealed
                .read()
                .expect("seals poisoned")
                .get(&object)
                .is_some_and(|mark| {
                    mark.group
                        .is_some_and(|sealed| sealed != group && removed(sealed))
                });
        if stale {
            self.forget(object)?;
        }
        Ok(stale)
    }

    /// Notes that `[offset, offset + len)` of `object` changed, if it is watched. Called
    /// under [`Moves::changing`].
    pub fn note(&self, object: ObjectId, offset: u64, len: u64) {
        if self.marked.load(Ordering::Acquire) == 0 {
            return;
        }
        self.watches().note(object, offset, len);
    }

    /// Notes that `object` was cut, if it is watched: the next round copies it all again.
    /// Called under [`Moves::changing`].
    pub fn note_cut(&self, object: ObjectId) {
        if self.marked.load(Ordering::Acquire) == 0 {
            return;
        }
        self.watches().note_cut(object);
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, Watches<ObjectId>> {
        self.watches.lock().expect("watches poisoned")
    }

    /// What changed of `object` since the last round of move `id` that completed
    /// ([`Moves::ack`]), and the verifier its copy's server answered then: a watch of another
    /// move, or none (lost with a restart), answers [`Changed::Whole`]. What it answers stays
    /// owed until acknowledged, so a round that fails is made again in full by the next.
    /// With `seal` (the verifier this server answers writes with now), the object is sealed
    /// first, durably, and its watch ends.
    pub fn take(&self, object: ObjectId, id: u64, seal: Option<SealMark>) -> io::Result<Watched> {
        // Alone on the stripe: every change admitted before is noted, none after slips by.
        let _alone = self.stripe(object).write().expect("seal lock poisoned");
        if let Some(mark) = seal {
            self.seal_alone(object, mark)?;
        }
        let mut watches = self.watches();
        let before = watches.len();
        let taken = watches.take(object, id, seal.is_some());
        // A watch started (a first round) or ended (the last); changes of this object wait
        // on the stripe meanwhile, and look at the count after.
        match watches.len().cmp(&before) {
            std::cmp::Ordering::Greater => self.marked.fetch_add(1, Ordering::AcqRel),
            std::cmp::Ordering::Less => self.marked.fetch_sub(1, Ordering::AcqRel),
            std::cmp::Ordering::Equal => 0,
        };
        Ok(taken)
    }

    /// Seals `object` with `mark`, durably, unless it is sealed already. A mirror member's
    /// object is sealed so, at its primary's word: it has no watch, since only a primary
    /// copies.
    pub fn seal(&self, object: ObjectId, mark: SealMark) -> io::Result<()> {
        let _alone = self.stripe(object).write().expect("seal lock poisoned");
        self.seal_alone(object, mark)
    }

    /// [`Moves::seal`], alone on the object's stripe already.
    fn seal_alone(&self, object: ObjectId, mark: SealMark) -> io::Result<()> {
        if self.is_sealed(object) {
            return Ok(());
        }
        let marker = self.dir.join(marker_name(object));
        let mut file = std::fs::File::create(&marker)?;
        std::io::Write::write_all(&mut file, &mark.encode())?;
        file.sync_all()?;
        weft_service::durable::sync_directory(&self.dir)?;
        self.sealed
            .write()
            .expect("seals poisoned")
            .insert(object, mark);
        self.marked.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The mirrored objects sealed here as they moved off storage mirror group `group`
    /// (whether or not their data is dropped yet).
    pub fn sealed_off(&self, group: u32) -> Vec<InodeId> {
        let mut sealed: Vec<InodeId> = self
            .sealed
            .read()
            .expect("seals poisoned")
            .iter()
            .filter(|(object, mark)| {
                object.space == Space::Mirrored && mark.group.is_none_or(|g| g == group)
            })
            .map(|(object, _)| object.inode)
            .collect();
        sealed.sort_unstable();
        sealed
    }

    /// Whether the mirrored `object` is sealed as it moved off storage mirror group `group`.
    pub fn is_sealed_off(&self, object: ObjectId, group: u32) -> bool {
        self.marked.load(Ordering::Acquire) > 0
            && self
                .sealed
                .read()
                .expect("seals poisoned")
                .get(&object)
                .is_some_and(|mark| mark.group.is_none_or(|g| g == group))
    }

    /// Settles a round of move `id` that copied all it was owed, with the verifier the
    /// copy's server answered (its copy is lost if it answers another later).
    pub fn ack(&self, object: ObjectId, id: u64, verifier: Option<u64>) {
        self.watches().ack(object, id, verifier);
    }

    /// Makes the next round of move `id` copy the whole object again onto a fresh copy.
    pub fn restart(&self, object: ObjectId, id: u64) {
        self.watches().restart(object, id);
    }

    /// Forgets `object`'s seal and watch: its file was removed.
    pub fn forget(&self, object: ObjectId) -> io::Result<()> {
        let _alone = self.stripe(object).write().expect("seal lock poisoned");
        if self.watches().forget(object) {
            self.marked.fetch_sub(1, Ordering::AcqRel);
        }
        if self
            .sealed
            .write()
            .expect("seals poisoned")
            .remove(&object)
            .is_none()
        {
            return Ok(());
        }
        self.marked.fetch_sub(1, Ordering::AcqRel);
        match std::fs::remove_file(self.dir.join(marker_name(object))) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => weft_service::durable::sync_directory(&self.dir),
        }
    }
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
    use weft_mirror::watch::Changed;

    // Goal: a watch sees every change after it started, owes what a round took until the
    // round is acknowledged, starts over for another move, a seal survives a reopen, and a
    // watch does not.
    #[test]
    fn seals_last_and_watches_do_not() {
        let dir = tempfile::tempdir().expect("dir");
        let object = ObjectId::new(Space::Plain, InodeId(0x2a));
        let moves = Moves::open(dir.path()).expect("open");
        let take = |id, seal: bool| {
            moves
                .take(
                    object,
                    id,
                    seal.then_some(SealMark {
                        verifier: 9,
                        group: None,
                    }),
                )
                .expect("take")
                .changed
        };
        moves.note(object, 0, 10);
        assert_eq!(take(1, false), Changed::Whole);
        // Not acknowledged: owed again, with what came since.
        moves.note(object, 100, 10);
        assert_eq!(take(1, false), Changed::Whole);
        moves.ack(object, 1, Some(7));
        moves.note(object, 100, 10);
        moves.note(object, 5, 1);
        assert_eq!(take(1, false), Changed::Ranges(vec![(100, 10), (5, 1)]));
        moves.note(object, 50, 1);
        assert_eq!(
            take(1, false),
            Changed::Ranges(vec![(100, 10), (5, 1), (50, 1)]),
            "a round that failed is owed again"
        );
        moves.ack(object, 1, None);
        assert_eq!(moves.take(object, 1, None).expect("take").verifier, Some(7));
        moves.ack(object, 1, None);
        moves.note_cut(object);
        assert_eq!(take(1, false), Changed::Whole);
        moves.ack(object, 1, None);
        assert_eq!(take(2, false), Changed::Whole, "another move starts over");
        moves.ack(object, 2, None);
        assert!(!moves.is_sealed(object));
        assert_eq!(take(2, true), Changed::Ranges(Vec::new()));
        assert!(moves.is_sealed(object));
        drop(moves);
        let moves = Moves::open(dir.path()).expect("reopen");
        assert!(moves.is_sealed(object));
        assert_eq!(
            moves.sealed_verifier(object),
            Some(9),
            "kept across a reopen"
        );
        assert_eq!(
            moves
                .take(
                    object,
                    2,
                    Some(SealMark {
                        verifier: 10,
                        group: None
                    })
                )
                .expect("seal")
                .changed,
            Changed::Whole
        );
        assert_eq!(moves.sealed_verifier(object), Some(9), "sealed once");
        moves.forget(object).expect("forget");
        assert!(!moves.is_sealed(object));
        let moves = Moves::open(dir.path()).expect("reopen");
        assert!(!moves.is_sealed(object));
    }
}
