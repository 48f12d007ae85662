//! The consistency check of a home (`weft fsck`): its progress, and the objects of its
//! files looked for on the targets.

use super::targets::TARGET_RETRY;
use super::Meta;
use crate::ops::check::{check, Checked, Listed};
use crate::ops::remove::list_orphans;
use crate::schema::OpError;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use weft_proto::answer::ObjectsPage;
use weft_proto::ids::{InodeId, TargetId};
use weft_proto::messages::{
    CheckProgress, Consistency, MetaResponse, MirrorKind, OBJECTS_PER_LIST_MAX,
};

impl Meta {
    /// Notes how far the consistency check is, for [`MetaRequest::CheckProgress`].
    pub(super) fn note_check_progress(&self, phase: &str, done: u64, total: u64) {
        *self.check_progress.lock().expect("progress poisoned") = CheckProgress {
            running: true,
            phase: phase.to_string(),
            done,
            total,
        };
    }

    /// `weft fsck` of this metadata target: lists the objects of its files on every target,
    /// checks namespace and objects — from a read snapshot, so no change waits for it, or in
    /// one transaction when it repairs — then removes the objects that belong to no file and
    /// looks again at the copies of files' data it suspects. Inode ids are never reused, so an
    /// object without a file can never come to belong to one later.
    pub(super) async fn check(
        &self,
        repair: bool,
        referenced: Vec<InodeId>,
    ) -> Result<MetaResponse, OpError> {
        let mut counts: HashMap<InodeId, usize> = HashMap::new();
        for inode in referenced {
            *counts.entry(inode).or_default() += 1;
        }
        let referenced = counts;
        let disposing = self.background.disposing.lock().await;
        let map = self
            .cluster
            .refresh()
            .await
            .unwrap_or_else(|_| self.cluster.map());
        let (objects, unreachable) = self.list_objects_everywhere(&map).await;
        let open = self.files_held_open()?;
        let listed = Listed {
            objects,
            targets: map
                .targets
                .iter()
                .map(|t| t.id)
                .filter(|id| !unreachable.contains(id))
                .collect(),
            good_members: map
                .mirror_groups
                .iter()
                .filter(|group| group.kind == MirrorKind::Storage)
                .map(|group| {
                    let good = group.members.iter().filter(|member| {
                        member.state == Consistency::Good
                            && !unreachable.contains(&TargetId::from(member.id))
                    });
                    (
                        group.id,
                        good.map(|member| TargetId::from(member.id)).collect(),
                    )
                })
                .collect(),
        };
        let home = self.node;
        self.note_check_progress("checking the namespace", 0, 0);
        let checked = if repair {
            self.committer
                .run_with(move |txn| check(txn, Some(txn), home, &listed, &open, &referenced))
                .await?
        } else {
            let db = Arc::clone(&self.db);
            tokio::task::spawn_blocking(move || {
                let snapshot = db.begin_read()?;
                check(&snapshot, None, home, &listed, &open, &referenced)
            })
            .await
            .map_err(|error| OpError::inconsistent(format!("the check stopped: {error}")))??
        };
        drop(disposing);
        let Checked {
            mut report,
            garbage,
            suspects,
        } = checked;
        self.verify_suspects(suspects, &mut report).await;
        for (inode, slot) in garbage {
            let removed = self
                .cluster
                .call_storage(slot, &TARGET_RETRY, |storage, route| async move {
                    storage.remove(route, inode).await
                })
                .await;
            match removed {
                Ok(()) => report
                    .repairs
                    .push(format!("removed the object of {inode} on {slot}")),
                Err(error) => report.problems.push(format!(
                    "could not remove the object of {inode} on {slot}: {error}"
                )),
            }
        }
        report.unreachable_targets = unreachable;
        self.background.work.notify_one();
        Ok(MetaResponse::CheckReport(report))
    }

    /// This home's objects on every target of `map`, plain and (on a storage mirror group's
    /// members) mirrored, each with its target, group and length; and the targets that could
    /// not be listed.
    async fn list_objects_everywhere(
        &self,
        map: &weft_proto::messages::ClusterMap,
    ) -> (Vec<crate::ops::check::FoundObject>, Vec<TargetId>) {
        let mut objects = Vec::new();
        let mut unreachable: Vec<TargetId> = Vec::new();
        // Every target's plain objects, and a group member's mirrored objects as well.
        let spaces = map.targets.iter().flat_map(|t| {
            let group = map.mirror_group_of_target(t.id).map(|g| g.id);
            std::iter::once((t.id, None)).chain(group.map(|group| (t.id, Some(group))))
        });
        let spaces: Vec<_> = spaces.collect();
        for (listed, &(target, group)) in spaces.iter().enumerate() {
            let total = spaces.len() as u64;
            self.note_check_progress("listing objects on targets", listed as u64, total);
            if unreachable.contains(&target) {
                continue;
            }
            let mut after = 0;
            loop {
                let home = Some(self.node);
                let mirrored = group.is_some();
                let page = self
                    .cluster
                    .call_storage(target, &TARGET_RETRY, |storage, _| async move {
                        storage
                            .list_objects(target, mirrored, home, after, OBJECTS_PER_LIST_MAX)
                            .await
                    })
                    .await;
                match page {
                    Ok(ObjectsPage {
                        objects: listed,
                        end,
                    }) => {
                        after = listed.last().map(|(inode, _)| inode.0).unwrap_or(after);
                        objects.extend(
                            listed
                                .into_iter()
                                .map(|(inode, length)| (inode, target, group, length)),
                        );
                        if end {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(target = target.0, %error, "fsck cannot list a target");
                        unreachable.push(target);
                        break;
                    }
                }
            }
        }
        (objects, unreachable)
    }

    /// The files the check must not take for garbage: those open here, and while the grace
    /// period lasts those unlinked while open before the start, which their clients may open
    /// again.
    fn files_held_open(&self) -> Result<HashSet<InodeId>, OpError> {
        let mut open: HashSet<InodeId> = self
            .sessions
            .opens
            .lock()
            .expect("open table poisoned")
            .handles
            .keys()
            .copied()
            .collect();
        if self
            .sessions
            .orphans_unclaimed
            .load(std::sync::atomic::Ordering::Acquire)
            && !self.locks.grace_over()
        {
            // Files unlinked while open before the start wait for their clients to open them
            // again until the grace period is over.
            open.extend(self.read(|txn| list_orphans(&txn.open_table(crate::schema::ORPHANS)?))?);
        }
        Ok(open)
    }
}
