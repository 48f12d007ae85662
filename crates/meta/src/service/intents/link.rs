//! Hard links to an inode living on another metadata server, coordinated by the server of the
//! new dentry: (1) record the intent and check the name; (2) the inode's home counts the link,
//! once per intent; (3) insert the dentry, drop the intent and keep the reply. The link-count
//! step is shared with unlink and rename (a replaced file victim living elsewhere).

use super::mkdir::finish_new_name;
use crate::ops::create::load_parent_for_new;
use crate::ops::intent::{
    check_unsettled, earlier, record_intent, Intent, IntentOp, LinkIntent, Prepared,
};
use crate::schema::{now, store_inode, InodeRecord, OpError, ENTRIES, INODES, REMOTE_CREATED};
use crate::service::Meta;
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, InodeAttr, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// Link step (1) for an inode of another server: checks the name and records the intent.
pub(crate) fn prepare_link(
    txn: &WriteTransaction,
    mutation: MutationId,
    inode: InodeId,
    kind: FileKind,
    new_parent: InodeId,
    new_name: &str,
) -> Result<Prepared, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    if kind == FileKind::Directory {
        return Err(OpError::rejected(
            ErrorCode::NotPermitted,
            "cannot hard-link a directory",
        ));
    }
    load_parent_for_new(
        &txn.open_table(INODES)?,
        &txn.open_table(ENTRIES)?,
        new_parent,
        new_name,
    )?;
    let intent = Intent {
        mutation,
        op: IntentOp::Link(LinkIntent {
            inode,
            kind_code: crate::schema::kind_code(kind),
            new_parent,
            new_name: new_name.to_string(),
        }),
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Link step (3): the inode's home counted the link; insert the dentry, drop the intent, keep
/// the reply. Returns whether the link must be given back (the name was taken meanwhile).
pub(crate) fn finish_link(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    LinkIntent {
        inode,
        kind_code,
        new_parent,
        new_name,
    }: &LinkIntent,
    attr: &InodeAttr,
) -> Result<(Result<MetaResponse, OpError>, bool), OpError> {
    debug_assert_eq!(
        *inode, attr.inode,
        "the link names the inode whose count went up"
    );
    let kind = crate::schema::kind_from_code(*kind_code);
    finish_new_name(txn, id, mutation, (*new_parent, new_name), kind, attr)
}

/// On the inode's home: applies a link-count change once per (coordinator, intent, delta).
pub(crate) fn adjust_links(
    txn: &WriteTransaction,
    coordinator: NodeId,
    intent: u64,
    inode: InodeId,
    delta: i32,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<MetaResponse, OpError> {
    check_unsettled(txn, coordinator, intent)?;
    // The applied-marker reuses the remote-creation table: (coordinator, intent) for +1,
    // (coordinator, intent | high bit) for -1, so an undo of a link has its own marker.
    let key = (
        coordinator.0,
        if delta < 0 {
            intent | (1 << 63)
        } else {
            intent
        },
    );
    let mut applied = txn.open_table(REMOTE_CREATED)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let already = applied.get(key)?.is_some();
    let Some(bytes) = inodes.get(inode.0)? else {
        if already || delta < 0 {
            // Gone already: its last link went before.
            return Ok(MetaResponse::Done);
        }
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            format!("inode {inode} does not exist"),
        ));
    };
    let mut record = InodeRecord::decode(inode.0, bytes.value())?;
    drop(bytes);
    if already {
        return Ok(MetaResponse::Attr(record.to_attr(inode)));
    }
    if record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::NotPermitted,
            "cannot hard-link a directory",
        ));
    }
    if delta > 0 && record.nlink == 0 {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            "the file was removed",
        ));
    }
    applied.insert(key, inode.0)?;
    drop(applied);
    if delta > 0 {
        record.nlink += 1;
        record.ctime = now();
        store_inode(&mut inodes, inode, &record)?;
        return Ok(MetaResponse::Attr(record.to_attr(inode)));
    }
    let attr = record.to_attr(inode);
    // The name that went was in a directory of another home (the coordinator's).
    crate::ops::remove::drop_link(txn, &mut inodes, (inode, None), record, is_open(inode))?;
    Ok(MetaResponse::Attr(attr))
}

impl Meta {
    /// A hard link here to an inode of another server (see the module header).
    pub(in crate::service) async fn remote_link(
        &self,
        mutation: MutationId,
        inode: InodeId,
        new_parent: InodeId,
        new_name: String,
    ) -> Result<MetaResponse, OpError> {
        let kind = self.attr_of(inode).await?.kind;
        self.start_intent(
            move |txn| prepare_link(txn, mutation, inode, kind, new_parent, &new_name),
            "link-after-intent",
        )
        .await
    }

    /// Asks the home of `inode` to change its link count for intent `id`.
    pub(in crate::service) async fn adjust_remote_links(
        &self,
        id: u64,
        inode: InodeId,
        delta: i32,
    ) -> Result<MetaResponse, OpError> {
        let request = MetaRequest::AdjustLinks {
            coordinator: self.node,
            intent: id,
            inode,
            delta,
        };
        self.call_meta(inode.home(), request).await
    }

    /// Link steps (2) and (3): the inode's home counts the link, then the dentry here; the link is
    /// given back when the name was taken meanwhile.
    pub(in crate::service) async fn continue_link(
        &self,
        id: u64,
        mutation: MutationId,
        link: &LinkIntent,
    ) -> Result<MetaResponse, OpError> {
        let MetaResponse::Attr(attr) = self.adjust_remote_links(id, link.inode, 1).await? else {
            return Err(OpError::inconsistent("attributes expected"));
        };
        weft_service::failpoint::failpoint("link-after-remote");
        let finishing = link.clone();
        let (finished, give_back) = {
            let attr = attr.clone();
            self.committer
                .run_with(move |txn| finish_link(txn, id, mutation, &finishing, &attr))
                .await?
        };
        if give_back {
            let _ = self.adjust_remote_links(id, link.inode, -1).await;
        }
        finished
    }
}
