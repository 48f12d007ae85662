//! Group commit. One writer thread commits the store's write transactions: it takes every
//! operation queued while the previous commit ran, applies them in one transaction and
//! commits. A client's change, on a home that answers before the sync, is committed by a
//! request's thread instead (flat combining, [`Committer::run_client_change`]): it is left in
//! a list, and a thread that finds the writer free commits everything the list holds as one
//! batch, its own change with it, while a thread that finds it taken leaves its change to
//! the holder. The writer's state is behind a lock that each of them takes, one batch at a
//! time, so batches stay serial and numbered in the order they applied. A home without a mirror group commits a batch as one record of the store's change
//! log, synced on this thread before its operations are answered, and the store's tables are
//! written at a checkpoint ([`how_to_commit`]; `store`). A mirrored home, and a checkpoint,
//! commits to redb: a home's store syncs each such commit in the background ([`HomeFile`]), so
//! the writer goes on with the next batch while an answer thread waits for the sync (one fsync
//! for the whole batch) and only then answers each operation. A lone operation that nothing waits
//! behind syncs on the writer thread instead, which then answers it: with nothing to overlap, the
//! hand-offs to the flusher and the answer thread would only add latency. A rejected operation has written
//! nothing (operations validate before they write), so it does not disturb its batch-mates; a
//! store failure abandons the whole batch and every operation in it gets the error.
//!
//! An operation may also say, as it applies, that its answer need not wait for the sync
//! ([`Answered::Committed`]): it is answered as soon as its batch committed, and a batch of
//! nothing else commits without a sync of its own. Its change is visible at once and durable
//! with the next sync; the writer asks for one at most [`UNSYNCED_FOR_MAX`] after the first
//! such change, or once a home's store holds [`UNSYNCED_BYTES_MAX`] of unsynced pages, whether
//! other commits come or not: what a crash can lose, and what a home keeps in memory for its
//! next sync, stays bounded. Only a change whose loss a restart
//! repairs may be answered that way (a size report of a file still marked unreported, see
//! `ops::setattr`).
//!
//! Bookkeeping that nobody waits for ([`Committer::tidy`]: a file's last close taking it off
//! the list of files without a size report, disposed files forgotten) rides in the next batch
//! instead of making a commit of its own: it is applied first in that batch's transaction, or
//! alone once it waited [`TIDY_HOLD_MAX`] for one. Only bookkeeping whose loss a restart
//! repairs may ride (the restart finds the rows and does again what they ask).
//!
//! [`HomeFile`]: crate::replica::HomeFile

use crate::replica::HomeLink;
use crate::schema::{OpError, StoreError};
use crate::store::Store as Database;
use crate::store::{Commit, WriteTransaction, Wrote};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use weft_proto::messages::MetaResponse;

/// Most operations applied in one transaction.
const BATCH_OPERATIONS_MAX: usize = 512;

/// Most operations queued or committing at once: a request beyond them waits for a slot
/// before its operation is queued (back-pressure on the connections, not a queue that grows
/// with the load).
pub(crate) const QUEUED_OPERATIONS_MAX: usize = 4 * BATCH_OPERATIONS_MAX;

/// Longest a committed change waits for a sync.
const UNSYNCED_FOR_MAX: Duration = Duration::from_secs(1);

/// Most bytes of unsynced pages a home's store keeps before it syncs them.
const UNSYNCED_BYTES_MAX: usize = 16 << 20;

/// An operation run inside the batch transaction; answered once its batch is durable.
pub(crate) type WriteOp =
    Box<dyn FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError> + Send>;

/// When an applied operation may be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answered {
    /// Once its batch is durable: synced, and on every present mirror member.
    Durable,
    /// Once its batch committed: every later operation sees it; durable with the next sync.
    Committed,
    /// A client's change with this number among the home's changes, whose rows its client
    /// keeps until the home's last synced number covers it. A home that answers before the
    /// sync answers it once its batch committed, if the batch holds no operation answered
    /// once durable, the home has no mirror group and keeps a change log; otherwise it is
    /// answered as [`Answered::Durable`] is. The sync that makes it durable makes its number
    /// the home's last synced ([`Committer::last_synced`]); the log's flusher syncs such
    /// changes in the background, while the writer goes on with the next batches.
    Numbered(u64),
}

/// An operation that tells, as it applies, when it may be answered.
pub(crate) type EventualOp =
    Box<dyn FnOnce(&WriteTransaction) -> Result<(MetaResponse, Answered), OpError> + Send>;

/// Bookkeeping applied in the next batch; nothing waits for it ([`Committer::tidy`]).
pub(crate) type TidyOp = Box<dyn FnOnce(&WriteTransaction) -> Result<(), OpError> + Send>;

/// Longest bookkeeping waits for a batch to ride in before it is committed alone.
const TIDY_HOLD_MAX: Duration = Duration::from_secs(1);

type Answer = oneshot::Sender<Result<MetaResponse, OpError>>;

/// What the writer thread is given.
enum Queued {
    /// An operation, and where its answer goes.
    Op(EventualOp, Answer),
    /// Bookkeeping for the next batch.
    Tidy(TidyOp),
    /// Nothing to apply: a commit made on another thread changed when the writer's next
    /// deadline falls ([`Committer::run_client_change`]).
    Nudge,
}

/// A committed batch waiting for its sync: each operation's answer and result (none when a
/// store failure abandoned it), and how the commit ended.
struct Committed {
    results: Vec<(Answer, Option<Result<MetaResponse, OpError>>)>,
    /// The highest change number given so far, this batch's included: on disk once the batch
    /// is.
    numbered: u64,
    /// Clients' changes answered when it committed, before its sync.
    numbered_early: usize,
    outcome: Result<(), StoreError>,
    started: Instant,
    /// The sync that makes the batch durable.
    sync: u64,
    /// Whether the commit asked for a sync: a batch of operations answered at commit did not.
    synced: bool,
    /// Operations already answered when the batch committed.
    answered: usize,
    /// Whether the batch was appended to the store's log (and synced there if `synced`), and
    /// not committed to redb: its outcome is final.
    logged: bool,
    /// Whether it was a checkpoint that wrote logged rows into the tables.
    checkpointed: bool,
}

/// What the writer thread reports to Prometheus.
#[derive(Clone, Debug)]
pub(crate) struct CommitMetrics {
    /// Operations queued or in the running batch.
    queued: Gauge,
    batch_operations: Histogram,
    commit_seconds: Histogram,
    commits: Counter,
    unsynced: Counter,
    /// Syncs made for commits answered before their sync.
    deferred_syncs: Counter,
    failed: Counter,
    logged: Counter,
    /// Commits made on a request's own thread.
    inline: Counter,
    checkpoints: Counter,
    /// Clients' changes answered before their sync.
    answered_early: Counter,
    /// Clients' changes made again from their replays after a restart.
    pub replayed: Counter,
    /// Clients' changes a restart dropped (a change before them was lost with its client).
    pub dropped: Counter,
    log_bytes: Gauge,
    /// Time a store's flusher takes to write, sync and ship one commit.
    pub sync_seconds: Histogram,
}

impl CommitMetrics {
    pub fn register(registry: &mut Registry) -> CommitMetrics {
        let metrics = CommitMetrics {
            queued: Gauge::default(),
            batch_operations: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            commit_seconds: Histogram::new(weft_observe::metrics::latency_histogram_buckets()),
            commits: Counter::default(),
            unsynced: Counter::default(),
            deferred_syncs: Counter::default(),
            failed: Counter::default(),
            logged: Counter::default(),
            inline: Counter::default(),
            checkpoints: Counter::default(),
            answered_early: Counter::default(),
            replayed: Counter::default(),
            dropped: Counter::default(),
            log_bytes: Gauge::default(),
            sync_seconds: Histogram::new(weft_observe::metrics::latency_histogram_buckets()),
        };
        registry.register(
            "weft_meta_commit_queue_depth",
            "Metadata changes waiting for or inside the running commit",
            metrics.queued.clone(),
        );
        registry.register(
            "weft_meta_commit_batch_operations",
            "Metadata changes applied per commit (group commit)",
            metrics.batch_operations.clone(),
        );
        registry.register(
            "weft_meta_commit_duration_seconds",
            "Time to apply and durably commit one batch",
            metrics.commit_seconds.clone(),
        );
        registry.register(
            "weft_meta_commits",
            "Commits of the metadata store",
            metrics.commits.clone(),
        );
        registry.register(
            "weft_meta_unsynced_commits",
            "Commits without a sync of their own (size reports of new files), durable with the \
             next sync; also counted in weft_meta_commits",
            metrics.unsynced.clone(),
        );
        registry.register(
            "weft_meta_deferred_syncs",
            "Syncs made for commits answered before their sync, at most 1 s after the first of \
             them or once 16 MiB of their pages wait",
            metrics.deferred_syncs.clone(),
        );
        registry.register(
            "weft_meta_commit_failures",
            "Commits that failed; every change in them got an error",
            metrics.failed.clone(),
        );
        registry.register(
            "weft_meta_logged_commits",
            "Commits appended to the store's change log as one record; the others are redb \
             commits (a mirrored home's, checkpoints); also counted in weft_meta_commits",
            metrics.logged.clone(),
        );
        registry.register(
            "weft_meta_inline_commits",
            "Commits of clients' changes made by a request's own thread, with no hand-off to \
             the commit thread (flat combining); also counted in weft_meta_commits",
            metrics.inline.clone(),
        );
        registry.register(
            "weft_meta_checkpoints",
            "Checkpoints that wrote the rows of the change log's records into the store's tables",
            metrics.checkpoints.clone(),
        );
        registry.register(
            "weft_meta_log_bytes",
            "Bytes of the change log's records since the last checkpoint (checkpoint_bytes \
             starts the next)",
            metrics.log_bytes.clone(),
        );
        registry.register(
            "weft_meta_answered_before_sync",
            "Clients' changes answered before their sync, which their clients keep until it \
             (sync_every_change = false)",
            metrics.answered_early.clone(),
        );
        registry.register(
            "weft_meta_replayed_changes",
            "Clients' changes made again from their replays after a restart",
            metrics.replayed.clone(),
        );
        registry.register(
            "weft_meta_dropped_changes",
            "Clients' changes a restart dropped: a change made before them was lost with its \
             client",
            metrics.dropped.clone(),
        );
        // After the commit counter, so a scrape never counts a commit whose sync it did not.
        registry.register(
            "weft_meta_sync_duration_seconds",
            "Time to write one commit's pages to the store file, sync it and ship them to the \
             mirror members: the commit's share of the disk",
            metrics.sync_seconds.clone(),
        );
        metrics
    }
}

/// Handle to the writer thread.
pub(crate) struct Committer {
    /// The highest change number on disk (and on every present mirror member).
    last_synced: Arc<std::sync::atomic::AtomicU64>,
    queue: mpsc::Sender<Queued>,
    /// What commits, and what it remembers between batches: taken by the writer thread for
    /// each batch, and by a request's own thread for a client's change that can commit
    /// there ([`Committer::run_client_change`]).
    writer: Arc<std::sync::Mutex<Writer>>,
    /// Clients' changes left for the next thread that holds the writer.
    pending: Arc<Pending>,
    /// Slots of [`QUEUED_OPERATIONS_MAX`] operations in the queue or its batch.
    slots: tokio::sync::Semaphore,
    metrics: CommitMetrics,
}

impl Committer {
    /// Starts the writer thread of `db`, whose changes were numbered up to `numbered` when it
    /// opened (all on disk); with `syncs`, the store syncs in the background and each batch
    /// is answered once its sync finished. With `answer_before_sync`, a client's numbered
    /// change is answered as soon as its batch is logged (see [`Answered::Numbered`]), and a
    /// flusher thread syncs the log behind it; `sync_delay` is how long any change answered
    /// before its sync may wait for it (none: the defaults, see `MetaConfig::sync_delay_ms`).
    pub fn start(
        (db, numbered): (Arc<Database>, u64),
        syncs: Option<Arc<HomeLink>>,
        metrics: CommitMetrics,
        (checkpoint_bytes, answer_before_sync, sync_delay): (u64, bool, Option<Duration>),
    ) -> Committer {
        let (queue, receiver) = mpsc::channel::<Queued>();
        let (committed, waiting) = mpsc::channel::<Committed>();
        let last_synced = Arc::new(std::sync::atomic::AtomicU64::new(numbered));
        let (flushes, flushing) = mpsc::channel::<u64>();
        if answer_before_sync {
            let flusher_db = Arc::clone(&db);
            let flusher_synced = Arc::clone(&last_synced);
            std::thread::Builder::new()
                .name("weft-meta-flush".into())
                .spawn(move || flush_loop(&flusher_db, &flushing, &flusher_synced))
                .expect("spawning the log's flusher");
        }
        let pending = Arc::new(Pending::default());
        let writer = Arc::new(std::sync::Mutex::new(Writer {
            db,
            pending: Arc::clone(&pending),
            syncs: syncs.clone(),
            checkpoint_bytes,
            answer_before_sync,
            sync_delay,
            numbered,
            unsynced_since: None,
            last_sync: 0,
            tidies: Vec::new(),
            tidy_since: None,
            committed,
            flushes,
            metrics: metrics.clone(),
            last_synced: Arc::clone(&last_synced),
        }));
        let thread_writer = Arc::clone(&writer);
        let thread_pending = Arc::clone(&pending);
        std::thread::Builder::new()
            .name("weft-meta-commit".into())
            .spawn(move || writer_loop(&thread_writer, &thread_pending, &receiver))
            .expect("spawning the commit thread");
        let answer_metrics = metrics.clone();
        let answer_synced = Arc::clone(&last_synced);
        std::thread::Builder::new()
            .name("weft-meta-answer".into())
            .spawn(move || {
                while let Ok(batch) = waiting.recv() {
                    let synced = match &syncs {
                        Some(link) if batch.outcome.is_ok() => link.wait_synced(batch.sync),
                        _ => Ok(()),
                    };
                    answer(batch, synced, (&answer_metrics, &answer_synced));
                }
            })
            .expect("spawning the answer thread");
        Committer {
            last_synced,
            queue,
            writer,
            pending,
            slots: tokio::sync::Semaphore::new(QUEUED_OPERATIONS_MAX),
            metrics,
        }
    }

    /// The counters of the store's commits and replays.
    pub fn metrics(&self) -> &CommitMetrics {
        &self.metrics
    }

    /// The highest number of a change on disk (and on every present mirror member): a
    /// client keeps the rows of its changes numbered above it.
    pub fn last_synced(&self) -> u64 {
        self.last_synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Makes every change committed so far durable (and shipped to every present mirror
    /// member): an empty change, answered once its batch is.
    pub async fn sync(&self) -> Result<(), OpError> {
        self.run(Box::new(|_| Ok(MetaResponse::Done)))
            .await
            .map(drop)
    }

    /// Runs `op` in the next batch and hands back what it computed once its batch is durable.
    pub async fn run_with<T: Send + 'static>(
        &self,
        op: impl FnOnce(&WriteTransaction) -> Result<T, OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        self.run_with_eventual(move |txn| op(txn).map(|value| (value, Answered::Durable)))
            .await
    }

    /// Runs `op` in the next batch and hands back what it computed once its batch committed,
    /// and also once it is durable unless `op` said otherwise (as [`Committer::run_eventual`]).
    pub async fn run_with_eventual<T: Send + 'static>(
        &self,
        op: impl FnOnce(&WriteTransaction) -> Result<(T, Answered), OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        self.run_with_queued(op, false).await
    }

    /// [`Committer::run_with_eventual`] for a client's change, which may commit on the
    /// calling thread ([`Committer::run_client_change`]).
    pub async fn run_client_change_with<T: Send + 'static>(
        &self,
        op: impl FnOnce(&WriteTransaction) -> Result<(T, Answered), OpError> + Send + 'static,
    ) -> Result<T, OpError> {
        self.run_with_queued(op, true).await
    }

    async fn run_with_queued<T: Send + 'static>(
        &self,
        op: impl FnOnce(&WriteTransaction) -> Result<(T, Answered), OpError> + Send + 'static,
        inline: bool,
    ) -> Result<T, OpError> {
        let (sender, receiver) = oneshot::channel();
        self.run_queued(
            Box::new(move |txn| {
                let (value, answered) = op(txn)?;
                let _ = sender.send(value);
                Ok((MetaResponse::Done, answered))
            }),
            inline,
        )
        .await?;
        receiver
            .await
            .map_err(|_| OpError::Store(StoreError::Stopped))
    }

    /// Runs `op` in the next batch and waits until its batch is durable.
    pub async fn run(&self, op: WriteOp) -> Result<MetaResponse, OpError> {
        self.run_eventual(Box::new(move |txn| {
            op(txn).map(|response| (response, Answered::Durable))
        }))
        .await
    }

    /// Applies `op` in the next batch, without waiting for it: for bookkeeping whose loss a
    /// restart repairs. A failure of `op` is logged; a store failure abandons its batch, and
    /// the bookkeeping with it.
    pub fn tidy(&self, op: TidyOp) {
        // A writer that stopped applies nothing more: the restart finds the rows.
        let _ = self.queue.send(Queued::Tidy(op));
    }

    /// Runs `op` in the next batch and waits until its batch committed, and also until it is
    /// durable unless `op` answered [`Answered::Committed`].
    pub async fn run_eventual(&self, op: EventualOp) -> Result<MetaResponse, OpError> {
        self.run_queued(op, false).await
    }

    /// Runs a client's change `op` as [`Committer::run_eventual`] does; when the home answers
    /// before the sync and has no mirror group, and no sync of redb runs (a commit would wait
    /// for it), on the calling thread if it finds the writer free, with every client change
    /// left meanwhile, or else on the thread that holds it ([`Committer::combine`]). Such a
    /// change is numbered and answered once logged ([`Answered::Numbered`]), so its commit is
    /// an append to the log without a sync: a request's thread does it in less time than the
    /// two hand-offs to the writer thread and back would take. Anything
    /// else (a change that turns out to wait for its sync, a checkpoint the log's size asks
    /// for) is committed the same way, synced on the calling thread once the runtime's other
    /// tasks on it went to another thread ([`may_block`]).
    pub async fn run_client_change(&self, op: EventualOp) -> Result<MetaResponse, OpError> {
        self.run_queued(op, true).await
    }

    async fn run_queued(&self, op: EventualOp, inline: bool) -> Result<MetaResponse, OpError> {
        // Held until the answer: the operation's slot among those queued or committing.
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| OpError::Store(StoreError::Stopped))?;
        let (answer, receiver) = oneshot::channel();
        self.metrics.queued.inc();
        let queued = Queued::Op(op, answer);
        if inline {
            self.combine(queued);
            return receiver
                .await
                .map_err(|_| OpError::Store(StoreError::Stopped))?;
        }
        if self.queue.send(queued).is_err() {
            self.metrics.queued.dec();
            return Err(OpError::Store(StoreError::Stopped));
        }
        receiver
            .await
            .map_err(|_| OpError::Store(StoreError::Stopped))?
    }
}

impl Committer {
    /// Leaves a client's change `queued` for whichever thread holds the writer next, and
    /// commits what is left so on this thread while the writer is free (flat combining): a
    /// change alone commits on its request's own thread, with no hand-off, and changes that
    /// arrive while a commit runs are committed together by the thread that held the writer,
    /// one hand-off each, where the writer thread's batches cost two (to it and back). When the
    /// home does not commit client changes inline (a mirrored home, a sync of redb running,
    /// every change synced before its answer), they go to the writer thread instead.
    fn combine(&self, queued: Queued) {
        lock_pending(&self.pending).push_back(queued);
        loop {
            let mut writer = match self.writer.try_lock() {
                Ok(writer) => writer,
                // Its holder takes what is left once it lets go of the writer.
                Err(std::sync::TryLockError::WouldBlock) => return,
                Err(std::sync::TryLockError::Poisoned(_)) => {
                    // A commit panicked: nothing commits any more, and every change left is
                    // answered so (its answer dropped) rather than kept waiting.
                    while let Some(queued) = take_pending(&self.pending) {
                        drop(queued);
                        self.metrics.queued.dec();
                    }
                    return;
                }
            };
            let mut batches = 0;
            while let Some(first) = take_pending(&self.pending) {
                if batches == COMBINED_BATCHES_MAX {
                    // Under a steady stream of changes one request's thread would commit for
                    // ever, its own answer waiting: the writer thread takes the rest.
                    lock_pending(&self.pending).push_front(first);
                    drop(writer);
                    let _ = self.queue.send(Queued::Nudge);
                    return;
                }
                batches += 1;
                if !writer.commits_inline() {
                    let mut next = Some(first);
                    while let Some(queued) = next {
                        if let Err(mpsc::SendError(queued)) = self.queue.send(queued) {
                            // The writer stopped: the change's answer is dropped, and its
                            // request told so.
                            drop(queued);
                            self.metrics.queued.dec();
                        }
                        next = take_pending(&self.pending);
                    }
                    break;
                }
                let nudge = writer.commit(Some(first), None);
                self.metrics.inline.inc();
                if nudge {
                    let _ = self.queue.send(Queued::Nudge);
                }
            }
            // What was answered before its sync is synced once due, whichever thread holds
            // the writer when it falls due.
            if writer.sync_due() {
                may_block(true, || writer.sync_if_due());
            }
            drop(writer);
            // A change left while this thread held the writer, by a thread that found it
            // taken, is this thread's to commit.
            if lock_pending(&self.pending).is_empty() {
                return;
            }
        }
    }
}

/// Most batches a request's thread commits in a row before it leaves the rest to the writer
/// thread ([`Committer::combine`]).
const COMBINED_BATCHES_MAX: usize = 4;

/// Client changes left for the next thread that holds the writer ([`Committer::combine`]).
type Pending = std::sync::Mutex<std::collections::VecDeque<Queued>>;

fn lock_pending(
    pending: &Pending,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Queued>> {
    pending.lock().expect("pending changes poisoned")
}

fn take_pending(pending: &Pending) -> Option<Queued> {
    lock_pending(pending).pop_front()
}

/// What commits, and what it keeps between batches. One batch at a time: the writer thread
/// and a request's thread take it in turn ([`Committer::run_client_change`]).
struct Writer {
    db: Arc<Database>,
    /// Clients' changes left for whoever holds the writer, which its batches take too.
    pending: Arc<Pending>,
    syncs: Option<Arc<HomeLink>>,
    checkpoint_bytes: u64,
    answer_before_sync: bool,
    sync_delay: Option<Duration>,
    /// The highest change number given so far.
    numbered: u64,
    /// When the first commit answered before its sync was made, while it is not synced yet.
    unsynced_since: Option<Instant>,
    /// The sync of the last batch that committed with one.
    last_sync: u64,
    /// Bookkeeping waiting for the next batch, and since when.
    tidies: Vec<TidyOp>,
    tidy_since: Option<Instant>,
    /// Batches whose answers wait for a sync running in the background.
    committed: mpsc::Sender<Committed>,
    /// The log's flusher: the highest number answered before its sync.
    flushes: mpsc::Sender<u64>,
    metrics: CommitMetrics,
    last_synced: Arc<std::sync::atomic::AtomicU64>,
}

impl Writer {
    fn unsynced_max(&self) -> Duration {
        self.sync_delay.unwrap_or(UNSYNCED_FOR_MAX)
    }

    /// Whether a client's change may commit on its request's thread now.
    fn commits_inline(&self) -> bool {
        self.answer_before_sync
            && self
                .syncs
                .as_deref()
                .is_none_or(|link| !link.mirrored() && !link.syncing())
    }

    /// Syncs what was answered before its sync once it waited long enough, or once enough of
    /// it waits.
    fn sync_if_due(&mut self) {
        if self.sync_due() {
            sync_now(
                &self.db,
                self.syncs.as_deref(),
                (self.numbered, &self.last_synced),
            );
            self.metrics.deferred_syncs.inc();
            self.unsynced_since = None;
        }
    }

    /// Whether what was answered before its sync waited long enough, or enough of it waits.
    fn sync_due(&self) -> bool {
        self.unsynced_since.is_some_and(|since| {
            let syncs = self.syncs.as_deref();
            syncs.is_some_and(|link| link.unsynced_bytes() >= UNSYNCED_BYTES_MAX)
                || self.db.unsynced_log_bytes() >= UNSYNCED_BYTES_MAX
                || since.elapsed() >= self.unsynced_max()
        })
    }

    /// When the writer thread next has something to do without an operation: a sync of
    /// what was answered before it, or bookkeeping that waited long enough for a batch.
    fn deadline(&self) -> Option<Instant> {
        [
            self.unsynced_since.map(|since| since + self.unsynced_max()),
            self.tidy_since.map(|since| since + TIDY_HOLD_MAX),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Takes bookkeeping for the next batch; false when the batch should commit now (too
    /// much waits).
    fn hold(&mut self, op: TidyOp) -> Option<TidyOp> {
        if self.tidies.len() >= BATCH_OPERATIONS_MAX {
            return Some(op);
        }
        self.tidy_since.get_or_insert_with(Instant::now);
        self.tidies.push(op);
        None
    }

    /// Commits the bookkeeping held, `first` and, with `receiver`, what else is queued,
    /// as one batch, and answers it or hands it to the answer thread. True when the commit
    /// set a deadline the writer thread does not know of yet.
    fn commit(&mut self, first: Option<Queued>, receiver: Option<&mpsc::Receiver<Queued>>) -> bool {
        self.tidy_since = None;
        let had_deadline = self.deadline().is_some();
        let syncs = self.syncs.as_deref();
        let batch = commit_batch(
            (&self.db, self.checkpoint_bytes, self.answer_before_sync),
            (std::mem::take(&mut self.tidies), first),
            (receiver, &self.pending, self.numbered),
            syncs,
        );
        let metrics = &self.metrics;
        if batch.outcome.is_ok() {
            // A failed batch's numbers were never given: the next batch gives them again.
            self.numbered = batch.numbered;
        }
        if batch.outcome.is_ok() && batch.numbered_early > 0 {
            metrics.answered_early.inc_by(batch.numbered_early as u64);
        }
        if batch.outcome.is_ok()
            && !batch.synced
            && batch.numbered_early > 0
            && self.sync_delay.is_none()
        {
            // Synced in the background, with every change answered before it meanwhile.
            let _ = self.flushes.send(self.numbered);
        }
        if syncs.is_some() && batch.outcome.is_ok() && batch.synced && !batch.logged {
            // Its answers wait for its own sync: one asked after every earlier batch's. A
            // commit that asked for none would be answered on an older batch's sync, before
            // its own changes are on disk.
            assert!(
                batch.sync > self.last_sync,
                "a batch of {} operations committed with sync {} after a batch with sync {}: its answers would not wait for its own changes",
                batch.results.len(),
                batch.sync,
                self.last_sync
            );
            self.last_sync = batch.sync;
        }
        if batch.outcome.is_ok() {
            if batch.synced {
                // A sync makes every commit before it durable too.
                self.unsynced_since = None;
            } else {
                self.unsynced_since.get_or_insert_with(Instant::now);
                metrics.unsynced.inc();
            }
            if batch.logged {
                metrics.logged.inc();
            }
            if batch.checkpointed {
                metrics.checkpoints.inc();
            }
        }
        metrics
            .log_bytes
            .set(i64::try_from(self.db.logged_bytes()).unwrap_or(i64::MAX));
        let synced = match syncs {
            Some(link) if batch.outcome.is_ok() && batch.synced && !batch.logged => {
                may_block(receiver.is_none(), || link.sync_outcome(batch.sync))
            }
            _ => Some(Ok(())),
        };
        match synced {
            // Synced on this thread (or failed): answered from here, in no other's turn.
            Some(synced) => answer(batch, synced, (metrics, &self.last_synced)),
            None => {
                // The answer thread ends only when this writer does.
                let _ = self.committed.send(batch);
            }
        }
        !had_deadline && self.deadline().is_some()
    }
}

/// Runs `work`, which may wait for the disk: when `blocks` on a runtime's worker thread, with
/// the worker's other tasks handed to another thread meanwhile (a commit made on a request's
/// own thread, [`Committer::run_client_change`], that turned out to need a sync or a
/// checkpoint).
fn may_block<T>(blocks: bool, work: impl FnOnce() -> T) -> T {
    let on_worker = blocks
        && tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
            runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        });
    if on_worker {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// The writer thread: commits what is queued, in batches, what waits for a deadline, and the
/// clients' changes left for it while it held the writer ([`Committer::combine`]).
fn writer_loop(
    writer: &std::sync::Mutex<Writer>,
    pending: &Pending,
    receiver: &mpsc::Receiver<Queued>,
) {
    let lock = || writer.lock().expect("metadata writer poisoned");
    let mut received = None;
    // Whether the last wait ended at a deadline.
    let mut waited = false;
    loop {
        let deadline = {
            let mut writer = lock();
            // Bookkeeping waits for an operation to ride with, or until it waited long enough.
            let first = match received.take() {
                None | Some(Queued::Nudge) => None,
                Some(Queued::Tidy(op)) => writer.hold(op).map(Queued::Tidy),
                Some(queued) => Some(queued),
            };
            let tidy_due = waited
                && writer
                    .tidy_since
                    .is_some_and(|since| since.elapsed() >= TIDY_HOLD_MAX);
            if first.is_some() || tidy_due {
                writer.commit(first, Some(receiver));
            }
            while let Some(first) = take_pending(pending) {
                writer.commit(Some(first), Some(receiver));
                // Due even while changes keep coming.
                writer.sync_if_due();
            }
            writer.sync_if_due();
            writer.deadline()
        };
        waited = false;
        // A change left while this thread held the writer, by a thread that found it taken.
        if !lock_pending(pending).is_empty() {
            continue;
        }
        match deadline {
            Some(deadline) => {
                match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(queued) => received = Some(queued),
                    Err(mpsc::RecvTimeoutError::Timeout) => waited = true,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        let writer = lock();
                        sync_now(
                            &writer.db,
                            writer.syncs.as_deref(),
                            (writer.numbered, &writer.last_synced),
                        );
                        return;
                    }
                }
            }
            None => match receiver.recv() {
                Ok(queued) => received = Some(queued),
                Err(_) => return,
            },
        }
    }
}

/// Syncs the change log in the background whenever clients' changes were answered before
/// their sync: each request carries the highest number appended when it was sent, and one
/// sync covers every request waiting when it starts (group commit off the reply path). The
/// log's records are written in order whoever syncs them (`Store::sync_log`), so a record
/// synced here never passes one the commit thread syncs itself.
fn flush_loop(
    db: &Database,
    flushing: &mpsc::Receiver<u64>,
    last_synced: &std::sync::atomic::AtomicU64,
) {
    while let Ok(mut numbered) = flushing.recv() {
        // Nobody waits for this sync (an fsync syncs on the commit thread): the changes of
        // the next moments share it.
        std::thread::sleep(FLUSH_GATHER);
        while let Ok(more) = flushing.try_recv() {
            numbered = numbered.max(more);
        }
        // A crash here loses clients' changes answered since the last sync: they replay them.
        weft_service::failpoint::failpoint("meta-before-numbered-sync");
        match db.sync_log() {
            Ok(()) => {
                last_synced.fetch_max(numbered, std::sync::atomic::Ordering::AcqRel);
            }
            // The log refuses every later record: the home is opened again.
            Err(error) => tracing::error!(%error, "syncing the metadata change log failed"),
        }
    }
}

/// Makes every commit so far durable, the changes numbered up to `numbered` with them, and
/// the last of them the home's `last_synced`: an empty commit, synced on this thread.
fn sync_now(
    db: &Database,
    syncs: Option<&HomeLink>,
    (numbered, last_synced): (u64, &std::sync::atomic::AtomicU64),
) {
    // A home served elsewhere now keeps what it had: the next start recovers the rest.
    if syncs.is_some_and(HomeLink::fenced) {
        return;
    }
    // A crash here loses every change answered since the last sync.
    weft_service::failpoint::failpoint("meta-before-idle-sync");
    // Both: the log's records, and any commit to redb made without a sync (a mirrored home's
    // answered at commit). An empty checkpoint writes nothing but its sync; one that finds
    // logged rows writes them too, and the log starts again.
    let synced = db
        .sync_log()
        .map_err(|error| error.to_string())
        .and_then(|()| {
            if db.has_logged_rows() {
                return Ok(());
            }
            db.begin_write()
                .map_err(|error| error.to_string())
                .and_then(|txn| {
                    syncs.inspect(|link| link.sync_next_inline());
                    txn.commit(Commit::Checkpoint { durable: true })
                        .map(drop)
                        .map_err(|error| error.to_string())
                })
        });
    match synced {
        Ok(()) => {
            last_synced.fetch_max(numbered, std::sync::atomic::Ordering::AcqRel);
        }
        // The next commit that waits for its sync reports the failure to its operations.
        Err(error) => tracing::error!(%error, "syncing the metadata store failed"),
    }
}

/// How long the flusher lets changes gather before a sync of the log.
const FLUSH_GATHER: Duration = Duration::from_millis(2);

/// How long the writer waits for another operation while the last sync still runs.
const GATHER_POLL: Duration = Duration::from_micros(100);

/// Applies the bookkeeping `tidies`, then `first`, every operation already queued, and every
/// one that arrives while the last commit's sync still runs (a commit could not start its own
/// sync before), in one transaction, and commits it. A batch of bookkeeping alone commits
/// without a sync, as one of operations answered at commit does.
fn commit_batch(
    (db, checkpoint_bytes, answer_before_sync): (&Database, u64, bool),
    (tidies, first): (Vec<TidyOp>, Option<Queued>),
    (receiver, pending, mut numbered): (Option<&mpsc::Receiver<Queued>>, &Pending, u64),
    syncs: Option<&HomeLink>,
) -> Committed {
    let started = Instant::now();
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(error) => {
            let results = match first {
                Some(Queued::Op(_, answer)) => vec![(answer, None)],
                _ => Vec::new(),
            };
            return Committed {
                results,
                numbered,
                numbered_early: 0,
                outcome: Err(error),
                started,
                sync: 0,
                synced: true,
                answered: 0,
                logged: false,
                checkpointed: false,
            };
        }
    };
    let mut results = Vec::new();
    // The operations answered once the batch committed, without waiting for its sync.
    let mut early = Vec::new();
    // Clients' changes answered so if nothing in the batch waits for its sync, and the batch
    // is logged.
    let mut numbered_early = Vec::new();
    let mut failure = None;
    let tidy = |op: TidyOp, failure: &mut Option<StoreError>| {
        if failure.is_some() {
            return;
        }
        match op(&txn) {
            Ok(()) => {}
            Err(OpError::Store(error)) => *failure = Some(error),
            Err(error) => tracing::warn!(?error, "metadata bookkeeping failed"),
        }
    };
    for op in tidies {
        tidy(op, &mut failure);
    }
    let mut next = first;
    while let Some(queued) = next.take() {
        match queued {
            Queued::Nudge => {}
            Queued::Tidy(op) => tidy(op, &mut failure),
            Queued::Op(_, answer) if failure.is_some() => results.push((answer, None)),
            Queued::Op(op, answer) => match op(&txn) {
                Err(OpError::Store(message)) => {
                    failure = Some(message);
                    results.push((answer, None));
                }
                Ok((response, Answered::Committed)) => early.push((answer, response)),
                Ok((response, Answered::Durable)) => results.push((answer, Some(Ok(response)))),
                Ok((response, Answered::Numbered(number))) => {
                    numbered = numbered.max(number);
                    if answer_before_sync {
                        numbered_early.push((answer, response));
                    } else {
                        results.push((answer, Some(Ok(response))));
                    }
                }
                Err(error) => results.push((answer, Some(Err(error)))),
            },
        }
        if results.len() + early.len() + numbered_early.len() >= BATCH_OPERATIONS_MAX {
            break;
        }
        next = receiver
            .and_then(|receiver| receiver.try_recv().ok())
            .or_else(|| take_pending(pending));
        let Some(receiver) = receiver else { continue };
        while next.is_none() && syncs.is_some_and(HomeLink::syncing) {
            match receiver.recv_timeout(GATHER_POLL) {
                Ok(queued) => next = Some(queued),
                Err(mpsc::RecvTimeoutError::Timeout) => next = take_pending(pending),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    if !results.is_empty()
        || (!numbered_early.is_empty() && !logs_batch((db, &txn), syncs, checkpoint_bytes))
    {
        // A batch mate waits for the sync: a client's change must not outlive, in its
        // client's hands, a change made before it that a crash would lose. Nor is a batch
        // that is to be a checkpoint answered before it is synced: only the log's records are
        // synced in the background.
        results.extend(
            numbered_early
                .drain(..)
                .map(|(answer, response)| (answer, Some(Ok(response)))),
        );
    }
    let synced = !results.is_empty();
    let numbered_early_count = numbered_early.len();
    early.extend(numbered_early);
    let answered = early.len();
    let mut logged = false;
    let mut checkpointed = false;
    let outcome = match failure {
        Some(message) => {
            let _ = txn.abort();
            Err(message)
        }
        None => {
            let lone = results.len() == 1 && early.is_empty() && next.is_none();
            let (how, covers_log) = how_to_commit((db, &txn), syncs, synced, checkpoint_bytes);
            let checkpoint = matches!(how, Commit::Checkpoint { .. });
            // A commit made on a request's own thread that waits for the disk (a sync, a
            // checkpoint's tables) hands that thread's other tasks to another one first.
            may_block(receiver.is_none() && (synced || checkpoint), || {
                if checkpoint && (covers_log || (synced && lone)) {
                    // A checkpoint of logged rows is synced here, so that the log can start again
                    // at once (nothing else is logged meanwhile). A lone operation, nothing
                    // waiting and no sync running: a sync on this thread overlaps nothing anyway,
                    // and spares two hand-offs between threads. Under concurrency the sync stays
                    // in the background, where the next batch is applied while it runs.
                    syncs.inspect(|link| link.sync_next_inline());
                }
                // A record answered once it is in the log must not be durable before a commit to
                // redb it was applied over (a checkpoint whose sync runs in the background, the
                // start's own commits): a crash would then keep the later change without the
                // earlier one.
                let earlier = match (checkpoint, syncs) {
                    (false, Some(link)) => link.wait_synced(link.last_sync()),
                    _ => Ok(()),
                };
                let committed = earlier.and_then(|()| txn.commit(how));
                match committed {
                    Ok(Wrote::Logged) => {
                        logged = true;
                        Ok(())
                    }
                    Ok(Wrote::Checkpoint { of_logged: false }) => Ok(()),
                    Ok(Wrote::Checkpoint { of_logged: true }) => {
                        checkpointed = true;
                        let on_disk =
                            syncs.map_or(Some(Ok(())), |link| link.sync_outcome(link.last_sync()));
                        match on_disk {
                            Some(Ok(())) => db.restart_log(),
                            Some(Err(error)) => Err(error),
                            // Not synced inline after all: the log keeps its records, which a
                            // start skips up to the position the checkpoint recorded, until the
                            // next checkpoint of logged rows restarts it.
                            None => Ok(()),
                        }
                    }
                    Err(error) => Err(error),
                }
            })
        }
    };
    for (answer, response) in early {
        let _ = answer.send(match &outcome {
            Ok(()) => Ok(response),
            Err(error) => Err(OpError::Store(error.clone())),
        });
    }
    Committed {
        results,
        numbered,
        numbered_early: numbered_early_count,
        outcome,
        started,
        // Only the writer's holder commits, so the last sync asked for is this commit's.
        sync: syncs.map_or(0, HomeLink::last_sync),
        synced,
        answered,
        logged,
        checkpointed,
    }
}

/// Whether batch `txn` is appended to the store's log rather than checkpointed: a home
/// without a mirror group whose redb holds no commit made without a sync, while the log has
/// room (`Store::can_log`).
fn logs_batch(
    (db, txn): (&Database, &WriteTransaction),
    syncs: Option<&HomeLink>,
    checkpoint_bytes: u64,
) -> bool {
    let mirrored = syncs.is_some_and(HomeLink::mirrored);
    let unsynced = syncs.is_some_and(|link| link.unsynced_bytes() > 0);
    !mirrored && !unsynced && db.can_log(txn, checkpoint_bytes)
}

/// How a batch `txn` that `synced` (or is answered at commit) goes to the disk, and whether
/// that writes logged rows into the tables. A mirrored home checkpoints every batch, whose
/// pages ship to the members; any other home logs it, until the log holds enough to
/// checkpoint, or the batch cannot be logged (`Store::can_log`), or redb holds commits made
/// without a sync (a home that was mirrored until now), which the checkpoint syncs.
fn how_to_commit(
    (db, txn): (&Database, &WriteTransaction),
    syncs: Option<&HomeLink>,
    synced: bool,
    checkpoint_bytes: u64,
) -> (Commit, bool) {
    if logs_batch((db, txn), syncs, checkpoint_bytes) {
        return (Commit::Logged { sync: synced }, false);
    }
    let covers_log = db.has_logged_rows();
    (
        Commit::Checkpoint {
            durable: synced || covers_log,
        },
        covers_log,
    )
}

impl CommitMetrics {
    /// Syncs made so far for commits answered before their sync.
    #[cfg(test)]
    pub fn deferred_syncs(&self) -> u64 {
        self.deferred_syncs.get()
    }

    /// Commits so far.
    #[cfg(test)]
    pub fn commits(&self) -> u64 {
        self.commits.get()
    }
}

/// Answers each operation of a committed batch once `synced` says how its sync ended; the
/// batch's changes are then the home's `last_synced` if it synced.
fn answer(
    batch: Committed,
    synced: Result<(), StoreError>,
    (metrics, last_synced): (&CommitMetrics, &std::sync::atomic::AtomicU64),
) {
    let operations = batch.results.len() + batch.answered;
    let outcome = batch.outcome.and(synced);
    if outcome.is_ok() && batch.synced {
        last_synced.fetch_max(batch.numbered, std::sync::atomic::Ordering::AcqRel);
    }
    // Counted before anyone is answered: an operation's caller finds its commit counted.
    metrics.batch_operations.observe(operations as f64);
    metrics
        .commit_seconds
        .observe(batch.started.elapsed().as_secs_f64());
    if outcome.is_ok() {
        metrics.commits.inc();
    } else {
        metrics.failed.inc();
    }
    metrics.queued.dec_by(operations as i64);
    for (answer, result) in batch.results {
        let reply = match (&outcome, result) {
            (Ok(()), Some(result)) => result,
            (Ok(()), None) => Err(OpError::inconsistent("batch abandoned")),
            (Err(error), _) => Err(OpError::Store(error.clone())),
        };
        let _ = answer.send(reply);
    }
}
