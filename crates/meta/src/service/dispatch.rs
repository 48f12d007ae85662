//! Request dispatch: every metadata request to the function or protocol that serves it.

use super::intents::exchange::exchange_dentry;
use super::intents::link::adjust_links;
use super::intents::mkdir::create_dir_inode;
use super::intents::mkdir::Placement;
use super::intents::rename::insert_dentry_for;
use super::intents::rmdir::remove_dir_inode;
use super::intents::spread::{seal_shard, set_shards, sync_shard};
use super::sessions::register_open;
use super::Meta;
use crate::locks::{check_range, LockRefusal, LOCK_RANGES_PER_SESSION_MAX};
use crate::ops::check::remote_references;
use crate::ops::create::{create, link, NewEntry};
use crate::ops::intent::settle_intents;
use crate::ops::lookup::{get_attr, lookup, read_dir, read_dir_plus, read_link};
use crate::ops::rename::renamed;
use crate::ops::setattr::{report_size, set_attr, set_pattern};
use crate::ops::xattr::{get_xattr, list_xattr, remove_xattr, set_xattr};
use crate::schema::{OpError, INODES, UNREPORTED};
use std::sync::Arc;
use std::time::Duration;
use weft_proto::access::{READ, WRITE};
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::messages::{
    FileKind, MetaRequest, MetaResponse, MutationId, Reply, LOCK_WAIT_MS_MAX,
};
use weft_proto::ErrorCode;

/// How long a truncate waits here for the last copies of its file's move before its client is
/// told to ask again (`Unavailable`): well within a request's deadline.
const TRUNCATE_WAITS_FOR_MOVE: Duration = Duration::from_secs(10);

impl Meta {
    pub(super) async fn handle_meta(&self, request: MetaRequest) -> Reply<MetaResponse> {
        if let Some((dir, adder)) = super::names::adds_name(&request) {
            self.names.clear_for(dir, adder).await;
        }
        let result = match request {
            request @ (MetaRequest::Lookup { .. }
            | MetaRequest::GetAttr { .. }
            | MetaRequest::ReadDir { .. }
            | MetaRequest::ReadDirPlus { .. }
            | MetaRequest::ReadLink { .. }
            | MetaRequest::GetXattr { .. }
            | MetaRequest::ListXattr { .. }) => self.serve_read(request).await,
            MetaRequest::Create {
                mutation,
                parent,
                name,
                new,
                open,
            } => {
                let entry = NewEntry { parent, name, new };
                return self.create_request(mutation, entry, open).await;
            }
            MetaRequest::CreateSpread {
                mutation,
                parent,
                name,
                new,
                shards,
            } => {
                let entry = NewEntry { parent, name, new };
                return self.create_spread_request(mutation, entry, shards).await;
            }
            MetaRequest::Link {
                mutation,
                inode,
                new_parent,
                new_name,
            } => {
                return self
                    .link_request(mutation, inode, (new_parent, new_name))
                    .await
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
            request @ (MetaRequest::SetAttr { .. }
            | MetaRequest::SetXattr { .. }
            | MetaRequest::RemoveXattr { .. }
            | MetaRequest::SetPattern { .. }) => return self.attributes_request(request).await,
            request @ (MetaRequest::Open { .. }
            | MetaRequest::Release { .. }
            | MetaRequest::Reserve { .. }
            | MetaRequest::ReportSize { .. }
            | MetaRequest::ApplyTruncate { .. }
            | MetaRequest::SetLock { .. }
            | MetaRequest::GetLock { .. }
            | MetaRequest::LockEpoch) => return self.serve_file_request(request).await,
            request @ (MetaRequest::SetShards { .. }
            | MetaRequest::SealShard { .. }
            | MetaRequest::SyncShard { .. }
            | MetaRequest::Renamed { .. }
            | MetaRequest::CreateDirInode { .. }
            | MetaRequest::ExchangeDentry { .. }
            | MetaRequest::InsertDentry { .. }
            | MetaRequest::AdjustLinks { .. }
            | MetaRequest::IntentsSettled { .. }
            | MetaRequest::RemoveDirInode { .. }
            | MetaRequest::RemoteReferences
            | MetaRequest::Check { .. }
            | MetaRequest::CheckProgress
            | MetaRequest::QuotaUsage
            | MetaRequest::Migrate { .. }
            | MetaRequest::ReplicaApply { .. }) => self.serve_member_step(request).await,
            MetaRequest::SyncHome {
                incarnation,
                number,
            } => self.sync_home(incarnation, number).await,
            MetaRequest::Replay {
                client,
                changes,
                done,
            } => self.replay(client, changes, done).await,
        };
        result.map_err(OpError::into_wire)
    }

    /// Serves a change of attributes: of an inode's, of an extended attribute, of a
    /// directory's pattern.
    async fn attributes_request(&self, request: MetaRequest) -> Reply<MetaResponse> {
        let changed = match request {
            MetaRequest::SetAttr {
                mutation,
                inode,
                changes,
                granted: _,
            } => return self.set_attr_request(mutation, inode, changes).await,
            MetaRequest::SetPattern {
                mutation,
                dir,
                pattern,
            } => self.set_pattern_request(mutation, dir, pattern).await,
            MetaRequest::SetXattr {
                mutation,
                inode,
                name,
                value,
                mode,
            } => {
                let set = move |txn: &crate::store::WriteTransaction, name: &str| {
                    set_xattr(txn, inode, name, &value, mode)
                };
                self.change_xattr(mutation, (inode, name), set).await
            }
            MetaRequest::RemoveXattr {
                mutation,
                inode,
                name,
            } => {
                let remove = move |txn: &crate::store::WriteTransaction, name: &str| {
                    remove_xattr(txn, inode, name)
                };
                self.change_xattr(mutation, (inode, name), remove).await
            }
            _ => unreachable!("only changes of attributes come here"),
        };
        changed.map_err(OpError::into_wire)
    }

    /// Serves a read of the namespace: a lookup, attributes, a directory's entries, a
    /// link's target, extended attributes.
    async fn serve_read(&self, request: MetaRequest) -> Result<MetaResponse, OpError> {
        match request {
            MetaRequest::Lookup { parent, name } => {
                let home = self.node;
                match self.read(|txn| lookup(txn, home, parent, &name)) {
                    // The child is a directory placed on another server: ask it.
                    Ok(MetaResponse::Inodes(children)) => self.remote_attr(children[0]).await,
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
            MetaRequest::ReadDirPlus {
                dir,
                shards,
                after_cookie,
                max_entries,
            } => {
                let (home, at) = (self.node, after_cookie);
                self.read(|txn| read_dir_plus(txn, home, (dir, shards), at, max_entries))
            }
            MetaRequest::ReadLink { inode } => self.read(|txn| read_link(txn, inode)),
            MetaRequest::GetXattr { inode, name } => self.read(|txn| get_xattr(txn, inode, &name)),
            MetaRequest::ListXattr { inode } => self.read(|txn| list_xattr(txn, inode)),
            _ => unreachable!("only reads come here"),
        }
    }

    /// Serves a request about a session's open files: opens and releases, room to grow and
    /// size reports, pending truncates, and locks.
    async fn serve_file_request(&self, request: MetaRequest) -> Reply<MetaResponse> {
        let result = match request {
            MetaRequest::SetLock {
                client,
                inode,
                lock,
                wait_ms,
                reclaim,
            } => return self.set_lock((client, inode), lock, wait_ms, reclaim).await,
            MetaRequest::GetLock {
                client,
                inode,
                lock,
            } => {
                check_range(&lock)?;
                Ok(MetaResponse::LockConflict(
                    self.locks.conflict(inode, client, &lock),
                ))
            }
            MetaRequest::LockEpoch => Ok(MetaResponse::LockEpoch(self.locks.epoch())),
            MetaRequest::ApplyTruncate { inode } => self
                .apply_truncate(inode)
                .await
                .map(|()| MetaResponse::Done)
                .map_err(OpError::Rejected),
            MetaRequest::ReportSize {
                inode,
                report,
                client,
                ..
            } => {
                // A home that answers before the sync numbers the report as its client's
                // change (unless the client waits for the disk): a later change of the file's
                // inode or of its owner's usage, which the client replays, holds its effect.
                let numbering = client
                    .filter(|_| self.answers_before_sync && !report.durable)
                    .map(|client| {
                        let mutation = MutationId {
                            client,
                            seq: 0,
                            oldest_pending: 0,
                        };
                        (self.numbering(), mutation)
                    });
                let numbered = numbering.is_some();
                let op: crate::commit::EventualOp = Box::new(move |txn| match numbering {
                    Some(((start, proofs), mutation)) => {
                        super::numbered::numbered(txn, start, (mutation, proofs.as_ref()), |txn| {
                            report_size(txn, inode, report).map(|(response, _)| response)
                        })
                    }
                    None => report_size(txn, inode, report),
                });
                // A numbered report is a client's change; one a client waits for the disk
                // for is synced, off the request's thread.
                let reported = if numbered {
                    self.committer.run_client_change(op).await
                } else {
                    self.committer.run_eventual(op).await
                }
                .map(super::numbered::keep);
                if reported.is_ok() {
                    self.recount_rooms(inode);
                }
                reported
            }
            MetaRequest::Reserve {
                client,
                handle,
                inode,
                to,
            } => self.reserve((client, handle), inode, to).await,
            MetaRequest::Open {
                client,
                handle,
                inode,
                access,
                granted: _,
            } => self.open((client, handle), inode, access),
            MetaRequest::Release { client, handles } => self.release_handles(client, handles).await,
            _ => unreachable!("only file requests come here"),
        };
        result.map_err(OpError::into_wire)
    }

    /// Serves a request only the cluster's members send: a step of another home's
    /// cross-server operation, a check, a move, a quota report.
    async fn serve_member_step(&self, request: MetaRequest) -> Result<MetaResponse, OpError> {
        match request {
            MetaRequest::SetShards { dir, shards } => {
                self.step(move |txn| set_shards(txn, dir, &shards)).await
            }
            MetaRequest::SealShard {
                shard,
                coordinator,
                intent,
                seal,
            } => {
                self.step(move |txn| seal_shard(txn, shard, (coordinator, intent), seal))
                    .await
            }
            request @ MetaRequest::SyncShard { .. } => {
                self.step(move |txn| sync_shard(txn, &request)).await
            }
            MetaRequest::Renamed { inode, parent } => {
                self.step(move |txn| renamed(txn, inode, parent)).await
            }
            MetaRequest::Check { repair, referenced } => {
                let checked = self.check(repair, referenced).await;
                self.check_progress
                    .lock()
                    .expect("progress poisoned")
                    .running = false;
                checked
            }
            MetaRequest::CheckProgress => Ok(MetaResponse::CheckProgress(
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
                self.step(move |txn| create_dir_inode(txn, home, &request))
                    .await
            }
            request @ MetaRequest::ExchangeDentry { .. } => {
                self.step(move |txn| exchange_dentry(txn, &request)).await
            }
            request @ MetaRequest::InsertDentry { .. } => {
                let home = self.node;
                let is_open = self.is_open_fn();
                self.step(move |txn| insert_dentry_for(txn, home, &request, is_open))
                    .await
            }
            MetaRequest::AdjustLinks {
                coordinator,
                intent,
                inode,
                delta,
            } => {
                let is_open = self.is_open_fn();
                self.step(move |txn| adjust_links(txn, coordinator, intent, inode, delta, is_open))
                    .await
            }
            MetaRequest::IntentsSettled { coordinator, below } => {
                self.step(move |txn| settle_intents(txn, coordinator, below))
                    .await
            }
            MetaRequest::RemoveDirInode { inode } => {
                self.step(move |txn| remove_dir_inode(txn, inode)).await
            }
            MetaRequest::QuotaUsage => self.quota_usage().map(MetaResponse::QuotaUsage),
            MetaRequest::Migrate {
                inode,
                pool,
                targets,
                pattern,
            } => self.migrate(inode, pool, targets, pattern).await,
            MetaRequest::ReplicaApply { .. } => Err(OpError::Rejected(WireError::new(
                ErrorCode::Internal,
                "shipped store changes reached a home's handler",
            ))),
            _ => unreachable!("only members' requests come here"),
        }
    }

    /// Serves a create: here, or a directory on the home its chooser picks, or spread over
    /// several; a regular file opened for the mutation's client with handle `open`.
    async fn create_request(
        &self,
        mutation: MutationId,
        NewEntry { parent, name, new }: NewEntry,
        open: Option<u64>,
    ) -> Reply<MetaResponse> {
        let result: Result<MetaResponse, OpError> = {
            if new.kind == FileKind::Regular {
                self.map_for(&self.parent_pattern(parent).0, std::time::Instant::now())
                    .await;
            }
            // A new inode counts in its owner's hard inode limits from its check here to
            // its commit, on whichever home makes it.
            let _charged = self
                .charge_new_inode(mutation, parent, &new)
                .await
                .map_err(OpError::into_wire)?;
            if new.kind == FileKind::Directory {
                // A parent with a default spread makes every new subdirectory spread.
                if let Some(shards) = self.inherited_spread(parent).await {
                    self.admits_directory(parent, &new)?;
                    return self
                        .mkdir_spread(mutation, NewEntry { parent, name, new }, shards)
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
                // A names lease for the client that makes a directory whose names live
                // here, granted in the commit that makes it: no one else can add a name
                // to it before the lease is known.
                let leasing = (new.kind == FileKind::Directory
                    && !self.link.mirrored()
                    && weft_net::server::peer_version() >= 15)
                    .then(|| (Arc::clone(&self.names), mutation.client));
                let entry = NewEntry { parent, name, new };
                // The open is registered before the commit, so no unlink can dispose of
                // the new file between the two; and again after it, for a retry answered
                // from the stored reply.
                let opens = Arc::clone(&self.sessions.opens);
                let mut result = self
                    .mutate(mutation, move |txn, context| {
                        let mut response = create(txn, context, entry)?;
                        if let (Some(handle), MetaResponse::Created { attr, .. }) =
                            (open, &response)
                        {
                            register_open(&opens, handle, attr.inode, READ | WRITE);
                            txn.open_table(UNREPORTED)?.insert(attr.inode.0, ())?;
                        }
                        if let (
                            Some((names, holder)),
                            MetaResponse::Created { attr, lease_ms, .. },
                        ) = (leasing, &mut response)
                        {
                            *lease_ms = names.grant(attr.inode, holder);
                        }
                        Ok(response)
                    })
                    .await;
                if let (Some(handle), Ok(MetaResponse::Created { attr, .. })) = (open, &result) {
                    register_open(&self.sessions.opens, handle, attr.inode, READ | WRITE);
                }
                if let Ok(MetaResponse::Created {
                    parent_lease_ms, ..
                }) = &mut result
                {
                    *parent_lease_ms = self.names.renew(parent, mutation.client);
                }
                result
            } else {
                self.admits_directory(parent, &new)?;
                let placement = Placement {
                    home,
                    shard_homes: Vec::new(),
                };
                self.remote_mkdir(mutation, NewEntry { parent, name, new }, placement)
                    .await
            }
        };
        result.map_err(OpError::into_wire)
    }

    /// Serves a create of a directory whose entries spread over several homes.
    async fn create_spread_request(
        &self,
        mutation: MutationId,
        entry: NewEntry,
        shards: u16,
    ) -> Reply<MetaResponse> {
        self.admits_directory(entry.parent, &entry.new)?;
        let _charged = self
            .charge_new_inode(mutation, entry.parent, &entry.new)
            .await
            .map_err(OpError::into_wire)?;
        self.mkdir_spread(mutation, entry, shards)
            .await
            .map_err(OpError::into_wire)
    }

    /// Serves a hard link: here when the inode is this home's, else by the cross-server
    /// protocol with the inode's home.
    async fn link_request(
        &self,
        mutation: MutationId,
        inode: InodeId,
        (new_parent, new_name): (InodeId, String),
    ) -> Reply<MetaResponse> {
        let linked = if inode.home() == self.node {
            self.mutate(mutation, move |txn, _| {
                link(txn, inode, new_parent, &new_name)
            })
            .await
        } else {
            self.check_project(inode, new_parent)
                .await
                .map_err(OpError::into_wire)?;
            self.remote_link(mutation, inode, new_parent, new_name)
                .await
        };
        linked.map_err(OpError::into_wire)
    }

    /// Serves an attribute change; a truncate waits for the last copies of its file's move,
    /// then reaches the targets.
    async fn set_attr_request(
        &self,
        mutation: MutationId,
        inode: InodeId,
        changes: weft_proto::messages::AttrChanges,
    ) -> Reply<MetaResponse> {
        let result: Result<MetaResponse, OpError> = {
            let _charged = self
                .charge_truncate(mutation, inode, changes.size)
                .await
                .map_err(OpError::into_wire)?;
            // A truncate of a file making the last copies of its move waits for them
            // (`Busy`, kept as no answer), and asks again.
            let started = std::time::Instant::now();
            let result = loop {
                let result = self
                    .mutate(mutation, move |txn, context| {
                        set_attr(txn, inode, changes, &context.map)
                    })
                    .await;
                match &result {
                    Err(OpError::Rejected(error))
                        if error.code == ErrorCode::Busy && changes.size.is_some() =>
                    {
                        if started.elapsed() > TRUNCATE_WAITS_FOR_MOVE {
                            break Err(OpError::Rejected(WireError::new(
                                ErrorCode::Unavailable,
                                error.message.clone(),
                            )));
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    _ => break result,
                }
            };
            if result.is_ok() && changes.size.is_some() {
                self.recount_rooms(inode);
            }
            if let Ok(MetaResponse::Attr(attr)) = &result {
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
        };
        result.map_err(OpError::into_wire)
    }

    /// Serves a lock of a range of `inode` for session `client`, waiting up to `wait_ms`.
    async fn set_lock(
        &self,
        (client, inode): (weft_proto::ids::ClientId, InodeId),
        lock: weft_proto::messages::LockRange,
        wait_ms: u32,
        reclaim: bool,
    ) -> Reply<MetaResponse> {
        let result: Result<MetaResponse, OpError> = {
            self.admit_session(client).map_err(OpError::into_wire)?;
            check_range(&lock)?;
            let wait = Duration::from_millis(u64::from(wait_ms.min(LOCK_WAIT_MS_MAX)));
            match self.locks.set(inode, client, lock, wait, reclaim).await {
                Ok(()) => Ok(MetaResponse::Done),
                Err(LockRefusal::Conflict(held)) => Err(OpError::rejected(
                    ErrorCode::WouldBlock,
                    format!("a conflicting lock is held by process {}", held.pid),
                )),
                Err(LockRefusal::InGrace) => Err(OpError::rejected(
                    ErrorCode::InGrace,
                    "locks are being reclaimed after a restart; ask again",
                )),
                Err(LockRefusal::TooMany) => Err(OpError::rejected(
                    ErrorCode::TooManyLocks,
                    format!(
                        "session {client} would hold more than {LOCK_RANGES_PER_SESSION_MAX} locked ranges of {inode}: release or merge some"
                    ),
                )),
            }
        };
        result.map_err(OpError::into_wire)
    }

    /// Commits one step another server asked for (a cross-server operation's, a check's):
    /// no mutation id, its own reply kept by its caller's intent.
    async fn step(
        &self,
        op: impl FnOnce(&crate::store::WriteTransaction) -> Result<MetaResponse, OpError>
            + Send
            + 'static,
    ) -> Result<MetaResponse, OpError> {
        self.committer.run(Box::new(op)).await
    }

    /// Serves a change of an extended attribute of `inode` named `name`: one inherited by
    /// new entries (a default ACL, a default spread) reaches the directory's other shards.
    async fn change_xattr(
        &self,
        mutation: MutationId,
        (inode, name): (InodeId, String),
        change: impl FnOnce(&crate::store::WriteTransaction, &str) -> Result<MetaResponse, OpError>
            + Send
            + 'static,
    ) -> Result<MetaResponse, OpError> {
        let inherited = name == crate::acl::ACL_DEFAULT || name == crate::acl::DIR_SPREAD;
        let result = self
            .mutate(mutation, move |txn, _| change(txn, &name))
            .await;
        if result.is_ok() && inherited {
            self.sync_shards(inode).await;
        }
        result
    }

    /// Serves a change of directory `dir`'s pattern, which reaches its other shards.
    async fn set_pattern_request(
        &self,
        mutation: MutationId,
        dir: InodeId,
        pattern: weft_proto::layout::StripePattern,
    ) -> Result<MetaResponse, OpError> {
        let slots = self.pool_slots_for(&pattern).await?;
        let result = self
            .mutate(mutation, move |txn, _| {
                set_pattern(txn, dir, pattern, slots)
            })
            .await;
        if result.is_ok() {
            self.sync_shards(dir).await;
        }
        result
    }

    /// Serves a release of session `client`'s `handles`: every one is released even if one
    /// fails, and the failure is the answer.
    async fn release_handles(
        &self,
        client: weft_proto::ids::ClientId,
        handles: Vec<(InodeId, u64)>,
    ) -> Result<MetaResponse, OpError> {
        let mut released = Ok(MetaResponse::Done);
        for (inode, handle) in handles {
            if let Err(error) = self.release((client, handle), inode).await {
                released = Err(error);
            }
        }
        released
    }

    /// How many slots `pattern`'s pool has (targets, or storage mirror groups for a mirrored
    /// pattern), by [`Meta::map_for`].
    ///
    /// # Errors
    /// InvalidArgument when the pool does not exist.
    async fn pool_slots_for(
        &self,
        pattern: &weft_proto::layout::StripePattern,
    ) -> Result<usize, OpError> {
        let map = self.map_for(pattern, std::time::Instant::now()).await;
        if map.pool(pattern.pool).is_none() {
            return Err(OpError::rejected(
                ErrorCode::InvalidArgument,
                format!(
                    "storage pool {} does not exist (weft pool list)",
                    pattern.pool
                ),
            ));
        }
        let mirrored = pattern.kind == weft_proto::layout::PatternKind::Mirrored;
        Ok(map.pool_slots(pattern.pool, mirrored))
    }

    /// The stripe pattern of directory `parent`, or the default one.
    /// Refuses a directory made through an intent (on another server, or spread) whose
    /// creator or project is over its inode quota in the pool (a local create checks in its
    /// transaction).
    fn admits_directory(
        &self,
        parent: InodeId,
        new: &weft_proto::messages::NewInode,
    ) -> Result<(), weft_proto::error::WireError> {
        let (pattern, project) = self.parent_pattern(parent);
        let owner = weft_proto::quota::Owner {
            uid: new.uid,
            gid: new.gid,
            project,
        };
        match self.cluster.map().quota_refusal(
            owner,
            pattern.pool,
            weft_proto::quota::Growth::Inode,
        ) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    /// Counts the inode `new` makes in `parent` against this home's grants of its owner's,
    /// group's and project's hard inode limits, until the guard drops; refuses it at a limit.
    async fn charge_new_inode(
        &self,
        mutation: MutationId,
        parent: InodeId,
        new: &weft_proto::messages::NewInode,
    ) -> Result<Option<super::grants::Charged>, OpError> {
        if self.cluster.map().quota_hard.is_empty() || self.answered_before(mutation)? {
            return Ok(None);
        }
        let (pattern, project) = self.parent_pattern(parent);
        let owner = weft_proto::quota::Owner {
            uid: new.uid,
            gid: new.gid,
            project,
        };
        self.charge(owner, pattern.pool, (0, 1)).await
    }

    /// Counts the growth of an extending truncate of `inode` to `size` against this home's
    /// grants of its owner's hard byte limits, until the guard drops; refuses it at a limit.
    async fn charge_truncate(
        &self,
        mutation: MutationId,
        inode: InodeId,
        size: Option<u64>,
    ) -> Result<Option<super::grants::Charged>, OpError> {
        let Some(size) = size else {
            return Ok(None);
        };
        if self.cluster.map().quota_hard.is_empty() || self.answered_before(mutation)? {
            return Ok(None);
        }
        let Ok(record) =
            self.read(|txn| crate::schema::load_inode(&txn.open_table(INODES)?, inode))
        else {
            return Ok(None);
        };
        if size <= record.size || record.kind != FileKind::Regular {
            return Ok(None);
        }
        self.charge(
            record.owner(),
            crate::schema::usage::pool_of(&record),
            (size - record.size, 0),
        )
        .await
    }

    /// The stripe pattern and the project new entries of `parent` take.
    pub(super) fn parent_pattern(
        &self,
        parent: InodeId,
    ) -> (weft_proto::layout::StripePattern, u32) {
        let record = self
            .read(|txn| crate::schema::load_dir(&txn.open_table(INODES)?, parent))
            .ok();
        (
            record
                .as_ref()
                .and_then(|record| record.pattern)
                .unwrap_or(weft_proto::layout::StripePattern::DEFAULT),
            record.map_or(0, |record| record.project),
        )
    }

    /// The cluster map, fetched again when it does not know `pattern`'s pool or holds fewer
    /// targets (mirror groups, for a mirrored pattern) than the pattern wants: a pool made,
    /// targets registered or groups made since the map came would otherwise be left out of
    /// files created right after. The fetch must have started after the request arrived
    /// (`arrived`); concurrent callers share it. A pool that really is smaller than the
    /// pattern pays one round trip to management per batch of creates.
    async fn map_for(
        &self,
        pattern: &weft_proto::layout::StripePattern,
        arrived: std::time::Instant,
    ) -> std::sync::Arc<weft_proto::messages::ClusterMap> {
        let map = self.cluster.map();
        let mirrored = pattern.kind == weft_proto::layout::PatternKind::Mirrored;
        // Groups made since the map was fetched count too.
        if map.pool(pattern.pool).is_some()
            && map.pool_slots(pattern.pool, mirrored) >= usize::from(pattern.num_targets)
        {
            return map;
        }
        self.cluster.refresh_unless_fetched_since(arrived).await;
        self.cluster.map()
    }
}
