//! What FUSE's transport costs a metadata operation, over `/dev/fuse` against FUSE over
//! io_uring: a file system of empty files in one directory, kept in memory, served either by
//! threads that read and write `/dev/fuse` (as fuser does) or by one io_uring queue per CPU
//! (the kernel's `enable_uring`). Both serve the same requests with the same code; only the
//! transport differs, so the rates a workload gets through each are the ceiling of what the
//! transport alone would give a file system.
//!
//! Usage: fuse-uring-probe MOUNTPOINT dev|uring [THREADS]   (root; unmount to stop)

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_UNLINK: u32 = 10;
const FUSE_OPEN: u32 = 14;
const FUSE_STATFS: u32 = 17;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_OPENDIR: u32 = 27;
const FUSE_RELEASEDIR: u32 = 29;
const FUSE_CREATE: u32 = 35;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;

const FUSE_INIT_EXT: u64 = 1 << 30;
const FUSE_MAX_PAGES: u64 = 1 << 22;
const FUSE_OVER_IO_URING: u64 = 1 << 41;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
const BUFFER: usize = 1 << 20;
const MAX_WRITE: u32 = 128 * 1024;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: the in or out header, the operation's header, and the
/// ring entry's `{flags, commit_id, payload_sz, padding, reserved}`.
const RING_HEADER: usize = 128 + 128 + 32;

#[derive(Default)]
struct Files {
    names: HashMap<Vec<u8>, u64>,
    next: u64,
}

struct Fs {
    files: Mutex<Files>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn attr(out: &mut Vec<u8>, ino: u64) {
    let dir = ino == 1;
    for v in [ino, 0, 0, 0, 0, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    let mode: u32 = if dir { 0o040755 } else { 0o100644 };
    for v in [0u32, 0, 0, mode, if dir { 2 } else { 1 }, 0, 0, 0, 4096, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn entry(out: &mut Vec<u8>, ino: u64) {
    // One second of entry and attribute validity, as Weft's default `attr_cache_ms`.
    for v in [ino, 0, 1, 1] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[0; 8]);
    attr(out, ino);
}

fn name(args: &[u8]) -> Vec<u8> {
    let end = args.iter().position(|&b| b == 0).unwrap_or(args.len());
    args[..end].to_vec()
}

/// Size of the operation's own header, which FUSE over io_uring puts apart from the rest.
fn op_header(opcode: u32) -> usize {
    match opcode {
        FUSE_CREATE => 16,
        FUSE_GETATTR | FUSE_OPEN | FUSE_OPENDIR => 16,
        FUSE_FLUSH | FUSE_RELEASE | FUSE_RELEASEDIR => 24,
        FUSE_SETATTR => 88,
        FUSE_INIT => 64,
        _ => 0,
    }
}

impl Fs {
    /// Serves one request: its error (0 or negative errno) and reply body; `None` for a
    /// request without a reply.
    fn serve(&self, opcode: u32, node: u64, rest: &[u8], out: &mut Vec<u8>) -> Option<i32> {
        out.clear();
        let mut files = self.files.lock().unwrap();
        Some(match opcode {
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => return None,
            FUSE_LOOKUP if node == 1 => match files.names.get(&name(rest)) {
                Some(&ino) => {
                    entry(out, ino);
                    0
                }
                None => -libc::ENOENT,
            },
            FUSE_GETATTR | FUSE_SETATTR => {
                for v in [1u64, 0] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                attr(out, node);
                0
            }
            FUSE_CREATE if node == 1 => {
                files.next += 1;
                let ino = files.next + 1;
                files.names.insert(name(rest), ino);
                entry(out, ino);
                out.extend_from_slice(&ino.to_le_bytes());
                out.extend_from_slice(&[0; 8]);
                0
            }
            FUSE_UNLINK if node == 1 => match files.names.remove(&name(rest)) {
                Some(_) => 0,
                None => -libc::ENOENT,
            },
            FUSE_OPEN | FUSE_OPENDIR => {
                out.extend_from_slice(&[0; 16]);
                0
            }
            FUSE_FLUSH | FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_DESTROY => 0,
            FUSE_STATFS => {
                out.extend_from_slice(&[0; 80]);
                0
            }
            _ => -libc::ENOSYS,
        })
    }
}

fn reply(dev: &File, unique: u64, error: i32, body: &[u8]) {
    let mut frame = Vec::with_capacity(OUT_HEADER + body.len());
    frame.extend_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
    frame.extend_from_slice(&error.to_le_bytes());
    frame.extend_from_slice(&unique.to_le_bytes());
    if error == 0 {
        frame.extend_from_slice(body);
    } else {
        frame.truncate(OUT_HEADER);
    }
    let _ = (&*dev).write_all(&frame);
}

/// Reads and serves requests from `/dev/fuse` until the file system is unmounted; answers
/// INIT, asking for io_uring with `uring`, and then calls `ready`.
fn dev_loop(dev: &File, fs: &Fs, uring: bool, ready: &dyn Fn()) {
    let mut buffer = vec![0u8; BUFFER + 4096];
    let mut out = Vec::new();
    loop {
        let len = match (&*dev).read(&mut buffer) {
            Ok(len) => len,
            Err(error) if error.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(error) if error.raw_os_error() == Some(libc::EINTR) => continue,
            Err(_) => return,
        };
        let request = &buffer[..len];
        let opcode = u32_at(request, 4);
        let unique = u64_at(request, 8);
        let node = u64_at(request, 16);
        let args = &request[IN_HEADER..];
        if opcode == FUSE_INIT {
            let minor = u32_at(args, 4).min(44);
            let flags = u64::from(u32_at(args, 12)) | (u64::from(u32_at(args, 16)) << 32);
            let mut want = FUSE_INIT_EXT | FUSE_MAX_PAGES;
            if uring {
                want |= FUSE_OVER_IO_URING;
            }
            let given = flags & want;
            if uring && given & FUSE_OVER_IO_URING == 0 {
                eprintln!(
                    "the kernel offers no FUSE over io_uring: set the fuse module's enable_uring"
                );
            }
            let mut body = Vec::new();
            for v in [7u32, minor, u32_at(args, 8), given as u32] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.extend_from_slice(&16u16.to_le_bytes()); // max_background
            body.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
            body.extend_from_slice(&MAX_WRITE.to_le_bytes());
            body.extend_from_slice(&1u32.to_le_bytes()); // time_gran
            body.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_le_bytes());
            body.extend_from_slice(&0u16.to_le_bytes());
            body.extend_from_slice(&((given >> 32) as u32).to_le_bytes());
            body.extend_from_slice(&[0; 28]);
            reply(dev, unique, 0, &body);
            ready();
            continue;
        }
        let header = op_header(opcode).min(args.len());
        if let Some(error) = fs.serve(opcode, node, &args[header..], &mut out) {
            reply(dev, unique, error, &out);
        }
    }
}

/// One entry of a ring queue: its header and payload buffers, and their iovecs.
struct Entry {
    header: Box<[u8; RING_HEADER]>,
    payload: Vec<u8>,
    iov: [libc::iovec; 2],
}

fn uring_cmd(
    fd: i32,
    op: u32,
    qid: u16,
    commit_id: u64,
    index: usize,
    iov: Option<&[libc::iovec; 2]>,
) -> io_uring::squeue::Entry128 {
    let mut cmd = [0u8; 80];
    // struct fuse_uring_cmd_req { flags, commit_id, qid, padding }
    cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
    cmd[16..18].copy_from_slice(&qid.to_le_bytes());
    let mut builder = io_uring::opcode::UringCmd80::new(io_uring::types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        builder = builder.addr(Some(iov.as_ptr() as u64));
    }
    let mut sqe = builder.build().user_data(index as u64);
    if iov.is_some() {
        // sqe->len: the number of iovecs (header and payload); the crate sets no length.
        let raw = &mut sqe as *mut io_uring::squeue::Entry128 as *mut u8;
        unsafe { raw.add(24).cast::<u32>().write_unaligned(2) };
    }
    sqe
}

/// Serves queue `qid`'s requests through its own ring, on a thread pinned to CPU `qid`.
fn ring_loop(fd: i32, qid: u16, depth: usize, fs: &Fs) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(qid as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    let mut ring: io_uring::IoUring<io_uring::squeue::Entry128, io_uring::cqueue::Entry> =
        io_uring::IoUring::builder()
            .build((depth * 2) as u32)
            .expect("io_uring");
    let mut entries: Vec<Entry> = (0..depth)
        .map(|_| {
            let mut header = Box::new([0u8; RING_HEADER]);
            let mut payload = vec![0u8; BUFFER];
            let iov = [
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: RING_HEADER,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: BUFFER,
                },
            ];
            Entry {
                header,
                payload,
                iov,
            }
        })
        .collect();
    for (index, entry) in entries.iter().enumerate() {
        let sqe = uring_cmd(fd, CMD_REGISTER, qid, 0, index, Some(&entry.iov));
        unsafe { ring.submission().push(&sqe).expect("room to register") };
    }
    ring.submit().expect("register");
    let mut out = Vec::new();
    loop {
        if ring.submit_and_wait(1).is_err() {
            continue;
        }
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (index, result) in done {
            if result < 0 {
                if result == -libc::EINTR || result == -libc::EAGAIN {
                    continue;
                }
                if result != -libc::ENOTCONN {
                    eprintln!("queue {qid}: ring entry {index} ended: errno {}", -result);
                }
                return;
            }
            let entry = &mut entries[index];
            let header = &mut entry.header[..];
            let opcode = u32_at(header, 4);
            let unique = u64_at(header, 8);
            let node = u64_at(header, 16);
            let commit_id = u64_at(header, 256 + 8);
            let payload_len = u32_at(header, 256 + 16) as usize;
            let error = fs
                .serve(opcode, node, &entry.payload[..payload_len], &mut out)
                .unwrap_or(0);
            let body: &[u8] = if error == 0 { &out } else { &[] };
            entry.payload[..body.len()].copy_from_slice(body);
            header[0..4].copy_from_slice(&((OUT_HEADER + body.len()) as u32).to_le_bytes());
            header[4..8].copy_from_slice(&error.to_le_bytes());
            header[8..16].copy_from_slice(&unique.to_le_bytes());
            header[256 + 16..256 + 20].copy_from_slice(&(body.len() as u32).to_le_bytes());
            let sqe = uring_cmd(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, index, None);
            unsafe { ring.submission().push(&sqe).expect("room to commit") };
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mountpoint, mode) = (&args[1], args[2].as_str());
    let threads: usize = args.get(3).map_or(4, |t| t.parse().unwrap());
    let uring = mode == "uring";
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .expect("/dev/fuse");
    let options = CString::new(format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other",
        dev.as_raw_fd()
    ))
    .unwrap();
    let target = CString::new(mountpoint.as_str()).unwrap();
    let rc = unsafe {
        libc::mount(
            c"probe".as_ptr(),
            target.as_ptr(),
            c"fuse.probe".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    };
    assert_eq!(rc, 0, "mount: {}", std::io::Error::last_os_error());
    let fs = Arc::new(Fs {
        files: Mutex::new(Files::default()),
    });
    let dev = Arc::new(dev);
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let queues: u16 = cpus
        .trim()
        .rsplit('-')
        .next()
        .unwrap()
        .parse::<u16>()
        .unwrap()
        + 1;
    let fd = dev.as_raw_fd();
    let mut handles = Vec::new();
    let started = Arc::new(std::sync::Once::new());
    for _ in 0..threads {
        let (dev, fs, started) = (Arc::clone(&dev), Arc::clone(&fs), Arc::clone(&started));
        handles.push(std::thread::spawn(move || {
            let ready = || {
                if uring {
                    started.call_once(|| {
                        for qid in 0..queues {
                            let fs = Arc::clone(&fs);
                            std::thread::spawn(move || ring_loop(fd, qid, 4, &fs));
                        }
                    });
                }
            };
            dev_loop(&dev, &fs, uring, &ready)
        }));
    }
    for handle in handles {
        let _ = handle.join();
    }
}
