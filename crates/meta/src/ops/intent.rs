//! The intent table: a coordinator's record of each operation spanning metadata servers while
//! it is in flight, the name each one protects from other operations meanwhile, and the
//! settlement that lets other homes forget the markers of finished intents' steps.
//!
//! Every cross-server protocol (`service/intents/`) starts by recording an intent here, in the
//! same transaction that checks the request, and ends by dropping it in the transaction that
//! keeps the client's reply. A request retried after a crash finds its intent (or its reply)
//! with [`earlier`] instead of starting over on a half-changed namespace.

use crate::schema::{
    load_dentry, load_dir, refuse_settled, Dentry, OpError, COUNTERS, ENTRIES, INODES, INTENTS,
    INTENT_NAMES, REMOTE_CREATED, REPLIES, SETTLED_INTENTS,
};
pub(crate) use crate::schema::{
    ExchangeIntent, Intent, IntentOp, LinkIntent, MkdirIntent, RenameIntent, RmdirIntent,
    SpreadMkdirIntent, SpreadRmdirIntent, UnlinkIntent,
};
use crate::store::{ReadTransaction, ReadableTable, WriteTransaction};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{MetaResponse, MutationId};
use weft_proto::ErrorCode;

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
        if let Ok(Some(intent)) = INTENTS.open(txn)?.get(id) {
            if intent.mutation.client == mutation.client && intent.mutation.seq == mutation.seq {
                return Ok(());
            }
        }
    }
    Err(OpError::rejected(
        ErrorCode::Busy,
        format!("{name:?} is being changed by another operation; try again"),
    ))
}

/// The entry `name` of `parent` that an intent of `mutation` is about to remove or replace:
/// the directory holds the name, the entry exists, and no other intent is changing it
/// ([`check_not_in_flight`]).
pub(crate) fn entry_to_change(
    txn: &WriteTransaction,
    mutation: MutationId,
    parent: InodeId,
    name: &str,
) -> Result<Dentry, OpError> {
    let dentry = {
        let inodes = txn.open_table(INODES)?;
        let entries = txn.open_table(ENTRIES)?;
        load_dir(&inodes, parent)?.check_holds_name(parent, name)?;
        load_dentry(&entries, parent, name)?
            .ok_or_else(|| OpError::rejected(ErrorCode::NotFound, format!("{name:?} not found")))?
    };
    check_not_in_flight(txn, parent, name, Some(mutation))?;
    Ok(dentry)
}

/// What step (1) leaves to do.
// One is made and consumed per cross-server operation: its size costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared {
    /// The request was answered before (a retry): this is its reply.
    Answered(Result<MetaResponse, OpError>),
    /// Go on with the intent.
    Intent(u64, Intent),
}

/// What a request that may span servers turned out to be, in the transaction that found out.
pub(crate) enum Decided {
    /// Local: made in that transaction, with this answer (a refusal among them).
    Local(Result<MetaResponse, OpError>),
    /// Spanning servers, or answered before: as [`Prepared`] says.
    Prepared(Prepared),
}

/// Runs `prepare` and, when it finds the request local (`None`, having written nothing),
/// `local` in the same transaction. A store failure of either is the transaction's: it
/// abandons the batch, so none of what `local` wrote before it commits.
pub(crate) fn prepared_or_local(
    txn: &WriteTransaction,
    prepare: impl FnOnce(&WriteTransaction) -> Result<Option<Prepared>, OpError>,
    local: impl FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError>,
) -> Result<Decided, OpError> {
    match prepare(txn)? {
        Some(prepared) => Ok(Decided::Prepared(prepared)),
        None => match local(txn) {
            Err(OpError::Store(error)) => Err(OpError::Store(error)),
            answer => Ok(Decided::Local(answer)),
        },
    }
}

/// What an earlier run of the same request left: its reply, or its intent still pending (a
/// retry after a crash goes on with it rather than start over on a half-changed namespace).
pub(crate) fn earlier(
    txn: &WriteTransaction,
    mutation: MutationId,
) -> Result<Option<Prepared>, OpError> {
    if let Some(reply) = crate::service::kept_in(&txn.open_table(REPLIES)?, mutation)? {
        return Ok(Some(Prepared::Answered(reply)));
    }
    if let Some((id, intent)) = pending_of(txn, mutation)? {
        return Ok(Some(Prepared::Intent(id, intent)));
    }
    refuse_settled(txn, mutation)?;
    Ok(None)
}

/// The intent of `mutation` in flight, if any: its request ran its first step and has not
/// finished (its reply is kept in the transaction that drops the intent). A record that does
/// not decode is passed over.
pub(crate) fn pending_of(
    txn: &impl crate::schema::Transaction,
    mutation: MutationId,
) -> Result<Option<(u64, Intent)>, OpError> {
    Ok(INTENTS
        .open(txn)?
        .each(usize::MAX)?
        .into_iter()
        .find_map(|(id, intent)| {
            intent
                .ok()
                .filter(|intent| {
                    intent.mutation.client == mutation.client && intent.mutation.seq == mutation.seq
                })
                .map(|intent| (id, intent))
        }))
}

/// All intents, for recovery.
pub(crate) fn intents(txn: &ReadTransaction) -> Result<Vec<(u64, Intent)>, OpError> {
    INTENTS.open(txn)?.all()
}

/// Records `intent` and returns its id. (A retry of the same request found its intent with
/// [`earlier`] instead.)
pub(crate) fn record_intent(txn: &WriteTransaction, intent: &Intent) -> Result<u64, OpError> {
    let mut counters = txn.open_table(COUNTERS)?;
    let id = counters.get("intent")?.map(|v| v.value()).unwrap_or(0) + 1;
    counters.insert("intent", id)?;
    INTENTS.open(txn)?.insert(id, intent)?;
    if let Some((parent, name)) = intent.op.protected_name() {
        txn.open_table(INTENT_NAMES)?.insert((parent.0, name), id)?;
    }
    Ok(id)
}

/// Removes intent `id` and the name it protects; false when it was gone already.
pub(crate) fn remove_intent(txn: &WriteTransaction, id: u64) -> Result<bool, OpError> {
    let mut intents = INTENTS.open(txn)?;
    // A record that does not decode is removed all the same.
    let intent = intents.get(id).ok().flatten();
    if !intents.remove(id)? {
        return Ok(false);
    }
    if let Some(intent) = intent {
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
    if let Some(oldest) = INTENTS.open(txn)?.first_key()? {
        return Ok(oldest);
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
) -> Result<MetaResponse, OpError> {
    let mut settled = txn.open_table(SETTLED_INTENTS)?;
    if settled
        .get(coordinator.0)?
        .is_some_and(|known| known.value() >= below)
    {
        return Ok(MetaResponse::Unchanged);
    }
    settled.insert(coordinator.0, below)?;
    txn.open_table(REMOTE_CREATED)?.retain_in(
        (coordinator.0, 0)..=(coordinator.0, u64::MAX),
        |(_, key), _| key & INTENT_BITS >= below,
    )?;
    Ok(MetaResponse::Done)
}

/// Refuses a step of `coordinator`'s intent `intent` once that intent is known to have
/// finished: it is a late copy, and the marker that made it harmless may be gone.
pub(crate) fn check_unsettled(
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

pub(crate) fn drop_intent(txn: &WriteTransaction, id: u64) -> Result<MetaResponse, OpError> {
    remove_intent(txn, id)?;
    Ok(MetaResponse::Done)
}
