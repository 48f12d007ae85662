//! Quotas: what users, groups and projects use, and the limits that hold however a file grows.

use super::*;

// Goal: what each user and group uses follows its files, per storage pool: a create counts an
// inode, a write its bytes, a truncate takes bytes off, a chown or chgrp moves both to the new
// owner, an unlink gives them back; it survives a kill of the metadata server, and fsck finds
// it equal to a count of the inodes. Method: files of made-up owners written, truncated,
// chowned and removed through the mount in two pools, `weft quota report` read after each,
// the metadata server killed (SIGKILL) and restarted, then `weft fsck`.
#[test]
fn quota_report_follows_what_users_and_groups_use() {
    use std::os::unix::fs::chown;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let mgmt = cluster.mgmt().to_string();
    let (ok, _, err) = weft(
        &cluster,
        &[
            "pool",
            "create",
            "fast",
            "--targets",
            "2,4",
            "--mgmt",
            &mgmt,
        ],
    );
    assert!(ok, "{err}");
    make_dir_with_pattern(
        &cluster,
        &mnt.join("fast"),
        &["--pool", "fast", "--num-targets", "1"],
    );
    fs::create_dir(mnt.join("plain")).expect("mkdir");
    let row = |kind: &str, id: u32, pool: &str, used: &str, inodes: u64| {
        (
            kind.to_string(),
            id,
            pool.to_string(),
            used.to_string(),
            inodes,
        )
    };

    fs::write(mnt.join("plain/a"), vec![1u8; 3 << 20]).expect("write");
    chown(mnt.join("plain/a"), Some(5001), Some(6001)).expect("chown");
    fs::create_dir(mnt.join("plain/d")).expect("mkdir");
    chown(mnt.join("plain/d"), Some(5001), Some(6001)).expect("chown");
    fs::write(mnt.join("fast/b"), vec![2u8; 1 << 20]).expect("write");
    chown(mnt.join("fast/b"), Some(5001), Some(6002)).expect("chown");
    fs::write(mnt.join("fast/c"), vec![3u8; 2 << 20]).expect("write");
    chown(mnt.join("fast/c"), Some(5002), Some(6002)).expect("chown");
    assert_eq!(
        quota_rows(&cluster, &["--user", "5001"]),
        vec![
            row("user", 5001, "default", "3M", 2),
            row("user", 5001, "fast", "1M", 1)
        ]
    );
    assert_eq!(
        quota_rows(&cluster, &["--group", "6002"]),
        vec![row("group", 6002, "fast", "3M", 2)]
    );

    fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("plain/a"))
        .expect("open")
        .set_len(1 << 20)
        .expect("truncate");
    chown(mnt.join("fast/b"), Some(5002), None).expect("chown");
    fs::remove_file(mnt.join("fast/c")).expect("unlink");
    let expected = vec![
        row("user", 5001, "default", "1M", 2),
        row("user", 5002, "fast", "1M", 1),
    ];
    let users = |cluster: &weft_testkit::LocalCluster| {
        let mut rows = quota_rows(cluster, &["--user", "5001"]);
        rows.extend(quota_rows(cluster, &["--user", "5002"]));
        rows
    };
    assert_eq!(users(&cluster), expected);
    assert_eq!(
        quota_rows(&cluster, &["--group", "6002", "--pool", "fast"]),
        vec![row("group", 6002, "fast", "1M", 1)]
    );

    cluster.kill("meta-1").expect("kill");
    cluster.restart("meta-1").expect("restart");
    weft_testkit::wait_until("the metadata server to answer again", || {
        weft(&cluster, &["quota", "report", "--mgmt", &mgmt]).0
    })
    .expect("back");
    assert_eq!(users(&cluster), expected, "usage survives a kill");
    let (ok, report, err) = weft(&cluster, &["fsck", "--mgmt", &mgmt]);
    assert!(ok, "fsck finds usage as the inodes count it: {report}{err}");
}

// Goal: quotas are enforced by the servers, per pool: a user at its hard inode limit makes no
// new file (EDQUOT from open(O_CREAT) through the mount), at its hard space limit no write
// grows a file (EDQUOT at fsync, the write's error), nor a truncate that extends one, nor a
// chown that hands it a file, while overwrites inside a file go on; a higher limit lets it go
// on; a soft limit held past its grace period blocks as a hard one.
// Method: a pool of its own for the user's files, `weft quota set` and `weft quota list`,
// writes through the mount, management with a grace period of one second.
#[test]
fn quotas_refuse_what_goes_over_them() {
    use std::io::Write;
    let mut cluster = cluster(ClusterSpec {
        mgmt_settings: vec!["quota_grace_period_ms=1000".into()],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let run = |args: &[&str]| run_ok(&cluster, args);
    run(&["pool", "create", "q", "--targets", "1,3"]);
    make_dir_with_pattern(
        &cluster,
        &mnt.join("q"),
        &["--pool", "q", "--num-targets", "1"],
    );
    // Another user's file, before the limits: it counts for user 1000.
    fs::write(mnt.join("q/theirs"), b"theirs").expect("write theirs");
    std::os::unix::fs::chown(mnt.join("q/theirs"), Some(1000), None).expect("chown to 1000");
    // The directory is one inode of user 0 in pool q; two files make three.
    run(&[
        "quota",
        "set",
        "--user",
        "0",
        "--pool",
        "q",
        "--hard-inodes",
        "3",
        "--hard-bytes",
        "2M",
    ]);
    fs::write(mnt.join("q/a"), vec![1u8; 1 << 20]).expect("write a");
    fs::write(mnt.join("q/b"), vec![2u8; 512 << 10]).expect("write b");
    let blocked = |what: usize| {
        move |list: &str| {
            list.lines()
                .find(|line| line.split_whitespace().nth(3) == Some("q"))
                .and_then(|line| {
                    let states: Vec<&str> = line
                        .split_whitespace()
                        .filter(|w| *w == "BLOCKED" || *w == "ok")
                        .collect();
                    states.get(what).map(|state| *state == "BLOCKED")
                })
                .unwrap_or(false)
        }
    };
    weft_testkit::wait_until("user 0 to be at its inode limit", || {
        blocked(1)(&run(&["quota", "list"]))
    })
    .expect("blocked");
    wait_for_the_map(&cluster);
    assert!(
        over_quota(fs::File::create(mnt.join("q/c"))),
        "no fourth inode"
    );
    // Elsewhere, the user is not limited.
    fs::write(mnt.join("elsewhere"), b"free").expect("another pool has no limit");

    // 1.5 MiB of 2: an overwrite goes on, growth to 2 MiB blocks the space.
    let mut a = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("q/a"))
        .expect("open a");
    a.write_all(&vec![3u8; 1 << 20]).expect("overwrite");
    a.sync_all().expect("an overwrite is no growth");
    drop(a);
    let mut b = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("q/b"))
        .expect("open b");
    b.write_all(&vec![4u8; 512 << 10]).expect("append");
    b.sync_all().expect("up to the limit");
    drop(b);
    weft_testkit::wait_until("user 0 to be at its space limit", || {
        blocked(0)(&run(&["quota", "list"]))
    })
    .expect("blocked");
    wait_for_the_map(&cluster);
    let mut b = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("q/b"))
        .expect("open b");
    let grew = b.write_all(b"one byte more").and_then(|()| b.sync_all());
    assert!(over_quota(grew), "no growth over the hard space limit");
    drop(b);
    // (The refused bytes read as a hole: the size the kernel took from the write stays, as
    // after any write whose writeback failed.)
    assert_eq!(
        fs::read(mnt.join("q/b")).expect("read")[..1 << 20],
        [vec![2u8; 512 << 10], vec![4u8; 512 << 10]].concat()[..]
    );

    // A truncate that extends a file grows it as a write would; a chown to the blocked user
    // hands it the file's inode and bytes: both refused. Shrinking is allowed.
    let extend = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("q/a"))
        .and_then(|file| file.set_len(4 << 20));
    assert!(over_quota(extend), "no growth by an extending truncate");
    // An allocation takes space whether or not it grows the size: refused either way.
    let a = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("q/a"))
        .expect("open a");
    for (flags, what) in [
        (0, "an allocation past the end"),
        (
            libc::FALLOC_FL_KEEP_SIZE,
            "an allocation that keeps the size",
        ),
    ] {
        // SAFETY: fallocate(2) on a descriptor this test owns.
        let allocated = unsafe {
            libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&a), flags, 2 << 20, 1 << 20)
        };
        let result = if allocated == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        };
        assert!(over_quota(result), "{what} of a blocked user's file");
    }
    drop(a);
    assert!(
        over_quota(std::os::unix::fs::chown(
            mnt.join("q/theirs"),
            Some(0),
            None
        )),
        "no chown to a blocked user"
    );
    std::os::unix::fs::chown(mnt.join("q/theirs"), Some(1001), None)
        .expect("a chown to a user with room");

    // A higher limit: both go on.
    run(&[
        "quota",
        "set",
        "--user",
        "0",
        "--pool",
        "q",
        "--hard-inodes",
        "100",
        "--hard-bytes",
        "100M",
    ]);
    weft_testkit::wait_until("user 0 to be free again", || {
        let list = run(&["quota", "list"]);
        !blocked(0)(&list) && !blocked(1)(&list)
    })
    .expect("free");
    wait_for_the_map(&cluster);
    fs::write(mnt.join("q/c"), b"now").expect("a new file under the new limit");

    // Over a soft limit longer than the grace period (1 s here): blocked as by a hard one.
    run(&[
        "quota",
        "set",
        "--user",
        "0",
        "--pool",
        "q",
        "--soft-inodes",
        "2",
        "--hard-inodes",
        "100",
    ]);
    weft_testkit::wait_until("the grace period to run out", || {
        blocked(1)(&run(&["quota", "list"]))
    })
    .expect("blocked after its grace");
    wait_for_the_map(&cluster);
    assert!(
        over_quota(fs::File::create(mnt.join("q/d"))),
        "no inode past the grace period"
    );
}

/// The standings (`ok`, `BLOCKED`) of space and inodes in the `weft quota list` line of
/// `kind` (user, group, project).
fn standings(list: &str, kind: &str) -> Vec<String> {
    list.lines()
        .find(|line| line.split_whitespace().next() == Some(kind))
        .map(|line| {
            line.split_whitespace()
                .filter(|word| *word == "BLOCKED" || *word == "ok")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

// Goal: a project quota counts a directory tree, wherever its entries live: `weft quota
// project` gives a tree its id (shown by `weft entry info`), what is made in it later takes
// the id (on either metadata server, in a spread directory's shards too), a rename into the
// tree from outside is refused with EXDEV so `mv` copies and the copy counts, a rename out
// keeps counting; at its hard limits no file or directory is made in the tree and no write
// grows one of its files (EDQUOT through the mount), while the same user goes on outside;
// the usage survives a kill of the metadata servers and fsck agrees with it.
// Method: two metadata servers, a spread directory in the tree, the commands an operator
// types, files written, renamed and moved through the mount.
#[test]
fn a_project_quota_counts_a_directory_tree() {
    use std::io::Write;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let run = |args: &[&str]| run_ok(&cluster, args);
    let path = |name: &str| mnt.join(name).display().to_string();
    fs::create_dir_all(mnt.join("proj/sub")).expect("mkdir");
    fs::write(mnt.join("proj/old"), vec![1u8; 1 << 20]).expect("write");
    fs::write(mnt.join("outside"), vec![2u8; 1 << 20]).expect("write");
    run(&["mkdir", "--spread", "2", &path("proj/wide")]);

    let set = run(&["quota", "project", &path("proj"), "7"]);
    assert!(set.contains("4 entries"), "{set}");
    let info = run(&["entry", "info", &path("proj/old")]);
    assert!(info.contains("Project: 7"), "{info}");
    assert!(
        !run(&["entry", "info", &path("outside")]).contains("Project:"),
        "outside the tree, no project"
    );

    // New entries take the project, in the spread directory's shards on both servers too.
    fs::write(mnt.join("proj/sub/new"), vec![3u8; 1 << 20]).expect("write");
    fs::create_dir(mnt.join("proj/sub/deeper")).expect("mkdir");
    for i in 0..4 {
        fs::write(mnt.join(format!("proj/wide/f{i}")), b"").expect("create");
    }
    fs::create_dir(mnt.join("proj/wide/d")).expect("mkdir in the spread directory");
    let project = |used: &str, inodes: u64| {
        vec![(
            "project".to_string(),
            7,
            "default".to_string(),
            used.to_string(),
            inodes,
        )]
    };
    // proj, sub, old, wide, new, deeper, f0..f3, d.
    assert_eq!(quota_rows(&cluster, &["--project", "7"]), project("2M", 11));

    // Into the tree from outside: EXDEV, and `mv` copies; out of it: it keeps counting.
    let refused = fs::rename(mnt.join("outside"), mnt.join("proj/moved"));
    assert_eq!(
        refused.map_err(|error| error.raw_os_error()),
        Err(Some(libc::EXDEV)),
        "a rename into another project"
    );
    let mv = std::process::Command::new("mv")
        .arg(mnt.join("outside"))
        .arg(mnt.join("proj/moved"))
        .output()
        .expect("mv");
    assert!(mv.status.success(), "{mv:?}");
    fs::create_dir(mnt.join("dir-out")).expect("mkdir");
    assert_eq!(
        fs::rename(mnt.join("dir-out"), mnt.join("proj/sub/dir-in"))
            .map_err(|error| error.raw_os_error()),
        Err(Some(libc::EXDEV)),
        "a directory renamed into another project"
    );
    fs::remove_dir(mnt.join("dir-out")).expect("rmdir");
    let c_path = |name: &str| {
        std::ffi::CString::new(mnt.join(name).into_os_string().into_encoded_bytes())
            .expect("a path")
    };
    let (inside, outside) = (c_path("proj/sub/new"), c_path("old-out-of-tree"));
    fs::write(mnt.join("old-out-of-tree"), b"swap me").expect("write");
    // SAFETY: renameat2(2) reads two NUL-terminated paths.
    let swapped = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            inside.as_ptr(),
            libc::AT_FDCWD,
            outside.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(
        (swapped, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EXDEV)),
        "an exchange across projects"
    );
    fs::remove_file(mnt.join("old-out-of-tree")).expect("unlink");
    fs::rename(mnt.join("proj/sub/new"), mnt.join("proj/sub/deeper/new"))
        .expect("a rename inside the project");
    fs::rename(mnt.join("proj/old"), mnt.join("old-out")).expect("a rename out of the tree");
    assert_eq!(quota_rows(&cluster, &["--project", "7"]), project("3M", 12));
    let info = run(&["entry", "info", &path("proj/moved")]);
    assert!(
        info.contains("Project: 7"),
        "the copy is the project's: {info}"
    );

    // At both hard limits: nothing new in the tree, no growth of its files; outside, the
    // same user goes on.
    run(&[
        "quota",
        "set",
        "--project",
        "7",
        "--hard-bytes",
        "3M",
        "--hard-inodes",
        "12",
    ]);
    weft_testkit::wait_until("project 7 to be blocked", || {
        standings(&run(&["quota", "list"]), "project") == ["BLOCKED", "BLOCKED"]
    })
    .expect("blocked");
    wait_for_the_map(&cluster);
    assert!(
        over_quota(fs::File::create(mnt.join("proj/sub/x"))),
        "no new file in the project"
    );
    assert!(
        over_quota(fs::create_dir(mnt.join("proj/wide/e"))),
        "no new directory in the project"
    );
    let (made, _, err) = weft(
        &cluster,
        &[
            "mkdir",
            "--spread",
            "2",
            &path("proj/wide2"),
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(
        !made && err.contains("quota"),
        "no new spread directory in the project: {err}"
    );
    let mut new = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("proj/sub/deeper/new"))
        .expect("open");
    let grew = new.write_all(b"more").and_then(|()| new.sync_all());
    assert!(over_quota(grew), "no growth of the project's files");
    drop(new);
    // The native library is refused the same, with EDQUOT.
    let (runtime, client) = common::native_client(&cluster, |config| {
        config.heartbeat_interval = std::time::Duration::from_millis(300);
    });
    let native = runtime.block_on(async {
        let proj = client
            .lookup(weft_proto::InodeId::ROOT, "proj")
            .await
            .expect("proj");
        let new = weft_client::client::regular_file(0o644, 0o022, (0, 0));
        let created = client.create(proj.inode, "native", new).await;
        let moved = client
            .lookup(proj.inode, "moved")
            .await
            .expect("proj/moved");
        let file = client
            .open_file(moved.inode, weft_proto::access::WRITE)
            .await
            .expect("open");
        let grown = match file
            .write(moved.size, bytes::Bytes::from_static(b"more"))
            .await
        {
            Ok(()) => file.sync().await,
            Err(error) => Err(error),
        };
        let _ = file.close().await;
        (created.map(drop), grown)
    });
    assert_eq!(
        native.0.map_err(|error| error.errno()),
        Err(libc::EDQUOT),
        "no new file through the native library"
    );
    assert_eq!(
        native.1.map_err(|error| error.errno()),
        Err(libc::EDQUOT),
        "no growth through the native library"
    );
    fs::write(mnt.join("free"), b"outside").expect("the user is not limited outside");
    let mut out = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("old-out"))
        .expect("open");
    assert!(
        over_quota(out.write_all(b"more").and_then(|()| out.sync_all())),
        "a file renamed out of the tree still counts in its project"
    );
    drop(out);

    // (The refused appends left their files longer by a hole, as the kernel took the size
    // from the writes, and each file counts its length.)
    let before = quota_rows(&cluster, &["--project", "7"]);
    assert_eq!(before[0].4, 12, "{before:?}");
    for meta in ["meta-1", "meta-2"] {
        cluster.kill(meta).expect("kill");
        cluster.restart(meta).expect("restart");
    }
    weft_testkit::wait_until("the metadata servers to answer again", || {
        weft(&cluster, &["quota", "report", "--mgmt", cluster.mgmt()]).0
    })
    .expect("back");
    assert_eq!(
        quota_rows(&cluster, &["--project", "7"]),
        before,
        "usage survives a kill"
    );
    let (ok, report, err) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(ok, "fsck finds usage as the inodes count it: {report}{err}");
}

// Goal: a writer that keeps its file open is counted as it writes, not only at its close or
// fsync, so a quota notices it: the file's growth shows in `weft quota report` while it is
// still open and unsynced. Method: 80 MiB written through the native library to a file held
// open (the mount's kernel reports sizes itself when it writes back a file's times), the
// report read until it shows them.
#[test]
fn a_file_held_open_is_counted_as_it_grows() {
    let cluster = cluster(ClusterSpec::default());
    let (runtime, client) = common::native_client(&cluster, |config| {
        config.heartbeat_interval = std::time::Duration::from_millis(300);
    });
    let new = weft_client::client::regular_file(0o644, 0o022, (5005, 6005));
    let (file, _) = runtime
        .block_on(client.create_file((weft_proto::InodeId::ROOT, "log"), new))
        .expect("create");
    let block = bytes::Bytes::from(vec![7u8; 1 << 20]);
    for at in 0..80u64 {
        runtime
            .block_on(file.write(at << 20, block.clone()))
            .expect("write");
    }
    let used = || bytes_used_by(&cluster, "5005");
    weft_testkit::wait_until("the open file's growth to be counted", || {
        // Reported every 64 MiB of growth: at least that much before the close.
        used() >= 64 << 20
    })
    .expect("counted while open");
    runtime.block_on(file.close()).expect("close");
    weft_testkit::wait_until("the whole file to be counted at its close", || {
        used() == 80 << 20
    })
    .expect("counted at close");
}

// Goal: a hard byte limit is hard. A user at 8 MiB who writes 32 MiB with dd (conv=fsync)
// is refused with EDQUOT, and nothing it does lands past the limit, however the file grows:
// writes through the mount (written behind by the kernel), an extending truncate, an
// allocation with and without its size, a copy (copy_file_range), and writes through the
// native library; a new file does not take another MiB. The usage management counts and the
// sizes a fresh mount sees stay within 8 MiB. A higher limit lets the same dd through.
// Method: `weft quota set` on nobody, the tools run as nobody through runuser in a
// world-writable directory, a native client writing as nobody, `weft quota report`.
#[test]
fn a_hard_limit_holds_however_a_file_grows() {
    let limit: u64 = 8 << 20;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    run_ok(
        &cluster,
        &["quota", "set", "--user", "65534", "--hard-bytes", "8M"],
    );
    wait_for_the_map(&cluster);
    let q = mnt.join("q");
    fs::create_dir(&q).expect("mkdir");
    fs::set_permissions(&q, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("chmod");

    let (ok, err) = as_nobody(&q, "dd if=/dev/zero of=big bs=1M count=32 conv=fsync");
    assert!(!ok, "32 MiB written under an 8 MiB limit");
    assert!(err.contains("Disk quota exceeded"), "dd says why: {err}");
    let (ok, err) = as_nobody(&q, "dd if=/dev/zero of=more bs=1M count=2 conv=fsync");
    assert!(
        !ok && err.contains("Disk quota exceeded"),
        "a new file takes no more: {err}"
    );
    for (script, what) in [
        ("truncate -s 64M big", "an extending truncate"),
        ("fallocate -l 4M allocated", "an allocation"),
        (
            "touch kept && fallocate -n -l 4M kept",
            "an allocation that keeps the size",
        ),
        ("cp --reflink=never big copy", "a copy"),
    ] {
        let (ok, err) = as_nobody(&q, script);
        assert!(!ok, "{what} went past the limit");
        assert!(err.contains("Disk quota exceeded"), "{what}: {err}");
    }
    // The native library, as nobody: refused at the limit too.
    {
        let (runtime, client) = common::native_client(&cluster, |_| {});
        let q_inode = runtime
            .block_on(client.lookup(weft_proto::InodeId::ROOT, "q"))
            .expect("lookup q")
            .inode;
        let new = weft_client::client::regular_file(0o644, 0o022, (65534, 65534));
        let (file, _) = runtime
            .block_on(client.create_file((q_inode, "native"), new))
            .expect("create");
        let block = bytes::Bytes::from(vec![7u8; 1 << 20]);
        let refused = (0..16u64)
            .map(|at| runtime.block_on(file.write(at << 20, block.clone())))
            .find_map(Result::err)
            .expect("16 MiB written through the native library under the limit");
        assert_eq!(
            refused.code(),
            weft_proto::ErrorCode::QuotaExceeded,
            "{refused}"
        );
        let _ = runtime.block_on(file.close());
    }
    weft_testkit::wait_until("every close to be counted", || {
        let used = bytes_used_by(&cluster, "65534");
        assert!(used <= limit, "nobody uses {used} bytes, past its limit");
        used > 0
    })
    .expect("counted");
    // A fresh mount sees the sizes the servers keep.
    cluster.unmount(&mnt).expect("unmount");
    let mnt = cluster.mount().expect("mount again");
    let sizes: u64 = fs::read_dir(mnt.join("q"))
        .expect("list")
        .map(|entry| entry.expect("entry").metadata().expect("stat").len())
        .sum();
    assert!(sizes <= limit, "nobody's files hold {sizes} bytes");
    assert!(bytes_used_by(&cluster, "65534") <= limit);

    // A higher limit: the same dd goes through.
    run_ok(
        &cluster,
        &["quota", "set", "--user", "65534", "--hard-bytes", "64M"],
    );
    wait_for_the_map(&cluster);
    let (ok, err) = as_nobody(
        &mnt.join("q"),
        "dd if=/dev/zero of=big bs=1M count=32 conv=fsync",
    );
    assert!(ok, "dd under a raised limit: {err}");
    // Space allocated past the size counts after the close too: allocations that keep the
    // size, one file after another, stop at the limit as writes do.
    let (ok, err) = as_nobody(
        &mnt.join("q"),
        "for f in k1 k2 k3 k4; do touch $f && fallocate -n -l 16M $f || exit 1; done",
    );
    assert!(
        !ok,
        "64 MiB allocated past 32 MiB written under a 64 MiB limit"
    );
    assert!(err.contains("Disk quota exceeded"), "{err}");
    weft_testkit::wait_until("the allocations to be counted", || {
        let used = bytes_used_by(&cluster, "65534");
        assert!(used <= 64 << 20, "nobody uses {used} bytes, past its limit");
        used >= (32 << 20) + (16 << 20)
    })
    .expect("allocations counted");
}

// Goal: the room a writer holds under a hard limit counts for as long as the writer may use
// it: a truncate of its file to nothing leaves the room counted (the writer may fill it again
// without asking), and so does the close of one of two handles of one client. Another file
// gets only what is left, and the use never passes the limit. Method: a native client as
// nobody under an 8 MiB limit, writes of 1 MiB until refused, `weft quota report`.
#[test]
fn a_writers_room_counts_across_truncates_and_handles() {
    let limit: u64 = 8 << 20;
    let cluster = cluster(ClusterSpec::default());
    run_ok(
        &cluster,
        &["quota", "set", "--user", "65534", "--hard-bytes", "8M"],
    );
    wait_for_the_map(&cluster);
    let (runtime, client) = common::native_client(&cluster, |_| {});
    let block = bytes::Bytes::from(vec![7u8; 1 << 20]);
    let create = |name: &str| {
        let new = weft_client::client::regular_file(0o644, 0o022, (65534, 65534));
        runtime
            .block_on(client.create_file((weft_proto::InodeId::ROOT, name), new))
            .expect("create")
            .0
    };
    // MiB written at 0, 1, 2… until one is refused (EDQUOT), at most `most`.
    let fill = |file: &weft_client::OpenFile, most: u64| -> u64 {
        for at in 0..most {
            if let Err(error) = runtime.block_on(file.write(at << 20, block.clone())) {
                assert_eq!(
                    error.code(),
                    weft_proto::ErrorCode::QuotaExceeded,
                    "{error}"
                );
                return at;
            }
        }
        most
    };
    let settled_use = |files: &[&weft_client::OpenFile]| {
        for file in files {
            runtime.block_on(file.flush()).expect("report");
        }
        let used = bytes_used_by(&cluster, "65534");
        assert!(used <= limit, "nobody uses {used} bytes, past its limit");
        used
    };

    let truncate = |file: &weft_client::OpenFile, what: &str| {
        let to_nothing = weft_proto::messages::AttrChanges {
            size: Some(0),
            ..Default::default()
        };
        runtime
            .block_on(client.set_attr(file.inode(), to_nothing))
            .expect(what);
    };

    // A truncate to nothing: the room stays counted, the file is filled again.
    let a = create("a");
    assert_eq!(fill(&a, 6), 6);
    truncate(&a, "truncate");
    let b = create("b");
    let into_b = fill(&b, 8);
    assert!(into_b < 2, "b took {into_b} MiB of a's room");
    assert_eq!(fill(&a, 6), 6, "a fills its room again");
    settled_use(&[&a, &b]);
    runtime.block_on(a.close()).expect("close a");
    runtime.block_on(b.close()).expect("close b");
    truncate(&b, "truncate b");
    truncate(&a, "truncate a");

    // Two handles of one file: the close of one leaves the other's room counted.
    let c = create("c");
    let c_again = runtime
        .block_on(client.open_file(
            c.inode(),
            weft_proto::access::READ | weft_proto::access::WRITE,
        ))
        .expect("open again");
    assert_eq!(fill(&c, 3), 3);
    runtime.block_on(c.close()).expect("close one handle");
    let d = create("d");
    fill(&d, 8);
    // Inside the room c's writes were given (its batch, 512 KiB past 3 MiB): no ask.
    runtime
        .block_on(c_again.write(3 << 20, bytes::Bytes::from(vec![8u8; 512 << 10])))
        .expect("a write inside the room");
    settled_use(&[&c_again, &d]);
    runtime.block_on(c_again.close()).expect("close");
    runtime.block_on(d.close()).expect("close");
    settled_use(&[]);
}

// Goal: a hard limit holds for mirrored files as for plain ones: a user at 8 MiB who writes
// 32 MiB with dd into a mirrored directory is refused with EDQUOT and uses no more than the
// limit (a file's size counts once, whatever its copies). Method: a storage mirror pair,
// `weft entry set --pattern mirrored`, dd as nobody through the mount, `weft quota report`.
#[test]
fn a_hard_limit_holds_for_mirrored_files() {
    let mut cluster = common::mirrored_pair();
    let mnt = cluster.mount().expect("mount");
    run_ok(
        &cluster,
        &["quota", "set", "--user", "65534", "--hard-bytes", "8M"],
    );
    wait_for_the_map(&cluster);
    let q = mnt.join("q");
    common::make_mirrored_dir(&cluster, &q, &[]);
    fs::set_permissions(&q, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).expect("chmod");
    let (ok, err) = as_nobody(&q, "dd if=/dev/zero of=big bs=1M count=32 conv=fsync");
    assert!(!ok, "32 MiB written under an 8 MiB limit");
    assert!(err.contains("Disk quota exceeded"), "dd says why: {err}");
    weft_testkit::wait_until("the close to be counted", || {
        let used = bytes_used_by(&cluster, "65534");
        assert!(used <= 8 << 20, "nobody uses {used} bytes, past its limit");
        used > 0
    })
    .expect("counted");
}

// Goal: a writer under a hard limit goes on writing across a failover of its file's metadata
// server. The server that takes the home over learns the writer's open only when the writer
// reclaims it; until then it answers that it is in its grace period, and the writer reclaims
// at once and asks again, instead of failing its write with EPERM ("not open for writing
// here", as the nemesis saw). Method: two mirrored metadata servers, a native client whose
// periodic reclaim would come only after an hour (so only the answer can make it reclaim),
// a file of a user under a hard limit held open with 1 MiB written, its home's server
// killed, then 16 MiB more written (past any room the first server granted) and closed.
#[test]
fn a_writer_under_a_hard_limit_goes_on_across_a_metadata_failover() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        mgmt_settings: vec!["session_timeout_ms=36000000".into()],
        ..ClusterSpec::default()
    });
    common::autocreate_meta_groups(&cluster);
    run_ok(
        &cluster,
        &["quota", "set", "--user", "5005", "--hard-bytes", "1G"],
    );
    wait_for_the_map(&cluster);
    let (runtime, client) = common::native_client(&cluster, |config| {
        config.heartbeat_interval = std::time::Duration::from_secs(3600);
    });
    let new = weft_client::client::regular_file(0o644, 0o022, (5005, 6005));
    let (file, created) = runtime
        .block_on(client.create_file((weft_proto::InodeId::ROOT, "held"), new))
        .expect("create");
    let inode = created.attr.inode;
    let block = bytes::Bytes::from(vec![7u8; 1 << 20]);
    runtime
        .block_on(file.write(0, block.clone()))
        .expect("write before the failover");
    assert_eq!(
        inode.home().0,
        1,
        "the file is on the root's home, meta-1's"
    );
    common::fail_meta_1_over(&mut cluster);
    for at in 1..=16u64 {
        runtime
            .block_on(file.write(at << 20, block.clone()))
            .unwrap_or_else(|error| panic!("write at {at} MiB after the failover: {error}"));
    }
    runtime.block_on(file.close()).expect("close");
    let attr = runtime.block_on(client.get_attr(inode)).expect("stat");
    assert_eq!(attr.size, 17 << 20, "every byte written is the file's");
}
