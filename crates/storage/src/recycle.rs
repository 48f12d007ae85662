//! Emptied object files kept for reuse.
//!
//! A new object needs a new file, and on ext4 a new file needs an inode. Without a journal,
//! ext4 will not hand out an inode freed in the last minute (five while its inode table block
//! is dirty), and finds that out by reading every such inode on the way to a free one: after a
//! burst of deletes, each create scans past all of them, and a workload that creates and
//! removes many small files spends most of its CPU there. So a removed object is cut to
//! nothing and moved into `<target>/free/` instead of unlinked, and a new object is a pooled
//! file renamed into place: neither allocates nor frees an inode.
//!
//! Only the caller knows when a file may be reused: no request may still hold it open, or
//! a late write for the old object would land in the new one (see `Target::remove`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use weft_service::durable::rename_with_flags;

/// Most emptied files one target keeps; removals beyond it unlink.
pub(crate) const POOLED_MAX: usize = 65_536;

/// The pool of one target: the numbers of the files in its `free/` directory.
pub(crate) struct FreeFiles {
    dir: PathBuf,
    pooled: Mutex<Pool>,
}

struct Pool {
    names: Vec<u64>,
    next: u64,
}

/// What [`FreeFiles::place`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// A pooled file now sits at the path.
    Moved,
    /// Something already sits at the path; the pooled file stays pooled.
    Occupied,
    /// The pool is empty.
    Empty,
}

impl FreeFiles {
    /// The pool under `root`, with the files a previous run left in it.
    pub fn open(root: &Path) -> std::io::Result<FreeFiles> {
        let dir = root.join("free");
        fs::create_dir_all(&dir)?;
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            match entry
                .file_name()
                .to_str()
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            {
                Some(number) if entry.file_type()?.is_file() => names.push(number),
                _ => {}
            }
        }
        let next = names.iter().max().map_or(0, |n| n + 1);
        Ok(FreeFiles {
            dir,
            pooled: Mutex::new(Pool { names, next }),
        })
    }

    /// Files in the pool.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pooled.lock().expect("free pool poisoned").names.len()
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:016x}"))
    }

    /// Moves the empty file at `path` into the pool; false when the pool is full (the caller
    /// unlinks it instead).
    pub fn keep(&self, path: &Path) -> std::io::Result<bool> {
        let mut pool = self.pooled.lock().expect("free pool poisoned");
        if pool.names.len() >= POOLED_MAX {
            return Ok(false);
        }
        let number = pool.next;
        fs::rename(path, self.path(number))?;
        pool.next += 1;
        pool.names.push(number);
        Ok(true)
    }

    /// Renames a pooled file to `path` unless something is there already.
    pub fn place(&self, path: &Path) -> std::io::Result<Placed> {
        let mut pool = self.pooled.lock().expect("free pool poisoned");
        let Some(&number) = pool.names.last() else {
            return Ok(Placed::Empty);
        };
        match rename_with_flags(&self.path(number), path, libc::RENAME_NOREPLACE) {
            Ok(()) => {
                pool.names.pop();
                Ok(Placed::Moved)
            }
            Err(error) if error.raw_os_error() == Some(libc::EEXIST) => Ok(Placed::Occupied),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                // Removed by hand; forget it (a missing destination directory also ends up
                // here, and the caller's plain create reports that).
                if !self.path(number).exists() {
                    pool.names.pop();
                }
                Ok(Placed::Empty)
            }
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_files_are_placed_once_and_survive_a_reopen() {
        let root = tempfile::tempdir().expect("tempdir");
        let pool = FreeFiles::open(root.path()).expect("open");
        let a = root.path().join("a");
        fs::write(&a, b"").expect("create");
        assert!(pool.keep(&a).expect("keep"));
        assert!(!a.exists());

        let pool = FreeFiles::open(root.path()).expect("reopen");
        assert_eq!(pool.len(), 1);
        let b = root.path().join("b");
        fs::write(&b, b"taken").expect("create");
        assert_eq!(pool.place(&b).expect("place"), Placed::Occupied);
        assert_eq!(
            fs::read(&b).expect("read"),
            b"taken",
            "an existing file is kept"
        );
        let c = root.path().join("c");
        assert_eq!(pool.place(&c).expect("place"), Placed::Moved);
        assert!(c.exists());
        assert_eq!(
            pool.place(&root.path().join("d")).expect("place"),
            Placed::Empty
        );
    }
}
