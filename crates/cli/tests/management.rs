//! Replicated management: three management servers replicate what management stores; the
//! leader killed under a write load is replaced by another, every node and mount follows it,
//! and nothing registered is lost.

mod common;

use common::{binary, cluster, run, verify, weft, Writer, RECORD_BYTES};
use std::fs;
use std::process::Command;
use weft_net::MgmtCalls;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

/// What management lists of nodes and targets, without what changes by itself (reachability,
/// space).
fn registered(cluster: &LocalCluster) -> (Vec<String>, Vec<String>) {
    // The columns of each listed row to keep, by index.
    let rows = |args: &[&str], columns: &[usize]| -> Vec<String> {
        let (ok, out, err) = weft(cluster, args);
        assert!(ok, "{args:?}: {err}");
        out.lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .filter(|fields| fields.first().is_some_and(|id| id.parse::<u32>().is_ok()))
            .map(|fields| {
                let kept: Vec<&str> = columns
                    .iter()
                    .filter_map(|&i| fields.get(i).copied())
                    .collect();
                kept.join(" ")
            })
            .collect()
    };
    // Id, alias and addresses of nodes (not their state); id and node of targets.
    let nodes = rows(&["node", "list", "--mgmt", cluster.mgmt()], &[0, 1, 3]);
    let targets = rows(&["target", "list", "--mgmt", cluster.mgmt()], &[0, 1]);
    (nodes, targets)
}

/// Pairs the two storage targets into a mirror group, once both members are good.
fn mirror_the_targets(cluster: &LocalCluster) {
    common::autocreate_storage_groups(cluster);
    wait_until("both members good", || {
        let (_, list, _) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
        list.matches("(good)").count() == 2
    })
    .expect("group formed");
}

fn assert_group_whole(cluster: &LocalCluster) {
    let (ok, list, err) = weft(cluster, &["mirror", "list", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{err}");
    assert_eq!(
        list.matches("(good)").count(),
        2,
        "the group is whole: {list}"
    );
}

/// A cluster of `replicas` management servers, a metadata server and two storage servers
/// whose targets are mirrored, mounted, with what it registered and a writer of `file`
/// (records of `seed`) past its first records.
struct Writing {
    cluster: LocalCluster,
    before: (Vec<String>, Vec<String>),
    mount: std::path::PathBuf,
    writer: Writer,
}

fn writing_under(replicas: usize, seed: u64) -> Writing {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        mgmt_replicas: replicas,
        ..ClusterSpec::default()
    });
    mirror_the_targets(&cluster);
    let before = registered(&cluster);
    assert_eq!(
        before.0.len(),
        3,
        "a metadata and two storage nodes: {before:?}"
    );
    let mount = cluster.mount().expect("mount");
    let writer = Writer::start(mount.join("file"), seed);
    writer.advance(4 * RECORD_BYTES as u64, "the first records");
    Writing {
        cluster,
        before,
        mount,
        writer,
    }
}

// Goal: with three management servers, killing the leader while a mirrored file is written
// costs a pause, not an error: another server is elected, the storage servers' leases and the
// mount's session are renewed by it, a new mount registers with it, and every node, target and
// mirror group registered before is still there — also after the old leader comes back and
// the leader is killed once more, and after every management server restarts at once.
#[test]
fn management_survives_the_loss_of_its_leader() {
    let Writing {
        mut cluster,
        before,
        mount,
        writer,
    } = writing_under(3, 7);

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
    // Every management server killed at once and started again: what the log committed is
    // there, and a leader serves it.
    for name in ["mgmt-1", "mgmt-2", "mgmt-3"] {
        cluster.kill(name).expect("kill");
    }
    for name in ["mgmt-1", "mgmt-2", "mgmt-3"] {
        cluster.restart(name).expect("start again");
    }
    cluster.mgmt_leader().expect("a leader after all restarted");
    assert_eq!(
        registered(&cluster),
        before,
        "nothing registered is lost when every management server restarts"
    );
    assert_group_whole(&cluster);
    common::fsck_clean(&cluster);
}

// Goal: five management servers outlive two of them: the leader killed, and then the next
// leader too, leaves a majority of three that elects a third; writes to a mirrored file go on
// throughout, and nothing registered is lost. Method: as above, with five servers and no
// restart between the two kills.
#[test]
fn five_management_servers_survive_the_loss_of_two() {
    let Writing {
        mut cluster,
        before,
        mount,
        writer,
    } = writing_under(5, 9);
    let mut killed = Vec::new();
    for round in 1..=2 {
        let leader = cluster.mgmt_leader().expect("a leader");
        assert!(!killed.contains(&leader), "round {round}: {leader} is dead");
        cluster.kill(&leader).expect("kill the leader");
        killed.push(leader);
        writer.advance(
            8 * RECORD_BYTES as u64,
            &format!(
                "writes after {} of five management servers were killed",
                killed.len()
            ),
        );
        assert_eq!(
            registered(&cluster),
            before,
            "round {round}: nothing registered is lost"
        );
    }
    for name in &killed {
        cluster.restart(name).expect("start again");
    }
    let records = writer.stop();
    verify(&mount.join("file"), 9, records);
    assert_group_whole(&cluster);
}

// Goal: a management leader cut off from the other management servers, while the storage
// servers and the mount still reach it, stops serving before another is elected (no two
// leaders renew leases at once): the mirrored file's writes go on under the new leader, nothing
// registered is lost, and once the path is mended the old leader follows the new one.
#[test]
fn a_leader_cut_off_from_the_other_management_servers_gives_way() {
    let mut cluster = cluster(ClusterSpec {
        storage: 2,
        targets_per_storage: 1,
        mgmt_replicas: 3,
        netns: true,
        ..ClusterSpec::default()
    });
    mirror_the_targets(&cluster);
    let before = registered(&cluster);
    let mount = cluster.mount().expect("mount");
    let writer = Writer::start(mount.join("file"), 9);
    writer.advance(4 * RECORD_BYTES as u64, "the first records");

    let leader = cluster.mgmt_leader().expect("a leader");
    let others: Vec<String> = (1..=3)
        .map(|index| format!("mgmt-{index}"))
        .filter(|name| *name != leader)
        .collect();
    for other in &others {
        cluster
            .set_path(&leader, other, false)
            .expect("cut the path");
    }
    let address = cluster.address_of(&leader).expect("address");
    wait_until("the cut-off leader to stop serving", || {
        !weft(&cluster, &["node", "list", "--mgmt", &address]).0
    })
    .expect("a leader without its majority stops serving");
    let next = cluster.mgmt_leader().expect("another leader");
    assert_ne!(next, leader, "another server leads");
    writer.advance(
        8 * RECORD_BYTES as u64,
        "writes while management's old leader is cut off from the others",
    );
    assert_eq!(registered(&cluster), before, "nothing registered is lost");

    for other in &others {
        cluster
            .set_path(&leader, other, true)
            .expect("mend the path");
    }
    wait_until("the old leader to follow the new one", || {
        let (ok, _, err) = weft(&cluster, &["node", "list", "--mgmt", &address]);
        !ok && err.contains("the leader is at")
    })
    .expect("the old leader names the new one");
    writer.advance(4 * RECORD_BYTES as u64, "writes after the path is mended");
    let records = writer.stop();
    verify(&mount.join("file"), 9, records);
    assert_group_whole(&cluster);
    common::fsck_clean(&cluster);
}

// Goal: the settings of a replicated management are checked, with what to do, and a server's
// store that holds a single management server's state is not taken over by a replica (the
// other replicas would not hold it). Method: `weft serve mgmt` with two replicas, with no
// `replica`, and with three replicas over the data directory of a management that ran alone.
#[test]
fn replicated_management_settings_are_checked() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().display().to_string();
    let serve = |settings: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["serve", "mgmt", "--data-dir", &data]
            .into_iter()
            .chain(["--listen", "127.0.0.1:0", "--set", r#"auth="none""#])
            .map(str::to_string)
            .collect();
        for setting in settings {
            args.extend(["--set".to_string(), setting.to_string()]);
        }
        args
    };
    let run_with = |settings: &[&str]| {
        let args = serve(settings);
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let three = r#"replicas=["127.0.0.1:1","127.0.0.1:2","127.0.0.1:3"]"#;
    let (ok, output) = run_with(&[r#"replicas=["127.0.0.1:1","127.0.0.1:2"]"#, "replica=1"]);
    assert!(!ok);
    assert!(output.contains("list 3 or 5"), "{output}");
    let (ok, output) = run_with(&[three]);
    assert!(!ok);
    assert!(output.contains("replica = 0 does not name"), "{output}");

    let log = directory.path().join("alone.log");
    let mut alone = Command::new(binary())
        .args(serve(&[]))
        .env("WEFT_LOG", "info")
        .stderr(fs::File::create(&log).expect("log"))
        .spawn()
        .expect("weft runs");
    wait_until("management to serve", || {
        fs::read_to_string(&log).is_ok_and(|text| text.contains("management serving"))
    })
    .expect("a management server alone starts");
    let _ = alone.kill();
    let _ = alone.wait();
    let (ok, output) = run_with(&[three, "replica=1"]);
    assert!(!ok, "{output}");
    assert!(
        output.contains("was not replicated") && output.contains("empty data directories"),
        "{output}"
    );
}

// Goal: a management server started again does not give the directory-rename lock to one
// metadata server while another may still hold the lease granted before the restart (two
// renames of directories between parents at once could make a loop no one checked). Method:
// one management server, with a rename-lock lease long enough that the restart is surely
// within it; metadata node 1's lock is taken by hand; management is restarted; node 2's request
// is refused with WouldBlock until the lease ran out, and granted after it.
#[test]
fn a_restarted_management_waits_out_the_rename_lock_lease() {
    use weft_proto::ids::NodeId;
    let lease = std::time::Duration::from_secs(15);
    let mut cluster = cluster(ClusterSpec {
        mgmt_settings: vec![format!("rename_lock_lease_ms={}", lease.as_millis())],
        ..ClusterSpec::default()
    });
    let runtime = common::runtime();
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    let acquire = |node: u32, token: u64| {
        runtime.block_on(view.mgmt().acquire_rename_lock(NodeId(node), token))
    };
    acquire(1, 1).expect("a fresh management grants the lock at once");
    let granted = std::time::Instant::now();
    cluster.restart("mgmt").expect("restart management");
    cluster.wait_ready().expect("ready");
    let refused = acquire(2, 2);
    assert!(
        granted.elapsed() < lease,
        "the restart took longer than the lease: the test proves nothing"
    );
    assert_eq!(
        refused.as_ref().err().map(weft_net::RpcError::code),
        Some(weft_proto::ErrorCode::WouldBlock),
        "the lock granted before the restart may still be held: {refused:?}"
    );
    wait_until("the lock once the lease ran out", || acquire(2, 2).is_ok())
        .expect("granted after the lease");
}
