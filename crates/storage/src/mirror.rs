//! Storage mirror groups on a storage server: the work of a primary target beyond the rules
//! every mirror member follows ([`weft_net::mirror::Membership`]: versions, lease, delivery to
//! present members):
//! - changes to overlapping ranges of one object are applied and forwarded one after the
//!   other, so every member applies them in the same order;
//! - a member in `needs-resync` gets new changes and, in the background, a copy of every
//!   object it missed (each copied under the object's range lock, so no newer change is
//!   overwritten); after a full copy it loses the objects the primary does not have.
//!
//! A member that left in sync gets only the objects the primary recorded as missed
//! ([`weft_service::missed`]); any other returning member gets a full copy.

use crate::objects::{ObjectId, Space};
use crate::target::Target;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use weft_mirror::numbers::Numbers;
use weft_mirror::primary::PrimaryChange;
use weft_mirror::ranges::RangeTable;
use weft_mirror::resync::{Held, ResyncNumbering, ResyncPlan, ResyncStep};
use weft_net::mirror::{Membership, ResyncStart, Unsynced};
use weft_net::{ClusterView, RpcError};
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, GroupId, GroupVersion, InodeId, MemberId, TargetId};
use weft_proto::messages::{
    ChangeTag, MirrorGroupInfo, MirrorRoute, Route, StorageRequest, StorageResponse, IO_BYTES_MAX,
    OBJECTS_PER_LIST_MAX,
};
use weft_proto::ErrorCode;
use weft_service::missed::MissedLogs;

fn stale(message: String) -> WireError {
    weft_net::mirror::stale(message)
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

/// The mirror side of a storage server.
pub(crate) struct Mirror {
    cluster: Arc<ClusterView>,
    targets: HashMap<TargetId, Arc<Target>>,
    /// The groups, lease and resyncs, kept as for every kind of member.
    pub membership: Membership,
    ranges: RangeLocks,
    missed: Arc<MissedLogs>,
    metrics: MirrorMetrics,
    /// The step tags of the resyncs of each (group, member), for the version they run in: a
    /// resync that fails and starts again in the same version numbers on, so its steps settle
    /// every step of the one before, whose first copies may still be on their way.
    resync_numbering: Mutex<ResyncNumbering>,
    /// The numbers of the changes this server forwards as primary, and their sender id (this
    /// start of this server).
    forwards: Numbers,
    forwarder: u64,
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
        boot: u64,
        interval: Duration,
        unsynced: Unsynced,
        metrics: MirrorMetrics,
    ) -> std::io::Result<Mirror> {
        let missed = Arc::new(MissedLogs::default());
        for target in targets.values() {
            missed.load(target.root())?;
        }
        Ok(Mirror {
            cluster,
            targets,
            membership: Membership::new(boot, interval, unsynced),
            ranges: RangeLocks::default(),
            resync_numbering: Mutex::default(),
            forwards: Numbers::default(),
            forwarder: own_client(None),
            missed,
            metrics,
        })
    }

    /// The verifier of writes to plain objects: changes whenever a restart may have lost the
    /// writes this server answered before syncing them.
    pub fn unsynced_boot(&self) -> u64 {
        self.membership.unsynced_boot()
    }

    /// Takes management's answer to a heartbeat sent at `sent`: the lease, and the groups
    /// (newer versions replace older ones). Starts the resyncs this server must run as
    /// primary.
    pub fn adopt(self: &Arc<Self>, sent: Instant, lease: Duration, groups: Vec<MirrorGroupInfo>) {
        let adopted = self.membership.adopt(
            sent,
            lease,
            groups,
            |member| self.targets.contains_key(&TargetId::from(member)),
            |adopted| {
                self.missed.follow(adopted, |group| {
                    let primary = adopted
                        .taken
                        .iter()
                        .find(|(_, g)| g.id == group)
                        .map(|(_, g)| g.primary)?;
                    Some(
                        self.targets
                            .get(&TargetId::from(primary))?
                            .root()
                            .to_path_buf(),
                    )
                });
            },
        );
        for start in adopted.starts {
            let mirror = Arc::clone(self);
            tokio::spawn(async move {
                let outcome = mirror.resync(start).await;
                mirror.membership.resync_ended(start, &outcome);
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
        self.membership
            .admit_primary(MemberId::from(target), route.group, route.version)
    }

    /// Checks a change forwarded to member `target` by its primary.
    ///
    /// # Errors
    /// `StaleRoute` when the version differs or `target` is not a present member.
    pub fn admit_forward(&self, target: TargetId, route: MirrorRoute) -> Result<(), WireError> {
        self.membership
            .admit_forward(MemberId::from(target), route.group, route.version)
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

    /// Begins `request`, a change routed by `route` to the primary `target` that holds its
    /// range ([`PrimaryChange::begin`]: admitted again, numbered among this server's
    /// forwards, its delivery to the present members started).
    ///
    /// # Errors
    /// `StaleRoute` when this target may no longer serve it: the client routes again.
    pub fn begin(
        &self,
        target: TargetId,
        route: MirrorRoute,
        request: &StorageRequest,
        payload_len: usize,
    ) -> Result<Forwarding<'_>, WireError> {
        // The object a member that does not take the change is owed if it is given up.
        let items: Vec<u64> = request
            .changed_range(payload_len)
            .map(|(inode, _)| inode.0)
            .into_iter()
            .collect();
        let change = self.membership.begin_change(
            MemberId::from(target),
            (route.group, route.version),
            items,
            &self.forwards,
            request.takes_tag(),
        )?;
        Ok(Forwarding {
            forwards: &self.forwards,
            change: Some(change),
        })
    }

    /// Sends a change begun here and applied (or being applied) here to every present
    /// member, and waits until each has it or has left the group. Returns the verifier to
    /// answer with: the group's loss epoch, as only a crash of every copy loses what was not
    /// synced.
    ///
    /// # Errors
    /// `StaleRoute` when this target stopped being the group's primary meanwhile: the client
    /// sends the change again to the new primary.
    pub async fn forward(
        &self,
        mut forwarding: Forwarding<'_>,
        request: &StorageRequest,
        payload: &Bytes,
    ) -> Result<u64, WireError> {
        let change = forwarding.change.as_mut().expect("a change is ended once");
        let number = change.number();
        let group = change.delivery.group();
        let delivered = self
            .membership
            .deliver_change(&mut change.delivery, |member, version, attempt| {
                let mut forward = request
                    .clone()
                    .rerouted(member_route(group, version, member));
                if let Some(number) = number {
                    forward = forward.retagged(weft_net::mirror::change_tag(
                        ClientId(self.forwarder),
                        number,
                        self.forwards.marks(number),
                    ));
                }
                async move {
                    if attempt > 0 {
                        self.metrics.forward_retries.inc();
                    }
                    self.send(member, forward, payload.clone()).await?;
                    self.metrics.forwards.inc();
                    Ok(())
                }
            })
            .await;
        let ended = forwarding
            .change
            .take()
            .expect("a change is ended once")
            .end(&self.forwards);
        delivered?;
        // Members that left miss this change: recorded before it is answered.
        if let Some((inode, _)) = request.changed_range(payload.len()) {
            if self.missed.any(group) {
                let missed = Arc::clone(&self.missed);
                let noted = tokio::task::spawn_blocking(move || missed.note(group, &[inode.0]))
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
        ended.map_err(|_| stale(format!("the change to mirror group {group} was given up")))
    }

    /// Sends one request to the server of `member`.
    async fn send(
        &self,
        member: MemberId,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), RpcError> {
        // A member cut off the network answers nothing: give up in time to report it.
        let timeout = self.membership.member_timeout();
        self.send_within(member, request, payload, timeout).await
    }

    /// Sends one request to the server of `member`, waiting at most `timeout`.
    async fn send_within(
        &self,
        member: MemberId,
        request: StorageRequest,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(StorageResponse, Bytes), RpcError> {
        let call = async {
            let client = self
                .cluster
                .storage_for_target(TargetId::from(member))
                .await?;
            client.send(request, payload).await
        };
        self.cluster
            .call_member(|| format!("storage target {member}"), timeout, call)
            .await
    }

    /// Brings the member of `start` up to date from this server's target, the group's
    /// primary in the start's version, by the steps of a [`ResyncPlan`]: when management says
    /// the member left in sync and this server recorded what it missed, only those objects;
    /// otherwise the member's objects this target lacks go first, then every object this
    /// target holds is copied; last, the member's target is synced.
    async fn resync(&self, start: ResyncStart) -> Result<(), WireError> {
        let ResyncStart {
            group,
            version,
            member,
            ..
        } = start;
        let (primary, target) = self.primary_of(group)?;
        let (mut plan, incremental) = self.plan_resync(start);
        held_at_gate(&target).await;
        let mut copied = 0u64;
        // The object whose range is held, with what its copy needs: its length and truncate
        // generation (every byte is written in the generation the primary's object has, so
        // the member records it too), and whether it counts as copied (not a look at an
        // object of the member's listing).
        let mut held: Option<(RangeGuard<'_>, u64, u64, bool)> = None;
        loop {
            match plan.step() {
                ResyncStep::ListMember { after } => {
                    let (objects, end) = self.list_member(primary, start, after).await?;
                    plan.listed(objects, end);
                }
                step @ (ResyncStep::RemoveIfGone(inode) | ResyncStep::Object(inode)) => {
                    let copies = matches!(step, ResyncStep::Object(_));
                    let inode = InodeId(inode);
                    let guard = self.lock_range(primary, inode, 0..u64::MAX).await;
                    let (state, length, generation) = look_at(&target, group, inode, copies)?;
                    held = Some((guard, length, generation, copies));
                    plan.holds(state);
                }
                ResyncStep::Remove(inode) => {
                    let tag = self.step_tag(primary, start);
                    self.member_step(primary, start, |target, mirror| StorageRequest::Remove {
                        target,
                        mirror,
                        inode: InodeId(inode),
                        tag: Some(tag),
                    })
                    .await?;
                }
                ResyncStep::Seal(inode) => {
                    self.member_step(primary, start, |target, mirror| StorageRequest::Seal {
                        target,
                        mirror,
                        inode: InodeId(inode),
                    })
                    .await?;
                }
                ResyncStep::SyncObject(inode) => {
                    self.member_step(primary, start, |target, mirror| StorageRequest::Sync {
                        target,
                        mirror,
                        inode: InodeId(inode),
                        capability: None,
                    })
                    .await?;
                }
                ResyncStep::Write {
                    object: inode,
                    offset,
                    len,
                } => {
                    let generation = held.as_ref().map_or(0, |(_, _, generation, _)| *generation);
                    let piece = (InodeId(inode), generation, offset, len);
                    self.copy_piece(&target, primary, start, piece).await?;
                }
                ResyncStep::Release(_) => {
                    if let Some((_, bytes, _, true)) = held.take() {
                        copied += 1;
                        self.metrics.resync_objects.inc();
                        self.metrics.resync_bytes.inc_by(bytes);
                        self.membership.resync_copied(start, bytes);
                    }
                }
                ResyncStep::ListPrimary => {
                    let inodes = list_primary(&target, group).await?;
                    let count = plan.primary_listed(inodes);
                    tracing::info!(%group, %version, %member, objects = count, "resync copies");
                    self.membership.resync_total(start, count as u64);
                }
                ResyncStep::SyncMember => self.sync_member(primary, start).await?,
                ResyncStep::Done => break,
            }
        }
        if incremental {
            self.missed.forget(group, member);
            tracing::info!(%group, %version, %member, objects = copied, "resync copied what the member missed");
        } else {
            tracing::info!(%group, %version, %member, objects = copied, "resync copied");
        }
        Ok(())
    }

    /// The primary target of `group`, which is on this server.
    fn primary_of(&self, group: GroupId) -> Result<(TargetId, Arc<Target>), WireError> {
        let primary = self
            .membership
            .group(group)
            .map(|known| TargetId::from(known.primary))
            .ok_or_else(|| stale("gone".into()))?;
        let target = self
            .targets
            .get(&primary)
            .cloned()
            .ok_or_else(|| stale(format!("target {primary} is not on this server")))?;
        Ok((primary, target))
    }

    /// The plan of `start`'s resync, and whether it copies only what the member missed: when
    /// management says the member left in sync and this server recorded what it missed, only
    /// those objects; otherwise every object (and a record, which does not cover a full copy,
    /// is dropped).
    fn plan_resync(&self, start: ResyncStart) -> (ResyncPlan, bool) {
        let recorded = match start.full {
            true => None,
            false => self.missed.recorded(start.group, start.member),
        };
        let (plan, incremental) = match recorded {
            Some(inodes) => {
                self.membership
                    .resync_started(start, inodes.len() as u64, false);
                (ResyncPlan::missed(inodes), true)
            }
            None => {
                self.missed.forget(start.group, start.member);
                self.membership.resync_started(start, 0, true);
                (ResyncPlan::full(), false)
            }
        };
        tracing::info!(
            group = %start.group,
            version = %start.version,
            member = %start.member,
            full = !incremental,
            "resync started"
        );
        (plan, incremental)
    }

    /// Sends a step of `start`'s resync without payload: the request `make` gives for the
    /// member's target and route.
    async fn member_step(
        &self,
        primary: TargetId,
        start: ResyncStart,
        make: impl FnOnce(TargetId, Option<MirrorRoute>) -> StorageRequest,
    ) -> Result<(), WireError> {
        let route = self.resync_route(primary, start)?;
        let request = make(route.target, route.mirror);
        self.send_step(primary, start, request, Bytes::new()).await
    }

    /// A page of the mirrored objects of `start`'s member after `after`, and whether it is
    /// the last.
    async fn list_member(
        &self,
        primary: TargetId,
        start: ResyncStart,
        after: u64,
    ) -> Result<(Vec<u64>, bool), WireError> {
        let route = self.resync_route(primary, start)?;
        let request = StorageRequest::ListObjects {
            target: route.target,
            mirrored: true,
            home: None,
            after,
            max: OBJECTS_PER_LIST_MAX,
        };
        let (response, _) = self
            .send(start.member, request, Bytes::new())
            .await
            .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
        let StorageResponse::Objects { objects, end } = response else {
            return Err(WireError::new(
                ErrorCode::Internal,
                "a member answered a listing with something else",
            ));
        };
        Ok((objects.iter().map(|(inode, _)| inode.0).collect(), end))
    }

    /// Copies one piece of an object held for `start`'s resync to its member: `len` bytes at
    /// `offset` of `inode`, read now under the object's range, written in the object's
    /// truncate `generation`.
    async fn copy_piece(
        &self,
        target: &Arc<Target>,
        primary: TargetId,
        start: ResyncStart,
        (inode, generation, offset, len): (InodeId, u64, u64, u64),
    ) -> Result<(), WireError> {
        let reading = Arc::clone(target);
        let len = u32::try_from(len).unwrap_or(IO_BYTES_MAX);
        let data = tokio::task::spawn_blocking(move || reading.read(mirrored(inode), offset, len))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??;
        if data.len() != len as usize {
            return Err(WireError::new(
                ErrorCode::Internal,
                format!("object {inode} changed length while it was copied under its lock"),
            ));
        }
        let route = self.resync_route(primary, start)?;
        let write = StorageRequest::Write {
            target: route.target,
            mirror: route.mirror,
            inode,
            generation,
            object_offset: offset,
            tag: Some(self.step_tag(primary, start)),
            capability: None,
            owner: None,
            project: 0,
        };
        self.send_step(primary, start, write, data).await
    }

    /// Makes everything the member of `start` holds durable: a `syncfs` of its file system,
    /// which may hold much more than the group's objects, so each try gets a request's
    /// deadline, and a few tries are made before the resync is given up (and starts over).
    async fn sync_member(&self, primary: TargetId, start: ResyncStart) -> Result<(), WireError> {
        let mut tries = 0;
        loop {
            let route = self.resync_route(primary, start)?;
            let sync = StorageRequest::SyncTarget {
                target: route.target,
                mirror: route.mirror,
            };
            let sent = self
                .send_within(start.member, sync, Bytes::new(), SYNC_TARGET_TIMEOUT)
                .await;
            match sent {
                Ok(_) => return Ok(()),
                Err(error) if error.is_retryable() && tries + 1 < SYNC_TARGET_TRIES => {
                    tries += 1;
                    tracing::warn!(member = %start.member, %error, "syncing a resynced member failed; trying again");
                }
                Err(error) => {
                    return Err(WireError::new(ErrorCode::Unavailable, error.to_string()))
                }
            }
        }
    }

    /// The tag of the next step of `start`'s resync.
    fn step_tag(&self, primary: TargetId, start: ResyncStart) -> ChangeTag {
        let mut numbering = self
            .resync_numbering
            .lock()
            .expect("resync numbering poisoned");
        let numbers = numbering.of((start.group, start.version, start.member), || {
            own_client(Some(primary))
        });
        let number = numbers.draw();
        ChangeTag {
            client: ClientId(numbers.client),
            number,
            settled_below: number,
            abandoned: Vec::new(),
        }
    }

    /// The route of a resync step; fails once the resync's version is over.
    fn resync_route(&self, primary: TargetId, start: ResyncStart) -> Result<Route, WireError> {
        let version = self
            .membership
            .resync_version(MemberId::from(primary), start)?;
        Ok(member_route(start.group, version, start.member))
    }

    /// One resync step of `start` from `primary`, tried until it lands or the resync's
    /// version is over.
    async fn send_step(
        &self,
        primary: TargetId,
        start: ResyncStart,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(), WireError> {
        self.membership
            .resync_step(MemberId::from(primary), start, || {
                self.send(start.member, request.clone(), payload.clone())
            })
            .await
            .map(|_| ())
    }
}

/// A test holds a resync here, its member back in the group, while it makes changes the
/// member takes before any copy: with the `resync-waits-at-its-gate` point armed, while
/// [`RESYNC_GATE`] exists in the primary's target directory.
async fn held_at_gate(target: &Target) {
    while weft_service::failpoint::misbehave("resync-waits-at-its-gate")
        && target.root().join(RESYNC_GATE).exists()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the primary `target` of `group` holds of the mirrored object of `inode`, its range
/// held: the object (with its length, and for a `copy` its truncate generation, which every
/// byte of the copy is written in), only its seal (it moved off the group), or nothing.
fn look_at(
    target: &Target,
    group: GroupId,
    inode: InodeId,
    copy: bool,
) -> Result<(Held, u64, u64), WireError> {
    let object = mirrored(inode);
    if target.exists(object) {
        let length = target.length(object)?;
        let state = Held::Object {
            length,
            largest: u64::from(IO_BYTES_MAX),
        };
        let generation = if copy { target.generation(object)? } else { 0 };
        return Ok((state, length, generation));
    }
    if target.moves().is_sealed_off(object, group.0) {
        return Ok((Held::SealedOff, 0, 0));
    }
    Ok((Held::Gone, 0, 0))
}

/// The mirrored objects the primary `target` of `group` holds, with those that moved to
/// another group and left only their seal here (which the member gets too), in order.
async fn list_primary(target: &Arc<Target>, group: GroupId) -> Result<Vec<u64>, WireError> {
    let listing = Arc::clone(target);
    let objects = tokio::task::spawn_blocking(move || {
        listing.list_objects(Space::Mirrored, None, 0, u32::MAX)
    })
    .await
    .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))??
    .0;
    let mut inodes: Vec<u64> = objects.into_iter().map(|(inode, _)| inode.0).collect();
    inodes.extend(
        target
            .moves()
            .sealed_off(group.0)
            .into_iter()
            .map(|inode| inode.0),
    );
    inodes.sort_unstable();
    inodes.dedup();
    Ok(inodes)
}

/// How long a resync waits for its member to sync its target (a `syncfs` of the member's file
/// system, which may hold much more than the group's objects); at most a request's deadline.
const SYNC_TARGET_TIMEOUT: Duration = weft_net::client::REQUEST_TIMEOUT_DEFAULT;

/// With the `resync-waits-at-its-gate` point armed, a resync of a group waits while this
/// file exists in its primary's target directory.
const RESYNC_GATE: &str = "resync-gate";

/// How many times a resync tries to sync its member before it gives up.
const SYNC_TARGET_TRIES: u32 = 3;

/// A server's own clients (its forwards, and its resyncs): ids no client session gets
/// (management numbers sessions from 1).
const OWN_CLIENTS: u64 = 1 << 63;

/// A new client of this server's own: for its forwards (`None`), or for the resyncs of one
/// member in one version of a group whose primary is `primary`. Unique among this server's
/// own clients, and unlikely to repeat after a restart.
fn own_client(primary: Option<TargetId>) -> u64 {
    static SERIAL: OnceLock<AtomicU64> = OnceLock::new();
    let serial = SERIAL.get_or_init(|| {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        AtomicU64::new(u64::from(since_epoch.subsec_nanos()))
    });
    let serial = serial.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff;
    let primary = primary.map_or(0, |target| target.0);
    OWN_CLIENTS | u64::from(primary) << 32 | serial
}

/// The object of a mirrored file's `inode`: a resync reads and writes only these, never an
/// object of a plain file on a member target.
fn mirrored(inode: InodeId) -> ObjectId {
    ObjectId::new(Space::Mirrored, inode)
}

/// The route of a change to `member` of `group` in `version`.
fn member_route(group: GroupId, version: GroupVersion, member: MemberId) -> Route {
    Route {
        target: TargetId::from(member),
        mirror: Some(MirrorRoute {
            group,
            version,
            forwarded: true,
        }),
    }
}

/// A change begun at this primary ([`Mirror::begin`]); dropped before it ended (its request
/// went away), it is given up, so a copy of it still on its way to a member is dropped.
pub(crate) struct Forwarding<'a> {
    forwards: &'a Numbers,
    change: Option<PrimaryChange>,
}

impl Drop for Forwarding<'_> {
    fn drop(&mut self) {
        if let Some(change) = self.change.take() {
            // Ended without an outcome: abandoned.
            let _ = change.end(self.forwards);
        }
    }
}

/// Byte-range locks per object ([`RangeTable`]): a holder keeps every overlapping range of
/// the same object waiting until its guard drops.
#[derive(Default)]
struct RangeLocks {
    table: Mutex<RangeTable<(TargetId, InodeId), Gate>>,
}

/// Locked by a range's holder; waiters queue on it.
type Gate = Arc<tokio::sync::Mutex<()>>;

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
                let mut table = self.table.lock().expect("range locks poisoned");
                let gate = Arc::new(tokio::sync::Mutex::new(()));
                let held = Arc::clone(&gate)
                    .try_lock_owned()
                    .expect("a new gate is free");
                match table.try_lock(&key, range.clone(), || gate) {
                    Ok(id) => {
                        return RangeGuard {
                            locks: self,
                            key,
                            id,
                            _gate: held,
                        }
                    }
                    Err(holder) => Arc::clone(holder),
                }
            };
            // Wakes when the holder's guard drops; then look again.
            drop(busy.lock().await);
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        self.locks
            .table
            .lock()
            .expect("range locks poisoned")
            .unlock(&self.key, self.id);
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
