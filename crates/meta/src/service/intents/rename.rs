//! rename: local in one transaction, or into a directory on another server, coordinated by the
//! server of the old name: (1) record the intent; (2) the new name's server inserts the dentry,
//! once per intent, replacing a victim (a file victim living elsewhere loses its link at its
//! home; a directory victim on a third server is sealed first, only if empty, then removed);
//! (3) a moved inode's home learns its new parent; (4) the old name goes with the intent and
//! the reply. A directory moving to another parent first takes the cluster-wide rename lock and
//! checks across servers that it is not moved into its own subtree.

use super::exchange::Exchange;
use crate::ops::intent::{
    check_not_in_flight, check_unsettled, earlier, entry_to_change, record_intent, Intent,
    IntentOp, Prepared, RenameIntent,
};
use crate::ops::rename::{
    check_kinds_match, mark_renamed, rename, too_deep, walk_ends_at, RenameArgs, PATH_DEPTH_MAX,
};
use crate::schema::{
    dir_is_empty, insert_dentry, load_dentry, load_dir, now, remove_dentry, store_inode, take_name,
    OpError, ENTRIES, INODES, REMOTE_CREATED, XATTRS,
};
use crate::service::targets::TARGET_RETRY;
use crate::service::{rpc_error, Meta};
use crate::store::{ReadableTable, WriteTransaction};
use std::time::Duration;
use weft_net::MetaCalls;
use weft_net::MgmtCalls;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// Rename step (1) to a directory on another server: checks the source and records the intent.
pub(crate) fn prepare_rename_out(
    txn: &WriteTransaction,
    mutation: MutationId,
    parent: InodeId,
    name: &str,
    new_parent: InodeId,
    new_name: &str,
    flags: weft_proto::messages::RenameFlags,
) -> Result<Prepared, OpError> {
    if let Some(prepared) = earlier(txn, mutation)? {
        return Ok(prepared);
    }
    crate::schema::check_name(new_name)?;
    let dentry = entry_to_change(txn, mutation, parent, name)?;
    let intent = Intent {
        mutation,
        op: IntentOp::RenameOut(RenameIntent {
            parent,
            name: name.to_string(),
            child: dentry.child,
            kind_code: crate::schema::kind_code(dentry.kind),
            new_parent,
            new_name: new_name.to_string(),
            no_replace: flags.no_replace,
        }),
    };
    let id = record_intent(txn, &intent)?;
    Ok(Prepared::Intent(id, intent))
}

/// Rename step (2), on the server of the new name: inserts the dentry once per (coordinator,
/// intent), replacing a file victim; a victim whose inode lives here loses its link here, one
/// whose inode lives elsewhere is returned (`Inodes`) for the coordinator to drop its link
/// there. `Unchanged` when the new name already names the inode.
pub(crate) fn insert_dentry_for(
    txn: &WriteTransaction,
    home: NodeId,
    request: &MetaRequest,
    is_open: impl Fn(InodeId) -> bool,
) -> Result<MetaResponse, OpError> {
    let MetaRequest::InsertDentry {
        coordinator,
        intent,
        parent,
        name,
        child,
        kind,
        no_replace,
        sealed_victim,
        project,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a dentry insertion",
        ));
    };
    check_unsettled(txn, *coordinator, *intent)?;
    crate::schema::check_name(name)?;
    // The marker keeps the replaced victim whose link its own home must drop (0: none).
    let key = (coordinator.0, *intent | (1 << 62));
    if let Some(victim) = txn.open_table(REMOTE_CREATED)?.get(key)? {
        return Ok(victim_response(victim.value()));
    }
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut entries = txn.open_table(ENTRIES)?;
    let mut parent_record = load_dir(&inodes, *parent)?;
    if parent_record.nlink == 0 {
        return Err(OpError::rejected(
            ErrorCode::NotFound,
            "the directory was removed",
        ));
    }
    parent_record.accepts_new_name(*parent, name)?;
    crate::ops::check_project(parent_record.project, *project)?;
    let mut replaced_elsewhere = 0;
    let mut replaced_dir = false;
    if let Some(victim) = load_dentry(&entries, *parent, name)? {
        if victim.child == *child {
            return Ok(MetaResponse::Unchanged);
        }
        if *no_replace {
            return Err(OpError::rejected(
                ErrorCode::Exists,
                format!("{name:?} already exists"),
            ));
        }
        check_not_in_flight(txn, *parent, name, None)?;
        let victim_is_dir = victim.kind == FileKind::Directory;
        check_kinds_match(*kind == FileKind::Directory, victim_is_dir, name)?;
        if victim_is_dir {
            check_dir_victim(
                (&inodes, &entries),
                home,
                (name, victim.child),
                *sealed_victim,
            )?;
        }
        replaced_dir = victim_is_dir;
        remove_dentry(&mut entries, *parent, victim)?;
        if replaced_dir && victim.child.home() == home {
            inodes.remove(victim.child)?;
            crate::ops::xattr::remove_all(&mut txn.open_table(XATTRS)?, victim.child)?;
        } else if victim.child.home() == home {
            let victim_record = crate::schema::load_inode(&inodes, victim.child)?;
            crate::ops::remove::drop_link(
                txn,
                &mut inodes,
                (victim.child, Some(*parent)),
                victim_record,
                is_open(victim.child),
            )?;
        } else {
            replaced_elsewhere = victim.child.0;
        }
    }
    insert_dentry(&mut entries, *parent, &parent_record, name, *child, *kind)?;
    if *kind == FileKind::Directory && !replaced_dir {
        // The moved directory's `..` now names this directory (a replaced one's did).
        parent_record.nlink += 1;
    }
    let timestamp = now();
    parent_record.touch(timestamp);
    store_inode(&mut inodes, *parent, &parent_record)?;
    drop((inodes, entries));
    txn.open_table(REMOTE_CREATED)?
        .insert(key, replaced_elsewhere)?;
    Ok(victim_response(replaced_elsewhere))
}

/// Whether the directory `victim`, named `name`, may be replaced by a rename step on this
/// server (`home`): one that lives here must be empty and not spread; one that lives
/// elsewhere must be the one the coordinator sealed (`sealed`), or the entry changed meanwhile.
fn check_dir_victim(
    (inodes, entries): (
        &crate::schema::usage::Inodes<'_>,
        &crate::schema::Entries<'_>,
    ),
    home: NodeId,
    (name, victim): (&str, InodeId),
    sealed: Option<InodeId>,
) -> Result<(), OpError> {
    if victim.home() != home {
        if sealed != Some(victim) {
            return Err(OpError::rejected(
                ErrorCode::Busy,
                format!("{name:?} changed during the rename; try again"),
            ));
        }
        return Ok(());
    }
    let record = crate::schema::load_inode(inodes, victim)?;
    if !record.shards.is_empty() {
        return Err(OpError::rejected(
            ErrorCode::CrossDevice,
            format!("{name:?} is a spread directory: remove it first"),
        ));
    }
    if !dir_is_empty(entries, victim)? {
        return Err(OpError::rejected(
            ErrorCode::NotEmpty,
            format!("{name:?} is not empty"),
        ));
    }
    Ok(())
}

/// `Inodes([victim])` when a replaced victim's link must still be dropped at its own home.
fn victim_response(victim: u64) -> MetaResponse {
    if victim == 0 {
        MetaResponse::Done
    } else {
        MetaResponse::Inodes(vec![InodeId(victim)])
    }
}

/// Rename step (3): the new name exists; the old one goes (unless the other server reported the
/// new name already named the inode), the intent goes and the reply is kept. With `outcome`
/// an error of step (2), only the intent goes and the error is the reply.
pub(crate) fn finish_rename_out(
    txn: &WriteTransaction,
    id: u64,
    mutation: MutationId,
    RenameIntent {
        parent,
        name,
        child,
        new_parent,
        ..
    }: &RenameIntent,
    outcome: Result<MetaResponse, OpError>,
) -> Result<MetaResponse, OpError> {
    super::conclude(txn, id, mutation, outcome, |txn, outcome| {
        if outcome == MetaResponse::Unchanged {
            return Ok(MetaResponse::Done);
        }
        let mut inodes = crate::schema::usage::Inodes::open(txn)?;
        let mut entries = txn.open_table(ENTRIES)?;
        if let Some(dentry) = load_dentry(&entries, *parent, name)? {
            if dentry.child == *child {
                let parent_record = load_dir(&inodes, *parent)?;
                take_name(&mut inodes, &mut entries, (*parent, parent_record), dentry)?;
            }
        }
        // The moved inode, when it lives here (one elsewhere was told by the coordinator).
        mark_renamed(&mut inodes, *child, *new_parent)?;
        Ok(MetaResponse::Done)
    })
}

/// Longest a directory rename waits for the cluster-wide rename lock.
pub(super) const RENAME_LOCK_WAIT: Duration = Duration::from_secs(45);

impl Meta {
    /// rename: local in one transaction, or across servers with an intent (a new name on
    /// another server, a directory or victim whose inode lives elsewhere, an exchange with
    /// anything elsewhere). A rename that moves a directory to another parent takes the
    /// cluster-wide rename lock from management first and walks the new parent's ancestors
    /// (across servers) to refuse a move into its own subtree; the lock keeps two such moves on
    /// different servers from making a loop together.
    pub(in crate::service) async fn rename(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
    ) -> Result<MetaResponse, OpError> {
        let Some((child, kind)) = self.local_dentry(parent, &name) else {
            // The one-server path says what is wrong with the source.
            return self
                .rename_local(mutation, parent, name, new_parent, new_name, flags, false)
                .await;
        };
        let here = self.node;
        let other = self.held_by(new_parent, &new_name, flags.exchange).await?;
        if parent != new_parent {
            // Between directories of different projects: EXDEV (`ops::check_project`).
            self.check_project(child, new_parent).await?;
            if let Some((other, _)) = other.filter(|_| flags.exchange) {
                self.check_project(other, parent).await?;
            }
        }
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
                let (other, other_kind) = other;
                let exchange = Exchange {
                    parent,
                    name,
                    new_parent,
                    new_name,
                    other,
                    other_kind,
                };
                self.exchange_out(mutation, exchange).await
            } else if all_here {
                let names = ((parent, name), (new_parent, new_name));
                self.rename_here(mutation, names, flags, (child, kind), moves_dirs)
                    .await
            } else {
                self.rename_out(mutation, parent, name, new_parent, new_name, flags)
                    .await
            }
        };
        if !moves_dirs {
            return route.await;
        }
        let token = self.take_rename_lock().await?;
        let mgmt = self.cluster.mgmt();
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

    /// The inode `name` in `dir` names here, with its kind, if it does.
    fn local_dentry(&self, dir: InodeId, name: &str) -> Option<(InodeId, FileKind)> {
        self.read(|txn| {
            crate::schema::load_dentry(&txn.open_table(crate::schema::ENTRIES)?, dir, name)
        })
        .ok()
        .flatten()
        .map(|dentry| (dentry.child, dentry.kind))
    }

    /// What a rename's new name holds now, which an exchange swaps with and a rename
    /// replaces: looked up here, or for an exchange on the new directory's home (a rename
    /// into another home's directory leaves the replacing to it).
    async fn held_by(
        &self,
        new_parent: InodeId,
        new_name: &str,
        exchange: bool,
    ) -> Result<Option<(InodeId, FileKind)>, OpError> {
        if new_parent.home() == self.node {
            return Ok(self.local_dentry(new_parent, new_name));
        }
        if !exchange {
            return Ok(None);
        }
        let meta = self
            .cluster
            .meta(new_parent.home())
            .await
            .map_err(rpc_error)?;
        match meta.lookup(new_parent, new_name).await {
            Ok(attr) => Ok(Some((attr.inode, attr.kind))),
            Err(weft_net::RpcError::Remote(error)) => Err(OpError::Rejected(error)),
            Err(error) => Err(rpc_error(error)),
        }
    }

    /// A rename whose names and directories are all here, of `child` (of `kind`), whose
    /// inode may live on another home: only its dentry moves here, and its home is told.
    async fn rename_here(
        &self,
        mutation: MutationId,
        ((parent, name), (new_parent, new_name)): ((InodeId, String), (InodeId, String)),
        flags: weft_proto::messages::RenameFlags,
        (child, kind): (InodeId, FileKind),
        moves_dirs: bool,
    ) -> Result<MetaResponse, OpError> {
        let forgets = child.home() != self.node && kind != FileKind::Directory;
        if forgets {
            // The file's home forgets its parent first, and learns the new one after: a home
            // that cannot be told afterwards keeps none, and refuses the file to confined
            // clients, rather than keep a directory without its name.
            self.mark_renamed(child, InodeId(0)).await?;
        }
        let renamed = self
            .rename_local(
                mutation, parent, name, new_parent, new_name, flags, moves_dirs,
            )
            .await;
        let renamed = match renamed {
            Ok(renamed) => renamed,
            Err(error) => {
                // Nothing moved: the old directory still holds the name.
                if forgets {
                    let _ = self.mark_renamed(child, parent).await;
                }
                return Err(error);
            }
        };
        // An inode living elsewhere: only its dentry moved here, its ctime and parent live on
        // its home. The rename is done: a home that cannot be told misses a time, and a
        // file's parent stays unknown.
        if let Err(error) = self.mark_renamed(child, new_parent).await {
            tracing::warn!(inode = %child, ?error, "could not move a renamed inode's ctime");
        }
        Ok(renamed)
    }

    /// Takes the cluster-wide directory-rename lock from management, waiting up to
    /// [`RENAME_LOCK_WAIT`] while another holds it; answers the token that releases it.
    async fn take_rename_lock(&self) -> Result<u64, OpError> {
        let token: u64 = rand::random();
        let started = std::time::Instant::now();
        loop {
            match self
                .cluster
                .mgmt()
                .acquire_rename_lock(self.node, token)
                .await
            {
                Ok(()) => return Ok(token),
                Err(error) if started.elapsed() < RENAME_LOCK_WAIT => {
                    tracing::debug!(%error, "waiting for the rename lock");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(rpc_error(error)),
            }
        }
    }

    /// The project of `inode`, from its record here or from its home.
    pub(in crate::service) async fn project_of(&self, inode: InodeId) -> Result<u32, OpError> {
        if inode.home() == self.node {
            return self.read(|txn| {
                Ok(crate::schema::load_inode(&txn.open_table(INODES)?, inode)?.project)
            });
        }
        let meta = self.cluster.meta(inode.home()).await.map_err(rpc_error)?;
        let attr = meta.get_attr(inode).await.map_err(rpc_error)?;
        Ok(attr.project)
    }

    /// Refuses a name for `inode` in directory `dir` of another project (EXDEV), wherever
    /// the two live. A one-server operation checks again in its transaction.
    pub(in crate::service) async fn check_project(
        &self,
        inode: InodeId,
        dir: InodeId,
    ) -> Result<(), OpError> {
        crate::ops::check_project(self.project_of(dir).await?, self.project_of(inode).await?)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::service) async fn rename_local(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
        ancestry_checked: bool,
    ) -> Result<MetaResponse, OpError> {
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
    pub(in crate::service) async fn is_ancestor_anywhere(
        &self,
        ancestor: InodeId,
        mut dir: InodeId,
    ) -> Result<bool, OpError> {
        for _ in 0..PATH_DEPTH_MAX {
            if let Some(found) = walk_ends_at(ancestor, dir) {
                return Ok(found);
            }
            dir = self.attr_of(dir).await?.parent;
        }
        Err(too_deep())
    }

    /// A rename of a non-directory into a directory on another server (see the module header).
    pub(in crate::service) async fn rename_out(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: String,
        new_parent: InodeId,
        new_name: String,
        flags: weft_proto::messages::RenameFlags,
    ) -> Result<MetaResponse, OpError> {
        self.start_intent(
            move |txn| {
                prepare_rename_out(txn, mutation, parent, &name, new_parent, &new_name, flags)
            },
            "rename-after-intent",
        )
        .await
    }

    /// Tells `inode`'s home, when that is another server, that a rename moved a dentry of it
    /// into `parent`: its ctime moves, and a directory's parent pointer follows (idempotent).
    /// An inode that lives here is marked by the rename's own commit.
    pub(in crate::service) async fn mark_renamed(
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
    pub(in crate::service) async fn drop_replaced(
        &self,
        id: u64,
        victim: InodeId,
    ) -> Result<(), OpError> {
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
                return Err(OpError::inconsistent(format!(
                    "replaced directory {victim} was not removed: {error:?}"
                )));
            }
            return Ok(());
        }
        self.adjust_remote_links(id, victim, -1).await.map(|_| ())
    }

    /// Rename steps (2) to (4): a directory victim on a third server is sealed, the new name's
    /// server inserts the dentry, a victim living elsewhere goes at its home, the moved inode's
    /// home learns its new parent; then the old name goes with the intent.
    pub(in crate::service) async fn continue_rename(
        &self,
        id: u64,
        mutation: MutationId,
        rename: &RenameIntent,
    ) -> Result<MetaResponse, OpError> {
        let RenameIntent {
            child,
            kind_code,
            new_parent,
            new_name,
            no_replace,
            ..
        } = rename;
        let meta = self
            .cluster
            .meta(new_parent.home())
            .await
            .map_err(rpc_error)?;
        let moves_dir = *kind_code == crate::schema::kind_code(FileKind::Directory);
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
                // The project of the inode moved, for the new directory to check (an inode
                // removed meanwhile has none).
                let project = match self.project_of(*child).await {
                    Ok(project) => project,
                    Err(OpError::Rejected(error)) if error.code == ErrorCode::NotFound => 0,
                    Err(error) => return Err(error),
                };
                let request = MetaRequest::InsertDentry {
                    coordinator: self.node,
                    intent: id,
                    parent: *new_parent,
                    name: new_name.clone(),
                    child: *child,
                    kind: crate::schema::kind_from_code(*kind_code),
                    no_replace: *no_replace,
                    sealed_victim: sealed,
                    project,
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
            Ok(MetaResponse::Inodes(victims)) => {
                for victim in victims {
                    self.drop_replaced(id, victim).await?;
                }
                Ok(MetaResponse::Done)
            }
            other => other,
        };
        if outcome.is_ok() {
            // The moved inode's ctime, and a directory's parent pointer.
            self.mark_renamed(*child, *new_parent).await?;
        }
        weft_service::failpoint::failpoint("rename-after-remote");
        let finishing = rename.clone();
        self.committer
            .run(Box::new(move |txn| {
                finish_rename_out(txn, id, mutation, &finishing, outcome)
            }))
            .await
    }
}
