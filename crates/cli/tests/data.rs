//! Data path: fio with verification through the mount and again from a fresh mount, and proof
//! that a file set to 4 targets has its bytes on all 4 in chunk-size pieces.

mod common;

use common::{cluster, pattern, weft};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use weft_testkit::ClusterSpec;

fn fio(directory: &Path, name: &str, extra: &[&str]) -> (bool, String) {
    let output = Command::new("fio")
        .arg(format!("--name={name}"))
        .arg(format!("--directory={}", directory.display()))
        .args([
            "--ioengine=psync",
            "--verify=crc32c",
            "--numjobs=3",
            "--group_reporting",
            "--output-format=terse",
            "--verify_fatal=1",
            // No verify state files in the working directory.
            "--verify_state_save=0",
        ])
        .args(extra)
        .output()
        .expect("fio runs (scripts/test.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (
        output.status.success() && !text.contains("verify: bad"),
        text,
    )
}

// Goal: fio's own verification passes for sequential and random writes by several jobs on
// files larger than a stripe, and again from a fresh mount (data is on the servers, not in a
// cache). Method: fio --verify=crc32c, unmount, mount again, fio --verify_only.
#[test]
fn fio_verify_and_verify_again_from_fresh_mount() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    // The default pattern is 512 KiB chunks over 4 targets: a 2 MiB stripe; files are 6 MiB.
    let sequential = ["--rw=write", "--bs=256k", "--size=6m"];
    let random = ["--rw=randwrite", "--bs=16k", "--size=6m", "--randrepeat=1"];
    let (ok, output) = fio(&mnt, "seq", &sequential);
    assert!(ok, "sequential fio verify failed:\n{output}");
    let (ok, output) = fio(&mnt, "rand", &random);
    assert!(ok, "random fio verify failed:\n{output}");
    let direct = [
        "--rw=randwrite",
        "--bs=64k",
        "--size=4m",
        "--direct=1",
        "--randrepeat=1",
    ];
    let (ok, output) = fio(&mnt, "direct", &direct);
    assert!(ok, "O_DIRECT fio verify failed:\n{output}");

    cluster.unmount(&mnt).expect("unmount");
    let fresh = cluster.mount().expect("fresh mount");
    for (name, args) in [
        ("seq", &sequential[..]),
        ("rand", &random[..]),
        ("direct", &direct[..]),
    ] {
        let mut args = args.to_vec();
        args.push("--verify_only");
        let (ok, output) = fio(&fresh, name, &args);
        assert!(
            ok,
            "{name}: verify_only from a fresh mount failed:\n{output}"
        );
    }
}

/// The target id saved in a target directory (on-disk format: docs/design/on-disk-format.md).
fn target_id(directory: &Path) -> u32 {
    let bytes = fs::read(directory.join("target.id")).expect("target.id");
    assert_eq!(&bytes[0..4], b"WTID");
    u32::from_le_bytes(bytes[10..14].try_into().expect("4 bytes"))
}

fn find_object(directory: &Path, name: &str) -> Option<PathBuf> {
    for entry in fs::read_dir(directory).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_object(&path, name) {
                return Some(found);
            }
        } else if entry.file_name().to_string_lossy() == name {
            return Some(path);
        }
    }
    None
}

// Goal: a file in a directory set to 64 KiB chunks over 4 targets has its bytes on all 4
// targets in chunk-size pieces, exactly where the layout rule puts them. Method: set the
// pattern with the CLI, write a file, read `weft entry info`, then read the objects directly
// from the target directories and compare them with the file.
#[test]
fn file_is_striped_over_four_targets() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let dir = mnt.join("striped");
    let stdout = common::make_dir_with_pattern(
        &cluster,
        &dir,
        &["--chunk-size", "64K", "--num-targets", "4"],
    );
    assert!(stdout.contains("Chunksize: 64K"), "{stdout}");

    let chunk = 64 * 1024;
    let data = pattern(11, 10 * chunk + 5000);
    let file = dir.join("data");
    fs::write(&file, &data).expect("write");

    let (order, info) = common::layout_targets(&cluster, &file);
    assert!(info.contains("Entry type: file"), "{info}");
    assert!(info.contains("Metadata node: meta-1 [ID: 1]"), "{info}");
    assert!(info.contains("+ Type: RAID0"), "{info}");
    assert!(info.contains("+ Chunksize: 64K"), "{info}");
    assert!(info.contains("desired: 4; actual: 4"), "{info}");
    assert_eq!(order.len(), 4, "four targets listed: {info}");

    let object_name = format!("{:016x}", fs::metadata(&file).expect("stat").ino());
    let mut directories = std::collections::HashMap::new();
    for storage in 1..=2 {
        for target in 1..=2 {
            let directory = cluster.target_dir(storage, target);
            directories.insert(target_id(&directory), directory);
        }
    }
    for (index, target) in order.iter().enumerate() {
        let object = find_object(&directories[target], &object_name)
            .unwrap_or_else(|| panic!("target {target} holds no object"));
        let bytes = fs::read(&object).expect("read object");
        let mut expected = Vec::new();
        for chunk_index in (index..).step_by(4).take_while(|i| i * chunk < data.len()) {
            let start = chunk_index * chunk;
            expected.extend_from_slice(&data[start..(start + chunk).min(data.len())]);
        }
        assert_eq!(
            bytes.len(),
            expected.len(),
            "object on target {target} has its chunks"
        );
        assert!(
            bytes == expected,
            "object on target {target} holds chunks {index}, {}, … in order",
            index + 4
        );
    }

    // A subdirectory inherits the pattern.
    fs::create_dir(dir.join("child")).expect("mkdir child");
    let (_, info, _) = weft(
        &cluster,
        &["entry", "info", dir.join("child").to_str().expect("utf-8")],
    );
    assert!(
        info.contains("Entry type: directory")
            && info.contains("Chunksize: 64K")
            && info.contains("desired: 4"),
        "{info}"
    );
}

// Goal: with the opt-in kernel writeback cache, fio's verified writes and reads still hold,
// and a file closed on that mount is whole on another mount (close writes the cache back).
// Method: a mount with `writeback_cache=true` next to a default one.
#[test]
fn writeback_cache_opt_in_keeps_data_and_close_to_open() {
    let mut cluster = cluster(ClusterSpec::default());
    let cached = cluster
        .mount_with(&["writeback_cache=true"])
        .expect("mount with writeback caching");
    let plain = cluster.mount().expect("mount");
    let status = std::process::Command::new("fio")
        .args([
            "--name=wb",
            "--rw=randwrite",
            "--bs=4k",
            "--size=8M",
            "--ioengine=psync",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--end_fsync=1",
            "--verify_state_save=0",
        ])
        .arg(format!("--directory={}", cached.display()))
        .status()
        .expect("fio");
    assert!(status.success(), "fio verify through the cached mount");
    let data = pattern(41, 3 * 1024 * 1024 + 123);
    fs::write(cached.join("handed-over"), &data).expect("write through the cached mount");
    assert_eq!(
        fs::read(plain.join("handed-over")).expect("read on the other mount"),
        data,
        "closing wrote the cache back"
    );
}

// Goal: storage servers with `direct_io = true` keep every byte, for aligned and unaligned
// writes alike (the unaligned edges are read, modified and written whole), and keep object
// data out of their page cache. Method: fio verify with aligned and odd block sizes, verify
// again from a fresh mount, and fincore on the object files.
#[test]
fn direct_io_targets_keep_data_and_skip_the_page_cache() {
    let mut cluster = cluster(ClusterSpec {
        storage_settings: vec!["direct_io=true".to_string()],
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let aligned = ["--rw=randwrite", "--bs=64k", "--size=4m", "--randrepeat=1"];
    let odd = ["--rw=randwrite", "--bs=3000", "--size=3m", "--randrepeat=1"];
    let appends = ["--rw=write", "--bs=777", "--size=1m"];
    for (name, args) in [
        ("aligned", &aligned[..]),
        ("odd", &odd[..]),
        ("appends", &appends[..]),
    ] {
        let (ok, output) = fio(&mnt, name, args);
        assert!(
            ok,
            "{name} fio verify on direct-I/O targets failed:\n{output}"
        );
    }
    cluster.unmount(&mnt).expect("unmount");
    let fresh = cluster.mount().expect("fresh mount");
    for (name, args) in [
        ("aligned", &aligned[..]),
        ("odd", &odd[..]),
        ("appends", &appends[..]),
    ] {
        let mut args = args.to_vec();
        args.push("--verify_only");
        let (ok, output) = fio(&fresh, name, &args);
        assert!(ok, "{name} verify from a fresh mount failed:\n{output}");
    }

    let mut objects = Vec::new();
    for (storage, target) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
        let mut stack = vec![cluster.target_dir(storage, target).join("objects")];
        while let Some(directory) = stack.pop() {
            for entry in fs::read_dir(&directory).expect("read objects").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    objects.push(path);
                }
            }
        }
    }
    assert!(!objects.is_empty(), "the files have objects");
    let output = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .args(&objects)
        .output()
        .expect("fincore runs (util-linux)");
    let cached: u64 = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.trim().parse::<u64>().ok())
        .sum();
    assert_eq!(cached, 0, "object data stays out of the page cache");

    // StorageBench runs with O_DIRECT on such targets, an odd size included.
    for read in [false, true] {
        let mut args = vec![
            "bench",
            "storage",
            "start",
            "--size",
            "5000K",
            "--threads",
            "2",
            "--wait",
            "--mgmt",
        ];
        args.push(cluster.mgmt());
        if read {
            args.push("--read");
        }
        let (ok, out, err) = weft(&cluster, &args);
        assert!(
            ok && out.contains("done"),
            "StorageBench on direct targets:\n{out}{err}"
        );
    }
}

/// A zeroed buffer of `len` bytes aligned to 4 KiB, for O_DIRECT reads.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let storage = vec![0u8; len + 4096];
    let start = (4096 - storage.as_ptr() as usize % 4096) % 4096;
    (storage, start)
}

// Goal: read-ahead never answers with stale data: a reader going through a file in order sees
// the writes this client makes ahead of it through another descriptor, and a truncate; and
// what it reads matches the file. Method: O_DIRECT reads (past the kernel's cache, so every
// read reaches the mount) of a 8 MiB file, with a write and a truncate ahead of the reader
// after its read-ahead has started.
#[test]
fn read_ahead_sees_this_clients_writes_and_truncates() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const MIB: usize = 1024 * 1024;
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let path = mnt.join("streamed");
    let mut expected = pattern(51, 8 * MIB);
    fs::write(&path, &expected).expect("write");

    let reader = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .expect("open for direct reads");
    let writer = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for writes");
    let (mut storage, start) = aligned(MIB);
    let mut read = |offset: usize| -> Vec<u8> {
        let buffer = &mut storage[start..start + MIB];
        let count = reader.read_at(buffer, offset as u64).expect("read");
        buffer[..count].to_vec()
    };
    // Two reads in order start the read-ahead of the next megabytes.
    let same = |got: Vec<u8>, want: &[u8], what: &str| {
        assert!(
            got == want,
            "{what}: {} bytes read, {} expected",
            got.len(),
            want.len()
        );
    };
    same(read(0), &expected[..MIB], "first megabyte");
    same(read(MIB), &expected[MIB..2 * MIB], "second megabyte");
    // A write ahead of the reader, inside what was read ahead.
    let patch = pattern(52, 64 * 1024);
    writer
        .write_all_at(&patch, (3 * MIB + 1000) as u64)
        .expect("write ahead of the reader");
    expected[3 * MIB + 1000..3 * MIB + 1000 + patch.len()].copy_from_slice(&patch);
    same(read(2 * MIB), &expected[2 * MIB..3 * MIB], "third megabyte");
    same(
        read(3 * MIB),
        &expected[3 * MIB..4 * MIB],
        "the write is seen",
    );
    // A truncate ahead of the reader.
    writer.set_len((4 * MIB + 123) as u64).expect("truncate");
    same(
        read(4 * MIB),
        &expected[4 * MIB..4 * MIB + 123],
        "the truncate is seen",
    );
    assert!(read(5 * MIB).is_empty(), "nothing past the new end");
}

// Goal: the native library's open files behave as the mount's do. Two handles of one file
// share what this client wrote: a write through one is part of the size the client knows
// before any report, and closing the other handle (twice, then dropping it) neither forgets
// the file's state under the handle still open nor loses its data. Method: a native client
// against a cluster of real processes; the size the client knows is compared with the
// server's before the close that reports it, and the data read back through a fresh open.
#[test]
fn native_open_files_share_what_they_wrote_and_close_once() {
    use weft_proto::access;

    let cluster = cluster(ClusterSpec::default());
    let (runtime, client) = common::native_client(&cluster, |_| {});
    let root = weft_proto::InodeId::ROOT;
    let new = weft_client::client::regular_file(0o644, 0o022, (0, 0));
    let data = pattern(7, 3 << 20);
    runtime.block_on(async {
        let (writer, created) = client
            .create_file((root, "shared"), new)
            .await
            .expect("create");
        let inode = created.attr.inode;
        let both = access::READ | access::WRITE;
        let other = client
            .open_file(inode, both)
            .await
            .expect("a second handle");
        other.close().await.expect("close");
        other.close().await.expect("a second close does nothing");
        drop(other);

        writer
            .write(0, bytes::Bytes::from(data.clone()))
            .await
            .expect("write");
        writer.drain().await;
        let server = client.get_attr(inode).await.expect("getattr");
        assert_eq!(server.size, 0, "nothing reported yet");
        assert_eq!(
            client.known(server).size,
            data.len() as u64,
            "the client knows what its handle wrote while that handle is open"
        );
        writer.flush().await.expect("flush reports the size");
        writer.close().await.expect("close");

        let reader = client.open_file(inode, access::READ).await.expect("reopen");
        let read = reader.read(0, data.len() as u64 + 10).await.expect("read");
        assert_eq!(read.len(), data.len(), "the size reported at close");
        assert!(read.into_bytes() == data, "the bytes written");
        reader.close().await.expect("close");
    });
}
