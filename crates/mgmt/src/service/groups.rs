//! Mirror groups: created by hand or paired across nodes, checked, and their resyncs reported.

use super::*;

impl Mgmt {
    pub(super) fn get_resync_stats(&self) -> Reply<MgmtResponse> {
        let storage = self.mirrors.groups(MirrorKind::Storage);
        let meta = self.mirrors.groups(MirrorKind::Meta);
        let resyncing = |kind: MirrorKind, group: GroupId, member: MemberId| {
            let groups = match kind {
                MirrorKind::Storage => &storage,
                MirrorKind::Meta => &meta,
            };
            groups.iter().any(|g| {
                g.id == group
                    && g.member(member).is_some_and(|m| {
                        matches!(m.state, weft_mirror::MemberState::NeedsResync { .. })
                    })
            })
        };
        let mut live = self.live.lock().expect("live state poisoned");
        live.resyncs
            .retain(|(kind, group, member), _| resyncing(*kind, *group, *member));
        let mut stats: Vec<ResyncProgress> = live.resyncs.values().copied().collect();
        stats.sort_by_key(|p| (p.kind == MirrorKind::Meta, p.group, p.member));
        Ok(MgmtResponse::ResyncStats(stats))
    }

    pub(super) fn create_mirror_group(
        &self,
        kind: MirrorKind,
        members: Vec<MemberId>,
    ) -> Reply<MgmtResponse> {
        let _creating = self.mirror_lock.lock().expect("mirror lock poisoned");
        let candidates = self.mirror_candidates(kind).map_err(internal)?;
        let group = check_mirror_group(kind, &members, &candidates)?;
        if kind == MirrorKind::Storage {
            pools::check_group_pool(&self.store, &members).map_err(refused)?;
        }
        self.check_meta_copies(kind, std::slice::from_ref(&group))?;
        let created = self.create_groups(kind, &[group]).map_err(internal)?;
        for group in &created {
            self.monitor.event(false, describe_group(group, "created"));
        }
        Ok(MgmtResponse::MirrorGroups(created))
    }

    pub(super) fn auto_create_mirror_groups(&self, kind: MirrorKind) -> Reply<MgmtResponse> {
        let _creating = self.mirror_lock.lock().expect("mirror lock poisoned");
        let candidates = self.mirror_candidates(kind).map_err(internal)?;
        // Storage targets pair within their pool: a group belongs to one.
        let pool_of: HashMap<MemberId, StoragePoolId> = match kind {
            MirrorKind::Storage => self
                .store
                .targets()
                .map_err(internal)?
                .into_iter()
                .map(|(target, record)| (MemberId::from(target), record.pool))
                .collect(),
            MirrorKind::Meta => HashMap::new(),
        };
        let mut by_pool: std::collections::BTreeMap<StoragePoolId, Vec<(MemberId, NodeId)>> =
            Default::default();
        for candidate in candidates {
            let pool = pool_of
                .get(&candidate.0)
                .copied()
                .unwrap_or(StoragePoolId::DEFAULT);
            by_pool.entry(pool).or_default().push(candidate);
        }
        let groups: Vec<_> = by_pool
            .values()
            .flat_map(|candidates| pair_across_nodes(candidates))
            .collect();
        self.check_meta_copies(kind, &groups)?;
        let created = self.create_groups(kind, &groups).map_err(internal)?;
        for group in &created {
            self.monitor.event(false, describe_group(group, "created"));
        }
        Ok(MgmtResponse::MirrorGroups(created))
    }

    /// Creates groups of (member, node) lists, the first member primary.
    pub(super) fn create_groups(
        &self,
        kind: MirrorKind,
        groups: &[Vec<(MemberId, NodeId)>],
    ) -> Result<Vec<MirrorGroupInfo>, MgmtError> {
        let members: Vec<Vec<MemberId>> = groups
            .iter()
            .map(|group| group.iter().map(|(member, _)| *member).collect())
            .collect();
        let nodes: HashMap<MemberId, NodeId> = groups.iter().flatten().copied().collect();
        let created = self.mirrors.create(&self.store, kind, &members)?;
        Ok(created
            .iter()
            .map(|group| published(kind, group, |m| nodes[&m]))
            .collect())
    }

    /// Refuses metadata groups whose members after the first hold inodes: they become copies
    /// of the first's home, and what they hold would be lost.
    pub(super) fn check_meta_copies(
        &self,
        kind: MirrorKind,
        groups: &[Vec<(MemberId, NodeId)>],
    ) -> Result<(), WireError> {
        if kind != MirrorKind::Meta {
            return Ok(());
        }
        let live = self.live.lock().expect("live state poisoned");
        for members in groups {
            for (member, _) in members.iter().skip(1) {
                match live.meta_usage.get(&NodeId::from(*member)) {
                    Some((_, 0)) => {}
                    Some((_, inodes)) => {
                        return Err(WireError::new(ErrorCode::InvalidArgument, format!(
                            "metadata node {member} holds {inodes} inodes: a metadata mirror group's members after the first become copies of the first's namespace, so they must be empty; list a node that holds data first"
                        )))
                    }
                    None => {
                        return Err(WireError::new(ErrorCode::Unavailable, format!(
                            "metadata node {member} has not reported how many inodes it holds yet; try again after its next heartbeat"
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    /// Every mirror group of both kinds, as published.
    pub(super) fn mirror_groups(
        &self,
        targets: &[(TargetId, crate::store::TargetRecord)],
    ) -> Vec<MirrorGroupInfo> {
        let nodes = nodes_of_targets(targets);
        let mut out: Vec<MirrorGroupInfo> = self
            .mirrors
            .groups(MirrorKind::Storage)
            .iter()
            .map(|group| {
                published(MirrorKind::Storage, group, |target| {
                    nodes.get(&target).copied().unwrap_or(NodeId(0))
                })
            })
            .collect();
        out.extend(
            self.mirrors
                .groups(MirrorKind::Meta)
                .iter()
                .map(|group| published(MirrorKind::Meta, group, NodeId::from)),
        );
        out
    }

    /// Members of `kind` not in a group yet, each with its node, in id order.
    pub(super) fn mirror_candidates(
        &self,
        kind: MirrorKind,
    ) -> Result<Vec<(MemberId, NodeId)>, MgmtError> {
        let grouped: std::collections::HashSet<MemberId> = self
            .mirrors
            .groups(kind)
            .iter()
            .flat_map(|g| g.members.iter().map(|m| m.server))
            .collect();
        let mut all: Vec<(MemberId, NodeId)> = match kind {
            MirrorKind::Storage => self
                .store
                .targets()?
                .into_iter()
                .map(|(target, record)| (MemberId::from(target), record.node))
                .collect(),
            MirrorKind::Meta => self
                .store
                .nodes()?
                .into_iter()
                .filter(|(node_kind, _, _)| *node_kind == NodeKind::Meta)
                .map(|(_, node, _)| (MemberId::from(node), node))
                .collect(),
        };
        all.retain(|(id, _)| !grouped.contains(id));
        all.sort();
        Ok(all)
    }
}

/// A group's description for events and logs.
pub(super) fn describe_group(group: &MirrorGroupInfo, what: &str) -> String {
    let members: Vec<String> = group.members.iter().map(|m| m.id.to_string()).collect();
    format!(
        "{} mirror group {} {what}: members {} (primary {})",
        <&str>::from(group.kind),
        group.id,
        members.join(", "),
        group.primary
    )
}

/// Checks a requested group against the members still free; returns (member, node) pairs.
pub(super) fn check_mirror_group(
    kind: MirrorKind,
    members: &[MemberId],
    candidates: &[(MemberId, NodeId)],
) -> Result<Vec<(MemberId, NodeId)>, WireError> {
    let noun = match kind {
        MirrorKind::Storage => "storage target",
        MirrorKind::Meta => "metadata node",
    };
    let invalid = |message: String| Err(WireError::new(ErrorCode::InvalidArgument, message));
    if members.len() < 2 || members.len() > MIRROR_MEMBERS_MAX {
        return invalid(format!(
            "a mirror group has 2 to {MIRROR_MEMBERS_MAX} members, not {}",
            members.len()
        ));
    }
    let mut group = Vec::new();
    for member in members {
        let Some(found) = candidates.iter().find(|(id, _)| id == member) else {
            return invalid(format!(
                "{noun} {member} is not registered or already in a mirror group (weft mirror list)"
            ));
        };
        if group.iter().any(|(_, node)| *node == found.1) {
            return invalid(format!(
                "{noun} {member} is on the same node as another member: a mirror must survive the loss of a node"
            ));
        }
        group.push(*found);
    }
    Ok(group)
}

/// Pairs free members two by two, never two on one node: each round takes one from each of
/// the two nodes with the most left.
pub(super) fn pair_across_nodes(candidates: &[(MemberId, NodeId)]) -> Vec<Vec<(MemberId, NodeId)>> {
    let mut by_node: std::collections::BTreeMap<NodeId, Vec<MemberId>> = Default::default();
    for (member, node) in candidates {
        by_node.entry(*node).or_default().push(*member);
    }
    for members in by_node.values_mut() {
        members.reverse(); // pop the lowest id first
    }
    let mut groups = Vec::new();
    loop {
        let mut nodes: Vec<(usize, NodeId)> = by_node
            .iter()
            .filter(|(_, members)| !members.is_empty())
            .map(|(node, members)| (members.len(), *node))
            .collect();
        if nodes.len() < 2 {
            return groups;
        }
        nodes.sort_by_key(|(left, node)| (std::cmp::Reverse(*left), *node));
        let mut group = Vec::new();
        for (_, node) in &nodes[..2] {
            let member = by_node
                .get_mut(node)
                .and_then(Vec::pop)
                .expect("nodes listed have members left");
            group.push((member, *node));
        }
        groups.push(group);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    // Goal: a mirror group survives the loss of a node: members on one node, too few
    // members, or a target already in a group are refused; autocreate pairs the free targets
    // across nodes, each pair on two nodes, and leaves none paired twice.
    #[test]
    fn mirror_groups_span_nodes() {
        let fixture = testing::mgmt();
        let nodes: Vec<NodeId> = (1..=3)
            .map(|n| fixture.node(NodeKind::Storage, &format!("storage-{n}")))
            .collect();
        let targets: Vec<(TargetId, NodeId)> = nodes
            .iter()
            .flat_map(|node| {
                [
                    (fixture.target(*node), *node),
                    (fixture.target(*node), *node),
                ]
            })
            .collect();
        let member = |index: usize| MemberId::from(targets[index].0);
        let create = |members: Vec<MemberId>| MgmtRequest::CreateMirrorGroup {
            kind: MirrorKind::Storage,
            members,
        };
        assert_eq!(
            fixture.refused(create(vec![member(0), member(1)])),
            ErrorCode::InvalidArgument,
            "two targets of one node"
        );
        assert_eq!(
            fixture.refused(create(vec![member(0)])),
            ErrorCode::InvalidArgument,
            "one member"
        );
        fixture
            .ask(create(vec![member(0), member(2)]))
            .expect("a group across two nodes");
        assert_eq!(
            fixture.refused(create(vec![member(0), member(4)])),
            ErrorCode::InvalidArgument,
            "a member already in a group"
        );
        let Ok(MgmtResponse::MirrorGroups(created)) =
            fixture.ask(MgmtRequest::AutoCreateMirrorGroups {
                kind: MirrorKind::Storage,
            })
        else {
            panic!("autocreate answers its groups");
        };
        assert_eq!(
            created.len(),
            2,
            "the four free targets paired: {created:?}"
        );
        let node_of = |member: MemberId| {
            targets
                .iter()
                .find(|(target, _)| MemberId::from(*target) == member)
                .expect("a registered target")
                .1
        };
        let mut seen = vec![member(0), member(2)];
        for group in &created {
            let members: Vec<MemberId> = group.members.iter().map(|m| m.id).collect();
            assert_ne!(node_of(members[0]), node_of(members[1]), "{group:?}");
            for member in members {
                assert!(!seen.contains(&member), "{member} paired twice");
                seen.push(member);
            }
        }
    }
}
