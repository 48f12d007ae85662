//! One send of a primary to members of its group, until each took it or left: a client's
//! change (or a sync) to every present secondary, or one step of a resync to its member.
//! Storage servers and metadata servers drive it in their I/O shell
//! (`weft_net::mirror::Membership::deliver`, `resync_step`), the simulator's server
//! (`crates/sim`) in its forwards; both over the same [`Membership`] decisions.
//!
//! The rules it keeps:
//! - every copy carries the version the decisions give now; a member that left the group is
//!   no longer waited for, and a primary that lost its role or its lease gives the send up;
//! - a member that has not taken a send within the member timeout (counted from the first
//!   copy under the version it now carries) is reported failing, so management takes it out;
//!   a resync's step that late stops its resync instead;
//! - a change given up before some members took it leaves them owed its items, so they are
//!   reported unreachable and copied in full or by the record of what they missed;
//! - a change a member took clears what was reported failing of it by that change's delivery
//!   (only: a member that takes other changes but keeps refusing one is still failing).
//!
//! The shell sends what [`Delivery::due`] asks for, tells [`Delivery::acknowledged`] or
//! [`Delivery::failed`] how each copy fared, and wakes at [`Delivery::next_wake`].

use crate::membership::{Membership, Refused, ResyncStart};
use crate::{GroupId, ServerId, Time, Version};
use std::collections::BTreeMap;

/// How a shell paces its copies, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// A copy with no answer this long is sent again (a shell whose calls end in a failure of
    /// their own sets this past their deadline).
    pub resend: Time,
    /// Pause after a copy failed before the next.
    pub retry: Time,
    /// A member that has not taken the send this long is failing.
    pub member_timeout: Time,
}

/// What is delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sending {
    /// A change (or sync) the primary applied, to every present secondary. `items` are what
    /// a member that does not take it is owed if it is given up (the objects it changes).
    Change {
        /// What it changes.
        items: Vec<u64>,
    },
    /// A step of `start`'s resync, to its member, in the resync's version only.
    Step(ResyncStart),
}

/// Why a send was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GivenUp {
    /// The sender may no longer send it: it lost its role or lease, or (a resync's step) the
    /// group left the resync's version.
    Refused(Refused),
    /// A resync's member did not take its step within the member timeout.
    Late {
        /// The member.
        member: ServerId,
    },
}

/// A member a send waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiting {
    /// The version of the last copy, and since when copies under it went unanswered.
    sent: Option<(Version, Time)>,
    /// Reported failing under that version.
    reported: bool,
    /// When the next copy is due.
    due: Time,
}

/// One send of a primary, waiting for its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Names this delivery's reports of failing members ([`Membership::delivery_failing`]).
    id: u64,
    primary: ServerId,
    group: GroupId,
    sending: Sending,
    waiting: BTreeMap<ServerId, Waiting>,
    given_up: Option<GivenUp>,
}

impl Delivery {
    /// A send from `primary` to the present secondaries of `group` (a change), or to the
    /// member of a resync step; every copy is due at `now`.
    pub fn new<G: Clone>(
        membership: &Membership<G>,
        now: Time,
        primary: ServerId,
        group: GroupId,
        sending: Sending,
    ) -> Delivery {
        let members = match &sending {
            Sending::Change { .. } => membership.present_secondaries(group),
            Sending::Step(start) => vec![start.member],
        };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Delivery {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            primary,
            group,
            sending,
            waiting: members
                .into_iter()
                .map(|member| {
                    (
                        member,
                        Waiting {
                            sent: None,
                            reported: false,
                            due: now,
                        },
                    )
                })
                .collect(),
            given_up: None,
        }
    }

    /// The group.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The resync this is a step of (`None`: a change).
    pub fn step_of(&self) -> Option<ResyncStart> {
        match self.sending {
            Sending::Step(start) => Some(start),
            Sending::Change { .. } => None,
        }
    }

    /// Whether it still waits for `member`.
    pub fn waits_for(&self, member: ServerId) -> bool {
        self.waiting.contains_key(&member)
    }

    /// How it ended: `None` while it waits, `Ok` once every member took it or left.
    pub fn outcome(&self) -> Option<Result<(), GivenUp>> {
        match self.given_up {
            Some(given_up) => Some(Err(given_up)),
            None => self.waiting.is_empty().then_some(Ok(())),
        }
    }

    /// The copies to send at `now`, each to a member with the version it carries. Members
    /// that left stop being waited for; members late are reported failing (a change) or
    /// give the send up (a step); a sender that may no longer send gives it up.
    pub fn due<G: Clone>(
        &mut self,
        membership: &mut Membership<G>,
        now: Time,
        pace: Pace,
    ) -> Vec<(ServerId, Version)> {
        if self.given_up.is_some() {
            return Vec::new();
        }
        let mut copies = Vec::new();
        for member in self.waiting.keys().copied().collect::<Vec<_>>() {
            let mut waiting = self.waiting[&member];
            if let Some((version, since)) = waiting.sent {
                if !waiting.reported && now.saturating_sub(since) >= pace.member_timeout {
                    match self.sending {
                        Sending::Change { .. } => {
                            membership.delivery_failing(
                                (self.group, member),
                                self.id,
                                version,
                                since,
                            );
                            waiting.reported = true;
                            self.waiting.insert(member, waiting);
                        }
                        Sending::Step(_) => {
                            self.given_up = Some(GivenUp::Late { member });
                            return Vec::new();
                        }
                    }
                }
            }
            if waiting.due > now {
                continue;
            }
            match self.version_to(membership, now, member) {
                Ok(Some(version)) => {
                    let (since, reported) = match waiting.sent {
                        Some((sent, since)) if sent == version => (since, waiting.reported),
                        // A new version starts the member's time over.
                        _ => (now, false),
                    };
                    self.waiting.insert(
                        member,
                        Waiting {
                            sent: Some((version, since)),
                            reported,
                            due: now.saturating_add(pace.resend),
                        },
                    );
                    copies.push((member, version));
                }
                Ok(None) => {
                    self.waiting.remove(&member);
                    membership.delivered(self.group, member, self.id);
                }
                Err(refused) => {
                    self.give_up(membership, GivenUp::Refused(refused));
                    return Vec::new();
                }
            }
        }
        copies
    }

    /// Looks at every member again at `now` without sending: members that left stop being
    /// waited for, and a sender that may no longer send gives the send up (after a newer map).
    pub fn revisit<G: Clone>(&mut self, membership: &mut Membership<G>, now: Time) {
        if self.given_up.is_some() {
            return;
        }
        for member in self.waiting.keys().copied().collect::<Vec<_>>() {
            match self.version_to(membership, now, member) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    self.waiting.remove(&member);
                    membership.delivered(self.group, member, self.id);
                }
                Err(refused) => {
                    self.give_up(membership, GivenUp::Refused(refused));
                    return;
                }
            }
        }
    }

    /// `member` took a copy (of any version: it applied the send).
    pub fn acknowledged<G: Clone>(&mut self, membership: &mut Membership<G>, member: ServerId) {
        if self.waiting.remove(&member).is_some() && matches!(self.sending, Sending::Change { .. })
        {
            membership.delivered(self.group, member, self.id);
        }
    }

    /// A copy to `member` failed at `now` (refused, or its call ended without an answer): the
    /// next is due after the pause.
    pub fn failed(&mut self, member: ServerId, now: Time, pace: Pace) {
        if let Some(waiting) = self.waiting.get_mut(&member) {
            waiting.due = now.saturating_add(pace.retry);
        }
    }

    /// When the shell should look again: the next copy due, or the next member to turn late.
    pub fn next_wake(&self, pace: Pace) -> Option<Time> {
        if self.given_up.is_some() {
            return None;
        }
        self.waiting
            .values()
            .map(|waiting| {
                let late = waiting
                    .sent
                    .filter(|_| !waiting.reported)
                    .map(|(_, since)| since.saturating_add(pace.member_timeout));
                late.map_or(waiting.due, |late| late.min(waiting.due))
            })
            .min()
    }

    /// The version a copy to `member` carries now; `None` when it left.
    fn version_to<G: Clone>(
        &self,
        membership: &Membership<G>,
        now: Time,
        member: ServerId,
    ) -> Result<Option<Version>, Refused> {
        match self.sending {
            Sending::Change { .. } => {
                membership.version_to_member(now, self.primary, self.group, member)
            }
            Sending::Step(start) => membership
                .resync_version(now, self.primary, start)
                .map(Some),
        }
    }

    /// Gives the send up: the members that did not take a change are owed its items.
    fn give_up<G: Clone>(&mut self, membership: &mut Membership<G>, why: GivenUp) {
        if let Sending::Change { items } = &self.sending {
            for member in self.waiting.keys() {
                membership.undelivered(self.group, *member, items.iter().copied());
            }
        }
        self.given_up = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::adopt_pair;
    use crate::MemberState;

    const PACE: Pace = Pace {
        resend: 100,
        retry: 50,
        member_timeout: 200,
    };

    fn member_of(version: Version) -> Membership<()> {
        let mut membership = Membership::new();
        adopt(&mut membership, 0, version);
        membership
    }

    /// Server 1 hears at `at` that group 1 is in `version`, server 2 good.
    fn adopt(membership: &mut Membership<()>, at: Time, version: Version) {
        adopt_pair(membership, ServerId(1), at, (version, MemberState::Good));
    }

    // Goal: a change given up (its primary's lease ran out) before its member took it, and
    // before the member was late, leaves the member owed it: reported unreachable, so it
    // cannot stay good without the change.
    #[test]
    fn a_change_given_up_leaves_its_member_owed_it() {
        let mut membership = member_of(Version(1));
        let patient = Pace {
            member_timeout: 1_000_000,
            ..PACE
        };
        let change = Sending::Change { items: vec![7] };
        let mut delivery = Delivery::new(&membership, 0, ServerId(1), GroupId(1), change);
        delivery.due(&mut membership, 0, patient);
        delivery.revisit(&mut membership, 100_000);
        assert!(matches!(delivery.outcome(), Some(Err(_))));
        assert_eq!(
            membership
                .unreachable(100_000, patient.member_timeout)
                .iter()
                .map(|m| m.member)
                .collect::<Vec<_>>(),
            vec![ServerId(2)],
            "owed the change given up"
        );
    }

    // Goal: a copy under a new version starts its member's time over: the member is late
    // only a member timeout after the first copy it could take.
    #[test]
    fn a_new_version_starts_a_members_time_over() {
        let mut membership = member_of(Version(1));
        let change = Sending::Change { items: vec![7] };
        let mut delivery = Delivery::new(&membership, 0, ServerId(1), GroupId(1), change);
        delivery.due(&mut membership, 0, PACE);
        adopt(&mut membership, 150, Version(2));
        assert_eq!(
            delivery.due(&mut membership, 160, PACE),
            vec![(ServerId(2), Version(2))]
        );
        delivery.failed(ServerId(2), 170, PACE);
        delivery.due(&mut membership, 250, PACE);
        assert!(
            membership.unreachable(250, PACE.member_timeout).is_empty(),
            "not late 90 ms into the new version"
        );
        delivery.due(&mut membership, 360, PACE);
        assert_eq!(membership.unreachable(360, PACE.member_timeout).len(), 1);
    }

    // Goal: a change reaches its member with the group's version, is sent again while
    // unanswered, and ends once the member took it.
    #[test]
    fn a_change_is_sent_again_until_its_member_takes_it() {
        let mut membership = member_of(Version(1));
        let change = Sending::Change { items: vec![7] };
        let mut delivery = Delivery::new(&membership, 0, ServerId(1), GroupId(1), change);
        assert_eq!(
            delivery.due(&mut membership, 0, PACE),
            vec![(ServerId(2), Version(1))]
        );
        assert!(delivery.due(&mut membership, 50, PACE).is_empty());
        assert_eq!(delivery.next_wake(PACE), Some(100));
        assert_eq!(delivery.due(&mut membership, 100, PACE).len(), 1);
        delivery.acknowledged(&mut membership, ServerId(2));
        assert_eq!(delivery.outcome(), Some(Ok(())));
    }

    // Goal: a member that takes nothing for the member timeout is reported unreachable; a
    // primary whose lease ran out gives the change up, and the member is owed its objects.
    #[test]
    fn a_silent_member_is_reported_and_owed_what_was_given_up() {
        let mut membership = member_of(Version(1));
        let change = Sending::Change { items: vec![7] };
        let mut delivery = Delivery::new(&membership, 0, ServerId(1), GroupId(1), change);
        delivery.due(&mut membership, 0, PACE);
        delivery.failed(ServerId(2), 10, PACE);
        delivery.due(&mut membership, 60, PACE);
        assert!(membership.unreachable(60, PACE.member_timeout).is_empty());
        delivery.due(&mut membership, 200, PACE);
        assert_eq!(
            membership.unreachable(200, PACE.member_timeout).len(),
            1,
            "late past the member timeout"
        );
        assert!(
            delivery.next_wake(PACE).is_some_and(|at| at > 200),
            "a member reported late wakes its shell only for its next copy"
        );
        // Far past the lease: given up.
        delivery.due(&mut membership, 100_000, PACE);
        assert!(matches!(
            delivery.outcome(),
            Some(Err(GivenUp::Refused(Refused::NoLease)))
        ));
        assert!(!membership
            .unreachable(100_000, PACE.member_timeout)
            .is_empty());
    }

    // Goal: a member that takes other changes but keeps refusing one is still reported
    // unreachable once that one is late, until that one reaches it. (A change the member took
    // cleared every report of it, so a member refusing one object's changes, while it took the
    // rest, was never taken out, and the change waited for it forever.)
    #[test]
    fn a_change_a_member_keeps_refusing_is_not_hidden_by_those_it_takes() {
        let mut membership = member_of(Version(1));
        let change = || Sending::Change { items: vec![7] };
        let mut refused = Delivery::new(&membership, 0, ServerId(1), GroupId(1), change());
        refused.due(&mut membership, 0, PACE);
        refused.failed(ServerId(2), 10, PACE);
        refused.due(&mut membership, 200, PACE);
        let mut taken = Delivery::new(&membership, 210, ServerId(1), GroupId(1), change());
        taken.due(&mut membership, 210, PACE);
        taken.acknowledged(&mut membership, ServerId(2));
        assert_eq!(taken.outcome(), Some(Ok(())));
        assert_eq!(
            membership.unreachable(220, PACE.member_timeout).len(),
            1,
            "still failing the change it refuses"
        );
        refused.acknowledged(&mut membership, ServerId(2));
        assert!(membership.unreachable(230, PACE.member_timeout).is_empty());
    }

    // Goal: a resync's step that its member does not take in time stops the resync.
    #[test]
    fn a_late_step_gives_its_resync_up() {
        let mut membership = member_of(Version(1));
        let start = ResyncStart {
            group: GroupId(1),
            version: Version(1),
            member: ServerId(2),
            full: true,
        };
        let mut delivery = Delivery::new(
            &membership,
            0,
            ServerId(1),
            GroupId(1),
            Sending::Step(start),
        );
        assert_eq!(delivery.due(&mut membership, 0, PACE).len(), 1);
        delivery.due(&mut membership, 200, PACE);
        assert_eq!(
            delivery.outcome(),
            Some(Err(GivenUp::Late {
                member: ServerId(2)
            }))
        );
    }
}
