//! An mdtest-like metadata benchmark. Each thread works in its own directory (or all in one
//! shared directory) through six timed phases: mkdir of a small tree, create (with a small
//! write), stat, read, unlink, rmdir. Phases start together behind a barrier; the rate of a
//! phase is all threads' operations over the wall time of the slowest.

use crate::cpu::CpuSample;
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use weft_proto::InodeId;

/// What the benchmark runs against: a POSIX directory or the native client.
pub trait MetaTarget: Sync {
    /// A directory handle.
    type Dir: Clone + Send + Sync;
    /// The directory the benchmark works under.
    fn base(&self) -> Self::Dir;
    /// Makes a directory.
    fn mkdir(&self, parent: &Self::Dir, name: &str) -> Result<Self::Dir>;
    /// Opens an existing directory.
    fn dir(&self, parent: &Self::Dir, name: &str) -> Result<Self::Dir>;
    /// Removes an empty directory.
    fn rmdir(&self, parent: &Self::Dir, name: &str) -> Result<()>;
    /// Creates a file holding `data`.
    fn create(&self, dir: &Self::Dir, name: &str, data: &[u8]) -> Result<()>;
    /// Reads a file's attributes.
    fn stat(&self, dir: &Self::Dir, name: &str) -> Result<()>;
    /// Reads a file whole.
    fn read(&self, dir: &Self::Dir, name: &str) -> Result<usize>;
    /// Removes a file.
    fn unlink(&self, dir: &Self::Dir, name: &str) -> Result<()>;
}

/// Parameters of a run.
#[derive(Clone, Debug, Serialize)]
pub struct MetaBenchConfig {
    /// Files each thread creates, stats, reads and removes.
    pub files_per_thread: usize,
    /// Directories each thread makes and removes.
    pub dirs_per_thread: usize,
    /// Bytes written into each file.
    pub file_bytes: usize,
    /// All threads in one shared directory instead of one each.
    pub shared_dir: bool,
}

/// One phase at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    /// mkdir, create, stat, read, unlink or rmdir.
    pub phase: &'static str,
    /// Threads.
    pub threads: usize,
    /// Operations done.
    pub operations: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_second: f64,
    /// Percent of the machine's CPUs busy during the phase.
    pub cpu_busy_percent: f64,
}

type Step<'a, T> = &'a (dyn Fn(&T, &<T as MetaTarget>::Dir, usize, usize) -> Result<()> + Sync);

/// Runs one phase on `threads` threads; `step(target, dir, thread, index)` is one operation.
fn phase<T: MetaTarget>(
    target: &T,
    name: &'static str,
    dirs: &[T::Dir],
    per_thread: usize,
    step: Step<'_, T>,
) -> Result<PhaseResult> {
    let threads = dirs.len();
    let barrier = Arc::new(Barrier::new(threads + 1));
    let (cpu, started, outcome) = std::thread::scope(|scope| {
        let workers: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(thread, dir)| {
                let barrier = Arc::clone(&barrier);
                scope.spawn(move || -> Result<()> {
                    barrier.wait();
                    for index in 0..per_thread {
                        step(target, dir, thread, index)
                            .with_context(|| format!("{name} #{index} of thread {thread}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        let cpu = CpuSample::now();
        let started = Instant::now();
        barrier.wait();
        let outcome: Result<()> = workers
            .into_iter()
            .try_for_each(|w| w.join().expect("benchmark thread panicked"));
        (cpu, started, outcome)
    });
    outcome?;
    let seconds = started.elapsed().as_secs_f64();
    let operations = (threads * per_thread) as u64;
    Ok(PhaseResult {
        phase: name,
        threads,
        operations,
        seconds,
        ops_per_second: operations as f64 / seconds.max(1e-9),
        cpu_busy_percent: CpuSample::now().busy_percent_since(&cpu),
    })
}

fn file_name(thread: usize, index: usize) -> String {
    format!("f{thread}.{index}")
}

/// Runs the six phases with `threads` threads under a fresh directory named `run`.
///
/// # Errors
/// The first operation that failed, with its phase and thread.
pub fn run<T: MetaTarget>(
    target: &T,
    config: &MetaBenchConfig,
    threads: usize,
    run: &str,
) -> Result<Vec<PhaseResult>> {
    let base = target.base();
    let top = target.mkdir(&base, run)?;
    let shared = if config.shared_dir {
        Some(target.mkdir(&top, "shared")?)
    } else {
        None
    };
    let own: Vec<T::Dir> = (0..threads)
        .map(|t| target.mkdir(&top, &format!("t{t}")))
        .collect::<Result<_>>()?;
    let work: Vec<T::Dir> = match &shared {
        Some(dir) => vec![dir.clone(); threads],
        None => own.clone(),
    };
    let data = vec![0x5a_u8; config.file_bytes];
    let mut results = Vec::new();
    results.push(phase(
        target,
        "mkdir",
        &own,
        config.dirs_per_thread,
        &|t: &T, dir, _, i| t.mkdir(dir, &format!("d{i}")).map(|_| ()),
    )?);
    results.push(phase(
        target,
        "create",
        &work,
        config.files_per_thread,
        &|t: &T, dir, th, i| t.create(dir, &file_name(th, i), &data),
    )?);
    results.push(phase(
        target,
        "stat",
        &work,
        config.files_per_thread,
        &|t: &T, dir, th, i| t.stat(dir, &file_name(th, i)),
    )?);
    results.push(phase(
        target,
        "read",
        &work,
        config.files_per_thread,
        &|t: &T, dir, th, i| {
            let read = t.read(dir, &file_name(th, i))?;
            anyhow::ensure!(
                read == data.len(),
                "read {read} bytes, wrote {}",
                data.len()
            );
            Ok(())
        },
    )?);
    results.push(phase(
        target,
        "unlink",
        &work,
        config.files_per_thread,
        &|t: &T, dir, th, i| t.unlink(dir, &file_name(th, i)),
    )?);
    results.push(phase(
        target,
        "rmdir",
        &own,
        config.dirs_per_thread,
        &|t: &T, dir, _, i| t.rmdir(dir, &format!("d{i}")),
    )?);
    if shared.is_some() {
        target.rmdir(&top, "shared")?;
    }
    for t in 0..threads {
        target.rmdir(&top, &format!("t{t}"))?;
    }
    target.rmdir(&base, run)?;
    Ok(results)
}

/// A POSIX directory: a Weft mount, a local file system, a passthrough.
pub struct PosixTarget {
    /// Where the benchmark works.
    pub base: PathBuf,
}

impl MetaTarget for PosixTarget {
    type Dir = PathBuf;

    fn base(&self) -> PathBuf {
        self.base.clone()
    }

    fn mkdir(&self, parent: &PathBuf, name: &str) -> Result<PathBuf> {
        let path = parent.join(name);
        std::fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(path)
    }

    fn dir(&self, parent: &PathBuf, name: &str) -> Result<PathBuf> {
        Ok(parent.join(name))
    }

    fn rmdir(&self, parent: &PathBuf, name: &str) -> Result<()> {
        Ok(std::fs::remove_dir(parent.join(name))?)
    }

    fn create(&self, dir: &PathBuf, name: &str, data: &[u8]) -> Result<()> {
        Ok(std::fs::write(dir.join(name), data)?)
    }

    fn stat(&self, dir: &PathBuf, name: &str) -> Result<()> {
        std::fs::metadata(dir.join(name))?;
        Ok(())
    }

    fn read(&self, dir: &PathBuf, name: &str) -> Result<usize> {
        Ok(std::fs::read(dir.join(name))?.len())
    }

    fn unlink(&self, dir: &PathBuf, name: &str) -> Result<()> {
        Ok(std::fs::remove_file(dir.join(name))?)
    }
}

/// The native client library, without FUSE: each operation is a call on a
/// [`weft_client::Client`], run on
/// a shared tokio runtime from the benchmark threads.
pub struct NativeTarget {
    /// The client.
    pub client: Arc<weft_client::Client>,
    /// The runtime the client's connections live on.
    pub runtime: tokio::runtime::Handle,
    /// The directory the benchmark works under.
    pub base: weft_proto::InodeId,
}

impl NativeTarget {
    fn block<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

impl MetaTarget for NativeTarget {
    type Dir = InodeId;

    fn base(&self) -> InodeId {
        self.base
    }

    fn mkdir(&self, parent: &InodeId, name: &str) -> Result<InodeId> {
        Ok(self
            .block(self.client.mkdir(*parent, name, 0o755, 0o022, (0, 0)))?
            .inode)
    }

    fn dir(&self, parent: &InodeId, name: &str) -> Result<InodeId> {
        Ok(self.block(self.client.lookup(*parent, name))?.inode)
    }

    fn rmdir(&self, parent: &InodeId, name: &str) -> Result<()> {
        self.block(self.client.rmdir(*parent, name))?;
        Ok(())
    }

    fn create(&self, dir: &InodeId, name: &str, data: &[u8]) -> Result<()> {
        self.block(async {
            let new = crate::new_file();
            if data.is_empty() {
                // An empty file is made by its create alone (mdtest's default, `-w 0`).
                self.client.create(*dir, name, new).await?;
                return Ok(());
            }
            let (file, _) = self.client.create_file((*dir, name), new).await?;
            let written = file.write(0, bytes::Bytes::copy_from_slice(data)).await;
            let flushed = match written {
                Ok(()) => file.flush().await,
                Err(error) => Err(error),
            };
            file.close().await?;
            Ok(flushed?)
        })
    }

    fn stat(&self, dir: &InodeId, name: &str) -> Result<()> {
        self.block(self.client.lookup(*dir, name))?;
        Ok(())
    }

    fn read(&self, dir: &InodeId, name: &str) -> Result<usize> {
        self.block(async {
            let attr = self.client.lookup(*dir, name).await?;
            let file = self
                .client
                .open_file(attr.inode, weft_proto::access::READ)
                .await?;
            let read = file.read(0, attr.size).await;
            file.close().await?;
            Ok(read?.len())
        })
    }

    fn unlink(&self, dir: &InodeId, name: &str) -> Result<()> {
        self.block(self.client.unlink(*dir, name))?;
        Ok(())
    }
}

/// Prints results as a table.
pub fn print_table(label: &str, results: &[PhaseResult]) {
    println!(
        "{:<16} {:>7} {:>8} {:>10} {:>12} {:>6}",
        "target", "threads", "phase", "ops", "ops/s", "cpu%"
    );
    for r in results {
        println!(
            "{label:<16} {:>7} {:>8} {:>10} {:>12.0} {:>6.0}",
            r.threads, r.phase, r.operations, r.ops_per_second, r.cpu_busy_percent
        );
    }
}
