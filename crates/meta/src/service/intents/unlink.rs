//! unlink of a dentry whose inode lives on another metadata server: (1) remove the dentry
//! together with recording the intent; (2) the inode's home drops the link (and disposes of the
//! file, or keeps it as an orphan while it is open); (3) drop the intent. A local unlink is one
//! transaction.

use crate::ops::intent::{
    check_not_in_flight, earlier, record_intent, Intent, IntentOp, Prepared, UnlinkIntent,
};
use crate::ops::remove::unlink;
use crate::schema::{load_dentry, load_dir, take_name, OpError, ENTRIES};
use crate::service::Meta;
use crate::store::WriteTransaction;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// Unlink step (1) of a dentry here naming an inode elsewhere: removes the dentry and records
/// the intent in one transaction; `None` when the inode is local (the caller unlinks it
/// locally).
pub(crate) fn prepare_unlink(
    txn: &WriteTransaction,
    home: NodeId,
    mutation: MutationId,
    parent: InodeId,
    name: &str,
) -> Result<Option<Prepared>, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(Some(prepared));
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let parent_record = load_dir(&inodes, parent)?;
    parent_record.check_holds_name(parent, name)?;
    let Some(dentry) = load_dentry(&entries, parent, name)? else {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            format!("{name:?} not found"),
        ));
    };
    check_not_in_flight(txn, parent, name, Some(mutation))?;
    if dentry.child.home() == home {
        return Ok(None);
    }
    if dentry.kind == FileKind::Directory {
        return Err(OpError::rejected(
            ErrorCode::IsDirectory,
            format!("{name:?} is a directory"),
        ));
    }
    take_name(&mut inodes, &mut entries, (parent, parent_record), dentry)?;
    drop((inodes, entries));
    let intent = Intent {
        mutation,
        op: IntentOp::Unlink(UnlinkIntent {
            inode: dentry.child,
        }),
    };
    let id = record_intent(txn, &intent)?;
    Ok(Some(Prepared::Intent(id, intent)))
}

/// Unlink step (3): the inode's home dropped the link; drop the intent and keep the reply.
pub(crate) fn finish_unlink(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
) -> Result<MetaResponse, OpError> {
    super::conclude(txn, id, mutation, Ok(()), |_, ()| Ok(MetaResponse::Done))
}

impl Meta {
    /// unlink: local in one transaction, or with an intent when the inode lives elsewhere.
    pub(in crate::service) async fn unlink(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
    ) -> Result<MetaResponse, OpError> {
        let home = self.node;
        let lookup_name = name.clone();
        let is_open = self.is_open_fn();
        self.local_or_intent(
            mutation,
            move |txn| prepare_unlink(txn, home, mutation, parent, &lookup_name),
            move |txn, _| unlink(txn, parent, &name, is_open),
            "unlink-after-intent",
        )
        .await
    }

    /// Unlink step (2): the inode's home drops the link (the dentry went with the intent).
    pub(in crate::service) async fn continue_unlink(
        &self,
        id: u64,
        mutation: MutationId,
        unlink: &UnlinkIntent,
    ) -> Result<MetaResponse, OpError> {
        self.adjust_remote_links(id, unlink.inode, -1).await?;
        weft_service::failpoint::failpoint("unlink-after-remote");
        self.committer
            .run(Box::new(move |txn| finish_unlink(txn, id, mutation)))
            .await
    }
}
