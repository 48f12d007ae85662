//! Root-squashed mounts and handles that keep what they wrote.

use super::*;

// Goal: a root-squashed mount keeps a read-only file it writes, as POSIX judges a write
// through a descriptor by the access it was opened with: a file created with mode 0444 and
// written takes its bytes, its size report at close, an ftruncate and an fchmod through the
// descriptor; git (which makes every object 0444) inits, adds, commits and packs; tar
// extracts read-only files; and every byte survives `weft fsck --repair`.
// Method: a cluster of real processes, a mount with a root-squashed client key, the tools run
// as root in it, the bytes read back through a member mount after the repair.
#[test]
fn a_root_squashed_mount_keeps_the_read_only_files_it_writes() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let (mut cluster, mnt, squash) = squashed_cluster(scratch.path());
    let work = squash.join("work");

    // One file, by hand: created 0444, written, cut through the descriptor, its mode changed
    // through the descriptor, closed.
    let data = common::pattern(43, 100_000);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(work.join("read-only"))
        .expect("create 0444");
    file.write_all(&data).expect("write");
    file.write_all(&[7; 5000]).expect("write past the end kept");
    file.set_len(data.len() as u64)
        .expect("ftruncate through a descriptor opened for writing");
    file.set_permissions(fs::Permissions::from_mode(0o400))
        .expect("fchmod by the owner");
    close(file).expect("close reports the size");
    assert_eq!(fs::read(mnt.join("work/read-only")).expect("read"), data);

    // git makes every object read-only; tar x sets the modes it extracts after writing. (A
    // directory archived without write access is another matter: tar as root makes it with
    // that mode before filling it, which a squashed root, as nobody, cannot fill: as on NFS.)
    let repo = work.join("repo");
    fs::create_dir(&repo).expect("mkdir");
    let git = |args: &[&str]| {
        let mut all = vec![
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=weft",
            "-c",
            "user.email=weft@example.invalid",
        ];
        all.extend_from_slice(args);
        run_in(&repo, "git", &all);
    };
    git(&["init", "-q"]);
    for index in 0..20u64 {
        fs::write(
            repo.join(format!("file-{index}")),
            common::pattern(index, 3000 + index as usize * 997),
        )
        .expect("write a file to commit");
    }
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "twenty files"]);
    git(&["gc", "-q"]);
    git(&["fsck", "--full"]);

    let source = scratch.path().join("tree");
    fs::create_dir_all(source.join("sub")).expect("mkdir");
    for index in 0..5u64 {
        let path = source.join(format!("sub/ro-{index}"));
        fs::write(&path, common::pattern(100 + index, 20_000)).expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).expect("chmod");
    }
    let tarball = scratch.path().join("tree.tar");
    run_in(
        scratch.path(),
        "tar",
        &["cf", tarball.to_str().expect("utf-8"), "tree"],
    );
    // As root, tar gives each file its archived owner: a squashed root may not (as on NFS).
    run_in(
        &work,
        "tar",
        &["xf", tarball.to_str().expect("utf-8"), "--no-same-owner"],
    );

    // Every byte survives a repair, read through a member mount.
    let (ok, report, err) = weft(&cluster, &["fsck", "--repair", "--mgmt", cluster.mgmt()]);
    assert!(ok, "fsck --repair: {report}{err}");
    assert_eq!(fs::read(mnt.join("work/read-only")).expect("read"), data);
    for index in 0..5u64 {
        assert_eq!(
            fs::read(mnt.join(format!("work/tree/sub/ro-{index}"))).expect("read"),
            common::pattern(100 + index, 20_000),
            "an extracted read-only file"
        );
    }
    let member_repo = mnt.join("work/repo");
    let output = Command::new("git")
        .args(["-c", "safe.directory=*", "fsck", "--full"])
        .current_dir(&member_repo)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "the repository is whole after the repair: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for index in 0..20u64 {
        assert_eq!(
            fs::read(member_repo.join(format!("file-{index}"))).expect("read"),
            common::pattern(index, 3000 + index as usize * 997)
        );
    }
    cluster.unmount(&squash).expect("unmount");
}

// Goal: a file the native library wrote through a handle dropped without `close()` keeps its
// size and bytes, as a file whose process exits without closing does: the size reaches its
// metadata server (other clients see it, while the writer's session lives on), and `weft fsck
// --repair` leaves the bytes alone. Method: a cluster of real processes, a native client that
// writes and drops the handle, a member mount that reads the file back.
#[test]
fn a_handle_dropped_without_a_close_keeps_what_it_wrote() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let (runtime, native) = common::native_client(&cluster, |_| {});
    let data = common::pattern(1, 300_000);
    let new = weft_client::client::regular_file(0o644, 0, (0, 0));
    runtime.block_on(async {
        let (file, _) = native
            .create_file((weft_proto::ids::InodeId::ROOT, "dropped"), new)
            .await
            .expect("create");
        file.write(0, bytes::Bytes::from(data.clone()))
            .await
            .expect("write");
        drop(file);
    });
    wait_until(
        "the dropped handle's size to reach its metadata server",
        || fs::metadata(mnt.join("dropped")).is_ok_and(|meta| meta.len() == data.len() as u64),
    )
    .expect("the size of a dropped handle is reported");
    let (ok, report, err) = weft(&cluster, &["fsck", "--repair", "--mgmt", cluster.mgmt()]);
    assert!(ok, "fsck --repair: {report}{err}");
    assert_eq!(fs::read(mnt.join("dropped")).expect("read"), data);
    drop(native);
}

// Goal: a root-squashed writer keeps its read-only file across a failover of the file's
// metadata server: its close reports the size through the descriptor it opened for writing,
// and the server that took the home over, which learns the open only when the writer
// reclaims it, answers that it is in its grace period instead of judging the write by the
// mode (EACCES, and the size lost). Method: two mirrored metadata servers, a native client
// with a root-squashed key whose periodic reclaim would come only after an hour, a 0444 file
// it creates and writes, meta-1 killed, then the close; a member client reads the size.
#[test]
fn a_squashed_writer_keeps_its_read_only_file_across_a_metadata_failover() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        mgmt_settings: vec!["session_timeout_ms=36000000".into()],
        ..ClusterSpec::default()
    });
    common::autocreate_meta_groups(&cluster);
    let scratch = tempfile::tempdir().expect("tempdir");
    let key = restricted_key(&cluster, scratch.path(), "squashed", &["--root-squash"]);
    let (runtime, member) = common::native_client(&cluster, |_| {});
    let root = weft_proto::ids::InodeId::ROOT;
    let open_root = weft_proto::messages::AttrChanges {
        mode: Some(0o777),
        ..weft_proto::messages::AttrChanges::default()
    };
    runtime
        .block_on(member.set_attr(root, open_root))
        .expect("chmod 777 /");
    let (squashed_runtime, squashed) = common::native_client(&cluster, |config| {
        config.auth_key_file = Some(key.clone());
        config.heartbeat_interval = std::time::Duration::from_secs(3600);
    });
    let data = common::pattern(7, 200_000);
    let new = weft_client::client::regular_file(0o444, 0, (0, 0));
    let (file, created) = squashed_runtime
        .block_on(squashed.create_file((root, "read-only"), new))
        .expect("create as nobody");
    assert_eq!(
        created.attr.uid, 65534,
        "the squashed root creates as nobody"
    );
    assert_eq!(
        created.attr.inode.home().0,
        1,
        "the file is on meta-1's home"
    );
    squashed_runtime
        .block_on(file.write(0, bytes::Bytes::from(data.clone())))
        .expect("write");
    common::fail_meta_1_over(&mut cluster);
    squashed_runtime
        .block_on(file.close())
        .expect("the close reports the size through the open descriptor");
    let attr = runtime
        .block_on(member.get_attr(created.attr.inode))
        .expect("stat");
    assert_eq!(
        attr.size,
        data.len() as u64,
        "every byte written is the file's"
    );
}

/// `ls` of `dir` with `args` through a mount: whether it succeeded, and the names it printed.
fn listed(dir: &Path, args: &[&str]) -> (bool, Vec<String>) {
    let output = Command::new("ls")
        .args(args)
        .arg(dir)
        .output()
        .expect("ls runs");
    let names = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.starts_with("total"))
        .filter_map(|line| line.split_whitespace().last().map(str::to_string))
        .collect();
    (output.status.success(), names)
}

// Goal: a listing with attributes (the mount's READDIRPLUS) holds to a root-squashed
// client's rules as the lookups it replaces would: a directory the caller may read but not
// search lists its names, while their attributes stay refused (stat fails with EACCES); once
// it may search the directory, `ls -l` shows every entry's size. Method: a cluster of real
// processes, a member mount that makes the directory (mode 0744, root's) and a mount with a
// root-squashed client key that lists it.
#[test]
fn a_directory_readable_but_not_searchable_lists_its_names_only() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("names");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("a"), b"12345").expect("write");
    fs::write(dir.join("b"), b"1234567").expect("write");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o744)).expect("chmod");
    let scratch = tempfile::tempdir().expect("tempdir");
    let squash = squashed_mount(&mut cluster, &mnt, scratch.path());

    let seen = squash.join("names");
    let (ok, names) = listed(&seen, &["-1", "--color=never"]);
    assert!(ok, "ls of a readable directory succeeds");
    assert_eq!(names, ["a", "b"]);
    let refused = fs::metadata(seen.join("a")).expect_err("no search permission");
    assert_eq!(refused.raw_os_error(), Some(libc::EACCES), "{refused}");
    let (_, long) = listed(&seen, &["-ln", "--color=never"]);
    assert_eq!(
        long,
        ["a", "b"],
        "ls -l lists the names whose attributes it cannot read"
    );

    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    wait_until("the directory to be searchable", || {
        fs::metadata(seen.join("a")).is_ok()
    })
    .expect("search allowed");
    let output = Command::new("ls")
        .args(["-ln", "--color=never"])
        .arg(&seen)
        .output()
        .expect("ls runs");
    assert!(output.status.success());
    let sizes: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.starts_with("total"))
        .map(|line| {
            line.split_whitespace()
                .nth(4)
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(sizes, ["5", "7"], "the entries' sizes, once searchable");
}

// Goal: a root-squashed client's rename and unlink whose reply a metadata server's crash took
// are answered from the reply the server kept, as a member client's are: the copy the client
// sends again is not judged anew against what the first one changed (the name it moved or
// removed is gone, so a kernel's check of it answers ENOENT). The nemesis saw such an unlink
// of a file it had answer ENOENT. Its creates, writes and fsyncs go through such a crash too.
// Method: files made (created, written, fsynced) through a root-squashed mount, then renamed,
// then removed, each pass while meta-1 is armed to crash right after a synced record of its
// change log (a change durable and not answered: meta-1 syncs every change before its answer,
// `sync_every_change=true`), restarted once it crashed: every call succeeds, and the files
// are gone.
#[test]
fn a_squashed_change_whose_reply_a_crash_took_is_answered() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let (mut cluster, mnt, squash) = squashed_cluster_with(
        scratch.path(),
        ClusterSpec {
            meta_settings: vec!["sync_every_change=true".into()],
            ..ClusterSpec::default()
        },
    );
    let paths: Vec<_> = (0..40)
        .map(|index| squash.join(format!("work/f{index}")))
        .collect();
    let creates = common::crash_during(&mut cluster, "meta-after-log@9", paths.clone(), |path| {
        let mut file = fs::File::create(path)?;
        file.write_all(b"nobody's")?;
        file.sync_all()
    });
    for (path, result) in paths.iter().zip(creates) {
        result.unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
    }
    let moved = |path: &Path| path.with_extension("moved");
    let renames = common::crash_during(&mut cluster, "meta-after-log@10", paths.clone(), |path| {
        fs::rename(path, path.with_extension("moved"))
    });
    for (path, result) in paths.iter().zip(renames) {
        result.unwrap_or_else(|error| panic!("rename {}: {error}", path.display()));
    }
    let moved_paths: Vec<_> = paths.iter().map(|path| moved(path)).collect();
    let unlinks = common::crash_during(
        &mut cluster,
        "meta-after-log@10",
        moved_paths.clone(),
        |path| fs::remove_file(path),
    );
    for (path, result) in moved_paths.iter().zip(unlinks) {
        result.unwrap_or_else(|error| panic!("unlink {}: {error}", path.display()));
    }
    let left: Vec<_> = fs::read_dir(mnt.join("work"))
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "every file was removed: {left:?}");
}

// Goal: a root-squashed writer under a hard space quota keeps writing a file it holds open
// while the file is restriped into a narrower pattern: the room its home reserved for it is
// room in the file, whatever pattern its objects have. (The capability's bound on the
// objects' growth was reckoned for the pattern of the open, three objects sharing the room,
// and the writes through the new pattern, one object taking it all, were refused with
// EDQUOT well inside the room and the limit.) Method: the standard cluster; a hard limit on
// nobody far above what is written; a directory striped over three targets in 64K chunks;
// the squashed mount writes and fsyncs, the tree is restriped onto the fourth target, the same
// descriptor writes further on and fsyncs; content compared.
#[test]
fn a_squashed_writer_keeps_writing_a_file_restriped_under_it() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let (cluster, mnt, squash) = squashed_cluster(scratch.path());
    common::set_quota(&cluster, &["--user", "65534", "--hard-bytes", "64G"]);
    let wide = mnt.join("work/wide");
    common::make_dir_with_pattern(
        &cluster,
        &wide,
        &["--num-targets", "3", "--chunk-size", "64K"],
    );
    fs::set_permissions(&wide, fs::Permissions::from_mode(0o777)).expect("chmod");
    let first = common::pattern(61, 256 << 10);
    let more = common::pattern(62, 512 << 10);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(squash.join("work/wide/f"))
        .expect("create as the squashed client");
    file.write_all(&first).expect("write");
    file.sync_all().expect("fsync");
    let path = wide.display().to_string();
    let (ok, out, err) = weft(
        &cluster,
        &[
            "entry",
            "migrate",
            &path,
            "--chunk-size",
            "64K",
            "--num-targets",
            "1",
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok && out.contains("1 moved"), "migrate: {out}{err}");
    let (targets, info) = common::layout_targets(&cluster, &wide.join("f"));
    assert_eq!(targets.len(), 1, "restriped onto one target: {info}");
    use std::os::unix::fs::FileExt;
    file.write_all_at(&more, 2 << 20)
        .expect("a write inside the room, through the new pattern");
    file.sync_all().expect("fsync after the restripe");
    close(file).expect("close");
    let mut expected = first.clone();
    expected.resize(2 << 20, 0);
    expected.extend_from_slice(&more);
    assert!(
        fs::read(mnt.join("work/wide/f")).expect("read") == expected,
        "the file holds both writes"
    );
}
