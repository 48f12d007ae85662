//! Mirror groups: defined, checked, paired across nodes, listed, kept across a restart.

#[path = "../common/mod.rs"]
mod common;

use common::{cluster, weft};
use weft_proto::ids::{GroupId, GroupVersion};
use weft_testkit::ClusterSpec;

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

mod copies;
mod survival;
