//! Lookup, getattr, readdir (with attributes or without) and readlink: read-only, on a
//! snapshot.

use crate::schema::{
    check_name, kind_from_code, load_dentry, load_dir, load_inode, OpError, ENTRIES, INODES,
};
use crate::store::{ReadTransaction, ReadableTable};
use weft_proto::ids::InodeId;
use weft_proto::messages::{DirEntry, DirEntryPlus, FileKind, MetaResponse, READDIR_ENTRIES_MAX};
use weft_proto::ErrorCode;

/// Looks a name up: the attributes of a local child, or `Inodes([child])` for a child whose
/// inode lives on another server.
pub(crate) fn lookup(
    txn: &ReadTransaction,
    home: weft_proto::NodeId,
    parent: InodeId,
    name: &str,
) -> Result<MetaResponse, OpError> {
    if name.len() > weft_proto::messages::NAME_BYTES_MAX {
        check_name(name)?;
    }
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
    let dentry = load_dentry(&entries, parent, name)?.ok_or_else(|| {
        OpError::rejected(
            ErrorCode::NotFound,
            format!("{name:?} not found in {parent}"),
        )
    })?;
    if dentry.child.home() != home {
        // A directory whose inode lives on another server: the caller asks it.
        return Ok(MetaResponse::Inodes(vec![dentry.child]));
    }
    let record = load_inode(&inodes, dentry.child)?;
    Ok(MetaResponse::Attr(record.to_attr(dentry.child)))
}

pub(crate) fn get_attr(txn: &ReadTransaction, inode: InodeId) -> Result<MetaResponse, OpError> {
    let inodes = txn.open_table(INODES)?;
    Ok(MetaResponse::Attr(
        load_inode(&inodes, inode)?.to_attr(inode),
    ))
}

/// Lists `dir` after a cookie. `shards` is the shard count the caller believes `dir` has: a
/// caller that lists a spread directory as a plain one learns otherwise (`WrongShard`).
pub(crate) fn read_dir(
    txn: &ReadTransaction,
    (dir, shards): (InodeId, u16),
    after_cookie: u64,
    max_entries: u32,
) -> Result<MetaResponse, OpError> {
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    let record = load_dir(&inodes, dir)?;
    if record.shard_of == 0 && record.shards.len().max(1) != usize::from(shards.max(1)) {
        return Err(OpError::rejected(
            ErrorCode::WrongShard,
            format!(
                "directory {dir} has {} shards, not {shards}",
                record.shards.len().max(1)
            ),
        ));
    }
    let limit = max_entries.clamp(1, READDIR_ENTRIES_MAX) as usize;
    let mut entries_out = Vec::with_capacity(limit);
    let start = after_cookie.saturating_add(1);
    let mut range = entries.range((dir.0, start)..=(dir.0, u64::MAX))?;
    for item in range.by_ref() {
        let (key, value) = item?;
        let (child, kind, name) = value.value();
        entries_out.push(DirEntry {
            name: name.to_string(),
            inode: InodeId(child),
            kind: kind_from_code(kind),
            cookie: key.value().1,
        });
        if entries_out.len() == limit {
            break;
        }
    }
    let end = range.next().is_none();
    Ok(MetaResponse::DirEntries {
        entries: entries_out,
        end,
    })
}

/// Lists `dir` as [`read_dir`] does, each entry with its inode's attributes where this home
/// holds the inode (read in the same snapshot).
pub(crate) fn read_dir_plus(
    txn: &ReadTransaction,
    home: weft_proto::NodeId,
    (dir, shards): (InodeId, u16),
    after_cookie: u64,
    max_entries: u32,
) -> Result<MetaResponse, OpError> {
    let MetaResponse::DirEntries { entries, end } =
        read_dir(txn, (dir, shards), after_cookie, max_entries)?
    else {
        unreachable!("a listing answers its entries")
    };
    let inodes = txn.open_table(INODES)?;
    let mut listed = Vec::with_capacity(entries.len());
    for entry in entries {
        // An entry whose inode is not here, or cannot be read, comes without attributes (the
        // client looks its name up, as it would without them).
        let attr = (entry.inode.home() == home)
            .then(|| load_inode(&inodes, entry.inode).ok())
            .flatten()
            .map(|record| record.to_attr(entry.inode));
        listed.push(DirEntryPlus { entry, attr });
    }
    Ok(MetaResponse::DirEntriesPlus {
        entries: listed,
        end,
    })
}

pub(crate) fn read_link(txn: &ReadTransaction, inode: InodeId) -> Result<MetaResponse, OpError> {
    let inodes = txn.open_table(INODES)?;
    let record = load_inode(&inodes, inode)?;
    match (record.kind, record.symlink) {
        (FileKind::Symlink, Some(target)) => Ok(MetaResponse::LinkTarget(target)),
        _ => Err(OpError::rejected(
            ErrorCode::NotSymlink,
            format!("inode {inode} is not a symbolic link"),
        )),
    }
}
