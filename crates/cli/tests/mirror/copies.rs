//! Copies that arrive late or twice: of metadata homes, forwards, resync steps and returning
//! members.

use super::*;

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

// Goal: a metadata home paired into a mirror group while it commits ends with a copy equal to
// its store file: no commit lands in the primary's file after the new member's resync read
// that part of the file without shipping to it (the sync that was under way when the group
// appeared). Method: 2 metadata servers, meta-1's journal slowed to 50 ms a sync (a
// failpoint), files created through the mount on home 1 without pause while `weft mirror
// autocreate meta` runs; once the copy is good and the creates stopped, the two store files
// are compared byte for byte, and the files read back.
#[test]
fn a_home_paired_under_load_gets_an_equal_copy() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    common::arm(&mut cluster, "meta-1", "meta-slow-journal");
    let mnt = cluster.mount().expect("mount");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creator = {
        let (mnt, stop) = (mnt.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(mnt.join(format!("f{i}")), i.to_le_bytes()).expect("create");
                i += 1;
            }
            i
        })
    };
    common::autocreate_meta_groups(&cluster);
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = creator.join().expect("creator");
    assert!(created > 0, "{created} files created");
    common::assert_meta_copies_identical(&cluster, "after pairing under load");
    for i in (0..created).step_by(7) {
        assert_eq!(
            std::fs::read(mnt.join(format!("f{i}"))).expect("read"),
            i.to_le_bytes()
        );
    }
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
