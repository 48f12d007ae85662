//! The metadata service: directories, dentries, inodes, layouts and sizes of one metadata target
//! (MDT), kept in redb and committed before every reply.
//!
//! Layout:
//! - [`config`] — [`MetaConfig`].
//! - `store`: tables, record encodings and the small helpers every operation uses.
//! - `commit`: group commit — one writer thread batches concurrent operations into one
//!   transaction and one fsync, and answers each after the commit.
//! - `locks`: byte-range locks in memory, reclaim after a restart, release on session expiry.
//! - `ops/`: one file per operation family (lookup, create, remove, rename, setattr, open).
//! - `acl`: POSIX ACLs in the xattr format, and their inheritance on create.
//! - `chooser`: picks storage targets for new files.
//! - `server`: the process — registration, heartbeats, and which homes it serves (its own,
//!   and after a failover those of the mirror groups it is primary of).
//! - `service`: one home's request handler, retry identity (mutation ids), background work
//!   queues (object disposal, truncate).
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
        let _ = crate::store::InodeRecord::decode(1, bytes);
        let _ = postcard::from_bytes::<crate::ops::remote::Intent>(bytes);
        let _ = postcard::from_bytes::<crate::store::TruncateWork>(bytes);
        let _ = postcard::from_bytes::<weft_proto::layout::FileLayout>(bytes);
        let _ = postcard::from_bytes::<weft_proto::layout::SlotSet>(bytes);
        let _ = crate::service::stored_reply(bytes);
    }
}
pub use server::run;

/// Why the metadata service could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// The configuration is unusable (its authentication settings, its key file).
    #[error("{0}")]
    Config(String),
    /// The data directory is missing or unusable.
    #[error("{0}")]
    DataDir(String),
    /// The store could not be opened.
    #[error("metadata store: {0}")]
    Store(String),
    /// Registration with management failed.
    #[error("{0}")]
    Register(String),
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
