//! Stored replies: the answer of every mutating request, kept in the same transaction as
//! its change, so a retry of the same mutation is answered, never applied twice.

use crate::store::{stored_reply, OpError, REPLIES};
use redb::{ReadableTable, WriteTransaction};
use weft_proto::messages::{MutationId, Reply, Response};
use weft_proto::ErrorCode;

/// Runs `op` unless this mutation already ran, and keeps its reply in the same transaction.
pub(crate) fn idempotent(
    txn: &WriteTransaction,
    mutation: MutationId,
    op: impl FnOnce(&WriteTransaction) -> Result<Response, OpError>,
) -> Result<Response, OpError> {
    let client = mutation.client.0;
    if let Some(bytes) = txn.open_table(REPLIES)?.get((client, mutation.seq))? {
        return stored_reply(bytes.value());
    }
    let result = op(txn);
    let reply: Reply = match &result {
        Ok(response) => Ok(response.clone()),
        // Asked of the wrong shard, or of one being removed: the client asks again, perhaps
        // elsewhere, with the same mutation; no answer is kept.
        Err(OpError::Rejected(error))
            if matches!(error.code, ErrorCode::WrongShard | ErrorCode::Busy) =>
        {
            return result
        }
        Err(OpError::Rejected(error)) => Err(error.clone()),
        Err(OpError::Store(_)) => return result,
    };
    let mut replies = txn.open_table(REPLIES)?;
    replies.insert(
        (client, mutation.seq),
        postcard::to_stdvec(&reply)
            .expect("replies encode")
            .as_slice(),
    )?;
    replies.retain_in(
        (client, 0)..(client, mutation.oldest_pending.min(mutation.seq)),
        |_, _| false,
    )?;
    result
}
