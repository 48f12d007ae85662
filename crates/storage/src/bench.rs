//! StorageBench: a storage server measures its own targets — sequential writes of new files,
//! or reads of them, with a block size and threads per target — with no client and no network
//! in the way (like `beegfs-ctl --storagebench`). A run goes on in the background; status,
//! stop and cleanup are requests of their own. Files live in `<target>/bench/`, apart from the
//! objects, and the writes end with fsync so the numbers are the disk's.
//!
//! NetBench, which measures the network and the protocol alone, is answered here too
//! ([`serve`]): the storage server's request path serves files only.

use crate::target::Target;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weft_proto::error::WireError;
use weft_proto::messages::{StorageBenchOp, StorageBenchStatus, TargetBenchResult, IO_BYTES_MAX};
use weft_proto::{ErrorCode, TargetId};

/// One target's progress.
struct TargetRun {
    target: TargetId,
    bytes: AtomicU64,
    threads_left: AtomicU64,
    finished_micros: AtomicU64,
    error: Mutex<Option<String>>,
}

/// A run, current or last.
struct Run {
    read: bool,
    /// Bytes per request.
    block_bytes: u32,
    /// Bytes each thread writes or reads.
    bytes_per_thread: u64,
    started: Instant,
    stop: AtomicBool,
    targets: Vec<Arc<TargetRun>>,
}

/// A storage server's StorageBench state.
#[derive(Default)]
pub(crate) struct StorageBench {
    run: Mutex<Option<Arc<Run>>>,
}

fn bench_dir(target: &Target) -> PathBuf {
    target.root().join("bench")
}

fn rejected(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

/// Starts thread `thread` of `run` on `target`, which records its progress and its first
/// error, and the run's time when it is the target's last to finish.
fn spawn_thread(
    target: Arc<Target>,
    progress: Arc<TargetRun>,
    run: Arc<Run>,
    thread: u16,
) -> Result<(), WireError> {
    std::thread::Builder::new()
        .name(format!("weft-bench-{}-{thread}", target.id))
        .spawn(move || {
            let outcome = bench_thread(&target, &run, &progress, thread);
            if let Err(error) = outcome {
                progress
                    .error
                    .lock()
                    .expect("bench error poisoned")
                    .get_or_insert(error);
            }
            if progress.threads_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                progress
                    .finished_micros
                    .store(run.started.elapsed().as_micros() as u64, Ordering::Release);
            }
        })
        .map(drop)
        .map_err(|e| rejected(ErrorCode::Internal, e.to_string()))
}

impl StorageBench {
    /// Serves one request about the bench on `targets` (this server's).
    pub fn handle(
        &self,
        op: StorageBenchOp,
        targets: &[Arc<Target>],
    ) -> Result<StorageBenchStatus, WireError> {
        match op {
            StorageBenchOp::Start {
                targets: chosen,
                read,
                block_bytes,
                bytes_per_thread,
                threads,
            } => {
                let chosen: Vec<Arc<Target>> = targets
                    .iter()
                    .filter(|t| chosen.is_empty() || chosen.contains(&t.id))
                    .cloned()
                    .collect();
                let shape = (read, block_bytes, bytes_per_thread);
                self.start(&chosen, shape, threads)
            }
            StorageBenchOp::Status => Ok(self.status()),
            StorageBenchOp::Stop => {
                if let Some(run) = self.run.lock().expect("bench state poisoned").as_ref() {
                    run.stop.store(true, Ordering::Release);
                }
                Ok(self.status())
            }
            StorageBenchOp::Cleanup => self.cleanup(targets),
        }
    }

    /// Starts a run on `chosen` targets, `threads` per target, each reading (or writing)
    /// `bytes_per_thread` bytes in blocks of `block_bytes`; refused while one runs.
    fn start(
        &self,
        chosen: &[Arc<Target>],
        (read, block_bytes, bytes_per_thread): (bool, u32, u64),
        threads: u16,
    ) -> Result<StorageBenchStatus, WireError> {
        if block_bytes == 0 || block_bytes > IO_BYTES_MAX || threads == 0 {
            return Err(rejected(
                ErrorCode::InvalidArgument,
                format!(
                    "the block size must be 1 byte to {IO_BYTES_MAX} bytes and threads at least 1"
                ),
            ));
        }
        if chosen.is_empty() {
            return Err(rejected(
                ErrorCode::UnknownTarget,
                "this server holds none of the named targets",
            ));
        }
        let mut slot = self.run.lock().expect("bench state poisoned");
        if slot.as_ref().is_some_and(|run| !run.finished()) {
            return Err(rejected(
                ErrorCode::Busy,
                "a StorageBench run is going on: wait for it or stop it",
            ));
        }
        let run = Arc::new(Run {
            read,
            block_bytes,
            bytes_per_thread,
            started: Instant::now(),
            stop: AtomicBool::new(false),
            targets: chosen
                .iter()
                .map(|t| {
                    Arc::new(TargetRun {
                        target: t.id,
                        bytes: AtomicU64::new(0),
                        threads_left: AtomicU64::new(u64::from(threads)),
                        finished_micros: AtomicU64::new(0),
                        error: Mutex::new(None),
                    })
                })
                .collect(),
        });
        for (target, progress) in chosen.iter().zip(&run.targets) {
            for thread in 0..threads {
                spawn_thread(
                    Arc::clone(target),
                    Arc::clone(progress),
                    Arc::clone(&run),
                    thread,
                )?;
            }
        }
        *slot = Some(Arc::clone(&run));
        Ok(run.status())
    }

    /// Removes the bench's files from `targets`; refused while a run goes on.
    fn cleanup(&self, targets: &[Arc<Target>]) -> Result<StorageBenchStatus, WireError> {
        let slot = self.run.lock().expect("bench state poisoned");
        if slot.as_ref().is_some_and(|run| !run.finished()) {
            return Err(rejected(
                ErrorCode::Busy,
                "a StorageBench run is going on: stop it first",
            ));
        }
        for target in targets {
            match fs::remove_dir_all(bench_dir(target)) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(rejected(
                        ErrorCode::Io,
                        format!("cannot remove the bench files of {}: {error}", target.id),
                    ))
                }
            }
        }
        drop(slot);
        Ok(self.status())
    }

    fn status(&self) -> StorageBenchStatus {
        match self.run.lock().expect("bench state poisoned").as_ref() {
            Some(run) => run.status(),
            None => StorageBenchStatus {
                running: false,
                read: false,
                targets: Vec::new(),
            },
        }
    }
}

impl Run {
    fn finished(&self) -> bool {
        self.targets
            .iter()
            .all(|t| t.threads_left.load(Ordering::Acquire) == 0)
    }

    fn status(&self) -> StorageBenchStatus {
        let now = self.started.elapsed().as_micros() as u64;
        StorageBenchStatus {
            running: !self.finished(),
            read: self.read,
            targets: self
                .targets
                .iter()
                .map(|t| {
                    let finished = t.threads_left.load(Ordering::Acquire) == 0;
                    TargetBenchResult {
                        target: t.target,
                        bytes: t.bytes.load(Ordering::Acquire),
                        elapsed_micros: if finished {
                            t.finished_micros.load(Ordering::Acquire)
                        } else {
                            now
                        },
                        finished,
                        error: t.error.lock().expect("bench error poisoned").clone(),
                    }
                })
                .collect(),
        }
    }
}

/// [`bench_thread`] on a direct-I/O target: the same file, read and written with O_DIRECT from
/// an aligned buffer, as the target's objects are.
fn direct_thread(run: &Run, progress: &TargetRun, path: &std::path::Path) -> Result<(), String> {
    use crate::direct;
    if run.read && !path.exists() {
        return Err(format!(
            "cannot open {} (run a write first)",
            path.display()
        ));
    }
    if !run.read {
        let _ = fs::remove_file(path);
    }
    let file = direct::open(path, !run.read)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut buffer = weft_net::buffer::HugeBuf::zeroed(run.block_bytes as usize)
        .map_err(|e| format!("cannot map a buffer: {e}"))?;
    buffer.as_mut_slice().fill(0x5a);
    let length = file.metadata().map_err(|e| format!("stat: {e}"))?.len();
    let read = run.read;
    transfer(run, progress, &file, |offset, len| {
        let aligned = direct::is_aligned(offset, len);
        match (read, aligned) {
            (true, true) => file.read_at(&mut buffer.as_mut_slice()[..len], offset),
            (true, false) => {
                direct::read_at(&file, offset, &mut buffer.as_mut_slice()[..len], length)
            }
            (false, true) => file
                .write_all_at(&buffer.as_slice()[..len], offset)
                .map(|()| len),
            (false, false) => {
                direct::write_at(&file, offset, &buffer.as_slice()[..len], offset).map(|()| len)
            }
        }
    })
}

/// Moves `bytes_per_thread` in blocks with `io(offset, len)` (which answers the bytes moved),
/// counting progress and stopping when asked; a write run ends with fsync.
fn transfer(
    run: &Run,
    progress: &TargetRun,
    file: &File,
    mut io: impl FnMut(u64, usize) -> std::io::Result<usize>,
) -> Result<(), String> {
    let (block_bytes, bytes_per_thread) = (run.block_bytes, run.bytes_per_thread);
    let what = if run.read { "read" } else { "write" };
    let mut offset = 0u64;
    while offset < bytes_per_thread && !run.stop.load(Ordering::Acquire) {
        let len = (bytes_per_thread - offset).min(u64::from(block_bytes)) as usize;
        let moved = io(offset, len).map_err(|e| format!("{what}: {e}"))?;
        if moved == 0 {
            break;
        }
        offset += moved as u64;
        progress.bytes.fetch_add(moved as u64, Ordering::AcqRel);
    }
    if !run.read {
        file.sync_all().map_err(|e| format!("fsync: {e}"))?;
    }
    Ok(())
}

/// One thread of one target: writes (then fsyncs) or reads its file.
fn bench_thread(
    target: &Target,
    run: &Run,
    progress: &TargetRun,
    thread: u16,
) -> Result<(), String> {
    let dir = bench_dir(target);
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(format!("thread-{thread}"));
    if target.is_direct() {
        return direct_thread(run, progress, &path);
    }
    let file: File = if run.read {
        File::open(&path)
            .map_err(|e| format!("cannot open {} (run a write first): {e}", path.display()))?
    } else {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?
    };
    if run.read {
        // Measure the disk, not the page cache the write run left (its pages are clean after
        // that run's fsync, so the kernel can drop them).
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise on a descriptor this function holds open.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let mut buffer = vec![0x5a_u8; run.block_bytes as usize];
    let read = run.read;
    transfer(run, progress, &file, |offset, len| {
        if read {
            file.read_at(&mut buffer[..len], offset)
        } else {
            file.write_all_at(&buffer[..len], offset).map(|()| len)
        }
    })
}

/// Answers the requests that measure the server rather than serve files: StorageBench (its
/// targets' disks, `bench`) and NetBench (the network and the protocol alone, no disk: a
/// write of `payload_len` bytes is taken, a read answered with zeros). `None` for every
/// other request.
pub(crate) async fn serve(
    bench: &Arc<StorageBench>,
    request: &weft_proto::messages::StorageRequest,
    payload_len: usize,
    targets: &std::collections::HashMap<TargetId, Arc<Target>>,
) -> Option<(
    weft_proto::messages::Reply<weft_proto::messages::StorageResponse>,
    bytes::Bytes,
)> {
    use weft_proto::messages::{StorageRequest, StorageResponse};
    let answer = match *request {
        StorageRequest::Bench { ref op } => {
            let (bench, op) = (Arc::clone(bench), op.clone());
            let mut targets: Vec<Arc<Target>> = targets.values().cloned().collect();
            targets.sort_by_key(|t| t.id);
            match tokio::task::spawn_blocking(move || bench.handle(op, &targets)).await {
                Ok(Ok(status)) => Ok((StorageResponse::StorageBench(status), bytes::Bytes::new())),
                Ok(Err(error)) => Err(error),
                Err(join) => Err(rejected(
                    ErrorCode::Internal,
                    format!("storage bench failed: {join}"),
                )),
            }
        }
        StorageRequest::NetBench { target, .. } if !targets.contains_key(&target) => {
            Err(crate::target::unknown(target))
        }
        StorageRequest::NetBench { read_len, .. } => match read_len {
            0 => Ok((
                StorageResponse::Written {
                    len: payload_len as u32,
                    verifier: 0,
                },
                bytes::Bytes::new(),
            )),
            len if len <= IO_BYTES_MAX => Ok((
                StorageResponse::Data,
                weft_proto::messages::zeros(len as usize),
            )),
            len => Err(rejected(
                ErrorCode::InvalidArgument,
                format!("read of {len} bytes exceeds {IO_BYTES_MAX}"),
            )),
        },
        _ => return None,
    };
    Some(match answer {
        Ok((response, payload)) => (Ok(response), payload),
        Err(error) => (Err(error), bytes::Bytes::new()),
    })
}
