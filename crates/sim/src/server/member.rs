//! The simulator's member side: what a secondary does with its primary's forwards and resync
//! steps, admitted by the group's version and through the fence of that version.

use super::*;

impl Server {
    /// A forward from this group's primary: admitted by version, a change through the fence
    /// of the group's version, so a late copy never lands after a newer change.
    pub(super) fn as_member(
        &mut self,
        now: Time,
        primary: ServerId,
        msg: Msg<Bytes>,
    ) -> Vec<Send<Bytes>> {
        let (group, version, op) = match &msg {
            Msg::Forward {
                group, version, op, ..
            }
            | Msg::SyncReplica { group, version, op }
            | Msg::SyncChunk {
                group, version, op, ..
            } => (*group, *version, *op),
            _ => return Vec::new(),
        };
        let mut alone = Fence::default();
        let admitted =
            self.forward_fences
                .admit(&self.membership, self.id, (group, version), Fence::default);
        let fence = match admitted {
            Ok(FenceOf::Current(fence)) => fence,
            Ok(FenceOf::Older) => &mut alone,
            Err(_) => return self.member_refused(primary, group, op),
        };
        match msg {
            Msg::Forward { tag, change, .. } => {
                match fence.admit(tag.tag(), now) {
                    Admission::Run => {
                        fence.finished(tag.client, tag.number, Some(()));
                        self.store.apply(group, &change);
                    }
                    Admission::Answered(()) => {}
                    // Dropped, as a storage server answers `Superseded`: the primary tries
                    // again until it gives the member up.
                    Admission::Late | Admission::Wait => return Vec::new(),
                }
            }
            Msg::SyncReplica { .. } => self.store.sync(group),
            Msg::SyncChunk { chunk, .. } => self.store.sync_chunk((group, chunk)),
            _ => {}
        }
        vec![Send {
            to: Node::Server(primary),
            msg: Msg::MemberAck { group, version, op },
        }]
    }

    /// What a member answers a send of `primary` it refuses: the version it knows.
    pub(super) fn member_refused(
        &self,
        primary: ServerId,
        group: GroupId,
        op: u64,
    ) -> Vec<Send<Bytes>> {
        let known = self
            .membership
            .group(group)
            .map_or(Version(0), |(g, _)| g.version);
        vec![Send {
            to: Node::Server(primary),
            msg: Msg::MemberRefused {
                group,
                version: known,
                op,
            },
        }]
    }
}
