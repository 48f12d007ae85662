//! Management's durable state in redb: nodes, targets, id counters, client sessions, mirror
//! groups and the restrictions of client identities.
//! Every change commits (fsync) before the request that made it is answered.

use crate::MgmtError;
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::Path;
use weft_mirror::ControllerDurable;
use weft_proto::access::{ClientRule, Subtree};
use weft_proto::ids::{ClientId, InodeId, NodeId, StoragePoolId, TargetId};
use weft_proto::messages::{MirrorKind, NodeKind};
use weft_proto::pools::{CapacityLimits, PoolInfo};
use weft_proto::quota::{QuotaKind, QuotaLimits, QuotaRule};

/// (kind, node id) → postcard [`NodeRecord`].
const NODES: TableDefinition<(u8, u32), &[u8]> = TableDefinition::new("nodes");
/// target id → postcard [`TargetRecord`].
const TARGETS: TableDefinition<u32, &[u8]> = TableDefinition::new("targets");
/// counter name → last value allocated.
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// client id → client alias.
const CLIENTS: TableDefinition<u64, &str> = TableDefinition::new("clients");
/// mirror kind → postcard [`weft_mirror::ControllerDurable`]: that kind's mirror groups with
/// their versions, primaries and member states, each member's last boot id, and which absent
/// members left in sync. Committed before any of it is published.
const MIRROR_STATE: TableDefinition<u8, &[u8]> = TableDefinition::new("mirror_state");
/// client session id → the name of the client identity that registered it (sessions of
/// members are not in it).
const SESSION_OWNERS: TableDefinition<u64, &str> = TableDefinition::new("session_owners");
/// client name → postcard [`RuleRecord`]: the restrictions of a client identity.
const CLIENT_RULES: TableDefinition<&str, &[u8]> = TableDefinition::new("client_rules");
/// client name → (directory inode, its path when the rule was set): the subtree a client is
/// confined to ([`ClientRule::subtree`]), for the clients that have one.
const CLIENT_SUBTREES: TableDefinition<&str, (u64, &str)> = TableDefinition::new("client_subtrees");
/// pool id → postcard [`PoolRecord`]: the storage pools but for the default pool while its
/// limits are its defaults.
const POOLS: TableDefinition<u16, &[u8]> = TableDefinition::new("pools");

/// (kind: 0 user, 1 group; id; pool) → (soft bytes, hard bytes, soft inodes, hard inodes):
/// the quota rules.
const QUOTA_RULES: TableDefinition<QuotaKey, (u64, u64, u64, u64)> =
    TableDefinition::new("quota_rules");
/// (kind: 0 user, 1 group; id; pool).
type QuotaKey = (u8, u32, u16);
/// Since when (Unix seconds) a rule's user or group has been over its soft limit of bytes
/// and of inodes.
pub(crate) type GraceStarts = [Option<u64>; 2];
/// (kind, id, pool, limit: 0 bytes, 1 inodes) → Unix seconds since which the use has been over
/// that soft limit: the grace periods running, kept across restarts.
const QUOTA_GRACE: TableDefinition<(u8, u32, u16, u8), u64> = TableDefinition::new("quota_grace");
/// target id → Unix milliseconds when its drain began (`weft target drain`).
const DRAINING: TableDefinition<u32, u64> = TableDefinition::new("draining");
/// target id → Unix milliseconds when it was removed from the cluster: it may not register
/// again.
const REMOVED_TARGETS: TableDefinition<u32, u64> = TableDefinition::new("removed_targets");

/// A storage pool as stored: its [`PoolInfo`] but for the id, which is the key.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PoolRecord {
    pub name: String,
    pub low: CapacityLimits,
    pub emergency: CapacityLimits,
}

/// A [`ClientRule`] as stored, but for its subtree (in [`CLIENT_SUBTREES`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RuleRecord {
    pub name: String,
    pub read_only: bool,
    pub root_squash: bool,
    pub revoked: bool,
}

/// Raises the counter of the ids given to mirror groups of `kind` to `id`, if it is lower.
fn raise_group_counter(
    txn: &redb::WriteTransaction,
    kind: MirrorKind,
    id: u32,
) -> Result<(), MgmtError> {
    let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
    let name = mirror_group_counter(kind);
    let last = counters
        .get(name)
        .map_err(store_error)?
        .map_or(0, |v| v.value());
    if u64::from(id) > last {
        counters.insert(name, u64::from(id)).map_err(store_error)?;
    }
    Ok(())
}

/// The counter of the ids given to mirror groups of `kind`.
fn mirror_group_counter(kind: MirrorKind) -> &'static str {
    match kind {
        MirrorKind::Storage => "storage_mirror_group",
        MirrorKind::Meta => "meta_mirror_group",
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
            txn.open_table(MIRROR_STATE).map_err(store_error)?;
            txn.open_table(CLIENT_RULES).map_err(store_error)?;
            txn.open_table(CLIENT_SUBTREES).map_err(store_error)?;
            txn.open_table(SESSION_OWNERS).map_err(store_error)?;
            txn.open_table(POOLS).map_err(store_error)?;
            txn.open_table(QUOTA_RULES).map_err(store_error)?;
            txn.open_table(QUOTA_GRACE).map_err(store_error)?;
            txn.open_table(DRAINING).map_err(store_error)?;
            txn.open_table(REMOVED_TARGETS).map_err(store_error)?;
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
        if let Some(target) = existing {
            let removed = txn.open_table(REMOVED_TARGETS).map_err(store_error)?;
            if removed.get(target.0).map_err(store_error)?.is_some() {
                return Err(MgmtError::TargetRemoved(target));
            }
        }
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

    /// Registers a session for `alias`, registered by the client identity `owner` (`None`
    /// for a member).
    pub fn register_client(&self, alias: &str, owner: Option<&str>) -> Result<ClientId, MgmtError> {
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
            if let Some(owner) = owner {
                let mut owners = txn.open_table(SESSION_OWNERS).map_err(store_error)?;
                owners.insert(next, owner).map_err(store_error)?;
            }
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

    /// Forgets expired client sessions.
    pub fn remove_clients(&self, expired: &[ClientId]) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            let mut clients = txn.open_table(CLIENTS).map_err(store_error)?;
            let mut owners = txn.open_table(SESSION_OWNERS).map_err(store_error)?;
            for client in expired {
                clients.remove(client.0).map_err(store_error)?;
                owners.remove(client.0).map_err(store_error)?;
            }
        }
        txn.commit().map_err(store_error)
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

    /// The stored state of `kind`'s mirror groups (empty before the first group).
    pub fn mirror_state(&self, kind: MirrorKind) -> Result<ControllerDurable, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(MIRROR_STATE).map_err(store_error)?;
        match table.get(mirror_kind_key(kind)).map_err(store_error)? {
            Some(bytes) => postcard::from_bytes(bytes.value()).map_err(store_error),
            None => Ok(ControllerDurable::default()),
        }
    }

    /// Commits the state of `kind`'s mirror groups.
    pub fn save_mirror_state(
        &self,
        kind: MirrorKind,
        state: &ControllerDurable,
    ) -> Result<(), MgmtError> {
        let bytes = postcard::to_stdvec(state).map_err(store_error)?;
        let txn = self.db.begin_write().map_err(store_error)?;
        txn.open_table(MIRROR_STATE)
            .map_err(store_error)?
            .insert(mirror_kind_key(kind), bytes.as_slice())
            .map_err(store_error)?;
        // The highest group id ever given, so a removed group's id is not given again.
        let highest = state.map.groups.keys().map(|id| id.0).max().unwrap_or(0);
        raise_group_counter(&txn, kind, highest)?;
        txn.commit().map_err(store_error)
    }

    /// Counts `id` as given to a mirror group of `kind` (the highest given stays the
    /// highest).
    pub fn note_mirror_group(&self, kind: MirrorKind, id: u32) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        raise_group_counter(&txn, kind, id)?;
        txn.commit().map_err(store_error)
    }

    /// The highest id a mirror group of `kind` was ever given (0: none yet).
    pub fn last_mirror_group(&self, kind: MirrorKind) -> Result<u32, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let counters = txn.open_table(COUNTERS).map_err(store_error)?;
        let last = counters
            .get(mirror_group_counter(kind))
            .map_err(store_error)?
            .map_or(0, |v| v.value());
        Ok(u32::try_from(last).unwrap_or(u32::MAX))
    }

    /// The sessions client identities registered, with the client's name.
    pub fn session_owners(&self) -> Result<Vec<(ClientId, String)>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(SESSION_OWNERS).map_err(store_error)?;
        let mut owners = Vec::new();
        for entry in table.iter().map_err(store_error)? {
            let (id, name) = entry.map_err(store_error)?;
            owners.push((ClientId(id.value()), name.value().to_string()));
        }
        Ok(owners)
    }

    /// Commits `rule`, replacing its client's earlier one.
    pub fn set_client_rule(&self, rule: &ClientRule) -> Result<(), MgmtError> {
        let record = RuleRecord {
            name: rule.name.clone(),
            read_only: rule.read_only,
            root_squash: rule.root_squash,
            revoked: rule.revoked,
        };
        let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
        let txn = self.db.begin_write().map_err(store_error)?;
        txn.open_table(CLIENT_RULES)
            .map_err(store_error)?
            .insert(rule.name.as_str(), bytes.as_slice())
            .map_err(store_error)?;
        let mut subtrees = txn.open_table(CLIENT_SUBTREES).map_err(store_error)?;
        match &rule.subtree {
            Some(subtree) => subtrees
                .insert(rule.name.as_str(), (subtree.inode.0, subtree.path.as_str()))
                .map(drop),
            None => subtrees.remove(rule.name.as_str()).map(drop),
        }
        .map_err(store_error)?;
        drop(subtrees);
        txn.commit().map_err(store_error)
    }

    /// Removes the rule of the client `name`; whether it had one.
    pub fn remove_client_rule(&self, name: &str) -> Result<bool, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let removed = txn
            .open_table(CLIENT_RULES)
            .map_err(store_error)?
            .remove(name)
            .map_err(store_error)?
            .is_some();
        txn.open_table(CLIENT_SUBTREES)
            .map_err(store_error)?
            .remove(name)
            .map_err(store_error)?;
        txn.commit().map_err(store_error)?;
        Ok(removed)
    }

    /// Every client identity's rule, by name.
    pub fn client_rules(&self) -> Result<Vec<ClientRule>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(CLIENT_RULES).map_err(store_error)?;
        let subtrees = txn.open_table(CLIENT_SUBTREES).map_err(store_error)?;
        let mut rules = Vec::new();
        for entry in table.iter().map_err(store_error)? {
            let (_, value) = entry.map_err(store_error)?;
            let record: RuleRecord = postcard::from_bytes(value.value()).map_err(store_error)?;
            let subtree = subtrees
                .get(record.name.as_str())
                .map_err(store_error)?
                .map(|value| {
                    let (inode, path) = value.value();
                    Subtree {
                        inode: InodeId(inode),
                        path: path.to_string(),
                    }
                });
            rules.push(ClientRule {
                name: record.name,
                read_only: record.read_only,
                root_squash: record.root_squash,
                revoked: record.revoked,
                subtree,
            });
        }
        Ok(rules)
    }

    /// Every storage pool, the default one included, by id.
    pub fn pools(&self) -> Result<Vec<PoolInfo>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(POOLS).map_err(store_error)?;
        let mut pools = Vec::new();
        for entry in table.iter().map_err(store_error)? {
            let (id, value) = entry.map_err(store_error)?;
            let record: PoolRecord = postcard::from_bytes(value.value()).map_err(store_error)?;
            pools.push(PoolInfo {
                id: StoragePoolId(id.value()),
                name: record.name,
                low: record.low,
                emergency: record.emergency,
            });
        }
        if !pools.iter().any(|pool| pool.id == StoragePoolId::DEFAULT) {
            pools.insert(0, PoolInfo::default_pool());
        }
        Ok(pools)
    }

    /// Creates a pool called `name` with the default limits; `None` when one has that name.
    pub fn create_pool(&self, name: &str) -> Result<Option<PoolInfo>, MgmtError> {
        let pools = self.pools()?;
        if pools.iter().any(|pool| pool.name == name) {
            return Ok(None);
        }
        let txn = self.db.begin_write().map_err(store_error)?;
        let pool = {
            let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let last = counters
                .get("pool")
                .map_err(store_error)?
                .map(|v| v.value())
                .unwrap_or(u64::from(StoragePoolId::DEFAULT.0))
                .max(u64::from(StoragePoolId::DEFAULT.0));
            let id = u16::try_from(last + 1)
                .map_err(|_| MgmtError::Store("no pool id is left".into()))?;
            counters.insert("pool", last + 1).map_err(store_error)?;
            let pool = PoolInfo::new(StoragePoolId(id), name.to_string());
            save_pool(&txn, &pool)?;
            pool
        };
        txn.commit().map_err(store_error)?;
        Ok(Some(pool))
    }

    /// Commits `pool`'s name and limits.
    pub fn save_pool(&self, pool: &PoolInfo) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        save_pool(&txn, pool)?;
        txn.commit().map_err(store_error)
    }

    /// Removes pool `id`; whether it was there. The caller checks it holds no target.
    pub fn remove_pool(&self, id: StoragePoolId) -> Result<bool, MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        let removed = txn
            .open_table(POOLS)
            .map_err(store_error)?
            .remove(id.0)
            .map_err(store_error)?
            .is_some();
        txn.commit().map_err(store_error)?;
        Ok(removed)
    }

    /// Puts `targets` into pool `to`, in one transaction.
    pub fn set_targets_pool(
        &self,
        targets: &[TargetId],
        to: StoragePoolId,
    ) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            let mut table = txn.open_table(TARGETS).map_err(store_error)?;
            for target in targets {
                let Some(bytes) = table.get(target.0).map_err(store_error)? else {
                    return Err(MgmtError::Store(format!(
                        "target {target} is not registered"
                    )));
                };
                let mut record: TargetRecord =
                    postcard::from_bytes(bytes.value()).map_err(store_error)?;
                drop(bytes);
                record.pool = to;
                let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
                table
                    .insert(target.0, bytes.as_slice())
                    .map_err(store_error)?;
            }
        }
        txn.commit().map_err(store_error)
    }

    /// Commits `rule`, or removes its user's or group's rule in its pool when it sets no limit.
    pub fn set_quota(&self, rule: &QuotaRule) -> Result<(), MgmtError> {
        let key = (rule.kind.key(), rule.id, rule.pool.0);
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            let mut rules = txn.open_table(QUOTA_RULES).map_err(store_error)?;
            let limits = rule.limits;
            if limits.is_empty() {
                rules.remove(key).map_err(store_error)?;
            } else {
                rules
                    .insert(
                        key,
                        (
                            limits.soft_bytes,
                            limits.hard_bytes,
                            limits.soft_inodes,
                            limits.hard_inodes,
                        ),
                    )
                    .map_err(store_error)?;
            }
            let mut grace = txn.open_table(QUOTA_GRACE).map_err(store_error)?;
            for what in [0, 1] {
                grace
                    .remove((key.0, key.1, key.2, what))
                    .map_err(store_error)?;
            }
        }
        txn.commit().map_err(store_error)
    }

    /// Every quota rule, with since when (Unix seconds) its user or group has been over its
    /// soft limit of bytes and of inodes: the grace periods running. One read of both tables.
    pub fn quota_rules(&self) -> Result<Vec<(QuotaRule, GraceStarts)>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(QUOTA_RULES).map_err(store_error)?;
        let graces = txn.open_table(QUOTA_GRACE).map_err(store_error)?;
        let since = |key: QuotaKey, what: u8| -> Result<Option<u64>, MgmtError> {
            Ok(graces
                .get((key.0, key.1, key.2, what))
                .map_err(store_error)?
                .map(|v| v.value()))
        };
        let mut rules = Vec::new();
        for entry in table.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            let key = key.value();
            let (kind, id, pool) = key;
            let (soft_bytes, hard_bytes, soft_inodes, hard_inodes) = value.value();
            let Some(kind) = QuotaKind::from_key(kind) else {
                continue;
            };
            let rule = QuotaRule {
                kind,
                id,
                pool: StoragePoolId(pool),
                limits: QuotaLimits {
                    soft_bytes,
                    hard_bytes,
                    soft_inodes,
                    hard_inodes,
                },
            };
            rules.push((rule, [since(key, 0)?, since(key, 1)?]));
        }
        Ok(rules)
    }

    /// Starts (`since` Some) or ends the grace period of `rule`'s soft limit `what`.
    pub fn set_grace(
        &self,
        rule: &QuotaRule,
        what: u8,
        since: Option<u64>,
    ) -> Result<(), MgmtError> {
        let key = (rule.kind.key(), rule.id, rule.pool.0, what);
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            let mut table = txn.open_table(QUOTA_GRACE).map_err(store_error)?;
            match since {
                Some(since) => table.insert(key, since).map(drop),
                None => table.remove(key).map(drop),
            }
            .map_err(store_error)?;
        }
        txn.commit().map_err(store_error)
    }

    /// The targets being drained, each with the Unix milliseconds its drain began.
    pub fn draining(&self) -> Result<std::collections::HashMap<TargetId, u64>, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(DRAINING).map_err(store_error)?;
        let mut out = std::collections::HashMap::new();
        for entry in table.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            out.insert(TargetId(key.value()), value.value());
        }
        Ok(out)
    }

    /// Starts draining `target` at `unix_ms` (kept if it drains already), or stops it.
    pub fn set_draining(&self, target: TargetId, unix_ms: Option<u64>) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            let mut table = txn.open_table(DRAINING).map_err(store_error)?;
            match unix_ms {
                Some(_) if table.get(target.0).map_err(store_error)?.is_some() => {}
                Some(at) => drop(table.insert(target.0, at).map_err(store_error)?),
                None => drop(table.remove(target.0).map_err(store_error)?),
            }
        }
        txn.commit().map_err(store_error)
    }

    /// Removes `target` from the cluster at `unix_ms`, for good: it leaves its pool, and may
    /// not register again.
    pub fn remove_target(&self, target: TargetId, unix_ms: u64) -> Result<(), MgmtError> {
        let txn = self.db.begin_write().map_err(store_error)?;
        {
            txn.open_table(TARGETS)
                .map_err(store_error)?
                .remove(target.0)
                .map_err(store_error)?;
            txn.open_table(DRAINING)
                .map_err(store_error)?
                .remove(target.0)
                .map_err(store_error)?;
            txn.open_table(REMOVED_TARGETS)
                .map_err(store_error)?
                .insert(target.0, unix_ms)
                .map_err(store_error)?;
        }
        txn.commit().map_err(store_error)
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

fn save_pool(txn: &redb::WriteTransaction, pool: &PoolInfo) -> Result<(), MgmtError> {
    let record = PoolRecord {
        name: pool.name.clone(),
        low: pool.low,
        emergency: pool.emergency,
    };
    let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
    txn.open_table(POOLS)
        .map_err(store_error)?
        .insert(pool.id.0, bytes.as_slice())
        .map_err(store_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_mirror::{Group, Member, MemberState};
    use weft_proto::ids::{GroupId, GroupVersion, MemberId};

    fn hex<T: Serialize>(value: &T) -> String {
        postcard::to_stdvec(value)
            .expect("records encode")
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    // Goal: the records management stores keep their bytes: a change is a change of the
    // on-disk format, which needs a conversion (docs/design/on-disk-format.md).
    #[test]
    fn stored_records_keep_their_bytes() {
        let node = NodeRecord {
            alias: "meta-1".into(),
            addresses: vec!["10.0.0.1:8010".into()],
        };
        assert_eq!(hex(&node), "066d6574612d31010d31302e302e302e313a38303130");
        let target = TargetRecord {
            node: NodeId(2),
            pool: StoragePoolId(1),
        };
        assert_eq!(hex(&target), "0201");
        let rule = RuleRecord {
            name: "node17".into(),
            read_only: true,
            root_squash: false,
            revoked: true,
        };
        assert_eq!(hex(&rule), "066e6f64653137010001");
        let pool = PoolRecord {
            name: "fast".into(),
            low: CapacityLimits {
                free_bytes: 1024,
                free_inodes: 5,
            },
            emergency: CapacityLimits {
                free_bytes: 2,
                free_inodes: 1,
            },
        };
        assert_eq!(hex(&pool), "04666173748008050201");
        let mut state = ControllerDurable::default();
        state.map.groups.insert(
            GroupId(3),
            Group {
                id: GroupId(3),
                version: GroupVersion(4),
                primary: MemberId(1),
                members: vec![
                    Member {
                        server: MemberId(1),
                        state: MemberState::Good,
                    },
                    Member {
                        server: MemberId(2),
                        state: MemberState::NeedsResync { full: true },
                    },
                ],
                loss_epoch: 5,
            },
        );
        state.boots.insert(MemberId(2), 9);
        state.left_good.insert((GroupId(3), MemberId(2)));
        assert_eq!(hex(&state), "010303040102010002010105010209010302");
    }
}
