//! Requests served by management ([`MgmtRequest`]), and the calls of its replicated log.

use super::*;

/// Requests served by management.
#[derive(Clone, Debug, PartialEq, Eq, Wire, strum::IntoStaticStr, crate::access::Declared)]
#[request(response = MgmtResponse, answers = mgmt_answers, calls = MgmtCalls)]
#[strum(serialize_all = "snake_case")]
pub enum MgmtRequest {
    /// A server announces itself; `node` is its saved id, or `None` on first start.
    #[wire(tag = 0)]
    #[request(members, changes, answer = NodeId)]
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
    #[request(members, changes, answer = TargetId)]
    RegisterTarget {
        /// The storage node.
        node: NodeId,
        /// Saved id, if any.
        target: Option<TargetId>,
    },
    /// A server is alive; storage servers report their targets' usage.
    #[wire(tag = 2)]
    #[request(members, reads, stub = none, answer = crate::answer::HeartbeatAck)]
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
    #[request(reads, stub = none, answer = crate::answer::Registered)]
    RegisterClient {
        /// Host name of the client.
        alias: String,
    },
    /// A client's session is alive.
    #[wire(tag = 4)]
    #[request(reads, sessions(client), stub = none, answer = ())]
    ClientHeartbeat {
        /// The session.
        client: ClientId,
        /// Requests its mount answered with an error because it does not serve them (ioctl,
        /// poll…), by kind, counted since it started.
        unserved: Vec<(String, u64)>,
    },
    /// Asks for the node and target maps.
    #[wire(tag = 5)]
    #[request(reads, stub = cluster_map, answer = ClusterMap)]
    GetClusterMap,
    /// Asks for management's view of the cluster: states, space, recent throughput, events.
    #[wire(tag = 6)]
    #[request(reads, stub = cluster_status, answer = ClusterStatus)]
    GetClusterStatus,
    /// Creates a mirror group of these members (storage target ids, or metadata node ids),
    /// the first one primary.
    ///
    /// Fails with `InvalidArgument` naming what is wrong with the members.
    #[wire(tag = 7)]
    #[request(members, changes, answer = Vec<MirrorGroupInfo>)]
    CreateMirrorGroup {
        /// Storage or metadata.
        kind: MirrorKind,
        /// The members.
        members: Vec<MemberId>,
    },
    /// Asks for the progress of the storage mirror resyncs running or finished lately.
    #[wire(tag = 8)]
    #[request(reads, stub = resync_stats, answer = Vec<ResyncProgress>)]
    GetResyncStats,
    /// Pairs every member not yet in a group with one on another node.
    #[wire(tag = 9)]
    #[request(members, changes, stub = autocreate_mirror_groups, answer = Vec<MirrorGroupInfo>)]
    AutoCreateMirrorGroups {
        /// Storage or metadata.
        kind: MirrorKind,
    },
    /// Takes (or renews) the cluster-wide lock that serializes directory renames between
    /// directories, so two of them on different metadata servers cannot make a loop. Granted
    /// when free, when its lease ran out, or to the same token.
    ///
    /// Fails with `WouldBlock`.
    #[wire(tag = 10)]
    #[request(members, changes, answer = ())]
    AcquireRenameLock {
        /// The metadata node asking.
        holder: NodeId,
        /// Names this acquisition.
        token: u64,
    },
    /// Gives the rename lock back.
    #[wire(tag = 11)]
    #[request(members, changes, answer = ())]
    ReleaseRenameLock {
        /// The token it was taken with.
        token: u64,
    },
    /// Sets the restrictions of a client identity (`weft client set`), replacing any it had.
    #[wire(tag = 12, since = 2)]
    #[request(members, changes, answer = ())]
    SetClientRule {
        /// The rule, naming its client.
        rule: crate::access::ClientRule,
    },
    /// Removes a client identity's restrictions (`weft client remove`).
    ///
    /// Fails with `NotFound` when it had none.
    #[wire(tag = 13, since = 2)]
    #[request(members, changes, answer = ())]
    RemoveClientRule {
        /// The client's name.
        name: String,
    },
    /// Creates an empty storage pool (`weft pool create`); answered with it.
    ///
    /// Fails with `Exists` or `InvalidArgument` for the name.
    #[wire(tag = 14, since = 4)]
    #[request(members, changes, answer = crate::pools::PoolInfo)]
    CreatePool {
        /// Its name.
        name: String,
    },
    /// Removes an empty storage pool (`weft pool remove`).
    ///
    /// Fails with `NotEmpty` while it holds targets.
    #[wire(tag = 15, since = 4)]
    #[request(members, changes, answer = ())]
    RemovePool {
        /// The pool.
        pool: StoragePoolId,
    },
    /// Moves storage targets from one pool to another (`weft pool add-target|remove-target`):
    /// each must be in `from`, and a target in a storage mirror group moves with its group's
    /// other members.
    ///
    /// Fails with `InvalidArgument` for a target not in `from` or a group split.
    #[wire(tag = 16, since = 4)]
    #[request(members, changes, answer = ())]
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
    #[request(reads, answer = ClusterMap)]
    WatchClusterMap {
        /// The epoch of the map the asker holds.
        after: u64,
        /// Longest to wait for a change, in milliseconds.
        wait_ms: u32,
    },
    /// Sets (or with all limits 0 removes) the quota limits of a user or group in a pool
    /// (`weft quota set`).
    ///
    /// Fails with `InvalidArgument` for a soft limit above its hard one.
    #[wire(tag = 19, since = 4)]
    #[request(members, changes, answer = ())]
    SetQuota {
        /// The rule.
        rule: crate::quota::QuotaRule,
    },
    /// Asks for every quota rule with its use and state (`weft quota list`).
    #[wire(tag = 20, since = 4)]
    #[request(members, reads, stub = quotas, answer = Vec<crate::quota::QuotaState>)]
    GetQuotas,
    /// A metadata home asks to hold `bytes` and `inodes` of a hard-limited user's, group's or
    /// project's use in a pool (all its inodes use there, and what its writers may still
    /// grow them by): management grants what keeps every home's grants together within the
    /// hard limit, and answers what the home now holds, which may be less than asked (and
    /// less than it held: asking less gives back).
    #[wire(tag = 24, since = 9)]
    #[request(members, changes, answer = (u64, u64))]
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
    ///
    /// Fails with `InvalidArgument` when emergency is above low.
    #[wire(tag = 17, since = 4)]
    #[request(members, changes, answer = crate::pools::PoolInfo)]
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
    ///
    /// Fails with `NotFound`, `InvalidArgument` (a mirror group member).
    #[wire(tag = 21, since = 4)]
    #[request(members, changes, answer = ())]
    DrainTarget {
        /// The target.
        target: TargetId,
        /// Stop draining it instead.
        stop: bool,
    },
    /// Removes a drained target from the cluster (`weft target remove`): refused while any
    /// file still uses it, or a metadata server has not told since the drain began.
    ///
    /// Fails with `NotFound`, `Busy` while files still use it (the message says what).
    #[wire(tag = 22, since = 4)]
    #[request(members, changes, answer = ())]
    RemoveTarget {
        /// The target.
        target: TargetId,
    },
    /// A message of the replication between management servers: the request, encoded by the
    /// replication library, is the payload, and so is its answer ([`MgmtResponse::Raft`]). Only
    /// members send it.
    #[wire(tag = 23, since = 7)]
    #[request(members, changes, stub = none, answer = crate::answer::InPayload)]
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

/// What a management server answers: its variants keep the tags they had when one enum answered every
/// service, so the bytes on the wire and in stored replies are the same.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub enum MgmtResponse {
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
    /// A storage pool.
    #[wire(tag = 30, since = 4)]
    Pool(crate::pools::PoolInfo),
    /// Quota rules with their use and state.
    #[wire(tag = 32, since = 4)]
    Quotas(#[serde(with = "crate::quota::spoken_rows")] Vec<crate::quota::QuotaState>),
    /// The answer to a [`MgmtRequest::Raft`], in the payload.
    #[wire(tag = 35, since = 7)]
    Raft,
    /// What a home now holds of a quota ([`MgmtRequest::GrantQuota`]).
    #[wire(tag = 37, since = 9)]
    QuotaGranted {
        /// Bytes.
        bytes: u64,
        /// Inodes.
        inodes: u64,
    },
}
