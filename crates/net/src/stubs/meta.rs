//! A metadata home's client, and whom the metadata requests of a task act for.

use super::*;

tokio::task_local! {
    /// Who the metadata requests of the current task act for: a mount sets it for each of the
    /// kernel's requests.
    static CALLER: Caller;
}

/// Runs `work` with the metadata requests it sends acting for `caller`; requests sent outside
/// such a scope act for the process's own user and groups. Only connections with a client key
/// send who they act for: members' requests are not checked by the servers.
pub async fn acting_for<F: std::future::Future>(caller: Caller, work: F) -> F::Output {
    CALLER.scope(caller, work).await
}

/// Whom the current task acts for, when it was told ([`acting_for`]); `None`: the process.
pub fn acting_caller() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Who the metadata requests of the current task act for (see [`acting_for`]).
pub fn caller() -> Caller {
    CALLER
        .try_with(Caller::clone)
        .unwrap_or_else(|_| Caller::of_process())
}

/// Client of one metadata home, on the server that serves it.
#[derive(Debug)]
pub struct MetaClient {
    rpc: RpcClient,
    route: MetaRoute,
}

impl MetaClient {
    /// A client for `route`'s home on the metadata server at `address`.
    pub fn new(
        address: impl Into<String>,
        route: MetaRoute,
        options: RpcClientOptions,
    ) -> MetaClient {
        MetaClient {
            rpc: RpcClient::new(address, options),
            route,
        }
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        self.rpc.address()
    }

    /// Where this client's requests go.
    pub fn route(&self) -> MetaRoute {
        self.route
    }

    /// Sends any metadata request.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn call(&self, request: MetaRequest) -> Result<MetaResponse, RpcError> {
        Ok(self.send(request, Bytes::new()).await?.0)
    }

    /// Sends a metadata request and answers what it declares.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn ask<A: Answer<MetaResponse>>(&self, request: MetaRequest) -> Result<A, RpcError> {
        let response = self.call(request).await?;
        self.rpc.answer(response)
    }

    /// Sends any metadata request with a payload.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn send(
        &self,
        request: MetaRequest,
        payload: Bytes,
    ) -> Result<(MetaResponse, Bytes), RpcError> {
        self.rpc
            .call(
                &Request::Meta(
                    self.route,
                    request,
                    self.rpc.client_name().map(|_| caller()),
                ),
                payload,
            )
            .await
    }
}

stubs! {
    MetaClient: MetaRequest, meta_answers;

    /// Looks a name up.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn lookup(parent: InodeId, name: &str) {
        Lookup { parent, name: name.to_string() }
    }

    /// Reads attributes.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn get_attr(inode: InodeId) {
        GetAttr { inode }
    }

    /// Changes attributes, through the open that was `granted` a capability when given.
    ///
    /// # Errors
    /// As the server decides, or [`RpcError`] for transport failures.
    fn set_attr(
        mutation: MutationId,
        inode: InodeId,
        changes: AttrChanges,
        granted: Option<Capability>,
    ) {
        SetAttr { mutation, inode, changes, granted }
    }

    /// Creates an entry of any kind, opened with handle `open` when given; answers its
    /// attributes and, when the server sent them, its directory's after the change, and the
    /// capability of a file created open.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `NoTargets`, or [`RpcError`] for transport failures.
    fn create(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new: NewInode,
        open: Option<u64>,
    ) {
        Create { mutation, parent, name: name.to_string(), new, open }
    }

    /// Creates a directory spread over `shards` metadata servers.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `InvalidArgument` (more shards than servers), or [`RpcError`]
    /// for transport failures.
    fn create_spread(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new: NewInode,
        shards: u16,
    ) {
        CreateSpread { mutation, parent, name: name.to_string(), new, shards }
    }

    /// Adds a hard link.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, or [`RpcError`] for transport failures.
    fn link(
        mutation: MutationId,
        inode: InodeId,
        new_parent: InodeId,
        new_name: &str,
    ) {
        Link { mutation, inode, new_parent, new_name: new_name.to_string() }
    }

    /// Removes a non-directory entry.
    ///
    /// # Errors
    /// `NotFound`, `IsDirectory`, or [`RpcError`] for transport failures.
    fn unlink(mutation: MutationId, parent: InodeId, name: &str) {
        Unlink { mutation, parent, name: name.to_string() }
    }

    /// Removes an empty directory.
    ///
    /// # Errors
    /// `NotFound`, `NotEmpty`, `NotDirectory`, or [`RpcError`] for transport failures.
    fn rmdir(mutation: MutationId, parent: InodeId, name: &str) {
        Rmdir { mutation, parent, name: name.to_string() }
    }

    /// Renames `name` in `parent` to `new_name` in `new_parent`.
    ///
    /// # Errors
    /// The POSIX rename errors as codes, or [`RpcError`] for transport failures.
    fn rename(
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        new_parent: InodeId,
        new_name: &str,
        flags: RenameFlags,
    ) {
        Rename {
            mutation,
            parent,
            name: name.to_string(),
            new_parent,
            new_name: new_name.to_string(),
            flags,
        }
    }

    /// Lists a directory (of `shards` shards, as the client believes) after a cookie;
    /// answers the entries and whether the listing is at its end.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`, or [`RpcError`] for transport failures.
    fn read_dir(
        dir: InodeId,
        shards: u16,
        after_cookie: u64,
        max_entries: u32,
    ) {
        ReadDir { dir, shards, after_cookie, max_entries }
    }

    /// Lists a directory as [`MetaClient::read_dir`] does, each entry with its inode's
    /// attributes where this server holds the inode.
    ///
    /// # Errors
    /// `NotFound`, `NotDirectory`, `VersionMismatch` from a server of protocol version 9, or
    /// [`RpcError`] for transport failures.
    fn read_dir_plus(dir: InodeId, shards: u16, after_cookie: u64, max_entries: u32) {
        ReadDirPlus { dir, shards, after_cookie, max_entries }
    }

    /// Reads a symbolic link.
    ///
    /// # Errors
    /// `NotFound`, `NotSymlink`, or [`RpcError`] for transport failures.
    fn read_link(inode: InodeId) {
        ReadLink { inode }
    }

    /// Registers handle `handle` of a session's open file, for `access` (the
    /// [`weft_proto::access`] bits), showing what the handle was `granted` before when it is
    /// opened again; answers the file's attributes and the capability granted.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn open(
        client: ClientId,
        handle: u64,
        inode: InodeId,
        access: u8,
        granted: Option<Capability>,
    ) {
        Open { client, handle, inode, access, granted }
    }

    /// Tells the server of several handles closed, of files of its home.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn release(client: ClientId, handles: Vec<(InodeId, u64)>) {
        Release { client, handles }
    }

    /// Asks for room to grow the file open as `handle` to `to`; answers the end it may grow
    /// the file to.
    ///
    /// # Errors
    /// `QuotaExceeded` when no room is left, `NotPermitted` without an open for writing, or
    /// [`RpcError`] for transport failures.
    fn reserve(client: ClientId, handle: u64, inode: InodeId, to: u64) {
        Reserve { client, handle, inode, to }
    }

    /// Has the file's queued truncate sent to every target now; answers once each has it.
    ///
    /// # Errors
    /// `Io` when a target cannot be reached, or [`RpcError`] for transport failures.
    fn apply_truncate(inode: InodeId) {
        ApplyTruncate { inode }
    }

    /// Reports a file's size after writes, through the open for writing that was `granted`
    /// a capability when given.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn report_size(
        inode: InodeId,
        report: SizeReport,
        granted: Option<Capability>,
    ) {
        ReportSize { inode, report, granted }
    }

    /// Sets an extended attribute.
    ///
    /// # Errors
    /// `Exists` / `NoAttribute` per `mode`, `OutOfRange`, or [`RpcError`] for transport failures.
    fn set_xattr(
        mutation: MutationId,
        inode: InodeId,
        name: &str,
        value: Vec<u8>,
        mode: XattrSetMode,
    ) {
        SetXattr { mutation, inode, name: name.to_string(), value, mode }
    }

    /// Reads an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`, or [`RpcError`] for transport failures.
    fn get_xattr(inode: InodeId, name: &str) {
        GetXattr { inode, name: name.to_string() }
    }

    /// Lists extended attribute names.
    ///
    /// # Errors
    /// `NotFound`, or [`RpcError`] for transport failures.
    fn list_xattr(inode: InodeId) {
        ListXattr { inode }
    }

    /// Removes an extended attribute.
    ///
    /// # Errors
    /// `NoAttribute`, or [`RpcError`] for transport failures.
    fn remove_xattr(mutation: MutationId, inode: InodeId, name: &str) {
        RemoveXattr { mutation, inode, name: name.to_string() }
    }

    /// Sets, changes or releases a byte-range lock, waiting up to `wait_ms` for a conflict.
    ///
    /// # Errors
    /// `WouldBlock` when a conflicting lock stays, or [`RpcError`] for transport failures.
    fn set_lock(
        client: ClientId,
        inode: InodeId,
        lock: LockRange,
        wait_ms: u32,
        reclaim: bool,
    ) {
        SetLock { client, inode, lock, wait_ms, reclaim }
    }

    /// The lock that would conflict with `lock`, if any.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn get_lock(client: ClientId, inode: InodeId, lock: LockRange) {
        GetLock { client, inode, lock }
    }

    /// The server's lock epoch.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn lock_epoch() {
        LockEpoch
    }

    /// Inodes of other homes that dentries on this server name.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn remote_references() {
        RemoteReferences
    }

    /// Removes an empty directory inode for a coordinating server (idempotent).
    ///
    /// # Errors
    /// `NotEmpty`, or [`RpcError`] for transport failures.
    fn remove_dir_inode(inode: InodeId) {
        RemoveDirInode { inode }
    }

    /// Checks the namespace and objects of this metadata target.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or the check fails.
    fn check(repair: bool, referenced: Vec<InodeId>) {
        Check { repair, referenced }
    }

    /// How far this server's consistency check is.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures.
    fn check_progress() {
        CheckProgress
    }

    /// What each user and group uses in each pool in the homes this server serves.
    ///
    /// # Errors
    /// [`RpcError`] for transport failures; `VersionMismatch` from a server of version 3.
    fn quota_usage() {
        QuotaUsage
    }

    /// Moves a regular file onto `targets` (in stripe order) or into `pool`; answers how
    /// many slots move and whether the move is done ([`MetaRequest::Migrate`]).
    ///
    /// # Errors
    /// `NotFound`, `InvalidArgument` (not a regular file, a mirrored one, a target that
    /// cannot take it), `NoTargets`, or [`RpcError`] for transport failures.
    fn migrate(
        inode: InodeId,
        pool: Option<weft_proto::ids::StoragePoolId>,
        targets: Vec<TargetId>,
        pattern: Option<(u32, u16)>,
    ) {
        Migrate { inode, pool, targets, pattern }
    }

    /// Sets a directory's stripe pattern.
    ///
    /// # Errors
    /// `NotDirectory`, or [`RpcError`] for transport failures.
    fn set_pattern(mutation: MutationId, dir: InodeId, pattern: StripePattern) {
        SetPattern { mutation, dir, pattern }
    }
}
