//! Replicated management: three management servers replicate what management stores; the
//! leader killed under a write load is replaced by another, every node and mount follows it,
//! and nothing registered is lost.

mod common;

use common::{cluster, verify, weft, Writer, RECORD_BYTES};
use weft_testkit::{ClusterSpec, LocalCluster};

/// What management lists of nodes and targets, without what changes by itself (reachability,
/// space).
fn registered(cluster: &LocalCluster) -> (Vec<String>, Vec<String>) {
    let first_fields = |args: &[&str], fields: usize| -> Vec<String> {
        let (ok, out, err) = weft(cluster, args);
        assert!(ok, "{args:?}: {err}");
        out.lines()
            .map(|line| line.split_whitespace().take(fields).collect::<Vec<_>>())
            .filter(|fields| fields.first().is_some_and(|id| id.parse::<u32>().is_ok()))
            .map(|fields| fields.join(" "))
            .collect()
    };
    let nodes = first_fields(&["node", "list", "--mgmt", cluster.mgmt()], 4);
    let targets = first_fields(&["target", "list", "--mgmt", cluster.mgmt()], 2);
    (nodes, targets)
}

// Goal: with three management servers, killing the leader while a mirrored file is written
// costs a pause, not an error: another server is elected, the storage servers' leases and the
// mount's session are renewed by it, a new mount registers with it, and every node, target and
// mirror group registered before is still there — also after the old leader comes back and
// the leader is killed once more.
#[test]
fn management_survives_the_loss_of_its_leader() {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        mgmt_replicas: 3,
        ..ClusterSpec::default()
    });
    common::autocreate_storage_groups(&cluster);
    weft_testkit::wait_until("both members good", || {
        let (_, list, _) = weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.matches("(good)").count() == 2
    })
    .expect("group formed");
    let before = registered(&cluster);
    assert_eq!(
        before.0.len(),
        3,
        "a metadata and two storage nodes: {before:?}"
    );
    let mount = cluster.mount().expect("mount");
    let writer = Writer::start(mount.join("file"), 7);
    writer.advance(4 * RECORD_BYTES as u64, "the first records");

    for round in 1..=2 {
        let leader = cluster.mgmt_leader().expect("a leader");
        cluster.kill(&leader).expect("kill the leader");
        let next = cluster.mgmt_leader().expect("another leader");
        assert_ne!(next, leader, "round {round}: another server leads");
        writer.advance(
            8 * RECORD_BYTES as u64,
            &format!("writes after management's leader {leader} was killed"),
        );
        assert_eq!(
            registered(&cluster),
            before,
            "round {round}: nothing registered is lost"
        );
        // A new mount registers its session with the new leader and reads what was written.
        let second = cluster.mount().expect("a mount after the leader changed");
        assert!(
            std::fs::metadata(second.join("file")).is_ok(),
            "round {round}: the new mount sees the file"
        );
        cluster.restart(&leader).expect("the old leader comes back");
    }
    let records = writer.stop();
    verify(&mount.join("file"), 7, records);
    let (ok, list, err) = weft(&cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{err}");
    assert_eq!(
        list.matches("(good)").count(),
        2,
        "the group is whole: {list}"
    );
    common::fsck_clean(&cluster);
}
