//! The cluster map and status: what management publishes to every node and client, and what
//! `weft cluster status` shows.

use super::*;

impl Mgmt {
    pub(super) fn get_cluster_status(&self, client_name: Option<&str>) -> Reply<MgmtResponse> {
        let status = self.cluster_status().map_err(internal)?;
        // A client learns the cluster's state, not the other sessions' load or every
        // user's quota use.
        Ok(MgmtResponse::ClusterStatus(match client_name {
            Some(_) => status.without_details(),
            None => status,
        }))
    }

    /// The map for a watcher of the map. A change wakes every node at once, and each fetches
    /// the map: one built for another watcher in the last [`WATCHED_MAP_SHARED_FOR`], with
    /// the epoch current now, serves them all, instead of one build from the store per node.
    /// (A fetch by request, `GetClusterMap`, always builds the map afresh.)
    pub(super) fn watched_map(&self, from: &weft_net::auth::Identity) -> Reply<MgmtResponse> {
        let map = {
            let mut watched = self.watched.lock().expect("watched map poisoned");
            let current = *self.map_epoch.borrow();
            match watched.as_ref() {
                Some((built, map))
                    if map.epoch == current && built.elapsed() < WATCHED_MAP_SHARED_FOR =>
                {
                    Arc::clone(map)
                }
                _ => {
                    let map = Arc::new(self.cluster_map().map_err(internal)?);
                    *watched = Some((Instant::now(), Arc::clone(&map)));
                    map
                }
            }
        };
        let mut map = ClusterMap::clone(&map);
        if let weft_net::auth::Identity::Client(name) = from {
            as_seen_by(&mut map, Some(name));
        }
        Ok(MgmtResponse::ClusterMap(map))
    }

    /// Publishes the map under a new epoch, waking its watchers, when what routing and
    /// placement follow changed since it was last published.
    pub(super) fn publish_map(&self) {
        if let Err(error) = self.run_quota_grace() {
            tracing::warn!(%error, "cannot run the grace periods of quotas");
        }
        if let Err(error) = self.cluster_map() {
            tracing::warn!(%error, "cannot read the cluster map to publish it");
        }
    }

    /// Gives `map` its epoch: a new one, which wakes the map's watchers, when what routing
    /// and placement follow changed since the last map made. So every map anyone is given
    /// has the epoch of what it holds, and a change is published by the first map made
    /// after it, whoever asked.
    pub(super) fn stamp(&self, map: &mut ClusterMap) {
        let shape = map_shape(map);
        let mut last = self.map_shape.lock().expect("map shape poisoned");
        if *last != shape {
            *last = shape;
            self.map_epoch.send_modify(|epoch| *epoch += 1);
        }
        map.epoch = *self.map_epoch.borrow();
    }

    pub(super) fn cluster_map(&self) -> Result<ClusterMap, MgmtError> {
        let nodes = self.store.nodes()?;
        let targets = self.store.targets()?;
        let draining = self.store.draining()?;
        let mirror_groups = self.mirror_groups(&targets);
        let clients = self.store.clients()?;
        let states = self.quota_states()?;
        let quota_hard = states
            .iter()
            .filter(|state| state.rule.limits.hard_bytes > 0 || state.rule.limits.hard_inodes > 0)
            .map(|state| weft_proto::quota::QuotaHard {
                key: weft_proto::quota::QuotaKey {
                    kind: state.rule.kind,
                    id: state.rule.id,
                    pool: state.rule.pool,
                },
                bytes: state.rule.limits.hard_bytes,
                inodes: state.rule.limits.hard_inodes,
            })
            .collect();
        let quota_blocked = states
            .into_iter()
            .filter(|state| state.bytes_blocked || state.inodes_blocked)
            .map(|state| weft_proto::quota::QuotaBlock {
                kind: state.rule.kind,
                id: state.rule.id,
                pool: state.rule.pool,
                bytes: state.bytes_blocked,
                inodes: state.inodes_blocked,
            })
            .collect();
        // Taken after the quota states, which take it too.
        let live = self.live.lock().expect("live state poisoned");
        let mut map = ClusterMap {
            mirror_groups,
            clients: self.store.client_rules()?,
            pools: self.store.pools()?,
            quota_blocked,
            quota_hard,
            ..ClusterMap::default()
        };
        for (kind, id, record) in nodes {
            let meta = if kind == NodeKind::Meta {
                live.meta_usage.get(&id).copied()
            } else {
                None
            };
            map.nodes.push(NodeInfo {
                id,
                kind,
                alias: record.alias,
                addresses: record.addresses,
                reachability: self.reachability(live.last_heard.get(&(kind, id)).copied()),
                meta_usage: meta.map(|(usage, _)| usage),
                meta_inodes_used: meta.map(|(_, used)| used),
            });
        }
        for (id, record) in targets {
            map.targets.push(weft_proto::messages::TargetInfo {
                id,
                node: record.node,
                pool: record.pool,
                reachability: self.reachability(
                    live.last_heard
                        .get(&(NodeKind::Storage, record.node))
                        .copied(),
                ),
                usage: live.target_usage.get(&id).copied().unwrap_or_default(),
                draining: draining.contains_key(&id),
            });
        }

        // As for nodes, a session counts as heard at management's start after a restart. An
        // expired session is forgotten: the store and the map hold only live ones.
        let (live_sessions, expired): (Vec<ClientId>, Vec<ClientId>) = clients
            .into_iter()
            .partition(|client| self.session_live(&live, *client));
        map.session_owners = self
            .store
            .session_owners()?
            .into_iter()
            .filter(|(id, _)| live_sessions.contains(id))
            .collect();
        map.live_sessions = live_sessions;
        drop(live);
        if !expired.is_empty() {
            self.store.remove_clients(&expired)?;
            let mut live = self.live.lock().expect("live state poisoned");
            for client in &expired {
                live.client_last_heard.remove(client);
                live.client_unserved.remove(client);
            }
            tracing::info!(sessions = expired.len(), "forgot expired client sessions");
        }
        self.stamp(&mut map);
        Ok(map)
    }

    pub(super) fn cluster_status(&self) -> Result<weft_proto::messages::ClusterStatus, MgmtError> {
        let map = self.cluster_map()?;
        let mut status = self.monitor.status(&map);
        status.quotas = self.quota_states()?;
        let draining = self.store.draining()?;
        for target in &mut status.targets {
            if let Some(&since) = draining.get(&target.id) {
                target.drain_left = self.drain_progress(target.id, since)?.ok();
                target.drain_blocked = self.drain_blocked(target.id);
            }
        }
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    // Goal: the map lists what registered, and a client key's view of the cluster's status
    // leaves out every user's quota use, which a member's view shows, and the sessions' load.
    #[test]
    fn the_map_lists_what_registered_and_a_client_sees_less() {
        let fixture = testing::mgmt();
        let node = fixture.node(NodeKind::Storage, "storage-1");
        let target = fixture.target(node);
        let Ok(MgmtResponse::ClusterMap(map)) = fixture.ask(MgmtRequest::GetClusterMap) else {
            panic!("the map");
        };
        assert!(map.target(target).is_some(), "{map:?}");
        fixture
            .ask(MgmtRequest::SetQuota {
                rule: weft_proto::quota::QuotaRule {
                    kind: weft_proto::quota::QuotaKind::User,
                    id: 1000,
                    pool: StoragePoolId::DEFAULT,
                    limits: weft_proto::quota::QuotaLimits {
                        hard_bytes: 100,
                        ..weft_proto::quota::QuotaLimits::default()
                    },
                },
            })
            .expect("a quota");
        let Ok(MgmtResponse::ClusterStatus(full)) = fixture.ask(MgmtRequest::GetClusterStatus)
        else {
            panic!("the status");
        };
        assert!(
            !full.quotas.is_empty(),
            "a member sees the quotas: {full:?}"
        );
        let Ok(MgmtResponse::ClusterStatus(seen)) =
            fixture.ask_as("lab", MgmtRequest::GetClusterStatus)
        else {
            panic!("the status as a client");
        };
        assert!(
            seen.clients.is_empty() && seen.quotas.is_empty(),
            "a client sees neither: {seen:?}"
        );
        assert_eq!(
            (seen.nodes, seen.targets),
            (full.nodes, full.targets),
            "both see the nodes and targets"
        );
    }
}
