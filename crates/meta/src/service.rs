//! The metadata request handler of one home: its state ([`Meta`]), its start and stop, and
//! the checks a request passes before it is served. Its parts live beside it:
//!
//! - `dispatch`: every request to what serves it;
//! - `intents`: operations that span metadata servers, their intents and recovery;
//! - `replies`: stored replies, which make every mutation idempotent;
//! - `sessions`: client sessions, their open files and orphans, and expiry;
//! - `work`: background work (truncates, disposal, size settling) and its loop;
//! - `moves`: files moving to other targets while in use, and the loop that moves them;
//! - `fsck`: the consistency check and its object verification (`verify`);
//! - `access` and `subtree`: the checks a client's rule asks of this server.

mod access;
mod dispatch;
mod fsck;
mod grants;
mod intents;
mod moves;
mod names;
mod numbered;
mod replies;
mod sessions;
mod subtree;
mod targets;
mod verify;
mod work;

#[cfg(test)]
pub(crate) use intents::mkdir::create_dir_inode;
pub(crate) use moves::MoveMetrics;
pub(crate) use replies::{idempotent, idempotent_admitted, kept_in};

use crate::chooser::Chooser;
use crate::commit::{CommitMetrics, Committer};
use crate::locks::LockTable;
use crate::ops::create::ensure_root;
use crate::ops::remove::list_orphans;
use crate::ops::OpContext;
use crate::replica::{HomeFiles, HomeLink, LinkParts};
use crate::schema::{OpError, REPLIES, UNREPORTED};
use crate::store::Store as Database;
use crate::store::{ReadableTable, WriteTransaction};
use crate::{MetaConfig, MetaError};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_net::mirror::Membership;
use weft_net::ClusterView;
use weft_proto::access::{Checks, READ, WRITE};
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, InodeId, NodeId, ROOT_HOME};
use weft_proto::messages::{CheckProgress, FileKind, MetaRequest, MetaResponse, MutationId, Reply};
use weft_proto::ErrorCode;
use weft_service::missed::MissedLogs;
use work::{spread_directories, work_loop};

/// Longest a copy of a checked client's mutation tries to finish the first copy's
/// cross-server intent before it answers `Busy` (see `Meta::kept_reply`).
const INTENT_WAIT_MAX: Duration = Duration::from_secs(5);
/// How long such a copy waits between tries.
const INTENT_WAIT_SLICE: Duration = Duration::from_millis(20);

/// A failed call to another server: its own error, or `Unavailable` (which clients retry).
fn rpc_error(error: weft_net::RpcError) -> OpError {
    match error {
        weft_net::RpcError::Remote(error) => OpError::Rejected(error),
        other => OpError::Rejected(WireError::new(ErrorCode::Unavailable, other.to_string())),
    }
}

/// One metadata home served by this server: its store and what lives beside it in memory.
pub(crate) struct Meta {
    /// The home: the node id every inode created here carries.
    node: NodeId,
    db: Arc<Database>,
    /// The store file's link to the home's mirror members.
    link: Arc<HomeLink>,
    /// The background work loop and the mover.
    workers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    committer: Committer,
    cluster: Arc<ClusterView>,
    chooser: Arc<Chooser>,
    /// Places new directories on metadata servers.
    directory_chooser: Chooser,
    locks: LockTable,
    /// How far the consistency check that runs (or ran last) is.
    check_progress: Mutex<CheckProgress>,
    /// The runs of this home's intents, and what other homes were told of them (see
    /// [`intents`]).
    intents: intents::IntentState,
    /// What the background work loop works through (see [`work`]).
    background: work::Background,
    /// Client sessions' opens and expiries on this home (see [`sessions`]).
    sessions: sessions::SessionState,
    /// The moves subsystem's state (see [`moves`]).
    moves: moves::MoveState,
    /// Directories recently found inside a confined client's subtree (see [`subtree`]).
    inside: subtree::Inside,
    /// What this home holds of hard quotas, and what counts against it (see [`grants`]).
    grants: Arc<grants::QuotaGrants>,
    /// Whether clients' changes are answered before their sync (`sync_every_change` off).
    answers_before_sync: bool,
    /// The replay of what this start lost (see [`numbered`]).
    recovery: numbered::Recovery,
    /// Directories whose makers answer for names not in them (see [`names`]).
    names: Arc<names::NamesLeases>,
}

/// A failure opening or preparing `home`'s store.
fn store_error(
    home: NodeId,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> MetaError {
    MetaError::Store {
        home,
        source: source.into(),
    }
}

/// What every home a metadata server serves shares.
pub(crate) struct Shared {
    /// This server's node id.
    pub node: NodeId,
    pub config: MetaConfig,
    pub cluster: Arc<ClusterView>,
    pub membership: Arc<Membership>,
    /// What absent members of the groups this server is primary of miss.
    pub missed: Arc<MissedLogs>,
    /// What this server keeps of its homes' store files: changes not shipped, write locks.
    pub files: Arc<HomeFiles>,
    pub commit_metrics: CommitMetrics,
    pub move_metrics: moves::MoveMetrics,
}

impl Meta {
    /// Opens the store of `home` (this server's own, or a copy of a mirrored home it now
    /// serves as primary) and starts its background work. Blocks: call it on a blocking
    /// thread.
    ///
    /// # Errors
    /// [`MetaError::Store`] when the store cannot be opened.
    pub(crate) fn start(home: NodeId, shared: &Shared) -> Result<Arc<Meta>, MetaError> {
        let parts = LinkParts {
            membership: Arc::clone(&shared.membership),
            cluster: Arc::clone(&shared.cluster),
            missed: Arc::clone(&shared.missed),
            files: Arc::clone(&shared.files),
            sync_seconds: shared.commit_metrics.sync_seconds.clone(),
        };
        let (link, file) = HomeLink::open(&shared.config.data_dir, shared.node, home, parts)
            .map_err(|e| store_error(home, e))?;
        // Only this server's own home logs its changes: a copy of another's, served after a
        // failover, commits every batch to redb, as the members it ships to expect.
        let log = (home == shared.node).then(|| {
            crate::store::log_path(&crate::replica::home_path(
                &shared.config.data_dir,
                shared.node,
                home,
            ))
        });
        let (db, logged) =
            Database::open(file, log.as_deref()).map_err(|e| store_error(home, e))?;
        let db = Arc::new(db);
        // Every table is known now: the rows the log held go into them, synced before the log
        // starts again, and then an earlier version's tables are converted.
        crate::schema::open_tables(&db).map_err(|e| store_error(home, e))?;
        link.sync_next_inline();
        if db.replay_log(logged).map_err(|e| store_error(home, e))? {
            match link.sync_outcome(link.last_sync()) {
                Some(Ok(())) => db.restart_log().map_err(|e| store_error(home, e))?,
                Some(Err(error)) => return Err(store_error(home, error)),
                // The log keeps its rows: the next start writes them again.
                None => {}
            }
        }
        crate::schema::create_tables(&db).map_err(|e| store_error(home, e))?;
        let mut first_start = false;
        // Files unlinked while open before this start stay until the grace period is over:
        // their clients reclaim their opens meanwhile (see `dispose_unclaimed_orphans`).
        let orphans: HashSet<InodeId> = {
            let txn = db.begin_write().map_err(|e| store_error(home, e))?;
            if home == ROOT_HOME && ensure_root(&txn).map_err(|e| store_error(home, e))? {
                tracing::info!("created the root directory");
                first_start = true;
            }
            let orphans = txn
                .open_table(crate::schema::ORPHANS)
                .map_err(|e| store_error(home, e))
                .and_then(|table| list_orphans(&table).map_err(|e| store_error(home, e)))?;
            txn.commit(crate::store::Commit::Checkpoint { durable: true })
                .map_err(|e| store_error(home, e))?;
            orphans
        };
        let config = &shared.config;
        // A new file system has no locks to reclaim.
        let locks = LockTable::until_served(if first_start {
            Duration::ZERO
        } else {
            config.lock_grace
        });
        // The sessions the last run answered changes before their sync: this start waits for
        // them to replay what it lost.
        let (recovering, expected) = (|| {
            let txn = db.begin_write()?;
            let previous = crate::schema::swap_incarnation(&txn, locks.epoch())?;
            // A start that ended during its own recovery leaves it to this one.
            let recovering = match crate::schema::recovering(&txn)? {
                0 => previous,
                unfinished => unfinished,
            };
            let expected = numbered::expected_sessions(
                &txn.open_table(crate::schema::REPLAYERS)?,
                recovering,
            )?;
            crate::schema::set_recovering(&txn, if expected.is_empty() { 0 } else { recovering })?;
            txn.commit(crate::store::Commit::Checkpoint { durable: true })?;
            Ok::<_, OpError>((recovering, expected))
        })()
        .map_err(|e| store_error(home, e))?;
        let numbered = db
            .begin_read()
            .map_err(OpError::from)
            .and_then(|txn| {
                crate::schema::last_change_number(&txn.open_table(crate::schema::COUNTERS)?)
            })
            .map_err(|e| store_error(home, e))?;
        if !expected.is_empty() {
            tracing::info!(
                sessions = expected.len(),
                "waiting for clients to replay the changes answered before their sync"
            );
        }
        let recovery = numbered::Recovery::new(
            (recovering, numbered),
            expected,
            std::time::Instant::now() + config.recovery_window,
        );
        let meta = Arc::new(Meta {
            node: home,
            committer: Committer::start(
                (Arc::clone(&db), numbered),
                Some(Arc::clone(&link)),
                shared.commit_metrics.clone(),
                (
                    config.checkpoint_bytes,
                    !config.sync_every_change,
                    config.sync_delay_ms.map(Duration::from_millis),
                ),
            ),
            db,
            link,
            cluster: Arc::clone(&shared.cluster),
            chooser: Arc::new(Chooser::new(config.target_chooser)),
            directory_chooser: Chooser::new(config.directory_chooser),
            sessions: sessions::SessionState::new(orphans),
            locks,
            answers_before_sync: !config.sync_every_change,
            recovery,
            names: Arc::new(names::NamesLeases::start(
                config.names_lease,
                (home == shared.node)
                    .then(|| config.data_dir.join("meta.names-lease"))
                    .as_deref(),
            )),
            inside: subtree::Inside::default(),
            grants: Arc::default(),
            check_progress: Mutex::default(),
            intents: intents::IntentState::default(),
            background: work::Background::default(),
            moves: moves::MoveState::new(
                (
                    config.rebalance_bytes_per_second,
                    config.rebalance_margin_percent,
                ),
                shared.move_metrics.clone(),
            ),
            workers: Mutex::default(),
        });
        // Operations a crash interrupted are finished at once (`work_loop` first learns from
        // the store what they are, once the clients' replays are made again).
        meta.background.work.notify_one();
        meta.moves.mover.notify_one();
        let runtime = tokio::runtime::Handle::current();
        let watcher = Arc::clone(&meta);
        let watcher = runtime.spawn(async move { watcher.watch_recovery().await });
        let worker = runtime.spawn(work_loop(Arc::clone(&meta)));
        let mover = runtime.spawn(Arc::clone(&meta).move_loop());
        meta.workers
            .lock()
            .expect("worker slots poisoned")
            .extend([watcher, worker, mover]);
        Ok(meta)
    }

    /// What a start learns from its store: the spread directories whose shards to sync, the
    /// files whose size no client reported yet, and the sessions with stored replies (expired
    /// like any seen here, so the replies of a client that went away while this server was
    /// down are dropped too).
    pub(super) fn recover_from_store(&self) {
        match self.read(spread_directories) {
            Ok(dirs) => self
                .intents
                .shard_syncs
                .lock()
                .expect("shard sync set poisoned")
                .extend(dirs),
            Err(error) => tracing::error!(?error, "could not list the spread directories"),
        }
        let unreported = self
            .read(|txn| {
                txn.open_table(UNREPORTED)?
                    .iter()?
                    .map(|item| item.map(|(key, _)| InodeId(key.value())))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(OpError::from)
            })
            .unwrap_or_else(|error| {
                tracing::error!(?error, "could not list the files without a size report");
                Vec::new()
            });
        // Files unlinked while open, the replayed changes' among them: each last close looks
        // for its orphan, and those no client opens again are disposed of after the grace.
        match self.read(|txn| list_orphans(&txn.open_table(crate::schema::ORPHANS)?)) {
            Ok(orphans) if !orphans.is_empty() => {
                self.sessions
                    .opens
                    .lock()
                    .expect("open table poisoned")
                    .maybe_orphaned
                    .extend(orphans);
                self.sessions
                    .orphans_unclaimed
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            Ok(_) => {}
            Err(error) => tracing::error!(?error, "could not list the files unlinked while open"),
        }
        if unreported.is_empty() {
            self.start_serving();
        }
        // The sessions with stored replies here are expired like any seen here, so the replies
        // of a client that went away while this server was down are dropped too.
        match self.read(|txn| {
            let mut clients = HashSet::new();
            let mut next = 0;
            let replies = txn.open_table(REPLIES)?;
            while let Some(item) = replies.range((next, 0)..)?.next() {
                let client = item?.0.value().0;
                clients.insert(ClientId(client));
                let Some(after) = client.checked_add(1) else {
                    break;
                };
                next = after;
            }
            Ok(clients)
        }) {
            Ok(clients) => {
                let mut seen = self.sessions.seen.lock().expect("seen table poisoned");
                for client in clients {
                    seen.entry(client).or_insert_with(std::time::Instant::now);
                }
            }
            Err(error) => {
                tracing::error!(?error, "could not list the sessions with stored replies")
            }
        }
        self.background
            .unreported
            .lock()
            .expect("unreported set poisoned")
            .extend(unreported);
    }

    /// Stops serving: nothing is written to the store through this instance again, and its
    /// background work ends. Requests still running fail.
    pub(crate) fn stop(&self) {
        self.link.fence();
        for worker in self
            .workers
            .lock()
            .expect("worker slots poisoned")
            .drain(..)
        {
            worker.abort();
        }
    }

    /// Whether the store refuses commits since changes could not reach the mirror group.
    pub(crate) fn broken(&self) -> bool {
        self.link.broken() || self.db.log_broken()
    }

    /// Copies this home's store to the member of `start`.
    pub(crate) async fn resync(
        &self,
        start: weft_net::mirror::ResyncStart,
    ) -> Result<(), WireError> {
        // Rows logged while the home had no mirror group go into its tables first, so that
        // the copy holds them: a mirrored home's commits are checkpoints (`commit`).
        self.committer.sync().await.map_err(OpError::into_wire)?;
        self.link.resync(start).await
    }

    /// The checks a restricted client's `request` passes before it is served, by its
    /// `checks`: its subtree, the files it may name, what it may hold, and its callers'
    /// access as a kernel would check it (which may make what it creates the caller's) —
    /// unless the request is a mutation `answered` from the reply kept when it ran.
    async fn check_client(
        &self,
        request: &mut MetaRequest,
        checks: &Checks,
        answered: bool,
    ) -> Result<(), OpError> {
        if let Some(subtree) = checks.subtree {
            self.check_subtree(request, subtree).await?;
        }
        if checks.per_file {
            self.check_restricted(request)?;
        }
        if checks.restricted() {
            self.check_holds(request, checks)?;
        }
        if let Some(caller) = checks.caller.as_ref().filter(|_| !answered) {
            self.check_access(request, caller).await?;
        }
        Ok(())
    }

    /// The reply kept for `request`, a mutation of a client whose callers the servers check,
    /// when it ran before (its client sends it again after a reply was lost): it passed its
    /// checks then, and it is answered from that reply with nothing run (but a create, whose
    /// open is registered again on the way to its kept reply, see `serve`). Judged again, it
    /// would meet what it changed (the name it removed is gone) and be refused for it; and
    /// only the kept reply answers it, so no request made to look like an earlier one runs
    /// unchecked. A request whose number an earlier request of another kind had is refused.
    ///
    /// A copy that arrives while the first copy's cross-server intent is in flight (its first
    /// step may already have removed the name it is about) runs that intent to its end, as
    /// its first copy would, and is answered from its reply too, whatever it asks: the intent
    /// runs from its own record, which its first copy's checks admitted. An intent still in
    /// flight after [`INTENT_WAIT_MAX`] (a server it needs is away) answers `Busy`, and the
    /// client asks again.
    async fn kept_reply(
        &self,
        request: &MetaRequest,
        checks: &Checks,
    ) -> Result<Option<Reply<MetaResponse>>, OpError> {
        let Some(mutation) = request.mutation().filter(|_| checks.caller.is_some()) else {
            return Ok(None);
        };
        let waiting = std::time::Instant::now();
        let kept = loop {
            match self.copy_of(mutation).await? {
                intents::Copy::Answered(reply) => break *reply,
                intents::Copy::New => return Ok(None),
                intents::Copy::Pending if waiting.elapsed() >= INTENT_WAIT_MAX => {
                    return Err(OpError::rejected(
                        ErrorCode::Busy,
                        format!(
                            "mutation {} of session {} is still being finished on the servers \
                             it spans; try again",
                            mutation.seq, mutation.client
                        ),
                    ))
                }
                intents::Copy::Pending => tokio::time::sleep(INTENT_WAIT_SLICE).await,
            }
        };
        Ok(Some(match kept {
            Ok(response) if !request.answer_fits()(&response) => Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "mutation {} of session {} was another request: a new request takes a new \
                     number",
                    mutation.seq, mutation.client
                ),
            )),
            kept => kept.map_err(OpError::into_wire),
        }))
    }

    /// Serves `request`, after the checks its client's rule asks of this server: that every
    /// inode it names lies in the client's subtree (see [`subtree`]), and for a caller of a
    /// client that squashes root, its access as a kernel would check it (see [`access`]).
    pub(crate) async fn serve(&self, request: MetaRequest, checks: Checks) -> Reply<MetaResponse> {
        if !self.answers_before_sync {
            // Nothing is numbered here: no change to answer with.
            return self.serve_checked(request, checks).await;
        }
        // Boxed: the request's future is large, and is moved into the scope that keeps its
        // numbered change.
        self.serve_numbered(Box::pin(self.serve_checked(request, checks)))
            .await
    }

    async fn serve_checked(&self, mut request: MetaRequest, checks: Checks) -> Reply<MetaResponse> {
        // Replays come first, and a client asks the lock epoch to learn it must replay.
        let replaying = matches!(request, MetaRequest::Replay { .. } | MetaRequest::LockEpoch);
        if !replaying && !*self.background.settled.borrow() {
            let mut settled = self.background.settled.subscribe();
            let _ = settled.wait_for(|settled| *settled).await;
        }
        let kept = self
            .kept_reply(&request, &checks)
            .await
            .map_err(OpError::into_wire)?;
        if kept.is_some() {
            // The kept reply was read from a snapshot that may hold changes not yet on disk:
            // a copy sent again is answered only once they are (the first answer may never
            // have reached the client, which then keeps nothing to replay).
            self.committer.sync().await.map_err(OpError::into_wire)?;
        }
        self.check_client(&mut request, &checks, kept.is_some())
            .await
            .map_err(OpError::into_wire)?;
        let grant_for = self.grant_for(&request, &checks);
        let reserving = match &request {
            MetaRequest::Reserve { inode, .. } => Some(*inode),
            _ => None,
        };
        // A create sent again is answered from its stored reply, whatever became of the file
        // since: it is granted again only what the file still allows (see `regranted`). Every
        // create with an open of a client the servers check is judged so, since a copy sent
        // again may arrive while the first runs, and only the file can tell (a file just made
        // allows its maker everything).
        let replayed = match &request {
            MetaRequest::Create {
                mutation,
                open: Some(handle),
                ..
            } if grant_for.is_some() => Some((mutation.client, *handle)),
            _ => None,
        };
        let reply = match kept {
            // A create sent again runs again, to its kept reply: the open it asks for is
            // registered anew (a server that restarted since forgot it), and what it is
            // granted is judged below.
            Some(Ok(_))
                if matches!(
                    request,
                    MetaRequest::Create { .. } | MetaRequest::CreateSpread { .. }
                ) =>
            {
                self.handle_meta(request).await
            }
            Some(reply) => reply,
            None => self.handle_meta(request).await,
        };
        let reply = match (reply, replayed) {
            (
                Ok(MetaResponse::Created {
                    attr,
                    parent,
                    lease_ms,
                    parent_lease_ms,
                    ..
                }),
                Some(open),
            ) if !self.regranted(attr.inode, &checks).await => {
                // Nor is it held open for the client: it opens the file, with an open's
                // checks, when it wants it.
                let _ = self.release(open, attr.inode).await;
                return Ok(MetaResponse::Created {
                    attr,
                    parent,
                    capability: None,
                    lease_ms,
                    parent_lease_ms,
                });
            }
            (reply, _) => reply,
        };
        // A client whose access the servers decide gets, with an open, the grant the storage
        // servers want from it (see `weft_net::capability`), by the cluster's clock.
        let now_seconds = self.cluster.mgmt().cluster_clock_ms() / 1000;
        let grant = |capabilities: &weft_net::capability::Capabilities, inode, access, session| {
            capabilities.grant(
                (inode, access),
                session,
                now_seconds,
                self.growth_bound(inode, session),
            )
        };
        match (grant_for, reply) {
            (Some((capabilities, access, session)), Ok(MetaResponse::Attr(attr))) => {
                Ok(MetaResponse::Opened {
                    capability: grant(capabilities, attr.inode, access, session),
                    attr,
                })
            }
            (
                Some((capabilities, access, session)),
                Ok(MetaResponse::Created {
                    attr,
                    parent,
                    lease_ms,
                    parent_lease_ms,
                    ..
                }),
            ) if attr.kind == FileKind::Regular => Ok(MetaResponse::Created {
                capability: Some(grant(capabilities, attr.inode, access, session)),
                attr,
                parent,
                lease_ms,
                parent_lease_ms,
            }),
            (Some((capabilities, access, session)), Ok(MetaResponse::Reserved { to, .. })) => {
                let inode = reserving.expect("a reserve's answer");
                Ok(MetaResponse::Reserved {
                    to,
                    capability: Some(grant(capabilities, inode, access, session)),
                })
            }
            (_, reply) => reply,
        }
    }

    /// What a request of a client whose access the servers decide (`checks`) is granted with
    /// its answer, if anything: the capabilities that grant, the access, and the session.
    fn grant_for(
        &self,
        request: &MetaRequest,
        checks: &Checks,
    ) -> Option<(&weft_net::capability::Capabilities, u8, ClientId)> {
        let capabilities = self.cluster.capabilities().filter(|_| checks.per_file)?;
        match request {
            MetaRequest::Open { client, access, .. } => Some((capabilities, *access, *client)),
            MetaRequest::Create {
                mutation,
                open: Some(_),
                ..
            } => Some((capabilities, READ | WRITE, mutation.client)),
            // Room reserved: the open is granted again, with the room as its growth bound.
            MetaRequest::Reserve {
                client,
                handle,
                inode,
                ..
            } => Some((
                capabilities,
                self.handle_access((*client, *handle), *inode).unwrap_or(0),
                *client,
            )),
            _ => None,
        }
    }

    /// Whether a create sent again, answered from its stored reply, is granted again what its
    /// first run granted (reading and writing the new file): only while the file is still
    /// inside the client's subtree and, for a checked caller, still the caller's own. A file
    /// given away or moved out since is opened again by the client when it wants access,
    /// with the checks of an open.
    async fn regranted(&self, inode: InodeId, checks: &Checks) -> bool {
        if let Some(subtree) = checks.subtree {
            let named = MetaRequest::GetAttr { inode };
            if self.check_subtree(&named, subtree).await.is_err() {
                return false;
            }
        }
        match &checks.caller {
            Some(caller) => self
                .attr_of(inode)
                .await
                .is_ok_and(|attr| attr.uid == caller.uid),
            None => true,
        }
    }

    /// Makes every change committed so far durable: at a clean stop, so that the next start
    /// has no size to recompute.
    pub(crate) async fn flush(&self) {
        // Stopped cleanly, this start leaves nothing it answered before the sync off its
        // disk: its sessions are no longer waited for at the next start. In a synced commit,
        // which puts every change before it on disk too. (The sessions of a start whose
        // recovery this one had not finished stay waited for.)
        let epoch = self.locks.epoch();
        let stopped = self.committer.run(Box::new(move |txn| {
            let mut replayers = txn.open_table(crate::schema::REPLAYERS)?;
            for session in numbered::expected_sessions(&replayers, epoch)? {
                replayers.remove(session.0)?;
            }
            Ok(MetaResponse::Done)
        }));
        if let Err(error) = stopped.await {
            tracing::warn!(
                home = self.node.0,
                ?error,
                "could not sync the store at stop"
            );
        }
    }

    /// Fences the sessions the map shows expired and releases their locks, at once, and
    /// wakes the background work, which releases the rest they held. Called by the heartbeat,
    /// so it never waits for the store: a commit may itself wait for the heartbeat (its sync
    /// for a mirror member that only the next heartbeat's map drops).
    pub(crate) fn after_map(
        &self,
        map: &weft_proto::messages::ClusterMap,
        fetch_started: std::time::Instant,
    ) {
        self.expire_sessions(map, fetch_started);
        self.grants.adopt_limits(&map.quota_hard);
        self.background.work.notify_one();
    }
}

impl Meta {
    fn context(&self) -> OpContext {
        OpContext {
            home: self.node,
            chooser: Arc::clone(&self.chooser),
            map: self.cluster.map(),
        }
    }

    /// How many entries `table` of this home's store holds: its inodes, its stored replies…
    pub(crate) fn entries<K: crate::store::Key + 'static, V: crate::store::Value + 'static>(
        &self,
        table: crate::store::TableDefinition<'static, K, V>,
    ) -> Result<u64, OpError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(table)?.len()?)
    }

    /// The home this serves.
    pub(crate) fn home(&self) -> NodeId {
        self.node
    }

    /// What each user and group uses in each pool in this home.
    pub(crate) fn quota_usage(&self) -> Result<Vec<weft_proto::quota::QuotaUsage>, OpError> {
        let txn = self.db.begin_read()?;
        crate::schema::usage::usage(&txn.open_table(crate::schema::usage::USAGE)?)
    }

    fn read<T>(
        &self,
        op: impl FnOnce(&crate::store::ReadTransaction) -> Result<T, OpError>,
    ) -> Result<T, OpError> {
        let txn = self.db.begin_read()?;
        op(&txn)
    }

    /// Whether an inode is open, for an operation that orphans it if it is: the inode is
    /// remembered so that its last close looks for the orphan.
    fn is_open_fn(&self) -> impl Fn(InodeId) -> bool + Send + 'static {
        let opens = Arc::clone(&self.sessions.opens);
        move |inode| {
            let mut opens = opens.lock().expect("open table poisoned");
            let open = opens.handles.contains_key(&inode);
            if open {
                opens.maybe_orphaned.insert(inode);
            }
            open
        }
    }

    async fn mutate(
        &self,
        mutation: MutationId,
        op: impl FnOnce(&WriteTransaction, &OpContext) -> Result<MetaResponse, OpError> + Send + 'static,
    ) -> Result<MetaResponse, OpError> {
        let op = self.mutation_op(mutation, op)?;
        let result = self.committer.run_client_change(Box::new(op)).await;
        self.background.work.notify_one();
        result.map(numbered::keep)
    }

    /// What numbers a change here ([`numbered::numbered`]): this home, this start, whether it
    /// answers before the sync, and the key of the proofs.
    fn numbering(&self) -> ((NodeId, u64, bool), Option<weft_net::kept::ChangeProofs>) {
        // A client of an older protocol keeps nothing, and a home with a mirror group or
        // without a log answers after the sync anyway: their sessions are not waited for.
        let replays = self.answers_before_sync
            && weft_net::server::peer_version() >= 14
            && self.db.logs()
            && !self.link.mirrored();
        (
            (self.node, self.locks.epoch(), replays),
            self.cluster.change_proofs().cloned(),
        )
    }

    /// `op` as mutation `mutation` of its session, to run in a commit: with this home's
    /// context, answered from its stored reply when it ran before, its reply kept, and its
    /// change numbered ([`numbered::numbered`]). Refused at once for a session that expired
    /// here.
    fn mutation_op(
        &self,
        mutation: MutationId,
        op: impl FnOnce(&WriteTransaction, &OpContext) -> Result<MetaResponse, OpError> + Send + 'static,
    ) -> Result<
        impl FnOnce(&WriteTransaction) -> Result<(MetaResponse, crate::commit::Answered), OpError>
            + Send
            + 'static,
        OpError,
    > {
        self.admit_session(mutation.client)?;
        let context = self.context();
        let (start, proofs) = self.numbering();
        Ok(move |txn: &WriteTransaction| {
            numbered::numbered(txn, start, (mutation, proofs.as_ref()), |txn| {
                idempotent(txn, mutation, |txn| op(txn, &context))
            })
        })
    }
}
