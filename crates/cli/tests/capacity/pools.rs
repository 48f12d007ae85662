//! Pools and placement: where new files go, and how a change of the map reaches every server.

use super::*;

// Goal: a storage pool sends a directory's new files to its targets and nowhere else, as
// `weft entry set --pool` asks, and says so in `weft entry info`; what cannot work is
// refused with the reason: a pattern wider than its pool, an unknown pool, a pool name taken,
// removing a pool that holds targets, a mirror group across two pools, half a mirror group
// moved. Method: a cluster of two storage servers with two targets each, the `weft` commands
// an operator types, files written through the mount, their layouts read back.
#[test]
fn a_pool_holds_the_new_files_of_its_directories() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let mgmt = cluster.mgmt().to_string();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--mgmt", mgmt.as_str()]);
        weft(&cluster, &all)
    };

    let (ok, out, err) = run(&["pool", "create", "fast", "--targets", "2,4"]);
    assert!(ok, "pool create: {err}");
    assert!(out.contains("storage pool fast (2) created"), "{out}");
    let (ok, list, err) = run(&["pool", "list"]);
    assert!(ok, "{err}");
    assert_eq!(row_of(&list, "default"), "1,3", "{list}");
    assert_eq!(row_of(&list, "fast"), "2,4", "{list}");
    let (_, metrics) =
        weft_testkit::http_get(&cluster.address_of("mgmt").expect("mgmt"), "/metrics")
            .expect("metrics");
    let targets = |pool: &str| -> u64 {
        metrics
            .lines()
            .filter(|line| {
                line.starts_with("weft_pool_targets{") && line.contains(&format!("pool=\"{pool}\""))
            })
            .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!((targets("default"), targets("fast")), (2, 2), "{metrics}");

    let dir = mnt.join("fast");
    let info = make_dir_with_pattern(&cluster, &dir, &["--pool", "fast", "--num-targets", "2"]);
    assert!(info.contains("+ Storage Pool: fast (2)"), "{info}");
    for index in 0..8 {
        let file = dir.join(format!("f{index}"));
        fs::write(&file, vec![index as u8; 3 << 20]).expect("write");
        let (mut targets, info) = common::layout_targets(&cluster, &file);
        targets.sort_unstable();
        assert_eq!(targets, vec![2, 4], "{info}");
        assert!(info.contains("+ Storage Pool: fast (2)"), "{info}");
        assert_eq!(fs::read(&file).expect("read"), vec![index as u8; 3 << 20]);
    }
    // A subdirectory inherits the pool.
    fs::create_dir(dir.join("sub")).expect("mkdir");
    fs::write(dir.join("sub/g"), b"inherited").expect("write");
    let (mut targets, info) = common::layout_targets(&cluster, &dir.join("sub/g"));
    targets.sort_unstable();
    assert_eq!(targets, vec![2, 4], "{info}");

    let path = dir.display().to_string();
    let (ok, _, err) = run(&["entry", "set", "--num-targets", "3", &path]);
    assert!(!ok, "three targets asked of a pool of two");
    assert!(
        err.contains("storage pool 2 has 2 targets, fewer than the 3 asked"),
        "{err}"
    );
    let (ok, _, err) = run(&["entry", "set", "--pool", "slow", &path]);
    assert!(
        !ok && err.contains("there is no storage pool \"slow\""),
        "{err}"
    );
    let (ok, _, err) = run(&["pool", "create", "fast"]);
    assert!(!ok && err.contains("is called \"fast\" already"), "{err}");
    let (ok, _, err) = run(&["pool", "remove", "fast"]);
    assert!(!ok && err.contains("still holds targets 2, 4"), "{err}");
    let (ok, _, err) = run(&["mirror", "create", "storage", "--members", "1,4"]);
    assert!(!ok && err.contains("different storage pools"), "{err}");

    // A mirror group moves whole.
    let (ok, _, err) = run(&["mirror", "create", "storage", "--members", "2,4"]);
    assert!(ok, "a group inside the pool: {err}");
    let (ok, _, err) = run(&["pool", "remove-target", "fast", "--targets", "2"]);
    assert!(!ok && err.contains("a group moves whole"), "{err}");
    let mirrored = mnt.join("fast-mirrored");
    make_dir_with_pattern(
        &cluster,
        &mirrored,
        &[
            "--pool",
            "fast",
            "--pattern",
            "mirrored",
            "--num-targets",
            "1",
        ],
    );
    fs::write(mirrored.join("m"), b"mirrored in fast").expect("write");
    let (_, info) = common::layout_targets(&cluster, &mirrored.join("m"));
    assert!(info.contains("group 1"), "{info}");

    // Emptied, the pool can go; its files stay readable where they are.
    let (ok, _, err) = run(&["pool", "remove-target", "fast", "--mirror-groups", "1"]);
    assert!(ok, "{err}");
    let (ok, _, err) = run(&["pool", "remove", "fast"]);
    assert!(ok, "{err}");
    assert_eq!(fs::read(dir.join("f3")).expect("read"), vec![3u8; 3 << 20]);
    assert_eq!(
        fs::read(mirrored.join("m")).expect("read"),
        b"mirrored in fast"
    );
    let (ok, list, _) = run(&["pool", "list"]);
    assert!(ok && !list.contains("fast"), "{list}");
    assert_eq!(row_of(&list, "default"), "1,2,3,4", "{list}");
}

// Goal: a change of the cluster map reaches the servers and clients that follow it as it
// happens, not at their next fetch: a view of the map that never fetches it again learns of
// a new pool and of new limits; every server exports the epoch of the map it holds, and
// catches up with management's. Method: a cluster of real processes, a `ClusterView` that
// follows management (as every server and mount does) after one fetch, `weft pool`
// commands.
#[test]
fn a_map_change_reaches_its_followers_as_it_happens() {
    let cluster = cluster(ClusterSpec::default());
    let runtime = common::runtime();
    let view = std::sync::Arc::new(weft_net::ClusterView::new(
        cluster.mgmt(),
        common::member_options(&cluster),
    ));
    let first = runtime
        .block_on(async {
            let map = view.refresh().await;
            view.follow();
            map
        })
        .expect("the map");
    assert!(
        first.epoch > 0,
        "management of this version numbers its maps"
    );
    let mgmt = cluster.mgmt().to_string();
    let (ok, _, err) = weft(&cluster, &["pool", "create", "watched", "--mgmt", &mgmt]);
    assert!(ok, "{err}");
    weft_testkit::wait_until("the followed view to learn of the new pool", || {
        view.map().pools.iter().any(|pool| pool.name == "watched")
    })
    .expect("a new pool reaches the view");
    let (ok, _, err) = weft(
        &cluster,
        &[
            "pool",
            "set",
            "watched",
            "--low-free",
            "5G",
            "--mgmt",
            &mgmt,
        ],
    );
    assert!(ok, "{err}");
    weft_testkit::wait_until("the followed view to learn of the new limits", || {
        view.map()
            .pools
            .iter()
            .any(|pool| pool.name == "watched" && pool.low.free_bytes == 5 << 30)
    })
    .expect("new limits reach the view");
    assert!(view.map().epoch > first.epoch);
    wait_for_the_map(&cluster);
}

/// How many of `files` (in a directory of one-target files) lie on each of targets 1 to 3.
fn files_per_target(
    cluster: &weft_testkit::LocalCluster,
    files: &[std::path::PathBuf],
) -> [usize; 3] {
    let mut counts = [0; 3];
    for file in files {
        let (targets, info) = common::layout_targets(cluster, file);
        match targets[..] {
            [target @ 1..=3] => counts[target as usize - 1] += 1,
            _ => panic!("one target of 1 to 3: {info}"),
        }
    }
    counts
}

// Goal: targets filled unevenly level out: new files avoid a target below its pool's low
// limit while others are normal, and with the balanced chooser the fuller of normal targets
// gets fewer new files than the emptier ones, but some. Method: three storage servers of one
// 64 MiB target each; 40 MiB written onto target 1 alone (through a pool of its own, then
// given back to the default pool); the default pool's low limit set above and then below
// target 1's free space; 90 new one-target files each time, their targets read back.
#[test]
fn new_files_go_to_the_emptier_targets() {
    let mut cluster = cluster(ClusterSpec {
        storage: 3,
        targets_per_storage: 1,
        target_capacity_bytes: Some(64 << 20),
        // Placement alone: rebalancing would move the filled target's data meanwhile.
        meta_settings: vec![
            "target_chooser=\"balanced\"".into(),
            "rebalance_bytes_per_second=0".into(),
        ],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let run = |args: &[&str]| run_ok(&cluster, args);
    run(&["pool", "create", "fill", "--targets", "1"]);
    make_dir_with_pattern(
        &cluster,
        &mnt.join("fill"),
        &["--pool", "fill", "--num-targets", "1"],
    );
    common::write_synced(&mnt.join("fill/big"), &vec![7u8; 40 << 20]);
    run(&["pool", "remove-target", "fill", "--targets", "1"]);
    make_dir_with_pattern(&cluster, &mnt.join("even"), &["--num-targets", "1"]);

    // Target 1 has 24 MiB free: below a low limit of 32 MiB.
    run(&[
        "pool",
        "set",
        "default",
        "--low-free",
        "32M",
        "--emergency-free",
        "1M",
    ]);
    weft_testkit::wait_until("target 1 to report its usage and be low", || {
        run(&["pool", "list"])
            .lines()
            .any(|line| line.contains(" default ") && line.contains("2 normal, 1 low"))
    })
    .expect("target 1 is low");
    wait_for_the_map(&cluster);
    let files: Vec<_> = (0..90).map(|i| mnt.join(format!("even/low-{i}"))).collect();
    for file in &files {
        fs::write(file, b"x").expect("create");
    }
    let counts = files_per_target(&cluster, &files);
    assert_eq!(counts[0], 0, "no new file on the low target: {counts:?}");

    // Below its free space, the limit leaves target 1 normal: it gets files again, fewer.
    run(&["pool", "set", "default", "--low-free", "8M"]);
    weft_testkit::wait_until("target 1 to be normal again", || {
        run(&["pool", "list"])
            .lines()
            .any(|line| line.contains(" default ") && line.contains("3 normal, 0 low"))
    })
    .expect("target 1 is normal");
    wait_for_the_map(&cluster);
    let files: Vec<_> = (0..90)
        .map(|i| mnt.join(format!("even/normal-{i}")))
        .collect();
    for file in &files {
        fs::write(file, b"x").expect("create");
    }
    let counts = files_per_target(&cluster, &files);
    // By free space, 24 : 64 : 64 of 90 files: about 14, 38 and 38.
    assert!(
        counts[0] > 0,
        "the fuller target still gets some: {counts:?}"
    );
    assert!(
        counts[0] < counts[1] && counts[0] < counts[2],
        "the fuller target gets fewer: {counts:?}"
    );
    assert_eq!(
        fs::read(mnt.join("fill/big")).expect("read").len(),
        40 << 20
    );
}
