//! The stable error codes that cross the wire, and their one mapping to errno.
//!
//! Codes are partitioned by subsystem and are never renumbered or reused: 1–999 generic,
//! 1xxx namespace (metadata), 2xxx storage, 3xxx management, 4xxx protocol. Strings are for
//! humans; codes are the contract.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A wire error code. See the module docs for the numbering rules. It crosses the wire (and
/// is kept in stored replies) as its number, never as its position in this list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::FromRepr)]
#[strum(serialize_all = "snake_case")]
#[repr(u16)]
#[non_exhaustive]
pub enum ErrorCode {
    // Generic, 1..999.
    /// An internal error; the message says more.
    Internal = 1,
    /// The request was malformed or named impossible arguments.
    InvalidArgument = 2,
    /// The server is shutting down or not ready yet; retry elsewhere or later.
    Unavailable = 3,
    /// An I/O error on the server's own media.
    Io = 4,
    /// The operation is not supported.
    NotSupported = 5,
    /// The request's deadline passed.
    TimedOut = 6,

    // Namespace, 1xxx.
    /// No such file or directory.
    NotFound = 1000,
    /// The name already exists.
    Exists = 1001,
    /// The directory is not empty.
    NotEmpty = 1002,
    /// The entry is a directory where a non-directory was required.
    IsDirectory = 1003,
    /// The entry is not a directory where one was required.
    NotDirectory = 1004,
    /// A name component is too long.
    NameTooLong = 1005,
    /// The caller lacks permission for the operation.
    PermissionDenied = 1006,
    /// The operation is not permitted (ownership, sticky bit, renaming into a descendant).
    NotPermitted = 1007,
    /// A link or rename would cross file systems or homes where that is not supported.
    CrossDevice = 1008,
    /// Too many links to one inode.
    TooManyLinks = 1009,
    /// The inode is not a symbolic link.
    NotSymlink = 1010,
    /// The inode's home is a metadata node other than the one asked.
    WrongHome = 1011,
    /// No storage target is available to place a new file on.
    NoTargets = 1012,
    /// The extended attribute does not exist.
    NoAttribute = 1013,
    /// A value or list does not fit the caller's buffer or the limits.
    OutOfRange = 1014,
    /// A conflicting lock is held.
    WouldBlock = 1015,
    /// The server grants only reclaimed locks for a while after its start; ask again soon.
    InGrace = 1016,
    /// The name belongs to another shard of a spread directory: learn the directory's shards
    /// (a getattr) and ask the shard that holds the name.
    WrongShard = 1017,
    /// The directory is being removed; ask again shortly (it will be gone or back).
    Busy = 1018,
    /// The client is read-only (`weft client set NAME --read-only`): it may not change
    /// files or the namespace.
    ReadOnly = 1019,
    /// The session holds as many files open on the metadata server as its client may (a
    /// restricted client's bound): EMFILE. A peer of protocol version 7 reads it as `Internal`.
    TooManyOpen = 1020,
    /// The lock would leave the session holding more byte ranges of the file than the server
    /// keeps: ENOLCK. A peer of protocol version 7 reads it as `Internal`.
    TooManyLocks = 1021,

    // Storage, 2xxx.
    /// The target has no space left.
    NoSpace = 2000,
    /// A payload's checksum did not match.
    ChecksumMismatch = 2001,
    /// The target refuses writes after an fsync failure until it is restarted and checked.
    TargetPoisoned = 2002,
    /// The storage server does not hold the named target.
    UnknownTarget = 2003,
    /// The request was routed with another version of its mirror group than the member
    /// knows, to a member that is not the primary, or to a primary whose lease ran out:
    /// fetch the cluster map and send it again (to the current primary).
    StaleRoute = 2004,
    /// The object still holds data from before a truncate of its file that it has not had
    /// (its target was away when the truncate was made): the caller has the metadata server
    /// apply it, then asks again.
    TruncatePending = 2005,
    /// A copy of a client's change that arrived after the client had its answer or gave up
    /// on it (the original of a retried request, delayed): dropped, so it cannot land over
    /// a newer change. A metadata server answers it too for a mutation below the number its
    /// client said every earlier mutation was answered by (its reply dropped then), so a very
    /// late copy never runs a second time.
    Superseded = 2006,
    /// The storage server wants a capability for this read or change of a file's objects
    /// (the client's access is checked by the servers): none was shown, or it expired,
    /// belongs to another session, or grants less. The client gets a new one by opening the
    /// file again, and asks again.
    CapabilityNeeded = 2007,
    /// The change would take a user or group over its quota in the pool (`weft quota
    /// report`): EDQUOT.
    QuotaExceeded = 2008,
    /// The object moved to another target (its file was migrated, or its target drained):
    /// the caller fetches the file's layout again and asks where it says.
    Moved = 2009,
    /// A change its metadata home answered before its sync was lost in a restart and not made
    /// again: a change made before it was lost with its client (docs/design/crash-consistency.md,
    /// "Durability by replay"). EIO.
    Evicted = 2010,

    // Management, 3xxx.
    /// The node id is not registered.
    UnknownNode = 3000,
    /// The client session is unknown or expired.
    UnknownSession = 3001,
    /// The management server is not its cluster's leader (management is replicated): the
    /// message names the leader when it knows one; ask the leader, or another server.
    NotLeader = 3002,

    // Protocol, 4xxx.
    /// The peer speaks another protocol version.
    VersionMismatch = 4000,
    /// The request was sent to a service that does not handle it.
    WrongService = 4001,
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u16(*self as u16)
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    /// A code this build does not know (sent by a newer peer) reads as `Internal`: the
    /// request failed either way, and the message that comes with it still says why.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = u16::deserialize(deserializer)?;
        Ok(ErrorCode::from_repr(number).unwrap_or(ErrorCode::Internal))
    }
}

/// What a client does when a request fails with an [`ErrorCode`]: each code has exactly one
/// recovery ([`ErrorCode::recovery`]), and every retry loop of the client and of the servers'
/// calls to each other asks it instead of naming codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr)]
pub enum Recovery {
    /// Route again (the map fetched anew: another address, a new primary) and send again.
    Reroute,
    /// Fetch the file's layout again and send with the new one: the object moved.
    Relayout,
    /// Reclaim the session's opens and locks on the home (a server that took it over waits
    /// for them), then send again.
    Reclaim,
    /// Have the file's home apply the truncate the object missed, then send again.
    ApplyTruncate,
    /// Learn the directory's shards, then send to the one that holds the name.
    LearnShards,
    /// Send again after a pause: the server is in the middle of something that ends (an rmdir
    /// of a spread directory).
    Wait,
    /// Fetch a capability for the file (open it again), then send again.
    Reopen,
    /// The session expired: what depended on it is lost; a new session starts.
    NewSession,
    /// The answer stands: report it.
    Fail,
}

impl ErrorCode {
    /// The code's name in snake case (`not_found`), as metrics label it.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The errno a POSIX caller sees for this code. The only such mapping in Weft.
    /// What a client does after a request failed with this code.
    pub fn recovery(self) -> Recovery {
        match self {
            ErrorCode::Unavailable | ErrorCode::StaleRoute => Recovery::Reroute,
            ErrorCode::Moved => Recovery::Relayout,
            ErrorCode::InGrace => Recovery::Reclaim,
            ErrorCode::TruncatePending => Recovery::ApplyTruncate,
            ErrorCode::WrongShard => Recovery::LearnShards,
            ErrorCode::Busy => Recovery::Wait,
            ErrorCode::CapabilityNeeded => Recovery::Reopen,
            ErrorCode::UnknownSession => Recovery::NewSession,
            // Management's own client asks the next server on `NotLeader`; a request sent
            // to a server that does not serve its home (`WrongHome`) or an old protocol
            // (`VersionMismatch`) is a bug or a misconfiguration, not a route to retry.
            ErrorCode::Internal
            | ErrorCode::InvalidArgument
            | ErrorCode::Io
            | ErrorCode::NotSupported
            | ErrorCode::TimedOut
            | ErrorCode::NotFound
            | ErrorCode::Exists
            | ErrorCode::NotEmpty
            | ErrorCode::IsDirectory
            | ErrorCode::NotDirectory
            | ErrorCode::NameTooLong
            | ErrorCode::PermissionDenied
            | ErrorCode::NotPermitted
            | ErrorCode::CrossDevice
            | ErrorCode::TooManyLinks
            | ErrorCode::NotSymlink
            | ErrorCode::WrongHome
            | ErrorCode::NoTargets
            | ErrorCode::NoAttribute
            | ErrorCode::OutOfRange
            | ErrorCode::WouldBlock
            | ErrorCode::ReadOnly
            | ErrorCode::TooManyOpen
            | ErrorCode::TooManyLocks
            | ErrorCode::NoSpace
            | ErrorCode::ChecksumMismatch
            | ErrorCode::TargetPoisoned
            | ErrorCode::UnknownTarget
            | ErrorCode::Superseded
            | ErrorCode::Evicted
            | ErrorCode::QuotaExceeded
            | ErrorCode::UnknownNode
            | ErrorCode::NotLeader
            | ErrorCode::VersionMismatch
            | ErrorCode::WrongService => Recovery::Fail,
        }
    }

    pub fn to_errno(self) -> i32 {
        match self {
            ErrorCode::Internal | ErrorCode::Io | ErrorCode::ChecksumMismatch => libc::EIO,
            ErrorCode::TargetPoisoned => libc::EIO,
            ErrorCode::InvalidArgument | ErrorCode::NotSymlink => libc::EINVAL,
            ErrorCode::Unavailable | ErrorCode::UnknownTarget | ErrorCode::UnknownNode => libc::EIO,
            ErrorCode::NotLeader => libc::EIO,
            ErrorCode::StaleRoute | ErrorCode::TruncatePending | ErrorCode::Superseded => libc::EIO,
            ErrorCode::Moved | ErrorCode::Evicted => libc::EIO,
            ErrorCode::UnknownSession | ErrorCode::VersionMismatch | ErrorCode::WrongService => {
                libc::EIO
            }
            ErrorCode::WrongHome | ErrorCode::WrongShard => libc::EIO,
            ErrorCode::NotSupported => libc::EOPNOTSUPP,
            ErrorCode::TimedOut => libc::ETIMEDOUT,
            ErrorCode::NotFound => libc::ENOENT,
            ErrorCode::Exists => libc::EEXIST,
            ErrorCode::NotEmpty => libc::ENOTEMPTY,
            ErrorCode::IsDirectory => libc::EISDIR,
            ErrorCode::NotDirectory => libc::ENOTDIR,
            ErrorCode::NameTooLong => libc::ENAMETOOLONG,
            ErrorCode::PermissionDenied | ErrorCode::CapabilityNeeded => libc::EACCES,
            ErrorCode::NotPermitted => libc::EPERM,
            ErrorCode::CrossDevice => libc::EXDEV,
            ErrorCode::TooManyLinks => libc::EMLINK,
            ErrorCode::NoSpace | ErrorCode::NoTargets => libc::ENOSPC,
            ErrorCode::QuotaExceeded => libc::EDQUOT,
            ErrorCode::NoAttribute => libc::ENODATA,
            ErrorCode::OutOfRange => libc::E2BIG,
            ErrorCode::WouldBlock | ErrorCode::InGrace | ErrorCode::Busy => libc::EAGAIN,
            ErrorCode::ReadOnly => libc::EROFS,
            ErrorCode::TooManyOpen => libc::EMFILE,
            ErrorCode::TooManyLocks => libc::ENOLCK,
        }
    }

    /// The code for an OS error seen by a server on its own media.
    pub fn from_io(error: &std::io::Error) -> ErrorCode {
        match error.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorCode::NoSpace,
            Some(libc::ENOENT) => ErrorCode::NotFound,
            _ => ErrorCode::Io,
        }
    }
}

/// An error as it crosses the wire: a stable code and a message for humans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// What went wrong, for programs.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

impl WireError {
    /// A wire error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

impl std::error::Error for WireError {}

/// `error` and every source under it, on one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_message = cause.to_string();
        if !message.ends_with(&cause_message) {
            message.push_str(": ");
            message.push_str(&cause_message);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: codes are a wire contract; their numbers must never change.
    #[test]
    fn codes_are_stable() {
        assert_eq!(ErrorCode::NotFound as u16, 1000);
        assert_eq!(ErrorCode::NoSpace as u16, 2000);
        assert_eq!(ErrorCode::UnknownNode as u16, 3000);
        assert_eq!(ErrorCode::VersionMismatch as u16, 4000);
        assert_eq!(ErrorCode::NotFound.to_errno(), libc::ENOENT);
        assert_eq!(ErrorCode::NoSpace.to_errno(), libc::ENOSPC);
        assert_eq!(ErrorCode::TooManyOpen as u16, 1020);
        assert_eq!(ErrorCode::TooManyLocks as u16, 1021);
        assert_eq!(ErrorCode::TooManyOpen.to_errno(), libc::EMFILE);
        assert_eq!(ErrorCode::TooManyLocks.to_errno(), libc::ENOLCK);
    }

    // Goal: what crosses the wire (and is kept in stored replies) is the code's number, not
    // its position in the enum: inserting or reordering variants changes no byte. Golden
    // bytes: the number as a postcard varint.
    #[test]
    fn codes_cross_the_wire_as_their_numbers() {
        let encode = |value: &WireError| postcard::to_stdvec(value).expect("encode");
        assert_eq!(
            encode(&WireError::new(ErrorCode::NotFound, "x")),
            [0xE8, 0x07, 1, b'x'],
            "1000 as a varint, then the message"
        );
        assert_eq!(encode(&WireError::new(ErrorCode::Internal, "")), [0x01, 0]);
        assert_eq!(
            encode(&WireError::new(ErrorCode::WrongService, "")),
            [0xA1, 0x1F, 0]
        );
        for code in [
            ErrorCode::Internal,
            ErrorCode::TimedOut,
            ErrorCode::Busy,
            ErrorCode::Superseded,
            ErrorCode::CapabilityNeeded,
            ErrorCode::QuotaExceeded,
            ErrorCode::UnknownSession,
            ErrorCode::NotLeader,
            ErrorCode::WrongService,
        ] {
            let bytes = encode(&WireError::new(code, "m"));
            let decoded: WireError = postcard::from_bytes(&bytes).expect("decode");
            assert_eq!(decoded.code, code);
        }
        // A code this build does not know (a newer peer's) reads as Internal, message intact.
        let newer: WireError = postcard::from_bytes(&[0xE7, 0x4E, 2, b'h', b'i']).expect("decode");
        assert_eq!(
            (newer.code, newer.message.as_str()),
            (ErrorCode::Internal, "hi")
        );
    }
}
