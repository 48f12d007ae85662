//! The namespace over several metadata servers: directories placed on any of them, files with
//! their directory, and mkdir / rmdir across servers that survive a crash of the coordinating
//! server at every step (fault-injection points), checked with `weft fsck`.

mod common;

use common::{cluster, crash_during, errno, fsck_clean, metadata_node};
use std::fs;
use std::path::{Path, PathBuf};
use weft_service::durable::rename_with_flags;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

// Goal: with three metadata servers, new directories spread over all of them, files live with
// their directory, and everyday operations — directory moves included — work the same
// whichever server holds what.
// Method: make directories and files through the mount and read `weft entry info`.
#[test]
fn directories_spread_over_metadata_servers() {
    let mut cluster = cluster(ClusterSpec {
        meta: 3,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    // Round-robin placement over the servers each coordinator knows; a server's map may lag a
    // heartbeat behind management, so directories are made until all three have one.
    let mut homes = std::collections::BTreeSet::new();
    let mut count = 0;
    wait_until("directories on every metadata server", || {
        let dir = mnt.join(format!("d{count}"));
        fs::create_dir(&dir).expect("mkdir");
        homes.insert(metadata_node(&cluster, &dir));
        count += 1;
        homes.len() == 3
    })
    .expect("spread");
    assert!(count <= 64, "placement reaches every server quickly");
    for index in 0..count {
        let dir = mnt.join(format!("d{index}"));
        fs::write(dir.join("file"), format!("in {index}")).expect("a file in it");
        fs::create_dir(dir.join("sub")).expect("a subdirectory in it");
        let home = metadata_node(&cluster, &dir);
        assert_eq!(
            metadata_node(&cluster, &dir.join("file")),
            home,
            "a file lives with its directory"
        );
    }

    let listed: Vec<String> = fs::read_dir(&mnt)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed.len(), count);
    for index in 0..count {
        let dir = mnt.join(format!("d{index}"));
        assert_eq!(
            fs::read_to_string(dir.join("file")).expect("read"),
            format!("in {index}")
        );
        assert_eq!(errno(fs::remove_dir(&dir)), libc::ENOTEMPTY);
        let status = std::process::Command::new("mv")
            .arg(dir.join("file"))
            .arg(mnt.join(format!("moved-{index}")))
            .status()
            .expect("mv");
        assert!(
            status.success(),
            "mv between directories works whichever servers hold them"
        );
        fs::remove_dir(dir.join("sub")).expect("rmdir sub");
        fs::remove_dir(&dir).expect("rmdir");
        assert_eq!(errno(fs::metadata(&dir)), libc::ENOENT);
    }
    // A directory that lives on another server than its dentry moves like any other.
    let tree = mnt.join("tree");
    fs::create_dir(&tree).expect("mkdir");
    let remote = wait_for_remote_child(&cluster, &tree);
    fs::write(remote.join("leaf"), b"leaf").expect("file in the remote directory");
    let links_before = fs::metadata(&tree).expect("stat").nlink();
    fs::rename(&remote, mnt.join("renamed")).expect("rename a directory living elsewhere");
    assert_eq!(
        fs::read(mnt.join("renamed/leaf")).expect("moved with its contents"),
        b"leaf"
    );
    assert_eq!(
        fs::metadata(&tree).expect("stat").nlink(),
        links_before - 1,
        "the old parent lost a link"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(mnt.join("renamed/..")).expect("stat").ino(),
        fs::metadata(&mnt).expect("stat").ino(),
        "`..` follows the move"
    );
    fsck_clean(&cluster);
}

/// Makes subdirectories of `parent` until one lives on another metadata server than `parent`.
fn wait_for_remote_child(cluster: &LocalCluster, parent: &Path) -> PathBuf {
    let home = metadata_node(cluster, parent);
    let mut found = None;
    let mut index = 0;
    wait_until("a subdirectory on another metadata server", || {
        let child = parent.join(format!("c{index}"));
        index += 1;
        fs::create_dir(&child).expect("mkdir");
        let remote = metadata_node(cluster, &child) != home;
        if remote {
            found = Some(child);
        }
        remote
    })
    .expect("remote child");
    found.expect("found")
}

// Goal: a mkdir whose directory goes to another metadata server is all-or-nothing when the
// coordinating server crashes after recording its intent, or after the other server created the
// inode: after the restart the mkdir completes, the directory works, and fsck finds no orphan.
// Method: fault-injection points end meta-1 at each step; the client retries through it.
#[test]
fn mkdir_across_servers_survives_a_crash_at_every_step() {
    for point in ["mkdir-after-intent", "mkdir-after-remote-create"] {
        let mut cluster = cluster(ClusterSpec {
            meta: 2,
            ..ClusterSpec::default()
        });
        let mnt = cluster.mount().expect("mount");
        // Round-robin placement: of four directories, two go to the other server.
        let paths: Vec<PathBuf> = (0..4).map(|i| mnt.join(format!("{point}-{i}"))).collect();
        let results = crash_during(&mut cluster, point, paths.clone(), |p| fs::create_dir(p));
        for (path, result) in paths.iter().zip(results) {
            result.unwrap_or_else(|error| {
                panic!("{point}: mkdir {} failed: {error}", path.display())
            });
            fs::write(path.join("inside"), b"ok")
                .unwrap_or_else(|e| panic!("{point}: {} is usable: {e}", path.display()));
        }
        let homes: std::collections::BTreeSet<String> =
            paths.iter().map(|p| metadata_node(&cluster, p)).collect();
        assert_eq!(
            homes.len(),
            2,
            "{point}: some directories went to the other server"
        );
        fsck_clean(&cluster);
    }
}

// Goal: an rmdir of a directory on another metadata server completes when the coordinating
// server crashes after recording its intent or after the other server removed the inode.
// Method: as for mkdir, with directories made before arming the point.
#[test]
fn rmdir_across_servers_survives_a_crash_at_every_step() {
    for point in ["rmdir-after-intent", "rmdir-after-remote-remove"] {
        let mut cluster = cluster(ClusterSpec {
            meta: 2,
            ..ClusterSpec::default()
        });
        let mnt = cluster.mount().expect("mount");
        // Directories until two live on the other server (meta-1 learns of meta-2 within a
        // heartbeat of its start).
        let mut paths: Vec<PathBuf> = Vec::new();
        wait_until("two directories on meta-2", || {
            let path = mnt.join(format!("{point}-{}", paths.len()));
            fs::create_dir(&path).expect("mkdir");
            paths.push(path);
            paths
                .iter()
                .filter(|p| metadata_node(&cluster, p).starts_with("meta-2"))
                .count()
                >= 2
        })
        .expect("remote directories");
        let results = crash_during(&mut cluster, point, paths.clone(), |p| fs::remove_dir(p));
        for (path, result) in paths.iter().zip(results) {
            result.unwrap_or_else(|error| {
                panic!("{point}: rmdir {} failed: {error}", path.display())
            });
            assert_eq!(
                errno(fs::metadata(path)),
                libc::ENOENT,
                "{point}: {} is gone",
                path.display()
            );
        }
        fsck_clean(&cluster);
    }
}

/// A directory on meta-1 and one on meta-2 (made until placement puts one there).
fn dirs_on_both_servers(cluster: &LocalCluster, mnt: &Path, prefix: &str) -> (PathBuf, PathBuf) {
    let mut on_first = None;
    let mut on_second = None;
    let mut index = 0;
    wait_until("a directory on each metadata server", || {
        let dir = mnt.join(format!("{prefix}{index}"));
        index += 1;
        fs::create_dir(&dir).expect("mkdir");
        if metadata_node(cluster, &dir).starts_with("meta-2") {
            on_second.get_or_insert(dir);
        } else {
            on_first.get_or_insert(dir);
        }
        on_first.is_some() && on_second.is_some()
    })
    .expect("directories on both servers");
    (on_first.expect("first"), on_second.expect("second"))
}

// Goal: hard links work between directories on different metadata servers: the link count is
// right from either name, the data stays reachable after the original name goes, and the file
// goes with its last name. Method: link from a directory on meta-1 into one on meta-2.
#[test]
fn hard_links_across_servers() {
    use std::os::unix::fs::MetadataExt;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let (first, second) = dirs_on_both_servers(&cluster, &mnt, "hl");
    let original = first.join("file");
    fs::write(&original, b"shared bytes").expect("write");
    let linked = second.join("link");
    fs::hard_link(&original, &linked).expect("link across servers");
    assert_eq!(fs::metadata(&original).expect("stat").nlink(), 2);
    assert_eq!(fs::metadata(&linked).expect("stat").nlink(), 2);
    assert_eq!(
        fs::metadata(&linked).expect("stat").ino(),
        fs::metadata(&original).expect("stat").ino()
    );
    fsck_clean(&cluster);
    fs::remove_file(&original).expect("unlink the original");
    assert_eq!(
        fs::read(&linked).expect("read through the link"),
        b"shared bytes"
    );
    assert_eq!(fs::metadata(&linked).expect("stat").nlink(), 1);
    fs::remove_file(&linked).expect("unlink the last name");
    assert_eq!(errno(fs::metadata(&linked)), libc::ENOENT);
    fsck_clean(&cluster);
}

// Goal: a cross-server link and unlink complete when the coordinating server crashes after
// each step. Method: fault-injection points on the server holding the new dentry (meta-2 for
// the link, and for the unlink of that name), the client retrying through the restart.
#[test]
fn links_across_servers_survive_a_crash_at_every_step() {
    for (point, service) in [
        ("link-after-intent", "meta-2"),
        ("link-after-remote", "meta-2"),
        ("unlink-after-intent", "meta-2"),
        ("unlink-after-remote", "meta-2"),
    ] {
        let mut cluster = cluster(ClusterSpec {
            meta: 2,
            ..ClusterSpec::default()
        });
        let mnt = cluster.mount().expect("mount");
        let (first, second) = dirs_on_both_servers(&cluster, &mnt, "d");
        let original = first.join("file");
        fs::write(&original, b"data").expect("write");
        let linked = second.join("link");
        let linking = point.starts_with("link");
        if !linking {
            fs::hard_link(&original, &linked).expect("link");
        }
        cluster
            .set_env(service, &[("WEFT_FAILPOINTS", point)])
            .expect("arm");
        cluster.restart(service).expect("restart armed");
        cluster.wait_ready().expect("ready");
        let (source, target) = (original.clone(), linked.clone());
        let worker = std::thread::spawn(move || {
            if linking {
                fs::hard_link(&source, &target)
            } else {
                fs::remove_file(&target)
            }
        });
        wait_until(&format!("{service} to crash at {point}"), || {
            cluster.has_exited(service)
        })
        .expect("crashed");
        cluster.set_env(service, &[]).expect("disarm");
        cluster.restart(service).expect("restart");
        worker
            .join()
            .expect("worker")
            .unwrap_or_else(|error| panic!("{point}: the operation failed: {error}"));
        use std::os::unix::fs::MetadataExt;
        if linking {
            assert_eq!(fs::metadata(&linked).expect("stat").nlink(), 2, "{point}");
        } else {
            assert_eq!(errno(fs::metadata(&linked)), libc::ENOENT, "{point}");
            assert_eq!(fs::metadata(&original).expect("stat").nlink(), 1, "{point}");
        }
        assert_eq!(fs::read(&original).expect("read"), b"data");
        fsck_clean(&cluster);
    }
}

// Goal: files move between directories on different metadata servers with rename(2), also
// over an existing file there, and RENAME_NOREPLACE is honoured; a rename that crashes the
// coordinating server after any step completes after its restart. Method: a directory on each
// server; plain renames, then fault-injection points on meta-1 (the old name's server).
#[test]
fn renames_across_servers() {
    use std::os::unix::fs::MetadataExt;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let (first, second) = dirs_on_both_servers(&cluster, &mnt, "r");
    fs::write(first.join("a"), b"moving").expect("write");
    let inode = fs::metadata(first.join("a")).expect("stat").ino();
    fs::rename(first.join("a"), second.join("a")).expect("rename across servers");
    assert_eq!(errno(fs::metadata(first.join("a"))), libc::ENOENT);
    assert_eq!(fs::read(second.join("a")).expect("read"), b"moving");
    assert_eq!(
        fs::metadata(second.join("a")).expect("stat").ino(),
        inode,
        "the same file, not a copy"
    );
    fs::write(first.join("b"), b"replacing").expect("write");
    fs::rename(first.join("b"), second.join("a")).expect("rename over a file on the other server");
    assert_eq!(fs::read(second.join("a")).expect("read"), b"replacing");
    // The moved file's inode stays on meta-1; renaming it within its new directory moves only
    // its dentry.
    let ctime = |path: &Path| {
        let meta = fs::metadata(path).expect("stat");
        (meta.ctime(), meta.ctime_nsec())
    };
    let before = ctime(&second.join("a"));
    fs::rename(second.join("a"), second.join("a2")).expect("rename a moved file in place");
    assert!(
        ctime(&second.join("a2")) > before,
        "a rename changes the ctime of the renamed inode on the other server"
    );
    assert_eq!(fs::read(second.join("a2")).expect("read"), b"replacing");
    fsck_clean(&cluster);

    for point in ["rename-after-intent", "rename-after-remote"] {
        let source = first.join(point);
        let target = second.join(point);
        fs::write(&source, point.as_bytes()).expect("write");
        cluster
            .set_env("meta-1", &[("WEFT_FAILPOINTS", point)])
            .expect("arm");
        cluster.restart("meta-1").expect("restart armed");
        cluster.wait_ready().expect("ready");
        let (from, to) = (source.clone(), target.clone());
        let worker = std::thread::spawn(move || fs::rename(&from, &to));
        wait_until(&format!("meta-1 to crash at {point}"), || {
            cluster.has_exited("meta-1")
        })
        .expect("crashed");
        cluster.set_env("meta-1", &[]).expect("disarm");
        cluster.restart("meta-1").expect("restart");
        worker
            .join()
            .expect("worker")
            .unwrap_or_else(|error| panic!("{point}: rename failed: {error}"));
        assert_eq!(
            errno(fs::metadata(&source)),
            libc::ENOENT,
            "{point}: the old name is gone"
        );
        assert_eq!(
            fs::read(&target).expect("read"),
            point.as_bytes(),
            "{point}: the new name has the file"
        );
        fsck_clean(&cluster);
    }
}

// Goal: directories move between metadata servers; a move into the directory's own subtree is
// refused even when the chain of parents crosses servers; two concurrent moves that together
// would make a loop cannot both succeed (the cluster-wide rename lock); and a move completes
// when its coordinator crashes after any step. Method: directories on two servers, plain and
// concurrent renames, fault-injection points on meta-1; fsck after each.
#[test]
fn directories_move_across_servers() {
    use std::os::unix::fs::MetadataExt;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let (first, second) = dirs_on_both_servers(&cluster, &mnt, "m");
    fs::create_dir(first.join("a")).expect("mkdir");
    fs::write(first.join("a/file"), b"inside").expect("write");
    let second_links = fs::metadata(&second).expect("stat").nlink();
    fs::rename(first.join("a"), second.join("a")).expect("move a directory across servers");
    assert_eq!(fs::read(second.join("a/file")).expect("read"), b"inside");
    assert_eq!(
        fs::metadata(&second).expect("stat").nlink(),
        second_links + 1
    );
    assert_eq!(
        fs::metadata(second.join("a/..")).expect("stat").ino(),
        fs::metadata(&second).expect("stat").ino()
    );
    assert_eq!(
        errno(fs::rename(&second, second.join("a/inside"))),
        libc::EINVAL,
        "no move into its own subtree"
    );
    fsck_clean(&cluster);

    // Two moves that would make a loop together: at most one wins.
    let (x, y) = dirs_on_both_servers(&cluster, &mnt, "loop");
    let (x2, y2) = (x.clone(), y.clone());
    let one = std::thread::spawn(move || fs::rename(&x2, y2.join("x")));
    let (x3, y3) = (x.clone(), y.clone());
    let two = std::thread::spawn(move || fs::rename(&y3, x3.join("y")));
    let results = [one.join().expect("one"), two.join().expect("two")];
    assert!(
        results.iter().filter(|r| r.is_ok()).count() <= 1,
        "both moves succeeded: {results:?}"
    );
    fsck_clean(&cluster);

    for point in ["rename-after-intent", "rename-after-remote"] {
        let (from, to) = dirs_on_both_servers(&cluster, &mnt, point);
        let moving = from.join("moving");
        fs::create_dir(&moving).expect("mkdir");
        fs::write(moving.join("f"), point.as_bytes()).expect("write");
        let coordinator = if metadata_node(&cluster, &from).starts_with("meta-2") {
            "meta-2"
        } else {
            "meta-1"
        };
        cluster
            .set_env(coordinator, &[("WEFT_FAILPOINTS", point)])
            .expect("arm");
        cluster.restart(coordinator).expect("restart armed");
        cluster.wait_ready().expect("ready");
        let (source, target) = (moving.clone(), to.join("moved"));
        let worker = std::thread::spawn(move || fs::rename(&source, &target));
        wait_until(&format!("{coordinator} to crash at {point}"), || {
            cluster.has_exited(coordinator)
        })
        .expect("crashed");
        cluster.set_env(coordinator, &[]).expect("disarm");
        cluster.restart(coordinator).expect("restart");
        worker
            .join()
            .expect("worker")
            .unwrap_or_else(|error| panic!("{point}: move failed: {error}"));
        assert_eq!(
            fs::read(to.join("moved/f")).expect("read"),
            point.as_bytes(),
            "{point}"
        );
        assert_eq!(errno(fs::metadata(&moving)), libc::ENOENT, "{point}");
        fsck_clean(&cluster);
    }
}

// Goal: a rename may replace a directory, or swap two entries (RENAME_EXCHANGE), whichever
// metadata servers hold the names and the inodes: an empty directory victim goes (one on
// another server is sealed first, so nothing lands in it meanwhile), a non-empty one answers
// ENOTEMPTY, a file victim whose inode lives elsewhere loses its link there, and an exchange
// swaps files, directories (their `..` follows) or one of each (the link counts follow).
// Method: directories on both servers; fsck after.
#[test]
fn renames_replace_and_exchange_across_servers() {
    use std::os::unix::fs::MetadataExt;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let (first, second) = dirs_on_both_servers(&cluster, &mnt, "r");
    let links = |dir: &Path| fs::metadata(dir).expect("stat").nlink();

    // A directory over an empty directory on the other server.
    fs::create_dir(first.join("a")).expect("mkdir");
    fs::write(first.join("a/file"), b"a").expect("write");
    fs::create_dir(second.join("b")).expect("mkdir");
    let second_links = links(&second);
    fs::rename(first.join("a"), second.join("b")).expect("replace an empty directory");
    assert_eq!(fs::read(second.join("b/file")).expect("read"), b"a");
    assert_eq!(
        links(&second),
        second_links,
        "one subdirectory replaced another"
    );
    // ... over a non-empty one: ENOTEMPTY, and both stay.
    fs::create_dir(first.join("c")).expect("mkdir");
    assert_eq!(
        errno(fs::rename(first.join("c"), second.join("b"))),
        libc::ENOTEMPTY
    );
    assert!(first.join("c").is_dir() && second.join("b/file").exists());
    // ... over an empty directory whose inode lives on a third place (not its dentry's
    // server): it is sealed, then removed.
    let remote = wait_for_remote_child(&cluster, &second);
    fs::rename(first.join("c"), &remote).expect("replace a directory living elsewhere");
    assert!(remote.is_dir());
    // The same, with both names on one server.
    let remote = wait_for_remote_child(&cluster, &first);
    fs::create_dir(first.join("local")).expect("mkdir");
    fs::rename(first.join("local"), &remote).expect("local names, remote victim");

    // A file over a file whose inode lives on the other server (a hard link's).
    fs::write(first.join("f"), b"f").expect("write");
    fs::hard_link(first.join("f"), second.join("g")).expect("link across servers");
    fs::write(second.join("h"), b"h").expect("write");
    fs::rename(second.join("h"), second.join("g")).expect("replace a remote file victim");
    assert_eq!(fs::read(second.join("g")).expect("read"), b"h");
    assert_eq!(fs::metadata(first.join("f")).expect("stat").nlink(), 1);

    // RENAME_EXCHANGE of files, of directories, and of one of each.
    fs::write(first.join("p"), b"P").expect("write");
    fs::write(second.join("q"), b"Q").expect("write");
    rename_with_flags(&first.join("p"), &second.join("q"), libc::RENAME_EXCHANGE)
        .expect("exchange files");
    assert_eq!(fs::read(first.join("p")).expect("read"), b"Q");
    assert_eq!(fs::read(second.join("q")).expect("read"), b"P");
    fs::create_dir(first.join("dp")).expect("mkdir");
    fs::write(first.join("dp/in"), b"dp").expect("write");
    fs::create_dir(second.join("dq")).expect("mkdir");
    fs::write(second.join("dq/in"), b"dq").expect("write");
    rename_with_flags(&first.join("dp"), &second.join("dq"), libc::RENAME_EXCHANGE)
        .expect("exchange directories");
    assert_eq!(fs::read(first.join("dp/in")).expect("read"), b"dq");
    assert_eq!(fs::read(second.join("dq/in")).expect("read"), b"dp");
    for (dir, parent) in [(first.join("dp"), &first), (second.join("dq"), &second)] {
        assert_eq!(
            fs::metadata(dir.join("..")).expect("stat").ino(),
            fs::metadata(parent).expect("stat").ino(),
            "`..` follows the exchange"
        );
    }
    let (first_links, second_links) = (links(&first), links(&second));
    fs::create_dir(first.join("m")).expect("mkdir");
    fs::write(second.join("n"), b"n").expect("write");
    rename_with_flags(&first.join("m"), &second.join("n"), libc::RENAME_EXCHANGE)
        .expect("exchange a directory and a file");
    assert!(first.join("m").is_file() && second.join("n").is_dir());
    assert_eq!(
        (links(&first), links(&second)),
        (first_links, second_links + 1),
        "the subdirectory counts follow"
    );
    assert_eq!(
        errno(rename_with_flags(
            &first.join("dp"),
            &first.join("dp/in"),
            libc::RENAME_EXCHANGE
        )),
        libc::EINVAL,
        "no exchange that puts a directory inside itself"
    );
    fsck_clean(&cluster);

    // An exchange completes when its coordinator crashes after any step.
    for point in ["rename-after-intent", "rename-after-remote"] {
        fs::write(first.join(format!("{point}-x")), b"x").expect("write");
        fs::write(second.join(format!("{point}-y")), b"y").expect("write");
        let coordinator = if metadata_node(&cluster, &first).starts_with("meta-2") {
            "meta-2"
        } else {
            "meta-1"
        };
        cluster
            .set_env(coordinator, &[("WEFT_FAILPOINTS", point)])
            .expect("arm");
        cluster.restart(coordinator).expect("restart armed");
        cluster.wait_ready().expect("ready");
        let (x, y) = (
            first.join(format!("{point}-x")),
            second.join(format!("{point}-y")),
        );
        let (x2, y2) = (x.clone(), y.clone());
        let worker = std::thread::spawn(move || rename_with_flags(&x2, &y2, libc::RENAME_EXCHANGE));
        wait_until(&format!("{coordinator} to crash at {point}"), || {
            cluster.has_exited(coordinator)
        })
        .expect("crashed");
        cluster.set_env(coordinator, &[]).expect("disarm");
        cluster.restart(coordinator).expect("restart");
        worker
            .join()
            .expect("worker")
            .unwrap_or_else(|error| panic!("{point}: exchange failed: {error}"));
        assert_eq!(fs::read(&x).expect("read"), b"y", "{point}");
        assert_eq!(fs::read(&y).expect("read"), b"x", "{point}");
        fsck_clean(&cluster);
    }
}

// Goal: the markers a home keeps so that another home's cross-server steps (mkdir of a
// directory placed here, a link or rename across servers) never run twice are forgotten once
// those operations finished; they used to stay forever, one per operation ever made.
// Method: 2 metadata servers; directories made until both hold some, a file hard-linked and
// renamed across them; then the servers' `weft_meta_step_markers` gauges must reach zero.
#[test]
fn finished_cross_server_operations_leave_no_markers() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let mut homes = std::collections::BTreeMap::new();
    let mut count = 0;
    wait_until("directories on both metadata servers", || {
        let dir = mnt.join(format!("d{count}"));
        fs::create_dir(&dir).expect("mkdir");
        count += 1;
        homes.insert(metadata_node(&cluster, &dir), dir);
        homes.len() == 2
    })
    .expect("placed on both");
    let dirs: Vec<&PathBuf> = homes.values().collect();
    fs::write(dirs[0].join("file"), b"linked").expect("write");
    fs::hard_link(dirs[0].join("file"), dirs[1].join("link")).expect("link across servers");
    fs::rename(dirs[0].join("file"), dirs[1].join("moved")).expect("rename across servers");
    assert_eq!(fs::read(dirs[1].join("link")).expect("read"), b"linked");

    let mut left = u64::MAX;
    wait_until("the markers of finished operations to go", || {
        left = common::metric_sum(&cluster, "weft_meta_step_markers", &[]);
        left == 0
    })
    .unwrap_or_else(|_| panic!("{left} markers of finished operations are still kept"));
    fsck_clean(&cluster);
}

// Goal: a create or a removal whose entry and inode are both on the server that gets it (the
// common case) is one change of the store: one commit and its one sync, not a first
// transaction that finds the removal local and a second that makes it, and no commit of its
// own for the bookkeeping after it (the close of a new file taking it off the list of files
// without a size report, the forgetting of a removed file's disposed objects), which rides in
// the next commit. Method: one metadata server, 40 files created and closed, then 40
// directories and 40 files removed through the mount, the server's commits counted.
#[test]
fn a_local_create_or_removal_is_one_commit() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let count = 40;
    let commits = || common::metric_sum(&cluster, "weft_meta_commits_total", &[]);
    for i in 0..count {
        fs::create_dir(mnt.join(format!("d{i}"))).expect("mkdir");
    }
    let before = commits();
    for i in 0..count {
        fs::write(mnt.join(format!("f{i}")), b"").expect("create");
    }
    let creates = commits() - before;
    let before = commits();
    for i in 0..count {
        fs::remove_dir(mnt.join(format!("d{i}"))).expect("rmdir");
    }
    let rmdirs = commits() - before;
    let before = commits();
    for i in 0..count {
        fs::remove_file(mnt.join(format!("f{i}"))).expect("unlink");
    }
    let unlinks = commits() - before;
    eprintln!(
        "{count} creates: {creates} commits; {count} rmdirs: {rmdirs} commits; \
         {count} unlinks: {unlinks} commits"
    );
    assert!(
        creates <= count + 5,
        "{count} creates took {creates} commits"
    );
    assert!(rmdirs <= count + 5, "{count} rmdirs took {rmdirs} commits");
    assert!(
        unlinks <= count + 5,
        "{count} unlinks took {unlinks} commits"
    );
    fsck_clean(&cluster);
}

// Goal: the objects of removed files leave every target, removed a batch of files at a time
// with one request per target, not one request per object (four per file on the default
// cluster, which made the disposal of an `rm -rf` cost more than the removals themselves).
// Method: 40 files with data, both storage servers down while they are removed (so their
// disposal waits and then goes as one batch), the servers back; then every object is gone,
// and the storage servers saw batches of removals and no removal of one object.
#[test]
fn removed_files_objects_go_in_batches() {
    let spec = ClusterSpec::default();
    let layout = (spec.storage, spec.targets_per_storage);
    let mut cluster = cluster(spec);
    let mnt = cluster.mount().expect("mount");
    let count = 40;
    let mut inodes = Vec::new();
    for i in 0..count {
        let path = mnt.join(format!("f{i}"));
        common::write_synced(&path, &vec![i as u8 + 1; 300 * 1024]);
        inodes.push(std::os::unix::fs::MetadataExt::ino(
            &fs::metadata(&path).expect("stat"),
        ));
    }
    let objects = |cluster: &LocalCluster, inode: u64| {
        common::object_files(cluster, layout, "objects", inode)
    };
    assert!(
        inodes
            .iter()
            .all(|inode| !objects(&cluster, *inode).is_empty()),
        "every file has objects"
    );
    for name in ["storage-1", "storage-2"] {
        cluster.kill(name).expect("kill");
    }
    for i in 0..count {
        fs::remove_file(mnt.join(format!("f{i}"))).expect("unlink");
    }
    for name in ["storage-1", "storage-2"] {
        cluster.restart(name).expect("restart");
    }
    cluster.wait_ready().expect("storage back");
    wait_until("the removed files' objects to go", || {
        inodes
            .iter()
            .all(|inode| objects(&cluster, *inode).is_empty())
    })
    .expect("every object of the removed files is gone");
    let requests = |op: &str| {
        common::metric_sum(
            &cluster,
            "weft_requests_total",
            &["role=\"storage\"", &format!("op=\"{op}\"")],
        )
    };
    let (batches, singles) = (requests("remove_objects"), requests("remove"));
    eprintln!("{count} files disposed of: {batches} batch requests, {singles} single removals");
    assert!(batches > 0, "the objects went in batches");
    assert_eq!(singles, 0, "no object was removed by a request of its own");
    fsck_clean(&cluster);
}

// Goal: a removal disposes of objects only of a file that may have some. Files made and
// closed without data have none: their removal queues nothing, so an `rm -rf` of empty files
// costs the storage servers nothing. Every object of a file that had data goes with it: one
// written, one allocated past its size (`fallocate -n`), one written and cut to nothing, and
// one written through a mount killed before its close. Method: 40 empty files removed while
// both storage servers are down (a queued disposal would wait for them), the metadata
// server's queue read; then the four other files removed with the servers back, their
// objects looked for on the targets, fsck clean.
#[test]
fn a_removal_disposes_of_objects_only_where_a_file_may_have_some() {
    let spec = ClusterSpec::default();
    let layout = (spec.storage, spec.targets_per_storage);
    let mut cluster = cluster(spec);
    let mnt = cluster.mount().expect("mount");
    let queued =
        |cluster: &LocalCluster| common::metric_sum(cluster, "weft_meta_disposals_queued", &[]);
    let count = 40;
    for i in 0..count {
        fs::write(mnt.join(format!("empty{i}")), b"").expect("create");
    }
    for name in ["storage-1", "storage-2"] {
        cluster.kill(name).expect("kill");
    }
    for i in 0..count {
        fs::remove_file(mnt.join(format!("empty{i}"))).expect("unlink");
    }
    assert_eq!(queued(&cluster), 0, "no empty file waits for a disposal");
    for name in ["storage-1", "storage-2"] {
        cluster.restart(name).expect("restart");
    }
    cluster.wait_ready().expect("storage back");

    let ino = |path: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).expect("stat"));
    common::write_synced(&mnt.join("written"), &vec![7u8; 3 * 1024 * 1024]);
    fs::write(mnt.join("allocated"), b"").expect("create");
    let allocated = std::process::Command::new("fallocate")
        .args(["-n", "-l", "1MiB"])
        .arg(mnt.join("allocated"))
        .status()
        .expect("fallocate runs");
    assert!(allocated.success(), "fallocate -n");
    common::write_synced(&mnt.join("cut"), &vec![9u8; 2 * 1024 * 1024]);
    fs::File::options()
        .write(true)
        .open(mnt.join("cut"))
        .expect("open")
        .set_len(0)
        .expect("truncate to nothing");
    // Made empty through this mount, written through another that dies before its close.
    fs::write(mnt.join("killed"), b"").expect("create");
    let second = cluster.mount().expect("second mount");
    let mut writer = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import os, sys, time\n\
             fd = os.open(sys.argv[1], os.O_WRONLY)\n\
             os.write(fd, b'k' * 300000)\n\
             os.fdatasync(fd)\n\
             print('written', flush=True)\n\
             time.sleep(120)\n",
        )
        .arg(second.join("killed"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("writer starts");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(writer.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("writer reports");
    assert_eq!(line.trim(), "written");
    cluster
        .kill_mount(&second)
        .expect("kill -9 the writer's mount");
    let _ = writer.kill();
    let _ = writer.wait();

    let names = ["written", "allocated", "cut", "killed"];
    let inodes: Vec<u64> = names.iter().map(|name| ino(&mnt.join(name))).collect();
    let objects = |cluster: &LocalCluster, inode: u64| {
        common::object_files(cluster, layout, "objects", inode)
    };
    for (name, inode) in names.iter().zip(&inodes) {
        assert!(!objects(&cluster, *inode).is_empty(), "{name} has objects");
    }
    for name in names {
        fs::remove_file(mnt.join(name)).expect("unlink");
    }
    wait_until("the removed files' objects to go", || {
        inodes
            .iter()
            .all(|inode| objects(&cluster, *inode).is_empty())
            && queued(&cluster) == 0
    })
    .expect("every object of the removed files is gone");
    fsck_clean(&cluster);
}

// Goal: a directory is listed a server page at a time, however small the kernel's buffers,
// and its end costs no request of its own: every name once, in `ls` and `find`, and the
// metadata server asked about as many listings as the directory has pages. A directory
// listed again sees what changed in it since. Method: 1,000 files in one directory and 300
// empty directories, listings through the mount, the server's listing request counts.
#[test]
fn a_directory_is_listed_a_page_at_a_time() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = common::long_cached_mount(&mut cluster);
    let big = mnt.join("big");
    fs::create_dir(&big).expect("mkdir");
    for index in 0..1000 {
        fs::write(
            big.join(format!("file-with-a-longish-name-{index:04}")),
            b"x",
        )
        .expect("create");
    }
    let small = mnt.join("small");
    fs::create_dir(&small).expect("mkdir");
    for index in 0..300 {
        fs::create_dir(small.join(format!("d{index}"))).expect("mkdir");
    }
    let listings = || common::meta_requests(&cluster, &["read_dir", "read_dir_plus"]);
    let names = common::names;

    let before = listings();
    let listed = names(&big);
    let asked = listings() - before;
    assert_eq!(listed.len(), 1000, "every name once");
    listed
        .windows(2)
        .for_each(|pair| assert_ne!(pair[0], pair[1]));
    // 1,000 entries are four pages of 256, the last of which says it is the end; the
    // kernel's buffers hold fewer, and it asks once more past the last entry.
    assert!(
        asked <= 4,
        "{asked} listing requests for 1,000 entries, four pages of 256"
    );

    let before = listings();
    let output = std::process::Command::new("find")
        .arg(&small)
        .output()
        .expect("find");
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 301);
    let asked = listings() - before;
    assert!(
        asked <= 302,
        "{asked} listing requests: one per directory, its end included"
    );

    fs::remove_file(big.join("file-with-a-longish-name-0500")).expect("unlink");
    fs::write(big.join("new"), b"y").expect("create");
    let again = names(&big);
    assert_eq!(again.len(), 1000);
    assert!(again.contains(&"new".to_string()));
    assert!(!again.contains(&"file-with-a-longish-name-0500".to_string()));
}

// Goal: a create in a directory this mount made asks its metadata server no lookup of the new
// name (the names lease answers that it is not there), and the lease never hides a name: one
// this mount made is found, and an exclusive create of it fails. With leases turned off
// (`names_lease_ms = 0`) every create costs a lookup, as before them.
#[test]
fn a_create_in_a_directory_this_mount_made_asks_no_lookup() {
    for (lease_ms, leased) in [(5000, true), (0, false)] {
        let mut cluster = cluster(ClusterSpec {
            meta_settings: vec![format!("names_lease_ms={lease_ms}")],
            ..ClusterSpec::default()
        });
        let mnt = cluster.mount().expect("mount");
        let dir = mnt.join("made-here");
        fs::create_dir(&dir).expect("mkdir");
        let count = 200;
        let before = common::meta_requests(&cluster, &["lookup"]);
        for i in 0..count {
            fs::File::create(dir.join(format!("f{i}"))).expect("create");
        }
        let lookups = common::meta_requests(&cluster, &["lookup"]) - before;
        if leased {
            assert!(
                lookups < count / 10,
                "{lookups} lookups for {count} creates in a leased directory"
            );
        } else {
            assert!(
                lookups >= count,
                "{lookups} lookups for {count} creates without leases"
            );
        }
        assert!(dir.join("f7").exists(), "a name this mount made is there");
        assert!(!dir.join("g7").exists(), "a name nobody made is not");
        let again = fs::File::options()
            .write(true)
            .create_new(true)
            .open(dir.join("f7"));
        assert_eq!(
            again.map(drop).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::AlreadyExists),
            "an exclusive create of a name this mount made fails"
        );
        assert_eq!(fs::read_dir(&dir).expect("list").count() as u64, count);
    }
}

// Goal: creates and unlinks through one mount, one after the other, are committed on the
// metadata server by the thread that read their request (most of them), with no hand-off to
// the commit thread and back, when the server answers before the sync; with every change
// synced before its answer, the commit thread commits them all. The server's count of each
// request's thread hand-offs (`weft_request_handoffs`) says the same: most of the changes
// crossed at most one by default, every one at least two (to the commit thread and back)
// with every change synced. Either way everything made is there.
#[test]
fn a_lone_change_is_committed_by_the_thread_that_read_it() {
    for sync_every_change in [false, true] {
        let mut cluster = cluster(ClusterSpec {
            meta_settings: vec![format!("sync_every_change={sync_every_change}")],
            ..ClusterSpec::default()
        });
        let mnt = cluster.mount().expect("mount");
        let dir = mnt.join("lone");
        fs::create_dir(&dir).expect("mkdir");
        let inline = || common::metric_sum(&cluster, "weft_meta_inline_commits_total", &[]);
        // Creates and unlinks answered, and those of them that crossed at most one hand-off.
        let changes = |bucket: &str| {
            ["create", "unlink"]
                .iter()
                .map(|op| {
                    common::metric_sum(
                        &cluster,
                        "weft_request_handoffs_bucket",
                        &["role=\"meta\"", &format!("op=\"{op}\""), bucket],
                    )
                })
                .sum::<u64>()
        };
        let (changes_before, light_before) = (changes("le=\"+Inf\""), changes("le=\"1.0\""));
        let before = inline();
        let count = 200;
        for i in 0..count {
            fs::File::create(dir.join(format!("f{i}"))).expect("create");
        }
        for i in 0..count / 2 {
            fs::remove_file(dir.join(format!("f{i}"))).expect("unlink");
        }
        let committed_here = inline() - before;
        let answered = changes("le=\"+Inf\"") - changes_before;
        let light = changes("le=\"1.0\"") - light_before;
        assert_eq!(
            answered,
            count + count / 2,
            "every change's hand-offs are counted"
        );
        if sync_every_change {
            assert_eq!(committed_here, 0, "synced changes go to the commit thread");
            assert_eq!(light, 0, "each change went to the commit thread and back");
        } else {
            assert!(
                light >= answered / 2,
                "{light} of {answered} changes crossed at most one thread hand-off"
            );
            // Most, not all: a change that arrives while the commit thread holds the writer
            // for a moment (bookkeeping a close sent) goes to it.
            assert!(
                committed_here >= (count + count / 2) / 2,
                "{committed_here} of {} changes committed by their request's thread",
                count + count / 2
            );
        }
        let names = common::names(&dir);
        let mut expected: Vec<String> = (count / 2..count).map(|i| format!("f{i}")).collect();
        expected.sort();
        assert_eq!(names, expected, "the names left are the ones not removed");
    }
}

// Goal: a name another mount adds to a directory this mount holds a names lease on is seen
// here at once: the other's create waits until the lease is recalled and ran out, so this
// mount's next lookup of the name asks the server. Both mounts make names in turn.
#[test]
fn a_name_another_mount_adds_to_a_leased_directory_is_seen_at_once() {
    let mut cluster = cluster(ClusterSpec {
        meta_settings: vec!["names_lease_ms=2000".to_string()],
        ..ClusterSpec::default()
    });
    let (here, there) = (
        cluster.mount().expect("mount"),
        cluster.mount().expect("second mount"),
    );
    fs::create_dir(here.join("shared")).expect("mkdir");
    let (mine, theirs) = (here.join("shared"), there.join("shared"));
    for i in 0..10 {
        fs::write(mine.join(format!("a{i}")), b"here").expect("create here");
        assert!(!mine.join(format!("b{i}")).exists(), "not made yet");
        fs::write(theirs.join(format!("b{i}")), b"there").expect("create there");
        assert_eq!(
            fs::read(mine.join(format!("b{i}"))).expect("the other mount's file, here"),
            b"there"
        );
        assert_eq!(
            fs::read(theirs.join(format!("a{i}"))).expect("this mount's file, there"),
            b"here"
        );
    }
    for dir in [&mine, &theirs] {
        assert_eq!(fs::read_dir(dir).expect("list").count(), 20);
    }
}
