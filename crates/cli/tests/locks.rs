//! Byte-range locks (fcntl) and flock across clients: conflicts between mounts, release on
//! close, blocking waits that end with the lock or with EINTR, release when a client's
//! session expires, and reclaim after the metadata server restarts.

mod common;

use common::{cluster, errno};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use weft_net::MetaCalls;
use weft_proto::ErrorCode;
use weft_testkit::{wait_until, ClusterSpec};

fn open(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .expect("open")
}

fn flock_struct(kind: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is plain data.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as i16;
    lock.l_whence = libc::SEEK_SET as i16;
    lock.l_start = start;
    lock.l_len = len;
    lock
}

fn set_lock(file: &File, kind: i32, start: i64, len: i64) -> std::io::Result<()> {
    let lock = flock_struct(kind, start, len);
    // SAFETY: fcntl with a valid descriptor and flock structure.
    let result = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get_lock(file: &File, kind: i32, start: i64, len: i64) -> libc::flock {
    let mut lock = flock_struct(kind, start, len);
    // SAFETY: fcntl with a valid descriptor and a writable flock structure.
    assert_eq!(
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) },
        0,
        "F_GETLK"
    );
    lock
}

fn flock(file: &File, operation: i32) -> std::io::Result<()> {
    // SAFETY: flock on a valid descriptor.
    let result = unsafe { libc::flock(file.as_raw_fd(), operation) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A Python process locking `path` with F_SETLKW; `script` runs after it opened the file.
fn python(script: &str, path: &Path) -> Command {
    let mut command = Command::new("timeout");
    command.args([
        "120",
        "python3",
        "-c",
        script,
        path.to_str().expect("utf-8"),
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

// Goal: locks taken through one mount are seen by another — fcntl conflicts, F_GETLK reports
// the holder, shared locks coexist, close releases the closing process's locks, and flock
// excludes across mounts until the holder closes. Method: one file, two mounts, libc calls.
#[test]
fn locks_hold_across_mounts() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let here = open(&first.join("locked"));
    let there = open(&second.join("locked"));

    set_lock(&here, libc::F_WRLCK, 0, 100).expect("write lock in mount 1");
    assert_eq!(
        errno(set_lock(&there, libc::F_WRLCK, 50, 10)),
        libc::EAGAIN,
        "conflict seen from mount 2"
    );
    assert_eq!(errno(set_lock(&there, libc::F_RDLCK, 99, 1)), libc::EAGAIN);
    let holder = get_lock(&there, libc::F_WRLCK, 50, 10);
    assert_eq!(i32::from(holder.l_type), libc::F_WRLCK);
    assert_eq!(
        holder.l_pid,
        std::process::id() as i32,
        "F_GETLK names the holder"
    );
    set_lock(&there, libc::F_WRLCK, 100, 50).expect("a range next to it is free");
    set_lock(&here, libc::F_RDLCK, 0, 100).expect("downgrade to shared");
    set_lock(&there, libc::F_RDLCK, 0, 10).expect("shared locks coexist");
    drop(here);
    set_lock(&there, libc::F_WRLCK, 0, 100).expect("close released mount 1's locks");
    drop(there);

    let a = open(&first.join("flocked"));
    let b = open(&second.join("flocked"));
    flock(&a, libc::LOCK_EX).expect("flock in mount 1");
    assert_eq!(
        errno(flock(&b, libc::LOCK_EX | libc::LOCK_NB)),
        libc::EWOULDBLOCK,
        "flock excludes across mounts"
    );
    // FUSE releases a flock with the last close's RELEASE request, which the kernel sends after
    // close(2) returns: the lock goes shortly after the close, not at it.
    drop(a);
    wait_until("the flock to be released", || {
        flock(&b, libc::LOCK_EX | libc::LOCK_NB).is_ok()
    })
    .expect("free after the holder closed");
}

// Goal: a lock request whose range ends before it starts is refused with a clear error, and
// the server keeps serving locks. Method: a member's native session sends SetLock and GetLock
// with byte 100 to byte 10, then a valid lock. Before, the server granted the inverted range
// and kept it in its table, where no release could match it.
#[test]
fn an_inverted_lock_range_is_refused() {
    use weft_proto::messages::{LockKind, LockRange};
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    std::fs::write(mnt.join("locked"), b"data").expect("a file");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let view = weft_net::ClusterView::new(cluster.mgmt(), common::member_options(&cluster));
        view.refresh().await.expect("the map");
        let session = view
            .mgmt()
            .register_client("inverted-lock".into())
            .await
            .expect("a session")
            .id;
        let root = weft_proto::ids::InodeId::ROOT;
        let meta = view.meta(root.home()).await.expect("the root's server");
        let file = meta.lookup(root, "locked").await.expect("lookup").inode;
        let inverted = LockRange {
            owner: 1,
            kind: LockKind::Write,
            start: 100,
            end: 10,
            pid: 1,
        };
        let refused = meta
            .set_lock(session, file, inverted, 0, false)
            .await
            .expect_err("an inverted range is refused");
        assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
        assert!(
            refused.to_string().contains("before it starts"),
            "{refused}"
        );
        let refused = meta
            .get_lock(session, file, inverted)
            .await
            .expect_err("a test of an inverted range is refused");
        assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
        let valid = LockRange {
            start: 10,
            end: 100,
            ..inverted
        };
        meta.set_lock(session, file, valid, 0, false)
            .await
            .expect("a valid lock is granted");
        let unlock = LockRange {
            kind: LockKind::Unlock,
            ..valid
        };
        meta.set_lock(session, file, unlock, 0, false)
            .await
            .expect("and released");
    });
}

// Goal: F_SETLKW blocks until the lock is released, and a blocked F_SETLKW ends with EINTR
// when a signal interrupts it. Method: Python waiters on the second mount against a lock
// held through the first; the interrupted one gets SIGALRM after one second.
#[test]
fn blocking_locks_wait_and_can_be_interrupted() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let holder = open(&first.join("contended"));
    set_lock(&holder, libc::F_WRLCK, 0, 0).expect("hold the whole file");

    let interrupted = python(
        "import fcntl, signal, sys\n\
         class Alarm(Exception): pass\n\
         def ring(*_): raise Alarm()\n\
         signal.signal(signal.SIGALRM, ring)\n\
         f = open(sys.argv[1], 'r+')\n\
         signal.alarm(1)\n\
         try:\n    fcntl.lockf(f, fcntl.LOCK_EX)\n    print('granted')\n\
         except Alarm:\n    print('interrupted')\n",
        &second.join("contended"),
    )
    .output()
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&interrupted.stdout);
    assert_eq!(
        stdout.trim(),
        "interrupted",
        "stderr: {}",
        String::from_utf8_lossy(&interrupted.stderr)
    );

    let waiter = python(
        "import fcntl, sys\nf = open(sys.argv[1], 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\nprint('granted')\n",
        &second.join("contended"),
    )
    .spawn()
    .expect("waiter starts");
    drop(holder);
    let output = waiter.wait_with_output().expect("waiter ends");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "granted",
        "the waiter gets the lock after the release"
    );
}

// Goal: the locks of a client that dies are released when its session expires. Method: a
// process on mount 2 holds a lock; kill -9 that mount's client; mount 1 gets the lock once
// management lets the session expire (3 s in tests).
#[test]
fn locks_of_a_dead_client_are_released() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let held = open(&second.join("orphaned-lock"));
    set_lock(&held, libc::F_WRLCK, 0, 0).expect("lock through mount 2");
    let mine = open(&first.join("orphaned-lock"));
    assert_eq!(errno(set_lock(&mine, libc::F_WRLCK, 0, 0)), libc::EAGAIN);
    cluster
        .kill_mount(&second)
        .expect("kill -9 the client of mount 2");
    std::mem::forget(held);
    wait_until("the dead client's lock to be released", || {
        set_lock(&mine, libc::F_WRLCK, 0, 0).is_ok()
    })
    .expect("released");
}

// Goal: after the metadata server restarts, clients reclaim their locks within the grace
// period, so a lock held across the restart still excludes others. Method: hold a lock
// through mount 1, kill -9 and restart the metadata server, and wait until mount 2 sees the
// lock again (only a reclaim can put it back), then release it and take it from mount 2.
#[test]
fn locks_are_reclaimed_after_a_metadata_restart() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let held = open(&first.join("reclaimed"));
    set_lock(&held, libc::F_WRLCK, 0, 10).expect("lock through mount 1");
    let other = open(&second.join("reclaimed"));
    cluster
        .restart("meta-1")
        .expect("restart the metadata server");
    wait_until("the lock to be reclaimed", || {
        i32::from(get_lock(&other, libc::F_WRLCK, 0, 10).l_type) == libc::F_WRLCK
    })
    .expect("reclaimed");
    assert_eq!(
        errno(set_lock(&other, libc::F_WRLCK, 0, 10)),
        libc::EAGAIN,
        "the reclaimed lock still excludes"
    );
    drop(held);
    wait_until("the lock to be free", || {
        set_lock(&other, libc::F_WRLCK, 0, 10).is_ok()
    })
    .expect("free");
}

// Goal: a client whose session expired while it could not speak (a frozen machine, a cut from
// management) learns that its locks are gone instead of going on as if it still excluded
// others. Method: mount 1 holds a lock and has written; its client is stopped (SIGSTOP) until
// the session expires and mount 2 takes the lock; once it runs again, the holder's fsync must
// fail with EIO (its locks were lost) and its lock requests must not pretend.
#[test]
fn a_client_whose_session_expired_is_told_its_locks_are_gone() {
    // The files of the stopped mount stay out of every process another test starts.
    common::private_file_table();
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let held = open(&first.join("fenced"));
    set_lock(&held, libc::F_WRLCK, 0, 0).expect("lock through mount 1");
    std::io::Write::write_all(&mut &held, b"under the lock").expect("write");
    held.sync_all().expect("fsync while the lock is held");
    cluster.pause_mount(&first, true).expect("stop mount 1");
    let other = open(&second.join("fenced"));
    let taken = wait_until("the expired session's lock to go to mount 2", || {
        set_lock(&other, libc::F_WRLCK, 0, 0).is_ok()
    });
    cluster.pause_mount(&first, false).expect("resume mount 1");
    taken.expect("mount 2 took the lock");
    wait_until("mount 1 to report its lost lock", || {
        held.sync_all()
            .is_err_and(|error| error.raw_os_error() == Some(libc::EIO))
    })
    .expect("the holder of a lost lock is told");
    assert_eq!(
        errno(set_lock(&held, libc::F_WRLCK, 0, 0)),
        libc::EAGAIN,
        "mount 2 holds the lock now"
    );
    assert!(
        cluster.log("mount-1").contains("session expired"),
        "the client says why"
    );
    drop(other);
    wait_until("mount 1 to take the lock under its new session", || {
        set_lock(&held, libc::F_WRLCK, 0, 0).is_ok()
    })
    .expect("a new session locks again");
}

// Goal: a client set to heartbeat more slowly than the cluster's session timeout keeps its
// session: management says the timeout when it opens the session, and the client beats within
// it. (Every `weft` tool, `weft entry migrate` among them, ran with the 5 s default against a
// cluster whose sessions last 3 s, and lost its session, with its locks and opens, every 5 s.)
// Method: the test cluster's sessions last 3 s; mount 1 is set to heartbeat every 20 s and
// holds a lock for 10 s; mount 2 must never get the lock, and mount 1 must never see its
// session expire.
#[test]
fn a_client_set_to_heartbeat_slowly_keeps_its_session() {
    let mut cluster = cluster(ClusterSpec::default());
    let slow = cluster
        .mount_with(&["heartbeat_interval_ms=20000"])
        .expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let held = open(&slow.join("held"));
    set_lock(&held, libc::F_WRLCK, 0, 0).expect("lock through mount 1");
    let other = open(&second.join("held"));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < until {
        assert_eq!(
            errno(set_lock(&other, libc::F_WRLCK, 0, 0)),
            libc::EAGAIN,
            "mount 1's lock must hold while it lives"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    held.sync_all().expect("mount 1's file is still good");
    assert!(
        !cluster.log("mount-1").contains("session expired"),
        "mount 1 lost its session: {}",
        cluster.log("mount-1")
    );
}

// Goal: expired client sessions are forgotten: management kept every client ever registered
// (and after its restart counted all of them live for a session timeout), and a metadata
// server kept the stored replies of dead clients forever. Method: a mount makes changes and its
// client dies; once its session expired, the metadata server must keep none of its replies;
// restart management: the dead session must not count.
#[test]
fn management_forgets_expired_sessions() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    // The session count `weft cluster status` shows, once management answers.
    let sessions = |cluster: &weft_testkit::LocalCluster| -> Option<u64> {
        let output = cluster
            .weft(&["cluster", "status", "--mgmt", cluster.mgmt()])
            .ok()?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let head = text.split(" client sessions").next()?;
        head.rsplit(' ').next()?.parse::<u64>().ok()
    };
    assert_eq!(sessions(&cluster), Some(1), "the mount's session");
    for file in 0..20 {
        std::fs::write(mnt.join(format!("f{file}")), b"changes with stored replies")
            .expect("write");
    }
    assert!(
        common::metric_sum(&cluster, "weft_meta_stored_replies", &[]) > 0,
        "a live session's last replies are kept for its retries"
    );
    cluster.kill_mount(&mnt).expect("kill the mount's client");
    wait_until("the dead client's session to expire", || {
        sessions(&cluster) == Some(0)
    })
    .expect("expired");
    let mut kept = u64::MAX;
    wait_until(
        "the metadata server to drop the dead session's replies",
        || {
            kept = common::metric_sum(&cluster, "weft_meta_stored_replies", &[]);
            kept == 0
        },
    )
    .unwrap_or_else(|_| panic!("{kept} replies of an expired session are still kept"));
    cluster.restart("mgmt").expect("restart management");
    let mut after = None;
    wait_until("management to answer", || {
        after = sessions(&cluster);
        after.is_some()
    })
    .expect("management answers");
    assert_eq!(
        after,
        Some(0),
        "an expired session is not live again after a restart"
    );
}

// Goal: a program that keeps its runtime busy does not lose its session. The session's
// heartbeat ran as a task among the program's own, and a runtime fires timers and reads
// sockets only between polls (every 61 polls when never idle), so tasks that compute for tens
// of milliseconds between awaits (as a burst of 64 KiB attribute sets did in a debug build)
// held the heartbeat past the session timeout: the session expired under a live client and
// its changes failed. Method: a native client on a two-thread runtime; the program floods the
// runtime with tasks of 50 ms of work each, about 6 s per thread, twice the session timeout
// (3 s in tests); the session must be the same one afterwards and management must have
// expired none.
#[test]
fn a_busy_program_keeps_its_session() {
    let cluster = cluster(ClusterSpec::default());
    let (runtime, client) = common::native_client(&cluster, |config| {
        config.heartbeat_interval = std::time::Duration::from_millis(300);
    });
    let session = client.id();
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..240u64 {
            tasks.spawn(async move {
                // Work that does not yield for 50 ms.
                let started = std::time::Instant::now();
                let mut sum = task;
                while started.elapsed() < std::time::Duration::from_millis(50) {
                    sum = std::hint::black_box(sum.wrapping_mul(31).wrapping_add(7));
                }
                sum
            });
        }
        while tasks.join_next().await.is_some() {}
    });
    assert_eq!(client.id(), session, "the busy client kept its session");
    assert!(
        !cluster
            .log("mgmt")
            .contains("forgot expired client sessions"),
        "management expired no session"
    );
    runtime
        .block_on(client.mkdir(weft_proto::ids::InodeId::ROOT, "after", 0o755, 0, (0, 0)))
        .expect("the client still makes changes");
}
