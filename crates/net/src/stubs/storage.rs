//! A storage server's client.

use super::*;

/// A write of file data into one object ([`StorageClient::write`]).
#[derive(Clone, Debug)]
pub struct ObjectWrite {
    /// The file, and the truncate generation the write is made in.
    pub file: (InodeId, u64),
    /// Where in the object.
    pub offset: u64,
    /// The bytes.
    pub data: Bytes,
    /// The client change the write is (see [`ChangeTag`]), if a client sends it.
    pub tag: Option<ChangeTag>,
    /// The file's capability, when the server wants one.
    pub capability: Option<Capability>,
    /// The file's owner, group and project, for their space quotas.
    pub owner: Option<weft_proto::quota::Owner>,
}

/// Client of one storage server.
#[derive(Debug)]
pub struct StorageClient {
    rpc: RpcClient,
}

impl StorageClient {
    /// A client for the storage server at `address`.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> StorageClient {
        StorageClient {
            rpc: RpcClient::new(address, options),
        }
    }

    /// Sends a storage request without payload and answers what it declares.
    async fn ask<A: Answer<StorageResponse>>(
        &self,
        request: StorageRequest,
    ) -> Result<A, RpcError> {
        let (response, _) = self.send(request, Bytes::new()).await?;
        self.rpc.answer(response)
    }

    /// Sends any storage request with its payload; answers the response and its payload.
    ///
    /// # Errors
    /// The server's error, or [`RpcError`] for transport failures.
    pub async fn send(
        &self,
        request: StorageRequest,
        payload: Bytes,
    ) -> Result<(StorageResponse, Bytes), RpcError> {
        self.rpc.call(&Request::Storage(request), payload).await
    }

    /// Writes `write.data` into the object of `write.file` behind `route` ([`ObjectWrite`]);
    /// answers the bytes written and the write's verifier.
    ///
    /// # Errors
    /// `NoSpace`, `QuotaExceeded`, `UnknownTarget`, `TargetPoisoned`, `TruncatePending`,
    /// `Superseded`, or [`RpcError`] for transport failures.
    pub async fn write(
        &self,
        route: impl Into<Route>,
        write: ObjectWrite,
    ) -> Result<storage_answers::Write, RpcError> {
        let route: Route = route.into();
        let ObjectWrite {
            file: (inode, generation),
            offset,
            data,
            tag,
            capability,
            owner,
        } = write;
        let request = StorageRequest::Write {
            target: route.target,
            mirror: route.mirror,
            inode,
            generation,
            object_offset: offset,
            tag,
            capability,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        };
        let (response, _) = self.send(request, data).await?;
        self.rpc.answer(response)
    }

    /// StorageBench on this server's own targets.
    ///
    /// # Errors
    /// `Busy` (a run is going on), `InvalidArgument`, or [`RpcError`] for transport failures.
    pub async fn storage_bench(
        &self,
        op: weft_proto::messages::StorageBenchOp,
    ) -> Result<storage_answers::Bench, RpcError> {
        self.ask(StorageRequest::Bench { op }).await
    }

    /// Network benchmark: sends `data` (dropped by the server) or asks for `read_len` bytes
    /// (zeros), with no disk I/O on the server. Returns the bytes written or the data read.
    ///
    /// # Errors
    /// `UnknownTarget`, or [`RpcError`] for transport failures.
    pub async fn net_bench(
        &self,
        target: TargetId,
        data: Bytes,
        read_len: u32,
    ) -> Result<(u32, Bytes), RpcError> {
        let request = StorageRequest::NetBench { target, read_len };
        let (response, payload) = self.send(request, data).await?;
        match response {
            StorageResponse::Written { len, .. } => Ok((len, payload)),
            StorageResponse::Data => Ok((payload.len() as u32, payload)),
            other => Err(self.rpc.unexpected(&other)),
        }
    }

    /// Reads up to `len` bytes, as a reader in truncate `generation` of the file; fewer bytes
    /// mean the object ends there.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, `TruncatePending`, or [`RpcError`] for transport failures.
    pub async fn read(
        &self,
        route: impl Into<Route>,
        (inode, generation): (InodeId, u64),
        object_offset: u64,
        len: u32,
        capability: Option<Capability>,
    ) -> Result<Bytes, RpcError> {
        let route: Route = route.into();
        let request = StorageRequest::Read {
            target: route.target,
            mirror: route.mirror,
            inode,
            generation,
            object_offset,
            len,
            capability,
        };
        let (response, payload) = self.send(request, Bytes::new()).await?;
        let storage_answers::Read { .. } = self.rpc.answer(response)?;
        Ok(payload)
    }
}

stubs! {
    StorageClient: StorageRequest, storage_answers;

    /// Cuts an object for truncate `generation` of its file (a no-op where the object had
    /// that truncate or a newer one).
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn truncate(route: Route, file: (InodeId, u64), length: u64) {
        Truncate {
            target: route.target,
            mirror: route.mirror,
            inode: file.0,
            length,
            generation: file.1,
        }
    }

    /// Removes an object.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn remove(route: Route, inode: InodeId) {
        Remove { target: route.target, mirror: route.mirror, inode, tag: None }
    }

    /// Removes the objects of `inodes`, in order, each as [`StorageClient::remove`] does
    /// (protocol version 12).
    ///
    /// # Errors
    /// The first removal's error, `VersionMismatch` from a server of an older version, or
    /// [`RpcError`] for transport failures.
    fn remove_objects(route: Route, inodes: Vec<InodeId>) {
        RemoveObjects { target: route.target, mirror: route.mirror, inodes }
    }

    /// Copies `pieces` of the objects of `source` into the object of `file` at
    /// `object_offset` on the servers (`copy_file_range`); answers the bytes written and the
    /// server's verifier, as a write.
    ///
    /// # Errors
    /// As a write, and the errors of reading the source's objects.
    fn copy_from(
        route: Route,
        file: (InodeId, u64),
        object_offset: u64,
        source: (InodeId, u64),
        pieces: Vec<weft_proto::messages::CopyPiece>,
        tag: Option<ChangeTag>,
        capabilities: (Option<Capability>, Option<Capability>),
        owner: Option<weft_proto::quota::Owner>,
    ) {
        CopyFrom {
            target: route.target,
            inode: file.0,
            generation: file.1,
            object_offset,
            source,
            pieces,
            tag,
            capability: capabilities.0,
            source_capability: capabilities.1,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        }
    }

    /// Removes an object as change `tag` of its sender, so a late copy of the removal,
    /// retried, cannot land after the sender's later changes.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, `Superseded`, or [`RpcError`] for transport failures.
    fn remove_tagged(route: Route, inode: InodeId, tag: ChangeTag) {
        Remove { target: route.target, mirror: route.mirror, inode, tag: Some(tag) }
    }

    /// Makes an object durable; answers the verifier ([`StorageResponse::Synced`]).
    ///
    /// # Errors
    /// `TargetPoisoned`, `Io`, or [`RpcError`] for transport failures.
    fn sync(route: Route, inode: InodeId, capability: Option<Capability>) {
        Sync { target: route.target, mirror: route.mirror, inode, capability }
    }

    /// Allocates or zeroes `len` bytes of an object at `object_offset`, in truncate
    /// generation `file.1` of the file, as client change `tag`.
    ///
    /// # Errors
    /// `NoSpace`, `NotSupported`, `Io`, `TruncatePending`, `Superseded`, or [`RpcError`] for
    /// transport failures.
    fn fallocate(
        route: Route,
        file: (InodeId, u64),
        object_offset: u64,
        len: u64,
        mode: FallocateMode,
        tag: Option<ChangeTag>,
        capability: Option<Capability>,
        owner: Option<weft_proto::quota::Owner>,
    ) {
        Fallocate {
            target: route.target,
            mirror: route.mirror,
            inode: file.0,
            generation: file.1,
            object_offset,
            len,
            mode,
            tag,
            capability,
            owner: owner.map(|owner| (owner.uid, owner.gid)),
            project: owner.map_or(0, |owner| owner.project),
        }
    }

    /// One page of the objects of `home`'s files (of all files: `None`) on `target`, after
    /// inode `after`: of mirrored files, or of plain ones; and whether it is the last.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn list_objects(
        target: TargetId,
        mirrored: bool,
        home: Option<NodeId>,
        after: u64,
        max: u32,
    ) {
        ListObjects { target, mirrored, home, after, max }
    }

    /// An object's length.
    ///
    /// # Errors
    /// `UnknownTarget`, or [`RpcError`] for transport failures.
    fn object_length(route: Route, inode: InodeId) {
        ObjectLength { target: route.target, mirror: route.mirror, inode }
    }

    /// The length of the copy of an object on `target` itself (a mirror member's own copy
    /// when `mirrored`) and the CRC32C of `len` bytes of it at `offset`.
    ///
    /// # Errors
    /// `UnknownTarget`, `Io`, or [`RpcError`] for transport failures.
    fn object_checksum(
        target: TargetId,
        mirrored: bool,
        inode: InodeId,
        offset: u64,
        len: u64,
    ) {
        ObjectChecksum { target, mirrored, inode, offset, len }
    }

    /// Pushes the object of `inode` on `target` to target `to` (or through layouts, `into`;
    /// a mirrored object by the primary of `group`): what changed since the last push, and
    /// with `seal` the last changes of an object sealed first; answers the bytes copied
    /// ([`StorageRequest::Push`]).
    ///
    /// # Errors
    /// `UnknownTarget`, `NoSpace` and the errors of the copy's writes, or [`RpcError`] for
    /// transport failures.
    fn push(
        target: TargetId,
        inode: InodeId,
        to: TargetId,
        id: u64,
        seal: bool,
        into: Option<weft_proto::messages::Restripe>,
        group: Option<weft_proto::ids::GroupId>,
    ) {
        Push { target, inode, to, id, seal, into, group }
    }
}
