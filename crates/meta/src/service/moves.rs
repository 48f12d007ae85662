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

mod drain;
mod plan;

pub(crate) use drain::DrainScan;
use plan::{free_slots, plan_move, plan_restripe, rebalance_candidate, set_pool, switch_layout};

use super::targets::{ends_a_move, TARGET_RETRY, WORK_RETRY_INTERVAL};
use super::Meta;
use crate::schema::{
    load_inode, load_move, load_tombstones, store_inode, MoveWork, OpError, SlotId, INODES, MOVES,
    TOMBSTONES,
};
use crate::store::{ReadableTable, WriteTransaction};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use weft_proto::error::WireError;
use weft_proto::ids::{InodeId, StoragePoolId, TargetId};
use weft_proto::layout::{FileLayout, PatternKind, Slot};
use weft_proto::messages::{FileKind, MetaResponse};
use weft_proto::ErrorCode;

/// A round that copies at most this much is followed by the last one.
const SMALL_ROUND_BYTES: u64 = 4 << 20;

/// Rounds of a move before its last one, however much each copies.
const ROUNDS_MAX: u32 = 8;

/// How long a migrate request waits for its move before it answers that it still runs.
const MIGRATE_WAIT: Duration = Duration::from_secs(20);

fn invalid(message: String) -> OpError {
    OpError::rejected(ErrorCode::InvalidArgument, message)
}

/// What the moves subsystem keeps of a home beside its tables: the mover's wake-ups, the
/// moves given up, the files being pushed, the last drain scan, background rebalancing's
/// settings and ledger, and its metrics.
pub(crate) struct MoveState {
    /// Wakes the mover (a move was recorded).
    pub(super) mover: Notify,
    /// Woken by the mover after each file it worked on.
    moved: Notify,
    /// Moves given up, with why, until their migrate request hears it.
    failures: Mutex<HashMap<InodeId, WireError>>,
    /// Files whose objects are being pushed to other targets now: their disposal waits.
    pushing: Mutex<HashSet<InodeId>>,
    /// What the last look for files on draining targets found.
    drain_scan: Mutex<DrainScan>,
    /// How background rebalancing runs: bytes per second at most (0: not at all), and the
    /// margin of fill it keeps targets within, in percentage points.
    rebalance: (u64, u8),
    metrics: MoveMetrics,
    /// Per target, the usage the map showed when rebalancing last moved an object onto or
    /// off it, and the bytes it moved since.
    ledger: Mutex<HashMap<weft_proto::ids::TargetId, (weft_proto::messages::SpaceUsage, i64)>>,
}

impl MoveState {
    /// Nothing moving yet, rebalancing as `rebalance` says (bytes per second, margin).
    pub(crate) fn new(rebalance: (u64, u8), metrics: MoveMetrics) -> MoveState {
        MoveState {
            mover: Notify::new(),
            moved: Notify::new(),
            failures: Mutex::default(),
            pushing: Mutex::default(),
            drain_scan: Mutex::default(),
            rebalance,
            metrics,
            ledger: Mutex::default(),
        }
    }
}

/// The slots of `kind` a rebalancing step may move between, each with the targets that hold
/// it, every one of them among the usable `targets`: the targets themselves for plain files,
/// the storage mirror groups all of whose members are usable for mirrored ones.
fn usable_slots<'a>(
    map: &'a weft_proto::messages::ClusterMap,
    targets: &[&'a weft_proto::messages::TargetInfo],
    kind: PatternKind,
) -> Vec<(Slot, Vec<&'a weft_proto::messages::TargetInfo>)> {
    match kind {
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
    }
}

/// The chunk size and width a file laid out as `layout` is restriped to when a migration asks
/// for `(chunk, width)` (0 keeps the file's own), or `None` when that is the file's own.
fn restriped(layout: &FileLayout, (chunk, width): (u32, u16)) -> Option<(u32, u16)> {
    let chunk = if chunk == 0 {
        layout.pattern.chunk_size_bytes
    } else {
        chunk
    };
    let width = if width == 0 {
        layout.width() as u16
    } else {
        width
    };
    ((chunk, usize::from(width)) != (layout.pattern.chunk_size_bytes, layout.width()))
        .then_some((chunk, width))
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
    ) -> Result<MetaResponse, OpError> {
        let (record, moving, tombstones) = self.read(|txn| {
            let record = load_inode(&txn.open_table(INODES)?, inode)?;
            let moving = load_move(&MOVES.open(txn)?, inode)?;
            let tombstones = load_tombstones(&TOMBSTONES.open(txn)?, inode)?;
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
        if let Some((chunk, width)) = pattern.and_then(|pattern| restriped(&layout, pattern)) {
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
            self.moves.mover.notify_one();
            return self.await_move(inode, moving).await;
        }
        let plan = plan_move(&self.chooser, &map, &layout, pool, &targets, &tombstones)?;
        if plan.is_empty() {
            if layout.pattern.pool != pool {
                self.committer
                    .run_with(move |txn| set_pool(txn, inode, pool))
                    .await?;
            }
            return Ok(MetaResponse::Migration {
                moving: 0,
                done: true,
            });
        }
        let moving = plan.len() as u16;
        self.record_move(inode, layout, plan, (pool, None)).await?;
        self.moves.mover.notify_one();
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
                let mut table = TOMBSTONES.open(txn)?;
                let mut held = load_tombstones(&table, inode)?;
                held.retain(|id| !gone.contains(id));
                if held.is_empty() {
                    table.remove(inode.0)?;
                } else {
                    table.insert(inode.0, &held)?;
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
                let mut moves = MOVES.open(txn)?;
                if load_move(&moves, inode)?.is_none() {
                    moves.insert(inode.0, &work)?;
                }
                Ok(())
            })
            .await
    }

    /// Waits up to [`MIGRATE_WAIT`] for the move of `inode` to finish.
    async fn await_move(&self, inode: InodeId, moving: u16) -> Result<MetaResponse, OpError> {
        let deadline = tokio::time::Instant::now() + MIGRATE_WAIT;
        loop {
            let notified = self.moves.moved.notified();
            if let Some(error) = self
                .moves
                .failures
                .lock()
                .expect("move failures poisoned")
                .remove(&inode)
            {
                return Err(OpError::Rejected(error));
            }
            let pending = self.read(|txn| Ok(load_move(&MOVES.open(txn)?, inode)?.is_some()))?;
            if !pending {
                return Ok(MetaResponse::Migration { moving, done: true });
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(MetaResponse::Migration {
                    moving,
                    done: false,
                });
            }
        }
    }

    /// Works off the moves recorded, one file at a time, until the home stops.
    pub(super) async fn move_loop(self: Arc<Self>) {
        // What clients replay comes before anything this home does on its own.
        self.recovery.wait_closed().await;
        loop {
            let _ = tokio::time::timeout(WORK_RETRY_INTERVAL, self.moves.mover.notified()).await;
            self.scan_draining().await;
            let works = self.read(|txn| {
                let works = MOVES.open(txn)?.all()?;
                Ok(works
                    .into_iter()
                    .map(|(inode, work)| (InodeId(inode), work))
                    .collect::<Vec<_>>())
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
                        self.moves
                            .failures
                            .lock()
                            .expect("move failures poisoned")
                            .insert(inode, error);
                    }
                }
                self.moves.moved.notify_waiters();
            }
            // Rebalancing waits for the moves asked for, and goes on while there is work.
            if idle && self.rebalance_step().await {
                self.moves.mover.notify_one();
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
        let (rate, margin) = self.moves.rebalance;
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
                let slots = usable_slots(&map, &targets, kind);
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
                if !self.rebalance_move(inode, layout, plan, pool.id).await {
                    return false;
                }
                tracing::info!(%inode, %from, %to, bytes, "rebalanced");
                self.moves.metrics.rebalanced.inc_by(bytes);
                {
                    let mut ledger = self.moves.ledger.lock().expect("ledger poisoned");
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

    /// Records the rebalancing move `plan` of `inode` (laid out as `layout`, staying in
    /// `pool`) and makes it; answers whether it finished.
    async fn rebalance_move(
        &self,
        inode: InodeId,
        layout: FileLayout,
        plan: Vec<(u16, SlotId, SlotId)>,
        pool: StoragePoolId,
    ) -> bool {
        if let Err(error) = self.record_move(inode, layout, plan, (pool, None)).await {
            tracing::debug!(%inode, ?error, "a rebalancing move was not recorded");
            return false;
        }
        let work = match self.read(|txn| load_move(&MOVES.open(txn)?, inode)) {
            Ok(Some(work)) => work,
            _ => return false,
        };
        if let Err(MoveError::Later(error) | MoveError::Abandoned(error)) =
            self.move_file(inode, work).await
        {
            tracing::warn!(%inode, %error, "a rebalancing move did not finish");
            return false;
        }
        true
    }

    /// Records that `inode`'s move makes its last round (a move through the file's layout,
    /// `through`, first lets a truncate committed during the rounds reach the targets, and
    /// has the rounds go again). Answers the move as recorded, or `None` when the file was
    /// removed meanwhile.
    async fn mark_sealing(
        &self,
        inode: InodeId,
        through: bool,
    ) -> Result<Option<MoveWork>, MoveError> {
        let sealing = self
            .committer
            .run_with(move |txn| {
                let mut moves = MOVES.open(txn)?;
                let Some(mut work) = load_move(&moves, inode)? else {
                    return Ok(Sealing::Gone);
                };
                // A truncate committed during the rounds goes first (from here on a
                // truncate waits for the switch: see `set_attr`).
                if through && crate::schema::TRUNCATES.open(txn)?.contains(inode.0)? {
                    return Ok(Sealing::TruncateFirst);
                }
                work.sealing = true;
                moves.insert(inode.0, &work)?;
                Ok(Sealing::Sealed(work))
            })
            .await
            .map_err(|error| MoveError::Later(error.into_wire()))?;
        match sealing {
            Sealing::Sealed(sealing) => Ok(Some(sealing)),
            Sealing::Gone => Ok(None),
            Sealing::TruncateFirst => {
                self.apply_truncate_now(inode)
                    .await
                    .map_err(MoveError::Later)?;
                Err(MoveError::Later(WireError::new(
                    ErrorCode::Busy,
                    format!("{inode} was truncated during the rounds of its move: they go again"),
                )))
            }
        }
    }

    /// The pattern kind of the file `inode` that moves.
    fn moving_kind(&self, inode: InodeId) -> Result<weft_proto::layout::PatternKind, MoveError> {
        match self.read(|txn| Ok(load_inode(&txn.open_table(INODES)?, inode)?.layout)) {
            Ok(Some(layout)) => Ok(layout.pattern.kind),
            Ok(None) => Err(MoveError::Later(WireError::new(
                ErrorCode::Internal,
                format!("{inode} moves without a layout"),
            ))),
            // Removed with its move meanwhile, or the store cannot be read: the next pass sees.
            Err(error) => Err(MoveError::Later(error.into_wire())),
        }
    }

    /// Runs a file's move to its end (see the module's notes).
    async fn move_file(&self, inode: InodeId, mut work: MoveWork) -> Result<(), MoveError> {
        let kind = self.moving_kind(inode)?;
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
                    Err(error) if ends_a_move(&error) => {
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
                    Err((error, _)) if ends_a_move(&error) => {
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
            match self.mark_sealing(inode, work.through_layout(kind)).await? {
                Some(sealing) => work = sealing,
                // The file was removed meanwhile.
                None => return Ok(()),
            }
            weft_service::failpoint::failpoint("move-after-sealing");
        }
        let _one = match held {
            Some(held) => held,
            None => gate.lock().await,
        };
        match self.push_round(inode, &work, true).await {
            Ok(_) => {}
            Err((error, _)) if ends_a_move(&error) && work.layout.is_some() => {
                // The old objects that finished their last round gave up their data, which
                // only the new objects hold now: the restripe waits for its targets to take
                // the rest (the file's requests wait meanwhile).
                tracing::error!(%inode, %error, "a restripe's last round cannot finish: it waits for its new targets to have room");
                return Err(MoveError::Later(error));
            }
            Err((error, failed)) if ends_a_move(&error) => {
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
        self.moves.metrics.files.inc();
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
            .read(|txn| Ok(load_move(&MOVES.open(txn)?, inode)?.is_some()))
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
                Ok(weft_proto::answer::Pushed { copied: pushed }) => {
                    self.moves.metrics.bytes.inc_by(pushed);
                    copied += pushed;
                }
                Err(error) => {
                    failed.push(index);
                    // The error that ends the move, if any, is the one reported.
                    if first.as_ref().is_none_or(|e: &WireError| !ends_a_move(e)) {
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
            let tombstones = load_tombstones(&TOMBSTONES.open(txn)?, inode)?;
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
                let mut moves = MOVES.open(txn)?;
                if load_move(&moves, inode)?.is_some() {
                    moves.insert(inode.0, &next)?;
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
                MOVES.open(txn)?.remove(inode.0)?;
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
        self.moves
            .pushing
            .lock()
            .expect("pushing set poisoned")
            .insert(inode);
        PushingGuard { meta: self, inode }
    }

    /// Whether pushes of `inode`'s objects are in flight.
    pub(super) fn is_pushing(&self, inode: InodeId) -> bool {
        self.moves
            .pushing
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
            .moves
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
