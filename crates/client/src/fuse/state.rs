//! What the FUSE adapter keeps between kernel requests: the client, open files by handle,
//! and the caches that spare round trips (files without capabilities, directories' attributes).

use super::*;

pub(super) struct State {
    pub(super) client: Arc<Client>,
    /// How long the kernel may trust what it is told.
    pub(super) ttl: Duration,
    /// Tells the kernel to forget cached attributes; set once the session exists.
    pub(super) notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Open files by FUSE handle (the handle's number with its metadata server).
    pub(super) handles: Mutex<HashMap<u64, Arc<OpenFile>>>,
    /// Ask the kernel for writeback caching.
    pub(super) writeback_cache: bool,
    /// Files known to have no `security.capability` since an instant (see
    /// [`State::capability_absent`]).
    pub(super) no_capability: Mutex<HashMap<u64, std::time::Instant>>,
    /// Directories' attributes as this client's last change of them left them.
    pub(super) dirs: Arc<dirs::FreshDirs>,
}

/// The extended attribute the kernel asks for before every write, to drop file capabilities.
pub(super) const CAPABILITY_XATTR: &str = "security.capability";

/// Most files remembered without file capabilities; older entries go first when it is full.
pub(super) const NO_CAPABILITY_REMEMBERED_MAX: usize = 65_536;

impl State {
    /// The inode of a FUSE inode number: 1 is the client's root ([`Client::root`]).
    pub(super) fn inode_of(&self, ino: INodeNo) -> InodeId {
        if ino.0 == 1 {
            self.client.root()
        } else {
            InodeId(ino.0)
        }
    }

    /// The FUSE inode number of an inode.
    pub(super) fn ino_of(&self, inode: InodeId) -> INodeNo {
        if inode == self.client.root() {
            INodeNo(1)
        } else {
            INodeNo(inode.0)
        }
    }
}

impl State {
    /// Whether `ino` is known to have no `security.capability`, which the kernel asks before
    /// every write. The answer is trusted for the attribute cache time and only until the
    /// file is opened again or this client changes its extended attributes — the consistency
    /// of cached attributes — so a write does not pay a round trip for it.
    pub(super) fn capability_absent(&self, ino: INodeNo) -> bool {
        self.no_capability
            .lock()
            .expect("capability cache poisoned")
            .get(&ino.0)
            .is_some_and(|since| since.elapsed() < self.ttl)
    }

    /// Remembers that `ino` has no `security.capability` as of now.
    pub(super) fn note_no_capability(&self, ino: INodeNo) {
        if self.ttl.is_zero() {
            return;
        }
        let mut absent = self
            .no_capability
            .lock()
            .expect("capability cache poisoned");
        if absent.len() >= NO_CAPABILITY_REMEMBERED_MAX {
            let ttl = self.ttl;
            absent.retain(|_, since| since.elapsed() < ttl);
            if absent.len() >= NO_CAPABILITY_REMEMBERED_MAX {
                absent.clear();
            }
        }
        absent.insert(ino.0, std::time::Instant::now());
    }

    /// Forgets what is known about `ino`'s file capabilities.
    pub(super) fn forget_capability(&self, ino: INodeNo) {
        self.no_capability
            .lock()
            .expect("capability cache poisoned")
            .remove(&ino.0);
    }

    /// Makes the kernel ask for `ino`'s attributes again before it next uses them (an open
    /// must see what other clients changed, even within the cache time).
    pub(super) fn forget_attributes(&self, ino: INodeNo) {
        if self.ttl.is_zero() {
            return;
        }
        if let Some(notifier) = self.notifier.get() {
            if let Err(error) = notifier.inval_inode(ino, -1, 0) {
                tracing::debug!(%error, "could not invalidate cached attributes");
            }
        }
    }

    /// The attributes the kernel should see: the server's, with this client's unreported size.
    pub(super) fn merge(&self, attr: InodeAttr) -> FileAttr {
        let attr = self.client.known(attr);
        let block_size = attr
            .layout
            .as_ref()
            .map(|l| l.pattern.chunk_size_bytes)
            .unwrap_or(4096);
        FileAttr {
            ino: self.ino_of(attr.inode),
            size: attr.size,
            blocks: attr.size.div_ceil(512),
            atime: system_time(attr.atime),
            mtime: system_time(attr.mtime),
            ctime: system_time(attr.ctime),
            crtime: system_time(attr.ctime),
            kind: file_type(attr.kind),
            perm: (attr.mode & 0o7777) as u16,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: attr.rdev,
            blksize: block_size.min(FUSE_IO_BYTES_MAX),
            flags: 0,
        }
    }

    pub(super) fn handle(&self, handle: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        self.handles
            .lock()
            .expect("handle table poisoned")
            .get(&handle.0)
            .cloned()
            .ok_or(Errno::EBADF)
    }

    /// Records an open file under its handle.
    pub(super) fn add_handle(&self, file: OpenFile) -> FileHandle {
        let handle = file.handle();
        self.handles
            .lock()
            .expect("handle table poisoned")
            .insert(handle, Arc::new(file));
        FileHandle(handle)
    }

    /// Releases every lock `owner` holds on `inode`, if it holds any.
    pub(super) async fn release_locks(
        &self,
        inode: InodeId,
        owner: u64,
    ) -> Result<(), ClientError> {
        if !self.client.holds_locks(inode, owner) {
            return Ok(());
        }
        let unlock = LockRange {
            owner,
            kind: LockKind::Unlock,
            start: 0,
            end: u64::MAX,
            pid: 0,
        };
        self.client.set_lock(inode, unlock, 0).await
    }
}
