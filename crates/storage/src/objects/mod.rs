//! How a target keeps its objects' bytes: the [`ObjectStore`] trait, its stores, and the
//! object tree on disk they share.
//!
//! - [`plain::PlainStore`] — objects through the page cache, their files held open in a table
//!   and emptied files recycled; large aligned writes may skip the cache.
//! - [`direct_io::DirectStore`] (`direct_io = true`) — every read and write with O_DIRECT, a
//!   file opened per request.
//! - [`journal::Journal`] (`crash_test_discard_unsynced = true`) — a wrapper over another store
//!   that keeps changes in memory until their object is synced, so a kill loses exactly what
//!   no sync covered.
//!
//! A store knows files, not what they mean: capacity, poisoning after a failed fsync, and the
//! admission of requests by truncate generation live in [`Target`](crate::target::Target),
//! which holds one store. Failures are [`ObjectError`]s, turned into wire codes in one place.

mod direct_io;
mod journal;
mod plain;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use weft_proto::error::WireError;
use weft_proto::ids::{InodeId, TargetId};
use weft_proto::messages::FallocateMode;
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

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ObjectError {
    /// The target's file system failed an operation on an object file or directory.
    #[error("cannot {what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An fsync, fdatasync or syncfs failed: the data may be lost (with EIO the target is
    /// poisoned, see [`Target`](crate::target::Target)).
    #[error("cannot sync {}", path.display())]
    Sync {
        /// The file, directory or target synced.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A write or an allocation would pass the target's configured capacity.
    #[error("target {target} is full ({used} of {capacity} bytes used)")]
    NoSpace {
        target: TargetId,
        used: u64,
        capacity: u64,
    },
    /// An fsync failed with EIO earlier: the page cache may have dropped data a retry would
    /// report as synced.
    #[error("target {target} refuses writes after an fsync failure; restart and check it")]
    Poisoned { target: TargetId },
    /// The object missed a truncate of its file the request was made after.
    #[error("the object of {inode} on target {target} has not had truncate {generation} of its file yet")]
    TruncatePending {
        inode: InodeId,
        target: TargetId,
        generation: u64,
    },
    /// A push's copy of the file's truncate generation before the one the object had since
    /// (a copy from a push round that failed, delayed on its way, after the move's truncate
    /// cut the object): dropped, or it would put back bytes past the cut.
    #[error(
        "a copy of the object of {inode} in truncate generation {generation} reached target \
         {target} after its truncate {recorded}: dropped"
    )]
    StaleCopy {
        inode: InodeId,
        target: TargetId,
        generation: u64,
        recorded: u64,
    },
    /// The object moved to another target: its file's layout says which.
    #[error("the object of {inode} moved off target {target}: fetch the file's layout again")]
    Moved { inode: InodeId, target: TargetId },
    /// The request names a range the object cannot have.
    #[error("{0}")]
    Invalid(&'static str),
    /// The target's file system cannot allocate or punch.
    #[error("the file system of {} does not support fallocate", root.display())]
    FallocateUnsupported { root: PathBuf },
    /// An object this operation had seen was removed under it.
    #[error("the object {} vanished", path.display())]
    Vanished { path: PathBuf },
}

impl ObjectError {
    fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ObjectError + 'a {
        move |source| ObjectError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The OS error of a failed sync with EIO, after which the target must be poisoned.
    pub fn is_eio_sync(&self) -> bool {
        matches!(self, ObjectError::Sync { source, .. } if source.raw_os_error() == Some(libc::EIO))
    }
}

/// The one conversion of an object failure into what the client is told.
impl From<ObjectError> for WireError {
    fn from(error: ObjectError) -> WireError {
        let code = match &error {
            ObjectError::Io { source, .. } | ObjectError::Sync { source, .. } => {
                ErrorCode::from_io(source)
            }
            ObjectError::NoSpace { .. } => ErrorCode::NoSpace,
            ObjectError::Poisoned { .. } => ErrorCode::TargetPoisoned,
            ObjectError::TruncatePending { .. } => ErrorCode::TruncatePending,
            ObjectError::Moved { .. } => ErrorCode::Moved,
            ObjectError::StaleCopy { .. } => ErrorCode::Superseded,
            ObjectError::Invalid(_) => ErrorCode::InvalidArgument,
            ObjectError::FallocateUnsupported { .. } => ErrorCode::NotSupported,
            ObjectError::Vanished { .. } => ErrorCode::Io,
        };
        WireError::new(code, weft_proto::error::error_chain(&error))
    }
}

/// What keeps a target's object bytes. Every method is called on the blocking pool; the
/// target serialises what must not interleave (a truncate with a change recording a newer
/// generation) with its cut locks, and a store serialises what its own I/O needs.
pub(crate) trait ObjectStore: Send + Sync {
    /// The object files on disk.
    fn tree(&self) -> &Tree;

    /// Whether every read and write skips the page cache.
    fn is_direct(&self) -> bool {
        false
    }

    /// Whether the object's file is held open, so a request on it opens nothing.
    fn is_open(&self, _object: ObjectId) -> bool {
        false
    }

    /// Whether the object exists.
    fn exists(&self, object: ObjectId) -> bool;

    /// The object's length as readers see it; 0 for a missing object.
    fn length(&self, object: ObjectId) -> Result<u64, ObjectError>;

    /// Up to `len` bytes at `offset`, short at the object's end, holes as zeros.
    fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, ObjectError>;

    /// [`ObjectStore::read`] if it cannot wait for the disk, and the object has had truncate
    /// `generation`; `None` otherwise.
    fn read_cached(
        &self,
        _object: ObjectId,
        _offset: u64,
        _len: u32,
        _generation: u64,
    ) -> Option<Bytes> {
        None
    }

    /// Writes `data` at `offset`, creating the object if missing.
    fn write(&self, object: ObjectId, offset: u64, data: Bytes) -> Result<(), ObjectError>;

    /// The newest truncate generation the object has had (0: none, or no object).
    fn generation(&self, object: ObjectId) -> Result<u64, ObjectError>;

    /// Records a newer truncate `generation` on an empty object (created if missing), made
    /// durable by the object's next sync.
    fn record_generation(&self, object: ObjectId, generation: u64) -> Result<(), ObjectError>;

    /// Cuts an existing object to at most `length` and records truncate `generation`, both
    /// durable before it returns. Returns the length before the cut.
    fn cut(&self, object: ObjectId, length: u64, generation: u64) -> Result<u64, ObjectError>;

    /// Allocates or zeroes `[offset, offset + len)` of an object of `length` bytes, never
    /// changing its length.
    fn fallocate(
        &self,
        object: ObjectId,
        range: (u64, u64),
        mode: FallocateMode,
        length: u64,
    ) -> Result<(), ObjectError>;

    /// The inodes with an object in `space`, in no order.
    fn list(&self, space: Space) -> Result<Vec<InodeId>, ObjectError>;

    /// Removes the object; a missing one is no error.
    fn remove(&self, object: ObjectId) -> Result<(), ObjectError>;

    /// Makes the object's data, length, generation and directory entry durable.
    fn sync(&self, object: ObjectId) -> Result<(), ObjectError>;

    /// Makes everything the store holds durable.
    fn sync_everything(&self) -> Result<(), ObjectError>;
}

/// How a target's store is made, from its server's config.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StoreKind {
    /// Every read and write with O_DIRECT ([`direct_io::DirectStore`]).
    pub direct_io: bool,
    /// Changes kept in memory until synced ([`journal::Journal`]).
    pub crash_test: bool,
    /// On a plain store, writes at least this large and aligned skip the page cache (0: none).
    pub direct_write_min_bytes: u64,
}

/// Opens the object store of the target at `root` (making its tree on first use) and returns
/// it with the bytes its objects hold.
pub(crate) fn open(root: &Path, kind: StoreKind) -> io::Result<(Box<dyn ObjectStore>, u64)> {
    let (tree, used) = Tree::open(root)?;
    let store: Box<dyn ObjectStore> = if kind.direct_io {
        crate::direct::probe(root)?;
        Box::new(direct_io::DirectStore::new(tree))
    } else {
        // Journalled writes reach the disk only at a sync, where skipping the cache buys
        // nothing.
        let direct_write_min = if kind.crash_test {
            None
        } else {
            plain::direct_write_min(root, kind.direct_write_min_bytes)
        };
        Box::new(plain::PlainStore::new(tree, direct_write_min)?)
    };
    if kind.crash_test {
        return Ok((Box::new(journal::Journal::new(store)), used));
    }
    Ok((store, used))
}

/// A target's object files: `<root>/<space>/<aa>/<inode in hex>`, and what must be synced
/// with them that the file's own fdatasync does not cover (a new directory entry, a truncate
/// generation recorded without a sync).
pub(crate) struct Tree {
    root: PathBuf,
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

impl Tree {
    /// The tree under `root`, made or brought to the current layout, and the bytes its
    /// objects hold.
    fn open(root: &Path) -> io::Result<(Tree, u64)> {
        let mut used = 0;
        for space in Space::ALL {
            let objects = root.join(space.directory());
            fs::create_dir_all(&objects)?;
            flatten_object_dirs(&objects)?;
            for index in 0..=u8::MAX {
                match fs::create_dir(objects.join(format!("{index:02x}"))) {
                    Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(error)
                    }
                    _ => {}
                }
            }
            used += directory_bytes(&objects)?;
        }
        probe_generation_records(root)?;
        let tree = Tree {
            root: root.to_path_buf(),
            new_entries: Mutex::default(),
            entry_syncs: AtomicU64::new(0),
            unsynced_generations: Mutex::default(),
        };
        Ok((tree, used))
    }

    /// The target's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<space>/<aa>/<object>`: [`Space::directory`] names the space's tree and
    /// [`object_dir`] names `aa`.
    pub fn object_path(&self, object: ObjectId) -> PathBuf {
        self.root
            .join(object.space.directory())
            .join(object_dir(object.inode.0))
            .join(format!("{:016x}", object.inode.0))
    }

    /// Directory syncs made for new entries.
    #[cfg(test)]
    pub fn entry_syncs(&self) -> u64 {
        self.entry_syncs.load(Ordering::Relaxed)
    }

    /// The object's file opened for this request (for writing too when `write`), if it
    /// exists.
    fn open_existing(&self, object: ObjectId, write: bool) -> Result<Option<File>, ObjectError> {
        let path = self.object_path(object);
        match OpenOptions::new().read(true).write(write).open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(ObjectError::io("open object", &path)(error)),
        }
    }

    /// Opens `object`'s file with `open` (which creates it), noting a new entry.
    fn open_creating(
        &self,
        object: ObjectId,
        open: impl Fn(&Path) -> io::Result<File>,
    ) -> Result<File, ObjectError> {
        let path = self.object_path(object);
        let existed = path.exists();
        let file = match open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let parent = path.parent().expect("object paths have a parent");
                fs::create_dir_all(parent)
                    .map_err(ObjectError::io("create object directory", parent))?;
                open(&path).map_err(ObjectError::io("create object", &path))?
            }
            Err(error) => return Err(ObjectError::io("open object", &path)(error)),
        };
        if !existed {
            self.note_new_entry(object);
        }
        Ok(file)
    }

    /// Opens (creating if missing) `object`'s file for reading and writing.
    fn open_for_write(&self, object: ObjectId) -> Result<File, ObjectError> {
        self.open_creating(object, |path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        })
    }

    fn note_new_entry(&self, object: ObjectId) {
        self.new_entries
            .lock()
            .expect("new entries poisoned")
            .insert(object);
    }

    /// Notes that `object` recorded a generation its next sync must make durable.
    fn note_unsynced_generation(&self, object: ObjectId) {
        self.unsynced_generations
            .lock()
            .expect("unsynced generations poisoned")
            .insert(object);
    }

    /// Forgets what a removed object still owed a sync.
    fn forget(&self, object: ObjectId) {
        self.new_entries
            .lock()
            .expect("new entries poisoned")
            .remove(&object);
        self.unsynced_generations
            .lock()
            .expect("unsynced generations poisoned")
            .remove(&object);
    }

    /// Syncs the directory of `object` if its entry is new since the last such sync.
    fn sync_entry(&self, object: ObjectId) -> Result<(), ObjectError> {
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
        if let Err(source) = File::open(directory).and_then(|directory| directory.sync_all()) {
            // Still not known to be durable: the next sync tries again.
            self.note_new_entry(object);
            return Err(ObjectError::Sync {
                path: directory.to_path_buf(),
                source,
            });
        }
        self.entry_syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Syncs `object`'s `file`: its data, and its metadata too when a generation was recorded
    /// since the last sync; then its directory entry if new.
    fn sync_object(&self, object: ObjectId, file: &File) -> Result<(), ObjectError> {
        let recorded = self
            .unsynced_generations
            .lock()
            .expect("unsynced generations poisoned")
            .remove(&object);
        let synced = if recorded {
            file.sync_all()
        } else {
            file.sync_data()
        };
        if let Err(source) = synced {
            if recorded {
                self.note_unsynced_generation(object);
            }
            return Err(ObjectError::Sync {
                path: self.object_path(object),
                source,
            });
        }
        self.sync_entry(object)
    }

    /// Cuts `object`'s `file` to at most `length`, has `record` record the truncate's
    /// generation, and syncs both and the entry. Returns the length before the cut.
    fn cut(
        &self,
        object: ObjectId,
        file: &File,
        length: u64,
        record: impl FnOnce() -> Result<(), ObjectError>,
    ) -> Result<u64, ObjectError> {
        let path = self.object_path(object);
        let current = file
            .metadata()
            .map_err(ObjectError::io("stat object", &path))?
            .len();
        if length < current {
            file.set_len(length)
                .map_err(ObjectError::io("truncate object", &path))?;
        }
        record()?;
        file.sync_all()
            .map_err(|source| ObjectError::Sync { path, source })?;
        self.sync_entry(object)?;
        Ok(current)
    }

    /// Allocates or punches `[offset, offset + len)` of `object`'s `file`.
    fn fallocate(
        &self,
        object: ObjectId,
        file: &File,
        (offset, len): (u64, u64),
        mode: FallocateMode,
    ) -> Result<(), ObjectError> {
        let flags = match mode {
            FallocateMode::Allocate => libc::FALLOC_FL_KEEP_SIZE,
            FallocateMode::Zero => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        };
        let (Ok(start), Ok(count)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(ObjectError::Invalid("range too large"));
        };
        // SAFETY: fallocate on a descriptor `file` holds open; the range was checked above.
        let result =
            unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(file), flags, start, count) };
        if result != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Err(ObjectError::FallocateUnsupported {
                    root: self.root.clone(),
                });
            }
            return Err(ObjectError::io(
                "fallocate object",
                &self.object_path(object),
            )(error));
        }
        Ok(())
    }

    /// Unlinks `object`'s file; a missing one is no error.
    fn unlink(&self, object: ObjectId) -> Result<(), ObjectError> {
        let path = self.object_path(object);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(ObjectError::io("remove object", &path)(error)),
        }
    }

    /// The inodes with an object file in `space`.
    fn list(&self, space: Space) -> Result<Vec<InodeId>, ObjectError> {
        let objects = self.root.join(space.directory());
        let mut found = Vec::new();
        collect_objects(&objects, &mut found).map_err(ObjectError::io("list objects", &objects))?;
        Ok(found)
    }

    /// One `syncfs` of the file system that holds the target.
    fn sync_file_system(&self) -> Result<(), ObjectError> {
        let root =
            File::open(&self.root).map_err(ObjectError::io("open the target", &self.root))?;
        // SAFETY: syncfs on a descriptor `root` holds open for the call.
        let done = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)) };
        if done != 0 {
            return Err(ObjectError::Sync {
                path: self.root.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// The extended attribute in which an object file records the newest truncate generation of
/// its file it has had (8 bytes, little endian); none means 0.
const GENERATION_XATTR: &std::ffi::CStr = c"user.weft.truncate_generation";

/// The truncate generation `file` records.
fn recorded_generation(file: &File) -> io::Result<u64> {
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
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENODATA) => Ok(0),
            _ => Err(error),
        };
    }
    if read != 8 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a truncate generation of {read} bytes, not 8"),
        ));
    }
    Ok(u64::from_le_bytes(value))
}

/// Checks that the file system under `root` keeps the extended attribute in which objects
/// record their truncate generation.
fn probe_generation_records(root: &Path) -> io::Result<()> {
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
        Ok(other) => Err(io::Error::other(format!(
            "the file system of {} read back truncate generation {other} for 1",
            root.display()
        ))),
        Err(error) => Err(io::Error::new(
            error.kind(),
            format!(
                "the file system of {} does not keep user extended attributes ({error}), in which objects record their truncate generation: put the target on ext4 or XFS",
                root.display()
            ),
        )),
    }
}

/// Records truncate `generation` in an object's file, which had `previous`. Generations only
/// grow: every caller checked, under the object's cut lock, that the object had an older one,
/// and a smaller one recorded would let a late truncate cut data written after it.
fn record_generation(
    file: &File,
    path: &Path,
    previous: u64,
    generation: u64,
) -> Result<(), ObjectError> {
    assert!(
        previous < generation,
        "truncate generation {generation} recorded over generation {previous} in {}",
        path.display()
    );
    set_generation(file, generation).map_err(ObjectError::io("record truncate generation", path))
}

fn set_generation(file: &File, generation: u64) -> io::Result<()> {
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
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Forgets the truncate generation `file` records.
fn clear_generation(file: &File) -> io::Result<()> {
    // SAFETY: fremovexattr on a descriptor that stays open while `file` lives.
    let result = unsafe {
        libc::fremovexattr(
            std::os::fd::AsRawFd::as_raw_fd(file),
            GENERATION_XATTR.as_ptr(),
        )
    };
    if result != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::ENODATA) {
            return Err(error);
        }
    }
    Ok(())
}

/// The subdirectory of `objects/` that holds object `id`: the first byte of the CRC32C of the
/// id, in hex. The 256 of them are made when the target opens, so no object write makes a
/// directory; ext4's hashed directories keep lookups fast at millions of objects each.
fn object_dir(id: u64) -> String {
    let hash = weft_proto::checksum::crc32c(&id.to_le_bytes());
    format!("{:02x}", hash & 0xff)
}

fn read_dir_if_present(path: &Path) -> io::Result<Option<fs::ReadDir>> {
    match fs::read_dir(path) {
        Ok(entries) => Ok(Some(entries)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Whether `name` is a subdirectory name of the object tree: two hex digits.
fn is_fan_out_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Moves the objects of a tree of the older two-level layout (`<aa>/<bb>/<inode>`) up into
/// `<aa>/`, where [`Tree::object_path`] looks for them, and removes the emptied `<bb>`
/// directories. Each move is one rename, so an interrupted pass is finished by the next open.
fn flatten_object_dirs(objects: &Path) -> io::Result<()> {
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

/// The inode ids of the object files under `objects` that sit where [`Tree::object_path`]
/// puts them; anything else (leftovers of other tools) is not an object and is skipped.
fn collect_objects(objects: &Path, found: &mut Vec<InodeId>) -> io::Result<()> {
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
fn directory_bytes(path: &Path) -> io::Result<u64> {
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
