//! One storage target: an object store (`crate::objects`) and what a target adds over it —
//! capacity accounting, poisoning after a failed fsync, and the admission of reads and
//! changes by the truncate generation of their file.
//!
//! Commit order of a write: the bytes go to the object with pwrite (into the page cache, or
//! straight to the disk for a large aligned write) and the write is acknowledged; they reach
//! stable media at the next Sync of that object (fdatasync). A crash before the Sync may lose
//! them — which is what `fsync` on the client promises against.

use bytes::Bytes;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::moves::Moves;
use crate::objects::{ObjectError, ObjectId, ObjectStore, Space, StoreKind};
use weft_proto::ids::{InodeId, NodeId, TargetId};
use weft_proto::messages::{FallocateMode, SpaceUsage};

/// Lock stripes of the truncate locks.
const CUT_STRIPES: u64 = 64;

pub(crate) struct Target {
    pub id: TargetId,
    store: Box<dyn ObjectStore>,
    used_bytes: AtomicU64,
    capacity_bytes: Option<u64>,
    poisoned: AtomicBool,
    /// Per object stripe: a truncate, and a write that records a newer truncate generation
    /// on an empty object, take it alone, so neither slips between the other's check and
    /// its change.
    cuts: Vec<Mutex<()>>,
    /// Per object stripe, on a target with a capacity: a change that may grow an object reads
    /// its length, checks the growth against the capacity and counts it under it, so
    /// concurrent writes to one object (a client writes a file's chunks in parallel) count
    /// each new byte once.
    growths: Vec<Mutex<()>>,
    /// Objects moving or moved off this target (see `crate::moves`).
    moves: Moves,
}

impl Target {
    pub fn open(
        id: TargetId,
        root: &Path,
        capacity_bytes: Option<u64>,
        kind: StoreKind,
    ) -> std::io::Result<Target> {
        let (store, used) = crate::objects::open(root, kind)?;
        let moves = Moves::open(root)?;
        Ok(Target {
            moves,
            id,
            store,
            used_bytes: AtomicU64::new(used),
            capacity_bytes,
            poisoned: AtomicBool::new(false),
            cuts: (0..CUT_STRIPES).map(|_| Mutex::new(())).collect(),
            growths: (0..CUT_STRIPES).map(|_| Mutex::new(())).collect(),
        })
    }

    /// The target's directory.
    pub fn root(&self) -> &Path {
        self.store.tree().root()
    }

    /// Whether the target reads and writes with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.store.is_direct()
    }

    /// Whether the object's file is held open, so a request on it opens nothing.
    pub fn is_open(&self, object: ObjectId) -> bool {
        self.store.is_open(object)
    }

    /// Whether the object exists (on disk, or only in the crash-test journal).
    pub fn exists(&self, object: ObjectId) -> bool {
        self.store.exists(object)
    }

    /// The object's length as readers see it.
    pub fn length(&self, object: ObjectId) -> Result<u64, ObjectError> {
        self.store.length(object)
    }

    fn check_writable(&self) -> Result<(), ObjectError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(ObjectError::Poisoned { target: self.id });
        }
        Ok(())
    }

    /// Poisons the target when `result` is a sync that failed with EIO: the page cache may
    /// have dropped the dirty pages, so retrying could report success for lost data.
    fn poison_on<T>(&self, result: Result<T, ObjectError>) -> Result<T, ObjectError> {
        if let Err(error) = &result {
            if error.is_eio_sync() {
                self.poisoned.store(true, Ordering::Release);
                tracing::error!(
                    target = self.id.0,
                    error = %weft_proto::error::error_chain(error),
                    "fsync failed with EIO: target poisoned until restart"
                );
            }
        }
        result
    }

    fn reserve(&self, growth: u64) -> Result<(), ObjectError> {
        if let Some(capacity) = self.capacity_bytes {
            let used = self.used_bytes.load(Ordering::Acquire);
            if used.saturating_add(growth) > capacity {
                return Err(ObjectError::NoSpace {
                    target: self.id,
                    used,
                    capacity,
                });
            }
        }
        Ok(())
    }

    fn release(&self, freed: u64) {
        self.used_bytes.fetch_sub(
            freed.min(self.used_bytes.load(Ordering::Acquire)),
            Ordering::AcqRel,
        );
    }

    /// The object's length and the CRC32C of the bytes of `[offset, offset + len)` before it,
    /// holes read as zeros: a copy of an object compared with another member's copy.
    pub fn checksum(
        &self,
        object: ObjectId,
        (offset, len): (u64, u64),
    ) -> Result<(u64, u32), ObjectError> {
        const PIECE: u64 = 1 << 20;
        let length = self.length(object)?;
        let end = offset.saturating_add(len).min(length);
        let mut crc = weft_proto::checksum::Crc32c::new();
        let mut at = offset;
        while at < end {
            let piece = self.read(object, at, (end - at).min(PIECE) as u32)?;
            if piece.is_empty() {
                break;
            }
            crc.update(&piece);
            at += piece.len() as u64;
        }
        Ok((length, crc.value()))
    }

    /// Writes `data` at `offset` of the object, as a writer in truncate `generation` of its
    /// file (see [`Target::admit_change`]).
    pub fn write(
        &self,
        object: ObjectId,
        offset: u64,
        data: Bytes,
        generation: u64,
    ) -> Result<u32, ObjectError> {
        self.write_admitted(object, offset, data, || {
            self.admit_change(object, generation)
        })
    }

    /// [`Target::write`] of a push's copy (a move's bytes sent from the object's old target):
    /// refused with `StaleCopy` if the object had a truncate of a later generation than the
    /// copy's. A move cuts its copies only after the pushes of the generation before ended
    /// on their old targets, so such a copy is one a failed push round sent and the network
    /// delivered late; written, it would put back bytes past the cut.
    pub fn write_pushed(
        &self,
        object: ObjectId,
        offset: u64,
        data: Bytes,
        generation: u64,
    ) -> Result<u32, ObjectError> {
        self.write_admitted(object, offset, data, || {
            self.refuse_moved(object)?;
            let cut = self.cut_lock(object);
            let recorded = self.generation(object)?;
            if generation < recorded {
                return Err(ObjectError::StaleCopy {
                    inode: object.inode,
                    target: self.id,
                    generation,
                    recorded,
                });
            }
            if generation > recorded {
                self.admit_recorded(object, generation, recorded)?;
                self.store.record_generation(object, generation)?;
            }
            Ok(Some(cut))
        })
    }

    /// Writes `data` at `offset` of `object` once `admit` let the change in (the guard it
    /// answers is held until the write is done).
    fn write_admitted<'a>(
        &'a self,
        object: ObjectId,
        offset: u64,
        data: Bytes,
        admit: impl FnOnce() -> Result<Option<MutexGuard<'a, ()>>, ObjectError>,
    ) -> Result<u32, ObjectError> {
        self.check_writable()?;
        let _changing = self.moves.changing(object);
        let _cut = admit()?;
        let len = u32::try_from(data.len()).map_err(|_| ObjectError::Invalid("write too large"))?;
        let end = offset
            .checked_add(u64::from(len))
            .ok_or(ObjectError::Invalid("offset overflows"))?;
        self.growing(object, end, || self.store.write(object, offset, data))?;
        self.moves.note(object, offset, u64::from(len));
        Ok(len)
    }

    /// Runs `change`, which may extend the object to `end`,
    /// refused with `NoSpace` if the growth does not fit the target's capacity, and counts
    /// the growth once it is made. On a target with a capacity, one change per object stripe
    /// at a time: the length read is the one the change extends.
    fn growing<T>(
        &self,
        object: ObjectId,
        end: u64,
        change: impl FnOnce() -> Result<T, ObjectError>,
    ) -> Result<T, ObjectError> {
        let _growing = self.capacity_bytes.map(|_| {
            self.growths[(object.inode.0 % CUT_STRIPES) as usize]
                .lock()
                .expect("growth lock poisoned")
        });
        let length = self.length(object)?;
        let growth = end.saturating_sub(length);
        self.reserve(growth)?;
        let done = change()?;
        self.used_bytes.fetch_add(growth, Ordering::AcqRel);
        Ok(done)
    }

    /// A client's read of truncate `generation` ([`Target::admit`], then [`Target::read`]),
    /// under the seal lock: a read admitted before the object is sealed ends before its data
    /// can be dropped.
    pub fn read_admitted(
        &self,
        object: ObjectId,
        generation: u64,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, ObjectError> {
        let _reading = self.moves.changing(object);
        self.admit(object, generation)?;
        self.read(object, offset, len)
    }

    /// Up to `len` bytes at `offset`, short at the object's end, holes as zeros.
    pub fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, ObjectError> {
        self.store.read(object, offset, len)
    }

    /// Reads like [`Target::read`] if the read cannot wait for the disk (the object's file is
    /// held open and the page cache holds every byte asked for); `None` when it could, and
    /// the caller reads the usual way. Also `None` when the object has not had truncate
    /// `generation`: the usual way checks it ([`Target::admit`]).
    pub fn read_cached(
        &self,
        object: ObjectId,
        offset: u64,
        len: u32,
        generation: u64,
    ) -> Option<Bytes> {
        // Under the seal lock, so the object cannot be sealed and its data dropped between
        // the look and the read.
        let _reading = self.moves.changing(object);
        if self.moves.is_sealed(object) {
            return None;
        }
        self.store.read_cached(object, offset, len, generation)
    }

    /// Cuts the object to `length` for truncate `generation` of its file, if it is longer
    /// (never extends it: holes read as zeros), and only if the object has not had that
    /// truncate or a newer one, so a late or re-sent truncate never cuts what was written
    /// after it. The object then records the generation, synced with the cut before the
    /// answer. A missing object stays missing: its first write records the generation it
    /// was written in.
    pub fn truncate(
        &self,
        object: ObjectId,
        length: u64,
        generation: u64,
    ) -> Result<(), ObjectError> {
        self.check_writable()?;
        let _changing = self.moves.changing(object);
        self.refuse_moved(object)?;
        let _cut = self.cut_lock(object);
        if generation <= self.generation(object)? || !self.exists(object) {
            return Ok(());
        }
        let before = self.poison_on(self.store.cut(object, length, generation))?;
        self.release(before.saturating_sub(length));
        self.moves.note_cut(object);
        Ok(())
    }

    /// The lock a truncate of `object` holds, and a change that records a newer generation.
    fn cut_lock(&self, object: ObjectId) -> MutexGuard<'_, ()> {
        self.cuts[(object.inode.0 % CUT_STRIPES) as usize]
            .lock()
            .expect("cut lock poisoned")
    }

    /// The newest truncate generation of its file the object has had (0: none, or no
    /// object), including one only in the crash-test journal.
    pub fn generation(&self, object: ObjectId) -> Result<u64, ObjectError> {
        self.store.generation(object)
    }

    /// Refuses a read or change of truncate `generation` while the object still holds data
    /// from before a truncate of that generation it has not had (its target was away when
    /// the truncate was made): the caller has the metadata server apply it and asks again.
    pub fn admit(&self, object: ObjectId, generation: u64) -> Result<(), ObjectError> {
        self.refuse_moved(object)?;
        let recorded = self.generation(object)?;
        self.admit_recorded(object, generation, recorded)
    }

    /// [`Target::admit`] for an object known to record generation `recorded`.
    fn admit_recorded(
        &self,
        object: ObjectId,
        generation: u64,
        recorded: u64,
    ) -> Result<(), ObjectError> {
        if generation > recorded && self.length(object)? > 0 {
            return Err(ObjectError::TruncatePending {
                inode: object.inode,
                target: self.id,
                generation,
            });
        }
        Ok(())
    }

    /// Admits a change of truncate `generation` ([`Target::admit`]); on an empty object of
    /// an older generation, records the newer one first, under the cut lock, so a truncate
    /// of that generation arriving later cuts nothing the change wrote. The guard, when
    /// taken, is held until the change is done.
    fn admit_change(
        &self,
        object: ObjectId,
        generation: u64,
    ) -> Result<Option<MutexGuard<'_, ()>>, ObjectError> {
        self.refuse_moved(object)?;
        if generation <= self.generation(object)? {
            return Ok(None);
        }
        let cut = self.cut_lock(object);
        let recorded = self.generation(object)?;
        if generation <= recorded {
            return Ok(Some(cut));
        }
        self.admit_recorded(object, generation, recorded)?;
        self.store.record_generation(object, generation)?;
        Ok(Some(cut))
    }

    /// Allocates or zeroes `[offset, offset + len)` of an object, never changing its length.
    pub fn fallocate(
        &self,
        object: ObjectId,
        (offset, len): (u64, u64),
        mode: FallocateMode,
        generation: u64,
    ) -> Result<(), ObjectError> {
        self.check_writable()?;
        let _changing = self.moves.changing(object);
        let _cut = self.admit_change(object, generation)?;
        let end = offset
            .checked_add(len)
            .ok_or(ObjectError::Invalid("range overflows"))?;
        let length = self.length(object)?;
        match mode {
            // Space is counted by object length, which an allocation keeps: it is only
            // checked to fit.
            FallocateMode::Allocate => self.reserve(end.saturating_sub(length))?,
            FallocateMode::Zero if offset >= length => return Ok(()),
            FallocateMode::Zero => {}
        }
        self.store.fallocate(object, (offset, len), mode, length)?;
        self.moves.note(object, offset, len);
        Ok(())
    }

    /// The objects of `home`'s inodes after object `after`, in object order, at most `max`;
    /// true when nothing follows. Objects only in the crash-test journal are included.
    pub fn list_objects(
        &self,
        space: Space,
        home: Option<NodeId>,
        after: u64,
        max: u32,
    ) -> Result<(Vec<(InodeId, u64)>, bool), ObjectError> {
        let mut objects: Vec<InodeId> = self
            .store
            .list(space)?
            .into_iter()
            .filter(|i| home.is_none_or(|home| i.home() == home) && i.0 > after)
            .collect();
        objects.sort_unstable();
        objects.dedup();
        let end = objects.len() <= max as usize;
        objects.truncate(max as usize);
        let listed = objects
            .into_iter()
            .map(|inode| Ok((inode, self.length(ObjectId::new(space, inode))?)))
            .collect::<Result<_, ObjectError>>()?;
        Ok((listed, end))
    }

    /// Removes the object, and its seal if it moved away: its file is gone.
    pub fn remove(&self, object: ObjectId) -> Result<(), ObjectError> {
        self.drop_data(object)?;
        self.moves
            .forget(object)
            .map_err(self.seals_failed("forget the seal of a removed object in"))
    }

    /// Removes the object's data, keeping its seal.
    fn drop_data(&self, object: ObjectId) -> Result<(), ObjectError> {
        let length = self.length(object)?;
        self.store.remove(object)?;
        self.release(length);
        Ok(())
    }

    /// Forgets the seal of the mirrored object of `inode` if it is of another group than
    /// `group`, one that was `removed` (see [`crate::moves::Moves::forget_stale`]).
    pub fn forget_stale_seal(
        &self,
        inode: weft_proto::ids::InodeId,
        group: u32,
        removed: impl Fn(u32) -> bool,
    ) -> Result<(), ObjectError> {
        let object = ObjectId::new(crate::objects::Space::Mirrored, inode);
        match self.moves.forget_stale(object, group, removed) {
            Ok(true) => {
                tracing::info!(%inode, target = %self.id, group, "a seal of a removed mirror group forgotten: the file may live in this target's new group");
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(source) => Err(self.seals_failed("forget a stale seal in")(source)),
        }
    }

    /// Forgets the seal of the mirrored object of `inode` on this member target, at a change
    /// of it that the group's primary forwarded. The primary admits a change only of an
    /// object it holds unsealed, under the object's whole range, which a seal takes too and
    /// keeps until every present member is sealed: a seal here that the primary does not hold
    /// is one whose removal (with the file's tombstones) this member missed while it was
    /// away, and the file lives in the group again. Refused as moved, the change would be
    /// sent again forever while the resync that removes the seal waits for its range.
    pub fn forget_seal_the_primary_lacks(
        &self,
        inode: weft_proto::ids::InodeId,
    ) -> Result<(), ObjectError> {
        let object = ObjectId::new(crate::objects::Space::Mirrored, inode);
        if !self.moves.is_sealed(object) {
            return Ok(());
        }
        self.moves
            .forget(object)
            .map_err(self.seals_failed("forget a seal its primary lacks in"))?;
        tracing::info!(%inode, target = %self.id, "a seal whose removal this member missed forgotten: its primary changes the file here again");
        Ok(())
    }

    /// The error of a failed change of this target's seal markers (`<target>/moved`).
    fn seals_failed(&self, what: &'static str) -> impl FnOnce(std::io::Error) -> ObjectError + '_ {
        move |source| ObjectError::Io {
            what,
            path: self.root().join("moved"),
            source,
        }
    }

    /// Refuses a request for an object that moved away.
    pub(crate) fn refuse_moved(&self, object: ObjectId) -> Result<(), ObjectError> {
        if self.moves.is_sealed(object) {
            return Err(ObjectError::Moved {
                inode: object.inode,
                target: self.id,
            });
        }
        Ok(())
    }

    /// A push's look at the object it moves for move `id`: whether it is gone already
    /// (sealed, its data dropped by an earlier last push), else what to copy (sealing it
    /// first with `seal`, the verifier of this server's writes now, see [`Moves::take`]), its
    /// length and its truncate generation.
    pub fn take_changes(
        &self,
        object: ObjectId,
        id: u64,
        seal: Option<crate::moves::SealMark>,
    ) -> Result<Taken, ObjectError> {
        if self.moves.is_sealed(object) && !self.exists(object) {
            return Ok(Taken::Gone);
        }
        let watched = self
            .moves
            .take(object, id, seal)
            .map_err(self.seals_failed("seal an object moving off"))?;
        Ok(Taken::Changed {
            watched,
            length: self.length(object)?,
            generation: self.generation(object)?,
        })
    }

    /// The moves of this target's objects.
    pub fn moves(&self) -> &Moves {
        &self.moves
    }

    /// Drops the data of an object whose last push is done: it lives on another target now.
    pub fn retire(&self, object: ObjectId) -> Result<(), ObjectError> {
        debug_assert!(
            self.moves.is_sealed(object),
            "retiring an object not sealed"
        );
        self.drop_data(object)
    }

    /// Seals a mirror member's copy of an object that moved to another group, at its
    /// primary's word ([`weft_proto::messages::StorageRequest::Seal`]), and drops its data.
    /// Done again, it does nothing.
    pub fn seal_and_retire(
        &self,
        object: ObjectId,
        mark: crate::moves::SealMark,
    ) -> Result<(), ObjectError> {
        self.check_writable()?;
        self.moves
            .seal(object, mark)
            .map_err(self.seals_failed("seal an object that moved off"))?;
        if self.exists(object) {
            self.drop_data(object)?;
        }
        Ok(())
    }

    /// Makes the object's data durable. A failed fdatasync poisons the target.
    pub fn sync(&self, object: ObjectId) -> Result<(), ObjectError> {
        self.check_writable()?;
        self.poison_on(self.store.sync(object))
    }

    /// Makes everything on the target durable: every object's data, length, generation and
    /// directory entry (a resync's last step on a returning mirror member, which may hold
    /// changes it took before it left that no sync reached since). The crash-test journal's
    /// pending changes are applied and synced, then one `syncfs` covers the file system that
    /// holds the target. A failure poisons the target, as a failed fdatasync does.
    pub fn sync_everything(&self) -> Result<(), ObjectError> {
        self.check_writable()?;
        self.poison_on(self.store.sync_everything())
    }

    pub fn usage(&self) -> SpaceUsage {
        let mut usage = weft_service::usage::file_system_usage(self.root()).unwrap_or_default();
        if let Some(capacity) = self.capacity_bytes {
            let used = self.used_bytes.load(Ordering::Acquire);
            usage.total_bytes = capacity.min(usage.total_bytes.max(capacity));
            usage.free_bytes = capacity.saturating_sub(used).min(usage.free_bytes);
        }
        usage
    }
}

/// What a push finds of the object it moves ([`Target::take_changes`]).
pub(crate) enum Taken {
    /// Its last push is done: it lives on its new target.
    Gone,
    /// What to copy.
    Changed {
        /// What changed, and the copy's server's verifier at the last round that completed.
        watched: crate::moves::Watched,
        length: u64,
        generation: u64,
    },
}

#[cfg(test)]
impl Target {
    /// The object's file.
    pub fn object_path(&self, object: ObjectId) -> std::path::PathBuf {
        self.store.tree().object_path(object)
    }

    /// Directory syncs made for new entries.
    pub fn entry_syncs(&self) -> u64 {
        self.store.tree().entry_syncs()
    }

    /// Bytes the target counts as used.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Acquire)
    }
}

/// The refusal of a request for a target this server does not hold.
pub(crate) fn unknown(target: TargetId) -> weft_proto::error::WireError {
    weft_proto::error::WireError::new(
        weft_proto::ErrorCode::UnknownTarget,
        format!("this server does not hold target {target}"),
    )
}
