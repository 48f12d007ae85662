//! Attributes the kernel asks for again after this client changed an inode, kept from the
//! change's reply.
//!
//! The kernel forgets a directory's cached attributes after every entry created or removed in
//! it, and with `default_permissions` asks for them again at the next lookup there: one round
//! trip to the metadata server per file created or removed, for attributes the change's own
//! reply could carry. The replies of a create, an unlink and an rmdir do carry them; they are
//! kept here and answer that GETATTR for what is left of the attribute cache time, the same
//! trust the kernel would have given them.
//!
//! The kernel forgets a regular file's attributes after every write to it too, and asks for
//! them again before the next change of them (an untar's `fchown` after the file's data): a
//! second table keeps a file's attributes from its create's reply and from every attribute
//! change's, and answers that GETATTR with this client's written size
//! ([`crate::Client::known_view`]) while the file's size report has not gone out (a flush,
//! fsync or close of the file forgets them, as does any other change of the file through
//! this mount, and every link, unlink, rename and rmdir forgets every file's).
//!
//! Only a change that ran alone on its inode (no other change of it from this client
//! overlapped) leaves attributes behind: of two overlapping changes, either reply may be the
//! older. Every change of an inode by this client forgets what was kept for it; a rename or
//! rmdir, which may change a directory other than the ones it names (the moved or removed
//! one), forgets everything, and no change that overlapped it keeps anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_proto::ids::InodeId;
use weft_proto::messages::InodeAttr;

/// Most inodes kept; expired ones go first when it is full.
const KEPT_MAX: usize = 4096;

/// Most changes remembered by inode for [`FreshAttrs::keep_new`]: a create that overlapped
/// more keeps nothing.
const RECENT_MAX: usize = 256;

#[derive(Default)]
struct Kept {
    /// Changes of it from this client now running.
    running: u32,
    /// Another change started while one was running.
    overlapped: bool,
    /// Attributes as a change left them, and when.
    fresh: Option<(InodeAttr, Instant)>,
}

/// Inodes of one mount (its directories, or its regular files).
pub(super) struct FreshAttrs {
    ttl: Duration,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_inode: HashMap<InodeId, Kept>,
    /// Bumped by every change that forgets everything.
    epoch: u64,
    /// Bumped by every change that starts, and by every forgetting.
    changes: u64,
    /// The last changes and forgettings, by their number in `changes`, with their inode.
    recent: std::collections::VecDeque<(u64, InodeId)>,
    /// The number in `changes` of the last forgetting of everything.
    all_forgotten: u64,
}

impl Table {
    /// Notes a change or a forgetting of `inode`.
    fn note(&mut self, inode: InodeId) {
        self.changes += 1;
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back((self.changes, inode));
    }

    /// Whether `inode` may have changed, or been forgotten, since `mark`.
    fn changed_since(&self, inode: InodeId, mark: u64) -> bool {
        let forgotten = self
            .recent
            .front()
            .is_some_and(|&(first, _)| first > mark + 1);
        self.all_forgotten > mark
            || forgotten
            || self
                .recent
                .iter()
                .rev()
                .take_while(|&&(number, _)| number > mark)
                .any(|&(_, changed)| changed == inode)
    }
}

impl FreshAttrs {
    /// Keeps attributes for `ttl` (zero: never).
    pub fn new(ttl: Duration) -> Arc<FreshAttrs> {
        Arc::new(FreshAttrs {
            ttl,
            table: Mutex::default(),
        })
    }

    /// Attributes of `inode` kept from this client's last change, and how much longer they may
    /// be trusted.
    pub fn get(&self, inode: InodeId) -> Option<(InodeAttr, Duration)> {
        let table = self.table.lock().expect("attribute table poisoned");
        let (attr, since) = table.by_inode.get(&inode)?.fresh.as_ref()?;
        let left = self.ttl.checked_sub(since.elapsed())?;
        Some((attr.clone(), left))
    }

    /// Starts a change of `inode`: forgets what was kept, until [`Change::finish`].
    pub fn change(self: &Arc<Self>, inode: InodeId) -> Change {
        let mut table = self.table.lock().expect("attribute table poisoned");
        let epoch = table.epoch;
        table.note(inode);
        let entry = table.by_inode.entry(inode).or_default();
        entry.overlapped |= entry.running > 0;
        entry.running += 1;
        entry.fresh = None;
        Change {
            attrs: Arc::clone(self),
            inode,
            epoch,
            done: false,
        }
    }

    /// Forgets `inode`'s attributes, and keeps none from a change of it running now.
    pub fn forget(&self, inode: InodeId) {
        let mut table = self.table.lock().expect("attribute table poisoned");
        table.note(inode);
        let Some(entry) = table.by_inode.get_mut(&inode) else {
            return;
        };
        if entry.running == 0 {
            table.by_inode.remove(&inode);
        } else {
            entry.overlapped = true;
            entry.fresh = None;
        }
    }

    /// A mark to give [`FreshAttrs::keep_new`]: taken before the request that makes an inode.
    pub fn mark(&self) -> u64 {
        self.table.lock().expect("attribute table poisoned").changes
    }

    /// Keeps the attributes of `inode`, which this client just made, from the reply that made
    /// it, if no change of it started and it was not forgotten since `mark` (a change of the
    /// new inode, found through a listing, may have answered first).
    pub fn keep_new(&self, inode: InodeId, attr: InodeAttr, mark: u64) {
        if self.ttl.is_zero() {
            return;
        }
        let mut table = self.table.lock().expect("attribute table poisoned");
        if table.changed_since(inode, mark) || table.by_inode.contains_key(&inode) {
            return;
        }
        table.by_inode.insert(
            inode,
            Kept {
                fresh: Some((attr, Instant::now())),
                ..Kept::default()
            },
        );
        self.trim(&mut table);
    }

    /// Forgets every inode's attributes, and keeps none from a change running now.
    pub fn forget_all(&self) {
        let mut table = self.table.lock().expect("attribute table poisoned");
        table.epoch += 1;
        table.changes += 1;
        table.all_forgotten = table.changes;
        table.by_inode.retain(|_, d| d.running > 0);
        for kept in table.by_inode.values_mut() {
            kept.fresh = None;
        }
    }

    fn finish(&self, inode: InodeId, epoch: u64, after: Option<InodeAttr>) {
        let mut table = self.table.lock().expect("attribute table poisoned");
        let current = table.epoch == epoch;
        let Some(entry) = table.by_inode.get_mut(&inode) else {
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
                table.by_inode.remove(&inode);
                return;
            }
        }
        self.trim(&mut table);
    }

    /// Drops what expired once too much is kept.
    fn trim(&self, table: &mut Table) {
        if table.by_inode.len() > KEPT_MAX {
            let ttl = self.ttl;
            table.by_inode.retain(|_, d| {
                d.running > 0 || d.fresh.as_ref().is_some_and(|(_, t)| t.elapsed() < ttl)
            });
        }
    }
}

/// A change of one inode in progress; dropping it without [`Change::finish`] keeps
/// nothing.
pub(super) struct Change {
    attrs: Arc<FreshAttrs>,
    inode: InodeId,
    epoch: u64,
    done: bool,
}

impl Change {
    /// Ends the change; `after` is the inode's attributes after it, if the reply had them.
    pub fn finish(mut self, after: Option<InodeAttr>) {
        self.done = true;
        self.attrs.finish(self.inode, self.epoch, after);
    }
}

impl Drop for Change {
    fn drop(&mut self) {
        if !self.done {
            self.attrs.finish(self.inode, self.epoch, None);
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
        let dirs = FreshAttrs::new(Duration::from_secs(60));
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
    fn a_new_inode_is_kept_only_if_nothing_changed_since_its_request() {
        let files = FreshAttrs::new(Duration::from_secs(60));
        let file = InodeId(9);
        let mark = files.mark();
        files.keep_new(file, attr(file, 1), mark);
        assert_eq!(files.get(file).expect("kept").0.mtime.seconds, 1);
        files.forget(file);
        assert!(files.get(file).is_none(), "forgotten");

        let mark = files.mark();
        files.change(file).finish(Some(attr(file, 3)));
        files.keep_new(file, attr(file, 2), mark);
        assert_eq!(
            files.get(file).expect("kept").0.mtime.seconds,
            3,
            "a change answered before the reply that made the inode stays"
        );

        let other = InodeId(10);
        let mark = files.mark();
        drop(files.change(InodeId(11)));
        files.keep_new(other, attr(other, 4), mark);
        assert_eq!(
            files.get(other).expect("kept").0.mtime.seconds,
            4,
            "another inode's change does not matter"
        );
        files.forget(other);

        let mark = files.mark();
        drop(files.change(other));
        files.forget(other);
        files.keep_new(other, attr(other, 5), mark);
        assert!(
            files.get(other).is_none(),
            "a change of the new inode since"
        );

        let mark = files.mark();
        files.forget_all();
        files.keep_new(other, attr(other, 6), mark);
        assert!(files.get(other).is_none(), "everything forgotten since");

        let mark = files.mark();
        for i in 0..RECENT_MAX as u64 + 1 {
            drop(files.change(InodeId(1000 + i)));
        }
        files.keep_new(other, attr(other, 7), mark);
        assert!(
            files.get(other).is_none(),
            "more changes since than are remembered"
        );

        let running = files.change(file);
        files.forget(file);
        running.finish(Some(attr(file, 5)));
        assert!(
            files.get(file).is_none(),
            "a change overlapping a forgetting keeps nothing"
        );
    }

    #[test]
    fn nothing_is_kept_without_an_attribute_cache() {
        let dirs = FreshAttrs::new(Duration::ZERO);
        dirs.change(InodeId(7)).finish(Some(attr(InodeId(7), 1)));
        assert!(dirs.get(InodeId(7)).is_none());
    }
}
