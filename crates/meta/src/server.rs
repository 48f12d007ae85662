//! A metadata server process: registration, heartbeats, and the homes it serves.
//!
//! A server serves its own home, unless that home is in a metadata mirror group whose
//! primary is another member; and it serves every other home whose mirror group it is the
//! primary of (after a failover). It keeps a copy of every home whose group it is a
//! secondary of ([`crate::replica`]). After each heartbeat answer it opens the homes it must
//! serve now, stops those it must not, and starts the resyncs it owes as primary.
//!
//! A request names its home ([`MetaRoute`]), which must be the home of what it routes by
//! (its declaration, `WrongHome` otherwise); one for a home not served here, or routed with
//! another group version, is refused with `StaleRoute`, and the sender fetches the map again.

use crate::commit::CommitMetrics;
use crate::replica::{group_of_home, HomeFiles, Replicas};
use crate::schema::{OpError, DISPOSALS, INODES, REMOTE_CREATED, REPLIES};
use crate::service::{Meta, Shared};
use crate::{MetaConfig, MetaError};
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use weft_net::auth::Identity;
use weft_net::mirror::{stale, Membership, Unsynced};
use weft_net::ClusterView;
use weft_net::MgmtCalls;
use weft_proto::error::WireError;
use weft_proto::ids::{GroupVersion, MemberId};
use weft_proto::ids::{NodeId, META_HOME_MAX};
use weft_proto::messages::{
    Consistency, MetaRequest, MetaResponse, MetaRoute, MirrorGroupInfo, MirrorKind, NodeKind,
    Reply, Request,
};
use weft_proto::ErrorCode;
use weft_service::missed::MissedLogs;

/// Heartbeats woken early (a newer mirror group version was seen) come no closer.
const EARLY_GAP: Duration = Duration::from_millis(50);

/// The homes served here, by home.
type Homes = Arc<RwLock<HashMap<NodeId, Arc<Meta>>>>;

struct Server {
    shared: Arc<Shared>,
    homes: Homes,
    replicas: Replicas,
    /// Serialises changes to the set of served homes.
    reconciling: tokio::sync::Mutex<()>,
}

/// Runs a metadata server until `shutdown` completes.
///
/// # Errors
/// [`MetaError`] when the data directory, the store or registration fails.
pub async fn run(
    config: MetaConfig,
    listeners: weft_net::Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MetaError> {
    config.validate().map_err(MetaError::Config)?;
    let admission = config.admission().map_err(MetaError::Config)?;
    let auth = admission.auth.clone();
    let cluster = Arc::new(ClusterView::for_member(config.mgmt.clone(), auth.clone()));
    let weft_service::identity::Registered {
        address,
        alias,
        node,
    } = weft_service::identity::register_listener(
        &config.data_dir,
        cluster.mgmt(),
        NodeKind::Meta,
        config.alias.clone(),
        &listeners,
    )
    .await?;
    if node.0 > META_HOME_MAX {
        return Err(MetaError::NodeIdTooLarge(node));
    }
    let _ = cluster.refresh().await;
    cluster.follow();
    let mut metrics = weft_observe::MetricsBuilder::new("meta", Some(node.0));
    metrics
        .registry()
        .register_collector(Box::new(weft_observe::metrics::MapEpochCollector(
            cluster.epoch_source(),
        )));
    let commit_metrics = CommitMetrics::register(metrics.registry());
    let move_metrics = crate::service::MoveMetrics::register(metrics.registry());
    let homes: Homes = Arc::default();
    register_store_metrics(
        metrics.registry(),
        node,
        &config.data_dir,
        Arc::clone(&homes),
    );
    // Commits answered before their sync (size reports) wait in this process's memory.
    let boot = weft_service::identity::next_boot(&config.data_dir)?;
    let membership = Arc::new(Membership::new(
        boot,
        config.heartbeat_interval,
        Unsynced::InProcess,
    ));
    let missed = Arc::new(MissedLogs::default());
    missed
        .load(&config.data_dir)
        .map_err(|source| MetaError::Io {
            what: "cannot read the records of what absent mirror members missed",
            source,
        })?;
    let files = Arc::new(HomeFiles::default());
    let server = Arc::new(Server {
        replicas: Replicas::new(config.data_dir.clone(), node, Arc::clone(&files)),
        shared: Arc::new(Shared {
            node,
            config: config.clone(),
            cluster,
            membership,
            missed,
            files,
            commit_metrics,
            move_metrics,
        }),
        homes,
        reconciling: tokio::sync::Mutex::new(()),
    });
    // Which homes to serve depends on the mirror groups: none is opened before management
    // has answered a heartbeat.
    while !server.heartbeat(&alias, &address).await {
        tokio::time::sleep(config.heartbeat_interval).await;
    }
    server.reconcile().await?;
    tracing::info!(node = node.0, %address, %alias, metrics = %format!("http://{address}/metrics"), "metadata server serving");
    let heartbeat = tokio::spawn(heartbeat_loop(Arc::clone(&server), alias, address));
    let served = Arc::clone(&server.homes);
    weft_net::serve_with_exporters(
        listeners,
        server,
        metrics.build(),
        config.exporters(),
        admission,
        shutdown,
    )
    .await
    .map_err(|source| MetaError::Io {
        what: "serving requests failed",
        source,
    })?;
    heartbeat.abort();
    for meta in homes_now(&served) {
        meta.flush().await;
        meta.stop();
    }
    Ok(())
}

/// The homes served at this moment.
fn homes_now(homes: &Homes) -> Vec<Arc<Meta>> {
    homes
        .read()
        .expect("home table poisoned")
        .values()
        .cloned()
        .collect()
}

/// The metadata target's space and the number of inodes its served homes hold, read at each
/// scrape.
fn register_store_metrics(
    registry: &mut prometheus_client::registry::Registry,
    node: NodeId,
    data_dir: &std::path::Path,
    homes: Homes,
) {
    let data_dir = data_dir.to_path_buf();
    registry.register_collector(Box::new(weft_observe::metrics::SpaceCollector(Box::new(
        move || {
            let usage = weft_service::usage::file_system_usage(&data_dir).unwrap_or_default();
            vec![(node.0.to_string(), usage)]
        },
    ))));
    registry.register_collector(Box::new(HomeCollector(homes)));
}

/// Counts something a served home holds.
type Count = fn(&Meta) -> Result<u64, OpError>;

/// Exports how many inodes, step markers and stored replies the served homes hold.
struct HomeCollector(Homes);

impl std::fmt::Debug for HomeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HomeCollector")
    }
}

impl prometheus_client::collector::Collector for HomeCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let homes = homes_now(&self.0);
        let gauges: [(&str, &str, Count); 4] = [
            (
                "weft_meta_inodes",
                "Inodes (files, directories, links) of the homes this metadata server serves.",
                |meta| meta.entries(INODES),
            ),
            (
                "weft_meta_step_markers",
                "Markers of other homes' cross-server operations (mkdir, link, rename) kept by \
                 the homes this server serves so that no step runs twice; each goes once its \
                 operation finished.",
                |meta| meta.entries(REMOTE_CREATED),
            ),
            (
                "weft_meta_stored_replies",
                "Replies kept for client sessions' retries by the homes this server serves; a \
                 session's go as its later requests settle them, all of them when it expires.",
                |meta| meta.entries(REPLIES),
            ),
            (
                "weft_meta_disposals_queued",
                "Removed files whose objects the homes this server serves have still to remove \
                 from their targets (a file that never had data has none to remove).",
                |meta| meta.entries(DISPOSALS.definition()),
            ),
        ];
        for (name, help, count) in gauges {
            let total = total(&homes, count);
            let metric = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            prometheus_client::metrics::gauge::ConstGauge::new(total as i64).encode(metric)?;
        }
        let mut usage = Vec::new();
        for meta in homes.iter() {
            if let Ok(rows) = meta.quota_usage() {
                weft_proto::quota::add_usage(&mut usage, &rows);
            }
        }
        let columns: [weft_observe::metrics::Column<weft_proto::quota::QuotaUsage>; 2] = [
            (
                "weft_quota_used_bytes",
                "Bytes of files (their sizes) each user and group has in each storage pool, in \
                 the homes this metadata server serves.",
                |row| row.bytes,
            ),
            (
                "weft_quota_used_inodes",
                "Inodes each user and group has in each storage pool, in the homes this \
                 metadata server serves.",
                |row| row.inodes,
            ),
        ];
        for (name, help, value) in columns {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for row in &usage {
                let (id, pool) = (row.id.to_string(), row.pool.to_string());
                let labels = [
                    ("kind", <&str>::from(row.kind)),
                    ("id", id.as_str()),
                    ("pool", pool.as_str()),
                ];
                prometheus_client::metrics::gauge::ConstGauge::new(value(row) as i64)
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// What `count` counts over `homes`, skipping a home that cannot be read.
fn total(homes: &[Arc<Meta>], count: Count) -> u64 {
    homes.iter().filter_map(|meta| count(meta).ok()).sum()
}

fn inode_count(homes: &Homes) -> u64 {
    total(&homes_now(homes), |meta| meta.entries(INODES))
}

async fn heartbeat_loop(server: Arc<Server>, alias: String, address: String) {
    let interval = server.shared.config.heartbeat_interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = server.shared.membership.wake.notified() => tokio::time::sleep(EARLY_GAP).await,
        }
        server.heartbeat(&alias, &address).await;
        if let Err(error) = server.reconcile().await {
            tracing::error!(%error, "could not change the homes served here");
        }
        let fetch_started = Instant::now();
        if let Ok(map) = server
            .shared
            .cluster
            .refresh_within(weft_net::stubs::HEARTBEAT_DEADLINE)
            .await
        {
            for meta in homes_now(&server.homes) {
                meta.after_map(&map, fetch_started);
                // Quota grants held past their need go back, off the heartbeat's path.
                tokio::spawn(async move { meta.return_spare_grants().await });
            }
        }
    }
}

impl Server {
    fn node(&self) -> NodeId {
        self.shared.node
    }

    /// Sends one heartbeat and adopts the answer; false when management did not answer.
    async fn heartbeat(self: &Arc<Self>, alias: &str, address: &str) -> bool {
        let shared = &self.shared;
        let mgmt = shared.cluster.mgmt();
        let usage = weft_service::usage::file_system_usage(&shared.config.data_dir).ok();
        // No count before a home is open: management keeps the last one.
        let serving = !self.homes.read().expect("home table poisoned").is_empty();
        let inodes = serving.then(|| inode_count(&self.homes));
        let homes = homes_now(&self.homes);
        let quota_usage = homes
            .iter()
            .filter_map(|meta| Some((meta.home(), meta.quota_usage().ok()?)))
            .collect();
        // Per home, the draining targets it looked for.
        let draining: Vec<weft_proto::ids::TargetId> = shared
            .cluster
            .map()
            .targets
            .iter()
            .filter(|target| target.draining)
            .map(|target| target.id)
            .collect();
        let target_uses = homes
            .iter()
            .map(|meta| {
                let uses = draining
                    .iter()
                    .filter_map(|&target| Some((target, meta.drain_uses(target)?)))
                    .collect();
                (meta.home(), uses)
            })
            .collect();
        let drain_blocked = homes
            .iter()
            .map(|meta| (meta.home(), meta.drain_blocked()))
            .filter(|(_, blocked)| !blocked.is_empty())
            .collect();
        let sent = Instant::now();
        let report = weft_net::stubs::MetaReport {
            usage,
            inodes_used: inodes,
            quota_usage,
            target_uses,
            drain_blocked,
        };
        match mgmt
            .heartbeat(
                (NodeKind::Meta, shared.node),
                Vec::new(),
                report,
                Some(shared.membership.report()),
                shared.membership.heartbeat_deadline(),
            )
            .await
        {
            Ok((lease_ms, groups)) => {
                let node = MemberId::from(shared.node);
                let adopted = shared.membership.adopt(
                    sent,
                    Duration::from_millis(lease_ms),
                    groups,
                    |member| member == node,
                    |adopted| {
                        shared
                            .missed
                            .follow(adopted, |_| Some(shared.config.data_dir.clone()));
                    },
                );
                for start in adopted.starts {
                    let server = Arc::clone(self);
                    tokio::spawn(async move {
                        let outcome = server.resync(start).await;
                        server.shared.membership.resync_ended(start, &outcome);
                    });
                }
                true
            }
            Err(error) if error.code() == ErrorCode::UnknownNode => {
                tracing::warn!("management does not know this node; registering again");
                let _ = mgmt
                    .register_node(
                        Some(shared.node),
                        NodeKind::Meta,
                        alias.to_string(),
                        weft_net::rails(address).map(str::to_string).collect(),
                    )
                    .await;
                false
            }
            Err(error) => {
                tracing::warn!(%error, "heartbeat failed");
                false
            }
        }
    }

    /// Copies the store of the home of `start`'s group to its member.
    async fn resync(&self, start: weft_net::mirror::ResyncStart) -> Result<(), WireError> {
        let group = self
            .shared
            .membership
            .group(start.group)
            .ok_or_else(|| stale(format!("mirror group {} is gone", start.group)))?;
        let home = NodeId::from(group.members.first().map_or(MemberId(0), |m| m.id));
        // The home opens after the heartbeat that made this server its primary.
        let meta = loop {
            if let Some(meta) = self.served(home) {
                break meta;
            }
            self.shared
                .membership
                .resync_version(MemberId::from(self.node()), start)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        meta.resync(start).await
    }

    fn served(&self, home: NodeId) -> Option<Arc<Meta>> {
        self.homes
            .read()
            .expect("home table poisoned")
            .get(&home)
            .cloned()
    }

    /// The homes this server must serve under the groups it knows: its own unless another
    /// member of its group is primary, and those of the groups it is primary of.
    fn wanted(&self, groups: &[MirrorGroupInfo]) -> Vec<NodeId> {
        let node = self.node();
        let mut wanted = Vec::new();
        if group_of_home(groups, node).is_none_or(|g| g.primary == MemberId::from(node)) {
            wanted.push(node);
        }
        for group in groups {
            if group.kind != MirrorKind::Meta || group.primary != MemberId::from(node) {
                continue;
            }
            if let Some(first) = group.members.first() {
                if first.id != MemberId::from(node) {
                    wanted.push(NodeId::from(first.id));
                }
            }
        }
        wanted
    }

    /// Opens the homes this server must serve now and stops the others; a home whose store
    /// failed to ship its changes is opened again.
    async fn reconcile(&self) -> Result<(), MetaError> {
        let _one = self.reconciling.lock().await;
        let groups = self.shared.membership.groups();
        let wanted = self.wanted(&groups);
        let served: Vec<(NodeId, Arc<Meta>)> = self
            .homes
            .read()
            .expect("home table poisoned")
            .iter()
            .map(|(home, meta)| (*home, Arc::clone(meta)))
            .collect();
        for (home, meta) in served {
            if !wanted.contains(&home) || meta.broken() {
                tracing::info!(
                    home = home.0,
                    broken = meta.broken(),
                    "metadata home no longer served here"
                );
                self.stop(home);
            }
        }
        for home in wanted {
            if self.served(home).is_some() {
                continue;
            }
            // A copy is served only once it is complete.
            if let Some(group) = group_of_home(&groups, home) {
                let good = group
                    .members
                    .iter()
                    .any(|m| m.id == MemberId::from(self.node()) && m.state == Consistency::Good);
                if !good {
                    continue;
                }
            }
            // Under the file's lock: a primary's send admitted before this server became
            // primary has written its copy by now, and a later one is refused, since the map
            // says so. (Not held while the store opens: its syncs take it.)
            self.replicas.writing(home, || self.replicas.close(home));
            let shared = Arc::clone(&self.shared);
            let meta = tokio::task::spawn_blocking(move || Meta::start(home, &shared))
                .await
                .map_err(|source| MetaError::Store {
                    home,
                    source: Box::new(source),
                })??;
            tracing::info!(home = home.0, "metadata home served here");
            self.homes
                .write()
                .expect("home table poisoned")
                .insert(home, meta);
        }
        Ok(())
    }

    fn stop(&self, home: NodeId) {
        let meta = self
            .homes
            .write()
            .expect("home table poisoned")
            .remove(&home);
        if let Some(meta) = meta {
            meta.stop();
        }
    }

    /// Whether `meta` no longer serves `home` here: its mirror group made another member
    /// primary, or this server stopped the home's store.
    fn home_moved(&self, home: NodeId, meta: &Arc<Meta>) -> bool {
        let primary_elsewhere = group_of_home(&self.shared.membership.groups(), home)
            .is_some_and(|group| group.primary != MemberId::from(self.node()));
        primary_elsewhere || self.served(home).is_none_or(|now| !Arc::ptr_eq(&now, meta))
    }

    /// Checks a request's route: its home is served here, under the version it was routed
    /// with.
    fn admit(&self, route: MetaRoute) -> Result<Arc<Meta>, WireError> {
        let membership = &self.shared.membership;
        let group = group_of_home(&membership.groups(), route.home).cloned();
        match group {
            Some(group) => {
                membership.admit_primary(MemberId::from(self.node()), group.id, route.version)?;
            }
            None if route.version != GroupVersion(0) => {
                membership.wake.notify_one();
                return Err(stale(format!(
                    "metadata home {} has no mirror group here, the request was routed with version {}",
                    route.home, route.version
                )));
            }
            None => {}
        }
        self.served(route.home).ok_or_else(|| {
            stale(format!(
                "metadata home {} is not served by metadata node {}",
                route.home,
                self.node()
            ))
        })
    }

    /// Applies changes a primary shipped to this member's copy.
    fn apply(&self, request: &MetaRequest, payload: &Bytes) -> Result<MetaResponse, WireError> {
        let MetaRequest::ReplicaApply {
            group,
            version,
            link,
            sequence,
            changes,
            sync,
        } = request
        else {
            return Err(WireError::new(ErrorCode::Internal, "not a shipped change"));
        };
        let membership = &self.shared.membership;
        let home = membership
            .group(*group)
            .and_then(|g| g.members.first().map(|m| NodeId::from(m.id)))
            .ok_or_else(|| stale(format!("mirror group {group} is not known here")))?;
        // Admitted and written under the file's lock: a link of this server fenced a moment
        // ago writes nothing after it, and once the map says this server is primary no send
        // of its old primary is admitted any more.
        self.replicas.writing(home, || {
            membership.admit_forward(MemberId::from(self.node()), *group, *version)?;
            // A member serves no home it receives a copy of.
            if self.served(home).is_some() {
                self.stop(home);
            }
            self.replicas
                .apply(home, (*version, *link, *sequence), changes, payload, *sync)?;
            Ok(MetaResponse::Done)
        })
    }
}

impl weft_net::Handler for Server {
    type Response = MetaResponse;

    async fn handle(
        &self,
        from: Identity,
        request: Request,
        payload: Bytes,
    ) -> (Reply<MetaResponse>, Bytes) {
        let checks = match self.shared.cluster.admit_client(&from, &request).await {
            Ok(checks) => checks,
            Err(error) => return (Err(error), Bytes::new()),
        };
        let reply = match request {
            Request::Meta(_, request @ MetaRequest::ReplicaApply { .. }, _) => {
                // The copy is written and synced in place: a short blocking section.
                tokio::task::block_in_place(|| self.apply(&request, &payload))
            }
            Request::Meta(route, request, _) => {
                let (op, fits): (&str, _) = ((&request).into(), request.answer_fits());
                let reply = self.serve_home(route, request, checks).await;
                weft_proto::answer::debug_check(
                    op,
                    |response: &MetaResponse| fits(response.answer()),
                    &reply,
                );
                reply
            }
            other => Err(WireError::new(
                ErrorCode::WrongService,
                format!("a metadata server does not serve {other:?}"),
            )),
        };
        (reply, Bytes::new())
    }
}

impl Server {
    /// Serves a request for the home `route` names.
    async fn serve_home(
        &self,
        route: MetaRoute,
        request: MetaRequest,
        checks: weft_proto::access::Checks,
    ) -> Reply<MetaResponse> {
        // A request that routes by an inode goes to its home: one sent elsewhere would be
        // answered as if the inode did not exist.
        if let Some(home) = request.route().home().filter(|home| *home != route.home) {
            let op: &str = (&request).into();
            return Err(WireError::new(
                ErrorCode::WrongHome,
                format!(
                    "{op} routes to metadata home {home}, but was sent to home {}",
                    route.home
                ),
            ));
        }
        match self.admit(route) {
            Ok(meta) => match meta.serve(request, checks).await {
                // A change whose commit failed because its mirror group made another
                // member primary meanwhile, or because this server's lease ran out before
                // the change reached the members, was never acknowledged: the client asks
                // again, at the group's primary once it has one (a retry of one that did
                // reach the file is answered from its stored reply).
                Err(error)
                    if error.code == ErrorCode::Io
                        && (self.home_moved(route.home, &meta) || self.admit(route).is_err()) =>
                {
                    Err(stale(format!(
                        "metadata home {} could not finish the change here (its group moved \
                             on, or this server's lease ran out): {}",
                        route.home, error.message
                    )))
                }
                // An answer newer than its peer speaks becomes the older one it adds to.
                reply => reply.map(|answer| answer.spoken_to(weft_net::server::peer_version())),
            },
            Err(error) => Err(error),
        }
    }
}
