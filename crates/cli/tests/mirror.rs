//! Mirror groups: defined, checked, paired across nodes, listed, kept across a restart.

mod common;

use common::{cluster, weft};
use weft_proto::ids::{GroupId, GroupVersion};
use weft_testkit::ClusterSpec;

// Goal: an operator can define mirror groups of storage targets and of metadata nodes: by
// hand (refused for members on one node or already grouped, with a message that says so) or
// paired automatically across nodes; `weft mirror list` shows members, primary, version and
// states, and the groups survive a management restart. Method: 2 metadata servers, 2 storage
// servers with 2 targets each (targets 1, 2 on storage-1 and 3, 4 on storage-2).
#[test]
fn mirror_groups_are_defined_listed_and_kept() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mgmt = cluster.mgmt().to_string();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--mgmt", &mgmt]);
        weft(&cluster, &all)
    };

    let (ok, _, err) = run(&["mirror", "create", "storage", "--members", "1,2"]);
    assert!(!ok, "two targets of one server are no mirror");
    assert!(err.contains("same node"), "{err}");
    let (ok, _, err) = run(&["mirror", "create", "storage", "--members", "1"]);
    assert!(!ok && err.contains("2 to 4 members"), "{err}");

    let (ok, out, err) = run(&["mirror", "create", "storage", "--members", "1,3"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("target 1 @ storage-1 (good)") && out.contains("target 3 @ storage-2 (good)"),
        "{out}"
    );
    let (ok, _, err) = run(&["mirror", "create", "storage", "--members", "3,2"]);
    assert!(!ok && err.contains("already in a mirror group"), "{err}");

    let (ok, out, err) = run(&["mirror", "autocreate", "storage"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("target 2 @ storage-1") && out.contains("target 4 @ storage-2"),
        "the rest is paired across servers: {out}"
    );
    let (ok, out, _) = run(&["mirror", "autocreate", "storage"]);
    assert!(ok && out.contains("nothing to pair"), "{out}");
    let (ok, out, err) = run(&["mirror", "autocreate", "meta"]);
    assert!(ok, "{err}");
    assert!(out.contains("metadata node 1 (meta-1)"), "{out}");
    // The second node becomes a copy of the first's namespace, good once copied.
    weft_testkit::wait_until("metadata node 2 to hold a full copy", || {
        let (_, list, _) = run(&["mirror", "list"]);
        !list.contains("needs-resync")
    })
    .expect("metadata copy made");

    let list = |cluster: &weft_testkit::LocalCluster| {
        let (ok, out, err) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        assert!(ok, "{err}");
        out
    };
    let before = list(&cluster);
    assert_eq!(
        before.lines().count(),
        4,
        "a header and three groups:\n{before}"
    );
    assert_eq!(before.matches(" storage ").count(), 2, "{before}");
    assert_eq!(before.matches(" meta ").count(), 1, "{before}");

    cluster.kill("mgmt").expect("kill management");
    cluster.restart("mgmt").expect("restart management");
    weft_testkit::wait_until("management to answer again", || {
        weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]).0
    })
    .expect("management back");
    assert_eq!(list(&cluster), before, "the groups are kept");
}

/// Asserts both members hold the same objects, byte for byte, once both are good: a member
/// slow to take a change (a loaded machine) is dropped and brought up to date by a resync.
fn assert_members_identical(cluster: &weft_testkit::LocalCluster, what: &str) {
    weft_testkit::wait_until("both members of storage group 1 good", || {
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.lines()
            .find(|line| line.starts_with("1 ") && line.contains(" storage "))
            .is_some_and(|group| group.matches("(good)").count() == 2)
    })
    .expect("members good");
    let one = common::mirrored_objects(&cluster.target_dir(1, 1));
    let two = common::mirrored_objects(&cluster.target_dir(2, 1));
    assert!(!one.is_empty(), "{what}: the members hold objects");
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        two.keys().collect::<Vec<_>>(),
        "{what}: the members hold the same objects"
    );
    for (name, data) in &one {
        assert!(
            two[name] == *data,
            "{what}: object {name} differs between the members"
        );
    }
}

// Goal: a file in a mirrored directory is on every member of its group, byte for byte. When
// the primary's storage server dies (kill -9), the mount keeps serving after a pause — what was
// written reads back, new writes and fsync succeed — because management promotes the good
// member; when the server comes back its target is brought up to date (resync) and marked
// good again, and both members hold identical objects. Method: 1 metadata server, 2 storage
// servers with one target each, paired into group 1 (primary target 1 on storage-1).
#[test]
fn mirrored_files_survive_the_loss_of_a_storage_server() {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        ..ClusterSpec::default()
    });
    let mgmt = cluster.mgmt().to_string();
    let out = common::autocreate_storage_groups(&cluster);
    assert!(out.contains("target 1 @ storage-1"), "{out}");
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("mirrored");
    let out = common::make_mirrored_dir(
        &cluster,
        &dir,
        &["--num-targets", "1", "--chunk-size", "64K"],
    );
    assert!(out.contains("Mirrored"), "{out}");

    let first = common::pattern(1, 3 << 20);
    common::write_synced(&dir.join("first"), &first);
    let info_path = dir.join("first").display().to_string();
    let (ok, info, err) = weft(&cluster, &["entry", "info", &info_path, "--mgmt", &mgmt]);
    assert!(ok, "{err}");
    assert!(
        info.contains("Storage mirror groups") && info.contains("group 1 (version"),
        "{info}"
    );
    assert_members_identical(&cluster, "after a write");

    cluster
        .kill("storage-1")
        .expect("kill the primary's server");
    let second = common::pattern(2, 2 << 20);
    let started = std::time::Instant::now();
    common::write_synced(&dir.join("second"), &second);
    eprintln!(
        "a write and fsync across the failover took {:?}",
        started.elapsed()
    );
    assert!(
        std::fs::read(dir.join("first")).expect("read after failover") == first,
        "what was written before the failover reads back"
    );
    let (ok, list, err) = weft(&cluster, &["mirror", "list", "--mgmt", &mgmt]);
    assert!(ok, "{err}");
    let group = list
        .lines()
        .find(|line| line.starts_with("1 ") && line.contains(" storage "))
        .unwrap_or_else(|| panic!("group 1 listed:\n{list}"));
    assert!(
        group.find("target 2").expect("listed") < group.find("target 1").expect("listed")
            && group.contains("target 1 @ storage-1 (bad)"),
        "the good member took over as primary, the dead one is out:\n{list}"
    );

    cluster.restart("storage-1").expect("restart storage-1");
    weft_testkit::wait_until("storage-1's target to be resynced", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", &mgmt]);
        list.contains("target 1 @ storage-1 (good)")
    })
    .expect("resync finished");
    assert_members_identical(&cluster, "after the resync");
    assert!(std::fs::read(dir.join("second")).expect("read") == second);

    // Now the secondary dies: the primary stops waiting for it once management takes it out.
    cluster
        .kill("storage-1")
        .expect("kill the secondary's server");
    let third = common::pattern(3, 1 << 20);
    common::write_synced(&dir.join("third"), &third);
    cluster.restart("storage-1").expect("restart storage-1");
    weft_testkit::wait_until("storage-1's target to be resynced again", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", &mgmt]);
        list.contains("target 1 @ storage-1 (good)")
    })
    .expect("resync finished");
    assert_members_identical(&cluster, "after the second resync");
    assert!(std::fs::read(dir.join("third")).expect("read") == third);

    // Operators see it in the metrics: forwards and resyncs counted by the storage servers,
    // members by state and group versions by management.
    common::write_synced(&dir.join("fourth"), &common::pattern(4, 1 << 20));
    let metric_sum = |name: &str, labels: &[&str]| common::metric_sum(&cluster, name, labels);
    assert!(
        metric_sum("weft_mirror_forwards_total", &[]) > 0,
        "forwards counted"
    );
    assert!(
        metric_sum("weft_mirror_resync_objects_total", &[]) > 0,
        "resyncs counted"
    );
    let good = metric_sum(
        "weft_cluster_mirror_members",
        &["kind=\"storage\"", "state=\"good\""],
    );
    assert_eq!(good, 2, "both members good");
    assert!(
        metric_sum("weft_cluster_mirror_group_version", &[]) > 1,
        "versions published"
    );
    let (ok, report, err) = weft(&cluster, &["fsck", "--mgmt", &mgmt]);
    assert!(ok, "{report}{err}");
}

// Goal: a resync touches only the objects of mirrored files. Files striped plainly over
// targets that later become members of a mirror group (the default pattern places files on
// every target) keep their bytes when a member restarts and is copied in full, and fsck finds
// them intact. Method: 2 storage servers with one target each; plain files written and synced,
// then the targets paired into a group, a mirrored file written, storage-2 killed with
// SIGKILL and restarted, and everything read back once the group is good again.
#[test]
fn resync_leaves_plain_files_alone() {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        ..ClusterSpec::default()
    });
    let mgmt = cluster.mgmt().to_string();
    let mnt = cluster.mount().expect("mount");
    let mut plain = Vec::new();
    for index in 0..8u64 {
        let len = if index == 0 { 2 << 20 } else { 100 << 10 };
        let path = mnt.join(format!("plain-{index}"));
        let data = common::pattern(index, len);
        common::write_synced(&path, &data);
        plain.push((path, data));
    }
    common::autocreate_storage_groups(&cluster);
    let dir = mnt.join("mirrored");
    common::make_mirrored_dir(&cluster, &dir, &[]);
    let mirrored = common::pattern(99, 1 << 20);
    common::write_synced(&dir.join("file"), &mirrored);

    // Group 1's version and whether both members are good.
    let group = |cluster: &weft_testkit::LocalCluster| {
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", &mgmt]);
        let line = list
            .lines()
            .find(|line| line.starts_with("1 "))
            .unwrap_or_default()
            .to_string();
        let version: u64 = line
            .split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let good = line.contains("target 1 @ storage-1 (good)")
            && line.contains("target 2 @ storage-2 (good)");
        (version, good)
    };
    let (before, _) = group(&cluster);
    cluster.kill("storage-2").expect("kill storage-2");
    cluster.restart("storage-2").expect("restart storage-2");
    weft_testkit::wait_until("the restarted member to be copied and good again", || {
        let (version, good) = group(&cluster);
        version > before && good
    })
    .expect("resynced");
    cluster.unmount(&mnt).expect("unmount");
    let fresh = cluster.mount().expect("mount again");
    for (path, data) in &plain {
        let path = fresh.join(path.file_name().expect("name"));
        assert!(
            std::fs::read(&path).expect("read") == *data,
            "{} keeps its bytes through the resync",
            path.display()
        );
    }
    assert!(std::fs::read(fresh.join("mirrored/file")).expect("read") == mirrored);
    common::fsck_clean(&cluster);
}

// Goal: a member that comes back while its primary is down is never promoted — it missed
// writes — so the group waits for the primary; `weft mirror resync-stats` says the member waits
// for it. When the primary returns, it brings the member up to date and every fsync'd byte is
// intact on both. Method: group 1 of targets 1 (primary, storage-1) and 2 (storage-2); kill
// storage-2, write, kill storage-1, restart storage-2, then storage-1.
#[test]
fn a_stale_member_waits_for_its_primary() {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        ..ClusterSpec::default()
    });
    let mgmt = cluster.mgmt().to_string();
    let list = |cluster: &weft_testkit::LocalCluster| {
        let (ok, out, err) = weft(cluster, &["mirror", "list", "--mgmt", &mgmt]);
        assert!(ok, "{err}");
        out
    };
    common::autocreate_storage_groups(&cluster);
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("mirrored");
    common::make_mirrored_dir(&cluster, &dir, &[]);

    cluster
        .kill("storage-2")
        .expect("kill the secondary's server");
    let data = common::pattern(7, 5 << 20);
    common::write_synced(&dir.join("while-alone"), &data);
    weft_testkit::wait_until("target 2 to leave the group", || {
        list(&cluster).contains("target 2 @ storage-2 (bad)")
    })
    .expect("target 2 out");

    cluster
        .kill("storage-1")
        .expect("kill the primary's server");
    cluster.restart("storage-2").expect("restart storage-2");
    weft_testkit::wait_until("target 2 to need a resync", || {
        list(&cluster).contains("target 2 @ storage-2 (needs-resync)")
    })
    .expect("target 2 back");
    let (ok, stats, err) = weft(&cluster, &["mirror", "resync-stats", "--mgmt", &mgmt]);
    assert!(ok, "{err}");
    assert!(stats.contains("waiting for the primary"), "{stats}");
    let group = list(&cluster);
    let line = group
        .lines()
        .find(|line| line.starts_with("1 "))
        .expect("group 1");
    assert!(
        line.find("target 1").expect("listed") < line.find("target 2").expect("listed"),
        "the stale member is not promoted:\n{group}"
    );

    cluster.restart("storage-1").expect("restart storage-1");
    weft_testkit::wait_until("target 2 to be resynced", || {
        list(&cluster).contains("target 2 @ storage-2 (good)")
    })
    .expect("resync finished");
    let (ok, stats, _) = weft(&cluster, &["mirror", "resync-stats", "--mgmt", &mgmt]);
    assert!(
        ok && stats.contains("no mirror member needs a resync"),
        "{stats}"
    );
    assert_members_identical(&cluster, "after the primary came back");
    assert!(std::fs::read(dir.join("while-alone")).expect("read") == data);
}

/// Two storage servers of one target each, in one mirror group (in crash-test mode, or each
/// in a network namespace of its own, as asked); a mount without write-behind and a mirrored
/// directory in it: (cluster, mount point, directory).
fn mirrored_pair(
    crash_test: bool,
    netns: bool,
) -> (
    weft_testkit::LocalCluster,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        crash_test,
        netns,
        ..ClusterSpec::default()
    });
    common::autocreate_storage_groups(&cluster);
    let mnt = cluster
        .mount_with(&["write_behind_bytes=0"])
        .expect("mount");
    let dir = mnt.join("mirrored");
    common::make_mirrored_dir(&cluster, &dir, &[]);
    (cluster, mnt, dir)
}

/// Whether both members of the pair's group are good.
fn pair_good(cluster: &weft_testkit::LocalCluster) -> bool {
    let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    list.matches("(good)").count() == 2
}

// Goal: when every copy of a mirror group crashes, writes acknowledged but not synced may be
// gone, and fsync says so (EIO) instead of claiming them; what was fsync'd survives, and the
// group serves and syncs new writes. A crash of one member alone loses nothing (the other
// has every acknowledged write), so it never makes fsync fail. Method: crash-test mode
// (unsynced writes die with the process), group 1 of targets 1 and 2, a mount without
// write-behind.
#[test]
fn fsync_reports_writes_lost_when_every_copy_crashed() {
    use std::io::Write;
    let (mut cluster, _mnt, dir) = mirrored_pair(true, false);

    let synced = common::pattern(91, 2 << 20);
    common::write_synced(&dir.join("synced"), &synced);
    let mut survivor = std::fs::File::create(dir.join("survivor")).expect("create");
    survivor
        .write_all(&common::pattern(92, 1 << 20))
        .expect("write");
    // One member crashes: the other had every write.
    cluster.kill("storage-2").expect("kill storage-2");
    cluster.restart("storage-2").expect("restart storage-2");
    weft_testkit::wait_until("the group to be good again", || pair_good(&cluster)).expect("resync");
    survivor
        .sync_all()
        .expect("one crashed member loses nothing");

    let mut lost = std::fs::File::create(dir.join("lost")).expect("create");
    lost.write_all(&common::pattern(93, 1 << 20))
        .expect("write");
    for name in ["storage-1", "storage-2"] {
        cluster.kill(name).expect("kill");
    }
    for name in ["storage-1", "storage-2"] {
        cluster.restart(name).expect("restart");
    }
    weft_testkit::wait_until("the group to be good again", || pair_good(&cluster)).expect("resync");
    let error = lost
        .sync_all()
        .expect_err("fsync must not claim lost writes");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert!(std::fs::read(dir.join("synced")).expect("read") == synced);
    let fresh = common::pattern(94, 1 << 20);
    common::write_synced(&dir.join("fresh"), &fresh);
    assert!(std::fs::read(dir.join("fresh")).expect("read") == fresh);
}

// Goal: a restart of the storage processes alone (kill -9, the host alive) loses no write
// they answered: those writes were in the kernel. So, unlike a crash of every copy's host,
// fsync afterwards succeeds, for a mirrored file and for a plain one, and both read back
// whole (the double fault of the trust work's item 15 gives a pause, not an error). Method:
// real disks (no crash-test mode), group 1 of targets 1 and 2, a mount without write-behind,
// both storage servers killed and restarted between the writes and their fsync.
#[test]
fn a_restart_of_every_storage_process_loses_no_answered_write() {
    use std::io::Write;
    let (mut cluster, mnt, dir) = mirrored_pair(false, false);

    let (mirrored, plain) = (common::pattern(95, 1 << 20), common::pattern(96, 3 << 20));
    let mut files = [
        (dir.join("mirrored"), &mirrored),
        (mnt.join("plain"), &plain),
    ]
    .map(|(path, data)| {
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(data).expect("write");
        (path, file, data)
    });
    for name in ["storage-1", "storage-2"] {
        cluster.kill(name).expect("kill");
    }
    for name in ["storage-1", "storage-2"] {
        cluster.restart(name).expect("restart");
    }
    weft_testkit::wait_until("the group to be good again", || pair_good(&cluster)).expect("resync");
    for (path, file, data) in &mut files {
        file.sync_all().unwrap_or_else(|e| {
            panic!(
                "fsync of {}: the restarts lost nothing: {e}",
                path.display()
            )
        });
        assert!(
            std::fs::read(&path).expect("read") == **data,
            "{} reads back",
            path.display()
        );
    }
}

// Goal: a namespace change made while the metadata copy is unreachable pauses until the copy
// is dropped from the group, and succeeds, even when a client session expires meanwhile. The
// primary's heartbeat, which renews its lease and brings the map that drops the copy, must
// not wait for the store while it handles the expiry: the change's commit waits for that very
// map. (Seen in the nemesis: the heartbeat waited for a commit that dropped the expired
// session's stored replies, the lease ran out, and the change failed with EIO.) Method: 2
// metadata servers paired, two mounts; one mount's client is killed; once management lists its
// session as expired, the copy's server is killed and a directory is made through the other
// mount while the primary is still to hear of the expiry (the test passes however the two
// meet; it catches the fault only when they do, about one run in three before the fix).
#[test]
fn a_session_expiring_while_the_copy_is_away_does_not_fail_a_change() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    common::autocreate_meta_groups(&cluster);
    common::wait_meta_member_good(&cluster, "meta-2");
    let mnt = cluster.mount().expect("mount");
    let doomed = cluster.mount().expect("second mount");
    std::fs::write(doomed.join("from-the-second-mount"), b"seen by the primary").expect("write");
    let sessions = |cluster: &weft_testkit::LocalCluster| {
        common::metric_sum(cluster, "weft_cluster_client_sessions", &[])
    };
    assert_eq!(sessions(&cluster), 2, "both mounts' sessions");
    cluster
        .kill_mount(&doomed)
        .expect("kill the second mount's client");
    weft_testkit::wait_until("its session to expire at management", || {
        sessions(&cluster) == 1
    })
    .expect("expired");
    cluster.kill("meta-2").expect("kill the copy's server");
    std::fs::create_dir(mnt.join("made-while-the-copy-is-away"))
        .expect("a change pauses while the copy is away, then succeeds");
    cluster.restart("meta-2").expect("restart");
    common::wait_meta_member_good(&cluster, "meta-2");
    assert!(mnt.join("made-while-the-copy-is-away").is_dir());
}

// Goal: with metadata mirroring, every namespace change reaches both members before it is
// answered, so when the primary metadata server dies (kill -9) management promotes the copy
// and the mount keeps serving after a pause: what was created reads back, and creates,
// renames, unlinks and fsync succeed. The returning server is brought up to date, becomes good,
// and takes over when the other dies in turn; the members' store files end identical and
// `weft fsck` finds nothing wrong. Method: 2 metadata servers paired (home 1 on meta-1, a copy
// on meta-2), 1 storage server.
#[test]
fn the_namespace_survives_the_loss_of_a_metadata_server() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let out = common::autocreate_meta_groups(&cluster);
    assert!(out.contains("metadata node 1 (meta-1)"), "{out}");
    let mnt = cluster.mount().expect("mount");
    let files: Vec<(std::path::PathBuf, Vec<u8>)> = (0..3)
        .flat_map(|d| (0..4).map(move |f| (d, f)))
        .map(|(d, f)| {
            (
                mnt.join(format!("dir-{d}")).join(format!("file-{f}")),
                common::pattern(d * 10 + f, 10_000 + (f as usize) * 7_000),
            )
        })
        .collect();
    for d in 0..3 {
        std::fs::create_dir(mnt.join(format!("dir-{d}"))).expect("mkdir");
    }
    for (path, data) in &files {
        common::write_synced(path, data);
    }
    for d in 0..3 {
        assert_eq!(
            common::metadata_node(&cluster, &mnt.join(format!("dir-{d}"))),
            "meta-1 [ID: 1]",
            "new directories live on the mirrored home, not on its copy"
        );
    }
    common::assert_meta_copies_identical(&cluster, "after creates");

    cluster
        .kill("meta-1")
        .expect("kill the primary metadata server");
    let started = std::time::Instant::now();
    std::fs::create_dir(mnt.join("after-1")).expect("mkdir across the failover");
    eprintln!("a mkdir across the failover took {:?}", started.elapsed());
    for (path, data) in &files {
        assert!(
            std::fs::read(path).expect("read after the failover") == *data,
            "{} reads back after the failover",
            path.display()
        );
    }
    common::write_synced(
        &mnt.join("after-1").join("new"),
        b"written after the failover",
    );
    std::fs::rename(
        mnt.join("dir-0").join("file-0"),
        mnt.join("after-1").join("moved"),
    )
    .expect("rename after the failover");
    std::fs::remove_file(mnt.join("dir-1").join("file-1")).expect("unlink after the failover");
    let group = common::meta_group_line(&cluster);
    assert!(
        group.find("meta-2").expect("listed") < group.find("meta-1").expect("listed"),
        "the copy took over as primary: {group}"
    );
    let (ok, info, err) = weft(
        &cluster,
        &[
            "entry",
            "info",
            mnt.join("after-1").to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "{err}");
    assert!(
        info.contains("Metadata mirror group: 1") && info.contains("served by meta-2 [ID: 2]"),
        "entry info names the group and the node serving the home now:\n{info}"
    );

    cluster.restart("meta-1").expect("restart meta-1");
    common::wait_meta_member_good(&cluster, "meta-1");
    cluster.kill("meta-2").expect("kill the new primary");
    assert_eq!(
        std::fs::read(mnt.join("after-1").join("moved")).expect("read the moved file"),
        files[0].1,
        "the rename made on the copy holds after the second failover"
    );
    assert_eq!(
        std::fs::read_to_string(mnt.join("after-1").join("new")).expect("read"),
        "written after the failover"
    );
    assert!(
        !mnt.join("dir-1").join("file-1").exists(),
        "the unlink holds"
    );
    std::fs::create_dir(mnt.join("after-2")).expect("mkdir after the second failover");
    cluster.restart("meta-2").expect("restart meta-2");
    common::wait_meta_member_good(&cluster, "meta-2");
    common::write_synced(&mnt.join("after-2").join("last"), b"last");
    // meta-1 is primary again: its file and meta-2's copy are the same.
    common::assert_meta_copies_identical(&cluster, "after both failovers");
    common::fsck_clean(&cluster);
}

// Goal: a commit larger than one frame still reaches the metadata copy. Each sync used to
// ship as one request; a sync whose pages exceed the 16 MiB payload limit never shipped (the
// member closed the connection), the commit failed, the member was dropped, and it recurred.
// Method: 2 metadata servers paired, 1 storage server; 600 files get a 64 KiB extended
// attribute each, all at once through one client, so a few hundred of them land in one
// commit (tens of MiB of pages). Every change must succeed, the copy must stay good and end
// identical, and after the primary is killed the copy serves every attribute.
#[test]
fn a_commit_larger_than_a_frame_reaches_the_metadata_copy() {
    use weft_proto::ids::InodeId;
    use weft_proto::messages::XattrSetMode;
    const FILES: usize = 1500;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    common::autocreate_meta_groups(&cluster);
    let mnt = cluster.mount().expect("mount");
    std::fs::create_dir(mnt.join("big")).expect("mkdir");
    for file in 0..FILES {
        std::fs::write(mnt.join("big").join(format!("f{file}")), b"x").expect("create");
    }
    let value = |file: usize| common::pattern(file as u64, 64 * 1024);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut config = weft_client::ClientConfig::new(cluster.mgmt().to_string());
    config.auth_key_file = Some(cluster.key_file());
    // Within the test cluster's short session timeout.
    config.heartbeat_interval = std::time::Duration::from_millis(300);
    let client = runtime
        .block_on(weft_client::Client::connect(&config))
        .expect("client");
    let inodes: Vec<InodeId> = runtime.block_on(async {
        let dir = client
            .lookup(InodeId::ROOT, "big")
            .await
            .expect("dir")
            .inode;
        let mut inodes = Vec::new();
        for file in 0..FILES {
            let name = format!("f{file}");
            inodes.push(client.lookup(dir, &name).await.expect("file").inode);
        }
        inodes
    });
    let results = runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for (file, inode) in inodes.iter().copied().enumerate() {
            let client = std::sync::Arc::clone(&client);
            tasks.spawn(async move {
                client
                    .set_xattr(inode, "user.big", &value(file), XattrSetMode::Any)
                    .await
                    .map_err(|error| format!("f{file}: {error}"))
            });
        }
        let mut results = Vec::new();
        while let Some(result) = tasks.join_next().await {
            results.push(result.expect("task"));
        }
        results
    });
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} changes failed: {:?}",
        failed.len(),
        failed.first()
    );
    let group = common::meta_group_line(&cluster);
    assert!(
        group.contains("(meta-2) (good)"),
        "the copy stayed in the group: {group}"
    );
    common::assert_meta_copies_identical(&cluster, "after the large commits");

    cluster.kill("meta-1").expect("kill the primary");
    runtime.block_on(async {
        for (file, inode) in inodes.iter().copied().enumerate() {
            let read = client
                .get_xattr(inode, "user.big")
                .await
                .expect("read the attribute from the copy");
            assert!(read == value(file), "f{file}: the copy holds the attribute");
        }
    });
}

// Goal: `weft fsck` compares the copies mirror members hold: a member whose copy of an object
// differs from the other's (a disk that returned other bytes), or that lacks the object
// altogether, is reported with the file. Method: group 1 of targets 1 and 2, a 1 MiB file in
// a mirrored directory, check clean; change 4 KiB in the middle of one member's object file
// on disk (same length), check; remove that object file, check.
#[test]
fn fsck_compares_the_copies_of_mirror_members() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let mut cluster = common::mirrored_pair();
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("mirrored");
    common::make_mirrored_dir(&cluster, &dir, &[]);
    common::write_synced(&dir.join("file"), &common::pattern(64, 1 << 20));
    weft_testkit::wait_until("both members good and fsck clean", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        !list.contains("(needs-resync)")
            && !list.contains("(bad)")
            && weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]).0
    })
    .expect("a clean mirrored cluster passes");

    let inode = std::fs::metadata(dir.join("file")).expect("stat").ino();
    let name = weft_proto::InodeId(inode).to_string();
    let copies = common::object_files(&cluster, (2, 1), "mirrored", inode);
    assert_eq!(copies.len(), 2, "each member holds a copy: {copies:?}");
    let (_, _, second) = &copies[1];
    std::fs::OpenOptions::new()
        .write(true)
        .open(second)
        .expect("open the copy")
        .write_all_at(&[0xEE; 4096], 512 * 1024)
        .expect("change the copy");
    let (ok, report, _) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(!ok, "copies that differ are a problem:\n{report}");
    assert!(
        report.contains(&name) && report.contains("differ"),
        "the report names the file whose copies differ:\n{report}"
    );

    std::fs::remove_file(second).expect("lose the copy");
    let (ok, report, _) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(!ok, "a member without its copy is a problem:\n{report}");
    assert!(
        report.contains(&name) && report.contains("lack the object"),
        "the report names the file a member lacks:\n{report}"
    );
}

// Goal: a late copy of a change a primary forwarded to a member never lands over a newer
// change there. A primary retries a forward whose answer did not come in time while the
// first copy may still wait at the member; once the retry is answered, the client's next
// change of the same bytes is forwarded, and the first copy must not then overwrite it (the
// member would hold old bytes the primary does not, and serve them after a failover). Method:
// against the member's storage server, send what a primary sends in that case: the retried
// forward, a newer forward of the same bytes, then the delayed first copy; the member's copy
// must hold the newer bytes.
#[test]
fn a_late_copy_of_a_forward_never_lands_over_a_newer_one() {
    use weft_proto::ids::{ClientId, InodeId, NodeId};
    use weft_proto::messages::{ChangeTag, Route};
    use weft_proto::ErrorCode;
    let cluster = common::mirrored_pair();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
        let file = (InodeId::new(NodeId(1), 1 << 40), 0);
        let tag = |number: u64, settled_below: u64| ChangeTag {
            client: ClientId(u64::MAX - 2),
            number,
            settled_below,
            abandoned: Vec::new(),
        };
        let route = || common::secondary_route(&view);
        let forward = |route: Route, data: &'static [u8], tag: ChangeTag| {
            let view = &view;
            async move {
                let storage = view.storage_for_target(route.target).await?;
                storage
                    .write(
                        route,
                        weft_net::ObjectWrite {
                            file,
                            offset: 0,
                            data: bytes::Bytes::from_static(data),
                            tag: Some(tag),
                            capability: None,
                            owner: None,
                        },
                    )
                    .await
            }
        };
        // The member may not have heard of the group's version yet.
        let mut retried = forward(route().await, b"old bytes", tag(1, 1)).await;
        for _ in 0..100 {
            if retried.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            retried = forward(route().await, b"old bytes", tag(1, 1)).await;
        }
        retried.expect("the retry");
        let route = route().await;
        forward(route, b"new bytes", tag(2, 2))
            .await
            .expect("the newer forward");
        let late = forward(route, b"old bytes", tag(1, 1))
            .await
            .expect_err("the late first copy is refused");
        assert_eq!(late.code(), ErrorCode::Superseded, "{late}");
        let storage = view
            .storage_for_target(route.target)
            .await
            .expect("storage");
        let weft_proto::answer::Checksum { length, crc } = storage
            .object_checksum(route.target, true, file.0, 0, 64)
            .await
            .expect("the member's copy");
        assert_eq!(
            (length, crc),
            (9, weft_proto::checksum::crc32c(b"new bytes")),
            "the member's copy holds the newer bytes"
        );
    });
}

// Goal: a change a member took as a forward in one version of its group is run again when a
// primary of a later version forwards it: the member's copy may have changed since (another
// client's change of the same bytes), and the resent change must land, or the member holds
// other bytes than its primary for an acknowledged change. Method: a group of three targets;
// against the third member, forward change 1 and then another client's change 2 of the same
// bytes; kill the second member's server so the group moves to a new version; forward change
// 1 again in it. The member's copy must hold change 1's bytes.
#[test]
fn a_change_forwarded_again_in_a_new_version_runs_again() {
    use weft_proto::ids::{ClientId, InodeId, NodeId, TargetId};
    use weft_proto::messages::{ChangeTag, MirrorKind, MirrorRoute, Route};
    let mut cluster = cluster(ClusterSpec {
        storage: 3,
        targets_per_storage: 1,
        ..ClusterSpec::default()
    });
    let (ok, _, err) = weft(
        &cluster,
        &[
            "mirror",
            "create",
            "storage",
            "--members",
            "1,2,3",
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "{err}");
    weft_testkit::wait_until("every member good", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.matches("(good)").count() == 3
    })
    .expect("group formed");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    let member = TargetId(3);
    let file = (InodeId::new(NodeId(1), 1 << 40), 0);
    let tag = |client: u64, number: u64| ChangeTag {
        client: ClientId(client),
        number,
        settled_below: 1,
        abandoned: Vec::new(),
    };
    // The group's version now, and a forward to the member in it, sent until the member
    // knows the version.
    let version = || {
        runtime.block_on(async {
            let map = view.refresh().await.expect("map");
            let group = map
                .mirror_groups
                .iter()
                .find(|group| group.kind == MirrorKind::Storage)
                .expect("the group");
            (group.id, group.version)
        })
    };
    let forward =
        |(group, version): (GroupId, GroupVersion), data: &'static [u8], tag: ChangeTag| {
            let route = Route {
                target: member,
                mirror: Some(MirrorRoute {
                    group,
                    version,
                    forwarded: true,
                }),
            };
            runtime.block_on(async {
                let storage = view.storage_for_target(member).await?;
                storage
                    .write(
                        route,
                        weft_net::ObjectWrite {
                            file,
                            offset: 0,
                            data: bytes::Bytes::from_static(data),
                            tag: Some(tag),
                            capability: None,
                            owner: None,
                        },
                    )
                    .await
            })
        };
    // The group may still be settling (its members resyncing), so the version is read again
    // until the member takes a forward in it.
    let mut first = version();
    weft_testkit::wait_until("the member to take a forward", || {
        first = version();
        forward(first, b"first", tag(u64::MAX - 3, 1)).is_ok()
    })
    .expect("forward taken");
    forward(first, b"other", tag(u64::MAX - 4, 1)).expect("another client's change");

    cluster
        .kill("storage-2")
        .expect("kill the second member's server");
    let mut second = first;
    weft_testkit::wait_until("the group to move to a new version", || {
        second = version();
        second.1 > first.1
    })
    .expect("new version");
    weft_testkit::wait_until("the member to take the change again", || {
        forward(second, b"first", tag(u64::MAX - 3, 1)).is_ok()
    })
    .expect("forward taken in the new version");
    let weft_proto::answer::Checksum { length, crc } = runtime
        .block_on(async {
            let storage = view.storage_for_target(member).await?;
            storage.object_checksum(member, true, file.0, 0, 64).await
        })
        .expect("the member's copy");
    assert_eq!(
        (length, crc),
        (5, weft_proto::checksum::crc32c(b"first")),
        "the change forwarded again in the new version landed"
    );
}

// Goal: a late first copy of a resync's step never undoes what later steps wrote. A primary
// copying an object to a returning member sends a removal of the member's copy, then the
// object's bytes, then a sync, and sends a step again when its answer does not come in time;
// a first copy of the removal arriving after the bytes would leave the member without the
// object it reports copied. Method: against the member's storage server, send the steps as a
// resync tags them: the removal (its retry), the write and the sync, then the delayed first
// copy of the removal; it must be refused and the member's copy must hold the bytes.
#[test]
fn a_late_copy_of_a_resync_step_never_undoes_later_ones() {
    use weft_proto::ids::{ClientId, InodeId, NodeId};
    use weft_proto::messages::{ChangeTag, Route, StorageRequest};
    let cluster = common::mirrored_pair();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    let inode = InodeId::new(NodeId(1), 1 << 40);
    let tag = |number: u64| ChangeTag {
        client: ClientId((1 << 63) | 99),
        number,
        settled_below: number,
        abandoned: Vec::new(),
    };
    let send = |step: &dyn Fn(Route) -> StorageRequest, payload: &'static [u8]| {
        runtime.block_on(async {
            let route = common::secondary_route(&view).await;
            let storage = view.storage_for_target(route.target).await?;
            storage
                .send(step(route), bytes::Bytes::from_static(payload))
                .await
                .map(|(response, _)| (route, response))
        })
    };
    let remove = |route: Route| StorageRequest::Remove {
        target: route.target,
        mirror: route.mirror,
        inode,
        tag: Some(tag(1)),
    };
    let mut removed = send(&remove, b"");
    weft_testkit::wait_until("the member to take a step", || {
        removed.is_ok() || {
            removed = send(&remove, b"");
            removed.is_ok()
        }
    })
    .expect("removal taken");
    let (route, _) = removed.expect("the removal's retry");
    let write = |route: Route| StorageRequest::Write {
        target: route.target,
        mirror: route.mirror,
        inode,
        generation: 0,
        object_offset: 0,
        tag: Some(tag(2)),
        capability: None,
        owner: None,
        project: 0,
    };
    send(&write, b"copied").expect("the copy's bytes");
    let sync = |route: Route| StorageRequest::Sync {
        target: route.target,
        mirror: route.mirror,
        inode,
        capability: None,
    };
    send(&sync, b"").expect("the copy's sync");
    let late = send(&remove, b"").expect_err("the late removal is refused");
    assert_eq!(late.code(), weft_proto::ErrorCode::Superseded, "{late}");
    let weft_proto::answer::Checksum { length, crc } = runtime
        .block_on(async {
            let storage = view.storage_for_target(route.target).await?;
            storage
                .object_checksum(route.target, true, inode, 0, 64)
                .await
        })
        .expect("the member's copy");
    assert_eq!(
        (length, crc),
        (6, weft_proto::checksum::crc32c(b"copied")),
        "the member still holds the copied bytes"
    );
}

// Goal: a member that comes back after it was cut off holds durably, once it is good again,
// the changes it took before it left, although its primary synced them without it: a resync
// ends by syncing everything the member holds. Otherwise a crash of the member's host after
// it turned good loses data an fsync acknowledged, and if its primary fails too, the member
// is promoted without it. Method: crash-test mode (unsynced writes die with the process) in
// network namespaces; a file written, not synced, with both members in; the secondary cut
// off until it leaves the group; the file fsync'd; the secondary reconnected (it left in
// sync, so it gets only what it missed: nothing); once the group is good the secondary is
// killed, and its object of the file on disk must hold the file.
#[test]
fn a_returning_member_holds_what_it_took_durably_once_good() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let (mut cluster, _mnt, dir) = mirrored_pair(true, true);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    let secondary = runtime.block_on(common::secondary_route(&view)).target.0 as usize;
    let member = format!("storage-{secondary}");

    let data = common::pattern(95, 1 << 20);
    let mut file = std::fs::File::create(dir.join("taken")).expect("create");
    file.write_all(&data).expect("write");
    cluster.set_link(&member, false).expect("cut the secondary");
    weft_testkit::wait_until("the secondary to leave its group", || !pair_good(&cluster))
        .expect("left");
    file.sync_all().expect("fsync with the primary alone");
    cluster.set_link(&member, true).expect("reconnect");
    weft_testkit::wait_until("the group to be good again", || pair_good(&cluster)).expect("resync");

    cluster.kill(&member).expect("kill the secondary");
    let inode = std::fs::metadata(dir.join("taken")).expect("stat").ino();
    let objects = common::object_files(&cluster, (2, 1), "mirrored", inode);
    let on = |wanted: &dyn Fn(usize) -> bool| {
        objects
            .iter()
            .find(|(server, _, _)| wanted(*server))
            .map(|(_, _, path)| std::fs::read(path).expect("read the object"))
    };
    assert!(
        on(&|server| server != secondary).as_deref() == Some(&data[..]),
        "the primary holds the file"
    );
    let on_disk = on(&|server| server == secondary);
    assert!(
        on_disk.as_deref() == Some(&data[..]),
        "the secondary's object holds {:?} bytes of the file's {} after its host died",
        on_disk.map(|bytes| bytes.len()),
        data.len()
    );
}
