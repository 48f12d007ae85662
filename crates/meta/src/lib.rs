//! The metadata service: directories, dentries, inodes, layouts and sizes of one metadata target
//! (MDT), kept in redb and its change log, and durable before every reply.
//!
//! Layout:
//! - [`config`] — [`MetaConfig`].
//! - `store`: the tables as operations and reads see them (transactions, tables, rows): the
//!   rows changed since the last checkpoint in memory and in the change log (`store/log.rs`),
//!   laid over redb's tables, which checkpoints write.
//! - `schema`: the tables, record encodings and the small helpers every operation uses.
//! - `commit`: group commit — one writer thread batches concurrent operations into one
//!   transaction, one log record (or redb commit) and one fsync, and answers each after it.
//! - `locks`: byte-range locks in memory, reclaim after a restart, release on session expiry.
//! - `ops/`: one file per operation family on one server's store (lookup, create, remove,
//!   rename, setattr, xattrs, check), and the intent table of operations spanning servers.
//! - `acl`: POSIX ACLs in the xattr format, and their inheritance on create.
//! - `chooser`: picks storage targets for new files.
//! - `server`: the process — registration, heartbeats, and which homes it serves (its own,
//!   and after a failover those of the mirror groups it is primary of).
//! - `service`: one home's request handler: dispatch, sessions and open files, background work
//!   (disposal, truncates, size settling), stored replies, fsck, and in `service/intents/` one
//!   module per protocol spanning servers (mkdir, rmdir, link, unlink, rename, exchange, spread).
//! - `replica`: metadata mirroring — a home's store file ships its changes to the home's
//!   mirror members at every commit; members apply them to their copies.
//!
//! Invariants: a dentry `(parent, name)` and its cookie entry `(parent, cookie)` exist together;
//! an inode's link count equals the dentries naming it (plus `.` and children's `..` for a
//! directory); an inode with no links exists only while a client holds it open (orphan list);
//! every operation validates before it writes, so a rejected operation changes nothing.

mod acl;
mod chooser;
mod commit;
pub mod config;
mod locks;
mod ops;
mod replica;
mod schema;
mod server;
mod service;
mod store;

pub use config::{MetaConfig, TargetChooser};

/// Entry points for the fuzzers (`fuzz/` at the top of the repository).
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` as each kind of record a metadata server stores; none may panic,
    /// whatever the bytes.
    pub fn decode_stored_records(bytes: &[u8]) {
        let _ = crate::schema::InodeRecord::decode(1, bytes);
        let _ = postcard::from_bytes::<crate::ops::intent::Intent>(bytes);
        let _ = postcard::from_bytes::<crate::schema::TruncateWork>(bytes);
        let _ = postcard::from_bytes::<weft_proto::layout::FileLayout>(bytes);
        let _ = postcard::from_bytes::<weft_proto::layout::SlotSet>(bytes);
        let _ = crate::schema::stored_reply(bytes);
    }
}
pub use server::run;

/// Why the metadata service could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The configuration is unusable; the message lists every problem.
    #[error("{0}")]
    Config(String),
    /// A record of the data directory (node id, boot id) could not be read or written.
    #[error(transparent)]
    Record(#[from] weft_service::durable::RecordError),
    /// The data directory or the listener failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A home's store could not be opened or prepared.
    #[error("metadata store of home {home}")]
    Store {
        /// The home whose store it is.
        home: weft_proto::ids::NodeId,
        /// What failed: the store file, redb, or the first transaction.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Registration with management failed.
    #[error(transparent)]
    Register(#[from] weft_service::identity::RegisterError),
    /// Management gave this server a node id an inode's home bits cannot hold.
    #[error("metadata node id {0} does not fit an inode's home bits")]
    NodeIdTooLarge(weft_proto::ids::NodeId),
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
