//! What a server decides about the mirror groups it holds members of, whatever they mirror:
//! which version of each group holds, whether it may serve as primary (its lease), whether a
//! forward may be applied, which members a change must reach, which members to report
//! unreachable, which resyncs to run, and which absent members to keep a record of missed
//! changes for. Storage servers and metadata servers run this machine inside their I/O shell
//! (`weft_net::mirror`); the simulator runs it inside its servers (`crates/sim`).

use crate::{Group, GroupId, GroupMember, MemberState, ServerId, Time, Version};
use std::collections::{BTreeMap, BTreeSet};

/// A resync this server must run as primary: bring `member` of `group` up to date in
/// `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ResyncStart {
    /// The group.
    pub group: GroupId,
    /// The version it runs in; it stops when the group leaves it.
    pub version: Version,
    /// The member to bring up to date.
    pub member: ServerId,
    /// Whether management asks for a full copy.
    pub full: bool,
}

/// Why a request or a forward is refused. Each is answered `StaleRoute` on the wire: the
/// sender fetches the map and routes again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The group is not known here (yet).
    UnknownGroup,
    /// Routed with another version than the one known here.
    WrongVersion {
        /// The version known here.
        known: Version,
    },
    /// The request went to a member that is not the primary.
    NotPrimary {
        /// The primary known here.
        primary: ServerId,
    },
    /// The primary's lease ran out: management may have promoted another member.
    NoLease,
    /// A forward reached a member that is no present secondary of the version it carries.
    NotPresent,
}

impl Refused {
    /// Whether the sender knows a newer map than this server, which should fetch it now.
    pub fn sender_is_ahead(&self, routed: Version) -> bool {
        match self {
            Refused::UnknownGroup | Refused::NoLease => true,
            Refused::WrongVersion { known } => routed > *known,
            Refused::NotPrimary { .. } | Refused::NotPresent => false,
        }
    }
}

/// What a newer map changed, for the shell to act on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Groups that took a newer version: (the version replaced, the group now).
    pub taken: Vec<(Option<Group>, Group)>,
    /// Resyncs to start.
    pub starts: Vec<ResyncStart>,
    /// Members that left a group in sync while its primary stayed on this server: from now
    /// on the primary records what they miss, so that they get only that when they return.
    /// The record starts with the items of changes given up before they took them.
    pub record_missed: Vec<(GroupId, ServerId, Vec<u64>)>,
    /// Groups whose primary is no longer on this server: their records of missed changes are
    /// another primary's business now.
    pub drop_missed: Vec<GroupId>,
}

/// One server's mirror groups.
#[derive(Clone, Debug)]
pub struct Membership<G> {
    /// The groups with a member on this server, as last heard, with what the shell keeps of
    /// each version beside them.
    groups: BTreeMap<GroupId, (Group, G)>,
    /// A primary serves until then.
    lease_until: Option<Time>,
    /// Members a change has not reached, per delivery of it (so that changes the member does
    /// take do not hide one it keeps refusing), since when, under which version: a failure
    /// under an older version is about a membership that no longer holds.
    failing: BTreeMap<(GroupId, ServerId, u64), (Time, Version)>,
    /// Resyncs running: (group, member) → their version.
    resyncs: BTreeMap<(GroupId, ServerId), Version>,
    /// Resyncs finished, reported until management marks the member good.
    resynced: BTreeSet<GroupMember>,
    /// Members that may lack changes this server applied as primary but gave up forwarding
    /// (its lease ran out first), with the changes' items. Such a member must not stay good:
    /// while present it is reported unreachable, whatever the version, and the record of what
    /// it misses starts with these items. Kept in memory only: after a restart of this
    /// server management promotes another member (every other one then gets a full copy) or
    /// none was good.
    owed: BTreeMap<(GroupId, ServerId), BTreeSet<u64>>,
}

impl<G: Clone> Default for Membership<G> {
    fn default() -> Self {
        Membership::new()
    }
}

impl<G: Clone> Membership<G> {
    /// No groups and no lease.
    pub fn new() -> Membership<G> {
        Membership {
            groups: BTreeMap::new(),
            lease_until: None,
            failing: BTreeMap::new(),
            resyncs: BTreeMap::new(),
            resynced: BTreeSet::new(),
            owed: BTreeMap::new(),
        }
    }

    /// The group as last heard.
    pub fn group(&self, group: GroupId) -> Option<&(Group, G)> {
        self.groups.get(&group)
    }

    /// Every group as last heard.
    pub fn groups(&self) -> impl Iterator<Item = &(Group, G)> {
        self.groups.values()
    }

    /// Whether the lease holds at `now`.
    pub fn lease_holds(&self, now: Time) -> bool {
        self.lease_until.is_some_and(|until| now < until)
    }

    /// As primary of `group`, newly adopted over `before`: a member that left since, good
    /// before under this same primary, gets a record of what it misses, starting with what
    /// it was owed.
    fn record_missed(&mut self, group: &Group, before: Option<&Group>, adopted: &mut Adopted) {
        let same_primary = before.is_some_and(|b| b.primary == group.primary);
        for member in &group.members {
            let was_good = before
                .and_then(|b| b.member(member.server))
                .is_some_and(|m| m.state == MemberState::Good);
            if member.server != group.primary
                && member.state == MemberState::Absent
                && same_primary
                && was_good
            {
                let owed = self
                    .owed
                    .remove(&(group.id, member.server))
                    .unwrap_or_default();
                adopted
                    .record_missed
                    .push((group.id, member.server, owed.into_iter().collect()));
            }
        }
    }

    /// Takes management's answer to a heartbeat sent at `sent_at`: a lease until
    /// `sent_at + lease_ms`, and the groups (newer versions replace older ones). `local` says
    /// which members live on this server.
    pub fn adopt(
        &mut self,
        sent_at: Time,
        lease_ms: u64,
        groups: Vec<(Group, G)>,
        local: impl Fn(ServerId) -> bool,
    ) -> Adopted {
        let until = sent_at + lease_ms;
        self.lease_until = Some(self.lease_until.map_or(until, |known| known.max(until)));
        let mut adopted = Adopted::default();
        for (group, kept) in groups {
            let newer = self
                .groups
                .get(&group.id)
                .is_none_or(|(known, _)| known.version < group.version);
            if !newer {
                continue;
            }
            // Management publishes a group only with its primary among its members.
            assert!(
                group.member(group.primary).is_some(),
                "group {} version {}: primary {:?} is none of its members {:?}",
                group.id,
                group.version,
                group.primary,
                group.members
            );
            let before = self
                .groups
                .insert(group.id, (group.clone(), kept))
                .map(|(before, _)| before);
            if local(group.primary) {
                self.record_missed(&group, before.as_ref(), &mut adopted);
            } else {
                adopted.drop_missed.push(group.id);
            }
            adopted.taken.push((before, group));
        }
        let groups = &self.groups;
        let needs_resync = |group: GroupId, member: ServerId| {
            groups.get(&group).is_some_and(|(g, _)| {
                g.member(member)
                    .is_some_and(|m| matches!(m.state, MemberState::NeedsResync { .. }))
            })
        };
        // Reports management has acted on are dropped.
        self.resynced.retain(|reported| {
            groups
                .get(&reported.group)
                .is_some_and(|(g, _)| g.version == reported.version)
                || needs_resync(reported.group, reported.member)
        });
        self.failing.retain(|(group, member, _), (_, version)| {
            groups.get(group).is_some_and(|(g, _)| {
                g.version == *version
                    && g.member(*member)
                        .is_some_and(|m| m.state != MemberState::Absent)
            })
        });
        // What absent members and other primaries' groups are owed is covered by a record or
        // a full copy now.
        self.owed.retain(|(group, member), _| {
            groups.get(group).is_some_and(|(g, _)| {
                local(g.primary) && g.present_secondaries().any(|m| m.server == *member)
            })
        });
        for (group, _) in self.groups.values() {
            if !local(group.primary) {
                continue;
            }
            for member in &group.members {
                let MemberState::NeedsResync { full } = member.state else {
                    continue;
                };
                let key = (group.id, member.server);
                let wanted = member.server != group.primary
                    && !self.resynced.contains(&GroupMember {
                        group: group.id,
                        version: group.version,
                        member: member.server,
                    });
                if wanted && self.resyncs.get(&key) != Some(&group.version) {
                    self.resyncs.insert(key, group.version);
                    adopted.starts.push(ResyncStart {
                        group: group.id,
                        version: group.version,
                        member: member.server,
                        full,
                    });
                }
            }
        }
        adopted
    }

    /// Checks a client request routed to `primary` of `group` in `version` at `now`; returns
    /// the group.
    ///
    /// # Errors
    /// Why this member may not serve it.
    pub fn admit_primary(
        &self,
        now: Time,
        primary: ServerId,
        group: GroupId,
        version: Version,
    ) -> Result<&(Group, G), Refused> {
        let Some(known) = self.groups.get(&group) else {
            return Err(Refused::UnknownGroup);
        };
        if known.0.version != version {
            return Err(Refused::WrongVersion {
                known: known.0.version,
            });
        }
        if known.0.primary != primary {
            return Err(Refused::NotPrimary {
                primary: known.0.primary,
            });
        }
        if !self.lease_holds(now) {
            return Err(Refused::NoLease);
        }
        Ok(known)
    }

    /// Checks a forward from the primary of `group` in `version` to `member`. Only that
    /// version's primary sends forwards that carry it.
    ///
    /// # Errors
    /// `WrongVersion` when the version differs, `NotPresent` when `member` gets no changes in
    /// it.
    pub fn admit_forward(
        &self,
        member: ServerId,
        group: GroupId,
        version: Version,
    ) -> Result<(), Refused> {
        let known = self.groups.get(&group).map(|(g, _)| g);
        let known_version = known.map_or(Version(0), |g| g.version);
        if known_version != version {
            return Err(Refused::WrongVersion {
                known: known_version,
            });
        }
        let present = known.is_some_and(|g| g.present_secondaries().any(|m| m.server == member));
        if present {
            Ok(())
        } else {
            Err(Refused::NotPresent)
        }
    }

    /// The members other than the primary that get changes now.
    pub fn present_secondaries(&self, group: GroupId) -> Vec<ServerId> {
        self.groups.get(&group).map_or(Vec::new(), |(g, _)| {
            g.present_secondaries().map(|m| m.server).collect()
        })
    }

    /// The version a change from `primary` to `member` carries at `now`; `None` when the
    /// member left the group (the change no longer waits for it).
    ///
    /// # Errors
    /// `NotPrimary` when `primary` was replaced, `NoLease` when its lease ran out (management
    /// may promote another member soon: the change stops waiting and is refused).
    pub fn version_to_member(
        &self,
        now: Time,
        primary: ServerId,
        group: GroupId,
        member: ServerId,
    ) -> Result<Option<Version>, Refused> {
        let Some((known, _)) = self.groups.get(&group) else {
            return Err(Refused::UnknownGroup);
        };
        if known.primary != primary {
            return Err(Refused::NotPrimary {
                primary: known.primary,
            });
        }
        if !self.lease_holds(now) {
            return Err(Refused::NoLease);
        }
        let present = known.present_secondaries().any(|m| m.server == member);
        Ok(present.then_some(known.version))
    }

    /// The version a step of `start` carries at `now`.
    ///
    /// # Errors
    /// As [`Membership::version_to_member`], and `WrongVersion` once the group left the
    /// resync's version.
    pub fn resync_version(
        &self,
        now: Time,
        primary: ServerId,
        start: ResyncStart,
    ) -> Result<Version, Refused> {
        match self.version_to_member(now, primary, start.group, start.member)? {
            Some(version) if version == start.version => Ok(version),
            _ => Err(Refused::WrongVersion {
                known: self
                    .groups
                    .get(&start.group)
                    .map_or(Version(0), |(g, _)| g.version),
            }),
        }
    }

    /// A change sent under `version` by delivery `delivery` has not reached `member` since
    /// `since`: once that lasts the member timeout, the member is reported unreachable (while
    /// `version` holds, and until that delivery reaches it), whatever other changes it takes.
    pub fn delivery_failing(
        &mut self,
        (group, member): (GroupId, ServerId),
        delivery: u64,
        version: Version,
        since: Time,
    ) {
        let holds = self
            .groups
            .get(&group)
            .is_some_and(|(g, _)| g.version == version);
        if holds {
            self.failing
                .insert((group, member, delivery), (since, version));
        }
    }

    /// Delivery `delivery` reached `member`, or stopped waiting for it.
    pub fn delivered(&mut self, group: GroupId, member: ServerId, delivery: u64) {
        self.failing.remove(&(group, member, delivery));
    }

    /// This server applied the change of `items` as primary of `group` and gave up
    /// forwarding it before `member` took it: the member is owed it.
    pub fn undelivered(
        &mut self,
        group: GroupId,
        member: ServerId,
        items: impl IntoIterator<Item = u64>,
    ) {
        self.owed.entry((group, member)).or_default().extend(items);
    }

    /// Members to report unreachable at `now`: those whose changes have failed for
    /// `member_timeout`, and those owed a change given up.
    pub fn unreachable(&self, now: Time, member_timeout: u64) -> Vec<GroupMember> {
        let failing = self
            .failing
            .iter()
            .filter(|(_, (since, _))| now.saturating_sub(*since) >= member_timeout)
            .map(|(&(group, member, _), &(_, version))| GroupMember {
                group,
                version,
                member,
            });
        let owed = self.owed.keys().filter_map(|&(group, member)| {
            let (known, _) = self.groups.get(&group)?;
            Some(GroupMember {
                group,
                version: known.version,
                member,
            })
        });
        let all: BTreeSet<_> = failing.chain(owed).collect();
        all.into_iter().collect()
    }

    /// Resyncs finished and not yet acted on by management.
    pub fn resynced(&self) -> Vec<GroupMember> {
        self.resynced.iter().copied().collect()
    }

    /// How `start` ended: a finished resync is reported until management marks the member
    /// good; a stopped one starts again at the next map while the member still needs it.
    pub fn resync_ended(&mut self, start: ResyncStart, finished: bool) {
        let key = (start.group, start.member);
        if self.resyncs.get(&key) == Some(&start.version) {
            self.resyncs.remove(&key);
        }
        if finished {
            self.resynced.insert(GroupMember {
                group: start.group,
                version: start.version,
                member: start.member,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pair as group;

    // Goal: a member that did not take a change the primary applied and then gave up (its
    // lease ran out first) does not stay good without it. The simulator lost a synced write
    // this way: the member stayed good, left later with a record that lacked the change, came
    // back with only what the record named, and was promoted. Method: give a change up before
    // member 2 took it; the member must be reported unreachable at once, under the current
    // version even after the version moves on, and its record must start with the change.
    #[test]
    fn a_member_owed_a_given_up_change_is_reported_and_its_record_starts_with_it() {
        let mut membership = Membership::<()>::new();
        let local = |member: ServerId| member == ServerId(1);
        membership.adopt(
            0,
            1_000,
            vec![(group(Version(1), MemberState::Good), ())],
            local,
        );
        assert!(membership.unreachable(10, 500).is_empty());
        membership.undelivered(GroupId(1), ServerId(2), [77]);
        assert_eq!(
            membership.unreachable(10, 500),
            vec![GroupMember {
                group: GroupId(1),
                version: Version(1),
                member: ServerId(2),
            }]
        );
        membership.adopt(
            20,
            1_000,
            vec![(group(Version(2), MemberState::Good), ())],
            local,
        );
        assert_eq!(
            membership.unreachable(30, 500),
            vec![GroupMember {
                group: GroupId(1),
                version: Version(2),
                member: ServerId(2),
            }],
            "still reported under the new version"
        );
        let adopted = membership.adopt(
            40,
            1_000,
            vec![(group(Version(3), MemberState::Absent), ())],
            local,
        );
        assert_eq!(
            adopted.record_missed,
            vec![(GroupId(1), ServerId(2), vec![77])]
        );
        assert!(membership.unreachable(50, 500).is_empty());
    }

    // Goal: a primary serves only with the version it was routed with and within its lease,
    // and a forward is taken only under the version known.
    #[test]
    fn requests_and_forwards_are_admitted_by_version_and_lease() {
        let mut membership = Membership::<()>::new();
        membership.adopt(
            0,
            100,
            vec![(group(Version(4), MemberState::Good), ())],
            |m| m == ServerId(1),
        );
        assert!(membership
            .admit_primary(50, ServerId(1), GroupId(1), Version(4))
            .is_ok());
        assert_eq!(
            membership
                .admit_primary(50, ServerId(1), GroupId(1), Version(3))
                .err(),
            Some(Refused::WrongVersion { known: Version(4) })
        );
        assert_eq!(
            membership
                .admit_primary(50, ServerId(2), GroupId(1), Version(4))
                .err(),
            Some(Refused::NotPrimary {
                primary: ServerId(1)
            })
        );
        assert_eq!(
            membership
                .admit_primary(100, ServerId(1), GroupId(1), Version(4))
                .err(),
            Some(Refused::NoLease)
        );
        assert!(membership
            .admit_forward(ServerId(2), GroupId(1), Version(4))
            .is_ok());
        assert_eq!(
            membership.admit_forward(ServerId(1), GroupId(1), Version(4)),
            Err(Refused::NotPresent)
        );
        assert_eq!(
            membership.admit_forward(ServerId(2), GroupId(1), Version(5)),
            Err(Refused::WrongVersion { known: Version(4) })
        );
    }
}
