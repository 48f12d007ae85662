//! The data path: a file range is cut into chunk pieces by the one layout function in `proto`,
//! and the pieces go to their targets in parallel. Payloads are slices of the caller's buffer,
//! never copied on the way out. [`DataPath`] holds what the data path needs of its own (the
//! cluster view, the retry policy, the verifiers of unsynced writes); what it needs of the
//! file's metadata server (a capability, a queued truncate, a change number) it asks the
//! session for.

use crate::error::ClientError;
use crate::session::Session;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weft_net::retry::RetryPolicy;
use weft_net::{ClusterView, RpcError, StorageClient};
use weft_proto::access::{self, Capability};
use weft_proto::answer::{Synced, Written};
use weft_proto::ids::InodeId;
use weft_proto::layout::{map_requests, object_span, FileLayout, Slot};
use weft_proto::messages::IO_BYTES_MAX;
use weft_proto::messages::{FallocateMode, Route};
use weft_proto::Recovery;

/// A file as its data is addressed: the inode, and the truncate generation its reads and
/// writes are made in (a target refuses a change of an older one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileRef {
    /// The file.
    pub(crate) inode: InodeId,
    /// Its truncate generation as the caller knows it.
    pub(crate) generation: u64,
    /// Its owner, group and project as the caller knows them, for their space quotas.
    pub(crate) owner: weft_proto::quota::Owner,
}

impl FileRef {
    fn wire(self) -> (InodeId, u64) {
        (self.inode, self.generation)
    }
}

/// A read of a piece of file data from the object behind a route.
#[derive(Clone, Copy, Debug)]
pub struct PieceRead {
    /// The file, and the truncate generation the read is made in.
    pub file: (InodeId, u64),
    /// Where in the object.
    pub offset: u64,
    /// Bytes wanted; fewer come back where the object ends.
    pub len: u32,
    /// The file's capability, when the server wants one.
    pub capability: Option<Capability>,
}

/// A write of a piece of file data into the object behind a route.
pub use weft_net::ObjectWrite as PieceWrite;

/// How the data path's reads, writes and syncs reach a storage server, once it has chosen
/// the server and the route: [`Objects`] for every client, the storage servers' objects; a
/// tool may bring its own, as the network benchmark does (requests that cross the network
/// and the protocol but never reach a disk). Fallocate always goes to the objects.
pub trait Transport: Send + Sync {
    /// Reads a piece; answers its bytes.
    fn read(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        piece: PieceRead,
    ) -> BoxFuture<'static, Result<Bytes, RpcError>>;

    /// Writes a piece; answers the bytes written and the server's verifier.
    fn write(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        piece: PieceWrite,
    ) -> BoxFuture<'static, Result<Written, RpcError>>;

    /// Makes the file's object behind `route` durable; answers the server's verifier.
    fn sync(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        inode: InodeId,
        capability: Option<Capability>,
    ) -> BoxFuture<'static, Result<Synced, RpcError>>;
}

/// The storage servers' objects: what every client reads and writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Objects;

impl Transport for Objects {
    fn read(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        piece: PieceRead,
    ) -> BoxFuture<'static, Result<Bytes, RpcError>> {
        Box::pin(async move {
            let PieceRead {
                file,
                offset,
                len,
                capability,
            } = piece;
            storage.read(route, file, offset, len, capability).await
        })
    }

    fn write(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        piece: PieceWrite,
    ) -> BoxFuture<'static, Result<Written, RpcError>> {
        Box::pin(async move { storage.write(route, piece).await })
    }

    fn sync(
        &self,
        storage: Arc<StorageClient>,
        route: Route,
        inode: InodeId,
        capability: Option<Capability>,
    ) -> BoxFuture<'static, Result<Synced, RpcError>> {
        Box::pin(async move { storage.sync(route, inode, capability).await })
    }
}

/// What the data path needs of the client it works for, and no more: the session (its
/// numbering of changes, the capabilities of its opens), a file opened again for a new
/// capability, and a truncate applied through the file's home.
pub(crate) trait DataSession: Sync {
    /// The session the data path's changes are numbered in and its capabilities held by.
    fn session(&self) -> &Session;

    /// Opens `inode` again as the handle that asked for `want` was opened, for a new
    /// capability; false when no open of it asked for that access.
    fn reopen(&self, inode: InodeId, want: u8) -> BoxFuture<'_, Result<bool, ClientError>>;

    /// Has `inode`'s home send its queued truncate to every target now.
    fn apply_truncate(&self, inode: InodeId) -> BoxFuture<'_, Result<(), ClientError>>;
}

/// How long the data path waits before it asks again for a capability a metadata server did
/// not grant while a storage server wanted one ([`DataPath::with_capability`]).
const CAPABILITY_RETRY_SLICE: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether `capability` bounds how far the file's objects may grow (a hard byte limit counts
/// the file).
fn bounds_growth(capability: Capability) -> bool {
    capability
        .growth
        .is_some_and(|bound| bound.object_end != u64::MAX)
}

/// Reads and changes of file data on the storage servers.
pub(crate) struct DataPath {
    cluster: Arc<ClusterView>,
    retry: RetryPolicy,
    transport: Arc<dyn Transport>,
    /// The verifier of the first write since the last sync, per file and slot: a sync that
    /// answers another one means those writes may be lost ([`DataPath::sync`]).
    unsynced: Mutex<HashMap<(InodeId, Slot), u64>>,
}

impl DataPath {
    pub(crate) fn new(
        cluster: Arc<ClusterView>,
        retry: RetryPolicy,
        transport: Arc<dyn Transport>,
    ) -> DataPath {
        DataPath {
            cluster,
            retry,
            transport,
            unsynced: Mutex::default(),
        }
    }

    /// Runs `attempt` with the capability of `inode` granting `want`, if an open of the file
    /// was granted one; when the storage server wants one it did not get (none was granted
    /// yet, or it expired, or was another session's), opens the file again for a new one, as
    /// the handle that asked that access was opened, and runs `attempt` once more. A storage
    /// server may learn of a new rule for this client before the file's metadata server does,
    /// which then grants nothing: the open is asked again, every [`CAPABILITY_RETRY_SLICE`],
    /// until it grants one or the operation's deadline passes.
    ///
    /// # Errors
    /// What `attempt` gave, or what the open again gave.
    async fn with_capability<T, F, Fut>(
        &self,
        session: &impl DataSession,
        inode: InodeId,
        want: u8,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Option<Capability>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let capability = || {
            let session = session.session();
            session.opens.capability(inode, want, session.id())
        };
        self.within(async {
            let mut granted = capability();
            let mut bound_renewed = false;
            loop {
                match attempt(granted).await {
                    Err(error)
                        if error.code() == weft_proto::ErrorCode::QuotaExceeded
                            && !bound_renewed
                            && granted.is_some_and(bounds_growth) =>
                    {
                        // The bound on the objects' growth was reckoned for the file's
                        // pattern when it was granted: a restripe since may spread the same
                        // room differently. One new grant, for the pattern the home has now,
                        // decides.
                        bound_renewed = true;
                        if !session.reopen(inode, want).await? {
                            return Err(error);
                        }
                        granted = capability();
                    }
                    Err(error) if error.code().recovery() == Recovery::Reopen => {
                        if !weft_net::retry::time_left(CAPABILITY_RETRY_SLICE)
                            || !session.reopen(inode, want).await?
                        {
                            return Err(error);
                        }
                        granted = capability();
                        if granted.is_none() {
                            // The metadata server does not know the rule the storage server
                            // applies yet.
                            tokio::time::sleep(CAPABILITY_RETRY_SLICE).await;
                        }
                    }
                    other => return other,
                }
            }
        })
        .await
    }

    /// Runs `work`, a step of an operation on file data, under the operation's one deadline
    /// (the retry policy's time, or the deadline of an operation it is part of).
    fn within<F: std::future::Future>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        weft_net::retry::within(self.retry.total_timeout, work)
    }

    /// Runs `call` on the server of `slot` for file `inode` under the retry policy. An
    /// object that still waits for a truncate of the file it missed (`TruncatePending`: its
    /// target was away when the truncate was made) gets it first, through the file's home,
    /// and the call goes again.
    async fn on_slot<T, F, Fut>(
        &self,
        session: &impl DataSession,
        inode: InodeId,
        slot: Slot,
        call: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(Arc<StorageClient>, Route) -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        self.within(async {
                loop {
                    match self.cluster.call_storage(slot, &self.retry, &call).await {
                        Err(RpcError::Remote(error))
                            if error.code.recovery() == Recovery::ApplyTruncate
                                && weft_net::retry::time_left(std::time::Duration::ZERO) =>
                        {
                            tracing::debug!(%inode, %slot, "an object waits for a truncate: applying it");
                            session.apply_truncate(inode).await?;
                        }
                        result => return Ok(result?),
                    }
                }
            })
            .await
    }

    /// Forgets the verifiers of a file's writes not synced yet, once no open file of it is
    /// left here to fsync them.
    pub(crate) fn forget_unsynced(&self, inode: InodeId) {
        self.unsynced
            .lock()
            .expect("unsynced writes poisoned")
            .retain(|(written, _), _| *written != inode);
    }
}

/// Pieces of the range, each one request.
fn pieces(layout: &FileLayout, offset: u64, len: u64) -> Vec<weft_proto::layout::ChunkPiece> {
    map_requests(layout, offset, len, u64::from(IO_BYTES_MAX))
}

/// A file range as read from its targets: the pieces' buffers in file order (holes as zeros),
/// joined into one buffer only for a caller that needs one, and copied at most once into a
/// caller's own buffer.
#[derive(Clone, Debug, Default)]
pub struct ReadData {
    parts: Vec<Bytes>,
}

impl ReadData {
    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(Bytes::is_empty)
    }

    /// Bytes `[from, to)`, without a copy.
    ///
    /// # Panics
    /// If `to` is past the end or `from` past `to`.
    pub fn slice(&self, from: usize, to: usize) -> ReadData {
        assert!(
            from <= to && to <= self.len(),
            "slice {from}..{to} of {}",
            self.len()
        );
        let mut parts = Vec::new();
        let mut at = 0;
        for part in &self.parts {
            let (start, end) = (at, at + part.len());
            at = end;
            if end <= from || start >= to {
                continue;
            }
            parts.push(part.slice(from.max(start) - start..to.min(end) - start));
        }
        ReadData { parts }
    }

    /// The bytes in one buffer: a single part as it is, several joined.
    pub fn into_bytes(mut self) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts.pop().expect("one part");
        }
        let mut joined = BytesMut::with_capacity(self.len());
        for part in &self.parts {
            joined.extend_from_slice(part);
        }
        joined.freeze()
    }

    /// Copies the bytes to the start of `buffer`; returns how many.
    ///
    /// # Panics
    /// If `buffer` is shorter than the data.
    pub fn copy_to(&self, buffer: &mut [u8]) -> usize {
        let mut at = 0;
        for part in &self.parts {
            buffer[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        at
    }
}

impl DataPath {
    /// Reads `[offset, offset + len)` of `file`, clamped to `size`; holes read as zeros.
    pub(crate) async fn read(
        &self,
        session: &impl DataSession,
        file: FileRef,
        layout: &FileLayout,
        (offset, len): (u64, u64),
        size: u64,
    ) -> Result<ReadData, ClientError> {
        let end = offset.saturating_add(len).min(size);
        if end <= offset {
            return Ok(ReadData::default());
        }
        let inode = file.inode;
        let requests = pieces(layout, offset, end - offset)
            .into_iter()
            .map(|piece| async move {
                let slot = layout.slot(piece.slot_index);
                let len = piece.len as u32;
                let data = self
                    .with_capability(session, inode, access::READ, |capability| {
                        self.on_slot(session, inode, slot, move |storage, route| {
                            let read = PieceRead {
                                file: file.wire(),
                                offset: piece.object_offset,
                                len,
                                capability,
                            };
                            self.transport.read(storage, route, read)
                        })
                    })
                    .await?;
                Ok::<_, ClientError>((piece, data))
            });
        // Pieces come back in file order; a short one is a hole and reads as zeros.
        let mut parts = Vec::new();
        for result in futures::future::join_all(requests).await {
            let (piece, data) = result?;
            let count = data.len().min(piece.len as usize);
            if count > 0 {
                parts.push(data.slice(..count));
            }
            if count < piece.len as usize {
                // No piece is longer than a request, so the shared zeros cover any hole.
                parts.push(weft_proto::messages::zeros(piece.len as usize - count));
            }
        }
        let data = ReadData { parts };
        debug_assert_eq!(data.len() as u64, end - offset);
        Ok(data)
    }

    /// Writes `data` at `offset` of `file`: every piece to its target, each a change of its
    /// own (two pieces may go to the same server). A target that takes fewer bytes than it
    /// was sent fails the write.
    pub(crate) async fn write(
        &self,
        session: &impl DataSession,
        file: FileRef,
        layout: &FileLayout,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let inode = file.inode;
        let requests = pieces(layout, offset, data.len() as u64)
            .into_iter()
            .map(|piece| {
                let at = (piece.file_offset - offset) as usize;
                let slice = data.slice(at..at + piece.len as usize);
                async move {
                    let slot = layout.slot(piece.slot_index);
                    let mut change = session.session().begin_change();
                    let sent = self
                        .with_capability(session, inode, access::WRITE, |capability| {
                            let (slice, change) = (&slice, &change);
                            self.on_slot(session, inode, slot, move |storage, route| {
                                let write = PieceWrite {
                                    file: file.wire(),
                                    offset: piece.object_offset,
                                    data: slice.clone(),
                                    tag: Some(change.tag()),
                                    capability,
                                    owner: Some(file.owner),
                                };
                                self.transport.write(storage, route, write)
                            })
                        })
                        .await;
                    self.written(&mut change, (inode, slot), &piece, sent)
                }
            });
        for result in futures::future::join_all(requests).await {
            result?;
        }
        Ok(())
    }

    /// The end of a piece written to `slot` (by a write or a copy), as change `change`: a
    /// failure or a short answer fails the change, and the verifier of the first write since
    /// the last sync is kept for the sync to check.
    fn written(
        &self,
        change: &mut crate::session::Change<'_>,
        (inode, slot): (InodeId, Slot),
        piece: &weft_proto::layout::ChunkPiece,
        sent: Result<Written, ClientError>,
    ) -> Result<(), ClientError> {
        let Written {
            len: written,
            verifier,
        } = sent.inspect_err(|_| change.failed())?;
        if u64::from(written) != piece.len {
            change.failed();
            return Err(ClientError::ShortWrite {
                inode,
                slot,
                offset: piece.object_offset,
                sent: piece.len,
                written: u64::from(written),
            });
        }
        self.unsynced
            .lock()
            .expect("unsynced writes poisoned")
            .entry((inode, slot))
            .or_insert(verifier);
        Ok(())
    }

    /// Makes `inode`'s data durable on every slot of its layout, and checks that no write
    /// acknowledged since the last sync was lost meanwhile (its verifier changed): also on
    /// slots the file moved away from since, whose servers took writes that the move copied
    /// (a server that restarted before the copy lost them, and tells so by its verifier).
    pub(crate) async fn sync(
        &self,
        session: &impl DataSession,
        inode: InodeId,
        layout: &FileLayout,
    ) -> Result<(), ClientError> {
        let mut slots: Vec<Slot> = layout.slots().collect();
        {
            let map = self.cluster.map();
            let mut unsynced = self.unsynced.lock().expect("unsynced writes poisoned");
            // A target removed from the cluster (drained first), or a storage mirror group
            // removed with its drained member, cannot tell any more.
            unsynced.retain(|&(written, slot), _| {
                written != inode || !map.slot_targets(slot).is_empty()
            });
            slots.extend(
                unsynced
                    .keys()
                    .filter(|(written, slot)| {
                        *written == inode && !layout.slots().any(|s| s == *slot)
                    })
                    .map(|(_, slot)| *slot)
                    .collect::<Vec<_>>(),
            );
        }
        let requests = slots.into_iter().map(|slot| async move {
            let Synced { verifier } = self
                .with_capability(session, inode, 0, |capability| {
                    self.on_slot(session, inode, slot, move |storage, route| {
                        self.transport.sync(storage, route, inode, capability)
                    })
                })
                .await?;
            let written = self
                .unsynced
                .lock()
                .expect("unsynced writes poisoned")
                .remove(&(inode, slot));
            match written {
                Some(written) if written != verifier => {
                    Err(ClientError::WritesLost { inode, slot })
                }
                _ => Ok(()),
            }
        });
        for result in futures::future::join_all(requests).await {
            result?;
        }
        Ok(())
    }

    /// Copies `len` bytes at `from` of `source` (laid out as `source_layout`) to `to` of
    /// `file`, each piece of `file`'s objects by its storage server, which reads the source's
    /// objects itself: the data never reaches this client. Both layouts are striped over
    /// targets.
    pub(crate) async fn copy(
        &self,
        session: &impl DataSession,
        (file, layout): (FileRef, &FileLayout),
        (source, source_layout): (FileRef, &FileLayout),
        (from, to, len): (u64, u64, u64),
    ) -> Result<(), ClientError> {
        let inode = file.inode;
        let requests = pieces(layout, to, len).into_iter().map(|piece| async move {
            let slot = layout.slot(piece.slot_index);
            let start = from + (piece.file_offset - to);
            let parts: Vec<weft_proto::messages::CopyPiece> =
                weft_proto::layout::map_range(source_layout, start, piece.len)
                    .into_iter()
                    .filter_map(|part| match source_layout.slot(part.slot_index) {
                        Slot::Target(target) => Some(weft_proto::messages::CopyPiece {
                            target,
                            offset: part.object_offset,
                            len: part.len as u32,
                        }),
                        Slot::Group(_) => None,
                    })
                    .collect();
            let mut change = session.session().begin_change();
            let sent = self
                .with_capability(session, source.inode, access::READ, |source_capability| {
                    let (parts, change) = (&parts, &change);
                    self.with_capability(session, inode, access::WRITE, move |capability| {
                        self.on_slot(session, inode, slot, move |storage, route| {
                            let parts = parts.clone();
                            let tag = change.tag();
                            async move {
                                storage
                                    .copy_from(
                                        route,
                                        file.wire(),
                                        piece.object_offset,
                                        source.wire(),
                                        parts,
                                        Some(tag),
                                        (capability, source_capability),
                                        Some(file.owner),
                                    )
                                    .await
                            }
                        })
                    })
                })
                .await;
            self.written(&mut change, (inode, slot), &piece, sent)
        });
        for result in futures::future::join_all(requests).await {
            result?;
        }
        Ok(())
    }

    /// Allocates or zeroes the file range `[offset, offset + len)` on every target it
    /// touches, one request per target (a file range is contiguous in each object).
    pub(crate) async fn fallocate(
        &self,
        session: &impl DataSession,
        file: FileRef,
        layout: &FileLayout,
        (offset, len): (u64, u64),
        mode: FallocateMode,
    ) -> Result<(), ClientError> {
        let inode = file.inode;
        let requests = layout.slots().enumerate().filter_map(|(index, slot)| {
            let span = object_span(layout, index, offset, len);
            (!span.is_empty()).then_some(async move {
                let mut change = session.session().begin_change();
                self.with_capability(session, inode, access::WRITE, |capability| {
                    let (span, change) = (&span, &change);
                    self.on_slot(session, inode, slot, move |storage, route| {
                        let span = span.clone();
                        let tag = change.tag();
                        async move {
                            let len = span.end - span.start;
                            storage
                                .fallocate(
                                    route,
                                    file.wire(),
                                    span.start,
                                    len,
                                    mode,
                                    Some(tag),
                                    capability,
                                    Some(file.owner),
                                )
                                .await
                        }
                    })
                })
                .await
                .inspect_err(|_| change.failed())
            })
        });
        for result in futures::future::join_all(requests).await {
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(parts: &[&'static [u8]]) -> ReadData {
        ReadData {
            parts: parts.iter().map(|p| Bytes::from_static(p)).collect(),
        }
    }

    // Goal: a range of pieces reads the same sliced, joined or copied, at every boundary.
    #[test]
    fn read_data_slices_joins_and_copies_across_pieces() {
        let whole = data(&[b"abc", b"", b"defg", b"hi"]);
        assert_eq!(whole.len(), 9);
        assert_eq!(&whole.clone().into_bytes()[..], b"abcdefghi");
        for from in 0..=9 {
            for to in from..=9 {
                let part = whole.slice(from, to);
                assert_eq!(&part.clone().into_bytes()[..], &b"abcdefghi"[from..to]);
                let mut buffer = [0u8; 9];
                assert_eq!(part.copy_to(&mut buffer), to - from);
                assert_eq!(&buffer[..to - from], &b"abcdefghi"[from..to]);
            }
        }
        assert!(data(&[b""]).is_empty() && ReadData::default().is_empty());
    }
}
