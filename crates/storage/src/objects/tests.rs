//! The object contract, run over every store: plain, O_DIRECT, and the crash-test journal
//! over each.

use super::*;
use crate::target::Target;
use std::sync::{Arc, Mutex};
use weft_proto::ids::TargetId;

/// The length of the object's file on disk (0 when there is none).
fn disk_length(target: &Target, object: ObjectId) -> u64 {
    fs::metadata(target.object_path(object)).map_or(0, |metadata| metadata.len())
}

/// A target written in the older `<aa>/<bb>/<inode>` layout opens with every object
/// readable where the flat layout looks, its capacity use unchanged and no `<bb>` left.
#[test]
fn opening_flattens_the_two_level_layout() {
    let directory = tempfile::tempdir().expect("tempdir");
    let objects = directory.path().join("objects");
    let inodes: Vec<InodeId> = (1..40)
        .map(|n| InodeId::new(weft_proto::NodeId(1), n))
        .collect();
    for inode in &inodes {
        let hash = weft_proto::checksum::crc32c(&inode.0.to_le_bytes()).to_le_bytes();
        let old = objects
            .join(format!("{:02x}", hash[0]))
            .join(format!("{:02x}", hash[1]));
        fs::create_dir_all(&old).expect("mkdir");
        fs::write(old.join(format!("{:016x}", inode.0)), inode.0.to_le_bytes()).expect("write");
    }
    let target = Target::open(TargetId(1), directory.path(), None, StoreKind::default())
        .expect("open flattens");
    for inode in &inodes {
        assert_eq!(
            &target.read(ObjectId::plain(*inode), 0, 8).expect("read")[..],
            &inode.0.to_le_bytes()[..],
            "object {inode} moved"
        );
    }
    assert_eq!(target.used_bytes(), 8 * inodes.len() as u64);
    let (listed, _) = target
        .list_objects(Space::Plain, None, 0, 1000)
        .expect("list");
    assert_eq!(listed.len(), inodes.len());
    for dir in fs::read_dir(&objects).expect("objects") {
        for entry in fs::read_dir(dir.expect("entry").path()).expect("dir") {
            assert!(entry.expect("entry").file_type().expect("type").is_file());
        }
    }
}

/// Concurrent writes that extend one object on a target with a capacity count each new byte
/// once: eight threads writing the eight MiB of an object at once use 8 MiB of it, and the
/// rest of a 12 MiB capacity stays writable. (Each write used to count its growth from the
/// length it read before the others landed, up to 36 MiB here, and the target refused
/// writes with most of it free.)
#[test]
fn concurrent_writes_to_one_object_count_their_growth_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let target = Arc::new(
        Target::open(
            TargetId(1),
            directory.path(),
            Some(12 << 20),
            StoreKind::default(),
        )
        .expect("open"),
    );
    let object = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 9));
    let start = Arc::new(std::sync::Barrier::new(8));
    let writers: Vec<_> = (0..8u64)
        .map(|index| {
            let (target, start) = (Arc::clone(&target), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                target.write(
                    object,
                    index << 20,
                    Bytes::from(vec![index as u8; 1 << 20]),
                    0,
                )
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer").expect("each write fits");
    }
    assert_eq!(target.used_bytes(), 8 << 20);
    target
        .write(object, 8 << 20, Bytes::from(vec![1u8; 4 << 20]), 0)
        .expect("the last 4 MiB fit");
}

/// The object contract every store keeps, checked through a target of kind `kind`.
fn conformance(kind: StoreKind) {
    let directory = tempfile::tempdir().expect("tempdir");
    if kind.direct_io && crate::direct::probe(directory.path()).is_err() {
        return; // tmpfs refuses O_DIRECT
    }
    let target = Target::open(TargetId(1), directory.path(), Some(1 << 20), kind).expect("open");
    let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 5));
    assert_eq!(target.length(inode).expect("length"), 0);
    assert!(
        target.read(inode, 0, 100).expect("read").is_empty(),
        "a missing object reads as empty"
    );
    target
        .write(inode, 10, Bytes::from_static(b"hello"), 0)
        .expect("write");
    assert_eq!(target.length(inode).expect("length"), 15);
    assert_eq!(
        &target.read(inode, 0, 100).expect("read")[..],
        b"\0\0\0\0\0\0\0\0\0\0hello",
        "holes read as zeros"
    );
    target.truncate(inode, 12, 1).expect("truncate");
    assert_eq!(&target.read(inode, 8, 100).expect("read")[..], b"\0\0he");
    target.sync(inode).expect("sync");
    assert_eq!(
        disk_length(&target, inode),
        12,
        "sync puts the data on disk"
    );
    // The new object's directory entry was synced with it, once.
    target.sync(inode).expect("sync again");
    assert_eq!(target.entry_syncs(), 1);
    let error = target
        .write(inode, 0, Bytes::from(vec![0u8; 2 << 20]), 0)
        .expect_err("over capacity");
    assert_eq!(WireError::from(error).code, ErrorCode::NoSpace);
    target.remove(inode).expect("remove");
    assert_eq!(target.length(inode).expect("length"), 0);
    // A removed object is gone for good: a new write starts a new one (an open file kept
    // for the old one must not receive it).
    target
        .write(inode, 3, Bytes::from_static(b"new"), 0)
        .expect("write after remove");
    assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");
    target.sync(inode).expect("sync");
    assert_eq!(disk_length(&target, inode), 6);
    assert_eq!(
        target.entry_syncs(),
        2,
        "an object made again after its removal has a new entry, synced"
    );

    // A mirrored file's object is another object than a plain file's of the same inode:
    // neither reads, changes, lists or removes the other.
    let mirrored = ObjectId::new(Space::Mirrored, inode.inode);
    assert!(!target.exists(mirrored));
    target
        .write(mirrored, 0, Bytes::from_static(b"mirrored"), 0)
        .expect("write mirrored");
    target.truncate(mirrored, 7, 1).expect("truncate mirrored");
    target.sync(mirrored).expect("sync mirrored");
    assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");
    assert_eq!(
        &target.read(mirrored, 0, 100).expect("read")[..],
        b"mirrore"
    );
    for (space, length) in [(Space::Plain, 6), (Space::Mirrored, 7)] {
        let (listed, end) = target.list_objects(space, None, 0, 10).expect("list");
        assert!(end);
        assert_eq!(listed, vec![(inode.inode, length)], "{space:?}");
    }
    target.remove(mirrored).expect("remove mirrored");
    assert!(!target.exists(mirrored));
    assert_eq!(&target.read(inode, 0, 100).expect("read")[..], b"\0\0\0new");

    // Truncate generations: a truncate cuts once; re-sent or late, it cuts nothing
    // written after it; an object that missed one refuses reads and writes of the new
    // generation until it has it; a new object records the generation of its first write.
    let file = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 7));
    target
        .write(file, 0, Bytes::from_static(b"0123456789"), 0)
        .expect("write");
    target.truncate(file, 4, 1).expect("truncate 1");
    assert_eq!(target.length(file).expect("length"), 4);
    target
        .write(file, 4, Bytes::from_static(b"ab"), 1)
        .expect("write after the truncate");
    target.truncate(file, 2, 1).expect("truncate 1 again");
    assert_eq!(
        &target.read(file, 0, 100).expect("read")[..],
        b"0123ab",
        "a re-sent truncate cuts nothing written after it"
    );
    let pending = target
        .write(file, 0, Bytes::from_static(b"x"), 2)
        .expect_err("truncate 2 not had");
    assert_eq!(WireError::from(pending).code, ErrorCode::TruncatePending);
    let pending = target
        .admit(file, 2)
        .expect_err("no read of generation 2 either");
    assert_eq!(WireError::from(pending).code, ErrorCode::TruncatePending);
    target.admit(file, 1).expect("generation 1 reads");
    target.truncate(file, 1, 2).expect("truncate 2");
    target
        .write(file, 3, Bytes::from_static(b"z"), 2)
        .expect("write of generation 2");
    assert_eq!(&target.read(file, 0, 100).expect("read")[..], b"0\0\0z");
    let late = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 8));
    target
        .truncate(late, 0, 3)
        .expect("truncate of a missing object");
    assert!(!target.exists(late), "a truncate creates nothing");
    target
        .write(late, 0, Bytes::from_static(b"new"), 3)
        .expect("first write of generation 3");
    target
        .truncate(late, 0, 3)
        .expect("the truncate again, late");
    assert_eq!(&target.read(late, 0, 100).expect("read")[..], b"new");
    target.sync(file).expect("sync");
    target.sync(late).expect("sync");
    assert_eq!(target.generation(file).expect("generation"), 2);
    target.remove(late).expect("remove");
    target.remove(file).expect("remove");
    assert_eq!(target.generation(file).expect("generation"), 0);
}

// Goal: the plain object store keeps the object contract (holes, truncate, capacity).
#[test]
fn plain_store_conformance() {
    conformance(StoreKind::default());
}

// Goal: on a plain target, large aligned writes that skip the page cache and small writes
// that go through it see each other's bytes in any order, from any buffer address.
#[test]
fn direct_writes_mix_with_cached_io() {
    let directory = tempfile::tempdir().expect("tempdir");
    if crate::direct::probe(directory.path()).is_err() {
        return; // tmpfs refuses O_DIRECT
    }
    let target = Target::open(
        TargetId(1),
        directory.path(),
        None,
        StoreKind {
            direct_write_min_bytes: 8192,
            ..StoreKind::default()
        },
    )
    .expect("open");
    let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 9));
    let mut model = vec![0u8; 64 << 10];
    let write = |offset: usize, data: Bytes, model: &mut Vec<u8>| {
        target
            .write(inode, offset as u64, data.clone(), 0)
            .expect("write");
        model[offset..offset + data.len()].copy_from_slice(&data);
    };
    // Cached, then direct over the cached pages, then cached inside the direct range.
    write(100, Bytes::from(vec![1u8; 300]), &mut model);
    write(0, Bytes::from(vec![2u8; 16 << 10]), &mut model);
    write(5000, Bytes::from(vec![3u8; 10]), &mut model);
    // Direct again, from a buffer one byte past an aligned address.
    let unaligned = Bytes::from(vec![4u8; (32 << 10) + 1]).slice(1..);
    write(32 << 10, unaligned, &mut model);
    // Direct over the cached bytes.
    write(4096, Bytes::from(vec![5u8; 8192]), &mut model);
    // Two small writes leave a large range whole in the page cache, read from there.
    write(40 << 10, Bytes::from(vec![6u8; 4096]), &mut model);
    write(44 << 10, Bytes::from(vec![7u8; 4096]), &mut model);
    assert_eq!(
        &target.read(inode, 40 << 10, 8192).expect("cached read")[..],
        &model[40 << 10..48 << 10]
    );
    assert_eq!(target.length(inode).expect("length"), 64 << 10);
    assert_eq!(
        &target.read(inode, 0, 64 << 10).expect("read")[..],
        &model[..]
    );
    target.sync(inode).expect("sync");
    let on_disk = fs::read(target.object_path(inode)).expect("read the object file");
    assert_eq!(on_disk, model, "the file holds every write");
}

// Goal: the O_DIRECT object store keeps the same contract, unaligned writes included.
#[test]
fn direct_io_store_conformance() {
    conformance(StoreKind {
        direct_io: true,
        ..StoreKind::default()
    });
}

// Goal: on a direct-I/O target, a truncate or a punch that comes while an unaligned write
// has read its edge blocks waits for the write, so the old bytes it writes back are cut
// or punched after it, never restored over the cut.
#[test]
fn a_cut_never_slips_inside_a_read_modify_write() {
    let directory = tempfile::tempdir().expect("tempdir");
    if crate::direct::probe(directory.path()).is_err() {
        return; // tmpfs refuses O_DIRECT
    }
    let target = Arc::new(
        Target::open(
            TargetId(1),
            directory.path(),
            None,
            StoreKind {
                direct_io: true,
                ..StoreKind::default()
            },
        )
        .expect("open"),
    );
    type Cut = fn(&Target, ObjectId) -> Result<(), ObjectError>;
    let cuts: [(&str, Cut); 2] = [
        ("truncate", |target, object| target.truncate(object, 0, 1)),
        ("punch", |target, object| {
            target.fallocate(object, (0, 8192), FallocateMode::Zero, 0)
        }),
    ];
    for (inode, (name, cut)) in (20..).zip(cuts) {
        let object = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), inode));
        target
            .write(object, 0, Bytes::from(vec![b'a'; 8192]), 0)
            .expect("write");
        let (done, cut_done) = std::sync::mpsc::channel();
        let cutter = Arc::clone(&target);
        let handle = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&handle);
        crate::direct::tests::on_edge_read(move || {
            let thread = std::thread::spawn(move || {
                cut(&cutter, object).expect("cut");
                let _ = done.send(());
            });
            *slot.lock().expect("slot") = Some(thread);
            // Give a cut that does not wait for the write the time to run.
            let _ = cut_done.recv_timeout(std::time::Duration::from_secs(1));
        });
        target
            .write(object, 100, Bytes::from_static(b"0123456789"), 0)
            .expect("unaligned write");
        let thread = handle.lock().expect("slot").take().expect("the hook ran");
        thread.join().expect("cut thread");
        let back = target.read(object, 0, 8192).expect("read");
        assert!(
            back.iter().all(|&byte| byte != b'a'),
            "{name}: old bytes came back after the cut"
        );
    }
}

// Goal: the crash-test journal over the plain store keeps the same contract.
#[test]
fn journal_store_conformance() {
    conformance(StoreKind {
        crash_test: true,
        ..StoreKind::default()
    });
}

// Goal: the crash-test journal over the O_DIRECT store keeps it too: the wrapper holds
// whatever store it wraps to the contract.
#[test]
fn journal_over_direct_io_conformance() {
    conformance(StoreKind {
        crash_test: true,
        direct_io: true,
        ..StoreKind::default()
    });
}

// Goal: in crash-test mode, unsynced data is not on disk, so a kill loses it.
#[test]
fn unsynced_data_stays_off_disk() {
    let directory = tempfile::tempdir().expect("tempdir");
    let target = Target::open(
        TargetId(1),
        directory.path(),
        None,
        StoreKind {
            crash_test: true,
            ..StoreKind::default()
        },
    )
    .expect("open");
    let inode = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 6));
    target
        .write(inode, 0, Bytes::from_static(b"volatile"), 0)
        .expect("write");
    assert_eq!(disk_length(&target, inode), 0);
    target.sync(inode).expect("sync");
    assert_eq!(
        std::fs::read(target.object_path(inode)).expect("object"),
        b"volatile"
    );
}

// Goal: a sync replaying the crash-test journal while truncates, writes and other syncs of the
// same object go on neither trips a generation check nor loses or resurrects a change: what
// the target showed before its last sync is what the disk holds after it. Method: one thread
// writes and truncates with growing generations, two others sync, over the journal on the
// plain store; then the object is read back and compared with the file.
#[test]
fn journal_replays_never_race_the_changes_they_apply() {
    let directory = tempfile::tempdir().expect("tempdir");
    let target = Arc::new(
        Target::open(
            TargetId(1),
            directory.path(),
            None,
            StoreKind {
                crash_test: true,
                ..StoreKind::default()
            },
        )
        .expect("open"),
    );
    let object = ObjectId::plain(InodeId::new(weft_proto::NodeId(1), 30));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncers: Vec<_> = (0..2)
        .map(|_| {
            let (target, done) = (Arc::clone(&target), Arc::clone(&done));
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    target.sync(object).expect("sync");
                }
            })
        })
        .collect();
    for generation in 1..200u64 {
        let byte = (generation % 251) as u8;
        target
            .write(
                object,
                generation * 7 % 4096,
                Bytes::from(vec![byte; 300]),
                generation - 1,
            )
            .expect("write");
        target
            .truncate(object, generation * 13 % 5000, generation)
            .expect("truncate");
        target
            .write(
                object,
                generation * 3 % 2048,
                Bytes::from(vec![byte; 100]),
                generation,
            )
            .expect("write after the truncate");
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    for syncer in syncers {
        syncer.join().expect("a sync never panics");
    }
    let length = target.length(object).expect("length");
    let shown = target.read(object, 0, length as u32).expect("read");
    target.sync(object).expect("last sync");
    let on_disk = fs::read(target.object_path(object)).expect("the object file");
    assert_eq!(
        on_disk,
        shown.to_vec(),
        "the disk holds what the target showed"
    );
    assert_eq!(target.generation(object).expect("generation"), 199);
}
