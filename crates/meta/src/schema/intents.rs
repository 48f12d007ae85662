//! The records of the intent table ([`super::INTENTS`]): a coordinator's cross-server
//! operation in flight, one record per protocol (`service/intents/`), and the name each one
//! protects meanwhile. The table's operations are `ops/intent.rs`.

use serde::{Deserialize, Serialize};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{MetaRequest, MutationId};
use weft_proto::wire::Wire;

/// A cross-server operation in flight, as recorded by its coordinator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Intent {
    /// The client request it serves; its reply is kept under this id when it finishes.
    pub mutation: MutationId,
    pub op: IntentOp,
}

/// What a cross-server operation does. Each variant's record is the one its protocol module
/// (`service/intents/`) runs and finishes; its fields are encoded in order, as they were when
/// the variants held them directly.
#[derive(Clone, Debug, Wire)]
pub(crate) enum IntentOp {
    #[wire(tag = 0)]
    Mkdir(MkdirIntent),
    #[wire(tag = 1)]
    Rmdir(RmdirIntent),
    #[wire(tag = 2)]
    MkdirSpread(SpreadMkdirIntent),
    #[wire(tag = 3)]
    RmdirSpread(SpreadRmdirIntent),
    #[wire(tag = 4)]
    Link(LinkIntent),
    #[wire(tag = 5)]
    Unlink(UnlinkIntent),
    #[wire(tag = 6)]
    RenameOut(RenameIntent),
    #[wire(tag = 7)]
    Exchange(ExchangeIntent),
}

/// mkdir of a directory whose inode `home` creates with `request`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct MkdirIntent {
    pub parent: InodeId,
    pub name: String,
    pub home: NodeId,
    pub request: MetaRequest,
}

/// rmdir of a directory whose inode `child` lives on another server.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RmdirIntent {
    pub parent: InodeId,
    pub name: String,
    pub child: InodeId,
}

/// mkdir of a spread directory: the directory on `mkdir.home`, then its other shards on
/// `shard_homes`, then the shard list on the directory, then the dentry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SpreadMkdirIntent {
    pub mkdir: MkdirIntent,
    pub shard_homes: Vec<NodeId>,
}

/// rmdir of a spread directory: seal its other shards (each must be empty), remove the
/// directory if it is empty, remove the shards, then the dentry; or unseal them again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SpreadRmdirIntent {
    pub rmdir: RmdirIntent,
    pub shards: Vec<InodeId>,
}

/// A hard link here to an inode elsewhere: the inode's home counts the link first.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LinkIntent {
    pub inode: InodeId,
    pub kind_code: u8,
    pub new_parent: InodeId,
    pub new_name: String,
}

/// The dentry here is already gone; the inode's home drops the link.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct UnlinkIntent {
    pub inode: InodeId,
}

/// A rename to a directory on another server: the new name first, then the old one goes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RenameIntent {
    pub parent: InodeId,
    pub name: String,
    pub child: InodeId,
    pub kind_code: u8,
    pub new_parent: InodeId,
    pub new_name: String,
    pub no_replace: bool,
}

/// RENAME_EXCHANGE with an entry on another server, or with inodes elsewhere: the far name
/// first takes `child`, then the near one takes `other`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ExchangeIntent {
    pub parent: InodeId,
    pub name: String,
    pub child: InodeId,
    pub kind_code: u8,
    pub new_parent: InodeId,
    pub new_name: String,
    pub other: InodeId,
    pub other_kind_code: u8,
}

impl IntentOp {
    /// The dentry here that the operation removes or replaces: no other operation may touch it
    /// until the intent is finished.
    pub(crate) fn protected_name(&self) -> Option<(InodeId, &str)> {
        match self {
            IntentOp::Rmdir(op) | IntentOp::RmdirSpread(SpreadRmdirIntent { rmdir: op, .. }) => {
                Some((op.parent, &op.name))
            }
            IntentOp::RenameOut(op) => Some((op.parent, &op.name)),
            IntentOp::Exchange(op) => Some((op.parent, &op.name)),
            IntentOp::Mkdir(_)
            | IntentOp::MkdirSpread(_)
            | IntentOp::Link(_)
            | IntentOp::Unlink(_) => None,
        }
    }
}
