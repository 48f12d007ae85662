//! Mirror groups in management: one [`Controller`] per kind (storage targets, metadata nodes)
//! decides versions, primaries and member states; every change is committed to the store
//! before anyone sees it (a heartbeat answer, the cluster map).
//!
//! Storage groups are driven by the storage servers' heartbeats: each target of a server is a
//! member heard with the server's boot id; a primary silent for the promotion timeout is
//! replaced by a good member, a restarted member comes back as `needs-resync`. Metadata groups
//! are driven the same way by the metadata servers' heartbeats, each node its own member.

use crate::store::MgmtStore;
use crate::MgmtError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_mirror::{Controller, Group, GroupId, MemberState, Msg, Node, Timing};
use weft_proto::ids::{MemberId, NodeId, TargetId};
use weft_proto::messages::{MirrorHeartbeat, MirrorKind};

/// A commit of the groups' state slower than this is logged.
const SLOW_COMMIT: Duration = Duration::from_secs(1);

/// Most a server's clock may run ahead of management's within a lease.
const LEASE_MARGIN: Duration = Duration::from_millis(weft_mirror::LEASE_MARGIN_MS);

pub(crate) struct Mirrors {
    started: Instant,
    promotion_timeout: Duration,
    storage: Mutex<Controller>,
    meta: Mutex<Controller>,
}

impl Mirrors {
    /// The groups as stored; promotion after `promotion_timeout` of silence.
    pub fn open(store: &MgmtStore, promotion_timeout: Duration) -> Result<Mirrors, MgmtError> {
        let timing = Timing {
            heartbeat_ms: 0,
            lease_ms: 0,
            promotion_timeout_ms: promotion_timeout.as_millis() as u64,
            member_timeout_ms: 0,
            retry_ms: 0,
        };
        let controller = |kind| -> Result<Mutex<Controller>, MgmtError> {
            Ok(Mutex::new(Controller::new(
                timing,
                0,
                store.mirror_state(kind)?,
            )))
        };
        Ok(Mirrors {
            started: Instant::now(),
            promotion_timeout,
            storage: controller(MirrorKind::Storage)?,
            meta: controller(MirrorKind::Meta)?,
        })
    }

    fn controller(&self, kind: MirrorKind) -> &Mutex<Controller> {
        match kind {
            MirrorKind::Storage => &self.storage,
            MirrorKind::Meta => &self.meta,
        }
    }

    /// Milliseconds since management started: the controllers' clock.
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Every group of `kind`, in id order.
    pub fn groups(&self, kind: MirrorKind) -> Vec<Group> {
        let controller = self.controller(kind).lock().expect("mirror lock poisoned");
        controller.map().groups.values().cloned().collect()
    }

    /// Creates groups of these members (the first of each primary), all good at version 1,
    /// committed before they are returned.
    pub fn create(
        &self,
        store: &MgmtStore,
        kind: MirrorKind,
        groups: &[Vec<MemberId>],
    ) -> Result<Vec<Group>, MgmtError> {
        let mut controller = self.controller(kind).lock().expect("mirror lock poisoned");
        // Never the id of a group removed since: a client or a file's tombstone may still
        // name it.
        let mut next = controller
            .map()
            .groups
            .keys()
            .last()
            .copied()
            .unwrap_or(GroupId(0))
            .max(GroupId(store.last_mirror_group(kind)?));
        let mut ids = Vec::new();
        for members in groups {
            next = GroupId(next.0 + 1);
            // A metadata home holds its namespace already: the other members start as copies
            // that need it in full.
            controller.create_group_of(next, members, kind == MirrorKind::Meta);
            ids.push(next);
        }
        store.save_mirror_state(kind, controller.durable())?;
        Ok(ids
            .iter()
            .map(|id| controller.map().groups[id].clone())
            .collect())
    }

    /// Removes storage mirror group `id`, committed before it returns: its members are in no
    /// group from the next map on (the caller checked that no file uses it).
    pub fn dissolve(&self, store: &MgmtStore, id: GroupId) -> Result<(), MgmtError> {
        let mut controller = self
            .controller(MirrorKind::Storage)
            .lock()
            .expect("mirror lock poisoned");
        // Its id counted as given before it goes, so no later group gets it.
        store.note_mirror_group(MirrorKind::Storage, id.0)?;
        if controller.remove_group(id) {
            store.save_mirror_state(MirrorKind::Storage, controller.durable())?;
        }
        Ok(())
    }

    /// A server's heartbeat for its `members` (a storage server's targets, or a metadata
    /// node itself): every member in a group is heard. The lease granted leaves a heartbeat
    /// interval and a margin before the promotion timeout, so a primary has stopped serving
    /// before anyone else may be promoted. Returns the lease and the groups of the members,
    /// after any change is committed, and the changes as events.
    pub fn heartbeat(
        &self,
        store: &MgmtStore,
        kind: MirrorKind,
        members: &[MemberId],
        heartbeat: MirrorHeartbeat,
    ) -> Result<(Duration, Vec<Group>, Vec<String>), MgmtError> {
        let interval = Duration::from_millis(heartbeat.interval_ms);
        let lease = self
            .promotion_timeout
            .saturating_sub(interval)
            .saturating_sub(LEASE_MARGIN);
        let mut controller = self.controller(kind).lock().expect("mirror lock poisoned");
        for member in members {
            if let Some(known) = controller.earlier_start(*member, heartbeat.boot) {
                return Err(MgmtError::EarlierStart {
                    member: *member,
                    boot: heartbeat.boot,
                    known,
                });
            }
        }
        let before = controller.map().clone();
        let now = self.now();
        let mine = |group: &Group| group.members.iter().any(|m| members.contains(&m.server));
        // Every member is heard, grouped or not, so a restart is told from its boot id even
        // for one that joins a group later.
        for member in members {
            let _: Vec<weft_mirror::Send<()>> = controller.handle(
                now,
                Node::Server(*member),
                Msg::Heartbeat {
                    boot: heartbeat.boot,
                    unsynced_boot: heartbeat.unsynced_boot,
                    sent_at: now,
                    resynced: heartbeat.resynced.clone(),
                    unreachable: heartbeat.unreachable.clone(),
                },
            );
        }
        let events = self.commit_changes(store, kind, &controller, &before)?;
        let groups = controller
            .map()
            .groups
            .values()
            .filter(|g| mine(g))
            .cloned()
            .collect();
        Ok((lease, groups, events))
    }

    /// Replaces silent primaries and drops silent members of every group; returns the
    /// changes as events, after they are committed.
    pub fn tick(&self, store: &MgmtStore) -> Result<Vec<String>, MgmtError> {
        let mut events = Vec::new();
        for kind in [MirrorKind::Storage, MirrorKind::Meta] {
            let mut controller = self.controller(kind).lock().expect("mirror lock poisoned");
            let before = controller.map().clone();
            let _: Vec<weft_mirror::Send<()>> = controller.tick(self.now());
            events.extend(self.commit_changes(store, kind, &controller, &before)?);
        }
        Ok(events)
    }

    /// Commits the controller's state if a group changed; describes every change.
    fn commit_changes(
        &self,
        store: &MgmtStore,
        kind: MirrorKind,
        controller: &Controller,
        before: &weft_mirror::GroupMap,
    ) -> Result<Vec<String>, MgmtError> {
        let changed: Vec<&Group> = controller
            .map()
            .groups
            .values()
            .filter(|g| before.groups.get(&g.id) != Some(*g))
            .collect();
        if changed.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        store.save_mirror_state(kind, controller.durable())?;
        if started.elapsed() > SLOW_COMMIT {
            // Heartbeats wait for it: leases may run out meanwhile.
            tracing::warn!(elapsed = ?started.elapsed(), "storing a mirror group change was slow");
        }
        Ok(changed
            .into_iter()
            .map(|group| describe_change(kind, group, before.groups.get(&group.id)))
            .collect())
    }
}

/// Says what changed in a group, for events and logs.
fn describe_change(kind: MirrorKind, group: &Group, before: Option<&Group>) -> String {
    let noun = match kind {
        MirrorKind::Storage => "target",
        MirrorKind::Meta => "metadata node",
    };
    let mut changes = Vec::new();
    if before.is_some_and(|b| b.primary != group.primary) {
        changes.push(format!("{noun} {} is primary", group.primary));
    }
    for member in &group.members {
        let was = before
            .and_then(|b| b.member(member.server))
            .map(|m| m.state);
        if was != Some(member.state) {
            let state = match member.state {
                MemberState::Good => "good",
                MemberState::NeedsResync { full: true } => "needs a full resync",
                MemberState::NeedsResync { full: false } => "needs a resync",
                MemberState::Absent => "absent",
            };
            changes.push(format!("{noun} {} {state}", member.server));
        }
    }
    if changes.is_empty() {
        changes.push("a member restarted".to_string());
    }
    format!(
        "{} mirror group {} version {}: {}",
        <&str>::from(kind),
        group.id,
        group.version,
        changes.join(", ")
    )
}

/// Group members by node, for publishing.
pub(crate) fn nodes_of_targets(
    targets: &[(TargetId, crate::store::TargetRecord)],
) -> HashMap<MemberId, NodeId> {
    targets
        .iter()
        .map(|(target, record)| (MemberId::from(*target), record.node))
        .collect()
}
