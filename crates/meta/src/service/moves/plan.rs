//! Planning a move: which slots of a file go to which targets (a drain, a rebalance, a
//! restripe into another pattern), on targets that hold none of its objects or tombstones;
//! and the commit that switches a moved file to its new layout.

use super::*;

/// A file of this home in `pool`, laid out as `kind`, to move one object of from slot `from`
/// to slot `to` for rebalancing: the one with the largest object in `from` that is at most
/// `room` bytes, among files not on `to` (nor with a tombstone there) and not moving already.
/// Answers the file, its layout, the slot's index and the object's bytes.
pub(super) fn rebalance_candidate(
    txn: &crate::store::ReadTransaction,
    (pool, kind): (StoragePoolId, PatternKind),
    from: Slot,
    to: Slot,
    room: u64,
) -> Result<Option<(InodeId, FileLayout, u16, u64)>, OpError> {
    let moves = MOVES.open(txn)?;
    let tombstones = TOMBSTONES.open(txn)?;
    let mut best: Option<(InodeId, FileLayout, u16, u64)> = None;
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        let record = crate::schema::InodeRecord::decode(key.value(), value.value())?;
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
        if moves.contains(inode.0)?
            || load_tombstones(&tombstones, inode)?.contains(&SlotId::of(to))
        {
            continue;
        }
        best = Some((inode, layout, index as u16, bytes));
    }
    Ok(best)
}

/// The slots of `layout` that must move for the file to be in `pool` (on `targets`, when
/// given, for a plain file), each with the slot it goes to: never one the file is on or was
/// on (`tombstones`). A slot moves when it is in another pool, or a target holding it is
/// being drained.
pub(super) fn plan_move(
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
pub(super) fn plan_restripe(
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
pub(super) fn free_slots(
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
pub(super) fn set_pool(
    txn: &WriteTransaction,
    inode: InodeId,
    pool: StoragePoolId,
) -> Result<(), OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    if let Some(layout) = &mut record.layout {
        layout.pattern.pool = pool;
    }
    store_inode(&mut inodes, inode, &record)
}

/// The commit that ends a move: the layout names the new targets (a restripe's new layout,
/// whose objects' `lengths` tell the slots that hold data and a least size), the old ones
/// hold the file's tombstones, and the move is forgotten.
pub(super) fn switch_layout(
    txn: &WriteTransaction,
    inode: InodeId,
    work: &MoveWork,
    lengths: Option<&[u64]>,
) -> Result<(), OpError> {
    let mut moves = MOVES.open(txn)?;
    if load_move(&moves, inode)?.is_none() {
        // Removed with its file meanwhile.
        return Ok(());
    }
    moves.remove(inode.0)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
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
        if !crate::schema::TRUNCATES.open(txn)?.contains(inode.0)? {
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
        crate::schema::change_written(txn, inode, |slots| *slots = written)?;
    }
    record.layout = Some(moved.clone());
    record.objectless = false;
    store_inode(&mut inodes, inode, &record)?;
    // A truncate still to send goes to the new objects.
    let mut truncates = crate::schema::TRUNCATES.open(txn)?;
    if let Some(mut truncate) = truncates.get(inode.0)? {
        truncate.layout = moved;
        truncates.insert(inode.0, &truncate)?;
    }
    let mut tombstones = TOMBSTONES.open(txn)?;
    let mut held = load_tombstones(&tombstones, inode)?;
    held.extend(work.slots.iter().map(|&(_, from, _)| from));
    held.sort_unstable();
    held.dedup();
    tombstones.insert(inode.0, &held)?;
    Ok(())
}
