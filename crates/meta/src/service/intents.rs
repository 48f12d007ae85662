//! Operations that span metadata servers (mkdir and rmdir of a directory placed elsewhere,
//! links, unlinks, renames and exchanges across servers, spread directories): their
//! orchestration through intents recorded by the coordinator (the transaction steps are in
//! `ops::remote`), recovery of intents a crash left, and the calls to other servers.

use super::work::{TARGET_RETRY, WORK_RETRY_INTERVAL};
use super::{rpc_error, Meta};
use crate::ops::lookup::get_attr;
use crate::ops::remote::{
    finish_exchange, finish_link, finish_mkdir, finish_rename_out, finish_rmdir, finish_unlink,
    intents, prepare_exchange, prepare_link, prepare_mkdir, prepare_rename_out, prepare_rmdir,
    prepare_unlink, settled_below, Intent, IntentOp, Prepared,
};
use crate::ops::remove::{rmdir, unlink};
use crate::ops::rename::{rename, RenameArgs, PATH_DEPTH_MAX};
use crate::store::{OpError, INODES};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, InodeAttr, MetaRequest, MutationId, NewInode, Response};
use weft_proto::ErrorCode;

/// Longest a directory rename waits for the cluster-wide rename lock.
pub(super) const RENAME_LOCK_WAIT: Duration = Duration::from_secs(45);

/// Who runs a home's intents now. More than one may run the same intent at once (a client's
/// retry finds its intent open and runs it too, recovery may be at it): the others' steps may
/// still be on their way when one of them finishes it, so the other homes are told it settled
/// only once none runs it ([`Meta::tell_settled`]).
#[derive(Default)]
pub(super) struct IntentRuns(Mutex<Runs>);

#[derive(Default)]
pub(super) struct Runs {
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
pub(super) struct Preparing<'a>(&'a IntentRuns);

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
pub(super) struct Running<'a>(&'a IntentRuns, u64);

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

impl Meta {
    /// Attributes of an inode on another metadata server.
    pub(super) async fn remote_attr(&self, inode: InodeId) -> Result<Response, OpError> {
        let meta = self.cluster.meta(inode.home()).await.map_err(rpc_error)?;
        Ok(Response::Attr(
            meta.get_attr(inode).await.map_err(rpc_error)?,
        ))
    }

    /// The attributes of `inode`, from this server's store or from its home.
    pub(super) async fn attr_of(&self, inode: InodeId) -> Result<InodeAttr, OpError> {
        let response = if inode.home() == self.node {
            self.read(|txn| get_attr(txn, inode))?
        } else {
            self.remote_attr(inode).await?
        };
        match response {
            Response::Attr(attr) => Ok(attr),
            other => Err(OpError::Store(format!(
                "the attributes of {inode} came back as {other:?}"
            ))),
        }
    }

    /// mkdir of a directory placed on `home`: intent, remote inode, dentry (see `ops::remote`).
    pub(super) async fn remote_mkdir(
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
    pub(super) async fn mkdir_spread(
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
    pub(super) async fn inherited_spread(&self, parent: InodeId) -> Option<u16> {
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
    pub(super) async fn shards_of_child(
        &self,
        parent: InodeId,
        name: &str,
    ) -> Result<Vec<InodeId>, OpError> {
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
    pub(super) async fn sync_shards(&self, dir: InodeId) {
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

    pub(super) async fn try_sync_shards(&self, dir: InodeId) -> Result<(), OpError> {
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
    pub(super) async fn seal_shards(
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
    pub(super) async fn ask_meta(
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
    pub(super) async fn call_meta(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<Response, OpError> {
        self.ask_meta(node, request).await?
    }

    /// [`Meta::call_meta`] for a step that answers with attributes.
    pub(super) async fn call_meta_attr(
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
    pub(super) async fn mark_renamed(
        &self,
        inode: InodeId,
        parent: InodeId,
    ) -> Result<(), OpError> {
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
    pub(super) async fn drop_replaced(&self, id: u64, victim: InodeId) -> Result<(), OpError> {
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
    pub(super) async fn remove_remote_dir(
        &self,
        inode: InodeId,
    ) -> Result<Result<(), OpError>, OpError> {
        let request = MetaRequest::RemoveDirInode { inode };
        Ok(self.ask_meta(inode.home(), request).await?.map(|_| ()))
    }

    /// rmdir: local in one transaction, or with an intent when the directory lives elsewhere.
    pub(super) async fn rmdir(
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
    pub(super) async fn remote_link(
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
    pub(super) async fn unlink(
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
    pub(super) async fn rename(
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
    pub(super) async fn exchange_out(
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
    pub(super) async fn rename_local(
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
    pub(super) async fn is_ancestor_anywhere(
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
            dir = self.attr_of(dir).await?.parent;
        }
        Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "directory tree too deep",
        ))
    }

    /// A rename of a non-directory into a directory on another server (see `ops::remote`).
    pub(super) async fn rename_out(
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
    pub(super) async fn adjust_remote_links(
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
    pub(super) async fn finish_intent(&self, id: u64, intent: Intent) -> Result<Response, OpError> {
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
    pub(super) async fn drive(
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
    pub(super) async fn recover_intents(&self) {
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
    pub(super) async fn tell_settled(&self) {
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
}
