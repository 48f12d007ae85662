//! Bad input gets a clear answer and loses nothing: wrong config keys, missing directories, an
//! unreachable management, a full target, unknown paths in the CLI.

mod common;

use common::{cluster, pattern, run, weft};
use std::fs;
use weft_testkit::{wait_until, ClusterSpec};

// Goal: configuration mistakes are named, with what to do. Method: run `weft serve` with an
// unknown key (in a file and on the command line) and with a missing data directory.
#[test]
fn configuration_errors_are_named() {
    let directory = tempfile::tempdir().expect("tempdir");
    let config = directory.path().join("meta.toml");
    fs::write(
        &config,
        "data_dir = \"/tmp\"\nmgmt = \"127.0.0.1:1\"\ncolour = \"blue\"\n",
    )
    .expect("config");
    let (ok, output) = run(&["serve", "meta", "--config", config.to_str().expect("utf-8")]);
    assert!(!ok);
    assert!(
        output.contains("colour"),
        "the unknown key is named: {output}"
    );

    let (ok, output) = run(&[
        "serve",
        "mgmt",
        "--data-dir",
        "/tmp",
        "--set",
        "node_offline_timout_ms=5",
    ]);
    assert!(!ok);
    assert!(
        output.contains("node_offline_timout_ms"),
        "a misspelt command-line key is named: {output}"
    );

    let missing = directory.path().join("missing");
    let (ok, output) = run(&[
        "serve",
        "storage",
        "--data-dir",
        missing.to_str().expect("utf-8"),
        "--target",
        "/nonexistent-target",
        "--mgmt",
        "127.0.0.1:1",
    ]);
    assert!(!ok);
    assert!(
        output.contains("does not exist") && output.contains("mkdir -p"),
        "missing directories are named with the fix: {output}"
    );
}

// Goal: a mount against a management address that does not answer fails with a message that
// names the address; admin commands outside a mount say how to point them at one.
#[test]
fn unreachable_management_and_unknown_paths() {
    let directory = tempfile::tempdir().expect("tempdir");
    let mountpoint = directory.path().join("mnt");
    fs::create_dir(&mountpoint).expect("mkdir");
    let (ok, output) = run(&[
        "mount",
        "--mgmt",
        "127.0.0.1:1",
        mountpoint.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(
        output.contains("127.0.0.1:1") && output.contains("management"),
        "{output}"
    );

    let (ok, output) = run(&["entry", "info", "/"]);
    assert!(!ok);
    assert!(
        output.contains("not inside a Weft mount") && output.contains("--mgmt"),
        "{output}"
    );
    let (ok, output) = run(&["node", "list", "--mgmt", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(
        output.contains("is management running at 127.0.0.1:1"),
        "{output}"
    );
}

// Goal: a write a full target refused leaves no slot recorded without its object, so
// `weft fsck` finds no data lost that was never written. (A close reported the slots written
// while its last write was still on its way; the target refused that write, and fsck took the
// slot's missing object for lost data.) Method: targets of 1 MiB each, filled; then small
// files, each written and closed at once (the close answers ENOSPC); unmount; fsck.
#[test]
fn a_write_a_full_target_refused_leaves_nothing_for_fsck() {
    use std::io::Write;
    let mut cluster = cluster(ClusterSpec {
        target_capacity_bytes: Some(1024 * 1024),
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    // More than the targets hold: its error is not what this test is about.
    let _ = fs::write(mnt.join("fill"), pattern(41, 16 * 1024 * 1024));
    for i in 0..16 {
        let mut file = fs::File::create(mnt.join(format!("small-{i}"))).expect("create");
        // Written behind: the refusal comes back at the close, which `drop` ignores.
        file.write_all(&pattern(42, 4096)).expect("write admitted");
    }
    // Unmounting waits for the closes to reach the metadata server: fsck judges only files
    // nobody holds open.
    cluster.unmount(&mnt).expect("unmount");
    let (ok, report, err) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(ok, "fsck finds nothing lost: {report}{err}");
}

// Goal: a full target gives the writer ENOSPC and nothing else is lost; no server crashes, and
// the space comes back when the file is removed. Method: targets limited to 4 MiB each; fill
// one file past the total; check an earlier file, the error, and the services.
#[test]
fn full_target_gives_enospc_and_loses_nothing() {
    let mut cluster = cluster(ClusterSpec {
        target_capacity_bytes: Some(4 * 1024 * 1024),
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let keep = pattern(31, 1024 * 1024);
    fs::write(mnt.join("keep"), &keep).expect("a file that fits");

    let error = fs::write(mnt.join("huge"), pattern(32, 24 * 1024 * 1024))
        .expect_err("the targets are too small");
    assert_eq!(
        error.raw_os_error(),
        Some(libc::ENOSPC),
        "the writer gets ENOSPC: {error}"
    );
    assert_eq!(
        fs::read(mnt.join("keep")).expect("read"),
        keep,
        "earlier data intact"
    );
    let (ok, nodes, _) = weft(&cluster, &["node", "list", "--mgmt", cluster.mgmt()]);
    assert!(
        ok && nodes.matches(" online ").count() == 3,
        "every server still runs: {nodes}"
    );

    // close(2) reports the write error of its file again.
    let path = std::ffi::CString::new(mnt.join("huge").to_str().expect("utf-8")).expect("path");
    // SAFETY: a valid path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY) };
    assert!(fd >= 0, "open");
    let block = vec![7u8; 1024 * 1024];
    let mut failed = false;
    for _ in 0..64 {
        // SAFETY: block is valid for block.len() bytes.
        if unsafe { libc::write(fd, block.as_ptr().cast(), block.len()) } < 0 {
            failed = true;
            break;
        }
    }
    assert!(failed, "writes fail once the targets are full");
    // SAFETY: fd is open and closed exactly once.
    let closed = unsafe { libc::close(fd) };
    assert_eq!(
        (closed, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::ENOSPC)),
        "close returns the error"
    );

    fs::remove_file(mnt.join("huge")).expect("remove the partial file");
    // A write is acknowledged by its fsync: `fs::write` ignores what close(2) answers, which
    // is where the error of a write still in flight at the last write(2) comes back.
    let write_synced = |path: &std::path::Path, data: &[u8]| {
        let mut file = fs::File::create(path)?;
        std::io::Write::write_all(&mut file, data)?;
        file.sync_all()
    };
    wait_until("space to come back", || {
        write_synced(&mnt.join("again"), &pattern(33, 2 * 1024 * 1024)).is_ok()
    })
    .expect("space back");
    assert_eq!(
        fs::read(mnt.join("again")).expect("read"),
        pattern(33, 2 * 1024 * 1024)
    );

    // The native client writes behind too: the error of a write in flight comes back at the
    // file's sync or close, and the benchmark fails with it.
    let (ok, _, stderr) = weft(
        &cluster,
        &[
            "bench",
            "io",
            "--mgmt",
            cluster.mgmt(),
            "--size",
            "24M",
            "--threads",
            "1",
        ],
    );
    assert!(!ok, "24 MiB cannot fit");
    assert!(stderr.to_lowercase().contains("space"), "{stderr}");
    assert_eq!(
        fs::read(mnt.join("again")).expect("read"),
        pattern(33, 2 * 1024 * 1024),
        "earlier data intact"
    );
}

// Goal: a storage server that takes fewer bytes of a write than it was sent is noticed: the
// writer gets EIO at its sync, never a file that silently lacks bytes. Method: the storage
// servers are armed to answer every write one byte short; a file written through the mount
// and synced fails with EIO (write-behind keeps the error for the file's sync), and the
// services keep serving.
#[test]
fn a_short_write_is_an_error_not_silence() {
    use std::io::Write;

    let mut cluster = cluster(ClusterSpec::default());
    for storage in ["storage-1", "storage-2"] {
        cluster
            .set_env(
                storage,
                &[("WEFT_FAILPOINTS", "storage-answers-short-writes")],
            )
            .expect("arm");
        cluster.restart(storage).expect("restart armed");
    }
    cluster.wait_ready().expect("ready");
    let mnt = cluster.mount().expect("mount");
    let mut file = fs::File::create(mnt.join("short")).expect("create");
    let written = file.write_all(&pattern(41, 1024 * 1024));
    let synced = written.and_then(|()| file.sync_all());
    let error = synced.expect_err("a short write is not a success");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    drop(file);
    let (ok, nodes, _) = weft(&cluster, &["node", "list", "--mgmt", cluster.mgmt()]);
    assert!(
        ok && nodes.matches(" online ").count() == 3,
        "every server still runs: {nodes}"
    );
}
