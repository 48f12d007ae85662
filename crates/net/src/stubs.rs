//! Typed clients per service. The client library and the servers (a metadata server truncating
//! objects, a storage server heartbeating) call each other through these same stubs.

use crate::client::{RpcClient, RpcClientOptions, RpcError};
use bytes::Bytes;
use std::time::Duration;
use weft_proto::access::{Caller, Capability, ClientRule};
use weft_proto::answer::Answer;
pub use weft_proto::answer::CreateReply;
use weft_proto::ids::{ClientId, InodeId, MemberId, NodeId, StoragePoolId, TargetId};
use weft_proto::layout::StripePattern;
use weft_proto::messages::{
    mgmt_answers, storage_answers, AttrChanges, ChangeTag, FallocateMode, LockRange, MetaRequest,
    MetaResponse, MetaRoute, MgmtRequest, MgmtResponse, MirrorGroupInfo, MirrorHeartbeat,
    MirrorKind, MutationId, NewInode, NodeKind, NodeStats, RenameFlags, Request, Route, SizeReport,
    SpaceUsage, StatsResponse, StorageRequest, StorageResponse, TargetReport, XattrSetMode,
};
use weft_proto::pools::CapacityLimits;

/// Declares stubs of a service client: each one sends the request variant its parameters
/// fill (a field named alone takes the parameter of its name; `field: value` converts one)
/// through the client's `ask`, and returns the answer the variant declares
/// (`answers::Variant`, see [`weft_proto::answer`]).
macro_rules! stubs {
    (
        $client:ident: $request:ident, $answers:ident;
        $(
            $(#[$doc:meta])*
            fn $name:ident($($param:ident: $ty:ty),* $(,)?) {
                $variant:ident $({ $($field:ident $(: $value:expr)?),* $(,)? })?
            }
        )*
    ) => {
        impl $client {
            $(
                $(#[$doc])*
                #[allow(clippy::too_many_arguments)]
                pub async fn $name(
                    &self,
                    $($param: $ty),*
                ) -> Result<weft_proto::messages::$answers::$variant, RpcError> {
                    self.ask($request::$variant $({ $($field $(: $value)?),* })?).await
                }
            )*
        }
    };
}

/// Longest a heartbeat (a server's or a client session's) waits for management's answer
/// before the next is sent, over another connection: well below the default offline, session
/// and promotion timeouts, well above the time a loaded management takes to answer.
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(3);

/// Whether a request to one server of a replicated management goes to another after `error`:
/// the server does not lead, or cannot be reached.
fn asks_another(error: &RpcError) -> bool {
    match error {
        RpcError::Remote(error) => error.code == weft_proto::ErrorCode::NotLeader,
        RpcError::Transport { .. } | RpcError::Timeout { .. } => true,
        _ => false,
    }
}

impl RpcClient {
    /// The answer `A` that `response`, of service response `R`, carries; a response that
    /// carries another is the server's error, reported as such.
    ///
    /// # Errors
    /// [`RpcError::Unexpected`] when the response is not the answer.
    pub fn answer<R: std::fmt::Debug, A: Answer<R>>(&self, response: R) -> Result<A, RpcError> {
        A::take(response).map_err(|other| self.unexpected(&other))
    }

    /// Asks any server for its load counters since it started.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable.
    pub async fn node_stats(&self) -> Result<NodeStats, RpcError> {
        let (response, _) = self
            .call::<StatsResponse>(&Request::Stats, Bytes::new())
            .await?;
        self.answer(response)
    }
}

/// A write of file data into one object ([`StorageClient::write`]).
#[derive(Clone, Debug)]
pub struct ObjectWrite {
    /// The file, and the truncate generation the write is made in.
    pub file: (InodeId, u64),
    /// Where in the object.
    pub offset: u64,
    /// The bytes.
    pub data: Bytes,
    /// The client change the write is (see [`ChangeTag`]), if a client sends it.
    pub tag: Option<ChangeTag>,
    /// The file's capability, when the server wants one.
    pub capability: Option<Capability>,
    /// The file's owner, group and project, for their space quotas.
    pub owner: Option<weft_proto::quota::Owner>,
}

/// What a metadata server reports in its heartbeat (nothing, for a storage server).
#[derive(Debug, Default)]
pub struct MetaReport {
    /// Space and inodes of its metadata target.
    pub usage: Option<SpaceUsage>,
    /// Inodes of the homes it serves (none before it serves one: management keeps the last).
    pub inodes_used: Option<u64>,
    /// What each user and group uses in each pool, per home it serves.
    pub quota_usage: Vec<(NodeId, Vec<weft_proto::quota::QuotaUsage>)>,
    /// Per home it serves, per target the map shows draining that the home looked for, the
    /// files of the home that still use it.
    pub target_uses: Vec<(NodeId, Vec<(TargetId, u64)>)>,
    /// Per home it serves, the draining targets some of whose files cannot move off, and why.
    pub drain_blocked: Vec<(NodeId, Vec<weft_proto::messages::DrainBlock>)>,
}

/// A client session management opened ([`MgmtClient::register_client`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The session's id.
    pub id: ClientId,
    /// How long management keeps it without a heartbeat, when it says (a server of protocol
    /// version 6 does not).
    pub timeout: Option<Duration>,
}

/// Client of the management service: of its one server, or of every server of a replicated
/// management (named together, separated by `;`), asking the one that answered last first
/// and the others in turn when it is not the leader or cannot be reached.
#[derive(Debug)]
pub struct MgmtClient {
    address: String,
    servers: Vec<RpcClient>,
    /// The server asked first: the last that answered.
    answered: std::sync::atomic::AtomicUsize,
    /// The cluster's clock (management's) less this process's, in milliseconds, as the last
    /// heartbeat measured it ([`MgmtClient::cluster_clock_ms`]).
    clock_offset_ms: std::sync::atomic::AtomicI64,
}

/// How long a client of a replicated management keeps looking for its leader (an election
/// takes a few seconds) before it gives up on a request.
const LEADER_SEARCH: Duration = Duration::from_secs(6);
/// The pause between two rounds of the management servers while none leads.
const LEADER_SEARCH_PAUSE: Duration = Duration::from_millis(300);

impl MgmtClient {
    /// A client for management at `address`: one server's address (its rails separated by
    /// commas), or every management server's, separated by `;`.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> MgmtClient {
        let address = address.into();
        let mut servers: Vec<RpcClient> = weft_proto::messages::mgmt_servers(&address)
            .map(|server| RpcClient::new(server, options.clone()))
            .collect();
        if servers.is_empty() {
            servers.push(RpcClient::new(address.clone(), options));
        }
        MgmtClient {
            address,
            servers,
            answered: std::sync::atomic::AtomicUsize::new(0),
            clock_offset_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The cluster's clock now, in milliseconds since the Unix epoch: this process's clock
    /// moved by what the last heartbeat measured against management's (this process's own
    /// before the first). Capabilities are granted and checked by it, so servers whose clocks
    /// differ agree on when one expires, to within a heartbeat's round trip.
    pub fn cluster_clock_ms(&self) -> u64 {
        let offset = self
            .clock_offset_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        crate::capability::local_clock_ms().saturating_add_signed(offset)
    }

    /// Management's address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `request` and answers what it declares.
    async fn ask<A: Answer<MgmtResponse>>(&self, request: MgmtRequest) -> Result<A, RpcError> {
        let (server, response) = self.send(request, None).await?;
        server.answer(response)
    }

    /// A heartbeat, answered within `deadline`: one sent over a cut rail gives way to the next
    /// over another rail before the lease or session it renews runs out. Asks each server
    /// once at most: the next heartbeat comes soon.
    async fn beat<A: Answer<MgmtResponse>>(
        &self,
        request: MgmtRequest,
        deadline: Duration,
    ) -> Result<A, RpcError> {
        let (server, response) = self.send(request, Some(deadline)).await?;
        server.answer(response)
    }

    /// Asks the server that answered last, then the others while they are not the leader or
    /// cannot be reached; with no deadline, for up to [`LEADER_SEARCH`] while none leads.
    /// Answers the server that answered, and its response.
    async fn send(
        &self,
        request: MgmtRequest,
        deadline: Option<Duration>,
    ) -> Result<(&RpcClient, MgmtResponse), RpcError> {
        use std::sync::atomic::Ordering;
        let request = Request::Mgmt(request);
        let count = self.servers.len();
        let searching_until = std::time::Instant::now() + LEADER_SEARCH;
        loop {
            let first = self.answered.load(Ordering::Relaxed);
            let mut error = None;
            for i in 0..count {
                let index = (first + i) % count;
                let server = &self.servers[index];
                let answer = match deadline {
                    Some(deadline) => server.call_within(&request, Bytes::new(), deadline).await,
                    None => server.call(&request, Bytes::new()).await,
                };
                match answer {
                    Ok((response, _)) => {
                        self.answered.store(index, Ordering::Relaxed);
                        return Ok((server, response));
                    }
                    Err(failed) if count > 1 && asks_another(&failed) => error = Some(failed),
                    Err(failed) => return Err(failed),
                }
            }
            let error = error.expect("every server was asked");
            if deadline.is_some() || std::time::Instant::now() >= searching_until {
                return Err(error);
            }
            tokio::time::sleep(LEADER_SEARCH_PAUSE).await;
        }
    }

    /// Sends a heartbeat with usage reports, answered within `deadline`
    /// ([`crate::mirror::Membership::heartbeat_deadline`]); answers the lease granted and the
    /// node's storage mirror groups.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or does not know the node.
    pub async fn heartbeat(
        &self,
        (kind, node): (NodeKind, NodeId),
        targets: Vec<TargetReport>,
        meta: MetaReport,
        mirror: Option<MirrorHeartbeat>,
        deadline: Duration,
    ) -> Result<(u64, Vec<MirrorGroupInfo>), RpcError> {
        let MetaReport {
            usage: meta_usage,
            inodes_used: meta_inodes_used,
            quota_usage,
            target_uses,
            drain_blocked,
        } = meta;
        let asked_at = crate::capability::local_clock_ms();
        let ack: mgmt_answers::Heartbeat = self
            .beat(
                MgmtRequest::Heartbeat {
                    kind,
                    node,
                    targets,
                    meta_usage,
                    meta_inodes_used,
                    mirror,
                    quota_usage,
                    target_uses,
                    drain_blocked,
                },
                deadline,
            )
            .await?;
        let answered_at = crate::capability::local_clock_ms();
        if ack.unix_ms > 0 {
            // Management's clock read half way through the round trip.
            let middle = asked_at / 2 + answered_at / 2;
            let offset = ack.unix_ms as i64 - middle as i64;
            self.clock_offset_ms
                .store(offset, std::sync::atomic::Ordering::Relaxed);
        }
        Ok((ack.lease_ms, ack.mirror_groups))
    }

    /// Opens a client session.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    pub async fn register_client(&self, alias: String) -> Result<Session, RpcError> {
        let registered: mgmt_answers::RegisterClient =
            self.ask(MgmtRequest::RegisterClient { alias }).await?;
        let timeout_ms = registered.session_timeout_ms;
        Ok(Session {
            id: registered.client,
            timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
        })
    }

    /// Renews a client session, reporting what its mount does not serve.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or the session expired.
    pub async fn client_heartbeat(
        &self,
        client: ClientId,
        unserved: Vec<(String, u64)>,
    ) -> Result<(), RpcError> {
        let request = MgmtRequest::ClientHeartbeat { client, unserved };
        self.beat(request, HEARTBEAT_DEADLINE).await
    }
}

stubs! {
    MgmtClient: MgmtRequest, mgmt_answers;

    /// Registers a server, keeping `node` if it has one.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or refuses.
    fn register_node(node: Option<NodeId>, kind: NodeKind, alias: String, addresses: Vec<String>) {
        RegisterNode { node, kind, alias, addresses }
    }

    /// Registers a storage target, keeping `target` if it has one.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or refuses.
    fn register_target(node: NodeId, target: Option<TargetId>) {
        RegisterTarget { node, target }
    }

    /// The progress of storage mirror resyncs.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    fn resync_stats() {
        GetResyncStats
    }

    /// Takes the cluster-wide directory-rename lock; `WouldBlock` while another holds it.
    ///
    /// # Errors
    /// `WouldBlock`, or [`RpcError`] when management is unreachable.
    fn acquire_rename_lock(holder: NodeId, token: u64) {
        AcquireRenameLock { holder, token }
    }

    /// Gives the rename lock back.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    fn release_rename_lock(token: u64) {
        ReleaseRenameLock { token }
    }

    /// Fetches the node and target maps.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    fn cluster_map() {
        GetClusterMap
    }

    /// The cluster map once its epoch is past `after`, or after `wait` with the map as it is.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable; `VersionMismatch` from a management
    /// of version 3, which cannot be watched.
    fn watch_cluster_map(after: u64, wait: Duration) {
        WatchClusterMap { after, wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX) }
    }

    /// Creates a mirror group of `members`, the first primary.
    ///
    /// # Errors
    /// `InvalidArgument` naming what is wrong with the members, or [`RpcError`].
    fn create_mirror_group(kind: MirrorKind, members: Vec<MemberId>) {
        CreateMirrorGroup { kind, members }
    }

    /// Pairs every member not in a group yet with one on another node.
    ///
    /// # Errors
    /// [`RpcError`].
    fn autocreate_mirror_groups(kind: MirrorKind) {
        AutoCreateMirrorGroups { kind }
    }

    /// Sets the restrictions of a client identity, replacing any it had.
    ///
    /// # Errors
    /// [`RpcError`].
    fn set_client_rule(rule: ClientRule) {
        SetClientRule { rule }
    }

    /// Removes a client identity's restrictions.
    ///
    /// # Errors
    /// `NotFound` when it had none, or [`RpcError`].
    fn remove_client_rule(name: &str) {
        RemoveClientRule { name: name.to_string() }
    }

    /// Creates an empty storage pool called `name`.
    ///
    /// # Errors
    /// `Exists` or `InvalidArgument` for the name, or [`RpcError`].
    fn create_pool(name: &str) {
        CreatePool { name: name.to_string() }
    }

    /// Starts draining `target` (with `stop`, stops it).
    ///
    /// # Errors
    /// `NotFound`, `InvalidArgument` (a mirror group member), or [`RpcError`].
    fn drain_target(target: TargetId, stop: bool) {
        DrainTarget { target, stop }
    }

    /// Removes a drained target from the cluster.
    ///
    /// # Errors
    /// `NotFound`, `Busy` while files still use it (the message says what), or [`RpcError`].
    fn remove_target(target: TargetId) {
        RemoveTarget { target }
    }

    /// Removes an empty storage pool.
    ///
    /// # Errors
    /// `NotEmpty` while it holds targets, or [`RpcError`].
    fn remove_pool(pool: StoragePoolId) {
        RemovePool { pool }
    }

    /// Moves `targets` from pool `from` to pool `to` (a mirror group's targets together).
    ///
    /// # Errors
    /// `InvalidArgument` for a target not in `from` or a group split, or [`RpcError`].
    fn move_pool_targets(targets: Vec<TargetId>, from: StoragePoolId, to: StoragePoolId) {
        MovePoolTargets { targets, from, to }
    }

    /// Sets a pool's capacity limits.
    ///
    /// # Errors
    /// `InvalidArgument` when emergency is above low, or [`RpcError`].
    fn set_pool_limits(pool: StoragePoolId, low: CapacityLimits, emergency: CapacityLimits) {
        SetPoolLimits { pool, low, emergency }
    }

    /// Sets (or with no limit removes) a quota rule.
    ///
    /// # Errors
    /// `InvalidArgument` for a soft limit above its hard one, or [`RpcError`].
    fn set_quota(rule: weft_proto::quota::QuotaRule) {
        SetQuota { rule }
    }

    /// Asks management for `home` to hold `amount` (bytes, inodes) of `key`'s hard limits;
    /// answers what it now holds.
    ///
    /// # Errors
    /// [`RpcError`].
    fn grant_quota(home: NodeId, key: weft_proto::quota::QuotaKey, amount: (u64, u64)) {
        GrantQuota { home, key, bytes: amount.0, inodes: amount.1 }
    }

    /// Every quota rule with its use and state.
    ///
    /// # Errors
    /// [`RpcError`].
    fn quotas() {
        GetQuotas
    }

    /// Fetches management's view of the cluster: states, space, throughput, events.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    fn cluster_status() {
        GetClusterStatus
    }
}

tokio::task_local! {
    /// Who the metadata requests of the current task act for: a mount sets it for each of the
    /// kernel's requests.
    static CALLER: Caller;
}

/// Runs `work` with the metadata requests it sends acting for `caller`; requests sent outside
/// such a scope act for the process's own user and groups. Only connections with a client key
/// send who they act for: members' requests are not checked by the servers.
pub async fn acting_for<F: std::future::Future>(caller: Caller, work: F) -> F::Output {
    CALLER.scope(caller, work).await
}

/// Whom the current task acts for, when it was told ([`acting_for`]); `None`: the process.
pub fn acting_caller() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Who the metadata requests of the current task act for (see [`acting_for`]).
pub fn caller() -> Caller {
    CALLER
        .try_with(Caller::clone)
        .unwrap_or_else(|_| Caller::of_process())
}

/// Client of one metadata home, on the server that serves it.
#[derive(Debug)]
pub struct MetaClient {
    rpc: RpcClient,
    route: MetaRoute,
}

impl MetaClient {
    /// A client for `route`'s home on the metadata server at `address`.
    pub fn new(
        address: impl Into<String>,
        route: MetaRoute,
        options: RpcClientOptions,
    ) -> MetaClient {
        MetaClient {
            rpc: RpcClient::new(address, options),
            route,
        }
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        self.rpc.address()
    }

    /// Where this client's requests go.
    pub fn route(&self) -> MetaRoute {
        self.route
    }

    /// Sends any metadata request.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn call(&self, request: MetaRequest) -> Result<MetaResponse, RpcError> {
        Ok(self.send(request, Bytes::new()).await?.0)
    }

    /// Sends a metadata request and answers what it declares.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn ask<A: Answer<MetaResponse>>(&self, request: MetaRequest) -> Result<A, RpcError> {
        let response = self.call(request).await?;
        self.rpc.answer(response)
    }

    /// Sends any metadata request with a payload.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn send(
        &self,
        request: MetaRequest,
        payload: Bytes,
    ) -> Result<(MetaResponse, Bytes), RpcError> {
        self.rpc
            .call(
                &Request::Meta(
                    self.route,
                    request,
                    self.rpc.client_name().map(|_| caller()),
                ),
                payload,
            )
            .await
    }
}

stubs! {
    MetaClient: MetaRequest, meta_answers;

    /// Looks a name up.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn lookup(parent: InodeId, name: &str) {
        Lookup { parent, name: name.to_string() }
    }

    /// Reads attributes.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn get_attr(inode: InodeId) {
        GetAttr { inode }
    }

    /// Changes attributes, through the open that was `granted` a capability when given.
    ///
    /// # Errors
    /// As the server decides, or [`RpcError`] for transport failures.
    fn set_attr(
        mutation: MutationId,
        inode: InodeId,
        changes: AttrChanges,
        granted: Option<Capability>,
    ) {
        SetAttr { mutation, inode, changes, granted }
    }

    /// Creates an entry of any kind, opened with handle `open` when given; answers its
    /// attributes and, when the server sent them, its directory's after the change, and the
    /// capability of a file created open.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `NoTargets`, or [`RpcError`] for transport failures.
    fn create(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new: NewInode,
        open: Option<u64>,
    ) {
        Create { mutation, parent, name: name.to_string(), new, open }
    }

    /// Creates a directory spread over `shards` metadata servers.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `InvalidArgument` (more shards than servers), or [`RpcError`]
    /// for transport failures.
    fn create_spread(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new: NewInode,
        shards: u16,
    ) {
        CreateSpread { mutation, parent, name: name.to_string(), new, shards }
    }

    /// Adds a hard link.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, or [`RpcError`] for transport failures.
    fn link(
        mutation: MutationId,
        inode: InodeId,
        new_parent: InodeId,
        new_name: &str,
    ) {
        Link { mutation, inode, new_parent, new_name: new_name.to_string() }
    }

    /// Removes a non-directory entry.
    ///
    /// # Errors
    /// `NotFound`, `IsDirectory`, or [`RpcError`] for transport failures.
    fn unlink(mutation: MutationId, parent: InodeId, name: &str) {
        Unlink { mutation, parent, name: name.to_string() }
    }

    /// Removes an empty directory.
    ///
    /// # Errors
    /// `NotFound`, `NotEmpty`, `NotDirectory`, or [`RpcError`] for transport failures.
    fn rmdir(mutation: MutationId, parent: InodeId, name: &str) {
        Rmdir { mutation, parent, name: name.to_string() }
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent`.
    ///
    /// # Errors
    /// The POSIX rename errors as codes, or [`RpcError`] for transport failures.
    fn rename(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new_parent: InodeId,
        new_name: &str,
        flags: RenameFlags,
    ) {
        Rename {
            mutation,
            parent,
            name: name.to_string(),
            new_parent,
            new_name: new_name.to_string(),
            flags,
        }
    }

    /// Lists a directory (of `shards` shards, as the client believes) after a cookie;
    /// answers the entries and whether the listing is at its end.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`, or [`RpcError`] for transport failures.
    fn read_dir(
        dir: InodeId,
        shards: u16,
        after_cookie: u64,
        max_entries: u32,
    ) {
        ReadDir { dir, shards, after_cookie, max_entries }
    }

    /// Lists a directory as [`MetaClient::read_dir`] does, each entry with its inode's
    /// attributes where this server holds the inode.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`, `VersionMismatch` from a server of protocol version 9, or
    /// [`RpcError`] for transport failures.
    fn read_dir_plus(dir: InodeId, shards: u16, after_cookie: u64, max_entries: u32) {
        ReadDirPlus { dir, shards, after_cookie, max_entries }
    }

    /// Reads a symbolic link.
    ///
    /// # Errors
    /// `NotFound`, `NotSymlink`, or [`RpcError`] for transport failures.
    fn read_link(inode: InodeId) {
        ReadLink { inode }
    }

    /// Registers handle `handle` of a session's open file, for `access` (the
    /// [`weft_proto::access`] bits), showing what the handle was `granted` before when it is
    /// opened again; answers the file's attributes and the capability granted.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn open(
        client: ClientId,
        handle: u64,
        inode: InodeId,
        access: u8,
        granted: Option<Capability>,
    ) {
        Open { client, handle, inode, access, granted }
    }

    /// Tells the server of several handles closed, of files of its home.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn release(client: ClientId, handles: Vec<(InodeId, u64)>) {
        Release { client, handles }
    }

    /// Asks for room to grow the file open as `handle` to `to`; answers the end it may grow
    /// the file to.
    ///
    /// # Errors
    /// `QuotaExceeded` when no room is left, `NotPermitted` without an open for writing, or
    /// [`RpcError`] for transport failures.
    fn reserve(client: ClientId, handle: u64, inode: InodeId, to: u64) {
        Reserve { client, handle, inode, to }
    }

    /// Has the file's queued truncate sent to every target now; answers once each has it.
    ///
    /// # Errors
    /// `Io` when a target cannot be reached, or [`RpcError`] for transport failures.
    fn apply_truncate(inode: InodeId) {
        ApplyTruncate { inode }
    }

    /// Reports a file's size after writes, through the open for writing that was `granted`
    /// a capability when given.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn report_size(
        inode: InodeId,
        report: SizeReport,
        granted: Option<Capability>,
    ) {
        ReportSize { inode, report, granted }
    }

    /// Sets an extended attribute.
    ///
    /// # Errors
    /// `Exists` / `NoAttribute` per `mode`, `OutOfRange`, or [`RpcError`] for transport failures.
    fn set_xattr(
        mutation: MutationId,
        inode: InodeId,
        name: &str,
        value: Vec<u8>,
        mode: XattrSetMode,
    ) {
        SetXattr { mutation, inode, name: name.to_string(), value, mode }
    }

    /// Reads an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`, or [`RpcError`] for transport failures.
    fn get_xattr(inode: InodeId, name: &str) {
        GetXattr { inode, name: name.to_string() }
    }

    /// Lists extended attribute names.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn list_xattr(inode: InodeId) {
        ListXattr { inode }
    }

    /// Removes an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`, or [`RpcError`] for transport failures.
    fn remove_xattr(mutation: MutationId, inode: InodeId, name: &str) {
        RemoveXattr { mutation, inode, name: name.to_string() }
    }

    /// Sets, changes or releases a byte-range lock, waiting up to `wait_ms` for a conflict.
    ///
    /// # Errors
    /// `WouldBlock` when a conflicting lock stays, or [`RpcError`] for transport failures.
    fn set_lock(
        client: ClientId,
        inode: InodeId,
        lock: LockRange,
        wait_ms: u32,
        reclaim: bool,
    ) {
        SetLock { client, inode, lock, wait_ms, reclaim }
    }

    /// The lock that would conflict with `lock`, if any.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn get_lock(client: ClientId, inode: InodeId, lock: LockRange) {
        GetLock { client, inode, lock }
    }

    /// The server's lock epoch.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn lock_epoch() {
        LockEpoch
    }

    /// Inodes of other homes that dentries on this server name.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn remote_references() {
        RemoteReferences
    }

    /// Removes an empty directory inode for a coordinating server (idempotent).
    ///
    /// # Errors
    /// `NotEmpty`, or [`RpcError`] for transport failures.
    fn remove_dir_inode(inode: InodeId) {
        RemoveDirInode { inode }
    }

    /// Checks the namespace and objects of this metadata target.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or the check fails.
    fn check(repair: bool, referenced: Vec<InodeId>) {
        Check { repair, referenced }
    }

    /// How far this server's consistency check is.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn check_progress() {
        CheckProgress
    }

    /// What each user and group uses in each pool in the homes this server serves.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures; `VersionMismatch` from a server of version 3.
    fn quota_usage() {
        QuotaUsage
    }

    /// Moves a regular file onto `targets` (in stripe order) or into `pool`; answers how
    /// many slots move and whether the move is done ([`MetaRequest::Migrate`]).
    ///
    /// # Errors
    /// `NotFound`, `InvalidArgument` (not a regular file, a mirrored one, a target that
    /// cannot take it), `NoTargets`, or [`RpcError`] for transport failures.
    fn migrate(
        inode: InodeId,
        pool: Option<weft_proto::ids::StoragePoolId>,
        targets: Vec<TargetId>,
        pattern: Option<(u32, u16)>,
    ) {
        Migrate { inode, pool, targets, pattern }
    }

    /// Sets a directory's stripe pattern.
    ///
    /// # Errors
    /// `NotDirectory`, or [`RpcError`] for transport failures.
    fn set_pattern(mutation: MutationId, dir: InodeId, pattern: StripePattern) {
        SetPattern { mutation, dir, pattern }
    }
}

/// Client of one storage server.
#[derive(Debug)]
pub struct StorageClient {
    rpc: RpcClient,
}

impl StorageClient {
    /// A client for the storage server at `address`.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> StorageClient {
        StorageClient {
            rpc: RpcClient::new(address, options),
        }
    }

    /// Sends a storage request without payload and answers what it declares.
    async fn ask<A: Answer<StorageResponse>>(
        &self,
        request: StorageRequest,
    ) -> Result<A, RpcError> {
        let (response, _) = self.send(request, Bytes::new()).await?;
        self.rpc.answer(response)
    }

    /// Sends any storage request with its payload; answers the response and its payload.
    ///
    /// # Errors
    /// The server's error, or [`RpcError`] for transport failures.
    pub async fn send(
        &self,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), RpcError> {
        self.rpc.call(&Request::Storage(request), payload).await
    }

    /// Writes `write.data` into the object of `write.file` behind `route` ([`ObjectWrite`]);
    /// answers the bytes written and the write's verifier.
    ///
    /// # Errors
    /// `NoSpace`, `QuotaExceeded`, `UnknownTarget`, `TargetPoisoned`, `TruncatePending`,
    /// `Superseded`, or [`RpcError`] for transport failures.
    pub async fn write(
        &self,
        route: impl Into<Route>,
        write: ObjectWrite,
    ) -> Result<storage_answers::Write, RpcError> {
        let route: Route = route.into();
        let ObjectWrite {
            file: (inode, generation),
            offset,
            data,
            tag,
            capability,
            owner,
        } = write;
        let request = StorageRequest::Write {
            target: route.target,
            mirror: route.mirror,
            inode,
            generation,
            object_offset: offset,
            tag,
            capability,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        };
        let (response, _) = self.send(request, data).await?;
        self.rpc.answer(response)
    }

    /// StorageBench on this server's own targets.
    ///
    /// # Errors
    /// `Busy` (a run is going on), `InvalidArgument`, or [`RpcError`] for transport failures.
    pub async fn storage_bench(
        &self,
        op: weft_proto::messages::StorageBenchOp,
    ) -> Result<storage_answers::Bench, RpcError> {
        self.ask(StorageRequest::Bench { op }).await
    }

    /// Network benchmark: sends `data` (dropped by the server) or asks for `read_len` bytes
    /// (zeros), with no disk I/O on the server. Returns the bytes written or the data read.
    ///
    /// # Errors
    /// `UnknownTarget`, or [`RpcError`] for transport failures.
    pub async fn net_bench(
        &self,
        target: TargetId,
        data: Bytes,
        read_len: u32,
    ) -> Result<(u32, Bytes), RpcError> {
        let request = StorageRequest::NetBench { target, read_len };
        let (response, payload) = self.send(request, data).await?;
        match response {
            StorageResponse::Written { len, .. } => Ok((len, payload)),
            StorageResponse::Data => Ok((payload.len() as u32, payload)),
            other => Err(self.rpc.unexpected(&other)),
        }
    }

    /// Reads up to `len` bytes, as a reader in truncate `generation` of the file; fewer bytes
    /// mean the object ends there.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, `TruncatePending`, or [`RpcError`] for transport failures.
    pub async fn read(
        &self,
        route: impl Into<Route>,
        (inode, generation): (InodeId, u64),
        object_offset: u64,
        len: u32,
        capability: Option<Capability>,
    ) -> Result<Bytes, RpcError> {
        let route: Route = route.into();
        let request = StorageRequest::Read {
            target: route.target,
            mirror: route.mirror,
            inode,
            generation,
            object_offset,
            len,
            capability,
        };
        let (response, payload) = self.send(request, Bytes::new()).await?;
        let storage_answers::Read { .. } = self.rpc.answer(response)?;
        Ok(payload)
    }
}

stubs! {
    StorageClient: StorageRequest, storage_answers;

    /// Cuts an object for truncate `generation` of its file (a no-op where the object had
    /// that truncate or a newer one).
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn truncate(route: Route, file: (InodeId, u64), length: u64) {
        Truncate {
            target: route.target,
            mirror: route.mirror,
            inode: file.0,
            length,
            generation: file.1,
        }
    }

    /// Removes an object.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn remove(route: Route, inode: InodeId) {
        Remove { target: route.target, mirror: route.mirror, inode, tag: None }
    }

    /// Copies `pieces` of the objects of `source` into the object of `file` at
    /// `object_offset` on the servers (`copy_file_range`); answers the bytes written and the
    /// server's verifier, as a write.
    ///
    /// # Errors
    /// As a write, and the errors of reading the source's objects.
    fn copy_from(
        route: Route,
        file: (InodeId, u64),
        object_offset: u64,
        source: (InodeId, u64),
        pieces: Vec<weft_proto::messages::CopyPiece>,
        tag: Option<ChangeTag>,
        capabilities: (Option<Capability>, Option<Capability>),
        owner: Option<weft_proto::quota::Owner>,
    ) {
        CopyFrom {
            target: route.target,
            inode: file.0,
            generation: file.1,
            object_offset,
            source,
            pieces,
            tag,
            capability: capabilities.0,
            source_capability: capabilities.1,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        }
    }

    /// Removes an object as change `tag` of its sender, so a late copy of the removal,
    /// retried, cannot land after the sender's later changes.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, `Superseded`, or [`RpcError`] for transport failures.
    fn remove_tagged(route: Route, inode: InodeId, tag: ChangeTag) {
        Remove { target: route.target, mirror: route.mirror, inode, tag: Some(tag) }
    }

    /// Makes an object durable; answers the verifier ([`StorageResponse::Synced`]).
    ///
    /// # Errors
    /// `TargetPoisoned`, `Io`, or [`RpcError`] for transport failures.
    fn sync(route: Route, inode: InodeId, capability: Option<Capability>) {
        Sync { target: route.target, mirror: route.mirror, inode, capability }
    }

    /// Allocates or zeroes `len` bytes of an object at `object_offset`, in truncate
    /// generation `file.1` of the file, as client change `tag`.
    ///
    /// # Errors
    /// `NoSpace`, `NotSupported`, `Io`, `TruncatePending`, `Superseded`, or [`RpcError`] for
    /// transport failures.
    fn fallocate(
        route: Route,
        file: (InodeId, u64),
        object_offset: u64,
        len: u64,
        mode: FallocateMode,
        tag: Option<ChangeTag>,
        capability: Option<Capability>,
        owner: Option<weft_proto::quota::Owner>,
    ) {
        Fallocate {
            target: route.target,
            mirror: route.mirror,
            inode: file.0,
            generation: file.1,
            object_offset,
            len,
            mode,
            tag,
            capability,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        }
    }

    /// One page of the objects of `home`'s files (of all files: `None`) on `target`, after
    /// inode `after`: of mirrored files, or of plain ones; and whether it is the last.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn list_objects(
        target: TargetId,
        mirrored: bool,
        home: Option<NodeId>,
        after: u64,
        max: u32,
    ) {
        ListObjects { target, mirrored, home, after, max }
    }

    /// An object's length.
    ///
    /// # Errors
    /// `UnknownTarget`, or [`RpcError`] for transport failures.
    fn object_length(route: Route, inode: InodeId) {
        ObjectLength { target: route.target, mirror: route.mirror, inode }
    }

    /// The length of the copy of an object on `target` itself (a mirror member's own copy
    /// when `mirrored`) and the CRC32C of `len` bytes of it at `offset`.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn object_checksum(
        target: TargetId,
        mirrored: bool,
        inode: InodeId,
        offset: u64,
        len: u64,
    ) {
        ObjectChecksum { target, mirrored, inode, offset, len }
    }

    /// Pushes the object of `inode` on `target` to target `to` (or through layouts, `into`;
    /// a mirrored object by the primary of `group`): what changed since the last push, and
    /// with `seal` the last changes of an object sealed first; answers the bytes copied
    /// ([`StorageRequest::Push`]).
    ///
    /// # Errors
    /// `UnknownTarget`, `NoSpace` and the errors of the copy's writes, or [`RpcError`] for
    /// transport failures.
    fn push(
        target: TargetId,
        inode: InodeId,
        to: TargetId,
        id: u64,
        seal: bool,
        into: Option<weft_proto::messages::Restripe>,
        group: Option<weft_proto::ids::GroupId>,
    ) {
        Push { target, inode, to, id, seal, into, group }
    }
}
