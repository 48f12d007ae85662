//! The metadata request handler: dispatch, retry identity, open files, background work queues
//! and heartbeats.

mod access;
mod subtree;
mod verify;

use crate::chooser::Chooser;
use crate::commit::{Answered, CommitMetrics, Committer};
use crate::locks::LockTable;
use crate::ops::check::{check, Checked, Listed};
use crate::ops::create::{create, ensure_root, link, NewEntry};
use crate::ops::lookup::{get_attr, lookup, read_dir, read_link};
use crate::ops::remote::{
    adjust_links, create_dir_inode, exchange_dentry, finish_exchange, finish_link, finish_mkdir,
    finish_rename_out, finish_rmdir, finish_unlink, insert_dentry_for, intents, prepare_exchange,
    prepare_link, prepare_mkdir, prepare_rename_out, prepare_rmdir, prepare_unlink,
    remote_references, remove_dir_inode, renamed, seal_shard, set_shards, settle_intents,
    settled_below, sync_shard, Intent, IntentOp, Prepared,
};
use crate::ops::remove::{list_orphans, release_orphan, rmdir, unlink};
use crate::ops::rename::{rename, RenameArgs};
use crate::ops::setattr::{
    finish_truncate, report_size, set_attr, set_pattern, settle_size, FoundSize,
};
use crate::ops::xattr::{get_xattr, list_xattr, remove_xattr, set_xattr};
use crate::ops::OpContext;
use crate::replica::{HomeFiles, HomeLink, LinkParts};
use crate::store::{OpError, TruncateWork, DISPOSALS, INODES, REPLIES, TRUNCATES, UNREPORTED};
use crate::{MetaConfig, MetaError};
use redb::{Database, ReadableTable, ReadableTableMetadata, WriteTransaction};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use weft_net::mirror::Membership;
use weft_net::retry::RetryPolicy;
use weft_net::{ClusterView, StorageClient};
use weft_proto::access::{Checks, READ, WRITE};
use weft_proto::error::WireError;
use weft_proto::ids::{ClientId, InodeId, NodeId, TargetId, ROOT_HOME};
use weft_proto::layout::{object_length_for_file_size, FileLayout, Slot, SlotSet};
use weft_proto::messages::{
    CheckProgress, Consistency, FileKind, InodeAttr, MetaRequest, MirrorKind, MutationId, NewInode,
    Reply, Response, LOCK_WAIT_MS_MAX, OBJECTS_PER_LIST_MAX,
};
use weft_proto::ErrorCode;
use weft_service::missed::MissedLogs;

/// A failed call to another server: its own error, or `Unavailable` (which clients retry).
fn rpc_error(error: weft_net::RpcError) -> OpError {
    match error {
        weft_net::RpcError::Remote(error) => OpError::Rejected(error),
        other => OpError::Rejected(WireError::new(ErrorCode::Unavailable, other.to_string())),
    }
}

/// Longest a directory rename waits for the cluster-wide rename lock.
const RENAME_LOCK_WAIT: Duration = Duration::from_secs(45);
/// Most directory levels walked when checking a directory move for a loop.
const PATH_DEPTH_MAX: usize = 4096;

/// Retries of a truncate or removal on a target before the work is left to the worker loop.
const TARGET_RETRY: RetryPolicy = RetryPolicy {
    initial_backoff: Duration::from_millis(50),
    max_backoff: Duration::from_millis(500),
    total_timeout: Duration::from_secs(5),
};

/// Interval at which queued truncates and disposals are retried when nothing wakes the worker.
const WORK_RETRY_INTERVAL: Duration = Duration::from_secs(2);

/// An open file handle: the client session and its handle number.
type OpenHandle = (ClientId, u64);
/// Open handles per inode.
/// Registers `open` of `inode`; true when it was new.
fn register_open(opens: &Mutex<OpenTable>, open: OpenHandle, inode: InodeId) -> bool {
    opens
        .lock()
        .expect("open table poisoned")
        .handles
        .entry(inode)
        .or_default()
        .insert(open)
}

/// The files open anywhere, and which of them an unlink or rename saw open.
#[derive(Default)]
struct OpenTable {
    handles: HashMap<InodeId, HashSet<OpenHandle>>,
    /// Inodes an operation that may orphan them (the last unlink, a rename over them) found
    /// open. Only their last close has an orphan to look for; every other close is free.
    /// Checked and marked under the same lock as `handles`, so no close slips between.
    maybe_orphaned: HashSet<InodeId>,
}

/// One metadata home served by this server: its store and what lives beside it in memory.
pub(crate) struct Meta {
    /// The home: the node id every inode created here carries.
    node: NodeId,
    db: Arc<Database>,
    /// The store file's link to the home's mirror members.
    link: Arc<HomeLink>,
    /// The background work loop.
    worker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    committer: Committer,
    cluster: Arc<ClusterView>,
    chooser: Arc<Chooser>,
    /// Places new directories on metadata servers.
    directory_chooser: Chooser,
    /// Open counts per inode and client session: an unlinked inode lives while one is held.
    opens: Arc<Mutex<OpenTable>>,
    /// Orphans from before this start may wait for the end of the grace period, in which
    /// clients reclaim their opens.
    orphans_unclaimed: std::sync::atomic::AtomicBool,
    work: Notify,
    locks: LockTable,
    /// Who runs this home's intents now: requests (first tries and retries) and recovery.
    intent_runs: IntentRuns,
    /// Per other home: the intent id below which it was told this home's intents finished.
    settled_told: Mutex<HashMap<NodeId, u64>>,
    /// How far the consistency check that runs (or ran last) is.
    check_progress: Mutex<CheckProgress>,
    /// When this server first heard of each client session, so that a session that registered
    /// after the last map fetch is not taken for expired.
    seen: Mutex<HashMap<ClientId, std::time::Instant>>,
    /// Sessions this server released as expired: their locks and opens are refused from then
    /// on (`UnknownSession`), so a client that missed its expiry learns it instead of acting
    /// on locks another client may hold now.
    fenced: Mutex<HashSet<ClientId>>,
    /// Sessions fenced as expired whose opens and stored replies the background work has
    /// still to release.
    expiring: Mutex<HashSet<ClientId>>,
    /// Spread directories whose shards must still learn what new entries inherit (every
    /// spread directory after a start, since a crash may have come between a change and its
    /// copy to the shards).
    shard_syncs: Mutex<std::collections::BTreeSet<InodeId>>,
    /// Files listed in [`UNREPORTED`] when this home started, whose sizes the work loop
    /// recomputes from their objects: a report of theirs may have been lost with the
    /// process.
    unreported: Mutex<std::collections::BTreeSet<InodeId>>,
    /// Whether the work loop has made its first attempt at those sizes: requests wait for it,
    /// so no reader sees a size a crash cut short.
    settled: tokio::sync::watch::Sender<bool>,
    /// Held while objects of removed files are deleted, and by fsck while it lists objects and
    /// checks them: an object deleted between the two would look like one without a file.
    disposing: tokio::sync::Mutex<()>,
    /// Held per inode while its queued truncate is sent to the targets: a setattr's truncate
    /// and the work loop's retry of it never run at once, so no retry of an older attempt can
    /// land after the setattr was answered and cut the writes that followed it.
    truncating: Mutex<HashMap<InodeId, Arc<tokio::sync::Mutex<()>>>>,
    /// Directories recently found inside a confined client's subtree (see [`subtree`]).
    inside: subtree::Inside,
}

/// What dropping an open left of an inode's opens.
enum Dropped {
    /// Other opens hold it still.
    Held,
    /// That was its last open.
    Last,
    /// That was its last open, and an unlink or rename may have left it an orphan.
    LastOfOrphan,
}

fn store_error(error: impl std::fmt::Display) -> MetaError {
    MetaError::Store(error.to_string())
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
            .map_err(store_error)?;
        let db = Arc::new(
            redb::Builder::new()
                .create_with_backend(file)
                .map_err(store_error)?,
        );
        crate::store::create_tables(&db).map_err(|e| MetaError::Store(format!("{e:?}")))?;
        let mut first_start = false;
        // Files unlinked while open before this start stay until the grace period is over:
        // their clients reclaim their opens meanwhile (see `dispose_unclaimed_orphans`).
        let orphans: HashSet<InodeId> = {
            let txn = db.begin_write().map_err(store_error)?;
            if home == ROOT_HOME
                && ensure_root(&txn).map_err(|e| MetaError::Store(format!("{e:?}")))?
            {
                tracing::info!("created the root directory");
                first_start = true;
            }
            let orphans = txn
                .open_table(crate::store::ORPHANS)
                .map_err(|e| MetaError::Store(format!("{e:?}")))
                .and_then(|table| {
                    list_orphans(&table).map_err(|e| MetaError::Store(format!("{e:?}")))
                })?;
            txn.commit().map_err(store_error)?;
            orphans
        };
        let config = &shared.config;
        let meta = Arc::new(Meta {
            node: home,
            committer: Committer::start(
                Arc::clone(&db),
                Some(Arc::clone(&link)),
                shared.commit_metrics.clone(),
            ),
            db,
            link,
            cluster: Arc::clone(&shared.cluster),
            chooser: Arc::new(Chooser::new(config.target_chooser)),
            directory_chooser: Chooser::new(config.directory_chooser),
            orphans_unclaimed: std::sync::atomic::AtomicBool::new(!orphans.is_empty()),
            opens: Arc::new(Mutex::new(OpenTable {
                handles: HashMap::new(),
                // The last close of a reclaimed open of one disposes of it.
                maybe_orphaned: orphans,
            })),
            work: Notify::new(),
            // A new file system has no locks to reclaim.
            locks: LockTable::new(if first_start {
                Duration::ZERO
            } else {
                Duration::from_millis(config.lock_grace_ms)
            }),
            seen: Mutex::default(),
            inside: subtree::Inside::default(),
            fenced: Mutex::default(),
            expiring: Mutex::default(),
            intent_runs: IntentRuns::default(),
            settled_told: Mutex::default(),
            check_progress: Mutex::default(),
            shard_syncs: Mutex::default(),
            unreported: Mutex::default(),
            settled: tokio::sync::watch::Sender::new(false),
            disposing: tokio::sync::Mutex::new(()),
            truncating: Mutex::default(),
            worker: Mutex::default(),
        });
        match meta.read(spread_directories) {
            Ok(dirs) => meta
                .shard_syncs
                .lock()
                .expect("shard sync set poisoned")
                .extend(dirs),
            Err(error) => tracing::error!(?error, "could not list the spread directories"),
        }
        let unreported = meta
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
        if unreported.is_empty() {
            meta.settled.send_replace(true);
        }
        // The sessions with stored replies here are expired like any seen here, so the replies
        // of a client that went away while this server was down are dropped too.
        match meta.read(|txn| {
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
                let mut seen = meta.seen.lock().expect("seen table poisoned");
                for client in clients {
                    seen.entry(client).or_insert_with(std::time::Instant::now);
                }
            }
            Err(error) => {
                tracing::error!(?error, "could not list the sessions with stored replies")
            }
        }
        meta.unreported
            .lock()
            .expect("unreported set poisoned")
            .extend(unreported);
        // Operations a crash interrupted are finished at once.
        meta.work.notify_one();
        let worker = tokio::runtime::Handle::current().spawn(work_loop(Arc::clone(&meta)));
        *meta.worker.lock().expect("worker slot poisoned") = Some(worker);
        Ok(meta)
    }

    /// Stops serving: nothing is written to the store through this instance again, and its
    /// background work ends. Requests still running fail.
    pub(crate) fn stop(&self) {
        self.link.fence();
        if let Some(worker) = self.worker.lock().expect("worker slot poisoned").take() {
            worker.abort();
        }
    }

    /// Whether the store refuses commits since changes could not reach the mirror group.
    pub(crate) fn broken(&self) -> bool {
        self.link.broken()
    }

    /// Copies this home's store to the member of `start`.
    pub(crate) async fn resync(
        &self,
        start: weft_net::mirror::ResyncStart,
    ) -> Result<(), WireError> {
        self.link.resync(start).await
    }

    /// Serves `request`, after the checks its client's rule asks of this server: that every
    /// inode it names lies in the client's subtree (see [`subtree`]), and for a caller of a
    /// client that squashes root, its access as a kernel would check it (see [`access`]).
    pub(crate) async fn serve(&self, mut request: MetaRequest, checks: Checks) -> Reply {
        if !*self.settled.borrow() {
            let mut settled = self.settled.subscribe();
            let _ = settled.wait_for(|settled| *settled).await;
        }
        if let Some(subtree) = checks.subtree {
            self.check_subtree(&request, subtree)
                .await
                .map_err(OpError::into_wire)?;
        }
        if let Some(caller) = checks.caller {
            self.check_access(&mut request, &caller)
                .await
                .map_err(OpError::into_wire)?;
        }
        let grant = match (&request, self.cluster.capabilities()) {
            (_, None) => None,
            _ if !checks.per_file => None,
            (MetaRequest::Open { client, access, .. }, Some(capabilities)) => {
                Some((capabilities, *access, *client))
            }
            (
                MetaRequest::Create {
                    mutation,
                    open: Some(_),
                    ..
                },
                Some(capabilities),
            ) => Some((capabilities, READ | WRITE, mutation.client)),
            _ => None,
        };
        let reply = self.handle_meta(request).await;
        // A client whose access the servers decide gets, with an open, the grant the storage
        // servers want from it (see `weft_net::capability`).
        match (grant, reply) {
            (Some((capabilities, access, session)), Ok(Response::Attr(attr))) => {
                Ok(Response::Opened {
                    capability: capabilities.grant(attr.inode, access, session),
                    attr,
                })
            }
            (Some((capabilities, access, session)), Ok(Response::Created { attr, parent, .. }))
                if attr.kind == FileKind::Regular =>
            {
                Ok(Response::Created {
                    capability: Some(capabilities.grant(attr.inode, access, session)),
                    attr,
                    parent,
                })
            }
            (_, reply) => reply,
        }
    }

    /// Makes every change committed so far durable: at a clean stop, so that the next start
    /// has no size to recompute.
    pub(crate) async fn flush(&self) {
        if let Err(error) = self.committer.run(Box::new(|_| Ok(Response::Done))).await {
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
        self.work.notify_one();
    }
}

pub(crate) fn stored_reply(bytes: &[u8]) -> Result<Response, OpError> {
    match postcard::from_bytes::<Reply>(bytes) {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(OpError::Rejected(error)),
        Err(error) => Err(OpError::Store(format!("stored reply is damaged: {error}"))),
    }
}

/// Runs `op` unless this mutation already ran, and keeps its reply in the same transaction.
pub(crate) fn idempotent(
    txn: &WriteTransaction,
    mutation: MutationId,
    op: impl FnOnce(&WriteTransaction) -> Result<Response, OpError>,
) -> Result<Response, OpError> {
    let client = mutation.client.0;
    if let Some(bytes) = txn.open_table(REPLIES)?.get((client, mutation.seq))? {
        return stored_reply(bytes.value());
    }
    let result = op(txn);
    let reply: Reply = match &result {
        Ok(response) => Ok(response.clone()),
        // Asked of the wrong shard, or of one being removed: the client asks again, perhaps
        // elsewhere, with the same mutation; no answer is kept.
        Err(OpError::Rejected(error))
            if matches!(error.code, ErrorCode::WrongShard | ErrorCode::Busy) =>
        {
            return result
        }
        Err(OpError::Rejected(error)) => Err(error.clone()),
        Err(OpError::Store(_)) => return result,
    };
    let mut replies = txn.open_table(REPLIES)?;
    replies.insert(
        (client, mutation.seq),
        postcard::to_stdvec(&reply)
            .expect("replies encode")
            .as_slice(),
    )?;
    replies.retain_in(
        (client, 0)..(client, mutation.oldest_pending.min(mutation.seq)),
        |_, _| false,
    )?;
    result
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
    pub(crate) fn entries<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        table: redb::TableDefinition<'static, K, V>,
    ) -> Result<u64, OpError> {
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(table)?.len()?)
    }

    fn read<T>(
        &self,
        op: impl FnOnce(&redb::ReadTransaction) -> Result<T, OpError>,
    ) -> Result<T, OpError> {
        let txn = self.db.begin_read()?;
        op(&txn)
    }

    /// Whether an inode is open, for an operation that orphans it if it is: the inode is
    /// remembered so that its last close looks for the orphan.
    fn is_open_fn(&self) -> impl Fn(InodeId) -> bool + Send + 'static {
        let opens = Arc::clone(&self.opens);
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
        op: impl FnOnce(&WriteTransaction, &OpContext) -> Result<Response, OpError> + Send + 'static,
    ) -> Result<Response, OpError> {
        self.admit_session(mutation.client)?;
        let context = self.context();
        let result = self
            .committer
            .run(Box::new(move |txn| {
                idempotent(txn, mutation, |txn| op(txn, &context))
            }))
            .await;
        self.work.notify_one();
        result
    }

    async fn handle_meta(&self, request: MetaRequest) -> Reply {
        let result = match request {
            MetaRequest::Lookup { parent, name } => {
                let home = self.node;
                match self.read(|txn| lookup(txn, home, parent, &name)) {
                    // The child is a directory placed on another server: ask it.
                    Ok(Response::Inodes(children)) => self.remote_attr(children[0]).await,
                    other => other,
                }
            }
            MetaRequest::GetAttr { inode } => self.read(|txn| get_attr(txn, inode)),
            MetaRequest::ReadDir {
                dir,
                shards,
                after_cookie,
                max_entries,
            } => self.read(|txn| read_dir(txn, (dir, shards), after_cookie, max_entries)),
            MetaRequest::ReadLink { inode } => self.read(|txn| read_link(txn, inode)),
            MetaRequest::Create {
                mutation,
                parent,
                name,
                new,
                open,
            } => {
                if new.kind == FileKind::Regular {
                    self.refresh_map_if_short(parent, std::time::Instant::now())
                        .await;
                }
                if new.kind == FileKind::Directory {
                    // A parent with a default spread makes every new subdirectory spread.
                    if let Some(shards) = self.inherited_spread(parent).await {
                        return self
                            .mkdir_spread(mutation, (parent, name), new, shards)
                            .await
                            .map_err(OpError::into_wire);
                    }
                }
                let home = if new.kind == FileKind::Directory {
                    self.directory_chooser
                        .choose_meta(&self.cluster.map(), self.node)
                } else {
                    self.node
                };
                let open = open
                    .filter(|_| new.kind == FileKind::Regular)
                    .map(|handle| (mutation.client, handle));
                if home == self.node {
                    let entry = NewEntry { parent, name, new };
                    // The open is registered before the commit, so no unlink can dispose of
                    // the new file between the two; and again after it, for a retry answered
                    // from the stored reply.
                    let opens = Arc::clone(&self.opens);
                    let result = self
                        .mutate(mutation, move |txn, context| {
                            let response = create(txn, context, entry)?;
                            if let (Some(handle), Response::Created { attr, .. }) =
                                (open, &response)
                            {
                                register_open(&opens, handle, attr.inode);
                                txn.open_table(UNREPORTED)?.insert(attr.inode.0, ())?;
                            }
                            Ok(response)
                        })
                        .await;
                    if let (Some(handle), Ok(Response::Created { attr, .. })) = (open, &result) {
                        register_open(&self.opens, handle, attr.inode);
                    }
                    result
                } else {
                    self.remote_mkdir(mutation, parent, name, new, home).await
                }
            }
            MetaRequest::CreateSpread {
                mutation,
                parent,
                name,
                new,
                shards,
            } => {
                self.mkdir_spread(mutation, (parent, name), new, shards)
                    .await
            }
            MetaRequest::SetShards { dir, shards } => {
                self.committer
                    .run(Box::new(move |txn| set_shards(txn, dir, &shards)))
                    .await
            }
            MetaRequest::SealShard {
                shard,
                coordinator,
                intent,
                seal,
            } => {
                self.committer
                    .run(Box::new(move |txn| {
                        seal_shard(txn, shard, (coordinator, intent), seal)
                    }))
                    .await
            }
            request @ MetaRequest::SyncShard { .. } => {
                self.committer
                    .run(Box::new(move |txn| sync_shard(txn, &request)))
                    .await
            }
            MetaRequest::Link {
                mutation,
                inode,
                new_parent,
                new_name,
            } => {
                if inode.home() == self.node {
                    self.mutate(mutation, move |txn, _| {
                        link(txn, inode, new_parent, &new_name)
                    })
                    .await
                } else {
                    self.remote_link(mutation, inode, new_parent, new_name)
                        .await
                }
            }
            MetaRequest::Unlink {
                mutation,
                parent,
                name,
            } => self.unlink(mutation, parent, name).await,
            MetaRequest::Rmdir {
                mutation,
                parent,
                name,
            } => self.rmdir(mutation, parent, name).await,
            MetaRequest::Rename {
                mutation,
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                self.rename(mutation, parent, name, new_parent, new_name, flags)
                    .await
            }
            MetaRequest::Renamed { inode, parent } => {
                self.committer
                    .run(Box::new(move |txn| renamed(txn, inode, parent)))
                    .await
            }
            MetaRequest::SetAttr {
                mutation,
                inode,
                changes,
            } => {
                let result = self
                    .mutate(mutation, move |txn, _| set_attr(txn, inode, changes))
                    .await;
                if let Ok(Response::Attr(attr)) = &result {
                    if attr.shards.len() > 1 {
                        self.sync_shards(inode).await;
                    }
                }
                if result.is_ok() && changes.size.is_some() {
                    // The truncate is committed, and every target enforces it by its
                    // generation: none serves a read or write of the new generation before
                    // it has had the cut, and none cuts again once it has. Targets get it
                    // now; one that is away keeps it queued and gets it when it returns, or
                    // sooner when a client finds it waiting (ApplyTruncate).
                    if let Err(error) = self.apply_truncate(inode).await {
                        tracing::info!(%inode, %error, "a truncate waits for a target");
                    }
                }
                result
            }
            MetaRequest::SetXattr {
                mutation,
                inode,
                name,
                value,
                mode,
            } => {
                let inherited = name == crate::acl::ACL_DEFAULT || name == crate::acl::DIR_SPREAD;
                let result = self
                    .mutate(mutation, move |txn, _| {
                        set_xattr(txn, inode, &name, &value, mode)
                    })
                    .await;
                if result.is_ok() && inherited {
                    self.sync_shards(inode).await;
                }
                result
            }
            MetaRequest::GetXattr { inode, name } => self.read(|txn| get_xattr(txn, inode, &name)),
            MetaRequest::ListXattr { inode } => self.read(|txn| list_xattr(txn, inode)),
            MetaRequest::RemoveXattr {
                mutation,
                inode,
                name,
            } => {
                let inherited = name == crate::acl::ACL_DEFAULT || name == crate::acl::DIR_SPREAD;
                let result = self
                    .mutate(mutation, move |txn, _| remove_xattr(txn, inode, &name))
                    .await;
                if result.is_ok() && inherited {
                    self.sync_shards(inode).await;
                }
                result
            }
            MetaRequest::Check { repair, referenced } => {
                let checked = self.check(repair, referenced).await;
                self.check_progress
                    .lock()
                    .expect("progress poisoned")
                    .running = false;
                checked
            }
            MetaRequest::CheckProgress => Ok(Response::CheckProgress(
                self.check_progress
                    .lock()
                    .expect("progress poisoned")
                    .clone(),
            )),
            MetaRequest::RemoteReferences => {
                let home = self.node;
                self.read(|txn| remote_references(txn, home))
            }
            request @ MetaRequest::CreateDirInode { .. } => {
                let home = self.node;
                self.committer
                    .run(Box::new(move |txn| create_dir_inode(txn, home, &request)))
                    .await
            }
            request @ MetaRequest::ExchangeDentry { .. } => {
                self.committer
                    .run(Box::new(move |txn| exchange_dentry(txn, &request)))
                    .await
            }
            request @ MetaRequest::InsertDentry { .. } => {
                let home = self.node;
                let is_open = self.is_open_fn();
                self.committer
                    .run(Box::new(move |txn| {
                        insert_dentry_for(txn, home, &request, is_open)
                    }))
                    .await
            }
            MetaRequest::AdjustLinks {
                coordinator,
                intent,
                inode,
                delta,
            } => {
                let is_open = self.is_open_fn();
                self.committer
                    .run(Box::new(move |txn| {
                        adjust_links(txn, coordinator, intent, inode, delta, is_open)
                    }))
                    .await
            }
            MetaRequest::IntentsSettled { coordinator, below } => {
                self.committer
                    .run(Box::new(move |txn| settle_intents(txn, coordinator, below)))
                    .await
            }
            MetaRequest::RemoveDirInode { inode } => {
                self.committer
                    .run(Box::new(move |txn| remove_dir_inode(txn, inode)))
                    .await
            }
            MetaRequest::SetLock {
                client,
                inode,
                lock,
                wait_ms,
                reclaim,
            } => {
                self.admit_session(client).map_err(OpError::into_wire)?;
                let wait = Duration::from_millis(u64::from(wait_ms.min(LOCK_WAIT_MS_MAX)));
                match self.locks.set(inode, client, lock, wait, reclaim).await {
                    Ok(()) => Ok(Response::Done),
                    Err(Some(held)) => Err(OpError::rejected(
                        ErrorCode::WouldBlock,
                        format!("a conflicting lock is held by process {}", held.pid),
                    )),
                    Err(None) => Err(OpError::rejected(
                        ErrorCode::InGrace,
                        "locks are being reclaimed after a restart; ask again",
                    )),
                }
            }
            MetaRequest::GetLock {
                client,
                inode,
                lock,
            } => Ok(Response::LockConflict(
                self.locks.conflict(inode, client, &lock),
            )),
            MetaRequest::LockEpoch => Ok(Response::LockEpoch(self.locks.epoch())),
            MetaRequest::ReplicaApply { .. } => Err(OpError::Rejected(WireError::new(
                ErrorCode::Internal,
                "shipped store changes reached a home's handler",
            ))),
            MetaRequest::SetPattern {
                mutation,
                dir,
                pattern,
            } => {
                let result = self
                    .mutate(mutation, move |txn, _| set_pattern(txn, dir, pattern))
                    .await;
                if result.is_ok() {
                    self.sync_shards(dir).await;
                }
                result
            }
            MetaRequest::ApplyTruncate { inode } => self
                .apply_truncate(inode)
                .await
                .map(|()| Response::Done)
                .map_err(OpError::Rejected),
            MetaRequest::ReportSize { inode, report } => {
                self.committer
                    .run_eventual(Box::new(move |txn| report_size(txn, inode, report)))
                    .await
            }
            MetaRequest::Open {
                client,
                handle,
                inode,
                access: _,
            } => self.open((client, handle), inode),
            MetaRequest::Release { client, handles } => {
                // Every handle is released even if one fails; the failure is the answer.
                let mut released = Ok(Response::Done);
                for (inode, handle) in handles {
                    if let Err(error) = self.release((client, handle), inode).await {
                        released = Err(error);
                    }
                }
                released
            }
        };
        result.map_err(OpError::into_wire)
    }

    /// Fetches the cluster map again when it holds fewer targets (mirror groups, for a mirrored
    /// pattern) than a new file in `parent` wants: targets registered or groups made since the
    /// last heartbeat would otherwise be left out of files created right after. The fetch must have started after the request arrived
    /// (`arrived`); concurrent creates share it. A pool that really is smaller than the pattern
    /// pays one round trip to management per batch of creates.
    async fn refresh_map_if_short(&self, parent: InodeId, arrived: std::time::Instant) {
        let desired = self
            .read(|txn| Ok(crate::store::load_dir(&txn.open_table(INODES)?, parent)?.pattern))
            .ok()
            .flatten()
            .unwrap_or(weft_proto::layout::StripePattern::DEFAULT);
        let map = self.cluster.map();
        let available = match desired.kind {
            weft_proto::layout::PatternKind::Raid0 => map
                .targets
                .iter()
                .filter(|t| t.pool == desired.pool)
                .count(),
            // Groups made since the map was fetched count too.
            weft_proto::layout::PatternKind::Mirrored => map
                .mirror_groups
                .iter()
                .filter(|g| g.kind == weft_proto::messages::MirrorKind::Storage)
                .filter_map(|g| map.target(weft_proto::TargetId(g.primary)))
                .filter(|t| t.pool == desired.pool)
                .count(),
        };
        if available >= usize::from(desired.num_targets) {
            return;
        }
        self.cluster.refresh_unless_fetched_since(arrived).await;
    }

    /// Admits a mutation, a lock or an open of `client`'s session: refused for a session
    /// released as expired.
    fn admit_session(&self, client: ClientId) -> Result<(), OpError> {
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

    fn note_client(&self, client: ClientId) {
        self.seen
            .lock()
            .expect("seen table poisoned")
            .entry(client)
            .or_insert_with(std::time::Instant::now);
    }

    /// Fences the sessions management no longer lists as live, if this server knew them
    /// before the map was fetched, and releases their locks; their opens and stored replies
    /// wait for [`Meta::finish_expiries`].
    fn expire_sessions(
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
    async fn finish_expiries(&self) {
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
                for client in &gone {
                    replies.retain_in((client.0, 0)..=(client.0, u64::MAX), |_, _| false)?;
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

    /// Raises a file's size to what its objects hold, as a report of the current truncate
    /// generation, and takes it off [`UNREPORTED`]: for the files of a client that went away
    /// and those still listed at a start. False, the file still listed, while a truncate has to
    /// reach the targets (the objects may hold bytes past the size then), or while one of its
    /// slots is in `unreachable`, the slots that failed earlier in this pass (a slot that
    /// fails now joins them): a target that is down costs one wait per pass, not one per file.
    async fn settle_size(
        &self,
        inode: InodeId,
        unreachable: Option<&Mutex<HashSet<Slot>>>,
    ) -> Result<bool, OpError> {
        let (attr, truncating, listed) = self.read(|txn| {
            let attr = match get_attr(txn, inode) {
                Ok(Response::Attr(attr)) => Some(attr),
                Ok(_) => None,
                Err(OpError::Rejected(error)) if error.code == ErrorCode::NotFound => None,
                Err(error) => return Err(error),
            };
            let truncating = txn.open_table(TRUNCATES)?.get(inode.0)?.is_some();
            let listed = txn.open_table(UNREPORTED)?.get(inode.0)?.is_some();
            Ok((attr, truncating, listed))
        })?;
        let failed = |slot: &Slot| {
            unreachable.is_some_and(|failed| {
                failed
                    .lock()
                    .expect("unreachable slots poisoned")
                    .contains(slot)
            })
        };
        let found = match attr.and_then(|attr| Some((attr.layout.clone()?, attr))) {
            Some(_) if truncating => return Ok(false),
            Some((layout, _)) if layout.slots().any(|slot| failed(&slot)) => return Ok(false),
            Some((layout, attr)) => {
                let lengths = layout.slots().map(|slot| {
                    self.cluster
                        .call_storage(slot, &TARGET_RETRY, move |storage, route| async move {
                            storage.object_length(route, inode).await
                        })
                });
                let mut found = Vec::with_capacity(layout.targets.len());
                let mut error = None;
                for (slot, length) in layout.slots().zip(futures::future::join_all(lengths).await) {
                    match length {
                        Ok(length) => found.push(length),
                        Err(failure) => {
                            if let Some(unreachable) = unreachable {
                                unreachable
                                    .lock()
                                    .expect("unreachable slots poisoned")
                                    .insert(slot);
                            }
                            error.get_or_insert(failure);
                        }
                    }
                }
                if let Some(error) = error {
                    return Err(rpc_error(error));
                }
                let size = weft_proto::layout::file_size_from_object_lengths(&layout, &found);
                let mut written = SlotSet::default();
                for (index, _) in found.iter().enumerate().filter(|(_, length)| **length > 0) {
                    written.insert(index);
                }
                Some(FoundSize {
                    generation: attr.truncate_generation,
                    written,
                    grown: (size > attr.size).then_some(size),
                })
            }
            None => None,
        };
        let grown = found.as_ref().and_then(|found| found.grown);
        let has_data = found
            .as_ref()
            .is_some_and(|found| !found.written.is_empty());
        if grown.is_some() || has_data || listed {
            self.committer
                .run(Box::new(move |txn| settle_size(txn, inode, found)))
                .await?;
        }
        if let Some(size) = grown {
            tracing::info!(%inode, size, "size recovered from the objects");
        }
        Ok(true)
    }

    /// Settles the sizes of the files listed in [`UNREPORTED`] when this home started, some
    /// at once; after the first attempt requests no longer wait (a target that is down keeps
    /// its files listed until it is back).
    async fn settle_unreported(&self) {
        use futures::StreamExt;
        let listed: Vec<InodeId> = self
            .unreported
            .lock()
            .expect("unreported set poisoned")
            .iter()
            .copied()
            .collect();
        let unreachable = Mutex::new(HashSet::new());
        let unreachable = &unreachable;
        let mut settling = futures::stream::iter(listed)
            .map(|inode| async move { (inode, self.settle_size(inode, Some(unreachable)).await) })
            .buffer_unordered(SETTLE_AT_ONCE);
        while let Some((inode, settled)) = settling.next().await {
            match settled {
                Ok(true) => {
                    self.unreported
                        .lock()
                        .expect("unreported set poisoned")
                        .remove(&inode);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%inode, ?error, "could not recompute a size from the objects; retrying");
                }
            }
        }
        if !*self.settled.borrow() {
            let waiting = self
                .unreported
                .lock()
                .expect("unreported set poisoned")
                .len();
            tracing::info!(
                waiting,
                "sizes recomputed at the start; requests are served (files on targets that are away wait for them)"
            );
        }
        self.settled.send_replace(true);
    }

    /// Registers an open; registering the same (client, handle) again changes nothing.
    fn open(&self, open: OpenHandle, inode: InodeId) -> Result<Response, OpError> {
        self.admit_session(open.0)?;
        let added = register_open(&self.opens, open, inode);
        let result = self.read(|txn| get_attr(txn, inode));
        if result.is_err() && added {
            let _ = self.drop_open(open, inode);
        }
        result
    }

    /// Drops an open and tells whether the inode is still open anywhere.
    fn drop_open(&self, open: OpenHandle, inode: InodeId) -> Dropped {
        let mut opens = self.opens.lock().expect("open table poisoned");
        let Some(handles) = opens.handles.get_mut(&inode) else {
            return Dropped::Held;
        };
        handles.remove(&open);
        if !handles.is_empty() {
            return Dropped::Held;
        }
        opens.handles.remove(&inode);
        if opens.maybe_orphaned.remove(&inode) {
            Dropped::LastOfOrphan
        } else {
            Dropped::Last
        }
    }

    async fn release(&self, open: OpenHandle, inode: InodeId) -> Result<Response, OpError> {
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
    async fn dispose_unclaimed_orphans(&self) {
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

    /// Attributes of an inode on another metadata server.
    async fn remote_attr(&self, inode: InodeId) -> Result<Response, OpError> {
        let meta = self.cluster.meta(inode.home()).await.map_err(rpc_error)?;
        Ok(Response::Attr(
            meta.get_attr(inode).await.map_err(rpc_error)?,
        ))
    }

    /// mkdir of a directory placed on `home`: intent, remote inode, dentry (see `ops::remote`).
    async fn remote_mkdir(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new: NewInode,
        home: NodeId,
    ) -> Result<Response, OpError> {
        let coordinator = self.node;
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| {
                prepare_mkdir(
                    txn,
                    coordinator,
                    mutation,
                    parent,
                    &name,
                    &new,
                    (home, Vec::new()),
                )
            })
            .await?;
        self.drive(prepared, preparing, "mkdir-after-intent").await
    }

    /// mkdir of a directory spread over `shards` metadata servers (see `ops::remote`).
    async fn mkdir_spread(
        &self,
        mutation: MutationId,
        (parent, name): (InodeId, String),
        new: NewInode,
        shards: u16,
    ) -> Result<Response, OpError> {
        if new.kind != FileKind::Directory
            || !(2..=weft_proto::layout::DIR_SHARDS_MAX).contains(&shards)
        {
            return Err(OpError::rejected(
                ErrorCode::InvalidArgument,
                format!(
                    "a spread directory has 2 to {} shards",
                    weft_proto::layout::DIR_SHARDS_MAX
                ),
            ));
        }
        let arrived = std::time::Instant::now();
        let mut homes = self
            .directory_chooser
            .choose_metas(&self.cluster.map(), usize::from(shards));
        if homes.len() < usize::from(shards) {
            // Servers that joined since the last heartbeat are not in the map yet.
            self.cluster.refresh_unless_fetched_since(arrived).await;
            homes = self
                .directory_chooser
                .choose_metas(&self.cluster.map(), usize::from(shards));
        }
        if homes.len() < usize::from(shards) {
            return Err(OpError::rejected(
                ErrorCode::InvalidArgument,
                format!(
                    "a directory spread over {shards} metadata servers needs as many; {} are \
                     online",
                    homes.len()
                ),
            ));
        }
        let home = homes.remove(0);
        let coordinator = self.node;
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| {
                prepare_mkdir(
                    txn,
                    coordinator,
                    mutation,
                    parent,
                    &name,
                    &new,
                    (home, homes),
                )
            })
            .await?;
        self.drive(prepared, preparing, "mkdir-after-intent").await
    }

    /// The spread a new subdirectory of `parent` inherits: its default spread, over as many
    /// metadata servers as are online when fewer than asked; `None` for a plain directory.
    async fn inherited_spread(&self, parent: InodeId) -> Option<u16> {
        let arrived = std::time::Instant::now();
        let asked = self
            .read(|txn| {
                Ok(txn
                    .open_table(crate::store::XATTRS)?
                    .get((parent.0, crate::acl::DIR_SPREAD))?
                    .and_then(|v| crate::acl::parse_dir_spread(v.value())))
            })
            .ok()
            .flatten()
            .filter(|count| *count > 1)?;
        let online = |meta: &Meta| {
            meta.directory_chooser
                .choose_metas(&meta.cluster.map(), usize::from(asked))
                .len() as u16
        };
        if online(self) < asked {
            // Servers that joined since the last heartbeat are not in the map yet.
            self.cluster.refresh_unless_fetched_since(arrived).await;
        }
        Some(asked.min(online(self))).filter(|count| *count > 1)
    }

    /// The shards of the directory `name` in `parent` if it is a spread one; empty for any
    /// other entry (and for a missing one: the rmdir itself reports that).
    async fn shards_of_child(&self, parent: InodeId, name: &str) -> Result<Vec<InodeId>, OpError> {
        let dentry = self.read(|txn| {
            crate::store::load_dentry(&txn.open_table(crate::store::ENTRIES)?, parent, name)
        })?;
        let Some(dentry) = dentry.filter(|d| d.kind == FileKind::Directory) else {
            return Ok(Vec::new());
        };
        let attr = if dentry.child.home() == self.node {
            self.read(|txn| get_attr(txn, dentry.child))
        } else {
            self.remote_attr(dentry.child).await
        };
        match attr {
            Ok(Response::Attr(attr)) => Ok(attr.shards),
            Ok(_) | Err(OpError::Rejected(_)) => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    /// Copies what new entries inherit from spread directory `dir` to its shards; a shard that
    /// cannot be reached gets it from the work loop later.
    async fn sync_shards(&self, dir: InodeId) {
        self.shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .insert(dir);
        if let Err(error) = self.try_sync_shards(dir).await {
            tracing::warn!(%dir, ?error, "a shard of a spread directory is not up to date yet");
            return;
        }
        self.shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .remove(&dir);
    }

    async fn try_sync_shards(&self, dir: InodeId) -> Result<(), OpError> {
        let (record, default_acl, default_spread) = self.read(|txn| {
            let record = crate::store::load_inode(&txn.open_table(INODES)?, dir)?;
            let xattrs = txn.open_table(crate::store::XATTRS)?;
            let get = |name: &str| -> Result<Option<Vec<u8>>, OpError> {
                Ok(xattrs
                    .get((dir.0, name))?
                    .map(|value| value.value().to_vec()))
            };
            Ok((
                record,
                get(crate::acl::ACL_DEFAULT)?,
                get(crate::acl::DIR_SPREAD)?,
            ))
        })?;
        for shard in record.shards.iter().skip(1).map(|shard| InodeId(*shard)) {
            let request = MetaRequest::SyncShard {
                shard,
                mode: record.mode,
                uid: record.uid,
                gid: record.gid,
                pattern: record
                    .pattern
                    .unwrap_or(weft_proto::layout::StripePattern::DEFAULT),
                default_acl: default_acl.clone(),
                default_spread: default_spread.clone(),
            };
            self.call_meta(shard.home(), request).await?;
        }
        Ok(())
    }

    /// Seals (or unseals) the shards of a spread directory for rmdir intent `id`. The first
    /// shard that refuses (not empty, or another rmdir's) is the answer; unreachable ones
    /// leave the intent for recovery.
    async fn seal_shards(
        &self,
        id: u64,
        shards: &[InodeId],
        seal: bool,
    ) -> Result<Result<(), OpError>, OpError> {
        for shard in shards {
            let request = MetaRequest::SealShard {
                shard: *shard,
                coordinator: self.node,
                intent: id,
                seal,
            };
            if let Err(refused) = self.ask_meta(shard.home(), request).await? {
                return Ok(Err(refused));
            }
        }
        Ok(Ok(()))
    }

    /// Asks metadata node `node` to do a step of an intent, under the retry policy: `Ok(Ok)`
    /// its answer, `Ok(Err)` its refusal, `Err` when it cannot be reached (the intent stays
    /// for recovery).
    async fn ask_meta(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<Result<Response, OpError>, OpError> {
        let meta = self.cluster.meta(node).await.map_err(rpc_error)?;
        match TARGET_RETRY.run(|| meta.call(request.clone())).await {
            Ok(response) => Ok(Ok(response)),
            Err(weft_net::RpcError::Remote(error)) => Ok(Err(OpError::Rejected(error))),
            Err(error) => Err(rpc_error(error)),
        }
    }

    /// [`Meta::ask_meta`] for a step whose refusal is an error like any other.
    async fn call_meta(&self, node: NodeId, request: MetaRequest) -> Result<Response, OpError> {
        self.ask_meta(node, request).await?
    }

    /// [`Meta::call_meta`] for a step that answers with attributes.
    async fn call_meta_attr(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<InodeAttr, OpError> {
        match self.call_meta(node, request).await? {
            Response::Attr(attr) => Ok(attr),
            other => Err(OpError::Store(format!(
                "metadata node {node} answered {other:?} where attributes were expected"
            ))),
        }
    }

    /// Tells `inode`'s home, when that is another server, that a rename moved a dentry of it
    /// into `parent`: its ctime moves, and a directory's parent pointer follows (idempotent).
    /// An inode that lives here is marked by the rename's own commit.
    async fn mark_renamed(&self, inode: InodeId, parent: InodeId) -> Result<(), OpError> {
        if inode.home() == self.node {
            return Ok(());
        }
        self.call_meta(inode.home(), MetaRequest::Renamed { inode, parent })
            .await
            .map(|_| ())
    }

    /// Finishes a victim that rename intent `id` replaced and whose inode lives on another
    /// server: a file loses that link, a directory (sealed empty by this intent) goes. One
    /// already gone was finished by an earlier pass.
    async fn drop_replaced(&self, id: u64, victim: InodeId) -> Result<(), OpError> {
        let meta = self.cluster.meta(victim.home()).await.map_err(rpc_error)?;
        let attr = match TARGET_RETRY.run(|| meta.get_attr(victim)).await {
            Ok(attr) => attr,
            Err(weft_net::RpcError::Remote(error)) if error.code == ErrorCode::NotFound => {
                return Ok(())
            }
            Err(error) => return Err(rpc_error(error)),
        };
        if attr.kind == FileKind::Directory {
            if let Err(error) = self.remove_remote_dir(victim).await? {
                return Err(OpError::Store(format!(
                    "replaced directory {victim} was not removed: {error:?}"
                )));
            }
            return Ok(());
        }
        self.adjust_remote_links(id, victim, -1).await.map(|_| ())
    }

    /// Removes an empty directory inode on its home: `Ok(Err)` when the home refuses.
    async fn remove_remote_dir(&self, inode: InodeId) -> Result<Result<(), OpError>, OpError> {
        let request = MetaRequest::RemoveDirInode { inode };
        Ok(self.ask_meta(inode.home(), request).await?.map(|_| ()))
    }

    /// rmdir: local in one transaction, or with an intent when the directory lives elsewhere.
    async fn rmdir(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
    ) -> Result<Response, OpError> {
        let home = self.node;
        let lookup_name = name.clone();
        let shards = self.shards_of_child(parent, &name).await?;
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| prepare_rmdir(txn, home, mutation, parent, (&lookup_name, shards)))
            .await?;
        match prepared {
            None => {
                self.mutate(mutation, move |txn, _| rmdir(txn, parent, &name))
                    .await
            }
            Some(prepared) => self.drive(prepared, preparing, "rmdir-after-intent").await,
        }
    }

    /// A hard link here to an inode of another server (see `ops::remote`).
    async fn remote_link(
        &self,
        mutation: MutationId,
        inode: InodeId,
        new_parent: InodeId,
        new_name: String,
    ) -> Result<Response, OpError> {
        let Response::Attr(attr) = self.remote_attr(inode).await? else {
            return Err(OpError::Store("attributes expected".into()));
        };
        let kind = attr.kind;
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| prepare_link(txn, mutation, inode, kind, new_parent, &new_name))
            .await?;
        self.drive(prepared, preparing, "link-after-intent").await
    }

    /// unlink: local in one transaction, or with an intent when the inode lives elsewhere.
    async fn unlink(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
    ) -> Result<Response, OpError> {
        let home = self.node;
        let lookup_name = name.clone();
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| prepare_unlink(txn, home, mutation, parent, &lookup_name))
            .await?;
        match prepared {
            None => {
                let is_open = self.is_open_fn();
                self.mutate(mutation, move |txn, _| unlink(txn, parent, &name, is_open))
                    .await
            }
            Some(prepared) => self.drive(prepared, preparing, "unlink-after-intent").await,
        }
    }

    /// rename: local in one transaction, or across servers with an intent (a new name on
    /// another server, a directory or victim whose inode lives elsewhere, an exchange with
    /// anything elsewhere). A rename that moves a directory to another parent takes the
    /// cluster-wide rename lock from management first and walks the new parent's ancestors
    /// (across servers) to refuse a move into its own subtree; the lock keeps two such moves on
    /// different servers from making a loop together.
    async fn rename(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
    ) -> Result<Response, OpError> {
        let local_dentry = |dir: InodeId, entry: &str| {
            self.read(|txn| {
                crate::store::load_dentry(&txn.open_table(crate::store::ENTRIES)?, dir, entry)
            })
            .ok()
            .flatten()
            .map(|d| (d.child, d.kind))
        };
        let Some((child, kind)) = local_dentry(parent, &name) else {
            // The one-server path says what is wrong with the source.
            return self
                .rename_local(mutation, parent, name, new_parent, new_name, flags, false)
                .await;
        };
        let here = self.node;
        // What the new name holds now: an exchange swaps with it, a rename replaces it.
        let other = if new_parent.home() == here {
            local_dentry(new_parent, &new_name)
        } else if flags.exchange {
            let meta = self
                .cluster
                .meta(new_parent.home())
                .await
                .map_err(rpc_error)?;
            match meta.lookup(new_parent, &new_name).await {
                Ok(attr) => Some((attr.inode, attr.kind)),
                Err(weft_net::RpcError::Remote(error)) => return Err(OpError::Rejected(error)),
                Err(error) => return Err(rpc_error(error)),
            }
        } else {
            None
        };
        let is_dir = |kind: FileKind| kind == FileKind::Directory;
        let other_dir = flags.exchange && other.is_some_and(|(_, kind)| is_dir(kind));
        let moves_dirs = parent != new_parent && (is_dir(kind) || other_dir);
        let all_here = new_parent.home() == here
            && (child.home() == here || (!moves_dirs && !flags.exchange))
            && other.is_none_or(|(inode, _)| inode.home() == here);
        let route = async {
            if flags.exchange && !all_here {
                let Some(other) = other else {
                    return Err(OpError::rejected(
                        ErrorCode::NotFound,
                        format!("{new_name:?} not found"),
                    ));
                };
                self.exchange_out(mutation, (parent, name), (new_parent, new_name), other)
                    .await
            } else if all_here {
                let forgets = child.home() != here && !is_dir(kind);
                if forgets {
                    // The file's home forgets its parent first, and learns the new one after:
                    // a home that cannot be told afterwards keeps none, and refuses the file
                    // to confined clients, rather than keep a directory without its name.
                    self.mark_renamed(child, InodeId(0)).await?;
                }
                let renamed = match self
                    .rename_local(
                        mutation, parent, name, new_parent, new_name, flags, moves_dirs,
                    )
                    .await
                {
                    Ok(renamed) => renamed,
                    Err(error) => {
                        // Nothing moved: the old directory still holds the name.
                        if forgets {
                            let _ = self.mark_renamed(child, parent).await;
                        }
                        return Err(error);
                    }
                };
                // An inode living elsewhere: only its dentry moved here, its ctime and parent
                // live on its home. The rename is done: a home that cannot be told misses a
                // time, and a file's parent stays unknown.
                if let Err(error) = self.mark_renamed(child, new_parent).await {
                    tracing::warn!(inode = %child, ?error, "could not move a renamed inode's ctime");
                }
                Ok(renamed)
            } else {
                self.rename_out(mutation, parent, name, new_parent, new_name, flags)
                    .await
            }
        };
        if !moves_dirs {
            return route.await;
        }
        let token: u64 = rand::random();
        let mgmt = self.cluster.mgmt();
        let started = std::time::Instant::now();
        loop {
            match mgmt.acquire_rename_lock(self.node, token).await {
                Ok(()) => break,
                Err(error) if started.elapsed() < RENAME_LOCK_WAIT => {
                    tracing::debug!(%error, "waiting for the rename lock");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(rpc_error(error)),
            }
        }
        let result = async {
            let into_itself = (is_dir(kind)
                && self.is_ancestor_anywhere(child, new_parent).await?)
                || match other {
                    Some((other, _)) if other_dir => {
                        self.is_ancestor_anywhere(other, parent).await?
                    }
                    _ => false,
                };
            if into_itself {
                return Err(OpError::rejected(
                    ErrorCode::InvalidArgument,
                    "cannot move a directory into its own subtree",
                ));
            }
            route.await
        }
        .await;
        if let Err(error) = mgmt.release_rename_lock(token).await {
            tracing::warn!(%error, "could not release the rename lock; its lease will end it");
        }
        result
    }

    /// RENAME_EXCHANGE with an entry elsewhere (see `ops::remote`).
    async fn exchange_out(
        &self,
        mutation: MutationId,
        (parent, name): (InodeId, String),
        (new_parent, new_name): (InodeId, String),
        other: (InodeId, FileKind),
    ) -> Result<Response, OpError> {
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| {
                prepare_exchange(
                    txn,
                    mutation,
                    (parent, &name),
                    (new_parent, &new_name),
                    other,
                )
            })
            .await?;
        self.drive(prepared, preparing, "rename-after-intent").await
    }

    #[allow(clippy::too_many_arguments)]
    async fn rename_local(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
        ancestry_checked: bool,
    ) -> Result<Response, OpError> {
        let is_open = self.is_open_fn();
        self.mutate(mutation, move |txn, context| {
            let args = RenameArgs {
                home: context.home,
                ancestry_checked,
                parent,
                name: &name,
                new_parent,
                new_name: &new_name,
                flags,
            };
            rename(txn, args, is_open)
        })
        .await
    }

    /// Whether `ancestor` is `dir` or above it, following parent pointers across servers.
    async fn is_ancestor_anywhere(
        &self,
        ancestor: InodeId,
        mut dir: InodeId,
    ) -> Result<bool, OpError> {
        for _ in 0..PATH_DEPTH_MAX {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == InodeId::ROOT {
                return Ok(false);
            }
            let attr = if dir.home() == self.node {
                self.read(|txn| get_attr(txn, dir))?
            } else {
                self.remote_attr(dir).await?
            };
            let Response::Attr(attr) = attr else {
                return Err(OpError::Store("attributes expected".into()));
            };
            dir = attr.parent;
        }
        Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "directory tree too deep",
        ))
    }

    /// A rename of a non-directory into a directory on another server (see `ops::remote`).
    async fn rename_out(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
    ) -> Result<Response, OpError> {
        let preparing = self.intent_runs.preparing();
        let prepared = self
            .committer
            .run_with(move |txn| {
                prepare_rename_out(txn, mutation, parent, &name, new_parent, &new_name, flags)
            })
            .await?;
        self.drive(prepared, preparing, "rename-after-intent").await
    }

    /// Asks the home of `inode` to change its link count for intent `id`.
    async fn adjust_remote_links(
        &self,
        id: u64,
        inode: InodeId,
        delta: i32,
    ) -> Result<Response, OpError> {
        let request = MetaRequest::AdjustLinks {
            coordinator: self.node,
            intent: id,
            inode,
            delta,
        };
        self.call_meta(inode.home(), request).await
    }

    /// Runs the remaining steps of an intent: after step (1) in a live request, or in recovery.
    /// Errors reaching the other server leave the intent for the next recovery pass.
    async fn finish_intent(&self, id: u64, intent: Intent) -> Result<Response, OpError> {
        match &intent.op {
            IntentOp::Mkdir { home, request, .. } => {
                let attr = self.call_meta_attr(*home, request.clone()).await?;
                weft_service::failpoint::failpoint("mkdir-after-remote-create");
                let finishing = intent.clone();
                let (finished, take_back) = {
                    let attr = attr.clone();
                    self.committer
                        .run_with(move |txn| finish_mkdir(txn, id, &finishing, &attr))
                        .await?
                };
                if take_back {
                    // The name was taken while the inode was made: take the inode back.
                    let _ = self.remove_remote_dir(attr.inode).await;
                }
                finished
            }
            IntentOp::Link { inode, .. } => {
                let Response::Attr(attr) = self.adjust_remote_links(id, *inode, 1).await? else {
                    return Err(OpError::Store("attributes expected".into()));
                };
                weft_service::failpoint::failpoint("link-after-remote");
                let finishing = intent.clone();
                let (finished, give_back) = {
                    let attr = attr.clone();
                    self.committer
                        .run_with(move |txn| finish_link(txn, id, &finishing, &attr))
                        .await?
                };
                if give_back {
                    let _ = self.adjust_remote_links(id, *inode, -1).await;
                }
                finished
            }
            IntentOp::RenameOut {
                child,
                kind_code,
                new_parent,
                new_name,
                no_replace,
                ..
            } => {
                let meta = self
                    .cluster
                    .meta(new_parent.home())
                    .await
                    .map_err(rpc_error)?;
                let moves_dir = *kind_code == crate::store::kind_code(FileKind::Directory);
                // A directory victim on a third server is sealed first (only if empty), so that
                // nothing is added to it before it goes.
                let mut sealed = None;
                let mut outcome = Ok(());
                if moves_dir && !*no_replace {
                    match meta.lookup(*new_parent, new_name).await {
                        Ok(victim)
                            if victim.inode != *child
                                && victim.kind == FileKind::Directory
                                && victim.inode.home() != new_parent.home() =>
                        {
                            outcome = if victim.shards.is_empty() {
                                self.seal_shards(id, &[victim.inode], true).await?
                            } else {
                                Err(OpError::rejected(
                                    ErrorCode::CrossDevice,
                                    format!("{new_name:?} is a spread directory: remove it first"),
                                ))
                            };
                            sealed = outcome.is_ok().then_some(victim.inode);
                        }
                        Ok(_) | Err(weft_net::RpcError::Remote(_)) => {}
                        Err(error) => return Err(rpc_error(error)),
                    }
                }
                let outcome = match outcome {
                    Err(error) => Err(error),
                    Ok(()) => {
                        let request = MetaRequest::InsertDentry {
                            coordinator: self.node,
                            intent: id,
                            parent: *new_parent,
                            name: new_name.clone(),
                            child: *child,
                            kind: crate::store::kind_from_code(*kind_code),
                            no_replace: *no_replace,
                            sealed_victim: sealed,
                        };
                        self.ask_meta(new_parent.home(), request).await?
                    }
                };
                if outcome.is_err() {
                    if let Some(victim) = sealed {
                        self.seal_shards(id, &[victim], false).await??;
                    }
                }
                // A replaced victim whose inode lives on another server goes there: a file
                // loses its link, a (sealed, empty) directory is removed.
                let outcome = match outcome {
                    Ok(Response::Inodes(victims)) => {
                        for victim in victims {
                            self.drop_replaced(id, victim).await?;
                        }
                        Ok(Response::Done)
                    }
                    other => other,
                };
                if outcome.is_ok() {
                    // The moved inode's ctime, and a directory's parent pointer.
                    self.mark_renamed(*child, *new_parent).await?;
                }
                weft_service::failpoint::failpoint("rename-after-remote");
                let finishing = intent.clone();
                self.committer
                    .run(Box::new(move |txn| {
                        finish_rename_out(txn, id, &finishing, outcome)
                    }))
                    .await
            }
            IntentOp::Exchange {
                child,
                kind_code,
                new_parent,
                new_name,
                other,
                parent,
                ..
            } => {
                let request = MetaRequest::ExchangeDentry {
                    coordinator: self.node,
                    intent: id,
                    parent: *new_parent,
                    name: new_name.clone(),
                    expect: *other,
                    child: *child,
                    kind: crate::store::kind_from_code(*kind_code),
                };
                let outcome = self.ask_meta(new_parent.home(), request).await?.map(|_| ());
                if outcome.is_ok() {
                    self.mark_renamed(*child, *new_parent).await?;
                    self.mark_renamed(*other, *parent).await?;
                }
                weft_service::failpoint::failpoint("rename-after-remote");
                let finishing = intent.clone();
                self.committer
                    .run(Box::new(move |txn| {
                        finish_exchange(txn, id, &finishing, outcome)
                    }))
                    .await
            }
            IntentOp::Unlink { inode } => {
                self.adjust_remote_links(id, *inode, -1).await?;
                weft_service::failpoint::failpoint("unlink-after-remote");
                let finishing = intent.clone();
                self.committer
                    .run(Box::new(move |txn| finish_unlink(txn, id, &finishing)))
                    .await
            }
            IntentOp::MkdirSpread {
                home,
                request,
                shard_homes,
                ..
            } => {
                let dir = self.call_meta_attr(*home, request.clone()).await?;
                let mut shards = vec![dir.inode];
                for shard_home in shard_homes {
                    let MetaRequest::CreateDirInode {
                        coordinator,
                        intent,
                        mode,
                        uid,
                        gid,
                        pattern,
                        acls,
                        ..
                    } = request.clone()
                    else {
                        return Err(OpError::Store(format!("intent {id} is damaged")));
                    };
                    let shard_request = MetaRequest::CreateDirInode {
                        coordinator,
                        intent,
                        parent: dir.inode,
                        mode,
                        uid,
                        gid,
                        pattern,
                        acls,
                        shard_of: Some(dir.inode),
                    };
                    let shard = self.call_meta_attr(*shard_home, shard_request).await?;
                    shards.push(shard.inode);
                }
                let request = MetaRequest::SetShards {
                    dir: dir.inode,
                    shards: shards.clone(),
                };
                let attr = self.call_meta_attr(*home, request).await?;
                weft_service::failpoint::failpoint("mkdir-spread-after-shards");
                let finishing = intent.clone();
                let (finished, take_back) = {
                    let attr = attr.clone();
                    self.committer
                        .run_with(move |txn| finish_mkdir(txn, id, &finishing, &attr))
                        .await?
                };
                if take_back {
                    for shard in shards.iter().skip(1).chain(std::iter::once(&dir.inode)) {
                        let _ = self.remove_remote_dir(*shard).await;
                    }
                }
                finished
            }
            IntentOp::RmdirSpread { child, shards, .. } => {
                let others = &shards[1..];
                let mut outcome = self.seal_shards(id, others, true).await?;
                if outcome.is_ok() {
                    weft_service::failpoint::failpoint("rmdir-spread-after-seal");
                    outcome = self.remove_remote_dir(*child).await?;
                }
                if outcome.is_ok() {
                    for shard in others {
                        if let Err(error) = self.remove_remote_dir(*shard).await? {
                            return Err(OpError::Store(format!(
                                "sealed empty shard {shard} was not removed: {error:?}"
                            )));
                        }
                    }
                } else {
                    self.seal_shards(id, others, false).await??;
                }
                let finishing = intent.clone();
                self.committer
                    .run(Box::new(move |txn| {
                        finish_rmdir(txn, id, &finishing, outcome)
                    }))
                    .await
            }
            IntentOp::Rmdir { child, .. } => {
                let outcome = self.remove_remote_dir(*child).await?;
                weft_service::failpoint::failpoint("rmdir-after-remote-remove");
                let finishing = intent.clone();
                self.committer
                    .run(Box::new(move |txn| {
                        finish_rmdir(txn, id, &finishing, outcome)
                    }))
                    .await
            }
        }
    }

    /// Answers a prepared cross-server operation: a retry gets its stored reply; a new intent
    /// runs its remaining steps (`failpoint` names the crash point right after the intent).
    async fn drive(
        &self,
        prepared: Prepared,
        preparing: Preparing<'_>,
        failpoint: &str,
    ) -> Result<Response, OpError> {
        match prepared {
            Prepared::Answered(answer) => answer,
            Prepared::Intent(id, intent) => {
                let _running = preparing.run(id);
                weft_service::failpoint::failpoint(failpoint);
                self.finish_intent(id, intent).await
            }
        }
    }

    /// Finishes the intents a crash left (at start and then in the work loop).
    async fn recover_intents(&self) {
        let Ok(pending) = self.read(intents) else {
            return;
        };
        for (id, intent) in pending {
            // A request finishing it now is left alone.
            let Some(_running) = self.intent_runs.recover(id) else {
                continue;
            };
            match self.finish_intent(id, intent).await {
                Ok(_) | Err(OpError::Rejected(_)) => {
                    tracing::info!(intent = id, "finished an operation interrupted by a crash")
                }
                Err(error) => tracing::debug!(
                    intent = id,
                    ?error,
                    "an interrupted operation is still pending"
                ),
            }
        }
    }

    /// Tells the other homes up to which intent this home's cross-server operations have
    /// finished, so they can forget the markers that keep their steps from running twice
    /// (a table that would otherwise grow with every such operation ever made). Only what is
    /// durable is told: a failover must never find an intent it must finish that the others
    /// take for a late copy. A home that is offline is told once it is back.
    async fn tell_settled(&self) {
        let Ok(oldest_open) = self.read(settled_below) else {
            return;
        };
        // Read after the store: a request that found an intent open before it was finished
        // is preparing or running it now, and its steps must still land.
        let Some(running) = self.intent_runs.oldest() else {
            return;
        };
        let below = running.map_or(oldest_open, |running| running.min(oldest_open));
        let homes: Vec<NodeId> = {
            let told = self.settled_told.lock().expect("settled table poisoned");
            self.cluster
                .map()
                .meta_homes()
                .into_iter()
                .filter(|home| *home != self.node && told.get(home).is_none_or(|t| *t < below))
                .collect()
        };
        if homes.is_empty() {
            return;
        }
        // What was read is committed; this makes it durable.
        if self
            .committer
            .run(Box::new(|_| Ok(Response::Done)))
            .await
            .is_err()
        {
            return;
        }
        for home in homes {
            let request = MetaRequest::IntentsSettled {
                coordinator: self.node,
                below,
            };
            let told = async {
                let meta = self.cluster.meta(home).await.ok()?;
                tokio::time::timeout(WORK_RETRY_INTERVAL, meta.call(request))
                    .await
                    .ok()?
                    .ok()
            };
            if told.await.is_some() {
                self.settled_told
                    .lock()
                    .expect("settled table poisoned")
                    .insert(home, below);
            }
        }
    }

    /// Notes how far the consistency check is, for [`MetaRequest::CheckProgress`].
    fn note_check_progress(&self, phase: &str, done: u64, total: u64) {
        *self.check_progress.lock().expect("progress poisoned") = CheckProgress {
            running: true,
            phase: phase.to_string(),
            done,
            total,
        };
    }

    /// `weft fsck` of this metadata target: lists the objects of its files on every target,
    /// checks namespace and objects — from a read snapshot, so no change waits for it, or in
    /// one transaction when it repairs — then removes the objects that belong to no file and
    /// looks again at the copies of files' data it suspects. Inode ids are never reused, so an
    /// object without a file can never come to belong to one later.
    async fn check(&self, repair: bool, referenced: Vec<InodeId>) -> Result<Response, OpError> {
        let mut counts: HashMap<InodeId, usize> = HashMap::new();
        for inode in referenced {
            *counts.entry(inode).or_default() += 1;
        }
        let referenced = counts;
        let disposing = self.disposing.lock().await;
        let map = self
            .cluster
            .refresh()
            .await
            .unwrap_or_else(|_| self.cluster.map());
        let mut objects = Vec::new();
        let mut unreachable: Vec<TargetId> = Vec::new();
        // Every target's plain objects, and a group member's mirrored objects as well.
        let spaces = map.targets.iter().flat_map(|t| {
            let group = map.mirror_group_of_target(t.id).map(|g| g.id);
            std::iter::once((t.id, None)).chain(group.map(|group| (t.id, Some(group))))
        });
        let spaces: Vec<_> = spaces.collect();
        for (listed, &(target, group)) in spaces.iter().enumerate() {
            let total = spaces.len() as u64;
            self.note_check_progress("listing objects on targets", listed as u64, total);
            if unreachable.contains(&target) {
                continue;
            }
            let mut after = 0;
            loop {
                let home = Some(self.node);
                let mirrored = group.is_some();
                let page = self
                    .cluster
                    .call_storage(target, &TARGET_RETRY, |storage, _| async move {
                        storage
                            .list_objects(target, mirrored, home, after, OBJECTS_PER_LIST_MAX)
                            .await
                    })
                    .await;
                match page {
                    Ok((listed, end)) => {
                        after = listed.last().map(|(inode, _)| inode.0).unwrap_or(after);
                        objects.extend(
                            listed
                                .into_iter()
                                .map(|(inode, length)| (inode, target, group, length)),
                        );
                        if end {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(target = target.0, %error, "fsck cannot list a target");
                        unreachable.push(target);
                        break;
                    }
                }
            }
        }
        let mut open: HashSet<InodeId> = self
            .opens
            .lock()
            .expect("open table poisoned")
            .handles
            .keys()
            .copied()
            .collect();
        if self
            .orphans_unclaimed
            .load(std::sync::atomic::Ordering::Acquire)
            && !self.locks.grace_over()
        {
            // Files unlinked while open before the start wait for their clients to open them
            // again until the grace period is over.
            open.extend(self.read(|txn| list_orphans(&txn.open_table(crate::store::ORPHANS)?))?);
        }
        let listed = Listed {
            targets: map
                .targets
                .iter()
                .map(|t| t.id)
                .filter(|id| !unreachable.contains(id))
                .collect(),
            good_members: map
                .mirror_groups
                .iter()
                .filter(|group| group.kind == MirrorKind::Storage)
                .map(|group| {
                    let good = group.members.iter().filter(|member| {
                        member.state == Consistency::Good
                            && !unreachable.contains(&TargetId(member.id))
                    });
                    (group.id, good.map(|member| TargetId(member.id)).collect())
                })
                .collect(),
        };
        let home = self.node;
        self.note_check_progress("checking the namespace", 0, 0);
        let checked = if repair {
            self.committer
                .run_with(move |txn| {
                    check(
                        txn,
                        Some(txn),
                        home,
                        (&objects, &listed),
                        &open,
                        &referenced,
                    )
                })
                .await?
        } else {
            let db = Arc::clone(&self.db);
            tokio::task::spawn_blocking(move || {
                let snapshot = db.begin_read()?;
                check(
                    &snapshot,
                    None,
                    home,
                    (&objects, &listed),
                    &open,
                    &referenced,
                )
            })
            .await
            .map_err(|error| OpError::Store(format!("the check stopped: {error}")))??
        };
        drop(disposing);
        let Checked {
            mut report,
            garbage,
            suspects,
        } = checked;
        self.verify_suspects(suspects, &mut report).await;
        for (inode, slot) in garbage {
            let removed = self
                .cluster
                .call_storage(slot, &TARGET_RETRY, |storage, route| async move {
                    storage.remove(route, inode).await
                })
                .await;
            match removed {
                Ok(()) => report
                    .repairs
                    .push(format!("removed the object of {inode} on {slot}")),
                Err(error) => report.problems.push(format!(
                    "could not remove the object of {inode} on {slot}: {error}"
                )),
            }
        }
        report.unreachable_targets = unreachable;
        self.work.notify_one();
        Ok(Response::CheckReport(report))
    }

    /// Applies a queued truncate on every target of the file, then retires the work item.
    async fn apply_truncate(&self, inode: InodeId) -> Result<(), WireError> {
        let gate = Arc::clone(
            self.truncating
                .lock()
                .expect("truncate locks poisoned")
                .entry(inode)
                .or_default(),
        );
        let applied = {
            let _one = gate.lock().await;
            self.apply_truncate_now(inode).await
        };
        let mut gates = self.truncating.lock().expect("truncate locks poisoned");
        // The table's entry and this one: nobody else waits.
        if Arc::strong_count(&gate) == 2 {
            gates.remove(&inode);
        }
        applied
    }

    /// Sends `inode`'s queued truncate, if any, to every target; the caller holds its lock.
    async fn apply_truncate_now(&self, inode: InodeId) -> Result<(), WireError> {
        let work = self
            .read(|txn| {
                let table = txn.open_table(TRUNCATES)?;
                let bytes = table.get(inode.0)?;
                Ok(
                    bytes
                        .and_then(|bytes| postcard::from_bytes::<TruncateWork>(bytes.value()).ok()),
                )
            })
            .map_err(OpError::into_wire)?;
        let Some(work) = work else { return Ok(()) };
        let attempts = work.layout.slots().enumerate().map(|(index, slot)| {
            let length = object_length_for_file_size(&work.layout, index, work.size);
            let cluster = Arc::clone(&self.cluster);
            async move {
                let generation = work.generation;
                let call = |storage: Arc<StorageClient>, route| async move {
                    storage.truncate(route, (inode, generation), length).await
                };
                cluster.call_storage(slot, &TARGET_RETRY, call).await
            }
        });
        for result in futures::future::join_all(attempts).await {
            result.map_err(|error| {
                WireError::new(
                    ErrorCode::Io,
                    format!("truncate of {inode} could not reach a target: {error}"),
                )
            })?;
        }
        let generation = work.generation;
        self.committer
            .run(Box::new(move |txn| finish_truncate(txn, inode, generation)))
            .await
            .map_err(OpError::into_wire)?;
        Ok(())
    }

    /// Removes the objects of removed files, the files at once and each file's objects at
    /// once, then forgets the files whose objects are all gone in one commit (a crash before
    /// it only makes the next pass remove nothing again).
    async fn dispose_objects(&self, files: &[(InodeId, FileLayout)]) {
        let _disposing = self.disposing.lock().await;
        let removals = files.iter().map(|(inode, layout)| {
            let inode = *inode;
            let slots = layout.slots().map(move |slot| {
                let cluster = Arc::clone(&self.cluster);
                async move {
                    let call = |storage: Arc<StorageClient>, route| async move {
                        storage.remove(route, inode).await
                    };
                    cluster.call_storage(slot, &TARGET_RETRY, call).await
                }
            });
            async move {
                futures::future::join_all(slots)
                    .await
                    .iter()
                    .all(Result::is_ok)
                    .then_some(inode)
            }
        });
        let disposed: Vec<InodeId> = futures::future::join_all(removals)
            .await
            .into_iter()
            .flatten()
            .collect();
        if disposed.is_empty() {
            return;
        }
        let forgotten = self
            .committer
            .run(Box::new(move |txn| {
                let mut queue = txn.open_table(DISPOSALS)?;
                for inode in &disposed {
                    queue.remove(inode.0)?;
                }
                Ok(Response::Done)
            }))
            .await;
        if let Err(error) = forgotten {
            tracing::warn!(
                ?error,
                "could not forget disposed files; the next pass repeats them"
            );
        }
    }
}

/// Files whose sizes a start recomputes at once.
const SETTLE_AT_ONCE: usize = 32;

/// Files whose objects are removed together and then forgotten in one commit.
const DISPOSE_BATCH_FILES: usize = 64;

/// Who runs a home's intents now. More than one may run the same intent at once (a client's
/// retry finds its intent open and runs it too, recovery may be at it): the others' steps may
/// still be on their way when one of them finishes it, so the other homes are told it settled
/// only once none runs it ([`Meta::tell_settled`]).
#[derive(Default)]
struct IntentRuns(Mutex<Runs>);

#[derive(Default)]
struct Runs {
    /// Requests preparing a cross-server operation: they may find an intent open and run it.
    preparing: usize,
    /// Runs per intent.
    running: HashMap<u64, usize>,
}

impl IntentRuns {
    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.0.lock().expect("intent runs poisoned")
    }

    /// A request starts preparing a cross-server operation.
    fn preparing(&self) -> Preparing<'_> {
        self.runs().preparing += 1;
        Preparing(self)
    }

    /// Recovery starts running intent `id`, unless something runs it already.
    fn recover(&self, id: u64) -> Option<Running<'_>> {
        let mut runs = self.runs();
        if runs.running.contains_key(&id) {
            return None;
        }
        runs.running.insert(id, 1);
        Some(Running(self, id))
    }

    /// The oldest intent being run (`Some(None)`: none), or `None` while a request prepares.
    fn oldest(&self) -> Option<Option<u64>> {
        let runs = self.runs();
        (runs.preparing == 0).then(|| runs.running.keys().min().copied())
    }
}

/// A request preparing a cross-server operation.
struct Preparing<'a>(&'a IntentRuns);

impl<'a> Preparing<'a> {
    /// The request runs intent `id`.
    fn run(self, id: u64) -> Running<'a> {
        let runs = self.0;
        std::mem::forget(self);
        let mut state = runs.runs();
        state.preparing -= 1;
        *state.running.entry(id).or_default() += 1;
        Running(runs, id)
    }
}

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        self.0.runs().preparing -= 1;
    }
}

/// A run of an intent.
struct Running<'a>(&'a IntentRuns, u64);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut runs = self.0.runs();
        if let Some(count) = runs.running.get_mut(&self.1) {
            *count -= 1;
            if *count == 0 {
                runs.running.remove(&self.1);
            }
        }
    }
}

/// Works off the durable queues: truncates that did not reach all targets and objects of
/// removed files. A target that is down gets its work when it comes back.
async fn work_loop(meta: Arc<Meta>) {
    loop {
        let _ = tokio::time::timeout(WORK_RETRY_INTERVAL, meta.work.notified()).await;
        // First: requests wait for it, and finishing an intent may ask another server.
        meta.settle_unreported().await;
        meta.finish_expiries().await;
        meta.dispose_unclaimed_orphans().await;
        meta.recover_intents().await;
        meta.tell_settled().await;
        let syncs: Vec<InodeId> = meta
            .shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .iter()
            .copied()
            .collect();
        for dir in syncs {
            meta.sync_shards(dir).await;
        }
        let pending = meta.read(|txn| {
            let truncates: Vec<u64> = txn
                .open_table(TRUNCATES)?
                .iter()?
                .map(|item| item.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()?;
            let disposals: Vec<(u64, Vec<u8>)> = txn
                .open_table(DISPOSALS)?
                .iter()?
                .take(1024)
                .map(|item| item.map(|(k, v)| (k.value(), v.value().to_vec())))
                .collect::<Result<_, _>>()?;
            Ok((truncates, disposals))
        });
        let Ok((truncates, disposals)) = pending else {
            continue;
        };
        for inode in truncates {
            if let Err(error) = meta.apply_truncate(InodeId(inode)).await {
                tracing::debug!(%error, "truncate still pending");
            }
        }
        let files: Vec<(InodeId, FileLayout)> = disposals
            .into_iter()
            .filter_map(
                |(inode, bytes)| match postcard::from_bytes::<FileLayout>(&bytes) {
                    Ok(layout) => Some((InodeId(inode), layout)),
                    Err(error) => {
                        tracing::error!(inode, %error, "damaged disposal record");
                        None
                    }
                },
            )
            .collect();
        for batch in files.chunks(DISPOSE_BATCH_FILES) {
            meta.dispose_objects(batch).await;
        }
    }
}

/// The spread directories whose home is here.
fn spread_directories(txn: &redb::ReadTransaction) -> Result<Vec<InodeId>, OpError> {
    let mut dirs = Vec::new();
    for item in txn.open_table(INODES)?.iter()? {
        let (key, value) = item?;
        if !crate::store::InodeRecord::decode(key.value(), value.value())?
            .shards
            .is_empty()
        {
            dirs.push(InodeId(key.value()));
        }
    }
    Ok(dirs)
}
