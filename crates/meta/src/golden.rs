//! Golden bytes of every record a metadata server stores: an inode, a truncate still to do, an
//! intent of each kind of cross-server operation, a layout waiting for disposal, the slots a
//! file was written to, a move in flight, the targets holding a file's tombstones, a stored
//! reply. They are in `golden_records.txt`; a difference is a
//! change of the on-disk format, which needs a format version and a conversion
//! (docs/design/on-disk-format.md). After a deliberate change,
//! `WEFT_BLESS=1 cargo test -p weft-meta golden` records the new bytes.

use crate::ops::intent::{
    ExchangeIntent, Intent, IntentOp, LinkIntent, MkdirIntent, RenameIntent, RmdirIntent,
    SpreadMkdirIntent, SpreadRmdirIntent, UnlinkIntent,
};
use crate::schema::SlotId;
use crate::schema::{InodeRecord, TruncateWork};
use std::fmt::Write as _;
use weft_proto::layout::{FileLayout, PatternKind, Slot, SlotSet, StripePattern};
use weft_proto::messages::{
    FileKind, InodeAttr, MetaRequest, MetaResponse, MutationId, Reply, Timestamp,
};
use weft_proto::{ClientId, InodeId, NodeId, StoragePoolId, TargetId};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/golden_records.txt");

fn inode(n: u64) -> InodeId {
    InodeId::new(NodeId(1), n)
}

fn pattern() -> StripePattern {
    StripePattern {
        kind: PatternKind::Raid0,
        chunk_size_bytes: 1 << 19,
        num_targets: 2,
        pool: StoragePoolId(1),
    }
}

fn layout() -> FileLayout {
    FileLayout::new(
        pattern(),
        vec![Slot::Target(TargetId(3)), Slot::Target(TargetId(4))],
    )
}

fn file() -> InodeRecord {
    InodeRecord {
        kind: FileKind::Regular,
        mode: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        size: 4096,
        rdev: 0,
        atime: Timestamp {
            seconds: 1,
            nanos: 2,
        },
        mtime: Timestamp {
            seconds: 3,
            nanos: 4,
        },
        ctime: Timestamp {
            seconds: 5,
            nanos: 6,
        },
        truncate_generation: 2,
        layout: Some(layout()),
        pattern: None,
        symlink: None,
        parent: 0,
        next_cookie: 0,
        shards: Vec::new(),
        shard_of: 0,
        sealed: None,
        project: 0,
        allocated: 1 << 20,
        xattr_free: true,
        objectless: true,
    }
}

fn directory() -> InodeRecord {
    InodeRecord {
        kind: FileKind::Directory,
        nlink: 2,
        layout: None,
        pattern: Some(pattern()),
        parent: inode(1).0,
        next_cookie: 300,
        shards: vec![inode(7).0],
        shard_of: inode(6).0,
        sealed: Some((2, 9)),
        symlink: Some("unused".into()),
        project: 42,
        allocated: 0,
        xattr_free: false,
        objectless: false,
        ..file()
    }
}

/// The request a mkdir intent keeps: the directory's inode on its home.
fn mkdir() -> MetaRequest {
    mkdir_in(42)
}

/// [`mkdir`]'s request for a directory of `project`.
fn mkdir_in(project: u32) -> MetaRequest {
    MetaRequest::CreateDirInode {
        coordinator: NodeId(1),
        intent: 3,
        parent: inode(1),
        mode: 0o2755,
        uid: 1000,
        gid: 100,
        pattern: pattern(),
        acls: vec![("system.posix_acl_default".into(), vec![2, 0, 0, 0])],
        shard_of: None,
        project,
    }
}

fn mutation() -> MutationId {
    MutationId {
        client: ClientId(7),
        seq: 9,
        oldest_pending: 8,
    }
}

fn intents() -> Vec<IntentOp> {
    let mkdir = |name: &str| MkdirIntent {
        parent: inode(1),
        name: name.into(),
        home: NodeId(2),
        request: mkdir(),
    };
    let rmdir = |name: &str| RmdirIntent {
        parent: inode(1),
        name: name.into(),
        child: inode(9),
    };
    vec![
        IntentOp::Mkdir(mkdir("d")),
        IntentOp::Rmdir(rmdir("d")),
        IntentOp::MkdirSpread(SpreadMkdirIntent {
            mkdir: mkdir("s"),
            shard_homes: vec![NodeId(1), NodeId(2)],
        }),
        IntentOp::RmdirSpread(SpreadRmdirIntent {
            rmdir: rmdir("s"),
            shards: vec![inode(10)],
        }),
        IntentOp::Link(LinkIntent {
            inode: inode(9),
            kind_code: 1,
            new_parent: inode(1),
            new_name: "l".into(),
        }),
        IntentOp::Unlink(UnlinkIntent { inode: inode(9) }),
        IntentOp::RenameOut(RenameIntent {
            parent: inode(1),
            name: "a".into(),
            child: inode(9),
            kind_code: 1,
            new_parent: inode(2),
            new_name: "b".into(),
            no_replace: true,
        }),
        IntentOp::Exchange(ExchangeIntent {
            parent: inode(1),
            name: "a".into(),
            child: inode(9),
            kind_code: 1,
            new_parent: inode(2),
            new_name: "b".into(),
            other: inode(10),
            other_kind_code: 2,
        }),
    ]
}

/// A move in flight, of a restripe.
fn moving() -> crate::schema::MoveWork {
    crate::schema::MoveWork {
        id: 0x1234_5678,
        slots: vec![(1, SlotId(3), SlotId(6))],
        pool: StoragePoolId(2),
        sealing: true,
        layout: Some(layout()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn records() -> String {
    let mut out = String::new();
    let mut line = |name: &str, bytes: Vec<u8>| {
        writeln!(out, "{name} {}", hex(&bytes)).expect("write to a string");
    };
    let encode = |value: &dyn erased::Encode| value.encode();
    line("inode/file", file().encode());
    line("inode/directory", directory().encode());
    line(
        "truncate",
        encode(&TruncateWork {
            generation: 3,
            size: 100,
            layout: layout(),
        }),
    );
    for (index, op) in intents().into_iter().enumerate() {
        line(
            &format!("intent/{index}"),
            encode(&Intent {
                mutation: mutation(),
                op,
            }),
        );
    }
    line("disposal/layout", encode(&layout()));
    let mut slots = SlotSet::default();
    slots.insert(0);
    slots.insert(130);
    line("written/slots", encode(&slots));
    line("move", encode(&moving()));
    line("tombstones", encode(&vec![SlotId(3), SlotId(4)]));
    let reply: Reply<MetaResponse> = Ok(MetaResponse::Attr(InodeAttr {
        inode: inode(5),
        ..file().to_attr(inode(5))
    }));
    line("reply/attr", crate::schema::reply_bytes(&reply));
    out
}

/// Encodes a record as the store does: postcard, in this version.
mod erased {
    pub(super) trait Encode {
        fn encode(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            postcard::to_stdvec(self).expect("records encode")
        }
    }
}

// Goal: every stored record keeps its bytes, and an intent of every kind is among them; each
// decodes back to itself.
#[test]
fn stored_records_keep_their_bytes() {
    let tags: Vec<u32> = intents().iter().map(IntentOp::wire_tag).collect();
    for (tag, name) in IntentOp::WIRE_TAGS {
        assert!(tags.contains(tag), "no sample of IntentOp::{name}");
    }
    assert_eq!(
        InodeRecord::decode(5, &directory().encode()).expect("decodes"),
        directory()
    );
    let now = records();
    if std::env::var_os("WEFT_BLESS").is_some() {
        std::fs::write(GOLDEN, &now).expect("write the golden file");
        return;
    }
    let recorded = std::fs::read_to_string(GOLDEN).expect("the golden file");
    for (now, recorded) in now.lines().zip(recorded.lines()) {
        assert_eq!(now, recorded, "a stored record's encoding changed");
    }
    assert_eq!(
        now.lines().count(),
        recorded.lines().count(),
        "records added or removed"
    );
}

// Goal: an inode record of format version 3 (before allocations past the size were kept)
// reads as with none.
#[test]
fn inode_records_of_version_3_decode() {
    const DIRECTORY_V3: &str = "0301a40302e80764802000020206040a060200010080802002010106756e7573656481808080808040ac020187808080808040868080808080400102092a";
    let bytes: Vec<u8> = (0..DIRECTORY_V3.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&DIRECTORY_V3[at..at + 2], 16).expect("hex"))
        .collect();
    assert_eq!(
        InodeRecord::decode(5, &bytes).expect("decodes"),
        directory()
    );
}

// Goal: an inode record of format version 2 (before projects) reads as in no project.
#[test]
fn inode_records_of_version_2_decode() {
    const DIRECTORY_V2: &str = "0201a40302e80764802000020206040a060200010080802002010106756e7573656481808080808040ac02018780808080804086808080808040010209";
    let bytes: Vec<u8> = (0..DIRECTORY_V2.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&DIRECTORY_V2[at..at + 2], 16).expect("hex"))
        .collect();
    assert_eq!(
        InodeRecord::decode(5, &bytes).expect("decodes"),
        InodeRecord {
            project: 0,
            ..directory()
        }
    );
}

/// An inode record of an older format, written as hexadecimal, decoded as inode 5's.
fn decode_hex(hex: &str) -> InodeRecord {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex"))
        .collect();
    InodeRecord::decode(5, &bytes).expect("decodes")
}

// Goal: inode records of format version 4 (before inodes without extended attributes were
// marked) read as inodes that may have some, so no client answers for them without asking.
#[test]
fn inode_records_of_version_4_decode() {
    const FILE_V4: &str =
        "0400a40301e80764802000020206040a0602010080802002010203040000000000000000808040";
    const DIRECTORY_V4: &str = "0401a40302e80764802000020206040a060200010080802002010106756e7573656481808080808040ac020187808080808040868080808080400102092a00";
    assert_eq!(
        decode_hex(FILE_V4),
        InodeRecord {
            xattr_free: false,
            objectless: false,
            ..file()
        }
    );
    assert_eq!(decode_hex(DIRECTORY_V4), directory());
}

// Goal: inode records of format version 5 (before files without objects were marked) read
// as files that may have objects, so their removal disposes of them.
#[test]
fn inode_records_of_version_5_decode() {
    const FILE_V5: &str =
        "0500a40301e80764802000020206040a060201008080200201020304000000000000000080804001";
    const DIRECTORY_V5: &str = "0501a40302e80764802000020206040a060200010080802002010106756e7573656481808080808040ac020187808080808040868080808080400102092a0000";
    assert_eq!(
        decode_hex(FILE_V5),
        InodeRecord {
            objectless: false,
            ..file()
        }
    );
    assert_eq!(decode_hex(DIRECTORY_V5), directory());
}

/// A create's reply: the new directory and its parent, in `project`.
fn created(project: u32) -> MetaResponse {
    let attr = |record: InodeRecord, at| {
        InodeRecord {
            project,
            xattr_free: false,
            ..record
        }
        .to_attr(inode(at))
    };
    MetaResponse::Created {
        attr: attr(directory(), 5),
        parent: Some(attr(directory(), 1)),
        capability: None,
        lease_ms: 0,
        parent_lease_ms: 0,
    }
}

// Goal: the intents, replies and moves of a store written by protocol version 4 are
// converted when it opens: a directory-inode request and attributes read on, in no project,
// and a move in flight goes on as a move (no restripe).
#[test]
fn intents_and_replies_of_version_4_are_converted() {
    use crate::store::{ReadableTable, TableDefinition};
    use redb::TableHandle;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (db, _) = crate::store::Store::create(dir.path().join("meta.redb")).expect("a store");
    let intent = |project| Intent {
        mutation: mutation(),
        op: IntentOp::Mkdir(MkdirIntent {
            parent: inode(1),
            name: "d".into(),
            home: NodeId(2),
            request: mkdir_in(project),
        }),
    };
    {
        let txn = db.begin_write().expect("a transaction");
        let old: TableDefinition<u64, &[u8]> = TableDefinition::new("intents");
        let bytes = weft_proto::wire::in_version(4, || postcard::to_stdvec(&intent(42)))
            .expect("encodes in version 4");
        txn.open_table(old)
            .expect("the old table")
            .insert(7, bytes.as_slice())
            .expect("stored");
        let old: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("replies");
        let reply: Reply<MetaResponse> = Ok(created(42));
        let bytes = weft_proto::wire::in_version(4, || postcard::to_stdvec(&reply))
            .expect("encodes in version 4");
        txn.open_table(old)
            .expect("the old table")
            .insert((7, 9), bytes.as_slice())
            .expect("stored");
        let old: TableDefinition<u64, &[u8]> = TableDefinition::new("moves");
        let bytes = weft_proto::wire::in_version(4, || postcard::to_stdvec(&moving()))
            .expect("encodes in version 4");
        txn.open_table(old)
            .expect("the old table")
            .insert(5, bytes.as_slice())
            .expect("stored");
        txn.commit(crate::store::Commit::Logged { sync: true })
            .expect("committed");
    }
    crate::schema::create_tables(&db).expect("the store opens");
    let txn = db.begin_read().expect("a read");
    let table = crate::schema::INTENTS.open(&txn).expect("the intents");
    let converted: Intent = table.get(7).expect("decodes").expect("the intent is kept");
    assert_eq!(
        format!("{:?}", converted.op),
        format!("{:?}", intent(0).op),
        "the intent reads on, its directory in no project"
    );
    let replies = txn.open_table(crate::schema::REPLIES).expect("the replies");
    let stored = replies
        .get((7, 9))
        .expect("read")
        .expect("the reply is kept");
    assert_eq!(
        crate::schema::stored_reply(stored.value()).expect("decodes"),
        created(0),
        "the reply reads on whole (its attributes in no project): a retry is answered with it"
    );
    let moves = crate::schema::MOVES.open(&txn).expect("the moves");
    let converted = moves.get(5).expect("decodes").expect("the move is kept");
    assert_eq!(
        converted,
        crate::schema::MoveWork {
            layout: None,
            ..moving()
        }
    );
    assert!(
        !txn.list_tables()
            .expect("tables")
            .any(|table| ["intents", "replies", "moves"].contains(&table.name())),
        "the old tables are gone"
    );
}
