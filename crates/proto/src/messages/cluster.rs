//! The cluster as every node sees it: nodes, targets, mirror groups and the routes to them
//! ([`ClusterMap`]), and what servers report of themselves to management.

use super::*;

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
