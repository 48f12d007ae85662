//! Conversions between the kernel's terms and Weft's: errors, times, file kinds, open flags,
//! lock kinds, callers' groups, and the replies built from client results.

use super::*;

pub(super) fn errno(error: &ClientError) -> Errno {
    if error.errno() == libc::EIO {
        // EIO tells the application nothing: the log says what went wrong.
        tracing::warn!(%error, "answering EIO");
    }
    Errno::from_i32(error.errno())
}

pub(super) fn system_time(timestamp: Timestamp) -> SystemTime {
    if timestamp.seconds >= 0 {
        UNIX_EPOCH + Duration::new(timestamp.seconds as u64, timestamp.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(timestamp.seconds.unsigned_abs())
            + Duration::from_nanos(u64::from(timestamp.nanos))
    }
}

pub(super) fn timestamp(time: SystemTime) -> Timestamp {
    match time.duration_since(UNIX_EPOCH) {
        Ok(elapsed) => Timestamp {
            seconds: elapsed.as_secs() as i64,
            nanos: elapsed.subsec_nanos(),
        },
        Err(before) => {
            let back = before.duration();
            let mut seconds = -(back.as_secs() as i64);
            let mut nanos = 0;
            if back.subsec_nanos() > 0 {
                seconds -= 1;
                nanos = 1_000_000_000 - back.subsec_nanos();
            }
            Timestamp { seconds, nanos }
        }
    }
}

pub(super) fn time_set(time: TimeOrNow) -> TimeSet {
    match time {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(time) => TimeSet::At(timestamp(time)),
    }
}

pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// FUSE open flags for an open with `flags`: O_DIRECT bypasses the page cache.
pub(super) fn fopen_flags(flags: i32) -> FopenFlags {
    if flags & libc::O_DIRECT != 0 {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

pub(super) fn name_str(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

/// The supplementary groups of process `pid` (the kernel gives FUSE only the uid and primary
/// group); none when it is gone.
pub(super) fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("Groups:").map(|groups| {
                    groups
                        .split_whitespace()
                        .filter_map(|group| group.parse().ok())
                        .take(weft_proto::access::CALLER_GROUPS_MAX)
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

/// What an open with `flags` asks for, in [`weft_proto::access`] bits. With writeback caching the kernel reads pages through
/// any handle to fill in a partial write, so a handle opened for writing is opened for
/// reading too (as a kernel-side cache needs: the file's read permission is checked).
pub(super) fn open_access(flags: i32, writeback_cache: bool) -> u8 {
    use weft_proto::access;
    let written = if flags & libc::O_TRUNC != 0 {
        access::WRITE
    } else {
        0
    };
    let access = written
        | match flags & libc::O_ACCMODE {
            libc::O_WRONLY => access::WRITE,
            libc::O_RDWR => access::READ | access::WRITE,
            _ => access::READ,
        };
    if writeback_cache && access & access::WRITE != 0 {
        access | access::READ
    } else {
        access
    }
}

pub(super) fn reply_entry(
    state: &State,
    reply: ReplyEntry,
    result: Result<InodeAttr, ClientError>,
) {
    match result {
        Ok(attr) => reply.entry(&state.ttl, &state.merge(attr), Generation(0)),
        Err(error) => reply.error(errno(&error)),
    }
}

pub(super) fn reply_empty(reply: ReplyEmpty, result: Result<(), ClientError>) {
    match result {
        Ok(()) => reply.ok(),
        Err(error) => reply.error(errno(&error)),
    }
}

pub(super) fn lock_kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

/// Whether thread `pid` has a signal pending that it neither blocks nor ignores, or is gone.
pub(super) fn signal_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| u64::from_str_radix(value.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    pending & !mask("SigBlk:") & !mask("SigIgn:") != 0
}

/// Answers a getxattr / listxattr: the size when asked with size 0, ERANGE when the value does
/// not fit the caller's buffer, else the value.
pub(super) fn reply_xattr(reply: fuser::ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

/// The attributes given the kernel for an entry of a listing whose own were not read: its
/// inode and type, nothing else, for no time (the kernel looks the name up before it uses
/// them).
pub(super) fn unread(ino: INodeNo, kind: FileType) -> FileAttr {
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
