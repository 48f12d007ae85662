//! Hard quotas, held where the inodes are counted (docs/design/quotas.md): each home holds a
//! grant from management of every hard-limited user's, group's and project's use, and lets
//! that use grow only within it. What a home's inodes use there (the usage table, changed
//! in their transactions), the room it reserved for its open writers to grow their files
//! into, and the growth of operations between their check and their commit, together never
//! pass what it holds; management gives out grants that together stay within the limit. So
//! a hard limit holds in file sizes and inodes, whatever the number of homes, writers and
//! targets, but for what the rooms of a crashed home had given (see the design).
//!
//! [`Ledger`] is the arithmetic, without I/O; [`Meta::reserve`] and [`Meta::charge`] ask
//! management when it says a grant is short.

use super::sessions::OpenHandle;
use super::Meta;
use crate::store::{load_inode, OpError, INODES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weft_proto::access::{GrowthBound, WRITE};
use weft_proto::ids::{InodeId, StoragePoolId};
use weft_proto::messages::Response;
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

/// The batch of room for limits `limits`: a sixteenth of the smallest byte limit, within
/// [`ROOM_BATCH_MIN`] and [`ROOM_BATCH_MAX`].
fn batch(limits: &[QuotaHard]) -> u64 {
    limits
        .iter()
        .filter(|hard| hard.bytes > 0)
        .map(|hard| (hard.bytes / 16).clamp(ROOM_BATCH_MIN, ROOM_BATCH_MAX))
        .min()
        .unwrap_or(ROOM_BATCH_MAX)
}

/// Room reserved for one open's writes to grow its file into.
struct Room {
    inode: InodeId,
    keys: Vec<QuotaKey>,
    /// The end the open may grow the file to.
    end: u64,
    /// The file's size as last counted in the usage table: the room counts past it.
    size: u64,
}

impl Room {
    fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.size)
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
    /// The hard limits the grants were given under, as the map last listed them: a limit set
    /// anew drops its grants (management does too).
    limits: Vec<QuotaHard>,
    /// (bytes, inodes) held of each quota.
    held: HashMap<QuotaKey, (u64, u64)>,
    rooms: HashMap<OpenHandle, Room>,
    pending: HashMap<u64, Pending>,
    next_pending: u64,
}

impl Ledger {
    /// Adopts the hard limits of a new map: the grants of a limit changed or removed are
    /// dropped (management dropped them when the rule was set).
    pub(crate) fn adopt_limits(&mut self, limits: &[QuotaHard]) {
        if self.limits == limits {
            return;
        }
        let kept: Vec<QuotaKey> = limits
            .iter()
            .filter(|hard| self.limits.contains(hard))
            .map(|hard| hard.key)
            .collect();
        self.held.retain(|key, _| kept.contains(key));
        self.limits = limits.to_vec();
    }

    /// (bytes, inodes) counted against `key` besides its inodes' use: rooms and pending
    /// growth.
    fn reserved(&self, key: QuotaKey) -> (u64, u64) {
        let rooms: u64 = self
            .rooms
            .values()
            .filter(|room| room.keys.contains(&key))
            .map(Room::bytes)
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
    /// falls short: enough for it and [`GRANT_SLACK_BATCHES`] batches more of bytes (or as
    /// many inodes) where it grows.
    fn short(
        &self,
        key: QuotaKey,
        used: (u64, u64),
        growth: (u64, u64),
        batch: u64,
    ) -> Option<(u64, u64)> {
        let reserved = self.reserved(key);
        let need = (
            used.0 + reserved.0 + growth.0,
            used.1 + reserved.1 + growth.1,
        );
        let held = self.held(key);
        // Only what grows is asked for: the other stays as held.
        let short = |grows: u64, need: u64, held: u64| grows > 0 && need > held;
        if !short(growth.0, need.0, held.0) && !short(growth.1, need.1, held.1) {
            return None;
        }
        let ask = |grows: u64, need: u64, held: u64, per: u64| match grows {
            0 => held,
            _ => held.max(need + GRANT_SLACK_BATCHES * per),
        };
        Some((
            ask(growth.0, need.0, held.0, batch),
            ask(growth.1, need.1, held.1, 16),
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

    /// The quotas holding more than their use needs, with what to keep of each: what is
    /// used and reserved, and the slack.
    fn spare(&self, used: impl Fn(QuotaKey) -> (u64, u64)) -> Vec<(QuotaKey, (u64, u64))> {
        self.held
            .iter()
            .filter_map(|(&key, &held)| {
                let limits = self.limits.iter().find(|hard| hard.key == key)?;
                let (used, reserved) = (used(key), self.reserved(key));
                let batch = batch(std::slice::from_ref(limits));
                let keep = (
                    used.0 + reserved.0 + GRANT_SLACK_BATCHES * batch,
                    used.1 + reserved.1 + GRANT_SLACK_BATCHES * 16,
                );
                let over = |held: u64, keep: u64, per: u64| held > keep + GRANT_SLACK_BATCHES * per;
                (over(held.0, keep.0, batch) || over(held.1, keep.1, 16))
                    .then_some((key, (held.0.min(keep.0), held.1.min(keep.1))))
            })
            .collect()
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

    /// The file `inode` is now `size` bytes long in the usage table: its rooms count past it.
    pub(crate) fn sized(&self, inode: InodeId, size: u64) {
        for room in self.ledger().rooms.values_mut() {
            if room.inode == inode {
                room.size = room.size.max(size);
            }
        }
    }

    /// Open `open` ended: its room is given back.
    pub(crate) fn forget_room(&self, open: OpenHandle) {
        let mut ledger = self.ledger();
        if !ledger.rooms.is_empty() {
            ledger.rooms.remove(&open);
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
            let table = txn.open_table(crate::usage::USAGE)?;
            let mut used = HashMap::new();
            for key in keys {
                let row = redb::ReadableTable::get(&table, (key.kind.key(), key.id, key.pool.0))?
                    .map_or((0, 0), |row| row.value());
                used.insert(*key, row);
            }
            Ok(used)
        })
    }

    /// Asks management for what the ledger says each of `limits` falls short of for
    /// `growth`, and adopts what it grants. Called with the grants' asking lock held.
    async fn top_up(
        &self,
        limits: &[QuotaHard],
        used: &HashMap<QuotaKey, (u64, u64)>,
        growth: (u64, u64),
        batch: u64,
    ) -> Result<(), OpError> {
        for hard in limits {
            let key = hard.key;
            let asked = self.grants.ledger().short(key, used[&key], growth, batch);
            let Some(asked) = asked else {
                continue;
            };
            let given = self
                .cluster
                .mgmt()
                .grant_quota(self.node, key, asked)
                .await
                .map_err(|error| {
                    OpError::rejected(
                        ErrorCode::Unavailable,
                        format!("management did not answer a grant of the quota of {key}: {error}; try again"),
                    )
                })?;
            self.grants.ledger().held.insert(key, given);
        }
        Ok(())
    }

    /// The growth bound of a capability of `session` for `inode`: the file's owner, group
    /// and project, and the end its objects may grow to: as far as the room this home
    /// reserved for the session's opens of it (or its size, without one) takes them, or no
    /// end when no hard byte limit counts the file. `None` for what is no regular file.
    pub(super) fn growth_bound(
        &self,
        inode: InodeId,
        session: weft_proto::ids::ClientId,
    ) -> Option<GrowthBound> {
        let record = self
            .read(|txn| load_inode(&txn.open_table(INODES)?, inode))
            .ok()?;
        let layout = record.layout.as_ref()?;
        let owner = record.owner();
        let limited = self.cluster.map().hard_limited(
            owner,
            crate::usage::pool_of(&record),
            weft_proto::quota::Growth::Bytes,
        );
        let object_end = if limited {
            let room = self
                .grants
                .ledger()
                .rooms
                .iter()
                .filter(|((client, _), room)| *client == session && room.inode == inode)
                .map(|(_, room)| room.end)
                .max()
                .unwrap_or(0);
            // The first object of a stripe is the longest.
            weft_proto::layout::object_length_for_file_size(layout, 0, room.max(record.size))
        } else {
            u64::MAX
        };
        Some(GrowthBound {
            uid: owner.uid,
            gid: owner.gid,
            project: owner.project,
            object_end,
        })
    }

    /// Room for open `open` (registered for writing) to grow `inode` to `to`: answers the
    /// end it may grow the file to, `to` and a batch more when its quotas hold it, less at a
    /// hard limit, and no end at all when no hard byte limit counts the file.
    ///
    /// # Errors
    /// `NotPermitted` without an open for writing; `Unavailable` when management did not
    /// answer.
    pub(super) async fn reserve(
        &self,
        open: OpenHandle,
        inode: InodeId,
        to: u64,
    ) -> Result<Response, OpError> {
        if self.handle_access(open, inode).unwrap_or(0) & WRITE == 0 {
            return Err(OpError::rejected(
                ErrorCode::NotPermitted,
                format!("room to grow {inode} was asked through handle {} of session {}, which is not open for writing here", open.1, open.0),
            ));
        }
        let record = self.read(|txn| load_inode(&txn.open_table(INODES)?, inode))?;
        let limits: Vec<QuotaHard> = self
            .limits_of(record.owner(), crate::usage::pool_of(&record))
            .into_iter()
            .filter(|hard| hard.bytes > 0)
            .collect();
        if limits.is_empty() {
            return Ok(Response::Reserved {
                to: u64::MAX,
                capability: None,
            });
        }
        let keys: Vec<QuotaKey> = limits.iter().map(|hard| hard.key).collect();
        let batch = batch(&limits);
        let _asking = self.grants.asking.lock().await;
        let base = {
            let ledger = self.grants.ledger();
            ledger
                .rooms
                .get(&open)
                .filter(|room| room.inode == inode)
                .map_or(record.size, |room| room.end.max(record.size))
        };
        if to <= base {
            return Ok(Response::Reserved {
                to: base,
                capability: None,
            });
        }
        let used = self.used(&keys)?;
        let size = record.size;
        // The room it had is given back and asked again with the growth, so it does not
        // count twice: the room wanted runs from the size to `to` and a batch more.
        let wanted = to.saturating_add(batch).saturating_sub(size);
        let old = self.grants.ledger().rooms.remove(&open);
        drop(old);
        let outcome = self.top_up(&limits, &used, (wanted, 0), batch).await;
        let mut ledger = self.grants.ledger();
        let fits = keys
            .iter()
            .map(|key| ledger.free(*key, used[key]).0)
            .min()
            .unwrap_or(0);
        // What the room it had promised stays promised (a limit set anew may have dropped
        // the grant that held it): it counts until the open ends.
        let end = (size + fits.min(wanted)).max(base);
        ledger.rooms.insert(
            open,
            Room {
                inode,
                keys,
                end,
                size,
            },
        );
        drop(ledger);
        outcome?;
        Ok(Response::Reserved {
            to: end,
            capability: None,
        })
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
        let batch = batch(&limits);
        let _asking = self.grants.asking.lock().await;
        let used = self.used(&keys)?;
        self.top_up(&limits, &used, growth, batch).await?;
        let mut ledger = self.grants.ledger();
        for hard in &limits {
            let free = ledger.free(hard.key, used[&hard.key]);
            if hard.bytes > 0 && growth.0 > free.0 {
                return Err(exceeded(hard.key, hard.bytes, "bytes"));
            }
            if hard.inodes > 0 && growth.1 > free.1 {
                return Err(exceeded(hard.key, hard.inodes, "inodes"));
            }
        }
        let id = ledger.next_pending;
        ledger.next_pending += 1;
        ledger.pending.insert(id, Pending { keys, growth });
        Ok(Some(Charged {
            grants: Arc::clone(&self.grants),
            id,
        }))
    }

    /// Gives back to management what this home holds past its use's needs (background
    /// work, with each heartbeat).
    pub(crate) async fn return_spare_grants(&self) {
        let _asking = self.grants.asking.lock().await;
        let keys: Vec<QuotaKey> = self.grants.ledger().held.keys().copied().collect();
        if keys.is_empty() {
            return;
        }
        let Ok(used) = self.used(&keys) else {
            return;
        };
        let spare = self
            .grants
            .ledger()
            .spare(|key| used.get(&key).copied().unwrap_or_default());
        for (key, keep) in spare {
            match self.cluster.mgmt().grant_quota(self.node, key, keep).await {
                Ok(given) => {
                    self.grants.ledger().held.insert(key, given);
                }
                Err(error) => {
                    tracing::debug!(%key, %error, "could not give back a spare quota grant");
                }
            }
        }
    }
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

    fn ledger_holding(bytes: u64) -> Ledger {
        let mut ledger = Ledger::default();
        ledger.adopt_limits(&[QuotaHard {
            key: key(),
            bytes: 8 << 20,
            inodes: 0,
        }]);
        ledger.held.insert(key(), (bytes, 0));
        ledger
    }

    #[test]
    fn rooms_and_pending_growth_count_against_the_grant() {
        let mut ledger = ledger_holding(8 << 20);
        assert_eq!(ledger.free(key(), (1 << 20, 3)).0, 7 << 20);
        ledger.rooms.insert(
            (weft_proto::ids::ClientId(1), 1),
            Room {
                inode: InodeId(5),
                keys: vec![key()],
                end: 3 << 20,
                size: 1 << 20,
            },
        );
        ledger.pending.insert(
            0,
            Pending {
                keys: vec![key()],
                growth: (1 << 20, 1),
            },
        );
        assert_eq!(ledger.free(key(), (1 << 20, 3)).0, 4 << 20);
        assert!(ledger
            .short(key(), (1 << 20, 3), (4 << 20, 0), 1 << 20)
            .is_none());
        assert_eq!(
            ledger.short(key(), (1 << 20, 3), (5 << 20, 0), 1 << 20),
            Some(((9 << 20) + 4 * (1 << 20), 0))
        );
    }

    #[test]
    fn a_limit_set_anew_drops_its_grant() {
        let mut ledger = ledger_holding(8 << 20);
        ledger.adopt_limits(&[QuotaHard {
            key: key(),
            bytes: 4 << 20,
            inodes: 0,
        }]);
        assert_eq!(ledger.held(key()), (0, 0));
    }

    #[test]
    fn a_grant_far_past_its_use_is_given_back_down_to_use_and_slack() {
        let ledger = ledger_holding(8 << 20);
        // A batch of an 8 MiB limit is 512 KiB: keep 2 MiB of slack over 1 MiB used.
        let spare = ledger.spare(|_| (1 << 20, 0));
        assert_eq!(spare, vec![(key(), (3 << 20, 0))]);
        assert!(ledger_holding(3 << 20).spare(|_| (1 << 20, 0)).is_empty());
    }
}
