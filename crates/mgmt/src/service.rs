//! The management request handler and its in-memory heartbeat view.

use crate::mirrors::{nodes_of_targets, Mirrors};
use crate::monitor::{unix_ms, Monitor};
use crate::pools;
use crate::replication::{self, Raft, Replica};
use crate::store::{MgmtStore, NodeRecord};
use crate::{MgmtConfig, MgmtError};
use bytes::Bytes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_net::mirror::published;
use weft_observe::HttpReply;
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, GroupId, MemberId, NodeId, StoragePoolId, TargetId};
use weft_proto::messages::{
    ClusterMap, MgmtRequest, MirrorGroupInfo, MirrorKind, NodeInfo, NodeKind, Reachability, Reply,
    Request, Response, ResyncProgress, SpaceUsage, MAP_WATCH_WAIT_MS_MAX, MIRROR_MEMBERS_MAX,
    NODE_ADDRESSES_MAX,
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
        .register_collector(Box::new(ClusterCollector(Arc::clone(&front))));
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
    async fn handle(
        &self,
        from: weft_net::auth::Identity,
        request: Request,
        payload: Bytes,
    ) -> (Reply, Bytes) {
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
                Ok(payload) => (Ok(Response::Raft), payload),
                Err(error) => (Err(error), Bytes::new()),
            };
        }
        match self.leading() {
            // A leader cut off from the majority stops serving before another is elected.
            Some(mgmt) if mgmt.store.leads_a_majority() => mgmt.handle(from, request).await,
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
    async fn handle(&self, from: weft_net::auth::Identity, request: Request) -> (Reply, Bytes) {
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

/// The cluster as management sees it, for Prometheus: nodes and targets by reachability,
/// storage space, live client sessions.
struct ClusterCollector(Arc<Front>);

impl std::fmt::Debug for ClusterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterCollector")
    }
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(mgmt) = self.0.leading() else {
            return Ok(());
        };
        let Ok(map) = mgmt.cluster_map() else {
            return Ok(());
        };
        let mut nodes: HashMap<(&'static str, &'static str), i64> = HashMap::new();
        for node in &map.nodes {
            *nodes
                .entry((node.kind.into(), node.reachability.into()))
                .or_default() += 1;
        }
        let mut family = encoder.encode_descriptor(
            "weft_cluster_nodes",
            "Registered nodes by kind and reachability.",
            None,
            MetricType::Gauge,
        )?;
        for ((kind, reachability), count) in nodes {
            let labels = [("kind", kind), ("reachability", reachability)];
            ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
        }
        let mut targets: HashMap<&'static str, i64> = HashMap::new();
        for target in &map.targets {
            *targets.entry(target.reachability.into()).or_default() += 1;
        }
        let mut family = encoder.encode_descriptor(
            "weft_cluster_storage_targets",
            "Registered storage targets by reachability.",
            None,
            MetricType::Gauge,
        )?;
        for (reachability, count) in targets {
            let labels = [("reachability", reachability)];
            ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
        }
        let sums: [(&str, &str, i64); 3] = [
            (
                "weft_cluster_storage_capacity_bytes",
                "Bytes all storage targets may hold, as last reported.",
                map.targets.iter().map(|t| t.usage.total_bytes as i64).sum(),
            ),
            (
                "weft_cluster_storage_free_bytes",
                "Bytes free on all storage targets, as last reported.",
                map.targets.iter().map(|t| t.usage.free_bytes as i64).sum(),
            ),
            (
                "weft_cluster_client_sessions",
                "Client sessions that are alive.",
                map.live_sessions.len() as i64,
            ),
        ];
        for (name, help, value) in sums {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)?;
        }
        let pools = map.all_pools();
        let mut family = encoder.encode_descriptor(
            "weft_pool_targets",
            "Storage targets of each pool by capacity class (normal, low, emergency), by the \
             pool's limits.",
            None,
            MetricType::Gauge,
        )?;
        for pool in &pools {
            for class in [
                weft_proto::pools::CapacityClass::Normal,
                weft_proto::pools::CapacityClass::Low,
                weft_proto::pools::CapacityClass::Emergency,
            ] {
                let count = map
                    .pool_targets(pool.id)
                    .filter(|t| pool.class_of(&t.usage) == class)
                    .count();
                let labels = [("pool", pool.name.as_str()), ("class", <&str>::from(class))];
                ConstGauge::new(count as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        let columns: [weft_observe::metrics::Column<SpaceUsage>; 2] = [
            (
                "weft_pool_capacity_bytes",
                "Bytes the targets of each pool may hold, as last reported.",
                |usage| usage.total_bytes,
            ),
            (
                "weft_pool_free_bytes",
                "Bytes free on the targets of each pool, as last reported.",
                |usage| usage.free_bytes,
            ),
        ];
        for (name, help, value) in columns {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for pool in &pools {
                let sum: u64 = map.pool_targets(pool.id).map(|t| value(&t.usage)).sum();
                let labels = [("pool", pool.name.as_str())];
                ConstGauge::new(sum as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut members: HashMap<(&'static str, &'static str), i64> = HashMap::new();
        for group in &map.mirror_groups {
            for member in &group.members {
                *members
                    .entry((group.kind.into(), member.state.into()))
                    .or_default() += 1;
            }
        }
        let mut family = encoder.encode_descriptor(
            "weft_cluster_mirror_members",
            "Members of mirror groups by kind and consistency (good, needs-resync, bad).",
            None,
            MetricType::Gauge,
        )?;
        for ((kind, state), count) in members {
            let labels = [("kind", kind), ("state", state)];
            ConstGauge::new(count).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "weft_cluster_mirror_group_version",
            "Each mirror group's version: it changes with every failover, drop or return.",
            None,
            MetricType::Gauge,
        )?;
        for group in &map.mirror_groups {
            let id = group.id.to_string();
            let labels = [("kind", <&str>::from(group.kind)), ("group", id.as_str())];
            ConstGauge::new(group.version.0 as i64).encode(family.encode_family(&labels)?)?;
        }
        let unserved = mgmt
            .live
            .lock()
            .expect("live state poisoned")
            .client_unserved
            .clone();
        let mut family = encoder.encode_descriptor(
            "weft_client_unserved_requests",
            "Requests each client's mount answered with an error because it does not serve them \
             (ioctl, poll, lseek…), by kind, as its heartbeats report them.",
            None,
            MetricType::Counter,
        )?;
        for (client, kinds) in unserved {
            let client = client.to_string();
            for (kind, count) in kinds {
                let labels = [("client", client.as_str()), ("request", kind.as_str())];
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// A group's description for events and logs.
fn describe_group(group: &MirrorGroupInfo, what: &str) -> String {
    let members: Vec<String> = group.members.iter().map(|m| m.id.to_string()).collect();
    format!(
        "{} mirror group {} {what}: members {} (primary {})",
        <&str>::from(group.kind),
        group.id,
        members.join(", "),
        group.primary
    )
}

/// Checks a requested group against the members still free; returns (member, node) pairs.
fn check_mirror_group(
    kind: MirrorKind,
    members: &[MemberId],
    candidates: &[(MemberId, NodeId)],
) -> Result<Vec<(MemberId, NodeId)>, WireError> {
    let noun = match kind {
        MirrorKind::Storage => "storage target",
        MirrorKind::Meta => "metadata node",
    };
    let invalid = |message: String| Err(WireError::new(ErrorCode::InvalidArgument, message));
    if members.len() < 2 || members.len() > MIRROR_MEMBERS_MAX {
        return invalid(format!(
            "a mirror group has 2 to {MIRROR_MEMBERS_MAX} members, not {}",
            members.len()
        ));
    }
    let mut group = Vec::new();
    for member in members {
        let Some(found) = candidates.iter().find(|(id, _)| id == member) else {
            return invalid(format!(
                "{noun} {member} is not registered or already in a mirror group (weft mirror list)"
            ));
        };
        if group.iter().any(|(_, node)| *node == found.1) {
            return invalid(format!(
                "{noun} {member} is on the same node as another member: a mirror must survive the loss of a node"
            ));
        }
        group.push(*found);
    }
    Ok(group)
}

/// Pairs free members two by two, never two on one node: each round takes one from each of
/// the two nodes with the most left.
fn pair_across_nodes(candidates: &[(MemberId, NodeId)]) -> Vec<Vec<(MemberId, NodeId)>> {
    let mut by_node: std::collections::BTreeMap<NodeId, Vec<MemberId>> = Default::default();
    for (member, node) in candidates {
        by_node.entry(*node).or_default().push(*member);
    }
    for members in by_node.values_mut() {
        members.reverse(); // pop the lowest id first
    }
    let mut groups = Vec::new();
    loop {
        let mut nodes: Vec<(usize, NodeId)> = by_node
            .iter()
            .filter(|(_, members)| !members.is_empty())
            .map(|(node, members)| (members.len(), *node))
            .collect();
        if nodes.len() < 2 {
            return groups;
        }
        nodes.sort_by_key(|(left, node)| (std::cmp::Reverse(*left), *node));
        let mut group = Vec::new();
        for (_, node) in &nodes[..2] {
            let member = by_node
                .get_mut(node)
                .and_then(Vec::pop)
                .expect("nodes listed have members left");
            group.push((member, *node));
        }
        groups.push(group);
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
    fn handle_mgmt(&self, from: &weft_net::auth::Identity, request: MgmtRequest) -> Reply {
        let client_name = match from {
            weft_net::auth::Identity::Client(name) => Some(&**name),
            weft_net::auth::Identity::Member => None,
        };
        match request {
            MgmtRequest::SetClientRule { rule } => {
                if !weft_proto::access::valid_client_name(&rule.name) {
                    return Err(WireError::new(
                        ErrorCode::InvalidArgument,
                        format!("{:?} cannot name a client", rule.name),
                    ));
                }
                self.store.set_client_rule(&rule).map_err(internal)?;
                tracing::info!(?rule, "client rule set");
                Ok(Response::Done)
            }
            MgmtRequest::RemoveClientRule { name } => {
                if !self.store.remove_client_rule(&name).map_err(internal)? {
                    return Err(WireError::new(
                        ErrorCode::NotFound,
                        format!("client {name} has no rule"),
                    ));
                }
                tracing::info!(client = %name, "client rule removed");
                Ok(Response::Done)
            }
            MgmtRequest::RegisterNode {
                node,
                kind,
                alias,
                addresses,
            } => {
                if addresses.is_empty() || addresses.len() > NODE_ADDRESSES_MAX {
                    return Err(WireError::new(
                        ErrorCode::InvalidArgument,
                        format!("a node announces 1 to {NODE_ADDRESSES_MAX} addresses"),
                    ));
                }
                let record = NodeRecord {
                    alias: alias.clone(),
                    addresses,
                };
                let node = self
                    .store
                    .register_node(kind, node, &record)
                    .map_err(internal)?;
                let mut live = self.live.lock().expect("live state poisoned");
                let was_known = live
                    .last_heard
                    .insert((kind, node), Instant::now())
                    .is_some();
                tracing::debug!(?kind, node = node.0, addresses = ?record.addresses, "node registered");
                self.monitor.event(
                    false,
                    format!(
                        "{} {alias} ({node}) registered{} at {}",
                        match kind {
                            NodeKind::Meta => "metadata node",
                            NodeKind::Storage => "storage node",
                            NodeKind::Management => "management",
                        },
                        if was_known { " again" } else { "" },
                        record.addresses.join(", ")
                    ),
                );
                Ok(Response::NodeRegistered { node })
            }
            MgmtRequest::RegisterTarget { node, target } => {
                if !self
                    .store
                    .node_exists(NodeKind::Storage, node)
                    .map_err(internal)?
                {
                    return Err(WireError::new(
                        ErrorCode::UnknownNode,
                        format!("storage node {node} is not registered"),
                    ));
                }
                let target =
                    self.store
                        .register_target(node, target)
                        .map_err(|error| match error {
                            MgmtError::TargetRemoved(_) => {
                                WireError::new(ErrorCode::InvalidArgument, error.to_string())
                            }
                            error => internal(error),
                        })?;
                tracing::info!(
                    target = target.0,
                    node = node.0,
                    "storage target registered"
                );
                Ok(Response::TargetRegistered { target })
            }
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
                if !self.store.node_exists(kind, node).map_err(internal)? {
                    return Err(WireError::new(
                        ErrorCode::UnknownNode,
                        format!("{kind:?} node {node} is not registered; register again"),
                    ));
                }
                let ids: Vec<TargetId> = targets.iter().map(|t| t.target).collect();
                {
                    let mut live = self.live.lock().expect("live state poisoned");
                    live.last_heard.insert((kind, node), Instant::now());
                    for report in targets {
                        live.target_usage.insert(report.target, report.usage);
                    }
                    if let Some(usage) = meta_usage {
                        // A server that serves no home yet reports no count: the last stays.
                        let known = live.meta_usage.get(&node).map_or(0, |(_, used)| *used);
                        live.meta_usage
                            .insert(node, (usage, meta_inodes_used.unwrap_or(known)));
                    }
                    for (home, usage) in quota_usage {
                        live.home_usage.insert(home, usage);
                    }
                    let now = unix_ms();
                    for (home, uses) in target_uses {
                        // A home that tells its uses and no blocked files has none.
                        live.drain_blocked.remove(&home);
                        live.target_uses.insert(home, (now, uses));
                    }
                    for (home, blocked) in drain_blocked {
                        live.drain_blocked.insert(home, blocked);
                    }
                }
                let Some(mirror) = mirror else {
                    return Ok(Response::HeartbeatAck {
                        lease_ms: 0,
                        mirror_groups: Vec::new(),
                        unix_ms: unix_ms(),
                    });
                };
                {
                    let mut live = self.live.lock().expect("live state poisoned");
                    for progress in &mirror.resyncs {
                        live.resyncs
                            .insert((progress.kind, progress.group, progress.member), *progress);
                    }
                }
                let (mirror_kind, members): (MirrorKind, Vec<MemberId>) = match kind {
                    NodeKind::Meta => (MirrorKind::Meta, vec![MemberId::from(node)]),
                    _ => (
                        MirrorKind::Storage,
                        ids.iter().copied().map(MemberId::from).collect(),
                    ),
                };
                let (lease, groups, events) = self
                    .mirrors
                    .heartbeat(&self.store, mirror_kind, &members, mirror)
                    .map_err(|error| match error {
                        MgmtError::EarlierStart { .. } => {
                            tracing::warn!(node = node.0, %error, "heartbeat ignored");
                            WireError::new(ErrorCode::Superseded, error.to_string())
                        }
                        error => internal(error),
                    })?;
                for event in events {
                    self.monitor.event(true, event);
                }
                // Most storage nodes hold no mirror member: no need to read the targets then.
                let nodes = if groups.is_empty() || mirror_kind == MirrorKind::Meta {
                    HashMap::new()
                } else {
                    nodes_of_targets(&self.store.targets().map_err(internal)?)
                };
                let node_of = |member: MemberId| match mirror_kind {
                    MirrorKind::Meta => NodeId::from(member),
                    MirrorKind::Storage => nodes.get(&member).copied().unwrap_or(NodeId(0)),
                };
                // Checked as the lease is granted: a leader cut off from the others must not
                // renew leases another leader could be granting; the node asks another server.
                if !self.store.leads_a_majority() {
                    return Err(lost_majority());
                }
                Ok(Response::HeartbeatAck {
                    unix_ms: unix_ms(),
                    lease_ms: lease.as_millis() as u64,
                    mirror_groups: groups
                        .iter()
                        .map(|g| published(mirror_kind, g, node_of))
                        .collect(),
                })
            }
            MgmtRequest::RegisterClient { alias } => {
                if let Some(name) = client_name {
                    let held = self
                        .store
                        .session_owners()
                        .map_err(internal)?
                        .iter()
                        .filter(|(_, owner)| owner == name)
                        .count();
                    if held >= self.sessions_per_client {
                        return Err(WireError::new(
                            ErrorCode::PermissionDenied,
                            format!("client {name} holds {held} live sessions, the most one client key may (management's sessions_per_client): sessions end when their clients stop"),
                        ));
                    }
                }
                let client = self
                    .store
                    .register_client(&alias, client_name)
                    .map_err(internal)?;
                self.live
                    .lock()
                    .expect("live state poisoned")
                    .client_last_heard
                    .insert(client, Instant::now());
                tracing::info!(client = %client, %alias, "client session registered");
                Ok(Response::ClientRegistered {
                    client,
                    session_timeout_ms: u64::try_from(self.session_timeout.as_millis())
                        .unwrap_or(u64::MAX),
                })
            }
            MgmtRequest::ClientHeartbeat { client, unserved } => {
                // A client keeps alive only its own sessions (one that expired is told so
                // below, and registers again).
                if let Some(name) = client_name {
                    let owners = self.store.session_owners().map_err(internal)?;
                    let owned = owners
                        .iter()
                        .any(|(id, owner)| *id == client && owner == name);
                    if !owned && self.store.client_exists(client).map_err(internal)? {
                        return Err(weft_proto::access::foreign_session(name, client));
                    }
                }
                if self.store.client_exists(client).map_err(internal)? {
                    let mut live = self.live.lock().expect("live state poisoned");
                    if !self.session_live(&live, client) {
                        tracing::warn!(client = %client, "a client came back after its session expired: told so");
                        return Err(WireError::new(
                            ErrorCode::UnknownSession,
                            format!(
                                "client session {client} expired: it was silent for more than {} ms, \
                                 and the servers released its locks and opens",
                                self.session_timeout.as_millis()
                            ),
                        ));
                    }
                    live.client_last_heard.insert(client, Instant::now());
                    if !unserved.is_empty() {
                        live.client_unserved.insert(client, unserved);
                    }
                    Ok(Response::Done)
                } else {
                    Err(WireError::new(
                        ErrorCode::UnknownSession,
                        format!("client session {client} is unknown"),
                    ))
                }
            }
            MgmtRequest::AcquireRenameLock { holder, token } => {
                if Instant::now() < self.rename_lock_from {
                    return Err(WireError::new(
                        ErrorCode::WouldBlock,
                        "management started again (or its leader changed): the rename lock is \
                         granted again once the lease granted before could have run out",
                    ));
                }
                let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
                match *lock {
                    Some((held, by, until)) if held != token && Instant::now() < until => {
                        Err(WireError::new(
                            ErrorCode::WouldBlock,
                            format!("metadata node {by} holds the rename lock"),
                        ))
                    }
                    _ => {
                        *lock = Some((token, holder, Instant::now() + self.rename_lock_lease));
                        Ok(Response::Done)
                    }
                }
            }
            MgmtRequest::ReleaseRenameLock { token } => {
                let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
                if lock.is_some_and(|(held, _, _)| held == token) {
                    *lock = None;
                }
                Ok(Response::Done)
            }
            MgmtRequest::GetResyncStats => {
                let storage = self.mirrors.groups(MirrorKind::Storage);
                let meta = self.mirrors.groups(MirrorKind::Meta);
                let resyncing = |kind: MirrorKind, group: GroupId, member: MemberId| {
                    let groups = match kind {
                        MirrorKind::Storage => &storage,
                        MirrorKind::Meta => &meta,
                    };
                    groups.iter().any(|g| {
                        g.id == group
                            && g.member(member).is_some_and(|m| {
                                matches!(m.state, weft_mirror::MemberState::NeedsResync { .. })
                            })
                    })
                };
                let mut live = self.live.lock().expect("live state poisoned");
                live.resyncs
                    .retain(|(kind, group, member), _| resyncing(*kind, *group, *member));
                let mut stats: Vec<ResyncProgress> = live.resyncs.values().copied().collect();
                stats.sort_by_key(|p| (p.kind == MirrorKind::Meta, p.group, p.member));
                Ok(Response::ResyncStats(stats))
            }
            MgmtRequest::GetClusterMap | MgmtRequest::WatchClusterMap { .. } => {
                let mut map = self.cluster_map().map_err(internal)?;
                as_seen_by(&mut map, client_name);
                Ok(Response::ClusterMap(map))
            }
            MgmtRequest::GetClusterStatus => {
                let status = self.cluster_status().map_err(internal)?;
                // A client learns the cluster's state, not the other sessions' load or every
                // user's quota use.
                Ok(Response::ClusterStatus(match client_name {
                    Some(_) => status.without_details(),
                    None => status,
                }))
            }
            MgmtRequest::SetQuota { rule } => {
                let limits = rule.limits;
                let crosses = |soft: u64, hard: u64| soft > 0 && hard > 0 && soft > hard;
                if crosses(limits.soft_bytes, limits.hard_bytes)
                    || crosses(limits.soft_inodes, limits.hard_inodes)
                {
                    return Err(WireError::new(
                        ErrorCode::InvalidArgument,
                        "a soft quota limit must not be above its hard one",
                    ));
                }
                self.store.set_quota(&rule).map_err(internal)?;
                tracing::info!(?rule, "quota set");
                Ok(Response::Done)
            }
            MgmtRequest::GetQuotas => Ok(Response::Quotas(self.quota_states().map_err(internal)?)),
            MgmtRequest::GrantQuota {
                home,
                key,
                bytes,
                inodes,
            } => {
                let (bytes, inodes) = self
                    .store
                    .grant_quota(key, home, (bytes, inodes))
                    .map_err(internal)?;
                Ok(Response::QuotaGranted { bytes, inodes })
            }
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
                let _creating = self.mirror_lock.lock().expect("mirror lock poisoned");
                let candidates = self.mirror_candidates(kind).map_err(internal)?;
                let group = check_mirror_group(kind, &members, &candidates)?;
                if kind == MirrorKind::Storage {
                    pools::check_group_pool(&self.store, &members).map_err(refused)?;
                }
                self.check_meta_copies(kind, std::slice::from_ref(&group))?;
                let created = self.create_groups(kind, &[group]).map_err(internal)?;
                for group in &created {
                    self.monitor.event(false, describe_group(group, "created"));
                }
                Ok(Response::MirrorGroups(created))
            }
            MgmtRequest::AutoCreateMirrorGroups { kind } => {
                let _creating = self.mirror_lock.lock().expect("mirror lock poisoned");
                let candidates = self.mirror_candidates(kind).map_err(internal)?;
                // Storage targets pair within their pool: a group belongs to one.
                let pool_of: HashMap<MemberId, StoragePoolId> = match kind {
                    MirrorKind::Storage => self
                        .store
                        .targets()
                        .map_err(internal)?
                        .into_iter()
                        .map(|(target, record)| (MemberId::from(target), record.pool))
                        .collect(),
                    MirrorKind::Meta => HashMap::new(),
                };
                let mut by_pool: std::collections::BTreeMap<
                    StoragePoolId,
                    Vec<(MemberId, NodeId)>,
                > = Default::default();
                for candidate in candidates {
                    let pool = pool_of
                        .get(&candidate.0)
                        .copied()
                        .unwrap_or(StoragePoolId::DEFAULT);
                    by_pool.entry(pool).or_default().push(candidate);
                }
                let groups: Vec<_> = by_pool
                    .values()
                    .flat_map(|candidates| pair_across_nodes(candidates))
                    .collect();
                self.check_meta_copies(kind, &groups)?;
                let created = self.create_groups(kind, &groups).map_err(internal)?;
                for group in &created {
                    self.monitor.event(false, describe_group(group, "created"));
                }
                Ok(Response::MirrorGroups(created))
            }
        }
    }

    /// What each user and group uses in each pool, summed over the metadata homes as they
    /// last reported.
    fn quota_totals(&self) -> HashMap<(QuotaKind, u32, StoragePoolId), (u64, u64)> {
        let live = self.live.lock().expect("live state poisoned");
        let mut totals: HashMap<_, (u64, u64)> = HashMap::new();
        for row in live.home_usage.values().flatten() {
            let total = totals.entry((row.kind, row.id, row.pool)).or_default();
            total.0 += row.bytes;
            total.1 += row.inodes;
        }
        totals
    }

    /// Every quota rule with what its user or group uses, its grace periods and whether it
    /// is blocked.
    fn quota_states(&self) -> Result<Vec<weft_proto::quota::QuotaState>, MgmtError> {
        let totals = self.quota_totals();
        let now = unix_seconds();
        let grace = self.quota_grace_period.as_secs();
        let mut states = Vec::new();
        for (rule, since) in self.store.quota_rules()? {
            let (bytes, inodes) = totals
                .get(&(rule.kind, rule.id, rule.pool))
                .copied()
                .unwrap_or_default();
            let limits = rule.limits;
            let ends = |over: bool, since: Option<u64>| since.filter(|_| over).map(|s| s + grace);
            let bytes_grace_ends =
                ends(limits.soft_bytes > 0 && bytes > limits.soft_bytes, since[0]);
            let inodes_grace_ends = ends(
                limits.soft_inodes > 0 && inodes > limits.soft_inodes,
                since[1],
            );
            states.push(weft_proto::quota::QuotaState {
                rule,
                bytes,
                inodes,
                bytes_grace_ends,
                inodes_grace_ends,
                bytes_blocked: (limits.hard_bytes > 0 && bytes >= limits.hard_bytes)
                    || bytes_grace_ends.is_some_and(|end| now >= end),
                inodes_blocked: (limits.hard_inodes > 0 && inodes >= limits.hard_inodes)
                    || inodes_grace_ends.is_some_and(|end| now >= end),
            });
        }
        Ok(states)
    }

    /// Starts the grace period of every soft limit newly exceeded, and ends those of limits
    /// no longer exceeded.
    fn run_quota_grace(&self) -> Result<(), MgmtError> {
        let totals = self.quota_totals();
        let now = unix_seconds();
        for (rule, since) in self.store.quota_rules()? {
            let (bytes, inodes) = totals
                .get(&(rule.kind, rule.id, rule.pool))
                .copied()
                .unwrap_or_default();
            let limits = rule.limits;
            for (what, soft, used) in [
                (0, limits.soft_bytes, bytes),
                (1, limits.soft_inodes, inodes),
            ] {
                let over = soft > 0 && used > soft;
                if over != since[usize::from(what)].is_some() {
                    self.store.set_grace(&rule, what, over.then_some(now))?;
                }
            }
        }
        Ok(())
    }

    /// Publishes the map under a new epoch, waking its watchers, when what routing and
    /// placement follow changed since it was last published.
    /// The map for a watcher of the map. A change wakes every node at once, and each fetches
    /// the map: one built for another watcher in the last [`WATCHED_MAP_SHARED_FOR`], with
    /// the epoch current now, serves them all, instead of one build from the store per node.
    /// (A fetch by request, `GetClusterMap`, always builds the map afresh.)
    fn watched_map(&self, from: &weft_net::auth::Identity) -> Reply {
        let map = {
            let mut watched = self.watched.lock().expect("watched map poisoned");
            let current = *self.map_epoch.borrow();
            match watched.as_ref() {
                Some((built, map))
                    if map.epoch == current && built.elapsed() < WATCHED_MAP_SHARED_FOR =>
                {
                    Arc::clone(map)
                }
                _ => {
                    let map = Arc::new(self.cluster_map().map_err(internal)?);
                    *watched = Some((Instant::now(), Arc::clone(&map)));
                    map
                }
            }
        };
        let mut map = ClusterMap::clone(&map);
        if let weft_net::auth::Identity::Client(name) = from {
            as_seen_by(&mut map, Some(name));
        }
        Ok(Response::ClusterMap(map))
    }

    fn publish_map(&self) {
        if let Err(error) = self.run_quota_grace() {
            tracing::warn!(%error, "cannot run the grace periods of quotas");
        }
        if let Err(error) = self.cluster_map() {
            tracing::warn!(%error, "cannot read the cluster map to publish it");
        }
    }

    /// Gives `map` its epoch: a new one, which wakes the map's watchers, when what routing
    /// and placement follow changed since the last map made. So every map anyone is given
    /// has the epoch of what it holds, and a change is published by the first map made
    /// after it, whoever asked.
    fn stamp(&self, map: &mut ClusterMap) {
        let shape = map_shape(map);
        let mut last = self.map_shape.lock().expect("map shape poisoned");
        if *last != shape {
            *last = shape;
            self.map_epoch.send_modify(|epoch| *epoch += 1);
        }
        map.epoch = *self.map_epoch.borrow();
    }

    /// Makes a pool change, notes it in the event log and answers it.
    fn pool_change(
        &self,
        change: impl FnOnce() -> Result<pools::Changed, pools::Refused>,
    ) -> Reply {
        let changed = change().map_err(refused)?;
        tracing::info!(event = %changed.event, "storage pools changed");
        self.monitor.event(false, changed.event);
        Ok(changed.response)
    }

    /// Whether `client`'s session is live: heard within the session timeout (after a restart,
    /// every session counts as heard at management's start). An expired session stays
    /// expired: servers have released its locks and opens, and its client must learn that.
    fn session_live(&self, live: &LiveState, client: ClientId) -> bool {
        let heard = live
            .client_last_heard
            .get(&client)
            .copied()
            .unwrap_or(self.started)
            .max(self.started);
        heard.elapsed() < self.session_timeout
    }

    fn reachability(&self, last_heard: Option<Instant>) -> Reachability {
        // After a restart every node counts as heard at management's start: nothing is marked
        // offline before a full timeout has passed.
        let heard = last_heard.unwrap_or(self.started).max(self.started);
        let silent = heard.elapsed();
        if silent >= self.offline_timeout {
            Reachability::Offline
        } else if silent >= self.offline_timeout / 2 {
            Reachability::ProbablyOffline
        } else {
            Reachability::Online
        }
    }

    /// Creates groups of (member, node) lists, the first member primary.
    fn create_groups(
        &self,
        kind: MirrorKind,
        groups: &[Vec<(MemberId, NodeId)>],
    ) -> Result<Vec<MirrorGroupInfo>, MgmtError> {
        let members: Vec<Vec<MemberId>> = groups
            .iter()
            .map(|group| group.iter().map(|(member, _)| *member).collect())
            .collect();
        let nodes: HashMap<MemberId, NodeId> = groups.iter().flatten().copied().collect();
        let created = self.mirrors.create(&self.store, kind, &members)?;
        Ok(created
            .iter()
            .map(|group| published(kind, group, |m| nodes[&m]))
            .collect())
    }

    /// Refuses metadata groups whose members after the first hold inodes: they become copies
    /// of the first's home, and what they hold would be lost.
    fn check_meta_copies(
        &self,
        kind: MirrorKind,
        groups: &[Vec<(MemberId, NodeId)>],
    ) -> Result<(), WireError> {
        if kind != MirrorKind::Meta {
            return Ok(());
        }
        let live = self.live.lock().expect("live state poisoned");
        for members in groups {
            for (member, _) in members.iter().skip(1) {
                match live.meta_usage.get(&NodeId::from(*member)) {
                    Some((_, 0)) => {}
                    Some((_, inodes)) => {
                        return Err(WireError::new(ErrorCode::InvalidArgument, format!(
                            "metadata node {member} holds {inodes} inodes: a metadata mirror group's members after the first become copies of the first's namespace, so they must be empty; list a node that holds data first"
                        )))
                    }
                    None => {
                        return Err(WireError::new(ErrorCode::Unavailable, format!(
                            "metadata node {member} has not reported how many inodes it holds yet; try again after its next heartbeat"
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Every mirror group of both kinds, as published.
    fn mirror_groups(
        &self,
        targets: &[(TargetId, crate::store::TargetRecord)],
    ) -> Vec<MirrorGroupInfo> {
        let nodes = nodes_of_targets(targets);
        let mut out: Vec<MirrorGroupInfo> = self
            .mirrors
            .groups(MirrorKind::Storage)
            .iter()
            .map(|group| {
                published(MirrorKind::Storage, group, |target| {
                    nodes.get(&target).copied().unwrap_or(NodeId(0))
                })
            })
            .collect();
        out.extend(
            self.mirrors
                .groups(MirrorKind::Meta)
                .iter()
                .map(|group| published(MirrorKind::Meta, group, NodeId::from)),
        );
        out
    }

    /// Members of `kind` not in a group yet, each with its node, in id order.
    fn mirror_candidates(&self, kind: MirrorKind) -> Result<Vec<(MemberId, NodeId)>, MgmtError> {
        let grouped: std::collections::HashSet<MemberId> = self
            .mirrors
            .groups(kind)
            .iter()
            .flat_map(|g| g.members.iter().map(|m| m.server))
            .collect();
        let mut all: Vec<(MemberId, NodeId)> = match kind {
            MirrorKind::Storage => self
                .store
                .targets()?
                .into_iter()
                .map(|(target, record)| (MemberId::from(target), record.node))
                .collect(),
            MirrorKind::Meta => self
                .store
                .nodes()?
                .into_iter()
                .filter(|(node_kind, _, _)| *node_kind == NodeKind::Meta)
                .map(|(_, node, _)| (MemberId::from(node), node))
                .collect(),
        };
        all.retain(|(id, _)| !grouped.contains(id));
        all.sort();
        Ok(all)
    }

    fn cluster_status(&self) -> Result<weft_proto::messages::ClusterStatus, MgmtError> {
        let map = self.cluster_map()?;
        let mut status = self.monitor.status(&map);
        status.quotas = self.quota_states()?;
        let draining = self.store.draining()?;
        for target in &mut status.targets {
            if let Some(&since) = draining.get(&target.id) {
                target.drain_left = self.drain_progress(target.id, since)?.ok();
                target.drain_blocked = self.drain_blocked(target.id);
            }
        }
        Ok(status)
    }

    /// The files of draining `target` that the metadata homes found unable to move off,
    /// summed over the homes, with the first reason told.
    fn drain_blocked(&self, target: TargetId) -> Option<weft_proto::messages::DrainBlock> {
        let live = self.live.lock().expect("live state poisoned");
        let mut blocks = live
            .drain_blocked
            .values()
            .flatten()
            .filter(|block| block.target == target);
        let first = blocks.next()?.clone();
        let more: u64 = blocks.map(|block| block.files).sum();
        Some(weft_proto::messages::DrainBlock {
            files: first.files + more,
            ..first
        })
    }

    /// `weft target drain`: marks the target (or unmarks it, with `stop`); the map carries it
    /// to the metadata servers, which move their files off it.
    fn drain_target(&self, target: TargetId, stop: bool) -> Reply {
        let map = self.cluster_map().map_err(internal)?;
        if map.target(target).is_none() {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("there is no target {target}: `weft target list` shows them"),
            ));
        }
        // A member of a storage mirror group drains its group: the group's files move to
        // other groups (`ClusterMap::slot_placement`).
        let group = map.mirror_group_of_target(target).map(|group| group.id);
        let event = if stop {
            self.store.set_draining(target, None).map_err(internal)?;
            format!("target {target} takes new files again: its drain stopped")
        } else {
            self.store
                .set_draining(target, Some(unix_ms()))
                .map_err(internal)?;
            match group {
                None => format!("target {target} is being drained: new files avoid it and files on it move off"),
                Some(group) => format!("target {target} is being drained: new files avoid its storage mirror group {group}, and files mirrored on the group move to other groups"),
            }
        };
        tracing::info!(%event, "drain");
        self.monitor.event(false, event);
        Ok(Response::Done)
    }

    /// How many files still use `target`, draining since `since` (Unix milliseconds): the sum
    /// of what every metadata node told since then, or why it is not known yet.
    fn drain_progress(
        &self,
        target: TargetId,
        since: u64,
    ) -> Result<Result<u64, String>, MgmtError> {
        let homes = self.cluster_map()?.all_meta_homes();
        let live = self.live.lock().expect("live state poisoned");
        let mut left = 0;
        for home in homes {
            let told = live.target_uses.get(&home).and_then(|(at, uses)| {
                let left = uses.iter().find(|(t, _)| *t == target)?.1;
                (*at >= since).then_some(left)
            });
            match told {
                Some(uses) => left += uses,
                None => {
                    return Ok(Err(format!(
                        "the metadata server of home {home} has not told yet how many of its files use target {target}: wait for its next heartbeat, or bring it back if it is offline"
                    )))
                }
            }
        }
        Ok(Ok(left))
    }

    /// `weft target remove`: removes a drained target, once every metadata node told, since
    /// its drain began, that none of its files use it.
    fn remove_target(&self, target: TargetId) -> Reply {
        let busy = |message: String| Err(WireError::new(ErrorCode::Busy, message));
        let draining = self.store.draining().map_err(internal)?;
        let Some(&since) = draining.get(&target) else {
            return match self.cluster_map().map_err(internal)?.target(target) {
                None => Err(WireError::new(
                    ErrorCode::NotFound,
                    format!("there is no target {target}: `weft target list` shows them"),
                )),
                Some(_) => busy(format!(
                    "target {target} is not drained: `weft target drain {target}` moves its files off first"
                )),
            };
        };
        match self.drain_progress(target, since).map_err(internal)? {
            Ok(0) => {}
            Ok(left) => {
                return busy(format!(
                    "{left} files still use target {target}: their moves go on (`weft target list --state` shows how many are left)"
                ))
            }
            Err(why) => return busy(why),
        }
        // Its storage mirror group holds nothing any more (every file on it moved): it goes
        // with the target, and its other members are free for new groups.
        let group = self
            .cluster_map()
            .map_err(internal)?
            .mirror_group_of_target(target)
            .cloned();
        if let Some(group) = &group {
            // A member that missed changes (the seals of the objects that moved off) would
            // keep them when it joins another group.
            if let Some(behind) = group.members.iter().find(|m| {
                TargetId::from(m.id) != target && m.state != weft_proto::messages::Consistency::Good
            }) {
                return busy(format!(
                    "target {} of storage mirror group {} is {}: the group goes with target {target} once its other members are good (their resync brings them what they missed)",
                    behind.id,
                    group.id,
                    <&str>::from(behind.state)
                ));
            }
            self.mirrors
                .dissolve(&self.store, weft_mirror::GroupId(group.id.0))
                .map_err(internal)?;
        }
        self.store
            .remove_target(target, unix_ms())
            .map_err(internal)?;
        let event = match &group {
            None => format!("target {target} removed from the cluster"),
            Some(group) => {
                let others: Vec<String> = group
                    .members
                    .iter()
                    .filter(|m| TargetId::from(m.id) != target)
                    .map(|m| m.id.to_string())
                    .collect();
                format!(
                    "target {target} removed from the cluster with its storage mirror group {}: targets {} are in no group now (`weft mirror autocreate storage` pairs them again)",
                    group.id,
                    others.join(", ")
                )
            }
        };
        tracing::info!(%event, "drain");
        self.monitor.event(false, event);
        Ok(Response::Done)
    }

    fn cluster_map(&self) -> Result<ClusterMap, MgmtError> {
        let nodes = self.store.nodes()?;
        let targets = self.store.targets()?;
        let draining = self.store.draining()?;
        let mirror_groups = self.mirror_groups(&targets);
        let clients = self.store.clients()?;
        let states = self.quota_states()?;
        let quota_hard = states
            .iter()
            .filter(|state| state.rule.limits.hard_bytes > 0 || state.rule.limits.hard_inodes > 0)
            .map(|state| weft_proto::quota::QuotaHard {
                key: weft_proto::quota::QuotaKey {
                    kind: state.rule.kind,
                    id: state.rule.id,
                    pool: state.rule.pool,
                },
                bytes: state.rule.limits.hard_bytes,
                inodes: state.rule.limits.hard_inodes,
            })
            .collect();
        let quota_blocked = states
            .into_iter()
            .filter(|state| state.bytes_blocked || state.inodes_blocked)
            .map(|state| weft_proto::quota::QuotaBlock {
                kind: state.rule.kind,
                id: state.rule.id,
                pool: state.rule.pool,
                bytes: state.bytes_blocked,
                inodes: state.inodes_blocked,
            })
            .collect();
        // Taken after the quota states, which take it too.
        let live = self.live.lock().expect("live state poisoned");
        let mut map = ClusterMap {
            mirror_groups,
            clients: self.store.client_rules()?,
            pools: self.store.pools()?,
            quota_blocked,
            quota_hard,
            ..ClusterMap::default()
        };
        for (kind, id, record) in nodes {
            let meta = if kind == NodeKind::Meta {
                live.meta_usage.get(&id).copied()
            } else {
                None
            };
            map.nodes.push(NodeInfo {
                id,
                kind,
                alias: record.alias,
                addresses: record.addresses,
                reachability: self.reachability(live.last_heard.get(&(kind, id)).copied()),
                meta_usage: meta.map(|(usage, _)| usage),
                meta_inodes_used: meta.map(|(_, used)| used),
            });
        }
        for (id, record) in targets {
            map.targets.push(weft_proto::messages::TargetInfo {
                id,
                node: record.node,
                pool: record.pool,
                reachability: self.reachability(
                    live.last_heard
                        .get(&(NodeKind::Storage, record.node))
                        .copied(),
                ),
                usage: live.target_usage.get(&id).copied().unwrap_or_default(),
                draining: draining.contains_key(&id),
            });
        }

        // As for nodes, a session counts as heard at management's start after a restart. An
        // expired session is forgotten: the store and the map hold only live ones.
        let (live_sessions, expired): (Vec<ClientId>, Vec<ClientId>) = clients
            .into_iter()
            .partition(|client| self.session_live(&live, *client));
        map.session_owners = self
            .store
            .session_owners()?
            .into_iter()
            .filter(|(id, _)| live_sessions.contains(id))
            .collect();
        map.live_sessions = live_sessions;
        drop(live);
        if !expired.is_empty() {
            self.store.remove_clients(&expired)?;
            let mut live = self.live.lock().expect("live state poisoned");
            for client in &expired {
                live.client_last_heard.remove(client);
                live.client_unserved.remove(client);
            }
            tracing::info!(sessions = expired.len(), "forgot expired client sessions");
        }
        self.stamp(&mut map);
        Ok(map)
    }
}
