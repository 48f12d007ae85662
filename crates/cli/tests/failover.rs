//! Mirror failover under load: every service in a network namespace of its own (management,
//! two metadata servers, three storage servers with two targets each, paired into three
//! storage mirror groups and the metadata servers into one), while fio `--verify` and a metadata workload run through the mount.

mod common;

use common::{cluster, weft};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

/// One group as `weft mirror list` shows it: the primary first, each member with its state.
#[derive(Debug)]
struct Group {
    members: Vec<(u32, String)>,
}

impl Group {
    fn primary(&self) -> u32 {
        self.members[0].0
    }
}

fn groups(cluster: &LocalCluster) -> BTreeMap<u32, Group> {
    let (ok, out, err) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{err}");
    let mut groups = BTreeMap::new();
    for line in out
        .lines()
        .skip(1)
        .filter(|line| line.contains(" storage "))
    {
        let Some(id) = line.split_whitespace().next().and_then(|w| w.parse().ok()) else {
            continue;
        };
        let members = line
            .split("target ")
            .skip(1)
            .map(|part| {
                let target = part
                    .split_whitespace()
                    .next()
                    .and_then(|w| w.parse().ok())
                    .expect("target id");
                let state = part
                    .split('(')
                    .nth(1)
                    .and_then(|rest| rest.split(')').next())
                    .expect("state")
                    .to_string();
                (target, state)
            })
            .collect();
        groups.insert(id, Group { members });
    }
    groups
}

fn all_good(cluster: &LocalCluster) -> bool {
    groups(cluster)
        .values()
        .all(|g| g.members.iter().all(|(_, state)| state == "good"))
}

fn state_of(cluster: &LocalCluster, target: u32) -> String {
    groups(cluster)
        .values()
        .flat_map(|g| g.members.iter())
        .find(|(t, _)| *t == target)
        .map(|(_, state)| state.clone())
        .expect("target in a group")
}

/// The alias of the metadata group's primary (listed first).
fn meta_primary(cluster: &LocalCluster) -> String {
    let line = common::meta_group_line(cluster);
    ["meta-1", "meta-2"]
        .into_iter()
        .min_by_key(|alias| line.find(alias).unwrap_or(usize::MAX))
        .expect("two aliases")
        .to_string()
}

/// Targets were registered in start order: storage-N holds targets 2N-1 and 2N.
fn server_of(target: u32) -> String {
    format!("storage-{}", (target - 1) / 2 + 1)
}

fn target_dir(cluster: &LocalCluster, target: u32) -> PathBuf {
    cluster.target_dir(
        ((target - 1) / 2 + 1) as usize,
        ((target - 1) % 2 + 1) as usize,
    )
}

fn assert_groups_identical(cluster: &LocalCluster, what: &str) {
    for (id, group) in groups(cluster) {
        let copies: Vec<_> = group
            .members
            .iter()
            .map(|(target, _)| common::mirrored_objects(&target_dir(cluster, *target)))
            .collect();
        for copy in &copies[1..] {
            assert_eq!(
                copies[0].keys().collect::<Vec<_>>(),
                copy.keys().collect::<Vec<_>>(),
                "{what}: the members of group {id} hold the same objects"
            );
            for (name, data) in &copies[0] {
                assert!(
                    copy[name] == *data,
                    "{what}: object {name} differs between the members of group {id}"
                );
            }
        }
    }
}

/// fio's arguments for job `index` in `dir`: 16 MiB written in 128 KiB blocks, verified.
fn fio_args(dir: &Path, index: usize) -> Vec<String> {
    [
        format!("--name=verify-{index}"),
        format!("--directory={}", dir.display()),
        "--rw=write".into(),
        "--bs=128k".into(),
        "--size=16M".into(),
        "--ioengine=psync".into(),
        "--direct=1".into(),
        "--verify=crc32c".into(),
        "--verify_fatal=1".into(),
        // No verify state files left in the working directory when a job stops.
        "--verify_state_save=0".into(),
    ]
    .into()
}

/// Background I/O through the mount until stopped: fio jobs that write and verify, and a
/// namespace workload of create, write, fsync, rename and unlink. Each returns what it did.
struct Workload {
    stop: Arc<AtomicBool>,
    fio: JoinHandle<Result<usize, String>>,
    meta: JoinHandle<Result<BTreeMap<String, Vec<u8>>, String>>,
}

impl Workload {
    fn start(data: PathBuf, names: PathBuf) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        // Both threads take a private descriptor table before this returns: one taken later
        // would copy the pipes of a CLI call the test thread is making, and that call would
        // wait for their other ends until the thread ends.
        let ready = Arc::new(std::sync::Barrier::new(3));
        let fio = {
            let stop = Arc::clone(&stop);
            let ready = Arc::clone(&ready);
            std::thread::spawn(move || {
                common::private_file_table();
                ready.wait();
                let mut jobs = 0;
                while !stop.load(Ordering::Relaxed) && jobs < 500 {
                    let output = Command::new("fio")
                        .args(fio_args(&data, jobs))
                        .output()
                        .map_err(|e| format!("fio: {e}"))?;
                    if !output.status.success() {
                        return Err(format!(
                            "fio job {jobs} failed: {}{}",
                            String::from_utf8_lossy(&output.stdout),
                            String::from_utf8_lossy(&output.stderr)
                        ));
                    }
                    jobs += 1;
                }
                Ok(jobs)
            })
        };
        let meta = {
            let stop = Arc::clone(&stop);
            let ready = Arc::clone(&ready);
            std::thread::spawn(move || {
                use std::io::Write;
                // The CLI calls of the test thread must not carry this thread's open files.
                common::private_file_table();
                ready.wait();
                let mut kept = BTreeMap::new();
                let mut index = 0u64;
                while !stop.load(Ordering::Relaxed) && index < 100_000 {
                    let mut step = || -> std::io::Result<()> {
                        let data = common::pattern(index, 4096 + (index as usize % 7) * 1000);
                        let fresh = names.join(format!("new-{index}"));
                        let mut attempts = 0;
                        loop {
                            let mut file = std::fs::File::create(&fresh)?;
                            file.write_all(&data)?;
                            match file.sync_all() {
                                Ok(()) => break,
                                // Every copy of a group crashed between the write and the
                                // fsync (step 4 kills a primary whose member is out): the
                                // write may be lost and fsync says so. Write it again.
                                Err(error)
                                    if error.raw_os_error() == Some(libc::EIO) && attempts < 3 =>
                                {
                                    attempts += 1;
                                }
                                Err(error) => return Err(error),
                            }
                        }
                        let kept_name = format!("file-{index}");
                        std::fs::rename(&fresh, names.join(&kept_name))?;
                        kept.insert(kept_name, data);
                        if index % 3 == 2 {
                            let gone = format!("file-{}", index - 1);
                            std::fs::remove_file(names.join(&gone))?;
                            kept.remove(&gone);
                        }
                        Ok(())
                    };
                    step().map_err(|e| format!("metadata workload step {index}: {e}"))?;
                    index += 1;
                }
                Ok(kept)
            })
        };
        ready.wait();
        Workload { stop, fio, meta }
    }

    fn finish(self) -> (usize, BTreeMap<String, Vec<u8>>) {
        self.stop.store(true, Ordering::Relaxed);
        let jobs = self.fio.join().expect("fio thread").expect("fio verified");
        let kept = self
            .meta
            .join()
            .expect("meta thread")
            .expect("metadata workload");
        (jobs, kept)
    }
}

// Goal: with storage and metadata mirroring, a cluster keeps serving through the loss of servers and an
// application sees pauses, never errors: fio `--verify` and a create/rename/unlink workload
// run through the mount while
// 1. a storage server is killed (kill -9) and restarted;
// 2. the primary metadata server is killed and restarted, then the new one is cut off the
//    network and reconnected (the namespace is mirrored: its copy takes over each time), then
//    the copy is cut off and reconnected (it gets only what it missed);
// 3. a storage server holding only secondaries is cut off the network and reconnected (its
//    members then get only what they missed), then one holding primaries;
// 4. a group's primary is killed while its returning member needs a resync: the group waits
//    for the primary instead of promoting the stale member.
// After each, the returned members resync to good; at the end the members of every group hold
// identical objects (compared on disk), and a fresh mount verifies every fio file and every
// kept file.
#[test]
fn mirrored_cluster_survives_server_loss_under_load() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        storage: 3,
        targets_per_storage: 2,
        netns: true,
        ..ClusterSpec::default()
    });
    let mgmt = cluster.mgmt().to_string();
    let out = common::autocreate_storage_groups(&cluster);
    assert_eq!(
        groups(&cluster).len(),
        3,
        "three groups across three servers:\n{out}"
    );
    // The namespace is mirrored too: meta-2 keeps a copy of meta-1's home.
    common::autocreate_meta_groups(&cluster);
    // The faults start from a healthy cluster: a member still being copied when its primary
    // is killed leaves its group waiting for that primary, not failing over.
    wait_until("every member good before the faults", || all_good(&cluster))
        .expect("groups formed");
    let mnt = cluster.mount().expect("mount");
    let data = mnt.join("data");
    let names = mnt.join("names");
    for dir in [&data, &names] {
        common::make_mirrored_dir(&cluster, dir, &["--num-targets", "3"]);
    }
    let workload = Workload::start(data.clone(), names.clone());
    let started = std::time::Instant::now();
    let note = |what: &str| eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());

    note("killing a storage server");
    // 1. A storage server dies and comes back.
    cluster.kill("storage-1").expect("kill storage-1");
    wait_until("storage-1's targets to leave their groups", || {
        state_of(&cluster, 1) == "bad" && state_of(&cluster, 2) == "bad"
    })
    .expect("failover");
    cluster.restart("storage-1").expect("restart storage-1");
    wait_until("every member good after storage-1 returned", || {
        all_good(&cluster)
    })
    .expect("resync");

    note("killing the primary metadata server");
    // 2. The primary metadata server dies: its copy takes over; it comes back as a copy.
    common::fail_meta_1_over(&mut cluster);
    cluster.restart("meta-1").expect("restart meta-1");
    common::wait_meta_member_good(&cluster, "meta-1");

    note("cutting the primary metadata server off the network");
    // Cut off, meta-2 loses its lease and stops serving; meta-1 takes over. Reconnected,
    // meta-2 learns it is a copy now and gets the namespace again.
    cluster.set_link("meta-2", false).expect("cut meta-2");
    wait_until("meta-1 to take over the namespace", || {
        meta_primary(&cluster) == "meta-1"
    })
    .expect("metadata failover");
    cluster.set_link("meta-2", true).expect("reconnect meta-2");
    common::wait_meta_member_good(&cluster, "meta-2");

    note("cutting the metadata copy off the network");
    // A copy cut off leaves its group in sync and comes back without a restart: it gets only
    // the extents of the store that changed meanwhile.
    // How often meta-1 has logged `text`.
    let logged = |cluster: &LocalCluster, text: &str| cluster.log("meta-1").matches(text).count();
    let full_copies = |cluster: &LocalCluster| logged(cluster, "metadata resync started");
    let records =
        |cluster: &LocalCluster| logged(cluster, "recording what an absent mirror member misses");
    let full_before = full_copies(&cluster);
    let records_before = records(&cluster);
    cluster.set_link("meta-2", false).expect("cut meta-2");
    wait_until("meta-2 to leave the metadata group", || {
        common::meta_group_line(&cluster).contains("(meta-2) (bad)")
    })
    .expect("copy out");
    // The primary learns that its copy left from its next heartbeat answer and records what
    // the copy misses from then on; a copy back before that (a cut shorter than a heartbeat
    // round after management noticed it) is copied in full, which is safe. A real outage
    // outlasts that round: the test waits for the record to start.
    wait_until("meta-1 to record what meta-2 misses", || {
        records(&cluster) > records_before
    })
    .expect("record started");
    cluster.set_link("meta-2", true).expect("reconnect meta-2");
    common::wait_meta_member_good(&cluster, "meta-2");
    // A resync starts again under each new version, so it may run more than once; it is never
    // a full copy.
    assert!(
        cluster
            .log("meta-1")
            .contains("metadata resync of what the member missed started"),
        "the returning copy got what it missed"
    );
    assert_eq!(
        full_copies(&cluster),
        full_before,
        "the returning copy got no full copy"
    );

    note("cutting a storage server with secondaries only off the network");
    // 3. A storage server is cut off the network, then reconnected. First one that holds no
    // primary (storage-1 since its failover): its members left in sync and come back without
    // a restart, so their primaries copy only what they missed.
    let primaries: Vec<u32> = groups(&cluster).values().map(Group::primary).collect();
    let quiet = (1..=3)
        .map(|n| format!("storage-{n}"))
        .find(|server| {
            !primaries
                .iter()
                .any(|primary| server_of(*primary) == *server)
        })
        .expect("a server with secondaries only");
    let quiet_targets: Vec<u32> = (1..=6).filter(|t| server_of(*t) == quiet).collect();
    // How often the storage servers have logged `text`, together.
    let storage_logged = |cluster: &LocalCluster, text: &str| -> usize {
        (1..=3)
            .map(|n| cluster.log(&format!("storage-{n}")).matches(text).count())
            .sum()
    };
    let storage_records = |cluster: &LocalCluster| {
        storage_logged(cluster, "recording what an absent mirror member misses")
    };
    let storage_full = |cluster: &LocalCluster| storage_logged(cluster, "resync copied group=");
    let missed =
        |cluster: &LocalCluster| storage_logged(cluster, "resync copied what the member missed");
    let (records_before, full_before, missed_before) = (
        storage_records(&cluster),
        storage_full(&cluster),
        missed(&cluster),
    );
    cluster.set_link(&quiet, false).expect("cut the server");
    wait_until("its targets to leave their groups", || {
        quiet_targets
            .iter()
            .all(|t| state_of(&cluster, *t) == "bad")
    })
    .expect("members out");
    // As above: the primaries record what their members miss from their next heartbeat
    // answer on; the test reconnects once every record started.
    wait_until("the primaries to record what the members miss", || {
        storage_records(&cluster) >= records_before + quiet_targets.len()
    })
    .expect("records started");
    cluster
        .set_link(&quiet, true)
        .expect("reconnect the server");
    wait_until("every member good after the server returned", || {
        all_good(&cluster)
    })
    .expect("resync");
    // A resync starts again under each new version, so one member's may run more than once;
    // none is a full copy.
    assert!(
        missed(&cluster) >= missed_before + quiet_targets.len(),
        "each returning member got what it missed"
    );
    assert_eq!(
        storage_full(&cluster),
        full_before,
        "no returning member got a full copy"
    );

    note("cutting a storage server that holds primaries off the network");
    let loud = server_of(primaries[0]);
    let loud_targets: Vec<u32> = (1..=6).filter(|t| server_of(*t) == loud).collect();
    cluster.set_link(&loud, false).expect("cut the server");
    wait_until("its targets to leave their groups", || {
        loud_targets.iter().all(|t| state_of(&cluster, *t) == "bad")
    })
    .expect("failover");
    cluster.set_link(&loud, true).expect("reconnect the server");
    wait_until("every member good after the server returned", || {
        all_good(&cluster)
    })
    .expect("resync");

    note("killing a secondary, then its primary while it needs a resync");
    // 4. The primary dies while its returning member needs a resync: the group waits for it.
    let group = groups(&cluster).remove(&1).expect("group 1");
    let primary = group.primary();
    let secondary = group.members[1].0;
    let (primary_server, secondary_server) = (server_of(primary), server_of(secondary));
    cluster.kill(&secondary_server).expect("kill the secondary");
    wait_until("the secondary to leave", || {
        state_of(&cluster, secondary) == "bad"
    })
    .expect("secondary out");
    note("the secondary left its group; restarting it");
    cluster
        .restart(&secondary_server)
        .expect("restart the secondary");
    wait_until("the secondary to need a resync", || {
        state_of(&cluster, secondary) != "bad"
    })
    .expect("secondary back");
    note("the secondary is back; killing the primary");
    cluster.kill(&primary_server).expect("kill the primary");
    wait_until("the primary's server to be offline", || {
        let (_, nodes, _) = weft(&cluster, &["node", "list", "--mgmt", &mgmt]);
        nodes
            .lines()
            .any(|line| line.contains(primary_server.as_str()) && line.contains(" offline "))
    })
    .expect("primary offline");
    note("the primary's server is offline");
    let group = groups(&cluster).remove(&1).expect("group 1");
    // The group is down until its primary returns: restart it before checking the snapshot.
    cluster
        .restart(&primary_server)
        .expect("restart the primary");
    let stale = group
        .members
        .iter()
        .any(|(target, state)| *target == secondary && state != "good");
    if stale {
        // The usual case: the resync had not finished when the primary died.
        assert_eq!(
            group.primary(),
            primary,
            "a member that is not good is never promoted: {group:?}"
        );
    }
    note(if stale {
        "the stale member was not promoted"
    } else {
        "the resync had finished before the primary died"
    });
    wait_until("every member good after the primary returned", || {
        all_good(&cluster)
    })
    .expect("resync");

    note("stopping the workload");
    let (jobs, kept) = workload.finish();
    assert!(jobs > 0, "fio ran");
    assert_groups_identical(&cluster, "after every fault");
    common::assert_meta_copies_identical(&cluster, "after every fault");

    // Everything reads back through a fresh mount.
    cluster.unmount(&mnt).expect("unmount");
    let fresh = cluster.mount().expect("mount again");
    for index in 0..jobs {
        let mut args = fio_args(&fresh.join("data"), index);
        args.push("--verify_only".into());
        let output = Command::new("fio").args(&args).output().expect("fio runs");
        assert!(
            output.status.success(),
            "fio job {index} verifies from a fresh mount: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for (name, content) in &kept {
        let read = std::fs::read(fresh.join("names").join(name)).expect("kept file");
        let first_difference = read.iter().zip(content).position(|(a, b)| a != b);
        assert!(
            read == *content,
            "{name} is intact after a fresh mount: {} bytes read, {} written, first difference at {first_difference:?}",
            read.len(),
            content.len()
        );
    }
    let (ok, report, err) = weft(&cluster, &["fsck", "--mgmt", &mgmt]);
    assert!(ok, "{report}{err}");
    eprintln!("{jobs} fio jobs and {} kept files verified", kept.len());
}

// Goal: a metadata request sent to a primary cut off the network waits for the failover, not
// for its deadline: the client notices that the home's group moved on and asks the new
// primary, as it does for storage. (The mount's deadline is made far longer than a failover,
// so waiting it out cannot pass for following the failover.)
#[test]
fn a_metadata_request_to_a_cut_off_primary_follows_the_failover() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        storage: 1,
        targets_per_storage: 1,
        netns: true,
        ..ClusterSpec::default()
    });
    common::autocreate_meta_groups(&cluster);
    common::wait_meta_member_good(&cluster, "meta-2");
    let deadline = std::time::Duration::from_secs(150);
    let mnt = cluster
        .mount_with(&[&format!("request_timeout_ms={}", deadline.as_millis())])
        .expect("mount");
    // Connections to the primary are open and in use when it is cut off.
    for index in 0..20 {
        std::fs::create_dir(mnt.join(format!("before-{index}"))).expect("mkdir before the cut");
    }
    let primary = meta_primary(&cluster);
    cluster.set_link(&primary, false).expect("cut the primary");
    let started = std::time::Instant::now();
    let made = std::fs::create_dir(mnt.join("during"));
    let took = started.elapsed();
    cluster.set_link(&primary, true).expect("reconnect");
    made.expect("mkdir while the primary is cut off");
    assert_ne!(meta_primary(&cluster), primary, "the other copy took over");
    assert!(
        took < weft_testkit::WAIT_DEADLINE,
        "the mkdir took {took:?}: it waited for its request's deadline instead of following the failover"
    );
    let names: Vec<_> = std::fs::read_dir(&mnt)
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 21, "every directory made is there: {names:?}");
}
