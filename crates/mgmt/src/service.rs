//! The management request handler and its in-memory heartbeat view.

mod capacity;
mod groups;
mod map;
mod metrics;
mod quotas;
mod registry;
mod sessions;

use crate::mirrors::{nodes_of_targets, Mirrors};
use crate::monitor::{unix_ms, Monitor};
use crate::pools;
use crate::replication::{self, Raft, Replica};
use crate::store::{MgmtStore, NodeRecord};
use crate::{MgmtConfig, MgmtError};
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_net::mirror::published;
use weft_observe::HttpReply;
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, GroupId, MemberId, NodeId, StoragePoolId, TargetId};
use weft_proto::messages::{
    ClusterMap, MgmtRequest, MgmtResponse, MirrorGroupInfo, MirrorKind, NodeInfo, NodeKind,
    Reachability, Reply, Request, ResyncProgress, SpaceUsage, MAP_WATCH_WAIT_MS_MAX,
    MIRROR_MEMBERS_MAX, NODE_ADDRESSES_MAX,
};
use weft_proto::quota::QuotaKind;
use weft_proto::ErrorCode;

/// What management heard from a node lately; rebuilt from heartbeats after a restart.
#[derive(Default)]
struct LiveState {
    last_heard: HashMap<(NodeKind, NodeId), Instant>,
    target_usage: HashMap<TargetId, SpaceUsage>,
    meta_usage: HashMap<NodeId, (SpaceUsage, u64)>,
    client_last_heard: HashMap<ClientId, Instant>,
    /// Requests each live session's mount answered with an error it does not serve, by kind,
    /// as its last heartbeat counted them.
    client_unserved: HashMap<ClientId, Vec<(String, u64)>>,
    /// Mirror resyncs as their primaries last reported them, by (kind, group, member).
    resyncs: HashMap<(MirrorKind, GroupId, MemberId), ResyncProgress>,
    /// What users and groups use per metadata home, as the server serving it last reported.
    home_usage: HashMap<NodeId, Vec<weft_proto::quota::QuotaUsage>>,
    /// Per metadata home, when (Unix milliseconds) the server serving it last told how many
    /// of its files use each draining target it looked for, and what it told.
    target_uses: HashMap<NodeId, (u64, Vec<(TargetId, u64)>)>,
    /// Per metadata home: the draining targets some of whose files cannot move off, and why,
    /// as it last told (with its `target_uses`).
    drain_blocked: HashMap<NodeId, Vec<weft_proto::messages::DrainBlock>>,
}

struct Mgmt {
    store: MgmtStore,
    live: Mutex<LiveState>,
    started: Instant,
    offline_timeout: Duration,
    session_timeout: Duration,
    /// The directory-rename lock: (token, holder, lease end).
    rename_lock: Mutex<Option<(u64, NodeId, Instant)>>,
    rename_lock_lease: Duration,
    /// Before this, the rename lock is not granted: a leader that took over from another
    /// waits out any lease the other granted.
    rename_lock_from: Instant,
    monitor: Monitor,
    /// Serialises mirror group creation: the free members are read and taken at once.
    mirror_lock: Mutex<()>,
    mirrors: Mirrors,
    /// The map's epoch, which watchers of the map wait on ([`Mgmt::publish_map`]).
    map_epoch: tokio::sync::watch::Sender<u64>,
    /// A digest of what routing and placement follow in the map published last.
    map_shape: Mutex<u64>,
    /// The map last built for a watcher, and when ([`Mgmt::watched_map`]).
    watched: Mutex<Option<(Instant, Arc<ClusterMap>)>>,
    quota_grace_period: Duration,
    /// Most live sessions of one client key (`sessions_per_client`).
    sessions_per_client: usize,
}

/// `map` as the client identity `client` may see it (all of it for members): a client learns
/// its own rule and sessions, not the others'.
fn as_seen_by(map: &mut ClusterMap, client: Option<&str>) {
    if let Some(name) = client {
        map.clients.retain(|rule| rule.name == name);
        map.session_owners.retain(|(_, owner)| owner == name);
    }
}

/// Longest a map built for one watcher of the map serves the others: every node watches the
/// map, and a change wakes them all at once.
const WATCHED_MAP_SHARED_FOR: Duration = Duration::from_millis(100);

/// How often management looks for changes of the map that no request makes (a node going
/// offline, a mirror group failing over, a target turning low, a session expiring) and
/// publishes them.
const MAP_PUBLISH_INTERVAL: Duration = Duration::from_millis(250);

/// The web page management serves at `/`: the cluster overview, with its styles and scripts
/// inside (no CDN), drawn from `/api/cluster`.
const WEB_PAGE: &str = include_str!("web/index.html");

/// Runs management until `shutdown` completes: this server alone, or one of a replicated
/// management (`replicas` in the config), which serves while it leads.
///
/// # Errors
/// [`MgmtError`] when the data directory or store cannot be used.
pub async fn run(
    config: MgmtConfig,
    listeners: weft_net::Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MgmtError> {
    let admission = config.admission().map_err(MgmtError::Config)?;
    let auth = admission.auth.clone();
    std::fs::create_dir_all(&config.data_dir).map_err(|source| MgmtError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    let store = MgmtStore::open(&config.data_dir)?;
    let replica = if config.replicas.is_empty() {
        None
    } else {
        Some(Replica::start(&config, &store, auth.clone()).await?)
    };
    let front = Arc::new(Front {
        config,
        auth,
        raft: replica.as_ref().map(|replica| replica.raft().clone()),
        serving: std::sync::RwLock::new(None),
    });
    // Ends when the Raft node stops for good (an error of its store): the server stops too.
    let (raft_stopped, stopping) = tokio::sync::oneshot::channel::<String>();
    let leading = match &replica {
        Some(replica) => Some(tokio::spawn(lead(
            Arc::clone(&front),
            replica.raft().clone(),
            store.replicated(replica.log()),
            raft_stopped,
        ))),
        None => {
            front.serve(store)?;
            None
        }
    };
    let address = listeners.address();
    tracing::info!(%address, metrics = %format!("http://{address}/metrics"), "management serving");
    let mut metrics = weft_observe::MetricsBuilder::new("mgmt", None);
    metrics
        .registry()
        .register_collector(Box::new(metrics::ClusterCollector(Arc::clone(&front))));
    let epoch = Arc::downgrade(&front);
    metrics
        .registry()
        .register_collector(Box::new(weft_observe::metrics::MapEpochCollector(
            Box::new(move || {
                epoch
                    .upgrade()
                    .and_then(|front| front.leading())
                    .map_or(0, |mgmt| *mgmt.map_epoch.borrow())
            }),
        )));
    let exporters = front.config.exporters();
    let failed = std::sync::Mutex::new(None);
    let served = weft_net::serve_with_exporters(
        listeners,
        Arc::clone(&front),
        metrics.build(),
        exporters,
        admission,
        async {
            tokio::select! {
                () = shutdown => {}
                Ok(why) = stopping => *failed.lock().expect("failed poisoned") = Some(why),
            }
        },
    )
    .await
    .map_err(|e| MgmtError::Listen(e.to_string()));
    if let Some(leading) = leading {
        leading.abort();
        let _ = leading.await;
    }
    front.stop_serving();
    if let Some(replica) = replica {
        replica.shutdown().await;
    }
    if let Some(why) = failed.lock().expect("failed poisoned").take() {
        return Err(MgmtError::Store(why));
    }
    served
}

/// Serves while this server leads: once it leads, and every entry committed before is
/// applied here, it serves as a restarted management does (it waits a full offline and
/// promotion timeout before it declares anything offline or promotes anyone); once it no
/// longer leads, it stops. `store` makes its changes through the replicated log.
async fn lead(
    front: Arc<Front>,
    raft: Raft,
    store: MgmtStore,
    raft_stopped: tokio::sync::oneshot::Sender<String>,
) {
    let mut metrics = raft.server_metrics();
    // The term this server serves in: a lead lost and won again between two looks is a new
    // term, served afresh (another leader may have changed the store meanwhile).
    let mut serving_term = None;
    loop {
        let (leads, term) = {
            let metrics = metrics.borrow_and_update();
            (
                metrics.state == openraft::ServerState::Leader,
                metrics.vote.leader_id.term,
            )
        };
        if serving_term.is_some_and(|serving| serving != term) || (!leads && serving_term.is_some())
        {
            front.stop_serving();
            serving_term = None;
            tracing::info!("this management server no longer leads");
        }
        if leads && serving_term.is_none() {
            match raft.ensure_linearizable().await {
                Ok(_) => match front.serve(store.clone()) {
                    Ok(()) => {
                        serving_term = Some(term);
                        tracing::info!(term, "this management server leads");
                    }
                    Err(error) => tracing::error!(%error, "cannot serve as the leader"),
                },
                Err(error) => tracing::debug!(%error, "lost the lead before serving"),
            }
            // Looks again at once: the lead may have changed meanwhile.
            tokio::time::sleep(replication::HEARTBEAT_INTERVAL).await;
            continue;
        }
        if metrics.changed().await.is_err() {
            front.stop_serving();
            let why = match &raft.metrics().borrow().running_state {
                Err(fatal) => format!("the replicated log stopped: {fatal}"),
                Ok(()) => "the replicated log stopped".to_string(),
            };
            tracing::error!(%why, "management stops");
            let _ = raft_stopped.send(why);
            return;
        }
    }
}

/// What answers on management's address: the service while this server serves (alone, or as
/// the leader of a replicated management), `NotLeader` naming the leader otherwise, and the
/// other management servers' replication messages.
struct Front {
    config: MgmtConfig,
    auth: weft_net::Auth,
    raft: Option<Raft>,
    serving: std::sync::RwLock<Option<Serving>>,
}

/// The service while this server serves, with its background loops.
struct Serving {
    mgmt: Arc<Mgmt>,
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        for task in &self.loops {
            task.abort();
        }
    }
}

impl Front {
    /// Starts serving from `store`.
    fn serve(&self, store: MgmtStore) -> Result<(), MgmtError> {
        let mgmt = Arc::new(Mgmt::new(&self.config, store, self.auth.clone())?);
        let loops = vec![
            tokio::spawn(monitor_loop(Arc::clone(&mgmt))),
            tokio::spawn(mirror_loop(Arc::clone(&mgmt))),
            tokio::spawn(publish_loop(Arc::clone(&mgmt))),
        ];
        *self.serving.write().expect("serving poisoned") = Some(Serving { mgmt, loops });
        Ok(())
    }

    fn stop_serving(&self) {
        self.serving.write().expect("serving poisoned").take();
    }

    /// The service, while this server serves.
    fn leading(&self) -> Option<Arc<Mgmt>> {
        self.serving
            .read()
            .expect("serving poisoned")
            .as_ref()
            .map(|serving| Arc::clone(&serving.mgmt))
    }

    /// The answer of a server that does not serve: who leads, as far as it knows.
    fn not_leader(&self) -> WireError {
        let leader = self.raft.as_ref().and_then(|raft| {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let leader = metrics.current_leader?;
            metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|node| node.addr.clone())
        });
        WireError::new(
            ErrorCode::NotLeader,
            replication::leader_named(leader.as_deref()),
        )
    }
}

impl weft_net::Handler for Front {
    type Response = MgmtResponse;

    async fn handle(
        &self,
        from: weft_net::auth::Identity,
        request: Request,
        payload: Bytes,
    ) -> (Reply<MgmtResponse>, Bytes) {
        if let Request::Mgmt(MgmtRequest::Raft { call }) = request {
            let answered = match (&self.raft, &from) {
                (Some(raft), weft_net::auth::Identity::Member) => {
                    replication::answer(raft, call, &payload)
                        .await
                        .map_err(|error| WireError::new(ErrorCode::InvalidArgument, error))
                }
                (Some(_), weft_net::auth::Identity::Client(_)) => Err(WireError::new(
                    ErrorCode::PermissionDenied,
                    "only management servers replicate management",
                )),
                (None, _) => Err(WireError::new(
                    ErrorCode::WrongService,
                    "this management server is not replicated (no replicas in its config)",
                )),
            };
            return match answered {
                Ok(payload) => (Ok(MgmtResponse::Raft), payload),
                Err(error) => (Err(error), Bytes::new()),
            };
        }
        match self.leading() {
            // A leader cut off from the majority stops serving before another is elected.
            Some(mgmt) if mgmt.store.leads_a_majority() => {
                let declared = match &request {
                    Request::Mgmt(request) => Some((request.into(), request.answer_fits())),
                    _ => None,
                };
                let answer = mgmt.handle(from, request).await;
                if let Some((op, fits)) = declared {
                    weft_proto::answer::debug_check(op, fits, &answer.0);
                }
                answer
            }
            Some(_) => (Err(lost_majority()), Bytes::new()),
            None => (Err(self.not_leader()), Bytes::new()),
        }
    }

    async fn http(&self, path: &str, _query: &str) -> Option<HttpReply> {
        match path {
            "/" | "/index.html" => Some(HttpReply::ok("text/html; charset=utf-8", WEB_PAGE)),
            "/api/cluster" => Some(match self.leading() {
                Some(mgmt) => match mgmt.cluster_status() {
                    Ok(status) if self.config.web_details => HttpReply::json(&status),
                    // Anyone who reaches the port reads this: not who uses what.
                    Ok(status) => HttpReply::json(&status.without_details()),
                    Err(error) => HttpReply::error(500, error.to_string()),
                },
                None => HttpReply::error(503, self.not_leader().message),
            }),
            _ => None,
        }
    }
}

impl Mgmt {
    fn new(config: &MgmtConfig, store: MgmtStore, auth: weft_net::Auth) -> Result<Mgmt, MgmtError> {
        let mirrors = Mirrors::open(&store, config.mirror_promotion_timeout)?;
        // A management that ran before (or another leader of a replicated one) may have
        // granted the directory-rename lock, which it kept in memory only: it is granted
        // again once that lease is surely over. A store with nothing in it has no before.
        let rename_lock_from = if store.is_replicated() || store.holds_anything()? {
            Instant::now() + config.rename_lock_lease
        } else {
            Instant::now()
        };
        // Past every epoch a management before this one published, so the map's watchers
        // take this one's maps whatever the clocks say.
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_micros() as u64);
        let first_epoch = store.start_map_epochs(clock)?;
        Ok(Mgmt {
            store,
            live: Mutex::default(),
            started: Instant::now(),
            offline_timeout: config.node_offline_timeout,
            session_timeout: config.session_timeout,
            rename_lock: Mutex::new(None),
            rename_lock_lease: config.rename_lock_lease,
            rename_lock_from,
            monitor: Monitor::new(config.stats_interval, auth),
            mirror_lock: Mutex::new(()),
            mirrors,
            map_epoch: tokio::sync::watch::Sender::new(first_epoch),
            map_shape: Mutex::new(0),
            watched: Mutex::new(None),
            quota_grace_period: config.quota_grace_period,
            sessions_per_client: config.sessions_per_client,
        })
    }
}

/// Replaces silent primaries of mirror groups, a few times per promotion timeout.
async fn mirror_loop(mgmt: Arc<Mgmt>) {
    const TICK: Duration = Duration::from_millis(250);
    loop {
        tokio::time::sleep(TICK).await;
        match tokio::task::block_in_place(|| mgmt.mirrors.tick(&mgmt.store)) {
            Ok(events) => {
                for event in events {
                    mgmt.monitor.event(true, event);
                }
            }
            Err(error) => tracing::error!(%error, "cannot store a mirror group change"),
        }
    }
}

/// Now, in seconds since the Unix epoch.
fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Publishes the changes of the map no request makes, a few times a second.
async fn publish_loop(mgmt: Arc<Mgmt>) {
    loop {
        tokio::time::sleep(MAP_PUBLISH_INTERVAL).await;
        tokio::task::block_in_place(|| mgmt.publish_map());
    }
}

/// What of the map routing and placement follow, as a digest: everything but usage figures,
/// with each target's capacity class in their place.
fn map_shape(map: &ClusterMap) -> u64 {
    use std::hash::{Hash, Hasher};
    let classes: Vec<weft_proto::pools::CapacityClass> =
        map.targets.iter().map(|t| map.capacity_class(t)).collect();
    let mut shape = map.clone();
    shape.epoch = 0;
    for node in &mut shape.nodes {
        node.meta_usage = None;
        node.meta_inodes_used = None;
    }
    for target in &mut shape.targets {
        target.usage = SpaceUsage::default();
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    postcard::to_stdvec(&(shape, classes))
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Whether the map is published at once after a request: those that change it when they
/// succeed, and the quota listing, which runs the grace periods first (usage reports and
/// time move the rest, published by the next map made, at the latest by the loop).
fn publishes_map(request: &MgmtRequest) -> bool {
    matches!(
        request,
        MgmtRequest::RegisterNode { .. }
            | MgmtRequest::RegisterTarget { .. }
            | MgmtRequest::RegisterClient { .. }
            | MgmtRequest::CreateMirrorGroup { .. }
            | MgmtRequest::AutoCreateMirrorGroups { .. }
            | MgmtRequest::SetClientRule { .. }
            | MgmtRequest::RemoveClientRule { .. }
            | MgmtRequest::CreatePool { .. }
            | MgmtRequest::RemovePool { .. }
            | MgmtRequest::MovePoolTargets { .. }
            | MgmtRequest::SetPoolLimits { .. }
            | MgmtRequest::SetQuota { .. }
            | MgmtRequest::DrainTarget { .. }
            | MgmtRequest::RemoveTarget { .. }
            | MgmtRequest::GetQuotas
    )
}

/// Samples the servers and notes state changes, once per interval.
async fn monitor_loop(mgmt: Arc<Mgmt>) {
    loop {
        tokio::time::sleep(mgmt.monitor.interval()).await;
        match mgmt.cluster_map() {
            Ok(map) => mgmt.monitor.tick(&map).await,
            Err(error) => tracing::warn!(%error, "cannot read the cluster map to monitor it"),
        }
    }
}

impl Mgmt {
    async fn handle(
        &self,
        from: weft_net::auth::Identity,
        request: Request,
    ) -> (Reply<MgmtResponse>, Bytes) {
        if let weft_net::auth::Identity::Client(name) = &from {
            let rule = self
                .store
                .client_rules()
                .map(|rules| rules.into_iter().find(|rule| *rule.name == **name));
            let admitted = match rule {
                Ok(Some(rule)) => rule.admit(&request),
                Ok(None) => Ok(()),
                Err(error) => Err(internal(error)),
            };
            if let Err(error) = admitted {
                return (Err(error), Bytes::new());
            }
        }
        let reply = match request {
            Request::Mgmt(MgmtRequest::WatchClusterMap { after, wait_ms }) => {
                let mut epochs = self.map_epoch.subscribe();
                let wait = Duration::from_millis(u64::from(wait_ms.min(MAP_WATCH_WAIT_MS_MAX)));
                // Answered with the map as it is when the wait runs out.
                let _ = tokio::time::timeout(wait, epochs.wait_for(|epoch| *epoch > after)).await;
                tokio::task::block_in_place(|| self.watched_map(&from))
            }
            // Requests may commit to the store (an fsync) or wait for a commit in flight: the
            // runtime moves its other tasks off this thread meanwhile, so a slow disk never
            // keeps management from answering map fetches and heartbeats that change nothing.
            Request::Mgmt(request) => tokio::task::block_in_place(|| {
                let publish = publishes_map(&request);
                let reply = self.handle_mgmt(&from, request);
                if publish && reply.is_ok() {
                    self.publish_map();
                }
                reply
            }),
            other => Err(WireError::new(
                ErrorCode::WrongService,
                format!("management does not serve {other:?}"),
            )),
        };
        (reply, Bytes::new())
    }
}

fn refused(refused: pools::Refused) -> WireError {
    match refused {
        pools::Refused::Wire(error) => error,
        pools::Refused::Store(error) => internal(error),
    }
}

/// The answer of a leader that has not heard from a majority of the management servers lately.
fn lost_majority() -> WireError {
    WireError::new(
        ErrorCode::NotLeader,
        "this management server lost contact with the majority of its replicas: ask another",
    )
}

fn internal(error: MgmtError) -> WireError {
    match error {
        MgmtError::NotLeader(message) => return WireError::new(ErrorCode::NotLeader, message),
        MgmtError::Refused(message) => return WireError::new(ErrorCode::OutOfRange, message),
        _ => {}
    }
    tracing::error!(%error, "management store failed");
    WireError::new(ErrorCode::Internal, error.to_string())
}

impl Mgmt {
    fn handle_mgmt(
        &self,
        from: &weft_net::auth::Identity,
        request: MgmtRequest,
    ) -> Reply<MgmtResponse> {
        let client_name = match from {
            weft_net::auth::Identity::Client(name) => Some(&**name),
            weft_net::auth::Identity::Member => None,
        };
        match request {
            MgmtRequest::SetClientRule { rule } => self.set_client_rule(rule),
            MgmtRequest::RemoveClientRule { name } => self.remove_client_rule(name),
            MgmtRequest::RegisterNode {
                node,
                kind,
                alias,
                addresses,
            } => self.register_node(node, kind, alias, addresses),
            MgmtRequest::RegisterTarget { node, target } => self.register_target(node, target),
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
            } => {
                let reports = registry::Reports {
                    targets,
                    meta_usage,
                    meta_inodes_used,
                    quota_usage,
                    target_uses,
                    drain_blocked,
                };
                self.heartbeat(kind, node, reports, mirror)
            }
            MgmtRequest::RegisterClient { alias } => self.register_client(client_name, alias),
            MgmtRequest::ClientHeartbeat { client, unserved } => {
                self.client_heartbeat(client_name, client, unserved)
            }
            MgmtRequest::AcquireRenameLock { holder, token } => {
                self.acquire_rename_lock(holder, token)
            }
            MgmtRequest::ReleaseRenameLock { token } => {
                let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
                if lock.is_some_and(|(held, _, _)| held == token) {
                    *lock = None;
                }
                Ok(MgmtResponse::Done)
            }
            MgmtRequest::GetResyncStats => self.get_resync_stats(),
            MgmtRequest::GetClusterMap | MgmtRequest::WatchClusterMap { .. } => {
                let mut map = self.cluster_map().map_err(internal)?;
                as_seen_by(&mut map, client_name);
                Ok(MgmtResponse::ClusterMap(map))
            }
            MgmtRequest::GetClusterStatus => self.get_cluster_status(client_name),
            MgmtRequest::SetQuota { rule } => self.set_quota(rule),
            MgmtRequest::GetQuotas => {
                Ok(MgmtResponse::Quotas(self.quota_states().map_err(internal)?))
            }
            MgmtRequest::GrantQuota {
                home,
                key,
                bytes,
                inodes,
            } => self.grant_quota(home, key, bytes, inodes),
            // Answered before the service (`Front`).
            MgmtRequest::Raft { .. } => Err(WireError::new(
                ErrorCode::WrongService,
                "replication messages are answered by the replication",
            )),
            MgmtRequest::CreatePool { name } => {
                self.pool_change(|| pools::create(&self.store, &name))
            }
            MgmtRequest::RemovePool { pool } => {
                self.pool_change(|| pools::remove(&self.store, pool))
            }
            MgmtRequest::MovePoolTargets { targets, from, to } => self.pool_change(|| {
                // Mirror groups are not created while their members move.
                let _creating = self.mirror_lock.lock().expect("mirror lock poisoned");
                pools::move_targets(&self.store, &self.mirrors, &targets, from, to)
            }),
            MgmtRequest::SetPoolLimits {
                pool,
                low,
                emergency,
            } => self.pool_change(|| pools::set_limits(&self.store, pool, low, emergency)),
            MgmtRequest::DrainTarget { target, stop } => self.drain_target(target, stop),
            MgmtRequest::RemoveTarget { target } => self.remove_target(target),
            MgmtRequest::CreateMirrorGroup { kind, members } => {
                self.create_mirror_group(kind, members)
            }
            MgmtRequest::AutoCreateMirrorGroups { kind } => self.auto_create_mirror_groups(kind),
        }
    }
}

/// What the service modules' tests share: a management service on a fresh store, asked
/// requests directly (no network), and the nodes and targets they need.
#[cfg(test)]
mod testing {
    use super::*;

    /// A management service on a fresh store in a temporary directory.
    pub(super) struct Fixture {
        _dir: tempfile::TempDir,
        pub mgmt: Mgmt,
    }

    pub(super) fn mgmt() -> Fixture {
        let dir = tempfile::tempdir().expect("dir");
        let config: MgmtConfig = toml::from_str(&format!(
            "data_dir = {:?}",
            dir.path().display().to_string()
        ))
        .expect("config");
        let store = MgmtStore::open(dir.path()).expect("store");
        let mgmt = Mgmt::new(&config, store, weft_net::Auth::none()).expect("management");
        Fixture { _dir: dir, mgmt }
    }

    impl Fixture {
        /// Asks `request` as a member (a server or an admin tool).
        pub fn ask(&self, request: MgmtRequest) -> Reply<MgmtResponse> {
            self.mgmt
                .handle_mgmt(&weft_net::auth::Identity::Member, request)
        }

        /// Asks `request` as the holder of client `name`'s key.
        pub fn ask_as(&self, name: &str, request: MgmtRequest) -> Reply<MgmtResponse> {
            self.mgmt
                .handle_mgmt(&weft_net::auth::Identity::Client(name.into()), request)
        }

        /// The error code `request` is refused with.
        pub fn refused(&self, request: MgmtRequest) -> ErrorCode {
            match self.ask(request) {
                Ok(response) => panic!("answered {response:?}"),
                Err(error) => error.code,
            }
        }

        /// Registers a node of `kind` named `alias`; returns its id.
        pub fn node(&self, kind: NodeKind, alias: &str) -> NodeId {
            let registered = self.ask(MgmtRequest::RegisterNode {
                node: None,
                kind,
                alias: alias.into(),
                addresses: vec![format!("{alias}:1")],
            });
            match registered {
                Ok(MgmtResponse::NodeRegistered { node }) => node,
                other => panic!("registering {alias}: {other:?}"),
            }
        }

        /// Registers a new target of storage node `node`; returns its id.
        pub fn target(&self, node: NodeId) -> TargetId {
            match self.ask(MgmtRequest::RegisterTarget { node, target: None }) {
                Ok(MgmtResponse::TargetRegistered { target }) => target,
                other => panic!("registering a target of {node}: {other:?}"),
            }
        }
    }
}
