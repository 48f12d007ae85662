//! Byte-range locks (fcntl record locks and flock), held in memory per inode on the inode's
//! home, keyed by (client session, lock owner).
//!
//! Rules, as POSIX gives them: two locks conflict when they belong to different owners,
//! overlap, and at least one is exclusive. Setting a lock replaces the owner's locks in its
//! range (splitting them at the edges); releasing removes them. A request that may wait is
//! woken on every release and tries again until its wait runs out.
//!
//! Locks do not survive a restart of this server: after a restart the lock epoch changes, and
//! for the grace period only reclaims — clients re-sending the locks they held — are granted.
//! Locks of sessions that expire are released.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use weft_proto::ids::{ClientId, InodeId};
use weft_proto::locks::{apply_to_owner, conflicts};
use weft_proto::messages::{LockKind, LockRange};

/// The ranges one (client, owner) holds on one inode.
type Owners = HashMap<(ClientId, u64), Vec<LockRange>>;

/// Most ranges one client session holds on one file, over all its lock owners: a lock that
/// would take it past that is refused (ENOLCK), so a client cannot make the table grow
/// without bound by locking every other byte, under as many owners as it likes.
pub(crate) const LOCK_RANGES_PER_SESSION_MAX: usize = 4096;

/// Why a lock was not set.
#[derive(Debug)]
pub(crate) enum LockRefusal {
    /// Another owner holds this conflicting lock (after the wait, if any, ran out).
    Conflict(LockRange),
    /// The server is in its grace period after a start: only reclaims are granted.
    InGrace,
    /// The session would hold more than [`LOCK_RANGES_PER_SESSION_MAX`] ranges of the file.
    TooMany,
}

pub(crate) struct LockTable {
    held: Mutex<HashMap<InodeId, Owners>>,
    released: Notify,
    epoch: u64,
    grace: Duration,
    /// When the grace period ends; unset while the home does not serve requests yet.
    grace_until: OnceLock<Instant>,
}

impl LockTable {
    /// A table that grants only reclaims for `grace`, from now on.
    #[cfg(test)]
    pub fn new(grace: Duration) -> LockTable {
        let table = LockTable::until_served(grace);
        table.start_grace();
        table
    }

    /// A table whose grace period of `grace` starts only at [`LockTable::start_grace`]: when
    /// its home starts serving requests. A start that waits (for a storage target, to settle
    /// the sizes of files open at a crash) before it serves gives its clients the whole grace
    /// period to reclaim their opens and locks all the same.
    pub fn until_served(grace: Duration) -> LockTable {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        LockTable {
            held: Mutex::default(),
            released: Notify::new(),
            epoch,
            grace,
            grace_until: OnceLock::new(),
        }
    }

    /// Starts the grace period, unless it started already.
    pub fn start_grace(&self) {
        self.grace_until.get_or_init(|| Instant::now() + self.grace);
    }

    /// Whether the grace period after the start is over (not before it started).
    pub fn grace_over(&self) -> bool {
        self.grace_until
            .get()
            .is_some_and(|until| Instant::now() >= *until)
    }

    /// Changes at every start of the server.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The lock that conflicts with `lock` of `client`, if any.
    pub fn conflict(
        &self,
        inode: InodeId,
        client: ClientId,
        lock: &LockRange,
    ) -> Option<LockRange> {
        let held = self.held.lock().expect("lock table poisoned");
        held.get(&inode)
            .and_then(|owners| Self::find_conflict(owners, client, lock))
    }

    fn find_conflict(owners: &Owners, client: ClientId, lock: &LockRange) -> Option<LockRange> {
        owners
            .iter()
            .filter(|(key, _)| **key != (client, lock.owner))
            .flat_map(|(_, ranges)| ranges.iter())
            .find(|held| conflicts(held, lock))
            .copied()
    }

    /// Applies `lock` unless another owner's lock conflicts or the session would hold too
    /// many ranges of the file.
    fn apply(&self, inode: InodeId, client: ClientId, lock: &LockRange) -> Result<(), LockRefusal> {
        let mut table = self.held.lock().expect("lock table poisoned");
        let owners = table.entry(inode).or_default();
        if let Some(conflict) = Self::find_conflict(owners, client, lock) {
            return Err(LockRefusal::Conflict(conflict));
        }
        let session_holds: usize = owners
            .iter()
            .filter(|(key, _)| key.0 == client)
            .map(|(_, ranges)| ranges.len())
            .sum();
        let ranges = owners.entry((client, lock.owner)).or_default();
        let mut applied = ranges.clone();
        apply_to_owner(&mut applied, lock);
        let after = session_holds - ranges.len() + applied.len();
        if after > LOCK_RANGES_PER_SESSION_MAX && applied.len() > ranges.len() {
            if ranges.is_empty() {
                owners.remove(&(client, lock.owner));
            }
            if owners.is_empty() {
                table.remove(&inode);
            }
            return Err(LockRefusal::TooMany);
        }
        let released = apply_to_owner(ranges, lock);
        if ranges.is_empty() {
            owners.remove(&(client, lock.owner));
        }
        #[cfg(debug_assertions)]
        check_owners(inode, owners);
        if owners.is_empty() {
            table.remove(&inode);
        }
        drop(table);
        if released {
            self.released.notify_waiters();
        }
        Ok(())
    }

    /// Sets `lock`, waiting up to `wait` for conflicting locks to go. Outside reclaims, no lock
    /// is granted during the grace period after a start. Returns the conflict when the wait
    /// ran out, or that the session would hold too many ranges.
    pub async fn set(
        &self,
        inode: InodeId,
        client: ClientId,
        lock: LockRange,
        wait: Duration,
        reclaim: bool,
    ) -> Result<(), LockRefusal> {
        let deadline = Instant::now() + wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let in_grace = !reclaim && lock.kind != LockKind::Unlock && !self.grace_over();
            let outcome = if in_grace {
                Err(LockRefusal::InGrace)
            } else {
                self.apply(inode, client, &lock)
            };
            let now = Instant::now();
            match outcome {
                Ok(()) => return Ok(()),
                Err(LockRefusal::TooMany) => return Err(LockRefusal::TooMany),
                Err(refusal) if now >= deadline => return Err(refusal),
                Err(_) => {
                    let until = match self.grace_until.get() {
                        Some(grace_until) if in_grace => (*grace_until).min(deadline),
                        _ => deadline,
                    };
                    let _ =
                        tokio::time::timeout(until.saturating_duration_since(now), released).await;
                }
            }
        }
    }

    /// Releases every lock of the sessions in `expired`; returns how many ranges were released.
    pub fn release_clients(&self, expired: &HashSet<ClientId>) -> usize {
        let mut table = self.held.lock().expect("lock table poisoned");
        let mut count = 0;
        table.retain(|_, owners| {
            owners.retain(|(client, _), ranges| {
                let gone = expired.contains(client);
                if gone {
                    count += ranges.len();
                }
                !gone
            });
            !owners.is_empty()
        });
        drop(table);
        if count > 0 {
            self.released.notify_waiters();
        }
        count
    }
}

/// Checks what the table keeps true of one inode's locks: every owner listed holds a range,
/// each range starts before it ends and is a lock (releases are never kept), one owner's
/// ranges never overlap, and no two owners hold conflicting locks. O(n²): debug builds only,
/// and the pairs only while the file has few ranges (a test of the bound on ranges holds
/// thousands).
#[cfg(debug_assertions)]
fn check_owners(inode: InodeId, owners: &Owners) {
    const PAIRS_CHECKED_RANGES_MAX: usize = 256;
    let ranges_held: usize = owners.values().map(Vec::len).sum();
    for ((client, owner), ranges) in owners {
        assert!(
            !ranges.is_empty(),
            "inode {inode}: owner {owner} of client {client} is listed without a range"
        );
        for (i, range) in ranges.iter().enumerate() {
            assert!(
                range.start <= range.end,
                "inode {inode}: {range:?} ends before it starts"
            );
            assert_ne!(
                range.kind,
                LockKind::Unlock,
                "inode {inode}: a release is kept as a lock"
            );
            if ranges_held > PAIRS_CHECKED_RANGES_MAX {
                continue;
            }
            for other in &ranges[i + 1..] {
                assert!(
                    !weft_proto::locks::overlaps(range, other),
                    "inode {inode}: ranges {range:?} and {other:?} of one owner overlap"
                );
            }
        }
    }
    if ranges_held > PAIRS_CHECKED_RANGES_MAX {
        return;
    }
    for (key, ranges) in owners {
        for (other_key, other_ranges) in owners {
            if key == other_key {
                continue;
            }
            for range in ranges {
                for other in other_ranges {
                    assert!(
                        !conflicts(range, other),
                        "inode {inode}: {key:?} holds {range:?} and {other_key:?} holds \
                         {other:?}, which conflict"
                    );
                }
            }
        }
    }
}

/// Refuses a range that ends before it starts: no lock (or test of one) covers it.
pub(crate) fn check_range(lock: &LockRange) -> Result<(), weft_proto::error::WireError> {
    if lock.start > lock.end {
        return Err(weft_proto::error::WireError::new(
            weft_proto::ErrorCode::InvalidArgument,
            format!(
                "a lock range ends (byte {}) before it starts (byte {})",
                lock.end, lock.start
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(owner: u64, kind: LockKind, start: u64, end: u64) -> LockRange {
        LockRange {
            owner,
            kind,
            start,
            end,
            pid: owner as u32,
        }
    }

    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);
    const FILE: InodeId = InodeId((1 << 48) | 9);

    // Goal: POSIX conflict rules — shared locks coexist, exclusive ones conflict across owners
    // (and across clients with equal owner numbers), never with the same owner.
    #[tokio::test]
    async fn conflicts_follow_posix() {
        let table = LockTable::new(Duration::ZERO);
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Read, 0, 99),
                Duration::ZERO,
                false,
            )
            .await
            .expect("read");
        table
            .set(
                FILE,
                B,
                lock(1, LockKind::Read, 50, 149),
                Duration::ZERO,
                false,
            )
            .await
            .expect("shared");
        assert!(
            table
                .set(
                    FILE,
                    B,
                    lock(1, LockKind::Write, 0, 9),
                    Duration::ZERO,
                    false
                )
                .await
                .is_err(),
            "same owner number, other client"
        );
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Write, 0, 9),
                Duration::ZERO,
                false,
            )
            .await
            .expect("upgrade a part of its own lock");
        assert_eq!(
            table
                .conflict(FILE, B, &lock(7, LockKind::Read, 5, 5))
                .map(|l| l.kind),
            Some(LockKind::Write)
        );
        table
            .set(
                FILE,
                B,
                lock(1, LockKind::Read, 10, 49),
                Duration::ZERO,
                false,
            )
            .await
            .expect("the rest is still shared");
    }

    // Goal: unlocking the middle of a lock splits it, and releasing wakes a waiter.
    #[tokio::test]
    async fn split_and_wake() {
        let table = std::sync::Arc::new(LockTable::new(Duration::ZERO));
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Write, 0, 999),
                Duration::ZERO,
                false,
            )
            .await
            .expect("lock");
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Unlock, 100, 199),
                Duration::ZERO,
                false,
            )
            .await
            .expect("unlock middle");
        table
            .set(
                FILE,
                B,
                lock(2, LockKind::Write, 100, 199),
                Duration::ZERO,
                false,
            )
            .await
            .expect("the hole is free");
        assert!(
            table
                .conflict(FILE, B, &lock(2, LockKind::Write, 99, 99))
                .is_some(),
            "the left part stays"
        );
        assert!(
            table
                .conflict(FILE, B, &lock(2, LockKind::Write, 200, 200))
                .is_some(),
            "the right part stays"
        );
        let waiter = {
            let table = std::sync::Arc::clone(&table);
            tokio::spawn(async move {
                table
                    .set(
                        FILE,
                        B,
                        lock(2, LockKind::Write, 0, 999),
                        Duration::from_secs(60),
                        false,
                    )
                    .await
            })
        };
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Unlock, 0, u64::MAX),
                Duration::ZERO,
                false,
            )
            .await
            .expect("release");
        waiter
            .await
            .expect("task")
            .expect("the waiter gets the lock after the release");
    }

    // Goal: in the grace period only reclaims are granted; expired sessions lose their locks.
    #[tokio::test]
    async fn grace_and_expiry() {
        let table = LockTable::new(Duration::from_secs(3600));
        assert!(
            table
                .set(
                    FILE,
                    B,
                    lock(2, LockKind::Write, 0, 9),
                    Duration::ZERO,
                    false
                )
                .await
                .is_err(),
            "no new locks in grace"
        );
        table
            .set(
                FILE,
                A,
                lock(1, LockKind::Write, 0, 9),
                Duration::ZERO,
                true,
            )
            .await
            .expect("reclaim");
        assert!(table
            .conflict(FILE, B, &lock(2, LockKind::Write, 0, 9))
            .is_some());
        assert_eq!(table.release_clients(&HashSet::from([A])), 1);
        assert!(table
            .conflict(FILE, B, &lock(2, LockKind::Write, 0, 9))
            .is_none());
    }
}
