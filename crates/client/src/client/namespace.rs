//! The namespace calls of a [`Client`]: lookups and attributes, creating, linking, renaming
//! and removing entries, extended attributes, listings, each sent to the metadata server
//! that holds what it names.

use super::*;
use futures::StreamExt;
use weft_net::MetaCalls;
use weft_proto::messages::DirEntryPlus;

impl Client {
    /// Looks `name` up in `parent`.
    ///
    /// # Errors
    /// `NotFound` and the other namespace codes.
    pub async fn lookup(&self, parent: InodeId, name: &str) -> Result<InodeAttr, ClientError> {
        if self.names.absent(parent, name) {
            return Err(ClientError::Rpc(RpcError::Remote(
                weft_proto::error::WireError::new(
                    ErrorCode::NotFound,
                    format!("{name:?} not found in {parent}"),
                ),
            )));
        }
        let attr = self
            .on_holder(parent, name, |meta, holder| async move {
                meta.lookup(holder, name).await
            })
            .await?;
        self.learn(&attr);
        self.gathered(attr).await
    }

    /// Reads attributes. A spread directory's link count and times gather its shards'.
    ///
    /// # Errors
    /// `NotFound` and the other namespace codes.
    pub async fn get_attr(&self, inode: InodeId) -> Result<InodeAttr, ClientError> {
        let attr = self
            .on_home(inode, |meta| async move { meta.get_attr(inode).await })
            .await?;
        self.learn(&attr);
        self.gathered(attr).await
    }

    /// `attr` as it is whole: a spread directory's server holds only its own shard's
    /// subdirectories and times, so every answer that gives the directory's attributes
    /// (getattr, lookup, setattr) adds the other shards' in.
    async fn gathered(&self, mut attr: InodeAttr) -> Result<InodeAttr, ClientError> {
        for shard in attr.shards.clone().into_iter().skip(1) {
            let part = self
                .on_home(shard, |meta| async move { meta.get_attr(shard).await })
                .await?;
            attr.nlink += part.nlink.saturating_sub(2);
            attr.mtime = attr.mtime.max(part.mtime);
            attr.ctime = attr.ctime.max(part.ctime);
        }
        Ok(attr)
    }

    /// Changes attributes; a size truncates. Of a file open here, a truncate comes after the
    /// writes sent before it, and their report goes first: it records the slots they wrote,
    /// which the truncate then keeps if its size leaves them bytes. A time set after writes
    /// (futimens before close, as tar x and cp -p do) comes after their report, which moves
    /// the mtime, and the report at close has nothing new to move it again.
    ///
    /// # Errors
    /// The namespace codes, or `Io` when a target could not be truncated.
    pub async fn set_attr(
        &self,
        inode: InodeId,
        changes: AttrChanges,
    ) -> Result<InodeAttr, ClientError> {
        self.set_attr_through(inode, changes, None).await
    }

    /// Changes attributes through the open handle `handle` when given (`ftruncate`,
    /// `futimens`): the servers judge the change by what the handle was opened for, as POSIX
    /// judges a descriptor, whatever the mode says now.
    ///
    /// # Errors
    /// As [`Client::set_attr`].
    pub async fn set_attr_through(
        &self,
        inode: InodeId,
        changes: AttrChanges,
        handle: Option<u64>,
    ) -> Result<InodeAttr, ClientError> {
        let granted =
            handle.and_then(|handle| self.session.opens.granted(inode, handle, WRITE, self.id()));
        let open = self.files.get(inode);
        if let Some(open) = open
            .as_ref()
            .filter(|_| changes.size.is_some() || changes.mtime.is_some())
        {
            open.drain().await;
            open.report_size(self, false).await?;
        }
        let (mutation, _guard) = self.begin_mutation();
        let attr = self
            .through_grace(inode, |meta| async move {
                meta.set_attr(mutation, inode, changes, granted).await
            })
            .await?;
        if changes.size.is_some() {
            self.files.truncated(&attr);
        }
        self.gathered(attr).await
    }

    /// Creates an entry of any kind; `new.mode` is masked by `new.umask` unless the parent has
    /// a default ACL.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `NoTargets` and the other namespace codes.
    pub async fn create(
        &self,
        parent: InodeId,
        name: &str,
        new: NewInode,
    ) -> Result<InodeAttr, ClientError> {
        Ok(self.create_entry(parent, name, new, None).await?.attr)
    }

    /// Creates an entry of any kind, opening a new regular file with handle `open` if given
    /// in the same request (as [`Client::open`] would: one round trip for `open(O_CREAT)`),
    /// and answers the directory's attributes after the change too when its server could.
    ///
    /// # Errors
    /// As [`Client::create`].
    pub async fn create_entry(
        &self,
        parent: InodeId,
        name: &str,
        new: NewInode,
        open: Option<u64>,
    ) -> Result<Created, ClientError> {
        if open.is_some() {
            // A new file lives on the server of its directory (or of its shard).
            self.watch_home(parent.home()).await?;
        }
        let (mutation, _guard) = self.begin_mutation();
        // On the server the file will live on: its directory's (or its shard's).
        let reclaims = self.reclaims(self.holder(parent, name).home());
        // A lease counts from before the request's first send, which is before its home
        // granted or renewed it.
        let sent = std::time::Instant::now();
        let making = (new.kind == FileKind::Directory).then(|| self.names.making());
        self.names.naming(parent, name);
        let created = self
            .on_holder(parent, name, |meta, holder| {
                let new = new.clone();
                async move { meta.create(mutation, holder, name, new, open).await }
            })
            .await?;
        let attr = created.attr;
        self.names.renewed(parent, sent, created.parent_lease_ms);
        if let Some(making) = making.filter(|_| attr.kind == FileKind::Directory) {
            self.names.granted(making, attr.inode, created.lease_ms);
        }
        self.learn(&attr);
        if let Some(handle) = open.filter(|_| attr.kind == FileKind::Regular) {
            self.watch_home(attr.inode.home()).await?;
            if weft_service::failpoint::misbehave("client-late-open-record") {
                // A client slow to record the open its create got: its home may restart and
                // be reclaimed from meanwhile.
                tracing::warn!(inode = %attr.inode, "recording a created file's open late");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
            self.record_open(
                (attr.inode, handle),
                weft_proto::access::READ | weft_proto::access::WRITE,
                created.capability,
                reclaims,
            )
            .await;
        }
        Ok(Created {
            attr,
            parent: created.parent.filter(|p| p.inode == parent),
        })
    }

    /// Creates a directory whose entries spread over `shards` metadata servers by name hash,
    /// for directories of very many entries.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `InvalidArgument` (more shards than metadata servers).
    pub async fn mkdir_spread(
        &self,
        (parent, name): (InodeId, &str),
        (mode, umask): (u32, u32),
        owner: (u32, u32),
        shards: u16,
    ) -> Result<InodeAttr, ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        let new = directory(mode, umask, owner);
        self.names.naming(parent, name);
        let attr = self
            .on_holder(parent, name, |meta, holder| {
                let new = new.clone();
                async move {
                    meta.create_spread(mutation, holder, name, new, shards)
                        .await
                }
            })
            .await?;
        self.learn(&attr);
        Ok(attr)
    }

    /// Creates a directory owned by `owner` (uid, gid).
    ///
    /// # Errors
    /// `Exists`, `NotFound` and the other namespace codes.
    pub async fn mkdir(
        &self,
        parent: InodeId,
        name: &str,
        mode: u32,
        umask: u32,
        owner: (u32, u32),
    ) -> Result<InodeAttr, ClientError> {
        self.create(parent, name, directory(mode, umask, owner))
            .await
    }

    /// Sets an extended attribute (POSIX ACLs are `system.posix_acl_*` attributes).
    ///
    /// # Errors
    /// `Exists` / `NoAttribute` per `mode`, `OutOfRange`.
    pub async fn set_xattr(
        &self,
        inode: InodeId,
        name: &str,
        value: &[u8],
        mode: XattrSetMode,
    ) -> Result<(), ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.on_home(inode, |meta| async move {
            meta.set_xattr(mutation, inode, name, value.to_vec(), mode)
                .await
        })
        .await
    }

    /// Reads an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`.
    pub async fn get_xattr(&self, inode: InodeId, name: &str) -> Result<Vec<u8>, ClientError> {
        self.on_home(
            inode,
            |meta| async move { meta.get_xattr(inode, name).await },
        )
        .await
    }

    /// Lists extended attribute names.
    ///
    /// # Errors
    /// `NotFound`.
    pub async fn list_xattr(&self, inode: InodeId) -> Result<Vec<String>, ClientError> {
        self.on_home(inode, |meta| async move { meta.list_xattr(inode).await })
            .await
    }

    /// Removes an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`.
    pub async fn remove_xattr(&self, inode: InodeId, name: &str) -> Result<(), ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.on_home(inode, |meta| async move {
            meta.remove_xattr(mutation, inode, name).await
        })
        .await
    }

    /// Adds a hard link.
    ///
    /// # Errors
    /// `Exists`, `NotPermitted` (directories) and the other namespace codes.
    pub async fn link(
        &self,
        inode: InodeId,
        new_parent: InodeId,
        new_name: &str,
    ) -> Result<InodeAttr, ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.names.naming(new_parent, new_name);
        self.on_holder(new_parent, new_name, |meta, holder| async move {
            meta.link(mutation, inode, holder, new_name).await
        })
        .await
    }

    /// Removes a non-directory entry; returns the directory's attributes after the change
    /// when its server could tell.
    ///
    /// # Errors
    /// `NotFound`, `IsDirectory` and the other namespace codes.
    pub async fn unlink(
        &self,
        parent: InodeId,
        name: &str,
    ) -> Result<Option<InodeAttr>, ClientError> {
        // The closes gathered for the server of the name go first: a file closed here and
        // now removed is disposed of at the unlink, not kept as an orphan until its release
        // comes. (Those for other servers wait their turn: one that is down must not hold up
        // this unlink.)
        self.send_releases(self.holder(parent, name).home()).await;
        let (mutation, _guard) = self.begin_mutation();
        self.on_holder(parent, name, |meta, holder| async move {
            meta.unlink(mutation, holder, name).await
        })
        .await
    }

    /// Removes an empty directory; returns its parent's attributes after the change when
    /// their server could tell.
    ///
    /// # Errors
    /// `NotFound`, `NotEmpty`, `NotDirectory` and the other namespace codes.
    pub async fn rmdir(
        &self,
        parent: InodeId,
        name: &str,
    ) -> Result<Option<InodeAttr>, ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.on_holder(parent, name, |meta, holder| async move {
            meta.rmdir(mutation, holder, name).await
        })
        .await
    }

    /// Renames an entry.
    ///
    /// # Errors
    /// The POSIX rename errors as codes.
    pub async fn rename(
        &self,
        parent: InodeId,
        name: &str,
        new_parent: InodeId,
        new_name: &str,
        flags: RenameFlags,
    ) -> Result<(), ClientError> {
        let (mutation, _guard) = self.begin_mutation();
        self.names.naming(new_parent, new_name);
        let attempt = || {
            self.on_holder(parent, name, |meta, holder| async move {
                let new_holder = self.holder(new_parent, new_name);
                meta.rename(mutation, holder, name, new_holder, new_name, flags)
                    .await
            })
        };
        match attempt().await {
            // The destination is a spread directory this client did not know of.
            Err(error) if error.code().recovery() == weft_proto::Recovery::LearnShards => {
                self.get_attr(new_parent).await?;
                attempt().await
            }
            other => other,
        }
    }

    /// Lists a directory after a cookie.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`.
    pub async fn read_dir(
        &self,
        dir: InodeId,
        after_cookie: u64,
        max_entries: u32,
    ) -> Result<(Vec<DirEntry>, bool), ClientError> {
        self.list(
            dir,
            after_cookie,
            |meta, (shard, count), after| async move {
                meta.read_dir(shard, count, after, max_entries).await
            },
        )
        .await
    }

    /// Lists a directory after a cookie, each entry with its inode's attributes as a lookup
    /// of its name would answer them: in one request per page where the directory's server
    /// holds the inodes, with a lookup of each name whose inode another server holds (and of
    /// every name, from a server of protocol version 9). An entry whose attributes the caller
    /// may not read, or that went meanwhile, comes without them; so does every entry of a
    /// directory the caller may read but not search, which is listed as a plain listing.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`, `PermissionDenied` (no read permission).
    pub async fn read_dir_plus(
        &self,
        dir: InodeId,
        after_cookie: u64,
        max_entries: u32,
    ) -> Result<(Vec<(DirEntry, Option<InodeAttr>)>, bool), ClientError> {
        let listed = self
            .list(
                dir,
                after_cookie,
                |meta, (shard, count), after| async move {
                    meta.read_dir_plus(shard, count, after, max_entries).await
                },
            )
            .await;
        let plain = |entries: Vec<DirEntry>| {
            entries
                .into_iter()
                .map(|entry| DirEntryPlus { entry, attr: None })
                .collect::<Vec<_>>()
        };
        let (entries, end, searchable) = match listed {
            Err(error) if error.code() == ErrorCode::VersionMismatch => {
                let (entries, end) = self.read_dir(dir, after_cookie, max_entries).await?;
                (plain(entries), end, true)
            }
            Err(error) if error.code() == ErrorCode::PermissionDenied => {
                let (entries, end) = self.read_dir(dir, after_cookie, max_entries).await?;
                (plain(entries), end, false)
            }
            listed => {
                let (entries, end) = listed?;
                (entries, end, true)
            }
        };
        let (entries, listed): (Vec<DirEntry>, Vec<Option<InodeAttr>>) = entries
            .into_iter()
            .map(|DirEntryPlus { entry, attr }| (entry, attr))
            .unzip();
        let mut reads = Vec::with_capacity(entries.len());
        for (entry, attr) in entries.iter().zip(listed) {
            reads.push(self.attr_of_listed(dir, &entry.name, attr, searchable));
        }
        let attrs: Vec<_> = futures::stream::iter(reads)
            .buffered(LOOKUPS_PER_LISTING)
            .collect()
            .await;
        let mut out = Vec::with_capacity(entries.len());
        for (entry, attr) in entries.into_iter().zip(attrs) {
            let attr = match attr {
                Ok(attr) => attr,
                Err(error) if unreadable(&error) => None,
                Err(error) => return Err(error),
            };
            out.push((entry, attr));
        }
        Ok((out, end))
    }

    /// The attributes of `name`, listed in `dir` with `listed` (the listing's, when its server
    /// holds the inode), or looked up when the caller may search `dir`.
    async fn attr_of_listed(
        &self,
        dir: InodeId,
        name: &str,
        listed: Option<InodeAttr>,
        searchable: bool,
    ) -> Result<Option<InodeAttr>, ClientError> {
        match (listed, searchable) {
            (Some(attr), _) => {
                self.learn(&attr);
                self.gathered(attr).await.map(Some)
            }
            (None, true) => self.lookup(dir, name).await.map(Some),
            (None, false) => Ok(None),
        }
    }

    /// A page of `dir`'s listing after a cookie, each page of a shard asked for by `page`
    /// (given the shard, the shard count and the cookie within the shard).
    async fn list<T, F, Fut>(
        &self,
        dir: InodeId,
        after_cookie: u64,
        page: F,
    ) -> Result<(Vec<T>, bool), ClientError>
    where
        T: Listed,
        F: Fn(Arc<MetaClient>, (InodeId, u16), u64) -> Fut,
        Fut: std::future::Future<Output = Result<(Vec<T>, bool), RpcError>>,
    {
        let shards = match self.shards(dir) {
            Some(shards) => shards,
            None => {
                let listed = self
                    .on_home(dir, |meta| page(meta, (dir, 1), after_cookie))
                    .await;
                match listed {
                    Err(error) if error.code().recovery() == weft_proto::Recovery::LearnShards => {
                        self.get_attr(dir).await?;
                        match self.shards(dir) {
                            Some(shards) => shards,
                            None => return Err(error),
                        }
                    }
                    other => return other,
                }
            }
        };
        // A spread directory lists its shards one after the other; a position names the shard
        // and the cookie within it.
        let count = shards.len() as u16;
        let (mut index, mut after) = weft_proto::layout::split_dir_shard_cookie(after_cookie);
        while index < shards.len() {
            let shard = shards[index];
            let (mut entries, end) = self
                .on_home(shard, |meta| page(meta, (shard, count), after))
                .await
                .or_else(|error| match error.code() {
                    // A shard read after its rmdir: nothing is left to list.
                    ErrorCode::NotFound if index > 0 => Ok((Vec::new(), true)),
                    _ => Err(error),
                })?;
            for entry in &mut entries {
                let cookie = entry.cookie();
                *cookie = weft_proto::layout::dir_shard_cookie(index, *cookie);
            }
            let last = index + 1 == shards.len();
            if !entries.is_empty() || last {
                return Ok((entries, end && last));
            }
            index += 1;
            after = 0;
        }
        Ok((Vec::new(), true))
    }

    /// Reads a symbolic link.
    ///
    /// # Errors
    /// `NotFound`, `NotSymlink`.
    pub async fn read_link(&self, inode: InodeId) -> Result<String, ClientError> {
        self.on_home(inode, |meta| async move { meta.read_link(inode).await })
            .await
    }
}

/// An entry of a page of a listing, whose cookie a spread directory's listing makes name the
/// shard too.
trait Listed {
    /// Its cookie.
    fn cookie(&mut self) -> &mut u64;
}

impl Listed for DirEntry {
    fn cookie(&mut self) -> &mut u64 {
        &mut self.cookie
    }
}

impl Listed for DirEntryPlus {
    fn cookie(&mut self) -> &mut u64 {
        &mut self.entry.cookie
    }
}

/// How many names of one page of a listing with attributes are looked up at once (those whose
/// inode another server holds, or every one, from a server of protocol version 9).
const LOOKUPS_PER_LISTING: usize = 16;

/// Whether a lookup of a listed name failed because the caller may not read its attributes or
/// the name went meanwhile: the entry is listed without them.
fn unreadable(error: &ClientError) -> bool {
    matches!(
        error.code(),
        ErrorCode::NotFound | ErrorCode::PermissionDenied | ErrorCode::NotPermitted
    )
}
