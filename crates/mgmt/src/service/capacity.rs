//! Storage pools, drains and target removal: where new files go and how targets leave.

use super::*;

impl Mgmt {
    /// Makes a pool change, notes it in the event log and answers it.
    pub(super) fn pool_change(
        &self,
        change: impl FnOnce() -> Result<pools::Changed, pools::Refused>,
    ) -> Reply<MgmtResponse> {
        let changed = change().map_err(refused)?;
        tracing::info!(event = %changed.event, "storage pools changed");
        self.monitor.event(false, changed.event);
        Ok(changed.response)
    }

    /// The files of draining `target` that the metadata homes found unable to move off,
    /// summed over the homes, with the first reason told.
    pub(super) fn drain_blocked(
        &self,
        target: TargetId,
    ) -> Option<weft_proto::messages::DrainBlock> {
        let live = self.live.lock().expect("live state poisoned");
        let mut blocks = live
            .drain_blocked
            .values()
            .flatten()
            .filter(|block| block.target == target);
        let first = blocks.next()?.clone();
        let more: u64 = blocks.map(|block| block.files).sum();
        Some(weft_proto::messages::DrainBlock {
            files: first.files + more,
            ..first
        })
    }

    /// `weft target drain`: marks the target (or unmarks it, with `stop`); the map carries it
    /// to the metadata servers, which move their files off it.
    pub(super) fn drain_target(&self, target: TargetId, stop: bool) -> Reply<MgmtResponse> {
        let map = self.cluster_map().map_err(internal)?;
        if map.target(target).is_none() {
            return Err(WireError::new(
                ErrorCode::NotFound,
                format!("there is no target {target}: `weft target list` shows them"),
            ));
        }
        // A member of a storage mirror group drains its group: the group's files move to
        // other groups (`ClusterMap::slot_placement`).
        let group = map.mirror_group_of_target(target).map(|group| group.id);
        let event = if stop {
            self.store.set_draining(target, None).map_err(internal)?;
            format!("target {target} takes new files again: its drain stopped")
        } else {
            self.store
                .set_draining(target, Some(unix_ms()))
                .map_err(internal)?;
            match group {
                None => format!("target {target} is being drained: new files avoid it and files on it move off"),
                Some(group) => format!("target {target} is being drained: new files avoid its storage mirror group {group}, and files mirrored on the group move to other groups"),
            }
        };
        tracing::info!(%event, "drain");
        self.monitor.event(false, event);
        Ok(MgmtResponse::Done)
    }

    /// How many files still use `target`, draining since `since` (Unix milliseconds): the sum
    /// of what every metadata node told since then, or why it is not known yet.
    pub(super) fn drain_progress(
        &self,
        target: TargetId,
        since: u64,
    ) -> Result<Result<u64, String>, MgmtError> {
        let homes = self.cluster_map()?.all_meta_homes();
        let live = self.live.lock().expect("live state poisoned");
        let mut left = 0;
        for home in homes {
            let told = live.target_uses.get(&home).and_then(|(at, uses)| {
                let left = uses.iter().find(|(t, _)| *t == target)?.1;
                (*at >= since).then_some(left)
            });
            match told {
                Some(uses) => left += uses,
                None => {
                    return Ok(Err(format!(
                        "the metadata server of home {home} has not told yet how many of its files use target {target}: wait for its next heartbeat, or bring it back if it is offline"
                    )))
                }
            }
        }
        Ok(Ok(left))
    }

    /// `weft target remove`: removes a drained target, once every metadata node told, since
    /// its drain began, that none of its files use it.
    pub(super) fn remove_target(&self, target: TargetId) -> Reply<MgmtResponse> {
        let busy = |message: String| Err(WireError::new(ErrorCode::Busy, message));
        let draining = self.store.draining().map_err(internal)?;
        let Some(&since) = draining.get(&target) else {
            return match self.cluster_map().map_err(internal)?.target(target) {
                None => Err(WireError::new(
                    ErrorCode::NotFound,
                    format!("there is no target {target}: `weft target list` shows them"),
                )),
                Some(_) => busy(format!(
                    "target {target} is not drained: `weft target drain {target}` moves its files off first"
                )),
            };
        };
        match self.drain_progress(target, since).map_err(internal)? {
            Ok(0) => {}
            Ok(left) => {
                return busy(format!(
                    "{left} files still use target {target}: their moves go on (`weft target list --state` shows how many are left)"
                ))
            }
            Err(why) => return busy(why),
        }
        // Its storage mirror group holds nothing any more (every file on it moved): it goes
        // with the target, and its other members are free for new groups.
        let group = self
            .cluster_map()
            .map_err(internal)?
            .mirror_group_of_target(target)
            .cloned();
        if let Some(group) = &group {
            // A member that missed changes (the seals of the objects that moved off) would
            // keep them when it joins another group.
            if let Some(behind) = group.members.iter().find(|m| {
                TargetId::from(m.id) != target && m.state != weft_proto::messages::Consistency::Good
            }) {
                return busy(format!(
                    "target {} of storage mirror group {} is {}: the group goes with target {target} once its other members are good (their resync brings them what they missed)",
                    behind.id,
                    group.id,
                    <&str>::from(behind.state)
                ));
            }
            self.mirrors
                .dissolve(&self.store, weft_mirror::GroupId(group.id.0))
                .map_err(internal)?;
        }
        self.store
            .remove_target(target, unix_ms())
            .map_err(internal)?;
        let event = match &group {
            None => format!("target {target} removed from the cluster"),
            Some(group) => {
                let others: Vec<String> = group
                    .members
                    .iter()
                    .filter(|m| TargetId::from(m.id) != target)
                    .map(|m| m.id.to_string())
                    .collect();
                format!(
                    "target {target} removed from the cluster with its storage mirror group {}: targets {} are in no group now (`weft mirror autocreate storage` pairs them again)",
                    group.id,
                    others.join(", ")
                )
            }
        };
        tracing::info!(%event, "drain");
        self.monitor.event(false, event);
        Ok(MgmtResponse::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    // Goal: a drain names a target that exists, and the map carries it to the servers until
    // it is stopped.
    #[test]
    fn a_drain_is_of_a_known_target_and_reaches_the_map() {
        let fixture = testing::mgmt();
        let node = fixture.node(NodeKind::Storage, "storage-1");
        let target = fixture.target(node);
        assert_eq!(
            fixture.refused(MgmtRequest::DrainTarget {
                target: TargetId(9),
                stop: false,
            }),
            ErrorCode::NotFound
        );
        let draining = |fixture: &testing::Fixture| {
            let map = fixture.mgmt.cluster_map().expect("map");
            map.target(target).expect("listed").draining
        };
        fixture
            .ask(MgmtRequest::DrainTarget {
                target,
                stop: false,
            })
            .expect("drain");
        assert!(draining(&fixture), "the map says the target drains");
        fixture
            .ask(MgmtRequest::DrainTarget { target, stop: true })
            .expect("drain stopped");
        assert!(!draining(&fixture), "the drain stopped");
    }
}
