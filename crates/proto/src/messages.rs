//! Request and response bodies of every service. Names follow `<Verb><Noun>`; the frame header
//! carries the request id, and chunk data travels as the frame's raw payload, never in a body.

use crate::access::Capability;
use crate::error::WireError;
use crate::ids::{
    ClientId, GroupId, GroupVersion, InodeId, MemberId, NodeId, StoragePoolId, TargetId,
};
use crate::layout::{FileLayout, SlotSet, StripePattern};
use crate::wire::Wire;
use serde::{Deserialize, Serialize};

/// The extended attribute holding a directory's default spread: new subdirectories are spread
/// over that many metadata servers (a decimal number) and inherit it.
pub const DIR_SPREAD_XATTR: &str = "trusted.weft.spread";

/// Longest name of one directory entry, as on Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symbolic link target, as Linux's PATH_MAX.
pub const SYMLINK_BYTES_MAX: usize = 4096;
/// Most entries one directory listing reply carries.
pub const READDIR_ENTRIES_MAX: u32 = 1024;
/// Most bytes one read request asks for; clients cut larger reads into pieces.
pub const IO_BYTES_MAX: u32 = 8 * 1024 * 1024;

/// `len` zero bytes (at most [`IO_BYTES_MAX`]): slices of one buffer allocated on first use,
/// for holes in reads and the network benchmark's answers.
///
/// # Panics
/// If `len` is above [`IO_BYTES_MAX`].
pub fn zeros(len: usize) -> bytes::Bytes {
    static ZEROS: std::sync::OnceLock<bytes::Bytes> = std::sync::OnceLock::new();
    ZEROS
        .get_or_init(|| bytes::Bytes::from(vec![0u8; IO_BYTES_MAX as usize]))
        .slice(..len)
}
/// Longest extended attribute name, as Linux's XATTR_NAME_MAX.
pub const XATTR_NAME_BYTES_MAX: usize = 255;
/// Largest extended attribute value, as Linux's XATTR_SIZE_MAX.
pub const XATTR_VALUE_BYTES_MAX: usize = 64 * 1024;
/// Largest list of one inode's attribute names, as Linux's XATTR_LIST_MAX.
pub const XATTR_LIST_BYTES_MAX: usize = 64 * 1024;
/// Longest a server waits for a conflicting lock within one request.
pub const LOCK_WAIT_MS_MAX: u32 = 5_000;
/// Most objects one ListObjects reply carries.
pub const OBJECTS_PER_LIST_MAX: u32 = 65_536;
/// Most bytes of an object one ObjectChecksum reads: one request stays well within a
/// request's deadline on a slow disk.
pub const CHECKSUM_BYTES_MAX: u64 = 64 << 20;
/// Most problems one consistency check reports in detail (the counts are always complete).
pub const CHECK_FINDINGS_MAX: usize = 1000;
/// Most addresses a node announces.
pub const NODE_ADDRESSES_MAX: usize = 16;

/// The addresses (rails) of a node peers name by `address`: a node with several network
/// interfaces announces one address per rail, and is named by all of them, comma-separated
/// (`10.0.1.5:7002,10.0.2.5:7002`).
pub fn rails(address: &str) -> impl Iterator<Item = &str> {
    address
        .split(',')
        .map(str::trim)
        .filter(|rail| !rail.is_empty())
}

/// The address peers name a node by: its rails, comma-separated (the inverse of [`rails`]).
pub fn rail_address(addresses: &[String]) -> String {
    addresses.join(",")
}

/// The role a node plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[wire(rename_all = "snake_case")]
pub enum NodeKind {
    /// The management service.
    #[wire(tag = 0)]
    Management,
    /// A metadata server with one metadata target.
    #[wire(tag = 1)]
    Meta,
    /// A storage server with one or more storage targets.
    #[wire(tag = 2)]
    Storage,
}

/// Whether management hears from a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[wire(rename_all = "snake_case")]
pub enum Reachability {
    /// Heartbeats arrive on time.
    #[wire(tag = 0)]
    Online,
    /// Heartbeats are late but the node is not yet declared dead.
    #[wire(tag = 1)]
    ProbablyOffline,
    /// No heartbeat within the offline timeout.
    #[wire(tag = 2)]
    Offline,
}

/// Space and inode usage of one target (storage or metadata).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceUsage {
    /// Bytes the target may hold.
    pub total_bytes: u64,
    /// Bytes still free.
    pub free_bytes: u64,
    /// Inodes (files) the target may hold.
    pub total_inodes: u64,
    /// Inodes still free.
    pub free_inodes: u64,
}

/// One target's usage as reported in a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    /// The target.
    pub target: TargetId,
    /// Its usage.
    pub usage: SpaceUsage,
}

/// A node as management knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's id.
    pub id: NodeId,
    /// Its role.
    pub kind: NodeKind,
    /// Human-friendly name (host name by default).
    pub alias: String,
    /// Addresses it listens on, `host:port`.
    pub addresses: Vec<String>,
    /// Whether its heartbeats arrive.
    pub reachability: Reachability,
    /// Usage of its metadata target, for metadata nodes.
    pub meta_usage: Option<SpaceUsage>,
    /// Inodes in use on its metadata target, for metadata nodes.
    pub meta_inodes_used: Option<u64>,
}

impl NodeInfo {
    /// The address peers reach it by, all its rails ([`rail_address`]); `None` when it
    /// announced none.
    pub fn address(&self) -> Option<String> {
        (!self.addresses.is_empty()).then(|| rail_address(&self.addresses))
    }
}

/// A storage target as management knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    /// The target's id.
    pub id: TargetId,
    /// The storage node holding it.
    pub node: NodeId,
    /// Its storage pool.
    pub pool: StoragePoolId,
    /// Reachability of its node.
    pub reachability: Reachability,
    /// Last reported usage.
    pub usage: SpaceUsage,
    /// Being drained (`weft target drain`): new files avoid it and the files on it move off.
    #[serde(default, with = "crate::wire::since_4")]
    pub draining: bool,
}

/// Longest management holds a [`MgmtRequest::WatchClusterMap`] before it answers.
pub const MAP_WATCH_WAIT_MS_MAX: u32 = 30_000;

/// The node and target maps clients and servers route with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Every registered node.
    pub nodes: Vec<NodeInfo>,
    /// Every registered storage target.
    pub targets: Vec<TargetInfo>,
    /// Client sessions whose heartbeats arrive; servers drop the locks and opens of others.
    pub live_sessions: Vec<ClientId>,
    /// Mirror groups of storage targets and of metadata nodes.
    pub mirror_groups: Vec<MirrorGroupInfo>,
    /// The restrictions of client identities, by name.
    #[serde(default, with = "crate::wire::since_2")]
    pub clients: Vec<crate::access::ClientRule>,
    /// The live sessions that client identities registered, with the client's name: a
    /// client may act only in its own sessions. Sessions of members are not listed.
    #[serde(default, with = "crate::wire::since_2")]
    pub session_owners: Vec<(ClientId, String)>,
    /// The storage pools but for a default pool with its default limits (`pools.rs`).
    #[serde(default, with = "crate::wire::since_4")]
    pub pools: Vec<crate::pools::PoolInfo>,
    /// Grows with every change of the map that routing or placement follows (not with usage
    /// figures, but with a target's capacity class); larger after a restart of management.
    /// 0 from a management of version 3.
    #[serde(default, with = "crate::wire::since_4")]
    pub epoch: u64,
    /// Users, groups and projects that may not grow their use in a pool (`quota.rs`).
    #[serde(default, with = "crate::quota::spoken_rows")]
    pub quota_blocked: Vec<crate::quota::QuotaBlock>,
    /// The hard limits of users, groups and projects, which the metadata homes hold grants
    /// of (`quota.rs`, [`MgmtRequest::GrantQuota`]).
    #[serde(default, with = "crate::wire::since_9")]
    pub quota_hard: Vec<crate::quota::QuotaHard>,
}

/// What a mirror group mirrors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[wire(rename_all = "snake_case")]
pub enum MirrorKind {
    /// Storage targets on different storage servers.
    #[wire(tag = 0)]
    Storage,
    /// Metadata nodes (each with its one metadata target).
    #[wire(tag = 1)]
    Meta,
}

/// A mirror group member's consistency state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
#[wire(rename_all = "snake_case")]
pub enum Consistency {
    /// Holds everything the primary acknowledged.
    #[wire(tag = 0)]
    Good,
    /// Is being brought up to date from the primary.
    #[wire(tag = 1)]
    NeedsResync,
    /// Out of the group until it is brought back.
    #[wire(tag = 2)]
    Bad,
}

/// One member of a mirror group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorMember {
    /// The storage target id, or the metadata node id.
    pub id: MemberId,
    /// The node that holds it.
    pub node: NodeId,
    /// Its state.
    pub state: Consistency,
    /// For a member that needs a resync: everything must be copied (it restarted, was not in
    /// sync when it left, or the primary changed), not only what the primary recorded it
    /// missed.
    pub full_resync: bool,
}

/// A mirror group as management publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorGroupInfo {
    /// The group (numbered per kind from 1).
    pub id: GroupId,
    /// What it mirrors.
    pub kind: MirrorKind,
    /// Bumped whenever its members, states or primary change.
    pub version: GroupVersion,
    /// The member that serves (its `id`).
    pub primary: MemberId,
    /// Every member, the primary included.
    pub members: Vec<MirrorMember>,
    /// Bumped when writes acknowledged but not synced may have been lost (every copy
    /// crashed): the verifier of the group's writes and syncs.
    pub loss_epoch: u64,
}

/// A member of a mirror group in one version, as a heartbeat reports it.
pub use weft_mirror::GroupMember;

/// What a storage server tells management about its mirror groups in each heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorHeartbeat {
    /// Changes whenever the server restarts.
    pub boot: u64,
    /// Changes whenever writes the server answered before syncing them may be gone: at every
    /// restart of a server that keeps them in its own memory, only when the host restarted
    /// for one whose writes reach the kernel before they are answered.
    pub unsynced_boot: u64,
    /// The server's heartbeat interval: the lease management grants is shorter than the
    /// promotion timeout by at least this much.
    pub interval_ms: u64,
    /// Members this server (as primary) brought up to date.
    pub resynced: Vec<GroupMember>,
    /// Members this server (as primary) cannot reach.
    pub unreachable: Vec<GroupMember>,
    /// Resyncs this server (as primary) runs or finished lately.
    pub resyncs: Vec<ResyncProgress>,
}

/// How far a primary got bringing a member up to date.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncProgress {
    /// Storage targets or metadata nodes.
    pub kind: MirrorKind,
    /// The mirror group.
    pub group: GroupId,
    /// The member being brought up to date.
    pub member: MemberId,
    /// The group version the resync runs in (a new version starts it again).
    pub version: GroupVersion,
    /// Objects the primary holds (for a metadata group: 1 MiB chunks of its store file),
    /// counted when the resync started.
    pub objects_total: u64,
    /// Objects (chunks) copied so far.
    pub objects_copied: u64,
    /// Bytes copied so far.
    pub bytes_copied: u64,
    /// Milliseconds since it started.
    pub elapsed_ms: u64,
    /// Finished: the primary reported the member resynced and waits for management.
    pub done: bool,
    /// Everything is copied, not only what the member missed.
    pub full: bool,
}

/// How a request to a mirrored object was routed: the group and the version of it the sender
/// knows. A member that knows another version refuses it ([`crate::ErrorCode::StaleRoute`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorRoute {
    /// The storage mirror group.
    pub group: GroupId,
    /// Its version.
    pub version: GroupVersion,
    /// Sent by the primary to a member (applied there, not forwarded again).
    pub forwarded: bool,
}

/// Where a storage request goes: the target, and for a mirrored object how it was routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The target that serves it (a group's primary, or a member for a forward).
    pub target: TargetId,
    /// The group route, for a mirrored object.
    pub mirror: Option<MirrorRoute>,
}

impl From<TargetId> for Route {
    fn from(target: TargetId) -> Route {
        Route {
            target,
            mirror: None,
        }
    }
}

/// Most members of one mirror group.
pub const MIRROR_MEMBERS_MAX: usize = 4;

impl ClusterMap {
    /// A storage target's consistency: its state in its mirror group, or good for a target
    /// that is its own only copy.
    pub fn target_consistency(&self, target: TargetId) -> Consistency {
        self.mirror_group_of_target(target)
            .and_then(|group| {
                group
                    .members
                    .iter()
                    .find(|member| member.id == MemberId::from(target))
            })
            .map_or(Consistency::Good, |member| member.state)
    }

    /// The mirror group of this kind and id, if defined.
    pub fn mirror_group(&self, kind: MirrorKind, id: GroupId) -> Option<&MirrorGroupInfo> {
        self.mirror_groups
            .iter()
            .find(|group| group.kind == kind && group.id == id)
    }

    /// The metadata mirror group that holds `home`: the group whose first member it is.
    pub fn meta_group_of_home(&self, home: NodeId) -> Option<&MirrorGroupInfo> {
        self.mirror_groups.iter().find(|group| {
            group.kind == MirrorKind::Meta
                && group
                    .members
                    .first()
                    .is_some_and(|m| m.id == MemberId::from(home))
        })
    }

    /// The metadata node serving `home` now (its group's primary, or the node itself), and
    /// the route a request to it carries.
    pub fn meta_route(&self, home: NodeId) -> (NodeId, MetaRoute) {
        match self.meta_group_of_home(home) {
            Some(group) => (
                NodeId::from(group.primary),
                MetaRoute {
                    home,
                    version: group.version,
                },
            ),
            None => (
                home,
                MetaRoute {
                    home,
                    version: GroupVersion(0),
                },
            ),
        }
    }

    /// Every metadata home, in id order: every metadata node except those that are only
    /// copies (a metadata mirror group's members after its first).
    pub fn all_meta_homes(&self) -> Vec<NodeId> {
        let copies: Vec<MemberId> = self
            .mirror_groups
            .iter()
            .filter(|group| group.kind == MirrorKind::Meta)
            .flat_map(|group| group.members.iter().skip(1).map(|m| m.id))
            .collect();
        let mut homes: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Meta && !copies.contains(&MemberId::from(n.id)))
            .map(|n| n.id)
            .collect();
        homes.sort();
        homes
    }

    /// The homes new directories may be placed on, in id order: [`ClusterMap::all_meta_homes`]
    /// but those whose server is offline.
    pub fn meta_homes(&self) -> Vec<NodeId> {
        let mut homes = self.all_meta_homes();
        homes.retain(|home| {
            let (server, _) = self.meta_route(*home);
            self.node(NodeKind::Meta, server)
                .is_some_and(|n| n.reachability != Reachability::Offline)
        });
        homes
    }

    /// The pool a layout slot's objects are in, and whether a target that holds them is being
    /// drained: a target's own; a storage mirror group's primary's pool, drained when any of
    /// its members is. `None` for a target or group the map does not have.
    pub fn slot_placement(&self, slot: crate::layout::Slot) -> Option<(StoragePoolId, bool)> {
        match slot {
            crate::layout::Slot::Target(target) => {
                self.target(target).map(|t| (t.pool, t.draining))
            }
            crate::layout::Slot::Group(group) => {
                let group = self.mirror_group(MirrorKind::Storage, group)?;
                let primary = self.target(TargetId::from(group.primary))?;
                let draining = self
                    .slot_targets(crate::layout::Slot::Group(group.id))
                    .into_iter()
                    .any(|member| self.target(member).is_some_and(|t| t.draining));
                Some((primary.pool, draining))
            }
        }
    }

    /// The targets that hold a layout slot's objects: the target, or a storage mirror group's
    /// members; none for a target or group the map does not have (removed from the cluster).
    pub fn slot_targets(&self, slot: crate::layout::Slot) -> Vec<TargetId> {
        match slot {
            crate::layout::Slot::Target(target) => {
                self.target(target).map(|t| t.id).into_iter().collect()
            }
            crate::layout::Slot::Group(group) => self
                .mirror_group(MirrorKind::Storage, group)
                .map(|group| group.members.iter().map(|m| TargetId::from(m.id)).collect())
                .unwrap_or_default(),
        }
    }

    /// The storage mirror group `target` is a member of, if any.
    pub fn mirror_group_of_target(&self, target: TargetId) -> Option<&MirrorGroupInfo> {
        self.mirror_groups.iter().find(|group| {
            group.kind == MirrorKind::Storage
                && group.members.iter().any(|m| m.id == MemberId::from(target))
        })
    }

    /// The node of this kind and id, if registered. Each kind numbers its nodes from 1.
    pub fn node(&self, kind: NodeKind, id: NodeId) -> Option<&NodeInfo> {
        self.nodes
            .iter()
            .find(|node| node.kind == kind && node.id == id)
    }

    /// The target with this id, if registered.
    pub fn target(&self, id: TargetId) -> Option<&TargetInfo> {
        self.targets.iter().find(|target| target.id == id)
    }

    /// The client identity that registered `session`; `None` for a member's session or one
    /// not in this map.
    pub fn session_owner(&self, session: ClientId) -> Option<&str> {
        self.session_owners
            .iter()
            .find(|(id, _)| *id == session)
            .map(|(_, name)| name.as_str())
    }

    /// The restrictions of the client named `name`, if management has any.
    pub fn client_rule(&self, name: &str) -> Option<&crate::access::ClientRule> {
        self.clients.iter().find(|rule| rule.name == name)
    }
}

/// Requests served by management.
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum MgmtRequest {
    /// A server announces itself; `node` is its saved id, or `None` on first start.
    #[wire(tag = 0)]
    RegisterNode {
        /// Saved id, if any.
        node: Option<NodeId>,
        /// Role.
        kind: NodeKind,
        /// Human-friendly name.
        alias: String,
        /// Listening addresses.
        addresses: Vec<String>,
    },
    /// A storage server announces a target; `target` is its saved id, or `None` when new.
    #[wire(tag = 1)]
    RegisterTarget {
        /// The storage node.
        node: NodeId,
        /// Saved id, if any.
        target: Option<TargetId>,
    },
    /// A server is alive; storage servers report their targets' usage.
    #[wire(tag = 2)]
    Heartbeat {
        /// The node's role (ids are numbered per role).
        kind: NodeKind,
        /// The node.
        node: NodeId,
        /// Storage targets' usage.
        targets: Vec<TargetReport>,
        /// Metadata target usage, for metadata nodes.
        meta_usage: Option<SpaceUsage>,
        /// Inodes in use on the metadata target, for metadata nodes.
        meta_inodes_used: Option<u64>,
        /// Mirror state of a storage server's targets.
        mirror: Option<MirrorHeartbeat>,
        /// What each user, group and project uses in each pool, per metadata home this
        /// server serves.
        #[serde(default, with = "crate::quota::spoken_rows_per_home")]
        quota_usage: Vec<(NodeId, Vec<crate::quota::QuotaUsage>)>,
        /// Per metadata home this server serves, for every target the map shows draining
        /// that the home looked for: how many of its files still use it (a slot of a layout,
        /// a move's copy, objects awaiting removal).
        #[serde(default, with = "crate::wire::since_4")]
        target_uses: Vec<(NodeId, Vec<(TargetId, u64)>)>,
        /// Per metadata home this server serves: the draining targets some of whose files
        /// cannot move off, how many, and why.
        #[serde(default, with = "crate::wire::since_8")]
        drain_blocked: Vec<(NodeId, Vec<DrainBlock>)>,
    },
    /// A client opens a session.
    #[wire(tag = 3)]
    RegisterClient {
        /// Host name of the client.
        alias: String,
    },
    /// A client's session is alive.
    #[wire(tag = 4)]
    ClientHeartbeat {
        /// The session.
        client: ClientId,
        /// Requests its mount answered with an error because it does not serve them (ioctl,
        /// poll…), by kind, counted since it started.
        unserved: Vec<(String, u64)>,
    },
    /// Asks for the node and target maps.
    #[wire(tag = 5)]
    GetClusterMap,
    /// Asks for management's view of the cluster: states, space, recent throughput, events.
    #[wire(tag = 6)]
    GetClusterStatus,
    /// Creates a mirror group of these members (storage target ids, or metadata node ids),
    /// the first one primary.
    #[wire(tag = 7)]
    CreateMirrorGroup {
        /// Storage or metadata.
        kind: MirrorKind,
        /// The members.
        members: Vec<MemberId>,
    },
    /// Asks for the progress of the storage mirror resyncs running or finished lately.
    #[wire(tag = 8)]
    GetResyncStats,
    /// Pairs every member not yet in a group with one on another node.
    #[wire(tag = 9)]
    AutoCreateMirrorGroups {
        /// Storage or metadata.
        kind: MirrorKind,
    },
    /// Takes (or renews) the cluster-wide lock that serializes directory renames between
    /// directories, so two of them on different metadata servers cannot make a loop. Granted
    /// when free, when its lease ran out, or to the same token.
    #[wire(tag = 10)]
    AcquireRenameLock {
        /// The metadata node asking.
        holder: NodeId,
        /// Names this acquisition.
        token: u64,
    },
    /// Gives the rename lock back.
    #[wire(tag = 11)]
    ReleaseRenameLock {
        /// The token it was taken with.
        token: u64,
    },
    /// Sets the restrictions of a client identity (`weft client set`), replacing any it had.
    #[wire(tag = 12, since = 2)]
    SetClientRule {
        /// The rule, naming its client.
        rule: crate::access::ClientRule,
    },
    /// Removes a client identity's restrictions (`weft client remove`).
    #[wire(tag = 13, since = 2)]
    RemoveClientRule {
        /// The client's name.
        name: String,
    },
    /// Creates an empty storage pool (`weft pool create`); answered with it.
    #[wire(tag = 14, since = 4)]
    CreatePool {
        /// Its name.
        name: String,
    },
    /// Removes an empty storage pool (`weft pool remove`).
    #[wire(tag = 15, since = 4)]
    RemovePool {
        /// The pool.
        pool: StoragePoolId,
    },
    /// Moves storage targets from one pool to another (`weft pool add-target|remove-target`):
    /// each must be in `from`, and a target in a storage mirror group moves with its group's
    /// other members.
    #[wire(tag = 16, since = 4)]
    MovePoolTargets {
        /// The targets.
        targets: Vec<TargetId>,
        /// The pool they are in.
        from: StoragePoolId,
        /// The pool they go to.
        to: StoragePoolId,
    },
    /// Asks for the cluster map once its epoch is past `after`, or after `wait_ms` (at most
    /// [`MAP_WATCH_WAIT_MS_MAX`]) with the map as it is: services and clients follow the map
    /// with it, so a change reaches them as it happens.
    #[wire(tag = 18, since = 4)]
    WatchClusterMap {
        /// The epoch of the map the asker holds.
        after: u64,
        /// Longest to wait for a change, in milliseconds.
        wait_ms: u32,
    },
    /// Sets (or with all limits 0 removes) the quota limits of a user or group in a pool
    /// (`weft quota set`).
    #[wire(tag = 19, since = 4)]
    SetQuota {
        /// The rule.
        rule: crate::quota::QuotaRule,
    },
    /// Asks for every quota rule with its use and state (`weft quota list`).
    #[wire(tag = 20, since = 4)]
    GetQuotas,
    /// A metadata home asks to hold `bytes` and `inodes` of a hard-limited user's, group's or
    /// project's use in a pool (all its inodes use there, and what its writers may still
    /// grow them by): management grants what keeps every home's grants together within the
    /// hard limit, and answers what the home now holds, which may be less than asked (and
    /// less than it held: asking less gives back).
    #[wire(tag = 24, since = 9)]
    GrantQuota {
        /// The home.
        home: NodeId,
        /// Whose use, in which pool.
        key: crate::quota::QuotaKey,
        /// Bytes it asks to hold.
        bytes: u64,
        /// Inodes it asks to hold.
        inodes: u64,
    },
    /// Sets a pool's capacity limits (`weft pool set`).
    #[wire(tag = 17, since = 4)]
    SetPoolLimits {
        /// The pool.
        pool: StoragePoolId,
        /// Below these a target is low.
        low: crate::pools::CapacityLimits,
        /// Below these a target is in emergency.
        emergency: crate::pools::CapacityLimits,
    },
    /// Starts draining a target (`weft target drain`): new files avoid it and the metadata
    /// servers move every file off it; with `stop`, it takes new files again.
    #[wire(tag = 21, since = 4)]
    DrainTarget {
        /// The target.
        target: TargetId,
        /// Stop draining it instead.
        stop: bool,
    },
    /// Removes a drained target from the cluster (`weft target remove`): refused while any
    /// file still uses it, or a metadata server has not told since the drain began.
    #[wire(tag = 22, since = 4)]
    RemoveTarget {
        /// The target.
        target: TargetId,
    },
    /// A message of the replication between management servers: the request, encoded by the
    /// replication library, is the payload, and so is its answer ([`Response::Raft`]). Only
    /// members send it.
    #[wire(tag = 23, since = 7)]
    Raft {
        /// Which message.
        call: RaftCall,
    },
}

/// The messages management servers replicate their state with ([`MgmtRequest::Raft`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[wire(rename_all = "snake_case")]
pub enum RaftCall {
    /// Log entries (or a heartbeat) from the leader.
    #[wire(tag = 0)]
    AppendEntries,
    /// A candidate asks for a vote.
    #[wire(tag = 1)]
    Vote,
    /// A chunk of the leader's snapshot of the state, for a server too far behind its log.
    #[wire(tag = 2)]
    InstallSnapshot,
}

/// The management servers named by `address`: a cluster with several management servers
/// (replicated) names them all, separated by `;` (each with its rails, comma-separated):
/// `10.0.1.1:8008;10.0.1.2:8008;10.0.1.3:8008`.
pub fn mgmt_servers(address: &str) -> impl Iterator<Item = &str> {
    address
        .split(';')
        .map(str::trim)
        .filter(|server| !server.is_empty())
}

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
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum MetaRequest {
    /// Looks a name up in a directory.
    #[wire(tag = 0)]
    Lookup {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Reads an inode's attributes.
    #[wire(tag = 1)]
    GetAttr {
        /// The inode.
        inode: InodeId,
    },
    /// Changes an inode's attributes; a size change truncates.
    #[wire(tag = 2)]
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
    #[wire(tag = 3)]
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
    #[wire(tag = 4)]
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
    #[wire(tag = 5)]
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
    #[wire(tag = 6)]
    Unlink {
        /// Retry identity.
        mutation: MutationId,
        /// The directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Removes an empty directory.
    #[wire(tag = 7)]
    Rmdir {
        /// Retry identity.
        mutation: MutationId,
        /// The parent directory.
        parent: InodeId,
        /// The name.
        name: String,
    },
    /// Renames an entry.
    #[wire(tag = 8)]
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
    #[wire(tag = 9)]
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
    /// Reads a symbolic link.
    #[wire(tag = 10)]
    ReadLink {
        /// The link.
        inode: InodeId,
    },
    /// A client opened a file: keeps it alive past an unlink until released. Idempotent: the
    /// (client, handle) pair names the open, so a retry registers nothing new.
    #[wire(tag = 11)]
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
    Release {
        /// The session.
        client: ClientId,
        /// The files and the handles given at their opens.
        handles: Vec<(InodeId, u64)>,
    },
    /// A client found an object of the file still waiting for a truncate (`TruncatePending`):
    /// the home sends the file's queued truncate to every target now and answers when each
    /// has it.
    #[wire(tag = 13)]
    ApplyTruncate {
        /// The file.
        inode: InodeId,
    },
    /// A client about to write a file past `to` (the end it may grow the file to) asks for
    /// room to: a file whose owner, group or project has a hard byte limit grows only into
    /// room its home reserved for an open, out of the home's grant (`quota.rs`). Answered
    /// with the end the open may now grow the file to (which may be short of `to` at the
    /// limit), [`Response::Reserved`].
    #[wire(tag = 39, since = 9)]
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
    #[wire(tag = 14)]
    ReportSize {
        /// The file.
        inode: InodeId,
        /// What the client wrote.
        report: SizeReport,
        /// The capability of the client's open for writing, for a client whose access the
        /// servers check: what it wrote through it is reported whatever the mode says now.
        #[serde(default, with = "crate::wire::since_8")]
        granted: Option<Capability>,
    },
    /// Sets an extended attribute (including `system.posix_acl_*`).
    #[wire(tag = 15)]
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
    #[wire(tag = 16)]
    GetXattr {
        /// The inode.
        inode: InodeId,
        /// Full name with namespace.
        name: String,
    },
    /// Lists an inode's extended attribute names.
    #[wire(tag = 17)]
    ListXattr {
        /// The inode.
        inode: InodeId,
    },
    /// Removes an extended attribute.
    #[wire(tag = 18)]
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
    #[wire(tag = 19)]
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
    LockEpoch,
    /// Server to server: creates a directory inode that a dentry on the coordinating server
    /// will name (the inode before the dentry, so a crash leaves at worst an orphan).
    /// Idempotent per (coordinator, intent).
    #[wire(tag = 22)]
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
    #[wire(tag = 26)]
    RemoveDirInode {
        /// The directory inode.
        inode: InodeId,
    },
    /// Inodes of other homes that dentries on this server name (for `weft fsck`).
    #[wire(tag = 27)]
    RemoteReferences,
    /// Server to server: inserts a dentry for a rename coordinated by another server (the
    /// entry's old name is there), replacing a victim: a file, or an empty directory (one
    /// living on a third server must have been sealed by the coordinator). Applied once per
    /// (coordinator, intent).
    #[wire(tag = 28)]
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
    Check {
        /// Fix what is safe to fix.
        repair: bool,
        /// Inodes of this home that dentries on other metadata servers name.
        referenced: Vec<InodeId>,
    },
    /// Sets a directory's stripe pattern for new files and subdirectories.
    #[wire(tag = 33)]
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
    IntentsSettled {
        /// The coordinating home.
        coordinator: NodeId,
        /// Its oldest unfinished intent, or its next intent id when none is unfinished.
        below: u64,
    },
    /// How far this metadata server's consistency check is (`weft fsck` shows it while it
    /// waits for the check).
    #[wire(tag = 36)]
    CheckProgress,
    /// What each user and group uses in each pool in the homes this server serves (`weft
    /// quota report` sums the servers).
    #[wire(tag = 37, since = 4)]
    QuotaUsage,
    /// Moves a regular file's objects onto other targets while it stays in use (`weft entry
    /// migrate`): every slot whose target is not in `pool` (when given), or is not the one
    /// `targets` names at its index (when given), or is being drained, goes to another
    /// target; the old layout stays the file's until the copies are complete and the new
    /// one is switched in with one commit. Answered when the move is done, or with
    /// `done: false` while it still runs (ask again: the move goes on either way, and a
    /// restart resumes it).
    #[wire(tag = 38, since = 4)]
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
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum StorageRequest {
    /// Writes the payload at an offset of an object, creating it if needed. Refused with
    /// `TruncatePending` while the object holds data from before a truncate of `generation`
    /// it has not had (see [`StorageRequest::Truncate`]).
    #[wire(tag = 0)]
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
    Bench {
        /// What to do.
        op: StorageBenchOp,
    },
    /// Network benchmark (`weft bench net`): a write whose payload is checked and dropped, or
    /// a read of `read_len` zero bytes, with no disk I/O; the target must exist.
    #[wire(tag = 2)]
    NetBench {
        /// The target.
        target: TargetId,
        /// Bytes to send back (0 for a write).
        read_len: u32,
    },
    /// Reads up to `len` bytes; a short reply means end of object (a hole to the reader).
    /// Refused with `TruncatePending` like a write, so bytes a truncate cut never show.
    #[wire(tag = 3)]
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
    /// Makes an object's data durable.
    #[wire(tag = 6)]
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

/// Any request, tagged with the service that serves it.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum Request {
    /// For management.
    #[wire(tag = 0)]
    Mgmt(MgmtRequest),
    /// For a metadata server: the home it is routed to, the request, and who it acts for
    /// (what a squashing client's root is checked as; `None` from servers and tools).
    #[wire(tag = 1)]
    Meta(
        MetaRoute,
        MetaRequest,
        #[serde(with = "crate::wire::since_2")] Option<crate::access::Caller>,
    ),
    /// For a storage server.
    #[wire(tag = 2)]
    Storage(StorageRequest),
    /// Any server's load counters since it started ([`NodeStats`]); answered by the server
    /// loop itself, for `weft stats` and management's cluster view.
    #[wire(tag = 3)]
    Stats,
}

/// Management's view of the cluster ([`MgmtRequest::GetClusterStatus`], and as JSON at
/// `/api/cluster` on management's port). Rates are per second over management's last two
/// samples of each server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// When this view was made, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Milliseconds between management's samples of the servers.
    pub sample_interval_ms: u64,
    /// Sums over the cluster.
    pub totals: ClusterTotals,
    /// Metadata and storage nodes.
    pub nodes: Vec<NodeStatus>,
    /// Storage targets.
    pub targets: Vec<TargetStatus>,
    /// The busiest client sessions over the whole cluster.
    pub clients: Vec<ClientStatus>,
    /// The cluster's throughput over the last minutes, oldest first.
    pub history: Vec<ClusterSample>,
    /// Recent events (nodes going offline or coming back, targets filling up), oldest first.
    pub events: Vec<ClusterEvent>,
    /// Quota rules with their use and state.
    #[serde(default, with = "crate::quota::spoken_rows")]
    pub quotas: Vec<crate::quota::QuotaState>,
}

impl ClusterStatus {
    /// The view for those who are not the cluster's members (a client key, or anyone over
    /// HTTP): without the client sessions and the quotas, which tell who uses what.
    pub fn without_details(mut self) -> ClusterStatus {
        self.clients.clear();
        self.quotas.clear();
        self
    }
}

/// Sums over the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterTotals {
    /// Metadata and storage nodes registered.
    pub nodes: u64,
    /// Of them, online.
    pub nodes_online: u64,
    /// Storage targets registered.
    pub targets: u64,
    /// Of them, online.
    pub targets_online: u64,
    /// Live client sessions.
    pub client_sessions: u64,
    /// Bytes all storage targets may hold.
    pub capacity_bytes: u64,
    /// Bytes free on all storage targets.
    pub free_bytes: u64,
    /// Inodes in the namespace (sum over metadata servers).
    pub inodes: u64,
    /// The latest throughput.
    pub now: ClusterSample,
}

/// The cluster's throughput at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSample {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Bytes per second read from storage targets.
    pub read_bytes_per_second: u64,
    /// Bytes per second written to storage targets.
    pub written_bytes_per_second: u64,
    /// Requests per second answered by metadata servers.
    pub meta_ops_per_second: u64,
}

/// One node as management sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub id: NodeId,
    /// Metadata or storage.
    pub kind: NodeKind,
    /// Its alias.
    pub alias: String,
    /// Its addresses (also where its metrics are: `http://ADDRESS/metrics`).
    pub addresses: Vec<String>,
    /// Whether heartbeats arrive.
    pub reachability: Reachability,
    /// Milliseconds since the service started; 0 when it was not sampled.
    pub uptime_ms: u64,
    /// Requests per second.
    pub requests_per_second: u64,
    /// Bytes per second received (clients' writes, requests).
    pub received_bytes_per_second: u64,
    /// Bytes per second sent (clients' reads, answers).
    pub sent_bytes_per_second: u64,
    /// Requests waiting or running when sampled.
    pub in_flight: u64,
    /// A metadata server's target space.
    pub meta_usage: Option<SpaceUsage>,
    /// A metadata server's inodes.
    pub meta_inodes: Option<u64>,
}

/// One storage target as management sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStatus {
    /// The target.
    pub id: TargetId,
    /// Its storage node.
    pub node: NodeId,
    /// Its pool.
    pub pool: StoragePoolId,
    /// Whether its node's heartbeats arrive.
    pub reachability: Reachability,
    /// `good`, `needs-resync` or `bad`: its state in its mirror group (good outside any).
    pub consistency: String,
    /// Space and inodes as last reported.
    pub usage: SpaceUsage,
    /// Bytes per second read.
    pub read_bytes_per_second: u64,
    /// Bytes per second written.
    pub written_bytes_per_second: u64,
    /// Disk operations per second.
    pub operations_per_second: u64,
    /// Disk operations queued or running when sampled.
    pub queue_depth: u64,
    /// While it drains: files that still use it, as the metadata servers last told.
    #[serde(default, with = "crate::wire::since_4")]
    pub drain_left: Option<u64>,
    /// While it drains: why some of those files cannot move off (and what to do), when
    /// the metadata servers found some that cannot.
    #[serde(default, with = "crate::wire::since_8")]
    pub drain_blocked: Option<DrainBlock>,
}

/// Files of a draining target that cannot move off it, as a metadata home (or, summed,
/// management) found them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainBlock {
    /// The draining target.
    pub target: TargetId,
    /// How many files that use it found no place to move to.
    pub files: u64,
    /// Why (of the first), and what to do.
    pub why: String,
}

/// One client session's load over the whole cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStatus {
    /// The session.
    pub client: ClientId,
    /// Requests per second to every server.
    pub requests_per_second: u64,
    /// Bytes per second it writes to storage servers.
    pub written_bytes_per_second: u64,
    /// Bytes per second it reads from storage servers.
    pub read_bytes_per_second: u64,
}

/// Something that happened in the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// `info` or `warning`.
    pub level: String,
    /// What happened, in words.
    pub message: String,
}

/// Most clients one [`NodeStats`] lists (the busiest).
pub const STATS_CLIENTS_MAX: usize = 1000;

/// A server's counters since it started. Rates are differences of two of these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Milliseconds since the service started.
    pub uptime_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Bytes of frames received.
    pub received_bytes: u64,
    /// Bytes of frames sent.
    pub sent_bytes: u64,
    /// Requests received and not answered yet.
    pub in_flight: u64,
    /// Requests answered, by operation name, in name order.
    pub ops: Vec<(String, u64)>,
    /// The busiest client sessions, at most [`STATS_CLIENTS_MAX`].
    pub clients: Vec<ClientStats>,
    /// A storage server's targets.
    pub targets: Vec<TargetStats>,
}

/// One client session's load on one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStats {
    /// The session (its id's low 32 bits; 0 for servers and tools without a session).
    pub client: ClientId,
    /// Requests answered.
    pub requests: u64,
    /// Bytes received from the session (what it wrote).
    pub received_bytes: u64,
    /// Bytes sent to the session (what it read).
    pub sent_bytes: u64,
}

/// One storage target's disk counters since its server started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetStats {
    /// The target.
    pub target: TargetId,
    /// Disk operations done.
    pub operations: u64,
    /// Bytes read from the target.
    pub read_bytes: u64,
    /// Bytes written to the target.
    pub written_bytes: u64,
    /// Disk operations queued or running now.
    pub queue_depth: u64,
    /// Space and inodes now.
    pub usage: SpaceUsage,
}

/// Successful answers.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum Response {
    /// Done, nothing to return.
    #[wire(tag = 0)]
    Done,
    /// The node's id.
    #[wire(tag = 1)]
    NodeRegistered {
        /// Allocated or confirmed id.
        node: NodeId,
    },
    /// The target's id.
    #[wire(tag = 2)]
    TargetRegistered {
        /// Allocated or confirmed id.
        target: TargetId,
    },
    /// The client's session.
    #[wire(tag = 3)]
    ClientRegistered {
        /// The new session id.
        client: ClientId,
        /// How long management keeps the session without a heartbeat, in milliseconds (0:
        /// not said, from a server of version 6). The client heartbeats well within it.
        #[serde(default, with = "crate::wire::since_7")]
        session_timeout_ms: u64,
    },
    /// The maps.
    #[wire(tag = 4)]
    ClusterMap(ClusterMap),
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
    /// An object's data is durable; `verifier` as in [`Response::Written`].
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
    /// A storage server's StorageBench state.
    #[wire(tag = 21)]
    StorageBench(StorageBenchStatus),
    /// A server's load counters.
    #[wire(tag = 22)]
    Stats(NodeStats),
    /// Management's view of the cluster.
    #[wire(tag = 23)]
    ClusterStatus(ClusterStatus),
    /// Mirror groups (the ones just created).
    #[wire(tag = 24)]
    MirrorGroups(Vec<MirrorGroupInfo>),
    /// Resyncs of storage mirror members, as their primaries last reported them.
    #[wire(tag = 25)]
    ResyncStats(Vec<ResyncProgress>),
    /// Management's answer to a heartbeat.
    #[wire(tag = 26)]
    HeartbeatAck {
        /// A primary may serve until this long after it sent the heartbeat.
        lease_ms: u64,
        /// The storage mirror groups the node's targets are members of.
        mirror_groups: Vec<MirrorGroupInfo>,
        /// Management's clock when it answered, in milliseconds since the Unix epoch: the
        /// cluster's clock, which capabilities' expiry is granted and checked by (0 from a
        /// management of version 7).
        #[serde(default, with = "crate::wire::since_8")]
        unix_ms: u64,
    },
    /// How far a consistency check is.
    #[wire(tag = 27)]
    CheckProgress(CheckProgress),
    /// An object's length, and the CRC32C of the range of it asked for (holes read as zeros).
    #[wire(tag = 28)]
    Checksum {
        /// The object's length.
        length: u64,
        /// CRC32C of the bytes of the range that lie before `length`.
        crc: u32,
    },
    /// A file opened by a client whose access the servers check: its attributes, and the
    /// grant of access to its objects the storage servers want from that client.
    #[wire(tag = 29, since = 3)]
    Opened {
        /// The file.
        attr: InodeAttr,
        /// The grant.
        capability: Capability,
    },
    /// A storage pool.
    #[wire(tag = 30, since = 4)]
    Pool(crate::pools::PoolInfo),
    /// What users, groups and projects use, per pool.
    #[wire(tag = 31, since = 4)]
    QuotaUsage(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaUsage>),
    /// Quota rules with their use and state.
    #[wire(tag = 32, since = 4)]
    Quotas(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaState>),
    /// A push of an object to another target is done ([`StorageRequest::Push`]).
    #[wire(tag = 33, since = 4)]
    Pushed {
        /// Bytes it copied.
        copied: u64,
    },
    /// How far a file's move is ([`MetaRequest::Migrate`]).
    #[wire(tag = 34, since = 4)]
    Migration {
        /// Slots of the layout that move (0: the file was where it should be).
        moving: u16,
        /// Whether the move is done.
        done: bool,
    },
    /// The answer to a [`MgmtRequest::Raft`], in the payload.
    #[wire(tag = 35, since = 7)]
    Raft,
    /// The end an open may grow its file to ([`MetaRequest::Reserve`]).
    #[wire(tag = 36, since = 9)]
    Reserved {
        /// The end.
        to: u64,
        /// For a client whose access the servers check: a new grant of the open, which lets
        /// its writes grow the file's objects as far as the room.
        capability: Option<Capability>,
    },
    /// What a home now holds of a quota ([`MgmtRequest::GrantQuota`]).
    #[wire(tag = 37, since = 9)]
    QuotaGranted {
        /// Bytes.
        bytes: u64,
        /// Inodes.
        inodes: u64,
    },
}

impl Request {
    /// The operation's name for metrics and statistics: the request's variant in snake case
    /// (`create`, `write`, `heartbeat`).
    pub fn op_name(&self) -> &'static str {
        match self {
            Request::Mgmt(request) => request.into(),
            Request::Meta(_, request, _) => request.into(),
            Request::Storage(request) => request.into(),
            Request::Stats => "stats",
        }
    }
}

/// The body of a response frame.
pub type Reply = Result<Response, WireError>;
