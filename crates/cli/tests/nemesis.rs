//! The nemesis: a randomized fault test. A cluster of separate processes, every one in a network
//! namespace of its own (management, two metadata servers mirrored, three storage servers with
//! two targets each, paired into three storage mirror groups), serves a mount on which a
//! workload writes, overwrites, truncates, punches, renames, deletes and reads back files in a
//! mirrored directory and in a plain (striped, unmirrored) one. It records each change only
//! after it returned, and after its fsync: every one is claimed durable. Meanwhile the nemesis
//! kills one server at a time with SIGKILL and starts it again, or cuts one off the network
//! and reconnects it, and waits until every mirror member is good again before the next fault;
//! between faults it restripes the plain directory's files, or the mirrored directory's (from
//! group to group), into another chunk size and width (`weft entry migrate`), in the
//! background, so moves run through the faults. In the replayed variant the metadata servers
//! are not mirrored and answer changes before their sync: a killed one gets back from the
//! mount what it lost.
//! Storage runs in crash-test mode, so a kill loses every write not synced, as a power loss
//! would. Every read checks the bytes it got against the record; at the end every recorded file
//! must hold exactly its bytes (through the mount, and through a new mount), nothing deleted is
//! back, and `weft fsck` is clean.
//!
//! A plain file has one copy: when its server restarts between a write and its fsync, the
//! write may be lost and the fsync says so (EIO, as after a failed fdatasync). The workload
//! then takes the file for unknown until it writes it whole again; that is the only error
//! allowed. A mirrored file never errs with a single fault.
//!
//! `nemesis_bounded` runs in CI for a minute of faults. `scripts/nemesis.sh --minutes N --seed S`
//! runs `nemesis_long`; the workload's choices follow the seed (the faults' timing follows the
//! machine), and every run prints its seed.

mod common;

use common::weft;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_sim::Random;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

/// Files per directory the workload works on.
const FILES: u64 = 8;
/// Largest file the workload writes.
const FILE_BYTES_MAX: u64 = 384 * 1024;

/// The workload's and the nemesis's choices.
struct Rng(Random);

impl Rng {
    /// A number in `0..bound`.
    fn below(&mut self, bound: u64) -> u64 {
        self.0.between(0, bound - 1)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let seed = self.0.next_u64();
        common::pattern(seed, len)
    }
}

/// What the workload did and what it expects the files to hold.
#[derive(Default)]
struct Record {
    /// Files and the bytes each must hold.
    files: BTreeMap<PathBuf, Vec<u8>>,
    /// Names removed (or renamed away) and not made again: they must not exist.
    gone: BTreeSet<PathBuf>,
    /// Plain files whose last change failed with EIO after their server restarted: their
    /// bytes are unknown until they are written whole again.
    unknown: BTreeSet<PathBuf>,
    /// Changes and reads that returned.
    operations: u64,
    /// Reads whose bytes were checked.
    reads: u64,
    /// Changes of plain files that failed with EIO, the loss a restart may cause.
    lost_claims: u64,
    /// The longest any operation took: the longest pause an application saw.
    longest: Duration,
}

impl Record {
    fn forget(&mut self, path: &Path) {
        self.files.remove(path);
        self.unknown.remove(path);
        self.gone.insert(path.to_path_buf());
    }

    fn set(&mut self, path: &Path, data: Vec<u8>) {
        self.gone.remove(path);
        self.unknown.remove(path);
        self.files.insert(path.to_path_buf(), data);
    }
}

/// The workload: random changes and checked reads in `dirs` (mirrored first, then plain)
/// until `stop`. An error other than the one a plain file may give ends it.
fn workload(dirs: &[PathBuf; 2], seed: u64, stop: &AtomicBool) -> Result<Record, String> {
    let mut rng = Rng(Random::new(seed));
    let mut record = Record::default();
    while !stop.load(Ordering::Relaxed) {
        let plain = rng.below(2) == 1;
        let dir = &dirs[usize::from(plain)];
        let path = dir.join(format!("f{}", rng.below(FILES)));
        let other = dir.join(format!("f{}", rng.below(FILES)));
        let exists = record.files.contains_key(&path);
        // A file whose bytes are unknown, or that does not exist, is written whole first.
        let choice = if exists { rng.below(100) } else { 0 };
        let started = Instant::now();
        let what: String;
        let result: std::io::Result<()> = match choice {
            0..=19 => {
                let len = rng.below(FILE_BYTES_MAX) as usize;
                let data = rng.bytes(len);
                what = format!("write {} bytes to {}", data.len(), path.display());
                write_whole(&path, &data).map(|()| record.set(&path, data))
            }
            20..=44 => {
                let offset = rng.below(FILE_BYTES_MAX);
                let len = 1 + rng.below(128 * 1024) as usize;
                let data = rng.bytes(len);
                what = format!(
                    "write {} bytes at {offset} of {}",
                    data.len(),
                    path.display()
                );
                write_at(&path, offset, &data).map(|()| {
                    let file = record.files.get_mut(&path).expect("recorded");
                    let end = offset as usize + data.len();
                    if file.len() < end {
                        file.resize(end, 0);
                    }
                    file[offset as usize..end].copy_from_slice(&data);
                })
            }
            45..=54 => {
                let size = rng.below(FILE_BYTES_MAX);
                what = format!("truncate {} to {size}", path.display());
                truncate(&path, size).map(|()| {
                    record
                        .files
                        .get_mut(&path)
                        .expect("recorded")
                        .resize(size as usize, 0);
                })
            }
            55..=64 => {
                let offset = rng.below(FILE_BYTES_MAX);
                let len = 1 + rng.below(128 * 1024);
                what = format!("punch {len} bytes at {offset} of {}", path.display());
                punch(&path, offset, len).map(|()| {
                    let file = record.files.get_mut(&path).expect("recorded");
                    let start = (offset as usize).min(file.len());
                    let end = ((offset + len) as usize).min(file.len());
                    file[start..end].fill(0);
                })
            }
            65..=74 => {
                what = format!("rename {} to {}", path.display(), other.display());
                std::fs::rename(&path, &other).map(|()| {
                    if path != other {
                        let data = record.files.remove(&path).expect("recorded");
                        record.forget(&path);
                        record.set(&other, data);
                    }
                })
            }
            75..=81 => {
                what = format!("unlink {}", path.display());
                std::fs::remove_file(&path).map(|()| record.forget(&path))
            }
            _ => {
                what = format!("read {}", path.display());
                let read = std::fs::read(&path);
                if let Ok(bytes) = &read {
                    let expected = &record.files[&path];
                    if bytes != expected {
                        return Err(format!(
                            "read {}: {} bytes, expected {}; first difference at {:?}",
                            path.display(),
                            bytes.len(),
                            expected.len(),
                            bytes.iter().zip(expected).position(|(a, b)| a != b)
                        ));
                    }
                    record.reads += 1;
                }
                read.map(|_| ())
            }
        };
        let took = started.elapsed();
        if took > record.longest && took > SLOW_OPERATION {
            // Named, so that a long pause can be matched with the fault before it in the log.
            eprintln!("nemesis workload: {what} took {took:?}, the longest pause yet");
        }
        record.longest = record.longest.max(took);
        match result {
            Ok(()) => record.operations += 1,
            Err(error) if plain && error.raw_os_error() == Some(libc::EIO) => {
                eprintln!("nemesis workload: {what}: {error} (a plain file's server restarted)");
                record.lost_claims += 1;
                // The file may exist with bytes lost even if it was not recorded yet (its
                // first write failed).
                record.files.remove(&path);
                record.gone.remove(&path);
                record.unknown.insert(path.clone());
                if record.files.remove(&other).is_some() {
                    record.unknown.insert(other.clone());
                }
            }
            Err(error) => return Err(format!("{what}: {error}")),
        }
    }
    Ok(record)
}

fn write_whole(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(data)?;
    file.sync_all()
}

fn write_at(path: &Path, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(data)?;
    file.sync_all()
}

fn truncate(path: &Path, size: u64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.set_len(size)?;
    file.sync_all()
}

fn punch(path: &Path, offset: u64, len: u64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    // SAFETY: fallocate on a descriptor this function owns.
    let result = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    file.sync_all()
}

/// Whether every member of every mirror group, storage and metadata, is good.
fn all_good(cluster: &LocalCluster) -> bool {
    let (ok, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    ok && list.lines().skip(1).all(|line| {
        line.split('(')
            .skip(1)
            .filter_map(|part| part.split(')').next())
            .filter(|word| !word.starts_with("meta-") && !word.starts_with("storage-"))
            .all(|state| state == "good")
    })
}

/// One fault, then the repair: a server killed and started again, or cut off the network and
/// reconnected. Returns what was done.
fn fault(cluster: &mut LocalCluster, rng: &mut Rng) -> String {
    const SERVERS: [&str; 5] = ["meta-1", "meta-2", "storage-1", "storage-2", "storage-3"];
    let server = SERVERS[rng.below(SERVERS.len() as u64) as usize];
    let down = Duration::from_millis(500 + rng.below(5000));
    let what = if rng.below(2) == 0 {
        cluster.kill(server).expect("kill");
        std::thread::sleep(down);
        cluster.restart(server).expect("restart");
        format!("killed {server}, restarted after {down:?}")
    } else {
        cluster.set_link(server, false).expect("cut");
        std::thread::sleep(down);
        cluster.set_link(server, true).expect("reconnect");
        format!("cut {server} off for {down:?}")
    };
    if let Err(error) = wait_until(&format!("every mirror member good after: {what}"), || {
        all_good(cluster)
    }) {
        // What the groups are at, and what their servers say of them: the end of each log
        // is printed as the cluster drops, but a stuck group shows best here.
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        let (_, status, _) = weft(cluster, &["cluster", "status", "--mgmt", cluster.mgmt()]);
        panic!("the cluster recovers: {error}\nmirror list:\n{list}\ncluster status:\n{status}");
    }
    what
}

/// The patterns the nemesis restripes the plain directory into, in turn: chunk size and width.
const RESTRIPES: [(&str, &str); 3] = [("128K", "2"), ("64K", "1"), ("256K", "2")];

/// The patterns it restripes the mirrored directory into, in turn (over the three groups: a
/// file is restriped onto groups it was never on, or left once nobody held it open).
const MIRRORED_RESTRIPES: [(&str, &str); 2] = [("128K", "2"), ("64K", "1")];

/// Starts `weft entry migrate DIR` of the plain directory (`dirs[1]`) into the next of
/// [`RESTRIPES`], or of the mirrored one (`dirs[0]`) into the next of [`MIRRORED_RESTRIPES`],
/// in turn, in the background, unless the last one still runs; returns what it started, if
/// anything.
fn restripe(
    cluster: &LocalCluster,
    dirs: &[PathBuf; 2],
    running: &mut Option<std::process::Child>,
    next: &mut usize,
) -> Option<String> {
    if let Some(child) = running {
        match child.try_wait() {
            Ok(None) => return None,
            _ => *running = None,
        }
    }
    let (dir, what, (chunk, width)) = match *next % 2 {
        0 => (&dirs[1], "plain", RESTRIPES[*next / 2 % RESTRIPES.len()]),
        _ => (
            &dirs[0],
            "mirrored",
            MIRRORED_RESTRIPES[*next / 2 % MIRRORED_RESTRIPES.len()],
        ),
    };
    *next += 1;
    let log = std::fs::File::create(restripe_log(cluster, *next)).expect("a restripe's log");
    let child = std::process::Command::new(common::binary())
        .args(["entry", "migrate"])
        .arg(dir)
        .args(["--chunk-size", chunk, "--num-targets", width])
        .args(["--mgmt", cluster.mgmt()])
        .env("WEFT_KEY_FILE", cluster.key_file())
        .env("WEFT_LOG", "warn")
        .stdout(log.try_clone().expect("the log again"))
        .stderr(log)
        .spawn()
        .expect("weft entry migrate starts");
    *running = Some(child);
    Some(format!(
        "restriping the {what} files into {chunk} chunks over {width}"
    ))
}

/// The last lines of the metadata servers' logs about moves that wait or were given up.
fn moves_waiting(cluster: &LocalCluster) -> String {
    let mut lines = Vec::new();
    for meta in ["meta-1", "meta-2"] {
        let log = cluster.log(meta);
        let about: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("a move waits") || line.contains("a move was given up"))
            .collect();
        lines.extend(
            about[about.len().saturating_sub(5)..]
                .iter()
                .map(|line| format!("{meta}: {line}")),
        );
    }
    lines.join("\n")
}

/// Where the output of restripe `number` goes.
fn restripe_log(cluster: &LocalCluster, number: usize) -> PathBuf {
    cluster.root().join(format!("logs/restripe-{number}.log"))
}

/// Files the restripes moved, as their logs say ("N files looked at: M moved"): of the plain
/// directory (odd runs), and of the mirrored one (even runs).
fn restriped(cluster: &LocalCluster, count: usize) -> (u64, u64) {
    let moved = |mirrored: bool| -> u64 {
        (1..=count)
            .filter(|number| (number % 2 == 0) == mirrored)
            .filter_map(|number| std::fs::read_to_string(restripe_log(cluster, number)).ok())
            .map(|log| moved_in(&log))
            .sum()
    };
    (moved(false), moved(true))
}

/// The files a restripe's log says it moved.
fn moved_in(log: &str) -> u64 {
    log.lines()
        .filter_map(|line| {
            let (_, moved) = line.split_once(" files looked at: ")?;
            moved.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// How the metadata servers of a nemesis run keep what they answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meta {
    /// Mirrored in one group, each change answered once on both members' disks.
    Mirrored,
    /// Not mirrored, each answering changes before their sync, which the mount replays
    /// after a restart (crash-consistency.md, "Durability by replay").
    Replayed,
}

/// Runs the workload against faults for `run`, then checks everything it recorded.
fn nemesis(run: Duration, seed: u64, meta: Meta) {
    eprintln!("nemesis: seed {seed}, {run:?} of faults, metadata {meta:?}");
    let mut cluster = common::cluster(ClusterSpec {
        meta: 2,
        storage: 3,
        targets_per_storage: 2,
        crash_test: true,
        netns: true,
        meta_settings: match meta {
            Meta::Mirrored => Vec::new(),
            Meta::Replayed => vec!["sync_every_change=false".into()],
        },
        ..ClusterSpec::default()
    });
    common::autocreate_storage_groups(&cluster);
    if meta == Meta::Mirrored {
        common::autocreate_meta_groups(&cluster);
    }
    let mnt = cluster.mount().expect("mount");
    let dirs = [mnt.join("mirrored"), mnt.join("plain")];
    // Over one of the three groups, so its restripes find groups to go to.
    common::make_mirrored_dir(
        &cluster,
        &dirs[0],
        &["--num-targets", "1", "--chunk-size", "64K"],
    );
    common::make_dir_with_pattern(
        &cluster,
        &dirs[1],
        &["--num-targets", "4", "--chunk-size", "64K"],
    );

    // A restricted client works beside the member mount: a root-squashed mount, whose root
    // acts as nobody, in directories of its own, under a quota of nobody's that is counted
    // (and checked by fsck) but never reached.
    let scratch = tempfile::tempdir().expect("tempdir");
    let squash = squashed_mount(&mut cluster, scratch.path(), &mnt);
    let squashed_dirs = dirs.clone().map(|dir| {
        let own = dir.join("squashed");
        std::fs::create_dir(&own).expect("mkdir");
        std::fs::set_permissions(&own, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
        squash.join(own.strip_prefix(&mnt).expect("in the mount"))
    });

    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(std::sync::Barrier::new(3));
    let start_worker = |dirs: [PathBuf; 2], seed: u64| {
        let (stop, ready) = (Arc::clone(&stop), Arc::clone(&ready));
        std::thread::spawn(move || {
            // The processes this test starts must not carry the workload's open files.
            common::private_file_table();
            ready.wait();
            workload(&dirs, seed, &stop)
        })
    };
    let worker = start_worker(dirs.clone(), seed);
    let squashed_worker = start_worker(squashed_dirs, seed ^ 0x0051_5541_5348);
    ready.wait();
    let mut rng = Rng(Random::new(seed ^ 0x006e_656d_6573_6973));
    let started = Instant::now();
    let mut faults = Vec::new();
    let (mut restriping, mut restripes) = (None, 0);
    while started.elapsed() < run && !worker.is_finished() && !squashed_worker.is_finished() {
        std::thread::sleep(Duration::from_millis(500 + rng.below(3000)));
        if rng.below(2) == 0 {
            if let Some(what) = restripe(&cluster, &dirs, &mut restriping, &mut restripes) {
                eprintln!(
                    "[{:>6.1} s] nemesis: {what}",
                    started.elapsed().as_secs_f64()
                );
            }
        }
        let what = fault(&mut cluster, &mut rng);
        eprintln!(
            "[{:>6.1} s] nemesis: {what}",
            started.elapsed().as_secs_f64()
        );
        faults.push(what);
    }
    stop.store(true, Ordering::Relaxed);
    // A restripe still running finishes: with every server up, nothing stops it.
    if let Some(mut child) = restriping {
        let deadline = Instant::now() + Duration::from_secs(300);
        while child.try_wait().expect("wait for migrate").is_none() {
            assert!(
                Instant::now() < deadline,
                "seed {seed}: a restripe did not finish in 5 minutes with every server up; \
                 the metadata servers' last words on moves:\n{}",
                moves_waiting(&cluster)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let record = worker
        .join()
        .expect("workload thread")
        .unwrap_or_else(|error| panic!("seed {seed}: the workload failed: {error}"));
    let squashed = squashed_worker
        .join()
        .expect("workload thread")
        .unwrap_or_else(|error| {
            panic!("seed {seed}: the root-squashed client's workload failed: {error}")
        });
    // A plain file whose change was lost to a restart (its fsync said so) may lack an object
    // its data was written to, which fsck rightly reports as lost data: it goes, as an
    // application told of the loss would write it again or remove it.
    for path in record.unknown.iter().chain(&squashed.unknown) {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => panic!("seed {seed}: remove {}: {error}", path.display()),
        }
    }

    let check_one = |record: &Record, of: &Path, root: &Path, through: &str| {
        let mut differences = Vec::new();
        for (path, expected) in &record.files {
            let path = root.join(path.strip_prefix(of).expect("in the mount"));
            match std::fs::File::open(&path).and_then(|mut file| {
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).map(|_| bytes)
            }) {
                Ok(bytes) if bytes == *expected => {}
                Ok(bytes) => differences.push(format!(
                    "{}: {} bytes, expected {}",
                    path.display(),
                    bytes.len(),
                    expected.len()
                )),
                Err(error) => differences.push(format!("{}: {error}", path.display())),
            }
        }
        for path in &record.gone {
            let path = root.join(path.strip_prefix(of).expect("in the mount"));
            if path.exists() {
                differences.push(format!("{} is back after its removal", path.display()));
            }
        }
        assert!(
            differences.is_empty(),
            "seed {seed}, through {through}: {} differences: {differences:#?}",
            differences.len()
        );
    };
    let check = |root: &Path, through: &str| {
        check_one(&record, &mnt, root, through);
        check_one(
            &squashed,
            &squash,
            root,
            &format!("{through} (the squashed client's files)"),
        );
    };
    check(&mnt, "the mount");
    let fresh = cluster.mount().expect("a new mount");
    check(&fresh, "a new mount");
    common::fsck_clean(&cluster);
    let (_, quotas, _) = weft(&cluster, &["quota", "list", "--mgmt", cluster.mgmt()]);
    eprintln!("nemesis: seed {seed}: quotas at the end:\n{quotas}");
    let (plain, mirrored) = restriped(&cluster, restripes);
    eprintln!(
        "nemesis: seed {seed}: {} operations ({} checked reads, {} of them by the root-squashed \
         client), {} faults, longest pause {:?}, \
         {} changes of plain files lost to a restart (EIO), {} plain and {} mirrored files \
         restriped in {restripes} runs, {} files checked, 0 differences",
        record.operations + squashed.operations,
        record.reads + squashed.reads,
        squashed.operations,
        faults.len(),
        record.longest.max(squashed.longest),
        record.lost_claims + squashed.lost_claims,
        plain,
        mirrored,
        record.files.len() + squashed.files.len()
    );
}

/// Mounts the cluster with the key of a root-squashed client made in `dir`, once the metadata
/// servers squash it, under a quota of nobody's (user 65534) that is counted but never
/// reached; `member` is a member mount.
fn squashed_mount(cluster: &mut LocalCluster, dir: &Path, member: &Path) -> PathBuf {
    let key = common::client_key(cluster, dir, "squashed");
    common::set_rule(cluster, &["squashed", "--root-squash"]);
    common::set_quota(
        cluster,
        &[
            "--user",
            "65534",
            "--hard-bytes",
            "64G",
            "--hard-inodes",
            "1000000",
        ],
    );
    // Synced: storage runs in crash-test mode, and a kill would take unsynced bytes.
    let mut only = std::fs::File::create(member.join("root-only")).expect("create");
    only.write_all(b"root's").expect("write");
    only.sync_all().expect("fsync");
    drop(only);
    std::fs::set_permissions(
        member.join("root-only"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let setting = format!("auth_key_file={:?}", key.display().to_string());
    let squash = cluster.mount_with(&[&setting]).expect("mount as squashed");
    wait_until("the servers to squash the client", || {
        std::fs::read(squash.join("root-only")).is_err()
    })
    .expect("root squash applies");
    squash
}

/// An operation slower than this is named in the log when it is the slowest yet.
const SLOW_OPERATION: Duration = Duration::from_secs(10);

/// The seed from `WEFT_NEMESIS_SEED`, or a new one.
fn seed() -> u64 {
    std::env::var("WEFT_NEMESIS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |since| since.as_nanos() as u64)
        })
}

// Goal: no acknowledged byte is lost or corrupted, and nothing removed comes back, while
// servers crash and drop off the network one at a time (see the module's comment). Method: a
// minute of random faults under the random workload, then every record checked.
#[test]
fn nemesis_bounded() {
    nemesis(Duration::from_secs(60), seed(), Meta::Mirrored);
}

// The same with metadata servers that answer before the sync and are killed with the changes
// their mount keeps: nothing they acknowledged is lost (crash-consistency.md, "Durability by
// replay", guarantee 1, under the nemesis).
#[test]
fn nemesis_bounded_replayed() {
    nemesis(Duration::from_secs(60), seed(), Meta::Replayed);
}

// The same for `WEFT_NEMESIS_MINUTES` minutes (`scripts/nemesis.sh`).
#[test]
#[ignore = "long: run by scripts/nemesis.sh"]
fn nemesis_long() {
    let minutes: u64 = std::env::var("WEFT_NEMESIS_MINUTES")
        .ok()
        .and_then(|minutes| minutes.parse().ok())
        .unwrap_or(30);
    let meta = match std::env::var("WEFT_NEMESIS_META").as_deref() {
        Ok("replayed") => Meta::Replayed,
        _ => Meta::Mirrored,
    };
    nemesis(Duration::from_secs(minutes * 60), seed(), meta);
}
