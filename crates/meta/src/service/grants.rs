//! Hard quotas, held where the inodes are counted (docs/design/quotas.md): each home holds a
//! grant from management of every hard-limited user's, group's and project's use, and lets
//! that use grow only within it. What a home's inodes use there (the usage table, changed
//! in their transactions), the room it reserved for its writers to grow their files into,
//! and the growth of operations between their check and their commit, together never pass
//! what it holds; management gives out grants that together stay within the limit. So a hard
//! limit holds in file sizes and inodes, whatever the number of homes, writers and targets,
//! but for what the rooms of a crashed home had given (see the design).
//!
//! [`Ledger`] is the arithmetic, without I/O; [`Meta::reserve`] and [`Meta::charge`] ask
//! management when it says a grant is short.

use super::sessions::OpenHandle;
use super::Meta;
use crate::schema::{load_inode, InodeRecord, OpError, INODES};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use weft_net::MgmtCalls;
use weft_proto::access::{GrowthBound, WRITE};
use weft_proto::ids::{ClientId, InodeId, StoragePoolId};
use weft_proto::messages::MetaResponse;
use weft_proto::quota::{Owner, QuotaHard, QuotaKey};
use weft_proto::ErrorCode;

/// The most room one reserve gives an open beyond the end it asked for: a streaming writer
/// asks its home once per this many bytes.
pub(crate) const ROOM_BATCH_MAX: u64 = 4 << 20;
/// The least, for small limits.
const ROOM_BATCH_MIN: u64 = 64 << 10;
/// How many batches a home asks management for beyond what it needs now, so it asks once
/// per several reserves; it gives back what it holds past twice that.
const GRANT_SLACK_BATCHES: u64 = 4;
/// The least inodes a home asks for at a time beyond what it needs now.
const INODE_BATCH_MIN: u64 = 16;
/// The most.
const INODE_BATCH_MAX: u64 = 4096;

/// The batch of room for limits `limits`: a sixteenth of the smallest byte limit, within
/// [`ROOM_BATCH_MIN`] and [`ROOM_BATCH_MAX`].
fn batch(limits: &[QuotaHard]) -> u64 {
    sixteenth(limits, |hard| hard.bytes, (ROOM_BATCH_MIN, ROOM_BATCH_MAX)).unwrap_or(ROOM_BATCH_MAX)
}

/// The batch of inodes for limits `limits`: a sixteenth of the smallest inode limit, within
/// [`INODE_BATCH_MIN`] and [`INODE_BATCH_MAX`].
fn inode_batch(limits: &[QuotaHard]) -> u64 {
    sixteenth(
        limits,
        |hard| hard.inodes,
        (INODE_BATCH_MIN, INODE_BATCH_MAX),
    )
    .unwrap_or(INODE_BATCH_MIN)
}

/// A sixteenth of the smallest of `limits`' limits `of` picks (0: none), within `(min,
/// max)`; `None` when none is set.
fn sixteenth(
    limits: &[QuotaHard],
    of: impl Fn(&QuotaHard) -> u64,
    (min, max): (u64, u64),
) -> Option<u64> {
    limits
        .iter()
        .map(of)
        .filter(|limit| *limit > 0)
        .map(|limit| (limit / 16).clamp(min, max))
        .min()
}

/// What a file counts in its quotas' bytes: its size, or the end of what was allocated past
/// it, whichever is larger (`schema/usage.rs`).
fn counted(record: &InodeRecord) -> u64 {
    record.size.max(record.allocated)
}

/// The room reserved for the writers of one file: each session's end, counted once past
/// the file's counted size (the furthest end of them all).
struct Rooms {
    keys: Vec<QuotaKey>,
    /// The file's bytes as the usage table counts them now.
    counted: u64,
    ends: HashMap<ClientId, u64>,
}

impl Rooms {
    fn furthest(&self) -> u64 {
        self.ends.values().copied().max().unwrap_or(0)
    }

    fn bytes(&self) -> u64 {
        self.furthest().saturating_sub(self.counted)
    }
}

/// Growth an operation makes in one commit, counted from its check to its commit.
struct Pending {
    keys: Vec<QuotaKey>,
    growth: (u64, u64),
}

/// What a home holds of each hard quota, and what counts against it besides its inodes' use.
#[derive(Default)]
pub(crate) struct Ledger {
    /// The hard limits the grants were given under, as the map last listed them.
    limits: Vec<QuotaHard>,
    /// (bytes, inodes) held of each quota.
    held: HashMap<QuotaKey, (u64, u64)>,
    /// Quotas whose grant management may record otherwise than `held` (after a start, or a
    /// limit changed): the next pass of [`Meta::return_spare_grants`] sets it to what the
    /// home needs.
    stale: BTreeSet<QuotaKey>,
    rooms: HashMap<InodeId, Rooms>,
    pending: HashMap<u64, Pending>,
    next_pending: u64,
}

impl Ledger {
    /// Adopts the hard limits of a new map: what is held of a limit that changed, appeared
    /// or went is forgotten (nothing more is given from it before management is asked), and
    /// management is told again what the home needs of each changed or new one.
    pub(crate) fn adopt_limits(&mut self, limits: &[QuotaHard]) {
        if self.limits == limits {
            return;
        }
        for hard in limits {
            if !self.limits.contains(hard) {
                self.held.remove(&hard.key);
                self.stale.insert(hard.key);
            }
        }
        self.held
            .retain(|key, _| limits.iter().any(|hard| hard.key == *key));
        self.stale
            .retain(|key| limits.iter().any(|hard| hard.key == *key));
        self.limits = limits.to_vec();
    }

    /// (bytes, inodes) counted against `key` besides its inodes' use: rooms and pending
    /// growth.
    fn reserved(&self, key: QuotaKey) -> (u64, u64) {
        let rooms: u64 = self
            .rooms
            .values()
            .filter(|rooms| rooms.keys.contains(&key))
            .map(Rooms::bytes)
            .sum();
        self.pending
            .values()
            .filter(|pending| pending.keys.contains(&key))
            .fold((rooms, 0), |(bytes, inodes), pending| {
                (bytes + pending.growth.0, inodes + pending.growth.1)
            })
    }

    fn held(&self, key: QuotaKey) -> (u64, u64) {
        self.held.get(&key).copied().unwrap_or_default()
    }

    /// What to ask management to hold of `key` for `growth` on top of `used`, if what is held
    /// falls short: enough for it and [`GRANT_SLACK_BATCHES`] batches more (of bytes, of
    /// inodes: `batches`) where it grows; the other stays as held.
    fn short(
        &self,
        key: QuotaKey,
        used: (u64, u64),
        growth: (u64, u64),
        batches: (u64, u64),
    ) -> Option<(u64, u64)> {
        let reserved = self.reserved(key);
        let need = (
            used.0 + reserved.0 + growth.0,
            used.1 + reserved.1 + growth.1,
        );
        let held = self.held(key);
        let short = |grows: u64, need: u64, held: u64| grows > 0 && need > held;
        if !short(growth.0, need.0, held.0) && !short(growth.1, need.1, held.1) {
            return None;
        }
        let ask = |grows: u64, need: u64, held: u64, per: u64| match grows {
            0 => held,
            _ => held.max(need + GRANT_SLACK_BATCHES * per),
        };
        Some((
            ask(growth.0, need.0, held.0, batches.0),
            ask(growth.1, need.1, held.1, batches.1),
        ))
    }

    /// How much of `key`'s grant is free on top of `used`: (bytes, inodes).
    fn free(&self, key: QuotaKey, used: (u64, u64)) -> (u64, u64) {
        let (reserved, held) = (self.reserved(key), self.held(key));
        (
            held.0.saturating_sub(used.0 + reserved.0),
            held.1.saturating_sub(used.1 + reserved.1),
        )
    }

    /// What `key` should hold for `used`: what is used and reserved, and the slack.
    fn keep(&self, key: QuotaKey, used: (u64, u64)) -> (u64, u64) {
        let limit = self.limits.iter().find(|hard| hard.key == key);
        let (bytes, inodes) = limit.map_or((ROOM_BATCH_MAX, INODE_BATCH_MIN), |hard| {
            let hard = std::slice::from_ref(hard);
            (batch(hard), inode_batch(hard))
        });
        let reserved = self.reserved(key);
        (
            used.0 + reserved.0 + GRANT_SLACK_BATCHES * bytes,
            used.1 + reserved.1 + GRANT_SLACK_BATCHES * inodes,
        )
    }

    /// The quotas whose grant management should set again, with what to hold: the stale
    /// ones, and those holding more than [`Ledger::keep`] by more than the slack again.
    fn to_settle(&self, used: impl Fn(QuotaKey) -> (u64, u64)) -> Vec<(QuotaKey, (u64, u64))> {
        let keys: BTreeSet<QuotaKey> = self.held.keys().chain(self.stale.iter()).copied().collect();
        keys.into_iter()
            .filter_map(|key| {
                let keep = self.keep(key, used(key));
                let held = self.held(key);
                if self.stale.contains(&key) {
                    return Some((key, keep));
                }
                let over = |held: u64, keep: u64| held > 2 * keep;
                (over(held.0, keep.0) || over(held.1, keep.1))
                    .then_some((key, (held.0.min(keep.0), held.1.min(keep.1))))
            })
            .collect()
    }

    /// Where a session's room for `inode` may end for growth to `to`, if its grants allow:
    /// `to` and a batch more when they hold it, else as far as they hold if that reaches
    /// `to`; `None` when they cannot reach `to` (the room stays as it was). `used` is each
    /// key's use; the room's file counts `counted` bytes.
    fn fit_room(
        &self,
        (inode, session): (InodeId, ClientId),
        keys: &[QuotaKey],
        used: &HashMap<QuotaKey, (u64, u64)>,
        (counted, to, batch): (u64, u64, u64),
    ) -> Option<u64> {
        let rooms = self.rooms.get(&inode);
        let others = rooms.map_or(0, |rooms| {
            rooms
                .ends
                .iter()
                .filter(|(client, _)| **client != session)
                .map(|(_, end)| *end)
                .max()
                .unwrap_or(0)
        });
        let own = rooms.and_then(|rooms| rooms.ends.get(&session).copied());
        // The inode's room runs to the furthest end: only growth past it takes more.
        let furthest = others.max(own.unwrap_or(0)).max(counted);
        let free = keys
            .iter()
            .map(|key| {
                self.free(*key, used.get(key).copied().unwrap_or_default())
                    .0
            })
            .min()
            .unwrap_or(0);
        let wanted = to.saturating_add(batch);
        let end = wanted.min(furthest.saturating_add(free).max(furthest));
        (end >= to).then_some(end)
    }

    fn set_room(
        &mut self,
        (inode, session): (InodeId, ClientId),
        keys: Vec<QuotaKey>,
        counted: u64,
        end: u64,
    ) {
        let rooms = self.rooms.entry(inode).or_insert_with(|| Rooms {
            keys,
            counted,
            ends: HashMap::new(),
        });
        rooms.counted = counted;
        let own = rooms.ends.entry(session).or_default();
        *own = (*own).max(end);
    }
}

/// A home's grants, and the one ask of management it makes at a time.
#[derive(Default)]
pub(crate) struct QuotaGrants {
    ledger: Mutex<Ledger>,
    asking: tokio::sync::Mutex<()>,
}

impl QuotaGrants {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().expect("quota ledger poisoned")
    }

    /// Whether a room is reserved for `inode`.
    pub(crate) fn holds_room(&self, inode: InodeId) -> bool {
        let ledger = self.ledger();
        !ledger.rooms.is_empty() && ledger.rooms.contains_key(&inode)
    }

    /// The file `inode` now counts `counted` bytes in the usage table (it grew, or was cut):
    /// its rooms count past that.
    fn recounted(&self, inode: InodeId, counted: u64) {
        if let Some(rooms) = self.ledger().rooms.get_mut(&inode) {
            rooms.counted = counted;
        }
    }

    /// Session `session` holds no open of `inode` here any more: its room is given back.
    pub(crate) fn forget_room(&self, session: ClientId, inode: InodeId) {
        let mut ledger = self.ledger();
        if let Some(rooms) = ledger.rooms.get_mut(&inode) {
            rooms.ends.remove(&session);
            if rooms.ends.is_empty() {
                ledger.rooms.remove(&inode);
            }
        }
    }

    /// A new map's hard limits.
    pub(crate) fn adopt_limits(&self, limits: &[QuotaHard]) {
        self.ledger().adopt_limits(limits);
    }
}

/// Growth counted against a home's grants until its commit: dropped after it (the usage
/// table counts it from then on) or when the operation failed.
pub(crate) struct Charged {
    grants: Arc<QuotaGrants>,
    id: u64,
}

impl Drop for Charged {
    fn drop(&mut self) {
        self.grants.ledger().pending.remove(&self.id);
    }
}

/// The refusal of growth past a hard limit.
fn exceeded(key: QuotaKey, hard: u64, what: &str) -> OpError {
    OpError::rejected(
        ErrorCode::QuotaExceeded,
        format!(
            "{key} is at its hard limit of {hard} {what} (weft quota list; weft quota set raises it)"
        ),
    )
}

impl Meta {
    /// The hard limits that count `owner`'s growth in `pool`.
    fn limits_of(&self, owner: Owner, pool: StoragePoolId) -> Vec<QuotaHard> {
        self.cluster.map().hard_limits(owner, pool)
    }

    /// What the usage table says `keys` use: (bytes, inodes) each.
    fn used(&self, keys: &[QuotaKey]) -> Result<HashMap<QuotaKey, (u64, u64)>, OpError> {
        self.read(|txn| {
            let table = txn.open_table(crate::schema::usage::USAGE)?;
            let mut used = HashMap::new();
            for key in keys {
                let row =
                    crate::store::ReadableTable::get(&table, (key.kind.key(), key.id, key.pool.0))?
                        .map_or((0, 0), |row| row.value());
                used.insert(*key, row);
            }
            Ok(used)
        })
    }

    /// Asks management to hold `asked` of `key`, and adopts what it grants.
    async fn ask_grant(&self, key: QuotaKey, asked: (u64, u64)) -> Result<(), OpError> {
        let given = self
            .cluster
            .mgmt()
            .grant_quota(self.node, key, asked.0, asked.1)
            .await
            .map_err(|error| {
                OpError::rejected(
                    ErrorCode::Unavailable,
                    format!("management did not answer a grant of the quota of {key}: {error}; try again"),
                )
            })?;
        let mut ledger = self.grants.ledger();
        ledger.held.insert(key, given);
        ledger.stale.remove(&key);
        Ok(())
    }

    /// Asks management for what the ledger says each of `limits` falls short of for
    /// `growth`. Called with the grants' asking lock held.
    async fn top_up(&self, limits: &[QuotaHard], growth: (u64, u64)) -> Result<(), OpError> {
        let keys: Vec<QuotaKey> = limits.iter().map(|hard| hard.key).collect();
        let batches = (batch(limits), inode_batch(limits));
        let used = self.used(&keys)?;
        for key in keys {
            let asked = self.grants.ledger().short(key, used[&key], growth, batches);
            if let Some(asked) = asked {
                self.ask_grant(key, asked).await?;
            }
        }
        Ok(())
    }

    /// Gives `session`'s room for `inode` up to `to` if the grants hold it; the end it may
    /// grow the file to, or `None`. The open must still be registered: the ledger is
    /// changed under the open table's lock, so a close cannot slip between.
    fn try_room(
        &self,
        open: OpenHandle,
        (inode, counted, to): (InodeId, u64, u64),
        (keys, batch): (&[QuotaKey], u64),
    ) -> Result<Option<u64>, OpError> {
        let opens = self.sessions.opens.lock().expect("open table poisoned");
        if !opens
            .handles
            .get(&inode)
            .is_some_and(|handles| handles.contains(&open))
        {
            return Err(not_open(open, inode));
        }
        let mut ledger = self.grants.ledger();
        // Read under the ledger: an operation's growth leaves the ledger only after its
        // commit, so it is counted here either way.
        let used = self.used(keys)?;
        let end = ledger.fit_room((inode, open.0), keys, &used, (counted, to, batch));
        if let Some(end) = end {
            ledger.set_room((inode, open.0), keys.to_vec(), counted, end);
        }
        Ok(end)
    }

    /// The growth bound of a capability of `session` for `inode`: the file's owner, group
    /// and project, and the end its objects may grow to: as far as the room this home
    /// reserved for the session (or its counted size, without one) takes them, or no end
    /// when no hard byte limit counts the file. `None` for what is no regular file.
    pub(super) fn growth_bound(&self, inode: InodeId, session: ClientId) -> Option<GrowthBound> {
        let record = self
            .read(|txn| load_inode(&txn.open_table(INODES)?, inode))
            .ok()?;
        let layout = record.layout.as_ref()?;
        let owner = record.owner();
        let limited = self.cluster.map().hard_limited(
            owner,
            crate::schema::usage::pool_of(&record),
            weft_proto::quota::Growth::Bytes,
        );
        let object_end = if limited {
            let room = self
                .grants
                .ledger()
                .rooms
                .get(&inode)
                .and_then(|rooms| rooms.ends.get(&session).copied())
                .unwrap_or(0);
            // The first object of a stripe is the longest.
            weft_proto::layout::object_length_for_file_size(layout, 0, room.max(counted(&record)))
        } else {
            u64::MAX
        };
        Some(GrowthBound {
            uid: owner.uid,
            gid: owner.gid,
            project: owner.project,
            object_end,
            proof: [0; 32],
        })
    }

    /// Room for open `open` (registered for writing) to grow `inode` to `to`: answers the
    /// end it may grow the file to, `to` and a batch more when its quotas hold it, what it
    /// had when they cannot reach `to` (the write is then refused), and no end at all when
    /// no hard byte limit counts the file.
    ///
    /// # Errors
    /// `NotPermitted` without an open for writing (`InGrace` while it may be one its client
    /// has not reclaimed yet); `Unavailable` when management did not answer.
    pub(super) async fn reserve(
        &self,
        open: OpenHandle,
        inode: InodeId,
        to: u64,
    ) -> Result<MetaResponse, OpError> {
        match self.handle_access(open, inode) {
            Some(access) if access & WRITE != 0 => {}
            Some(_) => return Err(not_open(open, inode)),
            None => return Err(self.open_missing(open.0, inode, not_open(open, inode))),
        }
        let load = || self.read(|txn| load_inode(&txn.open_table(INODES)?, inode));
        let limits_of = |record: &InodeRecord| -> Vec<QuotaHard> {
            self.limits_of(record.owner(), crate::schema::usage::pool_of(record))
                .into_iter()
                .filter(|hard| hard.bytes > 0)
                .collect()
        };
        let mut record = load()?;
        let mut limits = limits_of(&record);
        if limits.is_empty() {
            // The client's map lists a limit this server's does not know yet: the newer
            // map decides.
            let _ = self.cluster.refresh().await;
            record = load()?;
            limits = limits_of(&record);
        }
        if limits.is_empty() {
            return Ok(reserved(u64::MAX));
        }
        let keys: Vec<QuotaKey> = limits.iter().map(|hard| hard.key).collect();
        let batch = batch(&limits);
        let counted = counted(&record);
        let had = self
            .grants
            .ledger()
            .rooms
            .get(&inode)
            .and_then(|rooms| rooms.ends.get(&open.0).copied())
            .unwrap_or(0)
            .max(counted);
        if to <= had {
            return Ok(reserved(had));
        }
        if let Some(end) = self.try_room(open, (inode, counted, to), (&keys, batch))? {
            return Ok(reserved(end));
        }
        let _asking = self.grants.asking.lock().await;
        let growth = to.saturating_add(batch).saturating_sub(had);
        let asked = self.top_up(&limits, (growth, 0)).await;
        let end = self.try_room(open, (inode, counted, to), (&keys, batch))?;
        asked?;
        Ok(reserved(end.unwrap_or(had)))
    }

    /// Counts growth of `growth` (bytes, inodes) of `owner`'s use in `pool` against this
    /// home's grants until the returned guard drops (after the operation's commit), or
    /// refuses it past a hard limit. `None` when no hard limit counts it.
    ///
    /// # Errors
    /// `QuotaExceeded` at a hard limit; `Unavailable` when management did not answer.
    pub(super) async fn charge(
        &self,
        owner: Owner,
        pool: StoragePoolId,
        growth: (u64, u64),
    ) -> Result<Option<Charged>, OpError> {
        let limits: Vec<QuotaHard> = self
            .limits_of(owner, pool)
            .into_iter()
            .filter(|hard| (growth.0 > 0 && hard.bytes > 0) || (growth.1 > 0 && hard.inodes > 0))
            .collect();
        if limits.is_empty() {
            return Ok(None);
        }
        let keys: Vec<QuotaKey> = limits.iter().map(|hard| hard.key).collect();
        let fits = |ledger: &Ledger, used: &HashMap<QuotaKey, (u64, u64)>| {
            limits.iter().find_map(|hard| {
                let free = ledger.free(hard.key, used[&hard.key]);
                if hard.bytes > 0 && growth.0 > free.0 {
                    Some(exceeded(hard.key, hard.bytes, "bytes"))
                } else if hard.inodes > 0 && growth.1 > free.1 {
                    Some(exceeded(hard.key, hard.inodes, "inodes"))
                } else {
                    None
                }
            })
        };
        let charge = |ledger: &mut Ledger| {
            let id = ledger.next_pending;
            ledger.next_pending += 1;
            ledger.pending.insert(
                id,
                Pending {
                    keys: keys.clone(),
                    growth,
                },
            );
            Some(Charged {
                grants: Arc::clone(&self.grants),
                id,
            })
        };
        // The use is read under the ledger, as in `try_room`.
        {
            let mut ledger = self.grants.ledger();
            let used = self.used(&keys)?;
            if fits(&ledger, &used).is_none() {
                return Ok(charge(&mut ledger));
            }
        }
        let _asking = self.grants.asking.lock().await;
        self.top_up(&limits, growth).await?;
        let mut ledger = self.grants.ledger();
        let used = self.used(&keys)?;
        match fits(&ledger, &used) {
            Some(refusal) => Err(refusal),
            None => Ok(charge(&mut ledger)),
        }
    }

    /// The file `inode`'s bytes changed in the usage table (a size reported, a truncate):
    /// the rooms reserved for it count past what it counts now.
    pub(super) fn recount_rooms(&self, inode: InodeId) {
        if !self.grants.holds_room(inode) {
            return;
        }
        if let Ok(record) = self.read(|txn| load_inode(&txn.open_table(INODES)?, inode)) {
            self.grants.recounted(inode, counted(&record));
        }
    }

    /// Tells management again what this home needs of the quotas whose grant may be
    /// recorded otherwise (after a start or a limit's change), and gives back what it holds
    /// far past its needs (background work, with each heartbeat; skipped while another ask
    /// runs).
    pub(crate) async fn return_spare_grants(&self) {
        let Ok(_asking) = self.grants.asking.try_lock() else {
            return;
        };
        let keys: Vec<QuotaKey> = {
            let ledger = self.grants.ledger();
            ledger
                .held
                .keys()
                .chain(ledger.stale.iter())
                .copied()
                .collect()
        };
        if keys.is_empty() {
            return;
        }
        let Ok(used) = self.used(&keys) else {
            return;
        };
        let settle = self
            .grants
            .ledger()
            .to_settle(|key| used.get(&key).copied().unwrap_or_default());
        for (key, keep) in settle {
            if let Err(error) = self.ask_grant(key, keep).await {
                tracing::debug!(%key, ?error, "could not settle a quota grant");
            }
        }
    }
}

fn reserved(to: u64) -> MetaResponse {
    MetaResponse::Reserved {
        to,
        capability: None,
    }
}

fn not_open(open: OpenHandle, inode: InodeId) -> OpError {
    OpError::rejected(
        ErrorCode::NotPermitted,
        format!(
            "room to grow {inode} was asked through handle {} of session {}, which is not open for writing here",
            open.1, open.0
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::quota::QuotaKind;

    fn key() -> QuotaKey {
        QuotaKey {
            kind: QuotaKind::User,
            id: 65534,
            pool: StoragePoolId::DEFAULT,
        }
    }

    fn limit(bytes: u64) -> QuotaHard {
        QuotaHard {
            key: key(),
            bytes,
            inodes: 0,
        }
    }

    fn ledger_holding(bytes: u64) -> Ledger {
        let mut ledger = Ledger::default();
        ledger.adopt_limits(&[limit(8 << 20)]);
        ledger.held.insert(key(), (bytes, 0));
        ledger.stale.clear();
        ledger
    }

    #[test]
    fn rooms_and_pending_growth_count_against_the_grant() {
        let mut ledger = ledger_holding(8 << 20);
        assert_eq!(ledger.free(key(), (1 << 20, 3)).0, 7 << 20);
        // Two sessions' rooms of one file count once, to the furthest end.
        ledger.set_room((InodeId(5), ClientId(1)), vec![key()], 1 << 20, 3 << 20);
        ledger.set_room((InodeId(5), ClientId(2)), vec![key()], 1 << 20, 2 << 20);
        ledger.pending.insert(
            0,
            Pending {
                keys: vec![key()],
                growth: (1 << 20, 1),
            },
        );
        assert_eq!(ledger.free(key(), (1 << 20, 3)).0, 4 << 20);
        assert!(ledger
            .short(key(), (1 << 20, 3), (4 << 20, 0), (1 << 20, 16))
            .is_none());
        assert_eq!(
            ledger.short(key(), (1 << 20, 3), (5 << 20, 0), (1 << 20, 16)),
            Some(((9 << 20) + 4 * (1 << 20), 0))
        );
    }

    #[test]
    fn a_room_that_cannot_reach_the_end_asked_stays_as_it_was() {
        let mut ledger = ledger_holding(8 << 20);
        let used = HashMap::from([(key(), (6 << 20, 1))]);
        let at = (InodeId(5), ClientId(1));
        // 2 MiB free: a room to 7 MiB (and up to a batch more) fits, one to 9 MiB does not.
        assert_eq!(
            ledger.fit_room(at, &[key()], &used, (0, 1 << 20, 512 << 10)),
            Some((1 << 20) + (512 << 10))
        );
        assert_eq!(
            ledger.fit_room(at, &[key()], &used, (0, 3 << 20, 512 << 10)),
            None
        );
        ledger.set_room(at, vec![key()], 0, 1 << 20);
        // A cut file (counted 0) keeps its room counted from 0.
        assert_eq!(ledger.reserved(key()).0, 1 << 20);
    }

    #[test]
    fn a_changed_limit_forgets_its_grant_and_is_told_again() {
        let mut ledger = ledger_holding(8 << 20);
        ledger.adopt_limits(&[limit(4 << 20)]);
        assert_eq!(ledger.held(key()), (0, 0));
        // A batch of a 4 MiB limit is 256 KiB: it asks for 1 MiB of slack over 1 MiB used.
        assert_eq!(
            ledger.to_settle(|_| (1 << 20, 0)),
            vec![(key(), (2 << 20, 64))]
        );
    }

    #[test]
    fn a_grant_far_past_its_use_is_given_back_down_to_use_and_slack() {
        let ledger = ledger_holding(8 << 20);
        // A batch of an 8 MiB limit is 512 KiB: keep 2 MiB of slack over 1 MiB used.
        assert_eq!(
            ledger.to_settle(|_| (1 << 20, 0)),
            vec![(key(), (3 << 20, 0))]
        );
        assert!(ledger_holding(5 << 20)
            .to_settle(|_| (1 << 20, 0))
            .is_empty());
    }
}
