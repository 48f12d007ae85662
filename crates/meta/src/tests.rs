//! Unit tests of the metadata store and its operations, on a real redb file and the real
//! group-commit thread, without a network.

use crate::chooser::Chooser;
use crate::commit::{Answered, Committer};
use crate::config::TargetChooser;
use crate::ops::create::{create, ensure_root, NewEntry};
use crate::ops::lookup::{lookup, read_dir};
use crate::ops::remove::unlink;
use crate::ops::rename::{rename, RenameArgs};
use crate::ops::setattr::{report_size, set_attr};
use crate::ops::OpContext;
use crate::schema::{create_tables, OpError, DISPOSALS, UNREPORTED};
use crate::service::idempotent;
use crate::store::{ReadableTable, Store as Database};
use std::sync::Arc;
use weft_proto::ids::{ClientId, InodeId, NodeId, StoragePoolId, TargetId};
use weft_proto::layout::SlotSet;
use weft_proto::messages::{
    AttrChanges, CheckReport, ClusterMap, DirEntry, FileKind, InodeAttr, MetaResponse, MutationId,
    NewInode, Reachability, RenameFlags, SizeReport, SpaceUsage, TargetInfo,
};
use weft_proto::ErrorCode;

struct Fixture {
    _directory: tempfile::TempDir,
    db: Arc<Database>,
    committer: Committer,
    metrics: crate::commit::CommitMetrics,
    context: Arc<OpContext>,
    next_seq: std::sync::atomic::AtomicU64,
}

fn fixture() -> Fixture {
    let directory = tempfile::tempdir().expect("tempdir");
    let db = Arc::new(
        Database::create(directory.path().join("meta.redb"))
            .expect("db")
            .0,
    );
    create_tables(&db).expect("tables");
    let txn = db.begin_write().expect("txn");
    assert!(ensure_root(&txn).expect("root"));
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    let targets = (1..=4)
        .map(|id| TargetInfo {
            id: TargetId(id),
            node: NodeId(1),
            pool: StoragePoolId::DEFAULT,
            reachability: Reachability::Online,
            usage: SpaceUsage::default(),
            draining: false,
        })
        .collect();
    let context = Arc::new(OpContext {
        home: NodeId(1),
        chooser: Arc::new(Chooser::new(TargetChooser::Roundrobin)),
        map: Arc::new(ClusterMap {
            targets,
            ..ClusterMap::default()
        }),
    });
    let metrics = crate::commit::CommitMetrics::register(
        &mut prometheus_client::registry::Registry::default(),
    );
    Fixture {
        committer: Committer::start(
            (Arc::clone(&db), 0),
            None,
            metrics.clone(),
            (crate::config::CHECKPOINT_BYTES_DEFAULT, false, None),
        ),
        metrics,
        _directory: directory,
        db,
        context,
        next_seq: std::sync::atomic::AtomicU64::new(1),
    }
}

impl Fixture {
    /// Whether `inode` is listed as a file without a size report.
    fn unreported(&self, inode: InodeId) -> bool {
        self.db
            .begin_read()
            .expect("read")
            .open_table(UNREPORTED)
            .expect("table")
            .get(inode.0)
            .expect("get")
            .is_some()
    }

    fn mutation(&self) -> MutationId {
        let seq = self
            .next_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        MutationId {
            client: ClientId(7),
            seq,
            oldest_pending: seq,
        }
    }

    async fn create_as(
        &self,
        mutation: MutationId,
        parent: InodeId,
        name: &str,
        kind: FileKind,
    ) -> Result<InodeAttr, OpError> {
        let context = Arc::clone(&self.context);
        let entry = new_entry(parent, name, kind);
        let response = self
            .committer
            .run(Box::new(move |txn| {
                idempotent(txn, mutation, |txn| create(txn, &context, entry))
            }))
            .await?;
        match response {
            MetaResponse::Created { attr, .. } => Ok(attr),
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn create(
        &self,
        parent: InodeId,
        name: &str,
        kind: FileKind,
    ) -> Result<InodeAttr, OpError> {
        self.create_as(self.mutation(), parent, name, kind).await
    }

    fn lookup(&self, parent: InodeId, name: &str) -> Result<MetaResponse, OpError> {
        lookup(
            &self.db.begin_read().expect("read"),
            NodeId(1),
            parent,
            name,
        )
    }

    /// Up to `max` entries of `dir` after cookie `after`, and whether that is the end.
    fn list(&self, dir: InodeId, after: u64, max: u32) -> (Vec<DirEntry>, bool) {
        match read_dir(&self.db.begin_read().expect("read"), (dir, 1), after, max).expect("readdir")
        {
            MetaResponse::DirEntries { entries, end } => (entries, end),
            other => panic!("{other:?}"),
        }
    }
}

/// A new entry `name` of `kind` in `parent`, root's, mode 0644.
fn new_entry(parent: InodeId, name: &str, kind: FileKind) -> NewEntry {
    NewEntry {
        parent,
        name: name.to_string(),
        new: NewInode {
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            umask: 0o022,
            rdev: 0,
            symlink: None,
        },
    }
}

fn code(result: Result<impl std::fmt::Debug, OpError>) -> ErrorCode {
    match result {
        Err(OpError::Rejected(error)) => error.code,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

// Goal: create, lookup, unlink keep dentries, link counts and the disposal queue consistent.
#[tokio::test]
async fn create_lookup_unlink() {
    let f = fixture();
    let dir = f
        .create(InodeId::ROOT, "dir", FileKind::Directory)
        .await
        .expect("mkdir");
    assert_eq!(dir.nlink, 2);
    let file = f
        .create(dir.inode, "file", FileKind::Regular)
        .await
        .expect("create");
    let layout = file.layout.clone().expect("files get a layout");
    assert_eq!(layout.width(), 4, "four distinct targets");
    assert_eq!(dir.inode.home(), NodeId(1));
    assert!(
        matches!(f.lookup(dir.inode, "file"), Ok(MetaResponse::Attr(attr)) if attr.inode == file.inode)
    );
    assert_eq!(
        code(f.create(dir.inode, "file", FileKind::Regular).await),
        ErrorCode::Exists
    );
    assert_eq!(
        code(f.create(file.inode, "below", FileKind::Regular).await),
        ErrorCode::NotDirectory
    );
    assert_eq!(
        code(
            f.create(dir.inode, &"n".repeat(256), FileKind::Regular)
                .await
        ),
        ErrorCode::NameTooLong
    );

    let parent = dir.inode;
    let queued = || {
        let txn = f.db.begin_read().expect("read");
        let queued = DISPOSALS.open(&txn).expect("table").keys().expect("keys");
        queued.len()
    };
    f.committer
        .run(Box::new(move |txn| unlink(txn, parent, "file", |_| false)))
        .await
        .expect("unlink");
    assert_eq!(code(f.lookup(dir.inode, "file")), ErrorCode::NotFound);
    assert_eq!(
        queued(),
        0,
        "a file never written has no objects to dispose of"
    );

    let written_to = f
        .create(dir.inode, "written", FileKind::Regular)
        .await
        .expect("create");
    let inode = written_to.inode;
    f.committer
        .run_eventual(Box::new(move |txn| {
            report_size(txn, inode, written(10, 0, false))
        }))
        .await
        .expect("report");
    f.committer
        .run(Box::new(move |txn| {
            unlink(txn, parent, "written", |_| false)
        }))
        .await
        .expect("unlink");
    assert_eq!(
        queued(),
        1,
        "the objects of a file written to await disposal"
    );
}

// Goal: a retried mutation gets its original answer instead of EEXIST, and a new one does not.
// The stored answer is kept in protocol version 12: it leaves out whether the inode has no
// extended attributes (version 13), so the client asks rather than trusts a stale "none".
#[tokio::test]
async fn retried_mutation_gets_original_answer() {
    let f = fixture();
    let mutation = f.mutation();
    let first = f
        .create_as(mutation, InodeId::ROOT, "once", FileKind::Regular)
        .await
        .expect("first");
    let retry = f
        .create_as(mutation, InodeId::ROOT, "once", FileKind::Regular)
        .await
        .expect("retry");
    assert!(first.xattr_free, "a new file has no extended attributes");
    assert_eq!(
        InodeAttr {
            xattr_free: false,
            ..first
        },
        retry,
        "the retry gets the stored reply"
    );
    assert_eq!(
        code(f.create(InodeId::ROOT, "once", FileKind::Regular).await),
        ErrorCode::Exists
    );
}

/// Mutation `seq` of `client`, which says every mutation below it was answered.
fn answered_below(client: ClientId, seq: u64) -> MutationId {
    MutationId {
        client,
        seq,
        oldest_pending: seq,
    }
}

// Goal: a copy of a mutation that arrives after its client said every mutation below a higher
// number was answered (its reply dropped then) is refused as superseded, never run a second
// time: a very late duplicate of a create does not make the file again after it was removed,
// while a retry the client may still send gets its stored answer.
#[tokio::test]
async fn a_very_late_duplicate_is_refused_not_run_again() {
    let f = fixture();
    let early = answered_below(ClientId(9), 2);
    f.create_as(early, InodeId::ROOT, "late", FileKind::Regular)
        .await
        .expect("the first run");
    // The client goes on: every mutation below 10 was answered, and it sends number 10.
    let later = answered_below(ClientId(9), 10);
    f.create_as(later, InodeId::ROOT, "later", FileKind::Regular)
        .await
        .expect("a later mutation");
    let first = f
        .create_as(later, InodeId::ROOT, "later", FileKind::Regular)
        .await
        .expect("a retry of a pending one");
    assert!(
        matches!(f.lookup(InodeId::ROOT, "later"), Ok(MetaResponse::Attr(attr)) if attr.inode == first.inode),
        "a mutation not yet settled gets its stored answer"
    );
    // A copy of number 2, delayed in the network, arrives now: refused, whatever it asks.
    assert_eq!(
        code(
            f.create_as(early, InodeId::ROOT, "late", FileKind::Regular)
                .await
        ),
        ErrorCode::Superseded
    );
    let never_seen = answered_below(ClientId(9), 5);
    assert_eq!(
        code(
            f.create_as(never_seen, InodeId::ROOT, "ghost", FileKind::Regular)
                .await
        ),
        ErrorCode::Superseded,
        "a number below the settled ones is refused even if it never ran"
    );
    // The last step of a mutation admitted before (a cross-server operation's intent was
    // recorded, then its coordinator waited for a server that was down while the client went
    // on) still finishes: half of a rename must not stay.
    let admitted = answered_below(ClientId(9), 3);
    let context = Arc::clone(&f.context);
    let finished = f
        .committer
        .run(Box::new(move |txn| {
            crate::service::idempotent_admitted(txn, admitted, |txn| {
                create(
                    txn,
                    &context,
                    new_entry(InodeId::ROOT, "admitted", FileKind::Regular),
                )
            })
        }))
        .await;
    assert!(
        finished.is_ok(),
        "an admitted mutation's last step runs below the floor: {finished:?}"
    );
    // Another session is not affected.
    let other = answered_below(ClientId(11), 1);
    f.create_as(other, InodeId::ROOT, "other", FileKind::Regular)
        .await
        .expect("another session's first mutation");
}

// Goal: concurrent operations share commits, and a rejected one does not disturb the others.
#[tokio::test]
async fn group_commit_isolates_rejections() {
    let f = Arc::new(fixture());
    let mut tasks = Vec::new();
    for index in 0..64 {
        let f = Arc::clone(&f);
        // Two operations per name: exactly one of each pair must fail with Exists.
        let name = format!("n{}", index / 2);
        tasks.push(tokio::spawn(async move {
            f.create(InodeId::ROOT, &name, FileKind::Regular)
                .await
                .is_ok()
        }));
    }
    let mut created = 0;
    for task in tasks {
        created += usize::from(task.await.expect("task"));
    }
    assert_eq!(created, 32);
    let (entries, end) = f.list(InodeId::ROOT, 0, 1000);
    assert!(end);
    assert_eq!(entries.len(), 32);
}

// Goal: listings page by cookie and resume correctly after entries before the cookie vanish.
#[tokio::test]
async fn readdir_cookies_are_stable() {
    let f = fixture();
    for index in 0..10 {
        f.create(InodeId::ROOT, &format!("e{index}"), FileKind::Regular)
            .await
            .expect("create");
    }
    let read = |after: u64| f.list(InodeId::ROOT, after, 4);
    let (all, end) = read(0);
    assert!(!end);
    let mut listed = Vec::new();
    let mut after = 0;
    loop {
        let (page, end) = read(after);
        listed.extend(page.iter().map(|e| e.name.clone()));
        if end {
            break;
        }
        after = page.last().expect("a page that is not the end").cookie;
    }
    let mut sorted = listed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 10, "every entry exactly once: {listed:?}");
    let (page, _) = read(0);
    assert_eq!(page.len(), 4);
    assert_eq!(page[0].name, all[0].name);
    for entry in &page[..3] {
        let name = entry.name.clone();
        f.committer
            .run(Box::new(move |txn| {
                unlink(txn, InodeId::ROOT, &name, |_| false)
            }))
            .await
            .expect("unlink");
    }
    let (rest, _) = read(page[3].cookie);
    assert_eq!(
        rest.first().map(|e| e.name.as_str()),
        Some(listed[4].as_str()),
        "resumes after the last cookie seen"
    );
}

// Goal: names whose hashes collide share a directory: each gets its own listing position
// and is found, also once the first slot of the bucket is free again; fsck files an entry
// found outside its name's bucket where lookups find it.
#[tokio::test]
async fn names_with_colliding_hashes_coexist() {
    let f = fixture();
    let real = f
        .create(InodeId::ROOT, "real", FileKind::Regular)
        .await
        .expect("create");
    // Another name filed first in the bucket of "twin", as a hash collision would file it.
    let txn = f.db.begin_write().expect("txn");
    {
        let mut entries = txn.open_table(crate::schema::ENTRIES).expect("entries");
        let bucket = crate::schema::name_bucket("twin");
        entries
            .insert((InodeId::ROOT.0, bucket), (real.inode.0, 1, "collider"))
            .expect("insert");
        let mut inodes = crate::schema::usage::Inodes::open(&txn).expect("inodes");
        let mut record = crate::schema::load_inode(&inodes, real.inode).expect("real");
        record.nlink = 2;
        crate::schema::store_inode(&mut inodes, real.inode, &record).expect("store");
    }
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    let twin = f
        .create(InodeId::ROOT, "twin", FileKind::Regular)
        .await
        .expect("create twin");
    let lookup_of = |name: &str| match f.lookup(InodeId::ROOT, name) {
        Ok(MetaResponse::Attr(attr)) => Some(attr.inode),
        Err(OpError::Rejected(e)) if e.code == ErrorCode::NotFound => None,
        other => panic!("{other:?}"),
    };
    assert_eq!(lookup_of("twin"), Some(twin.inode));
    let (entries, _) = f.list(InodeId::ROOT, 0, 100);
    let cookie_of = |name: &str| entries.iter().find(|e| e.name == name).map(|e| e.cookie);
    assert_eq!(cookie_of("twin"), cookie_of("collider").map(|c| c + 1));
    // "collider" is not in its own bucket: fsck says so and files it there.
    assert_eq!(lookup_of("collider"), None);
    let report = run_check(&f, false);
    assert_eq!(report.problem_count, 1, "{:#?}", report.problems);
    assert!(report.problems[0].contains("not filed under its name's hash"));
    run_check(&f, true);
    assert_eq!(lookup_of("collider"), Some(real.inode));
    assert_eq!(
        lookup_of("twin"),
        Some(twin.inode),
        "found past a freed slot"
    );
    assert_eq!(run_check(&f, false).problem_count, 0);
}

// Goal: a directory cannot move into its own subtree, and a file cannot replace a directory.
#[tokio::test]
async fn rename_checks() {
    let f = fixture();
    let a = f
        .create(InodeId::ROOT, "a", FileKind::Directory)
        .await
        .expect("a");
    let b = f
        .create(a.inode, "b", FileKind::Directory)
        .await
        .expect("b");
    f.create(InodeId::ROOT, "file", FileKind::Regular)
        .await
        .expect("file");
    let into_subtree = f
        .committer
        .run(Box::new(move |txn| {
            rename(
                txn,
                RenameArgs {
                    home: NodeId(1),
                    ancestry_checked: false,
                    parent: InodeId::ROOT,
                    name: "a",
                    new_parent: b.inode,
                    new_name: "a",
                    flags: RenameFlags::default(),
                },
                |_| false,
            )
        }))
        .await;
    assert_eq!(code(into_subtree), ErrorCode::InvalidArgument);
    let over_dir = f
        .committer
        .run(Box::new(move |txn| {
            rename(
                txn,
                RenameArgs {
                    home: NodeId(1),
                    ancestry_checked: false,
                    parent: InodeId::ROOT,
                    name: "file",
                    new_parent: InodeId::ROOT,
                    new_name: "a",
                    flags: RenameFlags::default(),
                },
                |_| false,
            )
        }))
        .await;
    assert_eq!(code(over_dir), ErrorCode::IsDirectory);
}

// Goal: a file's parent is always a directory holding a name of it, or unknown (0), through
// creates, links, unlinks and renames, so a subtree check never lets a client reach a file
// its subtree holds no name of.
#[tokio::test]
async fn a_file_parent_holds_a_name_of_it() {
    let f = fixture();
    let a = f
        .create(InodeId::ROOT, "a", FileKind::Directory)
        .await
        .expect("a");
    let b = f
        .create(InodeId::ROOT, "b", FileKind::Directory)
        .await
        .expect("b");
    let file = f
        .create(a.inode, "file", FileKind::Regular)
        .await
        .expect("file");
    let parent = |f: &Fixture| match crate::ops::lookup::get_attr(
        &f.db.begin_read().expect("read"),
        file.inode,
    ) {
        Ok(MetaResponse::Attr(attr)) => attr.parent,
        other => panic!("{other:?}"),
    };
    assert_eq!(parent(&f), a.inode, "made in a");
    let inode = file.inode;
    let run = |op: crate::commit::WriteOp| f.committer.run(op);
    run(Box::new(move |txn| {
        crate::ops::create::link(txn, inode, b.inode, "link")
    }))
    .await
    .expect("link into b");
    assert_eq!(parent(&f), a.inode, "a still holds a name");
    run(Box::new(move |txn| unlink(txn, a.inode, "file", |_| false)))
        .await
        .expect("unlink in a");
    assert_eq!(
        parent(&f),
        InodeId(0),
        "the name that went may have been the one"
    );
    run(Box::new(move |txn| {
        crate::ops::create::link(txn, inode, a.inode, "again")
    }))
    .await
    .expect("link into a");
    assert_eq!(
        parent(&f),
        a.inode,
        "a file without a known parent takes the new one"
    );
    run(Box::new(move |txn| {
        rename(
            txn,
            RenameArgs {
                home: NodeId(1),
                ancestry_checked: false,
                parent: b.inode,
                name: "link",
                new_parent: InodeId::ROOT,
                new_name: "moved",
                flags: RenameFlags::default(),
            },
            |_| false,
        )
    }))
    .await
    .expect("rename out of b");
    assert_eq!(
        parent(&f),
        InodeId::ROOT,
        "a rename points it at the new name's directory"
    );
}

/// Truncates `inode` to `size`; returns the new attributes.
async fn truncate(f: &Fixture, inode: InodeId, size: u64) -> MetaResponse {
    f.committer
        .run(Box::new(move |txn| {
            set_attr(
                txn,
                inode,
                AttrChanges {
                    size: Some(size),
                    ..AttrChanges::default()
                },
                &weft_proto::messages::ClusterMap::default(),
            )
        }))
        .await
        .expect("truncate")
}

/// A writer's report of writes up to `size` in `generation`.
fn written(size: u64, generation: u64, durable: bool) -> SizeReport {
    SizeReport {
        size,
        truncate_generation: generation,
        durable,
        modified: true,
        written: SlotSet::default(),
        allocated: 0,
    }
}

// Goal: the largest size report of the current truncate generation wins; older generations
// are ignored, so a write that raced a truncate cannot resurrect the old size.
#[tokio::test]
async fn size_reports_follow_truncate_generations() {
    let f = fixture();
    let file = f
        .create(InodeId::ROOT, "sized", FileKind::Regular)
        .await
        .expect("create");
    let inode = file.inode;
    let report = |size: u64, generation: u64| {
        f.committer.run_eventual(Box::new(move |txn| {
            report_size(txn, inode, written(size, generation, false))
        }))
    };
    report(1000, 0).await.expect("report");
    report(500, 0).await.expect("smaller report");
    let truncated = truncate(&f, inode, 10).await;
    let MetaResponse::Attr(attr) = truncated else {
        panic!("attr")
    };
    assert_eq!((attr.size, attr.truncate_generation), (10, 1));
    let MetaResponse::Attr(attr) = report(2000, 0).await.expect("stale report") else {
        panic!("attr")
    };
    assert_eq!(attr.size, 10, "a report of the old generation is dropped");
    let MetaResponse::Attr(attr) = report(30, 1).await.expect("report") else {
        panic!("attr")
    };
    assert_eq!(attr.size, 30);
}

// Goal: a change answered before its sync is synced within a bounded time even while other
// such changes keep coming; a sync used to wait for a second with no commit at all, so under a
// steady stream of size reports nothing became durable (or reached a mirror member) and the
// unsynced pages grew without bound. Method: report sizes back to back for 2.5 s; a sync must
// have been made meanwhile (a pause of a second between reports would also sync, so the test
// can only pass wrongly, never fail wrongly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_answered_before_their_sync_are_synced_under_steady_load() {
    let f = fixture();
    let file = f
        .create(InodeId::ROOT, "reported", FileKind::Regular)
        .await
        .expect("create");
    let inode = file.inode;
    let started = std::time::Instant::now();
    let mut size = 0;
    while started.elapsed() < std::time::Duration::from_millis(2500) {
        size += 1;
        f.committer
            .run_eventual(Box::new(move |txn| {
                report_size(txn, inode, written(size, 0, false))
                    .map(|(response, _)| (response, Answered::Committed))
            }))
            .await
            .expect("report");
    }
    assert!(
        f.metrics.deferred_syncs() >= 1,
        "{size} reports answered before their sync over 2.5 s, and none synced"
    );
}

// Goal: bookkeeping nobody waits for makes no commit of its own: it rides in the next batch,
// and, when no operation comes, is committed alone once it waited long enough. Method: a row
// written as bookkeeping, then a create: one commit holds both; then a row written as
// bookkeeping alone, which must be in the store within seconds.
#[tokio::test]
async fn bookkeeping_rides_in_the_next_commit() {
    let f = fixture();
    let listed = |inode: u64| f.unreported(InodeId(inode));
    let commits = f.metrics.commits();
    f.committer.tidy(Box::new(|txn| {
        txn.open_table(UNREPORTED)?.insert(1_000_001, ())?;
        Ok(())
    }));
    f.create(InodeId::ROOT, "rider", FileKind::Regular)
        .await
        .expect("create");
    assert!(
        listed(1_000_001),
        "the bookkeeping rode in the create's commit"
    );
    assert_eq!(f.metrics.commits(), commits + 1, "one commit for both");

    f.committer.tidy(Box::new(|txn| {
        txn.open_table(UNREPORTED)?.insert(1_000_002, ())?;
        Ok(())
    }));
    let started = std::time::Instant::now();
    while !listed(1_000_002) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "bookkeeping alone was never committed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

// Goal: only the first size report of a file listed as unreported is answered before its
// commit is synced, and only when the writer did not ask for durability (fsync); the report
// takes the file off the list in the same commit, so a crash loses both together; a rejected
// report writes nothing. Method: list files by hand, report, and read what each report said
// about its answer and what the list holds after it.
#[tokio::test]
async fn only_the_first_report_of_a_listed_file_skips_the_sync() {
    let f = fixture();
    let listed = |inode: InodeId| f.unreported(inode);
    let report = |inode: InodeId, size: u64, durable: bool| {
        let txn = f.db.begin_write().expect("txn");
        let result =
            report_size(&txn, inode, written(size, 0, durable)).map(|(_, answered)| answered);
        txn.commit(crate::store::Commit::Logged { sync: true })
            .expect("commit");
        result
    };
    let list = |inode: InodeId| {
        let txn = f.db.begin_write().expect("txn");
        txn.open_table(UNREPORTED)
            .expect("table")
            .insert(inode.0, ())
            .expect("list");
        txn.commit(crate::store::Commit::Logged { sync: true })
            .expect("commit");
    };
    let mut files = Vec::new();
    for name in ["closed", "synced"] {
        let file = f
            .create(InodeId::ROOT, name, FileKind::Regular)
            .await
            .expect("create");
        list(file.inode);
        files.push(file.inode);
    }
    let (closed, synced) = (files[0], files[1]);

    assert_eq!(
        report(closed, 10, false).expect("report"),
        Answered::Committed
    );
    assert!(!listed(closed), "the report took the file off the list");
    assert_eq!(
        report(closed, 20, false).expect("report"),
        Answered::Durable,
        "a file no longer listed reports durably"
    );
    assert_eq!(
        report(synced, 10, true).expect("fsync report"),
        Answered::Durable
    );
    assert!(!listed(synced));

    let dir = f
        .create(InodeId::ROOT, "dir", FileKind::Directory)
        .await
        .expect("mkdir");
    list(dir.inode);
    assert_eq!(
        code(report(dir.inode, 10, false).map(|_| MetaResponse::Done)),
        ErrorCode::InvalidArgument
    );
    assert!(listed(dir.inode), "a rejected report writes nothing");
}

// Goal: a file records the slots its data was written to, from size reports of its current
// truncate generation only, and a truncate keeps only the slots its new size leaves bytes on:
// fsck takes a missing object of a recorded slot for lost data, so a slot recorded wrongly
// would be a false alarm and one missed a loss unseen. Method: reports, a stale report, a
// truncate, read the record.
#[tokio::test]
async fn written_slots_follow_reports_and_truncates() {
    let f = fixture();
    let file = f
        .create(InodeId::ROOT, "striped", FileKind::Regular)
        .await
        .expect("create");
    let inode = file.inode;
    let layout = file.layout.clone().expect("a file has a layout");
    assert!(layout.width() >= 2, "the fixture stripes over targets");
    let chunk = u64::from(layout.pattern.chunk_size_bytes);
    let report = |size: u64, generation: u64, written: SlotSet| {
        f.committer.run_eventual(Box::new(move |txn| {
            let mut report = self::written(size, generation, false);
            report.written = written;
            report_size(txn, inode, report)
        }))
    };
    let recorded = || {
        let txn = f.db.begin_read().expect("read");
        let table = crate::schema::WRITTEN.open(&txn).expect("table");
        crate::schema::load_written(&table, inode).expect("load")
    };
    let both = SlotSet::of_range(&layout, 0, 2 * chunk);
    assert_eq!(both.iter().collect::<Vec<_>>(), vec![0, 1]);
    report(2 * chunk, 0, both).await.expect("report");
    assert_eq!(recorded(), both);
    truncate(&f, inode, 10).await;
    assert_eq!(
        recorded().iter().collect::<Vec<_>>(),
        vec![0],
        "a cut to 10 bytes leaves bytes on the first slot only"
    );
    report(2 * chunk, 0, both).await.expect("stale report");
    assert_eq!(
        recorded().iter().collect::<Vec<_>>(),
        vec![0],
        "a report of the old generation records nothing"
    );
    report(2 * chunk, 1, SlotSet::of_range(&layout, chunk, 1))
        .await
        .expect("report");
    assert_eq!(recorded(), both);
}

// Goal: a home forgets the markers that keep another home's cross-server steps from running
// twice once that home says the operations finished (the table used to grow with every
// cross-server mkdir, link and rename ever made), and a late copy of such a step is refused
// instead of running again (a second directory inode, a second link-count change). Method:
// apply a remote mkdir step twice (one inode), settle, count the markers, send the step again.
#[tokio::test]
async fn settled_intents_leave_no_markers_and_refuse_late_steps() {
    use crate::ops::intent::settle_intents;
    use crate::schema::REMOTE_CREATED;
    use crate::service::create_dir_inode;
    let f = fixture();
    let coordinator = NodeId(2);
    let step = |intent: u64| {
        let request = weft_proto::messages::MetaRequest::CreateDirInode {
            coordinator,
            intent,
            parent: InodeId::new(coordinator, 1),
            mode: 0o755,
            uid: 0,
            gid: 0,
            pattern: weft_proto::layout::StripePattern::DEFAULT,
            acls: Vec::new(),
            shard_of: None,
            project: 0,
        };
        f.committer.run(Box::new(move |txn| {
            create_dir_inode(txn, NodeId(1), &request)
        }))
    };
    let inode = |response: MetaResponse| match response {
        MetaResponse::Attr(attr) => attr.inode,
        other => panic!("{other:?}"),
    };
    let markers = || {
        f.db.begin_read()
            .expect("read")
            .open_table(REMOTE_CREATED)
            .expect("table")
            .len()
            .expect("len")
    };
    let first = inode(step(5).await.expect("step"));
    assert_eq!(inode(step(5).await.expect("retry")), first, "a retry");
    inode(step(6).await.expect("the next operation's step"));
    assert_eq!(markers(), 2);

    let settle = |below: u64| {
        f.committer
            .run(Box::new(move |txn| settle_intents(txn, coordinator, below)))
    };
    settle(6).await.expect("settle");
    assert_eq!(
        markers(),
        1,
        "only the unfinished operation keeps its marker"
    );
    assert_eq!(code(step(5).await), ErrorCode::Superseded, "a late copy");
    settle(4).await.expect("an older word changes nothing");
    assert_eq!(code(step(5).await), ErrorCode::Superseded, "still late");
    step(6)
        .await
        .expect("the unfinished operation's step still runs");
}

mod formats;
mod fsck;

use fsck::run_check;

// Goal: an unlink or rmdir found local in the transaction that looked for an intent is made in
// it, and a store failure in the middle of the operation still abandons the batch: nothing the
// operation wrote before the failure commits (a half-made unlink would leave a name gone and
// its objects never queued for removal), while a refusal commits as a refusal. Method: the
// committer runs a local operation that writes a row and then fails, then one that writes a
// row and is refused; only the refused one's row is in the store afterwards.
#[tokio::test]
async fn a_store_failure_inside_a_local_operation_commits_none_of_it() {
    use crate::ops::intent::{prepared_or_local, Decided};
    use crate::schema::StoreError;
    let f = fixture();
    let failed = f
        .committer
        .run_with(|txn| {
            prepared_or_local(
                txn,
                |_| Ok(None),
                |txn| {
                    txn.open_table(UNREPORTED)?.insert(901, ())?;
                    Err(OpError::Store(StoreError::Inconsistent("broken".into())))
                },
            )
        })
        .await;
    assert!(
        matches!(failed, Err(OpError::Store(_))),
        "the failure is the caller's"
    );
    let refused = f
        .committer
        .run_with(|txn| {
            prepared_or_local(
                txn,
                |_| Ok(None),
                |txn| {
                    txn.open_table(UNREPORTED)?.insert(902, ())?;
                    Err(OpError::rejected(ErrorCode::NotFound, "refused"))
                },
            )
        })
        .await
        .expect("a refusal commits");
    assert!(matches!(refused, Decided::Local(Err(OpError::Rejected(_)))));
    let read = f.db.begin_read().expect("read");
    let table = read.open_table(UNREPORTED).expect("table");
    assert!(
        table.get(901).expect("get").is_none(),
        "what the failed operation wrote was committed"
    );
    assert!(table.get(902).expect("get").is_some());
}

/// The committer of a home that answers before the sync and has no mirror group, on a store of
/// its own: its clients' changes are committed by requests' own threads.
fn answering_before_sync() -> (tempfile::TempDir, Arc<Database>, Arc<Committer>) {
    let directory = tempfile::tempdir().expect("tempdir");
    let db = Arc::new(
        Database::create(directory.path().join("meta.redb"))
            .expect("db")
            .0,
    );
    let metrics = crate::commit::CommitMetrics::register(
        &mut prometheus_client::registry::Registry::default(),
    );
    let committer = Arc::new(Committer::start(
        (Arc::clone(&db), 0),
        None,
        metrics,
        (crate::config::CHECKPOINT_BYTES_DEFAULT, true, None),
    ));
    (directory, db, committer)
}

/// Clients' changes are committed by whichever request's thread finds the writer free, with
/// every change left meanwhile by threads that found it taken (flat combining): under many
/// concurrent changes each is applied once and answered, and none stays behind in the list of
/// changes left for a holder of the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_client_changes_are_each_committed_once_whoever_commits_them() {
    const ROWS: crate::store::TableDefinition<u64, u64> =
        crate::store::TableDefinition::new("combined_rows");
    const TASKS: u64 = 64;
    const CHANGES: u64 = 40;
    let (_directory, db, committer) = answering_before_sync();
    // Made first: a batch that opens a table new to the store is a checkpoint.
    committer
        .run_with(|txn| txn.open_table(ROWS).map(drop).map_err(OpError::from))
        .await
        .expect("the table");
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let committer = Arc::clone(&committer);
            tokio::spawn(async move {
                for change in 0..CHANGES {
                    let key = task * 1000 + change;
                    let replaced = committer
                        .run_client_change_with(move |txn| {
                            let mut rows = txn.open_table(ROWS)?;
                            let replaced = rows.insert(key, key * 2)?.map(|value| value.value());
                            // Answered once synced, so no deadline of the writer thread's
                            // comes to take a change left behind.
                            Ok((replaced, Answered::Durable))
                        })
                        .await
                        .expect("committed");
                    assert_eq!(replaced, None, "change {key} applied once");
                }
            })
        })
        .collect();
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        futures::future::try_join_all(tasks),
    )
    .await
    .expect("every change answered: none was left behind for a holder of the writer");
    answered.expect("no task failed");
    let read = db.begin_read().expect("read");
    let rows = read.open_table(ROWS).expect("rows");
    assert_eq!(rows.len().expect("len"), TASKS * CHANGES);
    for task in 0..TASKS {
        for change in 0..CHANGES {
            let key = task * 1000 + change;
            let value = rows.get(key).expect("get").map(|value| value.value());
            assert_eq!(value, Some(key * 2), "the row of change {key}");
        }
    }
}

/// A commit that panics leaves the writer poisoned: the client changes that come after are
/// answered with an error at once, none left waiting for a holder of the writer that will
/// never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_changes_after_a_commit_panicked_are_refused_not_kept_waiting() {
    let (_directory, _db, committer) = answering_before_sync();
    let panicking = Arc::clone(&committer);
    let panicked = tokio::spawn(async move {
        panicking
            .run_client_change_with(|_| -> Result<((), Answered), OpError> {
                panic!("an operation that panics while it commits")
            })
            .await
    })
    .await;
    assert!(panicked.is_err_and(|error| error.is_panic()));
    for _ in 0..3 {
        let refused = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            committer.run_client_change_with(|_| Ok(((), Answered::Committed))),
        )
        .await
        .expect("answered, not kept waiting");
        assert!(
            refused.is_err(),
            "nothing commits after a panic: {refused:?}"
        );
    }
}
