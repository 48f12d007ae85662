//! Management's side: group versions, leases, promotion and member states.

use crate::{
    Group, GroupId, GroupMap, GroupMember, Member, MemberState, Msg, Node, Send, ServerId, Time,
    Timing, Version,
};
use std::collections::BTreeMap;

/// What management keeps durable: published only after it is stored (in the simulator a
/// crash keeps it; in management it is a redb commit).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerDurable {
    /// The groups.
    pub map: GroupMap,
    /// Each server's last boot id, to tell a restart from a late heartbeat.
    pub boots: BTreeMap<ServerId, u64>,
    /// Absent members that were good when they left: only they may come back with a copy of
    /// what they missed rather than of everything.
    pub left_good: std::collections::BTreeSet<(GroupId, ServerId)>,
}

/// Management's group controller.
#[derive(Debug)]
pub struct Controller {
    timing: Timing,
    /// When this incarnation started: nothing is marked offline for a full timeout after.
    started: Time,
    durable: ControllerDurable,
    /// When each server was last heard (volatile; counts as `started` after a restart).
    heard: BTreeMap<ServerId, Time>,
    /// When each member was dropped on its primary's word: it comes back no sooner than a
    /// promotion timeout later, so an unreachable member does not flap in and out.
    dropped: BTreeMap<(GroupId, ServerId), Time>,
    /// Each server's last unsynced-boot id (volatile: after management restarts, a server's
    /// restart counts as one that lost its unsynced writes until it is heard twice).
    unsynced_boots: BTreeMap<ServerId, u64>,
}

impl Controller {
    /// A controller with `groups` (every member good, the first one primary), or with what a
    /// previous incarnation stored.
    pub fn new(timing: Timing, now: Time, durable: ControllerDurable) -> Controller {
        Controller {
            timing,
            started: now,
            durable,
            heard: BTreeMap::new(),
            dropped: BTreeMap::new(),
            unsynced_boots: BTreeMap::new(),
        }
    }

    /// Creates a group of `servers` (the first is primary), all good, at version 1.
    pub fn create_group(&mut self, id: GroupId, servers: &[ServerId]) {
        self.create_group_of(id, servers, false);
    }

    /// Creates a group of `servers` at version 1, the first primary. With `copy_first`, the
    /// first holds data already and the others need a full resync from it before they are
    /// good; otherwise all are good (empty) from the start.
    pub fn create_group_of(&mut self, id: GroupId, servers: &[ServerId], copy_first: bool) {
        let members = servers
            .iter()
            .enumerate()
            .map(|(index, server)| Member {
                server: *server,
                state: if copy_first && index > 0 {
                    MemberState::NeedsResync { full: true }
                } else {
                    MemberState::Good
                },
            })
            .collect();
        self.durable.map.groups.insert(
            id,
            Group {
                id,
                version: Version(1),
                primary: servers[0],
                members,
                loss_epoch: 0,
            },
        );
    }

    /// Removes group `id` (its last member left the cluster, no file uses it): its members
    /// are in no group from the next map on. Answers whether there was one.
    pub fn remove_group(&mut self, id: GroupId) -> bool {
        self.durable.left_good.retain(|(group, _)| *group != id);
        self.dropped.retain(|(group, _), _| *group != id);
        self.durable.map.groups.remove(&id).is_some()
    }

    /// What survives a crash.
    pub fn durable(&self) -> &ControllerDurable {
        &self.durable
    }

    /// The published map.
    pub fn map(&self) -> &GroupMap {
        &self.durable.map
    }

    fn heard(&self, server: ServerId) -> Time {
        self.heard
            .get(&server)
            .copied()
            .unwrap_or(self.started)
            .max(self.started)
    }

    /// A good, online member to take over from `leaving`.
    fn successor(&self, group: &Group, leaving: ServerId, now: Time) -> Option<ServerId> {
        group
            .members
            .iter()
            .filter(|m| m.server != leaving && m.state == MemberState::Good)
            .map(|m| m.server)
            .find(|s| self.online(*s, now))
    }

    fn online(&self, server: ServerId, now: Time) -> bool {
        now.saturating_sub(self.heard(server)) < self.timing.promotion_timeout_ms
    }

    /// Handles a message.
    pub fn handle<D>(&mut self, now: Time, from: Node, msg: Msg<D>) -> Vec<Send<D>> {
        match (from, msg) {
            // Ignored, and answered with no lease.
            (Node::Server(server), Msg::Heartbeat { boot, .. })
                if self.earlier_start(server, boot).is_some() =>
            {
                Vec::new()
            }
            (
                Node::Server(server),
                Msg::Heartbeat {
                    boot,
                    unsynced_boot,
                    sent_at,
                    resynced,
                    unreachable,
                },
            ) => {
                self.heartbeat(now, server, boot, unsynced_boot, &resynced, &unreachable);
                vec![Send {
                    to: Node::Server(server),
                    msg: Msg::HeartbeatAck {
                        sent_at,
                        map: self.durable.map.clone(),
                    },
                }]
            }
            (Node::Client(client), Msg::GetMap) => vec![Send {
                to: Node::Client(client),
                msg: Msg::Map(self.durable.map.clone()),
            }],
            _ => Vec::new(),
        }
    }

    /// The boot id heard from `server` if `boot` is of an earlier start (boot ids grow with
    /// every start): its heartbeat was delivered late and says nothing of the server now.
    /// Taken for a restart, it would promote another member while the primary still holds its
    /// lease; answered with a lease, it would keep a server whose restart went unseen serving.
    pub fn earlier_start(&self, server: ServerId, boot: u64) -> Option<u64> {
        self.durable
            .boots
            .get(&server)
            .copied()
            .filter(|known| boot < *known)
    }

    fn heartbeat(
        &mut self,
        now: Time,
        server: ServerId,
        boot: u64,
        unsynced_boot: u64,
        resynced: &[GroupMember],
        unreachable: &[GroupMember],
    ) {
        if self.earlier_start(server, boot).is_some() {
            return;
        }
        self.heard.insert(server, now);
        // Unknown counts as lost: nothing is claimed kept that management cannot vouch for.
        let kept_unsynced =
            self.unsynced_boots.insert(server, unsynced_boot) == Some(unsynced_boot);
        // A boot never heard before counts as a restart for a member that is out of its
        // group: it may have left before its first heartbeat reached management, and what it
        // had may be gone. (A member still in its group is simply heard for the first time.)
        let absent_somewhere = self.durable.map.groups.values().any(|g| {
            g.member(server)
                .is_some_and(|m| m.state == MemberState::Absent)
        });
        let restarted = match self.durable.boots.insert(server, boot) {
            Some(known) => known != boot,
            None => absent_somewhere,
        };
        let ids: Vec<GroupId> = self.durable.map.groups.keys().copied().collect();
        for id in ids {
            let mut group = self.durable.map.groups[&id].clone();
            let before = group.clone();
            if restarted && group.member(server).is_some() {
                self.member_restarted(&mut group, server, now, kept_unsynced);
            }
            for reported in resynced.iter().filter(|reported| reported.group == id) {
                // Only the primary of this very version vouches for a resync.
                if reported.version == group.version && group.primary == server {
                    set_state(&mut group, reported.member, MemberState::Good, |s| {
                        matches!(s, MemberState::NeedsResync { .. })
                    });
                }
            }
            for reported in unreachable.iter().filter(|reported| reported.group == id) {
                let member = reported.member;
                if reported.version == group.version && group.primary == server && member != server
                {
                    self.make_absent(&mut group, member);
                    self.dropped.insert((id, member), now);
                }
            }
            // An absent member that is heard again comes back to be brought up to date.
            if group
                .member(server)
                .is_some_and(|m| m.state == MemberState::Absent)
                && self
                    .dropped
                    .get(&(id, server))
                    .is_none_or(|at| now.saturating_sub(*at) >= self.timing.promotion_timeout_ms)
            {
                let full = !self.durable.left_good.remove(&(id, server));
                set_state(
                    &mut group,
                    server,
                    MemberState::NeedsResync { full },
                    |_| true,
                );
            }
            let force = restarted && group.member(server).is_some();
            self.publish(group, &before, force);
        }
    }

    /// A member restarted: it is brought up to date from another good member, which becomes
    /// primary if the restarted one was. Unless it `kept_unsynced` (its process restarted
    /// but its host did not, and its writes had reached the kernel) it may have lost the
    /// writes it had not synced.
    fn member_restarted(
        &mut self,
        group: &mut Group,
        server: ServerId,
        now: Time,
        kept_unsynced: bool,
    ) {
        if group.primary == server {
            if let Some(successor) = self.successor(group, server, now) {
                promote(group, successor);
                set_state(
                    group,
                    server,
                    MemberState::NeedsResync { full: true },
                    |_| true,
                );
            } else {
                // No better copy exists: the restarted primary's data is the truth, and every
                // other member is rebuilt from it. Writes it had not synced are gone unless it
                // kept them: then no acknowledged write is lost, and no fsync says so.
                if !kept_unsynced {
                    group.loss_epoch += 1;
                    // A member that left in sync may hold writes the primary lost: what the
                    // primary recorded it missed no longer covers the difference.
                    self.durable.left_good.retain(|(left, _)| *left != group.id);
                }
                let primary = group.primary;
                for member in &mut group.members {
                    if member.server != primary && member.state != MemberState::Absent {
                        member.state = MemberState::NeedsResync { full: true };
                    }
                }
            }
        } else {
            set_state(
                group,
                server,
                MemberState::NeedsResync { full: true },
                |_| true,
            );
        }
    }

    /// Drops silent secondaries and promotes a good secondary over a silent primary.
    pub fn tick<D>(&mut self, now: Time) -> Vec<Send<D>> {
        if now.saturating_sub(self.started) < self.timing.promotion_timeout_ms {
            return Vec::new();
        }
        let ids: Vec<GroupId> = self.durable.map.groups.keys().copied().collect();
        for id in ids {
            let mut group = self.durable.map.groups[&id].clone();
            let before = group.clone();
            let silent: Vec<ServerId> = group
                .members
                .iter()
                .filter(|m| m.state != MemberState::Absent && !self.online(m.server, now))
                .map(|m| m.server)
                .collect();
            for server in silent {
                if server == group.primary {
                    // Without a good member to promote the group waits for its primary.
                    if let Some(successor) = self.successor(&group, server, now) {
                        promote(&mut group, successor);
                        self.make_absent(&mut group, server);
                    }
                } else {
                    self.make_absent(&mut group, server);
                }
            }
            self.publish(group, &before, false);
        }
        Vec::new()
    }

    /// Takes `server` out of `group`, remembering whether it left in sync.
    fn make_absent(&mut self, group: &mut Group, server: ServerId) {
        let Some(member) = group.members.iter_mut().find(|m| m.server == server) else {
            return;
        };
        if member.state == MemberState::Absent {
            return;
        }
        if member.state == MemberState::Good && group.primary != server {
            self.durable.left_good.insert((group.id, server));
        } else {
            self.durable.left_good.remove(&(group.id, server));
        }
        member.state = MemberState::Absent;
    }

    /// Stores `group` under a new version if it changed, or if `force` (a member restarted:
    /// its new writes must be stamped above everything from before), durably before anyone
    /// sees it.
    fn publish(&mut self, mut group: Group, before: &Group, force: bool) {
        assert_eq!(group.id, before.id, "a group is published over another");
        assert!(
            group
                .members
                .iter()
                .any(|member| member.server == group.primary && member.state == MemberState::Good),
            "group {}: primary {:?} is not a good member of {:?}",
            group.id,
            group.primary,
            group.members
        );
        if force
            || group.members != before.members
            || group.primary != before.primary
            || group.loss_epoch != before.loss_epoch
        {
            group.version = before.version.next();
            self.durable.map.groups.insert(group.id, group);
        }
    }
}

fn set_state(
    group: &mut Group,
    server: ServerId,
    state: MemberState,
    only_if: impl Fn(MemberState) -> bool,
) {
    if let Some(member) = group.members.iter_mut().find(|m| m.server == server) {
        if only_if(member.state) {
            member.state = state;
        }
    }
}

/// Makes `successor` primary. Every other present member may hold writes the new primary
/// never got (forwards of the old primary still in flight), so each is copied in full.
fn promote(group: &mut Group, successor: ServerId) {
    group.primary = successor;
    for member in &mut group.members {
        if member.server != successor && member.state != MemberState::Absent {
            member.state = MemberState::NeedsResync { full: true };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TIMING;

    fn heartbeat(controller: &mut Controller, now: Time, server: ServerId, boot: u64) {
        heartbeat_reporting(controller, now, server, boot, Vec::new());
    }

    /// A heartbeat in which `server`, as primary, reports members it cannot reach.
    fn heartbeat_reporting(
        controller: &mut Controller,
        now: Time,
        server: ServerId,
        boot: u64,
        unreachable: Vec<GroupMember>,
    ) {
        let _: Vec<Send<()>> = controller.handle(
            now,
            Node::Server(server),
            Msg::Heartbeat {
                boot,
                unsynced_boot: boot,
                sent_at: now,
                resynced: Vec::new(),
                unreachable,
            },
        );
    }

    // Goal: a silent primary is replaced by its good secondary only after the full promotion
    // timeout, under a new version; a secondary that is resyncing is never promoted.
    #[test]
    fn promotes_only_good_members_after_the_timeout() {
        let mut controller = Controller::new(TIMING, 0, ControllerDurable::default());
        controller.create_group(GroupId(1), &[ServerId(1), ServerId(2)]);
        controller.create_group(GroupId(2), &[ServerId(3), ServerId(4)]);
        for now in (0..=2_000).step_by(100) {
            heartbeat(&mut controller, now, ServerId(2), 1);
            heartbeat(&mut controller, now, ServerId(4), 1);
            if now < 1_000 {
                heartbeat(&mut controller, now, ServerId(1), 1);
                heartbeat(&mut controller, now, ServerId(3), 1);
            }
            if now == 500 {
                // Server 4 restarts: it needs a full resync and cannot be promoted.
                heartbeat(&mut controller, now, ServerId(4), 2);
            }
            let _: Vec<Send<()>> = controller.tick(now);
            let group = &controller.map().groups[&GroupId(1)];
            if now < 1_900 {
                assert_eq!(
                    group.primary,
                    ServerId(1),
                    "no promotion before the timeout ({now} ms)"
                );
            }
        }
        let one = &controller.map().groups[&GroupId(1)];
        assert_eq!(one.primary, ServerId(2), "the good secondary took over");
        assert!(one.version > Version(1));
        assert_eq!(
            one.member(ServerId(1)).map(|m| m.state),
            Some(MemberState::Absent)
        );
        let two = &controller.map().groups[&GroupId(2)];
        assert_eq!(
            two.primary,
            ServerId(3),
            "a resyncing member is never promoted"
        );
    }

    // Goal: after management restarts it marks nothing offline for a full timeout, even for
    // servers it has not heard from since.
    #[test]
    fn waits_a_full_timeout_after_its_own_restart() {
        let mut first = Controller::new(TIMING, 0, ControllerDurable::default());
        first.create_group(GroupId(1), &[ServerId(1), ServerId(2)]);
        let stored = first.durable().clone();
        let mut restarted = Controller::new(TIMING, 10_000, stored);
        let _: Vec<Send<()>> = restarted.tick(10_900);
        assert_eq!(
            restarted.map().groups[&GroupId(1)].version,
            Version(1),
            "nothing changed yet"
        );
        heartbeat(&mut restarted, 10_950, ServerId(2), 1);
        let _: Vec<Send<()>> = restarted.tick(11_000);
        let group = &restarted.map().groups[&GroupId(1)];
        assert_eq!(
            group.primary,
            ServerId(2),
            "then the silent primary is replaced"
        );
    }

    // Goal: a heartbeat of a server's earlier start that arrives after its current start's is
    // not taken for a restart: the primary keeps its role (it holds a lease) and the group
    // its version. Found by the simulator (seed 949 with plain objects): a stalled heartbeat
    // made management promote the other member while the primary still served.
    #[test]
    fn a_late_heartbeat_of_an_earlier_start_is_ignored() {
        let mut c = Controller::new(TIMING, 0, ControllerDurable::default());
        c.create_group(GroupId(1), &[ServerId(1), ServerId(2)]);
        heartbeat(&mut c, 0, ServerId(1), 7);
        heartbeat(&mut c, 0, ServerId(2), 1);
        let before = c.map().groups[&GroupId(1)].clone();
        heartbeat(&mut c, 200, ServerId(1), 6);
        heartbeat(&mut c, 200, ServerId(2), 1);
        assert_eq!(
            c.map().groups[&GroupId(1)],
            before,
            "the late heartbeat of boot 6 changed nothing: server 1 stays primary"
        );
        heartbeat(&mut c, 300, ServerId(1), 8);
        assert_eq!(
            c.map().groups[&GroupId(1)].primary,
            ServerId(2),
            "a newer boot is a restart"
        );
    }

    // Goal: a member that left in sync, holding writes its primary then lost in a crash (no
    // good copy was left, so the restarted primary kept its role and the loss epoch moved),
    // is copied in full when it comes back, not only what the primary recorded it missed: it
    // may hold writes the primary no longer has.
    #[test]
    fn a_member_that_left_in_sync_is_copied_in_full_after_its_primary_lost_writes() {
        let mut c = Controller::new(TIMING, 0, ControllerDurable::default());
        c.create_group(GroupId(1), &[ServerId(1), ServerId(2)]);
        heartbeat(&mut c, 0, ServerId(1), 1);
        heartbeat(&mut c, 0, ServerId(2), 1);
        heartbeat_reporting(
            &mut c,
            100,
            ServerId(1),
            1,
            vec![GroupMember {
                group: GroupId(1),
                version: Version(1),
                member: ServerId(2),
            }],
        );
        assert_eq!(
            c.map().groups[&GroupId(1)]
                .member(ServerId(2))
                .map(|m| m.state),
            Some(MemberState::Absent)
        );
        // The primary's host crashes and it comes back alone: its unsynced writes are gone.
        heartbeat(&mut c, 200, ServerId(1), 2);
        assert_eq!(c.map().groups[&GroupId(1)].loss_epoch, 1);
        heartbeat(&mut c, 1_200, ServerId(1), 2);
        heartbeat(&mut c, 1_200, ServerId(2), 1);
        assert_eq!(
            c.map().groups[&GroupId(1)]
                .member(ServerId(2))
                .map(|m| m.state),
            Some(MemberState::NeedsResync { full: true })
        );
    }

    // Goal: a member dropped on its primary's word that comes back with another boot id —
    // or with one management never heard, as when it restarted before its first heartbeat —
    // is copied in full, not only what its primary recorded.
    #[test]
    fn a_dropped_member_that_restarted_needs_a_full_resync() {
        let mut c = Controller::new(TIMING, 0, ControllerDurable::default());
        c.create_group(GroupId(2), &[ServerId(5), ServerId(2)]);
        heartbeat(&mut c, 0, ServerId(5), 1);
        heartbeat(&mut c, 0, ServerId(2), 1);
        heartbeat_reporting(
            &mut c,
            100,
            ServerId(5),
            1,
            vec![GroupMember {
                group: GroupId(2),
                version: Version(1),
                member: ServerId(2),
            }],
        );
        assert_eq!(
            c.map().groups[&GroupId(2)]
                .member(ServerId(2))
                .map(|m| m.state),
            Some(MemberState::Absent)
        );
        heartbeat(&mut c, 200, ServerId(2), 2);
        heartbeat(&mut c, 2_000, ServerId(2), 2);
        assert_eq!(
            c.map().groups[&GroupId(2)]
                .member(ServerId(2))
                .map(|m| m.state),
            Some(MemberState::NeedsResync { full: true })
        );

        let mut c = Controller::new(TIMING, 0, ControllerDurable::default());
        c.create_group(GroupId(2), &[ServerId(5), ServerId(2)]);
        heartbeat(&mut c, 0, ServerId(5), 1);
        heartbeat_reporting(
            &mut c,
            100,
            ServerId(5),
            1,
            vec![GroupMember {
                group: GroupId(2),
                version: Version(1),
                member: ServerId(2),
            }],
        );
        heartbeat(&mut c, 2_000, ServerId(2), 7);
        heartbeat(&mut c, 2_100, ServerId(2), 7);
        assert_eq!(
            c.map().groups[&GroupId(2)]
                .member(ServerId(2))
                .map(|m| m.state),
            Some(MemberState::NeedsResync { full: true }),
            "never heard before it left"
        );
    }

    // Goal: a primary that restarts while no other member is good stays primary; the loss
    // epoch (which makes fsync report writes lost) moves only when the restart lost what it
    // had not synced: not for a process restart whose writes were in the kernel already.
    #[test]
    fn a_lone_primary_bumps_the_loss_epoch_only_when_it_lost_unsynced_writes() {
        let mut c = Controller::new(TIMING, 0, ControllerDurable::default());
        c.create_group(GroupId(1), &[ServerId(5), ServerId(2)]);
        let beat = |c: &mut Controller, now: Time, server: ServerId, boots: (u64, u64)| {
            let _: Vec<Send<()>> = c.handle(
                now,
                Node::Server(server),
                Msg::Heartbeat {
                    boot: boots.0,
                    unsynced_boot: boots.1,
                    sent_at: now,
                    resynced: Vec::new(),
                    unreachable: Vec::new(),
                },
            );
        };
        beat(&mut c, 0, ServerId(5), (1, 1));
        beat(&mut c, 0, ServerId(2), (1, 1));
        // The secondary restarts: it needs a resync, so no member could take over.
        beat(&mut c, 100, ServerId(2), (2, 2));
        beat(&mut c, 200, ServerId(5), (2, 1));
        let group = &c.map().groups[&GroupId(1)];
        assert_eq!(group.primary, ServerId(5));
        assert_eq!(
            group.loss_epoch, 0,
            "the process restarted, the host kept its writes"
        );
        beat(&mut c, 300, ServerId(5), (3, 3));
        assert_eq!(
            c.map().groups[&GroupId(1)].loss_epoch,
            1,
            "the host restarted"
        );
    }
}
