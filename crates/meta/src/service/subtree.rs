//! The subtree rule: a client confined to a directory ([`weft_proto::access::Subtree`]) may
//! name no inode outside it, whatever inode numbers it makes up.
//!
//! An inode lies in the subtree when following parents from it reaches the subtree's
//! directory before the root. A directory's parent is exact (it has one name). A file records
//! the directory of a name it has (`InodeRecord::parent`, kept through creates, renames and
//! links; a removed name that may have been that one leaves it unknown, 0): a file with
//! names inside and outside the subtree may be refused, never one the subtree holds no name
//! of, except for the window in which its home learns of a rename on another server.
//! The walk crosses servers for directories living elsewhere; directories found inside are
//! remembered for [`INSIDE_TTL`] from when they were found, so a directory moved out of the
//! subtree stays reachable for at most that long. An inode that does not exist is outside:
//! a request naming a removed inode is refused like one naming an inode outside.

use super::Meta;
use crate::ops::rename::PATH_DEPTH_MAX;
use crate::schema::OpError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::messages::MetaRequest;
use weft_proto::ErrorCode;

/// How long a directory found inside a subtree is taken to stay there.
pub(crate) const INSIDE_TTL: Duration = Duration::from_secs(2);
/// Most directories remembered; the memory is forgotten whole when full.
const INSIDE_REMEMBERED_MAX: usize = 65_536;

/// Directories found inside subtrees: (subtree, directory) → when that was known, which is
/// when the walk that found it started, or as old as the memory that walk ended on: a walk
/// through a remembered directory does not make it, or what lies below it, younger, so a
/// directory moved out cannot be kept reachable by walking below it.
#[derive(Default)]
pub(crate) struct Inside(Mutex<HashMap<(InodeId, InodeId), Instant>>);

impl Inside {
    /// Since when `dir` is known to lie in `subtree`, if that is recent enough to trust.
    fn known_since(&self, subtree: InodeId, dir: InodeId) -> Option<Instant> {
        let known = self.0.lock().expect("subtree memory poisoned");
        known
            .get(&(subtree, dir))
            .copied()
            .filter(|since| since.elapsed() < INSIDE_TTL)
    }

    fn remember(&self, subtree: InodeId, dirs: &[InodeId], since: Instant) {
        let mut known = self.0.lock().expect("subtree memory poisoned");
        if known.len() + dirs.len() > INSIDE_REMEMBERED_MAX {
            known.retain(|_, found| found.elapsed() < INSIDE_TTL);
            if known.len() + dirs.len() > INSIDE_REMEMBERED_MAX {
                known.clear();
            }
        }
        for dir in dirs {
            known.insert((subtree, *dir), since);
        }
    }
}

fn outside(inode: InodeId, subtree: InodeId) -> OpError {
    OpError::Rejected(WireError::new(
        ErrorCode::PermissionDenied,
        format!(
            "{inode} is outside the subtree {subtree} this client is confined to (weft client \
             set --subtree)"
        ),
    ))
}

impl Meta {
    /// That every inode `request` names lies in `subtree`.
    ///
    /// # Errors
    /// `PermissionDenied` for one outside, or what reading the parents gave.
    pub(crate) async fn check_subtree(
        &self,
        request: &MetaRequest,
        subtree: InodeId,
    ) -> Result<(), OpError> {
        for inode in request.inodes_named() {
            if !self.lies_in(inode, subtree).await? {
                return Err(outside(inode, subtree));
            }
        }
        Ok(())
    }

    /// Whether `inode` lies in `subtree`. An inode that does not exist does not: inode numbers
    /// are predictable, and one let through could be created outside before its request
    /// runs (and the answer would tell which outside numbers exist).
    async fn lies_in(&self, inode: InodeId, subtree: InodeId) -> Result<bool, OpError> {
        let started = Instant::now();
        let mut visited = Vec::new();
        let mut at = inode;
        for _ in 0..PATH_DEPTH_MAX {
            if at == subtree {
                self.inside.remember(subtree, &visited, started);
                return Ok(true);
            }
            if let Some(since) = self.inside.known_since(subtree, at) {
                self.inside.remember(subtree, &visited, since);
                return Ok(true);
            }
            if at == InodeId::ROOT || at.0 == 0 {
                return Ok(false);
            }
            let attr = match self.attr_of(at).await {
                Ok(attr) => attr,
                Err(OpError::Rejected(error)) if error.code == ErrorCode::NotFound => {
                    return Ok(false);
                }
                Err(error) => return Err(error),
            };
            if attr.kind == weft_proto::messages::FileKind::Directory {
                visited.push(at);
            }
            at = attr.parent;
        }
        Ok(false)
    }
}
