//! Open files: what this client knows of a file it has open beyond its metadata server, and
//! the handle ([`OpenFile`]) the mount and native callers read and write through. Admission of
//! writes, read-ahead, sticky errors and the size this client wrote exist here once.
//!
//! Size: a write goes to storage before it is answered; this client then knows a larger size
//! than the metadata server until the size is reported (at every flush, i.e. close, and at
//! fsync). So it remembers, per inode, the largest end it wrote in the current truncate
//! generation and never tells a smaller size than that ([`crate::Client::known`]).
//!
//! Errors: as Linux's errseq, a file counts its write errors and keeps the last; every handle
//! open when one happened reports it once at its next fsync (and at every flush until then),
//! whichever handle's write or sync met it.

use crate::ahead::ReadAhead;
use crate::behind::InFlight;
use crate::client::{Client, ClientError};
use crate::io::FileRef;
use crate::ReadData;
use bytes::Bytes;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weft_proto::ids::InodeId;
use weft_proto::layout::{FileLayout, SlotSet};
use weft_proto::messages::{FallocateMode, FileKind, InodeAttr, SizeReport};
use weft_proto::quota::Owner;

/// Growth of a file by this client's writes after which it reports the size while the file
/// stays open ([`Shared::report_when_grown`]).
const REPORT_GROWTH_BYTES: u64 = 64 << 20;

/// What this client knows of one file it has open, beyond its metadata server.
#[derive(Default)]
struct Known {
    /// Open handles of this client.
    opens: u32,
    /// Truncate generation of the writes below.
    generation: u64,
    /// Largest end written by this client in `generation`.
    written_end: u64,
    /// The slots of the layout this client wrote to in `generation`, sent with every report.
    written: SlotSet,
    /// Of those, the slots a write behind has reached in `generation`.
    landed: SlotSet,
    /// Whether a report of the size made while the file stays open is on its way.
    reporting: bool,
    /// Largest end already reported to the metadata server.
    reported_end: u64,
    /// The size the metadata server last told.
    size: u64,
    /// The owner, group and project the metadata server last told.
    owner: Owner,
    /// Changes of the data this client made (writes, allocations, punched ranges) and how
    /// many of them the metadata server has heard of: a report moves the file's mtime only
    /// when it covers a new one.
    changes: u64,
    reported_changes: u64,
    /// Bumped by every change of the file's data this client makes or learns of (writes,
    /// truncates, allocations): read-ahead windows of an older version are dropped.
    data_version: u64,
    /// How many write errors the file had, and the last one.
    errors: u64,
    last_error: Option<ClientError>,
    /// The file's layout as last heard of (it changes when the file moves to other targets).
    layout: Option<Arc<FileLayout>>,
    /// The end of what this client allocated past the size in `generation` (`fallocate` with
    /// `KEEP_SIZE`), reported for the file's quotas.
    allocated_end: u64,
    /// The end the file's home reserved room for this client's opens to grow it to, when its
    /// owner, group or project has a hard byte limit (`Client::reserve`); 0 before any.
    room: u64,
}

impl Known {
    /// Forgets the writes of an older truncate generation: `generation` is the file's now.
    fn truncated(&mut self, generation: u64) {
        self.data_version += 1;
        self.generation = generation;
        self.written_end = 0;
        self.written = SlotSet::default();
        self.landed = SlotSet::default();
        self.reported_end = 0;
        self.allocated_end = 0;
    }
}

/// One file open here, shared by its handles: what is known of it and its writes in flight.
pub(crate) struct Shared {
    inode: InodeId,
    known: Mutex<Known>,
    inflight: Arc<InFlight>,
}

impl Shared {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().expect("open file poisoned")
    }

    /// Reports the size in the background once this client's writes grew the file by
    /// [`REPORT_GROWTH_BYTES`] since its last report, without waiting for a close or fsync:
    /// a file's bytes count in its quotas from its reports, so a writer that keeps a file
    /// open cannot go far past a quota unnoticed.
    fn report_when_grown(self: &Arc<Self>, client: &Arc<Client>) {
        {
            let mut known = self.known();
            if known.reporting
                || known.written_end.saturating_sub(known.reported_end) < REPORT_GROWTH_BYTES
            {
                return;
            }
            known.reporting = true;
        }
        let (shared, client) = (Arc::clone(self), Arc::clone(client));
        let report = async move {
            if let Err(error) = shared.report_size(&client, false).await {
                tracing::debug!(inode = %shared.inode, %error, "a size report of an open file failed");
            }
            shared.known().reporting = false;
        };
        match weft_net::stubs::acting_caller() {
            Some(caller) => tokio::spawn(weft_net::stubs::acting_for(caller, report)),
            None => tokio::spawn(report),
        };
    }

    /// What a read goes by, read together: the size reads are clamped to (what the server
    /// said, or what this client wrote), the data version read-ahead checks, and the
    /// truncate generation the read is made in.
    fn view(&self) -> ReadView {
        let known = self.known();
        ReadView {
            file: FileRef {
                inode: self.inode,
                generation: known.generation,
                owner: known.owner,
            },
            size: known.size.max(known.written_end),
            version: known.data_version,
        }
    }

    /// The file's layout.
    fn layout(&self) -> Result<Arc<FileLayout>, ClientError> {
        self.known()
            .layout
            .clone()
            .ok_or(ClientError::NoLayout { inode: self.inode })
    }

    /// Runs `op` with the file's layout. An object that moved away (`Moved`: the file was
    /// migrated, or its target drained) has the layout fetched again and `op` run with the new
    /// one; while the layout is still the old one (its move is making its last copies), again
    /// after a pause, until the operation's deadline ([`Client::within`]).
    async fn with_layout<T, F, Fut>(&self, client: &Client, op: F) -> Result<T, ClientError>
    where
        F: Fn(Arc<FileLayout>) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        client
            .within(async {
                let mut pause = std::time::Duration::from_millis(10);
                loop {
                    let layout = self.layout()?;
                    match op(Arc::clone(&layout)).await {
                        Err(error) if error.code().recovery() == weft_proto::Recovery::Relayout => {
                            // The new layout is learnt as any attributes are
                            // (`OpenFiles::merge`).
                            client.known(client.get_attr(self.inode).await?);
                            if *self.layout()? != *layout {
                                tracing::debug!(inode = %self.inode, "the file moved: its new layout is used");
                                continue;
                            }
                            if !weft_net::retry::time_left(pause) {
                                return Err(error);
                            }
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(std::time::Duration::from_millis(500));
                        }
                        result => return result,
                    }
                }
            })
            .await
    }

    fn file_ref(&self) -> FileRef {
        let known = self.known();
        FileRef {
            inode: self.inode,
            generation: known.generation,
            owner: known.owner,
        }
    }

    /// Notes a change that makes the file at least `end` bytes long and, for a write, the
    /// slots it wrote data to (an allocation writes none: its range reads as zeros with or
    /// without an object); answers the slots not noted before.
    fn note_write(&self, end: u64, written: SlotSet) -> SlotSet {
        let mut known = self.known();
        known.written_end = known.written_end.max(end);
        let mut added = written;
        added.retain(|index| !known.written.contains(index));
        known.written.extend(written);
        known.data_version += 1;
        known.changes += 1;
        added
    }

    /// Settles a write behind of `written` (its slots): reached, or failed with the slots
    /// it noted first (`note_write`'s answer) taken back but for those another write
    /// reached. The metadata server must not take a slot no write reached for one whose data
    /// is lost when its object is missing (a write refused by a quota, onto a slot with no
    /// object yet).
    fn settle_written(&self, written: SlotSet, noted: SlotSet, landed: bool) {
        let mut known = self.known();
        if landed {
            known.landed.extend(written);
            return;
        }
        let reached = known.landed;
        known
            .written
            .retain(|index| !noted.contains(index) || reached.contains(index));
    }

    /// Makes room to grow the file to `end` through open `handle`: when the file's owner,
    /// group or project has a hard byte limit in its pool, growth past the room its home
    /// reserved asks the home for more first (the home answers a batch beyond `end`, so a
    /// streaming writer asks once per batch).
    ///
    /// # Errors
    /// `QuotaExceeded` when the home has no room left up to `end`, or the request's error.
    async fn make_room(&self, client: &Client, handle: u64, end: u64) -> Result<(), ClientError> {
        let (owner, pool) = {
            let known = self.known();
            if end <= known.room.max(known.size) {
                return Ok(());
            }
            let Some(layout) = known.layout.as_ref() else {
                return Ok(());
            };
            (known.owner, layout.pattern.pool)
        };
        let map = client.cluster.map();
        if !map.hard_limited(owner, pool, weft_proto::quota::Growth::Bytes) {
            return Ok(());
        }
        let room = client.reserve(self.inode, handle, end).await?;
        let mut known = self.known();
        if room == u64::MAX {
            // The home knows no limit (its map may be older than this client's): this write
            // goes on, and the next growth asks again.
            return Ok(());
        }
        known.room = known.room.max(room);
        if known.room < end {
            return Err(ClientError::Rpc(weft_net::RpcError::Remote(weft_proto::error::WireError::new(
                weft_proto::ErrorCode::QuotaExceeded,
                format!(
                    "{} has room to grow to {} bytes, and a write would take it to {end}: a quota of its owner, group or project is at its hard limit (weft quota list)",
                    self.inode, known.room
                ),
            ))));
        }
        Ok(())
    }

    /// Notes a change of the data that leaves its size alone (a punched or zeroed range):
    /// read-ahead windows read before it are dropped.
    fn note_change(&self) {
        let mut known = self.known();
        known.data_version += 1;
        known.changes += 1;
    }

    /// Records a write error: every handle open now reports it once.
    fn record_error(&self, error: ClientError) {
        let mut known = self.known();
        known.errors += 1;
        known.last_error = Some(error);
    }

    /// The last write error, if there were more than `seen`.
    fn error_since(&self, seen: u64) -> Option<ClientError> {
        let known = self.known();
        (known.errors > seen)
            .then(|| known.last_error.clone())
            .flatten()
    }

    /// The last write error, if there were more than `seen`, and `seen` moved up to how many
    /// there were: under the lock, so one error is taken once.
    fn take_error(&self, seen: &AtomicU64) -> Option<ClientError> {
        let known = self.known();
        let before = seen.swap(known.errors, Ordering::AcqRel);
        (known.errors > before)
            .then(|| known.last_error.clone())
            .flatten()
    }

    /// Reports this client's written size and changes to `client`'s metadata server if there
    /// is anything new since the last report (always, when the size must be made durable).
    pub(crate) async fn report_size(
        &self,
        client: &Client,
        durable: bool,
    ) -> Result<(), ClientError> {
        let (report, changes) = {
            let known = self.known();
            let modified = known.changes > known.reported_changes;
            if known.written_end <= known.reported_end && !modified && !durable {
                return Ok(());
            }
            let report = SizeReport {
                size: known.written_end,
                truncate_generation: known.generation,
                durable,
                modified,
                written: known.written,
                allocated: known.allocated_end,
            };
            (report, known.changes)
        };
        let attr = client.report_size(self.inode, report).await?;
        let mut known = self.known();
        if known.generation == report.truncate_generation {
            known.reported_end = known.reported_end.max(report.size);
        }
        known.reported_changes = known.reported_changes.max(changes);
        known.size = attr.size;
        Ok(())
    }

    /// Whether a report now may name a slot that only a write still on its way wrote: one no
    /// write behind has reached. (A slot written without write-behind is never among those
    /// reached, but nothing of it is on its way: waiting for the writes in flight then costs
    /// nothing.)
    fn names_unlanded_slots(&self) -> bool {
        let known = self.known();
        let mut unlanded = known.written;
        unlanded.retain(|index| !known.landed.contains(index));
        !unlanded.is_empty()
    }

    /// Waits until every write in flight is done.
    pub(crate) async fn drain(&self) {
        self.inflight.drain().await;
    }
}

/// Most bytes one `copy_file_range` copies: the kernel asks again for the rest.
pub const COPY_BYTES_MAX: u64 = 64 << 20;

/// What a read of a file goes by ([`Shared::view`]).
#[derive(Clone, Copy)]
struct ReadView {
    file: FileRef,
    /// The size reads are clamped to.
    size: u64,
    /// The data version read-ahead windows are checked against.
    version: u64,
}

/// The files this client has open, by inode.
pub(crate) struct OpenFiles {
    inodes: Mutex<HashMap<InodeId, Arc<Shared>>>,
    next_handle: AtomicU64,
    /// Bytes of writes each file may have in flight (0: every write waits for the servers).
    write_behind: u32,
    /// Bytes per read-ahead window (0: no read-ahead).
    read_ahead: u64,
}

impl OpenFiles {
    pub(crate) fn new(write_behind: u32, read_ahead: u64) -> OpenFiles {
        OpenFiles {
            inodes: Mutex::default(),
            next_handle: AtomicU64::new(1),
            write_behind,
            read_ahead,
        }
    }

    fn inodes(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, Arc<Shared>>> {
        self.inodes.lock().expect("open files poisoned")
    }

    /// A number for a new handle, unique in this client.
    pub(crate) fn next_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// The file `inode`, if it is open here.
    pub(crate) fn get(&self, inode: InodeId) -> Option<Arc<Shared>> {
        self.inodes().get(&inode).cloned()
    }

    /// Records a new handle of the file `attr` describes (as its open answered).
    fn add(&self, attr: &InodeAttr) -> Arc<Shared> {
        let shared = {
            let mut inodes = self.inodes();
            let shared = inodes.entry(attr.inode).or_insert_with(|| {
                Arc::new(Shared {
                    inode: attr.inode,
                    known: Mutex::new(Known {
                        generation: attr.truncate_generation,
                        layout: attr.layout.clone().map(Arc::new),
                        ..Known::default()
                    }),
                    inflight: Arc::new(InFlight::new(self.write_behind.max(1))),
                })
            });
            shared.known().opens += 1;
            Arc::clone(shared)
        };
        self.merge(attr.clone());
        shared
    }

    /// One handle of the file `shared` closed; after the last, the file is forgotten here
    /// and `last` runs, under the table's lock: no open of the file can come between (its
    /// writes would otherwise be forgotten with the closed ones).
    fn closed(&self, shared: &Arc<Shared>, last: impl FnOnce()) {
        let mut inodes = self.inodes();
        let mut known = shared.known();
        known.opens = known.opens.saturating_sub(1);
        if known.opens > 0 {
            return;
        }
        drop(known);
        if inodes
            .get(&shared.inode)
            .is_some_and(|listed| Arc::ptr_eq(listed, shared))
        {
            inodes.remove(&shared.inode);
        }
        last();
    }

    /// Kept attributes as [`OpenFiles::merge`] would give them now, without learning from them;
    /// `None` when they are of another truncate generation or layout than this client's, or
    /// a size report of the open file went out since (a report of its growth, sent while it
    /// stays open, moves its times at the home).
    pub(crate) fn view(&self, mut attr: InodeAttr) -> Option<InodeAttr> {
        if attr.kind != FileKind::Regular {
            return Some(attr);
        }
        let Some(shared) = self.get(attr.inode) else {
            return Some(attr);
        };
        let known = shared.known();
        let same_layout = match (&attr.layout, known.layout.as_deref()) {
            (Some(kept), Some(current)) => kept == current,
            _ => true,
        };
        let reported_since = known.reporting || known.reported_end > attr.size;
        if known.generation != attr.truncate_generation || !same_layout || reported_since {
            return None;
        }
        attr.size = attr.size.max(known.written_end);
        Some(attr)
    }

    /// The attributes as this client knows them: the server's, with this client's
    /// unreported size; what the server said is remembered, and a truncate by another
    /// client (a newer generation) drops this client's older writes.
    pub(crate) fn merge(&self, mut attr: InodeAttr) -> InodeAttr {
        if attr.kind != FileKind::Regular {
            return attr;
        }
        let Some(shared) = self.get(attr.inode) else {
            return attr;
        };
        let mut known = shared.known();
        known.size = attr.size;
        known.owner = Owner {
            uid: attr.uid,
            gid: attr.gid,
            project: attr.project,
        };
        if let Some(layout) = &attr.layout {
            if known.layout.as_deref() != Some(layout) {
                let restriped = known.layout.as_deref().is_some_and(|old| {
                    (old.pattern.chunk_size_bytes, old.width())
                        != (layout.pattern.chunk_size_bytes, layout.width())
                });
                if restriped {
                    // The slots written name places in the old pattern; the file's home
                    // took the new one's from its objects.
                    known.written = SlotSet::default();
                    known.landed = SlotSet::default();
                }
                known.layout = Some(Arc::new(layout.clone()));
            }
        }
        if known.generation == attr.truncate_generation {
            attr.size = attr.size.max(known.written_end);
        } else if attr.truncate_generation > known.generation {
            known.truncated(attr.truncate_generation);
        }
        attr
    }

    /// This client set the size of `inode` (a truncate): its writes before no longer count.
    pub(crate) fn truncated(&self, attr: &InodeAttr) {
        if let Some(shared) = self.get(attr.inode) {
            let mut known = shared.known();
            known.truncated(attr.truncate_generation);
            known.size = attr.size;
        }
    }

    /// Records a write error of `inode` (or the loss of its locks or open): every handle open
    /// now reports it once.
    pub(crate) fn record_error(&self, inode: InodeId, error: ClientError) {
        if let Some(shared) = self.get(inode) {
            shared.record_error(error);
        }
    }
}

/// A file this client has open ([`Client::open_file`], [`Client::create_file`]): reads with
/// read-ahead, writes written behind within a byte budget, and the file's write errors
/// reported as Linux reports them. Dropping it without [`OpenFile::close`] closes it in the
/// background (see its `Drop`).
///
/// Writes written behind are answered once on their way; a read
/// waits for those it overlaps, and [`OpenFile::flush`], [`OpenFile::sync`],
/// [`OpenFile::allocate`] and [`OpenFile::close`] wait for all of them.
pub struct OpenFile {
    client: Arc<Client>,
    handle: u64,
    shared: Arc<Shared>,
    /// How many of the file's write errors this handle reported (or were before it opened).
    errors_seen: AtomicU64,
    /// What was read ahead for this handle. Windows live as long as their handle, which
    /// keeps the close-to-open promise: an open never sees data read before it.
    ahead: ReadAhead,
    /// Set by the close (or the drop): the handle is forgotten here once.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for OpenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenFile")
            .field("inode", &self.shared.inode)
            .field("handle", &self.handle)
            .finish()
    }
}

impl OpenFile {
    /// Handle `handle` of `client`, just opened on the file `attr` describes.
    pub(crate) fn opened(client: &Arc<Client>, handle: u64, attr: &InodeAttr) -> OpenFile {
        let shared = client.files.add(attr);
        // Errors from before this open are not this handle's to report.
        let errors_seen = AtomicU64::new(shared.known().errors);
        OpenFile {
            client: Arc::clone(client),
            handle,
            shared,
            errors_seen,
            ahead: ReadAhead::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The file.
    pub fn inode(&self) -> InodeId {
        self.shared.inode
    }

    /// The handle's number, as its metadata server knows it.
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The file's layout.
    ///
    /// # Errors
    /// [`ClientError::NoLayout`] when the open entry is not a regular file.
    pub fn layout(&self) -> Result<Arc<FileLayout>, ClientError> {
        self.shared.layout()
    }

    /// The file's write error this handle has not reported by a sync yet, left for it.
    fn pending_error(&self) -> Option<ClientError> {
        self.shared
            .error_since(self.errors_seen.load(Ordering::Acquire))
    }

    /// The file's write error this handle has not reported by a sync yet, now reported.
    fn take_error(&self) -> Option<ClientError> {
        self.shared.take_error(&self.errors_seen)
    }

    /// Records a write error that this handle reports now, as its answer: the file's other
    /// handles report it at their next sync.
    fn report_error(&self, error: &ClientError) {
        self.shared.record_error(error.clone());
        self.take_error();
    }

    /// Reads `len` bytes at `offset`; shorter at the end of the file as this client knows
    /// it, holes as zeros. After two reads in a row that continue each other, the next
    /// windows are read ahead. The answer stays in the pieces it arrived in
    /// ([`ReadData::copy_to`] moves it into a caller's buffer with one copy).
    ///
    /// # Errors
    /// The read's error; a failed read-ahead window is read again directly.
    pub async fn read(&self, offset: u64, len: u64) -> Result<ReadData, ClientError> {
        let layout = self.layout()?;
        let view = self.shared.view();
        let fetch = |window| self.read_window(Arc::clone(&layout), window, view);
        let ahead = self.ahead.read(
            (offset, len),
            crate::ahead::FileNow {
                version: view.version,
                size: view.size,
            },
            self.client.files.read_ahead,
            fetch,
        );
        if let Some(data) = ahead.await {
            return Ok(data);
        }
        // A client reads its own writes.
        let end = offset.saturating_add(len);
        self.shared.inflight.wait_clear((offset, end)).await;
        let client = &self.client;
        self.shared
            .with_layout(client, |layout| async move {
                client
                    .data
                    .read(&**client, view.file, &layout, (offset, len), view.size)
                    .await
            })
            .await
    }

    /// Reads `[start, start + len)` in the background, after the writes in flight there.
    fn read_window(
        &self,
        layout: Arc<FileLayout>,
        (start, len): (u64, u64),
        view: ReadView,
    ) -> BoxFuture<'static, Option<ReadData>> {
        let (client, shared) = (Arc::clone(&self.client), Arc::clone(&self.shared));
        let task = tokio::spawn(async move {
            shared.inflight.wait_clear((start, start + len)).await;
            // A window of a file that moved is read again directly.
            client
                .data
                .read(&*client, view.file, &layout, (start, len), view.size)
                .await
                .ok()
        });
        Box::pin(async move { task.await.ok().flatten() })
    }

    /// Writes `data` at `offset`. With a write-behind budget the write is answered once it
    /// is admitted into flight (after the writes it overlaps, within the budget); its failure
    /// is then the answer of this handle's next write, flush or sync. Without one, the write
    /// is answered when its targets took it.
    ///
    /// # Errors
    /// An earlier write's failure not reported yet (written behind), or this write's.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        let len = data.len() as u64;
        let end = offset + len;
        self.shared
            .make_room(&self.client, self.handle, end)
            .await?;
        // The slots written, by index, which a move keeps; a restripe does not, so they are
        // taken in the pattern the write went to (or, written behind, known when it is sent).
        if self.client.files.write_behind == 0 {
            let file = self.shared.file_ref();
            let client = &self.client;
            let data = &data;
            return match self
                .shared
                .with_layout(client, |layout| async move {
                    client
                        .data
                        .write(&**client, file, &layout, offset, data.clone())
                        .await?;
                    Ok(SlotSet::of_range(&layout, offset, len))
                })
                .await
            {
                Ok(written) => {
                    self.shared.note_write(end, written);
                    self.shared.report_when_grown(&self.client);
                    Ok(())
                }
                Err(error) => {
                    // Some of its pieces may have landed: the file's other handles learn of
                    // it at their next sync.
                    self.report_error(&error);
                    Err(error)
                }
            };
        }
        if let Some(error) = self.pending_error() {
            return Err(error);
        }
        let admitted = self.shared.inflight.admit((offset, end)).await;
        // A write that failed while this one waited for budget is this one's answer.
        if let Some(error) = self.pending_error() {
            admitted.finish();
            return Err(error);
        }
        // In the pattern known now (a restripe may have come while this one waited).
        let written = SlotSet::of_range(&*self.layout()?, offset, len);
        let noted = self.shared.note_write(end, written);
        let (client, shared) = (Arc::clone(&self.client), Arc::clone(&self.shared));
        let send = async move {
            let file = shared.file_ref();
            let (on, data) = (&client, &data);
            let sent = shared
                .with_layout(on, |layout| async move {
                    on.data
                        .write(&**on, file, &layout, offset, data.clone())
                        .await
                })
                .await;
            shared.settle_written(written, noted, sent.is_ok());
            if sent.is_ok() {
                shared.report_when_grown(&client);
            }
            if let Err(error) = sent {
                tracing::warn!(inode = %shared.inode, %error, "a write-behind write failed");
                shared.record_error(error);
            }
            admitted.finish();
        };
        // The write acts for its writer, as it would have without write-behind (a queued
        // truncate it has applied on the way is asked for as that writer).
        match weft_net::stubs::acting_caller() {
            Some(caller) => tokio::spawn(weft_net::stubs::acting_for(caller, send)),
            None => tokio::spawn(send),
        };
        Ok(())
    }

    /// Waits until every write of the file in flight is done (their errors are kept for
    /// the next flush or sync).
    pub async fn drain(&self) {
        self.shared.drain().await;
    }

    /// What a close does before it returns: waits for the writes in flight and reports the
    /// size this client wrote, at once (a reader elsewhere may see the new size before the
    /// last bytes until this returns; close-to-open promises nothing earlier).
    ///
    /// # Errors
    /// The report's failure, or a write error this handle has not reported by a sync: left
    /// for it, as NFS's flush checks without advancing, so that a close of a copy of the
    /// descriptor does not take the error from the sync of the process that wrote.
    pub async fn flush(&self) -> Result<(), ClientError> {
        if self.shared.names_unlanded_slots() {
            // The report names the slots written, and the metadata server takes a named slot
            // without its object for lost data (`weft fsck`): a slot only a write on its way
            // wrote is named once that write landed, and not if it failed (a full target, a
            // quota's refusal).
            self.shared.drain().await;
            self.shared.report_size(&self.client, false).await?;
        } else {
            let (_, reported) = tokio::join!(
                self.shared.drain(),
                self.shared.report_size(&self.client, false)
            );
            reported?;
        }
        match self.pending_error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Makes the file's data and size durable: waits for the writes in flight, syncs every
    /// target and reports the size as durable.
    ///
    /// # Errors
    /// The sync's failure (writes lost since the last sync among them), the report's, or a
    /// write error this handle had not reported yet, now reported.
    pub async fn sync(&self) -> Result<(), ClientError> {
        self.shared.drain().await;
        if self.shared.layout().is_ok() {
            let (client, inode) = (&self.client, self.shared.inode);
            let synced = self
                .shared
                .with_layout(client, |layout| async move {
                    client.data.sync(&**client, inode, &layout).await
                })
                .await;
            if let Err(error) = synced {
                self.report_error(&error);
                return Err(error);
            }
        }
        self.shared.report_size(&self.client, true).await?;
        self.client.sync_changes().await?;
        match self.take_error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Allocates (`Allocate`) or zeroes (`Zero`) `[offset, offset + len)` on its targets,
    /// after the writes in flight. The file grows to the range's end unless `keep_size`.
    ///
    /// # Errors
    /// `NoSpace`, `NotSupported`, storage and transport errors.
    pub async fn allocate(
        &self,
        (offset, len): (u64, u64),
        mode: FallocateMode,
        keep_size: bool,
    ) -> Result<(), ClientError> {
        self.shared.drain().await;
        // An allocation takes space with or without the size: it needs the room either way.
        self.shared
            .make_room(&self.client, self.handle, offset.saturating_add(len))
            .await?;
        let file = self.shared.file_ref();
        let client = &self.client;
        self.shared
            .with_layout(client, |layout| async move {
                client
                    .data
                    .fallocate(&**client, file, &layout, (offset, len), mode)
                    .await
            })
            .await?;
        if keep_size {
            // Zeroed bytes: what was read ahead of them is stale. The space counts in the
            // file's quotas from its next report.
            self.shared.note_change();
            let mut known = self.shared.known();
            known.allocated_end = known.allocated_end.max(offset.saturating_add(len));
        } else {
            // The size grows as a write's would: known here at once, reported at close.
            self.shared
                .note_write(offset.saturating_add(len), SlotSet::default());
        }
        Ok(())
    }

    /// Copies up to `len` bytes at `from` of `source` to `to` of this file (`copy_file_range`),
    /// at most [`COPY_BYTES_MAX`] per call and not past the source's end; answers how many.
    /// Between files striped over targets the storage servers copy, each reading the source's
    /// objects itself, so the data never crosses this client; for mirrored files the client
    /// reads and writes. The copy lands after the writes in flight of both files, and counts
    /// as a write of this file (its size is reported at close or fsync).
    ///
    /// # Errors
    /// As a read of `source` and a write of this file.
    pub async fn copy_from(
        &self,
        source: &OpenFile,
        from: u64,
        to: u64,
        len: u64,
    ) -> Result<u64, ClientError> {
        source.shared.drain().await;
        self.shared.drain().await;
        if let Some(error) = self.pending_error() {
            return Err(error);
        }
        let len = len
            .min(source.shared.view().size.saturating_sub(from))
            .min(COPY_BYTES_MAX);
        if len == 0 {
            return Ok(0);
        }
        let striped =
            |layout: &FileLayout| layout.pattern.kind == weft_proto::layout::PatternKind::Raid0;
        if !striped(&*self.layout()?) || !striped(&*source.layout()?) {
            let data = source.read(from, len).await?;
            let len = data.len() as u64;
            self.write(to, data.into_bytes()).await?;
            return Ok(len);
        }
        self.shared
            .make_room(&self.client, self.handle, to + len)
            .await?;
        let client = &self.client;
        let (file, from_file) = (self.shared.file_ref(), source.shared.file_ref());
        let copied = self
            .shared
            .with_layout(client, |layout| {
                let source = &source.shared;
                async move {
                    // The source may have moved too: its layout is fetched again with this
                    // file's when a copy meets a moved object.
                    let source_layout = source.layout()?;
                    let copied = client
                        .data
                        .copy(
                            &**client,
                            (file, &layout),
                            (from_file, &source_layout),
                            (from, to, len),
                        )
                        .await;
                    if matches!(&copied, Err(error) if error.code().recovery() == weft_proto::Recovery::Relayout)
                    {
                        client.known(client.get_attr(source.inode).await?);
                    }
                    copied
                }
            })
            .await;
        match copied {
            Ok(()) => {
                let layout = self.layout()?;
                self.shared
                    .note_write(to + len, SlotSet::of_range(&layout, to, len));
                Ok(len)
            }
            Err(error) => {
                self.report_error(&error);
                Err(error)
            }
        }
    }

    /// Closes the handle: waits for the writes in flight, reports the size, and tells the
    /// metadata server soon after ([`Client::release_soon`]). The handle is of no use
    /// afterwards; a second close does nothing.
    ///
    /// # Errors
    /// The size report's failure; the handle is closed all the same.
    pub async fn close(&self) -> Result<(), ClientError> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.shared.drain().await;
        let reported = self.shared.report_size(&self.client, false).await;
        self.forget();
        reported
    }

    /// Forgets the handle here and tells its metadata server soon, once.
    fn forget(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        forget_handle(&self.client, &self.shared, self.handle);
    }
}

/// Forgets handle `handle` of the file `shared` here and tells its metadata server soon.
fn forget_handle(client: &Arc<Client>, shared: &Arc<Shared>, handle: u64) {
    let inode = shared.inode;
    // A sync needs an open file: what was not synced is not checked.
    let data = &client.data;
    client.files.closed(shared, || data.forget_unsynced(inode));
    if tokio::runtime::Handle::try_current().is_ok() {
        client.release_soon(inode, handle);
    } else {
        // Dropped outside the client's runtime: the server keeps the open until the
        // session ends, and then takes the size from the objects.
        client.session.opens.forget(inode, handle);
    }
}

/// A handle dropped without [`OpenFile::close`] is closed in the background as a close
/// would: after its writes in flight, the size it wrote is reported, then the open is
/// released, so what it wrote keeps its size as a file of a process that exits without
/// closing does. Dropped outside a runtime, it is forgotten here at once and its metadata
/// server keeps the open until the session ends (when the size is taken from the objects).
impl Drop for OpenFile {
    fn drop(&mut self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (client, shared, handle) = (
            Arc::clone(&self.client),
            Arc::clone(&self.shared),
            self.handle,
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            forget_handle(&client, &shared, handle);
            return;
        };
        let close = async move {
            shared.drain().await;
            if let Err(error) = shared.report_size(&client, false).await {
                tracing::warn!(inode = %shared.inode, %error, "the size report of a handle dropped without a close failed");
            }
            forget_handle(&client, &shared, handle);
        };
        match weft_net::stubs::acting_caller() {
            Some(caller) => runtime.spawn(weft_net::stubs::acting_for(caller, close)),
            None => runtime.spawn(close),
        };
    }
}
