//! Unlink and rmdir, and what happens to an inode whose last link goes: its objects are queued
//! for disposal, or, while a client still has it open, it waits on the orphan list.

use crate::schema::XATTRS;
use crate::schema::{
    dir_is_empty, load_dentry, load_dir, load_inode, now, store_inode, take_name, Dentry,
    InodeRecord, OpError, DISPOSALS, ENTRIES, ORPHANS, TRUNCATES, UNREPORTED, WRITTEN,
};
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::messages::MetaResponse;
use weft_proto::ErrorCode;

/// Drops one link of a non-directory inode, a name in directory `from` (`None`: a directory
/// of another home); the last link disposes of it or makes it an orphan. A file that keeps
/// names forgets its parent when the name that went may have been in it.
pub(crate) fn drop_link(
    txn: &WriteTransaction,
    inodes: &mut crate::schema::usage::Inodes<'_>,
    (inode, from): (InodeId, Option<InodeId>),
    mut record: InodeRecord,
    is_open: bool,
) -> Result<(), OpError> {
    debug_assert!(
        record.nlink > 0,
        "dropping a link of an inode without links"
    );
    record.nlink = record.nlink.saturating_sub(1);
    record.ctime = now();
    if record.nlink > 0 {
        let parent = InodeId(record.parent);
        if from.map_or(parent.home() != inode.home(), |dir| dir == parent) {
            record.parent = 0;
        }
        return store_inode(inodes, inode, &record);
    }
    if is_open {
        store_inode(inodes, inode, &record)?;
        txn.open_table(ORPHANS)?.insert(inode.0, 0)?;
        return Ok(());
    }
    dispose(txn, inodes, inode, &record)
}

/// Deletes an inode and queues its objects for removal.
pub(crate) fn dispose(
    txn: &WriteTransaction,
    inodes: &mut crate::schema::usage::Inodes<'_>,
    inode: InodeId,
    record: &InodeRecord,
) -> Result<(), OpError> {
    inodes.remove(inode)?;
    super::xattr::remove_all(&mut txn.open_table(XATTRS)?, inode)?;
    txn.open_table(ORPHANS)?.remove(inode.0)?;
    TRUNCATES.open(txn)?.remove(inode.0)?;
    // A file still listed was opened for writing and never reported: its writer may have
    // made objects.
    let listed = txn.open_table(UNREPORTED)?.remove(inode.0)?.is_some();
    WRITTEN.open(txn)?.remove(inode.0)?;
    if let Some(layout) = &record.layout {
        // Objects its moves left, or one in flight made, go with it.
        let moved = crate::schema::take_moved_objects(txn, inode, layout.pattern.kind)?;
        let mut slots: Vec<_> = if record.objectless && !listed {
            Vec::new()
        } else {
            layout.slots().collect()
        };
        slots.extend(
            moved
                .into_iter()
                .filter(|slot| !slots.contains(slot))
                .collect::<Vec<_>>(),
        );
        if slots.is_empty() {
            return Ok(());
        }
        let layout = weft_proto::layout::FileLayout::new(layout.pattern, slots);
        DISPOSALS.open(txn)?.insert(inode.0, &layout)?;
    }
    Ok(())
}

/// The dentry `name` in `parent` and the inode it names, or `NotFound`.
pub(crate) fn load_named(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    entries: &impl ReadableTable<(u64, u64), (u64, u8, &'static str)>,
    parent: InodeId,
    name: &str,
) -> Result<(Dentry, InodeRecord), OpError> {
    let dentry = load_dentry(entries, parent, name)?
        .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?;
    let record = load_inode(inodes, dentry.child)?;
    Ok((dentry, record))
}

/// What a removal of `name` from directory `parent` works on, once no cross-server operation
/// in flight holds the name: the directory's record, the entry, and the record it names.
fn to_remove(
    txn: &WriteTransaction,
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    entries: &crate::schema::Entries<'_>,
    parent: InodeId,
    name: &str,
) -> Result<(InodeRecord, Dentry, InodeRecord), OpError> {
    let parent_record = load_dir(inodes, parent)?;
    let (dentry, record) = load_named(inodes, entries, parent, name)?;
    super::intent::check_not_in_flight(txn, parent, name, None)?;
    Ok((parent_record, dentry, record))
}

pub(crate) fn unlink(
    txn: &WriteTransaction,
    parent: InodeId,
    name: &str,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let (parent_record, dentry, record) = to_remove(txn, &inodes, &entries, parent, name)?;
    if record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::IsDirectory,
            format!("{name:?} is a directory"),
        ));
    }
    let after = take_name(&mut inodes, &mut entries, (parent, parent_record), dentry)?;
    drop_link(
        txn,
        &mut inodes,
        (dentry.child, Some(parent)),
        record,
        is_open(dentry.child),
    )?;
    Ok(MetaResponse::Removed {
        parent: after.whole_dir_attr(parent),
    })
}

pub(crate) fn rmdir(
    txn: &WriteTransaction,
    parent: InodeId,
    name: &str,
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let (parent_record, dentry, record) = to_remove(txn, &inodes, &entries, parent, name)?;
    if !record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("{name:?} is not a directory"),
        ));
    }
    if !record.shards.is_empty() {
        return Err(OpError::inconsistent(format!(
            "{name:?} is a spread directory: its rmdir takes the spread path"
        )));
    }
    if !dir_is_empty(&entries, dentry.child)? {
        return Err(OpError::rejected(
            ErrorCode::NotEmpty,
            format!("{name:?} is not empty"),
        ));
    }
    let after = take_name(&mut inodes, &mut entries, (parent, parent_record), dentry)?;
    inodes.remove(dentry.child)?;
    super::xattr::remove_all(&mut txn.open_table(XATTRS)?, dentry.child)?;
    Ok(MetaResponse::Removed {
        parent: after.whole_dir_attr(parent),
    })
}

/// Disposes of an orphan once its last open is released.
pub(crate) fn release_orphan(
    txn: &WriteTransaction,
    inode: InodeId,
) -> Result<MetaResponse, OpError> {
    let orphaned = txn.open_table(ORPHANS)?.get(inode.0)?.is_some();
    if !orphaned {
        return Ok(MetaResponse::Done);
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let record = load_inode(&inodes, inode)?;
    if record.nlink == 0 {
        dispose(txn, &mut inodes, inode, &record)?;
    } else {
        txn.open_table(ORPHANS)?.remove(inode.0)?;
    }
    Ok(MetaResponse::Done)
}

/// The files unlinked while open, from the `ORPHANS` table of any transaction.
pub(crate) fn list_orphans(
    table: &impl ReadableTable<u64, u64>,
) -> Result<std::collections::HashSet<InodeId>, OpError> {
    let mut orphans = std::collections::HashSet::new();
    for item in table.iter()? {
        orphans.insert(InodeId(item?.0.value()));
    }
    Ok(orphans)
}
