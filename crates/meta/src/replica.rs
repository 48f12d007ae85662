//! Metadata mirroring by shipping the store file's changes.
//!
//! A home's store is a redb file. On the home's primary, redb writes that file through
//! [`HomeFile`], which keeps each commit's writes until the commit's sync; the sync's
//! flusher appends them to the store's journal ([`journal`]) and ships them, in order, to
//! every present member of the home's mirror group while the journal syncs, then writes them
//! to the local file; the sync finishes only when each member applied and synced them or left
//! the group. A member's copy is therefore the primary's file
//! as of its last sync, byte for byte:
//! promoted, it opens the copy as redb opens a file after a crash. The changes are the
//! committed key changes in their stored form, so nothing is re-executed (no ids, timestamps
//! or choices can diverge), and the reply cache travels with them: a client's retry after a
//! failover is answered from it.
//!
//! A member that needs a resync gets a copy of the whole file, one chunk at a time; each
//! chunk is read and sent while no changes ship, and every change made after a chunk was
//! read ships after it, so the copy ends equal to the primary's file.
//!
//! On a member, [`Replicas`] applies what its primary ships to its copy.

use crate::schema::StoreError;
use bytes::Bytes;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weft_mirror::home::{HomeSends, NoStep, Pieces, StepEnd};
use weft_mirror::pages::{self, Changes, CopyOrder, Edit, PageStep, SendOrder};
use weft_net::mirror::{Membership, ResyncStart};
use weft_net::{ClusterView, RpcError};
use weft_proto::error::WireError;
use weft_proto::ids::NodeId;
use weft_proto::ids::{GroupId, GroupVersion, MemberId};
use weft_proto::messages::{
    FileChange, MetaRequest, MetaResponse, MirrorGroupInfo, MirrorKind, IO_BYTES_MAX,
};
use weft_proto::ErrorCode;
use weft_service::missed::MissedLogs;

/// How a home cuts its store file: extents of what an absent member misses, and steps of a
/// full copy.
const PIECES: Pieces = Pieces {
    extent: MISSED_EXTENT,
    piece: if RESYNC_CHUNK < IO_BYTES_MAX as u64 {
        RESYNC_CHUNK
    } else {
        IO_BYTES_MAX as u64
    },
};

/// Most payload bytes and changes of one shipped request: a sync's changes ship in pieces
/// of this size, within the frame limits.
const SHIP_LIMITS: ShipLimits = ShipLimits {
    bytes_max: IO_BYTES_MAX as usize,
    changes_max: 1 << 16,
};

/// How much one shipped piece of a sync's changes may hold.
#[derive(Clone, Copy, Debug)]
struct ShipLimits {
    /// Payload bytes.
    bytes_max: usize,
    /// Changes.
    changes_max: usize,
}
/// Bytes of the store file per resync step.
const RESYNC_CHUNK: u64 = 1 << 20;
/// Bytes of the store file per item of a record of what an absent member misses.
const MISSED_EXTENT: u64 = 64 << 10;

/// The store file of `home` on metadata node `node`: its own store, or a copy of another
/// home's.
pub(crate) fn home_path(data_dir: &Path, node: NodeId, home: NodeId) -> PathBuf {
    if home == node {
        data_dir.join("meta.redb")
    } else {
        data_dir
            .join("mirror")
            .join(format!("home-{}.redb", home.0))
    }
}

/// A new link's id: the clock's nanoseconds, or one more than the last id when the clock did
/// not move on (it was set back), so that a link opened later in a process always sends under
/// a greater id; a start of a process is ordered by the group version, which a restart moves.
fn link_id() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let previous = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_else(|last| last);
    now.max(previous + 1)
}

/// The metadata mirror group holding `home`, if any.
pub(crate) fn group_of_home(groups: &[MirrorGroupInfo], home: NodeId) -> Option<&MirrorGroupInfo> {
    groups.iter().find(|group| {
        group.kind == MirrorKind::Meta
            && group
                .members
                .first()
                .is_some_and(|m| m.id == MemberId::from(home))
    })
}

/// Cuts `changes` (whose written bytes `payload` holds in order) into pieces of at most
/// `bytes_max` payload bytes and `changes_max` changes, in order; a longer write is split.
/// Applied one after the other, the pieces change a file as the whole does.
fn pieces(
    changes: &[FileChange],
    payload: &Bytes,
    ShipLimits {
        bytes_max,
        changes_max,
    }: ShipLimits,
) -> Vec<(Vec<FileChange>, Bytes)> {
    let mut pieces = Vec::new();
    let mut piece = Vec::new();
    // The payload of the piece being filled: from `start` to `at`.
    let (mut start, mut at) = (0usize, 0usize);
    let mut cut = |piece: &mut Vec<FileChange>, start: &mut usize, at: usize| {
        pieces.push((std::mem::take(piece), payload.slice(*start..at)));
        *start = at;
    };
    for change in changes {
        match *change {
            FileChange::SetLen(_) => {
                if piece.len() == changes_max {
                    cut(&mut piece, &mut start, at);
                }
                piece.push(*change);
            }
            FileChange::Write { mut offset, len } => {
                let mut left = len as usize;
                while left > 0 {
                    let room = bytes_max - (at - start);
                    if room == 0 || piece.len() == changes_max {
                        cut(&mut piece, &mut start, at);
                        continue;
                    }
                    let taken = left.min(room);
                    piece.push(FileChange::Write {
                        offset,
                        len: taken as u32,
                    });
                    offset += taken as u64;
                    at += taken;
                    left -= taken;
                }
            }
        }
    }
    if !piece.is_empty() {
        cut(&mut piece, &mut start, at);
    }
    pieces
}

/// Writes `changes` (whose written bytes `payload` holds in order) to `file`.
fn apply_changes(file: &File, changes: &[FileChange], payload: &[u8]) -> std::io::Result<()> {
    pages::apply(changes, payload, |edit| match edit {
        Edit::Write(offset, data) => file.write_all_at(data, offset),
        Edit::SetLen(len) => file.set_len(len),
    })
}

/// Reads what the file holds of `buffer.len()` bytes from `offset`; the rest stays zero.
fn read_available(file: &File, offset: u64, buffer: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buffer.len() {
        match file.read_at(&mut buffer[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(read) => done += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// A home's store writes between redb and the disk (see [`HomeFile`]).
struct Writes {
    /// What redb wrote, the syncs it asked for and the send under way.
    sends: HomeSends,
    /// Why a sync failed; no later one is attempted. redb's reads go on over the changes of
    /// the one that failed until the home is opened again: the file may lack them (their
    /// record was not written).
    failure: Option<Arc<std::io::Error>>,
    /// Set when redb closed the file: the flusher ends once it finished what was asked.
    closed: bool,
    /// Whether the running sync is carried out by the committing thread, not the flusher.
    inline: bool,
}

impl Writes {
    /// Whether the flusher has a sync to carry out.
    fn for_flusher(&self) -> bool {
        self.sends.syncing() && !self.inline
    }

    /// The failure that stopped syncs, as an I/O error for redb (the same error, shared).
    fn failure(&self) -> Option<std::io::Error> {
        self.failure
            .as_ref()
            .map(|failure| std::io::Error::new(failure.kind(), Arc::clone(failure)))
    }

    /// How sync `ticket` ended: done, or failed (it or one before it); `None` while it runs.
    fn outcome(&self, ticket: u64) -> Option<Result<(), StoreError>> {
        self.sends.outcome(ticket).map(|outcome| {
            outcome.map_err(|_| {
                let failure = self.failure.clone().expect("a failed sync says why");
                StoreError::Sync(failure)
            })
        })
    }
}

/// Changes to send to a member of a home's group (see [`MetaRequest::ReplicaApply`]).
struct Shipment {
    group: GroupId,
    version: GroupVersion,
    changes: Vec<FileChange>,
    sync: bool,
}

/// The payload of a sync's changes, shipped without a copy.
struct Payload(Arc<Changes>);

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        &self.0.payload
    }
}

/// The link between a served home's store file and its mirror members.
pub(crate) struct HomeLink {
    home: NodeId,
    node: NodeId,
    file: Arc<File>,
    writes: Mutex<Writes>,
    /// Signalled whenever a sync is asked for or finishes, and at close.
    flushed: std::sync::Condvar,
    /// Set when this server stops serving the home: the file is not written again through
    /// this link.
    fenced: AtomicBool,
    /// Set when changes could not ship: redb refuses further commits after a failed sync, so
    /// the home is opened again.
    broken: AtomicBool,
    /// Set by the commit thread when no operation waits: the next sync runs on the committing
    /// thread, sparing the hand-offs to the flusher and to the answer thread.
    sync_inline: AtomicBool,
    /// What each sync appends before its changes are written to the file.
    journal: Mutex<journal::Journal>,
    /// Held while changes are journaled, ship and are written to the file, and while a resync
    /// reads and sends a chunk.
    order: tokio::sync::Mutex<()>,
    /// When this link was opened, in nanoseconds since the Unix epoch: it orders this link's
    /// sends after those of an earlier link to the same home.
    opened: u64,
    /// Sends to members so far: the next one's number.
    sends: AtomicU64,
    membership: Arc<Membership>,
    cluster: Arc<ClusterView>,
    /// What absent members miss, for the groups this server is primary of.
    missed: Arc<MissedLogs>,
    files: Arc<HomeFiles>,
    runtime: tokio::runtime::Handle,
    sync_seconds: prometheus_client::metrics::histogram::Histogram,
}

/// What every link of a metadata server shares.
#[derive(Clone)]
pub(crate) struct LinkParts {
    pub membership: Arc<Membership>,
    pub cluster: Arc<ClusterView>,
    /// What absent members of the groups this server is primary of miss.
    pub missed: Arc<MissedLogs>,
    pub files: Arc<HomeFiles>,
    pub sync_seconds: prometheus_client::metrics::histogram::Histogram,
}

/// What this server keeps of each home's store file beyond one link to it.
///
/// - Changes it journaled and wrote to the file that the home's mirror members may lack:
///   those of a sync that failed to ship (the primary's lease ran out while a member was being
///   tried again). The home is opened again from its file, which holds them (or reads them
///   from here, should their journaling have failed), so its next link ships them
///   before anything else: to the present members, and into the records of the absent ones.
///   A copy written by a primary elsewhere drops them: that primary copies the whole file to
///   this server before it serves the home again.
/// - The file's write lock: a served home's flusher writes the file only under it and after
///   checking that the home is still served through its link, and a member's copy is written
///   only under it and after the primary's send is admitted, so the writes of a link fenced a
///   moment ago never land between (or after) those of the home's new primary.
#[derive(Default)]
pub(crate) struct HomeFiles {
    unshipped: Mutex<HashMap<NodeId, Changes>>,
    locks: Mutex<HashMap<NodeId, Arc<Mutex<()>>>>,
}

impl HomeFiles {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Changes>> {
        self.unshipped.lock().expect("unshipped changes poisoned")
    }

    /// Runs `write` under the write lock of `home`'s file here.
    pub fn writing<T>(&self, home: NodeId, write: impl FnOnce() -> T) -> T {
        let lock = {
            let mut locks = self.locks.lock().expect("file locks poisoned");
            Arc::clone(locks.entry(home).or_default())
        };
        let _writing = lock.lock().expect("file lock poisoned");
        write()
    }

    /// Keeps `changes` of `home`, after those kept before.
    fn keep(&self, home: NodeId, changes: &Changes) {
        let mut table = self.table();
        table.entry(home).or_default().extend(changes);
    }

    fn take(&self, home: NodeId) -> Changes {
        self.table().remove(&home).unwrap_or_default()
    }

    fn drop_home(&self, home: NodeId) {
        self.table().remove(&home);
    }
}

impl HomeLink {
    /// Opens (creating) the store file of `home` on `node` for redb. Changes an earlier link
    /// could not ship are the first the new one ships.
    pub fn open(
        data_dir: &Path,
        node: NodeId,
        home: NodeId,
        parts: LinkParts,
    ) -> std::io::Result<(Arc<HomeLink>, HomeFile)> {
        let LinkParts {
            membership,
            cluster,
            missed,
            files,
            sync_seconds,
        } = parts;
        let path = home_path(data_dir, node, home);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?,
        );
        // The file as of its last synced change, before redb reads it.
        let journal = files.writing(home, || {
            journal::Journal::recover(&file, &journal::journal_path(&path))
        })?;
        // The file holds the changes carried over (unless writing them failed): redb reads
        // them through the sends either way, and they ship first.
        let file_len = file.metadata()?.len();
        let sends = HomeSends::open(files.take(home), file_len, PIECES);
        let link = Arc::new(HomeLink {
            home,
            node,
            file: Arc::clone(&file),
            writes: Mutex::new(Writes {
                sends,
                failure: None,
                closed: false,
                inline: false,
            }),
            flushed: std::sync::Condvar::new(),
            journal: Mutex::new(journal),
            fenced: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            sync_inline: AtomicBool::new(false),
            order: tokio::sync::Mutex::new(()),
            opened: link_id(),
            sends: AtomicU64::new(0),
            membership,
            cluster,
            missed,
            files,
            runtime: tokio::runtime::Handle::current(),
            sync_seconds,
        });
        let flusher = Arc::clone(&link);
        std::thread::Builder::new()
            .name(format!("weft-meta-flush-{home}"))
            .spawn(move || flusher.flush_loop())?;
        Ok((
            Arc::clone(&link),
            HomeFile {
                file,
                link: Arc::clone(&link),
            },
        ))
    }

    fn writes(&self) -> std::sync::MutexGuard<'_, Writes> {
        self.writes.lock().expect("store writes poisoned")
    }

    /// The sync the last commit asked for.
    pub fn last_sync(&self) -> u64 {
        self.writes().sends.asked()
    }

    /// Bytes redb wrote since its last sync.
    pub fn unsynced_bytes(&self) -> usize {
        self.writes().sends.next().payload.len()
    }

    /// Whether a sync is running: a commit now would wait for it.
    pub fn syncing(&self) -> bool {
        self.writes().sends.syncing()
    }

    /// Has the next sync run on the thread that commits, before the commit returns: for a
    /// commit nothing else waits behind, whose answers then need no other thread.
    pub fn sync_next_inline(&self) {
        self.sync_inline.store(true, Ordering::SeqCst);
    }

    /// How sync `ticket` ended, if it did.
    pub fn sync_outcome(&self, ticket: u64) -> Option<Result<(), StoreError>> {
        self.writes().outcome(ticket)
    }

    /// Waits until sync `ticket` finished: its changes are durable here and on every present
    /// member of the home's group.
    ///
    /// # Errors
    /// Why that sync, or one before it, failed.
    pub fn wait_synced(&self, ticket: u64) -> Result<(), StoreError> {
        self.flushed
            .wait_while(self.writes(), |w| w.outcome(ticket).is_none())
            .expect("store writes poisoned")
            .outcome(ticket)
            .expect("the wait ends with an outcome")
    }

    /// Writes, syncs and ships each sync's changes, one sync at a time, in order.
    fn flush_loop(&self) {
        loop {
            {
                let writes = self
                    .flushed
                    .wait_while(self.writes(), |w| !w.for_flusher() && !w.closed)
                    .expect("store writes poisoned");
                if !writes.for_flusher() {
                    // Closed, with nothing left to flush.
                    return;
                }
            }
            self.carry_out();
        }
    }

    /// Carries out the sync taken and records how it ended, while no other send is under
    /// way.
    fn carry_out(&self) {
        let started = std::time::Instant::now();
        {
            // Held until the sync ended: a resync reads its pieces of the file under it, and
            // must not read one after a change shipped and before it landed here. Taken before
            // the group is looked at: a home that becomes mirrored meanwhile has its first
            // resync read the file only once these changes are in it.
            let _order = self.block_on(self.order.lock());
            let sync = self
                .writes()
                .sends
                .send_sync()
                .expect("a sync taken is sent by one thread, under the order lock");
            let result = self.flush(&sync.changes);
            self.sync_seconds.observe(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => {
                    let mut writes = self.writes();
                    writes.inline = false;
                    writes.sends.synced(true);
                }
                Err(error) => self.failed(error),
            }
        }
        self.flushed.notify_all();
    }

    /// The sync being sent failed: written here, perhaps, but perhaps not on every member.
    /// Its changes are kept for the home's next link here, which ships them first, before the
    /// failure shows (the home is opened again once it does). A fenced link's home is served
    /// elsewhere; checked under the file's lock, so changes are never kept after a primary's
    /// send fenced the link and wrote the copy (which voids what is kept). Taken before
    /// `writes`: a store dropped under the file's lock takes `writes` after it.
    fn failed(&self, error: std::io::Error) {
        tracing::error!(home = self.home.0, %error, "metadata store sync failed");
        self.files.writing(self.home, || {
            let mut writes = self.writes();
            writes.inline = false;
            let kept = writes.sends.synced(false);
            if let Some(kept) = kept.filter(|_| !self.fenced()) {
                self.files.keep(self.home, &kept);
            }
            writes.failure = Some(Arc::new(error));
        });
        self.broken.store(true, Ordering::SeqCst);
    }

    /// Appends `changes` to the store's journal and syncs it while they ship to the members,
    /// then writes them to the store file (see [`journal`]). Under the order lock.
    fn flush(&self, changes: &Arc<Changes>) -> std::io::Result<()> {
        let mirrored = self.group().is_some();
        // Journaled and written under the file's lock, each time checked once more to be
        // served through this link.
        let before = self.files.writing(self.home, || {
            self.check_fence()?;
            Ok::<_, std::io::Error>(self.file.metadata()?.len())
        })?;
        let journaled = || {
            self.files.writing(self.home, || {
                self.check_fence()?;
                self.journal
                    .lock()
                    .expect("store journal poisoned")
                    .append(&self.file, changes)
            })
        };
        // The local sync runs while the changes ship: a commit waits for the slower of the
        // two, not their sum. If shipping fails the sync fails, synced here or not; a copy
        // that missed it is copied in full before it can serve.
        let (shipped, journaled) = if mirrored {
            std::thread::scope(|scope| {
                let local = scope.spawn(journaled);
                let shipped = self.ship(changes, before);
                (shipped, local.join().expect("journal append panicked"))
            })
        } else {
            (Ok(()), journaled())
        };
        journaled?;
        // A crash here leaves the changes in the journal alone: the next start writes them.
        weft_service::failpoint::failpoint("meta-after-journal");
        // Only once their record is durable: the file never holds a change a crash could
        // take from the journal. Written even when they did not ship, as the next start
        // would write them: the file stays what the journal says.
        self.files.writing(self.home, || {
            self.check_fence()?;
            apply_changes(&self.file, &changes.changes, &changes.payload)
        })?;
        shipped
    }

    /// Stops every further write through this link.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    /// Whether the home stopped being served through this link.
    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Whether a sync failed to ship its changes.
    pub fn broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn check_fence(&self) -> std::io::Result<()> {
        if self.fenced() {
            return Err(std::io::Error::other(format!(
                "metadata home {} is no longer served here",
                self.home
            )));
        }
        Ok(())
    }

    /// Whether the home is in a mirror group: its every commit is then a checkpoint, whose
    /// pages ship to the members (`store`).
    pub fn mirrored(&self) -> bool {
        self.group().is_some()
    }

    fn group(&self) -> Option<MirrorGroupInfo> {
        group_of_home(&self.membership.groups(), self.home).cloned()
    }

    /// Ships the changes made since the last sync to every present member, in order, and
    /// records the extents they touched (of a file `before` bytes long before them) for every
    /// absent member that left in sync.
    fn ship(&self, pending: &Arc<Changes>, before: u64) -> std::io::Result<()> {
        if pending.changes.is_empty() {
            return Ok(());
        }
        let Some(group) = self.group() else {
            return Ok(());
        };
        let payload = Bytes::from_owner(Payload(Arc::clone(pending)));
        let pieces = pieces(&pending.changes, &payload, SHIP_LIMITS);
        // Under the order lock, which the caller holds.
        let shipped = self.block_on(async {
            // A sync given up is shipped again by the next link (`HomeFiles`): no member is
            // owed anything beyond it.
            self.membership
                .deliver(
                    MemberId::from(self.node),
                    group.id,
                    &[],
                    |member, version, _| {
                        let pieces = &pieces;
                        async move {
                            // A member that fails a piece gets them all again (writing the same
                            // bytes twice changes nothing) or leaves the group.
                            for (index, (changes, payload)) in pieces.iter().enumerate() {
                                let sync = index + 1 == pieces.len();
                                let shipment = Shipment {
                                    group: group.id,
                                    version,
                                    changes: changes.clone(),
                                    sync,
                                };
                                self.send(member, &shipment, payload.clone()).await?;
                            }
                            Ok(())
                        }
                    },
                )
                .await?;
            // Under the order lock, so a resync's view of the record misses nothing that was
            // not shipped to its member.
            if self.missed.any(group.id) {
                let extents = self.writes().sends.missed(before);
                self.missed.note(group.id, &extents).map_err(|error| {
                    WireError::new(
                        ErrorCode::Io,
                        format!("cannot record what an absent mirror member misses: {error}"),
                    )
                })?;
            }
            Ok::<(), WireError>(())
        });
        shipped.map_err(|error| {
            std::io::Error::other(format!(
                "metadata home {}: changes did not reach the mirror group: {error}",
                self.home
            ))
        })
    }

    /// Runs `future` to its end from redb's synchronous calls: on the commit thread, or on
    /// a runtime thread that may block.
    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| self.runtime.block_on(future)),
            Err(_) => self.runtime.block_on(future),
        }
    }

    /// Sends `shipment` to metadata node `member` as a send of its own (see
    /// [`MetaRequest::ReplicaApply`]), bounded by the member timeout.
    async fn send(
        &self,
        member: MemberId,
        shipment: &Shipment,
        payload: Bytes,
    ) -> Result<(MetaResponse, Bytes), RpcError> {
        let request = MetaRequest::ReplicaApply {
            group: shipment.group,
            version: shipment.version,
            link: self.opened,
            sequence: self.sends.fetch_add(1, Ordering::SeqCst),
            changes: shipment.changes.clone(),
            sync: shipment.sync,
        };
        let timeout = self.membership.member_timeout();
        let call = async {
            let client = self.cluster.meta_node(NodeId::from(member)).await?;
            client.send(request, payload).await
        };
        self.cluster
            .call_member(|| format!("metadata node {member}"), timeout, call)
            .await
    }

    /// Brings the member of `start` up to date: when it left in sync and this server recorded
    /// the extents it missed, only those are copied; otherwise the whole store file, piece by
    /// piece. Each piece is read and sent while no changes ship; the copy ends with the length
    /// and a sync.
    pub async fn resync(&self, start: ResyncStart) -> Result<(), WireError> {
        let stale = |what: &str| {
            WireError::new(
                ErrorCode::StaleRoute,
                format!("metadata resync of member {}: {what}", start.member),
            )
        };
        let (begun, length) = {
            // Under the order lock: no sync notes extents into the record meanwhile.
            let _order = self.order.lock().await;
            let recorded = self.missed.recorded(start.group, start.member);
            let length = self.file_length()?;
            let begun = self.writes().sends.begin_resync(start, recorded, length);
            if begun.forget_record {
                self.missed.forget(start.group, start.member);
            }
            (begun, length)
        };
        if begun.incremental {
            tracing::info!(
                home = self.home.0,
                group = %start.group,
                version = %start.version,
                member = %start.member,
                extents = begun.total,
                "metadata resync of what the member missed started"
            );
        } else {
            tracing::info!(
                home = self.home.0,
                group = %start.group,
                version = %start.version,
                member = %start.member,
                bytes = length,
                "metadata resync started"
            );
        }
        self.membership
            .resync_started(start, begun.total, !begun.incremental);
        let mut copied = 0;
        loop {
            let _order = self.order.lock().await;
            // A link whose home is served anew (or elsewhere) resyncs nothing more: the new
            // link ships in an order of its own.
            self.check_fence()
                .map_err(|error| WireError::new(ErrorCode::StaleRoute, error.to_string()))?;
            let length = self.file_length()?;
            let step = self.writes().sends.step(start, length);
            let step = match step {
                Ok(Some(step)) => step,
                Ok(None) | Err(NoStep::Stale) => return Err(stale("replaced or stopped")),
                Err(NoStep::Busy) => unreachable!("sends run one at a time under the order lock"),
            };
            // Ends the step as not taken if this task stops before it ended.
            let mut stepping = Stepping {
                link: self,
                start,
                ended: false,
            };
            let sent = self.send_step(start, step).await;
            stepping.ended = true;
            let end = self.writes().sends.stepped(start, sent.is_ok());
            match end {
                StepEnd::Going => {
                    let bytes = sent?;
                    copied += bytes;
                    self.membership.resync_copied(start, bytes);
                }
                StepEnd::Finished { incremental } => {
                    if incremental {
                        self.missed.forget(start.group, start.member);
                    }
                    break;
                }
                StepEnd::Stopped => return Err(sent.err().unwrap_or_else(|| stale("stopped"))),
                StepEnd::Stale => return Err(stale("replaced")),
            }
        }
        tracing::info!(
            home = self.home.0,
            group = %start.group,
            member = %start.member,
            bytes = copied,
            "metadata resync brought the member's copy up to date"
        );
        Ok(())
    }

    /// Sends `step` of resync `start` to its member: the bytes of the file it copied.
    async fn send_step(&self, start: ResyncStart, step: PageStep) -> Result<u64, WireError> {
        let (changes, payload, sync) = match step {
            PageStep::Copy { offset, len } => {
                let piece = self.read_piece(offset, len).await?;
                (
                    vec![FileChange::Write {
                        offset,
                        len: len as u32,
                    }],
                    piece,
                    false,
                )
            }
            PageStep::Finish { len } => (vec![FileChange::SetLen(len)], Bytes::new(), true),
        };
        let version = self
            .membership
            .resync_version(MemberId::from(self.node), start)?;
        let shipment = Shipment {
            group: start.group,
            version,
            changes,
            sync,
        };
        self.membership
            .resync_step(MemberId::from(self.node), start, || {
                self.send(start.member, &shipment, payload.clone())
            })
            .await?;
        Ok(payload.len() as u64)
    }

    fn file_length(&self) -> Result<u64, WireError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|error| WireError::new(ErrorCode::Io, error.to_string()))
    }

    /// Reads `len` bytes at `offset` of the store file.
    async fn read_piece(&self, offset: u64, len: u64) -> Result<Bytes, WireError> {
        let file = Arc::clone(&self.file);
        let piece = tokio::task::spawn_blocking(move || {
            let mut piece = vec![0; len as usize];
            file.read_exact_at(&mut piece, offset).map(|()| piece)
        })
        .await
        .map_err(|e| WireError::new(ErrorCode::Internal, e.to_string()))?
        .map_err(|error| WireError::new(ErrorCode::Io, error.to_string()))?;
        Ok(Bytes::from(piece))
    }
}

/// A resync's step being sent: ended as not taken when its task stops before it ended, so the
/// home's next send does not wait for it.
struct Stepping<'a> {
    link: &'a HomeLink,
    start: ResyncStart,
    ended: bool,
}

impl Drop for Stepping<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.link.writes().sends.stepped(self.start, false);
        }
    }
}

/// redb's view of a served home's store file.
///
/// A commit's writes stay in memory until its sync: the sync hands them to the home's flusher
/// thread, which appends them to the store's journal and syncs it while they ship to the
/// members, then writes them to the file, and returns at once, so the next batch of
/// operations is applied while the last one reaches the disk. redb reads its unsynced pages
/// back from memory. The next sync waits for the last one to finish, so no commit's pages are
/// written before the commit before it is durable: redb reuses a page only once the commit
/// that freed it is synced, and a crash leaves the file, once its journal is written into it
/// at the next start, as of some sync, as redb expects. A commit is durable only once its sync finished
/// ([`HomeLink::wait_synced`]); the commit thread answers after that. A commit that nothing
/// waits behind asks for its sync to run on the committing thread
/// ([`HomeLink::sync_next_inline`]), in the same order.
pub(crate) struct HomeFile {
    file: Arc<File>,
    link: Arc<HomeLink>,
}

impl std::fmt::Debug for HomeFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HomeFile(home {})", self.link.home)
    }
}

impl redb::StorageBackend for HomeFile {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.link.writes().sends.file_len())
    }

    fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut buffer = vec![0; len];
        // Under the lock: the flusher forgets the changes it flushed only after they are in
        // the file.
        let writes = self.link.writes();
        read_available(&self.file, offset, &mut buffer)?;
        writes.sends.overlay(offset, &mut buffer);
        Ok(buffer)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.link.check_fence()?;
        self.link.writes().sends.set_len(len);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> std::io::Result<()> {
        self.link.check_fence()?;
        let mut writes = self
            .link
            .flushed
            .wait_while(self.link.writes(), |w| w.sends.syncing())
            .expect("store writes poisoned");
        if let Some(failure) = writes.failure() {
            return Err(failure);
        }
        writes
            .sends
            .ask()
            .map_err(|_| std::io::Error::other("a sync failed"))?;
        writes
            .sends
            .take_sync()
            .expect("no sync is under way and one was asked for");
        if self.link.sync_inline.swap(false, Ordering::SeqCst) {
            writes.inline = true;
            drop(writes);
            self.link.carry_out();
            return self.link.writes().failure().map_or(Ok(()), Err);
        }
        self.link.flushed.notify_all();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.link.check_fence()?;
        self.link.writes().sends.write(offset, data);
        Ok(())
    }
}

impl Drop for HomeFile {
    /// redb closed the store: the flusher ends once it finished what was asked of it.
    fn drop(&mut self) {
        self.link.writes().closed = true;
        self.link.flushed.notify_all();
    }
}

/// A member's copies of the homes it mirrors, written as their primaries ship changes.
pub(crate) struct Replicas {
    data_dir: PathBuf,
    node: NodeId,
    copies: Mutex<HashMap<NodeId, Arc<Mutex<Copy>>>>,
    /// A copy written by another primary drops what this server could not ship of it.
    files: Arc<HomeFiles>,
}

/// A member's copy of one home.
struct Copy {
    file: File,
    /// The newest send applied to it.
    applied: CopyOrder,
}

impl Replicas {
    pub fn new(data_dir: PathBuf, node: NodeId, files: Arc<HomeFiles>) -> Replicas {
        Replicas {
            data_dir,
            node,
            copies: Mutex::default(),
            files,
        }
    }

    /// Runs `write` under the write lock of `home`'s file here (see [`HomeFiles`]): a
    /// primary's send is admitted and applied under it.
    pub fn writing<T>(&self, home: NodeId, write: impl FnOnce() -> T) -> T {
        self.files.writing(home, write)
    }

    /// Applies shipped `changes` (whose written bytes `payload` holds in order) to the copy of
    /// `home`, synced when `sync`.
    ///
    /// # Errors
    /// `Superseded` when a send newer than `order` was applied: its primary gave up on this
    /// one and sent its changes again.
    pub fn apply(
        &self,
        home: NodeId,
        order: SendOrder,
        changes: &[FileChange],
        payload: &[u8],
        sync: bool,
    ) -> Result<(), WireError> {
        let io = |error: std::io::Error| {
            WireError::new(
                ErrorCode::Io,
                format!("metadata copy of home {home}: {error}"),
            )
        };
        let needed = pages::payload_len(changes);
        if needed != payload.len() as u64 {
            return Err(WireError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "shipped changes name {needed} bytes, the payload holds {}",
                    payload.len()
                ),
            ));
        }
        let copy = self.copy(home).map_err(io)?;
        let mut copy = copy.lock().expect("replica file poisoned");
        if let Err(applied) = copy.applied.admit(order) {
            return Err(WireError::new(
                ErrorCode::Superseded,
                format!(
                    "metadata copy of home {home}: send {order:?} arrived after the newer send {applied:?}"
                ),
            ));
        }
        self.files.drop_home(home);
        apply_changes(&copy.file, changes, payload).map_err(io)?;
        if sync {
            copy.file.sync_data().map_err(io)?;
        }
        Ok(())
    }

    fn copy(&self, home: NodeId) -> std::io::Result<Arc<Mutex<Copy>>> {
        let mut copies = self.copies.lock().expect("replica table poisoned");
        if let Some(copy) = copies.get(&home) {
            return Ok(Arc::clone(copy));
        }
        let path = home_path(&self.data_dir, self.node, home);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        // What this server journaled as the home's primary before is in the copy first. Its
        // change log goes: a home logs only while it has no mirror group, and its rows are in
        // its tables before a member may copy them (a checkpoint at its first commit as a
        // mirrored home, and before each resync), so the log holds nothing a start should write
        // over what the primary ships.
        journal::settle(&file, &journal::journal_path(&path))?;
        crate::store::discard_log(&crate::store::log_path(&path))?;
        let copy = Arc::new(Mutex::new(Copy {
            file,
            applied: CopyOrder::default(),
        }));
        copies.insert(home, Arc::clone(&copy));
        Ok(copy)
    }

    /// Closes the copy of `home`, waiting for a change being applied: this server is about to
    /// serve it.
    pub fn close(&self, home: NodeId) {
        let copy = self
            .copies
            .lock()
            .expect("replica table poisoned")
            .remove(&home);
        if let Some(copy) = copy {
            drop(copy.lock().expect("replica file poisoned"));
        }
    }
}

mod journal;
#[cfg(test)]
mod tests;
