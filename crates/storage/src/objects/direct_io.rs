//! The direct-I/O store (`direct_io = true`): every read and write bypasses the page cache,
//! so a storage server's memory does not fill with data its clients already cache, and the
//! disk sees the I/O when it happens. A file is opened per request.
//!
//! Per object stripe, aligned writes share a lock; read-modify-writes (unaligned writes,
//! `crate::direct`), cuts and punches take it alone: a cut or a punch between a write's read
//! of its edge blocks and its write of them would be undone by the old bytes it writes.

use bytes::Bytes;
use std::sync::{RwLock, RwLockWriteGuard};

use super::{ObjectError, ObjectId, ObjectStore, Space, Tree};
use weft_proto::ids::InodeId;
use weft_proto::messages::FallocateMode;

/// Lock stripes of a direct-I/O store.
const STRIPES: u64 = 64;

pub(crate) struct DirectStore {
    tree: Tree,
    stripes: Vec<RwLock<()>>,
}

impl DirectStore {
    pub fn new(tree: Tree) -> DirectStore {
        DirectStore {
            tree,
            stripes: (0..STRIPES).map(|_| RwLock::new(())).collect(),
        }
    }

    fn stripe(&self, object: ObjectId) -> &RwLock<()> {
        &self.stripes[(object.inode.0 % STRIPES) as usize]
    }

    /// `object`'s stripe held alone: taken by a read-modify-write and by whatever cuts or
    /// punches the object.
    fn alone(&self, object: ObjectId) -> RwLockWriteGuard<'_, ()> {
        self.stripe(object).write().expect("direct lock poisoned")
    }
}

impl ObjectStore for DirectStore {
    fn tree(&self) -> &Tree {
        &self.tree
    }

    fn is_direct(&self) -> bool {
        true
    }

    fn exists(&self, object: ObjectId) -> bool {
        self.tree.object_path(object).exists()
    }

    fn length(&self, object: ObjectId) -> Result<u64, ObjectError> {
        let path = self.tree.object_path(object);
        match std::fs::metadata(&path) {
            Ok(metadata) => Ok(metadata.len()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(error) => Err(ObjectError::io("stat object", &path)(error)),
        }
    }

    fn read(&self, object: ObjectId, offset: u64, len: u32) -> Result<Bytes, ObjectError> {
        let wanted = self
            .length(object)?
            .saturating_sub(offset)
            .min(u64::from(len)) as usize;
        if wanted == 0 {
            return Ok(Bytes::new());
        }
        let path = self.tree.object_path(object);
        let file =
            crate::direct::open(&path, false).map_err(ObjectError::io("open object", &path))?;
        crate::direct::read_owned(&file, offset, wanted)
            .map_err(ObjectError::io("read object", &path))
    }

    fn write(&self, object: ObjectId, offset: u64, data: Bytes) -> Result<(), ObjectError> {
        let stripe = self.stripe(object);
        let _shared;
        let _alone;
        if crate::direct::is_aligned(offset, data.len()) {
            _shared = stripe.read().expect("direct lock poisoned");
        } else {
            _alone = stripe.write().expect("direct lock poisoned");
        }
        let file = self
            .tree
            .open_creating(object, |path| crate::direct::open(path, true))?;
        let path = self.tree.object_path(object);
        // The length under the lock: another write may have grown it.
        let length = file
            .metadata()
            .map_err(ObjectError::io("stat object", &path))?
            .len();
        crate::direct::write_at(&file, offset, &data, length)
            .map_err(ObjectError::io("write object", &path))
    }

    fn generation(&self, object: ObjectId) -> Result<u64, ObjectError> {
        match self.tree.open_existing(object, false)? {
            Some(file) => super::recorded_generation(&file).map_err(ObjectError::io(
                "read truncate generation",
                &self.tree.object_path(object),
            )),
            None => Ok(0),
        }
    }

    fn record_generation(&self, object: ObjectId, generation: u64) -> Result<(), ObjectError> {
        let file = self.tree.open_for_write(object)?;
        let path = self.tree.object_path(object);
        let previous = super::recorded_generation(&file)
            .map_err(ObjectError::io("read truncate generation", &path))?;
        super::record_generation(&file, &path, previous, generation)?;
        self.tree.note_unsynced_generation(object);
        Ok(())
    }

    fn cut(&self, object: ObjectId, length: u64, generation: u64) -> Result<u64, ObjectError> {
        let _alone = self.alone(object);
        let path = self.tree.object_path(object);
        let file = self
            .tree
            .open_existing(object, true)?
            .ok_or_else(|| ObjectError::Vanished { path: path.clone() })?;
        let previous = super::recorded_generation(&file)
            .map_err(ObjectError::io("read truncate generation", &path))?;
        self.tree.cut(object, &file, length, || {
            super::record_generation(&file, &path, previous, generation)
        })
    }

    fn fallocate(
        &self,
        object: ObjectId,
        range: (u64, u64),
        mode: FallocateMode,
        _length: u64,
    ) -> Result<(), ObjectError> {
        let _alone = self.alone(object);
        let file = self.tree.open_for_write(object)?;
        self.tree.fallocate(object, &file, range, mode)
    }

    fn list(&self, space: Space) -> Result<Vec<InodeId>, ObjectError> {
        self.tree.list(space)
    }

    fn remove(&self, object: ObjectId) -> Result<(), ObjectError> {
        self.tree.forget(object);
        self.tree.unlink(object)
    }

    fn sync(&self, object: ObjectId) -> Result<(), ObjectError> {
        match self.tree.open_existing(object, false)? {
            Some(file) => self.tree.sync_object(object, &file),
            None => Ok(()),
        }
    }

    fn sync_everything(&self) -> Result<(), ObjectError> {
        self.tree.sync_file_system()
    }
}
