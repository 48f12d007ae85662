//! Directory attributes the kernel asks for again after this client changed the directory.
//!
//! The kernel forgets a directory's cached attributes after every entry created or removed in
//! it, and with `default_permissions` asks for them again at the next lookup there: one round
//! trip to the metadata server per file created or removed, for attributes the change's own
//! reply could carry. The replies of a create, an unlink and an rmdir do carry them; they are
//! kept here and answer that GETATTR for what is left of the attribute cache time, the same
//! trust the kernel would have given them.
//!
//! Only a change that ran alone in its directory (no other change of it from this client
//! overlapped) leaves attributes behind: of two overlapping creates, either reply may be
//! the older. Every change of a directory by this client forgets what was kept for it; a
//! rename or rmdir, which may change a directory other than the ones it names (the moved or
//! removed one), forgets everything, and no change that overlapped it keeps anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_proto::ids::InodeId;
use weft_proto::messages::InodeAttr;

/// Most directories kept; expired ones go first when it is full.
const KEPT_MAX: usize = 4096;

#[derive(Default)]
struct Dir {
    /// Changes of it from this client now running.
    running: u32,
    /// Another change started while one was running.
    overlapped: bool,
    /// Attributes as a change left them, and when.
    fresh: Option<(InodeAttr, Instant)>,
}

/// The directories of one mount.
pub(super) struct FreshDirs {
    ttl: Duration,
    dirs: Mutex<Dirs>,
}

#[derive(Default)]
struct Dirs {
    by_inode: HashMap<InodeId, Dir>,
    /// Bumped by every change that forgets everything.
    epoch: u64,
}

impl FreshDirs {
    /// Keeps attributes for `ttl` (zero: never).
    pub fn new(ttl: Duration) -> Arc<FreshDirs> {
        Arc::new(FreshDirs {
            ttl,
            dirs: Mutex::default(),
        })
    }

    /// Attributes of `dir` kept from this client's last change, and how much longer they may
    /// be trusted.
    pub fn get(&self, dir: InodeId) -> Option<(InodeAttr, Duration)> {
        let dirs = self.dirs.lock().expect("directory table poisoned");
        let (attr, since) = dirs.by_inode.get(&dir)?.fresh.as_ref()?;
        let left = self.ttl.checked_sub(since.elapsed())?;
        Some((attr.clone(), left))
    }

    /// Starts a change of `dir`: forgets what was kept, until [`Change::finish`].
    pub fn change(self: &Arc<Self>, dir: InodeId) -> Change {
        let mut dirs = self.dirs.lock().expect("directory table poisoned");
        let epoch = dirs.epoch;
        let entry = dirs.by_inode.entry(dir).or_default();
        entry.overlapped |= entry.running > 0;
        entry.running += 1;
        entry.fresh = None;
        Change {
            dirs: Arc::clone(self),
            dir,
            epoch,
            done: false,
        }
    }

    /// Forgets every directory's attributes, and keeps none from a change running now.
    pub fn forget_all(&self) {
        let mut dirs = self.dirs.lock().expect("directory table poisoned");
        dirs.epoch += 1;
        dirs.by_inode.retain(|_, d| d.running > 0);
        for dir in dirs.by_inode.values_mut() {
            dir.fresh = None;
        }
    }

    fn finish(&self, dir: InodeId, epoch: u64, after: Option<InodeAttr>) {
        let mut dirs = self.dirs.lock().expect("directory table poisoned");
        let current = dirs.epoch == epoch;
        let Some(entry) = dirs.by_inode.get_mut(&dir) else {
            return;
        };
        entry.running -= 1;
        if entry.running > 0 {
            return;
        }
        let alone = !std::mem::take(&mut entry.overlapped);
        match after.filter(|_| alone && current && !self.ttl.is_zero()) {
            Some(attr) => entry.fresh = Some((attr, Instant::now())),
            None => {
                dirs.by_inode.remove(&dir);
                return;
            }
        }
        if dirs.by_inode.len() > KEPT_MAX {
            let ttl = self.ttl;
            dirs.by_inode.retain(|_, d| {
                d.running > 0 || d.fresh.as_ref().is_some_and(|(_, t)| t.elapsed() < ttl)
            });
        }
    }
}

/// A change of one directory in progress; dropping it without [`Change::finish`] keeps
/// nothing.
pub(super) struct Change {
    dirs: Arc<FreshDirs>,
    dir: InodeId,
    epoch: u64,
    done: bool,
}

impl Change {
    /// Ends the change; `after` is the directory's attributes after it, if the reply had them.
    pub fn finish(mut self, after: Option<InodeAttr>) {
        self.done = true;
        self.dirs.finish(self.dir, self.epoch, after);
    }
}

impl Drop for Change {
    fn drop(&mut self) {
        if !self.done {
            self.dirs.finish(self.dir, self.epoch, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::messages::{FileKind, Timestamp};

    fn attr(dir: InodeId, mtime: i64) -> InodeAttr {
        InodeAttr {
            inode: dir,
            kind: FileKind::Directory,
            mode: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp {
                seconds: mtime,
                nanos: 0,
            },
            ctime: Timestamp::default(),
            truncate_generation: 0,
            layout: None,
            pattern: None,
            parent: InodeId(0),
            shards: Vec::new(),
            project: 0,
            xattr_free: true,
        }
    }

    #[test]
    fn only_a_change_that_ran_alone_leaves_attributes() {
        let dirs = FreshDirs::new(Duration::from_secs(60));
        let dir = InodeId(7);
        dirs.change(dir).finish(Some(attr(dir, 1)));
        assert_eq!(dirs.get(dir).expect("kept").0.mtime.seconds, 1);

        let first = dirs.change(dir);
        assert!(dirs.get(dir).is_none(), "a change forgets what was kept");
        let second = dirs.change(dir);
        second.finish(Some(attr(dir, 3)));
        first.finish(Some(attr(dir, 2)));
        assert!(dirs.get(dir).is_none(), "overlapping changes keep nothing");

        dirs.change(dir).finish(Some(attr(dir, 4)));
        drop(dirs.change(dir));
        assert!(
            dirs.get(dir).is_none(),
            "a change without attributes forgets them"
        );

        let running = dirs.change(dir);
        dirs.forget_all();
        running.finish(Some(attr(dir, 5)));
        assert!(
            dirs.get(dir).is_none(),
            "a change overlapping a rename keeps nothing"
        );
        dirs.change(dir).finish(Some(attr(dir, 6)));
        assert_eq!(dirs.get(dir).expect("kept").0.mtime.seconds, 6);
    }

    #[test]
    fn nothing_is_kept_without_an_attribute_cache() {
        let dirs = FreshDirs::new(Duration::ZERO);
        dirs.change(InodeId(7)).finish(Some(attr(InodeId(7), 1)));
        assert!(dirs.get(InodeId(7)).is_none());
    }
}
