//! What the FUSE adapter keeps between kernel requests: the client, open files by handle,
//! and the caches that spare round trips (files without extended attributes or without
//! capabilities, directories' and written files' attributes).

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
    /// Files known to have no extended attributes, or none called `security.capability`,
    /// since an instant (see [`State::xattr_absent`]).
    pub(super) xattrs_absent: Mutex<HashMap<u64, (std::time::Instant, Absent)>>,
    /// Directories' attributes as this client's last change of them left them.
    pub(super) dirs: Arc<fresh::FreshAttrs>,
    /// Regular files' attributes as this client made them or last changed them, until their
    /// next size report (`fresh.rs`).
    pub(super) files: Arc<fresh::FreshAttrs>,
    /// What the server listed of each open directory that the kernel did not take yet.
    pub(super) listings: super::listings::Listings,
}

/// The extended attribute the kernel asks for before every write, to drop file capabilities.
pub(super) const CAPABILITY_XATTR: &str = "security.capability";

/// Most files remembered without extended attributes or file capabilities; older entries
/// go first when it is full.
pub(super) const XATTRS_ABSENT_REMEMBERED_MAX: usize = 65_536;

/// Which extended attributes a file is known not to have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Absent {
    /// None at all: its attributes said so (`InodeAttr::xattr_free`).
    All,
    /// No `security.capability`: its server answered so, or this client just made the file.
    Capability,
    /// Nothing: this client just changed them, and attributes fetched before the change may
    /// still arrive saying there are none.
    Unknown,
}

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
    /// Whether `ino` is known to have no extended attribute `name`: `ls -l` asks for two of
    /// every file it lists, and the kernel for `security.capability` before every write. What
    /// is known is trusted for the attribute cache time and only until the file is opened
    /// again or this client changes its extended attributes — the consistency of cached
    /// attributes — so these cost no round trip.
    pub(super) fn xattr_absent(&self, ino: INodeNo, name: Option<&str>) -> bool {
        self.xattrs_absent
            .lock()
            .expect("extended attribute cache poisoned")
            .get(&ino.0)
            .is_some_and(|(since, absent)| {
                since.elapsed() < self.ttl
                    && match absent {
                        Absent::All => true,
                        Absent::Capability => name == Some(CAPABILITY_XATTR),
                        Absent::Unknown => false,
                    }
            })
    }

    /// Remembers, as of now, what `ino` is known not to have.
    pub(super) fn note_absent(&self, ino: INodeNo, absent: Absent) {
        if self.ttl.is_zero() {
            return;
        }
        let mut known = self
            .xattrs_absent
            .lock()
            .expect("extended attribute cache poisoned");
        if known.len() >= XATTRS_ABSENT_REMEMBERED_MAX {
            let ttl = self.ttl;
            known.retain(|_, (since, _)| since.elapsed() < ttl);
            if known.len() >= XATTRS_ABSENT_REMEMBERED_MAX {
                known.clear();
            }
        }
        let kept = known
            .get(&ino.0)
            .filter(|(since, _)| since.elapsed() < self.ttl)
            .map(|(_, kept)| *kept);
        match (kept, absent) {
            // What attributes say is not trusted over a change this client just made: they
            // may have been read before it.
            (Some(Absent::Unknown), Absent::All) => return,
            // Knowing it has none at all says more than knowing it has no capability.
            (Some(Absent::All), Absent::Capability) => return,
            _ => {}
        }
        known.insert(ino.0, (std::time::Instant::now(), absent));
    }

    /// Learns from attributes just fetched whether `ino` has extended attributes.
    fn learn_xattrs(&self, ino: INodeNo, xattr_free: bool) {
        if xattr_free {
            self.note_absent(ino, Absent::All);
            return;
        }
        let mut known = self
            .xattrs_absent
            .lock()
            .expect("extended attribute cache poisoned");
        if known
            .get(&ino.0)
            .is_some_and(|(_, absent)| *absent == Absent::All)
        {
            known.remove(&ino.0);
        }
    }

    /// Forgets what is known about `ino`'s extended attributes: it is opened, and what its
    /// attributes say next is fetched after the open.
    pub(super) fn forget_xattrs(&self, ino: INodeNo) {
        self.xattrs_absent
            .lock()
            .expect("extended attribute cache poisoned")
            .remove(&ino.0);
    }

    /// This client changes `ino`'s extended attributes: nothing is known of them, and for the
    /// attribute cache time no attributes fetched meanwhile (perhaps before the change) say
    /// otherwise.
    pub(super) fn changing_xattrs(&self, ino: INodeNo) {
        self.note_absent(ino, Absent::Unknown);
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

    /// The attributes the kernel should see: the server's, with this client's unreported size;
    /// what they say of the file's extended attributes is learned.
    pub(super) fn merge(&self, attr: InodeAttr) -> FileAttr {
        self.learn_xattrs(self.ino_of(attr.inode), attr.xattr_free);
        self.file_attr(attr)
    }

    /// The attributes the kernel should see, as [`State::merge`], of attributes kept since
    /// they were fetched (what they say of extended attributes is as old as they are).
    pub(super) fn file_attr(&self, attr: InodeAttr) -> FileAttr {
        self.fuse_attr(self.client.known(attr))
    }

    /// The kernel's form of attributes this client's own knowledge is already in.
    pub(super) fn fuse_attr(&self, attr: InodeAttr) -> FileAttr {
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
