//! Moves of mirrored files between storage mirror groups: seals, drains, crashes of a
//! primary, resyncs, emptied groups, rebalancing.

use super::*;

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
