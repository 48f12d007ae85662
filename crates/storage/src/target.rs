//! One storage target: objects in a directory tree, capacity accounting, poisoning after a
//! failed fsync, and the crash-test journal that keeps unsynced writes in memory.
//!
//! Commit order of a write: the bytes go to the object with pwrite (into the page cache, or
//! straight to the disk for a large aligned write) and the write is acknowledged; they reach
//! stable media at the next Sync of that object (fdatasync). A crash before the Sync may lose
//! them — which is what `fsync` on the client promises against.

use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::recycle::{FreeFiles, Placed};
use weft_proto::error::WireError;
use weft_proto::ids::{InodeId, NodeId, TargetId};
use weft_proto::messages::{FallocateMode, SpaceUsage};
use weft_proto::ErrorCode;

/// Which of a target's two object trees an object lives in. A mirrored file's objects are
/// kept apart from plain files' objects, so that a mirror group's resync, which makes a
/// member's mirrored objects equal to its primary's, never touches an object of a plain file
/// that happens to live on a member target (`docs/design/replication.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Space {
    /// Objects of files striped over targets: `<target>/objects`.
    Plain,
    /// Objects of files striped over mirror groups: `<target>/mirrored`.
    Mirrored,
}

impl Space {
    /// The space a request's objects live in: mirrored when it was routed through a group.
    pub fn of(mirror: Option<weft_proto::messages::MirrorRoute>) -> Space {
        match mirror {
            Some(_) => Space::Mirrored,
            None => Space::Plain,
        }
    }

    /// The space of mirrored objects, or of plain ones.
    pub fn mirrored(mirrored: bool) -> Space {
        if mirrored {
            Space::Mirrored
        } else {
            Space::Plain
        }
    }

    fn directory(self) -> &'static str {
        match self {
            Space::Plain => "objects",
            Space::Mirrored => "mirrored",
        }
    }

    const ALL: [Space; 2] = [Space::Plain, Space::Mirrored];
}

/// One object of a target: a file's inode in one of the target's spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ObjectId {
    pub space: Space,
    pub inode: InodeId,
}

impl ObjectId {
    pub fn new(space: Space, inode: InodeId) -> ObjectId {
        ObjectId { space, inode }
    }

    /// The object of a plain file.
    #[cfg(test)]
    pub fn plain(inode: InodeId) -> ObjectId {
        ObjectId::new(Space::Plain, inode)
    }
}

/// An operation kept in memory until its object is synced (crash-test mode only).
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

pub(crate) struct Target {
    pub id: TargetId,
    root: PathBuf,
    used_bytes: AtomicU64,
    capacity_bytes: Option<u64>,
    poisoned: AtomicBool,
    /// Crash-test mode: unsynced operations per object, applied to disk at Sync.
    journal: Option<Mutex<HashMap<ObjectId, Vec<Pending>>>>,
    /// Direct I/O: per object stripe, aligned writes share the lock; read-modify-writes,
    /// truncates and fallocates take it alone (a cut or a punch between a write's read of
    /// its edge blocks and its write of them would be undone by the old bytes it writes).
    direct: Option<Vec<RwLock<()>>>,
    /// Open object files, so a request does not pay an open and a close (plain targets only).
    /// Removing an object takes it out under the same lock before the unlink.
    files: Option<Mutex<HashMap<ObjectId, Arc<ObjectFile>>>>,
    /// Writes at least this large and 4 KiB-aligned go to the disk with O_DIRECT (plain
    /// targets only).
    direct_write_min: Option<usize>,
    /// Emptied object files a new object reuses (plain targets only: only there does every
    /// request go through `files`, so a removal knows whether anyone still holds the file).
    free: Option<FreeFiles>,
    /// Per object stripe: a truncate, and a write that records a newer truncate generation
    /// on an empty object, take it alone, so neither slips between the other's check and
    /// its change.
    cuts: Vec<Mutex<()>>,
    /// Objects whose directory entry was made (created, or a pooled file renamed into place)
    /// since their directory was last synced: their next sync syncs the directory too, so a
    /// synced object never vanishes in a crash with its entry.
    new_entries: Mutex<HashSet<ObjectId>>,
    /// Directory syncs made for new entries.
    entry_syncs: AtomicU64,
    /// Objects whose recorded truncate generation changed since their last sync without a
    /// sync of its own (a first write recorded it): their next sync is a full fsync, which
    /// makes the record durable with the data.
    unsynced_generations: Mutex<HashSet<ObjectId>>,
}

/// An object file held open: the descriptor requests use, and one with O_DIRECT for large
/// aligned writes, opened on first need.
struct ObjectFile {
    file: File,
    direct: std::sync::OnceLock<File>,
    /// The truncate generation the object has had, as its file records it: read when a
    /// plain target's open-file table takes the file in, and kept up to date there. A file
    /// opened for one request (other modes) leaves it unread, and
    /// [`Target::generation`] asks the file itself.
    generation: AtomicU64,
}

impl ObjectFile {
    /// A file opened for one request.
    fn new(file: File) -> ObjectFile {
        ObjectFile {
            file,
            direct: std::sync::OnceLock::new(),
            generation: AtomicU64::new(0),
        }
    }

    /// A file for the open-file table, with its recorded truncate generation.
    fn held(file: File) -> Result<ObjectFile, WireError> {
        let generation =
            recorded_generation(&file).map_err(|e| io_error("read truncate generation", &e))?;
        let held = ObjectFile::new(file);
        held.generation.store(generation, Ordering::Release);
        Ok(held)
    }

    /// The object's O_DIRECT descriptor (the same inode as `file`).
    fn direct(&self) -> std::io::Result<&File> {
        if let Some(direct) = self.direct.get() {
            return Ok(direct);
        }
        let reopened = crate::direct::reopen(&self.file)?;
        Ok(self.direct.get_or_init(|| reopened))
    }
}

impl std::ops::Deref for ObjectFile {
    type Target = File;

    fn deref(&self) -> &File {
        &self.file
    }
}

/// Object files kept open per target; when the table is full it drops every file no request
/// is using.
const FILES_OPEN_MAX: usize = 1024;

/// Lock stripes of a direct-I/O target.
const DIRECT_STRIPES: u64 = 64;

fn io_error(context: &str, error: &std::io::Error) -> WireError {
    WireError::new(ErrorCode::from_io(error), format!("{context}: {error}"))
}

impl Target {
    /// The target's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the target reads and writes with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    pub fn open(
        id: TargetId,
        root: &Path,
        capacity_bytes: Option<u64>,
        (crash_test, direct_io): (bool, bool),
        direct_write_min_bytes: u64,
    ) -> std::io::Result<Target> {
        let mut used = 0;
        for space in Space::ALL {
            let objects = root.join(space.directory());
            fs::create_dir_all(&objects)?;
            flatten_object_dirs(&objects)?;
            for index in 0..=u8::MAX {
                match fs::create_dir(objects.join(format!("{index:02x}"))) {
                    Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                        return Err(error)
                    }
                    _ => {}
                }
            }
            used += directory_bytes(&objects)?;
        }
        if direct_io {
            crate::direct::probe(root)?;
        }
        probe_generation_records(root)?;
        let plain = !crash_test && !direct_io;
        Ok(Target {
            id,
            root: root.to_path_buf(),
            used_bytes: AtomicU64::new(used),
            capacity_bytes,
            poisoned: AtomicBool::new(false),
            journal: crash_test.then(Mutex::default),
            direct: direct_io.then(|| (0..DIRECT_STRIPES).map(|_| RwLock::new(())).collect()),
            files: plain.then(Mutex::default),
            direct_write_min: direct_write_min(root, direct_write_min_bytes, !plain),
            free: plain.then(|| FreeFiles::open(root)).transpose()?,
            cuts: (0..DIRECT_STRIPES).map(|_| Mutex::new(())).collect(),
            new_entries: Mutex::default(),
            entry_syncs: AtomicU64::new(0),
            unsynced_generations: Mutex::default(),
        })
    }

    /// `<root>/<space>/<aa>/<object>`: [`Space::directory`] names the space's tree and
    /// [`object_dir`] names `aa`.
    pub fn object_path(&self, object: ObjectId) -> PathBuf {
        self.root
            .join(object.space.directory())
            .join(object_dir(object.inode.0))
            .join(format!("{:016x}", object.inode.0))
    }

    fn check_writable(&self) -> Result<(), WireError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(WireError::new(
                ErrorCode::TargetPoisoned,
                format!(
                    "target {} refuses writes after an fsync failure; restart and check it",
                    self.id
                ),
            ));
        }
        Ok(())
    }

    fn reserve(&self, growth: u64) -> Result<(), WireError> {
        if let Some(capacity) = self.capacity_bytes {
            let used = self.used_bytes.load(Ordering::Acquire);
            if used.saturating_add(growth) > capacity {
                return Err(WireError::new(
                    ErrorCode::NoSpace,
                    format!(
                        "target {} is full ({used} of {capacity} bytes used)",
                        self.id
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The open object file of a plain target (`None`: the object does not exist and
    /// `create` is false).
    fn plain_file(
        &self,
        files: &Mutex<HashMap<ObjectId, Arc<ObjectFile>>>,
        object: ObjectId,
        create: bool,
    ) -> Result<Option<Arc<ObjectFile>>, WireError> {
        let mut open = files.lock().expect("open files poisoned");
        if let Some(file) = open.get(&object) {
            return Ok(Some(Arc::clone(file)));
        }
        let path = self.object_path(object);
        let file = match open_read_write(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                self.create_plain(object, &path)?
            }
            Err(error) => return Err(io_error("open object", &error)),
        };
        if open.len() >= FILES_OPEN_MAX {
            // A file a request holds stays, so a removal can tell it is in use.
            open.retain(|_, file| Arc::strong_count(file) > 1);
        }
        let file = Arc::new(ObjectFile::held(file)?);
        open.insert(object, Arc::clone(&file));
        Ok(Some(file))
    }

    /// Creates `object`'s missing object at `path` from a pooled file when the pool has one,
    /// else as a new file. Called under the open-file table's lock.
    fn create_plain(&self, object: ObjectId, path: &Path) -> Result<File, WireError> {
        if let Some(free) = &self.free {
            match free.place(path) {
                Ok(placed @ (Placed::Moved | Placed::Occupied)) => {
                    if matches!(placed, Placed::Moved) {
                        self.note_new_entry(object);
                    }
                    return open_read_write(path).map_err(|e| io_error("open object", &e));
                }
                Ok(Placed::Empty) => {}
                Err(error) => {
                    tracing::warn!(target = self.id.0, %error, "could not reuse a pooled object file");
                }
            }
        }
        self.open_creating(object, |path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        })
    }

    fn disk_length(&self, object: ObjectId) -> Result<u64, WireError> {
        if let Some(files) = &self.files {
            return match self.plain_file(files, object, false)? {
                Some(file) => Ok(file
                    .metadata()
                    .map_err(|e| io_error("stat object", &e))?
                    .len()),
                None => Ok(0),
            };
        }
        match fs::metadata(self.object_path(object)) {
            Ok(metadata) => Ok(metadata.len()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(io_error("stat object", &error)),
        }
    }

    /// Opens `object`'s object with `open` (which creates it), making its directory first if
    /// that is missing.
    fn open_creating(
        &self,
        object: ObjectId,
        open: impl Fn(&Path) -> std::io::Result<File>,
    ) -> Result<File, WireError> {
        let path = self.object_path(object);
        let existed = path.exists();
        let file = match open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let parent = path.parent().expect("object paths have a parent");
                fs::create_dir_all(parent).map_err(|e| io_error("create object directory", &e))?;
                open(&path).map_err(|e| io_error("create object", &e))?
            }
            Err(error) => return Err(io_error("open object", &error)),
        };
        if !existed {
            self.note_new_entry(object);
        }
        Ok(file)
    }

    fn note_new_entry(&self, object: ObjectId) {
        self.new_entries
            .lock()
            .expect("new entries poisoned")
            .insert(object);
    }

    /// Syncs the directory of `object` if its entry is new since the last such sync.
    fn sync_entry(&self, object: ObjectId) -> Result<(), WireError> {
        let new = self
            .new_entries
            .lock()
            .expect("new entries poisoned")
            .remove(&object);
        if !new {
            return Ok(());
        }
        let path = self.object_path(object);
        let directory = path.parent().expect("object paths have a parent");
        let synced = File::open(directory).and_then(|directory| directory.sync_all());
        if synced.is_err() {
            // Still not known to be durable: the next sync tries again.
            self.note_new_entry(object);
        }
        self.sync_result(synced)?;
        self.entry_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The object's file if it exists: the held one on a plain target, else opened for this
    /// request (for writing when `write`).
    fn existing_file(
        &self,
        object: ObjectId,
        write: bool,
    ) -> Result<Option<Arc<ObjectFile>>, WireError> {
        if let Some(files) = &self.files {
            return self.plain_file(files, object, false);
        }
        match OpenOptions::new()
            .read(true)
            .write(write)
            .open(self.object_path(object))
        {
            Ok(file) => Ok(Some(Arc::new(ObjectFile::new(file)))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(io_error("open object", &error)),
        }
    }

    /// The object's file to change, created if missing: the held one on a plain target.
    fn file_for_write(&self, object: ObjectId) -> Result<Arc<ObjectFile>, WireError> {
        match &self.files {
            Some(files) => Ok(self
                .plain_file(files, object, true)?
                .expect("created when missing")),
            None => Ok(Arc::new(ObjectFile::new(self.open_for_write(object)?))),
        }
    }

    fn open_for_write(&self, object: ObjectId) -> Result<File, WireError> {
        self.open_creating(object, |path| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        })
    }

    /// Opens (creating if needed) an object for direct writes.
    fn open_direct_for_write(&self, object: ObjectId) -> Result<File, WireError> {
        self.open_creating(object, |path| crate::direct::open(path, true))
    }

    /// Whether the object's file is held open (plain targets only), so a write to it opens
    /// nothing.
    pub fn is_open(&self, object: ObjectId) -> bool {
        self.files.as_ref().is_some_and(|files| {
            files
                .lock()
                .expect("open files poisoned")
                .contains_key(&object)
        })
    }

    /// Whether the object exists (on disk or in the crash-test journal).
    pub fn exists(&self, object: ObjectId) -> bool {
        let journaled = self.journal.as_ref().is_some_and(|journal| {
            journal
                .lock()
                .expect("journal poisoned")
                .contains_key(&object)
        });
        journaled || self.object_path(object).exists()
    }

    /// The object's length as readers see it (including unsynced journal entries).
    pub fn length(&self, object: ObjectId) -> Result<u64, WireError> {
        let disk = self.disk_length(object)?;
        let Some(journal) = &self.journal else {
            return Ok(disk);
        };
        let journal = journal.lock().expect("journal poisoned");
        Ok(journal
            .get(&object)
            .map(|ops| apply_length(disk, ops))
            .unwrap_or(disk))
    }

    /// The object's length and the CRC32C of the bytes of `[offset, offset + len)` before it,
    /// holes read as zeros: a copy of an object compared with another member's copy.
    pub fn checksum(
        &self,
        object: ObjectId,
        (offset, len): (u64, u64),
    ) -> Result<(u64, u32), WireError> {
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
    ) -> Result<u32, WireError> {
        self.check_writable()?;
        let _cut = self.admit_change(object, generation)?;
        let len = u32::try_from(data.len())
            .map_err(|_| WireError::new(ErrorCode::InvalidArgument, "write too large"))?;
        let end = offset
            .checked_add(u64::from(len))
            .ok_or_else(|| WireError::new(ErrorCode::InvalidArgument, "offset overflows"))?;
        let old_length = self.length(object)?;
        let growth = end.saturating_sub(old_length);
        self.reserve(growth)?;
        match &self.journal {
            Some(journal) => {
                push_pending(journal, object, Pending::Write { offset, data });
            }
            None => match self.direct_stripe(object) {
                Some(stripe) => {
                    let _shared;
                    let _alone;
                    if crate::direct::is_aligned(offset, data.len()) {
                        _shared = stripe.read().expect("direct lock poisoned");
                    } else {
                        _alone = stripe.write().expect("direct lock poisoned");
                    }
                    let file = self.open_direct_for_write(object)?;
                    // The length again, under the lock: another write may have grown it.
                    let length = file
                        .metadata()
                        .map_err(|e| io_error("stat object", &e))?
                        .len();
                    crate::direct::write_at(&file, offset, &data, length)
                        .map_err(|e| io_error("write object", &e))?;
                }
                None => {
                    let file = self.file_for_write(object)?;
                    if self.direct_write_min.is_some_and(|min| data.len() >= min)
                        && crate::direct::is_aligned(offset, data.len())
                    {
                        file.direct()
                            .and_then(|direct| crate::direct::write_aligned(direct, offset, &data))
                            .map_err(|e| io_error("write object", &e))?;
                    } else {
                        file.write_all_at(&data, offset)
                            .map_err(|e| io_error("write object", &e))?;
                        if data.len() >= WRITEBACK_START_BYTES {
                            start_writeback(&file, offset, data.len());
                        }
                    }
                }
            },
        }
        self.used_bytes.fetch_add(growth, Ordering::AcqRel);
        Ok(len)
    }

    pub fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, WireError> {
        let disk_length = self.disk_length(object)?;
        let wanted = disk_length.saturating_sub(offset).min(u64::from(len)) as usize;
        if wanted > 0 && self.direct.is_some() {
            let file = crate::direct::open(&self.object_path(object), false)
                .map_err(|e| io_error("open object", &e))?;
            return crate::direct::read_owned(&file, offset, wanted)
                .map_err(|e| io_error("read object", &e));
        }
        let mut buffer = vec![0u8; len as usize];
        let mut filled = 0usize;
        if offset < disk_length {
            let Some(file) = self.existing_file(object, false)? else {
                return Ok(Bytes::new());
            };
            let large = self.direct_write_min.is_some_and(|min| wanted >= min);
            if large && !fully_cached(&file, offset, wanted as u64) {
                // Not all in the page cache (large writes skip it): from the disk directly,
                // without filling the cache on the way.
                return file
                    .direct()
                    .and_then(|direct| crate::direct::read_owned(direct, offset, wanted))
                    .map_err(|e| io_error("read object", &e));
            }
            while filled < buffer.len() {
                let count = file
                    .read_at(&mut buffer[filled..], offset + filled as u64)
                    .map_err(|e| io_error("read object", &e))?;
                if count == 0 {
                    break;
                }
                filled += count;
            }
        }
        let mut logical_length = disk_length;
        if let Some(journal) = &self.journal {
            let journal = journal.lock().expect("journal poisoned");
            for op in journal.get(&object).map(Vec::as_slice).unwrap_or(&[]) {
                match op {
                    Pending::Write { offset: at, data } => {
                        let start = (*at).max(offset);
                        let stop = (at + data.len() as u64).min(offset + u64::from(len));
                        if start < stop {
                            buffer[(start - offset) as usize..(stop - offset) as usize]
                                .copy_from_slice(
                                    &data[(start - at) as usize..(stop - at) as usize],
                                );
                        }
                        logical_length = logical_length.max(at + data.len() as u64);
                    }
                    Pending::Truncate { length, .. } => {
                        if *length < offset + u64::from(len) {
                            let from = length.saturating_sub(offset) as usize;
                            buffer[from..].fill(0);
                        }
                        logical_length = *length;
                    }
                }
            }
        }
        let available = logical_length.saturating_sub(offset).min(u64::from(len)) as usize;
        buffer.truncate(available);
        Ok(Bytes::from(buffer))
    }

    /// Reads like [`Target::read`] if the object's file is held open and the page cache holds
    /// every byte asked for (`preadv2` with `RWF_NOWAIT`), so the read cannot wait for the
    /// disk; `None` when it could, and the caller reads the usual way. Also `None` when the
    /// object has not had truncate `generation`: the usual way checks it ([`Target::admit`]).
    pub fn read_cached(
        &self,
        object: ObjectId,
        offset: u64,
        len: u32,
        generation: u64,
    ) -> Option<Bytes> {
        if self.journal.is_some() {
            return None;
        }
        let file = self
            .files
            .as_ref()?
            .lock()
            .expect("open files poisoned")
            .get(&object)
            .cloned()?;
        if generation > file.generation.load(Ordering::Acquire) {
            return None;
        }
        let length = file.metadata().ok()?.len();
        let wanted = length.saturating_sub(offset).min(u64::from(len)) as usize;
        if wanted == 0 {
            return Some(Bytes::new());
        }
        let mut buffer: Vec<u8> = Vec::with_capacity(wanted);
        let iov = libc::iovec {
            iov_base: buffer.as_mut_ptr().cast(),
            iov_len: wanted,
        };
        // SAFETY: one iovec over `buffer`'s spare capacity of `wanted` bytes, which the call
        // writes at most; the descriptor stays open while `file` lives.
        let read = unsafe {
            libc::preadv2(
                std::os::fd::AsRawFd::as_raw_fd(&file.file),
                &iov,
                1,
                i64::try_from(offset).ok()?,
                libc::RWF_NOWAIT,
            )
        };
        if usize::try_from(read).ok()? != wanted {
            // Not all in the page cache (or an error the usual read reports).
            return None;
        }
        // SAFETY: the call initialised exactly `wanted` bytes.
        unsafe { buffer.set_len(wanted) };
        Some(Bytes::from(buffer))
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
    ) -> Result<(), WireError> {
        self.check_writable()?;
        let _cut = self.cut_lock(object);
        if generation <= self.generation(object)? || !self.exists(object) {
            return Ok(());
        }
        let _alone = self.direct_alone(object);
        let current = self.length(object)?;
        let cut = length.min(current);
        match &self.journal {
            // Synced before the answer as below: the file's home forgets the truncate once
            // every target answered it, so a crash must not take it back.
            Some(journal) => {
                push_pending(
                    journal,
                    object,
                    Pending::Truncate {
                        length: cut,
                        generation,
                    },
                );
                self.sync(object)?;
            }
            None => {
                let file = self
                    .existing_file(object, true)?
                    .ok_or_else(|| WireError::new(ErrorCode::Io, "object vanished"))?;
                if cut < current {
                    file.set_len(cut)
                        .map_err(|e| io_error("truncate object", &e))?;
                }
                record_generation(&file, generation)?;
                self.sync_file(&file)?;
                self.sync_entry(object)?;
            }
        }
        self.used_bytes.fetch_sub(
            (current - cut).min(self.used_bytes.load(Ordering::Acquire)),
            Ordering::AcqRel,
        );
        Ok(())
    }

    /// The direct-I/O lock stripe of `object` (direct-I/O targets only).
    fn direct_stripe(&self, object: ObjectId) -> Option<&RwLock<()>> {
        let stripes = self.direct.as_ref()?;
        Some(&stripes[(object.inode.0 % DIRECT_STRIPES) as usize])
    }

    /// `object`'s direct-I/O lock stripe held alone, on a direct-I/O target: taken by a
    /// read-modify-write and by whatever cuts or punches the object.
    fn direct_alone(&self, object: ObjectId) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        self.direct_stripe(object)
            .map(|stripe| stripe.write().expect("direct lock poisoned"))
    }

    /// The lock a truncate of `object` holds, and a change that records a newer generation.
    fn cut_lock(&self, object: ObjectId) -> std::sync::MutexGuard<'_, ()> {
        self.cuts[(object.inode.0 % DIRECT_STRIPES) as usize]
            .lock()
            .expect("cut lock poisoned")
    }

    /// The newest truncate generation of its file the object has had (0: none, or no
    /// object), including one only in the crash-test journal.
    pub fn generation(&self, object: ObjectId) -> Result<u64, WireError> {
        let disk = match self.existing_file(object, false)? {
            None => 0,
            // A held file keeps what it records up to date.
            Some(file) if self.files.is_some() => file.generation.load(Ordering::Acquire),
            Some(file) => {
                recorded_generation(&file).map_err(|e| io_error("read truncate generation", &e))?
            }
        };
        let Some(journal) = &self.journal else {
            return Ok(disk);
        };
        let journal = journal.lock().expect("journal poisoned");
        let pending = journal
            .get(&object)
            .into_iter()
            .flatten()
            .filter_map(|op| match op {
                Pending::Truncate { generation, .. } => Some(*generation),
                Pending::Write { .. } => None,
            });
        Ok(pending.fold(disk, u64::max))
    }

    /// Refuses a read or change of truncate `generation` while the object still holds data
    /// from before a truncate of that generation it has not had (its target was away when
    /// the truncate was made): the caller has the metadata server apply it and asks again.
    pub fn admit(&self, object: ObjectId, generation: u64) -> Result<(), WireError> {
        let recorded = self.generation(object)?;
        self.admit_recorded(object, generation, recorded)
    }

    /// [`Target::admit`] for an object known to record generation `recorded`.
    fn admit_recorded(
        &self,
        object: ObjectId,
        generation: u64,
        recorded: u64,
    ) -> Result<(), WireError> {
        if generation > recorded && self.length(object)? > 0 {
            return Err(WireError::new(
                ErrorCode::TruncatePending,
                format!(
                    "the object of {} on target {} has not had truncate {generation} of its file yet",
                    object.inode, self.id
                ),
            ));
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
    ) -> Result<Option<std::sync::MutexGuard<'_, ()>>, WireError> {
        if generation <= self.generation(object)? {
            return Ok(None);
        }
        let cut = self.cut_lock(object);
        let recorded = self.generation(object)?;
        if generation <= recorded {
            return Ok(Some(cut));
        }
        self.admit_recorded(object, generation, recorded)?;
        match &self.journal {
            Some(journal) => push_pending(
                journal,
                object,
                Pending::Truncate {
                    length: 0,
                    generation,
                },
            ),
            None => {
                let file = self.file_for_write(object)?;
                record_generation(&file, generation)?;
                self.unsynced_generations
                    .lock()
                    .expect("unsynced generations poisoned")
                    .insert(object);
            }
        }
        Ok(Some(cut))
    }

    /// Allocates or zeroes `[offset, offset + len)` of an object, never changing its length.
    /// In crash-test mode an allocation only checks the quota and a zeroing is journalled.
    pub fn fallocate(
        &self,
        object: ObjectId,
        (offset, len): (u64, u64),
        mode: FallocateMode,
        generation: u64,
    ) -> Result<(), WireError> {
        self.check_writable()?;
        let _cut = self.admit_change(object, generation)?;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| WireError::new(ErrorCode::InvalidArgument, "range overflows"))?;
        let length = self.length(object)?;
        match mode {
            FallocateMode::Allocate => self.reserve(end.saturating_sub(length))?,
            FallocateMode::Zero if offset >= length => return Ok(()),
            FallocateMode::Zero => {}
        }
        if let Some(journal) = &self.journal {
            if mode == FallocateMode::Zero {
                let zeros = Bytes::from(vec![0u8; (end.min(length) - offset) as usize]);
                push_pending(
                    journal,
                    object,
                    Pending::Write {
                        offset,
                        data: zeros,
                    },
                );
            }
            return Ok(());
        }
        let _alone = self.direct_alone(object);
        let file = self.file_for_write(object)?;
        let flags = match mode {
            FallocateMode::Allocate => libc::FALLOC_FL_KEEP_SIZE,
            FallocateMode::Zero => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        };
        let (Ok(start), Ok(count)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "range too large",
            ));
        };
        // SAFETY: fallocate on a descriptor we own; the range was checked above.
        let result = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&file.file),
                flags,
                start,
                count,
            )
        };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Err(WireError::new(
                    ErrorCode::NotSupported,
                    format!("target {} does not support fallocate", self.id),
                ));
            }
            return Err(io_error("fallocate object", &error));
        }
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
    ) -> Result<(Vec<(InodeId, u64)>, bool), WireError> {
        let mut found = Vec::new();
        collect_objects(&self.root.join(space.directory()), &mut found)
            .map_err(|e| io_error("list objects", &e))?;
        if let Some(journal) = &self.journal {
            let journal = journal.lock().expect("journal poisoned");
            found.extend(
                journal
                    .keys()
                    .filter(|object| object.space == space)
                    .map(|object| object.inode),
            );
        }
        let mut objects: Vec<InodeId> = found
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
            .collect::<Result<_, WireError>>()?;
        Ok((listed, end))
    }

    pub fn remove(&self, object: ObjectId) -> Result<(), WireError> {
        let length = self.length(object)?;
        self.new_entries
            .lock()
            .expect("new entries poisoned")
            .remove(&object);
        self.unsynced_generations
            .lock()
            .expect("unsynced generations poisoned")
            .remove(&object);
        if let Some(journal) = &self.journal {
            journal.lock().expect("journal poisoned").remove(&object);
        }
        // No request may open the object again between forgetting it and removing it.
        let mut open = self
            .files
            .as_ref()
            .map(|files| files.lock().expect("open files poisoned"));
        let held = open.as_mut().and_then(|open| open.remove(&object));
        let path = self.object_path(object);
        let pooled = match (&self.free, held) {
            // A request still using the file could write into its next life: unlink it.
            (Some(_), Some(held)) if Arc::strong_count(&held) > 1 => false,
            (Some(free), held) => self.empty_into(free, held, &path)?,
            (None, _) => false,
        };
        if !pooled {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_error("remove object", &error)),
            }
        }
        drop(open);
        self.used_bytes.fetch_sub(
            length.min(self.used_bytes.load(Ordering::Acquire)),
            Ordering::AcqRel,
        );
        Ok(())
    }

    /// Cuts the object at `path` (held open as `held`, if it is) to nothing and moves it into
    /// the pool; true when it is gone from `path` (or was never there). Called under the
    /// open-file table's lock, with no request holding the file.
    fn empty_into(
        &self,
        free: &FreeFiles,
        held: Option<Arc<ObjectFile>>,
        path: &Path,
    ) -> Result<bool, WireError> {
        // The generation goes first: a pooled file must never bring one to its next object.
        let emptied = match held {
            Some(file) => clear_generation(&file).and_then(|()| file.set_len(0)),
            None => OpenOptions::new().write(true).open(path).and_then(|file| {
                clear_generation(&file)?;
                file.set_len(0)
            }),
        };
        match emptied {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(error) => return Err(io_error("empty object", &error)),
        }
        free.keep(path)
            .map_err(|e| io_error("pool object file", &e))
    }

    /// Makes the object's data durable. A failed fdatasync poisons the target: the page cache
    /// may have dropped the dirty pages, so retrying could report success for lost data.
    pub fn sync(&self, object: ObjectId) -> Result<(), WireError> {
        self.check_writable()?;
        if let Some(journal) = &self.journal {
            let pending = journal
                .lock()
                .expect("journal poisoned")
                .remove(&object)
                .unwrap_or_default();
            if !pending.is_empty() {
                let file = self.open_for_write(object)?;
                for op in pending {
                    match op {
                        Pending::Write { offset, data } => file
                            .write_all_at(&data, offset)
                            .map_err(|e| io_error("write object", &e))?,
                        Pending::Truncate { length, generation } => {
                            file.set_len(length)
                                .map_err(|e| io_error("truncate object", &e))?;
                            set_generation(&file, generation)
                                .map_err(|e| io_error("record truncate generation", &e))?;
                        }
                    }
                }
            }
        }
        let Some(file) = self.existing_file(object, false)? else {
            return Ok(());
        };
        let recorded = self
            .unsynced_generations
            .lock()
            .expect("unsynced generations poisoned")
            .remove(&object);
        // The crash-test journal may just have recorded a generation too.
        let synced = if recorded || self.journal.is_some() {
            file.sync_all()
        } else {
            file.sync_data()
        };
        if synced.is_err() && recorded {
            self.unsynced_generations
                .lock()
                .expect("unsynced generations poisoned")
                .insert(object);
        }
        self.sync_result(synced)?;
        self.sync_entry(object)
    }

    /// Makes everything on the target durable: every object's data, length, generation and
    /// directory entry (a resync's last step on a returning mirror member, which may hold
    /// changes it took before it left that no sync reached since). The crash-test journal's
    /// pending changes are applied and synced, then one `syncfs` covers the file system that
    /// holds the target. A failure poisons the target, as a failed fdatasync does.
    pub fn sync_everything(&self) -> Result<(), WireError> {
        self.check_writable()?;
        if let Some(journal) = &self.journal {
            let pending: Vec<ObjectId> = journal
                .lock()
                .expect("journal poisoned")
                .keys()
                .copied()
                .collect();
            for object in pending {
                self.sync(object)?;
            }
        }
        let root = File::open(self.root()).map_err(|e| io_error("open the target", &e))?;
        // SAFETY: syncfs on a descriptor `root` holds open for the call.
        let done = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) };
        self.sync_result(if done == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        })
    }

    /// Makes the object file's data and metadata (its length and recorded generation)
    /// durable.
    fn sync_file(&self, file: &File) -> Result<(), WireError> {
        self.sync_result(file.sync_all())
    }

    /// The answer to a sync of an object: a failure with EIO poisons the target.
    fn sync_result(&self, synced: std::io::Result<()>) -> Result<(), WireError> {
        if let Err(error) = synced {
            if error.raw_os_error() == Some(libc::EIO) {
                self.poisoned.store(true, Ordering::Release);
                tracing::error!(target = self.id.0, %error, "fsync failed with EIO: target poisoned until restart");
            }
            return Err(io_error("sync object", &error));
        }
        Ok(())
    }

    pub fn usage(&self) -> SpaceUsage {
        let mut usage = weft_service::usage::file_system_usage(&self.root).unwrap_or_default();
        if let Some(capacity) = self.capacity_bytes {
            let used = self.used_bytes.load(Ordering::Acquire);
            usage.total_bytes = capacity.min(usage.total_bytes.max(capacity));
            usage.free_bytes = capacity.saturating_sub(used).min(usage.free_bytes);
        }
        usage
    }
}

/// The extended attribute in which an object file records the newest truncate generation of
/// its file it has had (8 bytes, little endian); none means 0.
const GENERATION_XATTR: &std::ffi::CStr = c"user.weft.truncate_generation";

/// The truncate generation `file` records.
fn recorded_generation(file: &File) -> std::io::Result<u64> {
    let mut value = [0u8; 8];
    // SAFETY: fgetxattr writes at most `value.len()` bytes into `value`; the descriptor stays
    // open while `file` lives.
    let read = unsafe {
        libc::fgetxattr(
            std::os::fd::AsRawFd::as_raw_fd(file),
            GENERATION_XATTR.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if read < 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENODATA) => Ok(0),
            _ => Err(error),
        };
    }
    if read != 8 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a truncate generation of {read} bytes, not 8"),
        ));
    }
    Ok(u64::from_le_bytes(value))
}

/// Checks that the file system under `root` keeps the extended attribute in which objects
/// record their truncate generation.
fn probe_generation_records(root: &Path) -> std::io::Result<()> {
    let path = root.join(".generation-probe");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let probed = set_generation(&file, 1).and_then(|()| recorded_generation(&file));
    drop(file);
    fs::remove_file(&path)?;
    match probed {
        Ok(1) => Ok(()),
        Ok(other) => Err(std::io::Error::other(format!(
            "the file system of {} read back truncate generation {other} for 1",
            root.display()
        ))),
        Err(error) => Err(std::io::Error::new(
            error.kind(),
            format!(
                "the file system of {} does not keep user extended attributes ({error}), in which objects record their truncate generation: put the target on ext4 or XFS",
                root.display()
            ),
        )),
    }
}

/// Records truncate `generation` in `file`.
/// Records truncate `generation` in an object's file and in its handle. Generations only
/// grow: every caller checked, under the object's cut lock, that the object had an older one,
/// and a smaller one recorded would let a late truncate cut data written after it.
fn record_generation(file: &ObjectFile, generation: u64) -> Result<(), WireError> {
    let previous = file.generation.load(Ordering::Acquire);
    assert!(
        previous < generation,
        "truncate generation {generation} recorded over generation {previous}"
    );
    set_generation(file, generation).map_err(|e| io_error("record truncate generation", &e))?;
    file.generation.store(generation, Ordering::Release);
    Ok(())
}

fn set_generation(file: &File, generation: u64) -> std::io::Result<()> {
    let value = generation.to_le_bytes();
    // SAFETY: fsetxattr reads `value.len()` bytes of `value`; the descriptor stays open while
    // `file` lives.
    let result = unsafe {
        libc::fsetxattr(
            std::os::fd::AsRawFd::as_raw_fd(file),
            GENERATION_XATTR.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Forgets the truncate generation `file` records.
fn clear_generation(file: &File) -> std::io::Result<()> {
    // SAFETY: fremovexattr on a descriptor that stays open while `file` lives.
    let result = unsafe {
        libc::fremovexattr(
            std::os::fd::AsRawFd::as_raw_fd(file),
            GENERATION_XATTR.as_ptr(),
        )
    };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ENODATA) {
            return Err(error);
        }
    }
    Ok(())
}

/// Keeps `op` of `object` in the crash-test journal until the object's next sync.
fn push_pending(journal: &Mutex<HashMap<ObjectId, Vec<Pending>>>, object: ObjectId, op: Pending) {
    journal
        .lock()
        .expect("journal poisoned")
        .entry(object)
        .or_default()
        .push(op);
}

/// Opens an existing object file for reading and writing.
fn open_read_write(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// Whether the page cache holds every page of `[offset, offset + len)` of `file`, asked with
/// `cachestat(2)` (Linux 6.5), which unlike a `RWF_NOWAIT` read starts no readahead on a miss.
/// False when the kernel cannot tell.
fn fully_cached(file: &File, offset: u64, len: u64) -> bool {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The syscall's number, the same on every architecture.
    const SYS_CACHESTAT: libc::c_long = 451;
    const PAGE: u64 = 4096;
    let first = offset / PAGE;
    let pages = (offset + len).div_ceil(PAGE) - first;
    let range = Range {
        off: first * PAGE,
        len: pages * PAGE,
    };
    let mut stat = Stat::default();
    // SAFETY: the kernel reads `range` and writes `stat`, both live and of the layout
    // cachestat(2) defines; the descriptor stays open while `file` is borrowed.
    let result = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            std::os::fd::AsRawFd::as_raw_fd(file),
            &range as *const Range,
            &mut stat as *mut Stat,
            0u32,
        )
    };
    result == 0 && stat.nr_cache >= pages
}

/// The least write that goes to the disk with O_DIRECT on a plain target: none when turned off
/// (0), when every I/O of the target is direct or journalled anyway (`other_mode`), or when
/// the file system refuses O_DIRECT (tmpfs), which is logged and leaves the page cache.
fn direct_write_min(root: &Path, min_bytes: u64, other_mode: bool) -> Option<usize> {
    if min_bytes == 0 || other_mode {
        return None;
    }
    if let Err(error) = crate::direct::supported(root) {
        tracing::info!(
            target = %root.display(),
            %error,
            "the file system refuses O_DIRECT: large writes go through the page cache"
        );
        return None;
    }
    Some(usize::try_from(min_bytes).unwrap_or(usize::MAX))
}

fn apply_length(disk: u64, ops: &[Pending]) -> u64 {
    ops.iter().fold(disk, |length, op| match op {
        Pending::Write { offset, data } => length.max(offset + data.len() as u64),
        Pending::Truncate { length: cut, .. } => *cut,
    })
}

/// The subdirectory of `objects/` that holds object `id`: the first byte of the CRC32C of the
/// id, in hex. The 256 of them are made when the target opens, so no object write makes a
/// directory; ext4's hashed directories keep lookups fast at millions of objects each.
fn object_dir(id: u64) -> String {
    let hash = weft_proto::checksum::crc32c(&id.to_le_bytes());
    format!("{:02x}", hash & 0xff)
}

fn read_dir_if_present(path: &Path) -> std::io::Result<Option<fs::ReadDir>> {
    match fs::read_dir(path) {
        Ok(entries) => Ok(Some(entries)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Whether `name` is a subdirectory name of the object tree: two hex digits.
fn is_fan_out_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Moves the objects of a tree of the older two-level layout (`<aa>/<bb>/<inode>`) up into
/// `<aa>/`, where [`Target::object_path`] looks for them, and removes the emptied `<bb>`
/// directories. Each move is one rename, so an interrupted pass is finished by the next open.
fn flatten_object_dirs(objects: &Path) -> std::io::Result<()> {
    let Some(first_level) = read_dir_if_present(objects)? else {
        return Ok(());
    };
    for first in first_level {
        let first = first?;
        if !first.file_type()?.is_dir() || !is_fan_out_name(&first.file_name()) {
            continue;
        }
        for second in fs::read_dir(first.path())? {
            let second = second?;
            if !second.file_type()?.is_dir() || !is_fan_out_name(&second.file_name()) {
                continue;
            }
            for file in fs::read_dir(second.path())? {
                let file = file?;
                fs::rename(file.path(), first.path().join(file.file_name()))?;
            }
            fs::remove_dir(second.path())?;
        }
    }
    Ok(())
}

/// The inode ids of the object files under `objects` that sit where [`Target::object_path`]
/// puts them; anything else (leftovers of other tools) is not an object and is skipped.
fn collect_objects(objects: &Path, found: &mut Vec<InodeId>) -> std::io::Result<()> {
    let Some(dirs) = read_dir_if_present(objects)? else {
        return Ok(());
    };
    for dir in dirs {
        let dir = dir?;
        let Some(files) = read_dir_if_present(&dir.path())? else {
            continue;
        };
        for file in files {
            let file = file?;
            let Some(id) = file
                .file_name()
                .to_str()
                .filter(|n| n.len() == 16)
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                continue;
            };
            if dir.file_name().to_str() == Some(object_dir(id).as_str()) {
                found.push(InodeId(id));
            }
        }
    }
    Ok(())
}

/// Sum of the lengths of every file under `path`.
fn directory_bytes(path: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += directory_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Writes at least this large start their own writeback at once.
const WRITEBACK_START_BYTES: usize = 256 * 1024;

/// Starts writing a just-written range to the disk without waiting for it
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): streams of large writes then never pile up
/// enough dirty pages for the kernel to throttle every writer at once. Durability is
/// unchanged (only fsync promises it); a failure here is left for fsync to report.
fn start_writeback(file: &File, offset: u64, len: usize) {
    // SAFETY: sync_file_range on a descriptor this function borrows; it reads no memory.
    unsafe {
        libc::sync_file_range(
            std::os::fd::AsRawFd::as_raw_fd(file),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target written in the older `<aa>/<bb>/<inode>` layout opens with every object
    /// readable where the flat layout looks, its capacity use unchanged and no `<bb>` left.
    #[test]
    fn opening_flattens_the_two_level_layout() {
        let directory = tempfile::tempdir().expect("tempdir");
        let objects = directory.path().join("objects");
        let inodes: Vec<InodeId> = (1..40)
            .map(|n| InodeId::new(weft_proto::NodeId(1), n))
            .collect();
        for inode in &inodes {
            let hash = weft_proto::checksum::crc32c(&inode.0.to_le_bytes()).to_le_bytes();
            let old = objects
                .join(format!("{:02x}", hash[0]))
                .join(format!("{:02x}", hash[1]));
            fs::create_dir_all(&old).expect("mkdir");
            fs::write(old.join(format!("{:016x}", inode.0)), inode.0.to_le_bytes()).expect("write");
        }
        let target = Target::open(TargetId(1), directory.path(), None, (false, false), 0)
            .expect("open flattens");
        for inode in &inodes {
            assert_eq!(
                &target.read(ObjectId::plain(*inode), 0, 8).expect("read")[..],
                &inode.0.to_le_bytes()[..],
                "object {inode} moved"
            );
        }
        assert_eq!(
            target.used_bytes.load(Ordering::Acquire),
            8 * inodes.len() as u64
        );
        let (listed, _) = target
            .list_objects(Space::Plain, None, 0, 1000)
            .expect("list");
        assert_eq!(listed.len(), inodes.len());
        for dir in fs::read_dir(&objects).expect("objects") {
            for entry in fs::read_dir(dir.expect("entry").path()).expect("dir") {
                assert!(entry.expect("entry").file_type().expect("type").is_file());
            }
        }
    }

    /// Runs the same checks against the plain store, the crash-test journal store and the
    /// O_DIRECT store.
    fn conformance(crash_test: bool, direct_io: bool) {
        let directory = tempfile::tempdir().expect("tempdir");
        if direct_io && crate::direct::probe(directory.path()).is_err() {
            return; // tmpfs refuses O_DIRECT
        }
        let target = Target::open(
            TargetId(1),
            directory.path(),
            Some(1 << 20),
            (crash_test, direct_io),
            0,
        )
        .expect("open");
        let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 5));
        assert_eq!(target.length(inode).expect("length"), 0);
        assert!(
            target.read(inode, 0, 100).expect("read").is_empty(),
            "a missing object reads as empty"
        );
        target
            .write(inode, 10, Bytes::from_static(b"hello"), 0)
            .expect("write");
        assert_eq!(target.length(inode).expect("length"), 15);
        assert_eq!(
            &target.read(inode, 0, 100).expect("read")[..],
            b"\0\0\0\0\0\0\0\0\0\0hello",
            "holes read as zeros"
        );
        target.truncate(inode, 12, 1).expect("truncate");
        assert_eq!(&target.read(inode, 8, 100).expect("read")[..], b"\0\0he");
        target.sync(inode).expect("sync");
        assert_eq!(
            target.disk_length(inode).expect("disk length"),
            12,
            "sync puts the data on disk"
        );
        // The new object's directory entry was synced with it, once.
        target.sync(inode).expect("sync again");
        assert_eq!(target.entry_syncs.load(Ordering::Relaxed), 1);
        let error = target
            .write(inode, 0, Bytes::from(vec![0u8; 2 << 20]), 0)
            .expect_err("over capacity");
        assert_eq!(error.code, ErrorCode::NoSpace);
        target.remove(inode).expect("remove");
        assert_eq!(target.length(inode).expect("length"), 0);
        // A removed object is gone for good: a new write starts a new one (an open file kept
        // for the old one must not receive it).
        target
            .write(inode, 3, Bytes::from_static(b"new"), 0)
            .expect("write after remove");
        assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");
        target.sync(inode).expect("sync");
        assert_eq!(target.disk_length(inode).expect("disk length"), 6);
        assert_eq!(
            target.entry_syncs.load(Ordering::Relaxed),
            2,
            "an object made again after its removal has a new entry, synced"
        );

        // A mirrored file's object is another object than a plain file's of the same inode:
        // neither reads, changes, lists or removes the other.
        let mirrored = ObjectId::new(Space::Mirrored, inode.inode);
        assert!(!target.exists(mirrored));
        target
            .write(mirrored, 0, Bytes::from_static(b"mirrored"), 0)
            .expect("write mirrored");
        target.truncate(mirrored, 7, 1).expect("truncate mirrored");
        target.sync(mirrored).expect("sync mirrored");
        assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");
        assert_eq!(
            &target.read(mirrored, 0, 100).expect("read")[..],
            b"mirrore"
        );
        for (space, length) in [(Space::Plain, 6), (Space::Mirrored, 7)] {
            let (listed, end) = target.list_objects(space, None, 0, 10).expect("list");
            assert!(end);
            assert_eq!(listed, vec![(inode.inode, length)], "{space:?}");
        }
        target.remove(mirrored).expect("remove mirrored");
        assert!(!target.exists(mirrored));
        assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");

        // Truncate generations: a truncate cuts once; re-sent or late, it cuts nothing
        // written after it; an object that missed one refuses reads and writes of the new
        // generation until it has it; a new object records the generation of its first write.
        let file = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 7));
        target
            .write(file, 0, Bytes::from_static(b"0123456789"), 0)
            .expect("write");
        target.truncate(file, 4, 1).expect("truncate 1");
        assert_eq!(target.length(file).expect("length"), 4);
        target
            .write(file, 4, Bytes::from_static(b"ab"), 1)
            .expect("write after the truncate");
        target.truncate(file, 2, 1).expect("truncate 1 again");
        assert_eq!(
            &target.read(file, 0, 100).expect("read")[..],
            b"0123ab",
            "a re-sent truncate cuts nothing written after it"
        );
        let pending = target
            .write(file, 0, Bytes::from_static(b"x"), 2)
            .expect_err("truncate 2 not had");
        assert_eq!(pending.code, ErrorCode::TruncatePending);
        let pending = target
            .admit(file, 2)
            .expect_err("no read of generation 2 either");
        assert_eq!(pending.code, ErrorCode::TruncatePending);
        target.admit(file, 1).expect("generation 1 reads");
        target.truncate(file, 1, 2).expect("truncate 2");
        target
            .write(file, 3, Bytes::from_static(b"z"), 2)
            .expect("write of generation 2");
        assert_eq!(&target.read(file, 0, 100).expect("read")[..], b"0\0\0z");
        let late = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 8));
        target
            .truncate(late, 0, 3)
            .expect("truncate of a missing object");
        assert!(!target.exists(late), "a truncate creates nothing");
        target
            .write(late, 0, Bytes::from_static(b"new"), 3)
            .expect("first write of generation 3");
        target
            .truncate(late, 0, 3)
            .expect("the truncate again, late");
        assert_eq!(&target.read(late, 0, 100).expect("read")[..], b"new");
        target.sync(file).expect("sync");
        target.sync(late).expect("sync");
        assert_eq!(target.generation(file).expect("generation"), 2);
        target.remove(late).expect("remove");
        target.remove(file).expect("remove");
        assert_eq!(target.generation(file).expect("generation"), 0);
    }

    /// A removed object's file is emptied and reused by the next new object, which reads
    /// only its own bytes; a file a request still holds is unlinked instead, so a late write
    /// through it cannot reach the next object.
    #[test]
    fn removed_objects_are_reused_only_when_no_request_holds_them() {
        use std::os::unix::fs::MetadataExt;
        let directory = tempfile::tempdir().expect("tempdir");
        let target =
            Target::open(TargetId(1), directory.path(), None, (false, false), 0).expect("open");
        let free = target.free.as_ref().expect("a plain target pools files");
        let (old, new) = (
            ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 1)),
            ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 2)),
        );
        target
            .write(old, 0, Bytes::from(vec![7u8; 8192]), 0)
            .expect("write");
        let old_ino = fs::metadata(target.object_path(old)).expect("stat").ino();
        target.remove(old).expect("remove");
        assert_eq!(free.len(), 1, "the removed object's file is pooled");
        assert!(!target.exists(old));
        target
            .write(new, 3, Bytes::from_static(b"new"), 0)
            .expect("write");
        assert_eq!(free.len(), 0);
        assert_eq!(
            fs::metadata(target.object_path(new)).expect("stat").ino(),
            old_ino,
            "the new object reuses the file"
        );
        assert_eq!(&target.read(new, 0, 100).expect("read")[..], b"\0\0\0new");

        let files = target.files.as_ref().expect("plain");
        let held = target
            .plain_file(files, new, false)
            .expect("open")
            .expect("exists");
        target.remove(new).expect("remove");
        assert_eq!(free.len(), 0, "a held file is not pooled");
        assert_eq!(held.metadata().expect("stat").nlink(), 0, "it is unlinked");
        held.write_all_at(b"late", 0).expect("late write");
        target
            .write(old, 0, Bytes::from_static(b"x"), 0)
            .expect("write");
        assert_eq!(&target.read(old, 0, 100).expect("read")[..], b"x");
    }

    // Goal: the plain object store keeps the object contract (holes, truncate, capacity).
    #[test]
    fn plain_store_conformance() {
        conformance(false, false);
    }

    // Goal: on a plain target, large aligned writes that skip the page cache and small writes
    // that go through it see each other's bytes in any order, from any buffer address.
    #[test]
    fn direct_writes_mix_with_cached_io() {
        let directory = tempfile::tempdir().expect("tempdir");
        if crate::direct::probe(directory.path()).is_err() {
            return; // tmpfs refuses O_DIRECT
        }
        let target =
            Target::open(TargetId(1), directory.path(), None, (false, false), 8192).expect("open");
        let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 9));
        let mut model = vec![0u8; 64 << 10];
        let write = |offset: usize, data: Bytes, model: &mut Vec<u8>| {
            target
                .write(inode, offset as u64, data.clone(), 0)
                .expect("write");
            model[offset..offset + data.len()].copy_from_slice(&data);
        };
        // Cached, then direct over the cached pages, then cached inside the direct range.
        write(100, Bytes::from(vec![1u8; 300]), &mut model);
        write(0, Bytes::from(vec![2u8; 16 << 10]), &mut model);
        write(5000, Bytes::from(vec![3u8; 10]), &mut model);
        // Direct again, from a buffer one byte past an aligned address.
        let unaligned = Bytes::from(vec![4u8; (32 << 10) + 1]).slice(1..);
        write(32 << 10, unaligned, &mut model);
        // Direct over the cached bytes.
        write(4096, Bytes::from(vec![5u8; 8192]), &mut model);
        // Two small writes leave a large range whole in the page cache, read from there.
        write(40 << 10, Bytes::from(vec![6u8; 4096]), &mut model);
        write(44 << 10, Bytes::from(vec![7u8; 4096]), &mut model);
        assert_eq!(
            &target.read(inode, 40 << 10, 8192).expect("cached read")[..],
            &model[40 << 10..48 << 10]
        );
        assert_eq!(target.length(inode).expect("length"), 64 << 10);
        assert_eq!(
            &target.read(inode, 0, 64 << 10).expect("read")[..],
            &model[..]
        );
        target.sync(inode).expect("sync");
        let on_disk = fs::read(target.object_path(inode)).expect("read the object file");
        assert_eq!(on_disk, model, "the file holds every write");
    }

    // Goal: the O_DIRECT object store keeps the same contract, unaligned writes included.
    #[test]
    fn direct_io_store_conformance() {
        conformance(false, true);
    }

    // Goal: on a direct-I/O target, a truncate or a punch that comes while an unaligned write
    // has read its edge blocks waits for the write, so the old bytes it writes back are cut
    // or punched after it, never restored over the cut.
    #[test]
    fn a_cut_never_slips_inside_a_read_modify_write() {
        let directory = tempfile::tempdir().expect("tempdir");
        if crate::direct::probe(directory.path()).is_err() {
            return; // tmpfs refuses O_DIRECT
        }
        let target = Arc::new(
            Target::open(TargetId(1), directory.path(), None, (false, true), 0).expect("open"),
        );
        type Cut = fn(&Target, ObjectId) -> Result<(), WireError>;
        let cuts: [(&str, Cut); 2] = [
            ("truncate", |target, object| target.truncate(object, 0, 1)),
            ("punch", |target, object| {
                target.fallocate(object, (0, 8192), FallocateMode::Zero, 0)
            }),
        ];
        for (inode, (name, cut)) in (20..).zip(cuts) {
            let object = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), inode));
            target
                .write(object, 0, Bytes::from(vec![b'a'; 8192]), 0)
                .expect("write");
            let (done, cut_done) = std::sync::mpsc::channel();
            let cutter = Arc::clone(&target);
            let handle = Arc::new(Mutex::new(None));
            let slot = Arc::clone(&handle);
            crate::direct::tests::on_edge_read(move || {
                let thread = std::thread::spawn(move || {
                    cut(&cutter, object).expect("cut");
                    let _ = done.send(());
                });
                *slot.lock().expect("slot") = Some(thread);
                // Give a cut that does not wait for the write the time to run.
                let _ = cut_done.recv_timeout(std::time::Duration::from_secs(1));
            });
            target
                .write(object, 100, Bytes::from_static(b"0123456789"), 0)
                .expect("unaligned write");
            let thread = handle.lock().expect("slot").take().expect("the hook ran");
            thread.join().expect("cut thread");
            let back = target.read(object, 0, 8192).expect("read");
            assert!(
                back.iter().all(|&byte| byte != b'a'),
                "{name}: old bytes came back after the cut"
            );
        }
    }

    // Goal: the crash-test journal behaves exactly like the direct store until a sync.
    #[test]
    fn journal_store_conformance() {
        conformance(true, false);
    }

    // Goal: in crash-test mode, unsynced data is not on disk, so a kill loses it.
    #[test]
    fn unsynced_data_stays_off_disk() {
        let directory = tempfile::tempdir().expect("tempdir");
        let target =
            Target::open(TargetId(1), directory.path(), None, (true, false), 0).expect("open");
        let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 6));
        target
            .write(inode, 0, Bytes::from_static(b"volatile"), 0)
            .expect("write");
        assert_eq!(target.disk_length(inode).expect("disk length"), 0);
        target.sync(inode).expect("sync");
        assert_eq!(
            std::fs::read(target.object_path(inode)).expect("object"),
            b"volatile"
        );
    }
}
