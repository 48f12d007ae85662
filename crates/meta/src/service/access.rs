//! The access checks a metadata server makes itself, for the callers of a client whose rule
//! squashes root ([`weft_proto::access::ClientRule::checked`]): its root acts as nobody, and
//! since the client's kernel let root through, every caller of that client is checked here,
//! as a kernel would check it, with the uid and groups the client states for it.
//!
//! The checks are POSIX's on the mode bits (owner, group, others), with the caller's
//! supplementary groups. Named entries of an access ACL are not consulted: with an ACL the
//! mode's group bits are its mask, an upper bound of what named users and groups get. What a
//! checked caller creates is its own; it cannot make device nodes, set `security.` or
//! `trusted.` attributes, give a file away, or keep a set-group-id bit on a group it is not
//! in.

use super::{rpc_error, Meta};
use crate::ops::lookup::lookup;
use crate::schema::OpError;
use weft_net::MetaCalls;
use weft_proto::access::{self, Caller, Capability};
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::messages::{AttrChanges, FileKind, InodeAttr, MetaRequest, MetaResponse, TimeSet};
use weft_proto::ErrorCode;

const STICKY: u32 = 0o1000;
const SET_GID: u32 = 0o2000;

/// Whether `caller` has every access in `want` (the [`access`] bits) to `attr`.
fn allows(attr: &InodeAttr, caller: &Caller, want: u8) -> bool {
    let bits = if attr.uid == caller.uid {
        attr.mode >> 6
    } else if caller.in_group(attr.gid) {
        attr.mode >> 3
    } else {
        attr.mode
    };
    (bits & 7) as u8 & want == want
}

fn denied(what: &str, inode: InodeId) -> OpError {
    OpError::Rejected(WireError::new(
        ErrorCode::PermissionDenied,
        format!("{what} of {inode} denied (checked by the server: the client squashes root)"),
    ))
}

fn not_permitted(what: &str, inode: InodeId) -> OpError {
    OpError::Rejected(WireError::new(
        ErrorCode::NotPermitted,
        format!(
            "{what} of {inode} not permitted (checked by the server: the client squashes root)"
        ),
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
        caller: &Caller,
    ) -> Result<(), OpError> {
        const SEARCH: u8 = access::EXECUTE;
        const CHANGE_DIR: u8 = access::WRITE | access::EXECUTE;
        match request {
            MetaRequest::Lookup { parent, .. } => self.require(*parent, caller, SEARCH).await,
            MetaRequest::ReadDir { dir, .. } => self.require(*dir, caller, access::READ).await,
            // The entries' attributes are what a lookup of each would answer: search too.
            MetaRequest::ReadDirPlus { dir, .. } => {
                self.require(*dir, caller, access::READ | SEARCH).await
            }
            MetaRequest::Open {
                client,
                handle,
                inode,
                access,
                granted,
            } => {
                let want = *access & (access::READ | access::WRITE);
                if self.reopened_for((*client, *handle), *inode, want, granted.as_ref()) {
                    return Ok(());
                }
                self.require(*inode, caller, want).await
            }
            MetaRequest::ReportSize { inode, granted, .. } => {
                if self.opened_for(*inode, access::WRITE, granted.as_ref()) {
                    return Ok(());
                }
                self.require(*inode, caller, access::WRITE)
                    .await
                    .map_err(|refusal| self.unreclaimed(*inode, granted.as_ref(), refusal))
            }
            MetaRequest::Create { parent, new, .. }
            | MetaRequest::CreateSpread { parent, new, .. } => {
                self.check_create(*parent, new, caller).await
            }
            MetaRequest::Link { new_parent, .. } => {
                self.require(*new_parent, caller, CHANGE_DIR).await
            }
            MetaRequest::Unlink { parent, name, .. } | MetaRequest::Rmdir { parent, name, .. } => {
                self.require_removable(*parent, name, caller)
                    .await
                    .map(drop)
            }
            MetaRequest::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => {
                self.check_rename((*parent, name), (*new_parent, new_name), caller)
                    .await
            }
            MetaRequest::SetAttr {
                inode,
                changes,
                granted,
                ..
            } => {
                if changes.project.is_some() {
                    // Projects are the cluster's quotas: set by its members' tools.
                    return Err(not_permitted("changing the project", *inode));
                }
                let attr = self.attr_of(*inode).await?;
                let through_writer = self.opened_for(*inode, access::WRITE, granted.as_ref());
                check_set_attr(&attr, changes, caller, through_writer)
                    .map_err(|refusal| self.unreclaimed(*inode, granted.as_ref(), refusal))
            }
            MetaRequest::SetXattr { inode, name, .. }
            | MetaRequest::RemoveXattr { inode, name, .. } => {
                self.check_change_xattr(*inode, name, caller).await
            }
            MetaRequest::GetXattr { inode, name } => {
                if name.starts_with("trusted.") {
                    return Err(not_permitted("reading a trusted attribute", *inode));
                }
                if name.starts_with("user.") {
                    return self.require(*inode, caller, access::READ).await;
                }
                Ok(())
            }
            MetaRequest::SetPattern { .. } => Err(OpError::Rejected(WireError::new(
                ErrorCode::NotPermitted,
                "changing a directory's pattern is for the cluster's members",
            ))),
            _ => Ok(()),
        }
    }

    /// A create in `parent` by `caller`: write and search on the directory; the new entry
    /// is the caller's, in the directory's group in a set-group-id directory; no device nodes.
    async fn check_create(
        &self,
        parent: InodeId,
        new: &mut weft_proto::messages::NewInode,
        caller: &Caller,
    ) -> Result<(), OpError> {
        if matches!(new.kind, FileKind::CharDevice | FileKind::BlockDevice) {
            return Err(not_permitted("making a device node in", parent));
        }
        let dir = self.attr_of(parent).await?;
        if !allows(&dir, caller, access::WRITE | access::EXECUTE) {
            return Err(denied("changing", parent));
        }
        new.uid = caller.uid;
        new.gid = caller.gid;
        // The group is the directory's in a set-group-id directory: a set-group-id bit on a
        // file of a group the caller is not in is dropped, as a kernel does.
        let group = if dir.mode & SET_GID != 0 {
            dir.gid
        } else {
            caller.gid
        };
        if new.kind != FileKind::Directory && !caller.in_group(group) {
            new.mode &= !SET_GID;
        }
        Ok(())
    }

    /// A rename of `name` in `parent` to `new_name` in `new_parent` by `caller`: the name must
    /// be one the caller could remove, and so must a name it replaces; a directory that
    /// changes parent has its ".." rewritten, which takes write on it too.
    async fn check_rename(
        &self,
        (parent, name): (InodeId, &str),
        (new_parent, new_name): (InodeId, &str),
        caller: &Caller,
    ) -> Result<(), OpError> {
        let moved = self.require_removable(parent, name, caller).await?;
        if moved.kind == FileKind::Directory
            && new_parent != parent
            && !allows(&moved, caller, access::WRITE)
        {
            return Err(denied("moving the directory", moved.inode));
        }
        match self.require_removable(new_parent, new_name, caller).await {
            Err(OpError::Rejected(wire)) if wire.code == ErrorCode::NotFound => Ok(()),
            other => other.map(drop),
        }
    }

    /// A change of extended attribute `name` of `inode` by `caller`: user attributes need
    /// write on the inode; ACLs are their owner's to change; security and trusted attributes
    /// need capabilities no checked caller has.
    async fn check_change_xattr(
        &self,
        inode: InodeId,
        name: &str,
        caller: &Caller,
    ) -> Result<(), OpError> {
        let attr = self.attr_of(inode).await?;
        if name.starts_with("user.") {
            if allows(&attr, caller, access::WRITE) {
                return Ok(());
            }
            return Err(denied("changing an attribute", inode));
        }
        if attr.uid == caller.uid && name.starts_with("system.") {
            return Ok(());
        }
        Err(not_permitted("changing an attribute", inode))
    }

    /// Whether the request is made through an open of `inode` for `want`: `granted` is a
    /// capability a metadata server granted for it (expired or not), and its session still
    /// holds an open of the file here registered for that access. POSIX judges a write, a
    /// truncate or a size through a descriptor by the access it was opened with, not by the
    /// mode at the time: a file created 0444 and written (as git and tar make them) keeps its
    /// bytes.
    fn opened_for(&self, inode: InodeId, want: u8, granted: Option<&Capability>) -> bool {
        let Some(granted) = granted.filter(|granted| self.proves(inode, want, granted)) else {
            return false;
        };
        self.open_access(granted.session, inode) & want == want
    }

    /// What a request through an open of `inode` that `granted` proves is refused with when
    /// its mode does not allow it: `refusal`, unless the open's session holds no open of the
    /// file here and this server may still be waiting for it to reclaim one (see
    /// `Meta::open_missing`).
    fn unreclaimed(
        &self,
        inode: InodeId,
        granted: Option<&Capability>,
        refusal: OpError,
    ) -> OpError {
        match granted {
            Some(granted)
                if self.proves(inode, access::WRITE, granted)
                    && self.open_access(granted.session, inode) == 0 =>
            {
                self.open_missing(granted.session, inode, refusal)
            }
            _ => refusal,
        }
    }

    /// Whether an open is handle `open` asked again for what it was granted before: `granted`
    /// proves the grant to its session, and the handle is registered here for `want` (a
    /// renewal of an expired capability), or this server is in its grace period after a start
    /// (a reclaim, which registers it again).
    fn reopened_for(
        &self,
        open: (weft_proto::ids::ClientId, u64),
        inode: InodeId,
        want: u8,
        granted: Option<&Capability>,
    ) -> bool {
        let Some(granted) = granted.filter(|granted| self.proves(inode, want, granted)) else {
            return false;
        };
        if granted.session != open.0 {
            return false;
        }
        let registered = self
            .handle_access(open, inode)
            .is_some_and(|access| access & want == want);
        registered || !self.locks.grace_over()
    }

    /// Whether `granted` is a capability of `inode` for at least `want` (not nothing).
    fn proves(&self, inode: InodeId, want: u8, granted: &Capability) -> bool {
        want != 0
            && self
                .cluster
                .capabilities()
                .is_some_and(|capabilities| capabilities.proves(inode, want, granted))
    }

    /// Refuses what no restricted client (one that squashes root or is confined to a subtree)
    /// may change, whatever its caller: a project (the cluster's quotas, set by its members'
    /// tools) and a directory's pool (a pool its members keep it out of), either of which
    /// would let it out of what holds it.
    ///
    /// # Errors
    /// `NotPermitted` naming what and why.
    pub(crate) fn check_restricted(&self, request: &MetaRequest) -> Result<(), OpError> {
        let members_only = |what: &str, inode: InodeId| {
            Err(OpError::Rejected(WireError::new(
                ErrorCode::NotPermitted,
                format!("{what} of {inode} is for the cluster's members: this client is restricted (root squash or a subtree)"),
            )))
        };
        match request {
            MetaRequest::SetAttr { inode, changes, .. } if changes.project.is_some() => {
                members_only("changing the project", *inode)
            }
            MetaRequest::SetPattern { dir, pattern, .. }
                if pattern.pool != self.parent_pattern(*dir).0.pool =>
            {
                members_only("changing the storage pool", *dir)
            }
            _ => Ok(()),
        }
    }

    async fn require(&self, inode: InodeId, caller: &Caller, want: u8) -> Result<(), OpError> {
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
    /// in a sticky directory, ownership of the directory or of the entry. Answers the entry's
    /// attributes.
    async fn require_removable(
        &self,
        parent: InodeId,
        name: &str,
        caller: &Caller,
    ) -> Result<InodeAttr, OpError> {
        let dir = self.attr_of(parent).await?;
        if !allows(&dir, caller, access::WRITE | access::EXECUTE) {
            return Err(denied("changing", parent));
        }
        let child = self.child_attr(parent, name).await?;
        if dir.mode & STICKY != 0 && dir.uid != caller.uid && child.uid != caller.uid {
            return Err(not_permitted(
                "removing an entry of the sticky directory",
                parent,
            ));
        }
        Ok(child)
    }

    /// The attributes of the entry `name` of `parent`.
    async fn child_attr(&self, parent: InodeId, name: &str) -> Result<InodeAttr, OpError> {
        if parent.home() != self.node {
            let meta = self.cluster.meta(parent.home()).await.map_err(rpc_error)?;
            return meta.lookup(parent, name).await.map_err(rpc_error);
        }
        let home = self.node;
        match self.read(|txn| lookup(txn, home, parent, name))? {
            MetaResponse::Attr(attr) => Ok(attr),
            MetaResponse::Inodes(children) if !children.is_empty() => {
                self.attr_of(children[0]).await
            }
            other => Err(OpError::inconsistent(format!(
                "the lookup of {name:?} in {parent} came back as {other:?}"
            ))),
        }
    }
}

/// What a kernel lets a caller without capabilities change: the mode and set times as the
/// owner (a set-group-id bit only on a group it is in), the group as the owner to a group it
/// is in, the size with write access, times to now as the owner or with write access; never
/// the owner. Through a descriptor opened for writing (`through_writer`), write access is
/// the descriptor's.
fn check_set_attr(
    attr: &InodeAttr,
    changes: &mut AttrChanges,
    caller: &Caller,
    through_writer: bool,
) -> Result<(), OpError> {
    let owner = attr.uid == caller.uid;
    let inode = attr.inode;
    let writes = through_writer || allows(attr, caller, access::WRITE);
    if changes.uid.is_some_and(|uid| uid != attr.uid) {
        return Err(not_permitted("changing the owner", inode));
    }
    if let Some(gid) = changes.gid {
        if gid != attr.gid && !(owner && caller.in_group(gid)) {
            return Err(not_permitted("changing the group", inode));
        }
    }
    if let Some(mode) = changes.mode.as_mut() {
        if !owner {
            return Err(not_permitted("changing the mode", inode));
        }
        if !caller.in_group(changes.gid.unwrap_or(attr.gid)) {
            *mode &= !SET_GID;
        }
    }
    if changes.size.is_some() && !writes {
        return Err(denied("truncating", inode));
    }
    for time in [changes.atime, changes.mtime].into_iter().flatten() {
        match time {
            TimeSet::At(_) if !owner => return Err(not_permitted("setting the times", inode)),
            TimeSet::Now if !owner && !writes => return Err(denied("touching", inode)),
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
            project: 0,
            xattr_free: true,
        }
    }

    fn nobody() -> Caller {
        Caller {
            uid: NOBODY,
            gid: NOBODY,
            groups: Vec::new(),
        }
    }

    // Goal: nobody gets the others' bits of another user's file, the owner's of its own.
    #[test]
    fn mode_bits_decide() {
        assert!(!allows(&file(0o600, 1000), &nobody(), access::READ));
        assert!(allows(&file(0o604, 1000), &nobody(), access::READ));
        assert!(!allows(
            &file(0o604, 1000),
            &nobody(),
            access::READ | access::WRITE
        ));
        assert!(allows(&file(0o600, NOBODY), &nobody(), access::WRITE));
        assert!(!allows(
            &file(0o070, 5),
            &Caller {
                uid: 5,
                gid: 5,
                groups: vec![]
            },
            access::READ
        ));
        let member = Caller {
            uid: 7,
            gid: 7,
            groups: vec![1000],
        };
        assert!(
            allows(&file(0o640, 1000), &member, access::READ),
            "a supplementary group"
        );
    }

    // Goal: a squashed root cannot take a file, chmod another's, or truncate without write.
    #[test]
    fn set_attr_follows_the_kernel_rules() {
        let others = file(0o644, 1000);
        let mut chown = AttrChanges {
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
        assert!(check_set_attr(&others, &mut chown, &nobody(), false).is_err());
        assert!(check_set_attr(&others, &mut chmod.clone(), &nobody(), false).is_err());
        assert!(check_set_attr(&others, &mut truncate.clone(), &nobody(), false).is_err());
        let own = file(0o644, NOBODY);
        assert!(check_set_attr(&own, &mut chmod.clone(), &nobody(), false).is_ok());
        assert!(check_set_attr(&own, &mut truncate.clone(), &nobody(), false).is_ok());
        assert!(
            check_set_attr(&file(0o666, 1000), &mut truncate.clone(), &nobody(), false).is_ok()
        );
        // A set-group-id bit on a group the owner is not in is dropped.
        let mut setgid = AttrChanges {
            mode: Some(0o2755),
            ..AttrChanges::default()
        };
        let mut theirs_group = file(0o644, NOBODY);
        theirs_group.gid = 1000;
        assert!(check_set_attr(&theirs_group, &mut setgid, &nobody(), false).is_ok());
        assert_eq!(setgid.mode, Some(0o755));
        // Through a descriptor opened for writing, a read-only file is cut (ftruncate of a
        // file created 0444), but its mode is still only its owner's to change.
        let read_only = file(0o444, 1000);
        assert!(check_set_attr(&read_only, &mut truncate.clone(), &nobody(), false).is_err());
        assert!(check_set_attr(&read_only, &mut truncate.clone(), &nobody(), true).is_ok());
        assert!(check_set_attr(&read_only, &mut chmod.clone(), &nobody(), true).is_err());
    }
}
