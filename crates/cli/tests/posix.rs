//! POSIX behaviour through a real FUSE mount of a real multi-process cluster: every operation
//! everyday tools need, and the right errno for each failure.

mod common;

use common::{c_path, cluster, errno, pattern};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use weft_service::durable::rename_with_flags;
use weft_testkit::ClusterSpec;

// Goal: files behave as POSIX says — create, exclusive create, truncate, append, holes, unlink
// of an open file, fsync, statfs. Method: run each through the mount and check data and errno.
#[test]
fn files() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");

    let path = mnt.join("file");
    let data = pattern(1, 3 * 1024 * 1024 + 12345);
    fs::write(&path, &data).expect("write");
    assert_eq!(fs::read(&path).expect("read"), data, "data reads back");
    assert_eq!(fs::metadata(&path).expect("stat").len(), data.len() as u64);

    let exclusive = OpenOptions::new().write(true).create_new(true).open(&path);
    assert_eq!(errno(exclusive), libc::EEXIST, "O_EXCL on an existing file");

    {
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open append");
        file.write_all(b"tail").expect("append");
    }
    let mut expected = data.clone();
    expected.extend_from_slice(b"tail");
    assert_eq!(fs::read(&path).expect("read"), expected, "O_APPEND appends");

    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("O_TRUNC");
    assert_eq!(
        fs::metadata(&path).expect("stat").len(),
        0,
        "O_TRUNC empties the file"
    );

    // Truncate up makes a hole that reads as zeros; a write past the end makes one too.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(1_000_000).expect("grow");
    let mut file = file;
    file.seek(SeekFrom::Start(3_000_000)).expect("seek");
    file.write_all(b"end").expect("write past end");
    file.sync_all().expect("fsync");
    drop(file);
    let content = fs::read(&path).expect("read");
    assert_eq!(content.len(), 3_000_003);
    assert!(
        content[..3_000_000].iter().all(|b| *b == 0),
        "holes read as zeros"
    );
    assert_eq!(&content[3_000_000..], b"end");

    // Truncate down and up again: the old bytes must not come back.
    fs::write(&path, pattern(2, 600_000)).expect("rewrite");
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(100)
        .expect("shrink");
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(600_000)
        .expect("regrow");
    let content = fs::read(&path).expect("read");
    assert_eq!(&content[..100], &pattern(2, 100)[..]);
    assert!(
        content[100..].iter().all(|b| *b == 0),
        "shrunk bytes stay gone"
    );

    // An unlinked open file stays readable until its last close.
    let doomed = mnt.join("doomed");
    let doomed_data = pattern(3, 700_000);
    fs::write(&doomed, &doomed_data).expect("write");
    let mut open = File::open(&doomed).expect("open");
    fs::remove_file(&doomed).expect("unlink");
    assert_eq!(
        errno(fs::metadata(&doomed)),
        libc::ENOENT,
        "the name is gone"
    );
    let mut read_back = Vec::new();
    open.read_to_end(&mut read_back).expect("read after unlink");
    assert_eq!(read_back, doomed_data, "data of an unlinked open file");
    drop(open);
    // Its last close disposes of it: fsck finds no unreachable inode (the kernel sends the
    // release after close returns, hence the wait).
    weft_testkit::wait_until("the unlinked file to go at its last close", || {
        common::weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]).0
    })
    .expect("the orphan is disposed of");

    // statfs reports the targets' space.
    let stat = nix_statvfs(&mnt);
    assert!(stat.0 > 0, "statfs reports blocks");

    assert_eq!(errno(File::open(mnt.join("missing"))), libc::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(errno(File::create(mnt.join(&long))), libc::ENAMETOOLONG);
    assert_eq!(errno(File::open(path.join("below-a-file"))), libc::ENOTDIR);

    // Requests the mount does not serve get their errno quietly: Python's open() asks isatty
    // (an ioctl) every time, which once logged a warning each.
    let script = format!(
        "import os\nfor _ in range(200):\n    with open({:?}) as f: f.isatty()\nos.fsync(os.open({:?}, os.O_RDONLY))",
        path.display().to_string(),
        mnt.display().to_string(),
    );
    let status = Command::new("python3")
        .args(["-c", &script])
        .status()
        .expect("python3");
    assert!(
        status.success(),
        "reads, isatty and fsync of a directory work"
    );
    let log = cluster.log("mount-1");
    let noisy = log.lines().filter(|line| line.contains("WARN")).count();
    assert!(
        noisy < 5,
        "unsupported requests are answered quietly ({noisy} warnings):\n{log}"
    );
    assert_eq!(
        log.matches("the mount does not serve this request").count(),
        1,
        "the first one of a kind is logged once:\n{log}"
    );
    // ...and counted: management exports each session's counts from its heartbeats.
    weft_testkit::wait_until("management to export the mount's unserved ioctls", || {
        common::metric_sum(
            &cluster,
            "weft_client_unserved_requests_total",
            &["request=\"ioctl\""],
        ) >= 200
    })
    .expect("the isatty ioctls are counted in a metric");
}

fn nix_statvfs(path: &Path) -> (u64, u64) {
    let path = c_path(path);
    // SAFETY: statvfs is plain data and the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers for the duration of the call.
    assert_eq!(
        unsafe { libc::statvfs(path.as_ptr(), &mut stat) },
        0,
        "statvfs"
    );
    (stat.f_blocks, stat.f_files)
}

// Goal: directories, links, renames and special files, with their POSIX error cases.
#[test]
fn namespace() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");

    let dir = mnt.join("dir");
    fs::create_dir(&dir).expect("mkdir");
    assert_eq!(errno(fs::create_dir(&dir)), libc::EEXIST);
    fs::write(dir.join("f"), b"x").expect("create in dir");
    assert_eq!(errno(fs::remove_dir(&dir)), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_file(&dir)), libc::EISDIR);
    assert_eq!(errno(fs::remove_dir(dir.join("f"))), libc::ENOTDIR);
    assert_eq!(fs::metadata(&dir).expect("stat").nlink(), 2);
    fs::create_dir(dir.join("sub")).expect("mkdir sub");
    assert_eq!(
        fs::metadata(&dir).expect("stat").nlink(),
        3,
        "a subdirectory adds a link"
    );

    // Rename over an existing file replaces it.
    fs::write(mnt.join("a"), b"A").expect("a");
    fs::write(mnt.join("b"), b"B").expect("b");
    fs::rename(mnt.join("a"), mnt.join("b")).expect("rename over");
    assert_eq!(fs::read(mnt.join("b")).expect("read"), b"A");
    assert_eq!(errno(fs::metadata(mnt.join("a"))), libc::ENOENT);

    // Directory renames and their checks.
    fs::rename(&dir, mnt.join("moved")).expect("rename dir");
    let moved = mnt.join("moved");
    assert_eq!(
        fs::read(moved.join("f")).expect("read through moved dir"),
        b"x"
    );
    assert_eq!(
        errno(fs::rename(&moved, moved.join("sub").join("inside"))),
        libc::EINVAL,
        "no move into own subtree"
    );
    fs::create_dir(mnt.join("full")).expect("mkdir full");
    fs::write(mnt.join("full").join("x"), b"").expect("fill");
    assert_eq!(
        errno(fs::rename(moved.join("sub"), mnt.join("full"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs::rename(mnt.join("b"), mnt.join("full"))),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs::rename(mnt.join("full"), mnt.join("b"))),
        libc::ENOTDIR
    );
    fs::create_dir(mnt.join("empty")).expect("mkdir empty");
    fs::rename(moved.join("sub"), mnt.join("empty")).expect("rename over empty dir");
    assert_eq!(
        fs::metadata(&moved).expect("stat").nlink(),
        2,
        "moved out: one link less"
    );

    // RENAME_NOREPLACE and RENAME_EXCHANGE.
    fs::write(mnt.join("c"), b"C").expect("c");
    assert_eq!(
        errno(rename_with_flags(
            &mnt.join("b"),
            &mnt.join("c"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    rename_with_flags(&mnt.join("b"), &mnt.join("c"), libc::RENAME_EXCHANGE).expect("exchange");
    assert_eq!(fs::read(mnt.join("b")).expect("b"), b"C");
    assert_eq!(fs::read(mnt.join("c")).expect("c"), b"A");

    // Symbolic and hard links.
    std::os::unix::fs::symlink("c", mnt.join("link")).expect("symlink");
    assert_eq!(
        fs::read_link(mnt.join("link")).expect("readlink").to_str(),
        Some("c")
    );
    assert_eq!(fs::read(mnt.join("link")).expect("follow"), b"A");
    fs::hard_link(mnt.join("c"), moved.join("hard")).expect("hard link");
    assert_eq!(fs::metadata(mnt.join("c")).expect("stat").nlink(), 2);
    fs::remove_file(mnt.join("c")).expect("unlink one name");
    assert_eq!(fs::read(moved.join("hard")).expect("other name"), b"A");
    assert_eq!(fs::metadata(moved.join("hard")).expect("stat").nlink(), 1);
    assert_eq!(
        errno(fs::hard_link(&moved, mnt.join("dirlink"))),
        libc::EPERM,
        "no hard links to directories"
    );

    // FIFOs and sockets.
    let fifo = c_path(&mnt.join("fifo"));
    // SAFETY: valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
    assert!(fs::metadata(mnt.join("fifo"))
        .expect("stat")
        .file_type()
        .is_fifo());
    let _listener =
        std::os::unix::net::UnixListener::bind(mnt.join("socket")).expect("bind socket");
    assert!(fs::metadata(mnt.join("socket"))
        .expect("stat")
        .file_type()
        .is_socket());

    // chmod, chown, utimens with nanoseconds.
    fs::set_permissions(moved.join("hard"), fs::Permissions::from_mode(0o640)).expect("chmod");
    assert_eq!(
        fs::metadata(moved.join("hard")).expect("stat").mode() & 0o7777,
        0o640
    );
    std::os::unix::fs::chown(moved.join("hard"), Some(1234), Some(5678)).expect("chown");
    let meta = fs::metadata(moved.join("hard")).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(1_600_000_000, 123_456_789);
    File::options()
        .write(true)
        .open(moved.join("hard"))
        .expect("open")
        .set_modified(when)
        .expect("utimens");
    let meta = fs::metadata(moved.join("hard")).expect("stat");
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_600_000_000, 123_456_789)
    );
}

// Goal: removing a file or a directory through the mount costs no extra round trip for the
// directory's attributes, which the kernel forgets after every removal and asks for again at
// the next lookup there: the removal's reply carries them, and the mount answers from it.
// Method: with a long attribute cache (so nothing expires during the test), remove entries
// one by one, each followed by a stat of a name in the same directory, and count the metadata
// servers' get-attributes; then check the directory's attributes are those after the removals.
#[test]
fn a_removal_leaves_its_directory_attributes_with_the_mount() {
    const ENTRIES: usize = 20;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = common::long_cached_mount(&mut cluster);
    let dir = mnt.join("dir");
    fs::create_dir(&dir).expect("mkdir");
    for i in 0..ENTRIES {
        fs::write(dir.join(format!("f{i}")), b"x").expect("create");
        fs::create_dir(dir.join(format!("d{i}"))).expect("mkdir");
    }
    fs::write(dir.join("kept"), b"k").expect("create");
    let kept = dir.join("kept");
    fs::metadata(&kept).expect("stat");
    let getattrs = || common::meta_requests(&cluster, &["get_attr"]);
    let before = getattrs();
    for i in 0..ENTRIES {
        fs::remove_file(dir.join(format!("f{i}"))).expect("unlink");
        fs::metadata(&kept).expect("stat after unlink");
        fs::remove_dir(dir.join(format!("d{i}"))).expect("rmdir");
        fs::metadata(&kept).expect("stat after rmdir");
    }
    let asked = getattrs() - before;
    assert!(
        asked <= 2,
        "{asked} get-attributes for {} removals, each followed by a lookup in their directory",
        2 * ENTRIES
    );
    let after = fs::metadata(&dir).expect("stat dir");
    assert_eq!(
        after.nlink(),
        2,
        "the directory's links after its subdirectories went"
    );
    let names: Vec<_> = fs::read_dir(&dir)
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["kept"], "what is left");

    // A client of protocol version 10 is answered as before: done, without the attributes.
    fs::write(mnt.join("old"), b"o").expect("create");
    fs::write(mnt.join("new"), b"n").expect("create");
    let (runtime, older) = common::native_client(&cluster, |config| config.protocol_max = 10);
    let root = weft_proto::InodeId::ROOT;
    let answered = runtime.block_on(older.unlink(root, "old")).expect("unlink");
    assert_eq!(answered, None, "a client of version 10 gets no attributes");
    let (runtime, newer) = common::native_client(&cluster, |_| {});
    let answered = runtime.block_on(newer.unlink(root, "new")).expect("unlink");
    assert_eq!(
        answered.map(|attr| attr.inode),
        Some(root),
        "the root's attributes"
    );
}

// Goal: extracting a file as tar does (create, write, then fchown, fchmod and futimens on
// the open file, close) costs no round trip for the attributes the kernel forgets after the
// writes and asks for before the fchown: the mount answers from the create's reply and the
// size it wrote. What a stat then shows is the file as it is: its size, owner, mode and
// times, its links after a link and an unlink made while it is open, its size after an
// fallocate, and, at the next open, a change another mount made.
// Method: with a long attribute cache, extract 20 files so, counting the metadata servers'
// get-attributes; then check each of those attributes through the open file.
#[test]
fn a_written_file_answers_the_kernels_stat_from_what_the_mount_knows() {
    const FILES: usize = 20;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = common::long_cached_mount(&mut cluster);
    let dir = mnt.join("dir");
    fs::create_dir(&dir).expect("mkdir");
    let getattrs = || common::meta_requests(&cluster, &["get_attr"]);
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(1_500_000_000, 7);
    let before = getattrs();
    for i in 0..FILES {
        let mut file = File::create(dir.join(format!("f{i}"))).expect("create");
        file.write_all(&vec![b'x'; 10_000 + i]).expect("write");
        std::os::unix::fs::fchown(&file, Some(0), Some(0)).expect("fchown");
        file.set_permissions(fs::Permissions::from_mode(0o640))
            .expect("fchmod");
        file.set_modified(when).expect("futimens");
    }
    let asked = getattrs() - before;
    assert!(
        asked <= 2,
        "{asked} get-attributes for {FILES} files extracted as tar does"
    );
    for i in 0..FILES {
        let meta = fs::metadata(dir.join(format!("f{i}"))).expect("stat");
        assert_eq!(
            (
                meta.len(),
                meta.mode() & 0o7777,
                meta.uid(),
                meta.mtime(),
                meta.mtime_nsec()
            ),
            ((10_000 + i) as u64, 0o640, 0, 1_500_000_000, 7),
            "f{i} as extracted"
        );
    }

    // Links made and removed while the file is open show in its attributes.
    let path = dir.join("open");
    let mut file = File::create(&path).expect("create");
    file.write_all(b"written").expect("write");
    assert_eq!(file.metadata().expect("fstat").len(), 7, "the size written");
    fs::hard_link(&path, dir.join("second")).expect("link");
    assert_eq!(file.metadata().expect("fstat").nlink(), 2, "after a link");
    fs::remove_file(dir.join("second")).expect("unlink");
    file.write_all(b" more").expect("write");
    assert_eq!(
        file.metadata().expect("fstat").nlink(),
        1,
        "after an unlink"
    );
    // SAFETY: fallocate on an open descriptor, with no pointer arguments.
    let allocated =
        unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, 1 << 20) };
    assert_eq!(
        allocated,
        0,
        "fallocate: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(
        file.metadata().expect("fstat").len(),
        1 << 20,
        "after an fallocate that grew the file"
    );
    file.set_len(3).expect("ftruncate");
    assert_eq!(file.metadata().expect("fstat").len(), 3, "after a truncate");
    drop(file);

    // Another mount's change is seen at the next open.
    let other = cluster.mount().expect("a second mount");
    let file = File::create(dir.join("shared")).expect("create");
    fs::set_permissions(other.join("dir/shared"), fs::Permissions::from_mode(0o600))
        .expect("chmod through the other mount");
    drop(file);
    let file = File::open(dir.join("shared")).expect("open again");
    assert_eq!(
        file.metadata().expect("fstat").mode() & 0o7777,
        0o600,
        "another mount's chmod, at the next open"
    );

    // A file written past 64 MiB reports its size while it stays open, which moves its
    // times at the home: a stat then shows them, not the create's.
    let mut file = File::create(dir.join("big")).expect("create");
    let created = file.metadata().expect("fstat").modified().expect("mtime");
    let chunk = vec![b'b'; 1 << 20];
    for _ in 0..65 {
        file.write_all(&chunk).expect("write");
    }
    weft_testkit::wait_until("the growth to be reported", || {
        fs::metadata(other.join("dir/big")).is_ok_and(|meta| meta.len() >= 64 << 20)
    })
    .expect("reported while open");
    let seen = file.metadata().expect("fstat");
    assert!(
        seen.modified().expect("mtime") > created,
        "the modification time of the size report made while the file is open"
    );
    assert_eq!(seen.len(), 65 << 20, "the size written");
}

// Goal: a directory's attributes seen through the mount follow every change made in it, even
// though the mount answers the kernel's re-read after a create from the create's reply.
// Method: after each kind of change, stat the directory and check its link count and that its
// change time (and for entry changes its modification time) moved forward.
#[test]
fn directory_attributes_follow_every_change() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("dir");
    fs::create_dir(&dir).expect("mkdir");
    let times = |m: &fs::Metadata| {
        (
            (m.mtime(), m.mtime_nsec()),
            (m.ctime(), m.ctime_nsec()),
            m.nlink(),
            m.mode() & 0o7777,
        )
    };
    let mut before = times(&fs::metadata(&dir).expect("stat"));
    let mut check = |what: &str, entries_changed: bool, nlink: u64, mode: u32| {
        let after = times(&fs::metadata(&dir).expect("stat"));
        assert!(
            after.1 > before.1,
            "{what}: ctime {:?} -> {:?}",
            before.1,
            after.1
        );
        if entries_changed {
            assert!(
                after.0 > before.0,
                "{what}: mtime {:?} -> {:?}",
                before.0,
                after.0
            );
        }
        assert_eq!((after.2, after.3), (nlink, mode), "{what}: links and mode");
        before = after;
    };
    fs::write(dir.join("f"), b"x").expect("create");
    check("create", true, 2, 0o755);
    fs::create_dir(dir.join("sub")).expect("mkdir");
    check("mkdir", true, 3, 0o755);
    std::os::unix::fs::symlink("f", dir.join("link")).expect("symlink");
    check("symlink", true, 3, 0o755);
    fs::hard_link(dir.join("f"), dir.join("hard")).expect("link");
    check("link", true, 3, 0o755);
    fs::remove_file(dir.join("hard")).expect("unlink");
    check("unlink", true, 3, 0o755);
    fs::rename(dir.join("sub"), mnt.join("sub")).expect("rename out");
    check("rename out", true, 2, 0o755);
    fs::rename(mnt.join("sub"), dir.join("back")).expect("rename in");
    check("rename in", true, 3, 0o755);
    fs::remove_dir(dir.join("back")).expect("rmdir");
    check("rmdir", true, 2, 0o755);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
    check("chmod", false, 2, 0o750);
    let (c_dir, name) = (
        c_path(&dir),
        std::ffi::CString::new("user.k").expect("name"),
    );
    // SAFETY: NUL-terminated path and name, and a value of the given length.
    let set = unsafe { libc::setxattr(c_dir.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(set, 0, "setxattr");
    check("setxattr", false, 2, 0o750);
    fs::write(dir.join("g"), b"y").expect("create after");
    check("create after", true, 2, 0o750);

    // A moved directory's change time moves too, though the rename names only its parents.
    let moved = dir.join("moving");
    fs::create_dir(&moved).expect("mkdir");
    fs::write(moved.join("inside"), b"z").expect("create inside");
    let ctime = |p: &Path| {
        let m = fs::metadata(p).expect("stat");
        (m.ctime(), m.ctime_nsec())
    };
    let was = ctime(&moved);
    fs::rename(&moved, mnt.join("moved")).expect("rename dir");
    assert!(
        ctime(&mnt.join("moved")) > was,
        "the moved directory's ctime"
    );
}

// Goal: readdir of a large directory returns every entry once, even while entries are removed
// during the listing (as `rm -rf` does). Method: list 3000 entries through libc readdir,
// unlinking each entry right after reading it.
#[test]
fn large_directory_with_stable_offsets() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("big");
    fs::create_dir(&dir).expect("mkdir");
    let count = 3000;
    for index in 0..count {
        File::create(dir.join(format!("entry-{index:05}"))).expect("create");
    }
    let listed: std::collections::BTreeSet<String> = fs::read_dir(&dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listed.len(), count);

    let c_dir = c_path(&dir);
    // SAFETY: valid path; the stream is closed below.
    let stream = unsafe { libc::opendir(c_dir.as_ptr()) };
    assert!(!stream.is_null(), "opendir");
    let mut seen = std::collections::BTreeMap::<String, u32>::new();
    loop {
        // SAFETY: stream is a valid open DIR*.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated in a valid dirent.
        let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        if name == "." || name == ".." {
            continue;
        }
        fs::remove_file(dir.join(&name)).expect("unlink while listing");
        *seen.entry(name).or_default() += 1;
    }
    // SAFETY: stream is valid and closed once.
    unsafe { libc::closedir(stream) };
    assert_eq!(seen.len(), count, "every entry listed");
    assert!(seen.values().all(|n| *n == 1), "no entry listed twice");
    fs::remove_dir(&dir).expect("now empty");
}

// Goal: shared mmap reads and writes reach the file. Method: write through a MAP_SHARED
// mapping, msync, unmap, then read with read(2) after reopening.
#[test]
fn shared_mmap() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    // Also on a file opened with O_DIRECT, as on ext4: the mount lets the kernel map it.
    for direct in [false, true] {
        let path = mnt.join(format!("mapped-{direct}"));
        let data = pattern(7, 256 * 1024);
        fs::write(&path, &data).expect("write");
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&path).expect("open");
        let len = data.len();
        // SAFETY: mapping a file we hold open, of its exact length; unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(
            map,
            libc::MAP_FAILED,
            "mmap (O_DIRECT {direct}): {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the mapping is len bytes long and writable.
        let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
        assert_eq!(&bytes[..], &data[..], "mmap reads the file");
        bytes[1000..1010].copy_from_slice(b"0123456789");
        // SAFETY: valid mapping.
        assert_eq!(unsafe { libc::msync(map, len, libc::MS_SYNC) }, 0, "msync");
        // SAFETY: unmapping what was mapped.
        unsafe { libc::munmap(map, len) };
        drop(file);
        let mut expected = data;
        expected[1000..1010].copy_from_slice(b"0123456789");
        assert_eq!(
            fs::read(&path).expect("read"),
            expected,
            "mmap writes reach the file (O_DIRECT {direct})"
        );
    }
}

// Goal: the kernel enforces permissions (default_permissions) for a non-root user. Method: run
// commands as `nobody` through runuser and check what is refused and what is allowed.
#[test]
fn permissions_as_non_root() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let as_nobody = |script: &str| {
        let output = Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", script])
            .output()
            .expect("runuser");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let closed = mnt.join("closed");
    fs::create_dir(&closed).expect("mkdir");
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o755)).expect("chmod");
    let (ok, stderr) = as_nobody(&format!("touch {}/x", closed.display()));
    assert!(!ok, "nobody cannot create in a root-owned 0755 directory");
    assert!(stderr.contains("Permission denied"), "{stderr}");

    let open = mnt.join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).expect("chmod");
    let (ok, stderr) = as_nobody(&format!(
        "echo hi > {}/mine && cat {}/mine",
        open.display(),
        open.display()
    ));
    assert!(ok, "nobody creates in a 1777 directory: {stderr}");
    let nobody_uid = fs::metadata(open.join("mine")).expect("stat").uid();
    assert_ne!(nobody_uid, 0, "the file belongs to nobody");

    fs::write(open.join("roots"), b"secret").expect("root file");
    fs::set_permissions(open.join("roots"), fs::Permissions::from_mode(0o600)).expect("chmod");
    let (ok, stderr) = as_nobody(&format!("cat {}/roots", open.display()));
    assert!(
        !ok && stderr.contains("Permission denied"),
        "0600 root file unreadable: {stderr}"
    );
    let (ok, _) = as_nobody(&format!("rm {}/roots", open.display()));
    assert!(!ok, "sticky bit: nobody cannot remove root's file");
    let (ok, stderr) = as_nobody(&format!("chown root {}/mine", open.display()));
    assert!(
        !ok && stderr.contains("not permitted"),
        "nobody cannot give a file away: {stderr}"
    );
}

// Goal: a modification time set after the last write and before close (futimens, as tar x,
// cp -p and rsync -a do) is the file's mtime for good: the size reported at close does not
// touch it, and the size written shows from the time set on. Method: write, set an old mtime,
// stat, close; unmount (which waits for the closes to reach the metadata server) and look
// from a new mount.
#[test]
fn mtime_set_before_close_is_kept() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    for (name, len) in [("small", 10usize), ("striped", 3 << 20)] {
        let mut file = File::create(first.join(name)).expect("create");
        file.write_all(&pattern(3, len)).expect("write");
        file.set_modified(old).expect("futimens");
        assert_eq!(
            file.metadata().expect("fstat").len(),
            len as u64,
            "{name}: the size written shows before close, after the time set"
        );
    }
    cluster.unmount(&first).expect("unmount");
    let second = cluster.mount().expect("mount 2");
    for name in ["small", "striped"] {
        let file = File::open(second.join(name)).expect("open");
        let mtime = file.metadata().expect("stat").modified().expect("mtime");
        assert_eq!(mtime, old, "{name}: the mtime set before close is kept");
    }
}

// Goal: close-to-open consistency between two mounts. Method: write and close in one mount,
// then open in the other and see the data and size; and back.
#[test]
fn close_to_open_between_mounts() {
    let mut cluster = cluster(ClusterSpec::default());
    let first = cluster.mount().expect("mount 1");
    let second = cluster.mount().expect("mount 2");
    let data = pattern(9, 2 * 1024 * 1024 + 7);
    fs::write(first.join("shared"), &data).expect("write in first");
    assert_eq!(
        fs::read(second.join("shared")).expect("read in second"),
        data
    );
    {
        let mut file = OpenOptions::new()
            .append(true)
            .open(second.join("shared"))
            .expect("open in second");
        file.write_all(b"more").expect("append");
    }
    let mut expected = data;
    expected.extend_from_slice(b"more");
    assert_eq!(
        fs::read(first.join("shared")).expect("read in first"),
        expected
    );
    fs::write(second.join("shared"), b"short").expect("rewrite in second");
    assert_eq!(
        fs::read(first.join("shared")).expect("read in first"),
        b"short",
        "a truncate is seen too"
    );
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(first.join("shared"));
    assert!(direct.is_ok(), "O_DIRECT opens work");
}

fn fallocate(file: &File, mode: i32, offset: i64, len: i64) -> std::io::Result<()> {
    // SAFETY: fallocate on a descriptor we hold open.
    let result =
        unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(file), mode, offset, len) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One 4 KiB block aligned for O_DIRECT.
#[repr(C, align(4096))]
struct AlignedBlock([u8; 4096]);

impl AlignedBlock {
    fn new() -> Box<AlignedBlock> {
        Box::new(AlignedBlock([0; 4096]))
    }

    fn bytes(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// Reads exactly `buffer.len()` bytes at `offset`.
fn read_at(file: &File, buffer: &mut [u8], offset: u64) {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buffer, offset).expect("pread");
}

// Goal: fallocate's default mode, KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE behave as on a local
// file system, across chunk and target boundaries, and the modes Weft does not do fail cleanly
// with EOPNOTSUPP. Method: apply each to a striped file and compare with a model in memory.
#[test]
fn fallocate_modes() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let path = mnt.join("fallocated");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("create");

    fallocate(&file, 0, 0, 3 * 1024 * 1024).expect("allocate");
    assert_eq!(
        file.metadata().expect("stat").len(),
        3 * 1024 * 1024,
        "default mode extends the size"
    );
    fallocate(&file, libc::FALLOC_FL_KEEP_SIZE, 0, 8 * 1024 * 1024).expect("allocate, keep size");
    assert_eq!(
        file.metadata().expect("stat").len(),
        3 * 1024 * 1024,
        "KEEP_SIZE keeps it"
    );

    let mut model = pattern(51, 3 * 1024 * 1024);
    (&file).write_all(&model).expect("write");
    let (hole_start, hole_len) = (400_000usize, 1_500_000usize);
    fallocate(
        &file,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        hole_start as i64,
        hole_len as i64,
    )
    .expect("punch");
    model[hole_start..hole_start + hole_len].fill(0);
    fallocate(
        &file,
        libc::FALLOC_FL_ZERO_RANGE,
        3 * 1024 * 1024 - 100,
        1000,
    )
    .expect("zero range past the end");
    model[3 * 1024 * 1024 - 100..].fill(0);
    model.resize(3 * 1024 * 1024 + 900, 0);
    drop(file);
    assert_eq!(
        fs::read(&path).expect("read"),
        model,
        "holes and zeroed ranges read as zeros, the rest is intact"
    );

    // A range punched or zeroed through a descriptor that is reading ahead reads as zeros
    // at once: the mount's read-ahead windows over it are dropped, not only when the size
    // changes. The same through O_DIRECT, whose reads also go through read-ahead.
    for (round, (mode, direct)) in [
        (libc::FALLOC_FL_PUNCH_HOLE, false),
        (libc::FALLOC_FL_ZERO_RANGE, false),
        (libc::FALLOC_FL_PUNCH_HOLE, true),
        (libc::FALLOC_FL_ZERO_RANGE, true),
    ]
    .into_iter()
    .enumerate()
    {
        let name = mnt.join(format!("read-ahead-{round}"));
        let data = pattern(60 + round as u64, 1 << 20);
        fs::write(&name, &data).expect("write");
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let file = options.open(&name).expect("open");
        let mut buffer = AlignedBlock::new();
        for offset in [0u64, 4096] {
            read_at(&file, buffer.bytes(), offset);
            assert_eq!(buffer.bytes(), &data[offset as usize..][..4096]);
        }
        let (start, len) = (256usize << 10, 256usize << 10);
        fallocate(
            &file,
            mode | libc::FALLOC_FL_KEEP_SIZE,
            start as i64,
            len as i64,
        )
        .expect("punch or zero");
        for offset in (start..start + len).step_by(64 << 10) {
            read_at(&file, buffer.bytes(), offset as u64);
            assert!(
                buffer.bytes().iter().all(|&b| b == 0),
                "round {round} (mode {mode:#x}, O_DIRECT {direct}): {offset} reads as zeros"
            );
        }
        read_at(&file, buffer.bytes(), (start + len) as u64);
        assert_eq!(
            buffer.bytes(),
            &data[start + len..][..4096],
            "after the range"
        );
    }

    let file = OpenOptions::new().write(true).open(&path).expect("open");
    assert_eq!(
        errno(fallocate(&file, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 65536)),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(fallocate(&file, libc::FALLOC_FL_PUNCH_HOLE, 0, 65536)),
        libc::EOPNOTSUPP,
        "PUNCH_HOLE needs KEEP_SIZE"
    );
}
