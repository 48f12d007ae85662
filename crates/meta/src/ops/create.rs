//! Create (files, symbolic links, FIFOs, sockets, devices), mkdir, link, and the root.

use super::xattr::{inherited_mode_and_acls, store_inherited};
use super::OpContext;
use crate::schema::XATTRS;
use crate::schema::{
    allocate_inode, check_name, insert_dentry, load_dentry, load_dir, load_inode, now, store_inode,
    InodeRecord, OpError, COUNTERS, ENTRIES, FIRST_COOKIE, LINKS_MAX,
};
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::layout::{FileLayout, PatternKind, StripePattern};
use weft_proto::messages::{FileKind, MetaResponse, NewInode, SYMLINK_BYTES_MAX};
use weft_proto::quota::Growth;
use weft_proto::ErrorCode;

const S_ISGID: u32 = 0o2000;

/// The group and mode of a new inode in `parent`: BSD group semantics in set-group-id
/// directories, as Linux file systems do (the group of the directory; subdirectories keep the
/// set-group-id bit).
pub(crate) fn owner_group_and_mode(
    parent: &InodeRecord,
    is_dir: bool,
    mode: u32,
    gid: u32,
) -> (u32, u32) {
    if parent.mode & S_ISGID == 0 {
        return (mode, gid);
    }
    (if is_dir { mode | S_ISGID } else { mode }, parent.gid)
}

/// The directory a new entry goes into: it must exist, not be removed, and not hold `name`.
pub(crate) fn load_parent_for_new(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    entries: &impl ReadableTable<(u64, u64), (u64, u8, &'static str)>,
    parent: InodeId,
    name: &str,
) -> Result<InodeRecord, OpError> {
    check_name(name)?;
    let record = load_dir(inodes, parent)?;
    if record.nlink == 0 {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            "the directory was removed",
        ));
    }
    record.accepts_new_name(parent, name)?;
    if load_dentry(entries, parent, name)?.is_some() {
        return Err(OpError::rejected(
            ErrorCode::Exists,
            format!("{name:?} already exists"),
        ));
    }
    Ok(record)
}

/// A new entry: where, and what (`proto`'s [`NewInode`]).
pub(crate) struct NewEntry {
    pub parent: InodeId,
    pub name: String,
    pub new: NewInode,
}

/// Creates any kind of entry, directories included.
pub(crate) fn create(
    txn: &WriteTransaction,
    context: &OpContext,
    entry: NewEntry,
) -> Result<MetaResponse, OpError> {
    check_name(&entry.name)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut counters = txn.open_table(COUNTERS)?;
    let mut parent = load_parent_for_new(&inodes, &entries, entry.parent, &entry.name)?;
    if let Some(target) = &entry.new.symlink {
        if target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
            return Err(OpError::rejected(
                ErrorCode::NameTooLong,
                "symbolic link target is empty or too long",
            ));
        }
    }
    let pattern = parent.pattern.unwrap_or(StripePattern::DEFAULT);
    let layout = match entry.new.kind {
        FileKind::Regular => Some(new_layout(context, pattern)?),
        _ => None,
    };
    let is_dir = entry.new.kind == FileKind::Directory;
    if is_dir && parent.nlink >= LINKS_MAX {
        return Err(OpError::rejected(
            ErrorCode::TooManyLinks,
            "too many subdirectories",
        ));
    }

    let mut xattrs = txn.open_table(XATTRS)?;
    let (mode, acls) = inherited_mode_and_acls(
        &xattrs,
        entry.parent,
        entry.new.kind,
        entry.new.mode & 0o7777,
        entry.new.umask,
    )?;

    // A user, group or project over its inode quota in the pool makes no new inode.
    let (_, gid) = owner_group_and_mode(&parent, is_dir, mode, entry.new.gid);
    let owner = weft_proto::quota::Owner {
        uid: entry.new.uid,
        gid,
        project: parent.project,
    };
    if let Some(refusal) = context
        .map
        .quota_refusal(owner, pattern.pool, Growth::Inode)
    {
        return Err(OpError::Rejected(refusal));
    }

    // Everything is checked; from here on the operation writes.
    let inode = allocate_inode(&mut counters, context.home)?;
    store_inherited(&mut xattrs, inode, &acls)?;
    let timestamp = now();
    let (mode, gid) = owner_group_and_mode(&parent, is_dir, mode, entry.new.gid);
    let record = InodeRecord {
        mode,
        gid,
        // A regular file is made without data: no object of it exists yet.
        objectless: layout.is_some(),
        layout,
        pattern: is_dir.then_some(pattern),
        project: parent.project,
        xattr_free: acls.is_empty(),
        ..new_record(&entry, timestamp)
    };
    store_inode(&mut inodes, inode, &record)?;
    insert_dentry(
        &mut entries,
        entry.parent,
        &parent,
        &entry.name,
        inode,
        entry.new.kind,
    )?;
    if is_dir {
        parent.nlink += 1;
    }
    parent.touch(timestamp);
    store_inode(&mut inodes, entry.parent, &parent)?;
    Ok(MetaResponse::Created {
        attr: record.to_attr(inode),
        parent: parent.whole_dir_attr(entry.parent),
        capability: None,
        lease_ms: 0,
        parent_lease_ms: 0,
    })
}

/// The layout of a new regular file of `pattern`: slots the chooser picks among the
/// reachable targets (or mirror groups) of its pool.
fn new_layout(context: &OpContext, pattern: StripePattern) -> Result<FileLayout, OpError> {
    let slots = context.chooser.choose(&context.map, &pattern);
    if slots.is_empty() {
        return Err(OpError::rejected(
            ErrorCode::NoTargets,
            match pattern.kind {
                PatternKind::Mirrored => format!(
                    "storage pool {} has no mirror group with a reachable primary (weft mirror autocreate storage)",
                    pattern.pool
                ),
                _ => format!("storage pool {} has no reachable target", pattern.pool),
            },
        ));
    }
    Ok(FileLayout::new(pattern, slots))
}

/// The record of a new entry made at `timestamp`, as its request asks, before what its
/// directory decides (mode, group, layout or pattern, project).
fn new_record(entry: &NewEntry, timestamp: weft_proto::messages::Timestamp) -> InodeRecord {
    let is_dir = entry.new.kind == FileKind::Directory;
    InodeRecord {
        kind: entry.new.kind,
        mode: entry.new.mode,
        nlink: if is_dir { 2 } else { 1 },
        uid: entry.new.uid,
        gid: entry.new.gid,
        size: entry.new.symlink.as_ref().map_or(0, |t| t.len() as u64),
        rdev: entry.new.rdev,
        atime: timestamp,
        mtime: timestamp,
        ctime: timestamp,
        truncate_generation: 0,
        layout: None,
        pattern: None,
        symlink: entry.new.symlink.clone(),
        parent: entry.parent.0,
        next_cookie: FIRST_COOKIE,
        shards: Vec::new(),
        shard_of: 0,
        sealed: None,
        project: 0,
        allocated: 0,
        xattr_free: true,
        objectless: false,
    }
}

/// Adds a hard link to a non-directory.
pub(crate) fn link(
    txn: &WriteTransaction,
    inode: InodeId,
    new_parent: InodeId,
    new_name: &str,
) -> Result<MetaResponse, OpError> {
    check_name(new_name)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut record = load_inode(&inodes, inode)?;
    if record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::NotPermitted,
            "cannot hard-link a directory",
        ));
    }
    if record.nlink == 0 {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            "the file was removed",
        ));
    }
    if record.nlink >= LINKS_MAX {
        return Err(OpError::rejected(
            ErrorCode::TooManyLinks,
            format!("inode {inode} has {} links", record.nlink),
        ));
    }
    let mut parent = load_dir(&inodes, new_parent)?;
    super::check_project(parent.project, record.project)?;
    if load_dentry(&entries, new_parent, new_name)?.is_some() {
        return Err(OpError::rejected(
            ErrorCode::Exists,
            format!("{new_name:?} already exists"),
        ));
    }
    let timestamp = now();
    insert_dentry(
        &mut entries,
        new_parent,
        &parent,
        new_name,
        inode,
        record.kind,
    )?;
    parent.touch(timestamp);
    store_inode(&mut inodes, new_parent, &parent)?;
    record.nlink += 1;
    record.ctime = timestamp;
    if record.parent == 0 {
        // A file that lost track of its names' directories has one again.
        record.parent = new_parent.0;
    }
    store_inode(&mut inodes, inode, &record)?;
    Ok(MetaResponse::Attr(record.to_attr(inode)))
}

/// Creates the root directory if this MDT is its home and it does not exist yet.
pub(crate) fn ensure_root(txn: &WriteTransaction) -> Result<bool, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    if inodes.get(InodeId::ROOT.0)?.is_some() {
        return Ok(false);
    }
    let record = InodeRecord::new_directory(0o755, 0, 0, InodeId::ROOT, StripePattern::DEFAULT);
    store_inode(&mut inodes, InodeId::ROOT, &record)?;
    Ok(true)
}
