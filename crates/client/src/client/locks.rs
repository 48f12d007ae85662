//! The lock calls of a [`Client`], and the reclaiming of what its session holds on metadata
//! servers: byte-range locks and open handles (kept in `session.rs`). Both live on the file's
//! home metadata server, in memory. When a home's epoch changes — it restarted, or another
//! server took it over, and forgot both — the client reclaims what it holds within the
//! server's grace period, in which no new lock is granted and no file unlinked while open is
//! disposed of. What cannot be reclaimed is lost, and the file is told.

use super::{Client, ClientError};
use std::collections::HashMap;
use weft_net::MetaCalls;
use weft_net::{MetaClient, RpcError};

use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::LockRange;
use weft_proto::Recovery;

/// How often a lock request asks again while its server is in its grace period.
const GRACE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

impl Client {
    /// Learns `home`'s epoch before the first lock or open this client holds there, so that a
    /// restart after it is noticed.
    ///
    /// # Errors
    /// Transport errors.
    pub(crate) async fn watch_home(&self, home: NodeId) -> Result<(), ClientError> {
        let known = self
            .session
            .locks
            .epochs
            .lock()
            .expect("epochs poisoned")
            .contains_key(&home);
        if !known {
            let epoch = self
                .on_node(home, |meta| async move { meta.lock_epoch().await })
                .await?;
            self.session
                .locks
                .epochs
                .lock()
                .expect("epochs poisoned")
                .entry(home)
                .or_insert(Some(epoch));
        }
        Ok(())
    }

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
        self.watch_home(inode.home()).await?;
        let mut client = self.id();
        loop {
            // After a restart the server takes only reclaims for its grace period: a new lock
            // waits for it to end rather than fail (and a restricted client's lock, which
            // needs its open there, waits for that open's reclaim).
            let attempt = self
                .through_grace(inode, |meta| async move {
                    meta.set_lock(client, inode, lock, wait_ms, false).await
                })
                .await;
            match attempt {
                // The server released this session's locks before the client heard of it:
                // the locks it held are lost (and told); this new request goes to the new
                // session.
                Err(error) if error.code().recovery() == Recovery::NewSession => {
                    self.session_expired(client, &error).await;
                    if self.id() == client {
                        return Err(error);
                    }
                    client = self.id();
                }
                Err(error) => return Err(error),
                Ok(()) => break,
            }
        }
        self.session.locks.record(inode, &lock);
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
        self.session.locks.holds(inode, owner)
    }

    /// Runs `call` on `inode`'s home when the home may answer `InGrace`: a call that needs an
    /// open of this client registered there (room to grow, a size report, a change through a
    /// descriptor, a restricted client's lock), or a new lock. A server that started serving
    /// the home moments ago (a restart, a takeover) answers so until this client reclaimed
    /// what it holds there, and takes no new lock before its grace period ends; the client
    /// reclaims at once and asks again, every [`GRACE_POLL`], until the server answers for
    /// itself or the operation's deadline comes.
    pub(crate) async fn through_grace<T, F, Fut>(
        &self,
        inode: InodeId,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(std::sync::Arc<MetaClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        self.within(async {
            loop {
                match self.on_home(inode, &call).await {
                    Err(error)
                        if error.code().recovery() == Recovery::Reclaim
                            && weft_net::retry::time_left(GRACE_POLL) =>
                    {
                        let _ = self.replay_changes().await;
                        self.reclaim().await;
                        tokio::time::sleep(GRACE_POLL).await;
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// Reclaims the opens and locks held on every home whose epoch changed (it restarted, or
    /// another server took it over). A home that cannot be reached is tried again at the next
    /// heartbeat.
    pub(crate) async fn reclaim(&self) {
        let _reclaiming = self.session.locks.reclaiming.lock().await;
        let homes: Vec<(NodeId, Option<u64>)> = self
            .session
            .locks
            .epochs
            .lock()
            .expect("epochs poisoned")
            .iter()
            .map(|(h, e)| (*h, *e))
            .collect();
        for (home, known) in homes {
            let forced = self.stale().remove(&home);
            // Tried again at the next heartbeat, forced as now.
            let again = || {
                if forced {
                    self.stale().insert(home);
                }
            };
            let Ok(meta) = self.cluster.meta(home).await else {
                again();
                continue;
            };
            let Ok(epoch) = meta.lock_epoch().await else {
                again();
                continue;
            };
            if Some(epoch) == known && !forced {
                continue;
            }
            let reclaimed = {
                let _running = ReclaimRunning::begin(&self.session.locks.reclaims, home);
                self.reclaim_opens(&meta, home).await
            };
            match reclaimed {
                Ok(()) => {}
                Err(error) if error.code().recovery() == Recovery::NewSession => {
                    self.session_expired(self.id(), &error).await;
                    return;
                }
                Err(_) => {
                    again();
                    continue;
                }
            }
            let held = self.session.locks.of_home(home);
            let mut reclaimed = 0;
            for (inode, lock) in &held {
                match meta.set_lock(self.id(), *inode, *lock, 0, true).await {
                    Ok(()) => reclaimed += 1,
                    Err(error) if error.code().recovery() == Recovery::NewSession => {
                        self.session_expired(self.id(), &error).await;
                        return;
                    }
                    Err(error) => {
                        tracing::error!(%error, %inode, "a lock could not be reclaimed: it is lost");
                        self.session.locks.forget(*inode, lock);
                        self.state_lost(*inode);
                    }
                }
            }
            if !held.is_empty() {
                tracing::info!(
                    home = home.0,
                    reclaimed,
                    held = held.len(),
                    "reclaimed locks after a metadata server restart"
                );
            }
            self.session
                .locks
                .epochs
                .lock()
                .expect("epochs poisoned")
                .insert(home, Some(epoch));
        }
    }

    /// Opens `handle` of `inode` again through `meta`, for what it was opened for, by whom it
    /// was, showing what it was granted in this session (so a file written since its mode
    /// allowed it is still the handle's, as POSIX has it; a capability of an earlier session
    /// is none). Refused, the open is lost (told) when `lost_if_refused`, and `false` is
    /// returned.
    ///
    /// # Errors
    /// A transport error or `UnknownSession`: nothing is lost, try again later.
    async fn reopen(
        &self,
        meta: &MetaClient,
        (inode, handle): (InodeId, u64),
        (access, caller): (u8, weft_proto::access::Caller),
        lost_if_refused: bool,
    ) -> Result<bool, RpcError> {
        let client = self.id();
        let granted = self.session.opens.granted(inode, handle, access, client);
        let reopened =
            weft_net::stubs::acting_for(caller, meta.open(client, handle, inode, access, granted));
        match reopened.await {
            Ok(_) => Ok(true),
            Err(error)
                if error.is_retryable() || error.code().recovery() == Recovery::NewSession =>
            {
                Err(error)
            }
            Err(error) if lost_if_refused => {
                tracing::error!(%error, %inode, "an open file could not be opened again: it is lost");
                self.session.opens.forget(inode, handle);
                self.state_lost(inode);
                Ok(false)
            }
            Err(error) => {
                tracing::warn!(%error, %inode, "an open could not be registered again");
                Ok(false)
            }
        }
    }

    /// Records open `handle` of `inode` for `access`, which its home answered (with
    /// `capability`, if any); `reclaims` is what [`Client::reclaims`] said of its home before
    /// the open was asked. A reclaim of that home running then or begun since may have looked
    /// for this client's opens before this one was recorded, its server having restarted
    /// after answering: then the open is registered again, as that reclaim would have (a
    /// refusal then, as from a server that has the open, loses nothing here); if that cannot
    /// be done now, the home's next reclaim registers all its opens again.
    pub(crate) async fn record_open(
        &self,
        (inode, handle): (InodeId, u64),
        access: u8,
        capability: Option<weft_proto::access::Capability>,
        reclaims: u64,
    ) {
        let home = inode.home();
        let caller = weft_net::stubs::caller();
        self.session
            .opens
            .record((inode, handle), (access, caller.clone()), capability);
        if self.reclaims(home) == reclaims && reclaims % 2 == 0 {
            return;
        }
        let reopened = match self.cluster.meta(home).await {
            Ok(meta) => {
                self.reopen(&meta, (inode, handle), (access, caller), false)
                    .await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = reopened {
            tracing::warn!(%error, %inode, "an open answered before its server restarted is not registered again yet");
            self.stale().insert(home);
        }
    }

    /// Twice the reclaims of opens of `home` begun so far, less one while one runs (see
    /// [`ReclaimRunning`]), for [`Client::record_open`].
    pub(crate) fn reclaims(&self, home: NodeId) -> u64 {
        self.session
            .locks
            .reclaims
            .lock()
            .expect("reclaim counts poisoned")
            .get(&home)
            .copied()
            .unwrap_or(0)
    }

    fn stale(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<NodeId>> {
        self.session
            .locks
            .stale
            .lock()
            .expect("stale homes poisoned")
    }

    /// Opens again through `meta`, in the current session, the handles open here on files of
    /// `home`: after their server restarted, or in a new session. A file that is gone
    /// meanwhile (disposed of once nobody held it open) is lost, and told.
    ///
    /// # Errors
    /// A transport error or `UnknownSession`: nothing is lost, try again later.
    async fn reclaim_opens(&self, meta: &MetaClient, home: NodeId) -> Result<(), RpcError> {
        let held = self.session.opens.of_home(home);
        if held.is_empty() {
            return Ok(());
        }
        let mut lost = 0;
        for (inode, handle, (access, caller)) in &held {
            if !self
                .reopen(meta, (*inode, *handle), (*access, caller.clone()), true)
                .await?
            {
                lost += 1;
            }
        }
        tracing::info!(
            home = home.0,
            reopened = held.len() - lost,
            lost,
            "opened files again after a metadata server restart or a new session"
        );
        Ok(())
    }
}

/// A reclaim of a home's opens running: the home's count of reclaims is odd from its start
/// until it ends, however it ends.
struct ReclaimRunning<'a>(&'a std::sync::Mutex<HashMap<NodeId, u64>>, NodeId);

impl<'a> ReclaimRunning<'a> {
    fn begin(
        reclaims: &'a std::sync::Mutex<HashMap<NodeId, u64>>,
        home: NodeId,
    ) -> ReclaimRunning<'a> {
        *reclaims
            .lock()
            .expect("reclaim counts poisoned")
            .entry(home)
            .or_default() += 1;
        ReclaimRunning(reclaims, home)
    }
}

impl Drop for ReclaimRunning<'_> {
    fn drop(&mut self) {
        *self
            .0
            .lock()
            .expect("reclaim counts poisoned")
            .entry(self.1)
            .or_default() += 1;
    }
}
