//! Mirror groups, and mirrored files that survive the loss of a storage server.

use super::*;

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
