//! What a client holds on metadata servers: byte-range locks and open handles. Both live on the
//! file's home metadata server, in memory; the client remembers the ranges each of its lock
//! owners holds (with the same arithmetic as the server, `proto::locks`), the handles it has
//! open, and the epoch of each home it holds either on. When a home's epoch changes — it
//! restarted, or another server took it over, and forgot both — the client reclaims what it
//! holds within the server's grace period, in which no new lock is granted and no file
//! unlinked while open is disposed of. What cannot be reclaimed is lost, and the file is told.

use crate::client::{Client, ClientError};
use std::collections::HashMap;
use std::sync::Mutex;
use weft_net::{MetaClient, RpcError};
use weft_proto::access::{Caller, Capability};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::locks::apply_to_owner;
use weft_proto::messages::LockRange;
use weft_proto::Recovery;

/// How often a lock request asks again while its server is in its grace period.
const GRACE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// What this client holds: inode → owner → ranges; and the epoch of each home seen.
#[derive(Default)]
pub(crate) struct HeldLocks {
    held: Mutex<HashMap<InodeId, HashMap<u64, Vec<LockRange>>>>,
    /// The epoch of each home this client held a lock or an open on when it last looked;
    /// `None` once everything held there must be reclaimed whatever its epoch (a new session).
    epochs: Mutex<HashMap<NodeId, Option<u64>>>,
    /// Held by the reclaim under way: the periodic one and one a grace answer asked for do
    /// not reclaim the same home twice at once.
    reclaiming: tokio::sync::Mutex<()>,
}

/// The handles this client has open: inode → handles, with what each was opened for and by
/// whom (an open for a new capability asks the same), and the capabilities its opens were
/// granted.
#[derive(Default)]
pub(crate) struct HeldOpens {
    held: Mutex<HashMap<InodeId, HeldFile>>,
}

/// The opens of one file.
#[derive(Default)]
struct HeldFile {
    handles: HashMap<u64, (u8, Caller)>,
    /// At most one per access asked (read, write, both).
    capabilities: Vec<Capability>,
}

impl HeldOpens {
    pub(crate) fn record(
        &self,
        (inode, handle): (InodeId, u64),
        opened: (u8, Caller),
        capability: Option<Capability>,
    ) {
        self.held
            .lock()
            .expect("held opens poisoned")
            .entry(inode)
            .or_default()
            .handles
            .insert(handle, opened);
        if let Some(capability) = capability {
            self.renew(inode, capability);
        }
    }

    /// Keeps `capability` for the file instead of the one granting the same access (a grant
    /// made again, with a wider growth bound, for the room its home reserved).
    pub(crate) fn renew(&self, inode: InodeId, capability: Capability) {
        let mut held = self.held.lock().expect("held opens poisoned");
        if let Some(file) = held.get_mut(&inode) {
            file.capabilities
                .retain(|kept| kept.access != capability.access);
            file.capabilities.push(capability);
        }
    }

    /// Forgets a handle closed; the file's capabilities go with its last handle.
    pub(crate) fn forget(&self, inode: InodeId, handle: u64) {
        let mut held = self.held.lock().expect("held opens poisoned");
        if let Some(file) = held.get_mut(&inode) {
            file.handles.remove(&handle);
            if file.handles.is_empty() {
                held.remove(&inode);
            }
        }
    }

    /// A capability of `inode` granting `want` ([`weft_proto::access`] bits) to `session`, if
    /// an open of it was granted one.
    pub(crate) fn capability(
        &self,
        inode: InodeId,
        want: u8,
        session: weft_proto::ids::ClientId,
    ) -> Option<Capability> {
        let held = self.held.lock().expect("held opens poisoned");
        // Of those that grant it, the one whose room reaches furthest (a reserve grants the
        // access of the open it was asked through again, with the new room).
        held.get(&inode)?
            .capabilities
            .iter()
            .filter(|capability| capability.access & want == want && capability.session == session)
            .max_by_key(|capability| {
                capability
                    .growth
                    .map_or(u64::MAX, |growth| growth.object_end)
            })
            .copied()
    }

    /// The capability of `session` granting `want` that handle `handle` of `inode` holds,
    /// if it was opened for at least that (expired or not: it shows what the open was
    /// granted, see [`weft_proto::messages::MetaRequest::Open`]).
    pub(crate) fn granted(
        &self,
        inode: InodeId,
        handle: u64,
        want: u8,
        session: weft_proto::ids::ClientId,
    ) -> Option<Capability> {
        let opened_for = {
            let held = self.held.lock().expect("held opens poisoned");
            held.get(&inode)?.handles.get(&handle)?.0
        };
        if want == 0 || opened_for & want != want {
            return None;
        }
        self.capability(inode, want, session)
    }

    /// A handle of `inode` opened for at least `want`, with what it was opened for and by whom.
    pub(crate) fn handle_for(&self, inode: InodeId, want: u8) -> Option<(u64, (u8, Caller))> {
        let held = self.held.lock().expect("held opens poisoned");
        held.get(&inode)?
            .handles
            .iter()
            .find(|(_, (access, _))| access & want == want)
            .map(|(handle, opened)| (*handle, opened.clone()))
    }

    /// The handles open on files of `home`, with what each was opened for and by whom.
    fn of_home(&self, home: NodeId) -> Vec<(InodeId, u64, (u8, Caller))> {
        let held = self.held.lock().expect("held opens poisoned");
        held.iter()
            .filter(|(inode, _)| inode.home() == home)
            .flat_map(|(inode, file)| {
                file.handles
                    .iter()
                    .map(move |(handle, opened)| (*inode, *handle, opened.clone()))
            })
            .collect()
    }
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

    /// Has the next [`Client::reclaim`] open again and relock what is held on every home,
    /// whatever its epoch: for a new session.
    pub(crate) fn reclaim_everywhere(&self) {
        let mut epochs = self.epochs.lock().expect("epochs poisoned");
        epochs.values_mut().for_each(|epoch| *epoch = None);
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
    /// Learns `home`'s epoch before the first lock or open this client holds there, so that a
    /// restart after it is noticed.
    ///
    /// # Errors
    /// Transport errors.
    pub(crate) async fn watch_home(&self, home: NodeId) -> Result<(), ClientError> {
        let known = self
            .locks
            .epochs
            .lock()
            .expect("epochs poisoned")
            .contains_key(&home);
        if !known {
            let epoch = self
                .on_node(home, |meta| async move { meta.lock_epoch().await })
                .await?;
            self.locks
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
        let _reclaiming = self.locks.reclaiming.lock().await;
        let homes: Vec<(NodeId, Option<u64>)> = self
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
            if Some(epoch) == known {
                continue;
            }
            match self.reclaim_opens(&meta, home).await {
                Ok(()) => {}
                Err(error) if error.code().recovery() == Recovery::NewSession => {
                    self.session_expired(self.id(), &error).await;
                    return;
                }
                Err(_) => continue,
            }
            let held = self.locks.of_home(home);
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
                        self.locks.forget(*inode, lock);
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
            self.locks
                .epochs
                .lock()
                .expect("epochs poisoned")
                .insert(home, Some(epoch));
        }
    }

    /// Opens again through `meta`, in the current session, the handles open here on files of
    /// `home`: after their server restarted, or in a new session. A file that is gone
    /// meanwhile (disposed of once nobody held it open) is lost, and told.
    ///
    /// # Errors
    /// A transport error or `UnknownSession`: nothing is lost, try again later.
    async fn reclaim_opens(&self, meta: &MetaClient, home: NodeId) -> Result<(), RpcError> {
        let held = self.opens.of_home(home);
        if held.is_empty() {
            return Ok(());
        }
        let client = self.id();
        let mut lost = 0;
        for (inode, handle, (access, caller)) in &held {
            // Opened again for what it was opened for, by whom it was, showing what it was
            // granted in this session (so a file written since its mode allowed it is still
            // the handle's, as POSIX has it); a capability of an earlier session is none.
            let granted = self.opens.granted(*inode, *handle, *access, client);
            let reopened = weft_net::stubs::acting_for(
                caller.clone(),
                meta.open(client, *handle, *inode, *access, granted),
            );
            match reopened.await {
                Ok(_) => {}
                Err(error)
                    if error.is_retryable() || error.code().recovery() == Recovery::NewSession =>
                {
                    return Err(error)
                }
                Err(error) => {
                    lost += 1;
                    tracing::error!(%error, %inode, "an open file could not be opened again: it is lost");
                    self.opens.forget(*inode, *handle);
                    self.state_lost(*inode);
                }
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
