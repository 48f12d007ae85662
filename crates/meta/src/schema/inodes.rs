//! The inode record ([`InodeRecord`]) of the `inodes` table: its fields, its format version
//! and the conversions of the older versions, and what a record says of itself (a
//! directory's names, its attributes as a client sees them); and the truncate queue's record
//! ([`TruncateWork`]).

use super::*;

/// Format version of inode records; older versions decode through explicit migrations.
const INODE_FORMAT_VERSION: u8 = 6;
/// What the unused `next_cookie` of an inode record holds (cookies come from name hashes).
pub(crate) const FIRST_COOKIE: u64 = 3;
/// Cookie bits that number the names of one hash bucket: 256 names whose hashes collide can
/// share a directory.
pub(super) const SLOT_BITS: u32 = 8;
/// Bits of a cookie: the listing position of a spread directory's shard keeps 16 bits above
/// them for the shard.
pub(super) const COOKIE_BITS: u32 = weft_proto::layout::DIR_SHARD_COOKIE_BITS;
/// Most hard links to one inode.
pub(crate) const LINKS_MAX: u32 = 65_000;

/// An inode as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InodeRecord {
    pub kind: FileKind,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub truncate_generation: u64,
    pub layout: Option<FileLayout>,
    pub pattern: Option<StripePattern>,
    pub symlink: Option<String>,
    /// A directory's parent (the root is its own parent). A file's: the directory of one of
    /// its names, the last one made or moved, or 0 when a removed name may have been that
    /// one (see `service::subtree`; files made before parents were kept have 0 too).
    pub parent: u64,
    /// Unused since cookies come from name hashes ([`FIRST_COOKIE`]); kept in the record format.
    pub next_cookie: u64,
    /// A spread directory's shards, itself first (empty when it is not spread).
    pub shards: Vec<u64>,
    /// A shard's spread directory (0 for every other inode).
    pub shard_of: u64,
    /// A shard sealed by the rmdir of its directory: (coordinator, intent). No entry is added
    /// while it is sealed.
    pub sealed: Option<(u32, u64)>,
    /// The project whose quotas count it (0: none), taken from its directory at creation.
    pub project: u32,
    /// The end of the space allocated to a regular file past its size (`fallocate` with
    /// `KEEP_SIZE`), as its writers reported it in its truncate generation; 0 when none.
    /// Quotas count a file's size or this, the larger: space it holds either way.
    pub allocated: u64,
    /// The inode has no extended attributes: set when it is made without any, cleared when
    /// one is set, set again when its last one is removed. False in records of an older
    /// format, whose inodes may have some.
    pub xattr_free: bool,
    /// No object of the file can exist on any target: a regular file made here, to which no
    /// data was written, allocated or moved since (no size report, no size recomputed from
    /// objects, no move). Its removal then disposes of nothing. False in records of an older
    /// format, and for every other kind of inode.
    pub objectless: bool,
}

/// Version 5 of [`InodeRecord`], before files without objects were marked: version 4's fields
/// and then whether the inode has no extended attributes (postcard lays a nested struct's
/// fields out in place, as if they were this one's).
#[derive(Deserialize)]
struct InodeRecordV5 {
    v4: InodeRecordV4,
    xattr_free: bool,
}

impl From<InodeRecordV5> for InodeRecord {
    fn from(v5: InodeRecordV5) -> InodeRecord {
        InodeRecord {
            xattr_free: v5.xattr_free,
            objectless: false,
            ..InodeRecord::from(v5.v4)
        }
    }
}

/// Version 4 of [`InodeRecord`], before inodes without extended attributes were marked.
#[derive(Deserialize)]
struct InodeRecordV4 {
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u32,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    truncate_generation: u64,
    layout: Option<FileLayout>,
    pattern: Option<StripePattern>,
    symlink: Option<String>,
    parent: u64,
    next_cookie: u64,
    shards: Vec<u64>,
    shard_of: u64,
    sealed: Option<(u32, u64)>,
    project: u32,
    allocated: u64,
}

impl From<InodeRecordV4> for InodeRecord {
    fn from(v4: InodeRecordV4) -> InodeRecord {
        InodeRecord {
            kind: v4.kind,
            mode: v4.mode,
            nlink: v4.nlink,
            uid: v4.uid,
            gid: v4.gid,
            size: v4.size,
            rdev: v4.rdev,
            atime: v4.atime,
            mtime: v4.mtime,
            ctime: v4.ctime,
            truncate_generation: v4.truncate_generation,
            layout: v4.layout,
            pattern: v4.pattern,
            symlink: v4.symlink,
            parent: v4.parent,
            next_cookie: v4.next_cookie,
            shards: v4.shards,
            shard_of: v4.shard_of,
            sealed: v4.sealed,
            project: v4.project,
            allocated: v4.allocated,
            xattr_free: false,
            objectless: false,
        }
    }
}

/// Version 3 of [`InodeRecord`], before allocations past the size were kept.
#[derive(Deserialize)]
struct InodeRecordV3 {
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u32,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    truncate_generation: u64,
    layout: Option<FileLayout>,
    pattern: Option<StripePattern>,
    symlink: Option<String>,
    parent: u64,
    next_cookie: u64,
    shards: Vec<u64>,
    shard_of: u64,
    sealed: Option<(u32, u64)>,
    project: u32,
}

impl From<InodeRecordV3> for InodeRecord {
    fn from(v3: InodeRecordV3) -> InodeRecord {
        InodeRecord {
            kind: v3.kind,
            mode: v3.mode,
            nlink: v3.nlink,
            uid: v3.uid,
            gid: v3.gid,
            size: v3.size,
            rdev: v3.rdev,
            atime: v3.atime,
            mtime: v3.mtime,
            ctime: v3.ctime,
            truncate_generation: v3.truncate_generation,
            layout: v3.layout,
            pattern: v3.pattern,
            symlink: v3.symlink,
            parent: v3.parent,
            next_cookie: v3.next_cookie,
            shards: v3.shards,
            shard_of: v3.shard_of,
            sealed: v3.sealed,
            project: v3.project,
            allocated: 0,
            xattr_free: false,
            objectless: false,
        }
    }
}

/// Version 2 of [`InodeRecord`], before projects.
#[derive(Deserialize)]
struct InodeRecordV2 {
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u32,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    truncate_generation: u64,
    layout: Option<FileLayout>,
    pattern: Option<StripePattern>,
    symlink: Option<String>,
    parent: u64,
    next_cookie: u64,
    shards: Vec<u64>,
    shard_of: u64,
    sealed: Option<(u32, u64)>,
}

impl From<InodeRecordV2> for InodeRecord {
    fn from(v2: InodeRecordV2) -> InodeRecord {
        InodeRecord {
            kind: v2.kind,
            mode: v2.mode,
            nlink: v2.nlink,
            uid: v2.uid,
            gid: v2.gid,
            size: v2.size,
            rdev: v2.rdev,
            atime: v2.atime,
            mtime: v2.mtime,
            ctime: v2.ctime,
            truncate_generation: v2.truncate_generation,
            layout: v2.layout,
            pattern: v2.pattern,
            symlink: v2.symlink,
            parent: v2.parent,
            next_cookie: v2.next_cookie,
            shards: v2.shards,
            shard_of: v2.shard_of,
            sealed: v2.sealed,
            project: 0,
            allocated: 0,
            xattr_free: false,
            objectless: false,
        }
    }
}

/// Version 1 of [`InodeRecord`], before spread directories.
#[derive(Deserialize)]
struct InodeRecordV1 {
    kind: FileKind,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    size: u64,
    rdev: u32,
    atime: Timestamp,
    mtime: Timestamp,
    ctime: Timestamp,
    truncate_generation: u64,
    layout: Option<FileLayout>,
    pattern: Option<StripePattern>,
    symlink: Option<String>,
    parent: u64,
    next_cookie: u64,
}

impl From<InodeRecordV1> for InodeRecordV2 {
    fn from(v1: InodeRecordV1) -> InodeRecordV2 {
        InodeRecordV2 {
            kind: v1.kind,
            mode: v1.mode,
            nlink: v1.nlink,
            uid: v1.uid,
            gid: v1.gid,
            size: v1.size,
            rdev: v1.rdev,
            atime: v1.atime,
            mtime: v1.mtime,
            ctime: v1.ctime,
            truncate_generation: v1.truncate_generation,
            layout: v1.layout,
            pattern: v1.pattern,
            symlink: v1.symlink,
            parent: v1.parent,
            next_cookie: v1.next_cookie,
            shards: Vec::new(),
            shard_of: 0,
            sealed: None,
        }
    }
}

/// A truncate that must still reach the targets of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TruncateWork {
    pub generation: u64,
    pub size: u64,
    pub layout: FileLayout,
}

impl InodeRecord {
    /// A new empty directory (two links: its name and its `.`), created now.
    pub fn new_directory(
        mode: u32,
        uid: u32,
        gid: u32,
        parent: InodeId,
        pattern: StripePattern,
    ) -> InodeRecord {
        let timestamp = now();
        InodeRecord {
            kind: FileKind::Directory,
            mode: mode & 0o7777,
            nlink: 2,
            uid,
            gid,
            size: 0,
            rdev: 0,
            atime: timestamp,
            mtime: timestamp,
            ctime: timestamp,
            truncate_generation: 0,
            layout: None,
            pattern: Some(pattern),
            symlink: None,
            parent: parent.0,
            next_cookie: FIRST_COOKIE,
            shards: Vec::new(),
            shard_of: 0,
            sealed: None,
            project: 0,
            allocated: 0,
            xattr_free: true,
            objectless: false,
        }
    }

    /// Whose quotas count it.
    pub fn owner(&self) -> weft_proto::quota::Owner {
        weft_proto::quota::Owner {
            uid: self.uid,
            gid: self.gid,
            project: self.project,
        }
    }

    /// Marks the data (for a directory: the entries) and the attributes changed at `at`.
    pub fn touch(&mut self, at: Timestamp) {
        self.mtime = at;
        self.ctime = at;
    }

    /// A directory's attributes after a change of its entries here, as a get-attributes
    /// of it would answer them: unless it is spread over several servers (a spread directory's
    /// and a shard's are gathered from all of them).
    pub fn whole_dir_attr(&self, inode: InodeId) -> Option<InodeAttr> {
        let whole = self.shards.is_empty() && self.shard_of == 0;
        whole.then(|| self.to_attr(inode))
    }

    pub fn to_attr(&self, inode: InodeId) -> InodeAttr {
        InodeAttr {
            inode,
            kind: self.kind,
            mode: self.mode,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            rdev: self.rdev,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            truncate_generation: self.truncate_generation,
            layout: self.layout.clone(),
            pattern: self.pattern,
            parent: InodeId(self.parent),
            shards: self.shards.iter().copied().map(InodeId).collect(),
            project: self.project,
            xattr_free: self.xattr_free,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![INODE_FORMAT_VERSION];
        bytes.extend(postcard::to_stdvec(self).expect("inode records always encode"));
        bytes
    }

    pub fn decode(inode: u64, bytes: &[u8]) -> Result<InodeRecord, OpError> {
        let damaged =
            |error: postcard::Error| StoreError::damaged(format!("inode {inode:#x}"), error).into();
        match bytes.split_first() {
            Some((&INODE_FORMAT_VERSION, rest)) => postcard::from_bytes(rest).map_err(damaged),
            Some((5, rest)) => postcard::from_bytes::<InodeRecordV5>(rest)
                .map(InodeRecord::from)
                .map_err(damaged),
            Some((4, rest)) => postcard::from_bytes::<InodeRecordV4>(rest)
                .map(InodeRecord::from)
                .map_err(damaged),
            Some((3, rest)) => postcard::from_bytes::<InodeRecordV3>(rest)
                .map(InodeRecord::from)
                .map_err(damaged),
            Some((2, rest)) => postcard::from_bytes::<InodeRecordV2>(rest)
                .map(InodeRecord::from)
                .map_err(damaged),
            Some((1, rest)) => postcard::from_bytes::<InodeRecordV1>(rest)
                .map(|v1| InodeRecord::from(InodeRecordV2::from(v1)))
                .map_err(damaged),
            Some((version, _)) => Err(OpError::inconsistent(format!(
                "inode {inode:#x} has unknown format version {version}"
            ))),
            None => Err(OpError::inconsistent(format!("inode {inode:#x} is empty"))),
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Directory
    }

    /// Fails with `WrongShard` when this is a spread directory and `name` belongs to another
    /// of its shards: a client that did not know the directory is spread asked its home.
    pub fn check_holds_name(&self, inode: InodeId, name: &str) -> Result<(), OpError> {
        let shard = weft_proto::layout::dir_shard_of_name(name, self.shards.len());
        if shard == 0 {
            return Ok(());
        }
        Err(OpError::rejected(
            ErrorCode::WrongShard,
            format!("{name:?} of spread directory {inode} is held by its shard {shard}"),
        ))
    }

    /// Whether `name` may be added here: this shard holds it, and no rmdir has sealed it.
    pub fn accepts_new_name(&self, inode: InodeId, name: &str) -> Result<(), OpError> {
        self.check_holds_name(inode, name)?;
        if self.sealed.is_some() {
            return Err(OpError::rejected(
                ErrorCode::Busy,
                format!("directory {inode} is being removed; try again"),
            ));
        }
        Ok(())
    }
}
