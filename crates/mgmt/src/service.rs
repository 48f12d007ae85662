//! The management request handler and its in-memory heartbeat view.

use crate::store::{MgmtStore, NodeRecord};
use crate::{MgmtConfig, MgmtError};
use bytes::Bytes;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, NodeId, TargetId};
use weft_proto::messages::{
    ClusterMap, MgmtRequest, NodeInfo, NodeKind, Reachability, Reply, Request, Response,
    SpaceUsage, NODE_ADDRESSES_MAX,
};
use weft_proto::ErrorCode;

/// What management heard from a node lately; rebuilt from heartbeats after a restart.
#[derive(Default)]
struct LiveState {
    last_heard: HashMap<(NodeKind, NodeId), Instant>,
    target_usage: HashMap<TargetId, SpaceUsage>,
    meta_usage: HashMap<NodeId, (SpaceUsage, u64)>,
    client_last_heard: HashMap<ClientId, Instant>,
}

struct Mgmt {
    store: MgmtStore,
    live: Mutex<LiveState>,
    started: Instant,
    offline_timeout: Duration,
    session_timeout: Duration,
    /// The directory-rename lock: (token, holder, lease end).
    rename_lock: Mutex<Option<(u64, NodeId, Instant)>>,
    rename_lock_lease: Duration,
}

/// Runs management until `shutdown` completes.
///
/// # Errors
/// [`MgmtError`] when the data directory or store cannot be used.
pub async fn run(
    config: MgmtConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MgmtError> {
    std::fs::create_dir_all(&config.data_dir).map_err(|source| MgmtError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    let store = MgmtStore::open(&config.data_dir)?;
    let mgmt = Arc::new(Mgmt {
        store,
        live: Mutex::default(),
        started: Instant::now(),
        offline_timeout: Duration::from_millis(config.node_offline_timeout_ms),
        session_timeout: Duration::from_millis(config.session_timeout_ms),
        rename_lock: Mutex::new(None),
        rename_lock_lease: Duration::from_millis(config.rename_lock_lease_ms),
    });
    tracing::info!(address = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "management serving");
    weft_net::serve(listener, mgmt, shutdown).await;
    Ok(())
}

impl weft_net::Handler for Mgmt {
    async fn handle(&self, request: Request, _payload: Bytes) -> (Reply, Bytes) {
        let reply = match request {
            Request::Mgmt(request) => self.handle_mgmt(request),
            other => Err(WireError::new(
                ErrorCode::WrongService,
                format!("management does not serve {other:?}"),
            )),
        };
        (reply, Bytes::new())
    }
}

fn internal(error: MgmtError) -> WireError {
    tracing::error!(%error, "management store failed");
    WireError::new(ErrorCode::Internal, error.to_string())
}

impl Mgmt {
    fn handle_mgmt(&self, request: MgmtRequest) -> Reply {
        match request {
            MgmtRequest::RegisterNode {
                node,
                kind,
                alias,
                addresses,
            } => {
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
                tracing::info!(?kind, node = node.0, %alias, addresses = ?record.addresses, "node registered{}", if was_known { " again" } else { "" });
                Ok(Response::NodeRegistered { node })
            }
            MgmtRequest::RegisterTarget { node, target } => {
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
                let target = self.store.register_target(node, target).map_err(internal)?;
                tracing::info!(
                    target = target.0,
                    node = node.0,
                    "storage target registered"
                );
                Ok(Response::TargetRegistered { target })
            }
            MgmtRequest::Heartbeat {
                kind,
                node,
                targets,
                meta_usage,
                meta_inodes_used,
            } => {
                if !self.store.node_exists(kind, node).map_err(internal)? {
                    return Err(WireError::new(
                        ErrorCode::UnknownNode,
                        format!("{kind:?} node {node} is not registered; register again"),
                    ));
                }
                let mut live = self.live.lock().expect("live state poisoned");
                let previous = live.last_heard.insert((kind, node), Instant::now());
                if previous.is_some_and(|heard| heard.elapsed() >= self.offline_timeout) {
                    tracing::info!(?kind, node = node.0, "node is online again");
                }
                for report in targets {
                    live.target_usage.insert(report.target, report.usage);
                }
                if let Some(usage) = meta_usage {
                    live.meta_usage
                        .insert(node, (usage, meta_inodes_used.unwrap_or(0)));
                }
                Ok(Response::Done)
            }
            MgmtRequest::RegisterClient { alias } => {
                let client = self.store.register_client(&alias).map_err(internal)?;
                self.live
                    .lock()
                    .expect("live state poisoned")
                    .client_last_heard
                    .insert(client, Instant::now());
                tracing::info!(client = %client, %alias, "client session registered");
                Ok(Response::ClientRegistered { client })
            }
            MgmtRequest::ClientHeartbeat { client } => {
                if self.store.client_exists(client).map_err(internal)? {
                    let mut live = self.live.lock().expect("live state poisoned");
                    let previous = live.client_last_heard.insert(client, Instant::now());
                    if previous.is_some_and(|heard| heard.elapsed() >= self.session_timeout) {
                        tracing::warn!(client = %client, "a client came back after its session expired");
                    }
                    Ok(Response::Done)
                } else {
                    Err(WireError::new(
                        ErrorCode::UnknownSession,
                        format!("client session {client} is unknown"),
                    ))
                }
            }
            MgmtRequest::AcquireRenameLock { holder, token } => {
                let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
                match *lock {
                    Some((held, by, until)) if held != token && Instant::now() < until => {
                        Err(WireError::new(
                            ErrorCode::WouldBlock,
                            format!("metadata node {by} holds the rename lock"),
                        ))
                    }
                    _ => {
                        *lock = Some((token, holder, Instant::now() + self.rename_lock_lease));
                        Ok(Response::Done)
                    }
                }
            }
            MgmtRequest::ReleaseRenameLock { token } => {
                let mut lock = self.rename_lock.lock().expect("rename lock poisoned");
                if lock.is_some_and(|(held, _, _)| held == token) {
                    *lock = None;
                }
                Ok(Response::Done)
            }
            MgmtRequest::GetClusterMap => {
                Ok(Response::ClusterMap(self.cluster_map().map_err(internal)?))
            }
        }
    }

    fn reachability(&self, last_heard: Option<Instant>) -> Reachability {
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

    fn cluster_map(&self) -> Result<ClusterMap, MgmtError> {
        let nodes = self.store.nodes()?;
        let targets = self.store.targets()?;
        let clients = self.store.clients()?;
        let live = self.live.lock().expect("live state poisoned");
        let mut map = ClusterMap::default();
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
            });
        }
        // As for nodes, a session counts as heard at management's start after a restart.
        map.live_sessions = clients
            .into_iter()
            .filter(|client| {
                let heard = live
                    .client_last_heard
                    .get(client)
                    .copied()
                    .unwrap_or(self.started)
                    .max(self.started);
                heard.elapsed() < self.session_timeout
            })
            .collect();
        Ok(map)
    }
}
