//! Directory operations that span two metadata servers: a new directory whose inode lives on
//! another server (mkdir), and the removal of such a directory (rmdir). The server holding the
//! dentry coordinates, with an intent record and idempotent steps:
//!
//! mkdir: (1) record the intent and check the name; (2) the inode's home creates the inode,
//! idempotently per (coordinator, intent); (3) insert the dentry, drop the intent and keep the
//! reply, in one transaction. A crash after (1) or (2) leaves an intent that recovery finishes;
//! if the name was taken meanwhile, the remote inode is removed again.
//!
//! rmdir: (1) record the intent; (2) the inode's home removes the directory if it is empty
//! (idempotent: a missing inode is removed already); (3) remove the dentry, drop the intent and
//! keep the reply. Recovery repeats (2) and (3); if (2) finds the directory not empty, the
//! intent is dropped and the directory stays.

use super::create::{load_parent_for_new, owner_group_and_mode};
use super::xattr::{inherited_mode_and_acls, store_inherited};
use crate::service::idempotent;
use crate::store::{
    allocate_inode, dir_is_empty, insert_dentry, load_dentry, load_dir, now, remove_dentry,
    store_inode, Dentry, InodeRecord, OpError, COUNTERS, ENTRIES, INODES, INTENTS, INTENT_NAMES,
    REMOTE_CREATED, REPLIES, SETTLED_INTENTS, XATTRS,
};
use redb::{ReadTransaction, ReadableTable, WriteTransaction};
use serde::{Deserialize, Serialize};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::layout::StripePattern;
use weft_proto::messages::{FileKind, InodeAttr, MetaRequest, MutationId, NewInode, Response};
use weft_proto::wire::Wire;
use weft_proto::ErrorCode;

/// A cross-server operation in flight, as recorded by its coordinator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Intent {
    /// The client request it serves; its reply is kept under this id when it finishes.
    pub mutation: MutationId,
    pub op: IntentOp,
}

#[derive(Clone, Debug, Wire)]
pub(crate) enum IntentOp {
    #[wire(tag = 0)]
    Mkdir {
        parent: InodeId,
        name: String,
        home: NodeId,
        request: MetaRequest,
    },
    #[wire(tag = 1)]
    Rmdir {
        parent: InodeId,
        name: String,
        child: InodeId,
    },
    /// mkdir of a spread directory: the directory on `home`, then its other shards on
    /// `shard_homes`, then the shard list on the directory, then the dentry.
    #[wire(tag = 2)]
    MkdirSpread {
        parent: InodeId,
        name: String,
        home: NodeId,
        request: MetaRequest,
        shard_homes: Vec<NodeId>,
    },
    /// rmdir of a spread directory: seal its other shards (each must be empty), remove the
    /// directory if it is empty, remove the shards, then the dentry; or unseal them again.
    #[wire(tag = 3)]
    RmdirSpread {
        parent: InodeId,
        name: String,
        child: InodeId,
        shards: Vec<InodeId>,
    },
    /// A hard link here to an inode elsewhere: the inode's home counts the link first.
    #[wire(tag = 4)]
    Link {
        inode: InodeId,
        kind_code: u8,
        new_parent: InodeId,
        new_name: String,
    },
    /// The dentry here is already gone; the inode's home drops the link.
    #[wire(tag = 5)]
    Unlink { inode: InodeId },
    /// A rename of a non-directory to a directory on another server: the new name first, then
    /// the old one goes.
    #[wire(tag = 6)]
    RenameOut {
        parent: InodeId,
        name: String,
        child: InodeId,
        kind_code: u8,
        new_parent: InodeId,
        new_name: String,
        no_replace: bool,
    },
    /// RENAME_EXCHANGE with an entry on another server, or with inodes elsewhere: the far
    /// name first takes `child`, then the near one takes `other`.
    #[wire(tag = 7)]
    Exchange {
        parent: InodeId,
        name: String,
        child: InodeId,
        kind_code: u8,
        new_parent: InodeId,
        new_name: String,
        other: InodeId,
        other_kind_code: u8,
    },
}

impl IntentOp {
    /// The dentry here that the operation removes or replaces: no other operation may touch it
    /// until the intent is finished.
    fn protected_name(&self) -> Option<(InodeId, &str)> {
        match self {
            IntentOp::Rmdir { parent, name, .. }
            | IntentOp::RmdirSpread { parent, name, .. }
            | IntentOp::RenameOut { parent, name, .. }
            | IntentOp::Exchange { parent, name, .. } => Some((*parent, name)),
            IntentOp::Mkdir { .. }
            | IntentOp::MkdirSpread { .. }
            | IntentOp::Link { .. }
            | IntentOp::Unlink { .. } => None,
        }
    }
}

/// Fails with `Busy` while an unfinished cross-server operation — other than `mutation`'s own,
/// retried — is about to remove or replace `name` in `parent`; the client asks again.
pub(crate) fn check_not_in_flight(
    txn: &WriteTransaction,
    parent: InodeId,
    name: &str,
    mutation: Option<MutationId>,
) -> Result<(), OpError> {
    let Some(id) = txn
        .open_table(INTENT_NAMES)?
        .get((parent.0, name))?
        .map(|id| id.value())
    else {
        return Ok(());
    };
    if let Some(mutation) = mutation {
        if let Some(bytes) = txn.open_table(INTENTS)?.get(id)? {
            if let Ok(intent) = postcard::from_bytes::<Intent>(bytes.value()) {
                if intent.mutation.client == mutation.client && intent.mutation.seq == mutation.seq
                {
                    return Ok(());
                }
            }
        }
    }
    Err(OpError::rejected(
        ErrorCode::Busy,
        format!("{name:?} is being changed by another operation; try again"),
    ))
}

/// What step (1) leaves to do.
// One is made and consumed per cross-server operation: its size costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared {
    /// The request was answered before (a retry): this is its reply.
    Answered(Result<Response, OpError>),
    /// Go on with the intent.
    Intent(u64, Intent),
}

/// What an earlier run of the same request left: its reply, or its intent still pending (a
/// retry after a crash goes on with it rather than start over on a half-changed namespace).
fn earlier(txn: &WriteTransaction, mutation: MutationId) -> Result<Option<Prepared>, OpError> {
    let replies = txn.open_table(REPLIES)?;
    if let Some(bytes) = replies.get((mutation.client.0, mutation.seq))? {
        return Ok(Some(Prepared::Answered(
            match postcard::from_bytes::<weft_proto::messages::Reply>(bytes.value()) {
                Ok(Ok(response)) => Ok(response),
                Ok(Err(error)) => Err(OpError::Rejected(error)),
                Err(error) => Err(OpError::Store(format!("stored reply is damaged: {error}"))),
            },
        )));
    }
    for item in txn.open_table(INTENTS)?.iter()? {
        let (key, value) = item?;
        if let Ok(intent) = postcard::from_bytes::<Intent>(value.value()) {
            if intent.mutation.client == mutation.client && intent.mutation.seq == mutation.seq {
                return Ok(Some(Prepared::Intent(key.value(), intent)));
            }
        }
    }
    Ok(None)
}

/// All intents, for recovery.
pub(crate) fn intents(txn: &ReadTransaction) -> Result<Vec<(u64, Intent)>, OpError> {
    let table = txn.open_table(INTENTS)?;
    let mut out = Vec::new();
    for item in table.iter()? {
        let (key, value) = item?;
        let intent: Intent = postcard::from_bytes(value.value()).map_err(|error| {
            OpError::Store(format!("intent {} is damaged: {error}", key.value()))
        })?;
        out.push((key.value(), intent));
    }
    Ok(out)
}

/// Records `intent` and returns its id. (A retry of the same request found its intent with
/// [`earlier`] instead.)
fn record_intent(txn: &WriteTransaction, intent: &Intent) -> Result<u64, OpError> {
    let mut counters = txn.open_table(COUNTERS)?;
    let id = counters.get("intent")?.map(|v| v.value()).unwrap_or(0) + 1;
    counters.insert("intent", id)?;
    let bytes = postcard::to_stdvec(intent).expect("intents encode");
    txn.open_table(INTENTS)?.insert(id, bytes.as_slice())?;
    if let Some((parent, name)) = intent.op.protected_name() {
        txn.open_table(INTENT_NAMES)?.insert((parent.0, name), id)?;
    }
    Ok(id)
}

/// Removes intent `id` and the name it protects; false when it was gone already.
fn remove_intent(txn: &WriteTransaction, id: u64) -> Result<bool, OpError> {
    let Some(bytes) = txn
        .open_table(INTENTS)?
        .remove(id)?
        .map(|b| b.value().to_vec())
    else {
        return Ok(false);
    };
    if let Ok(intent) = postcard::from_bytes::<Intent>(&bytes) {
        if let Some((parent, name)) = intent.op.protected_name() {
            let mut names = txn.open_table(INTENT_NAMES)?;
            if names.get((parent.0, name))?.map(|v| v.value()) == Some(id) {
                names.remove((parent.0, name))?;
            }
        }
    }
    Ok(true)
}

/// The bits of a step marker's key that hold the intent id; the bits above say which step.
const INTENT_BITS: u64 = (1 << 61) - 1;

/// The intent id below which every intent of this coordinator has finished: its oldest
/// recorded one, or the next id when none is recorded.
pub(crate) fn settled_below(txn: &ReadTransaction) -> Result<u64, OpError> {
    if let Some((oldest, _)) = txn.open_table(INTENTS)?.first()? {
        return Ok(oldest.value());
    }
    Ok(txn
        .open_table(COUNTERS)?
        .get("intent")?
        .map_or(0, |v| v.value())
        + 1)
}

/// On another home: records that every intent of `coordinator` below `below` finished, and
/// forgets the markers of their steps, which no copy of a step may use any more.
pub(crate) fn settle_intents(
    txn: &WriteTransaction,
    coordinator: NodeId,
    below: u64,
) -> Result<Response, OpError> {
    let mut settled = txn.open_table(SETTLED_INTENTS)?;
    if settled
        .get(coordinator.0)?
        .is_some_and(|known| known.value() >= below)
    {
        return Ok(Response::Unchanged);
    }
    settled.insert(coordinator.0, below)?;
    txn.open_table(REMOTE_CREATED)?.retain_in(
        (coordinator.0, 0)..=(coordinator.0, u64::MAX),
        |(_, key), _| key & INTENT_BITS >= below,
    )?;
    Ok(Response::Done)
}

/// Refuses a step of `coordinator`'s intent `intent` once that intent is known to have
/// finished: it is a late copy, and the marker that made it harmless may be gone.
fn check_unsettled(
    txn: &WriteTransaction,
    coordinator: NodeId,
    intent: u64,
) -> Result<(), OpError> {
    let below = txn
        .open_table(SETTLED_INTENTS)?
        .get(coordinator.0)?
        .map_or(0, |v| v.value());
    if intent < below {
        return Err(OpError::rejected(
            ErrorCode::Superseded,
            format!(
                "operation {intent} of metadata node {coordinator} finished; this is a late \
                 copy of one of its steps"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn drop_intent(txn: &WriteTransaction, id: u64) -> Result<Response, OpError> {
    remove_intent(txn, id)?;
    Ok(Response::Done)
}

/// mkdir step (1): checks the name, works out the new directory's mode, group, pattern and
/// ACLs from the parent, and records the intent with the request for the inode's home.
pub(crate) fn prepare_mkdir(
    txn: &WriteTransaction,
    coordinator: NodeId,
    mutation: MutationId,
    parent: InodeId,
    name: &str,
    new: &NewInode,
    (home, shard_homes): (NodeId, Vec<NodeId>),
) -> Result<Prepared, OpError> {
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
    };
    let name = name.to_string();
    let mut intent = Intent {
        mutation,
        op: if shard_homes.is_empty() {
            IntentOp::Mkdir {
                parent,
                name,
                home,
                request,
            }
        } else {
            IntentOp::MkdirSpread {
                parent,
                name,
                home,
                request,
                shard_homes,
            }
        },
    };
    let id = record_intent(txn, &intent)?;
    if let IntentOp::Mkdir { request, .. } | IntentOp::MkdirSpread { request, .. } = &mut intent.op
    {
        if let MetaRequest::CreateDirInode { intent: slot, .. } = request {
            *slot = id;
        }
    }
    // Store the request with its intent id, so recovery sends exactly the same one.
    let bytes = postcard::to_stdvec(&intent).expect("intents encode");
    txn.open_table(INTENTS)?.insert(id, bytes.as_slice())?;
    Ok(Prepared::Intent(id, intent))
}

/// mkdir step (2), on the inode's home: creates the directory inode (no dentry here), once per
/// (coordinator, intent).
pub(crate) fn create_dir_inode(
    txn: &WriteTransaction,
    home: NodeId,
    request: &MetaRequest,
) -> Result<Response, OpError> {
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
    let mut inodes = txn.open_table(INODES)?;
    if let Some(existing) = created.get((coordinator.0, *intent))? {
        let inode = InodeId(existing.value());
        let record = crate::store::load_inode(&inodes, inode)?;
        return Ok(Response::Attr(record.to_attr(inode)));
    }
    let inode = allocate_inode(&mut txn.open_table(COUNTERS)?, home)?;
    let mut record = InodeRecord::new_directory(*mode, *uid, *gid, *parent, *pattern);
    record.shard_of = shard_of.map_or(0, |dir| dir.0);
    store_inode(&mut inodes, inode, &record)?;
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
    store_inherited(&mut txn.open_table(XATTRS)?, inode, &inherited)?;
    created.insert((coordinator.0, *intent), inode.0)?;
    Ok(Response::Attr(record.to_attr(inode)))
}

/// mkdir step (3): inserts the dentry naming the remote inode (see [`finish_new_name`]);
/// the flag says whether the remote inode must be taken back.
pub(crate) fn finish_mkdir(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
    attr: &InodeAttr,
) -> Result<(Result<Response, OpError>, bool), OpError> {
    let (IntentOp::Mkdir { parent, name, .. } | IntentOp::MkdirSpread { parent, name, .. }) =
        &intent.op
    else {
        return Err(OpError::Store(format!("intent {id} is not a mkdir")));
    };
    finish_new_name(
        txn,
        id,
        intent.mutation,
        (*parent, name),
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
fn finish_new_name(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    (parent, name): (InodeId, &str),
    kind: FileKind,
    attr: &InodeAttr,
) -> Result<(Result<Response, OpError>, bool), OpError> {
    let ours = |txn: &WriteTransaction| -> Result<bool, OpError> {
        Ok(load_dentry(&txn.open_table(ENTRIES)?, parent, name)?
            .is_some_and(|d| d.child == attr.inode))
    };
    if !remove_intent(txn, id)? {
        let outcome = if ours(txn)? {
            Ok(Response::Attr(attr.clone()))
        } else {
            Err(OpError::rejected(
                ErrorCode::Exists,
                format!("{name:?} already exists"),
            ))
        };
        return Ok((outcome, false));
    }
    let result = idempotent(txn, mutation, |txn| {
        let mut inodes = txn.open_table(INODES)?;
        let mut entries = txn.open_table(ENTRIES)?;
        let mut parent_record = load_parent_for_new(&inodes, &entries, parent, name)?;
        insert_dentry(&mut entries, parent, &parent_record, name, attr.inode, kind)?;
        if kind == FileKind::Directory {
            parent_record.nlink += 1;
        }
        let timestamp = now();
        parent_record.touch(timestamp);
        store_inode(&mut inodes, parent, &parent_record)?;
        Ok(Response::Attr(attr.clone()))
    });
    match result {
        Err(OpError::Store(message)) => Err(OpError::Store(message)),
        // A stored reply may say Exists for a request whose dentry is ours: no take-back then.
        Err(rejected) => Ok((Err(rejected), !ours(txn)?)),
        Ok(response) => Ok((Ok(response), false)),
    }
}

/// rmdir step (1) when the directory's inode lives elsewhere; `None` when it is local (the
/// caller removes it in one local transaction).
pub(crate) fn prepare_rmdir(
    txn: &WriteTransaction,
    home: NodeId,
    mutation: MutationId,
    parent: InodeId,
    (name, shards): (&str, Vec<InodeId>),
) -> Result<Option<Prepared>, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(Some(prepared));
    }
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
    let dentry = load_dentry(&entries, parent, name)?
        .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?;
    check_not_in_flight(txn, parent, name, Some(mutation))?;
    if !shards.is_empty() {
        drop((inodes, entries));
        let intent = Intent {
            mutation,
            op: IntentOp::RmdirSpread {
                parent,
                name: name.to_string(),
                child: dentry.child,
                shards,
            },
        };
        let id = record_intent(txn, &intent)?;
        return Ok(Some(Prepared::Intent(id, intent)));
    }
    if dentry.child.home() == home {
        return Ok(None);
    }
    if dentry.kind != FileKind::Directory {
        return Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("{name:?} is not a directory"),
        ));
    }
    drop((inodes, entries));
    let intent = Intent {
        mutation,
        op: IntentOp::Rmdir {
            parent,
            name: name.to_string(),
            child: dentry.child,
        },
    };
    let id = record_intent(txn, &intent)?;
    Ok(Some(Prepared::Intent(id, intent)))
}

/// rmdir step (2), on the inode's home: removes an empty directory inode; a missing one is
/// removed already.
pub(crate) fn remove_dir_inode(
    txn: &WriteTransaction,
    inode: InodeId,
) -> Result<Response, OpError> {
    let mut inodes = txn.open_table(INODES)?;
    let Some(bytes) = inodes.get(inode.0)? else {
        return Ok(Response::Done);
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
    inodes.remove(inode.0)?;
    super::xattr::remove_all(&mut txn.open_table(XATTRS)?, inode)?;
    Ok(Response::Done)
}

/// rmdir step (3): removes the dentry if it still names the removed directory, drops the intent
/// and keeps the reply. With `outcome` an error of step (2), only the intent goes and the error
/// is the reply.
pub(crate) fn finish_rmdir(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
    outcome: Result<(), OpError>,
) -> Result<Response, OpError> {
    let (IntentOp::Rmdir {
        parent,
        name,
        child,
    }
    | IntentOp::RmdirSpread {
        parent,
        name,
        child,
        ..
    }) = &intent.op
    else {
        return Err(OpError::Store(format!("intent {id} is not an rmdir")));
    };
    drop_intent(txn, id)?;
    idempotent(txn, intent.mutation, |txn| {
        outcome?;
        let mut inodes = txn.open_table(INODES)?;
        let mut entries = txn.open_table(ENTRIES)?;
        let Some(dentry) = load_dentry(&entries, *parent, name)? else {
            return Ok(Response::Done);
        };
        if dentry.child == *child {
            remove_dentry(&mut entries, *parent, dentry)?;
            let mut parent_record = load_dir(&inodes, *parent)?;
            let timestamp = now();
            parent_record.nlink = parent_record.nlink.saturating_sub(1);
            parent_record.touch(timestamp);
            store_inode(&mut inodes, *parent, &parent_record)?;
        }
        Ok(Response::Done)
    })
}

/// Inodes of other homes that dentries here name.
pub(crate) fn remote_references(txn: &ReadTransaction, home: NodeId) -> Result<Response, OpError> {
    let entries = txn.open_table(ENTRIES)?;
    let mut out = Vec::new();
    for item in entries.iter()? {
        let (_, value) = item?;
        let child = InodeId(value.value().0);
        if child.home() != home {
            out.push(child);
        }
    }
    // A spread directory names its shards on other servers.
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        let record = InodeRecord::decode(key.value(), value.value())?;
        out.extend(record.shards.iter().skip(1).map(|shard| InodeId(*shard)));
    }
    Ok(Response::Inodes(out))
}

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
        op: IntentOp::Link {
            inode,
            kind_code: crate::store::kind_code(kind),
            new_parent,
            new_name: new_name.to_string(),
        },
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Link step (3): the inode's home counted the link; insert the dentry, drop the intent, keep
/// the reply. Returns whether the link must be given back (the name was taken meanwhile).
pub(crate) fn finish_link(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
    attr: &InodeAttr,
) -> Result<(Result<Response, OpError>, bool), OpError> {
    let IntentOp::Link {
        inode,
        kind_code,
        new_parent,
        new_name,
    } = &intent.op
    else {
        return Err(OpError::Store(format!("intent {id} is not a link")));
    };
    debug_assert_eq!(
        *inode, attr.inode,
        "the link names the inode whose count went up"
    );
    let kind = crate::store::kind_from_code(*kind_code);
    finish_new_name(
        txn,
        id,
        intent.mutation,
        (*new_parent, new_name),
        kind,
        attr,
    )
}

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
    let mut inodes = txn.open_table(INODES)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut parent_record = load_dir(&inodes, parent)?;
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
    remove_dentry(&mut entries, parent, dentry)?;
    let timestamp = now();
    parent_record.touch(timestamp);
    store_inode(&mut inodes, parent, &parent_record)?;
    drop((inodes, entries));
    let intent = Intent {
        mutation,
        op: IntentOp::Unlink {
            inode: dentry.child,
        },
    };
    let id = record_intent(txn, &intent)?;
    Ok(Some(Prepared::Intent(id, intent)))
}

/// Unlink step (3): the inode's home dropped the link; drop the intent and keep the reply.
pub(crate) fn finish_unlink(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
) -> Result<Response, OpError> {
    drop_intent(txn, id)?;
    idempotent(txn, intent.mutation, |_| Ok(Response::Done))
}

/// On the inode's home: applies a link-count change once per (coordinator, intent, delta).
pub(crate) fn adjust_links(
    txn: &WriteTransaction,
    coordinator: NodeId,
    intent: u64,
    inode: InodeId,
    delta: i32,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<Response, OpError> {
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
    let mut inodes = txn.open_table(INODES)?;
    let already = applied.get(key)?.is_some();
    let Some(bytes) = inodes.get(inode.0)? else {
        if already || delta < 0 {
            // Gone already: its last link went before.
            return Ok(Response::Done);
        }
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            format!("inode {inode} does not exist"),
        ));
    };
    let mut record = InodeRecord::decode(inode.0, bytes.value())?;
    drop(bytes);
    if already {
        return Ok(Response::Attr(record.to_attr(inode)));
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
        return Ok(Response::Attr(record.to_attr(inode)));
    }
    let attr = record.to_attr(inode);
    // The name that went was in a directory of another home (the coordinator's).
    super::remove::drop_link(txn, &mut inodes, (inode, None), record, is_open(inode))?;
    Ok(Response::Attr(attr))
}

/// Rename step (1) to a directory on another server: checks the source and records the intent.
pub(crate) fn prepare_rename_out(
    txn: &WriteTransaction,
    mutation: MutationId,
    parent: InodeId,
    name: &str,
    new_parent: InodeId,
    new_name: &str,
    flags: weft_proto::messages::RenameFlags,
) -> Result<Prepared, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    crate::store::check_name(new_name)?;
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
    let dentry = load_dentry(&entries, parent, name)?
        .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?;
    check_not_in_flight(txn, parent, name, Some(mutation))?;
    drop((inodes, entries));
    let intent = Intent {
        mutation,
        op: IntentOp::RenameOut {
            parent,
            name: name.to_string(),
            child: dentry.child,
            kind_code: crate::store::kind_code(dentry.kind),
            new_parent,
            new_name: new_name.to_string(),
            no_replace: flags.no_replace,
        },
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Rename step (2), on the server of the new name: inserts the dentry once per (coordinator,
/// intent), replacing a file victim; a victim whose inode lives here loses its link here, one
/// whose inode lives elsewhere is returned (`Inodes`) for the coordinator to drop its link
/// there. `Unchanged` when the new name already names the inode.
pub(crate) fn insert_dentry_for(
    txn: &WriteTransaction,
    home: NodeId,
    request: &MetaRequest,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<Response, OpError> {
    let MetaRequest::InsertDentry {
        coordinator,
        intent,
        parent,
        name,
        child,
        kind,
        no_replace,
        sealed_victim,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a dentry insertion",
        ));
    };
    check_unsettled(txn, *coordinator, *intent)?;
    crate::store::check_name(name)?;
    // The marker keeps the replaced victim whose link its own home must drop (0: none).
    let key = (coordinator.0, *intent | (1 << 62));
    if let Some(victim) = txn.open_table(REMOTE_CREATED)?.get(key)? {
        return Ok(victim_response(victim.value()));
    }
    let mut inodes = txn.open_table(INODES)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut parent_record = load_dir(&inodes, *parent)?;
    if parent_record.nlink == 0 {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            "the directory was removed",
        ));
    }
    parent_record.accepts_new_name(*parent, name)?;
    let mut replaced_elsewhere = 0;
    let mut replaced_dir = false;
    if let Some(victim) = load_dentry(&entries, *parent, name)? {
        if victim.child == *child {
            return Ok(Response::Unchanged);
        }
        if *no_replace {
            return Err(OpError::rejected(
                ErrorCode::Exists,
                format!("{name:?} already exists"),
            ));
        }
        check_not_in_flight(txn, *parent, name, None)?;
        match (
            victim.kind == FileKind::Directory,
            *kind == FileKind::Directory,
        ) {
            (true, false) => {
                return Err(OpError::rejected(
                    ErrorCode::IsDirectory,
                    format!("{name:?} is a directory"),
                ))
            }
            (false, true) => {
                return Err(OpError::rejected(
                    ErrorCode::NotDirectory,
                    format!("{name:?} is not a directory"),
                ))
            }
            (true, true) if victim.child.home() == home => {
                let record = crate::store::load_inode(&inodes, victim.child)?;
                if !record.shards.is_empty() {
                    return Err(OpError::rejected(
                        ErrorCode::CrossDevice,
                        format!("{name:?} is a spread directory: remove it first"),
                    ));
                }
                if !dir_is_empty(&entries, victim.child)? {
                    return Err(OpError::rejected(
                        ErrorCode::NotEmpty,
                        format!("{name:?} is not empty"),
                    ));
                }
            }
            (true, true) if *sealed_victim != Some(victim.child) => {
                // Not the directory the coordinator sealed: the entry changed meanwhile.
                return Err(OpError::rejected(
                    ErrorCode::Busy,
                    format!("{name:?} changed during the rename; try again"),
                ));
            }
            _ => {}
        }
        replaced_dir = victim.kind == FileKind::Directory;
        remove_dentry(&mut entries, *parent, victim)?;
        if replaced_dir && victim.child.home() == home {
            inodes.remove(victim.child.0)?;
            super::xattr::remove_all(&mut txn.open_table(XATTRS)?, victim.child)?;
        } else if victim.child.home() == home {
            let victim_record = crate::store::load_inode(&inodes, victim.child)?;
            super::remove::drop_link(
                txn,
                &mut inodes,
                (victim.child, Some(*parent)),
                victim_record,
                is_open(victim.child),
            )?;
        } else {
            replaced_elsewhere = victim.child.0;
        }
    }
    insert_dentry(&mut entries, *parent, &parent_record, name, *child, *kind)?;
    if *kind == FileKind::Directory && !replaced_dir {
        // The moved directory's `..` now names this directory (a replaced one's did).
        parent_record.nlink += 1;
    }
    let timestamp = now();
    parent_record.touch(timestamp);
    store_inode(&mut inodes, *parent, &parent_record)?;
    drop((inodes, entries));
    txn.open_table(REMOTE_CREATED)?
        .insert(key, replaced_elsewhere)?;
    Ok(victim_response(replaced_elsewhere))
}

/// `Inodes([victim])` when a replaced victim's link must still be dropped at its own home.
fn victim_response(victim: u64) -> Response {
    if victim == 0 {
        Response::Done
    } else {
        Response::Inodes(vec![InodeId(victim)])
    }
}

/// Rename step (3): the new name exists; the old one goes (unless the other server reported the
/// new name already named the inode), the intent goes and the reply is kept. With `outcome`
/// an error of step (2), only the intent goes and the error is the reply.
pub(crate) fn finish_rename_out(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
    outcome: Result<Response, OpError>,
) -> Result<Response, OpError> {
    let IntentOp::RenameOut {
        parent,
        name,
        child,
        kind_code,
        new_parent,
        ..
    } = &intent.op
    else {
        return Err(OpError::Store(format!("intent {id} is not a rename")));
    };
    drop_intent(txn, id)?;
    idempotent(txn, intent.mutation, |txn| {
        if outcome? == Response::Unchanged {
            return Ok(Response::Done);
        }
        let mut inodes = txn.open_table(INODES)?;
        let mut entries = txn.open_table(ENTRIES)?;
        if let Some(dentry) = load_dentry(&entries, *parent, name)? {
            if dentry.child == *child {
                remove_dentry(&mut entries, *parent, dentry)?;
                let mut parent_record = load_dir(&inodes, *parent)?;
                if *kind_code == crate::store::kind_code(FileKind::Directory) {
                    parent_record.nlink = parent_record.nlink.saturating_sub(1);
                }
                let timestamp = now();
                parent_record.touch(timestamp);
                store_inode(&mut inodes, *parent, &parent_record)?;
            }
        }
        // The moved inode, when it lives here (one elsewhere was told by the coordinator).
        mark_renamed(&mut inodes, *child, *new_parent)?;
        Ok(Response::Done)
    })
}

/// On an inode's home, after a rename elsewhere moved a dentry of it: its ctime becomes now,
/// and it points at its new parent (idempotent; a removed one is left). Parent 0 makes a
/// file forget its parent, before a rename that moves its name (a directory keeps its own).
pub(crate) fn renamed(
    txn: &WriteTransaction,
    inode: InodeId,
    parent: InodeId,
) -> Result<Response, OpError> {
    mark_renamed(&mut txn.open_table(INODES)?, inode, parent)?;
    Ok(Response::Done)
}

/// [`renamed`] in an open inode table; an inode that does not live here is left alone.
fn mark_renamed(
    inodes: &mut redb::Table<u64, &'static [u8]>,
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

/// On a spread directory's home: records its shards (idempotent) and answers its attributes.
pub(crate) fn set_shards(
    txn: &WriteTransaction,
    dir: InodeId,
    shards: &[InodeId],
) -> Result<Response, OpError> {
    let mut inodes = txn.open_table(INODES)?;
    let mut record = load_dir(&inodes, dir)?;
    let shards: Vec<u64> = shards.iter().map(|shard| shard.0).collect();
    if record.shards != shards {
        record.shards = shards;
        store_inode(&mut inodes, dir, &record)?;
    }
    Ok(Response::Attr(record.to_attr(dir)))
}

/// On a shard's home: seals an empty shard for the rmdir (coordinator, intent) of its
/// directory, or unseals it. A missing shard was removed by an earlier pass of that rmdir.
pub(crate) fn seal_shard(
    txn: &WriteTransaction,
    shard: InodeId,
    owner: (NodeId, u64),
    seal: bool,
) -> Result<Response, OpError> {
    check_unsettled(txn, owner.0, owner.1)?;
    let mut inodes = txn.open_table(INODES)?;
    let Some(bytes) = inodes.get(shard.0)? else {
        return Ok(Response::Done);
    };
    let mut record = InodeRecord::decode(shard.0, bytes.value())?;
    drop(bytes);
    let owner = (owner.0 .0, owner.1);
    match (seal, record.sealed) {
        (true, Some(sealed)) if sealed == owner => return Ok(Response::Done),
        (true, Some(_)) => {
            return Err(OpError::rejected(
                ErrorCode::Busy,
                "another rmdir is removing this directory",
            ))
        }
        (true, None) => {
            if !dir_is_empty(&txn.open_table(ENTRIES)?, shard)? {
                return Err(OpError::rejected(
                    ErrorCode::NotEmpty,
                    "the directory is not empty",
                ));
            }
            record.sealed = Some(owner);
        }
        (false, Some(sealed)) if sealed == owner => record.sealed = None,
        (false, _) => return Ok(Response::Done),
    }
    store_inode(&mut inodes, shard, &record)?;
    Ok(Response::Done)
}

/// On a shard's home: takes over what new entries inherit from its spread directory.
pub(crate) fn sync_shard(
    txn: &WriteTransaction,
    request: &MetaRequest,
) -> Result<Response, OpError> {
    let MetaRequest::SyncShard {
        shard,
        mode,
        uid,
        gid,
        pattern,
        default_acl,
        default_spread,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a shard synchronisation",
        ));
    };
    let mut inodes = txn.open_table(INODES)?;
    let Some(bytes) = inodes.get(shard.0)? else {
        return Ok(Response::Done);
    };
    let mut record = InodeRecord::decode(shard.0, bytes.value())?;
    drop(bytes);
    if record.shard_of == 0 {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            format!("inode {shard} is not a shard of a spread directory"),
        ));
    }
    record.mode = *mode;
    record.uid = *uid;
    record.gid = *gid;
    record.pattern = Some(*pattern);
    store_inode(&mut inodes, *shard, &record)?;
    let mut xattrs = txn.open_table(XATTRS)?;
    for (name, value) in [
        (crate::acl::ACL_DEFAULT, default_acl),
        (crate::acl::DIR_SPREAD, default_spread),
    ] {
        match value {
            Some(value) => {
                xattrs.insert((shard.0, name), value.as_slice())?;
            }
            None => {
                xattrs.remove((shard.0, name))?;
            }
        }
    }
    Ok(Response::Done)
}

/// Exchange step (1), on the coordinator: checks the near name and records the intent.
pub(crate) fn prepare_exchange(
    txn: &WriteTransaction,
    mutation: MutationId,
    (parent, name): (InodeId, &str),
    (new_parent, new_name): (InodeId, &str),
    (other, other_kind): (InodeId, FileKind),
) -> Result<Prepared, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    let inodes = txn.open_table(INODES)?;
    let entries = txn.open_table(ENTRIES)?;
    load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
    let dentry = load_dentry(&entries, parent, name)?
        .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?;
    check_not_in_flight(txn, parent, name, Some(mutation))?;
    if dentry.child == other {
        // Two names of one inode: nothing to swap.
        return Ok(Prepared::Answered(Ok(Response::Done)));
    }
    drop((inodes, entries));
    let intent = Intent {
        mutation,
        op: IntentOp::Exchange {
            parent,
            name: name.to_string(),
            child: dentry.child,
            kind_code: crate::store::kind_code(dentry.kind),
            new_parent,
            new_name: new_name.to_string(),
            other,
            other_kind_code: crate::store::kind_code(other_kind),
        },
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Exchange step (2), on the far name's server: the far name takes the near inode, once per
/// (coordinator, intent); the directory's link count follows the kinds.
pub(crate) fn exchange_dentry(
    txn: &WriteTransaction,
    request: &MetaRequest,
) -> Result<Response, OpError> {
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
        return Ok(Response::Unchanged);
    }
    let mut inodes = txn.open_table(INODES)?;
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
    crate::store::replace_dentry(
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
    Ok(Response::Done)
}

/// Exchange step (3), on the coordinator: the near name takes the far inode, the intent goes
/// and the reply is kept. With `outcome` an error of step (2), only the intent goes.
pub(crate) fn finish_exchange(
    txn: &WriteTransaction,
    id: u64,
    intent: &Intent,
    outcome: Result<(), OpError>,
) -> Result<Response, OpError> {
    let IntentOp::Exchange {
        parent,
        name,
        child,
        kind_code,
        new_parent,
        other,
        other_kind_code,
        ..
    } = &intent.op
    else {
        return Err(OpError::Store(format!("intent {id} is not an exchange")));
    };
    drop_intent(txn, id)?;
    idempotent(txn, intent.mutation, |txn| {
        outcome?;
        let mut inodes = txn.open_table(INODES)?;
        let mut entries = txn.open_table(ENTRIES)?;
        if let Some(dentry) = load_dentry(&entries, *parent, name)? {
            if dentry.child == *child {
                crate::store::replace_dentry(
                    &mut entries,
                    *parent,
                    name,
                    Dentry {
                        child: *other,
                        kind: crate::store::kind_from_code(*other_kind_code),
                        ..dentry
                    },
                )?;
                let directory = crate::store::kind_code(FileKind::Directory);
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
        Ok(Response::Done)
    })
}
