//! Spread directories: a directory whose entries live on several metadata servers, one shard
//! each. mkdir creates the directory, then each other shard, then records the shard list, then
//! the dentry; rmdir seals the other shards (each only if empty), removes the directory and
//! the shards, then the dentry, or unseals them again. What new entries inherit is copied from
//! the directory to its shards after every change.

use super::mkdir::Placement;
use super::rmdir::finish_rmdir;
use crate::ops::create::NewEntry;
use crate::ops::intent::{check_unsettled, MkdirIntent, SpreadMkdirIntent, SpreadRmdirIntent};
use crate::ops::lookup::get_attr;
use crate::schema::{
    dir_is_empty, load_dir, store_inode, InodeRecord, OpError, ENTRIES, INODES, XATTRS,
};
use crate::service::Meta;
use crate::store::{ReadableTable, WriteTransaction};
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{FileKind, MetaRequest, MetaResponse, MutationId};
use weft_proto::ErrorCode;

/// On a spread directory's home: records its shards (idempotent) and answers its attributes.
pub(crate) fn set_shards(
    txn: &WriteTransaction,
    dir: InodeId,
    shards: &[InodeId],
) -> Result<MetaResponse, OpError> {
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let mut record = load_dir(&inodes, dir)?;
    let shards: Vec<u64> = shards.iter().map(|shard| shard.0).collect();
    if record.shards != shards {
        record.shards = shards;
        store_inode(&mut inodes, dir, &record)?;
    }
    Ok(MetaResponse::Attr(record.to_attr(dir)))
}

/// On a shard's home: seals an empty shard for the rmdir (coordinator, intent) of its
/// directory, or unseals it. A missing shard was removed by an earlier pass of that rmdir.
pub(crate) fn seal_shard(
    txn: &WriteTransaction,
    shard: InodeId,
    owner: (NodeId, u64),
    seal: bool,
) -> Result<MetaResponse, OpError> {
    check_unsettled(txn, owner.0, owner.1)?;
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let Some(bytes) = inodes.get(shard.0)? else {
        return Ok(MetaResponse::Done);
    };
    let mut record = InodeRecord::decode(shard.0, bytes.value())?;
    drop(bytes);
    let owner = (owner.0 .0, owner.1);
    match (seal, record.sealed) {
        (true, Some(sealed)) if sealed == owner => return Ok(MetaResponse::Done),
        (true, Some(_)) => {
            return Err(OpError::rejected(
                ErrorCode::Busy,
                "another rmdir is removing this directory",
            ))
        }
        (true, None) => {
            if !dir_is_empty(&txn.open_table(ENTRIES)?, shard)? {
                return Err(OpError::rejected(
                    ErrorCode::NotEmpty,
                    "the directory is not empty",
                ));
            }
            record.sealed = Some(owner);
        }
        (false, Some(sealed)) if sealed == owner => record.sealed = None,
        (false, _) => return Ok(MetaResponse::Done),
    }
    store_inode(&mut inodes, shard, &record)?;
    Ok(MetaResponse::Done)
}

/// On a shard's home: takes over what new entries inherit from its spread directory.
pub(crate) fn sync_shard(
    txn: &WriteTransaction,
    request: &MetaRequest,
) -> Result<MetaResponse, OpError> {
    let MetaRequest::SyncShard {
        shard,
        mode,
        uid,
        gid,
        pattern,
        default_acl,
        default_spread,
        project,
    } = request
    else {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            "not a shard synchronisation",
        ));
    };
    let mut inodes = crate::schema::usage::Inodes::open(txn)?;
    let Some(bytes) = inodes.get(shard.0)? else {
        return Ok(MetaResponse::Done);
    };
    let mut record = InodeRecord::decode(shard.0, bytes.value())?;
    drop(bytes);
    if record.shard_of == 0 {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            format!("inode {shard} is not a shard of a spread directory"),
        ));
    }
    record.mode = *mode;
    record.uid = *uid;
    record.gid = *gid;
    record.pattern = Some(*pattern);
    record.project = *project;
    let mut xattrs = txn.open_table(XATTRS)?;
    for (name, value) in [
        (crate::acl::ACL_DEFAULT, default_acl),
        (crate::acl::DIR_SPREAD, default_spread),
    ] {
        match value {
            Some(value) => {
                xattrs.insert((shard.0, name), value.as_slice())?;
            }
            None => {
                xattrs.remove((shard.0, name))?;
            }
        }
    }
    record.xattr_free = crate::ops::xattr::has_none(&xattrs, *shard)?;
    store_inode(&mut inodes, *shard, &record)?;
    Ok(MetaResponse::Done)
}

impl Meta {
    /// mkdir of a directory spread over `shards` metadata servers (see the module header).
    pub(in crate::service) async fn mkdir_spread(
        &self,
        mutation: MutationId,
        entry: NewEntry,
        shards: u16,
    ) -> Result<MetaResponse, OpError> {
        if entry.new.kind != FileKind::Directory
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
        let placement = Placement {
            home,
            shard_homes: homes,
        };
        self.remote_mkdir(mutation, entry, placement).await
    }

    /// The spread a new subdirectory of `parent` inherits: its default spread, over as many
    /// metadata servers as are online when fewer than asked; `None` for a plain directory.
    pub(in crate::service) async fn inherited_spread(&self, parent: InodeId) -> Option<u16> {
        let arrived = std::time::Instant::now();
        let asked = self
            .read(|txn| {
                Ok(txn
                    .open_table(crate::schema::XATTRS)?
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
    pub(in crate::service) async fn shards_of_child(
        &self,
        parent: InodeId,
        name: &str,
    ) -> Result<Vec<InodeId>, OpError> {
        let dentry = self.read(|txn| {
            crate::schema::load_dentry(&txn.open_table(crate::schema::ENTRIES)?, parent, name)
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
            Ok(MetaResponse::Attr(attr)) => Ok(attr.shards),
            Ok(_) | Err(OpError::Rejected(_)) => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    /// Copies what new entries inherit from spread directory `dir` to its shards; a shard that
    /// cannot be reached gets it from the work loop later.
    pub(in crate::service) async fn sync_shards(&self, dir: InodeId) {
        self.intents
            .shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .insert(dir);
        if let Err(error) = self.try_sync_shards(dir).await {
            tracing::warn!(%dir, ?error, "a shard of a spread directory is not up to date yet");
            return;
        }
        self.intents
            .shard_syncs
            .lock()
            .expect("shard sync set poisoned")
            .remove(&dir);
    }

    pub(in crate::service) async fn try_sync_shards(&self, dir: InodeId) -> Result<(), OpError> {
        let (record, default_acl, default_spread) = self.read(|txn| {
            let record = crate::schema::load_inode(&txn.open_table(INODES)?, dir)?;
            let xattrs = txn.open_table(crate::schema::XATTRS)?;
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
                project: record.project,
            };
            self.call_meta(shard.home(), request).await?;
        }
        Ok(())
    }

    /// Seals (or unseals) the shards of a spread directory for rmdir intent `id`. The first
    /// shard that refuses (not empty, or another rmdir's) is the answer; unreachable ones
    /// leave the intent for recovery.
    pub(in crate::service) async fn seal_shards(
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

    /// Spread mkdir steps: the directory on its home, each other shard on its server, the shard list
    /// on the directory, then the dentry here; all taken back when the name was taken meanwhile.
    pub(in crate::service) async fn continue_mkdir_spread(
        &self,
        id: u64,
        mutation: MutationId,
        SpreadMkdirIntent { mkdir, shard_homes }: &SpreadMkdirIntent,
    ) -> Result<MetaResponse, OpError> {
        let MkdirIntent { home, request, .. } = mkdir;
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
                project,
                ..
            } = request.clone()
            else {
                return Err(OpError::inconsistent(format!("intent {id} is damaged")));
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
                project,
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
        let (finished, take_back) = self.commit_mkdir(id, mutation, mkdir, &attr).await?;
        if take_back {
            for shard in shards.iter().skip(1).chain(std::iter::once(&dir.inode)) {
                let _ = self.remove_remote_dir(*shard).await;
            }
        }
        finished
    }

    /// Spread rmdir steps: seal the other shards (each only if empty), remove the directory if its
    /// own shard is empty, remove the sealed shards, then the dentry; or unseal them again.
    pub(in crate::service) async fn continue_rmdir_spread(
        &self,
        id: u64,
        mutation: MutationId,
        SpreadRmdirIntent { rmdir, shards }: &SpreadRmdirIntent,
    ) -> Result<MetaResponse, OpError> {
        let child = &rmdir.child;
        let others = &shards[1..];
        let mut outcome = self.seal_shards(id, others, true).await?;
        if outcome.is_ok() {
            weft_service::failpoint::failpoint("rmdir-spread-after-seal");
            outcome = self.remove_remote_dir(*child).await?;
        }
        if outcome.is_ok() {
            for shard in others {
                if let Err(error) = self.remove_remote_dir(*shard).await? {
                    return Err(OpError::inconsistent(format!(
                        "sealed empty shard {shard} was not removed: {error:?}"
                    )));
                }
            }
        } else {
            self.seal_shards(id, others, false).await??;
        }
        let finishing = rmdir.clone();
        self.committer
            .run(Box::new(move |txn| {
                finish_rmdir(txn, id, mutation, &finishing, outcome)
            }))
            .await
    }
}
