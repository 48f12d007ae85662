//! Stores written by older builds: their records and tables read on, converted when the
//! store opens.

use super::*;

// Goal: inode records written before spread directories existed (format version 1) still
// decode, as plain entries.
// Method: encode a version-1 record by hand (the old field list) and decode it.
#[test]
fn version_one_inode_records_decode() {
    #[derive(serde::Serialize)]
    struct V1 {
        kind: FileKind,
        mode: u32,
        nlink: u32,
        uid: u32,
        gid: u32,
        size: u64,
        rdev: u32,
        atime: weft_proto::messages::Timestamp,
        mtime: weft_proto::messages::Timestamp,
        ctime: weft_proto::messages::Timestamp,
        truncate_generation: u64,
        layout: Option<weft_proto::layout::FileLayout>,
        pattern: Option<weft_proto::layout::StripePattern>,
        symlink: Option<String>,
        parent: u64,
        next_cookie: u64,
    }
    let old = V1 {
        kind: FileKind::Directory,
        mode: 0o755,
        nlink: 3,
        uid: 7,
        gid: 8,
        size: 0,
        rdev: 0,
        atime: Default::default(),
        mtime: Default::default(),
        ctime: Default::default(),
        truncate_generation: 0,
        layout: None,
        pattern: Some(weft_proto::layout::StripePattern::DEFAULT),
        symlink: None,
        parent: 1,
        next_cookie: 9,
    };
    let mut bytes = vec![1u8];
    bytes.extend(postcard::to_stdvec(&old).expect("encode"));
    let record = crate::schema::InodeRecord::decode(42, &bytes).expect("version 1 decodes");
    assert_eq!(
        (record.mode, record.nlink, record.uid, record.next_cookie),
        (0o755, 3, 7, 9)
    );
    assert!(record.shards.is_empty() && record.shard_of == 0 && record.sealed.is_none());
    let again = crate::schema::InodeRecord::decode(42, &record.encode()).expect("round trip");
    assert_eq!(again, record);
}

// Goal: a store written before entries were keyed by name hash opens with every entry found,
// listed and checked clean, and its old tables gone.
#[tokio::test]
async fn entries_of_the_old_format_migrate() {
    const DENTRIES_V1: redb::TableDefinition<(u64, &str), (u64, u64, u8)> =
        redb::TableDefinition::new("dentries");
    const COOKIES_V1: redb::TableDefinition<(u64, u64), &str> =
        redb::TableDefinition::new("cookies");
    let f = fixture();
    let dir = f
        .create(InodeId::ROOT, "dir", FileKind::Directory)
        .await
        .expect("mkdir");
    let file = f
        .create(dir.inode, "file", FileKind::Regular)
        .await
        .expect("create");
    // Rewrite both entries the way the old format stored them.
    let txn = f.db.begin_write().expect("txn");
    {
        let mut entries = txn.open_table(crate::schema::ENTRIES).expect("entries");
        let mut dentries = txn.open_table(DENTRIES_V1).expect("dentries");
        let mut cookies = txn.open_table(COOKIES_V1).expect("cookies");
        for (parent, name, child, kind) in [
            (InodeId::ROOT, "dir", dir.inode, 2),
            (dir.inode, "file", file.inode, 1),
        ] {
            let dentry = crate::schema::load_dentry(&entries, parent, name)
                .expect("read")
                .expect("dentry");
            crate::schema::remove_dentry(&mut entries, parent, dentry).expect("remove");
            dentries
                .insert((parent.0, name), (child.0, 3, kind))
                .expect("old dentry");
            cookies.insert((parent.0, 3), name).expect("old cookie");
        }
    }
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");

    create_tables(&f.db).expect("migrate");
    assert!(
        !f.db
            .begin_read()
            .expect("read")
            .list_tables()
            .expect("tables")
            .any(|t| redb::TableHandle::name(&t) == "dentries"
                || redb::TableHandle::name(&t) == "cookies"),
        "old tables dropped"
    );
    match f.lookup(dir.inode, "file").expect("lookup") {
        MetaResponse::Attr(attr) => assert_eq!(attr.inode, file.inode),
        other => panic!("{other:?}"),
    }
    let (entries, end) = f.list(InodeId::ROOT, 0, 100);
    assert!(end);
    assert_eq!(entries.len(), 1);
    assert_eq!(
        (entries[0].name.as_str(), entries[0].inode),
        ("dir", dir.inode)
    );
    assert_eq!(run_check(&f, false).problem_count, 0);
}

// Goal: a store made before usage was kept gets it counted from its inodes when it opens.
// Method: files created, the usage table dropped (as a store of the earlier format has
// none), the tables opened again as a server start does.
#[tokio::test]
async fn a_store_without_usage_counts_it_when_it_opens() {
    let f = fixture();
    f.create(InodeId::ROOT, "a", FileKind::Regular)
        .await
        .expect("create");
    let read = |f: &Fixture| {
        let txn = f.db.begin_read().expect("read");
        crate::schema::usage::usage(&txn.open_table(crate::schema::usage::USAGE).expect("usage"))
            .expect("rows")
    };
    let before = read(&f);
    assert_eq!(
        before.iter().map(|row| row.inodes).sum::<u64>(),
        4,
        "{before:?}"
    );
    let txn = f.db.begin_write().expect("txn");
    txn.delete_table(crate::schema::usage::USAGE).expect("drop");
    txn.commit(crate::store::Commit::Logged { sync: true })
        .expect("commit");
    create_tables(&f.db).expect("open again");
    assert_eq!(read(&f), before);
}
