//! Setattr (mode, owner, times, truncate), size reports from writers, and directory patterns.
//!
//! The MDT owns a file's size. A truncate is one transaction here — new size, next truncate
//! generation, and a durable truncate work item — followed by the work on the targets. Writers
//! report sizes tagged with the generation they wrote in; a report from an older generation is
//! dropped, so a write that raced a truncate cannot resurrect the old size.

use crate::commit::Answered;
use crate::schema::{
    change_written, load_dir, load_inode, now, store_inode, InodeRecord, OpError, TruncateWork,
    INODES, TRUNCATES, UNREPORTED,
};
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::layout::{object_length_for_file_size, PatternKind, SlotSet, StripePattern};
use weft_proto::messages::{AttrChanges, FileKind, MetaResponse, SizeReport, TimeSet};
use weft_proto::ErrorCode;

fn resolve(time: TimeSet) -> weft_proto::messages::Timestamp {
    match time {
        TimeSet::Now => now(),
        TimeSet::At(timestamp) => timestamp,
    }
}

/// Starts a truncate of `inode` to its record's size under a new truncate generation: the
/// work that cuts every object of the file to what that size leaves it, queued for the
/// targets. The caller stores the record.
pub(crate) fn queue_truncate(
    txn: &WriteTransaction,
    inode: InodeId,
    record: &mut InodeRecord,
) -> Result<(), OpError> {
    record.truncate_generation += 1;
    let work = TruncateWork {
        generation: record.truncate_generation,
        size: record.size,
        layout: record
            .layout
            .clone()
            .ok_or_else(|| OpError::inconsistent(format!("regular file {inode} has no layout")))?,
    };
    TRUNCATES.open(txn)?.insert(inode.0, &work)?;
    // Slots the new size leaves no byte on hold no data after the cut.
    change_written(txn, inode, |written| {
        written.retain(|index| object_length_for_file_size(&work.layout, index, work.size) > 0);
    })
}

/// Refuses what a change would add to a user, group or project its quota blocks in the
/// inode's pool (`QuotaExceeded`, EDQUOT): a chown (or a change of project) hands the inode,
/// and a file's bytes, to its new owner; a truncate that extends a file grows its bytes as a
/// write would.
fn quota_admits(
    map: &weft_proto::messages::ClusterMap,
    record: &InodeRecord,
    changes: &AttrChanges,
) -> Result<(), OpError> {
    use weft_proto::quota::{Growth, Owner};
    let pool = crate::schema::usage::pool_of(record);
    let bytes = if record.kind == FileKind::Regular {
        record.size
    } else {
        0
    };
    let now = record.owner();
    let new = Owner {
        uid: changes.uid.unwrap_or(now.uid),
        gid: changes.gid.unwrap_or(now.gid),
        project: changes.project.unwrap_or(now.project),
    };
    let counted: Vec<_> = now.ids().collect();
    for (kind, id) in new.ids().filter(|ids| !counted.contains(ids)) {
        let refusal = map
            .quota_refusal_of(kind, id, pool, Growth::Inode)
            .or_else(|| {
                (bytes > 0)
                    .then(|| map.quota_refusal_of(kind, id, pool, Growth::Bytes))
                    .flatten()
            });
        if let Some(refusal) = refusal {
            return Err(OpError::Rejected(refusal));
        }
    }
    if changes.size.is_some_and(|size| size > record.size) {
        if let Some(refusal) = map.quota_refusal(new, pool, Growth::Bytes) {
            return Err(OpError::Rejected(refusal));
        }
    }
    Ok(())
}

/// Applies attribute changes; returns the new attributes and whether truncate work was queued.
pub(crate) fn set_attr(
    txn: &WriteTransaction,
    inode: InodeId,
    changes: AttrChanges,
    map: &weft_proto::messages::ClusterMap,
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    quota_admits(map, &record, &changes)?;
    if let Some(size) = changes.size {
        match record.kind {
            FileKind::Regular => {}
            FileKind::Directory => {
                return Err(OpError::rejected(
                    ErrorCode::IsDirectory,
                    "cannot truncate a directory",
                ))
            }
            _ => {
                return Err(OpError::rejected(
                    ErrorCode::InvalidArgument,
                    "can only truncate regular files",
                ))
            }
        }
        if size > i64::MAX as u64 {
            return Err(OpError::rejected(
                ErrorCode::InvalidArgument,
                "size too large",
            ));
        }
        // The last copies of a restripe (or of a mirrored file's move) copy what the old
        // objects hold in their own truncate generation: a truncate waits for the switch.
        let moves = crate::schema::MOVES.open(txn)?;
        if let Some(work) = crate::schema::load_move(&moves, inode)? {
            let kind = record.layout.as_ref().map(|layout| layout.pattern.kind);
            if work.sealing && kind.is_some_and(|kind| work.through_layout(kind)) {
                return Err(OpError::rejected(
                    ErrorCode::Busy,
                    format!("{inode} is making the last copies of its move: its truncate waits for them"),
                ));
            }
        }
    }
    let timestamp = now();
    if let Some(mode) = changes.mode {
        record.mode = mode & 0o7777;
    }
    if let Some(uid) = changes.uid {
        record.uid = uid;
    }
    if let Some(gid) = changes.gid {
        record.gid = gid;
    }
    if let Some(project) = changes.project {
        record.project = project;
    }
    if let Some(atime) = changes.atime {
        record.atime = resolve(atime);
    }
    if let Some(mtime) = changes.mtime {
        record.mtime = resolve(mtime);
    }
    if let Some(size) = changes.size {
        record.size = size;
        // The truncate cuts every object past the size, what was allocated there too.
        record.allocated = 0;
        if changes.mtime.is_none() {
            record.mtime = timestamp;
        }
        // Objects may hold bytes past the new size even when it grows (a larger size reported
        // earlier and then truncated), so every truncate queues work; targets cut only longer
        // objects.
        queue_truncate(txn, inode, &mut record)?;
    }
    record.ctime = timestamp;
    store_inode(&mut inodes, inode, &record)?;
    Ok(MetaResponse::Attr(record.to_attr(inode)))
}

/// A writer's size report: the largest report of the current generation wins. It may be
/// answered before its commit is synced when the file was still listed in [`UNREPORTED`] and
/// the writer did not ask for a durable size (fsync asks): the listing goes in the same
/// commit, and a start recomputes the sizes of the files listed. Close promises visibility,
/// not durability; only fsync waits for the disk.
pub(crate) fn report_size(
    txn: &WriteTransaction,
    inode: InodeId,
    report: SizeReport,
) -> Result<(MetaResponse, Answered), OpError> {
    let response = apply_size(
        txn,
        inode,
        (report.size, report.truncate_generation, report.allocated),
        report.modified,
        report.written,
    )?;
    let listed = txn.open_table(UNREPORTED)?.remove(inode.0)?.is_some();
    let answered = if listed && !report.durable {
        Answered::Committed
    } else {
        Answered::Durable
    };
    Ok((response, answered))
}

/// What the objects of a file showed in truncate generation `generation`: the slots whose
/// objects hold bytes, and the size they give if it is larger than the file's.
pub(crate) struct FoundSize {
    pub generation: u64,
    pub written: SlotSet,
    pub grown: Option<u64>,
}

/// A size recomputed from the objects (when they could be read): raises the size, records
/// the slots that hold data, and takes the file off [`UNREPORTED`]. A file removed meanwhile
/// only leaves the list.
pub(crate) fn settle_size(
    txn: &WriteTransaction,
    inode: InodeId,
    found: Option<FoundSize>,
) -> Result<MetaResponse, OpError> {
    let response = match found {
        Some(found) if txn.open_table(INODES)?.get(inode.0)?.is_some() => {
            // The writer's report was lost: if the objects hold more than the size, its
            // writes changed the file.
            let size = found.grown.unwrap_or(0);
            let grown = found.grown.is_some();
            apply_size(
                txn,
                inode,
                (size, found.generation, 0),
                grown,
                found.written,
            )?
        }
        _ => MetaResponse::Done,
    };
    txn.open_table(UNREPORTED)?.remove(inode.0)?;
    Ok(response)
}

/// Raises the size of `inode` to `size` if `generation` is current, records the slots
/// `written` in it, and moves its mtime and ctime to now if the writes `modified` it.
fn apply_size(
    txn: &WriteTransaction,
    inode: InodeId,
    (size, generation, allocated): (u64, u64, u64),
    modified: bool,
    written: SlotSet,
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    if record.kind != FileKind::Regular {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "size reports are for regular files",
        ));
    }
    let timestamp = now();
    if generation == record.truncate_generation && size > record.size {
        record.size = size;
    }
    if generation == record.truncate_generation {
        record.allocated = record.allocated.max(allocated);
    }
    if generation == record.truncate_generation && modified {
        record.touch(timestamp);
    }
    // Reported or recomputed: its writers may have made objects, whatever they wrote.
    record.objectless = false;
    store_inode(&mut inodes, inode, &record)?;
    if generation == record.truncate_generation && !written.is_empty() {
        // A report sent as the file was restriped may name slots of its old pattern: those
        // past the layout's width are no slots of it.
        let width = record.layout.as_ref().map_or(0, |layout| layout.width());
        let mut written = written;
        written.retain(|index| index < width);
        change_written(txn, inode, |slots| slots.extend(written))?;
    }
    Ok(MetaResponse::Attr(record.to_attr(inode)))
}

/// Removes a truncate work item once every target applied it, unless a newer one replaced it.
pub(crate) fn finish_truncate(
    txn: &WriteTransaction,
    inode: InodeId,
    generation: u64,
) -> Result<MetaResponse, OpError> {
    let mut truncates = TRUNCATES.open(txn)?;
    // A record that does not decode is left for fsck.
    let current = truncates
        .get(inode.0)
        .map(|work| work.map(|work| work.generation));
    if let Ok(Some(current)) = current {
        if current == generation {
            truncates.remove(inode.0)?;
        }
    }
    Ok(MetaResponse::Done)
}

/// Sets a directory's stripe pattern. `slots` is how many its pool has (targets, or mirror
/// groups for a mirrored pattern): a pattern that asks for more is refused when it changes the
/// pool or the width (a file would get fewer than asked without a word), and kept when only
/// its chunk size or its kind changes (the width was asked of another pool or kind before:
/// `weft entry info` says when a file gets fewer).
pub(crate) fn set_pattern(
    txn: &WriteTransaction,
    dir: InodeId,
    pattern: StripePattern,
    slots: usize,
) -> Result<MetaResponse, OpError> {
    pattern
        .validate()
        .map_err(|error| OpError::rejected(ErrorCode::InvalidArgument, error.to_string()))?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_dir(&inodes, dir)?;
    let changes_width = record.pattern.is_none_or(|current| {
        (current.pool, current.num_targets) != (pattern.pool, pattern.num_targets)
    });
    if changes_width && slots < usize::from(pattern.num_targets) {
        let what = match pattern.kind {
            PatternKind::Raid0 => "targets",
            PatternKind::Mirrored => "storage mirror groups",
        };
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            format!(
                "storage pool {} has {slots} {what}, fewer than the {} asked: ask for fewer (--num-targets) or add to the pool (weft pool add-target)",
                pattern.pool, pattern.num_targets
            ),
        ));
    }
    record.pattern = Some(pattern);
    record.ctime = now();
    store_inode(&mut inodes, dir, &record)?;
    Ok(MetaResponse::Attr(record.to_attr(dir)))
}
