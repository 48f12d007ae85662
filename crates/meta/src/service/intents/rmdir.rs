//! rmdir of a directory whose inode lives on another metadata server (and of a local one, which
//! is one transaction):
//!
//! (1) record the intent; (2) the inode's home removes the directory if it is empty
//! (idempotent: a missing inode is removed already); (3) remove the dentry, drop the intent and
//! keep the reply. Recovery repeats (2) and (3); if (2) finds the directory not empty, the
//! intent is dropped and the directory stays.

use crate::ops::intent::{
    earlier, entry_to_change, record_intent, Intent, IntentOp, Prepared, RmdirIntent,
    SpreadRmdirIntent,
};
use crate::ops::remove::rmdir;
use crate::schema::{
    dir_is_empty, load_dentry, load_dir, take_name, InodeRecord, OpError, ENTRIES, XATTRS,
};
use crate::service::Meta;
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// The directory an rmdir removes.
pub(crate) struct RemovedDir<'a> {
    pub parent: InodeId,
    pub name: &'a str,
    /// Its shards, when it is spread (empty when not).
    pub shards: Vec<InodeId>,
}

/// rmdir step (1) when the directory's inode lives elsewhere; `None` when it is local (the
/// caller removes it in one local transaction).
pub(crate) fn prepare_rmdir(
    txn: &WriteTransaction,
    home: NodeId,
    mutation: MutationId,
    removed: RemovedDir<'_>,
) -> Result<Option<Prepared>, OpError> {
    let RemovedDir {
        parent,
        name,
        shards,
    } = removed;
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(Some(prepared));
    }
    let dentry = entry_to_change(txn, mutation, parent, name)?;
    let rmdir = RmdirIntent {
        parent,
        name: name.to_string(),
        child: dentry.child,
    };
    let op = if !shards.is_empty() {
        IntentOp::RmdirSpread(SpreadRmdirIntent { rmdir, shards })
    } else if dentry.child.home() == home {
        return Ok(None);
    } else if dentry.kind != FileKind::Directory {
        return Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("{name:?} is not a directory"),
        ));
    } else {
        IntentOp::Rmdir(rmdir)
    };
    let intent = Intent { mutation, op };
    let id = record_intent(txn, &intent)?;
    Ok(Some(Prepared::Intent(id, intent)))
}

/// rmdir step (2), on the inode's home: removes an empty directory inode; a missing one is
/// removed already.
pub(crate) fn remove_dir_inode(
    txn: &WriteTransaction,
    inode: InodeId,
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let Some(bytes) = inodes.get(inode.0)? else {
        return Ok(MetaResponse::Done);
    };
    let record = InodeRecord::decode(inode.0, bytes.value())?;
    drop(bytes);
    if !record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("inode {inode} is not a directory"),
        ));
    }
    if !dir_is_empty(&txn.open_table(ENTRIES)?, inode)? {
        return Err(OpError::rejected(
            ErrorCode::NotEmpty,
            "the directory is not empty",
        ));
    }
    inodes.remove(inode)?;
    crate::ops::xattr::remove_all(&mut txn.open_table(XATTRS)?, inode)?;
    Ok(MetaResponse::Done)
}

/// rmdir step (3): removes the dentry if it still names the removed directory, drops the intent
/// and keeps the reply. With `outcome` an error of step (2), only the intent goes and the error
/// is the reply.
pub(crate) fn finish_rmdir(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    RmdirIntent {
        parent,
        name,
        child,
    }: &RmdirIntent,
    outcome: Result<(), OpError>,
) -> Result<MetaResponse, OpError> {
    super::conclude(txn, id, mutation, outcome, |txn, ()| {
        let mut inodes = crate::schema::usage::Inodes::open(txn)?;
        let mut entries = txn.open_table(ENTRIES)?;
        let Some(dentry) = load_dentry(&entries, *parent, name)? else {
            return Ok(MetaResponse::Done);
        };
        if dentry.child == *child {
            let parent_record = load_dir(&inodes, *parent)?;
            take_name(&mut inodes, &mut entries, (*parent, parent_record), dentry)?;
        }
        Ok(MetaResponse::Done)
    })
}

impl Meta {
    /// rmdir: local in one transaction, or with an intent when the directory lives elsewhere.
    pub(in crate::service) async fn rmdir(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
    ) -> Result<MetaResponse, OpError> {
        let home = self.node;
        let lookup_name = name.clone();
        let shards = self.shards_of_child(parent, &name).await?;
        let prepare = move |txn: &crate::store::WriteTransaction| {
            let removed = RemovedDir {
                parent,
                name: &lookup_name,
                shards,
            };
            prepare_rmdir(txn, home, mutation, removed)
        };
        self.local_or_intent(
            mutation,
            prepare,
            move |txn, _| rmdir(txn, parent, &name),
            "rmdir-after-intent",
        )
        .await
    }

    /// Removes an empty directory inode on its home: `Ok(Err)` when the home refuses.
    pub(in crate::service) async fn remove_remote_dir(
        &self,
        inode: InodeId,
    ) -> Result<Result<(), OpError>, OpError> {
        let request = MetaRequest::RemoveDirInode { inode };
        Ok(self.ask_meta(inode.home(), request).await?.map(|_| ()))
    }

    /// rmdir steps (2) and (3): the inode's home removes the directory if it is empty, then the
    /// dentry goes here (or, refused, only the intent, with the refusal as the answer).
    pub(in crate::service) async fn continue_rmdir(
        &self,
        id: u64,
        mutation: MutationId,
        rmdir: &RmdirIntent,
    ) -> Result<MetaResponse, OpError> {
        let outcome = self.remove_remote_dir(rmdir.child).await?;
        weft_service::failpoint::failpoint("rmdir-after-remote-remove");
        let finishing = rmdir.clone();
        self.committer
            .run(Box::new(move |txn| {
                finish_rmdir(txn, id, mutation, &finishing, outcome)
            }))
            .await
    }
}
