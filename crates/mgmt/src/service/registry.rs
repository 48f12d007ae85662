//! Management's registry: nodes and storage targets register, and their heartbeats report
//! what they hold and use, their mirror groups' state and their quota counts.

use super::*;

/// What a node's heartbeat reports besides its mirror members' state.
pub(super) struct Reports {
    pub targets: Vec<weft_proto::messages::TargetReport>,
    pub meta_usage: Option<SpaceUsage>,
    pub meta_inodes_used: Option<u64>,
    pub quota_usage: Vec<(NodeId, Vec<weft_proto::quota::QuotaUsage>)>,
    pub target_uses: Vec<(NodeId, Vec<(TargetId, u64)>)>,
    pub drain_blocked: Vec<(NodeId, Vec<weft_proto::messages::DrainBlock>)>,
}

impl Mgmt {
    pub(super) fn register_node(
        &self,
        node: Option<NodeId>,
        kind: NodeKind,
        alias: String,
        addresses: Vec<String>,
    ) -> Reply<MgmtResponse> {
        if addresses.is_empty() || addresses.len() > NODE_ADDRESSES_MAX {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!("a node announces 1 to {NODE_ADDRESSES_MAX} addresses"),
            ));
        }
        let record = NodeRecord {
            alias: alias.clone(),
            addresses,
        };
        let node = self
            .store
            .register_node(kind, node, &record)
            .map_err(internal)?;
        let mut live = self.live.lock().expect("live state poisoned");
        let was_known = live
            .last_heard
            .insert((kind, node), Instant::now())
            .is_some();
        tracing::debug!(?kind, node = node.0, addresses = ?record.addresses, "node registered");
        self.monitor.event(
            false,
            format!(
                "{} {alias} ({node}) registered{} at {}",
                match kind {
                    NodeKind::Meta => "metadata node",
                    NodeKind::Storage => "storage node",
                    NodeKind::Management => "management",
                },
                if was_known { " again" } else { "" },
                record.addresses.join(", ")
            ),
        );
        Ok(MgmtResponse::NodeRegistered { node })
    }

    pub(super) fn register_target(
        &self,
        node: NodeId,
        target: Option<TargetId>,
    ) -> Reply<MgmtResponse> {
        if !self
            .store
            .node_exists(NodeKind::Storage, node)
            .map_err(internal)?
        {
            return Err(WireError::new(
                ErrorCode::UnknownNode,
                format!("storage node {node} is not registered"),
            ));
        }
        let target = self
            .store
            .register_target(node, target)
            .map_err(|error| match error {
                MgmtError::TargetRemoved(_) => {
                    WireError::new(ErrorCode::InvalidArgument, error.to_string())
                }
                error => internal(error),
            })?;
        tracing::info!(
            target = target.0,
            node = node.0,
            "storage target registered"
        );
        Ok(MgmtResponse::TargetRegistered { target })
    }

    /// A node's heartbeat: what it reports is noted, and a node with mirror members gets its
    /// groups and its lease.
    pub(super) fn heartbeat(
        &self,
        kind: NodeKind,
        node: NodeId,
        reports: Reports,
        mirror: Option<weft_proto::messages::MirrorHeartbeat>,
    ) -> Reply<MgmtResponse> {
        if !self.store.node_exists(kind, node).map_err(internal)? {
            return Err(WireError::new(
                ErrorCode::UnknownNode,
                format!("{kind:?} node {node} is not registered; register again"),
            ));
        }
        let ids: Vec<TargetId> = reports.targets.iter().map(|t| t.target).collect();
        self.note_reports(kind, node, reports);
        let Some(mirror) = mirror else {
            return Ok(MgmtResponse::HeartbeatAck {
                lease_ms: 0,
                mirror_groups: Vec::new(),
                unix_ms: unix_ms(),
            });
        };
        self.mirror_heartbeat(kind, node, &ids, mirror)
    }

    /// Notes what a node's heartbeat reports: when it was heard, its targets' and its
    /// metadata's space, its homes' quota counts, target uses and files a drain cannot move.
    fn note_reports(&self, kind: NodeKind, node: NodeId, reports: Reports) {
        let Reports {
            targets,
            meta_usage,
            meta_inodes_used,
            quota_usage,
            target_uses,
            drain_blocked,
        } = reports;
        let mut live = self.live.lock().expect("live state poisoned");
        live.last_heard.insert((kind, node), Instant::now());
        for report in targets {
            live.target_usage.insert(report.target, report.usage);
        }
        if let Some(usage) = meta_usage {
            // A server that serves no home yet reports no count: the last stays.
            let known = live.meta_usage.get(&node).map_or(0, |(_, used)| *used);
            live.meta_usage
                .insert(node, (usage, meta_inodes_used.unwrap_or(known)));
        }
        for (home, usage) in quota_usage {
            live.home_usage.insert(home, usage);
        }
        let now = unix_ms();
        for (home, uses) in target_uses {
            // A home that tells its uses and no blocked files has none.
            live.drain_blocked.remove(&home);
            live.target_uses.insert(home, (now, uses));
        }
        for (home, blocked) in drain_blocked {
            live.drain_blocked.insert(home, blocked);
        }
    }

    /// The mirror part of a heartbeat from `node`, whose members are `ids` (its targets, or
    /// itself for a metadata server): the controller hears it, and answers the node's groups
    /// and its lease.
    fn mirror_heartbeat(
        &self,
        kind: NodeKind,
        node: NodeId,
        ids: &[TargetId],
        mirror: weft_proto::messages::MirrorHeartbeat,
    ) -> Reply<MgmtResponse> {
        {
            let mut live = self.live.lock().expect("live state poisoned");
            for progress in &mirror.resyncs {
                live.resyncs
                    .insert((progress.kind, progress.group, progress.member), *progress);
            }
        }
        let (mirror_kind, members): (MirrorKind, Vec<MemberId>) = match kind {
            NodeKind::Meta => (MirrorKind::Meta, vec![MemberId::from(node)]),
            _ => (
                MirrorKind::Storage,
                ids.iter().copied().map(MemberId::from).collect(),
            ),
        };
        let (lease, groups, events) = self
            .mirrors
            .heartbeat(&self.store, mirror_kind, &members, mirror)
            .map_err(|error| match error {
                MgmtError::EarlierStart { .. } => {
                    tracing::warn!(node = node.0, %error, "heartbeat ignored");
                    WireError::new(ErrorCode::Superseded, error.to_string())
                }
                error => internal(error),
            })?;
        for event in events {
            self.monitor.event(true, event);
        }
        // Most storage nodes hold no mirror member: no need to read the targets then.
        let nodes = if groups.is_empty() || mirror_kind == MirrorKind::Meta {
            HashMap::new()
        } else {
            nodes_of_targets(&self.store.targets().map_err(internal)?)
        };
        let node_of = |member: MemberId| match mirror_kind {
            MirrorKind::Meta => NodeId::from(member),
            MirrorKind::Storage => nodes.get(&member).copied().unwrap_or(NodeId(0)),
        };
        // Checked as the lease is granted: a leader cut off from the others must not
        // renew leases another leader could be granting; the node asks another server.
        if !self.store.leads_a_majority() {
            return Err(lost_majority());
        }
        Ok(MgmtResponse::HeartbeatAck {
            unix_ms: unix_ms(),
            lease_ms: lease.as_millis() as u64,
            mirror_groups: groups
                .iter()
                .map(|g| published(mirror_kind, g, node_of))
                .collect(),
        })
    }

    pub(super) fn reachability(&self, last_heard: Option<Instant>) -> Reachability {
        // After a restart every node counts as heard at management's start: nothing is marked
        // offline before a full timeout has passed.
        let heard = last_heard.unwrap_or(self.started).max(self.started);
        let silent = heard.elapsed();
        if silent >= self.offline_timeout {
            Reachability::Offline
        } else if silent >= self.offline_timeout / 2 {
            Reachability::ProbablyOffline
        } else {
            Reachability::Online
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    fn heartbeat(kind: NodeKind, node: NodeId, targets: &[TargetId]) -> MgmtRequest {
        let usage = SpaceUsage {
            total_bytes: 100,
            free_bytes: 60,
            total_inodes: 10,
            free_inodes: 5,
        };
        MgmtRequest::Heartbeat {
            kind,
            node,
            targets: targets
                .iter()
                .map(|target| weft_proto::messages::TargetReport {
                    target: *target,
                    usage,
                })
                .collect(),
            meta_usage: None,
            meta_inodes_used: None,
            mirror: None,
            quota_usage: Vec::new(),
            target_uses: Vec::new(),
            drain_blocked: Vec::new(),
        }
    }

    // Goal: nodes and targets register with ids of their own kind, and only what registered
    // is heard: a node that announces no address, a target of an unknown node and the
    // heartbeat of a node management does not know are refused, saying what to do.
    #[test]
    fn only_registered_nodes_are_heard() {
        let fixture = testing::mgmt();
        let storage = fixture.node(NodeKind::Storage, "storage-1");
        let meta = fixture.node(NodeKind::Meta, "meta-1");
        assert_eq!((storage, meta), (NodeId(1), NodeId(1)), "ids per kind");
        let target = fixture.target(storage);
        assert_eq!(
            fixture.refused(MgmtRequest::RegisterNode {
                node: None,
                kind: NodeKind::Storage,
                alias: "mute".into(),
                addresses: Vec::new(),
            }),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            fixture.refused(MgmtRequest::RegisterTarget {
                node: NodeId(9),
                target: None,
            }),
            ErrorCode::UnknownNode
        );
        match fixture.ask(heartbeat(NodeKind::Storage, storage, &[target])) {
            Ok(MgmtResponse::HeartbeatAck { lease_ms: 0, .. }) => {}
            other => panic!("a node without mirror members: {other:?}"),
        }
        assert_eq!(
            fixture.refused(heartbeat(NodeKind::Storage, NodeId(9), &[])),
            ErrorCode::UnknownNode
        );
        let live = fixture.mgmt.live.lock().expect("live");
        assert_eq!(
            live.target_usage[&target].free_bytes, 60,
            "the usage is noted"
        );
    }
}
