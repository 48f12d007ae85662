//! `weft fsck`'s second look at the copies of files' data. The check listed the objects before
//! its transaction, so a write, truncate or removal in between can make a copy look missing
//! or different. A suspect is reported only if it still holds when looked at again: a missing
//! object is listed again and its slot must still be recorded as written in the same truncate
//! generation (such an object can only go with a truncate, which starts a new generation, or
//! with the file); copies that differ are compared twice, the file settled in between, and
//! must differ the same way both times. Either way, the members involved must still be good
//! afterwards: a member that failed meanwhile is resynced, not reported.

use super::targets::TARGET_RETRY;
use super::Meta;
use crate::ops::check::{report_problem, Suspect, SuspectKind};
use crate::schema::{load_inode, load_written, OpError, INODES, TRUNCATES, UNREPORTED, WRITTEN};
use crate::store::ReadableTable;
use weft_net::RpcError;
use weft_proto::answer::{Checksum, ObjectsPage};
use weft_proto::ids::MemberId;
use weft_proto::ids::{InodeId, TargetId};
use weft_proto::layout::Slot;
use weft_proto::messages::{CheckReport, Consistency, CHECKSUM_BYTES_MAX};
use weft_proto::ErrorCode;

/// Why a suspect could not be looked at again.
enum Unverified {
    /// This target did not answer.
    Target(TargetId, RpcError),
    Store(OpError),
}

impl From<OpError> for Unverified {
    fn from(error: OpError) -> Unverified {
        Unverified::Store(error)
    }
}

/// A member's copy of an object as compared: its length and the CRC32C of each piece.
#[derive(PartialEq, Eq)]
struct Copy {
    length: u64,
    crcs: Vec<u32>,
}

/// Targets as a list for a message: "target 3", "targets 3 and 5".
fn targets_text(targets: &[TargetId]) -> String {
    let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
    match names.as_slice() {
        [one] => format!("target {one}"),
        [rest @ .., last] => format!("targets {} and {last}", rest.join(", ")),
        [] => "no target".to_string(),
    }
}

impl Meta {
    /// Looks again at every suspect of a check and reports those that hold; a target that
    /// stops answering meanwhile is reported as not checked.
    pub(super) async fn verify_suspects(&self, suspects: Vec<Suspect>, report: &mut CheckReport) {
        let total = suspects.len() as u64;
        for (done, suspect) in suspects.into_iter().enumerate() {
            self.note_check_progress("comparing copies of files", done as u64, total);
            match self.verify_suspect(&suspect).await {
                Ok(Some(problem)) if self.members_still_good(&suspect) => {
                    report_problem(report, problem)
                }
                Ok(_) => {}
                Err(Unverified::Target(target, error)) => {
                    tracing::warn!(target = target.0, %error, "fsck cannot read a copy");
                    if !report.unreachable_targets.contains(&target) {
                        report.unreachable_targets.push(target);
                    }
                }
                Err(Unverified::Store(error)) => report_problem(
                    report,
                    format!(
                        "could not look again at {}: {}",
                        suspect.inode,
                        error.into_wire()
                    ),
                ),
            }
        }
    }

    /// The problem `suspect` shows when looked at again, if any.
    async fn verify_suspect(&self, suspect: &Suspect) -> Result<Option<String>, Unverified> {
        let (inode, slot) = (suspect.inode, suspect.slot);
        let mirrored = matches!(slot, Slot::Group(_));
        match &suspect.kind {
            SuspectKind::Missing { lacking, holding } => {
                let mut missing = Vec::new();
                for &target in lacking {
                    if !self.has_object(target, mirrored, inode).await? {
                        missing.push(target);
                    }
                }
                if missing.is_empty() || !self.still_written(suspect)? {
                    return Ok(None);
                }
                Ok(Some(
                    if holding.is_empty() && missing.len() == lacking.len() {
                        format!(
                        "the data of {inode} on {slot} is lost: its object is missing, and those \
                         bytes read as zeros; restore the file from a copy"
                    )
                    } else {
                        format!(
                            "{} of {slot} lack the object of {inode} that {} hold; copy the file \
                         again to rewrite every copy",
                            targets_text(&missing),
                            targets_text(holding)
                        )
                    },
                ))
            }
            SuspectKind::Compare(members) => {
                let first = self.checksums(members, mirrored, inode).await?;
                if first.windows(2).all(|pair| pair[0] == pair[1]) || !self.settled(suspect)? {
                    return Ok(None);
                }
                if self.checksums(members, mirrored, inode).await? != first {
                    // Changing while compared: not a settled file after all.
                    return Ok(None);
                }
                let copies: Vec<String> = members
                    .iter()
                    .zip(&first)
                    .map(|(target, copy)| format!("target {target} holds {} bytes", copy.length))
                    .collect();
                // The first piece in which some copy differs from the first one.
                let pieces = first.iter().map(|copy| copy.crcs.len()).max().unwrap_or(0);
                let piece = (0..pieces as u64)
                    .find(|index| {
                        let of = |copy: &Copy| copy.crcs.get(*index as usize).copied();
                        first.iter().any(|copy| of(copy) != of(&first[0]))
                    })
                    .unwrap_or(0);
                let from = piece * CHECKSUM_BYTES_MAX;
                Ok(Some(format!(
                    "the copies of {inode} in {slot} differ ({}; first in the {} bytes of the \
                     object from offset {from}); copy the file again to rewrite every copy",
                    copies.join(", "),
                    CHECKSUM_BYTES_MAX
                )))
            }
        }
    }

    /// Whether the members a suspect of a mirrored slot names are all still good.
    fn members_still_good(&self, suspect: &Suspect) -> bool {
        let Slot::Group(group) = suspect.slot else {
            return true;
        };
        let members: Vec<TargetId> = match &suspect.kind {
            SuspectKind::Missing { lacking, holding } => {
                lacking.iter().chain(holding).copied().collect()
            }
            SuspectKind::Compare(members) => members.clone(),
        };
        let map = self.cluster.map();
        let Some(info) = map.mirror_groups.iter().find(|info| {
            info.kind == weft_proto::messages::MirrorKind::Storage && info.id == group
        }) else {
            return false;
        };
        members.iter().all(|target| {
            info.members.iter().any(|member| {
                member.id == MemberId::from(*target) && member.state == Consistency::Good
            })
        })
    }

    /// Whether `target` holds an object of `inode` (a mirrored one if `mirrored`).
    async fn has_object(
        &self,
        target: TargetId,
        mirrored: bool,
        inode: InodeId,
    ) -> Result<bool, Unverified> {
        let home = Some(self.node);
        let ObjectsPage {
            objects: listed, ..
        } = self
            .cluster
            .call_storage(target, &TARGET_RETRY, |storage, _| async move {
                storage
                    .list_objects(target, mirrored, home, inode.0 - 1, 1)
                    .await
            })
            .await
            .map_err(|error| Unverified::Target(target, error))?;
        Ok(listed.first().is_some_and(|(found, _)| *found == inode))
    }

    /// Each member's copy of `inode`: its length and the CRC32C of each piece of
    /// [`CHECKSUM_BYTES_MAX`] bytes of it, read in one request each.
    async fn checksums(
        &self,
        members: &[TargetId],
        mirrored: bool,
        inode: InodeId,
    ) -> Result<Vec<Copy>, Unverified> {
        let mut copies = Vec::with_capacity(members.len());
        for &target in members {
            let mut copy = Copy {
                length: 0,
                crcs: Vec::new(),
            };
            let mut offset = 0;
            loop {
                let Checksum { length, crc } = self
                    .cluster
                    .call_storage(target, &TARGET_RETRY, |storage, _| async move {
                        storage
                            .object_checksum(target, mirrored, inode, offset, CHECKSUM_BYTES_MAX)
                            .await
                    })
                    .await
                    .map_err(|error| Unverified::Target(target, error))?;
                copy.length = length;
                copy.crcs.push(crc);
                offset += CHECKSUM_BYTES_MAX;
                if offset >= length {
                    break;
                }
            }
            copies.push(copy);
        }
        Ok(copies)
    }

    /// Whether the suspect's slot is still recorded as written in the same truncate
    /// generation of a file that still exists.
    fn still_written(&self, suspect: &Suspect) -> Result<bool, OpError> {
        self.read(|txn| {
            Ok(same_generation(txn, suspect)?
                && load_written(&WRITTEN.open(txn)?, suspect.inode)?.contains(suspect.index))
        })
    }

    /// Whether the suspect's file exists in the same truncate generation, is not open, and
    /// has no size to report nor a truncate under way.
    fn settled(&self, suspect: &Suspect) -> Result<bool, OpError> {
        let open = self
            .sessions
            .opens
            .lock()
            .expect("open table poisoned")
            .handles
            .contains_key(&suspect.inode);
        if open {
            return Ok(false);
        }
        self.read(|txn| {
            let id = suspect.inode.0;
            Ok(same_generation(txn, suspect)?
                && txn.open_table(UNREPORTED)?.get(id)?.is_none()
                && TRUNCATES.open(txn)?.get(id)?.is_none())
        })
    }
}

/// Whether the suspect's file still exists in the truncate generation it was suspected in.
fn same_generation(
    txn: &crate::store::ReadTransaction,
    suspect: &Suspect,
) -> Result<bool, OpError> {
    match load_inode(&txn.open_table(INODES)?, suspect.inode) {
        Ok(record) => Ok(record.truncate_generation == suspect.generation),
        Err(OpError::Rejected(error)) if error.code == ErrorCode::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}
