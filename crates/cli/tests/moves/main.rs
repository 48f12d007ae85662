//! Data that moves while in use: `weft entry migrate` re-places files onto other targets
//! while readers and writers go on, and a crash of the metadata server in the middle of a
//! move loses nothing and finishes it.

#[path = "../common/mod.rs"]
mod common;

use common::{cluster, fsck_clean, make_dir_with_pattern, pattern, weft};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use weft_testkit::{ClusterSpec, LocalCluster};

/// Bytes of one record of the writer.
const RECORD: usize = 4096;

/// Runs `weft entry migrate PATH --pool POOL`; returns (success, stdout, stderr).
fn migrate(cluster: &LocalCluster, path: &Path, pool: &str) -> (bool, String, String) {
    let path = path.display().to_string();
    weft(
        cluster,
        &[
            "entry",
            "migrate",
            &path,
            "--pool",
            pool,
            "--mgmt",
            cluster.mgmt(),
        ],
    )
}

/// Starts `weft entry migrate PATH --pool POOL MORE…` in a thread; its output when it ends.
fn migrate_in_background(
    cluster: &LocalCluster,
    path: &Path,
    pool: &str,
    more: &[&str],
) -> std::thread::JoinHandle<std::io::Result<std::process::Output>> {
    let args: Vec<String> = [
        "entry",
        "migrate",
        &path.display().to_string(),
        "--pool",
        pool,
    ]
    .iter()
    .chain(["--mgmt", cluster.mgmt()].iter())
    .chain(more)
    .map(|arg| arg.to_string())
    .collect();
    let (binary, key) = (common::binary().to_path_buf(), cluster.key_file());
    std::thread::spawn(move || {
        std::process::Command::new(binary)
            .args(&args)
            .env("WEFT_KEY_FILE", key)
            .output()
    })
}

/// The standard cluster, mounted, with a directory `name` whose files stripe over `width`
/// targets in 64 KiB chunks.
fn with_a_dir(name: &str, width: &str) -> (LocalCluster, PathBuf) {
    let mut cluster = cluster(ClusterSpec::default());
    let dir = cluster.mount().expect("mount").join(name);
    make_dir_with_pattern(
        &cluster,
        &dir,
        &["--num-targets", width, "--chunk-size", "64K"],
    );
    (cluster, dir)
}

/// The standard cluster, mounted, with pool `fast` (targets 2 and 4) and a directory
/// `project` whose files stripe over two targets of the default pool (1 and 3).
fn with_a_fast_pool() -> (LocalCluster, PathBuf) {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let (ok, _, err) = ask(&cluster, &["pool", "create", "fast", "--targets", "2,4"]);
    assert!(ok, "pool create: {err}");
    let dir = mnt.join("project");
    make_dir_with_pattern(
        &cluster,
        &dir,
        &["--num-targets", "2", "--chunk-size", "64K"],
    );
    (cluster, dir)
}

/// Runs `weft ARGS --mgmt …`; returns (success, stdout, stderr).
fn ask(cluster: &LocalCluster, args: &[&str]) -> (bool, String, String) {
    let mut all = args.to_vec();
    all.extend(["--mgmt", cluster.mgmt()]);
    weft(cluster, &all)
}

/// Record `index` of the writer: its number over and over.
fn record(index: u64) -> Vec<u8> {
    index
        .to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(RECORD)
        .collect()
}

/// A writer that keeps `file` open and appends numbered records to it, reading an earlier
/// one back every few, until `stop`; it tells `started` after its first records, and
/// answers how many it wrote, all fsynced.
fn writer(file: PathBuf, stop: Arc<AtomicBool>, started: mpsc::Sender<()>) -> u64 {
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&file)
        .expect("open the log");
    let mut index = 0u64;
    while !stop.load(Ordering::Acquire) || index < 64 {
        handle
            .write_all_at(&record(index), index * RECORD as u64)
            .unwrap_or_else(|e| panic!("write record {index} of {}: {e}", file.display()));
        if index % 8 == 7 {
            let back = index / 2;
            let mut read = vec![0u8; RECORD];
            handle
                .read_exact_at(&mut read, back * RECORD as u64)
                .unwrap_or_else(|e| panic!("read record {back}: {e}"));
            assert!(read == record(back), "record {back} read back wrong");
        }
        if index == 63 {
            let _ = started.send(());
        }
        index += 1;
    }
    handle.sync_all().expect("fsync the log");
    index
}

/// Starts [`writer`] on `log` and waits for its first records; answers the flag that stops
/// it and its thread.
fn start_writer(log: &Path) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (started, writing) = mpsc::channel();
    let thread = {
        let (log, stop) = (log.to_path_buf(), Arc::clone(&stop));
        std::thread::spawn(move || writer(log, stop, started))
    };
    writing
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the writer started");
    (stop, thread)
}

/// An appending writer of `log` ([`writer`]) and a reader of `file`, which must hold
/// `expected` ([`reader`]), busy until `stop`.
struct Busy {
    stop: Arc<AtomicBool>,
    write: std::thread::JoinHandle<u64>,
    read: std::thread::JoinHandle<u64>,
}

impl Busy {
    fn start(log: &Path, file: PathBuf, expected: &Arc<Vec<u8>>) -> Busy {
        let (stop, write) = start_writer(log);
        let read = {
            let (expected, stop) = (Arc::clone(expected), Arc::clone(&stop));
            std::thread::spawn(move || reader(file, expected, stop))
        };
        Busy { stop, write, read }
    }

    /// Stops both; answers the records written, after checking both did their part.
    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        let written = self.write.join().expect("writer");
        let reads = self.read.join().expect("reader");
        assert!(
            written >= 64 && reads >= 1,
            "{written} records, {reads} reads"
        );
        written
    }
}

/// A reader that keeps `file` open and reads it in 1 MiB pieces, checking each against
/// `expected`, until `stop`; answers how many pieces it read.
fn reader(file: PathBuf, expected: Arc<Vec<u8>>, stop: Arc<AtomicBool>) -> u64 {
    let handle = File::open(&file).expect("open for reading");
    let piece = 1 << 20;
    let mut reads = 0u64;
    let mut offset = 0;
    while !stop.load(Ordering::Acquire) || reads == 0 {
        let len = piece.min(expected.len() - offset);
        let mut read = vec![0u8; len];
        handle
            .read_exact_at(&mut read, offset as u64)
            .unwrap_or_else(|e| panic!("read {} at {offset}: {e}", file.display()));
        assert!(
            read == expected[offset..offset + len],
            "{} read wrong at {offset} while it moved",
            file.display()
        );
        reads += 1;
        offset = (offset + piece) % expected.len();
    }
    reads
}

/// A writer that keeps `file` open and, until `stop`, writes 6 MiB at its start and
/// truncates it shorter, over and over; answers what the file must hold, all fsynced.
fn cutter(file: PathBuf, stop: Arc<AtomicBool>) -> Vec<u8> {
    let handle = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&file)
        .expect("open the cut file");
    let mut expected = Vec::new();
    let mut round = 0u64;
    while !stop.load(Ordering::Acquire) || round < 4 {
        expected = pattern(100 + round, 6 << 20);
        handle
            .write_all_at(&expected, 0)
            .unwrap_or_else(|e| panic!("write round {round} of {}: {e}", file.display()));
        let cut = ((64 + round % 128) << 10) as usize;
        handle
            .set_len(cut as u64)
            .unwrap_or_else(|e| panic!("truncate round {round} of {}: {e}", file.display()));
        expected.truncate(cut);
        round += 1;
    }
    handle.sync_all().expect("fsync the cut file");
    expected
}

/// Checks that each file of `dir` holds its bytes.
fn holds(dir: &Path, files: &[(&str, &[u8])]) {
    for (name, expected) in files {
        let data = fs::read(dir.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        assert!(data == *expected, "{name}'s content");
    }
}

/// Checks the writer's log: `count` records, each right.
fn check_log(file: &Path, count: u64) {
    let data = fs::read(file).expect("read the log");
    assert_eq!(data.len() as u64, count * RECORD as u64, "the log's length");
    for index in 0..count {
        let at = (index as usize) * RECORD;
        assert!(
            data[at..at + RECORD] == record(index)[..],
            "record {index} of the log is wrong after the move"
        );
    }
}

/// Object files in every target's tree, per (storage server, target).
fn objects_per_target(cluster: &LocalCluster) -> Vec<((usize, usize), usize)> {
    let mut counts = Vec::new();
    for (storage, target) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
        let mut stack = vec![cluster.target_dir(storage, target).join("objects")];
        let mut count = 0;
        while let Some(directory) = stack.pop() {
            for entry in fs::read_dir(&directory).expect("read objects").flatten() {
                if entry.path().is_dir() {
                    stack.push(entry.path());
                } else {
                    count += 1;
                }
            }
        }
        counts.push(((storage, target), count));
    }
    counts
}

/// Three storage servers of two targets each, mounted, paired into three storage mirror
/// groups (each member on another server), the third in pool `fast`, and a directory
/// `project` whose files are mirrored on one group of the default pool. Answers the groups'
/// members, by group in id order.
fn with_mirror_groups() -> (LocalCluster, PathBuf, Vec<(u32, Vec<u32>)>) {
    let mut cluster = cluster(ClusterSpec {
        storage: 3,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    common::autocreate_storage_groups(&cluster);
    weft_testkit::wait_until("every member of the three groups good", || {
        let (_, list, _) = ask(&cluster, &["mirror", "list"]);
        list.matches("(good)").count() == 6
    })
    .expect("groups formed");
    let groups = mirror_groups(&cluster);
    assert_eq!(groups.len(), 3, "{groups:?}");
    pool_of_group(&cluster, "fast", groups[2].0);
    let dir = mnt.join("project");
    common::make_mirrored_dir(
        &cluster,
        &dir,
        &["--num-targets", "1", "--chunk-size", "64K"],
    );
    (cluster, dir, groups)
}

/// Mounts the cluster and makes directory `name` in it, whose files are mirrored on one group
/// each, in 64 KiB chunks.
fn mirrored_dir(cluster: &mut LocalCluster, name: &str) -> PathBuf {
    let dir = cluster.mount().expect("mount").join(name);
    common::make_mirrored_dir(
        cluster,
        &dir,
        &["--num-targets", "1", "--chunk-size", "64K"],
    );
    dir
}

/// The storage mirror groups of the cluster: each group's id and member targets, its primary
/// first.
fn mirror_groups(cluster: &LocalCluster) -> Vec<(u32, Vec<u32>)> {
    let runtime = common::runtime();
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(cluster));
    let map = runtime.block_on(view.refresh()).expect("the cluster map");
    let mut groups: Vec<(u32, Vec<u32>)> = map
        .mirror_groups
        .iter()
        .filter(|group| group.kind == weft_proto::messages::MirrorKind::Storage)
        .map(|group| {
            let mut members: Vec<u32> = group.members.iter().map(|m| m.id.0).collect();
            members.sort_by_key(|id| *id != group.primary.0);
            (group.id.0, members)
        })
        .collect();
    groups.sort();
    groups
}

/// The storage mirror group `file` is mirrored on (its layout's one slot).
fn group_of(cluster: &LocalCluster, file: &Path) -> (u32, String) {
    let (_, info) = common::layout_targets(cluster, file);
    let group = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("+ group "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{} is not mirrored: {info}", file.display()));
    (group, info)
}

/// Each target's storage server and directory, by target id, as the servers' logs tell.
fn target_homes(
    cluster: &LocalCluster,
    servers: usize,
) -> std::collections::BTreeMap<u32, (usize, PathBuf)> {
    let mut homes = std::collections::BTreeMap::new();
    for server in 1..=servers {
        let log = cluster.log(&format!("storage-{server}"));
        for line in log.lines().filter(|l| l.contains("storage target ready")) {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|word| word.strip_prefix(name))
                    .map(str::to_string)
            };
            if let (Some(id), Some(path)) = (field("target="), field("path=")) {
                homes.insert(
                    id.parse().expect("a target id"),
                    (server, PathBuf::from(path)),
                );
            }
        }
    }
    homes
}

/// The targets of each storage server (index 0: storage-1), in id order, once every one of
/// the `servers` logged its two targets.
fn targets_by_server(cluster: &LocalCluster, servers: usize) -> Vec<Vec<u32>> {
    weft_testkit::wait_until("every storage server to log its targets", || {
        target_homes(cluster, servers).len() == 2 * servers
    })
    .expect("targets logged");
    let homes = target_homes(cluster, servers);
    (1..=servers)
        .map(|server| {
            homes
                .iter()
                .filter(|(_, (s, _))| *s == server)
                .map(|(id, _)| *id)
                .collect()
        })
        .collect()
}

/// Makes a storage mirror group of each pair (its first target primary), and waits until
/// every member of every group is good.
fn make_groups(cluster: &LocalCluster, pairs: &[[u32; 2]]) {
    for pair in pairs {
        let list = format!("{},{}", pair[0], pair[1]);
        let (ok, _, err) = ask(
            cluster,
            &["mirror", "create", "storage", "--members", &list],
        );
        assert!(ok, "mirror create {list}: {err}");
    }
    weft_testkit::wait_until("every member good", || {
        let (_, list, _) = ask(cluster, &["mirror", "list"]);
        !list.contains("(needs-resync)")
            && !list.contains("(bad)")
            && list.matches("(good)").count() >= 2 * pairs.len()
    })
    .expect("groups formed");
}

/// Makes storage pool `pool` of the storage mirror group `group`.
fn pool_of_group(cluster: &LocalCluster, pool: &str, group: u32) {
    let (ok, _, err) = ask(cluster, &["pool", "create", pool]);
    assert!(ok, "pool create {pool}: {err}");
    let group = group.to_string();
    let (ok, _, err) = ask(
        cluster,
        &["pool", "add-target", pool, "--mirror-groups", &group],
    );
    assert!(ok, "pool add-target {pool} --mirror-groups {group}: {err}");
}

/// The sizes of the mirrored objects (holding data) on each target, by target id.
fn mirrored_sizes(
    cluster: &LocalCluster,
    servers: usize,
) -> std::collections::BTreeMap<u32, Vec<u64>> {
    let mut sizes = std::collections::BTreeMap::new();
    for (id, (_, path)) in target_homes(cluster, servers) {
        let mut stack = vec![path.join("mirrored")];
        let mut found = Vec::new();
        while let Some(directory) = stack.pop() {
            for entry in fs::read_dir(&directory).into_iter().flatten().flatten() {
                if entry.path().is_dir() {
                    stack.push(entry.path());
                } else {
                    found.push(entry.metadata().map_or(0, |m| m.len()));
                }
            }
        }
        sizes.insert(id, found);
    }
    sizes
}

/// Mirrored objects (holding data) on each target, by target id.
fn mirrored_objects(
    cluster: &LocalCluster,
    servers: usize,
) -> std::collections::BTreeMap<u32, usize> {
    mirrored_sizes(cluster, servers)
        .into_iter()
        .map(|(id, sizes)| (id, sizes.len()))
        .collect()
}

/// The id of the group whose members are `pair`.
fn pairs_group(groups: &[(u32, Vec<u32>)], pair: &[u32; 2]) -> u32 {
    groups
        .iter()
        .find(|(_, members)| members.contains(&pair[0]))
        .map(|(id, _)| *id)
        .expect("a group of the pair")
}

mod mirrored;
mod plain;
