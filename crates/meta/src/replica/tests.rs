use super::*;
use std::time::Duration;
use weft_proto::ids::{GroupId, GroupVersion, MemberId};
use weft_proto::messages::Consistency;

/// Reading the file under the changes not yet in it gives what the file holds once they
/// are: redb reads its unsynced pages back this way.
#[test]
fn unflushed_changes_read_as_if_written() {
    let directory = tempfile::tempdir().expect("tempdir");
    let base = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(directory.path().join("store"))
        .expect("store file");
    base.write_all_at(&[7; 40_000], 0).expect("base bytes");
    let mut flushing = Changes::default();
    flushing.write(4096, &[1; 8192]);
    flushing.changes.push(FileChange::SetLen(10_000));
    let mut next = Changes::default();
    next.changes.push(FileChange::SetLen(50_000));
    next.write(9_000, &[2; 100]);
    next.write(45_000, &[3; 5000]);
    next.write(12_000, &[4; 10]);

    const RANGES: [(u64, usize); 4] = [(0, 60_000), (4000, 200), (9_050, 3000), (44_000, 2000)];
    let views: Vec<Vec<u8>> = RANGES
        .iter()
        .map(|&(offset, len)| {
            let mut buffer = vec![0; len];
            read_available(&base, offset, &mut buffer).expect("read");
            flushing.overlay(offset, &mut buffer);
            next.overlay(offset, &mut buffer);
            buffer
        })
        .collect();

    for changes in [&flushing, &next] {
        apply_changes(&base, &changes.changes, &changes.payload).expect("apply");
    }
    assert_eq!(base.metadata().expect("metadata").len(), 50_000);
    for (view, &(offset, len)) in views.iter().zip(&RANGES) {
        let mut written = vec![0; len];
        read_available(&base, offset, &mut written).expect("read");
        assert_eq!(view, &written, "bytes from {offset}");
    }
}

/// A late copy of a send its primary gave up on (and sent again, followed by newer
/// changes) must not write its old bytes over the newer ones.
#[test]
fn a_late_send_does_not_overwrite_a_newer_one() {
    let directory = tempfile::tempdir().expect("tempdir");
    let replicas = Replicas::new(directory.path().to_path_buf(), NodeId(2), Arc::default());
    let home = NodeId(1);
    let write = |order: SendOrder, byte: u8| {
        replicas.apply(
            home,
            order,
            &[FileChange::Write { offset: 0, len: 4 }],
            &[byte; 4],
            false,
        )
    };
    let copy = || std::fs::read(home_path(directory.path(), NodeId(2), home)).expect("copy");

    write((GroupVersion(3), 100, 5), 1).expect("a send");
    write((GroupVersion(3), 100, 6), 2).expect("the next send");
    let late = write((GroupVersion(3), 100, 4), 9).expect_err("an earlier send arriving late");
    assert_eq!(late.code, ErrorCode::Superseded);
    assert_eq!(copy(), [2; 4], "the late send left the newer bytes alone");
    // A primary that opened the home again sends under a later link, from 0.
    write((GroupVersion(3), 200, 0), 3).expect("a send of a later link");
    assert!(
        write((GroupVersion(3), 100, 7), 9).is_err(),
        "a send of the earlier link"
    );
    // A new group version starts over.
    write((GroupVersion(4), 50, 0), 4).expect("a send in a later version");
    assert_eq!(copy(), [4; 4]);
}

/// A sync whose changes reached the file here but not the mirror members (the lease ran
/// out while a member was tried again) is shipped by the home's next link: its extents
/// reach the record of a member that is absent by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_a_failed_sync_did_not_ship_are_shipped_by_the_next_link() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data_dir = directory.path().to_path_buf();
    let (node, home, member) = (NodeId(1), NodeId(1), 2u32);
    let group = home_group;
    // A lease that already ran out: the member's changes cannot be delivered.
    let membership = primary_of_home_1(Duration::ZERO);
    let parts = link_parts(&membership);

    let (_, file) = HomeLink::open(&data_dir, node, home, parts.clone()).expect("open");
    redb::StorageBackend::write(&file, 0, &[7; 4096]).expect("write");
    assert!(sync(&file).is_err(), "the sync cannot reach the member");
    drop(file);

    // Management drops the member; this server records what it misses from now on.
    membership.adopt(
        std::time::Instant::now(),
        Duration::from_secs(60),
        vec![group(2, Consistency::Bad)],
        |_| true,
        |_| {},
    );
    parts
        .missed
        .start(&data_dir, GroupId(1), MemberId(member))
        .expect("record started");
    let (_, file) = HomeLink::open(&data_dir, node, home, parts.clone()).expect("open again");
    redb::StorageBackend::write(&file, 1 << 20, &[8; 100]).expect("write");
    sync(&file).expect("a sync with the member absent");
    assert_eq!(
        parts.missed.recorded(GroupId(1), MemberId(member)),
        Some(vec![0, (1 << 20) / MISSED_EXTENT]),
        "the absent member's record holds the extent the failed sync wrote"
    );
}

/// Home 1's group in `version`: node 1 its good primary, node 2 in `state`.
fn home_group(version: u64, state: Consistency) -> MirrorGroupInfo {
    MirrorGroupInfo {
        id: GroupId(1),
        kind: MirrorKind::Meta,
        version: GroupVersion(version),
        primary: MemberId(1),
        members: [(1, Consistency::Good), (2, state)]
            .into_iter()
            .map(|(id, state)| weft_proto::messages::MirrorMember {
                id: MemberId(id),
                node: NodeId(id),
                state,
                full_resync: false,
            })
            .collect(),
        loss_epoch: 0,
    }
}

/// Node 1's membership as primary of home 1, node 2 good, with a lease of `lease`.
fn primary_of_home_1(lease: Duration) -> Arc<Membership> {
    let membership = Arc::new(Membership::new(
        1,
        Duration::from_millis(100),
        weft_net::mirror::Unsynced::InProcess,
    ));
    membership.adopt(
        std::time::Instant::now(),
        lease,
        vec![home_group(1, Consistency::Good)],
        |_| true,
        |_| {},
    );
    membership
}

/// What a link needs, with no other server reachable.
fn link_parts(membership: &Arc<Membership>) -> LinkParts {
    LinkParts {
        membership: Arc::clone(membership),
        cluster: Arc::new(ClusterView::new(
            "127.0.0.1:9",
            weft_net::RpcClientOptions::default(),
        )),
        missed: Arc::new(MissedLogs::default()),
        files: Arc::default(),
        sync_seconds: prometheus_client::metrics::histogram::Histogram::new([1.0]),
    }
}

/// Asks for a sync of what `file` was given and waits for it.
fn sync(file: &HomeFile) -> Result<(), StoreError> {
    use redb::StorageBackend;
    file.sync_data(false).expect("sync asked");
    file.link.wait_synced(file.link.last_sync())
}

/// A sync that ships while its server takes the map in which a member left must land in
/// the record of what that member misses, or the member comes back for the recorded
/// extents only, is made good without the sync's pages and may be promoted: the record
/// is started before any other thread sees the new map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_shipped_as_its_member_leaves_is_recorded_for_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data_dir = directory.path().to_path_buf();
    let (node, home, member) = (NodeId(1), NodeId(1), 2u32);
    let now = std::time::Instant::now;
    let membership = primary_of_home_1(Duration::from_secs(60));
    let parts = link_parts(&membership);
    let (_, file) = HomeLink::open(&data_dir, node, home, parts.clone()).expect("open");
    redb::StorageBackend::write(&file, 0, &[7; 4096]).expect("write");

    // Management drops the member. While this server takes that map, a sync ships.
    let (taking, taken) = std::sync::mpsc::channel();
    let taker = {
        let (membership, missed) = (Arc::clone(&membership), Arc::clone(&parts.missed));
        let data_dir = data_dir.clone();
        std::thread::spawn(move || {
            membership.adopt(
                now(),
                Duration::from_secs(60),
                vec![home_group(2, Consistency::Bad)],
                |_| true,
                |adopted| {
                    taking.send(()).expect("the test waits");
                    std::thread::sleep(Duration::from_millis(300));
                    missed.follow(adopted, |_| Some(data_dir.clone()));
                },
            );
        })
    };
    taken.recv().expect("the map is being taken");
    sync(&file).expect("a sync with the member gone");
    taker.join().expect("the map taken");
    assert_eq!(
        parts.missed.recorded(GroupId(1), MemberId(member)),
        Some(vec![0]),
        "the record of what the member misses holds the extent the sync wrote"
    );
}

/// Links opened later send under greater ids, whatever the clock does.
#[test]
fn link_ids_grow() {
    let ids: Vec<u64> = (0..1000).map(|_| link_id()).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
}

/// A sync's changes cut into pieces within the limits change the file as the whole does.
#[test]
fn pieces_fit_the_limits_and_add_up_to_the_whole() {
    let mut changes = Changes::default();
    changes.write(0, &[1; 5000]);
    changes.changes.push(FileChange::SetLen(3000));
    changes.write(10_000, &[2; 1]);
    changes.write(2000, &[3; 2500]);
    changes.changes.push(FileChange::SetLen(20_000));
    for seed in 0..40u8 {
        changes.write(u64::from(seed) * 397, &[seed; 333]);
    }
    let payload = Bytes::from(changes.payload.clone());
    let directory = tempfile::tempdir().expect("tempdir");
    let open = |name: &str| {
        std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(directory.path().join(name))
            .expect("file")
    };
    let whole = open("whole");
    apply_changes(&whole, &changes.changes, &changes.payload).expect("apply");
    let expected = std::fs::read(directory.path().join("whole")).expect("read");
    for (bytes_max, changes_max) in [(1000, 3), (1, 1000), (4096, 1), (1 << 20, 1 << 10)] {
        let limits = ShipLimits {
            bytes_max,
            changes_max,
        };
        let pieced = open("pieced");
        let pieces = pieces(&changes.changes, &payload, limits);
        for (piece, bytes) in &pieces {
            assert!(
                bytes.len() <= bytes_max && piece.len() <= changes_max,
                "{limits:?}"
            );
            apply_changes(&pieced, piece, bytes).expect("apply");
        }
        assert_eq!(
            std::fs::read(directory.path().join("pieced")).expect("read"),
            expected,
            "pieces of {limits:?}"
        );
    }
}
