//! mkdir of a directory whose inode lives on another metadata server. The server holding the
//! dentry coordinates, with an intent record and idempotent steps:
//!
//! (1) record the intent and check the name; (2) the inode's home creates the inode,
//! idempotently per (coordinator, intent); (3) insert the dentry, drop the intent and keep the
//! reply, in one transaction. A crash after (1) or (2) leaves an intent that recovery finishes;
//! if the name was taken meanwhile, the remote inode is removed again.

use crate::ops::create::{load_parent_for_new, owner_group_and_mode, NewEntry};
use crate::ops::intent::{
    check_unsettled, earlier, record_intent, remove_intent, Intent, IntentOp, MkdirIntent,
    Prepared, SpreadMkdirIntent,
};
use crate::ops::xattr::{inherited_mode_and_acls, store_inherited};
use crate::schema::{
    allocate_inode, insert_dentry, load_dentry, now, store_inode, InodeRecord, OpError, COUNTERS,
    ENTRIES, INODES, INTENTS, REMOTE_CREATED, XATTRS,
};
use crate::service::{idempotent_admitted, Meta};
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::layout::StripePattern;
use weft_proto::messages::{FileKind, InodeAttr, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// Where a new directory made by an intent goes.
pub(crate) struct Placement {
    /// The home of its inode (of its first shard, for a spread directory).
    pub home: NodeId,
    /// The homes of its other shards; empty for a directory that is not spread.
    pub shard_homes: Vec<NodeId>,
}

/// mkdir step (1): checks the name, works out the new directory's mode, group, pattern and
/// ACLs from the parent, and records the intent with the request for the inode's home.
pub(crate) fn prepare_mkdir(
    txn: &WriteTransaction,
    coordinator: NodeId,
    mutation: MutationId,
    entry: &NewEntry,
    placement: Placement,
) -> Result<Prepared, OpError> {
    let NewEntry { parent, name, new } = entry;
    let (parent, name) = (*parent, name.as_str());
    let Placement { home, shard_homes } = placement;
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    let parent_record = load_parent_for_new(&inodes, &entries, parent, name)?;
    let xattrs = txn.open_table(XATTRS)?;
    let (mode, acls) = inherited_mode_and_acls(
        &xattrs,
        parent,
        FileKind::Directory,
        new.mode & 0o7777,
        new.umask,
    )?;
    let (mode, gid) = owner_group_and_mode(&parent_record, true, mode, new.gid);
    drop((inodes, entries, xattrs));
    let pattern = parent_record.pattern.unwrap_or(StripePattern::DEFAULT);
    let request = MetaRequest::CreateDirInode {
        coordinator,
        intent: 0,
        parent,
        mode,
        uid: new.uid,
        gid,
        pattern,
        acls: acls.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
        shard_of: None,
        project: parent_record.project,
    };
    let mkdir = MkdirIntent {
        parent,
        name: name.to_string(),
        home,
        request,
    };
    let mut intent = Intent {
        mutation,
        op: if shard_homes.is_empty() {
            IntentOp::Mkdir(mkdir)
        } else {
            IntentOp::MkdirSpread(SpreadMkdirIntent { mkdir, shard_homes })
        },
    };
    let id = record_intent(txn, &intent)?;
    if let IntentOp::Mkdir(mkdir) | IntentOp::MkdirSpread(SpreadMkdirIntent { mkdir, .. }) =
        &mut intent.op
    {
        if let MetaRequest::CreateDirInode { intent: slot, .. } = &mut mkdir.request {
            *slot = id;
        }
    }
    // Store the request with its intent id, so recovery sends exactly the same one.
    INTENTS.open(txn)?.insert(id, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// mkdir step (2), on the inode's home: creates the directory inode (no dentry here), once per
/// (coordinator, intent).
pub(crate) fn create_dir_inode(
    txn: &WriteTransaction,
    home: NodeId,
    request: &MetaRequest,
) -> Result<MetaResponse, OpError> {
    let MetaRequest::CreateDirInode {
        coordinator,
        intent,
        parent,
        mode,
        uid,
        gid,
        pattern,
        acls,
        shard_of,
        project,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a directory-inode creation",
        ));
    };
    check_unsettled(txn, *coordinator, *intent)?;
    pattern
        .validate()
        .map_err(|error| OpError::rejected(ErrorCode::InvalidArgument, error.to_string()))?;
    let mut created = txn.open_table(REMOTE_CREATED)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    if let Some(existing) = created.get((coordinator.0, *intent))? {
        let inode = InodeId(existing.value());
        let record = crate::schema::load_inode(&inodes, inode)?;
        return Ok(MetaResponse::Attr(record.to_attr(inode)));
    }
    let inode = allocate_inode(&mut txn.open_table(COUNTERS)?, home)?;
    let inherited: Vec<(&'static str, Vec<u8>)> = acls
        .iter()
        .filter_map(|(name, value)| {
            [
                crate::acl::ACL_ACCESS,
                crate::acl::ACL_DEFAULT,
                crate::acl::DIR_SPREAD,
            ]
            .into_iter()
            .find(|known| known == name)
            .map(|known| (known, value.clone()))
        })
        .collect();
    let mut record = InodeRecord::new_directory(*mode, *uid, *gid, *parent, *pattern);
    record.shard_of = shard_of.map_or(0, |dir| dir.0);
    record.project = *project;
    record.xattr_free = inherited.is_empty();
    store_inode(&mut inodes, inode, &record)?;
    store_inherited(&mut txn.open_table(XATTRS)?, inode, &inherited)?;
    created.insert((coordinator.0, *intent), inode.0)?;
    Ok(MetaResponse::Attr(record.to_attr(inode)))
}

/// mkdir step (3): inserts the dentry naming the remote inode (see [`finish_new_name`]);
/// the flag says whether the remote inode must be taken back.
pub(crate) fn finish_mkdir(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    mkdir: &MkdirIntent,
    attr: &InodeAttr,
) -> Result<(Result<MetaResponse, OpError>, bool), OpError> {
    finish_new_name(
        txn,
        id,
        mutation,
        (mkdir.parent, &mkdir.name),
        FileKind::Directory,
        attr,
    )
}

/// The last step of a mkdir or link across servers: names `attr.inode` as `name` in `parent`,
/// drops intent `id` and keeps the reply. Returns the reply and whether the other server's
/// work (the inode, or the counted link) must be taken back: only when this call found the
/// intent and the name taken by another entry. An intent already gone was finished by another
/// pass (a live request and recovery may race): its outcome stands, and the reply follows from
/// the dentry — never a take-back, which could undo what a dentry names.
pub(super) fn finish_new_name(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    (parent, name): (InodeId, &str),
    kind: FileKind,
    attr: &InodeAttr,
) -> Result<(Result<MetaResponse, OpError>, bool), OpError> {
    let ours = |txn: &WriteTransaction| -> Result<bool, OpError> {
        Ok(load_dentry(&txn.open_table(ENTRIES)?, parent, name)?
            .is_some_and(|d| d.child == attr.inode))
    };
    if !remove_intent(txn, id)? {
        let outcome = if ours(txn)? {
            Ok(MetaResponse::Attr(attr.clone()))
        } else {
            Err(OpError::rejected(
                ErrorCode::Exists,
                format!("{name:?} already exists"),
            ))
        };
        return Ok((outcome, false));
    }
    // Admitted when its intent was recorded: finished whatever its client settled since.
    let result = idempotent_admitted(txn, mutation, |txn| {
        let mut inodes = crate::schema::usage::Inodes::open(txn)?;
        let mut entries = txn.open_table(ENTRIES)?;
        let mut parent_record = load_parent_for_new(&inodes, &entries, parent, name)?;
        insert_dentry(&mut entries, parent, &parent_record, name, attr.inode, kind)?;
        if kind == FileKind::Directory {
            parent_record.nlink += 1;
        }
        let timestamp = now();
        parent_record.touch(timestamp);
        store_inode(&mut inodes, parent, &parent_record)?;
        Ok(MetaResponse::Attr(attr.clone()))
    });
    match result {
        Err(OpError::Store(message)) => Err(OpError::Store(message)),
        // A stored reply may say Exists for a request whose dentry is ours: no take-back then.
        // And it may name another inode: a retry of the request that was placed differently
        // (on this server, after a restart) made the name first; what this intent made is
        // then taken back.
        Err(rejected) => Ok((Err(rejected), !ours(txn)?)),
        Ok(response) => Ok((Ok(response), !ours(txn)?)),
    }
}

impl Meta {
    /// mkdir of a directory placed on `home`: intent, remote inode, dentry (see the module
    /// header); with `shard_homes`, a directory spread over them too (see `spread`).
    pub(in crate::service) async fn remote_mkdir(
        &self,
        mutation: MutationId,
        entry: NewEntry,
        placement: Placement,
    ) -> Result<MetaResponse, OpError> {
        let coordinator = self.node;
        self.start_intent(
            move |txn| prepare_mkdir(txn, coordinator, mutation, &entry, placement),
            "mkdir-after-intent",
        )
        .await
    }

    /// mkdir step (3) once the inode is made as `attr`: the dentry here ([`finish_mkdir`]),
    /// and whether the name was taken meanwhile, so what was made must be taken back.
    pub(super) async fn commit_mkdir(
        &self,
        id: u64,
        mutation: MutationId,
        mkdir: &MkdirIntent,
        attr: &InodeAttr,
    ) -> Result<(Result<MetaResponse, OpError>, bool), OpError> {
        let (mkdir, attr) = (mkdir.clone(), attr.clone());
        self.committer
            .run_with(move |txn| finish_mkdir(txn, id, mutation, &mkdir, &attr))
            .await
    }

    /// mkdir steps (2) and (3): the inode on its home, then the dentry here; the inode is taken back
    /// when the name was taken meanwhile.
    pub(in crate::service) async fn continue_mkdir(
        &self,
        id: u64,
        mutation: MutationId,
        mkdir: &MkdirIntent,
    ) -> Result<MetaResponse, OpError> {
        let attr = self
            .call_meta_attr(mkdir.home, mkdir.request.clone())
            .await?;
        weft_service::failpoint::failpoint("mkdir-after-remote-create");
        let (finished, take_back) = self.commit_mkdir(id, mutation, mkdir, &attr).await?;
        if take_back {
            // The name was taken while the inode was made: take the inode back.
            let _ = self.remove_remote_dir(attr.inode).await;
        }
        finished
    }
}
