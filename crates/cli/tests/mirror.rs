//! Mirror groups: defined, checked, paired across nodes, listed, kept across a restart.

mod common;

use common::{cluster, weft};
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
