//! Client sessions on this home: their open files (and the orphans an unlink leaves
//! open), admission of a session the map may not list yet, and the release of what an
//! expired session held.

use super::Meta;
use crate::commit::Answered;
use crate::ops::lookup::get_attr;
use crate::ops::remove::{list_orphans, release_orphan};
use crate::schema::{OpError, REPLIES, REPLY_FLOORS, UNREPORTED};
use crate::store::ReadableTable;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use weft_proto::access::Checks;
use weft_proto::ids::{ClientId, InodeId};
use weft_proto::messages::{LockKind, MetaRequest, MetaResponse};
use weft_proto::ErrorCode;

/// An open file handle: the client session and its handle number.
pub(super) type OpenHandle = (ClientId, u64);

/// Most files one session of a restricted client (read-only, root squash, a subtree) holds
/// open on one metadata server: an open beyond it is refused (EMFILE), so such a client cannot
/// make the open table grow without bound.
pub(super) const OPENS_PER_SESSION_MAX: usize = 65_536;

/// What a home keeps of its client sessions beside its tables.
pub(crate) struct SessionState {
    /// Open counts per inode and client session: an unlinked inode lives while one is held.
    pub(super) opens: Arc<Mutex<OpenTable>>,
    /// Orphans from before this start may wait for the end of the grace period, in which
    /// clients reclaim their opens.
    pub(super) orphans_unclaimed: std::sync::atomic::AtomicBool,
    /// When this server first heard of each client session, so that a session that registered
    /// after the last map fetch is not taken for expired.
    pub(super) seen: Mutex<HashMap<ClientId, std::time::Instant>>,
    /// Sessions this server released as expired: their locks and opens are refused from then
    /// on (`UnknownSession`), so a client that missed its expiry learns it instead of acting
    /// on locks another client may hold now.
    fenced: Mutex<HashSet<ClientId>>,
    /// Sessions fenced as expired whose opens and stored replies the background work has
    /// still to release.
    expiring: Mutex<HashSet<ClientId>>,
}

impl SessionState {
    /// No session known yet; `orphans` were unlinked while open before this start, and wait
    /// for their clients to reclaim them (the last close of a reclaimed open disposes of one).
    pub(super) fn new(orphans: HashSet<InodeId>) -> SessionState {
        SessionState {
            orphans_unclaimed: std::sync::atomic::AtomicBool::new(!orphans.is_empty()),
            opens: Arc::new(Mutex::new(OpenTable {
                handles: HashMap::new(),
                per_session: HashMap::new(),
                access: HashMap::new(),
                maybe_orphaned: orphans,
            })),
            seen: Mutex::default(),
            fenced: Mutex::default(),
            expiring: Mutex::default(),
        }
    }
}

/// Registers `open` of `inode` for `access` (added to what it was registered for); true
/// when it was new.
pub(super) fn register_open(
    opens: &Mutex<OpenTable>,
    open: OpenHandle,
    inode: InodeId,
    access: u8,
) -> bool {
    let mut opens = opens.lock().expect("open table poisoned");
    let added = opens.handles.entry(inode).or_default().insert(open);
    if added {
        *opens.per_session.entry(open.0).or_default() += 1;
    }
    *opens.access.entry(open).or_default() |= access;
    added
}

/// The files open anywhere, and which of them an unlink or rename saw open.
#[derive(Default)]
pub(super) struct OpenTable {
    /// Open handles per inode.
    pub(super) handles: HashMap<InodeId, HashSet<OpenHandle>>,
    /// Open handles per session (the sum of `handles` by session).
    pub(super) per_session: HashMap<ClientId, usize>,
    /// What each open handle was opened for ([`weft_proto::access`] bits): a change through
    /// it is judged by this (see `Meta::opened_for`).
    pub(super) access: HashMap<OpenHandle, u8>,
    /// Inodes an operation that may orphan them (the last unlink, a rename over them) found
    /// open. Only their last close has an orphan to look for; every other close is free.
    /// Checked and marked under the same lock as `handles`, so no close slips between.
    pub(super) maybe_orphaned: HashSet<InodeId>,
}

/// What dropping an open left of an inode's opens.
pub(super) enum Dropped {
    /// Other opens hold it still.
    Held,
    /// That was its last open.
    Last,
    /// That was its last open, and an unlink or rename may have left it an orphan.
    LastOfOrphan,
}

impl Meta {
    /// Admits a mutation, a lock or an open of `client`'s session: refused for a session
    /// released as expired.
    pub(super) fn admit_session(&self, client: ClientId) -> Result<(), OpError> {
        if self
            .sessions
            .fenced
            .lock()
            .expect("fenced sessions poisoned")
            .contains(&client)
        {
            return Err(OpError::rejected(
                ErrorCode::UnknownSession,
                format!(
                    "client session {client} expired and its locks and opens here were released"
                ),
            ));
        }
        self.note_client(client);
        Ok(())
    }

    pub(super) fn note_client(&self, client: ClientId) {
        self.sessions
            .seen
            .lock()
            .expect("seen table poisoned")
            .entry(client)
            .or_insert_with(std::time::Instant::now);
    }

    /// Fences the sessions management no longer lists as live, if this server knew them
    /// before the map was fetched, and releases their locks; their opens and stored replies
    /// wait for [`Meta::finish_expiries`].
    pub(super) fn expire_sessions(
        &self,
        map: &weft_proto::messages::ClusterMap,
        fetch_started: std::time::Instant,
    ) {
        let live: HashSet<ClientId> = map.live_sessions.iter().copied().collect();
        let expired: HashSet<ClientId> = {
            let seen = self.sessions.seen.lock().expect("seen table poisoned");
            seen.iter()
                .filter(|(client, first)| !live.contains(client) && **first < fetch_started)
                .map(|(client, _)| *client)
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        let released = self.locks.release_clients(&expired);
        self.sessions
            .seen
            .lock()
            .expect("seen table poisoned")
            .retain(|client, _| !expired.contains(client));
        self.sessions
            .fenced
            .lock()
            .expect("fenced sessions poisoned")
            .extend(expired.iter().copied());
        tracing::info!(
            sessions = expired.len(),
            locks = released,
            "fenced expired client sessions and released their locks"
        );
        self.sessions
            .expiring
            .lock()
            .expect("expiring sessions poisoned")
            .extend(expired);
    }

    /// Releases the opens and drops the stored replies of the sessions fenced as expired
    /// since the last call (background work: it commits).
    pub(super) async fn finish_expiries(&self) {
        let expired = std::mem::take(
            &mut *self
                .sessions
                .expiring
                .lock()
                .expect("expiring sessions poisoned"),
        );
        if expired.is_empty() {
            return;
        }
        let closed: Vec<(OpenHandle, InodeId)> = {
            let opens = self.sessions.opens.lock().expect("open table poisoned");
            opens
                .handles
                .iter()
                .flat_map(|(inode, handles)| {
                    handles
                        .iter()
                        .filter(|h| expired.contains(&h.0))
                        .map(move |h| (*h, *inode))
                })
                .collect()
        };
        // A client that died with files open may have written without reporting the size: the
        // objects' lengths tell it. Done before the release, which may dispose of an orphan.
        let inodes: HashSet<InodeId> = closed.iter().map(|(_, inode)| *inode).collect();
        for inode in inodes {
            if let Err(error) = self.settle_size(inode, None).await {
                tracing::warn!(%inode, ?error, "could not recompute a size from the objects");
            }
        }
        for (handle, inode) in &closed {
            let _ = self.release(*handle, *inode).await;
        }
        // Their stored replies are never asked for again (a fenced session's retries are
        // refused): drop them.
        let gone = expired.clone();
        let dropped = self
            .committer
            .run_eventual(Box::new(move |txn| {
                let mut replies = txn.open_table(REPLIES)?;
                let mut floors = txn.open_table(REPLY_FLOORS)?;
                // Nor is the session waited for at a start: it will replay nothing.
                let mut replayers = txn.open_table(crate::schema::REPLAYERS)?;
                for client in &gone {
                    replies.retain_in((client.0, 0)..=(client.0, u64::MAX), |_, _| false)?;
                    floors.remove(client.0)?;
                    replayers.remove(client.0)?;
                }
                Ok((MetaResponse::Done, Answered::Committed))
            }))
            .await;
        if let Err(error) = dropped {
            tracing::warn!(
                ?error,
                "could not drop the stored replies of expired sessions"
            );
        }
        tracing::info!(
            sessions = expired.len(),
            opens = closed.len(),
            "released what expired client sessions held"
        );
    }

    /// Registers an open for `access`; registering the same (client, handle) again adds the
    /// access asked.
    pub(super) fn open(
        &self,
        open: OpenHandle,
        inode: InodeId,
        access: u8,
    ) -> Result<MetaResponse, OpError> {
        self.admit_session(open.0)?;
        let added = register_open(&self.sessions.opens, open, inode, access);
        let result = self.read(|txn| get_attr(txn, inode));
        if result.is_err() && added {
            let _ = self.drop_open(open, inode);
        }
        result
    }

    /// Refuses what a restricted client may not hold (see [`Checks::restricted`]): a lock of a
    /// file its session has not open here for reading or writing (locks come through
    /// descriptors; after a restart the opens are reclaimed before the locks), an exclusive
    /// lock of a read-only client (it would hold other clients' writers off), an open that
    /// says for nothing (only a reclaim in the grace period after a start may), and a new open
    /// past [`OPENS_PER_SESSION_MAX`] (a handle opened again, or a create answered from its
    /// stored reply, is no new open).
    ///
    /// # Errors
    /// `NotPermitted`, `ReadOnly`, `InvalidArgument` or `TooManyOpen`, saying which.
    pub(crate) fn check_holds(
        &self,
        request: &MetaRequest,
        checks: &Checks,
    ) -> Result<(), OpError> {
        let too_many = |client: &ClientId, held: usize| {
            Err(OpError::rejected(
                ErrorCode::TooManyOpen,
                format!("session {client} holds {held} files open on this metadata server, the most a restricted client may: close some"),
            ))
        };
        let held_by = |client: &ClientId| {
            self.sessions
                .opens
                .lock()
                .expect("open table poisoned")
                .per_session
                .get(client)
                .copied()
                .unwrap_or(0)
        };
        match request {
            MetaRequest::SetLock {
                client,
                inode,
                lock,
                ..
            } if lock.kind != LockKind::Unlock => {
                if checks.read_only && lock.kind == LockKind::Write {
                    return Err(OpError::rejected(
                        ErrorCode::ReadOnly,
                        format!("an exclusive lock of {inode} by a read-only client: it takes shared locks only"),
                    ));
                }
                if self.open_access(*client, *inode) == 0 {
                    return Err(self.open_missing(*client, *inode, OpError::rejected(
                        ErrorCode::NotPermitted,
                        format!("a lock of {inode}, which session {client} has not open for reading or writing: a restricted client locks the files it opened"),
                    )));
                }
                Ok(())
            }
            MetaRequest::Open {
                client,
                handle,
                inode,
                access,
                ..
            } => {
                if *access == 0 && self.locks.grace_over() {
                    return Err(OpError::rejected(
                        ErrorCode::InvalidArgument,
                        format!("an open of {inode} for neither reading nor writing: a restricted client says what it opens for"),
                    ));
                }
                let held = held_by(client);
                if held >= OPENS_PER_SESSION_MAX
                    && self.handle_access((*client, *handle), *inode).is_none()
                {
                    return too_many(client, held);
                }
                Ok(())
            }
            MetaRequest::Create {
                mutation,
                open: Some(_),
                ..
            } => {
                let held = held_by(&mutation.client);
                if held < OPENS_PER_SESSION_MAX {
                    return Ok(());
                }
                if self.answered_before(*mutation)? {
                    return Ok(());
                }
                too_many(&mutation.client, held)
            }
            _ => Ok(()),
        }
    }

    /// Whether `mutation` was answered before (its stored reply answers it again, and what
    /// it made is counted already).
    pub(super) fn answered_before(
        &self,
        mutation: weft_proto::messages::MutationId,
    ) -> Result<bool, OpError> {
        self.read(|txn| {
            let replies = txn.open_table(REPLIES)?;
            let answered = replies.get((mutation.client.0, mutation.seq))?.is_some();
            Ok(answered)
        })
    }

    /// What the opens `session` holds of `inode` here were opened for, together
    /// ([`weft_proto::access`] bits; 0 when it holds none).
    pub(super) fn open_access(&self, session: ClientId, inode: InodeId) -> u8 {
        let opens = self.sessions.opens.lock().expect("open table poisoned");
        opens.handles.get(&inode).map_or(0, |handles| {
            handles
                .iter()
                .filter(|(client, _)| *client == session)
                .fold(0, |access, open| {
                    access | opens.access.get(open).copied().unwrap_or(0)
                })
        })
    }

    /// Why a request that needs `session`'s open of `inode` registered here, and did not
    /// find it, is refused: in the grace period after this server started serving the home
    /// (a restart, or a takeover from the server that held it) the open may be one its client
    /// has not reclaimed yet, so the client is told to reclaim and ask again (`InGrace`);
    /// after it, `refusal` (the open is not there).
    pub(super) fn open_missing(
        &self,
        session: ClientId,
        inode: InodeId,
        refusal: OpError,
    ) -> OpError {
        if self.locks.grace_over() {
            return refusal;
        }
        OpError::rejected(
            ErrorCode::InGrace,
            format!("session {session} has no open of {inode} registered here yet: this metadata server started serving the file's home moments ago, and its clients reclaim their opens now; ask again once reclaimed"),
        )
    }

    /// What open `open` of `inode` was opened for here, if it is registered.
    pub(super) fn handle_access(&self, open: OpenHandle, inode: InodeId) -> Option<u8> {
        let opens = self.sessions.opens.lock().expect("open table poisoned");
        if !opens
            .handles
            .get(&inode)
            .is_some_and(|handles| handles.contains(&open))
        {
            return None;
        }
        Some(opens.access.get(&open).copied().unwrap_or(0))
    }

    /// Drops an open and tells whether the inode is still open anywhere.
    pub(super) fn drop_open(&self, open: OpenHandle, inode: InodeId) -> Dropped {
        let mut opens = self.sessions.opens.lock().expect("open table poisoned");
        let Some(handles) = opens.handles.get_mut(&inode) else {
            return Dropped::Held;
        };
        let removed = handles.remove(&open);
        let held = !handles.is_empty();
        if removed {
            // The session's room for the file goes with its last open of it.
            if !handles.iter().any(|(session, _)| *session == open.0) {
                self.grants.forget_room(open.0, inode);
            }
            opens.access.remove(&open);
            if let Some(count) = opens.per_session.get_mut(&open.0) {
                *count -= 1;
                if *count == 0 {
                    opens.per_session.remove(&open.0);
                }
            }
        }
        if held {
            return Dropped::Held;
        }
        opens.handles.remove(&inode);
        if opens.maybe_orphaned.remove(&inode) {
            Dropped::LastOfOrphan
        } else {
            Dropped::Last
        }
    }

    pub(super) async fn release(
        &self,
        open: OpenHandle,
        inode: InodeId,
    ) -> Result<MetaResponse, OpError> {
        match self.drop_open(open, inode) {
            Dropped::Held => {}
            // A file closed before its writer reported a size (nothing was written) leaves
            // the unreported list: nothing of it is lost at a crash. Only when listed, and in
            // the next commit: a crash before it leaves the file listed, and the start finds
            // its size is what its objects hold.
            Dropped::Last => {
                let listed =
                    self.read(|txn| Ok(txn.open_table(UNREPORTED)?.get(inode.0)?.is_some()))?;
                if listed {
                    self.committer.tidy(Box::new(move |txn| {
                        txn.open_table(UNREPORTED)?.remove(inode.0)?;
                        Ok(())
                    }));
                }
            }
            // Only a last close of a file an unlink or rename saw open costs a durable commit.
            Dropped::LastOfOrphan => {
                let opens = Arc::clone(&self.sessions.opens);
                self.committer
                    .run(Box::new(move |txn| {
                        // Opened again while this waited: keep it.
                        if opens
                            .lock()
                            .expect("open table poisoned")
                            .handles
                            .contains_key(&inode)
                        {
                            return Ok(MetaResponse::Done);
                        }
                        release_orphan(txn, inode)
                    }))
                    .await?;
                self.background.work.notify_one();
            }
        }
        Ok(MetaResponse::Done)
    }

    /// Disposes of the files unlinked while open before this start that no client reclaimed
    /// an open of in the grace period (their holders are gone), once it is over.
    pub(super) async fn dispose_unclaimed_orphans(&self) {
        use std::sync::atomic::Ordering;
        if !self.sessions.orphans_unclaimed.load(Ordering::Acquire) || !self.locks.grace_over() {
            return;
        }
        let opens = Arc::clone(&self.sessions.opens);
        let disposed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&disposed);
        let result = self
            .committer
            .run(Box::new(move |txn| {
                let orphans = list_orphans(&txn.open_table(crate::schema::ORPHANS)?)?;
                let opens = opens.lock().expect("open table poisoned");
                for inode in orphans {
                    if !opens.handles.contains_key(&inode) {
                        release_orphan(txn, inode)?;
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(MetaResponse::Done)
            }))
            .await;
        match result {
            Ok(_) => {
                self.sessions
                    .orphans_unclaimed
                    .store(false, Ordering::Release);
                tracing::info!(
                    home = self.node.0,
                    disposed = disposed.load(Ordering::Relaxed),
                    "disposed of the files unlinked while open before the start that no client reclaimed"
                );
                self.background.work.notify_one();
            }
            Err(error) => tracing::warn!(?error, "could not dispose of unclaimed orphans"),
        }
    }
}
