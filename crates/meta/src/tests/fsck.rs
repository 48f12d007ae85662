//! The consistency check of one home's store: what it finds, and what its repair leaves.

use super::*;

// Goal: one fsck repair of a name filed twice leaves one entry that lookups find and a link
// count that matches it, whichever of the two comes first in the table. Method: file a second
// entry of a file's name in the same bucket, and another misfiled before its bucket; repair
// once; check again.
#[tokio::test]
async fn fsck_repairs_a_name_filed_twice_in_one_run() {
    let f = fixture();
    let file = f
        .create(InodeId::ROOT, "file", FileKind::Regular)
        .await
        .expect("create");
    let bucket = crate::schema::name_bucket("file");
    assert!(bucket > 1 << 8, "the misfiled entry sorts first");
    let txn = f.db.begin_write().expect("txn");
    {
        let mut entries = txn.open_table(crate::schema::ENTRIES).expect("entries");
        for cookie in [bucket + 1, 1 << 8] {
            entries
                .insert((InodeId::ROOT.0, cookie), (file.inode.0, 1, "file"))
                .expect("insert");
        }
        let mut inodes = crate::schema::usage::Inodes::open(&txn).expect("inodes");
        let mut record = crate::schema::load_inode(&inodes, file.inode).expect("file");
        record.nlink = 3;
        crate::schema::store_inode(&mut inodes, file.inode, &record).expect("store");
    }
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    let found = run_check(&f, false);
    assert!(found.problem_count >= 2, "{:#?}", found.problems);
    run_check(&f, true);
    let report = run_check(&f, false);
    assert_eq!(report.problem_count, 0, "{:#?}", report.problems);
    match f.lookup(InodeId::ROOT, "file") {
        Ok(MetaResponse::Attr(attr)) => {
            assert_eq!(attr.inode, file.inode);
            assert_eq!(attr.nlink, 1, "one name, one link");
        }
        other => panic!("the name is still there: {other:?}"),
    }
    let (entries, _) = f.list(InodeId::ROOT, 0, 100);
    assert_eq!(entries.len(), 1, "{entries:?}");
}

pub(super) fn run_check(f: &Fixture, repair: bool) -> CheckReport {
    let txn = f.db.begin_write().expect("txn");
    let listed = crate::ops::check::Listed {
        objects: Vec::new(),
        targets: std::collections::HashSet::new(),
        good_members: std::collections::HashMap::new(),
    };
    let checked = crate::ops::check::check(
        &txn,
        repair.then_some(&txn),
        NodeId(1),
        &listed,
        &std::collections::HashSet::new(),
        &std::collections::HashMap::new(),
    )
    .expect("check");
    assert!(checked.garbage.is_empty());
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    checked.report
}

// Goal: fsck finds the damage a crash or a bug could leave — a dentry naming a missing inode,
// an inode no dentry names, a wrong link count — repairs it, and then finds nothing. Method:
// damage the store directly, check, repair, check again.
#[tokio::test]
async fn fsck_finds_and_repairs_damage() {
    let f = fixture();
    let dir = f
        .create(InodeId::ROOT, "dir", FileKind::Directory)
        .await
        .expect("mkdir");
    let kept = f
        .create(dir.inode, "kept", FileKind::Regular)
        .await
        .expect("file");
    let lost = f
        .create(dir.inode, "lost", FileKind::Regular)
        .await
        .expect("file");
    let hidden = f
        .create(InodeId::ROOT, "hidden", FileKind::Regular)
        .await
        .expect("file");
    // Written to: its objects go with it.
    let inode = hidden.inode;
    f.committer
        .run_eventual(Box::new(move |txn| {
            crate::ops::setattr::report_size(txn, inode, super::written(10, 0, false))
        }))
        .await
        .expect("report");
    assert_eq!(
        run_check(&f, false).problem_count,
        0,
        "a fresh namespace is clean"
    );

    let txn = f.db.begin_write().expect("txn");
    {
        let mut inodes = crate::schema::usage::Inodes::open(&txn).expect("inodes");
        inodes
            .remove(lost.inode)
            .expect("drop an inode under its dentry");
        let mut record = crate::schema::load_inode(&inodes, kept.inode).expect("kept");
        record.nlink = 5;
        crate::schema::store_inode(&mut inodes, kept.inode, &record).expect("wrong link count");
        let mut entries = txn.open_table(crate::schema::ENTRIES).expect("dentries");
        let dentry = crate::schema::load_dentry(&entries, InodeId::ROOT, "hidden")
            .expect("read")
            .expect("dentry");
        crate::schema::remove_dentry(&mut entries, InodeId::ROOT, dentry).expect("orphan an inode");
        txn.open_table(UNREPORTED)
            .expect("unreported")
            .insert(lost.inode.0 + 1000, ())
            .expect("list a missing inode");
    }
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");

    let report = run_check(&f, false);
    assert_eq!(report.problem_count, 4, "{:#?}", report.problems);
    let text = report.problems.join("\n");
    assert!(text.contains("names a missing inode"), "{text}");
    assert!(text.contains("link count 5"), "{text}");
    assert!(text.contains(&format!("inode {}", hidden.inode)), "{text}");
    assert!(text.contains("without a size report"), "{text}");

    let repaired = run_check(&f, true);
    assert_eq!(repaired.repairs.len(), 4, "{:#?}", repaired.repairs);
    assert_eq!(
        run_check(&f, false).problem_count,
        0,
        "clean after the repair"
    );
    assert_eq!(code(f.lookup(dir.inode, "lost")), ErrorCode::NotFound);
    let txn = f.db.begin_read().expect("read");
    let queued = DISPOSALS.open(&txn).expect("table").keys().expect("keys");
    assert_eq!(
        queued.len(),
        1,
        "the unreachable file's objects await disposal"
    );
}

// Goal: fsck recounts what users and groups use: a usage table that disagrees with the
// inodes (a crash or a bug) is reported row by row, `--repair` writes the count, and the next
// check is clean. Method: files created through the operations, the usage table then changed
// behind their back, the check run without and with repair.
#[tokio::test]
async fn fsck_recounts_usage() {
    let f = fixture();
    f.create(InodeId::ROOT, "a", FileKind::Regular)
        .await
        .expect("create");
    f.create(InodeId::ROOT, "d", FileKind::Directory)
        .await
        .expect("mkdir");
    assert!(run_check(&f, false).problems.is_empty(), "counted as made");
    let txn = f.db.begin_write().expect("txn");
    {
        let mut usage = txn.open_table(crate::schema::usage::USAGE).expect("usage");
        usage.insert((0, 0, 1), (12345, 1)).expect("insert");
        usage.insert((1, 77, 1), (5, 5)).expect("insert");
    }
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    let found = run_check(&f, false);
    assert_eq!(found.problems.len(), 2, "{:?}", found.problems);
    assert!(
        found.problems[0].contains("user 0 in pool 1 is recorded as using 12345 bytes and 1 inodes; its inodes use 0 bytes and 3 inodes"),
        "{:?}",
        found.problems
    );
    assert!(
        found.problems[1].contains("group 77 in pool 1"),
        "{:?}",
        found.problems
    );
    let repaired = run_check(&f, true);
    assert_eq!(repaired.repairs.len(), 1, "{:?}", repaired.repairs);
    assert!(run_check(&f, false).problems.is_empty());
}

// Goal: an inode whose record says it has no extended attributes while some are kept for it
// (which would have mounts answer "none" for them) is found and corrected; and the flag
// follows the attributes set and removed. Method: a file made (no attributes), one set and
// removed through the operations, then an attribute row written behind the record's back;
// check, repair, check again.
#[tokio::test]
async fn fsck_corrects_a_record_that_hides_extended_attributes() {
    let f = fixture();
    let file = f
        .create(InodeId::ROOT, "file", FileKind::Regular)
        .await
        .expect("create");
    assert!(file.xattr_free, "made without attributes");
    let flag = || {
        let txn = f.db.begin_read().expect("read");
        let inodes = txn.open_table(crate::schema::INODES).expect("inodes");
        crate::schema::load_inode(&inodes, file.inode)
            .expect("file")
            .xattr_free
    };
    let inode = file.inode;
    f.committer
        .run(Box::new(move |txn| {
            crate::ops::xattr::set_xattr(
                txn,
                inode,
                "user.a",
                b"1",
                weft_proto::messages::XattrSetMode::Any,
            )
        }))
        .await
        .expect("set");
    assert!(!flag(), "an attribute set clears it");
    f.committer
        .run(Box::new(move |txn| {
            crate::ops::xattr::remove_xattr(txn, inode, "user.a")
        }))
        .await
        .expect("remove");
    assert!(flag(), "the last attribute removed sets it again");

    let txn = f.db.begin_write().expect("txn");
    txn.open_table(crate::schema::XATTRS)
        .expect("xattrs")
        .insert((file.inode.0, "user.hidden"), b"x".as_slice())
        .expect("insert");
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    let found = run_check(&f, false);
    assert_eq!(found.problem_count, 1, "{:#?}", found.problems);
    run_check(&f, true);
    assert!(!flag(), "repaired");
    let report = run_check(&f, false);
    assert_eq!(report.problem_count, 0, "{:#?}", report.problems);
}
