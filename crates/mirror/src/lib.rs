//! Mirror groups as sans-I/O state machines: messages and a clock go in, messages to send come
//! out. The deterministic simulator (`crates/sim`) drives them through partitions, message
//! loss and reordering, and crashes that lose unsynced writes; management runs the
//! [`Controller`] and every storage and metadata server runs [`Membership`].
//!
//! Roles:
//! - [`Membership`] (every server): what a server decides about its groups — versions, lease,
//!   admission, members to reach or report, resyncs, records of missed changes.
//! - [`Controller`] (management): owns each group's membership, primary and *version*, keeps
//!   them durable before it publishes them, grants leases in heartbeat answers, promotes a
//!   `good` secondary when a primary is silent for the promotion timeout, and turns members
//!   that left, restarted or came back into `needs-resync`.
//! - [`fence`], [`ranges`], [`resync`], [`numbers`] (every storage server): a change fence
//!   that applies a change once and never late, byte-range locks that order a primary's
//!   changes to one object, the plan and steps of bringing a returning member up to date, and
//!   the numbers a primary gives its forwards (as a client gives its requests).
//! - [`pages`], [`home`] (every metadata server): a sync's changes to a home's store file and
//!   the extents they write, the order in which a copy takes its primary's sends, the steps
//!   of a copy's resync, and a served home's sends: its syncs in order, what a sync that could
//!   not ship leaves for the next opening, and its resyncs' steps between syncs.
//! - [`watch`] (every storage server): what changed of an object moving off its target since
//!   the last round of its move's copy took it.
//! - [`delivery`], [`primary`] (every storage and metadata server): one send of a primary
//!   until each member took it or left, and a client's change at its primary from its range to
//!   its answer.
//!
//! Everything here is run by the services. The simulator (`crates/sim`) builds its storage
//! and metadata servers and its clients from these machines, as thin shells over messages
//! and chunks in memory, so what it checks is what the services run.
//!
//! Safety rests on four rules. Every request and forward carries a group version and is
//! refused by a member that knows another. A primary holds a chunk's range while a change to
//! it (or a resync's copy of it) reaches every member, so members apply changes to one chunk
//! in the primary's order. A copy of a change that arrives late (after its sender moved on) is
//! dropped by the receiver's fence. A primary's lease ends before management may promote
//! anyone: `lease + heartbeat + margin <= promotion timeout` ([`Timing::check`]).

mod controller;
pub mod delivery;
pub mod fence;
pub mod home;
mod membership;
pub mod numbers;
pub mod pages;
pub mod primary;
pub mod push;
pub mod ranges;
pub mod resync;
pub mod watch;

pub use controller::{Controller, ControllerDurable};
pub use membership::{Adopted, Membership, Refused, ResyncStart};

use std::collections::BTreeMap;
use weft_wire_derive::Wire;

/// Declares numbers that name things: a newtype over an integer, ordered, hashable, shown
/// as the number, and encoded exactly as the integer.
macro_rules! numbers {
    ($($(#[$doc:meta])* $name:ident($int:ty);)*) => {$(
        $(#[$doc])*
        #[derive(
            Clone,
            Copy,
            Debug,
            Default,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $int);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}

numbers! {
    /// A member of mirror groups: a storage target of a storage group, or a metadata node of a
    /// metadata group (in the model, a server).
    ServerId(u32);
    /// A mirror group, numbered per kind from 1.
    GroupId(u32);
    /// A group's version: management bumps it whenever membership, states or primary change.
    Version(u64);
}

impl GroupId {
    /// The group that names the plain objects of `server`'s target ([`PLAIN`]).
    pub fn plain(server: ServerId) -> GroupId {
        GroupId(PLAIN.0 + server.0)
    }

    /// The server whose plain objects this group id names, if it names such.
    pub fn plain_server(self) -> Option<ServerId> {
        (self >= PLAIN).then(|| ServerId(self.0 - PLAIN.0))
    }
}

impl Version {
    /// The version after this one.
    pub fn next(self) -> Version {
        Version(self.0 + 1)
    }
}

/// A member of a group in one version of it: what a primary reports about a member it brought
/// up to date or cannot reach.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct GroupMember {
    /// The group.
    pub group: GroupId,
    /// The version of the group the member was seen in.
    pub version: Version,
    /// The member.
    pub member: ServerId,
}

/// A chunk of a group (in Weft: an object's chunk on the group's targets).
pub type ChunkId = u64;
/// Milliseconds on the node's monotonic clock.
pub type Time = u64;
/// A client session.
pub type ClientId = u32;

/// Group ids from here on name no group but the plain objects of one server's target:
/// `PLAIN + server`. A client changes, syncs and reads them on that server alone, with no
/// version and no copies; their loss epoch is the server's unsynced-boot id (a crash of its
/// host loses what was not synced). They share chunk ids with mirrored chunks, as a storage
/// target holds plain and mirrored objects of the same inode ids apart.
pub const PLAIN: GroupId = GroupId(1 << 20);

/// Group ids from here on (below [`PLAIN`]) name metadata homes: groups that hold one store
/// file, mirrored as metadata servers mirror theirs ([`pages`]).
pub const HOMES: GroupId = GroupId(1 << 19);

/// Where a message goes or comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// Management.
    Mgmt,
    /// A storage server.
    Server(ServerId),
    /// A client.
    Client(ClientId),
}

/// A member's consistency state in one version of its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire)]
pub enum MemberState {
    /// Holds everything the primary acknowledged; may be promoted.
    #[wire(tag = 0)]
    Good,
    /// Receives new writes but is still being brought up to date; never promoted. `full`:
    /// everything is copied (it restarted and may have lost unsynced writes, or the primary
    /// changed), not only what it missed.
    #[wire(tag = 1)]
    NeedsResync {
        /// Copy everything, not only what was missed.
        full: bool,
    },
    /// Out of the group for now: gets no writes; the primary records what it misses.
    #[wire(tag = 2)]
    Absent,
}

/// One member of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Its server.
    pub server: ServerId,
    /// Its state.
    pub state: MemberState,
}

/// One version of a group.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Group {
    /// The group.
    pub id: GroupId,
    /// Its version.
    pub version: Version,
    /// The primary, always a `Good` member.
    pub primary: ServerId,
    /// Every member, the primary included.
    pub members: Vec<Member>,
    /// Bumped whenever acknowledged writes that were not synced may have been lost (a
    /// restarted primary kept its role because no good copy was left): a sync covering writes
    /// from an older epoch answers [`Answer::Lost`] instead of claiming they are durable.
    pub loss_epoch: u64,
}

impl Group {
    /// The member on `server`.
    pub fn member(&self, server: ServerId) -> Option<&Member> {
        self.members.iter().find(|m| m.server == server)
    }

    /// Members other than the primary that receive writes (good or resyncing).
    pub fn present_secondaries(&self) -> impl Iterator<Item = &Member> {
        self.members
            .iter()
            .filter(move |m| m.server != self.primary && m.state != MemberState::Absent)
    }
}

/// Every group, as management publishes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupMap {
    /// Groups by id.
    pub groups: BTreeMap<GroupId, Group>,
}

impl GroupMap {
    /// Takes every group of `other` that is newer than the one known; returns the groups
    /// taken, each with the version it replaced.
    pub fn merge_newer(&mut self, other: GroupMap) -> Vec<(GroupId, Option<Group>)> {
        let mut taken = Vec::new();
        for (id, group) in other.groups {
            let newer = self
                .groups
                .get(&id)
                .is_none_or(|known| known.version < group.version);
            if newer {
                let before = self.groups.insert(id, group);
                taken.push((id, before));
            }
        }
        taken
    }
}

/// A forwarded change's identity, as storage servers carry it in a change tag: its sender
/// (the primary's forwarder, or a resync), its number, the number below which the sender's
/// changes are settled, and the ones at or above it the sender gave up on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeId {
    /// The sender.
    pub client: u64,
    /// The change's number, the same in every copy.
    pub number: u64,
    /// Every change of the sender numbered below this is settled.
    pub settled_below: u64,
    /// Changes at or above the mark the sender gave up on.
    pub abandoned: Vec<u64>,
}

impl ChangeId {
    /// What the receiver's fence decides by.
    pub fn tag(&self) -> crate::fence::Tag<'_> {
        crate::fence::Tag {
            client: self.client,
            number: self.number,
            settled_below: self.settled_below,
            abandoned: &self.abandoned,
        }
    }
}

/// A chunk's bytes (the simulator's objects).
pub type Bytes = Vec<u8>;

/// A change of one chunk, as a client sends it and a primary forwards it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Writes `data` at `offset`, growing the chunk (with zeros) if it ends past its end.
    Write {
        /// The chunk.
        chunk: ChunkId,
        /// Where.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Zeroes `len` bytes at `offset` within the chunk's length (a punched hole).
    Punch {
        /// The chunk.
        chunk: ChunkId,
        /// Where.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// Cuts or extends (with zeros) the chunk to `length`.
    Truncate {
        /// The chunk.
        chunk: ChunkId,
        /// The new length.
        length: u64,
    },
    /// The chunk is gone.
    Remove {
        /// The chunk.
        chunk: ChunkId,
    },
    /// The chunk moved to another group, as a storage server's object whose file's last push
    /// ended: its bytes go, and every later change or read of it is answered
    /// [`Answer::Moved`].
    Seal {
        /// The chunk.
        chunk: ChunkId,
    },
}

impl Change {
    /// The chunk it changes.
    pub fn chunk(&self) -> ChunkId {
        match self {
            Change::Write { chunk, .. }
            | Change::Punch { chunk, .. }
            | Change::Truncate { chunk, .. }
            | Change::Remove { chunk }
            | Change::Seal { chunk } => *chunk,
        }
    }

    /// The bytes of the chunk it changes, as a primary locks them: a truncate or a removal
    /// takes the whole chunk, as on a storage server.
    pub fn range(&self) -> std::ops::Range<u64> {
        match self {
            Change::Write { offset, data, .. } => *offset..*offset + data.len() as u64,
            Change::Punch { offset, len, .. } => *offset..*offset + *len,
            Change::Truncate { .. } | Change::Remove { .. } | Change::Seal { .. } => 0..u64::MAX,
        }
    }

    /// Applies the change to `object` (`None`: there is none).
    pub fn apply(&self, object: &mut Option<Bytes>) {
        match self {
            Change::Write { offset, data, .. } => {
                let bytes = object.get_or_insert_with(Vec::new);
                let start = *offset as usize;
                let end = start + data.len();
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[start..end].copy_from_slice(data);
            }
            Change::Punch { offset, len, .. } => {
                if let Some(bytes) = object {
                    let end = ((*offset + *len) as usize).min(bytes.len());
                    let start = (*offset as usize).min(end);
                    bytes[start..end].fill(0);
                }
            }
            Change::Truncate { length, .. } => {
                object
                    .get_or_insert_with(Vec::new)
                    .resize(*length as usize, 0);
            }
            Change::Remove { .. } | Change::Seal { .. } => *object = None,
        }
    }

    /// Applies the change to its chunk of `group` among `chunks`.
    pub fn apply_to(&self, chunks: &mut BTreeMap<(GroupId, ChunkId), Bytes>, group: GroupId) {
        let key = (group, self.chunk());
        let mut object = chunks.remove(&key);
        self.apply(&mut object);
        if let Some(bytes) = object {
            chunks.insert(key, bytes);
        }
    }
}

/// Why a member refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request was routed with another version of the group: fetch the map again.
    WrongVersion,
    /// This server is not the group's primary.
    NotPrimary,
    /// The primary's lease ran out: it cannot know whether it is still primary.
    NoLease,
}

/// A client operation's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer<D> {
    /// A change is on every present member; `epoch` is the group's loss epoch it was made in.
    Written {
        /// The group's [`Group::loss_epoch`] when the write was applied.
        epoch: u64,
    },
    /// A sync is done: every write acknowledged before it is durable on every present member.
    Done,
    /// A sync found that writes acknowledged since the given epoch may have been lost in a
    /// crash of every copy before they were synced (the application sees EIO, as after a
    /// failed fsync).
    Lost,
    /// A read's data (`None`: never written), and the group's loss epoch when it was read.
    Data {
        /// The chunk.
        data: Option<D>,
        /// The group's [`Group::loss_epoch`].
        epoch: u64,
    },
    /// Refused; the client fetches the map and tries again.
    Refused(Refusal),
    /// The chunk was sealed (it moved to another group): nothing was changed or read.
    Moved,
}

/// Every message the machines exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg<D> {
    /// Server → management, every heartbeat interval.
    Heartbeat {
        /// Changes whenever the server restarts.
        boot: u64,
        /// Changes whenever writes the server answered before syncing them may be gone (a
        /// crash of its host; for a server that keeps them in its own memory, any restart).
        unsynced_boot: u64,
        /// The server's clock when it sent this; its lease counts from here.
        sent_at: Time,
        /// Members this server (as primary) brought up to date.
        resynced: Vec<GroupMember>,
        /// Members this server (as primary) cannot reach.
        unreachable: Vec<GroupMember>,
    },
    /// Management → server: the map, and a lease until `sent_at + lease`.
    HeartbeatAck {
        /// The heartbeat's `sent_at`.
        sent_at: Time,
        /// The map.
        map: GroupMap,
    },
    /// Client → management.
    GetMap,
    /// Management → client.
    Map(GroupMap),
    /// Client → primary: change a chunk.
    Change {
        /// The group.
        group: GroupId,
        /// The version the client routed with.
        version: Version,
        /// The change.
        change: Change,
        /// The client's sequence number (the same on every retry).
        seq: u64,
    },
    /// Client → primary: make every write acknowledged so far durable on every member.
    Sync {
        /// The group.
        group: GroupId,
        /// The version the client routed with.
        version: Version,
        /// The oldest loss epoch among the client's writes since its last sync
        /// (`u64::MAX`: none).
        since: u64,
        /// The client's sequence number.
        seq: u64,
    },
    /// Client → primary: read a chunk.
    Read {
        /// The group.
        group: GroupId,
        /// The version the client routed with.
        version: Version,
        /// The chunk.
        chunk: ChunkId,
        /// The client's sequence number.
        seq: u64,
    },
    /// Mover → primary of the group a chunk moves off: run a round of its copy to group `to`
    /// ([`push`]), the last one (`seal`) sealing it here and on every member. Answered
    /// [`Answer::Done`] once the round is done, refused as any request otherwise.
    Push {
        /// The group the chunk moves off.
        group: GroupId,
        /// The version the mover routed with.
        version: Version,
        /// The chunk.
        chunk: ChunkId,
        /// The group it moves to.
        to: GroupId,
        /// The move (a round of another starts its copy over).
        id: u64,
        /// Whether this is the last round.
        seal: bool,
        /// The mover's sequence number.
        seq: u64,
    },
    /// Primary → client.
    Reply {
        /// The request's sequence number.
        seq: u64,
        /// The answer.
        answer: Answer<D>,
    },
    /// Primary → member: apply a change (a client's, or a resync's step) once.
    Forward {
        /// The group.
        group: GroupId,
        /// The primary's version.
        version: Version,
        /// The primary's operation id, echoed by the ack.
        op: u64,
        /// Which change it is, for the member's fence.
        tag: ChangeId,
        /// The change.
        change: Change,
    },
    /// Primary → member: make the group's data durable.
    SyncReplica {
        /// The group.
        group: GroupId,
        /// The primary's version.
        version: Version,
        /// The primary's operation id.
        op: u64,
    },
    /// Primary → member: make one chunk durable (a resync's copy of it).
    SyncChunk {
        /// The group.
        group: GroupId,
        /// The primary's version.
        version: Version,
        /// The primary's operation id.
        op: u64,
        /// The chunk.
        chunk: ChunkId,
    },
    /// Primary → returning member: list your chunks of the group after `after`.
    ListChunks {
        /// The group.
        group: GroupId,
        /// The primary's version.
        version: Version,
        /// The primary's operation id.
        op: u64,
        /// The last chunk of the previous page (0: from the start).
        after: ChunkId,
    },
    /// Member → primary: a page of its chunks.
    Chunks {
        /// The group.
        group: GroupId,
        /// The listing's operation id.
        op: u64,
        /// The chunks, in order.
        chunks: Vec<ChunkId>,
        /// Whether they are the last.
        end: bool,
    },
    /// Primary of a metadata home → member: apply a sync's changes to the copy of the home's
    /// store file (or a resync's piece), if the send is newer than every one applied.
    PageApply {
        /// The home's group.
        group: GroupId,
        /// The primary's version.
        version: Version,
        /// The primary's operation id, echoed by the ack.
        op: u64,
        /// The send's place among the home's sends.
        order: pages::SendOrder,
        /// The changes.
        changes: Vec<pages::FileChange>,
        /// The bytes they write.
        payload: Bytes,
        /// Sync the copy before answering.
        sync: bool,
    },
    /// Member → primary: done.
    MemberAck {
        /// The group.
        group: GroupId,
        /// The version the member holds.
        version: Version,
        /// The operation.
        op: u64,
    },
    /// Member → primary: refused, the member knows another version.
    MemberRefused {
        /// The group.
        group: GroupId,
        /// The version the member holds.
        version: Version,
        /// The operation.
        op: u64,
    },
}

/// Timeouts, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between heartbeats of a server.
    pub heartbeat_ms: u64,
    /// A primary serves until this long after it sent a heartbeat management answered.
    pub lease_ms: u64,
    /// Management promotes a secondary after its primary was silent this long, and drops a
    /// silent secondary from its group.
    pub promotion_timeout_ms: u64,
    /// A member that has not acknowledged a forward this long is reported unreachable.
    pub member_timeout_ms: u64,
    /// Forwards and requests not answered this long are sent again.
    pub retry_ms: u64,
}

/// Kept between the end of a lease and the earliest promotion, for clock rate differences.
pub const LEASE_MARGIN_MS: u64 = 500;

impl Timing {
    /// Checks that a primary's lease always ends before management may promote another.
    ///
    /// # Errors
    /// Which inequality does not hold.
    pub fn check(&self) -> Result<(), String> {
        if self.lease_ms + self.heartbeat_ms + LEASE_MARGIN_MS > self.promotion_timeout_ms {
            return Err(format!(
                "lease ({} ms) + heartbeat ({} ms) + margin ({LEASE_MARGIN_MS} ms) must not exceed the promotion timeout ({} ms): two primaries could serve at once",
                self.lease_ms, self.heartbeat_ms, self.promotion_timeout_ms
            ));
        }
        if self.heartbeat_ms == 0 || self.retry_ms == 0 {
            return Err("heartbeat and retry intervals must be positive".into());
        }
        Ok(())
    }
}

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Send<D> {
    /// Where to.
    pub to: Node,
    /// What.
    pub msg: Msg<D>,
}

/// What the machines' unit tests (here and in the simulator) share.
#[doc(hidden)]
pub mod testing {
    use crate::{Group, GroupId, Member, MemberState, Membership, ServerId, Time, Timing, Version};

    /// Server `local` hears at `at` that group 1 ([`pair`]) is in `version`, server 2 in
    /// `second`; its lease runs from `at`.
    pub fn adopt_pair(
        membership: &mut Membership<()>,
        local: ServerId,
        at: Time,
        (version, second): (Version, MemberState),
    ) {
        membership.adopt(
            at,
            TIMING.lease_ms,
            vec![(pair(version, second), ())],
            |member| member == local,
        );
    }

    /// Timeouts that keep `Timing::check`.
    pub const TIMING: Timing = Timing {
        heartbeat_ms: 100,
        lease_ms: 300,
        promotion_timeout_ms: 1_000,
        member_timeout_ms: 400,
        retry_ms: 150,
    };

    /// Group 1 in `version`: server 1 its good primary, server 2 in `second`.
    pub fn pair(version: Version, second: MemberState) -> Group {
        Group {
            id: GroupId(1),
            version,
            primary: ServerId(1),
            members: vec![
                Member {
                    server: ServerId(1),
                    state: MemberState::Good,
                },
                Member {
                    server: ServerId(2),
                    state: second,
                },
            ],
            loss_epoch: 0,
        }
    }
}
