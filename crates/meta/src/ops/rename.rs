//! Rename, with POSIX's checks: replacing a file or an empty directory, RENAME_NOREPLACE,
//! RENAME_EXCHANGE, and never moving a directory into its own subtree.

use super::remove::drop_link;
use crate::schema::{
    check_name, dir_is_empty, insert_dentry, load_dentry, load_dir, load_inode, now, remove_dentry,
    replace_dentry, store_inode, InodeRecord, OpError, ENTRIES,
};
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::messages::{MetaResponse, RenameFlags};
use weft_proto::ErrorCode;

/// Most directory levels walked up from an inode (checking a move for a loop, or that an
/// inode lies in a subtree); deeper trees are refused.
pub(crate) const PATH_DEPTH_MAX: usize = 4096;

/// Where a walk from a directory up toward the root, looking for `ancestor`, stands at
/// `dir`: `Some` when it ends there (found, or at the root), `None` when it goes on up.
pub(crate) fn walk_ends_at(ancestor: InodeId, dir: InodeId) -> Option<bool> {
    if dir == ancestor {
        Some(true)
    } else if dir == InodeId::ROOT {
        Some(false)
    } else {
        None
    }
}

/// The answer of a walk up a tree deeper than [`PATH_DEPTH_MAX`].
pub(crate) fn too_deep() -> OpError {
    OpError::rejected(ErrorCode::InvalidArgument, "directory tree too deep")
}

/// Whether `ancestor` is `dir` or one of its ancestors.
fn is_ancestor(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    home: weft_proto::NodeId,
    ancestor: InodeId,
    mut dir: InodeId,
) -> Result<bool, OpError> {
    for _ in 0..PATH_DEPTH_MAX {
        if let Some(found) = walk_ends_at(ancestor, dir) {
            return Ok(found);
        }
        if dir.home() != home {
            return Err(cross_server());
        }
        dir = InodeId(load_inode(inodes, dir)?.parent);
    }
    Err(too_deep())
}

/// A rename that involves another metadata server reached the one-server path; the service
/// sends those through its cross-server protocols, so this is only a safety net (EXDEV, on
/// which `mv` copies instead).
fn cross_server() -> OpError {
    OpError::rejected(
        ErrorCode::CrossDevice,
        "this rename involves another metadata server",
    )
}

pub(crate) struct RenameArgs<'a> {
    /// This metadata server.
    pub home: weft_proto::NodeId,
    /// The caller walked the new parent's ancestors across servers under the cluster rename
    /// lock and found no loop.
    pub ancestry_checked: bool,
    pub parent: InodeId,
    pub name: &'a str,
    pub new_parent: InodeId,
    pub new_name: &'a str,
    pub flags: RenameFlags,
}

pub(crate) fn rename(
    txn: &WriteTransaction,
    args: RenameArgs<'_>,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<MetaResponse, OpError> {
    let RenameArgs {
        home,
        ancestry_checked,
        parent,
        name,
        new_parent,
        new_name,
        flags,
    } = args;
    check_name(new_name)?;
    if flags.exchange && flags.no_replace {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "RENAME_EXCHANGE and RENAME_NOREPLACE exclude each other",
        ));
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
    load_dir(&inodes, new_parent)?.accepts_new_name(new_parent, new_name)?;
    let source = load_dentry(&entries, parent, name)?
        .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?;
    let victim = load_dentry(&entries, new_parent, new_name)?;
    super::intent::check_not_in_flight(txn, parent, name, None)?;
    if victim.is_some() {
        super::intent::check_not_in_flight(txn, new_parent, new_name, None)?;
    }
    let source_is_dir = source.kind == weft_proto::messages::FileKind::Directory;
    let source_local = check_source_moves(
        &inodes,
        (home, ancestry_checked),
        (source, victim),
        (parent, new_parent),
        flags,
    )?;
    if let Some(victim) = victim {
        if flags.no_replace {
            return Err(OpError::rejected(
                ErrorCode::Exists,
                format!("{new_name:?} already exists"),
            ));
        }
        if victim.child == source.child {
            // Two names of one inode: POSIX says do nothing and succeed.
            return Ok(MetaResponse::Done);
        }
        let victim_record = load_inode(&inodes, victim.child)?;
        if !victim_record.shards.is_empty() && !flags.exchange {
            // Its shards on other servers would have to go with it: rmdir it first.
            return Err(cross_server());
        }
        if flags.exchange {
            if victim_record.is_dir()
                && new_parent != parent
                && !ancestry_checked
                && is_ancestor(&inodes, home, victim.child, parent)?
            {
                return Err(OpError::rejected(
                    ErrorCode::InvalidArgument,
                    "cannot move a directory into its own subtree",
                ));
            }
            if new_parent != parent {
                super::check_project(load_dir(&inodes, parent)?.project, victim_record.project)?;
            }
            return exchange(
                &mut inodes,
                &mut entries,
                (parent, name, source),
                (new_parent, new_name, victim),
            );
        }
        check_kinds_match(source_is_dir, victim_record.is_dir(), new_name)?;
        check_empty_if_dir(&entries, source_is_dir, victim.child, new_name)?;
    } else if flags.exchange {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            format!("{new_name:?} not found"),
        ));
    }

    // Everything is checked; from here on the operation writes.
    let moved = (parent, name, source);
    let replaced = (new_parent, new_name, victim);
    write_rename(
        txn,
        (&mut inodes, &mut entries),
        (moved, source_local),
        replaced,
        is_open,
    )
}

/// A directory replaced by a rename (`is_dir`: the replaced entry `victim`, named `name`, is
/// one) must be empty.
fn check_empty_if_dir(
    entries: &crate::schema::Entries<'_>,
    is_dir: bool,
    victim: InodeId,
    name: &str,
) -> Result<(), OpError> {
    if is_dir && !dir_is_empty(entries, victim)? {
        return Err(OpError::rejected(
            ErrorCode::NotEmpty,
            format!("{name:?} is not empty"),
        ));
    }
    Ok(())
}

/// Whether `source` may move from `parent` into `new_parent` on this server (`home`),
/// replacing `victim`; answers whether its inode lives here. A file whose inode lives on
/// another server (after a hard link or a move) can be renamed here: only its dentry moves. A
/// directory or a replaced victim living elsewhere cannot yet. A move between projects is
/// refused, and so is a directory's into its own subtree (unless the caller walked the
/// ancestors across servers already: `ancestry_checked`).
fn check_source_moves(
    inodes: &crate::schema::usage::Inodes<'_>,
    (home, ancestry_checked): (weft_proto::NodeId, bool),
    (source, victim): (crate::schema::Dentry, Option<crate::schema::Dentry>),
    (parent, new_parent): (InodeId, InodeId),
    flags: RenameFlags,
) -> Result<bool, OpError> {
    let source_is_dir = source.kind == weft_proto::messages::FileKind::Directory;
    let source_local = source.child.home() == home;
    if (!source_local && ((source_is_dir && new_parent != parent) || flags.exchange))
        || victim.is_some_and(|v| v.child.home() != home)
    {
        return Err(cross_server());
    }
    if source_local {
        debug_assert_eq!(
            load_inode(inodes, source.child)?.is_dir(),
            source_is_dir,
            "dentry kind matches the inode"
        );
    }
    if new_parent != parent && source_local {
        // (The service checked an inode living elsewhere against its home's record.)
        let project = load_inode(inodes, source.child)?.project;
        super::check_project(load_dir(inodes, new_parent)?.project, project)?;
    }
    if source_is_dir
        && new_parent != parent
        && !ancestry_checked
        && is_ancestor(inodes, home, source.child, new_parent)?
    {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "cannot move a directory into its own subtree",
        ));
    }
    Ok(source_local)
}

/// The writes of a checked rename: `source` (named `name` in `parent`; its inode on this
/// server when `source_local`) takes `new_name` in `new_parent`, replacing `victim` there if
/// any (a directory's record goes with it, a file's link is dropped); then the directories'
/// links and times, and the moved inode's parent.
fn write_rename(
    txn: &WriteTransaction,
    (inodes, entries): (
        &mut crate::schema::usage::Inodes<'_>,
        &mut crate::schema::Entries<'_>,
    ),
    ((parent, _name, source), source_local): (Side<'_>, bool),
    (new_parent, new_name, victim): (InodeId, &str, Option<crate::schema::Dentry>),
    is_open: impl Fn(InodeId) -> bool,
) -> Result<MetaResponse, OpError> {
    let source_is_dir = source.kind == weft_proto::messages::FileKind::Directory;
    let timestamp = now();
    remove_dentry(entries, parent, source)?;
    let mut victim_was_dir = false;
    if let Some(victim) = victim {
        remove_dentry(entries, new_parent, victim)?;
        let victim_record = load_inode(inodes, victim.child)?;
        if victim_record.is_dir() {
            victim_was_dir = true;
            inodes.remove(victim.child)?;
            super::xattr::remove_all(&mut txn.open_table(crate::schema::XATTRS)?, victim.child)?;
        } else {
            drop_link(
                txn,
                inodes,
                (victim.child, Some(new_parent)),
                victim_record,
                is_open(victim.child),
            )?;
        }
    }
    let mut target_dir = load_dir(inodes, new_parent)?;
    insert_dentry(
        entries,
        new_parent,
        &target_dir,
        new_name,
        source.child,
        source.kind,
    )?;
    if victim_was_dir {
        target_dir.nlink = target_dir.nlink.saturating_sub(1);
    }
    if source_is_dir && new_parent != parent {
        target_dir.nlink += 1;
    }
    target_dir.touch(timestamp);
    store_inode(inodes, new_parent, &target_dir)?;
    if new_parent != parent {
        let mut source_dir = load_dir(inodes, parent)?;
        if source_is_dir {
            source_dir.nlink = source_dir.nlink.saturating_sub(1);
        }
        source_dir.touch(timestamp);
        store_inode(inodes, parent, &source_dir)?;
    }
    if source_local {
        let mut moved = load_inode(inodes, source.child)?;
        moved.ctime = timestamp;
        moved.parent = new_parent.0;
        store_inode(inodes, source.child, &moved)?;
    }
    Ok(MetaResponse::Done)
}

type Side<'a> = (InodeId, &'a str, crate::schema::Dentry);

/// RENAME_EXCHANGE: the two names swap the inodes they name, keeping their cookies.
fn exchange(
    inodes: &mut crate::schema::usage::Inodes<'_>,
    entries: &mut crate::schema::Entries<'_>,
    (parent, name, source): Side<'_>,
    (new_parent, new_name, victim): Side<'_>,
) -> Result<MetaResponse, OpError> {
    let timestamp = now();
    let swapped =
        |dentry: crate::schema::Dentry, other: crate::schema::Dentry| crate::schema::Dentry {
            child: other.child,
            kind: other.kind,
            ..dentry
        };
    replace_dentry(entries, parent, name, swapped(source, victim))?;
    replace_dentry(entries, new_parent, new_name, swapped(victim, source))?;
    for (inode, new_home_dir) in [(source.child, new_parent), (victim.child, parent)] {
        let mut record = load_inode(inodes, inode)?;
        record.ctime = timestamp;
        record.parent = new_home_dir.0;
        store_inode(inodes, inode, &record)?;
    }
    if parent != new_parent {
        let source_dir_delta = i64::from(victim.kind == weft_proto::messages::FileKind::Directory)
            - i64::from(source.kind == weft_proto::messages::FileKind::Directory);
        for (dir, delta) in [(parent, source_dir_delta), (new_parent, -source_dir_delta)] {
            let mut record = load_dir(inodes, dir)?;
            record.nlink = (i64::from(record.nlink) + delta).max(0) as u32;
            record.touch(timestamp);
            store_inode(inodes, dir, &record)?;
        }
    } else {
        let mut record = load_dir(inodes, parent)?;
        record.touch(timestamp);
        store_inode(inodes, parent, &record)?;
    }
    Ok(MetaResponse::Done)
}

/// That an entry (a directory when `moving_dir`) may replace `name`, which holds a directory
/// when `victim_dir`: rename(2) replaces a directory only with a directory, and anything else
/// only with a non-directory.
pub(crate) fn check_kinds_match(
    moving_dir: bool,
    victim_dir: bool,
    name: &str,
) -> Result<(), OpError> {
    match (moving_dir, victim_dir) {
        (true, false) => Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("{name:?} is not a directory"),
        )),
        (false, true) => Err(OpError::rejected(
            ErrorCode::IsDirectory,
            format!("{name:?} is a directory"),
        )),
        _ => Ok(()),
    }
}

/// On an inode's home, after a rename elsewhere moved a dentry of it: its ctime becomes now,
/// and it points at its new parent (idempotent; a removed one is left). Parent 0 makes a
/// file forget its parent, before a rename that moves its name (a directory keeps its own).
pub(crate) fn renamed(
    txn: &WriteTransaction,
    inode: InodeId,
    parent: InodeId,
) -> Result<MetaResponse, OpError> {
    mark_renamed(&mut crate::schema::usage::Inodes::open(txn)?, inode, parent)?;
    Ok(MetaResponse::Done)
}

/// [`renamed`] in an open inode table; an inode that does not live here is left alone.
pub(crate) fn mark_renamed(
    inodes: &mut crate::schema::usage::Inodes<'_>,
    inode: InodeId,
    parent: InodeId,
) -> Result<(), OpError> {
    let Some(bytes) = inodes.get(inode.0)? else {
        return Ok(());
    };
    let mut record = InodeRecord::decode(inode.0, bytes.value())?;
    drop(bytes);
    if parent.0 != 0 || !record.is_dir() {
        record.parent = parent.0;
    }
    record.ctime = now();
    store_inode(inodes, inode, &record)
}
