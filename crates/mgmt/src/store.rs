//! Management's durable state in redb: nodes, targets, id counters, client sessions, mirror
//! groups and the restrictions of client identities.
//! Every change commits (fsync) before the request that made it is answered.

mod log;

use log::granted;
pub(crate) use log::{apply, Command, Outcome};

use crate::MgmtError;
use redb::{
    Database, ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
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
/// The counter of the first map epochs of management servers that started serving.
const MAP_EPOCH_COUNTER: &str = "map_epoch";
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
/// (kind, id, pool, metadata home) → (bytes, inodes): what each home holds of a hard quota
/// (`MgmtRequest::GrantQuota`). Together within the hard limits (but for grants given before
/// a limit was lowered, until their homes ask again); a rule removed drops its grants.
const QUOTA_GRANTS: TableDefinition<(u8, u32, u16, u32), (u64, u64)> =
    TableDefinition::new("quota_grants");
/// target id → Unix milliseconds when its drain began (`weft target drain`).
const DRAINING: TableDefinition<u32, u64> = TableDefinition::new("draining");
/// target id → Unix milliseconds when it was removed from the cluster: it may not register
/// again.
const REMOVED_TARGETS: TableDefinition<u32, u64> = TableDefinition::new("removed_targets");

/// A storage pool as stored: its [`PoolInfo`] but for the id, which is the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PoolRecord {
    pub name: String,
    pub low: CapacityLimits,
    pub emergency: CapacityLimits,
}

/// A [`ClientRule`] as stored, but for its subtree (in [`CLIENT_SUBTREES`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RuleRecord {
    pub name: String,
    pub read_only: bool,
    pub root_squash: bool,
    pub revoked: bool,
}

/// Raises the counter of the ids given to mirror groups of `kind` to `id`, if it is lower.
fn raise_group_counter(txn: &WriteTransaction, kind: u8, id: u32) -> Result<(), MgmtError> {
    let name = mirror_group_counter(if kind == mirror_kind_key(MirrorKind::Meta) {
        MirrorKind::Meta
    } else {
        MirrorKind::Storage
    });
    raise_counter(txn, name, u64::from(id))
}

/// Raises the counter `name` to `value`, if it is lower.
fn raise_counter(txn: &WriteTransaction, name: &str, value: u64) -> Result<(), MgmtError> {
    let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
    let last = counters
        .get(name)
        .map_err(store_error)?
        .map_or(0, |v| v.value());
    if value > last {
        counters.insert(name, value).map_err(store_error)?;
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// Management's durable state: read from its redb database, changed by [`Command`]s — applied
/// at once by a management server alone, or through the replicated log ([`crate::replication`])
/// by every management server of a replicated cluster, in the log's order. Clones share the
/// database.
#[derive(Clone)]
pub(crate) struct MgmtStore {
    db: Arc<Database>,
    log: Option<crate::replication::Log>,
}

/// Calls `$each!(TABLE)` for every table of management's state.
macro_rules! for_each_state_table {
    ($each:ident) => {
        $each!(NODES);
        $each!(TARGETS);
        $each!(COUNTERS);
        $each!(CLIENTS);
        $each!(MIRROR_STATE);
        $each!(SESSION_OWNERS);
        $each!(CLIENT_RULES);
        $each!(CLIENT_SUBTREES);
        $each!(POOLS);
        $each!(QUOTA_RULES);
        $each!(QUOTA_GRACE);
        $each!(QUOTA_GRANTS);
        $each!(DRAINING);
        $each!(REMOVED_TARGETS);
    };
}

impl MgmtStore {
    /// The store in `data_dir`, changed by this server alone.
    pub fn open(data_dir: &Path) -> Result<MgmtStore, MgmtError> {
        let db = Database::create(data_dir.join("mgmt.redb")).map_err(store_error)?;
        let txn = db.begin_write().map_err(store_error)?;
        {
            macro_rules! create {
                ($table:ident) => {
                    txn.open_table($table).map_err(store_error)?;
                };
            }
            for_each_state_table!(create);
        }
        txn.commit().map_err(store_error)?;
        Ok(MgmtStore {
            db: Arc::new(db),
            log: None,
        })
    }

    /// The same database, changed through the replicated `log` from now on.
    pub fn replicated(&self, log: crate::replication::Log) -> MgmtStore {
        MgmtStore {
            db: Arc::clone(&self.db),
            log: Some(log),
        }
    }

    /// Whether this server may grant leases now: always when alone; as one of a replicated
    /// management, while it leads a majority ([`crate::replication::Log::leads_a_majority`]).
    pub fn leads_a_majority(&self) -> bool {
        self.log
            .as_ref()
            .is_none_or(crate::replication::Log::leads_a_majority)
    }

    /// Whether changes go through the replicated log.
    pub fn is_replicated(&self) -> bool {
        self.log.is_some()
    }

    /// Whether any table holds a row (asked at every start: no row is read).
    pub fn holds_anything(&self) -> Result<bool, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        holds_rows(&txn)
    }

    /// The database, for the replicated log's state machine.
    pub fn database(&self) -> Arc<Database> {
        Arc::clone(&self.db)
    }

    /// Makes `command`: commits it here, or has the replicated log commit it on a majority of
    /// the management servers and apply it here.
    fn execute(&self, command: Command) -> Result<Outcome, MgmtError> {
        match &self.log {
            Some(log) => log.propose(command),
            None => {
                let txn = self.db.begin_write().map_err(store_error)?;
                let outcome = apply(&txn, &command)?;
                txn.commit().map_err(store_error)?;
                Ok(outcome)
            }
        }?
        .refused()
    }

    /// Registers or re-registers a node; returns its id.
    pub fn register_node(
        &self,
        kind: NodeKind,
        existing: Option<NodeId>,
        record: &NodeRecord,
    ) -> Result<NodeId, MgmtError> {
        let outcome = self.execute(Command::RegisterNode {
            kind: kind_key(kind),
            existing: existing.map(|node| node.0),
            record: record.clone(),
        })?;
        Ok(NodeId(outcome.small_id()?))
    }

    pub fn register_target(
        &self,
        node: NodeId,
        existing: Option<TargetId>,
    ) -> Result<TargetId, MgmtError> {
        match self.execute(Command::RegisterTarget {
            node: node.0,
            existing: existing.map(|target| target.0),
        })? {
            Outcome::TargetRemoved(target) => Err(MgmtError::TargetRemoved(TargetId(target))),
            outcome => Ok(TargetId(outcome.small_id()?)),
        }
    }

    /// Registers a session for `alias`, registered by the client identity `owner` (`None`
    /// for a member).
    pub fn register_client(&self, alias: &str, owner: Option<&str>) -> Result<ClientId, MgmtError> {
        let outcome = self.execute(Command::RegisterClient {
            alias: alias.to_string(),
            owner: owner.map(str::to_string),
        })?;
        Ok(ClientId(outcome.id()?))
    }

    /// Forgets expired client sessions.
    pub fn remove_clients(&self, expired: &[ClientId]) -> Result<(), MgmtError> {
        self.execute(Command::RemoveClients {
            clients: expired.iter().map(|client| client.0).collect(),
        })
        .map(drop)
    }

    /// Commits the state of `kind`'s mirror groups.
    pub fn save_mirror_state(
        &self,
        kind: MirrorKind,
        state: &ControllerDurable,
    ) -> Result<(), MgmtError> {
        self.execute(Command::SaveMirrorState {
            kind: mirror_kind_key(kind),
            state: postcard::to_stdvec(state).map_err(store_error)?,
            // The highest group id ever given, so a removed group's id is not given again.
            highest: state.map.groups.keys().map(|id| id.0).max().unwrap_or(0),
        })
        .map(drop)
    }

    /// Counts `id` as given to a mirror group of `kind` (the highest given stays the
    /// highest).
    pub fn note_mirror_group(&self, kind: MirrorKind, id: u32) -> Result<(), MgmtError> {
        self.execute(Command::NoteMirrorGroup {
            kind: mirror_kind_key(kind),
            id,
        })
        .map(drop)
    }

    /// Commits `rule`, replacing its client's earlier one.
    pub fn set_client_rule(&self, rule: &ClientRule) -> Result<(), MgmtError> {
        self.execute(Command::SetClientRule {
            rule: RuleRecord {
                name: rule.name.clone(),
                read_only: rule.read_only,
                root_squash: rule.root_squash,
                revoked: rule.revoked,
            },
            subtree: rule
                .subtree
                .as_ref()
                .map(|subtree| (subtree.inode.0, subtree.path.clone())),
        })
        .map(drop)
    }

    /// Removes the rule of the client `name`; whether it had one.
    pub fn remove_client_rule(&self, name: &str) -> Result<bool, MgmtError> {
        self.execute(Command::RemoveClientRule {
            name: name.to_string(),
        })?
        .found()
    }

    /// Creates a pool called `name` with the default limits; `None` when one has that name.
    pub fn create_pool(&self, name: &str) -> Result<Option<PoolInfo>, MgmtError> {
        match self.execute(Command::CreatePool {
            name: name.to_string(),
        })? {
            Outcome::Pool(pool) => Ok(pool.map(|(id, record)| PoolInfo {
                id: StoragePoolId(id),
                name: record.name,
                low: record.low,
                emergency: record.emergency,
            })),
            other => Err(other.unexpected()),
        }
    }

    /// Commits `pool`'s name and limits.
    pub fn save_pool(&self, pool: &PoolInfo) -> Result<(), MgmtError> {
        self.execute(Command::SavePool {
            id: pool.id.0,
            pool: PoolRecord {
                name: pool.name.clone(),
                low: pool.low,
                emergency: pool.emergency,
            },
        })
        .map(drop)
    }

    /// Removes pool `id`; whether it was there. The caller checks it holds no target.
    pub fn remove_pool(&self, id: StoragePoolId) -> Result<bool, MgmtError> {
        self.execute(Command::RemovePool { id: id.0 })?.found()
    }

    /// Puts `targets` into pool `to`, in one transaction.
    pub fn set_targets_pool(
        &self,
        targets: &[TargetId],
        to: StoragePoolId,
    ) -> Result<(), MgmtError> {
        match self.execute(Command::SetTargetsPool {
            targets: targets.iter().map(|target| target.0).collect(),
            pool: to.0,
        })? {
            Outcome::NotRegistered(target) => Err(MgmtError::Store(format!(
                "target {} is not registered",
                TargetId(target)
            ))),
            _ => Ok(()),
        }
    }

    /// Commits `rule`, or removes its user's or group's rule in its pool when it sets no limit.
    pub fn set_quota(&self, rule: &QuotaRule) -> Result<(), MgmtError> {
        let limits = rule.limits;
        self.execute(Command::SetQuota {
            key: (rule.kind.key(), rule.id, rule.pool.0),
            limits: (
                limits.soft_bytes,
                limits.hard_bytes,
                limits.soft_inodes,
                limits.hard_inodes,
            ),
        })
        .map(drop)
    }

    /// Has `home` hold `asked` (bytes, inodes) of `key`'s hard limits, or as much of it as
    /// keeps every home's grants together within them; answers what it now holds. An ask the
    /// grants would answer without a change (the same again, or more at a limit already
    /// given out) is answered from them, without a commit.
    pub fn grant_quota(
        &self,
        key: weft_proto::quota::QuotaKey,
        home: NodeId,
        asked: (u64, u64),
    ) -> Result<(u64, u64), MgmtError> {
        let key = (key.kind.key(), key.id, key.pool.0);
        {
            let txn = self.db.begin_read().map_err(store_error)?;
            let rules = txn.open_table(QUOTA_RULES).map_err(store_error)?;
            let grants = txn.open_table(QUOTA_GRANTS).map_err(store_error)?;
            let held = grants
                .get((key.0, key.1, key.2, home.0))
                .map_err(store_error)?
                .map_or((0, 0), |row| row.value());
            if granted(&rules, &grants, key, home.0, asked)? == held {
                return Ok(held);
            }
        }
        match self.execute(Command::GrantQuota {
            key,
            home: home.0,
            asked,
        })? {
            Outcome::Granted(bytes, inodes) => Ok((bytes, inodes)),
            other => Err(other.unexpected()),
        }
    }

    /// Starts (`since` Some) or ends the grace period of `rule`'s soft limit `what`.
    pub fn set_grace(
        &self,
        rule: &QuotaRule,
        what: u8,
        since: Option<u64>,
    ) -> Result<(), MgmtError> {
        self.execute(Command::SetGrace {
            key: (rule.kind.key(), rule.id, rule.pool.0, what),
            since,
        })
        .map(drop)
    }

    /// Starts draining `target` at `unix_ms` (kept if it drains already), or stops it.
    pub fn set_draining(&self, target: TargetId, unix_ms: Option<u64>) -> Result<(), MgmtError> {
        self.execute(Command::SetDraining {
            target: target.0,
            since_ms: unix_ms,
        })
        .map(drop)
    }

    /// Removes `target` from the cluster at `unix_ms`, for good: it leaves its pool, and may
    /// not register again.
    pub fn remove_target(&self, target: TargetId, unix_ms: u64) -> Result<(), MgmtError> {
        self.execute(Command::RemoveTarget {
            target: target.0,
            at_ms: unix_ms,
        })
        .map(drop)
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

    /// The stored state of `kind`'s mirror groups (empty before the first group).
    pub fn mirror_state(&self, kind: MirrorKind) -> Result<ControllerDurable, MgmtError> {
        let txn = self.db.begin_read().map_err(store_error)?;
        let table = txn.open_table(MIRROR_STATE).map_err(store_error)?;
        match table.get(mirror_kind_key(kind)).map_err(store_error)? {
            Some(bytes) => postcard::from_bytes(bytes.value()).map_err(store_error),
            None => Ok(ControllerDurable::default()),
        }
    }

    /// The first map epoch of a management server that starts serving: past every epoch an
    /// earlier one (before a restart, or another server of a replicated management) could
    /// have published, whatever the clocks — at least `clock`, the time in microseconds.
    pub fn start_map_epochs(&self, clock: u64) -> Result<u64, MgmtError> {
        let last = {
            let txn = self.db.begin_read().map_err(store_error)?;
            let counters = txn.open_table(COUNTERS).map_err(store_error)?;
            let last = counters
                .get(MAP_EPOCH_COUNTER)
                .map_err(store_error)?
                .map_or(0, |v| v.value());
            last
        };
        // A server publishes far fewer than 2^32 maps between two starts.
        let epoch = clock.max(last.saturating_add(1 << 32));
        self.execute(Command::NoteMapEpoch { epoch })?;
        Ok(epoch)
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

/// Every row of every table of management's state, as bytes, by table: what a replicated
/// management server sends one too far behind the log to catch up by it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct StateRows {
    tables: Vec<(String, Rows)>,
}

/// A table's rows: (key, value), as redb encodes them.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads every row of the state in one read transaction.
pub(crate) fn state_rows(txn: &ReadTransaction) -> Result<StateRows, MgmtError> {
    fn rows<K: redb::Key + 'static, V: redb::Value + 'static>(
        txn: &ReadTransaction,
        table: TableDefinition<K, V>,
    ) -> Result<(String, Rows), MgmtError> {
        let opened = txn.open_table(table).map_err(store_error)?;
        let mut out = Vec::new();
        for entry in opened.iter().map_err(store_error)? {
            let (key, value) = entry.map_err(store_error)?;
            out.push((
                K::as_bytes(&key.value()).as_ref().to_vec(),
                V::as_bytes(&value.value()).as_ref().to_vec(),
            ));
        }
        Ok((table.name().to_string(), out))
    }
    let mut state = StateRows::default();
    macro_rules! dump {
        ($table:ident) => {
            state.tables.push(rows(txn, $table)?)
        };
    }
    for_each_state_table!(dump);
    Ok(state)
}

/// Whether any table of the state holds a row.
fn holds_rows(txn: &ReadTransaction) -> Result<bool, MgmtError> {
    fn holds<K: redb::Key + 'static, V: redb::Value + 'static>(
        txn: &ReadTransaction,
        table: TableDefinition<K, V>,
    ) -> Result<bool, MgmtError> {
        let opened = txn.open_table(table).map_err(store_error)?;
        Ok(!opened.is_empty().map_err(store_error)?)
    }
    let mut any = false;
    macro_rules! look {
        ($table:ident) => {
            any = any || holds(txn, $table)?
        };
    }
    for_each_state_table!(look);
    Ok(any)
}

/// Replaces the whole state by `state`, in `txn`.
pub(crate) fn load_state_rows(txn: &WriteTransaction, state: &StateRows) -> Result<(), MgmtError> {
    fn load<K: redb::Key + 'static, V: redb::Value + 'static>(
        txn: &WriteTransaction,
        table: TableDefinition<K, V>,
        state: &StateRows,
    ) -> Result<(), MgmtError> {
        txn.delete_table(table).map_err(store_error)?;
        let mut opened = txn.open_table(table).map_err(store_error)?;
        let rows = state
            .tables
            .iter()
            .find(|(name, _)| name == table.name())
            .map(|(_, rows)| rows.as_slice())
            .unwrap_or_default();
        for (key, value) in rows {
            opened
                .insert(K::from_bytes(key), V::from_bytes(value))
                .map_err(store_error)?;
        }
        Ok(())
    }
    macro_rules! replace {
        ($table:ident) => {
            load(txn, $table, state)?
        };
    }
    for_each_state_table!(replace);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_mirror::{Group, Member, MemberState};
    use weft_proto::ids::{GroupId, GroupVersion, MemberId};

    /// `value`'s stored bytes, in hex (the store's tests and the log's).
    pub(super) fn hex<T: Serialize>(value: &T) -> String {
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

    // Goal: the grants of a hard limit together never pass it, whichever home asks and in
    // which order; a home that asks less gives back, and another then gets it; a limit set
    // again keeps them, a rule removed drops them. Method: one store, the grant requests of
    // two homes.
    #[test]
    fn grants_stay_within_the_hard_limit() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MgmtStore::open(dir.path()).expect("store");
        let rule = |hard_bytes| QuotaRule {
            kind: QuotaKind::User,
            id: 65534,
            pool: StoragePoolId::DEFAULT,
            limits: QuotaLimits {
                hard_bytes,
                ..QuotaLimits::default()
            },
        };
        store.set_quota(&rule(8 << 20)).expect("rule");
        let key = weft_proto::quota::QuotaKey {
            kind: QuotaKind::User,
            id: 65534,
            pool: StoragePoolId::DEFAULT,
        };
        let (one, two) = (NodeId(1), NodeId(2));
        let grant = |home, bytes| store.grant_quota(key, home, (bytes, 0)).expect("grant");
        assert_eq!(grant(one, 6 << 20), (6 << 20, 0));
        assert_eq!(grant(two, 6 << 20), (2 << 20, 0), "what home 1 leaves");
        assert_eq!(grant(one, 1 << 20), (1 << 20, 0), "home 1 gives back");
        assert_eq!(grant(two, 6 << 20), (6 << 20, 0));
        assert_eq!(grant(one, 4 << 20), (2 << 20, 0));
        // Lowered: what was given stays until asked again, and nothing more is given.
        store.set_quota(&rule(4 << 20)).expect("lowered");
        assert_eq!(grant(one, 3 << 20), (0, 0));
        assert_eq!(grant(two, 3 << 20), (3 << 20, 0));
        store.set_quota(&rule(0)).expect("removed");
        assert_eq!(grant(one, 16 << 20), (16 << 20, 0), "no limit cuts nothing");
    }

    // Goal: a management server that installs another's snapshot holds what that one holds,
    // and allocates the same next ids.
    #[test]
    fn a_snapshot_carries_the_whole_state() {
        let (dir_a, dir_b) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let a = MgmtStore::open(dir_a.path()).expect("store a");
        let b = MgmtStore::open(dir_b.path()).expect("store b");
        let record = NodeRecord {
            alias: "storage-1".into(),
            addresses: vec!["10.0.0.1:1".into()],
        };
        let node = a
            .register_node(NodeKind::Storage, None, &record)
            .expect("node");
        let target = a.register_target(node, None).expect("target");
        a.register_client("host", Some("reader")).expect("client");
        a.create_pool("fast").expect("pool").expect("created");
        a.set_draining(target, Some(7)).expect("drain");
        // b held something of its own: replaced, not merged.
        b.register_node(NodeKind::Meta, None, &record)
            .expect("b's node");

        let rows = state_rows(&a.db.begin_read().expect("read")).expect("rows");
        let txn = b.db.begin_write().expect("write");
        load_state_rows(&txn, &rows).expect("load");
        txn.commit().expect("commit");

        let nodes = |store: &MgmtStore| store.nodes().expect("nodes");
        assert_eq!(nodes(&a), nodes(&b));
        assert_eq!(
            format!("{:?}", a.targets().expect("targets")),
            format!("{:?}", b.targets().expect("targets"))
        );
        assert_eq!(a.pools().expect("pools"), b.pools().expect("pools"));
        assert_eq!(
            a.session_owners().expect("owners"),
            b.session_owners().expect("owners")
        );
        assert_eq!(
            a.draining().expect("draining"),
            b.draining().expect("draining")
        );
        assert_eq!(
            a.register_target(node, None).expect("next on a"),
            b.register_target(node, None).expect("next on b"),
            "the counters came along"
        );
    }

    // Goal: an id past the last one is refused the same way on every server, changing
    // nothing (an error instead would stop the replicated log on every server for good).
    #[test]
    fn an_id_past_the_last_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let store = MgmtStore::open(dir.path()).expect("store");
        assert!(
            !store.holds_anything().expect("read"),
            "a new store is empty"
        );
        let record = NodeRecord {
            alias: "m".into(),
            addresses: vec!["a:1".into()],
        };
        let last = store
            .register_node(NodeKind::Meta, Some(NodeId(u32::MAX)), &record)
            .expect("the last id is kept");
        assert_eq!(last, NodeId(u32::MAX));
        let before = store.nodes().expect("nodes");
        let refused = store.register_node(NodeKind::Meta, None, &record);
        assert!(
            matches!(refused, Err(MgmtError::Refused(ref why)) if why.contains("no meta_node id")),
            "{refused:?}"
        );
        assert_eq!(store.nodes().expect("nodes"), before);
        assert!(store.holds_anything().expect("read"));
    }
}
