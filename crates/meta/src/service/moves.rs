//! Moving a file's objects to other targets while it is in use (`weft entry migrate`).
//!
//! A move is planned per file: the slots of its layout whose targets must change, each with
//! the target it goes to, recorded in [`MOVES`] before anything is copied. The file's home
//! then has each old target push its object to the new one ([`StorageRequest::Push`]) in
//! rounds while clients go on reading and writing the old objects; when a round copies little,
//! the move is marked *sealing* and a last push seals each old object (it refuses clients
//! from then on, who fetch the layout again and wait for the new one), copies the last
//! changes and syncs the copy. One commit then switches the layout to the new targets and
//! records the old ones as holding the file's tombstones ([`TOMBSTONES`]), which are
//! removed with the file. Until that commit the old layout is the file's: a crash before it
//! resumes the move (a sealing one with its last pushes, which answer at once where they
//! were done), and nothing a client wrote is lost, since every change to an old object is
//! copied or refused.
//!
//! A target holds one life of a file's object at most while a client may still hold a layout
//! that names it: a file never moves onto a target that is one of its slots or holds one of
//! its tombstones, so a client with a layout however old either reaches the object its
//! layout means or a tombstone that sends it for a new one. A client forgets a file's layout
//! with its last close, and an open fetches it anew; so once no client has the file open
//! (and clients have had their grace period to reclaim opens after a restart), its
//! tombstones are removed ([`Meta::clear_tombstones`]) and their targets may take it again.
//!
//! [`StorageRequest::Push`]: weft_proto::messages::StorageRequest::Push

use super::work::TARGET_RETRY;
use super::Meta;
use crate::store::{load_inode, store_inode, OpError, INODES};
use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;
use weft_proto::error::WireError;
use weft_proto::ids::{GroupId, InodeId, StoragePoolId, TargetId};
use weft_proto::layout::{FileLayout, PatternKind, Slot};
use weft_proto::messages::{FileKind, Response};
use weft_proto::ErrorCode;

/// Files whose objects are moving: inode → postcard [`MoveWork`], in protocol version 5 (a
/// store's `moves` of version 4 is converted when it opens).
pub(crate) const MOVES: TableDefinition<u64, &[u8]> = TableDefinition::new("moves_v5");

/// Slots that hold a tombstone of a file (its objects moved away from them): inode →
/// postcard list of [`SlotId`]s. Their objects are removed with the file's.
pub(crate) const TOMBSTONES: TableDefinition<u64, &[u8]> = TableDefinition::new("tombstones");

/// A slot of a file's layout as a move or a tombstone records it: the id of a target, or of
/// a storage mirror group for a mirrored file, whose layout's kind tells which (as a stored
/// layout's slots do; a file keeps its kind through its moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct SlotId(pub u32);

impl SlotId {
    pub(crate) fn of(slot: Slot) -> SlotId {
        match slot {
            Slot::Target(target) => SlotId(target.0),
            Slot::Group(group) => SlotId(group.0),
        }
    }

    /// The slot this is in a layout of `kind`.
    pub(crate) fn slot(self, kind: PatternKind) -> Slot {
        match kind {
            PatternKind::Raid0 => Slot::Target(TargetId(self.0)),
            PatternKind::Mirrored => Slot::Group(GroupId(self.0)),
        }
    }
}

/// A round that copies at most this much is followed by the last one.
const SMALL_ROUND_BYTES: u64 = 4 << 20;

/// Rounds of a move before its last one, however much each copies.
const ROUNDS_MAX: u32 = 8;

/// How long a migrate request waits for its move before it answers that it still runs.
const MIGRATE_WAIT: Duration = Duration::from_secs(20);

/// A file's move: which slots go where, and how far it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MoveWork {
    /// The move's number, which its pushes carry: the old targets start their copy over
    /// for a move of another number.
    pub id: u64,
    /// `(slot index, slot it leaves, slot it goes to)`: targets, or storage mirror groups for
    /// a mirrored file; for a restripe, every slot of the layout, each with its own id twice.
    pub slots: Vec<(u16, SlotId, SlotId)>,
    /// The file's pool once moved.
    pub pool: StoragePoolId,
    /// Whether the last pushes started: the move only goes forward from here.
    pub sealing: bool,
    /// For a restripe into another pattern: the layout the file gets, on targets that hold
    /// none of its objects or tombstones.
    #[serde(default, with = "weft_proto::wire::since_5")]
    pub layout: Option<FileLayout>,
}

impl MoveWork {
    /// The slots the move copies the objects of a file of `kind` onto.
    pub(crate) fn copies(&self, kind: PatternKind) -> Vec<Slot> {
        match &self.layout {
            Some(layout) => layout.slots().collect(),
            None => self.slots.iter().map(|&(_, _, to)| to.slot(kind)).collect(),
        }
    }

    /// The layout a file laid out as `layout` has once moved: a restripe's new one, or the
    /// same with the moved slots on their new targets (or groups) and in the move's pool.
    pub(super) fn moved_layout(&self, layout: &FileLayout) -> Result<FileLayout, String> {
        if let Some(restriped) = &self.layout {
            return Ok(restriped.clone());
        }
        let kind = layout.pattern.kind;
        let mut slots: Vec<Slot> = layout.slots().collect();
        for &(index, from, to) in &self.slots {
            match slots.get_mut(usize::from(index)) {
                Some(slot) if *slot == from.slot(kind) => *slot = to.slot(kind),
                _ => {
                    return Err(format!(
                        "slot {index} is not on {} any more",
                        from.slot(kind)
                    ))
                }
            }
        }
        let pattern = weft_proto::layout::StripePattern {
            pool: self.pool,
            ..layout.pattern
        };
        Ok(FileLayout::new(pattern, slots))
    }

    /// Whether the file's objects go to their new places through the new layout (see
    /// `StorageRequest::Push::into`): a restripe's, and every move of a mirrored file.
    pub(crate) fn through_layout(&self, kind: PatternKind) -> bool {
        self.layout.is_some() || kind == PatternKind::Mirrored
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &str,
    inode: u64,
    bytes: &[u8],
) -> Result<T, OpError> {
    postcard::from_bytes(bytes).map_err(|error| {
        crate::store::StoreError::damaged(format!("{what} of inode {inode:#x}"), error).into()
    })
}

/// The move of `inode` in flight, if any.
pub(crate) fn load_move(
    table: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<Option<MoveWork>, OpError> {
    match table.get(inode.0)? {
        Some(bytes) => decode("the move", inode.0, bytes.value()).map(Some),
        None => Ok(None),
    }
}

/// Records `work` as the move of `inode`.
fn store_move(
    moves: &mut redb::Table<'_, u64, &'static [u8]>,
    inode: InodeId,
    work: &MoveWork,
) -> Result<(), OpError> {
    let bytes = postcard::to_stdvec(work).expect("moves always encode");
    moves.insert(inode.0, bytes.as_slice())?;
    Ok(())
}

/// The slots that hold tombstones of `inode`.
pub(crate) fn load_tombstones(
    table: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<Vec<SlotId>, OpError> {
    match table.get(inode.0)? {
        Some(bytes) => decode("the tombstones", inode.0, bytes.value()),
        None => Ok(Vec::new()),
    }
}

/// Forgets the move and the tombstones of a file of `kind` being disposed of, and answers
/// the slots whose objects go with it besides its layout's: its tombstones, and the copies
/// of a move in flight.
pub(crate) fn take_moved_objects(
    txn: &WriteTransaction,
    inode: InodeId,
    kind: PatternKind,
) -> Result<Vec<Slot>, OpError> {
    let mut slots: Vec<Slot> = Vec::new();
    let mut tombstones = txn.open_table(TOMBSTONES)?;
    slots.extend(
        load_tombstones(&tombstones, inode)?
            .into_iter()
            .map(|id| id.slot(kind)),
    );
    tombstones.remove(inode.0)?;
    let mut moves = txn.open_table(MOVES)?;
    if let Some(work) = load_move(&moves, inode)? {
        slots.extend(work.copies(kind));
    }
    moves.remove(inode.0)?;
    Ok(slots)
}

fn invalid(message: String) -> OpError {
    OpError::rejected(ErrorCode::InvalidArgument, message)
}

impl Meta {
    /// `weft entry migrate` of one file: plans its move (see the module's notes), records
    /// it and waits a while for the mover to finish it.
    pub(super) async fn migrate(
        &self,
        inode: InodeId,
        pool: Option<StoragePoolId>,
        targets: Vec<TargetId>,
        pattern: Option<(u32, u16)>,
    ) -> Result<Response, OpError> {
        let (record, moving, tombstones) = self.read(|txn| {
            let record = load_inode(&txn.open_table(INODES)?, inode)?;
            let moving = load_move(&txn.open_table(MOVES)?, inode)?;
            let tombstones = load_tombstones(&txn.open_table(TOMBSTONES)?, inode)?;
            Ok((record, moving, tombstones))
        })?;
        if let Some(work) = moving {
            return self.await_move(inode, work.slots.len() as u16).await;
        }
        let layout = match (&record.kind, &record.layout) {
            (FileKind::Regular, Some(layout)) => layout.clone(),
            _ => {
                return Err(invalid(format!(
                    "{inode} is not a regular file: only files move"
                )))
            }
        };
        let kind = layout.pattern.kind;
        let tombstones: Vec<Slot> = match tombstones.is_empty() {
            true => Vec::new(),
            false => self.clear_tombstones(inode, kind, tombstones).await?,
        }
        .into_iter()
        .map(|id| id.slot(kind))
        .collect();
        if layout.pattern.kind == PatternKind::Mirrored && !targets.is_empty() {
            return Err(invalid(format!(
                "{inode} is mirrored: its slots are storage mirror groups, which the file's pool (--pool) gives, not targets"
            )));
        }
        let mut map = self.cluster.map();
        let wanted = pool.or_else(|| targets.first().and_then(|t| map.target(*t)).map(|t| t.pool));
        if wanted.is_some_and(|p| map.pool(p).is_none()) {
            self.cluster
                .refresh_unless_fetched_since(std::time::Instant::now())
                .await;
            map = self.cluster.map();
        }
        let pool = wanted.unwrap_or(layout.pattern.pool);
        if map.pool(pool).is_none() {
            return Err(OpError::rejected(
                ErrorCode::NotFound,
                format!("there is no storage pool {pool}: `weft pool list` shows them"),
            ));
        }
        // 0 keeps the file's own chunk size or width.
        let restriped = pattern
            .map(|(chunk, width)| {
                (
                    if chunk == 0 {
                        layout.pattern.chunk_size_bytes
                    } else {
                        chunk
                    },
                    if width == 0 {
                        layout.width() as u16
                    } else {
                        width
                    },
                )
            })
            .filter(|&(chunk, width)| {
                (chunk, usize::from(width)) != (layout.pattern.chunk_size_bytes, layout.width())
            });
        if let Some((chunk, width)) = restriped {
            let new = plan_restripe(
                &self.chooser,
                &map,
                &layout,
                (pool, chunk, width),
                &targets,
                &tombstones,
            )?;
            let slots: Vec<(u16, SlotId, SlotId)> = layout
                .slots()
                .enumerate()
                .map(|(index, slot)| (index as u16, SlotId::of(slot), SlotId::of(slot)))
                .collect();
            let moving = slots.len() as u16;
            self.record_move(inode, layout, slots, (pool, Some(new)))
                .await?;
            self.mover.notify_one();
            return self.await_move(inode, moving).await;
        }
        let plan = plan_move(&self.chooser, &map, &layout, pool, &targets, &tombstones)?;
        if plan.is_empty() {
            if layout.pattern.pool != pool {
                self.committer
                    .run_with(move |txn| set_pool(txn, inode, pool))
                    .await?;
            }
            return Ok(Response::Migration {
                moving: 0,
                done: true,
            });
        }
        let moving = plan.len() as u16;
        self.record_move(inode, layout, plan, (pool, None)).await?;
        self.mover.notify_one();
        self.await_move(inode, moving).await
    }

    /// Removes the tombstones of `inode`, a file of `kind` (on `held`), if no client can hold
    /// a layout that names them: none has the file open, and the grace period in which
    /// clients reclaim their opens after a restart is over. Answers the tombstones left.
    async fn clear_tombstones(
        &self,
        inode: InodeId,
        kind: PatternKind,
        held: Vec<SlotId>,
    ) -> Result<Vec<SlotId>, OpError> {
        if !self.locks.grace_over() || (self.is_open_fn())(inode) {
            return Ok(held);
        }
        let removals = held.iter().map(|&id| async move {
            self.remove_object(id.slot(kind), inode)
                .await
                .is_ok()
                .then_some(id)
        });
        let removed: Vec<SlotId> = futures::future::join_all(removals)
            .await
            .into_iter()
            .flatten()
            .collect();
        let gone = removed.clone();
        self.committer
            .run_with(move |txn| {
                let mut table = txn.open_table(TOMBSTONES)?;
                let mut held = load_tombstones(&table, inode)?;
                held.retain(|id| !gone.contains(id));
                if held.is_empty() {
                    table.remove(inode.0)?;
                } else {
                    let bytes = postcard::to_stdvec(&held).expect("tombstones always encode");
                    table.insert(inode.0, bytes.as_slice())?;
                }
                Ok(held)
            })
            .await
    }

    /// Records the move of `inode` (laid out as `layout`) by `plan`, into `pool` (and into
    /// the new layout of a restripe), unless another is recorded; refused when the layout
    /// changed since it was read.
    async fn record_move(
        &self,
        inode: InodeId,
        layout: FileLayout,
        plan: Vec<(u16, SlotId, SlotId)>,
        (pool, restriped): (StoragePoolId, Option<FileLayout>),
    ) -> Result<(), OpError> {
        let work = MoveWork {
            id: rand::random(),
            slots: plan,
            pool,
            sealing: false,
            layout: restriped,
        };
        self.committer
            .run_with(move |txn| {
                let current = load_inode(&txn.open_table(INODES)?, inode)?;
                if current.layout.as_ref() != Some(&layout) {
                    return Err(OpError::rejected(
                        ErrorCode::Busy,
                        format!("{inode} changed while its move was planned: ask again"),
                    ));
                }
                let mut moves = txn.open_table(MOVES)?;
                if load_move(&moves, inode)?.is_none() {
                    store_move(&mut moves, inode, &work)?;
                }
                Ok(())
            })
            .await
    }

    /// Finds the files of this home that use a target being drained: counts them per target
    /// (for the heartbeat: `weft target remove` waits for none) and records the moves of
    /// some that have none yet, off the draining targets into their own pools.
    async fn scan_draining(&self) {
        let map = self.cluster.map();
        let draining: Vec<TargetId> = map
            .targets
            .iter()
            .filter(|t| t.draining)
            .map(|t| t.id)
            .collect();
        if draining.is_empty() {
            *self.drain_scan.lock().expect("drain scan poisoned") = DrainScan::default();
            return;
        }
        // Files found unable to move are looked at again only once the map changed (a target
        // added, a pool changed): until then the scan takes others, which may move.
        // Files found unable to move are looked at again every `STUCK_RECHECK_SCANS` scans
        // too: a tombstone that kept a target from them may have gone meanwhile.
        let stuck: HashSet<InodeId> = {
            let mut scan = self.drain_scan.lock().expect("drain scan poisoned");
            scan.scans_since_recheck += 1;
            if scan.scans_since_recheck >= STUCK_RECHECK_SCANS {
                scan.scans_since_recheck = 0;
                scan.stuck.clear();
            }
            if scan.epoch == map.epoch && scan.draining == draining {
                scan.stuck.keys().copied().collect()
            } else {
                HashSet::new()
            }
        };
        let found = self.read(|txn| find_draining(txn, &map, &draining, &stuck));
        let (uses, files, still_stuck) = match found {
            Ok(found) => found,
            Err(error) => {
                tracing::error!(?error, "cannot look for files on draining targets");
                return;
            }
        };
        {
            let mut scan = self.drain_scan.lock().expect("drain scan poisoned");
            if scan.epoch != map.epoch || scan.draining != draining {
                scan.stuck.clear();
            }
            // A stuck file removed (or moved by hand) meanwhile is stuck no more.
            scan.stuck.retain(|inode, _| still_stuck.contains(inode));
            scan.draining = draining.clone();
            scan.uses = uses;
            scan.epoch = map.epoch;
        }
        for (inode, layout) in files {
            let kind = layout.pattern.kind;
            let tombstones: Vec<Slot> = self
                .read(|txn| load_tombstones(&txn.open_table(TOMBSTONES)?, inode))
                .unwrap_or_default()
                .into_iter()
                .map(|id| id.slot(kind))
                .collect();
            let pool = layout.pattern.pool;
            let planned = plan_move(&self.chooser, &map, &layout, pool, &[], &tombstones)
                .map_err(OpError::into_wire);
            let on: Vec<TargetId> = layout
                .slots()
                .flat_map(|slot| map.slot_targets(slot))
                .filter(|target| draining.contains(target))
                .collect();
            let recorded = match planned {
                Ok(plan) if !plan.is_empty() => self
                    .record_move(inode, layout, plan, (pool, None))
                    .await
                    .map_err(OpError::into_wire),
                Ok(_) => Ok(()),
                Err(error) if error.code == ErrorCode::NoTargets => {
                    // It has no place to go: said where an operator looks, not only here.
                    let what = match layout.pattern.kind {
                        PatternKind::Raid0 => "target",
                        PatternKind::Mirrored => "storage mirror group",
                    };
                    let why = format!(
                        "storage pool {pool} has no reachable {what} these files are not on already (a file has one object per {what} and never moves onto one it is on): add {what}s to the pool, or move the files to another pool (`weft entry migrate PATH --pool P`); the drain goes on by itself once they can move"
                    );
                    tracing::warn!(%inode, %error, "a file on a draining target has no place to move to");
                    self.drain_scan
                        .lock()
                        .expect("drain scan poisoned")
                        .stuck
                        .insert(inode, (on, why));
                    continue;
                }
                Err(error) => Err(error),
            };
            if let Err(error) = recorded {
                tracing::warn!(%inode, %error, "a file on a draining target cannot move yet");
            }
        }
    }

    /// Per target the map shows draining, the files of this home that use it and cannot
    /// move off, and why, as the last scans found.
    pub(crate) fn drain_blocked(&self) -> Vec<weft_proto::messages::DrainBlock> {
        let scan = self.drain_scan.lock().expect("drain scan poisoned");
        let mut blocked: std::collections::BTreeMap<TargetId, (u64, &str)> = Default::default();
        for (on, why) in scan.stuck.values() {
            for target in on {
                blocked.entry(*target).or_insert((0, why)).0 += 1;
            }
        }
        blocked
            .into_iter()
            .map(|(target, (files, why))| weft_proto::messages::DrainBlock {
                target,
                files,
                why: why.to_string(),
            })
            .collect()
    }

    /// The bytes this home moved onto (positive) or off each of `targets` since its usage in
    /// the map last changed: a report newer than the moves forgets them.
    fn ledger_now(
        &self,
        targets: &[&weft_proto::messages::TargetInfo],
    ) -> std::collections::HashMap<TargetId, i64> {
        let mut ledger = self.ledger.lock().expect("ledger poisoned");
        for target in targets {
            if ledger
                .get(&target.id)
                .is_some_and(|(seen, _)| *seen != target.usage)
            {
                ledger.remove(&target.id);
            }
        }
        ledger
            .iter()
            .map(|(target, (_, moved))| (*target, *moved))
            .collect()
    }

    /// Per target the map shows draining, the files of this home that use it, as the last
    /// scan found; `None` for a target the last scan did not look for.
    pub(crate) fn drain_uses(&self, target: TargetId) -> Option<u64> {
        let scan = self.drain_scan.lock().expect("drain scan poisoned");
        scan.draining
            .contains(&target)
            .then(|| scan.uses.get(&target).copied().unwrap_or(0))
    }

    /// Waits up to [`MIGRATE_WAIT`] for the move of `inode` to finish.
    async fn await_move(&self, inode: InodeId, moving: u16) -> Result<Response, OpError> {
        let deadline = tokio::time::Instant::now() + MIGRATE_WAIT;
        loop {
            let notified = self.moved.notified();
            if let Some(error) = self
                .move_failures
                .lock()
                .expect("move failures poisoned")
                .remove(&inode)
            {
                return Err(OpError::Rejected(error));
            }
            let pending =
                self.read(|txn| Ok(load_move(&txn.open_table(MOVES)?, inode)?.is_some()))?;
            if !pending {
                return Ok(Response::Migration { moving, done: true });
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Response::Migration {
                    moving,
                    done: false,
                });
            }
        }
    }

    /// Works off the moves recorded, one file at a time, until the home stops.
    pub(super) async fn move_loop(self: Arc<Self>) {
        loop {
            let _ =
                tokio::time::timeout(super::work::WORK_RETRY_INTERVAL, self.mover.notified()).await;
            self.scan_draining().await;
            let works = self.read(|txn| {
                txn.open_table(MOVES)?
                    .iter()?
                    .map(|item| {
                        let (key, value) = item?;
                        let work: MoveWork = decode("the move", key.value(), value.value())?;
                        Ok((InodeId(key.value()), work))
                    })
                    .collect::<Result<Vec<_>, OpError>>()
            });
            let works = match works {
                Ok(works) => works,
                Err(error) => {
                    tracing::error!(?error, "cannot list the moves in flight");
                    continue;
                }
            };
            let idle = works.is_empty();
            for (inode, work) in works {
                match self.move_file(inode, work).await {
                    Ok(()) => {}
                    Err(MoveError::Later(error)) => {
                        tracing::warn!(%inode, %error, "a move waits: it goes on later")
                    }
                    Err(MoveError::Abandoned(error)) => {
                        tracing::warn!(%inode, %error, "a move was given up: the file stays where it was");
                        self.move_failures
                            .lock()
                            .expect("move failures poisoned")
                            .insert(inode, error);
                    }
                }
                self.moved.notify_waiters();
            }
            // Rebalancing waits for the moves asked for, and goes on while there is work.
            if idle && self.rebalance_step().await {
                self.mover.notify_one();
            }
        }
    }

    /// One step of background rebalancing (see `rebalance_candidate`): in the first pool one
    /// of whose slots is further than the margin from the mean fill of the pool's slots of
    /// its kind (its targets, for plain files; its storage mirror groups, each as full as its
    /// fullest member, for mirrored ones), moves one object of a file of this home from the
    /// fullest slot to the emptiest, then waits as long as the rate asks. Fill is judged by
    /// the usage in the map plus what this home moved since a target last reported (the
    /// ledger), so steps need not wait for the heartbeats. Answers whether it moved something.
    async fn rebalance_step(&self) -> bool {
        let (rate, margin) = self.rebalance;
        if rate == 0 {
            return false;
        }
        let margin = f64::from(margin) / 100.0;
        let map = self.cluster.map();
        for pool in map.all_pools() {
            let targets: Vec<&weft_proto::messages::TargetInfo> = map
                .targets
                .iter()
                .filter(|t| {
                    t.pool == pool.id
                        && !t.draining
                        && t.usage.total_bytes > 0
                        && t.reachability == weft_proto::messages::Reachability::Online
                })
                .collect();
            // What the map shows, with what this home moved since the target last reported.
            let ledger = self.ledger_now(&targets);
            let fill = |t: &weft_proto::messages::TargetInfo| {
                let used = t.usage.total_bytes.saturating_sub(t.usage.free_bytes) as f64
                    + ledger.get(&t.id).copied().unwrap_or(0) as f64;
                used / t.usage.total_bytes as f64
            };
            for kind in [PatternKind::Raid0, PatternKind::Mirrored] {
                // Each slot with the targets that hold it, every one of them usable.
                let slots: Vec<(Slot, Vec<&weft_proto::messages::TargetInfo>)> = match kind {
                    PatternKind::Raid0 => targets
                        .iter()
                        .map(|t| (Slot::Target(t.id), vec![*t]))
                        .collect(),
                    PatternKind::Mirrored => map
                        .mirror_groups
                        .iter()
                        .filter(|g| g.kind == weft_proto::messages::MirrorKind::Storage)
                        .filter_map(|g| {
                            let slot = Slot::Group(g.id);
                            let members: Vec<&weft_proto::messages::TargetInfo> = map
                                .slot_targets(slot)
                                .iter()
                                .filter_map(|id| targets.iter().find(|t| t.id == *id).copied())
                                .collect();
                            (members.len() == g.members.len()).then_some((slot, members))
                        })
                        .collect(),
                };
                if slots.len() < 2 {
                    continue;
                }
                let slot_fill = |members: &[&weft_proto::messages::TargetInfo]| {
                    members.iter().map(|t| fill(t)).fold(0.0, f64::max)
                };
                let mean =
                    slots.iter().map(|(_, m)| slot_fill(m)).sum::<f64>() / slots.len() as f64;
                let by_fill =
                    |a: &&(Slot, Vec<&weft_proto::messages::TargetInfo>),
                     b: &&(Slot, Vec<&weft_proto::messages::TargetInfo>)| {
                        slot_fill(&a.1).total_cmp(&slot_fill(&b.1))
                    };
                let (Some(fullest), Some(emptiest)) =
                    (slots.iter().max_by(by_fill), slots.iter().min_by(by_fill))
                else {
                    continue;
                };
                let (full, empty) = (slot_fill(&fullest.1), slot_fill(&emptiest.1));
                if full - mean <= margin && mean - empty <= margin {
                    continue;
                }
                // Half the gap at most, so the two never cross.
                let smallest = emptiest
                    .1
                    .iter()
                    .map(|t| t.usage.total_bytes)
                    .min()
                    .unwrap_or(0);
                let room = ((full - empty) / 2.0 * smallest as f64) as u64;
                let (from, to) = (fullest.0, emptiest.0);
                let found =
                    self.read(|txn| rebalance_candidate(txn, (pool.id, kind), from, to, room));
                let (inode, layout, index, bytes) = match found {
                    Ok(Some(found)) => found,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::warn!(?error, "cannot look for a file to rebalance");
                        return false;
                    }
                };
                let plan = vec![(index, SlotId::of(from), SlotId::of(to))];
                if let Err(error) = self
                    .record_move(inode, layout, plan.clone(), (pool.id, None))
                    .await
                {
                    tracing::debug!(%inode, ?error, "a rebalancing move was not recorded");
                    return false;
                }
                let work = match self.read(|txn| load_move(&txn.open_table(MOVES)?, inode)) {
                    Ok(Some(work)) => work,
                    _ => return false,
                };
                if let Err(MoveError::Later(error) | MoveError::Abandoned(error)) =
                    self.move_file(inode, work).await
                {
                    tracing::warn!(%inode, %error, "a rebalancing move did not finish");
                    return false;
                }
                tracing::info!(%inode, %from, %to, bytes, "rebalanced");
                self.move_metrics.rebalanced.inc_by(bytes);
                {
                    let mut ledger = self.ledger.lock().expect("ledger poisoned");
                    for (members, sign) in [(&fullest.1, -1i64), (&emptiest.1, 1i64)] {
                        for member in members.iter() {
                            ledger.entry(member.id).or_insert((member.usage, 0)).1 +=
                                sign * bytes as i64;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs_f64(bytes as f64 / rate as f64)).await;
                return true;
            }
        }
        false
    }

    /// Runs a file's move to its end (see the module's notes).
    async fn move_file(&self, inode: InodeId, mut work: MoveWork) -> Result<(), MoveError> {
        let kind = match self.read(|txn| Ok(load_inode(&txn.open_table(INODES)?, inode)?.layout)) {
            Ok(Some(layout)) => layout.pattern.kind,
            Ok(None) => {
                return Err(MoveError::Later(WireError::new(
                    ErrorCode::Internal,
                    format!("{inode} moves without a layout"),
                )))
            }
            // Removed with its move meanwhile, or the store cannot be read: the next pass sees.
            Err(error) => return Err(MoveError::Later(error.into_wire())),
        };
        // A file's truncates and its move's rounds exclude each other: a plain move's last
        // round (the old objects refuse truncates once sealed), every round of a restripe
        // (and of a mirrored file's move), which a truncate cuts the copies of too. A truncate
        // still on its way to the targets goes first, unless the last round began: then it
        // waits for the switch (see `apply_truncate_now`).
        let gate = self.truncate_gate(inode);
        let mut held = None;
        if work.through_layout(kind) {
            held = Some(gate.lock().await);
            if !work.sealing {
                match self.apply_truncate_now(inode).await {
                    Ok(()) => {}
                    // A copy's target is gone or refuses: the move cannot be made.
                    Err(error) if gives_up(&error) => {
                        self.abandon_move(inode, &work, kind).await;
                        return Err(MoveError::Abandoned(error));
                    }
                    Err(error) => return Err(MoveError::Later(error)),
                }
            }
        }
        if !work.sealing {
            let mut rounds = 0;
            loop {
                let copied = match self.push_round(inode, &work, false).await {
                    Ok(copied) => copied,
                    Err((error, _)) if gives_up(&error) => {
                        self.abandon_move(inode, &work, kind).await;
                        return Err(MoveError::Abandoned(error));
                    }
                    Err((error, _)) => return Err(MoveError::Later(error)),
                };
                rounds += 1;
                if copied <= SMALL_ROUND_BYTES || rounds >= ROUNDS_MAX {
                    break;
                }
            }
            let through = work.through_layout(kind);
            let sealing = self
                .committer
                .run_with(move |txn| {
                    let mut moves = txn.open_table(MOVES)?;
                    let Some(mut work) = load_move(&moves, inode)? else {
                        return Ok(Sealing::Gone);
                    };
                    // A truncate committed during the rounds goes first (from here on a
                    // truncate waits for the switch: see `set_attr`).
                    if through
                        && txn
                            .open_table(crate::store::TRUNCATES)?
                            .get(inode.0)?
                            .is_some()
                    {
                        return Ok(Sealing::TruncateFirst);
                    }
                    work.sealing = true;
                    store_move(&mut moves, inode, &work)?;
                    Ok(Sealing::Sealed(work))
                })
                .await
                .map_err(|error| MoveError::Later(error.into_wire()))?;
            match sealing {
                Sealing::Sealed(sealing) => work = sealing,
                // The file was removed meanwhile.
                Sealing::Gone => return Ok(()),
                Sealing::TruncateFirst => {
                    self.apply_truncate_now(inode)
                        .await
                        .map_err(MoveError::Later)?;
                    return Err(MoveError::Later(WireError::new(
                        ErrorCode::Busy,
                        format!(
                            "{inode} was truncated during the rounds of its move: they go again"
                        ),
                    )));
                }
            }
            weft_service::failpoint::failpoint("move-after-sealing");
        }
        let _one = match held {
            Some(held) => held,
            None => gate.lock().await,
        };
        match self.push_round(inode, &work, true).await {
            Ok(_) => {}
            Err((error, _)) if gives_up(&error) && work.layout.is_some() => {
                // The old objects that finished their last round gave up their data, which
                // only the new objects hold now: the restripe waits for its targets to take
                // the rest (the file's requests wait meanwhile).
                tracing::error!(%inode, %error, "a restripe's last round cannot finish: it waits for its new targets to have room");
                return Err(MoveError::Later(error));
            }
            Err((error, failed)) if gives_up(&error) => {
                // The new target cannot take it, and the move cannot go back: the sealed old
                // objects keep their data until a copy is complete, so another target gets it.
                self.retarget(inode, &work, &failed).await;
                return Err(MoveError::Later(error));
            }
            Err((error, _)) => return Err(MoveError::Later(error)),
        }
        weft_service::failpoint::failpoint("move-after-last-push");
        // A restriped file's new objects tell which slots hold data, and how long the file
        // is at least (writes not reported yet included).
        let lengths = match &work.layout {
            Some(layout) => Some(
                self.object_lengths(inode, layout)
                    .await
                    .map_err(MoveError::Later)?,
            ),
            None => None,
        };
        let switched = work.clone();
        self.committer
            .run_with(move |txn| switch_layout(txn, inode, &switched, lengths.as_deref()))
            .await
            .map_err(|error| MoveError::Later(error.into_wire()))?;
        tracing::info!(%inode, slots = work.slots.len(), pool = %work.pool, "file moved");
        self.move_metrics.files.inc();
        // A truncate that waited for the switch goes to the new objects now.
        if let Err(error) = self.apply_truncate_now(inode).await {
            tracing::info!(%inode, %error, "a truncate waits for a target");
        }
        Ok(())
    }

    /// One push of every slot of a move, at once; answers the bytes copied. Skipped (0) when
    /// the move is no longer recorded (its file was removed); the file's disposal waits for
    /// the round, so no copy lands after its objects were removed.
    async fn push_round(
        &self,
        inode: InodeId,
        work: &MoveWork,
        seal: bool,
    ) -> Result<u64, (WireError, Vec<u16>)> {
        let _pushing = self.pushing(inode);
        let recorded = self
            .read(|txn| Ok(load_move(&txn.open_table(MOVES)?, inode)?.is_some()))
            .map_err(|error| (error.into_wire(), Vec::new()))?;
        if !recorded {
            return Ok(0);
        }
        let id = work.id;
        let layout = self
            .read(|txn| Ok(load_inode(&txn.open_table(INODES)?, inode)?.layout))
            .map_err(|error| (error.into_wire(), Vec::new()))?
            .ok_or_else(|| {
                let error = WireError::new(
                    ErrorCode::Internal,
                    format!("{inode} moves without a layout"),
                );
                (error, Vec::new())
            })?;
        let kind = layout.pattern.kind;
        // A restripe, and any move of a mirrored file, sends each old object's bytes to their
        // places in the layout the file gets.
        let into = match work.through_layout(kind) {
            true => Some(
                work.moved_layout(&layout)
                    .map_err(|why| (WireError::new(ErrorCode::Internal, why), Vec::new()))?,
            ),
            false => None,
        };
        let pushes = work.slots.iter().map(|&(index, from, to)| {
            let cluster = Arc::clone(&self.cluster);
            let into = into.clone().map(|to| weft_proto::messages::Restripe {
                slot: index,
                from: layout.clone(),
                to,
            });
            async move {
                let call = |storage: Arc<weft_net::StorageClient>,
                            route: weft_proto::messages::Route| {
                    let into = into.clone();
                    // The object's target: the plain one, or the group's primary (a peer of an
                    // older version, which could not push it, is refused by the encoding).
                    let to = match into {
                        Some(_) => route.target,
                        None => TargetId(to.0),
                    };
                    let group = match from.slot(kind) {
                        Slot::Group(group) => Some(group),
                        Slot::Target(_) => None,
                    };
                    async move {
                        storage
                            .push(route.target, inode, to, id, seal, into, group)
                            .await
                    }
                };
                let pushed = cluster
                    .call_storage(from.slot(kind), &TARGET_RETRY, call)
                    .await
                    .map_err(|error| super::rpc_error(error).into_wire());
                (index, pushed)
            }
        });
        let mut copied = 0;
        let mut failed = Vec::new();
        let mut first = None;
        for (index, pushed) in futures::future::join_all(pushes).await {
            match pushed {
                Ok(pushed) => {
                    self.move_metrics.bytes.inc_by(pushed);
                    copied += pushed;
                }
                Err(error) => {
                    failed.push(index);
                    // The error that ends the move, if any, is the one reported.
                    if first.as_ref().is_none_or(|e: &WireError| !gives_up(e)) {
                        first = Some(error);
                    }
                }
            }
        }
        match first {
            Some(error) => Err((error, failed)),
            None => Ok(copied),
        }
    }

    /// Gives the `failed` slots of a sealing move new targets (and the move a new number, so
    /// their sealed old objects copy in full to them); slots whose last push was done keep
    /// theirs (their old objects answer at once).
    async fn retarget(&self, inode: InodeId, work: &MoveWork, failed: &[u16]) {
        let map = self.cluster.map();
        let record = self.read(|txn| {
            let record = load_inode(&txn.open_table(INODES)?, inode)?;
            let tombstones = load_tombstones(&txn.open_table(TOMBSTONES)?, inode)?;
            Ok((record, tombstones))
        });
        let Ok((record, tombstones)) = record else {
            return;
        };
        let Some(layout) = record.layout else {
            return;
        };
        let kind = layout.pattern.kind;
        let mut taken: BTreeSet<Slot> = tombstones.into_iter().map(|id| id.slot(kind)).collect();
        taken.extend(work.slots.iter().map(|&(_, _, to)| to.slot(kind)));
        taken.extend(layout.slots());
        let mut free = free_slots(&self.chooser, &map, &layout, work.pool, &taken).into_iter();
        let mut next = work.clone();
        next.id = rand::random();
        for slot in &mut next.slots {
            if failed.contains(&slot.0) {
                match free.next() {
                    Some(to) => slot.2 = SlotId::of(to),
                    None => {
                        tracing::warn!(%inode, "no target left for a sealed move: it waits for one");
                        return;
                    }
                }
            }
        }
        if self.store_if_moving(inode, next).await.is_ok() {
            // What the last targets were sent goes (fsck would list it).
            for &(index, _, to) in &work.slots {
                if failed.contains(&index) {
                    let _ = self.remove_object(to.slot(kind), inode).await;
                }
            }
        }
    }

    /// Records `next` as the move of `inode`, if it still has one.
    async fn store_if_moving(&self, inode: InodeId, next: MoveWork) -> Result<(), OpError> {
        self.committer
            .run_with(move |txn| {
                let mut moves = txn.open_table(MOVES)?;
                if load_move(&moves, inode)?.is_some() {
                    store_move(&mut moves, inode, &next)?;
                }
                Ok(())
            })
            .await
    }

    /// Forgets a move that cannot be made (before its last pushes) and removes what it
    /// copied.
    async fn abandon_move(&self, inode: InodeId, work: &MoveWork, kind: PatternKind) {
        let forgotten = self
            .committer
            .run_with(move |txn| {
                txn.open_table(MOVES)?.remove(inode.0)?;
                Ok(())
            })
            .await;
        if forgotten.is_err() {
            return;
        }
        for to in work.copies(kind) {
            if let Err(error) = self.remove_object(to, inode).await {
                tracing::warn!(%inode, slot = %to, %error, "the copy of a move given up stays: fsck lists it");
            }
        }
    }

    /// The lengths of the objects of `inode` in `layout`, slot by slot.
    async fn object_lengths(
        &self,
        inode: InodeId,
        layout: &FileLayout,
    ) -> Result<Vec<u64>, WireError> {
        let lengths = layout.slots().map(|slot| async move {
            let call = |storage: Arc<weft_net::StorageClient>, route| async move {
                storage.object_length(route, inode).await
            };
            self.cluster
                .call_storage(slot, &TARGET_RETRY, call)
                .await
                .map_err(|error| super::rpc_error(error).into_wire())
        });
        futures::future::join_all(lengths)
            .await
            .into_iter()
            .collect()
    }

    /// Removes the object of `inode` in `slot` (a copy, or a tombstone).
    async fn remove_object(&self, slot: Slot, inode: InodeId) -> Result<(), weft_net::RpcError> {
        if self.cluster.map().slot_targets(slot).is_empty() {
            // Removed from the cluster with what it held.
            return Ok(());
        }
        let call = |storage: Arc<weft_net::StorageClient>, route| async move {
            storage.remove(route, inode).await
        };
        self.cluster.call_storage(slot, &TARGET_RETRY, call).await
    }

    /// Marks `inode` as having pushes in flight until the guard drops: its disposal waits.
    fn pushing(&self, inode: InodeId) -> PushingGuard<'_> {
        self.pushing
            .lock()
            .expect("pushing set poisoned")
            .insert(inode);
        PushingGuard { meta: self, inode }
    }

    /// Whether pushes of `inode`'s objects are in flight.
    pub(super) fn is_pushing(&self, inode: InodeId) -> bool {
        self.pushing
            .lock()
            .expect("pushing set poisoned")
            .contains(&inode)
    }
}

struct PushingGuard<'a> {
    meta: &'a Meta,
    inode: InodeId,
}

impl Drop for PushingGuard<'_> {
    fn drop(&mut self) {
        self.meta
            .pushing
            .lock()
            .expect("pushing set poisoned")
            .remove(&self.inode);
    }
}

/// What the commit that marks a move sealing found.
enum Sealing {
    Sealed(MoveWork),
    /// The file was removed meanwhile.
    Gone,
    /// A truncate is queued: it goes to the objects (and the rounds again) first.
    TruncateFirst,
}

/// Why a move stopped.
enum MoveError {
    /// It goes on at a later pass (a target is away, the store is busy).
    Later(WireError),
    /// It was given up before its last pushes: the new target cannot take the file.
    Abandoned(WireError),
}

/// What the moves of files report to Prometheus, summed over the homes of a server.
#[derive(Clone, Debug, Default)]
pub(crate) struct MoveMetrics {
    /// Files whose move finished.
    files: prometheus_client::metrics::counter::Counter,
    /// Bytes their pushes copied.
    bytes: prometheus_client::metrics::counter::Counter,
    /// Bytes moved by background rebalancing.
    rebalanced: prometheus_client::metrics::counter::Counter,
}

impl MoveMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> MoveMetrics {
        let metrics = MoveMetrics::default();
        registry.register(
            "weft_meta_moved_files",
            "Files moved to other targets (migrate, drain and rebalancing), since the start",
            metrics.files.clone(),
        );
        registry.register(
            "weft_meta_moved_bytes",
            "Bytes the moves of files copied between targets, since the start",
            metrics.bytes.clone(),
        );
        registry.register(
            "weft_meta_rebalanced_bytes",
            "Bytes background rebalancing moved between targets, since the start",
            metrics.rebalanced.clone(),
        );
        metrics
    }
}

/// A file of this home in `pool`, laid out as `kind`, to move one object of from slot `from`
/// to slot `to` for rebalancing: the one with the largest object in `from` that is at most
/// `room` bytes, among files not on `to` (nor with a tombstone there) and not moving already.
/// Answers the file, its layout, the slot's index and the object's bytes.
fn rebalance_candidate(
    txn: &redb::ReadTransaction,
    (pool, kind): (StoragePoolId, PatternKind),
    from: Slot,
    to: Slot,
    room: u64,
) -> Result<Option<(InodeId, FileLayout, u16, u64)>, OpError> {
    let moves = txn.open_table(MOVES)?;
    let tombstones = txn.open_table(TOMBSTONES)?;
    let mut best: Option<(InodeId, FileLayout, u16, u64)> = None;
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        let record = crate::store::InodeRecord::decode(key.value(), value.value())?;
        let Some(layout) = record.layout else {
            continue;
        };
        if layout.pattern.kind != kind || layout.pattern.pool != pool {
            continue;
        }
        let Some(index) = layout.slots().position(|slot| slot == from) else {
            continue;
        };
        if layout.slots().any(|slot| slot == to) {
            continue;
        }
        let bytes = weft_proto::layout::object_length_for_file_size(&layout, index, record.size);
        if bytes == 0 || bytes > room || best.as_ref().is_some_and(|b| b.3 >= bytes) {
            continue;
        }
        let inode = InodeId(key.value());
        if moves.get(inode.0)?.is_some()
            || load_tombstones(&tombstones, inode)?.contains(&SlotId::of(to))
        {
            continue;
        }
        best = Some((inode, layout, index as u16, bytes));
    }
    Ok(best)
}

/// What the last look for files on draining targets found ([`Meta::scan_draining`]).
#[derive(Default)]
pub(crate) struct DrainScan {
    /// The targets it looked for.
    draining: Vec<TargetId>,
    /// Per target, the files that use it.
    uses: std::collections::HashMap<TargetId, u64>,
    /// The epoch of the map the scans since `stuck` was cleared went by.
    epoch: u64,
    /// Files found with no place to move to, with the draining targets they use and why.
    stuck: std::collections::HashMap<InodeId, (Vec<TargetId>, String)>,
    /// Scans since `stuck` was last emptied to be looked at again.
    scans_since_recheck: u32,
}

/// Scans after which files found unable to move are looked at again even if the map did not
/// change (about a minute at a scan every two seconds).
const STUCK_RECHECK_SCANS: u32 = 30;

/// Files recorded for moving off draining targets per scan: the mover works them off before
/// the next.
const DRAIN_FILES_PER_SCAN: usize = 64;

/// The files of a home that use one of the `draining` targets, counted per target (a slot of
/// a layout, the copy of a move in flight, objects awaiting removal: a target, or a member
/// of a storage mirror group by `map`), and up to [`DRAIN_FILES_PER_SCAN`] of those with a
/// slot there and no move yet, with their layouts, but for those `stuck` (found unable to
/// move under the same map).
#[allow(clippy::type_complexity)]
fn find_draining(
    txn: &redb::ReadTransaction,
    map: &weft_proto::messages::ClusterMap,
    draining: &[TargetId],
    stuck: &HashSet<InodeId>,
) -> Result<
    (
        std::collections::HashMap<TargetId, u64>,
        Vec<(InodeId, FileLayout)>,
        HashSet<InodeId>,
    ),
    OpError,
> {
    let mut still_stuck = HashSet::new();
    let mut uses: std::collections::HashMap<TargetId, u64> = std::collections::HashMap::new();
    let mut files = Vec::new();
    let moves = txn.open_table(MOVES)?;
    let inodes = txn.open_table(INODES)?;
    let mut count = |slots: &mut dyn Iterator<Item = Slot>| {
        let mut counted = BTreeSet::new();
        for target in slots.flat_map(|slot| map.slot_targets(slot)) {
            if draining.contains(&target) && counted.insert(target) {
                *uses.entry(target).or_default() += 1;
            }
        }
        !counted.is_empty()
    };
    for item in inodes.iter()? {
        let (key, value) = item?;
        let record = crate::store::InodeRecord::decode(key.value(), value.value())?;
        let Some(layout) = record.layout else {
            continue;
        };
        let on_draining = count(&mut layout.slots());
        let inode = InodeId(key.value());
        if on_draining && stuck.contains(&inode) {
            still_stuck.insert(inode);
            continue;
        }
        if on_draining && files.len() < DRAIN_FILES_PER_SCAN && moves.get(key.value())?.is_none() {
            files.push((InodeId(key.value()), layout));
        }
    }
    for item in moves.iter()? {
        let (key, value) = item?;
        let work: MoveWork = decode("the move", key.value(), value.value())?;
        let kind = match load_inode(&inodes, InodeId(key.value())) {
            Ok(record) => record.layout.map_or(PatternKind::Raid0, |l| l.pattern.kind),
            Err(_) => continue,
        };
        count(&mut work.copies(kind).into_iter());
    }
    for item in txn.open_table(crate::store::DISPOSALS)?.iter()? {
        let (key, value) = item?;
        let layout: FileLayout = decode("the disposal", key.value(), value.value())?;
        count(&mut layout.slots());
    }
    Ok((uses, files, still_stuck))
}

/// Whether a push's failure means the move cannot be made as planned.
pub(super) fn gives_up(error: &WireError) -> bool {
    matches!(
        error.code,
        ErrorCode::NoSpace
            | ErrorCode::QuotaExceeded
            | ErrorCode::UnknownTarget
            | ErrorCode::TargetPoisoned
    )
}

/// The slots of `layout` that must move for the file to be in `pool` (on `targets`, when
/// given, for a plain file), each with the slot it goes to: never one the file is on or was
/// on (`tombstones`). A slot moves when it is in another pool, or a target holding it is
/// being drained.
fn plan_move(
    chooser: &crate::chooser::Chooser,
    map: &weft_proto::messages::ClusterMap,
    layout: &FileLayout,
    pool: StoragePoolId,
    targets: &[TargetId],
    tombstones: &[Slot],
) -> Result<Vec<(u16, SlotId, SlotId)>, OpError> {
    if !targets.is_empty() && targets.len() != layout.width() {
        return Err(invalid(format!(
            "the file is striped over {} targets: name as many, in stripe order (not {})",
            layout.width(),
            targets.len()
        )));
    }
    let current: Vec<Slot> = layout.slots().collect();
    let mut taken: BTreeSet<Slot> = current.iter().chain(tombstones).copied().collect();
    let moving: Vec<(u16, Slot)> = current
        .iter()
        .enumerate()
        .filter(|&(index, &slot)| match targets.get(index) {
            Some(&wanted) => Slot::Target(wanted) != slot,
            None => map
                .slot_placement(slot)
                .is_none_or(|(its_pool, draining)| its_pool != pool || draining),
        })
        .map(|(index, &slot)| (index as u16, slot))
        .collect();
    if moving.is_empty() {
        return Ok(Vec::new());
    }
    let mut plan = Vec::with_capacity(moving.len());
    if targets.is_empty() {
        let mut free = free_slots(chooser, map, layout, pool, &taken).into_iter();
        for (index, from) in moving {
            let Some(to) = free.next() else {
                let what = match layout.pattern.kind {
                    PatternKind::Raid0 => "targets",
                    PatternKind::Mirrored => "storage mirror groups",
                };
                return Err(OpError::rejected(
                    ErrorCode::NoTargets,
                    format!(
                        "storage pool {pool} has too few reachable {what} this file was never on to take {} of its slots: add {what} to the pool",
                        plan.len() + 1
                    ),
                ));
            };
            plan.push((index, SlotId::of(from), SlotId::of(to)));
        }
        return Ok(plan);
    }
    for (index, from) in moving {
        let to = targets[usize::from(index)];
        let Some(info) = map.target(to) else {
            return Err(OpError::rejected(
                ErrorCode::NotFound,
                format!("there is no target {to}: `weft target list` shows them"),
            ));
        };
        if info.pool != pool {
            return Err(invalid(format!(
                "target {to} is in storage pool {}, not in pool {pool}",
                info.pool
            )));
        }
        if !taken.insert(Slot::Target(to)) {
            return Err(invalid(format!(
                "the file is or was on target {to} already: a file never moves onto a target it was on, so name another"
            )));
        }
        plan.push((index, SlotId::of(from), SlotId(to.0)));
    }
    Ok(plan)
}

/// The layout a file laid out as `layout` gets when restriped into chunks of `chunk` bytes
/// over `width` slots of `pool` (`targets`, when given, for a plain file): slots that hold
/// none of its objects and none of its tombstones, so no client with an old layout reaches
/// a new object.
fn plan_restripe(
    chooser: &crate::chooser::Chooser,
    map: &weft_proto::messages::ClusterMap,
    layout: &FileLayout,
    (pool, chunk, width): (StoragePoolId, u32, u16),
    targets: &[TargetId],
    tombstones: &[Slot],
) -> Result<FileLayout, OpError> {
    let pattern = weft_proto::layout::StripePattern {
        chunk_size_bytes: chunk,
        num_targets: width,
        pool,
        ..layout.pattern
    };
    pattern
        .validate()
        .map_err(|error| invalid(format!("the new pattern: {error}")))?;
    let taken: BTreeSet<Slot> = layout.slots().chain(tombstones.iter().copied()).collect();
    let chosen: Vec<Slot> = if targets.is_empty() {
        free_slots(chooser, map, layout, pool, &taken)
            .into_iter()
            .take(usize::from(width))
            .collect()
    } else {
        if targets.len() != usize::from(width) {
            return Err(invalid(format!(
                "a file restriped over {width} targets needs {width} of them named, not {}",
                targets.len()
            )));
        }
        for target in targets {
            match map.target(*target) {
                None => {
                    return Err(OpError::rejected(
                        ErrorCode::NotFound,
                        format!("there is no target {target}: `weft target list` shows them"),
                    ))
                }
                Some(info) if info.pool != pool => {
                    return Err(invalid(format!(
                        "target {target} is in storage pool {}, not in pool {pool}",
                        info.pool
                    )))
                }
                Some(_) if taken.contains(&Slot::Target(*target)) => {
                    return Err(invalid(format!(
                        "the file is or was on target {target}: a file is restriped onto targets it never was on"
                    )))
                }
                Some(_) if targets.iter().filter(|t| *t == target).count() > 1 => {
                    return Err(invalid(format!(
                        "target {target} is named twice: a file has one object per target"
                    )))
                }
                Some(_) => {}
            }
        }
        targets.iter().copied().map(Slot::Target).collect()
    };
    if chosen.len() < usize::from(width) {
        let what = match layout.pattern.kind {
            PatternKind::Raid0 => "targets",
            PatternKind::Mirrored => "storage mirror groups",
        };
        return Err(OpError::rejected(
            ErrorCode::NoTargets,
            format!(
                "storage pool {pool} has {} reachable {what} this file was never on, and a restripe over {width} needs as many: add {what} to the pool, or move the file to another pool first",
                chosen.len()
            ),
        ));
    }
    Ok(FileLayout::new(pattern, chosen))
}

/// The slots (targets, or storage mirror groups for a mirrored file) of `pool` a file laid
/// out as `layout` could move onto, in the order the chooser takes them, but for those in
/// `taken`.
fn free_slots(
    chooser: &crate::chooser::Chooser,
    map: &weft_proto::messages::ClusterMap,
    layout: &FileLayout,
    pool: StoragePoolId,
    taken: &BTreeSet<Slot>,
) -> Vec<Slot> {
    let pattern = weft_proto::layout::StripePattern {
        num_targets: weft_proto::layout::NUM_TARGETS_MAX,
        pool,
        ..layout.pattern
    };
    chooser
        .choose(map, &pattern)
        .into_iter()
        .filter(|slot| !taken.contains(slot))
        .collect()
}

/// Sets the pool of a file none of whose objects moves.
fn set_pool(txn: &WriteTransaction, inode: InodeId, pool: StoragePoolId) -> Result<(), OpError> {
    let mut inodes = crate::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    if let Some(layout) = &mut record.layout {
        layout.pattern.pool = pool;
    }
    store_inode(&mut inodes, inode, &record)
}

/// The commit that ends a move: the layout names the new targets (a restripe's new layout,
/// whose objects' `lengths` tell the slots that hold data and a least size), the old ones
/// hold the file's tombstones, and the move is forgotten.
fn switch_layout(
    txn: &WriteTransaction,
    inode: InodeId,
    work: &MoveWork,
    lengths: Option<&[u64]>,
) -> Result<(), OpError> {
    let mut moves = txn.open_table(MOVES)?;
    if load_move(&moves, inode)?.is_none() {
        // Removed with its file meanwhile.
        return Ok(());
    }
    moves.remove(inode.0)?;
    let mut inodes = crate::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    let Some(layout) = &record.layout else {
        return Err(OpError::inconsistent(format!(
            "{inode} moved without a layout"
        )));
    };
    let kind = layout.pattern.kind;
    if work.slots.iter().any(|&(index, from, _)| {
        usize::from(index) >= layout.width() || layout.slot(usize::from(index)) != from.slot(kind)
    }) {
        return Err(OpError::inconsistent(format!(
            "the move of {inode} was planned from another layout"
        )));
    }
    let moved = work
        .moved_layout(layout)
        .map_err(|why| OpError::inconsistent(format!("the move of {inode}: {why}")))?;
    if let Some(restriped) = &work.layout {
        let lengths = lengths.unwrap_or_default();
        // Writes not reported yet may have gone past the size; a truncate still to reach
        // the new objects decides it instead.
        if txn
            .open_table(crate::store::TRUNCATES)?
            .get(inode.0)?
            .is_none()
        {
            record.size = record
                .size
                .max(weft_proto::layout::file_size_from_object_lengths(
                    restriped, lengths,
                ));
        }
        let mut written = weft_proto::layout::SlotSet::default();
        for (index, _) in lengths
            .iter()
            .enumerate()
            .filter(|(_, length)| **length > 0)
        {
            written.insert(index);
        }
        crate::store::change_written(txn, inode, |slots| *slots = written)?;
    }
    record.layout = Some(moved.clone());
    store_inode(&mut inodes, inode, &record)?;
    // A truncate still to send goes to the new objects.
    let mut truncates = txn.open_table(crate::store::TRUNCATES)?;
    let queued = truncates
        .get(inode.0)?
        .map(|bytes| decode::<crate::store::TruncateWork>("the truncate", inode.0, bytes.value()))
        .transpose()?;
    if let Some(mut truncate) = queued {
        truncate.layout = moved;
        let bytes = postcard::to_stdvec(&truncate).expect("truncates always encode");
        truncates.insert(inode.0, bytes.as_slice())?;
    }
    let mut tombstones = txn.open_table(TOMBSTONES)?;
    let mut held = load_tombstones(&tombstones, inode)?;
    held.extend(work.slots.iter().map(|&(_, from, _)| from));
    held.sort_unstable();
    held.dedup();
    let bytes = postcard::to_stdvec(&held).expect("tombstones always encode");
    tombstones.insert(inode.0, bytes.as_slice())?;
    Ok(())
}
