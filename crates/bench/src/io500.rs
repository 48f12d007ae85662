//! An IO500-style run on any POSIX directory (a Weft mount, a peer's mount, a local disk): the
//! twelve phases of IO500's standard list, in its order, scored with its formula.
//!
//! - ior-easy: a file per thread, written then read sequentially in 1 MiB transfers.
//! - ior-hard: one shared file of 47,008-byte records, thread `t` writing records
//!   `t, t + threads, t + 2·threads, …` (interleaved, unaligned), then reading them.
//! - mdtest-easy: empty files in a directory per thread: create, stat, delete.
//! - mdtest-hard: 3,901-byte files in one shared directory: create (with their data), stat,
//!   read, delete.
//! - find: a walk of the whole tree that stats every entry and counts the files of
//!   mdtest-hard's size.
//!
//! Every phase starts its threads together behind a barrier; its rate is all threads' work over
//! the wall time of the slowest. Writes end with an fsync. The bandwidth score is the geometric
//! mean of the four ior phases in GiB/s, the metadata score that of the mdtest phases and find
//! in thousands of operations per second, and the score the geometric mean of the two. Sizes
//! are small enough for one machine: the phases are IO500's, not its five-minute runs, so a
//! score is comparable between file systems measured in the same run, not with the IO500 list.
//!
//! Every byte read is checked against what was written. With `drop_caches` (root), the kernel's
//! page, dentry and inode caches are emptied before every phase after the writes: on one
//! machine the reads would otherwise come from the cache the writes left, where IO500 reads
//! data another node wrote.

use crate::io::{check, fill};
use anyhow::{ensure, Context, Result};
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Bytes of one ior-hard record, as IO500 sets them.
pub const IOR_HARD_RECORD_BYTES: usize = 47_008;
/// Bytes of one mdtest-hard file, as IO500 sets them.
pub const MDTEST_HARD_FILE_BYTES: usize = 3_901;
/// Bytes of one ior-easy transfer.
pub const IOR_EASY_TRANSFER_BYTES: usize = 1 << 20;

/// Parameters of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Io500Config {
    /// Threads (IO500's processes).
    pub threads: usize,
    /// Bytes each thread writes to its ior-easy file.
    pub easy_bytes_per_thread: u64,
    /// Records each thread writes to the ior-hard file.
    pub hard_records_per_thread: u64,
    /// Files each thread makes in mdtest-easy.
    pub easy_files_per_thread: usize,
    /// Files each thread makes in mdtest-hard.
    pub hard_files_per_thread: usize,
    /// Empty the kernel's caches before every phase after the writes.
    pub drop_caches: bool,
}

/// Writes back what is dirty and empties the kernel's page, dentry and inode caches.
fn drop_caches() -> Result<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("cannot empty the kernel's caches (needs root; or run with --keep-caches)")
}

/// One phase's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Io500Phase {
    /// IO500's name of the phase, e.g. `ior-hard-write`.
    pub name: &'static str,
    /// GiB/s for ior phases, thousands of operations per second for the others.
    pub value: f64,
    /// `GiB/s` or `kIOPS`.
    pub unit: &'static str,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// A whole run: the phases in IO500's order and the scores.
#[derive(Clone, Debug, Serialize)]
pub struct Io500Result {
    /// The twelve phases.
    pub phases: Vec<Io500Phase>,
    /// Geometric mean of the ior phases, GiB/s.
    pub bandwidth_score: f64,
    /// Geometric mean of the mdtest phases and find, kIOPS.
    pub metadata_score: f64,
    /// Geometric mean of the two.
    pub score: f64,
}

/// Geometric mean of `values` (0 when there are none).
fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    (values
        .iter()
        .map(|v| v.max(f64::MIN_POSITIVE).ln())
        .sum::<f64>()
        / values.len() as f64)
        .exp()
}

/// Runs `work(thread)` on every thread at once; answers the wall time of the slowest and the
/// sum of what the threads answered (bytes or operations).
fn timed(threads: usize, work: &(dyn Fn(usize) -> Result<u64> + Sync)) -> Result<(f64, u64)> {
    let barrier = Arc::new(Barrier::new(threads + 1));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let barrier = Arc::clone(&barrier);
                scope.spawn(move || {
                    barrier.wait();
                    work(thread)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let mut total = 0;
        for worker in workers {
            total += worker.join().expect("benchmark thread panicked")?;
        }
        Ok((started.elapsed().as_secs_f64(), total))
    })
}

/// One metadata phase: `op(path, thread, index)` on each of `files` files of every thread, file
/// `index` of `thread` being at `path(thread, index)`; answers as [`timed`] does, counting
/// operations. An error names the file.
fn each_file(
    threads: usize,
    files: usize,
    path: &(dyn Fn(usize, usize) -> PathBuf + Sync),
    op: &(dyn Fn(&Path, usize, usize) -> Result<()> + Sync),
) -> Result<(f64, u64)> {
    timed(threads, &|thread| {
        for index in 0..files {
            let path = path(thread, index);
            op(&path, thread, index).with_context(|| path.display().to_string())?;
        }
        Ok(files as u64)
    })
}

/// The name of file `index` of `thread`.
fn file_name(thread: usize, index: usize) -> String {
    format!("file.{thread}.{index}")
}

/// Runs the twelve phases under a fresh directory `run` of `base`, and removes it.
///
/// # Errors
/// The first operation that failed or read back the wrong data, with its phase.
pub fn run(base: &Path, config: &Io500Config, run: &str) -> Result<Io500Result> {
    ensure!(config.threads > 0, "at least one thread");
    let tree = Tree::made(base.join(run), config)?;
    let mut phases = Vec::new();
    let mut note = |name: &'static str, (seconds, amount): (f64, u64), bandwidth: bool| {
        let (value, unit) = if bandwidth {
            (amount as f64 / seconds / f64::from(1u32 << 30), "GiB/s")
        } else {
            (amount as f64 / seconds / 1e3, "kIOPS")
        };
        phases.push(Io500Phase {
            name,
            value,
            unit,
            seconds,
        });
    };
    let (easy, hard) = (Mdtest::Easy, Mdtest::Hard);
    note("ior-easy-write", tree.ior_easy(Direction::Write)?, true);
    note(
        "mdtest-easy-write",
        tree.mdtest(easy, "write", &create)?,
        false,
    );
    note("ior-hard-write", tree.ior_hard(Direction::Write)?, true);
    note(
        "mdtest-hard-write",
        tree.mdtest(hard, "write", &write_hard)?,
        false,
    );
    tree.fresh()?;
    note("find", tree.find()?, false);
    tree.fresh()?;
    note("ior-easy-read", tree.ior_easy(Direction::Read)?, true);
    tree.fresh()?;
    note("mdtest-easy-stat", tree.mdtest(easy, "stat", &stat)?, false);
    tree.fresh()?;
    note("ior-hard-read", tree.ior_hard(Direction::Read)?, true);
    tree.fresh()?;
    note(
        "mdtest-hard-stat",
        tree.mdtest(hard, "stat", &stat_hard)?,
        false,
    );
    tree.fresh()?;
    note(
        "mdtest-easy-delete",
        tree.mdtest(easy, "delete", &delete)?,
        false,
    );
    tree.fresh()?;
    note(
        "mdtest-hard-read",
        tree.mdtest(hard, "read", &read_hard)?,
        false,
    );
    tree.fresh()?;
    note(
        "mdtest-hard-delete",
        tree.mdtest(hard, "delete", &delete)?,
        false,
    );
    std::fs::remove_dir_all(&tree.top).with_context(|| format!("remove {}", tree.top.display()))?;

    let of_unit = |unit: &str| -> Vec<f64> {
        phases
            .iter()
            .filter(|phase| phase.unit == unit)
            .map(|phase| phase.value)
            .collect()
    };
    let bandwidth_score = geometric_mean(&of_unit("GiB/s"));
    let metadata_score = geometric_mean(&of_unit("kIOPS"));
    Ok(Io500Result {
        score: (bandwidth_score * metadata_score).sqrt(),
        bandwidth_score,
        metadata_score,
        phases,
    })
}

/// Whether an ior phase writes or reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Write,
    Read,
}

/// mdtest's two shapes.
#[derive(Clone, Copy)]
enum Mdtest {
    Easy,
    Hard,
}

/// An mdtest operation on file `index` of `thread` at a path.
type FileOp = dyn Fn(&Path, usize, usize) -> Result<()> + Sync;

fn create(path: &Path, _: usize, _: usize) -> Result<()> {
    std::fs::File::create(path)?;
    Ok(())
}

fn stat(path: &Path, _: usize, _: usize) -> Result<()> {
    std::fs::metadata(path)?;
    Ok(())
}

fn delete(path: &Path, _: usize, _: usize) -> Result<()> {
    Ok(std::fs::remove_file(path)?)
}

fn write_hard(path: &Path, thread: usize, index: usize) -> Result<()> {
    Ok(std::fs::write(path, hard_data(thread, index))?)
}

fn stat_hard(path: &Path, _: usize, _: usize) -> Result<()> {
    let size = std::fs::metadata(path)?.len();
    ensure!(size == MDTEST_HARD_FILE_BYTES as u64, "it has {size} bytes");
    Ok(())
}

fn read_hard(path: &Path, thread: usize, index: usize) -> Result<()> {
    ensure!(
        std::fs::read(path)? == hard_data(thread, index),
        "it does not hold what was written"
    );
    Ok(())
}

/// What file `index` of `thread` holds in mdtest-hard.
fn hard_data(thread: usize, index: usize) -> Vec<u8> {
    let mut data = vec![0u8; MDTEST_HARD_FILE_BYTES];
    fill(&mut data, (thread as u64) << 32 | index as u64, 0);
    data
}

/// The tree of one run, and the phases that work in it.
struct Tree<'a> {
    config: &'a Io500Config,
    top: PathBuf,
    easy_dir: PathBuf,
    hard_file: PathBuf,
    md_easy: PathBuf,
    md_hard: PathBuf,
}

impl<'a> Tree<'a> {
    /// Makes the directories of a run under `top`, and ior-hard's shared file.
    fn made(top: PathBuf, config: &'a Io500Config) -> Result<Tree<'a>> {
        let tree = Tree {
            config,
            easy_dir: top.join("ior-easy"),
            hard_file: top.join("ior-hard").join("file"),
            md_easy: top.join("mdtest-easy"),
            md_hard: top.join("mdtest-hard"),
            top,
        };
        let hard_dir = tree.top.join("ior-hard");
        for dir in [&tree.easy_dir, &tree.md_easy, &tree.md_hard, &hard_dir] {
            std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        }
        for thread in 0..config.threads {
            let dir = tree.md_easy.join(format!("t{thread}"));
            std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        }
        std::fs::File::create(&tree.hard_file)
            .with_context(|| format!("create {}", tree.hard_file.display()))?;
        Ok(tree)
    }

    /// Empties the kernel's caches when the run asks for it.
    fn fresh(&self) -> Result<()> {
        if self.config.drop_caches {
            drop_caches()?;
        }
        Ok(())
    }

    /// ior-easy: each thread's own file, in 1 MiB transfers, fsynced after writing.
    fn ior_easy(&self, direction: Direction) -> Result<(f64, u64)> {
        let phase = match direction {
            Direction::Write => "ior-easy-write",
            Direction::Read => "ior-easy-read",
        };
        let transfers = self.config.easy_bytes_per_thread / IOR_EASY_TRANSFER_BYTES as u64;
        timed(self.config.threads, &|thread| {
            let path = self.easy_dir.join(format!("file.{thread}"));
            let file = match direction {
                Direction::Write => std::fs::File::create(&path),
                Direction::Read => std::fs::File::open(&path),
            }
            .with_context(|| format!("{phase}: open {}", path.display()))?;
            let mut block = vec![0u8; IOR_EASY_TRANSFER_BYTES];
            for transfer in 0..transfers {
                let offset = transfer * IOR_EASY_TRANSFER_BYTES as u64;
                if direction == Direction::Write {
                    fill(&mut block, thread as u64, offset);
                    file.write_all_at(&block, offset).context(phase)?;
                } else {
                    file.read_exact_at(&mut block, offset).context(phase)?;
                    check(&block, thread as u64, offset).context(phase)?;
                }
            }
            if direction == Direction::Write {
                file.sync_all().with_context(|| format!("{phase}: fsync"))?;
            }
            Ok(transfers * IOR_EASY_TRANSFER_BYTES as u64)
        })
    }

    /// ior-hard: the shared file's interleaved records, fsynced after writing.
    fn ior_hard(&self, direction: Direction) -> Result<(f64, u64)> {
        let phase = match direction {
            Direction::Write => "ior-hard-write",
            Direction::Read => "ior-hard-read",
        };
        let (threads, records) = (self.config.threads, self.config.hard_records_per_thread);
        timed(threads, &|thread| {
            let file = std::fs::OpenOptions::new()
                .read(direction == Direction::Read)
                .write(direction == Direction::Write)
                .open(&self.hard_file)
                .with_context(|| format!("{phase}: open"))?;
            let mut record = vec![0u8; IOR_HARD_RECORD_BYTES];
            for index in 0..records {
                let offset =
                    (index * threads as u64 + thread as u64) * IOR_HARD_RECORD_BYTES as u64;
                if direction == Direction::Write {
                    fill(&mut record, u64::MAX, offset);
                    file.write_all_at(&record, offset).context(phase)?;
                } else {
                    file.read_exact_at(&mut record, offset).context(phase)?;
                    check_all(&record, u64::MAX, offset).context(phase)?;
                }
            }
            if direction == Direction::Write {
                file.sync_all().with_context(|| format!("{phase}: fsync"))?;
            }
            Ok(records * IOR_HARD_RECORD_BYTES as u64)
        })
    }

    /// An mdtest phase of `shape`: `op` on each of its files.
    fn mdtest(&self, shape: Mdtest, phase: &str, op: &FileOp) -> Result<(f64, u64)> {
        let threads = self.config.threads;
        match shape {
            Mdtest::Easy => each_file(
                threads,
                self.config.easy_files_per_thread,
                &|thread, index| {
                    self.md_easy
                        .join(format!("t{thread}"))
                        .join(file_name(thread, index))
                },
                op,
            ),
            Mdtest::Hard => each_file(
                threads,
                self.config.hard_files_per_thread,
                &|thread, index| self.md_hard.join(file_name(thread, index)),
                op,
            ),
        }
        .with_context(|| match shape {
            Mdtest::Easy => format!("mdtest-easy-{phase}"),
            Mdtest::Hard => format!("mdtest-hard-{phase}"),
        })
    }

    /// find: a walk of the whole tree, which must count every mdtest-hard file.
    fn find(&self) -> Result<(f64, u64)> {
        let started = Instant::now();
        let (examined, found) = walk(&self.top)?;
        let seconds = started.elapsed().as_secs_f64();
        let expected = (self.config.threads * self.config.hard_files_per_thread) as u64;
        ensure!(
            found == expected,
            "find counted {found} files of {MDTEST_HARD_FILE_BYTES} bytes, mdtest-hard made {expected}"
        );
        Ok((seconds, examined))
    }
}

/// Checks every byte of `block` (an ior-hard record is not page-aligned, so [`check`]'s
/// page sampling would miss most of it).
fn check_all(block: &[u8], seed: u64, offset: u64) -> Result<()> {
    let mut expected = vec![0u8; block.len()];
    fill(&mut expected, seed, offset);
    ensure!(
        block == expected.as_slice(),
        "data at offset {offset} is not what was written there"
    );
    Ok(())
}

/// Walks `top` as `find -size 3901c` does: every entry is stat'ed. Answers the entries
/// examined and the files of mdtest-hard's size.
fn walk(top: &Path) -> Result<(u64, u64)> {
    let mut pending: Vec<PathBuf> = vec![top.to_path_buf()];
    let (mut examined, mut matching) = (0, 0);
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("find: {}", dir.display()))? {
            let path = entry.context("find")?.path();
            let metadata = std::fs::symlink_metadata(&path)
                .with_context(|| format!("find: {}", path.display()))?;
            examined += 1;
            if metadata.is_dir() {
                pending.push(path);
            } else if metadata.len() == MDTEST_HARD_FILE_BYTES as u64 {
                matching += 1;
            }
        }
    }
    Ok((examined, matching))
}

/// Prints the phases and the scores as a table.
pub fn print(label: &str, result: &Io500Result) {
    println!("{label}");
    for phase in &result.phases {
        println!(
            "  {:<20} {:>12.4} {:<6} ({:.2} s)",
            phase.name, phase.value, phase.unit, phase.seconds
        );
    }
    println!(
        "  score {:.4} (bandwidth {:.4} GiB/s, metadata {:.4} kIOPS)",
        result.score, result.bandwidth_score, result.metadata_score
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the twelve phases run in IO500's order on a local directory, every read checks
    // out, find counts every mdtest-hard file, and the score is IO500's formula of them.
    #[test]
    fn a_small_run_on_a_local_directory() {
        let directory = tempfile::tempdir().expect("tempdir");
        let config = Io500Config {
            threads: 3,
            easy_bytes_per_thread: 2 << 20,
            hard_records_per_thread: 20,
            easy_files_per_thread: 30,
            hard_files_per_thread: 30,
            drop_caches: false,
        };
        let result = run(directory.path(), &config, "io500").expect("run");
        let names: Vec<&str> = result.phases.iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "ior-easy-write",
                "mdtest-easy-write",
                "ior-hard-write",
                "mdtest-hard-write",
                "find",
                "ior-easy-read",
                "mdtest-easy-stat",
                "ior-hard-read",
                "mdtest-hard-stat",
                "mdtest-easy-delete",
                "mdtest-hard-read",
                "mdtest-hard-delete",
            ]
        );
        let bandwidth: Vec<f64> = result
            .phases
            .iter()
            .filter(|p| p.unit == "GiB/s")
            .map(|p| p.value)
            .collect();
        assert_eq!(bandwidth.len(), 4);
        let expected = bandwidth.iter().product::<f64>().powf(0.25);
        assert!((result.bandwidth_score - expected).abs() <= expected * 1e-9);
        assert!(
            (result.score - (result.bandwidth_score * result.metadata_score).sqrt()).abs()
                <= result.score * 1e-9
        );
        assert!(
            !directory.path().join("io500").exists(),
            "the run cleans up"
        );
    }

    // Goal: the geometric mean is IO500's: the n-th root of the product.
    #[test]
    fn the_geometric_mean() {
        assert!((geometric_mean(&[1.0, 4.0, 16.0]) - 4.0).abs() < 1e-12);
        assert_eq!(geometric_mean(&[]), 0.0);
    }
}
