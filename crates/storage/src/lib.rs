//! The storage service: file data as one object per (file, target), created on first write.
//!
//! Layout:
//! - [`config`] — [`StorageConfig`].
//! - `objects`: how a target keeps its objects' bytes — the object-store trait, the plain
//!   store (open-file table and recycling), the O_DIRECT store and the crash-test journal
//!   that wraps either — and the object tree on disk they share.
//! - `target`: one storage target over one object store: capacity accounting, poisoning
//!   after a failed fsync, and admission by truncate generation.
//! - `service`: registration, heartbeats and the request handler; `service/push`, the
//!   source side of a move (its copies, restripes and seals).
//! - `recycle`: emptied object files a new object reuses instead of allocating an inode.
//! - `mirror`: storage mirror groups: admission by group version and lease, ordering and
//!   forwarding changes to members, resync of returning members.
//!
//! Objects live at `<target>/objects/<aa>/<inode id in hex>`, where `aa` is the first byte of
//! the CRC32C of the inode id. The 256 directories are made when the target opens (a tree of
//! the older `<aa>/<bb>/` layout is flattened then), so writing a new object makes no directory.

mod bench;
pub mod config;
mod direct;
mod fence;
mod metrics;
mod mirror;
mod moves;
mod objects;
mod recycle;
mod service;
mod target;

pub use config::StorageConfig;
pub use service::run;

/// Why a storage server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The configuration is unusable; the message lists every problem.
    #[error("{0}")]
    Config(String),
    /// A record of the data directory or of a target (node id, target id, boot id) could not
    /// be read or written.
    #[error(transparent)]
    Record(#[from] weft_service::durable::RecordError),
    /// A target directory could not be prepared.
    #[error("storage target {path}")]
    Target {
        /// The target directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The data directory or the listener failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Registration of the server with management failed.
    #[error(transparent)]
    Register(#[from] weft_service::identity::RegisterError),
    /// Registration of a target with management failed.
    #[error("cannot register target {path}")]
    RegisterTarget {
        /// The target directory.
        path: std::path::PathBuf,
        /// What the last attempt met.
        #[source]
        source: weft_net::RpcError,
    },
}
