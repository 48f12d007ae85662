//! Data that moves while in use: `weft entry migrate` re-places files onto other targets
//! while readers and writers go on, and a crash of the metadata server in the middle of a
//! move loses nothing and finishes it.

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

// Goal: `weft entry migrate DIR --pool P` moves every file of a tree into another pool while
// a reader and a writer keep the files open and busy: they see the right data throughout,
// nothing a writer wrote is lost, the files' layouts name the new pool's targets only, the
// old targets keep no data of them, new files of the tree go to the new pool, a second run
// finds nothing to move, and the tree moves back again once nobody holds the files open.
// Method: a two-target default pool and a two-target pool `fast`; files of several sizes
// (a big one, a small one, an empty one, one in a subdirectory) written through the mount; a
// reader thread on the big file and a writer thread appending to a log, both open across
// the move; the `weft` commands an operator types; content compared byte for byte; fsck.
#[test]
fn a_tree_moves_to_another_pool_while_it_is_read_and_written() {
    let (cluster, dir) = with_a_fast_pool();
    let big = Arc::new(pattern(7, 12 << 20));
    fs::write(dir.join("big"), &*big).expect("write big");
    fs::write(dir.join("small"), b"a few bytes").expect("write small");
    File::create(dir.join("empty")).expect("create empty");
    fs::create_dir(dir.join("sub")).expect("mkdir sub");
    let inner = pattern(8, 3 << 20);
    fs::write(dir.join("sub/inner"), &inner).expect("write inner");
    let (before, info) = common::layout_targets(&cluster, &dir.join("big"));
    assert!(
        before.iter().all(|t| [1, 3].contains(t)),
        "big starts in the default pool: {info}"
    );

    let log = dir.join("log");
    let busy = Busy::start(&log, dir.join("big"), &big);

    let (ok, out, err) = migrate(&cluster, &dir, "fast");
    assert!(ok, "migrate: {err}");
    assert!(
        out.contains("5 files looked at: 5 moved"),
        "every file moved: {out}"
    );
    let written = busy.finish();

    holds(
        &dir,
        &[
            ("big", &big),
            ("small", b"a few bytes"),
            ("empty", b""),
            ("sub/inner", &inner),
        ],
    );
    check_log(&log, written);
    for name in ["big", "small", "empty", "sub/inner", "log"] {
        let (targets, info) = common::layout_targets(&cluster, &dir.join(name));
        assert!(
            targets.len() == 2 && targets.iter().all(|t| [2, 4].contains(t)),
            "{name} is on the pool's targets: {info}"
        );
        assert!(info.contains("+ Storage Pool: fast (2)"), "{name}: {info}");
    }
    let counts = objects_per_target(&cluster);
    let holding = counts.iter().filter(|(_, count)| *count > 0).count();
    assert_eq!(
        holding, 2,
        "only the two targets of fast hold objects: {counts:?}"
    );
    let fresh = dir.join("sub/fresh");
    fs::write(&fresh, pattern(9, 1 << 20)).expect("a new file");
    let (targets, info) = common::layout_targets(&cluster, &fresh);
    assert!(
        targets.iter().all(|t| [2, 4].contains(t)),
        "a new file of the tree goes to the new pool: {info}"
    );

    let (ok, out, err) = migrate(&cluster, &dir, "fast");
    assert!(ok, "migrate again: {err}");
    assert!(out.contains("0 moved"), "nothing left to move: {out}");

    // Nobody holds the files open now: their old targets may take them again.
    let (ok, out, err) = migrate(&cluster, &dir, "default");
    assert!(ok, "migrate back: {err}");
    assert!(out.contains("6 files looked at: 6 moved"), "{out}");
    assert!(
        fs::read(dir.join("big")).expect("read big") == *big,
        "content"
    );
    check_log(&log, written);
    let (targets, info) = common::layout_targets(&cluster, &dir.join("big"));
    assert!(
        targets.iter().all(|t| [1, 3].contains(t)),
        "big is back in the default pool: {info}"
    );
    fsck_clean(&cluster);
}

// Goal: a move, and a restripe into another pattern, survive a crash of the file's metadata
// server at their two points of no return (after the move is marked for its last copies, and
// after those copies were made and the old objects sealed, before the layout switched), with
// a writer appending throughout: after the restart the move finishes by itself, the writer's
// every record is there, and fsck is clean. Method: fault-injection points end meta-1 at
// each step; the writer's requests meet sealed objects and wait for the new layout across
// the restart.
#[test]
fn a_move_survives_a_crash_of_its_metadata_server() {
    let restripe = ["--chunk-size", "128K", "--num-targets", "2"];
    // Each crash point once and each kind of move once: the points are steps of the metadata
    // server's move, the same for both kinds, and every pairing cost CI a minute more.
    for (point, pattern_args) in [
        ("move-after-sealing", &[][..]),
        ("move-after-last-push", &restripe[..]),
    ] {
        let (mut cluster, dir) = with_a_fast_pool();
        let data = pattern(11, 6 << 20);
        fs::write(dir.join("data"), &data).expect("write");

        let log = dir.join("log");
        let (stop, write_thread) = start_writer(&log);
        cluster
            .set_env("meta-1", &[("WEFT_FAILPOINTS", point)])
            .expect("arm");
        cluster.restart("meta-1").expect("restart armed");
        cluster.wait_ready().expect("ready");
        let moving = migrate_in_background(&cluster, &log, "fast", pattern_args);
        weft_testkit::wait_until(&format!("meta-1 to crash at {point}"), || {
            cluster.has_exited("meta-1")
        })
        .expect("crashed");
        cluster.set_env("meta-1", &[]).expect("disarm");
        cluster.restart("meta-1").expect("restart");
        cluster.wait_ready().expect("ready again");
        // The command waited for its metadata server, and ends with the move.
        let _ = moving.join();
        let (ok, out, err) = migrate(&cluster, &log, "fast");
        assert!(ok, "{point}: migrate after the restart: {err}");
        assert!(out.contains("1 files looked at"), "{point}: {out}");
        stop.store(true, Ordering::Release);
        let written = write_thread.join().expect("writer");
        check_log(&log, written);
        let (targets, info) = common::layout_targets(&cluster, &log);
        assert!(
            targets.iter().all(|t| [2, 4].contains(t)),
            "{point}: the log moved: {info}"
        );
        if !pattern_args.is_empty() {
            assert!(
                info.contains("+ Chunksize: 128K"),
                "{point}: the log was restriped: {info}"
            );
        }
        assert!(fs::read(dir.join("data")).expect("read") == data, "{point}");
        fsck_clean(&cluster);
    }
}

// Goal: a drain that cannot finish says so and why, where an operator looks: files striped
// over every target of their pool have no target to move to (a file never moves onto a target
// it is on), so `weft target list --state` shows them stuck with the reason and what to do,
// `weft target drain T --wait` ends with that reason instead of waiting for ever, the files
// that can move still move, and every byte stays. Method: the default four targets, eight
// files striped over all four and four over two; the commands an operator types.
#[test]
fn a_drain_that_cannot_finish_says_why() {
    let (cluster, wide) = with_a_dir("wide", "4");
    let narrow = wide.with_file_name("narrow");
    make_dir_with_pattern(
        &cluster,
        &narrow,
        &["--num-targets", "2", "--chunk-size", "64K"],
    );
    let mut files = Vec::new();
    for index in 0..8u64 {
        let path = wide.join(format!("f{index}"));
        let data = pattern(60 + index, 1 << 20);
        fs::write(&path, &data).expect("write");
        files.push((path, data));
    }
    let target = 3;
    let mut on_target = 0;
    for index in 0..4u64 {
        let path = narrow.join(format!("g{index}"));
        let data = pattern(80 + index, 300_000);
        fs::write(&path, &data).expect("write");
        on_target += usize::from(common::layout_targets(&cluster, &path).0.contains(&target));
        files.push((path, data));
    }
    let (ok, out, err) = ask(&cluster, &["target", "drain", &target.to_string()]);
    assert!(ok, "drain: {out}{err}");
    let stuck = "8 files cannot move off it";
    let mut state = String::new();
    weft_testkit::wait_until(
        "`weft target list --state` to say why the drain waits",
        || {
            state = ask(&cluster, &["target", "list", "--state"]).1;
            state.contains(stuck) && state.contains("draining, 8 left, 8 stuck")
        },
    )
    .unwrap_or_else(|_| panic!("the drain explains itself: {state}"));
    assert!(
        state.contains("add targets to the pool") && state.contains("--pool"),
        "the reason says what to do: {state}"
    );
    let (ok, out, err) = ask(
        &cluster,
        &["target", "drain", &target.to_string(), "--wait"],
    );
    assert!(!ok, "a drain that cannot finish is not waited for: {out}");
    assert!(
        err.contains("cannot be drained") && err.contains(stuck),
        "--wait ends with the reason: {err}"
    );
    // The files that could move did ({on_target} of the narrow ones were on the target).
    for index in 0..4u64 {
        let path = narrow.join(format!("g{index}"));
        let (targets, info) = common::layout_targets(&cluster, &path);
        assert!(
            !targets.contains(&target),
            "a file that can move moved off ({on_target} were on it): {info}"
        );
    }
    let (ok, _, err) = ask(
        &cluster,
        &["target", "drain", &target.to_string(), "--stop"],
    );
    assert!(ok, "the drain stops: {err}");
    for (path, data) in &files {
        assert!(&fs::read(path).expect("read") == data, "{}", path.display());
    }
}

// Goal: `weft target drain T --wait` empties a target while its files are in use — a writer
// appends to one of them throughout — new files avoid it, every file keeps its data, and
// `weft target remove T` is refused before the drain and takes the target out after it; the
// storage server that held it starts again without it. Method: the default four targets,
// files of several sizes striped over two; the commands an operator types; the target's
// object tree counted; content compared byte for byte; fsck.
#[test]
fn a_drained_target_empties_while_in_use_and_is_removed() {
    let (mut cluster, dir) = with_a_dir("data", "2");
    let files: Vec<(PathBuf, Vec<u8>)> = (0..12u64)
        .map(|index| {
            let data = pattern(20 + index, (index as usize * 300_000) % (2 << 20));
            let path = dir.join(format!("f{index}"));
            fs::write(&path, &data).expect("write");
            (path, data)
        })
        .collect();
    let (ok, _, err) = ask(&cluster, &["target", "remove", "1"]);
    assert!(
        !ok && err.contains("not drained"),
        "remove before a drain: {err}"
    );

    let log = dir.join("log");
    let (stop, write_thread) = start_writer(&log);
    let (ok, out, err) = ask(&cluster, &["target", "drain", "1", "--wait"]);
    assert!(ok, "drain: {err}");
    assert!(out.contains("target 1 is drained"), "{out}");
    stop.store(true, Ordering::Release);
    let written = write_thread.join().expect("writer");
    check_log(&log, written);

    for index in 0..6 {
        let path = dir.join(format!("new{index}"));
        fs::write(&path, pattern(40 + index, 200_000)).expect("a new file");
        let (targets, info) = common::layout_targets(&cluster, &path);
        assert!(
            !targets.contains(&1),
            "a new file avoids the draining target: {info}"
        );
    }
    for (path, data) in &files {
        assert!(&fs::read(path).expect("read") == data, "{}", path.display());
        let (targets, info) = common::layout_targets(&cluster, path);
        assert!(
            !targets.contains(&1),
            "{} left target 1: {info}",
            path.display()
        );
    }
    let counts = objects_per_target(&cluster);
    assert_eq!(
        counts[0],
        ((1, 1), 0),
        "target 1 holds no object: {counts:?}"
    );
    let (ok, state, err) = ask(&cluster, &["target", "list", "--state"]);
    assert!(ok, "{err}");
    assert!(state.contains("draining, 0 left"), "{state}");

    let (ok, _, err) = ask(&cluster, &["target", "remove", "1"]);
    assert!(ok, "remove after the drain: {err}");
    let (ok, list, err) = ask(&cluster, &["target", "list"]);
    assert!(ok, "{err}");
    assert!(
        !list
            .lines()
            .any(|line| line.split_whitespace().next() == Some("1")),
        "target 1 is gone: {list}"
    );
    cluster.restart("storage-1").expect("restart storage-1");
    weft_testkit::wait_until("storage-1 to serve target 2 again", || {
        let (_, state, _) = ask(&cluster, &["target", "list", "--state"]);
        cluster.log("storage-1").contains("target not served")
            && state
                .lines()
                .any(|line| line.starts_with("2 ") && line.contains(" online "))
    })
    .expect("storage-1 back");
    for (path, data) in &files {
        assert!(&fs::read(path).expect("read") == data, "{}", path.display());
    }
    check_log(&log, written);
    fsck_clean(&cluster);
}

/// Bytes of object data on each of the four targets, in target order 1, 2, 3, 4 (storage-1
/// holds targets 1 and 2, storage-2 targets 3 and 4).
fn bytes_per_target(cluster: &LocalCluster) -> Vec<u64> {
    [(1, 1), (1, 2), (2, 1), (2, 2)]
        .iter()
        .map(|&(storage, target)| {
            let mut stack = vec![cluster.target_dir(storage, target).join("objects")];
            let mut bytes = 0;
            while let Some(directory) = stack.pop() {
                for entry in fs::read_dir(&directory).expect("read objects").flatten() {
                    let metadata = entry.metadata().expect("stat");
                    if metadata.is_dir() {
                        stack.push(entry.path());
                    } else {
                        bytes += metadata.len();
                    }
                }
            }
            bytes
        })
        .collect()
}

// Goal: targets added to a pool fill by themselves — background rebalancing moves data from
// the full ones until every target is within the margin of the pool's mean fill — with no
// command beyond adding them, and every file keeps its data. Method: 64 MiB targets; a pool
// of two targets filled with 24 MiB through the mount; the other two targets added to the
// pool; the bytes in each target's object tree watched until they level out (the
// rebalancing rate is raised so the test does not wait on it); content compared; fsck.
#[test]
fn added_targets_fill_by_themselves_until_the_pool_is_level() {
    let capacity: u64 = 64 << 20;
    let mut cluster = cluster(ClusterSpec {
        target_capacity_bytes: Some(capacity),
        meta_settings: vec!["rebalance_bytes_per_second=1073741824".into()],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let (ok, _, err) = ask(&cluster, &["pool", "create", "p", "--targets", "1,3"]);
    assert!(ok, "pool create: {err}");
    let dir = mnt.join("data");
    make_dir_with_pattern(
        &cluster,
        &dir,
        &["--pool", "p", "--num-targets", "2", "--chunk-size", "64K"],
    );
    let files: Vec<(PathBuf, Vec<u8>)> = (0..16u64)
        .map(|index| {
            let data = pattern(60 + index, 1536 << 10);
            let path = dir.join(format!("f{index}"));
            fs::write(&path, &data).expect("write");
            (path, data)
        })
        .collect();
    let before = bytes_per_target(&cluster);
    assert_eq!(
        (before[1], before[3]),
        (0, 0),
        "targets 2 and 4 start empty: {before:?}"
    );

    let (ok, _, err) = ask(&cluster, &["pool", "add-target", "p", "--targets", "2,4"]);
    assert!(ok, "add-target: {err}");
    // Within the margin (5 % of a target's capacity) of the mean, and an object's size for
    // the step that may still be on its way.
    let slack = capacity * 5 / 100 + (768 << 10);
    let mut last = Vec::new();
    let level = weft_testkit::wait_until("the pool to level out", || {
        last = bytes_per_target(&cluster);
        let mean = last.iter().sum::<u64>() / 4;
        last.iter().all(|&bytes| bytes.abs_diff(mean) <= slack)
    });
    assert!(
        level.is_ok(),
        "the targets did not level out: {last:?} from {before:?}"
    );
    assert!(
        last[1] > 0 && last[3] > 0,
        "the added targets took data: {last:?}"
    );
    for (path, data) in &files {
        assert!(&fs::read(path).expect("read") == data, "{}", path.display());
    }
    let metrics = weft_testkit::http_get(&cluster.address_of("meta-1").expect("meta"), "/metrics")
        .expect("metrics")
        .1;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("weft_meta_rebalanced_bytes_total")
                && !line.ends_with(" 0")),
        "rebalancing shows in the metrics: {metrics}"
    );
    fsck_clean(&cluster);
}

// Goal: a move given up (its new target filled up) leaves the file whole where it was, and a
// later move of the file copies all of it again, not only what changed since the first try.
// Method: 16 MiB targets; a filler moved onto targets 2 and 4 leaves no room there for a
// 16 MiB file's two 8 MiB objects; the move is refused with the reason; the filler goes and
// the same move is asked again; the file's content compared; fsck. Rebalancing is off so
// nothing else moves. Seen failing (the second move copied nothing) before pushes carried
// their move's number.
#[test]
fn a_move_given_up_leaves_the_file_whole_and_a_later_one_copies_it_all() {
    let mut cluster = cluster(ClusterSpec {
        target_capacity_bytes: Some(16 << 20),
        meta_settings: vec!["rebalance_bytes_per_second=0".into()],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    for (pool, targets) in [("a", "1,3"), ("b", "2,4")] {
        let (ok, _, err) = ask(&cluster, &["pool", "create", pool, "--targets", targets]);
        assert!(ok, "pool create {pool}: {err}");
    }
    let dir = mnt.join("data");
    make_dir_with_pattern(
        &cluster,
        &dir,
        &["--pool", "a", "--num-targets", "2", "--chunk-size", "64K"],
    );
    let filler = dir.join("filler");
    common::write_synced(&filler, &pattern(70, 20 << 20));
    let (ok, _, err) = migrate(&cluster, &filler, "b");
    assert!(ok, "filler moved: {err}");
    let victim = dir.join("victim");
    let data = pattern(71, 16 << 20);
    common::write_synced(&victim, &data);

    let (ok, _, err) = migrate(&cluster, &victim, "b");
    assert!(!ok, "no room for the victim");
    assert!(
        err.contains("full"),
        "the refusal says the target is full: {err}"
    );
    assert!(
        fs::read(&victim).expect("read") == data,
        "the victim stayed whole"
    );
    let (on, info) = common::layout_targets(&cluster, &victim);
    assert!(
        on.iter().all(|t| [1, 3].contains(t)),
        "it stayed in pool a: {info}"
    );

    fs::remove_file(&filler).expect("remove the filler");
    weft_testkit::wait_until("room for the victim", || migrate(&cluster, &victim, "b").0)
        .expect("the victim moved");
    let (now, info) = common::layout_targets(&cluster, &victim);
    assert!(
        now.iter().all(|t| [2, 4].contains(t)),
        "the victim moved: {info}"
    );
    assert!(
        fs::read(&victim).expect("read") == data,
        "the victim is whole after its move"
    );
    fsck_clean(&cluster);
}

/// The count of one request type a service's `/metrics` shows.
fn requests_of(cluster: &LocalCluster, service: &str, op: &str) -> u64 {
    let address = cluster.address_of(service).expect("address");
    let (_, metrics) = weft_testkit::http_get(&address, "/metrics").expect("metrics");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("weft_requests_total{") && line.contains(&format!("op=\"{op}\""))
        })
        .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

// Goal: copy_file_range, and `cp` that uses it, copy between Weft files on the storage servers:
// the copy is exact (ranges at any offset, a sparse source, across chunk and stripe edges,
// between files of different chunk sizes and widths), and the data does not cross the client
// (the storage servers served copies, and the mount sent no write for it). Method: files
// written through the mount; libc::copy_file_range at odd offsets and `cp` run on it; the
// content compared; the storage servers' request counters read.
#[test]
fn copy_file_range_copies_on_the_storage_servers() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let a = mnt.join("a");
    let b = mnt.join("b");
    make_dir_with_pattern(&cluster, &a, &["--num-targets", "2", "--chunk-size", "64K"]);
    make_dir_with_pattern(
        &cluster,
        &b,
        &["--num-targets", "3", "--chunk-size", "128K"],
    );
    let mut data = pattern(80, 5 << 20);
    // A hole in the middle.
    data[(1 << 20)..(2 << 20)].fill(0);
    let source = a.join("source");
    {
        let file = File::create(&source).expect("create");
        file.write_all_at(&data[..1 << 20], 0).expect("write");
        file.write_all_at(&data[2 << 20..], 2 << 20).expect("write");
    }
    let writes_before =
        requests_of(&cluster, "storage-1", "write") + requests_of(&cluster, "storage-2", "write");

    let target = b.join("copy");
    let input = File::open(&source).expect("open source");
    let output = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&target)
        .expect("open target");
    use std::os::fd::AsRawFd;
    let copy = |from: i64, to: i64, len: usize| {
        let (mut from, mut to) = (from, to);
        let mut left = len;
        while left > 0 {
            // SAFETY: both descriptors are open; the offsets are valid pointers.
            let copied = unsafe {
                libc::copy_file_range(
                    input.as_raw_fd(),
                    &mut from,
                    output.as_raw_fd(),
                    &mut to,
                    left,
                    0,
                )
            };
            assert!(
                copied > 0,
                "copy_file_range: {}",
                std::io::Error::last_os_error()
            );
            left -= copied as usize;
        }
    };
    // An odd range first, then the rest around it.
    copy(12_345, 12_345, 3 << 20);
    copy(0, 0, 12_345);
    copy(
        12_345 + (3 << 20),
        12_345 + (3 << 20),
        data.len() - 12_345 - (3 << 20),
    );
    output.sync_all().expect("fsync");
    drop((input, output));
    assert!(
        fs::read(&target).expect("read the copy") == data,
        "the copy is exact"
    );
    let copies = requests_of(&cluster, "storage-1", "copy_from")
        + requests_of(&cluster, "storage-2", "copy_from");
    let writes_after =
        requests_of(&cluster, "storage-1", "write") + requests_of(&cluster, "storage-2", "write");
    assert!(copies > 0, "the storage servers copied");
    assert_eq!(
        writes_after, writes_before,
        "the mount sent no write for the copy"
    );

    let by_cp = b.join("by-cp");
    let status = std::process::Command::new("cp")
        .arg(&source)
        .arg(&by_cp)
        .status()
        .expect("cp runs");
    assert!(status.success(), "cp");
    assert!(
        fs::read(&by_cp).expect("read") == data,
        "cp's copy is exact"
    );
    fsck_clean(&cluster);
}

// Goal: `weft entry migrate DIR --chunk-size C --num-targets N` restripes every file of a
// tree into another pattern while a reader and a writer keep files open and busy: they see
// the right data throughout, nothing written is lost, a sparse file keeps its holes as zeros,
// every file's layout has the new chunk size and width on targets it was never on, new files
// of the tree get the new pattern, a second run restripes nothing, and fsck is clean.
// Method: the default four targets; files striped over one target in 64K chunks, written
// through the mount (one with a hole); a reader thread and an appending writer open across
// the restripe; content compared byte for byte.
#[test]
fn a_tree_is_restriped_while_it_is_read_and_written() {
    let (cluster, dir) = with_a_dir("narrow", "1");
    let big = Arc::new(pattern(21, 9 << 20));
    fs::write(dir.join("big"), &*big).expect("write big");
    fs::write(dir.join("small"), b"a few bytes").expect("write small");
    let sparse = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("sparse"))
        .expect("create sparse");
    let tail = pattern(22, 300 << 10);
    sparse
        .write_all_at(&tail, 5 << 20)
        .expect("write past a hole");
    drop(sparse);
    let mut expected_sparse = vec![0u8; 5 << 20];
    expected_sparse.extend_from_slice(&tail);

    let log = dir.join("log");
    let busy = Busy::start(&log, dir.join("big"), &big);
    let cut_thread = {
        let (file, stop) = (dir.join("cut"), Arc::clone(&busy.stop));
        std::thread::spawn(move || cutter(file, stop))
    };
    let path = dir.display().to_string();
    let restripe = || {
        ask(
            &cluster,
            &[
                "entry",
                "migrate",
                &path,
                "--chunk-size",
                "128K",
                "--num-targets",
                "3",
            ],
        )
    };
    let (ok, out, err) = restripe();
    assert!(ok, "migrate: {err}");
    assert!(
        out.contains("5 files looked at: 5 moved"),
        "every file was restriped: {out}"
    );
    let written = busy.finish();
    let cut = cut_thread.join().expect("cutter");
    // The file truncated throughout, and the sparse one's hole, hold what they must.
    holds(
        &dir,
        &[
            ("cut", &cut),
            ("big", &big),
            ("small", b"a few bytes"),
            ("sparse", &expected_sparse),
        ],
    );
    check_log(&log, written);
    for name in ["big", "small", "sparse", "log", "cut"] {
        let (targets, info) = common::layout_targets(&cluster, &dir.join(name));
        assert_eq!(targets.len(), 3, "{name} is striped over three: {info}");
        assert!(info.contains("+ Chunksize: 128K"), "{name}: {info}");
    }
    let fresh = dir.join("fresh");
    fs::write(&fresh, pattern(23, 1 << 20)).expect("a new file");
    let (targets, info) = common::layout_targets(&cluster, &fresh);
    assert!(
        targets.len() == 3 && info.contains("+ Chunksize: 128K"),
        "a new file of the tree gets the new pattern: {info}"
    );
    let (ok, out, err) = restripe();
    assert!(ok, "migrate again: {err}");
    assert!(out.contains("0 moved"), "nothing left to restripe: {out}");
    fsck_clean(&cluster);
}

// Goal: a truncate made while a restripe waits between two rounds (the old object's server
// went down after a round had filled the new objects) reaches the new objects too: the
// restripe finishes, and the file holds what the truncate left, with zeros past it when it
// grows again. (The truncate reached the old object alone; the new ones, holding bytes of the
// generation before it, refused every later copy with TruncatePending, and the restripe never
// finished.) Method: a file on one target; its storage server is armed to exit after a round
// of a restripe's push; the file is cut while that server is down; the server comes back.
#[test]
fn a_truncate_between_two_rounds_of_a_restripe_reaches_the_new_objects() {
    let (mut cluster, dir) = with_a_dir("narrow", "1");
    let file = dir.join("data");
    let data = pattern(41, 3 << 20);
    fs::write(&file, &data).expect("write");
    let (targets, info) = common::layout_targets(&cluster, &file);
    let homes = targets_by_server(&cluster, 2);
    let server = homes
        .iter()
        .position(|held| held.contains(&targets[0]))
        .map(|index| format!("storage-{}", index + 1))
        .unwrap_or_else(|| panic!("the file's target has a server: {info} {homes:?}"));
    cluster
        .set_env(&server, &[("WEFT_FAILPOINTS", "restripe-push-after-round")])
        .expect("arm");
    cluster.restart(&server).expect("restart armed");
    cluster.wait_ready().expect("ready");

    let restripe = ["--chunk-size", "128K", "--num-targets", "2"];
    let moving = migrate_in_background(&cluster, &file, "default", &restripe);
    weft_testkit::wait_until(&format!("{server} to exit after a round"), || {
        cluster.has_exited(&server)
    })
    .expect("a round was copied");
    let cut = (1 << 20) + 5;
    OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open")
        .set_len(cut)
        .expect("truncate while the old object's server is down");
    cluster.set_env(&server, &[]).expect("disarm");
    cluster.restart(&server).expect("restart");
    cluster.wait_ready().expect("ready again");
    let finished = weft_testkit::wait_until("the restripe to finish", || {
        common::layout_targets(&cluster, &file)
            .1
            .contains("+ Chunksize: 128K")
    });
    if let Err(error) = finished {
        panic!(
            "{error}; the metadata server logged:\n{}",
            cluster.log("meta-1")
        );
    }
    let migrated = moving.join().expect("migrate").expect("migrate ran");
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        fs::read(&file).expect("read") == data[..cut as usize],
        "the file holds what the truncate left"
    );
    let grown = 3 << 20;
    OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open")
        .set_len(grown)
        .expect("grow");
    let mut expected = data[..cut as usize].to_vec();
    expected.resize(grown as usize, 0);
    assert!(
        fs::read(&file).expect("read") == expected,
        "zeros past the cut once the file grows"
    );
    fsck_clean(&cluster);
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

// Goal: the seal a moved mirrored file leaves on its old group's members holds while that
// group exists: a request that names another group (any client can send one, a read among
// them) does not make the member forget it, so a writer still holding the old layout is told
// the file moved instead of having its writes land where nobody reads them. Method: three
// storage servers in three groups; a mirrored file migrated to another pool's group; raw
// requests to the old group's primary through the protocol.
#[test]
fn a_moved_mirrored_files_seal_holds_against_other_groups() {
    use std::os::unix::fs::MetadataExt;
    use weft_proto::ids::{GroupId, InodeId};
    let (cluster, dir, groups) = with_mirror_groups();
    let file = dir.join("sealed");
    fs::write(&file, pattern(90, 200_000)).expect("write");
    let (old_group, _) = group_of(&cluster, &file);
    let inode = InodeId(fs::metadata(&file).expect("stat").ino());
    let (ok, out, err) = migrate(&cluster, &file, "fast");
    assert!(ok, "migrate: {out}{err}");
    assert_eq!(
        group_of(&cluster, &file).0,
        groups[2].0,
        "moved to pool fast"
    );

    let runtime = common::runtime();
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    let old_route = runtime
        .block_on(view.route(weft_proto::layout::Slot::Group(GroupId(old_group))))
        .expect("the old group's route");
    let storage = runtime
        .block_on(view.storage_for_target(old_route.target))
        .expect("the old primary's server");
    let write_old = || {
        runtime.block_on(storage.write(
            old_route,
            weft_net::ObjectWrite {
                file: (inode, 0),
                offset: 0,
                data: bytes::Bytes::from_static(b"late write with the old layout"),
                tag: None,
                capability: None,
                owner: None,
            },
        ))
    };
    let moved = |result: Result<weft_proto::answer::Written, weft_net::RpcError>| {
        result.is_err_and(|error| error.code() == weft_proto::ErrorCode::Moved)
    };
    assert!(
        moved(write_old()),
        "a write with the old layout is told the file moved"
    );
    // Requests naming other groups, existing or not, for the sealed object.
    for other in [groups[1].0, groups[2].0, 999] {
        let mut elsewhere = old_route;
        let mirror = elsewhere.mirror.as_mut().expect("a group route");
        mirror.group = GroupId(other);
        let _ = runtime.block_on(storage.read(elsewhere, (inode, 0), 0, 5, None));
    }
    assert!(
        moved(write_old()),
        "the seal holds after requests naming other groups"
    );

    // A truncate forwarded by the old primary that reaches its member only now (a late copy:
    // truncates carry no change tag, so no fence drops it) is answered and leaves the
    // member's seal: a member promoted later still tells old writers the file moved.
    let member = groups
        .iter()
        .find(|(id, _)| *id == old_group)
        .map(|(_, members)| members[1])
        .expect("the old group's member");
    let member_storage = runtime
        .block_on(view.storage_for_target(weft_proto::TargetId(member)))
        .expect("the old member's server");
    let mut forwarded = old_route.mirror.expect("a group route");
    forwarded.forwarded = true;
    let late_truncate = weft_proto::messages::StorageRequest::Truncate {
        target: weft_proto::TargetId(member),
        mirror: Some(forwarded),
        inode,
        length: 0,
        generation: u64::MAX,
    };
    runtime
        .block_on(member_storage.send(late_truncate, bytes::Bytes::new()))
        .expect("a late truncate on a sealed member object changes nothing, and is answered");
    let homes = target_homes(&cluster, 3);
    let marker = homes[&member]
        .1
        .join("moved")
        .join(format!("mirrored-{:016x}", inode.0));
    assert!(
        marker.exists(),
        "the member keeps its seal: {} missing",
        marker.display()
    );
    assert_eq!(fs::read(&file).expect("read"), pattern(90, 200_000));
}

// Goal: mirrored files move between storage mirror groups while in use. A drain of one
// member of a group moves every file mirrored on the group to another group of the pool (new
// files avoid the group meanwhile), and `weft entry migrate --pool` takes a mirrored tree to
// the groups of another pool; a reader and a writer keep the files open and busy throughout,
// every member of the new groups holds the data, the old groups' members hold none of it, and
// fsck (which compares the members' copies) is clean.
// Method: three storage servers paired into three groups, the third in pool `fast`; files of
// several sizes mirrored on one group each; the commands an operator types; content compared
// byte for byte; the targets' object trees counted.
#[test]
fn mirrored_files_move_between_mirror_groups_while_in_use() {
    let (cluster, dir, groups) = with_mirror_groups();
    let (first, second, third) = (&groups[0], &groups[1], &groups[2]);
    let big = Arc::new(pattern(31, 8 << 20));
    fs::write(dir.join("big"), &*big).expect("write big");
    fs::write(dir.join("small"), b"a few mirrored bytes").expect("write small");
    File::create(dir.join("empty")).expect("create empty");
    fs::create_dir(dir.join("sub")).expect("mkdir sub");
    let mut files: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|index| {
            let name = format!("sub/f{index}");
            let data = pattern(40 + index, 200_000 * (index as usize + 1));
            fs::write(dir.join(&name), &data).expect("write");
            (name, data)
        })
        .collect();
    files.push(("small".into(), b"a few mirrored bytes".to_vec()));
    files.push(("empty".into(), Vec::new()));
    let on_first = files
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(["big"])
        .filter(|name| group_of(&cluster, &dir.join(name)).0 == first.0)
        .count();
    assert!(on_first > 0, "some files are on group {}", first.0);

    let log = dir.join("log");
    let busy = Busy::start(&log, dir.join("big"), &big);
    // Its second member: a drain of any member drains its group.
    let drained = first.1[1].to_string();
    let (ok, out, err) = ask(&cluster, &["target", "drain", &drained, "--wait"]);
    assert!(ok, "drain: {err}");
    assert!(
        out.contains(&format!("target {drained} is drained")),
        "{out}"
    );
    for (name, _) in files.iter().chain([&("big".to_string(), Vec::new())]) {
        let (group, info) = group_of(&cluster, &dir.join(name));
        assert_eq!(
            group, second.0,
            "{name} moved off the drained group: {info}"
        );
    }
    let fresh = dir.join("fresh");
    fs::write(&fresh, pattern(50, 300_000)).expect("a new file");
    let (group, info) = group_of(&cluster, &fresh);
    assert_eq!(
        group, second.0,
        "a new file avoids the drained group: {info}"
    );
    files.push(("fresh".into(), pattern(50, 300_000)));
    let counts = mirrored_objects(&cluster, 3);
    for member in &first.1 {
        assert_eq!(
            counts[member], 0,
            "the drained group keeps nothing: {counts:?}"
        );
    }
    // The target leaves the cluster, and its emptied group with it.
    let (ok, _, err) = ask(&cluster, &["target", "remove", &drained]);
    assert!(ok, "remove the drained member: {err}");
    let (ok, list, err) = ask(&cluster, &["target", "list"]);
    assert!(ok, "{err}");
    assert!(
        !list
            .lines()
            .any(|line| line.split_whitespace().next() == Some(drained.as_str())),
        "target {drained} is gone: {list}"
    );
    let left: Vec<u32> = mirror_groups(&cluster).iter().map(|(id, _)| *id).collect();
    assert_eq!(left, vec![second.0, third.0], "the emptied group is gone");
    let after = dir.join("after-remove");
    fs::write(&after, pattern(51, 100_000)).expect("a new file");
    assert_eq!(group_of(&cluster, &after).0, second.0);
    files.push(("after-remove".into(), pattern(51, 100_000)));

    let (ok, out, err) = migrate(&cluster, &dir, "fast");
    assert!(ok, "migrate: {err}");
    assert!(out.contains("moved"), "{out}");
    let written = busy.finish();
    let mut expected: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(name, data)| (name.as_str(), data.as_slice()))
        .collect();
    expected.push(("big", &big));
    holds(&dir, &expected);
    check_log(&log, written);
    for name in files
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(["big", "log"])
    {
        let (group, info) = group_of(&cluster, &dir.join(name));
        assert_eq!(group, third.0, "{name} is in pool fast: {info}");
        assert!(info.contains("+ Storage Pool: fast"), "{name}: {info}");
    }
    let counts = mirrored_objects(&cluster, 3);
    for member in first.1.iter().chain(&second.1) {
        assert_eq!(counts[member], 0, "the old groups keep nothing: {counts:?}");
    }
    let holding = counts[&third.1[0]];
    assert!(holding >= 10, "the new group holds the files: {counts:?}");
    assert_eq!(
        counts[&third.1[1]], holding,
        "both members of the new group hold every object: {counts:?}"
    );
    fsck_clean(&cluster);
}

// Goal: the move of a mirrored file survives a crash of its group's primary at both points
// that matter: after the primary sealed its object and before the copy (the member that takes
// over holds all the data, unsealed, and is pushed from in full), and after the members were
// sealed and dropped their data, before the primary dropped its own (the member that takes
// over answers at once). A writer appends throughout; afterwards every record is there, the
// crashed member, back, is brought up to date with the seal and keeps no data, and fsck is
// clean. Method: groups made by hand so the first group's primary is known; a fault-injection
// point named for that target ends its storage server; the group fails over; the server is
// started again without it.
#[test]
fn a_mirrored_move_survives_a_crash_of_its_groups_primary() {
    for point in [
        "mirrored-push-after-seal",
        "mirrored-push-after-members-sealed",
    ] {
        // Armed from the start: a restart would count as one that may have lost writes, and
        // its groups' primaries would move off it.
        let mut cluster = cluster(ClusterSpec {
            storage: 3,
            env: vec![("storage-1".into(), "WEFT_FAILPOINTS".into(), point.into())],
            ..ClusterSpec::default()
        });
        let targets = targets_by_server(&cluster, 3);
        let (one, two, three) = (&targets[0], &targets[1], &targets[2]);
        // The source group's primary on storage-1; the others spread so each keeps a member.
        let members = [[one[0], two[0]], [two[1], three[0]], [three[1], one[1]]];
        make_groups(&cluster, &members);
        let groups = mirror_groups(&cluster);
        let id_of = |pair: &[u32; 2]| pairs_group(&groups, pair);
        let (source, spare, fast) = (id_of(&members[0]), id_of(&members[1]), id_of(&members[2]));
        assert!(
            groups.contains(&(source, members[0].to_vec())),
            "{point}: the source group's primary is on storage-1: {groups:?}"
        );
        for (pool, group) in [("spare", spare), ("fast", fast)] {
            pool_of_group(&cluster, pool, group);
        }
        let dir = mirrored_dir(&mut cluster, "project");
        let data = pattern(61, 6 << 20);
        fs::write(dir.join("data"), &data).expect("write");
        assert_eq!(group_of(&cluster, &dir.join("data")).0, source, "{point}");
        let log = dir.join("log");
        let (stop, write_thread) = start_writer(&log);

        let moving = migrate_in_background(&cluster, &dir, "fast", &[]);
        let crashed = weft_testkit::wait_until(&format!("storage-1 to crash at {point}"), || {
            cluster.has_exited("storage-1")
        });
        if let Err(error) = crashed {
            panic!(
                "{error}: migrate answered {:?}; groups {:?}; storage-1 logged:\n{}",
                moving.join(),
                ask(&cluster, &["mirror", "list"]).1,
                cluster.log("storage-1")
            );
        }
        // A truncate while the move waits to make its last copies (the group fails over):
        // it goes to the new objects once the move is done. (It was sent to the old group,
        // whose sealed objects refused it, or whose new primary, unsealed, took it and then
        // copied the cut object into new objects of the older generation, which refused it:
        // either way the move never finished.)
        let cut = (1 << 20) + 5;
        OpenOptions::new()
            .write(true)
            .open(dir.join("data"))
            .expect("open")
            .set_len(cut)
            .expect("truncate during the last copies");
        let moved = weft_testkit::wait_until("data to reach the fast group", || {
            group_of(&cluster, &dir.join("data")).0 == fast
        });
        if let Err(error) = moved {
            panic!(
                "{point}: {error}; meta-1 logged:\n{}",
                cluster.log("meta-1")
            );
        }
        let _ = moving.join();
        let (ok, out, err) = migrate(&cluster, &dir, "fast");
        assert!(ok, "{point}: migrate with the primary down: {err}");
        assert!(out.contains("2 files looked at"), "{point}: {out}");
        cluster.set_env("storage-1", &[]).expect("disarm");
        cluster.restart("storage-1").expect("restart");
        cluster.wait_ready().expect("ready again");
        weft_testkit::wait_until("the crashed members brought up to date", || {
            let (_, list, _) = ask(&cluster, &["mirror", "list"]);
            list.matches("(good)").count() == 6
        })
        .expect("resynced");
        stop.store(true, Ordering::Release);
        let written = write_thread.join().expect("writer");
        check_log(&log, written);
        let mut expected = data[..cut as usize].to_vec();
        assert!(
            fs::read(dir.join("data")).expect("read") == expected,
            "{point}: data holds what the truncate left"
        );
        OpenOptions::new()
            .write(true)
            .open(dir.join("data"))
            .expect("open")
            .set_len(data.len() as u64)
            .expect("grow");
        expected.resize(data.len(), 0);
        assert!(
            fs::read(dir.join("data")).expect("read") == expected,
            "{point}: zeros past the cut once the file grows"
        );
        for name in ["data", "log"] {
            let (group, info) = group_of(&cluster, &dir.join(name));
            assert_eq!(group, fast, "{point}: {name} moved: {info}");
        }
        let counts = mirrored_objects(&cluster, 3);
        for member in &members[0] {
            assert_eq!(
                counts[member], 0,
                "{point}: the old group's members keep nothing, the crashed one too: {counts:?}"
            );
        }
        assert_eq!(counts[&members[2][0]], 2, "{point}: {counts:?}");
        assert_eq!(counts[&members[2][1]], 2, "{point}: {counts:?}");
        fsck_clean(&cluster);
    }
}

// Goal: a mirrored file that moved off a group and back while one of the group's members was
// away can be written while that member catches up: the seal the member still holds from the
// first move (it missed its removal) does not refuse the changes its primary forwards, and the
// resync completes with the member's copy equal to the primary's. (The member refused the
// forwards as moved, forever: the change held the object's range, the resync waited for it,
// and the file's writes and truncates hung.) Method: three storage servers, two groups made
// by hand, one in pool `fast`; the file migrated to `fast` and back while the member's server
// is down; the resync held at its start (a test point) while a write, a truncate and an fsync
// go through the mount, and another file of the group is written throughout (the member takes
// its changes, so it is never reported failing); content compared, fsck (which compares the
// members' copies).
#[test]
fn a_mirrored_file_moved_back_while_a_member_was_away_takes_changes_during_its_resync() {
    let mut cluster = cluster(ClusterSpec {
        storage: 3,
        env: vec![(
            "storage-1".into(),
            "WEFT_FAILPOINTS".into(),
            "resync-waits-at-its-gate".into(),
        )],
        ..ClusterSpec::default()
    });
    let targets = targets_by_server(&cluster, 3);
    let (one, two, three) = (&targets[0], &targets[1], &targets[2]);
    // The file's group: primary on storage-1, member on storage-2; `fast` has neither server's
    // member in doubt once storage-2 is down.
    let members = [[one[0], two[0]], [three[0], one[1]]];
    make_groups(&cluster, &members);
    let groups = mirror_groups(&cluster);
    let (home, fast) = (
        pairs_group(&groups, &members[0]),
        pairs_group(&groups, &members[1]),
    );
    pool_of_group(&cluster, "fast", fast);
    let dir = mirrored_dir(&mut cluster, "project");
    let file = dir.join("data");
    let data = pattern(47, 300_000);
    fs::write(&file, &data).expect("write");
    assert_eq!(group_of(&cluster, &file).0, home);
    let (ok, out, err) = migrate(&cluster, &file, "fast");
    assert!(ok, "migrate to fast: {out}{err}");
    assert_eq!(group_of(&cluster, &file).0, fast);

    cluster.kill("storage-2").expect("kill storage-2");
    weft_testkit::wait_until("the member on storage-2 to leave its group", || {
        let (_, list, _) = ask(&cluster, &["mirror", "list"]);
        list.matches("(good)").count() == 3
    })
    .expect("member out");
    // Back home: the old seal goes from the primary (the member misses its removal), and the
    // file's object is copied onto the primary alone.
    let (ok, out, err) = migrate(&cluster, &file, "default");
    assert!(ok, "migrate back: {out}{err}");
    assert_eq!(group_of(&cluster, &file).0, home);

    // Changes of another file of the group reach the member throughout, as a busy group's do.
    let log = dir.join("log");
    let (stop, write_thread) = start_writer(&log);
    assert_eq!(group_of(&cluster, &log).0, home);

    let gate = target_homes(&cluster, 3)[&one[0]].1.join("resync-gate");
    fs::write(&gate, b"").expect("close the resync gate");
    let started = |cluster: &LocalCluster| {
        cluster
            .log("storage-1")
            .lines()
            .filter(|line| {
                line.contains("resync started") && line.contains(&format!("group={home} "))
            })
            .count()
    };
    let before = started(&cluster);
    cluster.restart("storage-2").expect("restart storage-2");
    weft_testkit::wait_until("the member's resync to start", || {
        started(&cluster) > before
    })
    .expect("resync started");

    let changing = {
        let file = file.clone();
        std::thread::spawn(move || -> std::io::Result<()> {
            // A truncate first, as the nemesis run's was: on the member it meets the seal.
            let mut handle = OpenOptions::new().write(true).open(&file)?;
            handle.set_len(200_000)?;
            std::io::Write::write_all(&mut handle, b"written during the resync")?;
            handle.sync_all()
        })
    };
    let finished = weft_testkit::wait_until("the changes during the resync to finish", || {
        changing.is_finished()
    });
    fs::remove_file(&gate).expect("open the resync gate");
    if let Err(error) = finished {
        panic!(
            "{error}; groups {}; storage-1 logged:\n{}",
            ask(&cluster, &["mirror", "list"]).1,
            cluster.log("storage-1")
        );
    }
    changing
        .join()
        .expect("thread")
        .expect("write, truncate, fsync");
    weft_testkit::wait_until("the member brought up to date", || {
        let (_, list, _) = ask(&cluster, &["mirror", "list"]);
        list.matches("(good)").count() == 4
    })
    .expect("resynced");
    let mut expected = data[..200_000].to_vec();
    expected[..25].copy_from_slice(b"written during the resync");
    assert!(
        fs::read(&file).expect("read") == expected,
        "the file holds its changes"
    );
    stop.store(true, Ordering::Release);
    let written = write_thread.join().expect("writer");
    check_log(&log, written);
    fsck_clean(&cluster);
}

// Goal: storage mirror groups emptied by drains go with their removed members (not while
// another member is out of date), and their other members serve again in a new group, where
// files that once lived on the old groups can move back: the seals the old groups left there
// do not refuse them, and no group id is given twice (the highest one went). Method: four
// storage servers, four groups made by hand; one member of each of two groups drained and
// removed, the first removal tried while the group's other member's server is down;
// `weft mirror autocreate storage` pairs the two members left; the tree is migrated onto the
// new group's pool, then restriped back over the two groups it left; content compared, fsck.
#[test]
fn members_of_emptied_groups_serve_again_in_a_new_group() {
    let mut cluster = cluster(ClusterSpec {
        storage: 4,
        ..ClusterSpec::default()
    });
    let targets = targets_by_server(&cluster, 4);
    let (s1, s2, s3, s4) = (&targets[0], &targets[1], &targets[2], &targets[3]);
    let pairs = [
        [s1[0], s2[0]],
        [s3[0], s4[0]],
        [s1[1], s3[1]],
        [s2[1], s4[1]],
    ];
    make_groups(&cluster, &pairs);
    let dir = mirrored_dir(&mut cluster, "project");
    let files: Vec<(String, Vec<u8>)> = (0..12u64)
        .map(|index| {
            let name = format!("f{index}");
            let data = pattern(70 + index, 150_000 * (index as usize + 1));
            fs::write(dir.join(&name), &data).expect("write");
            (name, data)
        })
        .collect();
    let expected: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(name, data)| (name.as_str(), data.as_slice()))
        .collect();

    for (index, drained) in [s2[0], s4[1]].into_iter().enumerate() {
        let drained = drained.to_string();
        let (ok, _, err) = ask(&cluster, &["target", "drain", &drained, "--wait"]);
        assert!(ok, "drain {drained}: {err}");
        if index == 0 {
            // The group's other member (on storage-1) misses what happens while it is down.
            cluster.kill("storage-1").expect("kill storage-1");
            weft_testkit::wait_until("storage-1's targets out of their groups", || {
                let (_, list, _) = ask(&cluster, &["mirror", "list"]);
                list.matches("(good)").count() == 6
            })
            .expect("members out");
            let (ok, _, err) = ask(&cluster, &["target", "remove", &drained]);
            assert!(
                !ok && err.contains(&format!("target {} of storage mirror group", s1[0])),
                "a group goes only with its other members good: {err}"
            );
            cluster.restart("storage-1").expect("restart storage-1");
            weft_testkit::wait_until("every member good again", || {
                let (_, list, _) = ask(&cluster, &["mirror", "list"]);
                list.matches("(good)").count() == 8
            })
            .expect("members back");
        }
        let (ok, _, err) = ask(&cluster, &["target", "remove", &drained]);
        assert!(ok, "remove {drained}: {err}");
    }
    let groups = mirror_groups(&cluster);
    assert_eq!(
        groups.len(),
        2,
        "two groups went with their members: {groups:?}"
    );
    holds(&dir, &expected);

    let out = common::autocreate_storage_groups(&cluster);
    let groups = mirror_groups(&cluster);
    let (new, members) = groups
        .iter()
        .find(|(_, members)| members.contains(&s1[0]))
        .unwrap_or_else(|| panic!("the members left are paired again: {out} {groups:?}"))
        .clone();
    assert!(members.contains(&s2[1]), "{groups:?}");
    assert!(
        new > 4,
        "a new group id, never one given before: {groups:?}"
    );
    weft_testkit::wait_until("the new group's members good", || {
        let (_, list, _) = ask(&cluster, &["mirror", "list"]);
        list.matches("(good)").count() == 6
    })
    .expect("new group formed");
    pool_of_group(&cluster, "again", new);
    let (ok, out, err) = migrate(&cluster, &dir, "again");
    assert!(ok, "migrate onto the new group: {err}");
    assert!(out.contains("12 files looked at: 12 moved"), "{out}");
    for (name, _) in &files {
        let (group, info) = group_of(&cluster, &dir.join(name));
        assert_eq!(group, new, "{name}: {info}");
    }
    holds(&dir, &expected);

    // Nobody holds the files open: the groups they left take them again, restriped over two.
    let (ok, out, err) = ask(
        &cluster,
        &[
            "entry",
            "migrate",
            &dir.display().to_string(),
            "--pool",
            "default",
            "--num-targets",
            "2",
            "--chunk-size",
            "128K",
        ],
    );
    assert!(ok, "restripe over two groups: {err}");
    assert!(out.contains("12 files looked at: 12 moved"), "{out}");
    let (_, info) = common::layout_targets(&cluster, &dir.join("f11"));
    assert!(
        info.contains(&format!("+ group {}", pairs_group(&groups, &pairs[1])))
            && info.contains(&format!("+ group {}", pairs_group(&groups, &pairs[2])))
            && info.contains("+ Chunksize: 128K"),
        "restriped over the default pool's two groups: {info}"
    );
    holds(&dir, &expected);
    fsck_clean(&cluster);
}

/// The id of the group whose members are `pair`.
fn pairs_group(groups: &[(u32, Vec<u32>)], pair: &[u32; 2]) -> u32 {
    groups
        .iter()
        .find(|(_, members)| members.contains(&pair[0]))
        .map(|(id, _)| *id)
        .expect("a group of the pair")
}

// Goal: a storage mirror group added to a pool fills by itself — background rebalancing moves
// mirrored files from the fullest groups (as full as their fullest member) until every group
// is within the margin of the mean — with no command beyond making the group, and every file
// keeps its data. Method: 64 MiB targets; two groups filled with 24 MiB of mirrored files
// through the mount; a third group made of the two targets left; the bytes in each member's
// tree of mirrored objects watched until they level out (the rebalancing rate is raised so
// the test does not wait on it); content compared; fsck.
#[test]
fn an_added_mirror_group_fills_by_itself_until_the_pool_is_level() {
    let capacity: u64 = 64 << 20;
    let mut cluster = cluster(ClusterSpec {
        storage: 3,
        target_capacity_bytes: Some(capacity),
        meta_settings: vec!["rebalance_bytes_per_second=1073741824".into()],
        ..ClusterSpec::default()
    });
    let targets = targets_by_server(&cluster, 3);
    let (s1, s2, s3) = (&targets[0], &targets[1], &targets[2]);
    make_groups(&cluster, &[[s1[0], s2[0]], [s2[1], s3[0]]]);
    let dir = mirrored_dir(&mut cluster, "data");
    let files: Vec<(PathBuf, Vec<u8>)> = (0..16u64)
        .map(|index| {
            let data = pattern(90 + index, 1536 << 10);
            let path = dir.join(format!("f{index}"));
            fs::write(&path, &data).expect("write");
            (path, data)
        })
        .collect();
    let bytes = |cluster: &LocalCluster| -> std::collections::BTreeMap<u32, u64> {
        mirrored_sizes(cluster, 3)
            .into_iter()
            .map(|(id, sizes)| (id, sizes.iter().sum()))
            .collect()
    };
    let before = bytes(&cluster);
    assert_eq!(
        (before[&s1[1]], before[&s3[1]]),
        (0, 0),
        "the targets left start empty: {before:?}"
    );

    let list = format!("{},{}", s1[1], s3[1]);
    let (ok, _, err) = ask(
        &cluster,
        &["mirror", "create", "storage", "--members", &list],
    );
    assert!(ok, "the new group: {err}");
    // Within the margin (5 % of a target's capacity) of the members' mean, and an object's
    // size for the step that may still be on its way.
    let slack = capacity * 5 / 100 + (1536 << 10);
    let mut last = std::collections::BTreeMap::new();
    let level = weft_testkit::wait_until("the groups to level out", || {
        last = bytes(&cluster);
        let mean = last.values().sum::<u64>() / last.len() as u64;
        last.values().all(|&b| b.abs_diff(mean) <= slack)
    });
    assert!(
        level.is_ok(),
        "the groups did not level out: {last:?} from {before:?}"
    );
    assert!(
        last[&s1[1]] > 0 && last[&s3[1]] > 0,
        "both members of the new group took data: {last:?}"
    );
    for (path, data) in &files {
        assert!(&fs::read(path).expect("read") == data, "{}", path.display());
    }
    fsck_clean(&cluster);
}

// Goal: `weft entry migrate` that finds the file's metadata server down waits for it and
// finishes the move once the server is back, rather than giving up at once (as it did when a
// nemesis fault met a restripe). Method: the file's attributes read (so the command finds the
// file), meta-1 killed, the command started, meta-1 started again a little later; the
// command's exit, its report, the file's layout and content.
#[test]
fn a_migrate_waits_for_its_metadata_server() {
    let (mut cluster, dir) = with_a_fast_pool();
    let data = pattern(13, 2 << 20);
    let file = dir.join("data");
    fs::write(&file, &data).expect("write");
    cluster.kill("meta-1").expect("kill meta-1");
    let moving = migrate_in_background(&cluster, &file, "fast", &[]);
    // Long enough for the command to meet the server down (it passes either way).
    std::thread::sleep(std::time::Duration::from_secs(3));
    cluster.restart("meta-1").expect("restart meta-1");
    let out = moving
        .join()
        .expect("migrate")
        .expect("weft entry migrate runs");
    assert!(
        out.status.success(),
        "migrate waited for the server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 files looked at: 1 moved"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    cluster.wait_ready().expect("ready");
    let (targets, info) = common::layout_targets(&cluster, &file);
    assert!(
        targets.iter().all(|t| [2, 4].contains(t)),
        "the file moved: {info}"
    );
    assert!(fs::read(&file).expect("read") == data);
}
