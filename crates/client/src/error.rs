//! Why a client operation failed ([`ClientError`]), and the errno a POSIX caller sees.

use std::time::Duration;
use weft_net::RpcError;
use weft_proto::ids::InodeId;
use weft_proto::ErrorCode;

/// Why a client operation failed. [`ClientError::errno`] is what a POSIX caller sees.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// A server answered with an error, or could not be reached in time.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// Writes to a file's object acknowledged since the last fsync may be lost: the server
    /// that took them restarted (or every copy crashed) before they were synced, which the
    /// sync's verifier showed.
    #[error("writes to {inode} on {slot} since the last fsync may be lost: its server restarted (or every copy crashed) before they were synced")]
    WritesLost {
        /// The file.
        inode: InodeId,
        /// Where its object lives.
        slot: weft_proto::layout::Slot,
    },
    /// A storage server took fewer bytes of a write than it was sent: the rest is not there.
    #[error(
        "{slot} took {written} of the {sent} bytes written to {inode} at object offset {offset}"
    )]
    ShortWrite {
        /// The file.
        inode: InodeId,
        /// Where its object lives.
        slot: weft_proto::layout::Slot,
        /// Where the write went in the object.
        offset: u64,
        /// Bytes sent.
        sent: u64,
        /// Bytes the server said it wrote.
        written: u64,
    },
    /// The client's configuration is unusable; nothing was sent.
    #[error("{0}")]
    Config(String),
    /// No metadata server answered for the client's root in the time the client waits for
    /// its cluster to come up.
    #[error("no metadata server answered for the root directory within {waited:?} (last: {last}): start the metadata servers (`weft serve meta` with mgmt = {mgmt}) or check that they reach management")]
    ClusterNotReady {
        /// Management's address.
        mgmt: String,
        /// How long the client waited.
        waited: Duration,
        /// What the last try met.
        last: String,
    },
    /// A read, write or allocation of an open entry that is not a regular file.
    #[error("{inode} has no data layout: it is not a regular file")]
    NoLayout {
        /// The entry.
        inode: InodeId,
    },
    /// The locks or the open of a file were lost (the session expired, or they could not be
    /// reclaimed after its metadata server restarted): its writer must not go on as if it
    /// still excluded others.
    #[error("the locks or the open of {inode} were lost: the session expired or could not reclaim them after a metadata server restart")]
    StateLost {
        /// The file.
        inode: InodeId,
    },
}

impl ClientError {
    /// The error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Rpc(error) => error.code(),
            ClientError::WritesLost { .. }
            | ClientError::ShortWrite { .. }
            | ClientError::StateLost { .. } => ErrorCode::Io,
            ClientError::Config(_) | ClientError::NoLayout { .. } => ErrorCode::InvalidArgument,
            ClientError::ClusterNotReady { .. } => ErrorCode::Unavailable,
        }
    }

    /// The errno, through the one mapping in `proto`.
    pub fn errno(&self) -> i32 {
        self.code().to_errno()
    }

    /// The server's failure, when a server failed.
    pub fn rpc(&self) -> Option<&RpcError> {
        match self {
            ClientError::Rpc(error) => Some(error),
            _ => None,
        }
    }
}
