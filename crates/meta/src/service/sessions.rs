//! Client sessions on this home: their open files (and the orphans an unlink leaves
//! open), admission of a session the map may not list yet, and the release of what an
//! expired session held.

use super::Meta;
use crate::commit::Answered;
use crate::ops::lookup::get_attr;
use crate::ops::remove::{list_orphans, release_orphan};
use crate::store::{OpError, REPLIES, REPLY_FLOORS, UNREPORTED};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use weft_proto::access::Checks;
use weft_proto::ids::{ClientId, InodeId};
use weft_proto::messages::{LockKind, MetaRequest, MutationId, Response};
use weft_proto::ErrorCode;

/// An open file handle: the client session and its handle number.
pub(super) type OpenHandle = (ClientId, u64);

/// Most files one session of a restricted client (read-only, root squash, a subtree) holds
/// open on one metadata server: an open beyond it is refused (EMFILE), so such a client cannot
/// make the open table grow without bound.
pub(super) const OPENS_PER_SESSION_MAX: usize = 65_536;

/// Registers `open` of `inode`; true when it was new.
pub(super) fn register_open(opens: &Mutex<OpenTable>, open: OpenHandle, inode: InodeId) -> bool {
    let mut opens = opens.lock().expect("open table poisoned");
    let added = opens.handles.entry(inode).or_default().insert(open);
    if added {
        *opens.per_session.entry(open.0).or_default() += 1;
    }
    added
}

/// The files open anywhere, and which of them an unlink or rename saw open.
#[derive(Default)]
pub(super) struct OpenTable {
    /// Open handles per inode.
    pub(super) handles: HashMap<InodeId, HashSet<OpenHandle>>,
    /// Open handles per session (the sum of `handles` by session).
    pub(super) per_session: HashMap<ClientId, usize>,
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
        self.seen
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
            let seen = self.seen.lock().expect("seen table poisoned");
            seen.iter()
                .filter(|(client, first)| !live.contains(client) && **first < fetch_started)
                .map(|(client, _)| *client)
                .collect()
        };
        if expired.is_empty() {
            return;
        }
        let released = self.locks.release_clients(&expired);
        self.seen
            .lock()
            .expect("seen table poisoned")
            .retain(|client, _| !expired.contains(client));
        self.fenced
            .lock()
            .expect("fenced sessions poisoned")
            .extend(expired.iter().copied());
        tracing::info!(
            sessions = expired.len(),
            locks = released,
            "fenced expired client sessions and released their locks"
        );
        self.expiring
            .lock()
            .expect("expiring sessions poisoned")
            .extend(expired);
    }

    /// Releases the opens and drops the stored replies of the sessions fenced as expired
    /// since the last call (background work: it commits).
    pub(super) async fn finish_expiries(&self) {
        let expired =
            std::mem::take(&mut *self.expiring.lock().expect("expiring sessions poisoned"));
        if expired.is_empty() {
            return;
        }
        let closed: Vec<(OpenHandle, InodeId)> = {
            let opens = self.opens.lock().expect("open table poisoned");
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
                for client in &gone {
                    replies.retain_in((client.0, 0)..=(client.0, u64::MAX), |_, _| false)?;
                    floors.remove(client.0)?;
                }
                Ok((Response::Done, Answered::Committed))
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

    /// Registers an open; registering the same (client, handle) again changes nothing.
    pub(super) fn open(&self, open: OpenHandle, inode: InodeId) -> Result<Response, OpError> {
        self.admit_session(open.0)?;
        let added = register_open(&self.opens, open, inode);
        let result = self.read(|txn| get_attr(txn, inode));
        if result.is_err() && added {
            let _ = self.drop_open(open, inode);
        }
        result
    }

    /// Refuses what a restricted client may not hold (see [`Checks::restricted`]): a lock of a
    /// file its session has not open here (locks come through descriptors; a reclaim after a
    /// restart follows the reclaim of the opens), an exclusive lock of a read-only client
    /// (it would hold other clients' writers off), and an open past
    /// [`OPENS_PER_SESSION_MAX`].
    ///
    /// # Errors
    /// `NotPermitted`, `ReadOnly` or `NoSpace`, saying which.
    pub(crate) fn check_holds(
        &self,
        request: &MetaRequest,
        checks: &Checks,
    ) -> Result<(), OpError> {
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
                if !self.holds_open(*client, *inode) {
                    return Err(OpError::rejected(
                        ErrorCode::NotPermitted,
                        format!("a lock of {inode}, which session {client} has not open: a restricted client locks the files it opened"),
                    ));
                }
                Ok(())
            }
            MetaRequest::Open { client, .. }
            | MetaRequest::Create {
                mutation: MutationId { client, .. },
                open: Some(_),
                ..
            } => {
                let held = self
                    .opens
                    .lock()
                    .expect("open table poisoned")
                    .per_session
                    .get(client)
                    .copied()
                    .unwrap_or(0);
                if held >= OPENS_PER_SESSION_MAX {
                    return Err(OpError::rejected(
                        ErrorCode::NoSpace,
                        format!("session {client} holds {held} files open on this metadata server, the most a restricted client may: close some"),
                    ));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether `session` holds an open of `inode` here.
    pub(super) fn holds_open(&self, session: ClientId, inode: InodeId) -> bool {
        self.opens
            .lock()
            .expect("open table poisoned")
            .handles
            .get(&inode)
            .is_some_and(|handles| handles.iter().any(|(client, _)| *client == session))
    }

    /// Drops an open and tells whether the inode is still open anywhere.
    pub(super) fn drop_open(&self, open: OpenHandle, inode: InodeId) -> Dropped {
        let mut opens = self.opens.lock().expect("open table poisoned");
        let Some(handles) = opens.handles.get_mut(&inode) else {
            return Dropped::Held;
        };
        let removed = handles.remove(&open);
        let held = !handles.is_empty();
        if removed {
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
    ) -> Result<Response, OpError> {
        match self.drop_open(open, inode) {
            Dropped::Held => {}
            // A file closed before its writer reported a size (nothing was written) leaves
            // the unreported list: nothing of it is lost at a crash. A commit only when listed,
            // and answered without waiting for a sync.
            Dropped::Last => {
                let listed =
                    self.read(|txn| Ok(txn.open_table(UNREPORTED)?.get(inode.0)?.is_some()))?;
                if listed {
                    self.committer
                        .run_eventual(Box::new(move |txn| {
                            txn.open_table(UNREPORTED)?.remove(inode.0)?;
                            Ok((Response::Done, Answered::Committed))
                        }))
                        .await?;
                }
            }
            // Only a last close of a file an unlink or rename saw open costs a durable commit.
            Dropped::LastOfOrphan => {
                let opens = Arc::clone(&self.opens);
                self.committer
                    .run(Box::new(move |txn| {
                        // Opened again while this waited: keep it.
                        if opens
                            .lock()
                            .expect("open table poisoned")
                            .handles
                            .contains_key(&inode)
                        {
                            return Ok(Response::Done);
                        }
                        release_orphan(txn, inode)
                    }))
                    .await?;
                self.work.notify_one();
            }
        }
        Ok(Response::Done)
    }

    /// Disposes of the files unlinked while open before this start that no client reclaimed
    /// an open of in the grace period (their holders are gone), once it is over.
    pub(super) async fn dispose_unclaimed_orphans(&self) {
        use std::sync::atomic::Ordering;
        if !self.orphans_unclaimed.load(Ordering::Acquire) || !self.locks.grace_over() {
            return;
        }
        let opens = Arc::clone(&self.opens);
        let disposed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&disposed);
        let result = self
            .committer
            .run(Box::new(move |txn| {
                let orphans = list_orphans(&txn.open_table(crate::store::ORPHANS)?)?;
                let opens = opens.lock().expect("open table poisoned");
                for inode in orphans {
                    if !opens.handles.contains_key(&inode) {
                        release_orphan(txn, inode)?;
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(Response::Done)
            }))
            .await;
        match result {
            Ok(_) => {
                self.orphans_unclaimed.store(false, Ordering::Release);
                tracing::info!(
                    home = self.node.0,
                    disposed = disposed.load(Ordering::Relaxed),
                    "disposed of the files unlinked while open before the start that no client reclaimed"
                );
                self.work.notify_one();
            }
            Err(error) => tracing::warn!(?error, "could not dispose of unclaimed orphans"),
        }
    }
}
