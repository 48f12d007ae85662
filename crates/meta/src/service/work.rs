//! Background work of a home: queued truncates sent to the targets, objects of removed
//! files disposed of, sizes settled from the objects after a crash, and the loop that runs
//! them.

use super::targets::{TARGET_RETRY, WORK_RETRY_INTERVAL};
use super::{rpc_error, Meta};
use crate::ops::lookup::get_attr;
use crate::ops::setattr::{finish_truncate, settle_size, FoundSize};
use crate::schema::{OpError, DISPOSALS, INODES, TRUNCATES, UNREPORTED};
use crate::store::ReadableTable;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use weft_net::StorageClient;
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::layout::{object_length_for_file_size, FileLayout, Slot, SlotSet};
use weft_proto::messages::MetaResponse;
use weft_proto::ErrorCode;

/// What the background work loop of a home works through beside its tables.
pub(crate) struct Background {
    /// Wakes the work loop.
    pub(super) work: tokio::sync::Notify,
    /// Files listed in [`UNREPORTED`] when this home started, whose sizes the work loop
    /// recomputes from their objects: a report of theirs may have been lost with the
    /// process.
    pub(super) unreported: Mutex<std::collections::BTreeSet<InodeId>>,
    /// Whether the work loop has made its first attempt at those sizes: requests wait for it,
    /// so no reader sees a size a crash cut short.
    pub(super) settled: tokio::sync::watch::Sender<bool>,
    /// Held while objects of removed files are deleted, and by fsck while it lists objects and
    /// checks them: an object deleted between the two would look like one without a file.
    pub(super) disposing: tokio::sync::Mutex<()>,
    /// Disposed files whose rows the next commit forgets: a pass before it skips them.
    forgetting: Arc<Mutex<HashSet<InodeId>>>,
    /// Held per inode while its queued truncate is sent to the targets: a setattr's truncate
    /// and the work loop's retry of it never run at once, so no retry of an older attempt can
    /// land after the setattr was answered and cut the writes that followed it.
    truncating: Mutex<std::collections::HashMap<InodeId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Default for Background {
    fn default() -> Background {
        Background {
            work: tokio::sync::Notify::new(),
            unreported: Mutex::default(),
            settled: tokio::sync::watch::Sender::new(false),
            disposing: tokio::sync::Mutex::new(()),
            forgetting: Arc::default(),
            truncating: Mutex::default(),
        }
    }
}

/// Files whose sizes a start recomputes at once.
pub(super) const SETTLE_AT_ONCE: usize = 32;

/// The least time between two passes of the work loop.
const WORK_GATHER: std::time::Duration = std::time::Duration::from_millis(20);

/// Files whose objects are removed together and then forgotten in one commit.
pub(super) const DISPOSE_BATCH_FILES: usize = 64;

/// Works off the durable queues: truncates that did not reach all targets and objects of
/// removed files. A target that is down gets its work when it comes back.
pub(super) async fn work_loop(meta: Arc<Meta>) {
    // What clients replay comes before anything this home does on its own, and before what
    // the store says is left to do.
    meta.recovery.wait_closed().await;
    meta.recover_from_store();
    let mut last_pass = tokio::time::Instant::now();
    loop {
        let _ = tokio::time::timeout(WORK_RETRY_INTERVAL, meta.background.work.notified()).await;
        // Every change wakes the loop: under a stream of them, a pass takes what the changes
        // of the last moments queued (one removal request per target for all their files,
        // not one per file) instead of a pass per change.
        tokio::time::sleep_until(last_pass + WORK_GATHER).await;
        last_pass = tokio::time::Instant::now();
        // First: requests wait for it, and finishing an intent may ask another server.
        meta.settle_unreported().await;
        meta.finish_expiries().await;
        meta.dispose_unclaimed_orphans().await;
        meta.recover_intents().await;
        meta.tell_settled().await;
        let syncs: Vec<InodeId> = meta
            .intents
            .shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .iter()
            .copied()
            .collect();
        for dir in syncs {
            meta.sync_shards(dir).await;
        }
        let pending = meta.read(|txn| {
            let truncates = TRUNCATES.open(txn)?.keys()?;
            let disposals = DISPOSALS.open(txn)?.each(1024)?;
            Ok((truncates, disposals))
        });
        let Ok((truncates, disposals)) = pending else {
            continue;
        };
        for inode in truncates {
            if let Err(error) = meta.apply_truncate(InodeId(inode)).await {
                tracing::debug!(%error, "truncate still pending");
            }
        }
        let files: Vec<(InodeId, FileLayout)> = disposals
            .into_iter()
            .filter_map(|(inode, layout)| match layout {
                Ok(layout) => Some((InodeId(inode), layout)),
                Err(error) => {
                    tracing::error!(inode, %error, "damaged disposal record");
                    None
                }
            })
            .collect();
        for batch in files.chunks(DISPOSE_BATCH_FILES) {
            meta.dispose_objects(batch).await;
        }
    }
}

/// The spread directories whose home is here.
pub(super) fn spread_directories(
    txn: &crate::store::ReadTransaction,
) -> Result<Vec<InodeId>, OpError> {
    let mut dirs = Vec::new();
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        if !crate::schema::InodeRecord::decode(key.value(), value.value())?
            .shards
            .is_empty()
        {
            dirs.push(InodeId(key.value()));
        }
    }
    Ok(dirs)
}

impl Meta {
    /// Raises a file's size to what its objects hold, as a report of the current truncate
    /// generation, and takes it off [`UNREPORTED`]: for the files of a client that went away
    /// and those still listed at a start. False, the file still listed, while a truncate has to
    /// reach the targets (the objects may hold bytes past the size then), while a move of its
    /// objects makes its last copies, or while one of its
    /// slots is in `unreachable`, the slots that failed earlier in this pass (a slot that
    /// fails now joins them): a target that is down costs one wait per pass, not one per file.
    pub(super) async fn settle_size(
        &self,
        inode: InodeId,
        unreachable: Option<&Mutex<HashSet<Slot>>>,
    ) -> Result<bool, OpError> {
        let (attr, truncating, listed) = self.read(|txn| {
            let attr = match get_attr(txn, inode) {
                Ok(MetaResponse::Attr(attr)) => Some(attr),
                Ok(_) => None,
                Err(OpError::Rejected(error)) if error.code == ErrorCode::NotFound => None,
                Err(error) => return Err(error),
            };
            // A sealing move's old objects may have given up their data already: the size
            // is settled from the new ones, once the move switched to them.
            let truncating = TRUNCATES.open(txn)?.contains(inode.0)?
                || crate::schema::load_move(&crate::schema::MOVES.open(txn)?, inode)?
                    .is_some_and(|work| work.sealing);
            let listed = txn.open_table(UNREPORTED)?.get(inode.0)?.is_some();
            Ok((attr, truncating, listed))
        })?;
        let failed = |slot: &Slot| {
            unreachable.is_some_and(|failed| {
                failed
                    .lock()
                    .expect("unreachable slots poisoned")
                    .contains(slot)
            })
        };
        let found = match attr.and_then(|attr| Some((attr.layout.clone()?, attr))) {
            Some(_) if truncating => return Ok(false),
            Some((layout, _)) if layout.slots().any(|slot| failed(&slot)) => return Ok(false),
            Some((layout, attr)) => {
                let lengths = layout.slots().map(|slot| {
                    self.cluster
                        .call_storage(slot, &TARGET_RETRY, move |storage, route| async move {
                            storage.object_length(route, inode).await
                        })
                });
                let mut found = Vec::with_capacity(layout.width());
                let mut error = None;
                for (slot, length) in layout.slots().zip(futures::future::join_all(lengths).await) {
                    match length {
                        Ok(length) => found.push(length),
                        Err(failure) => {
                            if let Some(unreachable) = unreachable {
                                unreachable
                                    .lock()
                                    .expect("unreachable slots poisoned")
                                    .insert(slot);
                            }
                            error.get_or_insert(failure);
                        }
                    }
                }
                if let Some(error) = error {
                    return Err(rpc_error(error));
                }
                let size = weft_proto::layout::file_size_from_object_lengths(&layout, &found);
                let mut written = SlotSet::default();
                for (index, _) in found.iter().enumerate().filter(|(_, length)| **length > 0) {
                    written.insert(index);
                }
                Some(FoundSize {
                    generation: attr.truncate_generation,
                    written,
                    grown: (size > attr.size).then_some(size),
                })
            }
            None => None,
        };
        let grown = found.as_ref().and_then(|found| found.grown);
        let has_data = found
            .as_ref()
            .is_some_and(|found| !found.written.is_empty());
        if grown.is_some() || has_data || listed {
            self.committer
                .run(Box::new(move |txn| settle_size(txn, inode, found)))
                .await?;
        }
        if let Some(size) = grown {
            tracing::info!(%inode, size, "size recovered from the objects");
        }
        Ok(true)
    }

    /// Settles the sizes of the files listed in [`UNREPORTED`] when this home started, some
    /// at once; after the first attempt requests no longer wait (a target that is down keeps
    /// its files listed until it is back).
    pub(super) async fn settle_unreported(&self) {
        use futures::StreamExt;
        let listed: Vec<InodeId> = self
            .background
            .unreported
            .lock()
            .expect("unreported set poisoned")
            .iter()
            .copied()
            .collect();
        let unreachable = Mutex::new(HashSet::new());
        let unreachable = &unreachable;
        let mut settling = futures::stream::iter(listed)
            .map(|inode| async move { (inode, self.settle_size(inode, Some(unreachable)).await) })
            .buffer_unordered(SETTLE_AT_ONCE);
        while let Some((inode, settled)) = settling.next().await {
            match settled {
                Ok(true) => {
                    self.background
                        .unreported
                        .lock()
                        .expect("unreported set poisoned")
                        .remove(&inode);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%inode, ?error, "could not recompute a size from the objects; retrying");
                }
            }
        }
        if !*self.background.settled.borrow() {
            let waiting = self
                .background
                .unreported
                .lock()
                .expect("unreported set poisoned")
                .len();
            tracing::info!(
                waiting,
                "sizes recomputed at the start; requests are served (files on targets that are away wait for them)"
            );
        }
        self.start_serving();
    }

    /// Lets requests through, once the sizes of the files open at a crash are settled, and
    /// starts the grace period in which clients reclaim their opens and locks.
    pub(super) fn start_serving(&self) {
        self.locks.start_grace();
        self.background.settled.send_replace(true);
    }

    /// Applies a queued truncate on every target of the file, then retires the work item.
    pub(super) async fn apply_truncate(&self, inode: InodeId) -> Result<(), WireError> {
        let gate = self.truncate_gate(inode);
        let _one = gate.lock().await;
        self.apply_truncate_now(inode).await
    }

    /// The lock a truncate of `inode` sent to its targets holds (and the last pushes of its
    /// move, which its old objects refuse truncates during); forgotten with its last user.
    pub(super) fn truncate_gate(&self, inode: InodeId) -> TruncateGate<'_> {
        let gate = Arc::clone(
            self.background
                .truncating
                .lock()
                .expect("truncate locks poisoned")
                .entry(inode)
                .or_default(),
        );
        TruncateGate {
            meta: self,
            inode,
            gate,
        }
    }

    /// Sends `inode`'s queued truncate, if any, to every target; the caller holds its lock.
    ///
    /// While the file moves through a new layout (a restripe, or a mirrored file's move),
    /// the objects copied so far are cut too, in the same generation, so the old and the new
    /// objects stay alike: the next round copies the cut objects again into new ones that
    /// take the generation's writes. (Cut on the old objects alone, the new ones held bytes of
    /// the generation before and refused every later copy as waiting for the truncate, which
    /// never came: the move never finished.) From the move's last round on, the old objects
    /// must not change, and the truncate waits for the move's switch, which gives it the new
    /// layout (`Unavailable` meanwhile).
    pub(super) async fn apply_truncate_now(&self, inode: InodeId) -> Result<(), WireError> {
        let queued = self
            .read(|txn| {
                let Ok(Some(work)) = TRUNCATES.open(txn)?.get(inode.0) else {
                    return Ok(None);
                };
                let moving = crate::schema::load_move(&crate::schema::MOVES.open(txn)?, inode)?;
                Ok(Some((work, moving)))
            })
            .map_err(OpError::into_wire)?;
        let Some((work, moving)) = queued else {
            return Ok(());
        };
        self.on_disk_before_acting()
            .await
            .map_err(OpError::into_wire)?;
        let old: Vec<(Slot, u64)> = work
            .layout
            .slots()
            .enumerate()
            .map(|(index, slot)| {
                let length = object_length_for_file_size(&work.layout, index, work.size);
                (slot, length)
            })
            .collect();
        let mut copies: Vec<(Slot, u64)> = Vec::new();
        if let Some(moving) = moving.filter(|m| m.through_layout(work.layout.pattern.kind)) {
            if moving.sealing {
                return Err(WireError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "{inode} is making the last copies of its move: its truncate goes to \
                         the new objects once the move is done"
                    ),
                ));
            }
            let new = moving.moved_layout(&work.layout).map_err(|why| {
                WireError::new(ErrorCode::Internal, format!("the move of {inode}: {why}"))
            })?;
            copies.extend(
                new.slots()
                    .enumerate()
                    .filter(|(_, slot)| !work.layout.slots().any(|old| old == *slot))
                    .map(|(index, slot)| {
                        (slot, object_length_for_file_size(&new, index, work.size))
                    }),
            );
        }
        let cut = |cuts: Vec<(Slot, u64)>| {
            let generation = work.generation;
            futures::future::join_all(cuts.into_iter().map(move |(slot, length)| {
                let cluster = Arc::clone(&self.cluster);
                async move {
                    let call = |storage: Arc<StorageClient>, route| async move {
                        storage.truncate(route, (inode, generation), length).await
                    };
                    cluster.call_storage(slot, &TARGET_RETRY, call).await
                }
            }))
        };
        let unreached = |error: weft_net::RpcError| {
            WireError::new(
                ErrorCode::Io,
                format!("truncate of {inode} could not reach a target: {error}"),
            )
        };
        // The old objects first: each waits there for a push of it still running (its
        // copies, of the generation before, land before the copies are cut).
        for result in cut(old).await {
            result.map_err(unreached)?;
        }
        for result in cut(copies).await {
            result.map_err(|error| {
                // A copy whose target is gone or refuses ends the move (see `move_file`).
                let refused = rpc_error(error.clone()).into_wire();
                if super::targets::ends_a_move(&refused) {
                    refused
                } else {
                    unreached(error)
                }
            })?;
        }
        let generation = work.generation;
        self.committer
            .run(Box::new(move |txn| finish_truncate(txn, inode, generation)))
            .await
            .map_err(OpError::into_wire)?;
        Ok(())
    }

    /// Makes what this home's store shows durable before the home acts on it outside the
    /// store (removes or cuts objects). A home answering before the sync shows a client's
    /// change at once; if a crash then lost it with its client, its objects would be gone or
    /// cut under a file that is back. Changes answered after their sync are shown only once
    /// on disk. A sync of the change log, with no commit of its own: a pass that finds it
    /// synced already costs nothing.
    async fn on_disk_before_acting(&self) -> Result<(), OpError> {
        if !self.answers_before_sync {
            return Ok(());
        }
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || db.sync_log())
            .await
            .map_err(|error| {
                crate::schema::StoreError::Sync(Arc::new(std::io::Error::other(error)))
            })?
            .map_err(OpError::from)
    }

    /// Removes the objects of removed files, with one request per target (or storage mirror
    /// group) for every file of the batch with an object there, all at once, then forgets the
    /// files whose objects are all gone in the next commit, synced with
    /// the next change that syncs (a crash before it only makes the next pass remove nothing
    /// again).
    pub(super) async fn dispose_objects(&self, files: &[(InodeId, FileLayout)]) {
        let _disposing = self.background.disposing.lock().await;
        let forgetting = Arc::clone(&self.background.forgetting);
        // A push of a file's move in flight could make a copy again after its removal. Taken
        // out of the set's lock, which is not held across the removals.
        let files: Vec<_> = {
            let forgotten = forgetting.lock().expect("forgotten files poisoned");
            files
                .iter()
                .filter(|(inode, _)| !self.is_pushing(*inode) && !forgotten.contains(inode))
                .collect()
        };
        if files.is_empty() || self.on_disk_before_acting().await.is_err() {
            return;
        }
        // One request per slot for every file of the batch with an object there.
        let map = self.cluster.map();
        let mut by_slot: std::collections::BTreeMap<Slot, Vec<InodeId>> =
            std::collections::BTreeMap::new();
        for (inode, layout) in &files {
            // A target removed from the cluster took its objects with it, and a storage
            // mirror group removed with its member the tombstones it held.
            for slot in layout
                .slots()
                .filter(|slot| !map.slot_targets(*slot).is_empty())
            {
                by_slot.entry(slot).or_default().push(*inode);
            }
        }
        let removals = by_slot.into_iter().map(|(slot, inodes)| async move {
            let removed = self.remove_objects(slot, &inodes).await;
            (slot, removed.is_ok())
        });
        let failed: HashSet<Slot> = futures::future::join_all(removals)
            .await
            .into_iter()
            .filter_map(|(slot, removed)| (!removed).then_some(slot))
            .collect();
        let disposed: Vec<InodeId> = files
            .iter()
            .filter(|(_, layout)| layout.slots().all(|slot| !failed.contains(&slot)))
            .map(|(inode, _)| *inode)
            .collect();
        if disposed.is_empty() {
            return;
        }
        // Forgotten in the next commit, without a sync of its own: the rows only ask for
        // removals already made, and a crash that loses them makes the next pass remove
        // nothing again (inode numbers are not reused, and a later change synced carries the
        // removal of the rows with it).
        let forgotten = Forgetting::new(forgetting, disposed);
        self.committer.tidy(Box::new(move |txn| {
            let mut queue = DISPOSALS.open(txn)?;
            for inode in &forgotten.inodes {
                queue.remove(inode.0)?;
            }
            Ok(())
        }));
    }
}

impl Meta {
    /// Removes the objects of `inodes` on `slot`: in one request, or one per object from a
    /// storage server of a version before batches.
    async fn remove_objects(
        &self,
        slot: Slot,
        inodes: &[InodeId],
    ) -> Result<(), weft_net::RpcError> {
        let batch = |storage: Arc<StorageClient>, route| async move {
            storage.remove_objects(route, inodes.to_vec()).await
        };
        match self.cluster.call_storage(slot, &TARGET_RETRY, batch).await {
            Err(error) if error.code() == ErrorCode::VersionMismatch => {}
            removed => return removed,
        }
        for inode in inodes {
            let one = |storage: Arc<StorageClient>, route| async move {
                storage.remove(route, *inode).await
            };
            self.cluster.call_storage(slot, &TARGET_RETRY, one).await?;
        }
        Ok(())
    }
}

/// Disposed files whose rows are being forgotten: skipped by the passes until the commit that
/// forgets them applied it, or failed (then the rows stay, and the next pass removes them
/// again).
struct Forgetting {
    set: Arc<Mutex<HashSet<InodeId>>>,
    inodes: Vec<InodeId>,
}

impl Forgetting {
    fn new(set: Arc<Mutex<HashSet<InodeId>>>, inodes: Vec<InodeId>) -> Forgetting {
        set.lock()
            .expect("forgotten files poisoned")
            .extend(inodes.iter().copied());
        Forgetting { set, inodes }
    }
}

impl Drop for Forgetting {
    fn drop(&mut self) {
        let mut set = self.set.lock().expect("forgotten files poisoned");
        for inode in &self.inodes {
            set.remove(inode);
        }
    }
}

/// A held truncate lock of one file ([`Meta::truncate_gate`]).
pub(super) struct TruncateGate<'a> {
    meta: &'a Meta,
    inode: InodeId,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl std::ops::Deref for TruncateGate<'_> {
    type Target = tokio::sync::Mutex<()>;

    fn deref(&self) -> &Self::Target {
        &self.gate
    }
}

impl Drop for TruncateGate<'_> {
    fn drop(&mut self) {
        let mut gates = self
            .meta
            .background
            .truncating
            .lock()
            .expect("truncate locks poisoned");
        // The table's entry and this one: nobody else waits.
        if Arc::strong_count(&self.gate) == 2 {
            gates.remove(&self.inode);
        }
    }
}
