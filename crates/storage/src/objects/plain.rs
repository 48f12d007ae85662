//! The plain store: objects through the page cache, their files held open in a table so a
//! request pays no open and close, and removed files emptied into a pool a new object reuses
//! (`recycle`). Writes at least `direct_write_min` bytes long and aligned go to the disk with
//! O_DIRECT, and large reads of bytes not in the cache come back the same way.

use bytes::Bytes;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{ObjectError, ObjectId, ObjectStore, Space, Tree};
use crate::recycle::{FreeFiles, Placed};
use weft_proto::ids::InodeId;
use weft_proto::messages::FallocateMode;

/// Object files kept open per target; when the table is full it drops every file no request
/// is using.
const FILES_OPEN_MAX: usize = 1024;

/// Writes at least this large start their own writeback at once.
const WRITEBACK_START_BYTES: usize = 256 * 1024;

pub(crate) struct PlainStore {
    tree: Tree,
    /// Open object files. Removing an object takes it out under the same lock before the
    /// unlink, and every request goes through here, so a removal knows whether anyone still
    /// holds the file.
    files: Mutex<HashMap<ObjectId, Arc<ObjectFile>>>,
    /// Emptied object files a new object reuses.
    free: FreeFiles,
    /// Writes at least this large and 4 KiB-aligned go to the disk with O_DIRECT.
    direct_write_min: Option<usize>,
}

/// An object file held open: the descriptor requests use, one with O_DIRECT for large
/// aligned writes (opened on first need), and the truncate generation the file records,
/// read when the table takes the file in and kept up to date there.
struct ObjectFile {
    file: File,
    direct: OnceLock<File>,
    generation: AtomicU64,
}

impl ObjectFile {
    fn held(file: File, path: &Path) -> Result<ObjectFile, ObjectError> {
        let generation = super::recorded_generation(&file)
            .map_err(ObjectError::io("read truncate generation", path))?;
        Ok(ObjectFile {
            file,
            direct: OnceLock::new(),
            generation: AtomicU64::new(generation),
        })
    }

    /// The object's O_DIRECT descriptor (the same inode as `file`).
    fn direct(&self) -> std::io::Result<&File> {
        if let Some(direct) = self.direct.get() {
            return Ok(direct);
        }
        let reopened = crate::direct::reopen(&self.file)?;
        Ok(self.direct.get_or_init(|| reopened))
    }

    /// Records truncate `generation` in the file and here.
    fn record(&self, path: &Path, generation: u64) -> Result<(), ObjectError> {
        let previous = self.generation.load(Ordering::Acquire);
        super::record_generation(&self.file, path, previous, generation)?;
        self.generation.store(generation, Ordering::Release);
        Ok(())
    }
}

impl PlainStore {
    pub fn new(tree: Tree, direct_write_min: Option<usize>) -> std::io::Result<PlainStore> {
        Ok(PlainStore {
            free: FreeFiles::open(tree.root())?,
            tree,
            files: Mutex::default(),
            direct_write_min,
        })
    }

    /// The object's held file (`None`: the object does not exist and `create` is false).
    fn held(&self, object: ObjectId, create: bool) -> Result<Option<Arc<ObjectFile>>, ObjectError> {
        let mut open = self.files.lock().expect("open files poisoned");
        if let Some(file) = open.get(&object) {
            return Ok(Some(Arc::clone(file)));
        }
        let path = self.tree.object_path(object);
        let file = match open_read_write(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if !create {
                    return Ok(None);
                }
                self.create(object, &path)?
            }
            Err(error) => return Err(ObjectError::io("open object", &path)(error)),
        };
        if open.len() >= FILES_OPEN_MAX {
            // A file a request holds stays, so a removal can tell it is in use.
            open.retain(|_, file| Arc::strong_count(file) > 1);
        }
        let file = Arc::new(ObjectFile::held(file, &path)?);
        open.insert(object, Arc::clone(&file));
        Ok(Some(file))
    }

    /// The object's held file, created if missing.
    fn held_for_write(&self, object: ObjectId) -> Result<Arc<ObjectFile>, ObjectError> {
        Ok(self.held(object, true)?.expect("created when missing"))
    }

    /// Creates `object`'s missing file at `path` from a pooled file when the pool has one,
    /// else as a new file. Called under the open-file table's lock.
    fn create(&self, object: ObjectId, path: &Path) -> Result<File, ObjectError> {
        match self.free.place(path) {
            Ok(placed @ (Placed::Moved | Placed::Occupied)) => {
                if matches!(placed, Placed::Moved) {
                    self.tree.note_new_entry(object);
                }
                return open_read_write(path).map_err(ObjectError::io("open object", path));
            }
            Ok(Placed::Empty) => {}
            Err(error) => {
                tracing::warn!(root = %self.tree.root().display(), %error, "could not reuse a pooled object file");
            }
        }
        self.tree.open_for_write(object)
    }

    /// Cuts the file at `path` (held open as `held`, if it is) to nothing and moves it into
    /// the pool; true when it is gone from `path` (or was never there). Called under the
    /// open-file table's lock, with no request holding the file.
    fn empty_into_pool(
        &self,
        held: Option<Arc<ObjectFile>>,
        path: &Path,
    ) -> Result<bool, ObjectError> {
        // The generation goes first: a pooled file must never bring one to its next object.
        let emptied = match held {
            Some(file) => super::clear_generation(&file.file).and_then(|()| file.file.set_len(0)),
            None => OpenOptions::new().write(true).open(path).and_then(|file| {
                super::clear_generation(&file)?;
                file.set_len(0)
            }),
        };
        match emptied {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(error) => return Err(ObjectError::io("empty object", path)(error)),
        }
        self.free
            .keep(path)
            .map_err(ObjectError::io("pool object file", path))
    }
}

impl ObjectStore for PlainStore {
    fn tree(&self) -> &Tree {
        &self.tree
    }

    fn is_open(&self, object: ObjectId) -> bool {
        self.files
            .lock()
            .expect("open files poisoned")
            .contains_key(&object)
    }

    fn exists(&self, object: ObjectId) -> bool {
        self.tree.object_path(object).exists()
    }

    fn length(&self, object: ObjectId) -> Result<u64, ObjectError> {
        match self.held(object, false)? {
            Some(file) => Ok(file
                .file
                .metadata()
                .map_err(|e| ObjectError::io("stat object", &self.tree.object_path(object))(e))?
                .len()),
            None => Ok(0),
        }
    }

    fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, ObjectError> {
        let Some(file) = self.held(object, false)? else {
            return Ok(Bytes::new());
        };
        let path = || self.tree.object_path(object);
        let length = file
            .file
            .metadata()
            .map_err(|e| ObjectError::io("stat object", &path())(e))?
            .len();
        let wanted = length.saturating_sub(offset).min(u64::from(len)) as usize;
        if wanted == 0 {
            return Ok(Bytes::new());
        }
        let large = self.direct_write_min.is_some_and(|min| wanted >= min);
        if large && !fully_cached(&file.file, offset, wanted as u64) {
            // Not all in the page cache (large writes skip it): from the disk directly,
            // without filling the cache on the way.
            return file
                .direct()
                .and_then(|direct| crate::direct::read_owned(direct, offset, wanted))
                .map_err(|e| ObjectError::io("read object", &path())(e));
        }
        // Bytes a concurrent truncate took read as zeros.
        let mut buffer = vec![0u8; wanted];
        let mut filled = 0usize;
        while filled < buffer.len() {
            let count = file
                .file
                .read_at(&mut buffer[filled..], offset + filled as u64)
                .map_err(|e| ObjectError::io("read object", &path())(e))?;
            if count == 0 {
                break;
            }
            filled += count;
        }
        Ok(Bytes::from(buffer))
    }

    /// Reads like [`ObjectStore::read`] if the object's file is held open and the page cache
    /// holds every byte asked for (`preadv2` with `RWF_NOWAIT`), so the read cannot wait for
    /// the disk; `None` when it could, and the caller reads the usual way. Also `None` when
    /// the object has not had truncate `generation`: the usual way checks it.
    fn read_cached(
        &self,
        object: ObjectId,
        offset: u64,
        len: u32,
        generation: u64,
    ) -> Option<Bytes> {
        let file = self
            .files
            .lock()
            .expect("open files poisoned")
            .get(&object)
            .cloned()?;
        if generation > file.generation.load(Ordering::Acquire) {
            return None;
        }
        let length = file.file.metadata().ok()?.len();
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

    fn write(&self, object: ObjectId, offset: u64, data: Bytes) -> Result<(), ObjectError> {
        let file = self.held_for_write(object)?;
        let path = || self.tree.object_path(object);
        if self.direct_write_min.is_some_and(|min| data.len() >= min)
            && crate::direct::is_aligned(offset, data.len())
        {
            return file
                .direct()
                .and_then(|direct| crate::direct::write_aligned(direct, offset, &data))
                .map_err(|e| ObjectError::io("write object", &path())(e));
        }
        file.file
            .write_all_at(&data, offset)
            .map_err(|e| ObjectError::io("write object", &path())(e))?;
        if data.len() >= WRITEBACK_START_BYTES {
            start_writeback(&file.file, offset, data.len());
        }
        Ok(())
    }

    fn generation(&self, object: ObjectId) -> Result<u64, ObjectError> {
        // A held file keeps what it records up to date.
        Ok(self
            .held(object, false)?
            .map_or(0, |file| file.generation.load(Ordering::Acquire)))
    }

    fn record_generation(&self, object: ObjectId, generation: u64) -> Result<(), ObjectError> {
        let file = self.held_for_write(object)?;
        file.record(&self.tree.object_path(object), generation)?;
        self.tree.note_unsynced_generation(object);
        Ok(())
    }

    fn cut(&self, object: ObjectId, length: u64, generation: u64) -> Result<u64, ObjectError> {
        let path = self.tree.object_path(object);
        let file = self
            .held(object, false)?
            .ok_or_else(|| ObjectError::Vanished { path: path.clone() })?;
        self.tree.cut(object, &file.file, length, || {
            file.record(&path, generation)
        })
    }

    fn fallocate(
        &self,
        object: ObjectId,
        range: (u64, u64),
        mode: FallocateMode,
        _length: u64,
    ) -> Result<(), ObjectError> {
        let file = self.held_for_write(object)?;
        self.tree.fallocate(object, &file.file, range, mode)
    }

    fn list(&self, space: Space) -> Result<Vec<InodeId>, ObjectError> {
        self.tree.list(space)
    }

    fn remove(&self, object: ObjectId) -> Result<(), ObjectError> {
        self.tree.forget(object);
        // No request may open the object again between forgetting it and removing it.
        let mut open = self.files.lock().expect("open files poisoned");
        let held = open.remove(&object);
        let path = self.tree.object_path(object);
        let pooled = match held {
            // A request still using the file could write into its next life: unlink it.
            Some(held) if Arc::strong_count(&held) > 1 => false,
            held => self.empty_into_pool(held, &path)?,
        };
        if !pooled {
            self.tree.unlink(object)?;
        }
        drop(open);
        Ok(())
    }

    fn sync(&self, object: ObjectId) -> Result<(), ObjectError> {
        match self.held(object, false)? {
            Some(file) => self.tree.sync_object(object, &file.file),
            None => Ok(()),
        }
    }

    fn sync_everything(&self) -> Result<(), ObjectError> {
        self.tree.sync_file_system()
    }
}

/// Opens an existing object file for reading and writing.
fn open_read_write(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// The least write that goes to the disk with O_DIRECT: none when turned off (0), or when
/// the file system refuses O_DIRECT (tmpfs), which is logged and leaves the page cache.
pub(super) fn direct_write_min(root: &Path, min_bytes: u64) -> Option<usize> {
    if min_bytes == 0 {
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
    use std::os::unix::fs::MetadataExt;
    use weft_proto::ids::NodeId;

    /// A removed object's file is emptied and reused by the next new object, which reads
    /// only its own bytes; a file a request still holds is unlinked instead, so a late write
    /// through it cannot reach the next object.
    #[test]
    fn removed_objects_are_reused_only_when_no_request_holds_them() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (tree, _) = Tree::open(directory.path()).expect("tree");
        let store = PlainStore::new(tree, None).expect("open");
        let (old, new) = (
            ObjectId::plain(InodeId::new(NodeId(1), 1)),
            ObjectId::plain(InodeId::new(NodeId(1), 2)),
        );
        store
            .write(old, 0, Bytes::from(vec![7u8; 8192]))
            .expect("write");
        let old_ino = std::fs::metadata(store.tree.object_path(old))
            .expect("stat")
            .ino();
        store.remove(old).expect("remove");
        assert_eq!(store.free.len(), 1, "the removed object's file is pooled");
        assert!(!store.exists(old));
        store
            .write(new, 3, Bytes::from_static(b"new"))
            .expect("write");
        assert_eq!(store.free.len(), 0);
        assert_eq!(
            std::fs::metadata(store.tree.object_path(new))
                .expect("stat")
                .ino(),
            old_ino,
            "the new object reuses the file"
        );
        assert_eq!(&store.read(new, 0, 100).expect("read")[..], b"\0\0\0new");

        let held = store.held(new, false).expect("open").expect("exists");
        store.remove(new).expect("remove");
        assert_eq!(store.free.len(), 0, "a held file is not pooled");
        assert_eq!(
            held.file.metadata().expect("stat").nlink(),
            0,
            "it is unlinked"
        );
        held.file.write_all_at(b"late", 0).expect("late write");
        store
            .write(old, 0, Bytes::from_static(b"x"))
            .expect("write");
        assert_eq!(&store.read(old, 0, 100).expect("read")[..], b"x");
    }
}
