//! The FUSE adapter: a [`fuser::Filesystem`] over [`Client`], and mounting.
//!
//! Every kernel request but a write runs on the FUSE thread that read it until it first
//! waits, and from then on as a tokio task (`fs::here_first`; a write is a task at once), so
//! the FUSE threads never wait on the network and a request the client answers itself wakes
//! no other thread. The kernel may trust attributes and names for `attr_cache_ms` (a stat
//! elsewhere sees a change within that time); every open fetches fresh attributes, tells the
//! kernel to forget the ones it holds, and never keeps the page cache, which gives
//! close-to-open consistency: after a writer closes, every later open anywhere sees its size
//! and data.
//!
//! Every open file is a [`crate::OpenFile`] of the client library: write-behind, read-ahead,
//! the size this client wrote and the file's write errors live there, and this adapter only
//! turns kernel requests into its calls and its answers into replies.

mod convert;
mod fresh;
mod fs;
mod listings;
pub mod mount;
mod state;

use convert::*;
pub use fs::WeftFs;
use state::*;

pub use mount::{detach_stale_mount, mount, MountError, Mounted};

use crate::client::{Client, ClientError};
use crate::OpenFile;
use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weft_proto::access::Caller;
use weft_proto::ids::InodeId;
use weft_proto::messages::{
    AttrChanges, FallocateMode, FileKind, InodeAttr, LockKind, LockRange, NewInode, TimeSet,
    Timestamp, XattrSetMode,
};
use weft_proto::ErrorCode;

/// Largest FUSE read and write request.
pub const FUSE_IO_BYTES_MAX: u32 = 1024 * 1024;
/// Entries asked from the metadata server per readdir call.
const READDIR_BATCH: u32 = 256;

/// How long unmounting waits for the metadata servers to hear of the last closes.
const RELEASE_AT_UNMOUNT_MAX: Duration = Duration::from_secs(2);

/// Longest one attempt of an unmount to have its changes on the metadata servers' disks
/// (`Client::close`) waits.
const CLOSE_AT_UNMOUNT_MAX: Duration = Duration::from_secs(30);
/// Pause between an unmount's attempts to hand its changes over to a home that is down.
const CLOSE_RETRY: Duration = Duration::from_secs(1);

/// How long one F_SETLKW request waits on the server before the adapter checks for signals.
const LOCK_WAIT_SLICE_MS: u32 = 200;

impl Filesystem for WeftFs {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(FUSE_IO_BYTES_MAX);
        let _ = config.set_max_readahead(FUSE_IO_BYTES_MAX);
        let _ = config.set_max_background(64);
        // Asynchronous direct I/O lets O_DIRECT AIO keep many requests in flight; parallel
        // directory operations let lookups and creates in one directory proceed together.
        let _ =
            config.add_capabilities(InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_PARALLEL_DIROPS);
        // Listings carry their entries' attributes where the kernel wants them (`ls -l`,
        // `find`): no lookup per entry afterwards.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // A file opened with O_DIRECT may still be mapped, as on a local file system: the
        // mapping goes through the page cache (kernels from 6.6; older ones refuse the mmap).
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // fcntl record locks and flock go to the metadata server, so they hold across clients.
        if config
            .add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS)
            .is_err()
        {
            tracing::warn!(
                "the kernel does not pass locks to FUSE; locks hold on this client only"
            );
        }
        // The kernel enforces POSIX ACLs (stored as system.posix_acl_* attributes); with
        // DONT_MASK it leaves the umask to the server, which applies a directory's default ACL
        // instead of the umask when there is one, as POSIX says.
        if config
            .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
            .is_err()
        {
            tracing::warn!("the kernel does not offer POSIX ACLs over FUSE; ACLs are not enforced");
        }
        // Opt-in: the kernel caches writes and trusts its own size (one writer per file).
        if self.state.writeback_cache
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            tracing::warn!("the kernel does not offer writeback caching over FUSE");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // Closes gathered for one request go out before the session ends, unless the server
        // does not answer soon: it drops the session's opens when the session expires.
        let client = Arc::clone(&self.state.client);
        self.runtime.block_on(async move {
            let _ = tokio::time::timeout(RELEASE_AT_UNMOUNT_MAX, client.release_now()).await;
            // Changes answered before their sync are on their homes' disks before the mount
            // goes: nothing is left to replay. A home that is down is waited for as long as
            // this mount keeps changes of it: given up, they would be lost, and with them
            // every later change of other clients at that home. Killing the process gives
            // them up.
            loop {
                let why = match tokio::time::timeout(CLOSE_AT_UNMOUNT_MAX, client.close()).await {
                    Ok(Ok(())) => break,
                    // Refused for good (a revoked client, changes dropped): waiting changes
                    // nothing.
                    Ok(Err(error)) if error.code().recovery() == weft_proto::Recovery::Fail => {
                        tracing::error!(%error, "changes of this mount may not be on disk");
                        break;
                    }
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("no answer within {CLOSE_AT_UNMOUNT_MAX:?}"),
                };
                if !client.keeps_changes() {
                    tracing::error!(why, "the metadata servers were not told this mount ended");
                    break;
                }
                tracing::warn!(
                    why,
                    "waiting for the metadata servers to confirm this mount's changes are on \
                     disk; killing this process gives them up"
                );
                tokio::time::sleep(CLOSE_RETRY).await;
            }
        });
        let unsupported = self.state.client.unserved.counts();
        if !unsupported.is_empty() {
            tracing::info!(?unsupported, "requests the mount answered with an error");
        }
    }

    fn ioctl(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _handle: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // No device-specific requests: what a terminal check (isatty) expects of a file.
        self.state.client.unserved.note("ioctl", "ENOTTY");
        reply.error(Errno::ENOTTY);
    }

    fn poll(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _handle: FileHandle,
        _poll_handle: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        // ENOSYS: the kernel stops asking and treats files as always ready.
        self.state.client.unserved.note("poll", "ENOSYS");
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _handle: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        // ENOSYS: the kernel stops asking and answers SEEK_DATA / SEEK_HOLE itself, as if
        // the whole file were data.
        self.state.client.unserved.note("lseek", "ENOSYS");
        reply.error(Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        request: &Request,
        _ino_in: INodeNo,
        handle_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        handle_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        if flags.bits() != 0 {
            return reply.error(Errno::EINVAL);
        }
        let change = self.state.files.change(self.state.inode_of(ino_out));
        self.spawn(request, |state| async move {
            let _change = change;
            let (source, file) = match (state.handle(handle_in), state.handle(handle_out)) {
                (Ok(source), Ok(file)) => (source, file),
                (Err(error), _) | (_, Err(error)) => return reply.error(error),
            };
            match file.copy_from(&source, offset_in, offset_out, len).await {
                Ok(copied) => reply.written(copied as u32),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn bmap(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _block_size: u32,
        _index: u64,
        reply: fuser::ReplyBmap,
    ) {
        self.state.client.unserved.note("bmap", "ENOSYS");
        reply.error(Errno::ENOSYS);
    }

    fn fsyncdir(
        &self,
        request: &Request,
        _ino: INodeNo,
        _handle: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // A change of a directory is on its home's disk once answered, or kept by this client
        // until it is: the sync waits for every home to have what is kept.
        self.spawn(request, |state| async move {
            reply_empty(reply, state.client.sync_changes().await);
        });
    }

    fn lookup(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::ENOENT);
        };
        self.spawn(request, |state| async move {
            let result = state.client.lookup(state.inode_of(parent), &name).await;
            reply_entry(&state, reply, result);
        });
    }

    fn getattr(
        &self,
        request: &Request,
        ino: INodeNo,
        _handle: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        // After this client made or removed an entry in a directory, the kernel asks for its
        // attributes again; the change's reply had them.
        let inode = self.state.inode_of(ino);
        if let Some((attr, left)) = self.state.dirs.get(inode) {
            return reply.attr(&left, &self.state.file_attr(attr));
        }
        // After this client wrote to a file, the kernel asks again before the file's next
        // change (an untar's fchown): its create's or last attribute change's reply, with
        // the size written since, answers.
        if let Some((attr, left)) = self.state.files.get(inode) {
            if let Some(attr) = self.state.client.known_view(attr) {
                return reply.attr(&left, &self.state.fuse_attr(attr));
            }
        }
        self.spawn(request, |state| async move {
            match state.client.get_attr(state.inode_of(ino)).await {
                Ok(attr) => reply.attr(&state.ttl, &state.merge(attr)),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn setattr(
        &self,
        request: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        handle: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = AttrChanges {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            project: None,
        };
        let change = self.state.dirs.change(self.state.inode_of(ino));
        let file_change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let _change = change;
            // Through a descriptor (ftruncate), judged by what it was opened for.
            let through = handle.map(|handle| handle.0);
            match state
                .client
                .set_attr_through(state.inode_of(ino), changes, through)
                .await
            {
                Ok(attr) => {
                    if attr.kind == FileKind::Regular {
                        file_change.finish(Some(attr.clone()));
                    }
                    reply.attr(&state.ttl, &state.merge(attr));
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn readlink(&self, request: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(request, |state| async move {
            match state.client.read_link(state.inode_of(ino)).await {
                Ok(target) => reply.data(target.as_bytes()),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::EINVAL);
        };
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileKind::Regular,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => return reply.error(Errno::EINVAL),
        };
        let new = NewInode {
            kind,
            mode: mode & 0o7777,
            uid: request.uid(),
            gid: request.gid(),
            umask,
            rdev,
            symlink: None,
        };
        self.create_entry(request, (parent, name), new, reply);
    }

    fn mkdir(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::EINVAL);
        };
        let new = crate::client::directory(mode & 0o7777, umask, (request.uid(), request.gid()));
        self.create_entry(request, (parent, name), new, reply);
    }

    fn unlink(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::ENOENT);
        };
        // The file whose name goes changes too (its links and ctime), and is not named.
        self.state.files.forget_all();
        let change = self.state.dirs.change(self.state.inode_of(parent));
        self.spawn(request, |state| async move {
            let result = state.client.unlink(state.inode_of(parent), &name).await;
            // Again once done: a change the kernel did not hold back meanwhile (a writeback
            // cache's SETATTR of the times) may have kept the file's links from before.
            state.files.forget_all();
            reply_empty(reply, result.map(|after| change.finish(after)));
        });
    }

    fn rmdir(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::ENOENT);
        };
        self.state.dirs.forget_all();
        self.state.files.forget_all();
        let change = self.state.dirs.change(self.state.inode_of(parent));
        self.spawn(request, |state| async move {
            let result = state.client.rmdir(state.inode_of(parent), &name).await;
            state.files.forget_all();
            reply_empty(reply, result.map(|after| change.finish(after)));
        });
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (Ok(name), Some(target)) = (
            name_str(link_name).map(str::to_string),
            target.to_str().map(str::to_string),
        ) else {
            return reply.error(Errno::EINVAL);
        };
        let new = NewInode {
            kind: FileKind::Symlink,
            mode: 0o777,
            uid: request.uid(),
            gid: request.gid(),
            umask: 0,
            rdev: 0,
            symlink: Some(target),
        };
        self.create_entry(request, (parent, name), new, reply);
    }

    fn rename(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (Ok(name), Ok(new_name)) = (
            name_str(name).map(str::to_string),
            name_str(new_name).map(str::to_string),
        ) else {
            return reply.error(Errno::EINVAL);
        };
        let flags = weft_proto::messages::RenameFlags {
            no_replace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        // A moved directory changes too (its parent and ctime), and its inode is not named;
        // so does a file the rename replaces.
        self.state.dirs.forget_all();
        self.state.files.forget_all();
        let changes = (
            self.state.dirs.change(self.state.inode_of(parent)),
            self.state.dirs.change(self.state.inode_of(new_parent)),
        );
        self.spawn(request, |state| async move {
            let renamed = state
                .client
                .rename(
                    state.inode_of(parent),
                    &name,
                    state.inode_of(new_parent),
                    &new_name,
                    flags,
                )
                .await;
            state.files.forget_all();
            reply_empty(reply, renamed);
            drop(changes);
        });
    }

    fn link(
        &self,
        request: &Request,
        ino: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        let Ok(new_name) = name_str(new_name).map(str::to_string) else {
            return reply.error(Errno::EINVAL);
        };
        let change = self.state.dirs.change(self.state.inode_of(new_parent));
        let file_change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let result = state
                .client
                .link(state.inode_of(ino), state.inode_of(new_parent), &new_name)
                .await;
            reply_entry(&state, reply, result);
            drop((change, file_change));
        });
    }

    fn open(&self, request: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(request, |state| async move {
            let access = open_access(flags.0, state.writeback_cache);
            match state.client.open_file(state.inode_of(ino), access).await {
                Ok(file) => {
                    let handle = state.add_handle(file);
                    // Close-to-open: what the file is now, not what this client kept.
                    state.files.forget(state.inode_of(ino));
                    state.forget_attributes(ino);
                    state.forget_xattrs(ino);
                    reply.opened(handle, fopen_flags(flags.0));
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn read(
        &self,
        request: &Request,
        _ino: INodeNo,
        handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(request, |state| async move {
            let file = match state.handle(handle) {
                Ok(file) => file,
                Err(error) => return reply.error(error),
            };
            match file.read(offset, u64::from(size)).await {
                // One buffer for the kernel: a read within one piece goes without a copy.
                Ok(data) => reply.data(&data.into_bytes()),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn write(
        &self,
        request: &Request,
        _ino: INodeNo,
        handle: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel's buffer is borrowed only for this call: one copy into an owned buffer,
        // whose slices then travel to the targets without further copies.
        let data = Bytes::copy_from_slice(data);
        self.spawn_task(request, |state| async move {
            let file = match state.handle(handle) {
                Ok(file) => file,
                Err(error) => return reply.error(error),
            };
            let len = data.len() as u32;
            match file.write(offset, data).await {
                Ok(()) => reply.written(len),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn flush(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // The size report changes the file's size and times at its home.
        let change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let _change = change;
            let file = match state.handle(handle) {
                Ok(file) => file,
                Err(error) => return reply.error(error),
            };
            let flushed = file.flush().await;
            // Every close(2) releases the closing process's record locks on the file.
            if let Err(error) = state.release_locks(file.inode(), lock_owner.0).await {
                return reply.error(errno(&error));
            }
            reply_empty(reply, flushed);
        });
    }

    fn release(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let _change = change;
            tracing::debug!(?lock_owner, "release");
            let Ok(file) = state.handle(handle) else {
                return reply.ok();
            };
            // The last close of an open file description releases its flock, after the
            // writes made under it.
            file.drain().await;
            if let Some(owner) = lock_owner {
                if let Err(error) = state.release_locks(file.inode(), owner.0).await {
                    tracing::warn!(%error, "releasing a flock failed");
                }
            }
            state
                .handles
                .lock()
                .expect("handle table poisoned")
                .remove(&handle.0);
            if let Err(error) = file.close().await {
                tracing::debug!(%error, "reporting the size at release failed");
            }
            reply.ok();
        });
    }

    fn fsync(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let _change = change;
            let file = match state.handle(handle) {
                Ok(file) => file,
                Err(error) => return reply.error(error),
            };
            reply_empty(reply, file.sync().await);
        });
    }

    fn opendir(&self, _request: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let handle = self.state.listings.open();
        reply.opened(FileHandle(handle), FopenFlags::empty());
    }

    fn releasedir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        handle: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state.listings.close(handle.0);
        reply.ok();
    }

    fn readdir(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.spawn(request, |state| async move {
            if offset < 1 && reply.add(ino, 1, FileType::Directory, ".") {
                return reply.ok();
            }
            if offset < 2 && reply.add(ino, 2, FileType::Directory, "..") {
                return reply.ok();
            }
            let listed = list(&state, (handle.0, ino), offset, false, |entry, _| {
                reply.add(
                    state.ino_of(entry.inode),
                    entry.cookie,
                    file_type(entry.kind),
                    &entry.name,
                )
            })
            .await;
            match listed {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn readdirplus(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.spawn(request, |state| async move {
            // The kernel takes no entry for "." and "..": their attributes are not read.
            let dots = unread(ino, FileType::Directory);
            for (at, name) in [(1, "."), (2, "..")] {
                if offset < at && reply.add(ino, at, name, &state.ttl, &dots, Generation(0)) {
                    return reply.ok();
                }
            }
            let listed = list(&state, (handle.0, ino), offset, true, |entry, attr| {
                // An entry whose attributes the caller may not read goes with none the
                // kernel may keep: its next use looks the name up (and is refused).
                let (attr, ttl) = match attr {
                    Some(attr) => (state.merge(attr.clone()), state.ttl),
                    None => {
                        let ino = state.ino_of(entry.inode);
                        (unread(ino, file_type(entry.kind)), Duration::ZERO)
                    }
                };
                reply.add(
                    attr.ino,
                    entry.cookie,
                    &entry.name,
                    &ttl,
                    &attr,
                    Generation(0),
                )
            })
            .await;
            match listed {
                Ok(()) => reply.ok(),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn statfs(&self, request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(request, |state| async move {
            match state.client.cluster_map().await {
                Ok(map) => {
                    const BLOCK: u64 = 4096;
                    let total: u64 = map.targets.iter().map(|t| t.usage.total_bytes).sum();
                    let free: u64 = map.targets.iter().map(|t| t.usage.free_bytes).sum();
                    let files: u64 = map
                        .nodes
                        .iter()
                        .filter_map(|n| n.meta_usage)
                        .map(|u| u.total_inodes)
                        .sum();
                    let free_files: u64 = map
                        .nodes
                        .iter()
                        .filter_map(|n| n.meta_usage)
                        .map(|u| u.free_inodes)
                        .sum();
                    reply.statfs(
                        total / BLOCK,
                        free / BLOCK,
                        free / BLOCK,
                        files,
                        free_files,
                        BLOCK as u32,
                        255,
                        BLOCK as u32,
                    );
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn fallocate(
        &self,
        request: &Request,
        ino: INodeNo,
        handle: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        // Plain allocation, PUNCH_HOLE (with KEEP_SIZE) and ZERO_RANGE; the rest (collapse,
        // insert, unshare) would move data between chunks and is refused cleanly.
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let operation = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let storage_mode = match operation {
            0 => FallocateMode::Allocate,
            libc::FALLOC_FL_PUNCH_HOLE if keep_size => FallocateMode::Zero,
            libc::FALLOC_FL_ZERO_RANGE => FallocateMode::Zero,
            _ => return reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
        };
        let change = self.state.files.change(self.state.inode_of(ino));
        self.spawn(request, |state| async move {
            let _change = change;
            let file = match state.handle(handle) {
                Ok(file) => file,
                Err(error) => return reply.error(error),
            };
            let range = (offset, length);
            reply_empty(reply, file.allocate(range, storage_mode, keep_size).await);
        });
    }

    fn getlk(
        &self,
        request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: fuser::ReplyLock,
    ) {
        let Some(kind) = lock_kind(typ) else {
            return reply.error(Errno::EINVAL);
        };
        let wanted = LockRange {
            owner: lock_owner.0,
            kind,
            start,
            end,
            pid,
        };
        self.spawn(request, |state| async move {
            state.client.drain_writes(state.inode_of(ino)).await;
            match state.client.get_lock(state.inode_of(ino), wanted).await {
                Ok(Some(held)) => {
                    let typ = if held.kind == LockKind::Write {
                        libc::F_WRLCK
                    } else {
                        libc::F_RDLCK
                    };
                    reply.locked(held.start, held.end, typ, held.pid);
                }
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn setlk(
        &self,
        request: &Request,
        ino: INodeNo,
        _handle: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(kind) = lock_kind(typ) else {
            return reply.error(Errno::EINVAL);
        };
        let lock = LockRange {
            owner: lock_owner.0,
            kind,
            start,
            end,
            pid,
        };
        tracing::debug!(?lock, sleep, "setlk");
        self.spawn(request, |state| async move {
            let inode = state.inode_of(ino);
            // What was written under a lock reaches the servers before the lock changes.
            state.client.drain_writes(inode).await;
            loop {
                let wait_ms = if sleep { LOCK_WAIT_SLICE_MS } else { 0 };
                match state.client.set_lock(inode, lock, wait_ms).await {
                    Ok(()) => return reply.ok(),
                    Err(error) if sleep && error.code() == ErrorCode::WouldBlock => {
                        // F_SETLKW waits until the lock is free or the process is interrupted.
                        // The kernel's interrupt request does not reach this adapter, so the
                        // waiter looks for a pending signal itself between waits.
                        if signal_pending(pid) {
                            return reply.error(Errno::EINTR);
                        }
                    }
                    Err(error) => return reply.error(errno(&error)),
                }
            }
        });
    }

    fn setxattr(
        &self,
        request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::EINVAL);
        };
        let mode = match flags {
            0 => XattrSetMode::Any,
            libc::XATTR_CREATE => XattrSetMode::Create,
            libc::XATTR_REPLACE => XattrSetMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let value = value.to_vec();
        self.state.changing_xattrs(ino);
        let changes = (
            self.state.dirs.change(self.state.inode_of(ino)),
            self.state.files.change(self.state.inode_of(ino)),
        );
        self.spawn(request, |state| async move {
            reply_empty(
                reply,
                state
                    .client
                    .set_xattr(state.inode_of(ino), &name, &value, mode)
                    .await,
            );
            drop(changes);
        });
    }

    fn getxattr(
        &self,
        request: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::from_i32(libc::ENODATA));
        };
        if self.state.xattr_absent(ino, Some(&name)) {
            return reply.error(Errno::from_i32(libc::ENODATA));
        }
        let capability = name == CAPABILITY_XATTR;
        self.spawn(request, |state| async move {
            match state.client.get_xattr(state.inode_of(ino), &name).await {
                Ok(value) => reply_xattr(reply, size, &value),
                Err(error) => {
                    if capability && error.errno() == libc::ENODATA {
                        state.note_absent(ino, Absent::Capability);
                    }
                    reply.error(errno(&error))
                }
            }
        });
    }

    fn listxattr(&self, request: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if self.state.xattr_absent(ino, None) {
            return reply_xattr(reply, size, &[]);
        }
        self.spawn(request, |state| async move {
            match state.client.list_xattr(state.inode_of(ino)).await {
                Ok(names) => {
                    let mut list = Vec::new();
                    for name in names {
                        list.extend_from_slice(name.as_bytes());
                        list.push(0);
                    }
                    reply_xattr(reply, size, &list);
                }
                Err(error) => reply.error(errno(&error)),
            }
        });
    }

    fn removexattr(&self, request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::from_i32(libc::ENODATA));
        };
        self.state.changing_xattrs(ino);
        let changes = (
            self.state.dirs.change(self.state.inode_of(ino)),
            self.state.files.change(self.state.inode_of(ino)),
        );
        self.spawn(request, |state| async move {
            reply_empty(
                reply,
                state.client.remove_xattr(state.inode_of(ino), &name).await,
            );
            drop(changes);
        });
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Ok(name) = name_str(name).map(str::to_string) else {
            return reply.error(Errno::EINVAL);
        };
        let new = NewInode {
            kind: FileKind::Regular,
            mode: mode & 0o7777,
            uid: request.uid(),
            gid: request.gid(),
            umask,
            rdev: 0,
            symlink: None,
        };
        let change = self.state.dirs.change(self.state.inode_of(parent));
        let mark = self.state.files.mark();
        self.spawn(request, |state| async move {
            // One request creates the file and registers the open.
            let created = state
                .client
                .create_file((state.inode_of(parent), &name), new)
                .await;
            let (file, attr) = match created {
                Ok((file, created)) => {
                    change.finish(created.parent);
                    state
                        .files
                        .keep_new(created.attr.inode, created.attr.clone(), mark);
                    (file, created.attr)
                }
                Err(error) => return reply.error(errno(&error)),
            };
            let handle = state.add_handle(file);
            let open_flags = fopen_flags(flags);
            // A new file has no file capabilities.
            state.note_absent(state.ino_of(attr.inode), Absent::Capability);
            reply.created(
                &state.ttl,
                &state.merge(attr),
                Generation(0),
                handle,
                open_flags,
            );
        });
    }
}

/// Gives the kernel the entries of directory `ino`, open as `handle`, from `offset` on (past
/// "." and ".."): from the listing kept for the handle where it goes on there, else from the
/// server, a page at a time, through `add` (true: the kernel's buffer is full and the entry
/// was not taken). Keeps what the kernel did not take, or that the end was reached, for its
/// next buffer (see `listings.rs`).
async fn list(
    state: &State,
    (handle, ino): (u64, INodeNo),
    offset: u64,
    with_attrs: bool,
    mut add: impl FnMut(&weft_proto::messages::DirEntry, Option<&InodeAttr>) -> bool,
) -> Result<(), ClientError> {
    let dir = state.inode_of(ino);
    let mut listing = match state.listings.take(handle, offset, with_attrs) {
        Some(listing) => listing,
        None => list_page(state, dir, offset.max(2), with_attrs).await?,
    };
    loop {
        while let Some((entry, attr)) = listing.left.front() {
            if add(entry, attr.as_ref()) {
                state.listings.keep(handle, listing);
                return Ok(());
            }
            listing.next = entry.cookie;
            listing.left.pop_front();
        }
        if listing.end {
            state.listings.keep(handle, listing);
            return Ok(());
        }
        listing = list_page(state, dir, listing.next, with_attrs).await?;
    }
}

/// A page of the server's listing of `dir` after cookie `after`.
async fn list_page(
    state: &State,
    dir: InodeId,
    after: u64,
    with_attrs: bool,
) -> Result<listings::Listing, ClientError> {
    let listed = std::time::Instant::now();
    let (left, end): (std::collections::VecDeque<_>, bool) = if with_attrs {
        let (entries, end) = state
            .client
            .read_dir_plus(dir, after, READDIR_BATCH)
            .await?;
        (entries.into_iter().collect(), end)
    } else {
        let (entries, end) = state.client.read_dir(dir, after, READDIR_BATCH).await?;
        (
            entries.into_iter().map(|entry| (entry, None)).collect(),
            end,
        )
    };
    Ok(listings::Listing {
        next: after,
        end: end || left.is_empty(),
        left,
        with_attrs,
        listed,
    })
}
