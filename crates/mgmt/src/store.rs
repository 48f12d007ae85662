//! Management's durable state in redb: nodes, targets, id counters and client sessions.
//! Every change commits (fsync) before the request that made it is answered.

use crate::MgmtError;
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;
use weft_proto::ids::{ClientId, NodeId, StoragePoolId, TargetId};
use weft_proto::messages::{Consistency, MirrorGroupInfo, MirrorKind, NodeKind};

/// (kind, node id) → postcard [`NodeRecord`].
const NODES: TableDefinition<(u8, u32), &[u8]> = TableDefinition::new("nodes");
/// target id → postcard [`TargetRecord`].
const TARGETS: TableDefinition<u32, &[u8]> = TableDefinition::new("targets");
/// counter name → last value allocated.
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// client id → client alias.
const CLIENTS: TableDefinition<u64, &str> = TableDefinition::new("clients");
/// (kind, group id) → postcard [`MirrorGroupRecord`].
const MIRROR_GROUPS: TableDefinition<(u8, u32), &[u8]> = TableDefinition::new("mirror_groups");

/// A mirror group as stored: published only after it is committed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct MirrorGroupRecord {
    pub version: u64,
    pub primary: u32,
    /// (member id, its node, consistency).
    pub members: Vec<(u32, NodeId, Consistency)>,
}

impl MirrorGroupRecord {
    fn info(&self, kind: MirrorKind, id: u32) -> MirrorGroupInfo {
        MirrorGroupInfo {
            id,
            kind,
            version: self.version,
            primary: self.primary,
            members: self
                .members
                .iter()
                .map(|(id, node, state)| weft_proto::messages::MirrorMember {
                    id: *id,
                    node: *node,
                    state: *state,
                })
                .collect(),
        }
    }
}

fn mirror_kind_key(kind: MirrorKind) -> u8 {
    match kind {
        MirrorKind::Storage => 0,
        MirrorKind::Meta => 1,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct NodeRecord {
    pub alias: String,
    pub addresses: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TargetRecord {
    pub node: NodeId,
    pub pool: StoragePoolId,
}

pub(crate) fn kind_key(kind: NodeKind) -> u8 {
    match kind {
        NodeKind::Management => 0,
        NodeKind::Meta => 1,
        NodeKind::Storage => 2,
    }
}

fn kind_from_key(key: u8) -> Option<NodeKind> {
    match key {
        0 => Some(NodeKind::Management),
        1 => Some(NodeKind::Meta),
        2 => Some(NodeKind::Storage),
        _ => None,
    }
}

fn store_error(error: impl std::fmt::Display) -> MgmtError {
    MgmtError::Store(error.to_string())
}

pub(crate) struct MgmtStore {
    db: Database,
}

impl MgmtStore {
    pub fn open(data_dir: &Path) -> Result<MgmtStore, MgmtError> {
        let db = Database::create(data_dir.join("mgmt.redb")).map_err(store_error)?;
        let txn = db.begin_write().map_err(store_error)?;
        {
            txn.open_table(NODES).map_err(store_error)?;
            txn.open_table(TARGETS).map_err(store_error)?;
            txn.open_table(COUNTERS).map_err(store_error)?;
            txn.open_table(CLIENTS).map_err(store_error)?;
            txn.open_table(MIRROR_GROUPS).map_err(store_error)?;
        }
        txn.commit().map_err(store_error)?;
        Ok(MgmtStore { db })
    }

    /// Registers or re-registers a node; returns its id.
    pub fn register_node(
        &self,
        kind: NodeKind,
        existing: Option<NodeId>,
        record: &NodeRecord,
    ) -> Result<NodeId, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let node = {
            let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let counter_name = match kind {
                NodeKind::Meta => "meta_node",
                NodeKind::Storage => "storage_node",
                NodeKind::Management => "management_node",
            };
            let last = counters
                .get(counter_name)
                .map_err(store_error)?
                .map(|v| v.value())
                .unwrap_or(0);
            let node = match existing {
                Some(node) => {
                    // A node keeps the id it saved, even one this store has never seen (a
                    // restored management store); the counter moves past it.
                    if u64::from(node.0) > last {
                        counters
                            .insert(counter_name, u64::from(node.0))
                            .map_err(store_error)?;
                    }
                    node
                }
                None => {
                    let next = last + 1;
                    counters.insert(counter_name, next).map_err(store_error)?;
                    NodeId(u32::try_from(next).map_err(store_error)?)
                }
            };
            let mut nodes = txn.open_table(NODES).map_err(store_error)?;
            let bytes = postcard::to_stdvec(record).map_err(store_error)?;
            nodes
                .insert((kind_key(kind), node.0), bytes.as_slice())
                .map_err(store_error)?;
            node
        };
        txn.commit().map_err(store_error)?;
        Ok(node)
    }

    pub fn register_target(
        &self,
        node: NodeId,
        existing: Option<TargetId>,
    ) -> Result<TargetId, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let target = {
            let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let last = counters
                .get("target")
                .map_err(store_error)?
                .map(|v| v.value())
                .unwrap_or(0);
            let target = match existing {
                Some(target) => {
                    if u64::from(target.0) > last {
                        counters
                            .insert("target", u64::from(target.0))
                            .map_err(store_error)?;
                    }
                    target
                }
                None => {
                    counters.insert("target", last + 1).map_err(store_error)?;
                    TargetId(u32::try_from(last + 1).map_err(store_error)?)
                }
            };
            let mut targets = txn.open_table(TARGETS).map_err(store_error)?;
            let pool = match targets.get(target.0).map_err(store_error)? {
                Some(bytes) => postcard::from_bytes::<TargetRecord>(bytes.value())
                    .map(|r| r.pool)
                    .unwrap_or(StoragePoolId::DEFAULT),
                None => StoragePoolId::DEFAULT,
            };
            let bytes = postcard::to_stdvec(&TargetRecord { node, pool }).map_err(store_error)?;
            targets
                .insert(target.0, bytes.as_slice())
                .map_err(store_error)?;
            target
        };
        txn.commit().map_err(store_error)?;
        Ok(target)
    }

    pub fn register_client(&self, alias: &str) -> Result<ClientId, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let client = {
            let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let next = counters
                .get("client")
                .map_err(store_error)?
                .map(|v| v.value())
                .unwrap_or(0)
                + 1;
            counters.insert("client", next).map_err(store_error)?;
            let mut clients = txn.open_table(CLIENTS).map_err(store_error)?;
            clients.insert(next, alias).map_err(store_error)?;
            ClientId(next)
        };
        txn.commit().map_err(store_error)?;
        Ok(client)
    }

    pub fn client_exists(&self, client: ClientId) -> Result<bool, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let clients = txn.open_table(CLIENTS).map_err(store_error)?;
        Ok(clients.get(client.0).map_err(store_error)?.is_some())
    }

    pub fn clients(&self) -> Result<Vec<ClientId>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let clients = txn.open_table(CLIENTS).map_err(store_error)?;
        let mut out = Vec::new();
        for entry in clients.iter().map_err(store_error)? {
            out.push(ClientId(entry.map_err(store_error)?.0.value()));
        }
        Ok(out)
    }

    pub fn nodes(&self) -> Result<Vec<(NodeKind, NodeId, NodeRecord)>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let nodes = txn.open_table(NODES).map_err(store_error)?;
        let mut out = Vec::new();
        for entry in nodes.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            let (kind, id) = key.value();
            let Some(kind) = kind_from_key(kind) else {
                continue;
            };
            let record: NodeRecord = postcard::from_bytes(value.value()).map_err(store_error)?;
            out.push((kind, NodeId(id), record));
        }
        Ok(out)
    }

    pub fn node_exists(&self, kind: NodeKind, node: NodeId) -> Result<bool, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let nodes = txn.open_table(NODES).map_err(store_error)?;
        Ok(nodes
            .get((kind_key(kind), node.0))
            .map_err(store_error)?
            .is_some())
    }

    /// Every mirror group.
    pub fn mirror_groups(&self) -> Result<Vec<MirrorGroupInfo>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let groups = txn.open_table(MIRROR_GROUPS).map_err(store_error)?;
        let mut out = Vec::new();
        for entry in groups.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            let (kind, id) = key.value();
            let kind = if kind == 0 {
                MirrorKind::Storage
            } else {
                MirrorKind::Meta
            };
            let record: MirrorGroupRecord =
                postcard::from_bytes(value.value()).map_err(store_error)?;
            out.push(record.info(kind, id));
        }
        Ok(out)
    }

    /// Stores new mirror groups of `kind`, each a list of (member, node), the first primary;
    /// allocates their ids and commits them all at once.
    pub fn create_mirror_groups(
        &self,
        kind: MirrorKind,
        groups: &[Vec<(u32, NodeId)>],
    ) -> Result<Vec<MirrorGroupInfo>, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let mut created = Vec::new();
        {
            let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let counter = match kind {
                MirrorKind::Storage => "storage_mirror_group",
                MirrorKind::Meta => "meta_mirror_group",
            };
            let mut last = counters
                .get(counter)
                .map_err(store_error)?
                .map(|v| v.value())
                .unwrap_or(0);
            let mut table = txn.open_table(MIRROR_GROUPS).map_err(store_error)?;
            for members in groups {
                last += 1;
                let id = u32::try_from(last).map_err(store_error)?;
                let record = MirrorGroupRecord {
                    version: 1,
                    primary: members[0].0,
                    members: members
                        .iter()
                        .map(|(member, node)| (*member, *node, Consistency::Good))
                        .collect(),
                };
                let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
                table
                    .insert((mirror_kind_key(kind), id), bytes.as_slice())
                    .map_err(store_error)?;
                created.push(record.info(kind, id));
            }
            counters.insert(counter, last).map_err(store_error)?;
        }
        txn.commit().map_err(store_error)?;
        Ok(created)
    }

    pub fn targets(&self) -> Result<Vec<(TargetId, TargetRecord)>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let targets = txn.open_table(TARGETS).map_err(store_error)?;
        let mut out = Vec::new();
        for entry in targets.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            let record: TargetRecord = postcard::from_bytes(value.value()).map_err(store_error)?;
            out.push((TargetId(key.value()), record));
        }
        Ok(out)
    }
}
