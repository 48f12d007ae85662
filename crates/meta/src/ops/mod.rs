//! The metadata operations, one family per file. Read-only operations run on a read
//! transaction; mutating ones run inside the group-commit batch and validate everything before
//! they write anything.

pub(crate) mod check;
pub(crate) mod create;
pub(crate) mod intent;
pub(crate) mod lookup;
pub(crate) mod remove;
pub(crate) mod rename;
pub(crate) mod setattr;
pub(crate) mod xattr;

use crate::chooser::Chooser;
use std::sync::Arc;
use weft_proto::ids::NodeId;
use weft_proto::messages::ClusterMap;

/// What a mutating operation needs besides the transaction.
pub(crate) struct OpContext {
    /// This MDT's node id: the home of every inode it creates.
    pub home: NodeId,
    /// Target chooser for new files.
    pub chooser: Arc<Chooser>,
    /// The cluster map when the operation was queued.
    pub map: Arc<ClusterMap>,
}

/// Refuses a name in a directory of project `dir_project` for an inode of another project
/// (EXDEV, as XFS and Lustre do: `mv` then copies, and the copy counts in the directory's
/// project). A directory outside every project (0) takes any inode, which keeps its project.
pub(crate) fn check_project(dir_project: u32, project: u32) -> Result<(), crate::schema::OpError> {
    if dir_project == 0 || dir_project == project {
        return Ok(());
    }
    Err(crate::schema::OpError::rejected(
        weft_proto::ErrorCode::CrossDevice,
        format!(
            "the directory belongs to project {dir_project} and the entry to {}: \
             it moves by copying",
            match project {
                0 => "none".to_string(),
                project => format!("project {project}"),
            }
        ),
    ))
}
