//! Requests served by metadata servers ([`MetaRequest`]) and the records they carry: inodes,
//! attributes, directory entries, locks, size reports.

use super::*;

/// Identifies a mutating metadata request so a retry gets the original answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MutationId {
    /// The client session.
    pub client: ClientId,
    /// Increases by one per mutating request of this client.
    pub seq: u64,
    /// The lowest sequence number the client still waits for: replies below it may be dropped.
    pub oldest_pending: u64,
}

/// A client's change to a home, numbered by the home in the order it made its changes: what
/// the client keeps until the home's last synced number covers it, and sends back
/// ([`MetaRequest::Replay`]) when the home restarts without it (docs/design/crash-consistency.md,
/// "Durability by replay").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumberedChange {
    /// The start of the home that made it: its lock epoch ([`MetaRequest::LockEpoch`]), new
    /// at every start. A home that started since tells a change it lost from one it made.
    pub incarnation: u64,
    /// Its number among the home's changes.
    pub number: u64,
    /// The request that made it.
    pub mutation: MutationId,
    /// The rows it made, as the home's store encodes them; empty when the change was on disk
    /// when it was answered, and there is nothing to keep.
    pub rows: Vec<u8>,
    /// The home's proof that it made these rows with this number for this mutation (an
    /// HMAC-SHA256 under a key only the cluster's members derive); empty in a cluster without
    /// a key, or with `rows`.
    pub proof: Vec<u8>,
}

/// The kind of a non-directory inode a create makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Wire)]
pub enum FileKind {
    /// A regular file.
    #[wire(tag = 0)]
    Regular,
    /// A directory.
    #[wire(tag = 1)]
    Directory,
    /// A symbolic link.
    #[wire(tag = 2)]
    Symlink,
    /// A named pipe.
    #[wire(tag = 3)]
    Fifo,
    /// A Unix domain socket.
    #[wire(tag = 4)]
    Socket,
    /// A character device.
    #[wire(tag = 5)]
    CharDevice,
    /// A block device.
    #[wire(tag = 6)]
    BlockDevice,
}

/// What a new inode is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewInode {
    /// What to create.
    pub kind: FileKind,
    /// Requested permission bits, umask not applied.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// The creator's umask, applied unless the directory has a default ACL.
    pub umask: u32,
    /// Device number for device files.
    pub rdev: u32,
    /// Target of a symbolic link.
    pub symlink: Option<String>,
}

/// A time stamp with nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    /// Seconds since the Unix epoch.
    pub seconds: i64,
    /// Nanoseconds within the second.
    pub nanos: u32,
}

/// A time a setattr sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum TimeSet {
    /// The server's current time.
    #[wire(tag = 0)]
    Now,
    /// A given time.
    #[wire(tag = 1)]
    At(Timestamp),
}

/// An inode's attributes, as a stat shows them, plus its layout or pattern.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeAttr {
    /// The inode.
    pub inode: InodeId,
    /// File type.
    pub kind: FileKind,
    /// Permission bits, with set-id and sticky bits (no file type bits).
    pub mode: u32,
    /// Hard link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Device number for device files.
    pub rdev: u32,
    /// Last access.
    pub atime: Timestamp,
    /// Last data change.
    pub mtime: Timestamp,
    /// Last attribute change.
    pub ctime: Timestamp,
    /// Truncate generation: size reports from older generations are dropped.
    pub truncate_generation: u64,
    /// A regular file's layout.
    pub layout: Option<FileLayout>,
    /// A directory's pattern.
    pub pattern: Option<StripePattern>,
    /// A directory's parent (the root's is itself); zero for other kinds.
    pub parent: InodeId,
    /// A spread directory's shards: the directory inodes that hold its entries, by
    /// [`crate::layout::dir_shard_of_name`]; the first is the directory itself. Empty for a
    /// directory on one server and for other kinds.
    pub shards: Vec<InodeId>,
    /// The project whose quotas count the inode (a directory tree's, `weft quota project`);
    /// 0 for none. New inodes take their directory's.
    #[serde(default, with = "crate::wire::since_5")]
    pub project: u32,
    /// The inode has no extended attributes (POSIX ACLs included): a client answers a read
    /// or a listing of them itself while these attributes are fresh. False when it has some,
    /// or its server did not say (an older one).
    #[serde(default, with = "crate::wire::since_13")]
    pub xattr_free: bool,
}

/// Attribute changes of a setattr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttrChanges {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// New project (`weft quota project`; a client whose access the servers check may not).
    #[serde(default, with = "crate::wire::since_5_set")]
    pub project: Option<u32>,
}

/// One directory entry of a listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The name.
    pub name: String,
    /// The inode it names.
    pub inode: InodeId,
    /// Its type.
    pub kind: FileKind,
    /// Stable position in the directory: a listing resumes after it.
    pub cookie: u64,
}

/// A directory entry with the attributes of the inode it names, when the directory's server
/// holds that inode (a directory placed on another server, or a hard link to a file of another
/// home, comes without them: the client asks the inode's own server).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntryPlus {
    /// The entry.
    pub entry: DirEntry,
    /// Its inode's attributes, as a get-attributes of the directory's server would answer.
    pub attr: Option<InodeAttr>,
}

/// How a setxattr treats an existing attribute (XATTR_CREATE / XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Wire)]
pub enum XattrSetMode {
    /// Create or replace.
    #[default]
    #[wire(tag = 0)]
    Any,
    /// Fail with EEXIST if it exists.
    #[wire(tag = 1)]
    Create,
    /// Fail with ENODATA if it does not exist.
    #[wire(tag = 2)]
    Replace,
}

/// The kind of a byte-range lock request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum LockKind {
    /// Shared (F_RDLCK).
    #[wire(tag = 0)]
    Read,
    /// Exclusive (F_WRLCK).
    #[wire(tag = 1)]
    Write,
    /// Release (F_UNLCK).
    #[wire(tag = 2)]
    Unlock,
}

/// A byte-range lock of one lock owner (a process for fcntl locks, an open file for flock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRange {
    /// The lock owner, unique within the client.
    pub owner: u64,
    /// Shared, exclusive or release.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`u64::MAX` for "to the end of the file").
    pub end: u64,
    /// The process that asked, reported to F_GETLK callers.
    pub pid: u32,
}

/// Flags of a rename.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameFlags {
    /// Fail with EEXIST if the new name exists.
    pub no_replace: bool,
    /// Swap the two entries atomically.
    pub exchange: bool,
}

/// A writer's report of what it did to a file since its last report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeReport {
    /// One past the last byte written.
    pub size: u64,
    /// The truncate generation the writes belong to.
    pub truncate_generation: u64,
    /// Whether the new size must be durable before the reply (fsync).
    pub durable: bool,
    /// Whether the file's data changed since the last report: only then do its mtime and
    /// ctime move to the time of the report. A report that only confirms a size (fsync after
    /// a `futimens`, as `cp -p` and `tar x` do) leaves the times alone.
    pub modified: bool,
    /// The slots of the file's layout this client wrote to in the generation: the file
    /// records them, so `weft fsck` can tell a lost object from a hole.
    pub written: SlotSet,
    /// The end of what this client allocated past the size in the generation (`fallocate`
    /// with `KEEP_SIZE`), which quotas count; 0 when nothing (protocol version 9).
    #[serde(default, with = "crate::wire::since_9")]
    pub allocated: u64,
}

/// Requests served by a metadata server.
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr, crate::access::Declared)]
#[request(response = MetaResponse, answers = meta_answers, calls = MetaCalls)]
#[strum(serialize_all = "snake_case")]
pub enum MetaRequest {
    /// Looks a name up in a directory.
    ///
    /// Fails with `NotFound`.
    #[wire(tag = 0)]
    #[request(reads, inodes(parent), route = holder(parent, name), answer = InodeAttr)]
    Lookup {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Reads an inode's attributes.
    ///
    /// Fails with `NotFound`.
    #[wire(tag = 1)]
    #[request(reads, inodes(inode), route = home(inode), answer = InodeAttr)]
    GetAttr {
        /// The inode.
        inode: InodeId,
    },
    /// Changes an inode's attributes; a size change truncates.
    #[wire(tag = 2)]
    #[request(changes, inodes(inode), sessions(mutation, granted), route = home(inode), answer = InodeAttr)]
    SetAttr {
        /// Retry identity.
        mutation: MutationId,
        /// The inode.
        inode: InodeId,
        /// What to change.
        changes: AttrChanges,
        /// The capability of the open the change is made through (`ftruncate`), for a client
        /// whose access the servers check: a descriptor opened for writing may truncate
        /// whatever the mode says now, as POSIX judges a descriptor by its open.
        #[serde(default, with = "crate::wire::since_8")]
        granted: Option<Capability>,
    },
    /// Creates an entry of any kind, directories included.
    ///
    /// Fails with `Exists`, `NotFound`, `NoTargets`.
    #[wire(tag = 3)]
    #[request(changes, inodes(parent), sessions(mutation), route = holder(parent, name), answer = crate::answer::CreateReply)]
    Create {
        /// Retry identity.
        mutation: MutationId,
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: String,
        /// What to create.
        new: NewInode,
        /// Also opens the new regular file for the mutation's client with this handle, as
        /// [`MetaRequest::Open`] would (saving a round trip per `open(O_CREAT)`).
        open: Option<u64>,
    },
    /// Creates a directory whose entries spread over `shards` metadata servers by name hash.
    ///
    /// Fails with `Exists`, `NotFound`, `InvalidArgument` (more shards than servers).
    #[wire(tag = 4)]
    #[request(changes, inodes(parent), sessions(mutation), route = holder(parent, name), answer = InodeAttr)]
    CreateSpread {
        /// Retry identity.
        mutation: MutationId,
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: String,
        /// What to create (a directory).
        new: NewInode,
        /// How many metadata servers hold its entries (2..=DIR_SHARDS_MAX).
        shards: u16,
    },
    /// Adds a hard link.
    ///
    /// Fails with `Exists`, `NotFound`.
    #[wire(tag = 5)]
    #[request(changes, inodes(inode, new_parent), sessions(mutation), route = holder(new_parent, new_name), answer = InodeAttr)]
    Link {
        /// Retry identity.
        mutation: MutationId,
        /// The inode to link.
        inode: InodeId,
        /// The directory of the new name.
        new_parent: InodeId,
        /// The new name.
        new_name: String,
    },
    /// Removes a non-directory entry.
    ///
    /// Fails with `NotFound`, `IsDirectory`.
    #[wire(tag = 6)]
    #[request(changes, inodes(parent), sessions(mutation), route = holder(parent, name), answer = Option<InodeAttr>)]
    Unlink {
        /// Retry identity.
        mutation: MutationId,
        /// The directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Removes an empty directory.
    ///
    /// Fails with `NotFound`, `NotEmpty`, `NotDirectory`.
    #[wire(tag = 7)]
    #[request(changes, inodes(parent), sessions(mutation), route = holder(parent, name), answer = Option<InodeAttr>)]
    Rmdir {
        /// Retry identity.
        mutation: MutationId,
        /// The parent directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Renames an entry.
    ///
    /// Fails with the POSIX rename errors, as codes.
    #[wire(tag = 8)]
    #[request(changes, inodes(parent, new_parent), sessions(mutation), route = holder(parent, name), answer = ())]
    Rename {
        /// Retry identity.
        mutation: MutationId,
        /// Source directory.
        parent: InodeId,
        /// Source name.
        name: String,
        /// Destination directory.
        new_parent: InodeId,
        /// Destination name.
        new_name: String,
        /// RENAME_NOREPLACE / RENAME_EXCHANGE.
        flags: RenameFlags,
    },
    /// Lists a directory (or one shard of a spread directory) after a cookie.
    ///
    /// Fails with `NotFound`, `NotDirectory`.
    #[wire(tag = 9)]
    #[request(reads, inodes(dir), route = home(dir), answer = (Vec<DirEntry>, bool))]
    ReadDir {
        /// The directory.
        dir: InodeId,
        /// The shard count the client believes the directory has (1: not spread); a spread
        /// directory answers `WrongShard` to a client that does not know it is spread.
        shards: u16,
        /// Resume after this cookie (0 from the start).
        after_cookie: u64,
        /// Most entries wanted.
        max_entries: u32,
    },
    /// Lists a directory as [`MetaRequest::ReadDir`] does, each entry with its inode's
    /// attributes (FUSE's READDIRPLUS: `ls -l` and `find` need no lookup per entry).
    ///
    /// Fails with `NotFound`, `NotDirectory`, `VersionMismatch` from a server of protocol version
    /// 9.
    #[wire(tag = 40, since = 10)]
    #[request(reads, inodes(dir), route = home(dir), answer = (Vec<DirEntryPlus>, bool))]
    ReadDirPlus {
        /// The directory.
        dir: InodeId,
        /// The shard count the client believes the directory has, as for `ReadDir`.
        shards: u16,
        /// Resume after this cookie (0 from the start).
        after_cookie: u64,
        /// Most entries wanted.
        max_entries: u32,
    },
    /// Reads a symbolic link.
    ///
    /// Fails with `NotFound`, `NotSymlink`.
    #[wire(tag = 10)]
    #[request(reads, inodes(inode), route = home(inode), answer = String)]
    ReadLink {
        /// The link.
        inode: InodeId,
    },
    /// A client opened a file: keeps it alive past an unlink until released. Idempotent: the
    /// (client, handle) pair names the open, so a retry registers nothing new.
    ///
    /// Fails with `NotFound`.
    #[wire(tag = 11)]
    #[request(kind = crate::access::open_kind(*access), inodes(inode), sessions(client, granted), route = home(inode), answer = (InodeAttr, Option<Capability>))]
    Open {
        /// The session.
        client: ClientId,
        /// The client's handle of this open, unique within the session.
        handle: u64,
        /// The file.
        inode: InodeId,
        /// What the open is for: [`crate::access::READ`] and [`crate::access::WRITE`] bits.
        #[serde(default, with = "crate::wire::since_2")]
        access: u8,
        /// For an open asked again for a new capability (the one it had expired, or the
        /// metadata server restarted), the capability the handle was granted before: the open
        /// is granted what it was, whatever the mode says now.
        #[serde(default, with = "crate::wire::since_8")]
        granted: Option<Capability>,
    },
    /// A client closed handles of files of this home (clients gather the closes of a few
    /// milliseconds into one request). Idempotent, like `Open`.
    #[wire(tag = 12)]
    #[request(reads, sessions(client), answer = ())]
    Release {
        /// The session.
        client: ClientId,
        /// The files and the handles given at their opens.
        handles: Vec<(InodeId, u64)>,
    },
    /// A client found an object of the file still waiting for a truncate (`TruncatePending`):
    /// the home sends the file's queued truncate to every target now and answers when each
    /// has it.
    ///
    /// Fails with `Io` when a target cannot be reached.
    #[wire(tag = 13)]
    #[request(reads, inodes(inode), route = home(inode), answer = ())]
    ApplyTruncate {
        /// The file.
        inode: InodeId,
    },
    /// A client about to write a file past `to` (the end it may grow the file to) asks for
    /// room to: a file whose owner, group or project has a hard byte limit grows only into
    /// room its home reserved for an open, out of the home's grant (`quota.rs`). Answered
    /// with the end the open may now grow the file to (which may be short of `to` at the
    /// limit), [`MetaResponse::Reserved`].
    ///
    /// Fails with `QuotaExceeded` when no room is left, `NotPermitted` without an open for writing.
    #[wire(tag = 39, since = 9)]
    #[request(changes, inodes(inode), sessions(client), route = home(inode), answer = (u64, Option<Capability>))]
    Reserve {
        /// The session.
        client: ClientId,
        /// The handle of the open for writing.
        handle: u64,
        /// The file.
        inode: InodeId,
        /// The end the client wants to write to.
        to: u64,
    },
    /// A client reports a file's size after writing; the largest report of the generation wins.
    ///
    /// Fails with `NotFound`.
    #[wire(tag = 14)]
    #[request(changes, inodes(inode), sessions(granted, client), route = home(inode), answer = InodeAttr)]
    ReportSize {
        /// The file.
        inode: InodeId,
        /// What the client wrote.
        report: SizeReport,
        /// The capability of the client's open for writing, for a client whose access the
        /// servers check: what it wrote through it is reported whatever the mode says now.
        #[serde(default, with = "crate::wire::since_8")]
        granted: Option<Capability>,
        /// The session of the client reporting: a home that answers changes before their
        /// sync numbers the report as that session's change, which the client keeps
        /// ([`NumberedChange`]); without it, the report is answered once durable.
        #[serde(default, with = "crate::wire::since_14")]
        client: Option<ClientId>,
    },
    /// Sets an extended attribute (including `system.posix_acl_*`).
    ///
    /// Fails with `Exists` / `NoAttribute` per `mode`, `OutOfRange`.
    #[wire(tag = 15)]
    #[request(changes, inodes(inode), sessions(mutation), route = home(inode), answer = ())]
    SetXattr {
        /// Retry identity.
        mutation: MutationId,
        /// The inode.
        inode: InodeId,
        /// Full name with namespace, e.g. `user.origin`.
        name: String,
        /// The value, at most [`XATTR_VALUE_BYTES_MAX`] bytes.
        value: Vec<u8>,
        /// XATTR_CREATE / XATTR_REPLACE.
        mode: XattrSetMode,
    },
    /// Reads an extended attribute.
    ///
    /// Fails with `NoAttribute`.
    #[wire(tag = 16)]
    #[request(reads, inodes(inode), route = home(inode), answer = Vec<u8>)]
    GetXattr {
        /// The inode.
        inode: InodeId,
        /// Full name with namespace.
        name: String,
    },
    /// Lists an inode's extended attribute names.
    ///
    /// Fails with `NotFound`.
    #[wire(tag = 17)]
    #[request(reads, inodes(inode), route = home(inode), answer = Vec<String>)]
    ListXattr {
        /// The inode.
        inode: InodeId,
    },
    /// Removes an extended attribute.
    ///
    /// Fails with `NoAttribute`.
    #[wire(tag = 18)]
    #[request(changes, inodes(inode), sessions(mutation), route = home(inode), answer = ())]
    RemoveXattr {
        /// Retry identity.
        mutation: MutationId,
        /// The inode.
        inode: InodeId,
        /// Full name with namespace.
        name: String,
    },
    /// Takes, changes or releases a byte-range lock. Idempotent: setting the same lock twice
    /// leaves the same state.
    ///
    /// Fails with `WouldBlock` when a conflicting lock stays.
    #[wire(tag = 19)]
    #[request(reads, inodes(inode), sessions(client), route = home(inode), answer = ())]
    SetLock {
        /// The session.
        client: ClientId,
        /// The file.
        inode: InodeId,
        /// The lock.
        lock: LockRange,
        /// How long to wait for a conflicting lock to go, in milliseconds (0: do not wait).
        /// A wait that runs out answers `WouldBlock`; the client asks again.
        wait_ms: u32,
        /// The client reclaims a lock it held before this server restarted.
        reclaim: bool,
    },
    /// Finds a lock that would conflict with `lock` (F_GETLK).
    #[wire(tag = 20)]
    #[request(reads, inodes(inode), sessions(client), route = home(inode), answer = Option<LockRange>)]
    GetLock {
        /// The session.
        client: ClientId,
        /// The file.
        inode: InodeId,
        /// The lock that would be taken.
        lock: LockRange,
    },
    /// Asks for the server's lock epoch, which changes when it restarts: a client that sees a
    /// new epoch reclaims its locks.
    #[wire(tag = 21)]
    #[request(reads, answer = u64)]
    LockEpoch,
    /// Server to server: creates a directory inode that a dentry on the coordinating server
    /// will name (the inode before the dentry, so a crash leaves at worst an orphan).
    /// Idempotent per (coordinator, intent).
    #[wire(tag = 22)]
    #[request(members, changes, answer = MetaResponse)]
    CreateDirInode {
        /// The metadata node coordinating the mkdir.
        coordinator: NodeId,
        /// The coordinator's intent record.
        intent: u64,
        /// The directory that will hold the dentry.
        parent: InodeId,
        /// Permission bits and set-id bits, final (umask and ACLs already applied).
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group, final (set-group-id directories already applied).
        gid: u32,
        /// The stripe pattern it inherits.
        pattern: StripePattern,
        /// ACL attributes it inherits: (name, value).
        acls: Vec<(String, Vec<u8>)>,
        /// For a shard of a spread directory: the directory it belongs to.
        shard_of: Option<InodeId>,
        /// The project it inherits.
        #[serde(default, with = "crate::wire::since_5")]
        project: u32,
    },
    /// Server to server: records a spread directory's shards, once they all exist. Idempotent.
    #[wire(tag = 23)]
    #[request(members, changes, answer = MetaResponse)]
    SetShards {
        /// The spread directory.
        dir: InodeId,
        /// Its shards, the directory itself first.
        shards: Vec<InodeId>,
    },
    /// Server to server: seals an empty shard of a spread directory being removed, so no entry
    /// is added to it meanwhile (`seal`), or unseals it when the removal gives up. Idempotent
    /// per (coordinator, intent); a missing shard is removed already.
    #[wire(tag = 24)]
    #[request(members, changes, answer = MetaResponse)]
    SealShard {
        /// The shard.
        shard: InodeId,
        /// The metadata node coordinating the rmdir.
        coordinator: NodeId,
        /// The coordinator's intent record.
        intent: u64,
        /// Seal (true) or unseal (false).
        seal: bool,
    },
    /// Server to server: copies what new entries inherit from a spread directory (mode, group,
    /// stripe pattern, default ACL, default spread) to one of its shards. Idempotent.
    #[wire(tag = 25)]
    #[request(members, changes, answer = MetaResponse)]
    SyncShard {
        /// The shard.
        shard: InodeId,
        /// The directory's permission and set-id bits.
        mode: u32,
        /// The directory's owner.
        uid: u32,
        /// The directory's group.
        gid: u32,
        /// The directory's stripe pattern.
        pattern: StripePattern,
        /// The directory's default ACL, if any.
        default_acl: Option<Vec<u8>>,
        /// The directory's default spread for new subdirectories, if any.
        default_spread: Option<Vec<u8>>,
        /// The directory's project.
        #[serde(default, with = "crate::wire::since_5")]
        project: u32,
    },
    /// Server to server: removes an empty directory inode whose dentry the coordinating server
    /// is removing. Idempotent: a missing inode is already removed.
    ///
    /// Fails with `NotEmpty`.
    #[wire(tag = 26)]
    #[request(members, changes, answer = ())]
    RemoveDirInode {
        /// The directory inode.
        inode: InodeId,
    },
    /// Inodes of other homes that dentries on this server name (for `weft fsck`).
    #[wire(tag = 27)]
    #[request(members, reads, answer = Vec<InodeId>)]
    RemoteReferences,
    /// Server to server: inserts a dentry for a rename coordinated by another server (the
    /// entry's old name is there), replacing a victim: a file, or an empty directory (one
    /// living on a third server must have been sealed by the coordinator). Applied once per
    /// (coordinator, intent).
    #[wire(tag = 28)]
    #[request(members, changes, answer = MetaResponse)]
    InsertDentry {
        /// The metadata node coordinating the rename.
        coordinator: NodeId,
        /// The coordinator's intent record.
        intent: u64,
        /// The directory of the new name.
        parent: InodeId,
        /// The new name.
        name: String,
        /// The inode the name will name.
        child: InodeId,
        /// Its type.
        kind: FileKind,
        /// RENAME_NOREPLACE.
        no_replace: bool,
        /// The directory victim on a third server that the coordinator sealed empty.
        sealed_victim: Option<InodeId>,
        /// The project of the inode moved (a directory of another project refuses it).
        #[serde(default, with = "crate::wire::since_5")]
        project: u32,
    },
    /// Server to server: the far half of a RENAME_EXCHANGE across servers: `name` in `parent`
    /// stops naming `expect` and names `child`. Idempotent (`Unchanged` when it already names
    /// `child`); `Busy` when it names neither (the entry changed meanwhile).
    #[wire(tag = 29)]
    #[request(members, changes, answer = MetaResponse)]
    ExchangeDentry {
        /// The metadata node coordinating the exchange.
        coordinator: NodeId,
        /// The coordinator's intent record.
        intent: u64,
        /// The directory of the far name.
        parent: InodeId,
        /// The far name.
        name: String,
        /// The inode it names now.
        expect: InodeId,
        /// The inode it will name.
        child: InodeId,
        /// The type of `child`.
        kind: FileKind,
    },
    /// Server to server: a rename moved a dentry of `inode`, which lives on the receiver: its
    /// ctime becomes now and, for a directory, its parent pointer follows the dentry.
    /// Idempotent (a repeat only moves the ctime again).
    #[wire(tag = 30)]
    #[request(members, changes, answer = MetaResponse)]
    Renamed {
        /// The renamed inode.
        inode: InodeId,
        /// The directory its dentry is in now.
        parent: InodeId,
    },
    /// Server to server: changes the link count of an inode whose dentry another server adds
    /// or removes (hard links across servers). Applied once per (coordinator, intent, delta);
    /// returns the inode's attributes. A count that reaches zero disposes of the inode (or
    /// keeps it as an orphan while it is open).
    #[wire(tag = 31)]
    #[request(members, changes, answer = MetaResponse)]
    AdjustLinks {
        /// The metadata node coordinating the change.
        coordinator: NodeId,
        /// The coordinator's intent record.
        intent: u64,
        /// The inode.
        inode: InodeId,
        /// +1 for a new dentry, -1 for a removed one.
        delta: i32,
    },
    /// Checks this metadata target's namespace and the objects of its files; with `repair`,
    /// fixes what can be fixed safely.
    #[wire(tag = 32)]
    #[request(members, changes, answer = CheckReport)]
    Check {
        /// Fix what is safe to fix.
        repair: bool,
        /// Inodes of this home that dentries on other metadata servers name.
        referenced: Vec<InodeId>,
    },
    /// Sets a directory's stripe pattern for new files and subdirectories.
    ///
    /// Fails with `NotDirectory`.
    #[wire(tag = 33)]
    #[request(changes, inodes(dir), sessions(mutation), route = home(dir), answer = InodeAttr)]
    SetPattern {
        /// Retry identity.
        mutation: MutationId,
        /// The directory.
        dir: InodeId,
        /// The new pattern.
        pattern: StripePattern,
    },
    /// Primary to secondary of a metadata mirror group: changes to the primary's store file,
    /// applied in order to the member's copy. The payload holds the bytes of every `Write`,
    /// one after the other. With `sync`, the copy is synced before the answer.
    #[wire(tag = 34)]
    #[request(members, changes, answer = MetaResponse)]
    ReplicaApply {
        /// The group.
        group: GroupId,
        /// The group version the primary sends with.
        version: GroupVersion,
        /// The primary's link to the home: when it was opened, in nanoseconds since the Unix
        /// epoch. A primary that opens the home again sends under a later one.
        link: u64,
        /// This send's number on the link, new for every send and retry. A member applies
        /// only sends newer than every one it applied in the version: a late copy of an
        /// earlier send (one its primary gave up on and sent again) would write old bytes
        /// over newer ones.
        sequence: u64,
        /// The changes, in the order the primary made them.
        changes: Vec<FileChange>,
        /// Sync the copy before answering.
        sync: bool,
    },
    /// Coordinator to another metadata home: every cross-server operation the coordinator
    /// recorded with an intent id below `below` has finished, durably. The home forgets its
    /// markers of their steps and refuses a late copy of one of them (`Superseded`).
    #[wire(tag = 35)]
    #[request(members, changes, answer = MetaResponse)]
    IntentsSettled {
        /// The coordinating home.
        coordinator: NodeId,
        /// Its oldest unfinished intent, or its next intent id when none is unfinished.
        below: u64,
    },
    /// How far this metadata server's consistency check is (`weft fsck` shows it while it
    /// waits for the check).
    #[wire(tag = 36)]
    #[request(members, reads, answer = crate::messages::CheckProgress)]
    CheckProgress,
    /// What each user and group uses in each pool in the homes this server serves (`weft
    /// quota report` sums the servers).
    #[wire(tag = 37, since = 4)]
    #[request(members, reads, answer = Vec<crate::quota::QuotaUsage>)]
    QuotaUsage,
    /// Moves a regular file's objects onto other targets while it stays in use (`weft entry
    /// migrate`): every slot whose target is not in `pool` (when given), or is not the one
    /// `targets` names at its index (when given), or is being drained, goes to another
    /// target; the old layout stays the file's until the copies are complete and the new
    /// one is switched in with one commit. Answered when the move is done, or with
    /// `done: false` while it still runs (ask again: the move goes on either way, and a
    /// restart resumes it).
    ///
    /// Fails with `NotFound`, `InvalidArgument` (not a regular file, a mirrored one, a target that
    /// cannot take it), `NoTargets`.
    #[wire(tag = 38, since = 4)]
    #[request(members, changes, answer = (u16, bool))]
    Migrate {
        /// The file.
        inode: InodeId,
        /// The pool the file should be in.
        pool: Option<StoragePoolId>,
        /// The targets the file should be on, in stripe order (empty: chosen in the pool).
        targets: Vec<TargetId>,
        /// The chunk size and width the file should have (restriped onto targets it is not
        /// on), if another than its own.
        #[serde(default, with = "crate::wire::since_5_set")]
        pattern: Option<(u32, u16)>,
    },
    /// Waits until every change this home numbered up to `number` is on disk (and on every
    /// present mirror member), syncing them now: what `fsync`, a directory's fsync and
    /// synchronous opens wait for. Answered with the home's last synced number.
    ///
    /// Fails with `InGrace` when the home started again since `incarnation`.
    #[wire(tag = 41, since = 14)]
    #[request(reads, answer = u64)]
    SyncHome {
        /// The start of the home that numbered the caller's changes: a home that started
        /// since answers `InGrace` (the caller replays them first).
        incarnation: u64,
        /// The highest number the caller holds a change of.
        number: u64,
    },
    /// A client's changes that the home answered but did not have on disk when it restarted,
    /// sent back in the order of their numbers within the home's recovery window: the home
    /// makes their rows again, in the order of the numbers across clients. `done` says the
    /// client has sent every change it kept for the home.
    ///
    /// Fails with `Evicted` for changes the home dropped (a change numbered before them was
    /// lost with its client), `InvalidArgument` for a change the home did not make.
    #[wire(tag = 42, since = 14)]
    #[request(changes, sessions(client), answer = ())]
    Replay {
        /// The session.
        client: ClientId,
        /// Its changes, in the order of their numbers.
        changes: Vec<NumberedChange>,
        /// Whether these are the last the client kept.
        done: bool,
    },
}

impl MetaRequest {
    /// The retry identity of a mutating request: a copy sent again carries the same, and is
    /// answered from the reply its server kept.
    pub fn mutation(&self) -> Option<MutationId> {
        match self {
            MetaRequest::SetAttr { mutation, .. }
            | MetaRequest::Create { mutation, .. }
            | MetaRequest::CreateSpread { mutation, .. }
            | MetaRequest::Link { mutation, .. }
            | MetaRequest::Unlink { mutation, .. }
            | MetaRequest::Rmdir { mutation, .. }
            | MetaRequest::Rename { mutation, .. }
            | MetaRequest::SetXattr { mutation, .. }
            | MetaRequest::RemoveXattr { mutation, .. }
            | MetaRequest::SetPattern { mutation, .. } => Some(*mutation),
            _ => None,
        }
    }
}

/// A piece of a source file's object that a [`StorageRequest::CopyFrom`] copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyPiece {
    /// The target that holds the object.
    pub target: TargetId,
    /// Offset in the object.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// A change to a metadata store file, shipped to mirror members ([`MetaRequest::ReplicaApply`]):
/// the mirroring of store files is `weft_mirror::pages`.
pub use weft_mirror::pages::FileChange;

/// Where a metadata request goes: the home whose inodes it names, and for a mirrored home the
/// version of its group the sender routed it with (0 for a home without a group).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRoute {
    /// The home (a metadata node id, or a mirror group's first member).
    pub home: NodeId,
    /// The home's group version, or 0.
    pub version: GroupVersion,
}

/// What a metadata server answers: its variants keep the tags they had when one enum answered every
/// service, so the bytes on the wire and in stored replies are the same.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum MetaResponse {
    /// Done, nothing to return.
    #[wire(tag = 0)]
    Done,
    /// An inode's attributes.
    #[wire(tag = 5)]
    Attr(InodeAttr),
    /// A new entry's attributes, with its directory's as they are after the change (when
    /// the directory's entries all live with it, so they are what a get-attributes would
    /// answer), which saves the client asking for them.
    #[wire(tag = 6)]
    Created {
        /// The new entry.
        attr: InodeAttr,
        /// Its directory, unless that is spread over several servers.
        parent: Option<InodeAttr>,
        /// For a file created open by a client whose access the servers check: the grant of
        /// access to its objects.
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
        /// For a new directory: how long, in milliseconds from when the client first sent
        /// the request, the client that made it may answer that a name is not in it without
        /// asking (a names lease, docs/design/namespace.md); 0: no lease.
        #[serde(default, with = "crate::wire::since_15")]
        lease_ms: u32,
        /// The creating client's names lease on the directory, renewed for this many
        /// milliseconds from when it first sent the request; 0: not renewed (it holds none,
        /// or another client recalled it), and it runs out when it runs out.
        #[serde(default, with = "crate::wire::since_15")]
        parent_lease_ms: u32,
    },
    /// A page of a directory listing.
    #[wire(tag = 7)]
    DirEntries {
        /// Entries in cookie order.
        entries: Vec<DirEntry>,
        /// True when the listing reached the end.
        end: bool,
    },
    /// A symbolic link's target.
    #[wire(tag = 8)]
    LinkTarget(String),
    /// An extended attribute's value.
    #[wire(tag = 9)]
    XattrValue(Vec<u8>),
    /// An inode's extended attribute names.
    #[wire(tag = 10)]
    XattrNames(Vec<String>),
    /// The result of a consistency check.
    #[wire(tag = 16)]
    CheckReport(CheckReport),
    /// The lock that conflicts, or none.
    #[wire(tag = 17)]
    LockConflict(Option<LockRange>),
    /// The server's lock epoch.
    #[wire(tag = 18)]
    LockEpoch(u64),
    /// A list of inodes.
    #[wire(tag = 19)]
    Inodes(Vec<InodeId>),
    /// Nothing needed doing (a rename onto another name of the same inode).
    #[wire(tag = 20)]
    Unchanged,
    /// How far a consistency check is.
    #[wire(tag = 27)]
    CheckProgress(CheckProgress),
    /// A file opened by a client whose access the servers check: its attributes, and the
    /// grant of access to its objects the storage servers want from that client.
    #[wire(tag = 29, since = 3)]
    Opened {
        /// The file.
        attr: InodeAttr,
        /// The grant.
        capability: Capability,
    },
    /// What users, groups and projects use, per pool.
    #[wire(tag = 31, since = 4)]
    QuotaUsage(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaUsage>),
    /// How far a file's move is ([`MetaRequest::Migrate`]).
    #[wire(tag = 34, since = 4)]
    Migration {
        /// Slots of the layout that move (0: the file was where it should be).
        moving: u16,
        /// Whether the move is done.
        done: bool,
    },
    /// The end an open may grow its file to ([`MetaRequest::Reserve`]).
    #[wire(tag = 36, since = 9)]
    Reserved {
        /// The end.
        to: u64,
        /// For a client whose access the servers check: a new grant of the open, which lets
        /// its writes grow the file's objects as far as the room.
        capability: Option<Capability>,
    },
    /// A page of a directory listing with the entries' attributes
    /// ([`MetaRequest::ReadDirPlus`]).
    #[wire(tag = 38, since = 10)]
    DirEntriesPlus {
        /// Entries in cookie order.
        entries: Vec<DirEntryPlus>,
        /// True when the listing reached the end.
        end: bool,
    },
    /// A name removed ([`MetaRequest::Unlink`], [`MetaRequest::Rmdir`]), with its directory's
    /// attributes as they are after the change (as [`MetaResponse::Created`] carries them),
    /// which saves the client asking for them. A peer older than version 11 is answered
    /// [`MetaResponse::Done`] instead ([`MetaResponse::spoken_to`]).
    #[wire(tag = 39, since = 11)]
    Removed {
        /// The directory, unless it is spread over several servers.
        parent: Option<InodeAttr>,
    },
    /// A client's change, numbered ([`NumberedChange`]), with the answer of the request that
    /// made it and the home's last synced number when it was answered. A peer older than
    /// version 14 is answered the answer alone ([`MetaResponse::spoken_to`]).
    #[wire(tag = 40, since = 14)]
    Numbered {
        /// The request's own answer.
        reply: Box<MetaResponse>,
        /// The change.
        change: NumberedChange,
        /// The highest number the home had on disk.
        synced: u64,
    },
    /// The home's last synced number ([`MetaRequest::SyncHome`]).
    #[wire(tag = 41, since = 14)]
    Synced(u64),
}

impl MetaResponse {
    /// The answer of the request itself: a numbered change's ([`MetaResponse::Numbered`])
    /// carries it inside.
    pub fn answer(&self) -> &MetaResponse {
        match self {
            MetaResponse::Numbered { reply, .. } => reply,
            other => other,
        }
    }

    /// This answer as a peer speaking protocol `version` reads it: a variant that only adds
    /// to an older one's meaning becomes that older one.
    #[must_use]
    pub fn spoken_to(self, version: u16) -> MetaResponse {
        match self {
            MetaResponse::Removed { .. } if version < 11 => MetaResponse::Done,
            MetaResponse::Numbered { reply, .. } if version < 14 => reply.spoken_to(version),
            other => other,
        }
    }
}
