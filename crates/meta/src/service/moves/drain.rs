//! Drains: the files on targets being drained are found a few at a time and moved off; the
//! ones that cannot move are counted with the reason, and management hears how many files
//! each drained target still holds.

use super::*;

impl Meta {
    /// Finds the files of this home that use a target being drained: counts them per target
    /// (for the heartbeat: `weft target remove` waits for none) and records the moves of
    /// some that have none yet, off the draining targets into their own pools.
    pub(super) async fn scan_draining(&self) {
        let map = self.cluster.map();
        let draining: Vec<TargetId> = map
            .targets
            .iter()
            .filter(|t| t.draining)
            .map(|t| t.id)
            .collect();
        if draining.is_empty() {
            *self.moves.drain_scan.lock().expect("drain scan poisoned") = DrainScan::default();
            return;
        }
        // Files found unable to move are looked at again only once the map changed (a target
        // added, a pool changed): until then the scan takes others, which may move.
        // Files found unable to move are looked at again every `STUCK_RECHECK_SCANS` scans
        // too: a tombstone that kept a target from them may have gone meanwhile.
        let stuck: HashSet<InodeId> = {
            let mut scan = self.moves.drain_scan.lock().expect("drain scan poisoned");
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
            let mut scan = self.moves.drain_scan.lock().expect("drain scan poisoned");
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
                .read(|txn| load_tombstones(&TOMBSTONES.open(txn)?, inode))
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
                    self.moves
                        .drain_scan
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
        let scan = self.moves.drain_scan.lock().expect("drain scan poisoned");
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
    pub(super) fn ledger_now(
        &self,
        targets: &[&weft_proto::messages::TargetInfo],
    ) -> std::collections::HashMap<TargetId, i64> {
        let mut ledger = self.moves.ledger.lock().expect("ledger poisoned");
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
        let scan = self.moves.drain_scan.lock().expect("drain scan poisoned");
        scan.draining
            .contains(&target)
            .then(|| scan.uses.get(&target).copied().unwrap_or(0))
    }
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
pub(super) const STUCK_RECHECK_SCANS: u32 = 30;

/// Files recorded for moving off draining targets per scan: the mover works them off before
/// the next.
pub(super) const DRAIN_FILES_PER_SCAN: usize = 64;

/// The files of a home that use one of the `draining` targets, counted per target (a slot of
/// a layout, the copy of a move in flight, objects awaiting removal: a target, or a member
/// of a storage mirror group by `map`), and up to [`DRAIN_FILES_PER_SCAN`] of those with a
/// slot there and no move yet, with their layouts, but for those `stuck` (found unable to
/// move under the same map).
#[allow(clippy::type_complexity)]
pub(super) fn find_draining(
    txn: &crate::store::ReadTransaction,
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
    let moves = MOVES.open(txn)?;
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
        let record = crate::schema::InodeRecord::decode(key.value(), value.value())?;
        let Some(layout) = record.layout else {
            continue;
        };
        let on_draining = count(&mut layout.slots());
        let inode = InodeId(key.value());
        if on_draining && stuck.contains(&inode) {
            still_stuck.insert(inode);
            continue;
        }
        if on_draining && files.len() < DRAIN_FILES_PER_SCAN && !moves.contains(key.value())? {
            files.push((InodeId(key.value()), layout));
        }
    }
    for (inode, work) in moves.all()? {
        let kind = match load_inode(&inodes, InodeId(inode)) {
            Ok(record) => record.layout.map_or(PatternKind::Raid0, |l| l.pattern.kind),
            Err(_) => continue,
        };
        count(&mut work.copies(kind).into_iter());
    }
    for (_, layout) in crate::schema::DISPOSALS.open(txn)?.all()? {
        count(&mut layout.slots());
    }
    Ok((uses, files, still_stuck))
}
