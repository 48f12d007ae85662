//! The commands of management's replicated log ([`Command`]), what each came to
//! ([`Outcome`]), and how every management server applies them ([`apply`]): the same way on
//! each, from the state it applies them to. Both carry wire tags written in the source
//! (`#[derive(Wire)]`), and every variant's bytes are golden: a log written by one build is
//! applied by the next (docs/design/on-disk-format.md).

use super::*;
use weft_proto::wire::Wire;

/// A change of management's durable state, as [`MgmtStore::execute`] makes it and the
/// replicated log carries it: stored records and plain numbers, so its bytes keep their
/// meaning in a log written by an older build. Applied by [`apply`], the same way by every
/// management server: whatever it allocates (ids) comes from the state it is applied to.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub(crate) enum Command {
    /// A node registers: keeps `existing`, or is given the next id of its kind.
    #[wire(tag = 0)]
    RegisterNode {
        kind: u8,
        existing: Option<u32>,
        record: NodeRecord,
    },
    /// A storage target registers: keeps `existing` (unless it was removed), or is given the
    /// next id.
    #[wire(tag = 1)]
    RegisterTarget { node: u32, existing: Option<u32> },
    /// A client session opens.
    #[wire(tag = 2)]
    RegisterClient {
        alias: String,
        owner: Option<String>,
    },
    /// Expired client sessions are forgotten.
    #[wire(tag = 3)]
    RemoveClients { clients: Vec<u64> },
    /// The state of a kind's mirror groups (a postcard [`ControllerDurable`]), and the highest
    /// group id in it.
    #[wire(tag = 4)]
    SaveMirrorState {
        kind: u8,
        state: Vec<u8>,
        highest: u32,
    },
    /// A mirror group id is counted as given.
    #[wire(tag = 5)]
    NoteMirrorGroup { kind: u8, id: u32 },
    /// A client identity's rule, with its subtree (directory inode, path).
    #[wire(tag = 6)]
    SetClientRule {
        rule: RuleRecord,
        subtree: Option<(u64, String)>,
    },
    #[wire(tag = 7)]
    RemoveClientRule { name: String },
    /// A pool is created, unless one has the name.
    #[wire(tag = 8)]
    CreatePool { name: String },
    #[wire(tag = 9)]
    SavePool { id: u16, pool: PoolRecord },
    #[wire(tag = 10)]
    RemovePool { id: u16 },
    /// Targets move into a pool, all or none.
    #[wire(tag = 11)]
    SetTargetsPool { targets: Vec<u32>, pool: u16 },
    /// A quota rule (soft and hard bytes, soft and hard inodes); all zero removes it. Its
    /// grace periods end.
    #[wire(tag = 12)]
    SetQuota {
        key: QuotaKey,
        limits: (u64, u64, u64, u64),
    },
    #[wire(tag = 13)]
    SetGrace {
        key: (u8, u32, u16, u8),
        since: Option<u64>,
    },
    #[wire(tag = 14)]
    SetDraining { target: u32, since_ms: Option<u64> },
    #[wire(tag = 15)]
    RemoveTarget { target: u32, at_ms: u64 },
    /// A management server starts serving with map epochs from `epoch` on (the highest
    /// noted stays).
    #[wire(tag = 16)]
    NoteMapEpoch { epoch: u64 },
    /// A metadata home asks to hold (bytes, inodes) of a hard quota: it is given what keeps
    /// every home's grants together within the rule's hard limits ([`granted`]).
    #[wire(tag = 17)]
    GrantQuota {
        key: QuotaKey,
        home: u32,
        asked: (u64, u64),
    },
}

/// What a [`Command`] came to, as it is answered to whoever made it.
#[derive(Clone, Debug, PartialEq, Eq, Wire)]
pub(crate) enum Outcome {
    #[wire(tag = 0)]
    Done,
    /// The id given (a node's, a target's, a client session's).
    #[wire(tag = 1)]
    Id(u64),
    /// Whether what was removed was there.
    #[wire(tag = 2)]
    Found(bool),
    /// The pool created, or `None` when one had its name.
    #[wire(tag = 3)]
    Pool(Option<(u16, PoolRecord)>),
    /// Refused: the target was removed from the cluster.
    #[wire(tag = 4)]
    TargetRemoved(u32),
    /// Refused: the target is not registered.
    #[wire(tag = 5)]
    NotRegistered(u32),
    /// Refused, the same way on every server (an id past the last one, say): nothing changed.
    #[wire(tag = 6)]
    Refused(String),
    /// What a home now holds of a hard quota (bytes, inodes).
    #[wire(tag = 7)]
    Granted(u64, u64),
}

impl Outcome {
    pub(super) fn id(self) -> Result<u64, MgmtError> {
        match self {
            Outcome::Id(id) => Ok(id),
            other => Err(other.unexpected()),
        }
    }

    /// The error a refusal is, or the outcome.
    pub(super) fn refused(self) -> Result<Outcome, MgmtError> {
        match self {
            Outcome::Refused(why) => Err(MgmtError::Refused(why)),
            outcome => Ok(outcome),
        }
    }

    /// A node's or a target's id.
    pub(super) fn small_id(self) -> Result<u32, MgmtError> {
        u32::try_from(self.id()?).map_err(store_error)
    }

    pub(super) fn found(self) -> Result<bool, MgmtError> {
        match self {
            Outcome::Found(found) => Ok(found),
            other => Err(other.unexpected()),
        }
    }

    pub(super) fn unexpected(&self) -> MgmtError {
        MgmtError::Store(format!("a change of the store came to {self:?}"))
    }
}

/// Gives the next id of `counter`, or keeps `existing` and moves the counter past it (a node
/// keeps the id it saved, even one this store has never seen: a restored management store);
/// `None`, changing nothing, when the id would pass `max`.
fn allocate(
    txn: &WriteTransaction,
    counter: &str,
    existing: Option<u64>,
    max: u64,
) -> Result<Option<u64>, MgmtError> {
    let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
    let last = counters
        .get(counter)
        .map_err(store_error)?
        .map_or(0, |v| v.value());
    let id = match existing {
        Some(id) if id <= max => id,
        None if last < max => last + 1,
        _ => return Ok(None),
    };
    if id > last {
        counters.insert(counter, id).map_err(store_error)?;
    }
    Ok(Some(id))
}

/// Applies `command` in `txn`: what every management server does with each command of the
/// log, and a server alone with each change. Refusals ([`Outcome::TargetRemoved`],
/// [`Outcome::NotRegistered`]) change nothing; an error is the store's own failure.
///
/// # Panics
/// When the state it is applied to breaks an invariant of the log: a new id already in use,
/// a mirror group's version going back, a group without members or whose primary is not
/// one. Every server applies the same log, so the state is the bug report.
pub(crate) fn apply(txn: &WriteTransaction, command: &Command) -> Result<Outcome, MgmtError> {
    match command {
        Command::RegisterNode {
            kind,
            existing,
            record,
        } => register_node(txn, *kind, *existing, record),
        Command::RegisterTarget { node, existing } => register_target(txn, *node, *existing),
        Command::RegisterClient { alias, owner } => register_client(txn, alias, owner.as_deref()),
        Command::RemoveClients { clients: expired } => {
            let mut clients = txn.open_table(CLIENTS).map_err(store_error)?;
            let mut owners = txn.open_table(SESSION_OWNERS).map_err(store_error)?;
            for client in expired {
                clients.remove(*client).map_err(store_error)?;
                owners.remove(*client).map_err(store_error)?;
            }
            Ok(Outcome::Done)
        }
        Command::SaveMirrorState {
            kind,
            state,
            highest,
        } => save_mirror_state(txn, *kind, state, *highest),
        Command::NoteMirrorGroup { kind, id } => {
            raise_group_counter(txn, *kind, *id)?;
            Ok(Outcome::Done)
        }
        Command::NoteMapEpoch { epoch } => {
            raise_counter(txn, MAP_EPOCH_COUNTER, *epoch)?;
            Ok(Outcome::Done)
        }
        Command::SetClientRule { rule, subtree } => set_client_rule(txn, rule, subtree.as_ref()),
        Command::RemoveClientRule { name } => {
            let removed = txn
                .open_table(CLIENT_RULES)
                .map_err(store_error)?
                .remove(name.as_str())
                .map_err(store_error)?
                .is_some();
            txn.open_table(CLIENT_SUBTREES)
                .map_err(store_error)?
                .remove(name.as_str())
                .map_err(store_error)?;
            Ok(Outcome::Found(removed))
        }
        Command::CreatePool { name } => create_pool(txn, name),
        Command::SavePool { id, pool } => {
            save_pool(txn, *id, pool)?;
            Ok(Outcome::Done)
        }
        Command::RemovePool { id } => {
            let removed = txn
                .open_table(POOLS)
                .map_err(store_error)?
                .remove(*id)
                .map_err(store_error)?
                .is_some();
            Ok(Outcome::Found(removed))
        }
        Command::SetTargetsPool { targets, pool } => set_targets_pool(txn, targets, *pool),
        Command::SetQuota { key, limits } => set_quota(txn, *key, *limits),
        Command::GrantQuota { key, home, asked } => grant_quota(txn, *key, *home, *asked),
        Command::SetGrace { key, since } => {
            let mut table = txn.open_table(QUOTA_GRACE).map_err(store_error)?;
            match since {
                Some(since) => table.insert(*key, *since).map(drop),
                None => table.remove(*key).map(drop),
            }
            .map_err(store_error)?;
            Ok(Outcome::Done)
        }
        Command::SetDraining { target, since_ms } => {
            let mut table = txn.open_table(DRAINING).map_err(store_error)?;
            match since_ms {
                Some(_) if table.get(*target).map_err(store_error)?.is_some() => {}
                Some(at) => drop(table.insert(*target, *at).map_err(store_error)?),
                None => drop(table.remove(*target).map_err(store_error)?),
            }
            Ok(Outcome::Done)
        }
        Command::RemoveTarget { target, at_ms } => remove_target(txn, *target, *at_ms),
    }
}

/// A node registers: keeps `existing`, or is given the next id of its kind.
fn register_node(
    txn: &WriteTransaction,
    kind: u8,
    existing: Option<u32>,
    record: &NodeRecord,
) -> Result<Outcome, MgmtError> {
    let counter = match kind_from_key(kind) {
        Some(NodeKind::Meta) => "meta_node",
        Some(NodeKind::Storage) => "storage_node",
        Some(NodeKind::Management) => "management_node",
        None => return Err(MgmtError::Store(format!("no node kind {kind}"))),
    };
    let Some(node) = allocate(txn, counter, existing.map(u64::from), u32::MAX.into())? else {
        return Ok(Outcome::Refused(format!("no {counter} id is left")));
    };
    let node = node as u32;
    let bytes = postcard::to_stdvec(record).map_err(store_error)?;
    let mut nodes = txn.open_table(NODES).map_err(store_error)?;
    let before = nodes
        .insert((kind, node), bytes.as_slice())
        .map_err(store_error)?;
    assert!(
        existing.is_some() || before.is_none(),
        "node id {node} of kind {kind} was given anew, but node {:?} holds it: the counter {counter} went back",
        before.map(|old| postcard::from_bytes::<NodeRecord>(old.value()))
    );
    Ok(Outcome::Id(u64::from(node)))
}

/// A storage target registers: keeps `existing` (unless it was removed), or is given the next
/// id, in the pool it was in.
fn register_target(
    txn: &WriteTransaction,
    node: u32,
    existing: Option<u32>,
) -> Result<Outcome, MgmtError> {
    if let Some(target) = existing {
        let removed = txn.open_table(REMOVED_TARGETS).map_err(store_error)?;
        if removed.get(target).map_err(store_error)?.is_some() {
            return Ok(Outcome::TargetRemoved(target));
        }
    }
    let Some(target) = allocate(txn, "target", existing.map(u64::from), u32::MAX.into())? else {
        return Ok(Outcome::Refused("no target id is left".into()));
    };
    let target = target as u32;
    let mut targets = txn.open_table(TARGETS).map_err(store_error)?;
    let held = match targets.get(target).map_err(store_error)? {
        Some(bytes) => {
            Some(postcard::from_bytes::<TargetRecord>(bytes.value()).map_err(store_error)?)
        }
        None => None,
    };
    assert!(
        existing.is_some() || held.is_none(),
        "target id {target} was given anew to node {node}, but {held:?} holds it: the target counter went back"
    );
    let record = TargetRecord {
        node: NodeId(node),
        pool: held.map_or(StoragePoolId::DEFAULT, |held| held.pool),
    };
    let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
    targets
        .insert(target, bytes.as_slice())
        .map_err(store_error)?;
    Ok(Outcome::Id(u64::from(target)))
}

/// A client session opens, with the identity that registered it.
fn register_client(
    txn: &WriteTransaction,
    alias: &str,
    owner: Option<&str>,
) -> Result<Outcome, MgmtError> {
    let Some(client) = allocate(txn, "client", None, u64::MAX)? else {
        return Ok(Outcome::Refused("no client session id is left".into()));
    };
    let before = txn
        .open_table(CLIENTS)
        .map_err(store_error)?
        .insert(client, alias)
        .map_err(store_error)?
        .map(|old| old.value().to_string());
    assert!(
        before.is_none(),
        "client session {client} was given anew to {alias:?}, but {before:?} holds it: the client counter went back"
    );
    if let Some(owner) = owner {
        txn.open_table(SESSION_OWNERS)
            .map_err(store_error)?
            .insert(client, owner)
            .map_err(store_error)?;
    }
    Ok(Outcome::Id(client))
}

/// The state of a kind's mirror groups is saved (and the highest group id in it counted).
/// No group goes back to an older version, and each has members, its primary among them.
fn save_mirror_state(
    txn: &WriteTransaction,
    kind: u8,
    state: &[u8],
    highest: u32,
) -> Result<Outcome, MgmtError> {
    let mut table = txn.open_table(MIRROR_STATE).map_err(store_error)?;
    let decode =
        |bytes: &[u8]| postcard::from_bytes::<ControllerDurable>(bytes).map_err(store_error);
    let new = decode(state)?;
    let before = table
        .insert(kind, state)
        .map_err(store_error)?
        .map(|old| decode(old.value()))
        .transpose()?;
    for group in new.map.groups.values() {
        assert!(
            group.members.iter().any(|member| member.server == group.primary),
            "mirror group {} of kind {kind} is saved without members, or without its primary among them: {group:?}",
            group.id
        );
        if let Some(old) = before
            .as_ref()
            .and_then(|old| old.map.groups.get(&group.id))
        {
            assert!(
                group.version >= old.version,
                "mirror group {} of kind {kind} went back from {old:?} to {group:?}",
                group.id
            );
        }
    }
    drop(table);
    raise_group_counter(txn, kind, highest)?;
    Ok(Outcome::Done)
}

/// A client identity's rule, with its subtree (directory inode, path).
fn set_client_rule(
    txn: &WriteTransaction,
    rule: &RuleRecord,
    subtree: Option<&(u64, String)>,
) -> Result<Outcome, MgmtError> {
    let bytes = postcard::to_stdvec(rule).map_err(store_error)?;
    txn.open_table(CLIENT_RULES)
        .map_err(store_error)?
        .insert(rule.name.as_str(), bytes.as_slice())
        .map_err(store_error)?;
    let mut subtrees = txn.open_table(CLIENT_SUBTREES).map_err(store_error)?;
    match subtree {
        Some((inode, path)) => subtrees
            .insert(rule.name.as_str(), (*inode, path.as_str()))
            .map(drop),
        None => subtrees.remove(rule.name.as_str()).map(drop),
    }
    .map_err(store_error)?;
    Ok(Outcome::Done)
}

/// A pool is created, unless one has the name.
fn create_pool(txn: &WriteTransaction, name: &String) -> Result<Outcome, MgmtError> {
    // The default pool is stored only once its limits change.
    let mut names = vec![PoolInfo::default_pool().name];
    {
        let pools = txn.open_table(POOLS).map_err(store_error)?;
        for entry in pools.iter().map_err(store_error)? {
            let (id, value) = entry.map_err(store_error)?;
            let record: PoolRecord = postcard::from_bytes(value.value()).map_err(store_error)?;
            if id.value() == StoragePoolId::DEFAULT.0 {
                names[0] = record.name;
            } else {
                names.push(record.name);
            }
        }
    }
    if names.contains(name) {
        return Ok(Outcome::Pool(None));
    }
    let default = u64::from(StoragePoolId::DEFAULT.0);
    let mut counters = txn.open_table(COUNTERS).map_err(store_error)?;
    let last = counters
        .get("pool")
        .map_err(store_error)?
        .map_or(default, |v| v.value())
        .max(default);
    let Ok(id) = u16::try_from(last + 1) else {
        return Ok(Outcome::Refused("no pool id is left".into()));
    };
    counters.insert("pool", last + 1).map_err(store_error)?;
    drop(counters);
    let pool = PoolInfo::new(StoragePoolId(id), name.clone());
    let record = PoolRecord {
        name: pool.name,
        low: pool.low,
        emergency: pool.emergency,
    };
    save_pool(txn, id, &record)?;
    Ok(Outcome::Pool(Some((id, record))))
}

/// Targets move into a pool, all or none.
fn set_targets_pool(
    txn: &WriteTransaction,
    targets: &[u32],
    pool: u16,
) -> Result<Outcome, MgmtError> {
    let mut table = txn.open_table(TARGETS).map_err(store_error)?;
    let mut records = Vec::with_capacity(targets.len());
    for &target in targets {
        let Some(bytes) = table.get(target).map_err(store_error)? else {
            return Ok(Outcome::NotRegistered(target));
        };
        let record: TargetRecord = postcard::from_bytes(bytes.value()).map_err(store_error)?;
        records.push((target, record));
    }
    for (target, mut record) in records {
        record.pool = StoragePoolId(pool);
        let bytes = postcard::to_stdvec(&record).map_err(store_error)?;
        table
            .insert(target, bytes.as_slice())
            .map_err(store_error)?;
    }
    Ok(Outcome::Done)
}

/// A quota rule is set (all zero removes it, with its grants); its grace periods end.
fn set_quota(
    txn: &WriteTransaction,
    key: QuotaKey,
    limits: (u64, u64, u64, u64),
) -> Result<Outcome, MgmtError> {
    let mut rules = txn.open_table(QUOTA_RULES).map_err(store_error)?;
    if limits == (0, 0, 0, 0) {
        rules.remove(key).map_err(store_error)?;
    } else {
        rules.insert(key, limits).map_err(store_error)?;
    }
    // A rule removed takes its grants with it. A rule set anew keeps them: each home
    // forgets what it held of a changed limit and tells management what it needs.
    if limits == (0, 0, 0, 0) {
        let mut grants = txn.open_table(QUOTA_GRANTS).map_err(store_error)?;
        grants
            .retain_in(
                (key.0, key.1, key.2, 0)..=(key.0, key.1, key.2, u32::MAX),
                |_, _| false,
            )
            .map_err(store_error)?;
    }
    let mut grace = txn.open_table(QUOTA_GRACE).map_err(store_error)?;
    for what in [0, 1] {
        grace
            .remove((key.0, key.1, key.2, what))
            .map_err(store_error)?;
    }
    Ok(Outcome::Done)
}

/// A home is given what it may hold of a hard quota ([`granted`]).
fn grant_quota(
    txn: &WriteTransaction,
    key: QuotaKey,
    home: u32,
    asked: (u64, u64),
) -> Result<Outcome, MgmtError> {
    let rules = txn.open_table(QUOTA_RULES).map_err(store_error)?;
    let mut grants = txn.open_table(QUOTA_GRANTS).map_err(store_error)?;
    let given = granted(&rules, &grants, key, home, asked)?;
    let row = (key.0, key.1, key.2, home);
    if given == (0, 0) {
        grants.remove(row).map_err(store_error)?;
    } else {
        grants.insert(row, given).map_err(store_error)?;
    }
    Ok(Outcome::Granted(given.0, given.1))
}

/// A target leaves the cluster for good: its id is never given again.
fn remove_target(txn: &WriteTransaction, target: u32, at_ms: u64) -> Result<Outcome, MgmtError> {
    txn.open_table(TARGETS)
        .map_err(store_error)?
        .remove(target)
        .map_err(store_error)?;
    txn.open_table(DRAINING)
        .map_err(store_error)?
        .remove(target)
        .map_err(store_error)?;
    txn.open_table(REMOVED_TARGETS)
        .map_err(store_error)?
        .insert(target, at_ms)
        .map_err(store_error)?;
    Ok(Outcome::Done)
}

fn save_pool(txn: &WriteTransaction, id: u16, record: &PoolRecord) -> Result<(), MgmtError> {
    let bytes = postcard::to_stdvec(record).map_err(store_error)?;
    txn.open_table(POOLS)
        .map_err(store_error)?
        .insert(id, bytes.as_slice())
        .map_err(store_error)?;
    Ok(())
}

/// What `home` may hold of `key`'s hard limits when it asks `asked` (bytes, inodes): the ask,
/// cut to what the other homes' grants leave of each hard limit (a limit of 0 cuts nothing).
pub(super) fn granted(
    rules: &impl ReadableTable<QuotaKey, (u64, u64, u64, u64)>,
    grants: &impl ReadableTable<(u8, u32, u16, u32), (u64, u64)>,
    key: QuotaKey,
    home: u32,
    asked: (u64, u64),
) -> Result<(u64, u64), MgmtError> {
    let (_, hard_bytes, _, hard_inodes) = rules
        .get(key)
        .map_err(store_error)?
        .map_or((0, 0, 0, 0), |rule| rule.value());
    let mut others = (0u64, 0u64);
    for entry in grants
        .range((key.0, key.1, key.2, 0)..=(key.0, key.1, key.2, u32::MAX))
        .map_err(store_error)?
    {
        let (row, held) = entry.map_err(store_error)?;
        if row.value().3 != home {
            let (bytes, inodes) = held.value();
            others = (
                others.0.saturating_add(bytes),
                others.1.saturating_add(inodes),
            );
        }
    }
    let cut = |asked: u64, hard: u64, others: u64| match hard {
        0 => asked,
        hard => asked.min(hard.saturating_sub(others)),
    };
    let given = (
        cut(asked.0, hard_bytes, others.0),
        cut(asked.1, hard_inodes, others.1),
    );
    // What is given keeps the grants together within each hard limit.
    assert!(hard_bytes == 0 || given.0 == 0 || given.0 + others.0 <= hard_bytes);
    assert!(hard_inodes == 0 || given.1 == 0 || given.1 + others.1 <= hard_inodes);
    Ok(given)
}

#[cfg(test)]
mod tests {
    use super::super::tests::hex;
    use super::*;
    use weft_mirror::{Group, Member, MemberState};
    use weft_proto::ids::{GroupId, GroupVersion, MemberId};

    fn group(version: u64, primary: u32, members: &[u32]) -> Group {
        Group {
            id: GroupId(3),
            version: GroupVersion(version),
            primary: MemberId(primary),
            members: members
                .iter()
                .map(|server| Member {
                    server: MemberId(*server),
                    state: MemberState::Good,
                })
                .collect(),
            loss_epoch: 1,
        }
    }

    fn mirror_state(groups: &[Group]) -> Vec<u8> {
        let mut state = ControllerDurable::default();
        for group in groups {
            state.map.groups.insert(group.id, group.clone());
        }
        postcard::to_stdvec(&state).expect("state encodes")
    }

    /// A command of every kind, with the bytes it is logged as.
    fn commands() -> Vec<(Command, &'static str)> {
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
        vec![
            (
                Command::RegisterNode {
                    kind: 2,
                    existing: None,
                    record: NodeRecord {
                        alias: "s".into(),
                        addresses: vec!["a:1".into()],
                    },
                },
                "00020001730103613a31",
            ),
            (
                Command::RegisterTarget {
                    node: 2,
                    existing: Some(7),
                },
                "01020107",
            ),
            (
                Command::RegisterClient {
                    alias: "h".into(),
                    owner: Some("c".into()),
                },
                "020168010163",
            ),
            (
                Command::RemoveClients {
                    clients: vec![4, 300],
                },
                "030204ac02",
            ),
            (
                Command::SaveMirrorState {
                    kind: 1,
                    state: vec![1, 2],
                    highest: 3,
                },
                "040102010203",
            ),
            (Command::NoteMirrorGroup { kind: 0, id: 9 }, "050009"),
            (
                Command::SetClientRule {
                    rule: RuleRecord {
                        name: "n".into(),
                        read_only: true,
                        root_squash: false,
                        revoked: false,
                    },
                    subtree: Some((5, "/d".into())),
                },
                "06016e0100000105022f64",
            ),
            (Command::RemoveClientRule { name: "n".into() }, "07016e"),
            (
                Command::CreatePool {
                    name: "fast".into(),
                },
                "080466617374",
            ),
            (
                Command::SavePool { id: 2, pool },
                "090204666173748008050201",
            ),
            (Command::RemovePool { id: 2 }, "0a02"),
            (
                Command::SetTargetsPool {
                    targets: vec![1, 2],
                    pool: 2,
                },
                "0b02010202",
            ),
            (
                Command::SetQuota {
                    key: (0, 65534, 1),
                    limits: (1, 2, 3, 4),
                },
                "0c00feff030101020304",
            ),
            (
                Command::SetGrace {
                    key: (1, 100, 1, 0),
                    since: Some(6),
                },
                "0d016401000106",
            ),
            (
                Command::SetDraining {
                    target: 3,
                    since_ms: Some(5),
                },
                "0e030105",
            ),
            (
                Command::RemoveTarget {
                    target: 3,
                    at_ms: 8,
                },
                "0f0308",
            ),
            (Command::NoteMapEpoch { epoch: 300 }, "10ac02"),
            (
                Command::GrantQuota {
                    key: (0, 65534, 1),
                    home: 2,
                    asked: (5, 1),
                },
                "1100feff0301020501",
            ),
        ]
    }

    /// An outcome of every kind, with the bytes it is answered as.
    fn outcomes() -> Vec<(Outcome, &'static str)> {
        let pool = PoolRecord {
            name: "p".into(),
            low: CapacityLimits {
                free_bytes: 1,
                free_inodes: 0,
            },
            emergency: CapacityLimits {
                free_bytes: 0,
                free_inodes: 0,
            },
        };
        vec![
            (Outcome::Done, "00"),
            (Outcome::Id(300), "01ac02"),
            (Outcome::Found(true), "0201"),
            (Outcome::Pool(Some((2, pool))), "030102017001000000"),
            (Outcome::TargetRemoved(4), "0404"),
            (Outcome::NotRegistered(4), "0504"),
            (Outcome::Refused("no".into()), "06026e6f"),
            (Outcome::Granted(5, 1), "070501"),
        ]
    }

    // Goal: the commands of the replicated log, and what they come to, keep their bytes: a log
    // written by one build is applied by the next (docs/design/on-disk-format.md). Every
    // variant has its sample, and each decodes back to itself.
    #[test]
    fn commands_keep_their_bytes() {
        let commands = commands();
        for (tag, name) in Command::WIRE_TAGS {
            assert!(
                commands
                    .iter()
                    .any(|(command, _)| command.wire_tag() == *tag),
                "no sample of Command::{name}"
            );
        }
        for (command, bytes) in &commands {
            assert_eq!(hex(command), *bytes, "{command:?}");
            let decoded: Command =
                postcard::from_bytes(&postcard::to_stdvec(command).expect("encodes"))
                    .expect("decodes");
            assert_eq!(&decoded, command);
        }
        let outcomes = outcomes();
        for (tag, name) in Outcome::WIRE_TAGS {
            assert!(
                outcomes
                    .iter()
                    .any(|(outcome, _)| outcome.wire_tag() == *tag),
                "no sample of Outcome::{name}"
            );
        }
        for (outcome, bytes) in &outcomes {
            assert_eq!(hex(outcome), *bytes, "{outcome:?}");
            let decoded: Outcome =
                postcard::from_bytes(&postcard::to_stdvec(outcome).expect("encodes"))
                    .expect("decodes");
            assert_eq!(&decoded, outcome);
        }
    }

    fn store() -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().expect("dir");
        let db = Database::create(dir.path().join("mgmt.redb")).expect("store");
        (dir, db)
    }

    fn applied(db: &Database, command: &Command) -> Outcome {
        let txn = db.begin_write().expect("txn");
        let outcome = apply(&txn, command).expect("applied");
        txn.commit().expect("commit");
        outcome
    }

    // Goal: ids given anew are never ones in use, whatever was kept before: a node that keeps
    // its id moves the counter past it, so the next new node gets the id after.
    #[test]
    fn ids_given_anew_are_past_every_kept_one() {
        let (_dir, db) = store();
        let node = |existing| Command::RegisterNode {
            kind: 2,
            existing,
            record: NodeRecord {
                alias: "s".into(),
                addresses: vec!["a:1".into()],
            },
        };
        assert_eq!(applied(&db, &node(Some(5))), Outcome::Id(5));
        assert_eq!(applied(&db, &node(None)), Outcome::Id(6));
        let client = Command::RegisterClient {
            alias: "h".into(),
            owner: None,
        };
        assert_eq!(applied(&db, &client), Outcome::Id(1));
        assert_eq!(applied(&db, &client), Outcome::Id(2));
    }

    // Goal: the log's apply refuses to go on from a state a bug broke: a mirror group going
    // back to an older version, or saved without its primary among its members, stops the
    // server with the state in the message instead of publishing it.
    #[test]
    fn mirror_state_never_goes_back_nor_loses_its_primary() {
        let (_dir, db) = store();
        let save = |groups: &[Group]| Command::SaveMirrorState {
            kind: 1,
            state: mirror_state(groups),
            highest: 3,
        };
        applied(&db, &save(&[group(4, 1, &[1, 2])]));
        applied(&db, &save(&[group(5, 2, &[1, 2])]));
        let back = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            applied(&db, &save(&[group(3, 2, &[1, 2])]))
        }));
        let message = *back
            .expect_err("refused")
            .downcast::<String>()
            .expect("a message");
        assert!(message.contains("went back"), "{message}");
        let orphaned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            applied(&db, &save(&[group(6, 7, &[1, 2])]))
        }));
        let message = *orphaned
            .expect_err("refused")
            .downcast::<String>()
            .expect("a message");
        assert!(message.contains("without its primary"), "{message}");
    }
}
