//! The client side of byte-range locks. Locks live on the file's home metadata server; the
//! client remembers the ranges each of its lock owners holds (with the same arithmetic as the
//! server, `proto::locks`) and the lock epoch of each home. When a home's epoch changes — it
//! restarted and forgot its locks — the client reclaims what it holds within the server's
//! grace period.

use crate::client::{Client, ClientError};
use std::collections::HashMap;
use std::sync::Mutex;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::locks::apply_to_owner;
use weft_proto::messages::LockRange;
use weft_proto::ErrorCode;

/// How often a lock request asks again while its server is in its grace period.
const GRACE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// What this client holds: inode → owner → ranges; and the epoch of each home seen.
#[derive(Default)]
pub(crate) struct HeldLocks {
    held: Mutex<HashMap<InodeId, HashMap<u64, Vec<LockRange>>>>,
    epochs: Mutex<HashMap<NodeId, u64>>,
}

impl HeldLocks {
    fn record(&self, inode: InodeId, lock: &LockRange) {
        let mut held = self.held.lock().expect("held locks poisoned");
        let owners = held.entry(inode).or_default();
        let ranges = owners.entry(lock.owner).or_default();
        apply_to_owner(ranges, lock);
        if ranges.is_empty() {
            owners.remove(&lock.owner);
        }
        if owners.is_empty() {
            held.remove(&inode);
        }
    }

    fn holds(&self, inode: InodeId, owner: u64) -> bool {
        let held = self.held.lock().expect("held locks poisoned");
        held.get(&inode)
            .is_some_and(|owners| owners.contains_key(&owner))
    }

    /// Forgets every lock held; returns the files that held one.
    pub(crate) fn forget_all(&self) -> Vec<InodeId> {
        let mut held = self.held.lock().expect("held locks poisoned");
        held.drain().map(|(inode, _)| inode).collect()
    }

    /// Forgets `lock`'s range of its owner on `inode`, which the server no longer holds.
    fn forget(&self, inode: InodeId, lock: &LockRange) {
        let unlocked = LockRange {
            kind: weft_proto::messages::LockKind::Unlock,
            ..*lock
        };
        self.record(inode, &unlocked);
    }

    fn of_home(&self, home: NodeId) -> Vec<(InodeId, LockRange)> {
        let held = self.held.lock().expect("held locks poisoned");
        held.iter()
            .filter(|(inode, _)| inode.home() == home)
            .flat_map(|(inode, owners)| {
                owners.values().flatten().map(move |range| (*inode, *range))
            })
            .collect()
    }
}

impl Client {
    /// Takes, changes or releases a lock on `inode`, waiting up to `wait_ms` on the server for
    /// a conflicting lock to go.
    ///
    /// # Errors
    /// `WouldBlock` when a conflicting lock stays; transport errors.
    pub async fn set_lock(
        &self,
        inode: InodeId,
        lock: LockRange,
        wait_ms: u32,
    ) -> Result<(), ClientError> {
        let home = inode.home();
        let known = self
            .locks
            .epochs
            .lock()
            .expect("epochs poisoned")
            .contains_key(&home);
        if !known {
            // Learn the epoch before the first lock, so a restart after it is noticed.
            let epoch = self
                .on_home(inode, |meta| async move { meta.lock_epoch().await })
                .await?;
            self.locks
                .epochs
                .lock()
                .expect("epochs poisoned")
                .entry(home)
                .or_insert(epoch);
        }
        let client = self.id();
        loop {
            let attempt = self
                .on_home(inode, |meta| async move {
                    meta.set_lock(client, inode, lock, wait_ms, false).await
                })
                .await;
            match attempt {
                // After a restart the server takes only reclaims for its grace period; a new
                // lock waits for it to end rather than fail.
                Err(error) if error.code() == ErrorCode::InGrace => {
                    tokio::time::sleep(GRACE_POLL).await
                }
                // The server released this session's locks before the client heard of it.
                Err(error) if error.code() == ErrorCode::UnknownSession => {
                    self.session_expired(client, &error.0).await;
                    return Err(error);
                }
                Err(error) => return Err(error),
                Ok(()) => break,
            }
        }
        self.locks.record(inode, &lock);
        Ok(())
    }

    /// The lock that would conflict with `lock`, if any (F_GETLK).
    ///
    /// # Errors
    /// Transport errors.
    pub async fn get_lock(
        &self,
        inode: InodeId,
        lock: LockRange,
    ) -> Result<Option<LockRange>, ClientError> {
        let client = self.id();
        self.on_home(inode, |meta| async move {
            meta.get_lock(client, inode, lock).await
        })
        .await
    }

    /// Whether `owner` of this client holds any lock on `inode` (so a close must release).
    pub fn holds_locks(&self, inode: InodeId, owner: u64) -> bool {
        self.locks.holds(inode, owner)
    }

    /// Reclaims the locks held on every home whose lock epoch changed (it restarted).
    pub(crate) async fn reclaim_locks(&self) {
        let homes: Vec<(NodeId, u64)> = self
            .locks
            .epochs
            .lock()
            .expect("epochs poisoned")
            .iter()
            .map(|(h, e)| (*h, *e))
            .collect();
        for (home, known) in homes {
            let Ok(meta) = self.cluster.meta(home).await else {
                continue;
            };
            let Ok(epoch) = meta.lock_epoch().await else {
                continue;
            };
            if epoch == known {
                continue;
            }
            let held = self.locks.of_home(home);
            let mut reclaimed = 0;
            for (inode, lock) in &held {
                match meta.set_lock(self.id(), *inode, *lock, 0, true).await {
                    Ok(()) => reclaimed += 1,
                    Err(error) if error.code() == ErrorCode::UnknownSession => {
                        self.session_expired(self.id(), &error).await;
                        return;
                    }
                    Err(error) => {
                        tracing::error!(%error, %inode, "a lock could not be reclaimed: it is lost");
                        self.locks.forget(*inode, lock);
                        self.locks_lost(*inode);
                    }
                }
            }
            tracing::info!(
                home = home.0,
                reclaimed,
                held = held.len(),
                "reclaimed locks after a metadata server restart"
            );
            self.locks
                .epochs
                .lock()
                .expect("epochs poisoned")
                .insert(home, epoch);
        }
    }
}
