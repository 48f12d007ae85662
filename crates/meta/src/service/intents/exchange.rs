//! RENAME_EXCHANGE with an entry on another server, or with inodes living elsewhere:
//! (1) record the intent; (2) the far name takes the near inode, once per intent (`Busy` if the
//! far entry changed meanwhile); the moved inodes' homes learn their parents; (3) the near name
//! takes the far inode, the intent goes and the reply is kept.

use crate::ops::intent::{
    check_not_in_flight, check_unsettled, earlier, entry_to_change, record_intent, ExchangeIntent,
    Intent, IntentOp, Prepared,
};
use crate::ops::rename::mark_renamed;
use crate::schema::{
    load_dentry, load_dir, now, store_inode, Dentry, OpError, ENTRIES, REMOTE_CREATED,
};
use crate::service::Meta;
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::InodeId;
use weft_proto::messages::{FileKind, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// A RENAME_EXCHANGE of a name on this server with a name elsewhere.
pub(crate) struct Exchange {
    /// The near name's directory, here.
    pub parent: InodeId,
    pub name: String,
    /// The far name's directory, elsewhere.
    pub new_parent: InodeId,
    pub new_name: String,
    /// The inode the far name holds, and its kind.
    pub other: InodeId,
    pub other_kind: FileKind,
}

/// Exchange step (1), on the coordinator: checks the near name and records the intent.
pub(crate) fn prepare_exchange(
    txn: &WriteTransaction,
    mutation: MutationId,
    exchange: &Exchange,
) -> Result<Prepared, OpError> {
    let Exchange {
        parent,
        name,
        new_parent,
        new_name,
        other,
        other_kind,
    } = exchange;
    let (parent, new_parent, other, other_kind) = (*parent, *new_parent, *other, *other_kind);
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    let dentry = entry_to_change(txn, mutation, parent, name)?;
    if dentry.child == other {
        // Two names of one inode: nothing to swap.
        return Ok(Prepared::Answered(Ok(MetaResponse::Done)));
    }
    let intent = Intent {
        mutation,
        op: IntentOp::Exchange(ExchangeIntent {
            parent,
            name: name.to_string(),
            child: dentry.child,
            kind_code: crate::schema::kind_code(dentry.kind),
            new_parent,
            new_name: new_name.to_string(),
            other,
            other_kind_code: crate::schema::kind_code(other_kind),
        }),
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Exchange step (2), on the far name's server: the far name takes the near inode, once per
/// (coordinator, intent); the directory's link count follows the kinds.
pub(crate) fn exchange_dentry(
    txn: &WriteTransaction,
    request: &MetaRequest,
) -> Result<MetaResponse, OpError> {
    let MetaRequest::ExchangeDentry {
        coordinator,
        intent,
        parent,
        name,
        expect,
        child,
        kind,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a dentry exchange",
        ));
    };
    check_unsettled(txn, *coordinator, *intent)?;
    // The marker says this exchange was applied here already.
    let key = (coordinator.0, *intent | (1 << 61));
    if txn.open_table(REMOTE_CREATED)?.get(key)?.is_some() {
        return Ok(MetaResponse::Unchanged);
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut parent_record = load_dir(&inodes, *parent)?;
    parent_record.check_holds_name(*parent, name)?;
    let dentry = load_dentry(&entries, *parent, name)?
        .filter(|dentry| dentry.child == *expect)
        .ok_or_else(|| {
            OpError::rejected(
                ErrorCode::Busy,
                format!("{name:?} changed during the exchange; try again"),
            )
        })?;
    check_not_in_flight(txn, *parent, name, None)?;
    crate::schema::replace_dentry(
        &mut entries,
        *parent,
        name,
        Dentry {
            child: *child,
            kind: *kind,
            ..dentry
        },
    )?;
    let delta =
        i64::from(*kind == FileKind::Directory) - i64::from(dentry.kind == FileKind::Directory);
    parent_record.nlink = (i64::from(parent_record.nlink) + delta).max(0) as u32;
    parent_record.touch(now());
    store_inode(&mut inodes, *parent, &parent_record)?;
    drop((inodes, entries));
    txn.open_table(REMOTE_CREATED)?.insert(key, expect.0)?;
    Ok(MetaResponse::Done)
}

/// Exchange step (3), on the coordinator: the near name takes the far inode, the intent goes
/// and the reply is kept. With `outcome` an error of step (2), only the intent goes.
pub(crate) fn finish_exchange(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    ExchangeIntent {
        parent,
        name,
        child,
        kind_code,
        new_parent,
        other,
        other_kind_code,
        ..
    }: &ExchangeIntent,
    outcome: Result<(), OpError>,
) -> Result<MetaResponse, OpError> {
    super::conclude(txn, id, mutation, outcome, |txn, ()| {
        let mut inodes = crate::schema::usage::Inodes::open(txn)?;
        let mut entries = txn.open_table(ENTRIES)?;
        if let Some(dentry) = load_dentry(&entries, *parent, name)? {
            if dentry.child == *child {
                crate::schema::replace_dentry(
                    &mut entries,
                    *parent,
                    name,
                    Dentry {
                        child: *other,
                        kind: crate::schema::kind_from_code(*other_kind_code),
                        ..dentry
                    },
                )?;
                let directory = crate::schema::kind_code(FileKind::Directory);
                let delta =
                    i64::from(*other_kind_code == directory) - i64::from(*kind_code == directory);
                let mut parent_record = load_dir(&inodes, *parent)?;
                parent_record.nlink = (i64::from(parent_record.nlink) + delta).max(0) as u32;
                parent_record.touch(now());
                store_inode(&mut inodes, *parent, &parent_record)?;
            }
        }
        // The swapped inodes that live here (those elsewhere were told by the coordinator).
        mark_renamed(&mut inodes, *child, *new_parent)?;
        mark_renamed(&mut inodes, *other, *parent)?;
        Ok(MetaResponse::Done)
    })
}

impl Meta {
    /// RENAME_EXCHANGE with an entry elsewhere (see the module header).
    pub(in crate::service) async fn exchange_out(
        &self,
        mutation: MutationId,
        exchange: Exchange,
    ) -> Result<MetaResponse, OpError> {
        self.start_intent(
            move |txn| prepare_exchange(txn, mutation, &exchange),
            "rename-after-intent",
        )
        .await
    }

    /// Exchange steps (2) and (3): the far name takes the near inode, the moved inodes' homes
    /// learn their parents, then the near name takes the far inode.
    pub(in crate::service) async fn continue_exchange(
        &self,
        id: u64,
        mutation: MutationId,
        exchange: &ExchangeIntent,
    ) -> Result<MetaResponse, OpError> {
        let ExchangeIntent {
            child,
            kind_code,
            new_parent,
            new_name,
            other,
            parent,
            ..
        } = exchange;
        let request = MetaRequest::ExchangeDentry {
            coordinator: self.node,
            intent: id,
            parent: *new_parent,
            name: new_name.clone(),
            expect: *other,
            child: *child,
            kind: crate::schema::kind_from_code(*kind_code),
        };
        let outcome = self.ask_meta(new_parent.home(), request).await?.map(|_| ());
        if outcome.is_ok() {
            self.mark_renamed(*child, *new_parent).await?;
            self.mark_renamed(*other, *parent).await?;
        }
        weft_service::failpoint::failpoint("rename-after-remote");
        let finishing = exchange.clone();
        self.committer
            .run(Box::new(move |txn| {
                finish_exchange(txn, id, mutation, &finishing, outcome)
            }))
            .await
    }
}
