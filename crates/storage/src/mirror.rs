//! Storage mirror groups on a storage server: which of its targets are members of which
//! group in which version, the primary's lease, and the primary's work: ordering changes to an
//! object, forwarding them to every present member before answering, and bringing returning
//! members up to date (resync).
//!
//! The rules are those of the `weft-mirror` state machines, which the simulator checks:
//! - a request carries the group version it was routed with; a member that knows another
//!   version refuses it ([`ErrorCode::StaleRoute`]) and the sender fetches the map again;
//! - the primary serves only while its lease holds (management grants it in heartbeat
//!   answers, ending before management may promote anyone else);
//! - changes to overlapping ranges of one object are applied and forwarded one after the
//!   other, so every member applies them in the same order; a change is answered only once
//!   every present member has it;
//! - a member that stops acknowledging is reported unreachable; management takes it out of
//!   the group under a new version, and the primary stops waiting for it;
//! - a member in `needs-resync` gets new changes and, in the background, a copy of every
//!   object (each copied under the object's range lock, so no newer change is overwritten),
//!   then loses the objects the primary does not have, then is reported resynced.
//!
//! Every resync copies everything: a member that was away briefly gets a full copy too.

use crate::missed::MissedLogs;
use crate::target::Target;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_net::{ClusterView, RpcError};
use weft_proto::error::WireError;
use weft_proto::ids::{InodeId, TargetId};
use weft_proto::messages::{
    Consistency, GroupMember, MirrorGroupInfo, MirrorHeartbeat, MirrorRoute, Response,
    ResyncProgress, Route, StorageRequest, IO_BYTES_MAX, OBJECTS_PER_LIST_MAX,
};
use weft_proto::ErrorCode;

/// Pause between attempts to reach a member.
const FORWARD_RETRY: Duration = Duration::from_millis(100);

fn stale(message: String) -> WireError {
    WireError::new(ErrorCode::StaleRoute, message)
}

/// What a storage server's mirror side counts, for Prometheus.
#[derive(Clone, Default)]
pub(crate) struct MirrorMetrics {
    forwards: Counter,
    forward_retries: Counter,
    resync_objects: Counter,
    resync_bytes: Counter,
}

impl MirrorMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> MirrorMetrics {
        let metrics = MirrorMetrics::default();
        registry.register(
            "weft_mirror_forwards",
            "Changes this server forwarded as primary to a mirror member (each member counts)",
            metrics.forwards.clone(),
        );
        registry.register(
            "weft_mirror_forward_retries",
            "Forwards sent again because a member did not take them",
            metrics.forward_retries.clone(),
        );
        registry.register(
            "weft_mirror_resync_objects",
            "Objects this server copied (or removed) on returning mirror members",
            metrics.resync_objects.clone(),
        );
        registry.register(
            "weft_mirror_resync_bytes",
            "Bytes this server copied to returning mirror members",
            metrics.resync_bytes.clone(),
        );
        metrics
    }
}

/// What the server knows of its groups.
#[derive(Default)]
struct State {
    /// Groups with a member on this server, as last heard from management.
    groups: HashMap<u32, MirrorGroupInfo>,
    /// A primary serves until then.
    lease_until: Option<Instant>,
    /// Members a forward has not reached, since when: (group, member).
    failing: HashMap<(u32, u32), Instant>,
    /// Resyncs running: (group, member) → the version they run in.
    resyncs: HashMap<(u32, u32), u64>,
    /// Resyncs finished, reported until management marks the member good.
    resynced: HashSet<GroupMember>,
    /// Progress of the resyncs running or finished, by (group, member), with their start.
    progress: HashMap<(u32, u32), (ResyncProgress, Instant)>,
}

/// The mirror side of a storage server.
pub(crate) struct Mirror {
    boot: u64,
    interval: Duration,
    cluster: Arc<ClusterView>,
    targets: HashMap<TargetId, Arc<Target>>,
    state: Mutex<State>,
    ranges: RangeLocks,
    missed: Arc<MissedLogs>,
    metrics: MirrorMetrics,
    /// Wakes the heartbeat loop early: a request showed that a newer map exists.
    pub wake: tokio::sync::Notify,
}

impl Mirror {
    /// The mirror side of a server with `targets`, with the records of what absent members
    /// miss that the targets keep.
    ///
    /// # Errors
    /// When a record cannot be read: without it a returning member could miss data.
    pub fn new(
        cluster: Arc<ClusterView>,
        targets: HashMap<TargetId, Arc<Target>>,
        interval: Duration,
        metrics: MirrorMetrics,
    ) -> std::io::Result<Mirror> {
        let missed = Arc::new(MissedLogs::default());
        for target in targets.values() {
            missed.load(target.root())?;
        }
        // Differs on every start, so management tells a restart from a late heartbeat.
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id());
        Ok(Mirror {
            boot,
            interval,
            cluster,
            targets,
            state: Mutex::default(),
            ranges: RangeLocks::default(),
            missed,
            metrics,
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Starts recording what members miss that left `group` in sync while this server stayed
    /// its primary; drops the records of a group this server no longer leads.
    fn track_missed(&self, before: Option<&MirrorGroupInfo>, group: &MirrorGroupInfo) {
        let Some(primary) = self.targets.get(&TargetId(group.primary)) else {
            self.missed.forget_group(group.id);
            return;
        };
        let was_primary = before.is_some_and(|b| b.primary == group.primary);
        for member in &group.members {
            if member.id == group.primary || member.state != Consistency::Bad {
                continue;
            }
            let was_good = before
                .and_then(|b| b.members.iter().find(|m| m.id == member.id))
                .is_some_and(|m| m.state == Consistency::Good);
            if was_primary && was_good {
                if let Err(error) = self.missed.start(primary.root(), group.id, member.id) {
                    // Without a record the member is copied in full when it comes back.
                    tracing::error!(group = group.id, member = member.id, %error, "cannot record what a mirror member misses");
                }
            }
        }
    }

    /// This process's boot id: changes on every start.
    pub fn boot(&self) -> u64 {
        self.boot
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("mirror state poisoned")
    }

    /// A forward unacknowledged this long makes its member unreachable.
    fn member_timeout(&self) -> Duration {
        (self.interval * 2).max(Duration::from_secs(1))
    }

    /// What the next heartbeat tells management.
    pub fn report(&self) -> MirrorHeartbeat {
        let state = self.state();
        let timeout = self.member_timeout();
        let unreachable = state
            .failing
            .iter()
            .filter(|(_, since)| since.elapsed() >= timeout)
            .filter_map(|((group, member), _)| {
                let known = state.groups.get(group)?;
                Some((*group, known.version, *member))
            })
            .collect();
        MirrorHeartbeat {
            boot: self.boot,
            interval_ms: self.interval.as_millis() as u64,
            resynced: state.resynced.iter().copied().collect(),
            unreachable,
            resyncs: state
                .progress
                .values()
                .map(|(progress, started)| ResyncProgress {
                    elapsed_ms: started.elapsed().as_millis() as u64,
                    ..*progress
                })
                .collect(),
        }
    }

    /// Takes management's answer to a heartbeat sent at `sent`: the lease, and the groups
    /// (newer versions replace older ones). Starts the resyncs this server must run as
    /// primary.
    pub fn adopt(self: &Arc<Self>, sent: Instant, lease: Duration, groups: Vec<MirrorGroupInfo>) {
        let mut starts = Vec::new();
        {
            let mut state = self.state();
            let until = sent + lease;
            state.lease_until = Some(state.lease_until.map_or(until, |known| known.max(until)));
            for group in groups {
                let newer = state
                    .groups
                    .get(&group.id)
                    .is_none_or(|known| known.version < group.version);
                if newer {
                    tracing::info!(
                        group = group.id,
                        version = group.version,
                        primary = group.primary,
                        "mirror group version adopted"
                    );
                    let before = state.groups.insert(group.id, group.clone());
                    self.track_missed(before.as_ref(), &group);
                }
            }
            let State {
                groups,
                resyncs,
                resynced,
                failing,
                progress,
                ..
            } = &mut *state;
            // Progress is kept while the member still needs it or the resync's version holds.
            progress.retain(|(group, member), (p, _)| {
                groups.get(group).is_some_and(|g| {
                    g.members
                        .iter()
                        .any(|m| m.id == *member && m.state == Consistency::NeedsResync)
                        && (g.version == p.version || !p.done)
                })
            });
            // Reports management has acted on are dropped.
            resynced.retain(|(group, version, member)| {
                groups.get(group).is_some_and(|g| {
                    g.version == *version
                        || g.members
                            .iter()
                            .any(|m| m.id == *member && m.state == Consistency::NeedsResync)
                })
            });
            failing.retain(|(group, member), _| {
                groups.get(group).is_some_and(|g| {
                    g.members
                        .iter()
                        .any(|m| m.id == *member && m.state != Consistency::Bad)
                })
            });
            for group in groups.values() {
                if !self.targets.contains_key(&TargetId(group.primary)) {
                    continue;
                }
                for member in &group.members {
                    let key = (group.id, member.id);
                    let wanted = member.state == Consistency::NeedsResync
                        && member.id != group.primary
                        && !resynced.contains(&(group.id, group.version, member.id));
                    if wanted && resyncs.get(&key) != Some(&group.version) {
                        resyncs.insert(key, group.version);
                        starts.push((group.id, group.version, member.id));
                    }
                }
            }
        }
        for (group, version, member) in starts {
            let mirror = Arc::clone(self);
            tokio::spawn(async move {
                let outcome = mirror.resync(group, version, member).await;
                let mut state = mirror.state();
                if state.resyncs.get(&(group, member)) == Some(&version) {
                    state.resyncs.remove(&(group, member));
                }
                match outcome {
                    Ok(()) => {
                        tracing::info!(group, version, member, "member resynced");
                        state.resynced.insert((group, version, member));
                        if let Some((progress, _)) = state.progress.get_mut(&(group, member)) {
                            progress.done = true;
                        }
                        drop(state);
                        mirror.wake.notify_one();
                    }
                    Err(error) => {
                        tracing::info!(group, version, member, %error, "resync stopped; it starts again with the next version");
                    }
                }
            });
        }
    }

    /// Checks a request routed to `target` as primary of its group; returns the group.
    ///
    /// # Errors
    /// `StaleRoute` when the route's version is not the one known, this target is not the
    /// primary, or the lease ran out.
    pub fn admit_primary(
        &self,
        target: TargetId,
        route: MirrorRoute,
    ) -> Result<MirrorGroupInfo, WireError> {
        let state = self.state();
        let Some(group) = state.groups.get(&route.group) else {
            self.wake.notify_one();
            return Err(stale(format!(
                "mirror group {} is not known on this server yet",
                route.group
            )));
        };
        if group.version != route.version {
            if route.version > group.version {
                self.wake.notify_one();
            }
            return Err(stale(format!(
                "mirror group {} is at version {} here, the request was routed with {}",
                route.group, group.version, route.version
            )));
        }
        if group.primary != target.0 {
            return Err(stale(format!(
                "target {target} is not the primary of mirror group {} (target {} is)",
                route.group, group.primary
            )));
        }
        if state
            .lease_until
            .is_none_or(|until| Instant::now() >= until)
        {
            self.wake.notify_one();
            return Err(stale(format!(
                "the lease of mirror group {}'s primary ran out: management has not answered lately",
                route.group
            )));
        }
        Ok(group.clone())
    }

    /// Checks a change forwarded to member `target` by its primary.
    ///
    /// # Errors
    /// `StaleRoute` when the version differs or `target` is not a present member.
    pub fn admit_forward(&self, target: TargetId, route: MirrorRoute) -> Result<(), WireError> {
        let state = self.state();
        let group = state.groups.get(&route.group);
        let known = group.map_or(0, |g| g.version);
        if known != route.version {
            if route.version > known {
                self.wake.notify_one();
            }
            return Err(stale(format!(
                "mirror group {} is at version {known} here, the forward carries {}",
                route.group, route.version
            )));
        }
        let present = group.is_some_and(|g| {
            g.primary != target.0
                && g.members
                    .iter()
                    .any(|m| m.id == target.0 && m.state != Consistency::Bad)
        });
        if present {
            Ok(())
        } else {
            Err(stale(format!(
                "target {target} is no present secondary of mirror group {} in version {known}",
                route.group
            )))
        }
    }

    /// Holds changes to `range` of the object of `inode` on `target` that overlap it until
    /// the guard drops.
    pub async fn lock_range(
        &self,
        target: TargetId,
        inode: InodeId,
        range: Range<u64>,
    ) -> RangeGuard<'_> {
        self.ranges.lock((target, inode), range).await
    }

    /// Sends a change the primary `target` applied to every present member of `group`, and
    /// waits until each has it or has left the group.
    ///
    /// # Errors
    /// `StaleRoute` when this target stopped being the group's primary meanwhile: the client
    /// sends the change again to the new primary.
    pub async fn forward(
        &self,
        target: TargetId,
        group: u32,
        request: &StorageRequest,
        payload: &Bytes,
    ) -> Result<(), WireError> {
        let members = self.present_secondaries(group);
        let sends = members.into_iter().map(|member| async move {
            let mut first_failure: Option<Instant> = None;
            loop {
                let Some(route) = self.route_to_member(target, group, member)? else {
                    return Ok(());
                };
                let forward = request.clone().rerouted(route);
                if first_failure.is_some() {
                    self.metrics.forward_retries.inc();
                }
                match self.send(member, forward, payload.clone()).await {
                    Ok(_) => {
                        self.metrics.forwards.inc();
                        self.state().failing.remove(&(group, member));
                        return Ok(());
                    }
                    Err(error) => {
                        if first_failure.is_none() {
                            tracing::warn!(group, member, %error, "a mirror member did not take a change; trying again");
                        }
                        let since = *first_failure.get_or_insert_with(Instant::now);
                        if !error.is_retryable() || since.elapsed() >= self.member_timeout() {
                            self.state().failing.entry((group, member)).or_insert(since);
                        }
                        tokio::time::sleep(FORWARD_RETRY).await;
                    }
                }
            }
        });
        for result in futures::future::join_all(sends).await {
            result?;
        }
        // Members that left miss this change: recorded before it is answered.
        if let Some((inode, _)) = request.changed_range(payload.len()) {
            if self.missed.any(group) {
                let missed = Arc::clone(&self.missed);
                let noted = tokio::task::spawn_blocking(move || missed.note(group, inode))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?;
                noted.map_err(|error| {
                    WireError::new(
                        ErrorCode::Io,
                        format!("cannot record what an absent mirror member misses: {error}"),
                    )
                })?;
            }
        }
        Ok(())
    }

    /// The members other than the primary that get changes now.
    fn present_secondaries(&self, group: u32) -> Vec<u32> {
        self.state().groups.get(&group).map_or(Vec::new(), |g| {
            g.members
                .iter()
                .filter(|m| m.id != g.primary && m.state != Consistency::Bad)
                .map(|m| m.id)
                .collect()
        })
    }

    /// The route of a forward from primary `target` to `member` in the current version;
    /// `None` when the member left the group.
    ///
    /// # Errors
    /// `StaleRoute` when `target` is no longer the primary.
    fn route_to_member(
        &self,
        target: TargetId,
        group: u32,
        member: u32,
    ) -> Result<Option<Route>, WireError> {
        let state = self.state();
        let Some(known) = state.groups.get(&group) else {
            return Err(stale(format!("mirror group {group} is gone")));
        };
        if known.primary != target.0 {
            return Err(stale(format!(
                "target {target} stopped being the primary of mirror group {group}"
            )));
        }
        if state
            .lease_until
            .is_none_or(|until| Instant::now() >= until)
        {
            // Management may promote another member soon: stop waiting for this one.
            return Err(stale(format!(
                "the lease of mirror group {group}'s primary ran out while a member was unreachable"
            )));
        }
        let present = known
            .members
            .iter()
            .any(|m| m.id == member && m.state != Consistency::Bad);
        Ok(present.then_some(Route {
            target: TargetId(member),
            mirror: Some(MirrorRoute {
                group,
                version: known.version,
                forwarded: true,
            }),
        }))
    }

    /// Sends one request to the server of `member`.
    async fn send(
        &self,
        member: u32,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(Response, Bytes), RpcError> {
        let result = async {
            let client = self.cluster.storage_for_target(TargetId(member)).await?;
            // A member cut off the network answers nothing: give up in time to report it.
            let timeout = self.member_timeout();
            match tokio::time::timeout(timeout, client.send(request, payload)).await {
                Ok(result) => result,
                Err(_) => Err(RpcError::Timeout {
                    address: format!("storage target {member}"),
                    timeout,
                }),
            }
        }
        .await;
        if result.as_ref().is_err_and(RpcError::is_retryable) {
            self.cluster
                .refresh_if_older(Duration::from_millis(500))
                .await;
        }
        result
    }

    /// Brings `member` of `group` up to date from this server's target, the group's primary
    /// in `version`. When management says the member left in sync and this server recorded
    /// what it missed, only those objects are copied (or removed); otherwise every object is
    /// copied and then the member's objects the primary lacks are removed. Each object is
    /// copied under its range lock, so no newer change is overwritten.
    async fn resync(&self, group: u32, version: u64, member: u32) -> Result<(), WireError> {
        let (primary, full) = {
            let state = self.state();
            let known = state
                .groups
                .get(&group)
                .ok_or_else(|| stale("gone".into()))?;
            let full = known
                .members
                .iter()
                .find(|m| m.id == member)
                .is_none_or(|m| m.full_resync);
            (TargetId(known.primary), full)
        };
        let target = self
            .targets
            .get(&primary)
            .cloned()
            .ok_or_else(|| stale(format!("target {primary} is not on this server")))?;
        let recorded = if full {
            None
        } else {
            self.missed.recorded(group, member)
        };
        let incremental = recorded.is_some();
        let objects: Vec<InodeId> = match recorded {
            Some(inodes) => inodes,
            None => {
                // A record of what it missed does not cover a full copy.
                self.missed.forget(group, member);
                let listing = Arc::clone(&target);
                tokio::task::spawn_blocking(move || listing.list_objects(None, 0, u32::MAX))
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??
                    .0
                    .into_iter()
                    .map(|(inode, _)| inode)
                    .collect()
            }
        };
        tracing::info!(
            group,
            version,
            member,
            full = !incremental,
            objects = objects.len(),
            "resync started"
        );
        self.state().progress.insert(
            (group, member),
            (
                ResyncProgress {
                    group,
                    member,
                    version,
                    objects_total: objects.len() as u64,
                    objects_copied: 0,
                    bytes_copied: 0,
                    elapsed_ms: 0,
                    done: false,
                    full: !incremental,
                },
                Instant::now(),
            ),
        );
        let mut copied = 0u64;
        for inode in &objects {
            let bytes = if target.exists(*inode) {
                self.copy_object(&target, group, version, member, *inode)
                    .await?
            } else {
                // Removed since the member left.
                self.remove_if_gone(&target, group, version, member, *inode)
                    .await?;
                0
            };
            copied += 1;
            self.metrics.resync_objects.inc();
            self.metrics.resync_bytes.inc_by(bytes);
            if let Some((progress, _)) = self.state().progress.get_mut(&(group, member)) {
                if progress.version == version {
                    progress.objects_copied += 1;
                    progress.bytes_copied += bytes;
                }
            }
        }
        if incremental {
            self.missed.forget(group, member);
            tracing::info!(
                group,
                version,
                member,
                objects = copied,
                "resync copied what the member missed"
            );
            return Ok(());
        }
        // Objects the member holds and the primary does not.
        let mut after = 0;
        loop {
            let route = self.resync_route(primary, group, version, member)?;
            let request = StorageRequest::ListObjects {
                target: route.target,
                home: None,
                after,
                max: OBJECTS_PER_LIST_MAX,
            };
            let (response, _) = self
                .send(member, request, Bytes::new())
                .await
                .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
            let Response::Objects { objects, end } = response else {
                return Err(WireError::new(
                    ErrorCode::Internal,
                    "a member answered a listing with something else",
                ));
            };
            for (inode, _) in &objects {
                self.remove_if_gone(&target, group, version, member, *inode)
                    .await?;
            }
            after = objects.last().map_or(after, |(inode, _)| inode.0);
            if end {
                break;
            }
        }
        tracing::info!(group, version, member, objects = copied, "resync copied");
        Ok(())
    }

    /// The route of a resync step; fails once the resync's version is over.
    fn resync_route(
        &self,
        primary: TargetId,
        group: u32,
        version: u64,
        member: u32,
    ) -> Result<Route, WireError> {
        let route = self.route_to_member(primary, group, member)?;
        match route {
            Some(route) if route.mirror.is_some_and(|m| m.version == version) => Ok(route),
            _ => Err(stale(format!(
                "mirror group {group} left version {version}"
            ))),
        }
    }

    /// One resync step, tried until it lands or the resync's version is over.
    async fn send_step(
        &self,
        member: u32,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(), WireError> {
        let started = Instant::now();
        loop {
            match self.send(member, request.clone(), payload.clone()).await {
                Ok(_) => return Ok(()),
                Err(error) if started.elapsed() < self.member_timeout() => {
                    tracing::debug!(member, %error, "resync step failed; trying again");
                    tokio::time::sleep(FORWARD_RETRY).await;
                }
                Err(error) => {
                    return Err(WireError::new(ErrorCode::Unavailable, error.to_string()))
                }
            }
        }
    }

    /// Removes the object of `inode` from the member unless the primary holds it, checked
    /// under the object's range lock so a concurrent create is not undone.
    async fn remove_if_gone(
        &self,
        target: &Target,
        group: u32,
        version: u64,
        member: u32,
        inode: InodeId,
    ) -> Result<(), WireError> {
        let _held = self.lock_range(target.id, inode, 0..u64::MAX).await;
        if target.exists(inode) {
            return Ok(());
        }
        let route = self.resync_route(target.id, group, version, member)?;
        let remove = StorageRequest::Remove {
            target: route.target,
            mirror: route.mirror,
            inode,
        };
        self.send_step(member, remove, Bytes::new()).await
    }

    /// Copies one object to the member: cut to the primary's length, every byte written, then
    /// synced. Changes to the object wait meanwhile. Returns the bytes copied.
    async fn copy_object(
        &self,
        target: &Arc<Target>,
        group: u32,
        version: u64,
        member: u32,
        inode: InodeId,
    ) -> Result<u64, WireError> {
        let primary = target.id;
        let _held = self.lock_range(primary, inode, 0..u64::MAX).await;
        let length = target.length(inode)?;
        let route = self.resync_route(primary, group, version, member)?;
        let truncate = StorageRequest::Truncate {
            target: route.target,
            mirror: route.mirror,
            inode,
            length,
        };
        self.send_step(member, truncate, Bytes::new()).await?;
        let mut offset = 0;
        while offset < length {
            let len = (length - offset).min(u64::from(IO_BYTES_MAX)) as u32;
            let reading = Arc::clone(target);
            let data = tokio::task::spawn_blocking(move || reading.read(inode, offset, len))
                .await
                .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??;
            if data.is_empty() {
                break;
            }
            let route = self.resync_route(primary, group, version, member)?;
            let write = StorageRequest::Write {
                target: route.target,
                mirror: route.mirror,
                inode,
                object_offset: offset,
            };
            offset += data.len() as u64;
            self.send_step(member, write, data).await?;
        }
        let route = self.resync_route(primary, group, version, member)?;
        let sync = StorageRequest::Sync {
            target: route.target,
            mirror: route.mirror,
            inode,
        };
        self.send_step(member, sync, Bytes::new()).await?;
        Ok(offset)
    }
}

/// Byte-range locks per object: a holder keeps every overlapping range of the same object
/// waiting until its guard drops.
#[derive(Default)]
struct RangeLocks {
    held: Mutex<HashMap<(TargetId, InodeId), Vec<Held>>>,
    next: std::sync::atomic::AtomicU64,
}

struct Held {
    id: u64,
    range: Range<u64>,
    /// Locked by the holder; waiters queue on it.
    gate: Arc<tokio::sync::Mutex<()>>,
}

/// A held range; dropping it lets overlapping changes go on.
pub(crate) struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    key: (TargetId, InodeId),
    id: u64,
    _gate: tokio::sync::OwnedMutexGuard<()>,
}

impl RangeLocks {
    async fn lock(&self, key: (TargetId, InodeId), range: Range<u64>) -> RangeGuard<'_> {
        loop {
            let busy = {
                let mut held = self.held.lock().expect("range locks poisoned");
                let list = held.entry(key).or_default();
                match list
                    .iter()
                    .find(|h| h.range.start < range.end && range.start < h.range.end)
                {
                    Some(holder) => Arc::clone(&holder.gate),
                    None => {
                        let gate = Arc::new(tokio::sync::Mutex::new(()));
                        let guard = Arc::clone(&gate)
                            .try_lock_owned()
                            .expect("a new gate is free");
                        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        list.push(Held {
                            id,
                            range: range.clone(),
                            gate,
                        });
                        return RangeGuard {
                            locks: self,
                            key,
                            id,
                            _gate: guard,
                        };
                    }
                }
            };
            // Wakes when the holder's guard drops; then look again.
            drop(busy.lock().await);
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().expect("range locks poisoned");
        if let Some(list) = held.get_mut(&self.key) {
            list.retain(|h| h.id != self.id);
            if list.is_empty() {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a change waits for an overlapping one on the same object and only for it;
    // non-overlapping changes and other objects go on at once.
    #[tokio::test]
    async fn overlapping_ranges_wait_for_each_other() {
        let locks = RangeLocks::default();
        let object = (TargetId(1), InodeId(7));
        let first = locks.lock(object, 0..100).await;
        let beside = tokio::time::timeout(Duration::from_secs(5), locks.lock(object, 100..200))
            .await
            .expect("a range beside it is free");
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            locks.lock((TargetId(1), InodeId(8)), 0..100),
        )
        .await
        .expect("another object is free");
        drop((beside, other));
        let mut waiting = Box::pin(locks.lock(object, 50..60));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "an overlapping range waits"
        );
        drop(first);
        let _second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("it goes on once the first is released");
    }
}
