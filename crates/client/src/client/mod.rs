//! [`Client`]: a session with management and every metadata and storage server.

use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_net::kept::KeptChanges;
use weft_net::retry::RetryPolicy;
use weft_net::MetaCalls;
use weft_net::{ClusterView, MetaClient, MgmtClient, RpcClientOptions, RpcError};
use weft_proto::access::WRITE;
use weft_proto::ids::{ClientId, InodeId, NodeId};
use weft_proto::layout::StripePattern;
use weft_proto::messages::{
    AttrChanges, ClusterMap, DirEntry, FileKind, InodeAttr, MutationId, NewInode, RenameFlags,
    SizeReport, XattrSetMode,
};
use weft_proto::{ErrorCode, Recovery};

use weft_mirror::numbers::Pending;

mod config;
mod files;
mod locks;
mod names;
mod namespace;

pub use crate::error::ClientError;
use crate::session::Session;
pub use config::ClientConfig;

/// A client session: routes each request to the server that owns it.
pub struct Client {
    pub(crate) cluster: Arc<ClusterView>,
    /// The client name of this client's key; `None` with the cluster key.
    identity: Option<String>,
    /// See [`Client::root`].
    root: InodeId,
    /// Requests the mount answered with an error it does not serve, by kind.
    pub(crate) unserved: crate::unserved::Unserved,
    /// The session: its id and numbers, its opens and locks.
    pub(crate) session: Session,
    pub(crate) retry: RetryPolicy,
    /// The shards of every spread directory this client has seen. A spread directory's shards
    /// never change and inode ids are never reused, so entries never go stale.
    spread: Mutex<HashMap<InodeId, Arc<[InodeId]>>>,
    /// Reads and changes of file data.
    pub(crate) data: crate::io::DataPath,
    /// The files open here.
    pub(crate) files: crate::file::OpenFiles,
    /// Closed handles not told to their metadata servers yet, by home ([`Client::release_soon`]).
    releases: Mutex<HashMap<NodeId, Vec<(InodeId, u64)>>>,
    /// Held while this client replays its changes ([`Client::replay_changes`]).
    replaying: tokio::sync::Mutex<()>,
    /// Directories this client made whose homes let it answer for names not in them.
    names: names::NamesLeases,
}

/// Renews `client`'s session every `interval` until the client is gone, on a thread with a
/// runtime and a management connection of its own. A runtime fires timers and reads sockets
/// only between polls of its tasks, so a heartbeat among the program's tasks waited behind
/// tasks that compute for long between awaits, and a live client's session expired (its
/// locks and opens released under it). Only the renewal of an expired session runs on the
/// program's runtime, where the rest of the client lives.
fn spawn_heartbeat(client: &Arc<Client>, interval: Duration, mgmt: MgmtClient) {
    let program = tokio::runtime::Handle::current();
    let weak = Arc::downgrade(client);
    // As `std::thread::spawn` does, a machine out of threads or descriptors panics here.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the session heartbeat");
    std::thread::Builder::new()
        .name("weft-heartbeat".into())
        .spawn(move || {
            runtime.block_on(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    // Not held across the call: the program may drop the client meanwhile.
                    let Some((session, unserved)) = weak
                        .upgrade()
                        .map(|client| (client.id(), client.unserved_report()))
                    else {
                        return;
                    };
                    match mgmt.client_heartbeat(session, unserved).await {
                        Err(error) if error.code().recovery() == Recovery::NewSession => {
                            let Some(client) = weak.upgrade() else {
                                return;
                            };
                            program.spawn(async move {
                                client.session_expired(session, &error).await;
                            });
                        }
                        Err(error) => tracing::warn!(%error, "session heartbeat failed"),
                        Ok(()) => {}
                    }
                }
            });
        })
        .expect("a thread for the session heartbeat");
}

/// How often a client heartbeats: as configured, and at least three times within the session
/// timeout management said (a client configured for a slower heartbeat than the cluster's
/// timeout would lose its session, and its locks and opens, between two heartbeats).
fn heartbeat_interval(configured: Duration, session_timeout: Option<Duration>) -> Duration {
    match session_timeout {
        Some(timeout) => configured.min(timeout / 3),
        None => configured,
    }
}

/// How long one try of [`Client::wait_for_root`] waits for its answer.
const ROOT_TRY_TIMEOUT: Duration = Duration::from_secs(2);

/// How long [`Client::wait_for_root`] waits between tries.
const ROOT_RETRY_SLICE: Duration = Duration::from_millis(500);

/// How long a closed handle waits for others to be told to its metadata server with. A
/// process that writes small files one after another (an untar, mdtest's hard shape) closes
/// one every millisecond or so: this gathers tens of closes into one request. An unlink, and
/// a request for room under a hard quota, sends what is gathered for its server first
/// ([`Client::unlink`], [`Client::reserve`]).
const RELEASE_GATHER: Duration = Duration::from_millis(20);

/// How long a create waits, in slices, for a spread directory's rmdir to finish.
const BUSY_RETRY_SLICE: Duration = Duration::from_millis(20);

/// Most bytes of rows sent back in one replay request, well under a frame's body.
const REPLAY_BYTES_PER_REQUEST: usize = 1 << 20;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("client", &self.id())
            .finish()
    }
}

impl Client {
    /// Connects to management, registers a session and fetches the maps.
    ///
    /// # Errors
    /// [`ClientError`] when management does not answer.
    pub async fn connect(config: &ClientConfig) -> Result<Arc<Client>, ClientError> {
        Client::connect_over(config, Arc::new(crate::Objects)).await
    }

    /// Connects as [`Client::connect`] does, with file data going over `transport` instead of
    /// to the storage servers' objects (a tool's own, such as the network benchmark's).
    ///
    /// # Errors
    /// [`ClientError`] when management does not answer.
    pub async fn connect_over(
        config: &ClientConfig,
        transport: Arc<dyn crate::Transport>,
    ) -> Result<Arc<Client>, ClientError> {
        let auth = config.auth().map_err(ClientError::Config)?;
        let identity = auth.client_name().map(str::to_string);
        let options = RpcClientOptions {
            connections: config.connections_per_server,
            request_timeout: config.request_timeout,
            auth,
            protocol_max: config.protocol_max,
            ..RpcClientOptions::default()
        };
        let mut cluster = ClusterView::new(config.mgmt.clone(), options.clone());
        let session = cluster
            .mgmt()
            .register_client(weft_service_free_host_name())
            .await?;
        let client = session.id;
        cluster.set_origin(client.origin());
        let cluster = Arc::new(cluster);
        let map = cluster.refresh().await?;
        cluster.follow();
        let root = identity
            .as_deref()
            .and_then(|name| map.client_rule(name))
            .and_then(|rule| rule.subtree.as_ref())
            .map_or(InodeId::ROOT, |subtree| subtree.inode);
        let retry = RetryPolicy {
            total_timeout: config.retry_timeout,
            ..RetryPolicy::default()
        };
        let client = Arc::new(Client {
            data: crate::io::DataPath::new(Arc::clone(&cluster), retry, transport),
            cluster,
            identity,
            root,
            session: Session::new(client),
            retry,
            spread: Mutex::default(),
            files: crate::file::OpenFiles::new(config.write_behind_bytes, config.read_ahead_bytes),
            releases: Mutex::default(),
            replaying: tokio::sync::Mutex::default(),
            names: names::NamesLeases::default(),
            unserved: crate::unserved::Unserved::default(),
        });
        let interval = heartbeat_interval(config.heartbeat_interval, session.timeout);
        spawn_heartbeat(
            &client,
            interval,
            MgmtClient::new(
                config.mgmt.clone(),
                RpcClientOptions {
                    connections: 1,
                    ..options
                },
            ),
        );
        let reclaim = Arc::downgrade(&client);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(client) = reclaim.upgrade() else {
                    return;
                };
                let _ = client.cluster.refresh().await;
                let _ = client.replay_changes().await;
                client.reclaim().await;
            }
        });
        Ok(client)
    }

    /// Waits until a metadata server answers for this client's root, at most `limit`,
    /// refreshing the map meanwhile (servers register after management, and a restarted one
    /// comes back); `waiting` is called once, with what the first try met, when it does not
    /// answer at once. Each try is one request, not the retry policy's minute.
    ///
    /// # Errors
    /// [`ClientError::ClusterNotReady`] when none answered in time.
    pub async fn wait_for_root(
        &self,
        limit: Duration,
        waiting: impl FnOnce(&str),
    ) -> Result<(), ClientError> {
        let started = std::time::Instant::now();
        let root = self.root;
        let mut waiting = Some(waiting);
        loop {
            let tried = async {
                let meta = self.cluster.meta(root.home()).await?;
                meta.get_attr(root).await
            };
            let last = match tokio::time::timeout(ROOT_TRY_TIMEOUT, tried).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {ROOT_TRY_TIMEOUT:?}"),
            };
            if started.elapsed() >= limit {
                return Err(ClientError::ClusterNotReady {
                    mgmt: self.mgmt_address().to_string(),
                    waited: started.elapsed(),
                    last,
                });
            }
            if let Some(waiting) = waiting.take() {
                waiting(&last);
            }
            tokio::time::sleep(ROOT_RETRY_SLICE).await;
            let _ = self.cluster.refresh().await;
        }
    }

    /// The client name of this client's key (`weft keygen --client`); `None` when it holds
    /// the cluster key.
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// The directory this client sees as its root: the subtree its client's rule confines it
    /// to when it connected (`weft client set --subtree`), or the cluster's root.
    pub fn root(&self) -> InodeId {
        self.root
    }

    /// What the heartbeat reports: the requests the mount does not serve, by kind.
    fn unserved_report(&self) -> Vec<(String, u64)> {
        self.unserved
            .counts()
            .into_iter()
            .map(|(kind, count)| (kind.to_string(), count))
            .collect()
    }

    /// This session's id.
    pub fn id(&self) -> ClientId {
        self.session.id()
    }

    /// Locks or an open of `inode` are lost: the file's next write, flush and sync fail, as
    /// after a write error.
    pub(crate) fn state_lost(&self, inode: InodeId) {
        self.files
            .record_error(inode, ClientError::StateLost { inode });
    }

    /// Session `expired` has expired (`why`): the servers released its locks and opens, so
    /// every lock this client holds is lost, and the files that held one are told; then a new
    /// session is registered, unless another caller did so already, and the next
    /// [`Client::reclaim`] opens the files still open here again in it (one disposed of
    /// meanwhile is lost).
    pub(crate) async fn session_expired(
        &self,
        expired: ClientId,
        why: &(dyn std::fmt::Display + Sync),
    ) {
        // One caller renews; the others wait for it and find the new session.
        let _renewing = self.session.renewing.lock().await;
        if self.id() != expired {
            return;
        }
        let lost = self.session.locks.forget_all();
        tracing::error!(
            session = %expired,
            error = %why,
            files_with_locks = lost.len(),
            "this client's session expired: its locks are lost (each file that held one fails \
             its next write, fsync and close with EIO)"
        );
        for inode in lost {
            self.state_lost(inode);
        }
        match self
            .cluster
            .mgmt()
            .register_client(weft_service_free_host_name())
            .await
        {
            Ok(session) => {
                let session = session.id;
                if self.session.renewed(expired, session) {
                    tracing::info!(%session, "registered a new session");
                    self.session.locks.reclaim_everywhere();
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not register a new session; trying again at the next heartbeat");
            }
        }
    }

    /// Management's address.
    pub fn mgmt_address(&self) -> &str {
        self.cluster.mgmt().address()
    }

    /// The cluster map, fetched fresh from management.
    ///
    /// # Errors
    /// [`ClientError`] when management does not answer.
    pub async fn cluster_map(&self) -> Result<Arc<ClusterMap>, ClientError> {
        Ok(self.cluster.refresh().await?)
    }

    fn begin_mutation(&self) -> (MutationId, Pending<'_>) {
        self.session.begin_mutation()
    }

    /// Runs a metadata call on the home of `inode` under the retry policy.
    pub(crate) async fn on_home<T, F, Fut>(&self, inode: InodeId, call: F) -> Result<T, ClientError>
    where
        F: Fn(Arc<MetaClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        self.on_node(inode.home(), call).await
    }

    /// Runs a metadata call on the server of `home` under the retry policy.
    pub(crate) async fn on_node<T, F, Fut>(&self, home: NodeId, call: F) -> Result<T, ClientError>
    where
        F: Fn(Arc<MetaClient>) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        Ok(self.cluster.call_meta(home, &self.retry, call).await?)
    }

    /// Waits until every metadata home has on disk the changes of this client it answered
    /// before its sync (docs/design/crash-consistency.md, "Durability by replay"): what
    /// `fsync`, `fdatasync` and a directory's fsync wait for, beyond the data. (`syncfs` and
    /// `sync` never reach a FUSE file system's process: the kernel sends them to virtiofs
    /// only.)
    ///
    /// # Errors
    /// A home could not be reached.
    pub async fn sync_changes(&self) -> Result<(), ClientError> {
        for (home, kept) in self.cluster.homes_answering_early() {
            // Changes of a start before the one that answered last: sent back first, and
            // the home says whether it had them.
            if kept.has_earlier() {
                self.replay_home(home, &kept).await?;
            }
            if let Some((incarnation, number)) = kept.highest() {
                let synced = self
                    .on_node(home, |meta| async move {
                        meta.sync_home(incarnation, number).await
                    })
                    .await;
                match synced {
                    Ok(_) => {}
                    // The home started again since: what it lost is on disk once replayed.
                    Err(error) if error.code().recovery() == Recovery::Reclaim => {
                        self.replay_home(home, &kept).await?;
                    }
                    Err(error) => return Err(error),
                }
            }
            // Changes a restart dropped fail the next sync that waits for them.
            if let Some(lost) = kept.take_lost() {
                return Err(RpcError::Remote(lost).into());
            }
        }
        Ok(())
    }

    /// Whether this client keeps changes a home answered before their sync and may not have
    /// on disk: lost with this process, they would be lost to every client of that home.
    pub fn keeps_changes(&self) -> bool {
        self.cluster
            .homes_answering_early()
            .iter()
            .any(|(_, kept)| kept.highest().is_some() || kept.has_earlier())
    }

    /// Ends this client's part in the homes' durability by replay: waits until every change
    /// it kept is on disk, then tells each home that answered it before the sync that it
    /// keeps nothing, so that the home's next start does not wait for it. For a mount being
    /// unmounted, and a tool that changed the namespace, before they end.
    ///
    /// # Errors
    /// As [`Client::sync_changes`]; a home that cannot be told waits for this client at its
    /// next start, until its recovery window ends.
    pub async fn close(&self) -> Result<(), ClientError> {
        self.sync_changes().await?;
        let client = self.id();
        for (home, _) in self.cluster.homes_answering_early() {
            self.on_node(home, |meta| async move {
                meta.replay(client, Vec::new(), true).await
            })
            .await?;
        }
        Ok(())
    }

    /// Sends back to every home that started again since it answered this client changes
    /// before their sync what this client keeps of them, and says it sent everything: the home
    /// waits for this before it serves again (docs/design/crash-consistency.md, "Durability by
    /// replay"). The homes are sent to at once, so that homes that restarted together do not
    /// wait for each other's clients.
    ///
    /// # Errors
    /// A home could not be reached (asked again at the next heartbeat), or dropped changes of
    /// this client (`Evicted`: one made before them was lost with its client), which the next
    /// [`Client::sync_changes`] reports too.
    pub(crate) async fn replay_changes(&self) -> Result<(), ClientError> {
        let _replaying = self.replaying.lock().await;
        let homes = self.cluster.homes_answering_early();
        let replays = homes
            .iter()
            .map(|(home, kept)| self.replay_home_unlocked(*home, kept));
        futures::future::join_all(replays)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .map(drop)
    }

    /// [`Client::replay_changes`] of one home.
    async fn replay_home(&self, home: NodeId, kept: &KeptChanges) -> Result<(), ClientError> {
        let _replaying = self.replaying.lock().await;
        self.replay_home_unlocked(home, kept).await
    }

    async fn replay_home_unlocked(
        &self,
        home: NodeId,
        kept: &KeptChanges,
    ) -> Result<(), ClientError> {
        let meta = self.cluster.meta(home).await?;
        let epoch = meta.lock_epoch().await?;
        if kept.answered_by() == Some(epoch) && !kept.has_earlier() {
            return Ok(());
        }
        let changes = kept.waiting();
        // In requests of at most REPLAY_BYTES_PER_REQUEST of rows, the last saying so.
        let mut requests: Vec<Vec<weft_proto::messages::NumberedChange>> = vec![Vec::new()];
        let mut bytes = 0;
        for change in &changes {
            let size = change.rows.len() + change.proof.len() + 64;
            if bytes + size > REPLAY_BYTES_PER_REQUEST && bytes > 0 {
                requests.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            requests.last_mut().expect("a request").push(change.clone());
        }
        let last = requests.len() - 1;
        let client = self.id();
        for (index, request) in requests.into_iter().enumerate() {
            let sent = self
                .on_node(home, |meta| {
                    let request = request.clone();
                    async move { meta.replay(client, request, index == last).await }
                })
                .await;
            match sent {
                Ok(()) => {}
                Err(error) if error.code() == weft_proto::ErrorCode::Evicted => {
                    tracing::error!(home = home.0, %error, "changes of this client were lost");
                    kept.replayed(epoch, &changes);
                    if let ClientError::Rpc(RpcError::Remote(lost)) = &error {
                        kept.lose(lost.clone());
                    }
                    return Err(error);
                }
                // Sent again at the next heartbeat.
                Err(error) => {
                    tracing::warn!(home = home.0, %error, "replaying changes failed; trying again");
                    return Err(error);
                }
            }
        }
        if !changes.is_empty() {
            tracing::info!(
                home = home.0,
                changes = changes.len(),
                "replayed changes a metadata server lost in its restart"
            );
        }
        kept.replayed(epoch, &changes);
        Ok(())
    }

    /// Remembers the shards of a spread directory.
    fn learn(&self, attr: &InodeAttr) {
        if attr.shards.len() > 1 {
            self.spread
                .lock()
                .expect("spread table poisoned")
                .entry(attr.inode)
                .or_insert_with(|| attr.shards.as_slice().into());
        }
    }

    fn shards(&self, dir: InodeId) -> Option<Arc<[InodeId]>> {
        self.spread
            .lock()
            .expect("spread table poisoned")
            .get(&dir)
            .cloned()
    }

    /// The directory inode that holds `name` of `dir`: `dir` itself, or for a spread directory
    /// the shard the name hashes to.
    fn holder(&self, dir: InodeId, name: &str) -> InodeId {
        match self.shards(dir) {
            Some(shards) => shards[weft_proto::layout::dir_shard_of_name(name, shards.len())],
            None => dir,
        }
    }

    /// Runs a call about `name` in `dir` on the server of the directory inode that holds the
    /// name (`call` gets that inode). A spread directory this client did not know of answers
    /// `WrongShard`: learn its shards and ask again. A shard sealed by an rmdir in progress
    /// answers `Busy`: ask again until the rmdir ends.
    async fn on_holder<T, F, Fut>(
        &self,
        dir: InodeId,
        name: &str,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Arc<MetaClient>, InodeId) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        self.within(async {
            let mut learned = false;
            loop {
                let holder = self.holder(dir, name);
                let result = self.on_home(holder, |meta| call(meta, holder)).await;
                match result {
                    Err(error) if error.code().recovery() == Recovery::LearnShards && !learned => {
                        learned = true;
                        self.get_attr(dir).await?;
                    }
                    Err(error)
                        if error.code().recovery() == Recovery::Wait
                            && weft_net::retry::time_left(BUSY_RETRY_SLICE) =>
                    {
                        tokio::time::sleep(BUSY_RETRY_SLICE).await;
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// Registers open `handle` (unique within this session) of `inode` for `access` (the
    /// [`weft_proto::access`] bits: `READ`, `WRITE`) with its home, which keeps the file alive past an
    /// unlink until the handle is released; returns fresh attributes.
    ///
    /// # Errors
    /// `NotFound`; `ReadOnly` for a write by a read-only client; `PermissionDenied` when the
    /// server checks the caller's access itself (a squashed root) and it lacks it.
    pub async fn open(
        &self,
        inode: InodeId,
        handle: u64,
        access: u8,
    ) -> Result<InodeAttr, ClientError> {
        self.watch_home(inode.home()).await?;
        let client = self.id();
        // A handle opened again shows what it was granted before.
        let granted = self.session.opens.granted(inode, handle, access, client);
        let reclaims = self.reclaims(inode.home());
        let (attr, capability) = self
            .on_home(inode, |meta| async move {
                meta.open(client, handle, inode, access, granted).await
            })
            .await?;
        self.record_open((inode, handle), access, capability, reclaims)
            .await;
        Ok(attr)
    }

    /// Runs `work`, an operation of this client, under one deadline (the retry policy's
    /// time) that every retry loop inside it ends at ([`weft_net::retry::within`]).
    pub(crate) fn within<F: std::future::Future>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        weft_net::retry::within(self.retry.total_timeout, work)
    }

    /// Tells the metadata server of a closed handle within [`RELEASE_GATHER`], together with
    /// the other handles of its home closed meanwhile: one request for many closes. The
    /// server keeps the file open until then (an unlink meanwhile disposes of it at the
    /// release). Call [`Client::release_now`] before the session ends.
    pub fn release_soon(self: &Arc<Self>, inode: InodeId, handle: u64) {
        self.session.opens.forget(inode, handle);
        let home = inode.home();
        let first = {
            let mut releases = self.releases.lock().expect("release queue poisoned");
            let queued = releases.entry(home).or_default();
            queued.push((inode, handle));
            queued.len() == 1
        };
        if first {
            let client = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(RELEASE_GATHER).await;
                client.send_releases(home).await;
            });
        }
    }

    /// Sends every handle [`Client::release_soon`] holds.
    pub async fn release_now(&self) {
        let homes: Vec<NodeId> = self
            .releases
            .lock()
            .expect("release queue poisoned")
            .keys()
            .copied()
            .collect();
        for home in homes {
            self.send_releases(home).await;
        }
    }

    async fn send_releases(&self, home: NodeId) {
        let Some(handles) = self
            .releases
            .lock()
            .expect("release queue poisoned")
            .remove(&home)
        else {
            return;
        };
        let (inode, client) = (handles[0].0, self.id());
        let count = handles.len();
        let sent = self
            .on_home(inode, |meta| {
                let handles = handles.clone();
                async move { meta.release(client, handles).await }
            })
            .await;
        if let Err(error) = sent {
            // The server drops the session's opens when the session expires.
            tracing::warn!(%error, count, %home, "telling a metadata server of closed files failed");
        }
    }

    /// Reports a file's size after writes.
    ///
    /// # Errors
    /// `NotFound`, transport errors.
    pub async fn report_size(
        &self,
        inode: InodeId,
        report: SizeReport,
    ) -> Result<InodeAttr, ClientError> {
        // What was written went through an open for writing: its capability shows it.
        let granted = self.session.opens.capability(inode, WRITE, self.id());
        let client = Some(self.id());
        self.through_grace(inode, |meta| async move {
            meta.report_size(inode, report, granted, client).await
        })
        .await
    }

    /// Asks `inode`'s home for room to grow the file open as `handle` to `to`; answers the
    /// end it may grow the file to (short of `to` at a hard limit).
    ///
    /// # Errors
    /// `QuotaExceeded` when no room is left, or the request's error.
    pub(crate) async fn reserve(
        &self,
        inode: InodeId,
        handle: u64,
        to: u64,
    ) -> Result<u64, ClientError> {
        // The closes gathered for the file's home go first: the room of a handle closed here
        // is given back before this asks for more.
        self.send_releases(inode.home()).await;
        let client = self.id();
        let (to, capability) = self
            .through_grace(inode, |meta| async move {
                meta.reserve(client, handle, inode, to).await
            })
            .await?;
        if let Some(capability) = capability {
            self.session.opens.renew(inode, capability);
        }
        Ok(to)
    }

    /// Sets a directory's stripe pattern.
    ///
    /// # Errors
    /// `NotDirectory`, `InvalidArgument`.
    pub async fn set_pattern(
        &self,
        dir: InodeId,
        pattern: StripePattern,
    ) -> Result<InodeAttr, ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.on_home(dir, |meta| async move {
            meta.set_pattern(mutation, dir, pattern).await
        })
        .await
    }

    /// Has `inode`'s home send the file's queued truncate to every target now (a target
    /// answered `TruncatePending`); returns when each has it.
    ///
    /// # Errors
    /// `Io` when a target cannot be reached, transport errors.
    pub async fn apply_truncate(&self, inode: InodeId) -> Result<(), ClientError> {
        self.on_home(
            inode,
            |meta| async move { meta.apply_truncate(inode).await },
        )
        .await
    }
}

/// What [`Client::create_entry`] answers.
#[derive(Clone, Debug)]
pub struct Created {
    /// The new entry.
    pub attr: InodeAttr,
    /// The directory after the change, when its server could tell (its entries are not
    /// spread over several servers).
    pub parent: Option<InodeAttr>,
}

/// What to create for a directory with `mode` (masked by `umask` unless the parent has a
/// default ACL) owned by (uid, gid).
pub fn directory(mode: u32, umask: u32, (uid, gid): (u32, u32)) -> NewInode {
    NewInode {
        kind: FileKind::Directory,
        mode,
        uid,
        gid,
        umask,
        rdev: 0,
        symlink: None,
    }
}

/// What to create for a regular file with `mode` (masked by `umask` unless the parent has a
/// default ACL) owned by (uid, gid).
pub fn regular_file(mode: u32, umask: u32, owner: (u32, u32)) -> NewInode {
    NewInode {
        kind: FileKind::Regular,
        ..directory(mode, umask, owner)
    }
}

/// The host name, as the session's alias.
fn weft_service_free_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|n| n.trim().to_string())
        .unwrap_or_else(|_| "client".into())
}

impl crate::io::DataSession for Client {
    fn session(&self) -> &Session {
        &self.session
    }

    fn reopen(&self, inode: InodeId, want: u8) -> BoxFuture<'_, Result<bool, ClientError>> {
        Box::pin(async move {
            let Some((handle, (access, caller))) = self.session.opens.handle_for(inode, want)
            else {
                return Ok(false);
            };
            weft_net::stubs::acting_for(caller, self.open(inode, handle, access)).await?;
            Ok(true)
        })
    }

    fn apply_truncate(&self, inode: InodeId) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(Client::apply_truncate(self, inode))
    }
}
