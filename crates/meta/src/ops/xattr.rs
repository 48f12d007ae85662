//! Extended attributes, POSIX ACLs among them. Names carry their namespace (`user.`,
//! `trusted.`, `security.`, `system.posix_acl_*`); the kernel checks who may touch which
//! namespace before a request arrives, so the server checks bounds and formats only.

use crate::acl::{Acl, ACL_ACCESS, ACL_DEFAULT};
use crate::schema::{load_inode, now, store_inode, OpError, INODES, XATTRS};
use crate::store::{ReadTransaction, ReadableTable, Table, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::messages::{
    FileKind, MetaResponse, XattrSetMode, XATTR_LIST_BYTES_MAX, XATTR_NAME_BYTES_MAX,
    XATTR_VALUE_BYTES_MAX,
};
use weft_proto::ErrorCode;

/// ACL attributes a new inode inherits: (attribute name, value).
pub(crate) type InheritedAcls = Vec<(&'static str, Vec<u8>)>;

fn check_name(name: &str) -> Result<(), OpError> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX || name.contains('\0') {
        return Err(OpError::rejected(
            ErrorCode::OutOfRange,
            format!("attribute name of {} bytes is invalid", name.len()),
        ));
    }
    Ok(())
}

fn names(
    xattrs: &impl ReadableTable<(u64, &'static str), &'static [u8]>,
    inode: InodeId,
) -> Result<Vec<String>, OpError> {
    let mut names = Vec::new();
    for item in xattrs.range(keys_of(inode))? {
        names.push(item?.0.value().1.to_string());
    }
    Ok(names)
}

pub(crate) fn set_xattr(
    txn: &WriteTransaction,
    inode: InodeId,
    name: &str,
    value: &[u8],
    mode: XattrSetMode,
) -> Result<MetaResponse, OpError> {
    check_name(name)?;
    if value.len() > XATTR_VALUE_BYTES_MAX {
        return Err(OpError::rejected(
            ErrorCode::OutOfRange,
            format!(
                "attribute value of {} bytes exceeds {XATTR_VALUE_BYTES_MAX}",
                value.len()
            ),
        ));
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut xattrs = txn.open_table(XATTRS)?;
    let mut record = load_inode(&inodes, inode)?;
    let exists = xattrs.get((inode.0, name))?.is_some();
    match mode {
        XattrSetMode::Create if exists => {
            return Err(OpError::rejected(
                ErrorCode::Exists,
                format!("attribute {name} exists"),
            ))
        }
        XattrSetMode::Replace if !exists => {
            return Err(OpError::rejected(
                ErrorCode::NoAttribute,
                format!("attribute {name} does not exist"),
            ))
        }
        _ => {}
    }
    if !exists {
        let listed: usize = names(&xattrs, inode)?.iter().map(|n| n.len() + 1).sum();
        if listed + name.len() + 1 > XATTR_LIST_BYTES_MAX {
            return Err(OpError::rejected(
                ErrorCode::OutOfRange,
                "the inode's attribute list is full",
            ));
        }
    }
    let mut store_value = true;
    if name == crate::acl::DIR_SPREAD
        && (record.kind != FileKind::Directory || crate::acl::parse_dir_spread(value).is_none())
    {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            format!(
                "{name} is a directory's count of metadata servers, 0 to {}",
                weft_proto::layout::DIR_SHARDS_MAX
            ),
        ));
    }
    if name == ACL_ACCESS || name == ACL_DEFAULT {
        let acl = Acl::decode(value)
            .map_err(|reason| OpError::rejected(ErrorCode::InvalidArgument, reason))?;
        if name == ACL_DEFAULT && record.kind != FileKind::Directory {
            return Err(OpError::rejected(
                ErrorCode::PermissionDenied,
                "only directories have default ACLs",
            ));
        }
        if name == ACL_ACCESS {
            // The mode bits follow the access ACL; an ACL that says no more than the mode is
            // kept as the mode alone, as Linux file systems do.
            record.mode = (record.mode & !0o777) | acl.mode_bits();
            store_value = !acl.is_equivalent_to_mode();
        }
    }
    if store_value {
        xattrs.insert((inode.0, name), value)?;
    } else {
        xattrs.remove((inode.0, name))?;
    }
    record.xattr_free = has_none(&xattrs, inode)?;
    record.ctime = now();
    store_inode(&mut inodes, inode, &record)?;
    Ok(MetaResponse::Done)
}

/// Whether `inode` has no extended attributes (what its record's `xattr_free` says once a
/// change of them is stored).
pub(crate) fn has_none(
    xattrs: &impl ReadableTable<(u64, &'static str), &'static [u8]>,
    inode: InodeId,
) -> Result<bool, OpError> {
    Ok(xattrs.range(keys_of(inode))?.next().is_none())
}

/// The keys of `inode`'s attributes.
fn keys_of(inode: InodeId) -> std::ops::RangeInclusive<(u64, &'static str)> {
    (inode.0, "")..=(inode.0, "\u{10FFFF}")
}

pub(crate) fn get_xattr(
    txn: &ReadTransaction,
    inode: InodeId,
    name: &str,
) -> Result<MetaResponse, OpError> {
    check_name(name)?;
    load_inode(&txn.open_table(INODES)?, inode)?;
    match txn.open_table(XATTRS)?.get((inode.0, name))? {
        Some(value) => Ok(MetaResponse::XattrValue(value.value().to_vec())),
        None => Err(OpError::rejected(
            ErrorCode::NoAttribute,
            format!("attribute {name} does not exist"),
        )),
    }
}

pub(crate) fn list_xattr(txn: &ReadTransaction, inode: InodeId) -> Result<MetaResponse, OpError> {
    load_inode(&txn.open_table(INODES)?, inode)?;
    Ok(MetaResponse::XattrNames(names(
        &txn.open_table(XATTRS)?,
        inode,
    )?))
}

pub(crate) fn remove_xattr(
    txn: &WriteTransaction,
    inode: InodeId,
    name: &str,
) -> Result<MetaResponse, OpError> {
    check_name(name)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_inode(&inodes, inode)?;
    let mut xattrs = txn.open_table(XATTRS)?;
    if xattrs.remove((inode.0, name))?.is_none() {
        return Err(OpError::rejected(
            ErrorCode::NoAttribute,
            format!("attribute {name} does not exist"),
        ));
    }
    record.xattr_free = has_none(&xattrs, inode)?;
    record.ctime = now();
    store_inode(&mut inodes, inode, &record)?;
    Ok(MetaResponse::Done)
}

/// Removes every attribute of an inode that is going away.
pub(crate) fn remove_all(
    xattrs: &mut Table<(u64, &'static str), &'static [u8]>,
    inode: InodeId,
) -> Result<(), OpError> {
    for name in names(xattrs, inode)? {
        xattrs.remove((inode.0, name.as_str()))?;
    }
    Ok(())
}

/// The permission bits of a new inode in `parent`, and the ACLs it inherits: with a default
/// ACL on the parent, the mode is masked by it (and the umask is ignored, as POSIX says);
/// without one, the umask applies.
pub(crate) fn inherited_mode_and_acls(
    xattrs: &impl ReadableTable<(u64, &'static str), &'static [u8]>,
    parent: InodeId,
    kind: FileKind,
    mode: u32,
    umask: u32,
) -> Result<(u32, InheritedAcls), OpError> {
    let special = mode & 0o7000;
    // A new directory inherits its parent's default spread.
    let spread = if kind == FileKind::Directory {
        xattrs
            .get((parent.0, crate::acl::DIR_SPREAD))?
            .map(|v| (crate::acl::DIR_SPREAD, v.value().to_vec()))
    } else {
        None
    };
    let default = if kind == FileKind::Symlink {
        None
    } else {
        xattrs
            .get((parent.0, ACL_DEFAULT))?
            .map(|v| v.value().to_vec())
    };
    let Some(default) = default else {
        return Ok((
            special | (mode & 0o777 & !umask),
            spread.into_iter().collect(),
        ));
    };
    let mut acl = Acl::decode(&default).map_err(|reason| {
        OpError::inconsistent(format!("default ACL of {parent} is damaged: {reason}"))
    })?;
    let bits = acl.create_masq(mode);
    let mut acls = Vec::new();
    if !acl.is_equivalent_to_mode() {
        acls.push((ACL_ACCESS, acl.encode()));
    }
    if kind == FileKind::Directory {
        acls.push((ACL_DEFAULT, default));
    }
    acls.extend(spread);
    Ok((special | bits, acls))
}

/// Writes the ACLs a new inode inherited.
pub(crate) fn store_inherited(
    xattrs: &mut Table<(u64, &'static str), &'static [u8]>,
    inode: InodeId,
    acls: &InheritedAcls,
) -> Result<(), OpError> {
    for (name, value) in acls {
        xattrs.insert((inode.0, *name), value.as_slice())?;
    }
    Ok(())
}
