//! The access checks a metadata server makes itself, for a caller whose own kernel let it
//! through as root: the root of a client whose rule squashes it, acting as nobody
//! ([`weft_proto::access::ClientRule::squashed`]). Other callers were checked by their kernel
//! with the same credentials (and their supplementary groups, which the server does not
//! know), so they are not checked again.
//!
//! The checks are POSIX's on the mode bits (owner, group, others); a squashed caller has no
//! supplementary groups and owns only what it made. Named entries of an access ACL are not
//! consulted: the ACL's mask and other entries are in the mode bits, so a squashed caller gets
//! at most what others get.

use super::{rpc_error, Meta};
use crate::ops::lookup::{get_attr, lookup};
use crate::store::OpError;
use weft_proto::access::{self, Caller};
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::messages::{AttrChanges, InodeAttr, MetaRequest, Response, TimeSet};
use weft_proto::ErrorCode;

const STICKY: u32 = 0o1000;

/// Whether `caller` has every access in `want` (the [`access`] bits) to `attr`.
fn allows(attr: &InodeAttr, caller: Caller, want: u8) -> bool {
    let bits = if attr.uid == caller.uid {
        attr.mode >> 6
    } else if attr.gid == caller.gid {
        attr.mode >> 3
    } else {
        attr.mode
    };
    (bits & 7) as u8 & want == want
}

fn denied(what: &str, inode: InodeId) -> OpError {
    OpError::Rejected(WireError::new(
        ErrorCode::PermissionDenied,
        format!("{what} of {inode} denied to a squashed root (acting as nobody)"),
    ))
}

fn not_permitted(what: &str, inode: InodeId) -> OpError {
    OpError::Rejected(WireError::new(
        ErrorCode::NotPermitted,
        format!("{what} of {inode} not permitted to a squashed root (acting as nobody)"),
    ))
}

impl Meta {
    /// Checks `request` as `caller` would be checked by a kernel, and makes what it creates
    /// the caller's.
    ///
    /// # Errors
    /// `PermissionDenied` or `NotPermitted` when the caller may not, or what reading the
    /// attributes it needs gave.
    pub(crate) async fn check_access(
        &self,
        request: &mut MetaRequest,
        caller: Caller,
    ) -> Result<(), OpError> {
        const SEARCH: u8 = access::EXECUTE;
        const CHANGE_DIR: u8 = access::WRITE | access::EXECUTE;
        match request {
            MetaRequest::Lookup { parent, .. } => self.require(*parent, caller, SEARCH).await,
            MetaRequest::ReadDir { dir, .. } => self.require(*dir, caller, access::READ).await,
            MetaRequest::Open { inode, access, .. } => {
                let want = *access & (access::READ | access::WRITE);
                self.require(*inode, caller, want).await
            }
            MetaRequest::Create { parent, new, .. }
            | MetaRequest::CreateSpread { parent, new, .. } => {
                self.require(*parent, caller, CHANGE_DIR).await?;
                new.uid = caller.uid;
                new.gid = caller.gid;
                Ok(())
            }
            MetaRequest::Link { new_parent, .. } => {
                self.require(*new_parent, caller, CHANGE_DIR).await
            }
            MetaRequest::Unlink { parent, name, .. } | MetaRequest::Rmdir { parent, name, .. } => {
                self.require_removable(*parent, name, caller).await
            }
            MetaRequest::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => {
                self.require_removable(*parent, name, caller).await?;
                // Write and search on the new directory; a name it replaces must be one the
                // caller could remove.
                match self.require_removable(*new_parent, new_name, caller).await {
                    Err(OpError::Rejected(wire)) if wire.code == ErrorCode::NotFound => Ok(()),
                    other => other,
                }
            }
            MetaRequest::SetAttr { inode, changes, .. } => {
                let attr = self.attr_of(*inode).await?;
                check_set_attr(&attr, changes, caller)
            }
            MetaRequest::SetXattr { inode, name, .. }
            | MetaRequest::RemoveXattr { inode, name, .. } => {
                let attr = self.attr_of(*inode).await?;
                if name.starts_with("user.") {
                    if allows(&attr, caller, access::WRITE) {
                        return Ok(());
                    }
                    return Err(denied("changing an attribute", *inode));
                }
                // ACLs and the like are their owner's to change.
                if attr.uid == caller.uid && name.starts_with("system.") {
                    return Ok(());
                }
                Err(not_permitted("changing an attribute", *inode))
            }
            MetaRequest::GetXattr { inode, name } if name.starts_with("user.") => {
                self.require(*inode, caller, access::READ).await
            }
            MetaRequest::SetPattern { .. } => Err(OpError::Rejected(WireError::new(
                ErrorCode::NotPermitted,
                "changing a directory's pattern is not permitted to a squashed root",
            ))),
            _ => Ok(()),
        }
    }

    async fn require(&self, inode: InodeId, caller: Caller, want: u8) -> Result<(), OpError> {
        if allows(&self.attr_of(inode).await?, caller, want) {
            return Ok(());
        }
        let what = match want {
            access::EXECUTE => "search",
            access::READ => "reading",
            _ if want & access::WRITE != 0 => "writing",
            _ => "access",
        };
        Err(denied(what, inode))
    }

    /// That `caller` may remove `name` from `parent`: write and search on the directory, and
    /// in a sticky directory, ownership of the directory or of the entry.
    async fn require_removable(
        &self,
        parent: InodeId,
        name: &str,
        caller: Caller,
    ) -> Result<(), OpError> {
        let dir = self.attr_of(parent).await?;
        if !allows(&dir, caller, access::WRITE | access::EXECUTE) {
            return Err(denied("changing", parent));
        }
        if dir.mode & STICKY != 0 && dir.uid != caller.uid {
            let child = self.child_attr(parent, name).await?;
            if child.uid != caller.uid {
                return Err(not_permitted(
                    "removing an entry of the sticky directory",
                    parent,
                ));
            }
        }
        Ok(())
    }

    /// The attributes of `inode`, from this server's store or from its home.
    async fn attr_of(&self, inode: InodeId) -> Result<InodeAttr, OpError> {
        let response = if inode.home() == self.node {
            self.read(|txn| get_attr(txn, inode))?
        } else {
            self.remote_attr(inode).await?
        };
        match response {
            Response::Attr(attr) => Ok(attr),
            other => Err(OpError::Store(format!(
                "the attributes of {inode} came back as {other:?}"
            ))),
        }
    }

    /// The attributes of the entry `name` of `parent`.
    async fn child_attr(&self, parent: InodeId, name: &str) -> Result<InodeAttr, OpError> {
        if parent.home() != self.node {
            let meta = self.cluster.meta(parent.home()).await.map_err(rpc_error)?;
            return meta.lookup(parent, name).await.map_err(rpc_error);
        }
        let home = self.node;
        match self.read(|txn| lookup(txn, home, parent, name))? {
            Response::Attr(attr) => Ok(attr),
            Response::Inodes(children) if !children.is_empty() => self.attr_of(children[0]).await,
            other => Err(OpError::Store(format!(
                "the lookup of {name:?} in {parent} came back as {other:?}"
            ))),
        }
    }
}

/// What a kernel lets a non-root caller change: mode, times set to given values, and the
/// group only as the owner (and the group only to its own); the size with write access; times
/// set to now as the owner or with write access; never the owner.
fn check_set_attr(attr: &InodeAttr, changes: &AttrChanges, caller: Caller) -> Result<(), OpError> {
    let owner = attr.uid == caller.uid;
    let inode = attr.inode;
    if changes.uid.is_some_and(|uid| uid != attr.uid) {
        return Err(not_permitted("changing the owner", inode));
    }
    if changes.mode.is_some() && !owner {
        return Err(not_permitted("changing the mode", inode));
    }
    if let Some(gid) = changes.gid {
        if gid != attr.gid && !(owner && gid == caller.gid) {
            return Err(not_permitted("changing the group", inode));
        }
    }
    if changes.size.is_some() && !allows(attr, caller, access::WRITE) {
        return Err(denied("truncating", inode));
    }
    for time in [changes.atime, changes.mtime].into_iter().flatten() {
        match time {
            TimeSet::At(_) if !owner => return Err(not_permitted("setting the times", inode)),
            TimeSet::Now if !owner && !allows(attr, caller, access::WRITE) => {
                return Err(denied("touching", inode))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::access::NOBODY;
    use weft_proto::messages::FileKind;
    use weft_proto::NodeId;

    fn file(mode: u32, uid: u32) -> InodeAttr {
        InodeAttr {
            inode: InodeId::new(NodeId(1), 9),
            kind: FileKind::Regular,
            mode,
            nlink: 1,
            uid,
            gid: uid,
            size: 0,
            rdev: 0,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            truncate_generation: 0,
            layout: None,
            pattern: None,
            parent: InodeId::new(NodeId(1), 1),
            shards: Vec::new(),
        }
    }

    const NOBODY_CALLER: Caller = Caller {
        uid: NOBODY,
        gid: NOBODY,
    };

    // Goal: nobody gets the others' bits of another user's file, the owner's of its own.
    #[test]
    fn mode_bits_decide() {
        assert!(!allows(&file(0o600, 1000), NOBODY_CALLER, access::READ));
        assert!(allows(&file(0o604, 1000), NOBODY_CALLER, access::READ));
        assert!(!allows(
            &file(0o604, 1000),
            NOBODY_CALLER,
            access::READ | access::WRITE
        ));
        assert!(allows(&file(0o600, NOBODY), NOBODY_CALLER, access::WRITE));
        assert!(!allows(
            &file(0o070, 5),
            Caller { uid: 5, gid: 5 },
            access::READ
        ));
    }

    // Goal: a squashed root cannot take a file, chmod another's, or truncate without write.
    #[test]
    fn set_attr_follows_the_kernel_rules() {
        let others = file(0o644, 1000);
        let chown = AttrChanges {
            uid: Some(NOBODY),
            ..AttrChanges::default()
        };
        let chmod = AttrChanges {
            mode: Some(0o777),
            ..AttrChanges::default()
        };
        let truncate = AttrChanges {
            size: Some(0),
            ..AttrChanges::default()
        };
        assert!(check_set_attr(&others, &chown, NOBODY_CALLER).is_err());
        assert!(check_set_attr(&others, &chmod, NOBODY_CALLER).is_err());
        assert!(check_set_attr(&others, &truncate, NOBODY_CALLER).is_err());
        let own = file(0o644, NOBODY);
        assert!(check_set_attr(&own, &chmod, NOBODY_CALLER).is_ok());
        assert!(check_set_attr(&own, &truncate, NOBODY_CALLER).is_ok());
        assert!(check_set_attr(&file(0o666, 1000), &truncate, NOBODY_CALLER).is_ok());
    }
}
