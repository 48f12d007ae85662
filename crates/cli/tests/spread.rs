//! Spread directories: one directory's entries over several metadata servers by name hash
//! (`weft mkdir --spread K`). Everything an application does in a directory works the same in
//! one; listings resume at stable positions; rmdir does not race with creates on other
//! shards; a crash of the coordinating server at any step leaves a consistent namespace.

mod common;

use common::{cluster, crash_during, errno, fsck_clean, metadata_node, weft};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use weft_testkit::{ClusterSpec, LocalCluster};

fn three_metas() -> LocalCluster {
    cluster(ClusterSpec {
        meta: 3,
        ..ClusterSpec::default()
    })
}

/// `weft mkdir --spread <shards> <path>`; returns its report.
fn mkdir_spread(cluster: &LocalCluster, path: &Path, shards: u16) -> String {
    let (ok, out, err) = weft(
        cluster,
        &[
            "mkdir",
            "--spread",
            &shards.to_string(),
            path.to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "weft mkdir --spread: {err}");
    out
}

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

// Goal: a spread directory holds its entries on every one of its metadata servers, and create,
// lookup, read, list, rename (within, in and out), hard links, unlink, rmdir and inherited
// attributes work as in any directory.
// Method: `weft mkdir --spread 3` on three metadata servers, then the ordinary tools through
// the mount; `weft entry info` shows where entries live; fsck at the end.
#[test]
fn spread_directory_works_like_any_other() {
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    let big = mnt.join("big");
    let report = mkdir_spread(&cluster, &big, 3);
    assert!(report.contains("Spread over 3 metadata nodes"), "{report}");
    let shard_nodes: BTreeSet<&str> = report
        .lines()
        .filter_map(|l| l.strip_prefix("+ shard "))
        .filter_map(|l| l.split(" @ ").nth(1))
        .collect();
    assert_eq!(
        shard_nodes.len(),
        3,
        "three shards on three servers: {report}"
    );
    let big4 = mnt.join("big4");
    let (ok, _, err) = weft(
        &cluster,
        &["mkdir", "--spread", "4", big4.to_str().expect("utf-8")],
    );
    assert!(!ok, "more shards than metadata servers is refused");
    assert!(err.contains("needs as many"), "the error says why: {err}");

    const FILES: usize = 240;
    for i in 0..FILES {
        fs::write(big.join(format!("f{i}")), format!("data {i}")).expect("create");
    }
    for i in 0..6 {
        fs::create_dir(big.join(format!("sub{i}"))).expect("mkdir");
    }
    let homes: BTreeMap<String, usize> = (0..30).fold(BTreeMap::new(), |mut homes, i| {
        *homes
            .entry(metadata_node(&cluster, &big.join(format!("f{i}"))))
            .or_default() += 1;
        homes
    });
    assert_eq!(
        homes.len(),
        3,
        "files land on every shard's server: {homes:?}"
    );
    let listed = names(&big);
    assert_eq!(listed.len(), FILES + 6, "every entry is listed once");
    assert_eq!(listed.iter().collect::<BTreeSet<_>>().len(), FILES + 6);
    assert_eq!(fs::metadata(&big).expect("stat").nlink(), 2 + 6);
    // The count gathers every shard's however the kernel learns it: from a lookup (its
    // caches dropped) or from a setattr's reply, not only from a getattr.
    fs::write("/proc/sys/vm/drop_caches", "2").expect("drop the kernel's dentries");
    assert_eq!(
        fs::metadata(&big).expect("stat").nlink(),
        2 + 6,
        "after a lookup"
    );
    fs::set_permissions(&big, fs::Permissions::from_mode(0o775)).expect("chmod");
    assert_eq!(
        fs::metadata(&big).expect("stat").nlink(),
        2 + 6,
        "after a setattr"
    );
    for i in 0..FILES {
        assert_eq!(
            fs::read_to_string(big.join(format!("f{i}"))).expect("read"),
            format!("data {i}")
        );
    }

    // Renames between names on different shards, in from outside and out again.
    for i in 0..40 {
        fs::rename(big.join(format!("f{i}")), big.join(format!("renamed-{i}"))).expect("rename");
    }
    fs::rename(big.join("sub0"), big.join("sub-moved")).expect("a directory between shards");
    fs::write(mnt.join("outside"), b"outside").expect("create");
    fs::rename(mnt.join("outside"), big.join("came-in")).expect("rename in");
    fs::rename(big.join("f40"), mnt.join("went-out")).expect("rename out");
    assert_eq!(fs::read(big.join("came-in")).expect("read"), b"outside");
    assert_eq!(fs::read(mnt.join("went-out")).expect("read"), b"data 40");
    fs::hard_link(big.join("f41"), big.join("link-41")).expect("hard link");
    assert_eq!(fs::metadata(big.join("f41")).expect("stat").nlink(), 2);
    assert_eq!(errno(fs::create_dir(big.join("f42"))), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(&big)), libc::ENOTEMPTY);

    // What new entries inherit follows the directory onto every shard.
    fs::set_permissions(&big, fs::Permissions::from_mode(0o2775)).expect("chmod g+s");
    std::os::unix::fs::chown(&big, None, Some(4242)).expect("chgrp");
    let (ok, _, err) = weft(
        &cluster,
        &[
            "entry",
            "set",
            "--num-targets",
            "1",
            big.to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "{err}");
    for i in 0..12 {
        let path = big.join(format!("new-{i}"));
        fs::write(&path, b"x").expect("create");
        assert_eq!(
            fs::metadata(&path).expect("stat").gid(),
            4242,
            "setgid group"
        );
        let (_, info, _) = weft(&cluster, &["entry", "info", path.to_str().expect("utf-8")]);
        assert!(
            info.contains("desired: 1; actual: 1"),
            "the new pattern applies on every shard: {info}"
        );
    }

    let status = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&big)
        .status()
        .expect("rm");
    assert!(status.success(), "rm -rf empties and removes it");
    assert_eq!(errno(fs::metadata(&big)), libc::ENOENT);
    fsck_clean(&cluster);
}

// Goal: a listing of a spread directory resumes at stable positions while entries come and go:
// every entry present throughout is listed exactly once.
// Method: long names, so a listing takes many readdir calls, while another thread creates and
// removes other entries in every shard.
#[test]
fn spread_listing_is_stable_under_change() {
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    let big = mnt.join("big");
    mkdir_spread(&cluster, &big, 3);
    let long = "x".repeat(180);
    let stable: BTreeSet<String> = (0..400).map(|i| format!("{long}-{i}")).collect();
    for name in &stable {
        fs::write(big.join(name), b"").expect("create");
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (big, stop) = (big.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || round < 50 {
                let path = big.join(format!("churn-{round}"));
                fs::write(&path, b"").expect("churn create");
                if round % 2 == 0 {
                    fs::remove_file(&path).expect("churn unlink");
                }
                round += 1;
            }
        })
    };
    for _ in 0..5 {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for name in names(&big) {
            *seen.entry(name).or_default() += 1;
        }
        for name in &stable {
            assert_eq!(seen.get(name), Some(&1), "{name} listed exactly once");
        }
        assert!(seen.values().all(|count| *count == 1), "no entry twice");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().expect("churn");
    fsck_clean(&cluster);
}

// Goal: rmdir of a spread directory does not race with creates on its other shards: either the
// rmdir fails (not empty), or it succeeds and no entry survives in any shard.
// Method: one thread creates and removes files (whose names hash to every shard) until the
// directory is gone; the test retries rmdir meanwhile. A file created and then found missing
// before its own unlink would be an entry lost to the race; fsck finds any orphan.
#[test]
fn spread_rmdir_does_not_race_with_creates() {
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    let big = mnt.join("big");
    mkdir_spread(&cluster, &big, 3);
    let (started, running) = std::sync::mpsc::channel();
    let creator = {
        let big = big.clone();
        std::thread::spawn(move || {
            let mut created = 0;
            for i in 0.. {
                let path = big.join(format!("f{i}"));
                match fs::write(&path, b"") {
                    Ok(()) => created += 1,
                    Err(error) if error.raw_os_error() == Some(libc::ENOENT) => return created,
                    Err(error) => panic!("create failed with {error}"),
                }
                fs::remove_file(&path).expect("a created file is there until its unlink");
                if i == 0 {
                    started.send(()).expect("test waits");
                }
            }
            unreachable!()
        })
    };
    running.recv().expect("the creator runs");
    let mut attempts = 0;
    loop {
        attempts += 1;
        match fs::remove_dir(&big) {
            Ok(()) => break,
            Err(error) if error.raw_os_error() == Some(libc::ENOTEMPTY) => {}
            Err(error) => panic!("rmdir failed with {error}"),
        }
        assert!(attempts < 100_000, "rmdir succeeds once the creates pause");
    }
    let created = creator.join().expect("creator");
    assert!(created > 0, "the creator ran");
    assert_eq!(errno(fs::metadata(&big)), libc::ENOENT);
    fsck_clean(&cluster);
}

// Goal: mkdir and rmdir of a spread directory complete when the coordinating server crashes at
// each step: after its intent, after all shards exist (mkdir), after the shards are sealed
// (rmdir). fsck finds no orphan shard and no sealed leftover.
// Method: fault-injection points end meta-1 (which holds the root's entries); the client
// retries through the restart.
#[test]
fn spread_mkdir_and_rmdir_survive_a_crash_at_every_step() {
    for point in ["mkdir-after-intent", "mkdir-spread-after-shards"] {
        let mut cluster = three_metas();
        let mnt = cluster.mount().expect("mount");
        let path = mnt.join(point);
        let results = crash_during(&mut cluster, point, vec![path.clone()], |path| {
            let output = std::process::Command::new(common::binary())
                .args(["mkdir", "--spread", "3"])
                .arg(path)
                .output()?;
            if output.status.success() {
                Ok(())
            } else {
                Err(std::io::Error::other(
                    String::from_utf8_lossy(&output.stderr).into_owned(),
                ))
            }
        });
        for result in results {
            result.unwrap_or_else(|error| panic!("{point}: mkdir --spread failed: {error}"));
        }
        for i in 0..30 {
            fs::write(path.join(format!("f{i}")), b"ok")
                .unwrap_or_else(|e| panic!("{point}: the directory is usable: {e}"));
        }
        assert_eq!(names(&path).len(), 30, "{point}");
        fsck_clean(&cluster);
    }
    for point in ["rmdir-after-intent", "rmdir-spread-after-seal"] {
        let mut cluster = three_metas();
        let mnt = cluster.mount().expect("mount");
        let paths: Vec<_> = (0..2).map(|i| mnt.join(format!("{point}-{i}"))).collect();
        for path in &paths {
            mkdir_spread(&cluster, path, 3);
            for i in 0..20 {
                fs::write(path.join(format!("f{i}")), b"").expect("create");
                fs::remove_file(path.join(format!("f{i}"))).expect("unlink");
            }
        }
        let results = crash_during(&mut cluster, point, paths.clone(), |p| fs::remove_dir(p));
        for (path, result) in paths.iter().zip(results) {
            result.unwrap_or_else(|error| panic!("{point}: rmdir {}: {error}", path.display()));
            assert_eq!(errno(fs::metadata(path)), libc::ENOENT, "{point}");
        }
        fsck_clean(&cluster);
    }
}

// Goal: a directory can pass a spread on: with `weft entry set --spread K`, every new
// subdirectory (and theirs, by inheritance) is spread over K metadata servers, through plain
// mkdir(2); a bad value is refused; `--spread 1` stops it.
// Method: three metadata servers; mkdir through the mount; read `weft entry info`.
#[test]
fn spread_is_inherited_by_new_subdirectories() {
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    let jobs = mnt.join("jobs");
    fs::create_dir(&jobs).expect("mkdir");
    let jobs_text = jobs.to_str().expect("utf-8");
    let (ok, _, err) = weft(&cluster, &["entry", "set", "--spread", "3", jobs_text]);
    assert!(ok, "{err}");
    let (_, info, _) = weft(&cluster, &["entry", "info", jobs_text]);
    assert!(info.contains("New subdirectories spread over: 3"), "{info}");
    let run = jobs.join("run-1");
    fs::create_dir(&run).expect("mkdir under a spreading directory");
    fs::create_dir(run.join("step")).expect("mkdir one level down");
    for dir in [&run, &run.join("step")] {
        let (_, info, _) = weft(&cluster, &["entry", "info", dir.to_str().expect("utf-8")]);
        assert!(
            info.contains("Spread over 3 metadata nodes"),
            "{} is spread: {info}",
            dir.display()
        );
    }
    for i in 0..60 {
        fs::write(run.join(format!("f{i}")), b"x").expect("create");
    }
    assert_eq!(names(&run).len(), 61);
    let status = std::process::Command::new("setfattr")
        .args(["-n", "trusted.weft.spread", "-v", "many"])
        .arg(&jobs)
        .status()
        .expect("setfattr");
    assert!(!status.success(), "a value that is not a count is refused");
    let (ok, _, err) = weft(&cluster, &["entry", "set", "--spread", "1", jobs_text]);
    assert!(ok, "{err}");
    fs::create_dir(jobs.join("plain")).expect("mkdir");
    let (_, info, _) = weft(
        &cluster,
        &["entry", "info", jobs.join("plain").to_str().expect("utf-8")],
    );
    assert!(!info.contains("Spread over"), "no longer spread: {info}");
    let status = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&jobs)
        .status()
        .expect("rm");
    assert!(status.success());
    fsck_clean(&cluster);
}

/// Each entry of `dir` as `ls -lnA` through the mount shows it: name to (nlink, uid, size).
fn long_listing(dir: &Path) -> BTreeMap<String, (u32, u32, u64)> {
    let out = std::process::Command::new("ls")
        .args(["-lnA", "--time-style=+%s"])
        .arg(dir)
        .output()
        .expect("ls");
    assert!(out.status.success(), "ls -l {}", dir.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| !line.starts_with("total"))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let name = fields[6].to_string();
            let number = |i: usize| fields[i].parse::<u64>().expect("a number");
            (name, (number(1) as u32, number(2) as u32, number(4)))
        })
        .collect()
}

/// The inode at `path` under the root, looked up name by name.
async fn resolve(client: &weft_client::Client, path: &str) -> weft_proto::InodeId {
    let mut inode = weft_proto::InodeId::ROOT;
    for name in path.split('/') {
        inode = client.lookup(inode, name).await.expect("lookup").inode;
    }
    inode
}

/// Every entry of `dir` with its attributes, listed a few entries at a time, each checked
/// against a get-attributes of its own; answers name to (nlink, uid, size).
async fn listed_with_attributes(
    client: &weft_client::Client,
    dir: weft_proto::InodeId,
) -> BTreeMap<String, (u32, u32, u64)> {
    let mut listed = BTreeMap::new();
    let mut after = 0;
    loop {
        let (page, end) = client.read_dir_plus(dir, after, 7).await.expect("listing");
        for (entry, attr) in page {
            let attr = attr.unwrap_or_else(|| panic!("{}: no attributes", entry.name));
            let own = client.get_attr(entry.inode).await.expect("get-attributes");
            let shown = |a: &weft_proto::messages::InodeAttr| {
                (a.inode, a.kind, a.mode, a.nlink, a.uid, a.size, a.mtime)
            };
            assert_eq!(shown(&attr), shown(&own), "{}", entry.name);
            assert_eq!(entry.inode, attr.inode, "{}", entry.name);
            after = entry.cookie;
            listed.insert(entry.name, (attr.nlink, attr.uid, attr.size));
        }
        if end {
            return listed;
        }
    }
}

// Goal: a listing with attributes (FUSE's READDIRPLUS, what `ls -l` and `find` get) shows
// each entry as a lookup of it would: in a spread directory and a plain one, subdirectories
// placed on other servers, a hard link to a file of another server, a symbolic link, and a
// file this mount has open and wrote; a client that speaks protocol version 9 gets
// the same from its fallback, one get-attributes per entry. Method: three metadata servers, a
// mount and native clients of both versions; `ls -lnA` through the mount and the native
// listing compared with each entry's own attributes; the servers' request counters show that
// the mount listed with attributes.
#[test]
fn listings_carry_each_entrys_attributes() {
    use std::io::Write;
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    let wide = mnt.join("wide");
    mkdir_spread(&cluster, &wide, 3);
    let plain = mnt.join("plain");
    fs::create_dir(&plain).expect("mkdir");
    for dir in [&wide, &plain] {
        for i in 0..30 {
            fs::write(dir.join(format!("f{i}")), vec![7u8; i * 100]).expect("create");
        }
        for j in 0..4 {
            fs::create_dir(dir.join(format!("sub{j}"))).expect("mkdir");
        }
        std::os::unix::fs::symlink("f1", dir.join("l")).expect("symlink");
        fs::set_permissions(dir.join("f3"), fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    fs::hard_link(wide.join("f5"), plain.join("h")).expect("link");
    let mut growing = fs::File::create(plain.join("growing")).expect("create");
    growing.write_all(&[1u8; 4096]).expect("write");
    growing.flush().expect("flush");

    let (runtime, client) = common::native_client(&cluster, |_| {});
    let (_, older) = common::native_client(&cluster, |config| config.protocol_max = 9);
    for (path, name) in [(&wide, "wide"), (&plain, "plain")] {
        let through_mount = long_listing(path);
        let dir = runtime.block_on(resolve(&client, name));
        let listed = runtime.block_on(listed_with_attributes(&client, dir));
        let from_older = runtime.block_on(listed_with_attributes(&older, dir));
        assert_eq!(listed, from_older, "{name}: the fallback lists the same");
        assert_eq!(
            listed.len(),
            35 + usize::from(name == "plain") * 2,
            "{name}"
        );
        assert_eq!(through_mount, listed, "{name}: ls -l through the mount");
    }
    assert!(
        common::metric_sum(&cluster, "weft_requests_total", &["op=\"read_dir_plus\""]) > 0,
        "the mount listed with attributes"
    );
    drop(growing);
    fsck_clean(&cluster);
}

// Goal: a request sent to a metadata server for an inode of another home is refused with a
// reason that names both homes, and changes nothing; before every request declared what it
// routes by, a lookup, a getattr or an unlink sent to the wrong home answered as if the name
// did not exist. Method: three metadata servers, raw requests to each home that does not
// hold the file, then the file read back through the mount.
#[test]
fn a_request_sent_to_another_home_is_refused_as_misrouted() {
    use weft_net::MetaCalls;
    let mut cluster = three_metas();
    let mnt = cluster.mount().expect("mount");
    fs::write(mnt.join("kept"), b"still here").expect("create");
    let (runtime, client) = common::native_client(&cluster, |_| {});
    let attr = runtime
        .block_on(client.lookup(weft_proto::InodeId::ROOT, "kept"))
        .expect("lookup");
    let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
    runtime.block_on(view.refresh()).expect("the map");
    let others: Vec<_> = view
        .map()
        .meta_homes()
        .into_iter()
        .filter(|home| *home != attr.inode.home())
        .collect();
    assert_eq!(others.len(), 2, "two homes do not hold the file");
    let misrouted = |error: weft_net::RpcError| {
        error.code() == weft_proto::ErrorCode::WrongHome
            && error.to_string().contains("routes to metadata home")
    };
    for home in others {
        let meta = runtime
            .block_on(view.meta(home))
            .expect("a client of the home");
        let got = runtime.block_on(meta.get_attr(attr.inode));
        assert!(got.is_err_and(misrouted), "getattr at home {home}");
        let mutation = weft_proto::messages::MutationId {
            client: weft_proto::ids::ClientId(u64::MAX),
            seq: 1,
            oldest_pending: 1,
        };
        let root = weft_proto::InodeId::ROOT;
        if root.home() != home {
            let unlinked = runtime.block_on(meta.unlink(mutation, root, "kept"));
            assert!(unlinked.is_err_and(misrouted), "unlink at home {home}");
        }
    }
    assert_eq!(fs::read(mnt.join("kept")).expect("read"), b"still here");
    fsck_clean(&cluster);
}
