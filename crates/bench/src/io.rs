//! An IOR/IOzone-like data benchmark: sequential write then read, one file per thread (N-N) or
//! one shared file with a region per thread (N-1), then random 4 KiB writes and reads; run
//! through any POSIX directory (buffered or O_DIRECT) or through the native client library.
//!
//! Every block carries a pattern derived from its offset, so the reads check what they get: a
//! benchmark that moved the wrong bytes fast would say so.

use crate::cpu::CpuSample;
use anyhow::{bail, ensure, Context, Result};
use futures::future::BoxFuture;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use weft_proto::messages::Route;
use weft_proto::InodeId;

/// Size of a random I/O.
pub const RANDOM_IO_BYTES: usize = 4096;
/// Alignment O_DIRECT needs of buffers, offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// Where the benchmark's files live and how they are read and written.
pub trait IoTarget: Sync {
    /// An open file.
    type File: Send + Sync;
    /// Creates (or truncates) `name` and opens it for reading and writing.
    fn create(&self, name: &str) -> Result<Self::File>;
    /// Opens `name` for reading and writing.
    fn open(&self, name: &str) -> Result<Self::File>;
    /// Writes `scratch.len()` bytes at `offset`, laid out by `fill` in the buffer the write
    /// goes from: `scratch` (this thread's, aligned for O_DIRECT) or, for a target that takes
    /// its buffers over as an application of its zero-copy API would, one of its own.
    fn write_at(
        &self,
        file: &Self::File,
        offset: u64,
        scratch: &mut [u8],
        fill: &dyn Fn(&mut [u8]),
    ) -> Result<()>;
    /// Reads `buf.len()` bytes at `offset` (fewer only at the end of the file).
    fn read_at(&self, file: &Self::File, offset: u64, buf: &mut [u8]) -> Result<usize>;
    /// Makes the file's data and size durable.
    fn sync(&self, file: &Self::File) -> Result<()>;
    /// Closes the file (for Weft: the size is reported).
    fn close(&self, file: Self::File) -> Result<()>;
    /// Removes `name`.
    fn remove(&self, name: &str) -> Result<()>;
}

/// Parameters of a run.
#[derive(Clone, Debug, Serialize)]
pub struct IoBenchConfig {
    /// Bytes each thread writes and reads sequentially.
    pub bytes_per_thread: u64,
    /// Size of each sequential request.
    pub block_bytes: usize,
    /// One shared file (N-1) instead of a file per thread (N-N).
    pub shared_file: bool,
    /// Random 4 KiB writes, then as many reads, per thread (0: none).
    pub random_ops_per_thread: usize,
    /// Random requests each thread keeps in flight (1: one at a time).
    pub queue_depth: usize,
    /// Check that reads return what was written (off for the network benchmark, whose servers
    /// drop writes and answer reads with zeros).
    pub verify: bool,
}

/// One phase at one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct IoPhaseResult {
    /// write, read, randwrite or randread.
    pub phase: &'static str,
    /// Threads.
    pub threads: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// Requests made.
    pub operations: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Megabytes (10^6 bytes) per second.
    pub mb_per_second: f64,
    /// Requests per second.
    pub iops: f64,
    /// Percent of the machine's CPUs busy during the phase.
    pub cpu_busy_percent: f64,
}

/// Fills `block` with the pattern of the bytes at `offset` of file `seed`: every 8-byte word
/// holds its own file offset mixed with the seed.
pub(crate) fn fill(block: &mut [u8], seed: u64, offset: u64) {
    let mix = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let word = |index: usize| ((offset + index as u64 * 8) ^ mix).to_le_bytes();
    // Whole words as fixed-size stores (the compiler vectorises them); a copy of a length
    // known only at run time would be a call to memcpy per word.
    let (whole, rest) = block.split_at_mut(block.len() / 8 * 8);
    for (index, bytes) in whole.chunks_exact_mut(8).enumerate() {
        bytes.copy_from_slice(&word(index));
    }
    if !rest.is_empty() {
        rest.copy_from_slice(&word(whole.len() / 8)[..rest.len()]);
    }
}

/// Checks the first word of every 4 KiB page of `block` (enough to catch a misplaced or stale
/// page without doubling the CPU work).
pub(crate) fn check(block: &[u8], seed: u64, offset: u64) -> Result<()> {
    let mut expected = [0u8; 8];
    for page in (0..block.len()).step_by(4096) {
        let end = (page + 8).min(block.len());
        fill(&mut expected[..end - page], seed, offset + page as u64);
        ensure!(
            block[page..end] == expected[..end - page],
            "data at offset {} is not what was written there",
            offset + page as u64
        );
    }
    Ok(())
}

/// A buffer of `len` bytes aligned for O_DIRECT.
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_ALIGN);
        Aligned {
            storage,
            start,
            len,
        }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// A small deterministic generator for random offsets (xorshift).
struct Offsets(u64);

impl Offsets {
    fn next(&mut self, blocks: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % blocks.max(1)
    }
}

/// What each thread works on: its file, the offset its region starts at, and the pattern seed.
struct Work<F> {
    file: F,
    base: u64,
    seed: u64,
}

type Step<'a, F> = &'a (dyn Fn(&Work<F>, &mut [u8], usize) -> Result<u64> + Sync);

/// How many requests each thread of a phase makes, of how many bytes, and how many it keeps
/// in flight.
#[derive(Clone, Copy)]
struct Requests {
    count: usize,
    bytes: usize,
    depth: usize,
}

/// Runs `step(work, buffer, index)` for `index` in `0..count` on each thread; `step` returns
/// bytes moved. With `depth` above 1 a thread keeps that many requests in flight: its indices
/// are dealt to `depth` lanes, each a thread of its own with its own buffer.
fn phase<T: IoTarget>(
    name: &'static str,
    works: &[Work<T::File>],
    requests: Requests,
    step: Step<'_, T::File>,
) -> Result<IoPhaseResult> {
    let Requests {
        count,
        bytes: buffer,
        depth,
    } = requests;
    eprintln!("  {name}, {} threads", works.len());
    let barrier = Arc::new(Barrier::new(works.len() + 1));
    let (cpu, started, outcome) = std::thread::scope(|scope| {
        let workers: Vec<_> = works
            .iter()
            .enumerate()
            .map(|(thread, work)| {
                let barrier = Arc::clone(&barrier);
                scope.spawn(move || -> Result<u64> {
                    let lane = |lane: usize, aligned: &mut Aligned| -> Result<u64> {
                        let mut moved = 0;
                        for index in (lane..count).step_by(depth) {
                            moved += step(work, aligned.get(), index)
                                .with_context(|| format!("{name} #{index} of thread {thread}"))?;
                        }
                        Ok(moved)
                    };
                    let mut buffers: Vec<Aligned> =
                        (0..depth).map(|_| Aligned::new(buffer)).collect();
                    barrier.wait();
                    std::thread::scope(|lanes| {
                        let (first, rest) = buffers.split_first_mut().expect("depth is at least 1");
                        let others: Vec<_> = rest
                            .iter_mut()
                            .enumerate()
                            .map(|(index, aligned)| lanes.spawn(move || lane(index + 1, aligned)))
                            .collect();
                        let mut moved = lane(0, first)?;
                        for other in others {
                            moved += other.join().expect("benchmark lane panicked")?;
                        }
                        Ok(moved)
                    })
                })
            })
            .collect();
        let cpu = CpuSample::now();
        let started = Instant::now();
        barrier.wait();
        let outcome: Result<u64> = workers
            .into_iter()
            .map(|w| w.join().expect("benchmark thread panicked"))
            .sum();
        (cpu, started, outcome)
    });
    let bytes = outcome?;
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    let operations = (works.len() * count) as u64;
    Ok(IoPhaseResult {
        phase: name,
        threads: works.len(),
        bytes,
        operations,
        seconds,
        mb_per_second: bytes as f64 / seconds / 1e6,
        iops: operations as f64 / seconds,
        cpu_busy_percent: CpuSample::now().busy_percent_since(&cpu),
    })
}

/// The blocks each thread moves in a sequential phase, once the configuration is checked.
fn blocks_per_thread(config: &IoBenchConfig) -> Result<u64> {
    let block = config.block_bytes;
    if config.queue_depth == 0 {
        bail!("the queue depth must be at least 1");
    }
    if block == 0 || block % DIRECT_ALIGN != 0 {
        bail!("the block size must be a positive multiple of {DIRECT_ALIGN} bytes");
    }
    let blocks = config.bytes_per_thread / block as u64;
    if blocks == 0 {
        bail!("each thread must move at least one block");
    }
    Ok(blocks)
}

/// Each thread's file (made first when `create`) and its region: `names` are the files,
/// one per thread or one shared, in which each thread has `region` bytes.
fn open_works<T: IoTarget>(
    target: &T,
    config: &IoBenchConfig,
    (names, threads, region): (&[String], usize, u64),
    create: bool,
) -> Result<Vec<Work<T::File>>> {
    if create && config.shared_file {
        target.close(target.create(&names[0])?)?;
    }
    (0..threads)
        .map(|thread| {
            let (name, base) = if config.shared_file {
                (&names[0], thread as u64 * region)
            } else {
                (&names[thread], 0)
            };
            let file = if create && !config.shared_file {
                target.create(name)?
            } else {
                target.open(name)?
            };
            // One pattern per file: a shared file's regions share its seed.
            let seed = if config.shared_file { 0 } else { thread as u64 };
            Ok(Work { file, base, seed })
        })
        .collect()
}

/// Runs the phases with `threads` threads on files named after `run`, and removes them.
///
/// # Errors
/// The first request that failed or returned the wrong data, with its phase and thread.
pub fn run<T: IoTarget>(
    target: &T,
    config: &IoBenchConfig,
    threads: usize,
    run: &str,
) -> Result<Vec<IoPhaseResult>> {
    let block = config.block_bytes;
    let blocks = blocks_per_thread(config)?;
    let region = blocks * block as u64;
    let names: Vec<String> = if config.shared_file {
        vec![format!("{run}.shared")]
    } else {
        (0..threads).map(|t| format!("{run}.{t}")).collect()
    };
    let open_all = |create: bool| open_works(target, config, (&names, threads, region), create);
    let close_all = |works: Vec<Work<T::File>>| -> Result<()> {
        works.into_iter().try_for_each(|w| target.close(w.file))
    };
    let mut results = Vec::new();

    let works = open_all(true)?;
    // Without a check there is nothing to fill: the pattern would only cost CPU the measured
    // system needs.
    let verify = config.verify;
    // One request of any phase: the pattern in, or the data out and checked.
    let write_block = |w: &Work<T::File>, buf: &mut [u8], offset: u64| -> Result<u64> {
        let pattern = |block: &mut [u8]| {
            if verify {
                fill(block, w.seed, offset);
            }
        };
        target.write_at(&w.file, offset, buf, &pattern)?;
        Ok(buf.len() as u64)
    };
    let read_block = |w: &Work<T::File>, buf: &mut [u8], offset: u64| -> Result<u64> {
        let read = target.read_at(&w.file, offset, buf)?;
        ensure!(read == buf.len(), "read {read} of {} bytes", buf.len());
        if verify {
            check(buf, w.seed, offset)?;
        }
        Ok(read as u64)
    };
    let write_step = |w: &Work<T::File>, buf: &mut [u8], index: usize| -> Result<u64> {
        let written = write_block(w, buf, w.base + index as u64 * block as u64)?;
        if index as u64 + 1 == blocks {
            // Like fio's end_fsync: the phase ends when the data is durable.
            target.sync(&w.file)?;
        }
        Ok(written)
    };
    let sequential = Requests {
        count: blocks as usize,
        bytes: block,
        depth: 1,
    };
    results.push(phase::<T>("write", &works, sequential, &write_step)?);
    close_all(works)?;

    let works = open_all(false)?;
    let read_step = |w: &Work<T::File>, buf: &mut [u8], index: usize| -> Result<u64> {
        read_block(w, buf, w.base + index as u64 * block as u64)
    };
    results.push(phase::<T>("read", &works, sequential, &read_step)?);

    if config.random_ops_per_thread > 0 {
        let random = Requests {
            count: config.random_ops_per_thread,
            bytes: RANDOM_IO_BYTES,
            depth: config.queue_depth,
        };
        let pages = region / RANDOM_IO_BYTES as u64;
        let random_offset = |w: &Work<T::File>, index: usize| {
            let mut offsets =
                Offsets(0x2545_F491_4F6C_DD1D ^ (w.base + 1) ^ ((index as u64) << 20));
            w.base + offsets.next(pages) * RANDOM_IO_BYTES as u64
        };
        let randwrite = |w: &Work<T::File>, buf: &mut [u8], index: usize| -> Result<u64> {
            write_block(w, buf, random_offset(w, index))
        };
        results.push(phase::<T>("randwrite", &works, random, &randwrite)?);
        let randread = |w: &Work<T::File>, buf: &mut [u8], index: usize| -> Result<u64> {
            read_block(w, buf, random_offset(w, index))
        };
        results.push(phase::<T>("randread", &works, random, &randread)?);
    }
    close_all(works)?;
    for name in &names {
        target.remove(name)?;
    }
    Ok(results)
}

/// Files in a POSIX directory, buffered or with O_DIRECT.
pub struct PosixFiles {
    /// The directory.
    pub dir: PathBuf,
    /// Open with O_DIRECT (bypass the page cache).
    pub direct: bool,
}

impl PosixFiles {
    fn open_with(&self, name: &str, create: bool) -> Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(name);
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .custom_flags(if self.direct { libc::O_DIRECT } else { 0 })
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))
    }
}

impl IoTarget for PosixFiles {
    type File = std::fs::File;

    fn create(&self, name: &str) -> Result<std::fs::File> {
        self.open_with(name, true)
    }

    fn open(&self, name: &str) -> Result<std::fs::File> {
        self.open_with(name, false)
    }

    fn write_at(
        &self,
        file: &std::fs::File,
        offset: u64,
        scratch: &mut [u8],
        fill: &dyn Fn(&mut [u8]),
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        fill(scratch);
        Ok(file.write_all_at(scratch, offset)?)
    }

    fn read_at(&self, file: &std::fs::File, offset: u64, buf: &mut [u8]) -> Result<usize> {
        use std::os::unix::fs::FileExt;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }

    fn sync(&self, file: &std::fs::File) -> Result<()> {
        Ok(file.sync_all()?)
    }

    fn close(&self, file: std::fs::File) -> Result<()> {
        drop(file);
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<()> {
        Ok(std::fs::remove_file(self.dir.join(name))?)
    }
}

/// Files through the native client library, without FUSE.
pub struct NativeFiles {
    /// The client; its configuration sets the write-behind and read-ahead of every file.
    pub client: Arc<weft_client::Client>,
    /// The runtime the client's connections live on.
    pub runtime: tokio::runtime::Handle,
    /// The directory the files go in.
    pub dir: InodeId,
}

/// An open file of [`NativeFiles`].
pub struct NativeFile {
    file: weft_client::OpenFile,
    /// Buffers handed to the file's writes, reused once they have let go of them.
    spare: std::sync::Mutex<Vec<bytes::Bytes>>,
}

/// Buffers a [`NativeFile`] keeps for reuse: more than the write-behind budget holds of
/// 1 MiB blocks.
const SPARE_BUFFERS: usize = 8;

impl NativeFile {
    fn new(file: weft_client::OpenFile) -> NativeFile {
        NativeFile {
            file,
            spare: std::sync::Mutex::default(),
        }
    }

    /// A buffer of `len` bytes: a spare one the writes are done with, or a new one.
    fn buffer(&self, len: usize) -> bytes::BytesMut {
        let mut spare = self.spare.lock().expect("spare buffers poisoned");
        let done = spare
            .iter()
            .position(|data| data.len() == len && data.is_unique());
        done.and_then(|index| spare.swap_remove(index).try_into_mut().ok())
            .unwrap_or_else(|| bytes::BytesMut::zeroed(len))
    }

    /// Keeps a reference to `data` to reuse its buffer once the writes have let go of it.
    fn keep(&self, data: &bytes::Bytes) {
        let mut spare = self.spare.lock().expect("spare buffers poisoned");
        if spare.len() < SPARE_BUFFERS {
            spare.push(data.clone());
        }
    }
}

impl IoTarget for NativeFiles {
    type File = NativeFile;

    fn create(&self, name: &str) -> Result<NativeFile> {
        let new = crate::new_file();
        let (file, _) = self
            .runtime
            .block_on(self.client.create_file((self.dir, name), new))?;
        Ok(NativeFile::new(file))
    }

    fn open(&self, name: &str) -> Result<NativeFile> {
        let file = self.runtime.block_on(async {
            let attr = self.client.lookup(self.dir, name).await?;
            let access = weft_proto::access::READ | weft_proto::access::WRITE;
            self.client.open_file(attr.inode, access).await
        })?;
        Ok(NativeFile::new(file))
    }

    fn write_at(
        &self,
        file: &NativeFile,
        offset: u64,
        scratch: &mut [u8],
        fill: &dyn Fn(&mut [u8]),
    ) -> Result<()> {
        // The file takes the buffer over: no copy of the block on its way out.
        let mut buffer = file.buffer(scratch.len());
        fill(&mut buffer);
        let data = buffer.freeze();
        file.keep(&data);
        Ok(self.runtime.block_on(file.file.write(offset, data))?)
    }

    fn read_at(&self, file: &NativeFile, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let data = self
            .runtime
            .block_on(file.file.read(offset, buf.len() as u64))?;
        Ok(data.copy_to(buf))
    }

    fn sync(&self, file: &NativeFile) -> Result<()> {
        Ok(self.runtime.block_on(file.file.sync())?)
    }

    fn close(&self, file: NativeFile) -> Result<()> {
        self.runtime.block_on(async {
            let flushed = file.file.flush().await;
            file.file.close().await?;
            Ok(flushed?)
        })
    }

    fn remove(&self, name: &str) -> Result<()> {
        self.runtime.block_on(self.client.unlink(self.dir, name))?;
        Ok(())
    }
}

/// The network benchmark's transport (`weft bench net`): every read and write of the native
/// client crosses the network and the protocol to the storage server of its slot, which drops
/// what it is sent and answers zeros, touching no disk (`StorageRequest::NetBench`). The rest
/// of the client path — write-behind, read-ahead, the layout, the retry policy — is the one
/// every client runs. Nothing reaches a disk, so a sync has nothing to do.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetBench;

use weft_proto::answer::{Synced, Written};

impl weft_client::Transport for NetBench {
    fn read(
        &self,
        storage: Arc<weft_net::StorageClient>,
        route: Route,
        piece: weft_client::PieceRead,
    ) -> BoxFuture<'static, Result<bytes::Bytes, weft_net::RpcError>> {
        Box::pin(async move {
            let (_, data) = storage
                .net_bench(route.target, bytes::Bytes::new(), piece.len)
                .await?;
            Ok(data)
        })
    }

    fn write(
        &self,
        storage: Arc<weft_net::StorageClient>,
        route: Route,
        piece: weft_client::PieceWrite,
    ) -> BoxFuture<'static, Result<Written, weft_net::RpcError>> {
        Box::pin(async move {
            let (len, _) = storage.net_bench(route.target, piece.data, 0).await?;
            Ok(Written { len, verifier: 0 })
        })
    }

    fn sync(
        &self,
        _storage: Arc<weft_net::StorageClient>,
        _route: Route,
        _inode: InodeId,
        _capability: Option<weft_proto::access::Capability>,
    ) -> BoxFuture<'static, Result<Synced, weft_net::RpcError>> {
        Box::pin(async { Ok(Synced { verifier: 0 }) })
    }
}

/// Prints results as a table.
pub fn print_table(label: &str, results: &[IoPhaseResult]) {
    println!(
        "{:<16} {:>7} {:>9} {:>12} {:>10} {:>10} {:>6}",
        "target", "threads", "phase", "bytes", "MB/s", "IOPS", "cpu%"
    );
    for r in results {
        println!(
            "{label:<16} {:>7} {:>9} {:>12} {:>10.1} {:>10.0} {:>6.0}",
            r.threads, r.phase, r.bytes, r.mb_per_second, r.iops, r.cpu_busy_percent
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the data check accepts what the pattern wrote and rejects a block from elsewhere.
    #[test]
    fn pattern_check_catches_misplaced_data() {
        let mut block = vec![0u8; 8192];
        fill(&mut block, 3, 65536);
        check(&block, 3, 65536).expect("the same block checks");
        assert!(check(&block, 3, 65536 + 8192).is_err(), "another offset");
        assert!(check(&block, 4, 65536).is_err(), "another file");
        let mut short = [0u8; 13];
        fill(&mut short, 3, 65536);
        assert_eq!(
            short,
            block[..13],
            "a partial word is the start of the whole one"
        );
    }

    // Goal: the aligned buffer really is aligned for O_DIRECT.
    #[test]
    fn aligned_buffers() {
        let mut buffer = Aligned::new(1 << 20);
        assert_eq!(buffer.get().as_ptr() as usize % DIRECT_ALIGN, 0);
        assert_eq!(buffer.get().len(), 1 << 20);
    }
}
