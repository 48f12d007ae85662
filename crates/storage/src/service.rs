//! Registration, heartbeats and the storage request handler. Disk I/O runs on tokio's blocking
//! pool so a slow disk never stalls the network threads.

mod objects;
mod push;

use objects::on_target;
use weft_net::MgmtCalls;

use push::{push_stripe, PUSH_STRIPES};

use crate::fence::Admission;
use crate::metrics::TargetMetrics;
use crate::mirror::{Mirror, MirrorMetrics};
use crate::objects::{ObjectId, Space, StoreKind};
use crate::target::Target;
use crate::{StorageConfig, StorageError};
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_mirror::fence::{FenceOf, ForwardFences};
use weft_net::auth::Identity;
use weft_net::mirror::Unsynced;
use weft_net::ClusterView;
use weft_proto::error::WireError;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{
    MirrorRoute, NodeKind, Reply, Request, StorageRequest, StorageResponse, TargetReport,
    CHECKSUM_BYTES_MAX, IO_BYTES_MAX, OBJECTS_PER_LIST_MAX,
};
use weft_proto::ErrorCode;

struct Storage {
    targets: HashMap<weft_proto::TargetId, Arc<Target>>,
    bench: Arc<crate::bench::StorageBench>,
    metrics: TargetMetrics,
    mirror: Arc<Mirror>,
    /// The cluster map: the rules of client identities.
    cluster: Arc<ClusterView>,
    /// Drops late copies of clients' retried changes.
    fence: crate::fence::ChangeFence,
    /// Per storage mirror group, the version of it forwards last came in and their fence:
    /// drops late copies of changes a primary forwarded here and sent again when the answer
    /// did not come in time. Apart from `fence`: a change this target took as a member is
    /// still one to run (and forward) when its client resends it here as to a new primary.
    /// One per group and version: a change taken in one version is run again when a primary
    /// of a later version forwards it (the copies may have changed since, and only the
    /// primary that forwards it knows it is due), and what a client settled in one group says
    /// nothing of the order of its changes in another.
    forward_fences: Mutex<ForwardFences<Arc<crate::fence::ChangeFence>>>,
    /// Per object stripe: one push of an object at a time.
    pushing: Vec<tokio::sync::Mutex<()>>,
    /// The sender the copies of pushes go as, one per object stripe (`| stripe`): a number of
    /// this start's own, above every client session's, marked as a push's ([`PUSH_SENDERS`]).
    push_sender: u64,
    /// Per object stripe, the number of the next change a push sends.
    push_numbers: Vec<std::sync::atomic::AtomicU64>,
}

/// Runs a storage server until `shutdown` completes.
///
/// # Errors
/// [`StorageError`] when the config, a target directory or registration fails.
pub async fn run(
    config: StorageConfig,
    listeners: weft_net::Listeners,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StorageError> {
    config.validate().map_err(StorageError::Config)?;
    let admission = config.admission().map_err(StorageError::Config)?;
    let auth = admission.auth.clone();
    let cluster = Arc::new(ClusterView::for_member(config.mgmt.clone(), auth.clone()));
    let mgmt = cluster.mgmt();
    let weft_service::identity::Registered {
        address,
        alias,
        node,
    } = weft_service::identity::register_listener(
        &config.data_dir,
        mgmt,
        NodeKind::Storage,
        config.alias.clone(),
        &listeners,
    )
    .await?;
    let targets = open_targets(&config, mgmt, node).await?;
    cluster.follow();
    if config.crash_test_discard_unsynced {
        tracing::warn!(
            "crash-test mode: unsynced writes live in memory and are lost when the process dies"
        );
    }
    let exporters = config.exporters();
    let boot = weft_service::identity::next_boot(&config.data_dir)?;
    let mut builder = weft_observe::MetricsBuilder::new("storage", Some(node.0));
    builder
        .registry()
        .register_collector(Box::new(weft_observe::metrics::MapEpochCollector(
            cluster.epoch_source(),
        )));
    let metrics = TargetMetrics::register(&mut builder, targets.values().cloned().collect());
    let mirror = Arc::new(
        Mirror::new(
            Arc::clone(&cluster),
            targets.clone(),
            boot,
            config.heartbeat_interval,
            // A crash-test target keeps unsynced writes in memory; the others write them to
            // their files (or the device) before they answer.
            if config.crash_test_discard_unsynced {
                Unsynced::InProcess
            } else {
                Unsynced::InKernel
            },
            MirrorMetrics::register(builder.registry()),
        )
        .map_err(|source| StorageError::Io {
            what: "cannot read the records of what absent mirror members missed",
            source,
        })?,
    );
    let storage = Arc::new(Storage {
        targets,
        bench: Arc::default(),
        metrics,
        mirror,
        cluster: Arc::clone(&cluster),
        fence: crate::fence::ChangeFence::new(),
        forward_fences: Mutex::default(),
        pushing: (0..PUSH_STRIPES)
            .map(|_| tokio::sync::Mutex::new(()))
            .collect(),
        push_sender: PUSH_SENDERS
            | ((u64::from(node.0) & 0xffff) << 40)
            | ((boot & 0xff_ffff) << 16),
        push_numbers: (0..PUSH_STRIPES)
            .map(|_| std::sync::atomic::AtomicU64::new(1))
            .collect(),
    });
    tracing::info!(node = node.0, %address, %alias, metrics = %format!("http://{address}/metrics"), "storage server serving");
    let heartbeat = tokio::spawn(heartbeat_loop(
        Arc::clone(&storage),
        cluster,
        node,
        config,
        alias,
        address,
    ));
    weft_net::serve_with_exporters(
        listeners,
        storage,
        builder.build(),
        exporters,
        admission,
        shutdown,
    )
    .await
    .map_err(|source| StorageError::Io {
        what: "serving requests failed",
        source,
    })?;
    heartbeat.abort();
    Ok(())
}

/// Registers and opens the targets of `config` for storage server `node`: a target removed
/// from the cluster (`weft target remove`) stays out, and the others serve.
async fn open_targets(
    config: &StorageConfig,
    mgmt: &weft_net::MgmtClient,
    node: NodeId,
) -> Result<HashMap<weft_proto::TargetId, Arc<Target>>, StorageError> {
    let mut targets = HashMap::new();
    for path in &config.targets {
        let saved = weft_service::identity::load_target_id(path)?;
        let id = weft_net::retry::RetryPolicy::default()
            .run(|| mgmt.register_target(node, saved))
            .await;
        let id = match id {
            Ok(id) => id,
            // A target removed from the cluster (`weft target remove`) stays out; the others
            // serve.
            Err(error) if saved.is_some() && error.code() == ErrorCode::InvalidArgument => {
                tracing::error!(path = %path.display(), %error, "target not served");
                continue;
            }
            Err(source) => {
                return Err(StorageError::RegisterTarget {
                    path: path.clone(),
                    source,
                })
            }
        };
        if saved != Some(id) {
            weft_service::identity::save_target_id(path, id)?;
        }
        let target = Target::open(
            id,
            path,
            config.target_capacity_bytes,
            StoreKind {
                direct_io: config.direct_io,
                crash_test: config.crash_test_discard_unsynced,
                direct_write_min_bytes: config.direct_write_min_bytes,
            },
        )
        .map_err(|source| StorageError::Target {
            path: path.clone(),
            source,
        })?;
        tracing::info!(target = id.0, path = %path.display(), "storage target ready");
        targets.insert(id, Arc::new(target));
    }
    Ok(targets)
}

async fn heartbeat_loop(
    storage: Arc<Storage>,
    cluster: Arc<ClusterView>,
    node: NodeId,
    config: StorageConfig,
    alias: String,
    address: String,
) {
    /// Heartbeats woken early (a newer mirror group version was seen) come no closer.
    const EARLY_GAP: Duration = Duration::from_millis(50);
    let interval = config.heartbeat_interval;
    let mgmt = cluster.mgmt();
    loop {
        let reports: Vec<TargetReport> = storage
            .targets
            .values()
            .map(|t| TargetReport {
                target: t.id,
                usage: t.usage(),
            })
            .collect();
        let sent = std::time::Instant::now();
        let mirror = Some(storage.mirror.membership.report());
        match mgmt
            .heartbeat(
                (NodeKind::Storage, node),
                reports,
                weft_net::stubs::MetaReport::default(),
                mirror,
                storage.mirror.membership.heartbeat_deadline(),
            )
            .await
        {
            Ok((lease_ms, groups)) => {
                storage
                    .mirror
                    .adopt(sent, Duration::from_millis(lease_ms), groups);
                // The map brings the rules of client identities this server enforces.
                if let Err(error) = cluster
                    .refresh_within(weft_net::stubs::HEARTBEAT_DEADLINE)
                    .await
                {
                    tracing::warn!(%error, "cannot fetch the cluster map");
                }
            }
            Err(error) if error.code() == ErrorCode::UnknownNode => {
                tracing::warn!("management does not know this node; registering again");
                if mgmt
                    .register_node(
                        Some(node),
                        NodeKind::Storage,
                        alias.clone(),
                        weft_net::rails(&address).map(str::to_string).collect(),
                    )
                    .await
                    .is_ok()
                {
                    for id in storage.targets.keys() {
                        let _ = mgmt.register_target(node, Some(*id)).await;
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "heartbeat failed"),
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = storage.mirror.membership.wake.notified() => tokio::time::sleep(EARLY_GAP).await,
        }
    }
}

impl weft_net::Handler for Storage {
    type Response = StorageResponse;

    fn target_stats(&self) -> Vec<weft_proto::messages::TargetStats> {
        let mut stats: Vec<_> = self
            .targets
            .values()
            .map(|target| self.metrics.stats(target))
            .collect();
        stats.sort_by_key(|s| s.target);
        stats
    }

    async fn handle(
        &self,
        from: Identity,
        request: Request,
        payload: Bytes,
    ) -> (Reply<StorageResponse>, Bytes) {
        if let Err(error) = self.cluster.admit_client(&from, &request).await {
            return (Err(error), Bytes::new());
        }
        let Request::Storage(request) = request else {
            return (
                Err(WireError::new(
                    ErrorCode::WrongService,
                    "a storage server serves storage requests only",
                )),
                Bytes::new(),
            );
        };
        let (op, fits): (&str, _) = ((&request).into(), request.answer_fits());
        let answer = self.handle_storage(request, payload).await;
        weft_proto::answer::debug_check(op, fits, &answer.0);
        answer
    }
}

impl Storage {
    /// Serves a storage request: a benchmark's, or one for a target of this server.
    async fn handle_storage(
        &self,
        request: StorageRequest,
        payload: Bytes,
    ) -> (Reply<StorageResponse>, Bytes) {
        if let Some(answer) =
            crate::bench::serve(&self.bench, &request, payload.len(), &self.targets).await
        {
            return answer;
        }
        let Some(target_id) = request.target() else {
            unreachable!("only StorageBench names no target, answered above")
        };
        let Some(target) = self.targets.get(&target_id).cloned() else {
            return (Err(crate::target::unknown(target_id)), Bytes::new());
        };
        if let StorageRequest::RemoveObjects {
            target: target_id,
            mirror,
            inodes,
        } = request
        {
            // Plain objects: the whole batch in one task of the blocking pool, the way a
            // removal of one runs there. Mirrored ones each as a removal of its own, the way
            // every mirrored removal goes: through the group's primary to its members.
            if mirror.is_none() {
                return match self.remove_plain(target, inodes).await {
                    Ok(()) => (Ok(StorageResponse::Done), Bytes::new()),
                    Err(error) => (Err(error), Bytes::new()),
                };
            }
            for inode in inodes {
                let remove = StorageRequest::Remove {
                    target: target_id,
                    mirror,
                    inode,
                    tag: None,
                };
                let (answer, _) = self.serve(Arc::clone(&target), remove, Bytes::new()).await;
                if let Err(error) = answer {
                    return (Err(error), Bytes::new());
                }
            }
            return (Ok(StorageResponse::Done), Bytes::new());
        }
        self.serve(target, request, payload).await
    }
}

impl Storage {
    /// Removes the plain objects of `inodes` on `target`, in order, in one task of the
    /// blocking pool (a handoff per object cost more than most removals: an object of a file
    /// that never wrote to this target is two failed opens); stops at the first that fails.
    async fn remove_plain(
        &self,
        target: Arc<Target>,
        inodes: Vec<InodeId>,
    ) -> Result<(), WireError> {
        let metrics = self.metrics.clone();
        blocking(move || {
            for inode in inodes {
                let disk_op = metrics.start(target.id, "remove");
                let removed = target.remove(ObjectId::new(Space::Plain, inode));
                disk_op.finish(0, 0);
                removed?;
            }
            Ok(())
        })
        .await
    }

    /// Refuses a seal a client sends (only a group's primary seals, on its members), and
    /// forgets a seal `target` holds of the mirrored object a request names that is of a
    /// group the map no longer has.
    fn check_seal(&self, target: &Target, request: &StorageRequest) -> Result<(), WireError> {
        if matches!(request, StorageRequest::Seal { .. })
            && !request.mirror().is_some_and(|route| route.forwarded)
        {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                "only a storage mirror group's primary seals an object, on its members",
            ));
        }
        if let (Some(route), Some(inode)) = (request.mirror(), mirrored_inode(request)) {
            // Only a seal of a group the map no longer has is stale: while the group exists,
            // a writer with the old layout reaches the object through it and must be told
            // the file moved, whatever group another request names.
            let map = self.cluster.map();
            let removed = |group: u32| !map.mirror_groups.iter().any(|known| known.id.0 == group);
            target.forget_stale_seal(inode, route.group.0, removed)?;
        }
        Ok(())
    }

    /// Serves a request for `target`, one of this server's: a push, or a read or change of
    /// its objects (through the fences, the quota check, and as its mirror group's primary or
    /// member when it names one).
    async fn serve(
        &self,
        target: Arc<Target>,
        request: StorageRequest,
        payload: Bytes,
    ) -> (Reply<StorageResponse>, Bytes) {
        let target_id = target.id;
        // A copy is a write of what it reads: the rest of its way is a write's.
        let (request, payload) = match request {
            StorageRequest::CopyFrom { .. } => match self.gather_copy(request).await {
                Ok(write) => write,
                Err(error) => return (Err(error), Bytes::new()),
            },
            request => (request, payload),
        };
        if let StorageRequest::Push {
            inode,
            to,
            id,
            seal,
            into,
            group,
            ..
        } = request
        {
            return match self
                .serve_push(target, (inode, to, id), seal, (into, group))
                .await
            {
                Ok(copied) => (Ok(StorageResponse::Pushed { copied }), Bytes::new()),
                Err(error) => (Err(error), Bytes::new()),
            };
        }
        if let Err(error) = self.check_seal(&target, &request) {
            return (Err(error), Bytes::new());
        }
        // A client's change passes the fence where the client sent it, and at each member the
        // fence of its group's version: a primary sends a forward again when its answer does
        // not come in time, and the first copy, still on its way, must not land after a newer
        // change.
        let forward_fence;
        let fence = match request.mirror() {
            Some(route) if route.forwarded => match self.forward_fence(target_id, route) {
                Ok(fence) => {
                    forward_fence = fence;
                    &*forward_fence
                }
                Err(error) => return (Err(error), Bytes::new()),
            },
            _ => &self.fence,
        };
        if let Err(error) = self.quota_admits(&target, &request, payload.len()) {
            return (Err(error), Bytes::new());
        }
        let running = match request.tag() {
            Some(tag) => match fence.admit(tag).await {
                Ok(Admission::Run(running)) => Some(running),
                Ok(Admission::Answered(answer)) => return (answer, Bytes::new()),
                Err(error) => return (Err(error), Bytes::new()),
            },
            None => None,
        };
        // A truncate waits for a push of its object still running here (its metadata server
        // may have stopped waiting for it): the copies the push makes, in the generation
        // before the truncate, land before the metadata server cuts them too.
        let _no_push = match &request {
            StorageRequest::Truncate { inode, .. }
                if !request.mirror().is_some_and(|route| route.forwarded) =>
            {
                Some(self.pushing[push_stripe(*inode)].lock().await)
            }
            _ => None,
        };
        let outcome = match request.mirror() {
            None => self.local(target, request, payload).await,
            Some(route) if route.forwarded => match self.mirror.admit_forward(target_id, route) {
                Ok(()) => self.as_member(target, request, payload).await,
                Err(error) => Err(error),
            },
            Some(route) => self.as_primary(target, route, request, payload).await,
        };
        if let Some(running) = running {
            running.answer(outcome.as_ref().map(|(response, _)| response));
        }
        match outcome {
            Ok((response, payload)) => (Ok(response), payload),
            Err(error) => (Err(error), Bytes::new()),
        }
    }
}

impl Storage {
    /// The write a copy makes (`StorageRequest::CopyFrom`): its pieces read where they live
    /// (this server's targets, or another storage server's), each a hole (zeros) where its
    /// object ends, joined in order.
    async fn gather_copy(
        &self,
        request: StorageRequest,
    ) -> Result<(StorageRequest, Bytes), WireError> {
        let StorageRequest::CopyFrom {
            target,
            inode,
            generation,
            object_offset,
            source,
            pieces,
            tag,
            owner,
            project,
            capability,
            ..
        } = request
        else {
            unreachable!("only copies are gathered")
        };
        let total: u64 = pieces.iter().map(|piece| u64::from(piece.len)).sum();
        if total > u64::from(IO_BYTES_MAX) {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("a copy of {total} bytes exceeds {IO_BYTES_MAX}"),
            ));
        }
        let retry = weft_net::retry::RetryPolicy::default();
        let reads = pieces.iter().map(|piece| {
            let piece = *piece;
            let retry = &retry;
            async move {
                let data = match self.targets.get(&piece.target).cloned() {
                    Some(local) => {
                        let object = ObjectId::new(Space::Plain, source.0);
                        blocking(move || {
                            local.read_admitted(object, source.1, piece.offset, piece.len)
                        })
                        .await?
                    }
                    None => self
                        .cluster
                        .call_storage(
                            weft_proto::layout::Slot::Target(piece.target),
                            retry,
                            |storage, route| async move {
                                storage
                                    .read(route, source, piece.offset, piece.len, None)
                                    .await
                            },
                        )
                        .await
                        .map_err(rpc_error)?,
                };
                let mut data = bytes::BytesMut::from(&data[..data.len().min(piece.len as usize)]);
                data.resize(piece.len as usize, 0);
                Ok::<_, WireError>(data)
            }
        });
        let mut payload = bytes::BytesMut::with_capacity(total as usize);
        for read in futures::future::join_all(reads).await {
            payload.extend_from_slice(&read?);
        }
        let write = StorageRequest::Write {
            target,
            mirror: None,
            inode,
            generation,
            object_offset,
            tag,
            // Checked with the copy: it binds the write's growth as the copy's.
            capability,
            owner,
            project,
        };
        Ok((write, payload.freeze()))
    }

    /// Refuses a client's write that grows a file whose owner, group or project is over its
    /// space quota in this target's pool (as the cluster map lists them), and any allocation
    /// of such a file's space (with or without its size), with `QuotaExceeded`. A request that
    /// shows a capability is judged by what the capability binds (its owner, whatever the
    /// request says, and the end its objects may grow to: the room the file's home reserved
    /// for the client), so a restricted client cannot name another owner, none, or grow a
    /// file past its room. Forwards are not checked: the primary decided for the group.
    fn quota_admits(
        &self,
        target: &Target,
        request: &StorageRequest,
        len: usize,
    ) -> Result<(), WireError> {
        // Where the request grows the object to: past its end for a write or a zeroing; any
        // allocation takes space whatever the object's length (`allocates`).
        let (said, mirror, inode, end, allocates) = match request {
            StorageRequest::Write {
                inode,
                object_offset,
                owner,
                project,
                mirror,
                ..
            } => (
                owner.map(|owner| (owner, *project)),
                mirror,
                inode,
                object_offset.saturating_add(len as u64),
                false,
            ),
            StorageRequest::Fallocate {
                inode,
                object_offset,
                len,
                mode,
                owner,
                project,
                mirror,
                ..
            } => (
                owner.map(|owner| (owner, *project)),
                mirror,
                inode,
                object_offset.saturating_add(*len),
                *mode == weft_proto::messages::FallocateMode::Allocate,
            ),
            _ => return Ok(()),
        };
        if mirror.is_some_and(|route| route.forwarded) {
            return Ok(());
        }
        let capability = request
            .file_access()
            .and_then(|(_, _, capability)| capability);
        // A metadata server of version 9 binds every capability of a regular file's open:
        // one shown without its bound by a peer of version 9 had it taken off.
        if capability.is_some_and(|capability| capability.growth.is_none())
            && weft_net::server::peer_version() >= 9
        {
            return Err(WireError::new(
                ErrorCode::CapabilityNeeded,
                format!("a capability of {inode} without its growth bound: open the file again"),
            ));
        }
        let bound = capability.and_then(|capability| capability.growth);
        let object = ObjectId::new(Space::of(*mirror), *inode);
        let length = || target.length(object).map_err(WireError::from);
        let owner = match (bound, said) {
            (Some(bound), _) => {
                if end > bound.object_end && end > length()? {
                    return Err(WireError::new(
                        ErrorCode::QuotaExceeded,
                        format!(
                            "a change of {inode} to object offset {end} passes the room its home reserved (to {}): ask it for room first (a quota of its owner, group or project is limited)",
                            bound.object_end
                        ),
                    ));
                }
                weft_proto::quota::Owner {
                    uid: bound.uid,
                    gid: bound.gid,
                    project: bound.project,
                }
            }
            (None, Some(((uid, gid), project))) => weft_proto::quota::Owner { uid, gid, project },
            (None, None) => return Ok(()),
        };
        let map = self.cluster.map();
        let Some(pool) = map.target(target.id).map(|t| t.pool) else {
            return Ok(());
        };
        let Some(refusal) = map.quota_refusal(owner, pool, weft_proto::quota::Growth::Bytes) else {
            return Ok(());
        };
        if allocates || end > length()? {
            return Err(refusal);
        }
        Ok(())
    }

    /// Admits a forward to member `target` along `route`, and gives the fence of the forwards
    /// of its group in its version (one of its own for a forward of an older version).
    fn forward_fence(
        &self,
        target: weft_proto::TargetId,
        route: MirrorRoute,
    ) -> Result<Arc<crate::fence::ChangeFence>, WireError> {
        let mut fences = self.forward_fences.lock().expect("forward fences poisoned");
        let fence = self.mirror.membership.admit_forward_fence(
            &mut fences,
            weft_proto::ids::MemberId::from(target),
            route.group,
            route.version,
            || Arc::new(crate::fence::ChangeFence::new()),
        )?;
        Ok(match fence {
            FenceOf::Current(fence) => Arc::clone(fence),
            FenceOf::Older => Arc::new(crate::fence::ChangeFence::new()),
        })
    }

    /// A request to a mirrored object at its group's primary: admitted by version and lease;
    /// a change is applied here and on every present member (in order with overlapping
    /// changes to the same object) before it is answered. A change that fails here after a
    /// member applied it leaves the member ahead in that range; the caller sees the error, as
    /// for any failed write whose range is then undefined.
    async fn as_primary(
        &self,
        target: Arc<Target>,
        route: MirrorRoute,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), WireError> {
        self.mirror.admit_primary(target.id, route)?;
        let changes = matches!(
            request,
            StorageRequest::Write { .. }
                | StorageRequest::Truncate { .. }
                | StorageRequest::Remove { .. }
                | StorageRequest::Fallocate { .. }
                | StorageRequest::Sync { .. }
        );
        if !changes {
            return self.local(target, request, payload).await;
        }
        let _held = match request.changed_range(payload.len()) {
            Some((inode, range)) => Some(self.mirror.lock_range(target.id, inode, range).await),
            None => None,
        };
        // Admitted again: the wait may have outlived this target's role or lease.
        let forwarding = self
            .mirror
            .begin(target.id, route, &request, payload.len())?;
        // An object sealed (its file's last push began) takes no change the members would
        // take: its copy would miss it.
        if let StorageRequest::Write { inode, .. }
        | StorageRequest::Truncate { inode, .. }
        | StorageRequest::Fallocate { inode, .. } = &request
        {
            target.refuse_moved(ObjectId::new(Space::Mirrored, *inode))?;
        }
        // Here and on the members at once: the range lock keeps overlapping changes in order.
        let (answer, forwarded) = futures::join!(
            self.local(Arc::clone(&target), request.clone(), payload.clone()),
            self.mirror.forward(forwarding, &request, &payload)
        );
        let verifier = forwarded?;
        answer.map(|(response, payload)| match response {
            StorageResponse::Written { len, .. } => {
                (StorageResponse::Written { len, verifier }, payload)
            }
            StorageResponse::Synced { .. } => (StorageResponse::Synced { verifier }, payload),
            other => (other, payload),
        })
    }

    /// A request its group's primary forwarded to this member target, admitted. A write or
    /// allocation of an object sealed here first drops the seal, which the primary no longer
    /// holds ([`Target::forget_seal_the_primary_lacks`]): both carry tags, so the change fence
    /// of the group's version already dropped any late copy of one sent before a seal. A
    /// truncate carries none, and a late copy of one must not undo a seal: on a sealed object
    /// (which holds no data) it changes nothing, as on a missing one, and is answered so.
    async fn as_member(
        &self,
        target: Arc<Target>,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), WireError> {
        let inode = match &request {
            StorageRequest::Write { inode, .. }
            | StorageRequest::Fallocate { inode, .. }
            | StorageRequest::Truncate { inode, .. } => *inode,
            _ => return self.local(target, request, payload).await,
        };
        // Looked at here, a load of a counter when nothing is sealed: the forget itself (a
        // marker removed, its directory synced) goes to the blocking pool.
        if !target
            .moves()
            .is_sealed(ObjectId::new(Space::Mirrored, inode))
        {
            return self.local(target, request, payload).await;
        }
        match &request {
            StorageRequest::Truncate { .. } => return Ok((StorageResponse::Done, Bytes::new())),
            // Untagged (no primary sends one): refused as moved, as before the fence.
            _ if request.tag().is_none() => return self.local(target, request, payload).await,
            _ => {}
        }
        let forgetting = Arc::clone(&target);
        tokio::task::spawn_blocking(move || forgetting.forget_seal_the_primary_lacks(inode))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??;
        self.local(target, request, payload).await
    }

    /// Runs a request on this server's own target, timed: on the blocking pool, or, for a small
    /// write or cached read of an object file already open, on this thread (see
    /// [`INLINE_IO_BYTES`]).
    async fn local(
        &self,
        target: Arc<Target>,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), WireError> {
        let target_id = target.id;
        let space = Space::of(request.mirror());
        let object = move |inode: InodeId| ObjectId::new(space, inode);
        // A restart of this server (or of its host) may have lost what was not synced.
        let verifier = self.mirror.unsynced_boot();
        let disk_op = self.metrics.start(target_id, (&request).into());
        let written = match &request {
            StorageRequest::Write { .. } => payload.len() as u64,
            _ => 0,
        };
        if let StorageRequest::Read {
            inode,
            generation,
            object_offset,
            len,
            ..
        } = &request
        {
            if *len as usize <= INLINE_IO_BYTES {
                let cached = target.read_cached(object(*inode), *object_offset, *len, *generation);
                if let Some(data) = cached {
                    disk_op.finish(data.len() as u64, 0);
                    return Ok((StorageResponse::Data, data));
                }
            }
        }
        let inline = match &request {
            StorageRequest::Write { inode, .. } => {
                payload.len() <= INLINE_IO_BYTES && target.is_open(object(*inode))
            }
            _ => false,
        };
        let work = move || on_target(&target, request, payload, verifier);
        let outcome = if inline {
            Ok(work())
        } else {
            tokio::task::spawn_blocking(work).await
        };
        match &outcome {
            Ok(Ok((_, read))) => disk_op.finish(read.len() as u64, written),
            _ => disk_op.finish(0, 0),
        }
        match outcome {
            Ok(result) => result,
            Err(join) => Err(WireError::new(
                ErrorCode::Internal,
                format!("storage task failed: {join}"),
            )),
        }
    }
}

/// Runs object work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, crate::objects::ObjectError> + Send + 'static,
) -> Result<T, WireError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(WireError::from),
        Err(join) => Err(WireError::new(
            ErrorCode::Internal,
            format!("storage task failed: {join}"),
        )),
    }
}

/// A failed call to another storage server, as this server's answer.
fn rpc_error(error: weft_net::RpcError) -> WireError {
    match error {
        weft_net::RpcError::Remote(error) => error,
        other => WireError::new(ErrorCode::Unavailable, other.to_string()),
    }
}

/// Writes and reads at most this large of an object file the target holds open run on the
/// runtime's thread instead of the blocking pool: such a write is a copy into the page cache
/// and a `fstat`, a few microseconds, less than handing it to another thread and back (random
/// 4 KiB writes through a mount ran 1.4-1.5x faster); such a read runs there only when the
/// page cache holds all of it (`RWF_NOWAIT`). Opening or creating an object, reads that would
/// wait for the disk, larger requests and every other request stay on the blocking pool. A
/// write the kernel throttles because too much of memory is dirty pauses this thread as it
/// would pause a pool thread; the pause is the kernel pacing writers to the disk, short and
/// bounded.
pub(crate) const INLINE_IO_BYTES: usize = 16 << 10;

/// The senders the copies of pushes go as (`Storage::push_sender`): a server's own numbers
/// (the top bit, which no client session gets), with the next bit set, which a server's
/// other own senders (forwards and resyncs: `mirror.rs`, below target 2^30) never have.
const PUSH_SENDERS: u64 = (1 << 63) | (1 << 62);

/// Whether `client` is a push's sender: its writes are copies ([`Target::write_pushed`]).
pub(crate) fn is_push_copy(client: weft_proto::ids::ClientId) -> bool {
    client.0 & PUSH_SENDERS == PUSH_SENDERS
}

/// The file a request routed through a storage mirror group is about, if any.
fn mirrored_inode(request: &StorageRequest) -> Option<InodeId> {
    match request {
        StorageRequest::Write { inode, .. }
        | StorageRequest::Read { inode, .. }
        | StorageRequest::Truncate { inode, .. }
        | StorageRequest::Remove { inode, .. }
        | StorageRequest::Sync { inode, .. }
        | StorageRequest::Fallocate { inode, .. }
        | StorageRequest::ObjectLength { inode, .. }
        | StorageRequest::Seal { inode, .. } => Some(*inode),
        _ => None,
    }
}
