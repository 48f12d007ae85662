//! Capacity as operators run it: storage pools (which targets a directory's new files land
//! on), capacity classes that keep new files off full targets, and placement that keeps
//! targets level.

mod common;

use common::{cluster, make_dir_with_pattern, weft};
use std::fs;
use std::path::Path;
use weft_testkit::ClusterSpec;

/// The targets `weft entry info` lists for a file.
fn targets_of(cluster: &weft_testkit::LocalCluster, file: &Path) -> (Vec<u32>, String) {
    let path = file.display().to_string();
    let (ok, info, err) = weft(cluster, &["entry", "info", &path, "--mgmt", cluster.mgmt()]);
    assert!(ok, "entry info {path}: {err}");
    let targets = info
        .lines()
        .filter_map(|line| line.strip_prefix("  + "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|id| id.parse().ok())
        .collect();
    (targets, info)
}

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

    let dir = mnt.join("fast");
    let info = make_dir_with_pattern(&cluster, &dir, &["--pool", "fast", "--num-targets", "2"]);
    assert!(info.contains("+ Storage Pool: fast (2)"), "{info}");
    for index in 0..8 {
        let file = dir.join(format!("f{index}"));
        fs::write(&file, vec![index as u8; 3 << 20]).expect("write");
        let (mut targets, info) = targets_of(&cluster, &file);
        targets.sort_unstable();
        assert_eq!(targets, vec![2, 4], "{info}");
        assert!(info.contains("+ Storage Pool: fast (2)"), "{info}");
        assert_eq!(fs::read(&file).expect("read"), vec![index as u8; 3 << 20]);
    }
    // A subdirectory inherits the pool.
    fs::create_dir(dir.join("sub")).expect("mkdir");
    fs::write(dir.join("sub/g"), b"inherited").expect("write");
    let (mut targets, info) = targets_of(&cluster, &dir.join("sub/g"));
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
    let (_, info) = targets_of(&cluster, &mirrored.join("m"));
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

fn row_of(list: &str, name: &str) -> String {
    list.lines()
        .find(|line| line.split_whitespace().nth(1) == Some(name))
        .and_then(|line| line.split_whitespace().nth(2))
        .unwrap_or_default()
        .to_string()
}
