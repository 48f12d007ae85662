//! Stored replies: the answer of every mutating request, kept in the same transaction as
//! its change, so a retry of the same mutation is answered, never applied twice.

use crate::schema::{refuse_settled, reply_bytes, stored_reply, OpError, REPLIES, REPLY_FLOORS};
use crate::store::{ReadTransaction, ReadableTable, WriteTransaction};
use weft_proto::messages::{MetaResponse, MutationId, Reply};
use weft_proto::Recovery;

/// Runs `op` unless this mutation already ran, and keeps its reply in the same transaction.
/// A mutation below its client's settled number is refused ([`refuse_settled`]).
pub(crate) fn idempotent(
    txn: &WriteTransaction,
    mutation: MutationId,
    op: impl FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError>,
) -> Result<MetaResponse, OpError> {
    keep_reply(txn, mutation, true, op)
}

/// As [`idempotent`], for the last step of a mutation admitted before (a cross-server
/// operation whose intent was recorded): it finishes whatever its client said since, or the
/// namespace would keep half of it.
pub(crate) fn idempotent_admitted(
    txn: &WriteTransaction,
    mutation: MutationId,
    op: impl FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError>,
) -> Result<MetaResponse, OpError> {
    keep_reply(txn, mutation, false, op)
}

/// The reply kept for `mutation`, if it ran here: a copy sent again is answered with it.
pub(crate) fn kept(
    txn: &ReadTransaction,
    mutation: MutationId,
) -> Result<Option<Result<MetaResponse, OpError>>, OpError> {
    kept_in(&txn.open_table(REPLIES)?, mutation)
}

/// The reply `replies` (the [`REPLIES`] table, read or being written) keeps for `mutation`.
pub(crate) fn kept_in(
    replies: &impl ReadableTable<(u64, u64), &'static [u8]>,
    mutation: MutationId,
) -> Result<Option<Result<MetaResponse, OpError>>, OpError> {
    Ok(replies
        .get((mutation.client.0, mutation.seq))?
        .map(|bytes| stored_reply(bytes.value())))
}

fn keep_reply(
    txn: &WriteTransaction,
    mutation: MutationId,
    starts: bool,
    op: impl FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError>,
) -> Result<MetaResponse, OpError> {
    let client = mutation.client.0;
    if let Some(reply) = kept_in(&txn.open_table(REPLIES)?, mutation)? {
        return reply;
    }
    if starts {
        refuse_settled(txn, mutation)?;
    }
    let result = op(txn);
    let reply: Reply<MetaResponse> = match &result {
        Ok(response) => Ok(response.clone()),
        // Asked of the wrong shard, or of one being removed: the client asks again, perhaps
        // elsewhere, with the same mutation; no answer is kept.
        Err(OpError::Rejected(error))
            if matches!(
                error.code.recovery(),
                Recovery::LearnShards | Recovery::Wait
            ) =>
        {
            return result
        }
        Err(OpError::Rejected(error)) => Err(error.clone()),
        Err(OpError::Store(_)) => return result,
    };
    let mut replies = txn.open_table(REPLIES)?;
    replies.insert((client, mutation.seq), reply_bytes(&reply).as_slice())?;
    let settled = mutation.oldest_pending.min(mutation.seq);
    replies.retain_in((client, 0)..(client, settled), |_, _| false)?;
    let mut floors = txn.open_table(REPLY_FLOORS)?;
    let floor = floors.get(client)?.map_or(0, |floor| floor.value());
    if settled > floor {
        floors.insert(client, settled)?;
    }
    result
}
