//! Extended attributes and POSIX ACLs through the mount: the xattr namespaces and flags with
//! Linux's errors, and ACLs enforced by the kernel, stored by Weft and inherited on create.

mod common;

use common::{cluster, errno};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use weft_testkit::ClusterSpec;

fn c(text: &str) -> CString {
    CString::new(text).expect("no NUL")
}

fn set(path: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: valid NUL-terminated strings and a value buffer of value.len() bytes.
    let result = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c(name).as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn get(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let path = CString::new(path.as_os_str().as_bytes()).expect("path");
    let mut buffer = vec![0u8; 128 * 1024];
    // SAFETY: valid strings and a writable buffer of buffer.len() bytes.
    let result = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c(name).as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate(result as usize);
    Ok(buffer)
}

fn remove(path: &Path, name: &str) -> std::io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes()).expect("path");
    // SAFETY: valid NUL-terminated strings.
    let result = unsafe { libc::removexattr(path.as_ptr(), c(name).as_ptr()) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn run(program: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(program).args(args).output().expect("runs");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

fn as_nobody(script: &str) -> (bool, String) {
    run("runuser", &["-u", "nobody", "--", "sh", "-c", script])
}

// Goal: extended attributes in every namespace behave as on a local Linux file system:
// XATTR_CREATE / XATTR_REPLACE, ENODATA, size limits, listing, removal, and the kernel's
// namespace permissions (trusted.* for root only). Method: libc calls through the mount.
#[test]
fn extended_attributes() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let file = mnt.join("f");
    fs::write(&file, b"data").expect("create");

    set(&file, "user.origin", b"lab-7", 0).expect("set");
    assert_eq!(get(&file, "user.origin").expect("get"), b"lab-7");
    assert_eq!(
        errno(set(&file, "user.origin", b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(set(&file, "user.absent", b"x", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    set(&file, "user.origin", b"lab-8", libc::XATTR_REPLACE).expect("replace");
    assert_eq!(get(&file, "user.origin").expect("get"), b"lab-8");
    assert_eq!(errno(get(&file, "user.absent")), libc::ENODATA);
    set(&file, "user.empty", b"", 0).expect("empty value");
    assert_eq!(get(&file, "user.empty").expect("get"), b"");
    set(&file, "trusted.note", b"root only", 0).expect("trusted as root");
    set(&file, "security.label", b"s0", 0).expect("security");
    let big = vec![b'v'; 65536];
    set(&file, "user.big", &big, 0).expect("a value of 64 KiB");
    assert_eq!(get(&file, "user.big").expect("get"), big);
    assert_eq!(
        errno(set(&file, "user.huge", &vec![0u8; 65537], 0)),
        libc::E2BIG
    );

    let (ok, listing) = run(
        "getfattr",
        &["-d", "-m", "-", file.to_str().expect("utf-8")],
    );
    assert!(ok, "{listing}");
    for name in [
        "user.origin",
        "user.empty",
        "trusted.note",
        "security.label",
        "user.big",
    ] {
        assert!(listing.contains(name), "{name} listed: {listing}");
    }
    remove(&file, "user.big").expect("remove");
    assert_eq!(errno(get(&file, "user.big")), libc::ENODATA);
    assert_eq!(errno(remove(&file, "user.big")), libc::ENODATA);

    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).expect("chmod");
    let (ok, output) = as_nobody(&format!("setfattr -n trusted.x -v 1 {}", file.display()));
    assert!(!ok, "trusted.* is for root only: {output}");
    let (ok, output) = as_nobody(&format!(
        "setfattr -n user.mine -v 1 {} && getfattr -n user.mine {}",
        file.display(),
        file.display()
    ));
    assert!(ok, "user.* follows write permission: {output}");

    // Attributes go with their inode.
    fs::rename(&file, mnt.join("g")).expect("rename");
    assert_eq!(
        get(&mnt.join("g"), "user.origin").expect("get after rename"),
        b"lab-8"
    );
    fs::create_dir(mnt.join("d")).expect("mkdir");
    set(&mnt.join("d"), "user.dir", b"yes", 0).expect("set on a directory");
    assert_eq!(get(&mnt.join("d"), "user.dir").expect("get"), b"yes");
}

// Goal: POSIX ACLs are enforced by the kernel and inherited through default ACLs. Method:
// grant `nobody` access with setfacl where the mode bits alone would refuse it, create files
// and directories under a default ACL, and check access as nobody and with getfacl.
#[test]
fn posix_acls() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("shared");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
    let dir_text = dir.to_str().expect("utf-8");

    let (ok, _) = as_nobody(&format!("touch {dir_text}/before"));
    assert!(!ok, "mode 0750 keeps nobody out");
    let (ok, output) = run("setfacl", &["-m", "u:nobody:rwx", dir_text]);
    assert!(ok, "{output}");
    let (ok, output) = as_nobody(&format!("touch {dir_text}/granted"));
    assert!(ok, "the ACL entry lets nobody in: {output}");
    let (_, acl) = run("getfacl", &["-p", dir_text]);
    assert!(
        acl.contains("user:nobody:rwx") && acl.contains("mask::rwx"),
        "{acl}"
    );

    // Default ACLs: new entries inherit them, and the umask does not apply.
    let (ok, output) = run("setfacl", &["-d", "-m", "u:nobody:rw,o::-", dir_text]);
    assert!(ok, "{output}");
    fs::write(dir.join("inherited"), b"x").expect("create as root");
    let (_, acl) = run(
        "getfacl",
        &["-p", dir.join("inherited").to_str().expect("utf-8")],
    );
    assert!(
        acl.contains("user:nobody:rw-"),
        "the file inherits the default ACL: {acl}"
    );
    let (ok, output) = as_nobody(&format!("echo more >> {dir_text}/inherited"));
    assert!(ok, "nobody writes through the inherited entry: {output}");
    fs::create_dir(dir.join("sub")).expect("mkdir under a default ACL");
    let (_, acl) = run(
        "getfacl",
        &["-p", "-d", dir.join("sub").to_str().expect("utf-8")],
    );
    assert!(
        acl.contains("user:nobody:rw-"),
        "a subdirectory inherits the default ACL: {acl}"
    );

    // Removing the ACL takes the access away again.
    let (ok, output) = run(
        "setfacl",
        &["-b", dir.join("inherited").to_str().expect("utf-8")],
    );
    assert!(ok, "{output}");
    let (ok, _) = as_nobody(&format!("echo again >> {dir_text}/inherited"));
    assert!(!ok, "without the ACL nobody cannot write");
}

// Goal: writing to a file drops its file capabilities, as on a local file system, even though
// the mount answers the kernel's capability question from its cache between opens; and a file
// without capabilities keeps its other attributes. Method: set security.capability (a valid
// v2 value), open and write, read the attribute back; write a second time after a reopen.
#[test]
fn a_write_drops_file_capabilities() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let path = mnt.join("tool");
    fs::write(&path, b"#!/bin/true\n").expect("write");
    // vfs_cap_data revision 2, effective, permitting CAP_NET_BIND_SERVICE.
    let mut capability = Vec::new();
    for word in [0x0200_0001u32, 1 << 10, 0, 0, 0] {
        capability.extend_from_slice(&word.to_le_bytes());
    }
    set(&path, "security.capability", &capability, 0).expect("set the capability");
    set(&path, "user.kept", b"yes", 0).expect("set a user attribute");
    assert_eq!(get(&path, "security.capability").expect("get"), capability);
    for round in 0..2 {
        use std::io::Write;
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(b"echo\n").expect("append");
        drop(file);
        assert_eq!(
            errno(get(&path, "security.capability")),
            libc::ENODATA,
            "round {round}: the write dropped the capability"
        );
        if round == 0 {
            set(&path, "security.capability", &capability, 0).expect("set it again");
        }
    }
    assert_eq!(get(&path, "user.kept").expect("get"), b"yes");
}

// Goal: `ls -l` of files without extended attributes asks the metadata servers nothing for
// them (it asks two of every file it lists, `security.selinux` and its ACL), nor does
// `getfattr` or `listxattr`; an attribute set through the mount is seen at once, one another
// client set is seen once the file is opened (as its other attributes are), and a file whose
// last attribute is removed is again one the mount answers for. Method: mounts with a long
// attribute cache (so no expiry decides what is asked), the metadata servers' request counts
// of get_xattr and list_xattr around each step.
#[test]
fn files_without_extended_attributes_are_answered_by_the_mount() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster
        .mount_with(&["attr_cache_ms=600000"])
        .expect("mount");
    let other = cluster
        .mount_with(&["attr_cache_ms=600000"])
        .expect("second mount");
    let dir = mnt.join("tree");
    fs::create_dir_all(dir.join("sub")).expect("mkdir");
    for index in 0..40 {
        let sub = if index % 2 == 0 { "" } else { "sub/" };
        fs::write(dir.join(format!("{sub}f{index}")), b"data").expect("create");
    }
    let asked = |cluster| common::meta_requests(cluster, &["get_xattr", "list_xattr"]);

    let before = asked(&cluster);
    let (ok, listing) = run("ls", &["-lR", dir.to_str().expect("utf-8")]);
    assert!(ok, "{listing}");
    assert_eq!(listing.matches(" f").count(), 40, "{listing}");
    let (ok, dump) = run(
        "getfattr",
        &["-R", "-d", "-m", "-", dir.to_str().expect("utf-8")],
    );
    assert!(ok && dump.trim().is_empty(), "no attributes: {dump}");
    assert_eq!(errno(get(&dir.join("f0"), "user.none")), libc::ENODATA);
    assert_eq!(
        asked(&cluster),
        before,
        "files without attributes were answered by the mount"
    );

    // Set through this mount: seen at once, here and by a listing, and still once the
    // file's attributes are fetched again (they say it has some now).
    let refetch = |path: &Path| {
        drop(fs::File::open(path).expect("open"));
        let (ok, listing) = run("ls", &["-l", path.to_str().expect("utf-8")]);
        assert!(ok, "{listing}");
    };
    set(&dir.join("f0"), "user.tag", b"one", 0).expect("set");
    assert_eq!(get(&dir.join("f0"), "user.tag").expect("get"), b"one");
    let (ok, dump) = run("getfattr", &["-d", dir.join("f0").to_str().expect("utf-8")]);
    assert!(ok && dump.contains("user.tag=\"one\""), "{dump}");
    refetch(&dir.join("f0"));
    assert_eq!(get(&dir.join("f0"), "user.tag").expect("get"), b"one");

    // Set through another client: seen here once the file is opened.
    let elsewhere = other.join("tree/f2");
    set(&elsewhere, "user.tag", b"two", 0).expect("set through the other mount");
    refetch(&dir.join("f2"));
    assert_eq!(
        get(&dir.join("f2"), "user.tag").expect("seen after an open"),
        b"two"
    );

    // Its last attribute removed, the file is again answered for, once its attributes are
    // fetched again (an open).
    remove(&dir.join("f0"), "user.tag").expect("remove");
    assert_eq!(errno(get(&dir.join("f0"), "user.tag")), libc::ENODATA);
    refetch(&dir.join("f0"));
    let before = asked(&cluster);
    assert_eq!(errno(get(&dir.join("f0"), "user.tag")), libc::ENODATA);
    assert_eq!(asked(&cluster), before, "f0 has no attributes left");
}
