//! [`ClusterView`]: the cluster map from management and a client per peer, shared by the client
//! library and by servers that call other servers (a metadata server truncating objects).

use crate::auth::Identity;
use crate::capability::Capabilities;
use crate::client::{RpcClientOptions, RpcError};
use crate::kept::{ChangeProofs, KeptChanges};
use crate::retry::RetryPolicy;
use crate::stubs::{MetaClient, MgmtClient, StorageClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use weft_proto::access::{self, Checks, Sessions};
use weft_proto::error::WireError;
use weft_proto::ids::GroupVersion;
use weft_proto::ids::{NodeId, TargetId};
use weft_proto::layout::Slot;
use weft_proto::messages::{
    ClusterMap, MetaRoute, MgmtCalls, MirrorKind, MirrorRoute, NodeKind, Request, Route,
};
use weft_proto::ErrorCode;

/// A map younger than this is not fetched again after an unreachable peer.
const MAP_REFRESH_AFTER_FAILURE_MIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Longest a watch of the map waits for a change before it asks again.
const MAP_WATCH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Pause before a failed watch of the map is sent again.
const MAP_WATCH_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// How often the map is fetched while a request to a mirror group's primary is outstanding.
const GROUP_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The cluster map and connections to every peer it names.
#[derive(Debug)]
pub struct ClusterView {
    mgmt: MgmtClient,
    options: RpcClientOptions,
    map: RwLock<Arc<ClusterMap>>,
    /// When the map was last fetched, for [`ClusterView::refresh_if_older`].
    fetched: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Clients per metadata home.
    meta: Mutex<HashMap<NodeId, Arc<MetaClient>>>,
    /// Clients per metadata node, for mirror traffic.
    meta_nodes: Mutex<HashMap<NodeId, Arc<MetaClient>>>,
    /// Per metadata home, the changes it answered that its disk may not have yet: they
    /// outlive the home's client, which a move of the home replaces.
    kept: Mutex<HashMap<NodeId, Arc<KeptChanges>>>,
    storage: Mutex<HashMap<NodeId, (String, Arc<StorageClient>)>>,
    /// The capability key, for a process holding the cluster key.
    capabilities: Option<Capabilities>,
    /// The key of numbered changes' proofs, for a process holding the cluster key.
    change_proofs: Option<ChangeProofs>,
}

/// Shortest time between two fetches of the map for a session it does not list.
pub const UNKNOWN_SESSION_REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

fn unknown(what: String) -> RpcError {
    RpcError::Remote(WireError::new(ErrorCode::UnknownNode, what))
}

impl ClusterView {
    /// A member service's view: management at `mgmt_address`, reached with the service's
    /// key, and the default options otherwise.
    pub fn for_member(mgmt_address: impl Into<String>, auth: crate::Auth) -> ClusterView {
        ClusterView::new(
            mgmt_address,
            RpcClientOptions {
                auth,
                ..RpcClientOptions::default()
            },
        )
    }

    /// A view that talks to management at `mgmt_address`; call [`ClusterView::refresh`] first.
    pub fn new(mgmt_address: impl Into<String>, options: RpcClientOptions) -> ClusterView {
        ClusterView {
            mgmt: MgmtClient::new(
                mgmt_address,
                RpcClientOptions {
                    connections: 1,
                    ..options.clone()
                },
            ),
            capabilities: Capabilities::of(&options.auth),
            change_proofs: ChangeProofs::of(&options.auth),
            options,
            map: RwLock::default(),
            fetched: tokio::sync::Mutex::new(None),
            meta: Mutex::default(),
            meta_nodes: Mutex::default(),
            kept: Mutex::default(),
            storage: Mutex::default(),
        }
    }

    /// Stamps `origin` (a client session, see [`weft_proto::ClientId::origin`]) on the requests
    /// of every metadata and storage connection opened from now on.
    pub fn set_origin(&mut self, origin: u32) {
        self.options.origin = origin;
    }

    /// The management client.
    pub fn mgmt(&self) -> &MgmtClient {
        &self.mgmt
    }

    /// The last fetched map.
    pub fn map(&self) -> Arc<ClusterMap> {
        Arc::clone(&self.map.read().expect("map lock poisoned"))
    }

    /// Fetches the map from management again.
    ///
    /// # Errors
    /// [`RpcError`] when management cannot be reached.
    pub async fn refresh(&self) -> Result<Arc<ClusterMap>, RpcError> {
        // One fetch at a time: a slow, older fetch never lands over a newer one (it could
        // bring back a client rule that was changed meanwhile).
        let mut fetched = self.fetched.lock().await;
        let started = std::time::Instant::now();
        let map = self.install(self.mgmt.cluster_map().await?);
        *fetched = Some(started);
        Ok(map)
    }

    /// [`ClusterView::refresh`], given up after `deadline`. A server's heartbeat loop fetches
    /// the map after each heartbeat: while management elects a leader, a fetch looks for one
    /// for seconds, and the loop's next heartbeat (its lease, its being seen online) must not
    /// wait behind it.
    ///
    /// # Errors
    /// As [`ClusterView::refresh`], or `Timeout` once `deadline` passed.
    pub async fn refresh_within(
        &self,
        deadline: std::time::Duration,
    ) -> Result<Arc<ClusterMap>, RpcError> {
        tokio::time::timeout(deadline, self.refresh())
            .await
            .map_err(|_| RpcError::Timeout {
                address: self.mgmt.address().to_string(),
                timeout: deadline,
            })?
    }

    /// Takes a fetched `map`; returns it. A fetch always wins: after a restart of management
    /// whose clock went back, its epochs are smaller, and only fetches can bring them in.
    fn install(&self, map: ClusterMap) -> Arc<ClusterMap> {
        let map = Arc::new(map);
        *self.map.write().expect("map lock poisoned") = Arc::clone(&map);
        map
    }

    /// The epoch of the held map, for the `weft_cluster_map_epoch` metric, while the view
    /// lives (0 after).
    pub fn epoch_source(self: &Arc<ClusterView>) -> Box<dyn Fn() -> u64 + Send + Sync> {
        let view = Arc::downgrade(self);
        Box::new(move || view.upgrade().map_or(0, |view| view.map().epoch))
    }

    /// Follows management's map from now on: a task asks for it each time it changes
    /// ([`MgmtRequest::WatchClusterMap`](weft_proto::messages::MgmtRequest)), so a new
    /// server, pool, mirror group or client rule reaches this view as it happens, not at the
    /// next heartbeat's fetch. The task ends when the view is dropped, and at once against a
    /// management of version 3 (which cannot be watched; the fetches at heartbeats remain).
    pub fn follow(self: &Arc<ClusterView>) {
        let view = Arc::downgrade(self);
        // Well inside the request timeout, so a quiet cluster's watch is answered, not timed out.
        let wait = (self.options.request_timeout / 2).min(MAP_WATCH_WAIT);
        tokio::spawn(async move {
            loop {
                let Some(strong) = view.upgrade() else {
                    return;
                };
                let after = strong.map().epoch;
                match strong.mgmt.watch_cluster_map(after, millis(wait)).await {
                    Ok(map) => {
                        // Unless a fetch brought a later one meanwhile.
                        let mut held = strong.map.write().expect("map lock poisoned");
                        if map.epoch >= held.epoch {
                            *held = Arc::new(map);
                        }
                    }
                    Err(error) if error.code() == ErrorCode::VersionMismatch => {
                        tracing::info!(%error, "management cannot be watched: the map is fetched at heartbeats");
                        return;
                    }
                    Err(error) => {
                        tracing::debug!(%error, "cannot watch the cluster map; trying again");
                        drop(strong);
                        tokio::time::sleep(MAP_WATCH_RETRY).await;
                    }
                }
            }
        });
    }

    /// Whether the peer `from` may send `request`, by its client's rule, sessions and, for a
    /// read or change of a file's objects, capability (a member always may); with what a
    /// metadata server must check itself for it: who it acts for when the client squashes
    /// root, the subtree it must stay in ([`Checks`]).
    ///
    /// # Errors
    /// The rule's refusal, [`ClusterView::admit_sessions`]', or `CapabilityNeeded`.
    pub async fn admit_client(
        &self,
        from: &Identity,
        request: &Request,
    ) -> Result<Checks, WireError> {
        let Identity::Client(name) = from else {
            return Ok(Checks::default());
        };
        let rule = self.map().client_rule(name).cloned();
        if let Some(rule) = &rule {
            rule.admit(request)?;
        }
        self.admit_sessions(name, request).await?;
        let checks = match (rule, request) {
            (Some(rule), Request::Meta(_, _, caller)) => rule.checks(caller.clone()),
            (Some(rule), _) => rule.checks(None),
            (None, _) => Checks::default(),
        };
        self.check_capability(&checks, request)?;
        Ok(checks)
    }

    /// The capability key, for a process holding the cluster key.
    pub fn capabilities(&self) -> Option<&Capabilities> {
        self.capabilities.as_ref()
    }

    /// The key of numbered changes' proofs, for a process holding the cluster key.
    pub fn change_proofs(&self) -> Option<&ChangeProofs> {
        self.change_proofs.as_ref()
    }

    /// That a storage request of a client whose access the servers decide
    /// ([`Checks::per_file`]) shows a capability for what it does to a file's objects.
    ///
    /// # Errors
    /// `CapabilityNeeded` without one (or with a forged, narrower or expired one).
    fn check_capability(&self, checks: &Checks, request: &Request) -> Result<(), WireError> {
        let Request::Storage(request) = request else {
            return Ok(());
        };
        if !checks.per_file {
            return Ok(());
        }
        for (inode, want, capability) in request
            .file_access()
            .into_iter()
            .chain(request.source_access())
        {
            match &self.capabilities {
                Some(capabilities) => capabilities.check(
                    inode,
                    want,
                    capability,
                    self.mgmt.cluster_clock_ms() / 1000,
                )?,
                None => {
                    return Err(WireError::new(
                        ErrorCode::PermissionDenied,
                        "this server holds no cluster key to check capabilities with",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether the client `name` may act in the sessions `request` names: sessions it
    /// registered itself. A session the map does not know yet (registered since it was
    /// fetched) is looked for in a new map, fetched at most every
    /// [`UNKNOWN_SESSION_REFRESH`].
    ///
    /// # Errors
    /// `PermissionDenied` for another's session; `Unavailable` (asked again by the client)
    /// for one management does not list yet.
    pub async fn admit_sessions(&self, name: &str, request: &Request) -> Result<(), WireError> {
        if let Sessions::Unknown(_) = access::sessions_of(name, request, &self.map()) {
            self.refresh_if_older(UNKNOWN_SESSION_REFRESH).await;
        }
        match access::sessions_of(name, request, &self.map()) {
            Sessions::Own => Ok(()),
            Sessions::Foreign(session) => Err(access::foreign_session(name, session)),
            Sessions::Unknown(session) => Err(WireError::new(
                ErrorCode::Unavailable,
                format!("session {session} is not in this server's cluster map yet"),
            )),
        }
    }

    /// Runs `call`, a request to a member of a mirror group (`member` names it in errors),
    /// for at most `timeout`: a member cut off the network answers nothing, and its primary
    /// must give up in time to report it. After a failure worth retrying, the map is fetched
    /// again unless it is younger than half a second (the member may have moved).
    ///
    /// # Errors
    /// What `call` gave, or `Timeout`.
    pub async fn call_member<T>(
        &self,
        member: impl FnOnce() -> String,
        timeout: std::time::Duration,
        call: impl std::future::Future<Output = Result<T, RpcError>>,
    ) -> Result<T, RpcError> {
        let result = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(RpcError::Timeout {
                address: member(),
                timeout,
            }),
        };
        self.after_call(result).await
    }

    /// `result`, after fetching the map again when it is a failure that may mean the peer
    /// moved, unless the map is younger than [`MAP_REFRESH_AFTER_FAILURE_MIN`].
    async fn after_call<T>(&self, result: Result<T, RpcError>) -> Result<T, RpcError> {
        if result.as_ref().is_err_and(RpcError::is_retryable) {
            self.refresh_if_older(MAP_REFRESH_AFTER_FAILURE_MIN).await;
        }
        result
    }

    /// Fetches the map again unless it is younger than `age`: after a peer was unreachable (it
    /// may have restarted on a new address). Concurrent callers share one fetch.
    pub async fn refresh_if_older(&self, age: std::time::Duration) {
        let since = std::time::Instant::now()
            .checked_sub(age)
            .unwrap_or_else(std::time::Instant::now);
        self.refresh_unless_fetched_since(since).await;
    }

    /// Fetches the map again unless a fetch started at or after `since`; a caller that must
    /// see every registration made before it started passes its own start time. Concurrent
    /// callers share one fetch.
    pub async fn refresh_unless_fetched_since(&self, since: std::time::Instant) {
        let mut fetched = self.fetched.lock().await;
        if fetched.is_some_and(|at| at >= since) {
            return;
        }
        let started = std::time::Instant::now();
        if let Ok(map) = self.mgmt.cluster_map().await {
            self.install(map);
            *fetched = Some(started);
        }
    }

    /// A client for the metadata home `home` on the server that serves it now (the home's
    /// node, or its mirror group's primary), refreshing the map if the server is not known
    /// yet.
    ///
    /// # Errors
    /// `UnknownNode` when management does not know it either.
    pub async fn meta(&self, home: NodeId) -> Result<Arc<MetaClient>, RpcError> {
        let resolve = || {
            let map = self.map();
            let (server, route) = map.meta_route(home);
            map.node(NodeKind::Meta, server)
                .and_then(|info| info.address())
                .map(|address| (address, route))
        };
        let (address, route) = match resolve() {
            Some(found) => found,
            None => {
                self.refresh().await?;
                resolve()
                    .ok_or_else(|| unknown(format!("metadata node {home} is not registered")))?
            }
        };
        let mut clients = self.meta.lock().expect("client table poisoned");
        match clients.get(&home) {
            Some(client) if client.address() == address && client.route() == route => {
                Ok(Arc::clone(client))
            }
            _ => {
                let client = Arc::new(
                    MetaClient::new(address, route, self.options.clone())
                        .keeping(self.kept_for(home)),
                );
                clients.insert(home, Arc::clone(&client));
                Ok(client)
            }
        }
    }

    /// The changes of metadata home `home` this process keeps.
    pub fn kept_for(&self, home: NodeId) -> Arc<KeptChanges> {
        let mut kept = self.kept.lock().expect("kept changes poisoned");
        Arc::clone(kept.entry(home).or_default())
    }

    /// The homes that answered this process changes before their sync, with what it keeps
    /// of each.
    pub fn homes_answering_early(&self) -> Vec<(NodeId, Arc<KeptChanges>)> {
        let kept = self.kept.lock().expect("kept changes poisoned");
        kept.iter()
            .filter(|(_, kept)| kept.answered_by().is_some())
            .map(|(home, kept)| (*home, Arc::clone(kept)))
            .collect()
    }

    /// A client for metadata node `node` itself, whichever homes it serves: for the traffic
    /// between the members of a metadata mirror group.
    ///
    /// # Errors
    /// `UnknownNode` when management does not know it.
    pub async fn meta_node(&self, node: NodeId) -> Result<Arc<MetaClient>, RpcError> {
        let resolve = || {
            self.map()
                .node(NodeKind::Meta, node)
                .and_then(|info| info.address())
        };
        let address = match resolve() {
            Some(address) => address,
            None => {
                self.refresh().await?;
                resolve()
                    .ok_or_else(|| unknown(format!("metadata node {node} is not registered")))?
            }
        };
        let mut clients = self.meta_nodes.lock().expect("client table poisoned");
        match clients.get(&node) {
            Some(client) if client.address() == address => Ok(Arc::clone(client)),
            _ => {
                let route = MetaRoute {
                    home: node,
                    version: GroupVersion(0),
                };
                let client = Arc::new(MetaClient::new(address, route, self.options.clone()));
                clients.insert(node, Arc::clone(&client));
                Ok(client)
            }
        }
    }

    /// Runs a call on the storage server that serves `slot` under `policy`: the target's
    /// server, or for a mirror group its current primary's, with the route (target and group
    /// version) the call must send. After a failure that may mean the server moved (restarted
    /// on a new address) or the group changed (failover), the map is fetched again and the
    /// call retried with the new route.
    ///
    /// # Errors
    /// The last error of `call`, or `UnknownTarget` when management does not know the target
    /// or group.
    pub async fn call_storage<T, F, Fut>(
        &self,
        slot: impl Into<Slot>,
        policy: &RetryPolicy,
        call: F,
    ) -> Result<T, RpcError>
    where
        F: Fn(Arc<StorageClient>, Route) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        let slot = slot.into();
        self.rerouted(policy, || async {
            let route = self.route(slot).await?;
            let client = self.storage_for_target(route.target).await?;
            match route.mirror {
                None => call(client, route).await,
                Some(mirror) => {
                    // A primary cut off the network answers nothing until the request
                    // times out; once the group moved on, ask the new primary instead.
                    let version = |map: &ClusterMap| {
                        map.mirror_group(MirrorKind::Storage, mirror.group)
                            .map(|g| g.version)
                    };
                    tokio::select! {
                        result = call(client, route) => result,
                        moved = self.moved_on(version, mirror.version, || {
                            format!("storage mirror group {}", mirror.group)
                        }) => Err(moved),
                    }
                }
            }
        })
        .await
    }

    /// Runs a call on the metadata server of `home` under `policy`: the home's node, or its
    /// mirror group's primary. After a failure that may mean the server moved (restarted on
    /// a new address) or the home's group changed (failover), the map is fetched again and
    /// the call asked of the server it names now.
    ///
    /// # Errors
    /// The last error of `call`, or `UnknownNode`.
    pub async fn call_meta<T, F, Fut>(
        &self,
        home: NodeId,
        policy: &RetryPolicy,
        call: F,
    ) -> Result<T, RpcError>
    where
        F: Fn(Arc<MetaClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        self.rerouted(policy, || self.call_meta_once(home, &call))
            .await
    }

    /// The one reroute loop: runs `attempt` under `policy`, and after a failure that may mean
    /// the server moved (a new address, a new primary) fetches the map again, unless it is
    /// younger than [`MAP_REFRESH_AFTER_FAILURE_MIN`], so the next attempt routes anew.
    async fn rerouted<T, F, Fut>(&self, policy: &RetryPolicy, attempt: F) -> Result<T, RpcError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        policy
            .run(|| async {
                let result = attempt().await;
                self.after_call(result).await
            })
            .await
    }

    /// Runs one metadata call on the server of `home`. A primary cut off the network answers
    /// nothing until the request times out: once the home's group moved on, the call ends
    /// `StaleRoute`, so that it is asked of the new primary instead.
    async fn call_meta_once<T, F, Fut>(&self, home: NodeId, call: F) -> Result<T, RpcError>
    where
        F: FnOnce(Arc<MetaClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        let client = self.meta(home).await?;
        let route = client.route();
        if route.version == GroupVersion(0) {
            return call(client).await;
        }
        let version = |map: &ClusterMap| Some(map.meta_route(home).1.version);
        tokio::select! {
            result = call(client) => result,
            moved = self.moved_on(version, route.version, || {
                format!("the mirror group of metadata home {home}")
            }) => Err(moved),
        }
    }

    /// Completes once the map shows a group (`group` names it) at another version than
    /// `routed` (`version` reads it from the map), looking every [`GROUP_WATCH_INTERVAL`]
    /// while a request routed by it is outstanding.
    async fn moved_on(
        &self,
        version: impl Fn(&ClusterMap) -> Option<GroupVersion>,
        routed: GroupVersion,
        group: impl Fn() -> String,
    ) -> RpcError {
        loop {
            tokio::time::sleep(GROUP_WATCH_INTERVAL).await;
            self.refresh_if_older(GROUP_WATCH_INTERVAL).await;
            if version(&self.map()) != Some(routed) {
                return RpcError::Remote(WireError::new(
                    ErrorCode::StaleRoute,
                    format!(
                        "{} moved on from version {routed} while a request waited",
                        group()
                    ),
                ));
            }
        }
    }

    /// Where a request for `slot` goes now: the target itself, or a mirror group's primary
    /// with the group's version.
    ///
    /// # Errors
    /// `UnknownTarget` when management does not know the group.
    pub async fn route(&self, slot: Slot) -> Result<Route, RpcError> {
        let group = match slot {
            Slot::Target(target) => return Ok(Route::from(target)),
            Slot::Group(group) => group,
        };
        let lookup = |map: &ClusterMap| {
            map.mirror_group(MirrorKind::Storage, group).map(|g| Route {
                target: TargetId::from(g.primary),
                mirror: Some(MirrorRoute {
                    group,
                    version: g.version,
                    forwarded: false,
                }),
            })
        };
        match lookup(&self.map()) {
            Some(route) => Ok(route),
            None => lookup(&*self.refresh().await?).ok_or_else(|| {
                RpcError::Remote(WireError::new(
                    ErrorCode::UnknownTarget,
                    format!("storage mirror group {group} is not defined"),
                ))
            }),
        }
    }

    /// The storage node holding `target` and a client for it.
    ///
    /// # Errors
    /// `UnknownTarget` / `UnknownNode` when management does not know them.
    pub async fn storage_for_target(
        &self,
        target: TargetId,
    ) -> Result<Arc<StorageClient>, RpcError> {
        let lookup = |map: &ClusterMap| {
            map.target(target)
                .and_then(|t| map.node(NodeKind::Storage, t.node))
                .map(|n| (n.id, n.address()))
        };
        let found = match lookup(&self.map()) {
            Some(found) => found,
            None => lookup(&*self.refresh().await?).ok_or_else(|| {
                RpcError::Remote(WireError::new(
                    ErrorCode::UnknownTarget,
                    format!("storage target {target} is not registered"),
                ))
            })?,
        };
        let (node, Some(address)) = found else {
            return Err(unknown(format!(
                "storage node of target {target} has no address"
            )));
        };
        let mut clients = self.storage.lock().expect("client table poisoned");
        match clients.get(&node) {
            Some((known, client)) if *known == address => Ok(Arc::clone(client)),
            _ => {
                let client = Arc::new(StorageClient::new(address.clone(), self.options.clone()));
                clients.insert(node, (address, Arc::clone(&client)));
                Ok(client)
            }
        }
    }
}

/// `wait` in whole milliseconds, as a request carries it.
fn millis(wait: std::time::Duration) -> u32 {
    u32::try_from(wait.as_millis()).unwrap_or(u32::MAX)
}
