//! Requests served by storage servers ([`StorageRequest`]): object reads and changes, pushes
//! of moving objects, benchmarks and consistency checks.

use super::*;

/// What a StorageBench request asks of a storage server.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum StorageBenchOp {
    /// Starts a run on its targets (all of them when `targets` is empty) unless one runs.
    #[wire(tag = 0)]
    Start {
        /// The targets to measure; empty for all of this server's.
        targets: Vec<TargetId>,
        /// Write new files, or read the files of an earlier write run.
        read: bool,
        /// Bytes per request.
        block_bytes: u32,
        /// Bytes each thread writes or reads.
        bytes_per_thread: u64,
        /// Threads per target.
        threads: u16,
    },
    /// Reports the current or last run.
    #[wire(tag = 1)]
    Status,
    /// Asks a running run to stop.
    #[wire(tag = 2)]
    Stop,
    /// Removes the files the runs wrote.
    #[wire(tag = 3)]
    Cleanup,
}

/// One target's part of a StorageBench run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetBenchResult {
    /// The target.
    pub target: TargetId,
    /// Bytes moved so far.
    pub bytes: u64,
    /// Microseconds since the run started (until the target finished).
    pub elapsed_micros: u64,
    /// Whether this target's threads are done.
    pub finished: bool,
    /// The first error, if any.
    pub error: Option<String>,
}

/// The state of a storage server's StorageBench.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageBenchStatus {
    /// A run is going on.
    pub running: bool,
    /// The run reads (else writes).
    pub read: bool,
    /// Per target.
    pub targets: Vec<TargetBenchResult>,
}

/// A client's change of object data (a write or a fallocate), numbered so that a storage
/// server applies it at most once and drops a copy of it that arrives after its client moved
/// on: the original of a retried request, delayed on its way or inside the server, must never
/// land over a newer change of the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeTag {
    /// The client session that made it.
    pub client: ClientId,
    /// The change's number among the client's mutations ([`MutationId::seq`]), the same in
    /// every retry of it.
    pub number: u64,
    /// Every change of the client numbered below this has been answered or given up on.
    pub settled_below: u64,
    /// Changes at or above `settled_below` the client gave up on (rare: a request failed
    /// after its retries). A copy of one of these, or of one below `settled_below`, is
    /// dropped (`Superseded`).
    pub abandoned: Vec<u64>,
}

/// Requests served by a storage server. Data travels as the frame payload.
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr, crate::access::Declared)]
#[request(response = StorageResponse, answers = storage_answers)]
#[strum(serialize_all = "snake_case")]
pub enum StorageRequest {
    /// Writes the payload at an offset of an object, creating it if needed. Refused with
    /// `TruncatePending` while the object holds data from before a truncate of `generation`
    /// it has not had (see [`StorageRequest::Truncate`]).
    #[wire(tag = 0)]
    #[request(changes, route = target(target), answer = crate::answer::Written)]
    Write {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// The file's truncate generation the writer writes in.
        generation: u64,
        /// Offset in the object.
        object_offset: u64,
        /// The client change it is, if a client sent it (see [`ChangeTag`]).
        tag: Option<ChangeTag>,
        /// What lets a client whose access the servers check read or change the file's
        /// objects: the metadata server's grant at its open (see [`Capability`]).
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
        /// The file's owner and group as the writer knows them: a write that grows the
        /// object of a user or group over its space quota is refused.
        #[serde(default, with = "crate::wire::since_4")]
        owner: Option<(u32, u32)>,
        /// The file's project as the writer knows it, for its space quota (0: none).
        #[serde(default, with = "crate::wire::since_5")]
        project: u32,
    },
    /// StorageBench (`weft bench storage`): the server benchmarks its own targets, no client
    /// network involved.
    #[wire(tag = 1)]
    #[request(members, changes, answer = StorageBenchStatus)]
    Bench {
        /// What to do.
        op: StorageBenchOp,
    },
    /// Network benchmark (`weft bench net`): a write whose payload is checked and dropped, or
    /// a read of `read_len` zero bytes, with no disk I/O; the target must exist.
    #[wire(tag = 2)]
    #[request(reads, route = target(target), answer = StorageResponse)]
    NetBench {
        /// The target.
        target: TargetId,
        /// Bytes to send back (0 for a write).
        read_len: u32,
    },
    /// Reads up to `len` bytes; a short reply means end of object (a hole to the reader).
    /// Refused with `TruncatePending` like a write, so bytes a truncate cut never show.
    #[wire(tag = 3)]
    #[request(reads, route = target(target), answer = crate::answer::Data)]
    Read {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// The file's truncate generation the reader reads in.
        generation: u64,
        /// Offset in the object.
        object_offset: u64,
        /// Bytes wanted, at most [`IO_BYTES_MAX`].
        len: u32,
        /// What lets a client whose access the servers check read or change the file's
        /// objects: the metadata server's grant at its open (see [`Capability`]).
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
    },
    /// Cuts an object to a length, as truncate `generation` of its file asks, unless the
    /// object already had that truncate or a newer one: a late or re-sent truncate never
    /// cuts what was written after it. The object then records the generation, durably
    /// before the answer.
    #[wire(tag = 4)]
    #[request(members, changes, route = target(target), answer = ())]
    Truncate {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// New object length.
        length: u64,
        /// The file's truncate generation that made the cut.
        generation: u64,
    },
    /// Removes an object; removing a missing object succeeds.
    #[wire(tag = 5)]
    #[request(members, changes, route = target(target), answer = ())]
    Remove {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// The change it is, for a resync's step (see [`ChangeTag`]); `None` otherwise.
        tag: Option<ChangeTag>,
    },
    /// Removes the objects of `inodes` on one target (or storage mirror group): each as a
    /// [`StorageRequest::Remove`] of its own, in order, so a mirrored one reaches every member
    /// as that removal does. Removing a missing object succeeds. Fails with the first object
    /// that could not be removed (the ones before it are gone; sending the rest again is
    /// safe). A file's metadata server disposes of removed files' objects with it, a batch at
    /// a time.
    #[wire(tag = 15, since = 12)]
    #[request(members, changes, route = target(target), answer = ())]
    RemoveObjects {
        /// The target.
        target: TargetId,
        /// How it was routed, for mirrored objects.
        mirror: Option<MirrorRoute>,
        /// The files.
        inodes: Vec<InodeId>,
    },
    /// Makes an object's data durable.
    #[wire(tag = 6)]
    #[request(reads, route = target(target), answer = crate::answer::Synced)]
    Sync {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// What lets a client whose access the servers check read or change the file's
        /// objects: the metadata server's grant at its open (see [`Capability`]).
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
    },
    /// Allocates space for, or zeroes, a range of an object without changing its length.
    /// Refused with `TruncatePending` like a write.
    #[wire(tag = 7)]
    #[request(changes, route = target(target), answer = ())]
    Fallocate {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
        /// The file's truncate generation the caller works in.
        generation: u64,
        /// Offset in the object.
        object_offset: u64,
        /// Bytes of the range.
        len: u64,
        /// Allocate or zero.
        mode: FallocateMode,
        /// The client change it is, if a client sent it (see [`ChangeTag`]).
        tag: Option<ChangeTag>,
        /// What lets a client whose access the servers check read or change the file's
        /// objects: the metadata server's grant at its open (see [`Capability`]).
        #[serde(default, with = "crate::wire::since_3_advisory")]
        capability: Option<Capability>,
        /// The file's owner and group as the client knows them: an allocation of a blocked
        /// owner's file is refused with `QuotaExceeded` (a server of version 7 takes none).
        #[serde(default, with = "crate::wire::since_8")]
        owner: Option<(u32, u32)>,
        /// The file's project as the client knows it (0: none).
        #[serde(default, with = "crate::wire::since_8")]
        project: u32,
    },
    /// Lists the objects of files whose home is `home` (of every file: `None`), in inode
    /// order after `after`.
    #[wire(tag = 8)]
    #[request(members, reads, route = target(target), answer = crate::answer::ObjectsPage)]
    ListObjects {
        /// The target.
        target: TargetId,
        /// The objects of mirrored files (kept apart from plain files' objects on a target),
        /// or of plain files.
        mirrored: bool,
        /// Only objects of inodes of this metadata node.
        home: Option<NodeId>,
        /// Resume after this inode (0 from the start).
        after: u64,
        /// Most objects wanted, at most [`OBJECTS_PER_LIST_MAX`].
        max: u32,
    },
    /// The length of an object (0 if it does not exist).
    #[wire(tag = 9)]
    #[request(members, reads, route = target(target), answer = u64)]
    ObjectLength {
        /// The target.
        target: TargetId,
        /// How it was routed, for a mirrored object.
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
    },
    /// The length of one copy of an object and the CRC32C of a range of it, read on the
    /// target named (a mirror member's own copy, never routed): `weft fsck` compares mirror
    /// members with it.
    #[wire(tag = 10)]
    #[request(members, reads, route = target(target), answer = crate::answer::Checksum)]
    ObjectChecksum {
        /// The target.
        target: TargetId,
        /// The object of a mirrored file, or of a plain one.
        mirrored: bool,
        /// The file.
        inode: InodeId,
        /// Start of the range in the object.
        offset: u64,
        /// Bytes of the range, at most [`CHECKSUM_BYTES_MAX`].
        len: u64,
    },
    /// Makes everything on a mirror member's target durable: the last step of a resync (the
    /// member may hold changes it took before it left that no sync reached).
    #[wire(tag = 11)]
    #[request(members, reads, route = target(target), answer = crate::answer::Synced)]
    SyncTarget {
        /// The target.
        target: TargetId,
        /// How it was routed (forwarded by the group's primary).
        mirror: Option<MirrorRoute>,
    },
    /// Copies bytes of a file's objects into an object of this target (`copy_file_range`):
    /// the server reads each piece where it lives — on this server, or from the storage
    /// server of its target — and writes them in order at `object_offset`, so the data never
    /// crosses the client. A piece that ends early reads as zeros (a hole). Refused like a
    /// write (`TruncatePending`, `NoSpace`, `QuotaExceeded`), and answered like one.
    #[wire(tag = 13, since = 4)]
    #[request(changes, route = target(target), answer = crate::answer::Written)]
    CopyFrom {
        /// The target.
        target: TargetId,
        /// The file written.
        inode: InodeId,
        /// Its truncate generation the writer writes in.
        generation: u64,
        /// Offset in the object.
        object_offset: u64,
        /// The file read, and its truncate generation the reader reads in.
        source: (InodeId, u64),
        /// The pieces of the source file's objects whose bytes go, in order, at
        /// `object_offset`: at most [`IO_BYTES_MAX`] bytes in all.
        pieces: Vec<CopyPiece>,
        /// The client change it is (see [`ChangeTag`]).
        tag: Option<ChangeTag>,
        /// The capability to write the file written, when the server wants one.
        capability: Option<Capability>,
        /// The capability to read the file read, when the server wants one.
        source_capability: Option<Capability>,
        /// The written file's owner and group, for their space quotas.
        owner: Option<(u32, u32)>,
        /// The written file's project, for its space quota (0: none).
        #[serde(default, with = "crate::wire::since_5")]
        project: u32,
    },
    /// A mirrored object that moved to another storage mirror group (its copy there is
    /// complete and synced), sealed on a member as on its group's primary: every read and
    /// change of it is refused with `Moved` from then on, durably, and its data is dropped.
    /// Sent only by the group's primary to its members (with a move's last push, or by a
    /// resync); the seal stays as the object's tombstone until its file is removed.
    #[wire(tag = 14, since = 6)]
    #[request(members, changes, route = target(target), answer = ())]
    Seal {
        /// The member's target.
        target: TargetId,
        /// How it was routed (forwarded by the group's primary).
        mirror: Option<MirrorRoute>,
        /// The file.
        inode: InodeId,
    },
    /// A file's metadata server moving the file's object off `target` to target `to` (a
    /// plain object): the first push copies the whole object and starts watching it, each
    /// later one copies what changed since the one before. A push with `seal` first makes the
    /// object refuse every read and change (`Moved`) for good, durably, copies the last
    /// changes, syncs the copy and drops the object's data: the copy on `to` is then
    /// complete, and the metadata server switches the file's layout to it. A sealed push
    /// sent again answers at once.
    #[wire(tag = 12, since = 4)]
    #[request(members, changes, route = target(target), answer = crate::answer::Pushed)]
    Push {
        /// The target the object is on.
        target: TargetId,
        /// The file.
        inode: InodeId,
        /// The target it moves to.
        to: TargetId,
        /// The move, as its metadata server numbers it: a push of another move (one given up
        /// and planned again) copies the whole object again.
        id: u64,
        /// Whether this is the last push.
        seal: bool,
        /// For a file being restriped into another pattern: where the object's bytes go
        /// instead of to `to` (which is then the object's own target).
        #[serde(default, with = "crate::wire::since_5_set")]
        into: Option<Restripe>,
        /// For a mirrored file's object: the storage mirror group `target` is the primary of
        /// (the slot `into` moves). A server of an older version could not push it.
        #[serde(default, with = "crate::wire::since_6_set")]
        group: Option<GroupId>,
    },
}

/// The object pushed is slot `slot` of layout `from`; its bytes go to their places in the
/// objects of layout `to` (plain targets none of which holds an object of `from`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restripe {
    /// The object's slot in `from`.
    pub slot: u16,
    /// The file's layout now.
    pub from: FileLayout,
    /// The layout it is restriped into.
    pub to: FileLayout,
}

impl StorageRequest {
    /// The target the request names (`None` for a StorageBench request, which names none).
    pub fn target(&self) -> Option<TargetId> {
        match self {
            StorageRequest::Write { target, .. }
            | StorageRequest::Read { target, .. }
            | StorageRequest::Truncate { target, .. }
            | StorageRequest::Remove { target, .. }
            | StorageRequest::RemoveObjects { target, .. }
            | StorageRequest::Sync { target, .. }
            | StorageRequest::Fallocate { target, .. }
            | StorageRequest::ListObjects { target, .. }
            | StorageRequest::ObjectLength { target, .. }
            | StorageRequest::ObjectChecksum { target, .. }
            | StorageRequest::SyncTarget { target, .. }
            | StorageRequest::Push { target, .. }
            | StorageRequest::Seal { target, .. }
            | StorageRequest::CopyFrom { target, .. }
            | StorageRequest::NetBench { target, .. } => Some(*target),
            StorageRequest::Bench { .. } => None,
        }
    }

    /// How a request to a mirrored object was routed.
    pub fn mirror(&self) -> Option<MirrorRoute> {
        match self {
            StorageRequest::Write { mirror, .. }
            | StorageRequest::Read { mirror, .. }
            | StorageRequest::Truncate { mirror, .. }
            | StorageRequest::Remove { mirror, .. }
            | StorageRequest::RemoveObjects { mirror, .. }
            | StorageRequest::Sync { mirror, .. }
            | StorageRequest::Fallocate { mirror, .. }
            | StorageRequest::SyncTarget { mirror, .. }
            | StorageRequest::Seal { mirror, .. }
            | StorageRequest::ObjectLength { mirror, .. } => *mirror,
            _ => None,
        }
    }

    /// The change it is (writes and fallocates a client sent, and a resync's writes and
    /// removals).
    pub fn tag(&self) -> Option<&ChangeTag> {
        match self {
            StorageRequest::Write { tag, .. }
            | StorageRequest::Fallocate { tag, .. }
            | StorageRequest::CopyFrom { tag, .. }
            | StorageRequest::Remove { tag, .. } => tag.as_ref(),
            _ => None,
        }
    }

    /// The same request carrying `tag` instead of its own (a primary numbering the changes it
    /// forwards); a request that carries no tag is the same.
    pub fn retagged(mut self, tag: ChangeTag) -> StorageRequest {
        match &mut self {
            StorageRequest::Write { tag: carried, .. }
            | StorageRequest::Fallocate { tag: carried, .. }
            | StorageRequest::Remove { tag: carried, .. } => *carried = Some(tag),
            _ => {}
        }
        self
    }

    /// Whether the request can carry a change tag (a write, a fallocate, a removal).
    pub fn takes_tag(&self) -> bool {
        matches!(
            self,
            StorageRequest::Write { .. }
                | StorageRequest::Fallocate { .. }
                | StorageRequest::Remove { .. }
        )
    }

    /// The same request sent along `route` (a primary forwarding it to a member), without the
    /// client's capability: the member trusts the primary, which checked it.
    pub fn rerouted(mut self, route: Route) -> StorageRequest {
        if let StorageRequest::Write { capability, .. }
        | StorageRequest::Read { capability, .. }
        | StorageRequest::Sync { capability, .. }
        | StorageRequest::Fallocate { capability, .. } = &mut self
        {
            *capability = None;
        }
        match &mut self {
            StorageRequest::Write { target, mirror, .. }
            | StorageRequest::Read { target, mirror, .. }
            | StorageRequest::Truncate { target, mirror, .. }
            | StorageRequest::Remove { target, mirror, .. }
            | StorageRequest::RemoveObjects { target, mirror, .. }
            | StorageRequest::Sync { target, mirror, .. }
            | StorageRequest::Fallocate { target, mirror, .. }
            | StorageRequest::SyncTarget { target, mirror }
            | StorageRequest::Seal { target, mirror, .. }
            | StorageRequest::ObjectLength { target, mirror, .. } => {
                *target = route.target;
                *mirror = route.mirror;
            }
            StorageRequest::ListObjects { target, .. }
            | StorageRequest::ObjectChecksum { target, .. }
            | StorageRequest::Push { target, .. }
            | StorageRequest::CopyFrom { target, .. }
            | StorageRequest::NetBench { target, .. } => {
                *target = route.target;
            }
            StorageRequest::Bench { .. } => {}
        }
        self
    }

    /// The object and byte range a change touches, which changes to the same object must not
    /// overlap in flight to stay in one order on every mirror member; `None` for requests that
    /// change no data.
    pub fn changed_range(&self, payload_len: usize) -> Option<(InodeId, std::ops::Range<u64>)> {
        match self {
            StorageRequest::Write {
                inode,
                object_offset,
                ..
            } => Some((*inode, *object_offset..object_offset + payload_len as u64)),
            StorageRequest::Fallocate {
                inode,
                object_offset,
                len,
                ..
            } => Some((*inode, *object_offset..object_offset.saturating_add(*len))),
            StorageRequest::Truncate { inode, .. }
            | StorageRequest::Remove { inode, .. }
            | StorageRequest::Seal { inode, .. } => Some((*inode, 0..u64::MAX)),
            _ => None,
        }
    }
}

/// What a fallocate does to an object range. The object's length never changes: the metadata
/// server owns the file size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum FallocateMode {
    /// Reserve the blocks (FALLOC_FL_KEEP_SIZE on the object).
    #[wire(tag = 0)]
    Allocate,
    /// Make the range read as zeros and free its blocks (punch a hole).
    #[wire(tag = 1)]
    Zero,
}

/// How far a metadata server's consistency check is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckProgress {
    /// Whether a check runs now.
    pub running: bool,
    /// What it does now, e.g. "listing objects".
    pub phase: String,
    /// Steps of the phase done.
    pub done: u64,
    /// Steps of the phase (0 when not counted).
    pub total: u64,
}

/// What a consistency check (`weft fsck`) of one metadata target found and fixed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// The metadata node checked.
    pub node: NodeId,
    /// Inodes examined.
    pub inodes: u64,
    /// Directory entries examined.
    pub dentries: u64,
    /// Storage objects examined.
    pub objects: u64,
    /// Problems found, each in words (at most [`CHECK_FINDINGS_MAX`]).
    pub problems: Vec<String>,
    /// Problems found in all, including those beyond the detailed list.
    pub problem_count: u64,
    /// What a repair did, each in words.
    pub repairs: Vec<String>,
    /// Storage targets that could not be listed: their objects were not checked.
    pub unreachable_targets: Vec<TargetId>,
}

/// What a storage server answers: its variants keep the tags they had when one enum answered every
/// service, so the bytes on the wire and in stored replies are the same.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum StorageResponse {
    /// Done, nothing to return.
    #[wire(tag = 0)]
    Done,
    /// Bytes written; data read is in the payload.
    #[wire(tag = 11)]
    Written {
        /// Bytes written.
        len: u32,
        /// Changes when writes acknowledged but not yet synced may have been lost (a storage
        /// server's boot id, or a mirror group's loss epoch); a sync answers it too, and a
        /// client whose unsynced writes carried another one reports EIO.
        verifier: u64,
    },
    /// An object's data is durable; `verifier` as in [`StorageResponse::Written`].
    #[wire(tag = 12)]
    Synced {
        /// The verifier now.
        verifier: u64,
    },
    /// Data is in the payload.
    #[wire(tag = 13)]
    Data,
    /// An object's length.
    #[wire(tag = 14)]
    Length(u64),
    /// Objects as (inode, length), in inode order; `end` when nothing follows.
    #[wire(tag = 15)]
    Objects {
        /// The objects.
        objects: Vec<(InodeId, u64)>,
        /// True when the listing reached the end.
        end: bool,
    },
    /// A storage server's StorageBench state.
    #[wire(tag = 21)]
    StorageBench(StorageBenchStatus),
    /// An object's length, and the CRC32C of the range of it asked for (holes read as zeros).
    #[wire(tag = 28)]
    Checksum {
        /// The object's length.
        length: u64,
        /// CRC32C of the bytes of the range that lie before `length`.
        crc: u32,
    },
    /// A push of an object to another target is done ([`StorageRequest::Push`]).
    #[wire(tag = 33, since = 4)]
    Pushed {
        /// Bytes it copied.
        copied: u64,
    },
}
