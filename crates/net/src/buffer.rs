//! Buffers for large payloads on huge pages. A direct (O_DIRECT) transfer is one block-layer
//! segment per physically contiguous run of its buffer. Heap pages are scattered, so a large
//! transfer from them is many segments, which a device may split into several requests
//! (virtio-blk takes 254) and a virtual disk serves more slowly; a 2 MiB huge page is one.
//! Measured on this project's machine: StorageBench's 1 MiB O_DIRECT transfers ran at
//! 0.6-0.8x fio's rate from heap buffers and 1.5-2.1x from huge pages.
//!
//! [`take`] hands out a slot of a pooled huge page for a payload that fits; the slot goes back
//! to the pool when the last [`bytes::Bytes`] made from it is dropped.

use bytes::Bytes;
use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Huge pages are this large on x86_64 and aarch64 (4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// A zeroed buffer of its own mapping, backed by transparent huge pages where the kernel gives
/// them (`MADV_HUGEPAGE`; without them it still works, with scattered pages).
pub struct HugeBuf {
    start: NonNull<u8>,
    mapped: usize,
    len: usize,
}

// SAFETY: the mapping is owned by the buffer alone; `&HugeBuf` gives only shared access.
unsafe impl Send for HugeBuf {}
// SAFETY: as above; mutation needs `&mut HugeBuf`.
unsafe impl Sync for HugeBuf {}

impl HugeBuf {
    /// Maps `len` zeroed bytes, rounded up to whole huge pages.
    ///
    /// # Errors
    /// The mapping's error (out of address space or memory).
    pub fn zeroed(len: usize) -> io::Result<HugeBuf> {
        let mapped = len.max(1).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Only advice: the buffer works without huge pages.
        // SAFETY: the range is the mapping just made.
        let _ = unsafe { libc::madvise(address, mapped, libc::MADV_HUGEPAGE) };
        let start = NonNull::new(address.cast::<u8>()).expect("mmap never maps address 0");
        Ok(HugeBuf { start, mapped, len })
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes from `start` are mapped, readable and initialised (mmap zeroes).
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }

    /// The buffer's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.len) }
    }
}

impl Drop for HugeBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, unmapped once; no slice outlives `self`.
        unsafe {
            libc::munmap(self.start.as_ptr().cast(), self.mapped);
        }
    }
}

/// Huge pages carved into slots of this size for payloads (a piece of the default 512 KiB
/// chunk fits one).
pub const SLOT: usize = 512 << 10;

/// Most bytes of huge pages a process maps for slots; past it, payloads use the heap.
const SLOTS_MAPPED_MAX: usize = 256 << 20;

/// Slots carved from huge pages that are mapped once and never unmapped (unmapping would cost
/// every CPU a TLB flush), so the memory is bounded by the most payloads ever in flight, up to
/// [`SLOTS_MAPPED_MAX`].
pub struct Pool {
    free: Mutex<Vec<Slot>>,
    mapped: std::sync::atomic::AtomicUsize,
}

/// One slot: [`SLOT`] bytes of a huge page.
struct Slot(NonNull<u8>);

// SAFETY: a slot is owned by the pool's free list or by one `Pooled` at a time.
unsafe impl Send for Slot {}

/// The process's pool.
static POOL: Pool = Pool::new();

impl Pool {
    const fn new() -> Pool {
        Pool {
            free: Mutex::new(Vec::new()),
            mapped: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// A buffer of `len` bytes (at most [`SLOT`]) on a huge page; `None` when `len` is larger
    /// or the pool is at its limit (the caller uses the heap). Its contents are whatever it
    /// last held: fill all `len` bytes before reading them.
    pub fn take(&'static self, len: usize) -> Option<Pooled> {
        use std::sync::atomic::Ordering;
        if len > SLOT {
            return None;
        }
        let mut free = self.free.lock().expect("buffer pool poisoned");
        if free.is_empty() {
            if self.mapped.load(Ordering::Relaxed) + HUGE_PAGE > SLOTS_MAPPED_MAX {
                return None;
            }
            let mut page = HugeBuf::zeroed(HUGE_PAGE).ok()?;
            let base = page.as_mut_slice().as_mut_ptr();
            // The page stays mapped for the life of the process; its slots are the pool's.
            std::mem::forget(page);
            self.mapped.fetch_add(HUGE_PAGE, Ordering::Relaxed);
            for index in 0..HUGE_PAGE / SLOT {
                // SAFETY: `index * SLOT` is inside the `HUGE_PAGE` bytes just mapped.
                let start = unsafe { base.add(index * SLOT) };
                free.push(Slot(NonNull::new(start).expect("inside a mapping")));
            }
        }
        let slot = free.pop().expect("refilled above");
        Some(Pooled {
            slot: Some(slot),
            len,
            pool: self,
        })
    }
}

/// [`Pool::take`] from the process's pool.
pub fn take(len: usize) -> Option<Pooled> {
    POOL.take(len)
}

/// A pooled buffer: back to its pool when dropped.
pub struct Pooled {
    slot: Option<Slot>,
    len: usize,
    pool: &'static Pool,
}

impl Pooled {
    /// The buffer's bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let start = self.slot.as_ref().expect("held until dropped").0;
        // SAFETY: `len <= SLOT` bytes of a mapped slot this buffer alone holds; `&mut self`
        // makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), self.len) }
    }

    /// The first `len` bytes as `Bytes`, without a copy; the buffer returns to the pool when the
    /// last of them is dropped.
    pub fn freeze(mut self, len: usize) -> Bytes {
        assert!(len <= SLOT, "{len} bytes in a {SLOT}-byte slot");
        self.len = len;
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        let start = self.slot.as_ref().expect("held until dropped").0;
        // SAFETY: as in `as_mut_slice`, shared; the pages were zeroed when mapped, so every
        // byte is initialised.
        unsafe { std::slice::from_raw_parts(start.as_ptr(), self.len) }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool
                .free
                .lock()
                .expect("buffer pool poisoned")
                .push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a huge buffer is zeroed, page-aligned and as long as asked; a pooled one comes
    // back to the pool once its last Bytes is dropped, and serves the next payload.
    #[test]
    fn pooled_buffers_return_when_their_bytes_are_dropped() {
        let buffer = HugeBuf::zeroed(1 << 20).expect("map");
        assert_eq!(buffer.as_slice().len(), 1 << 20);
        assert_eq!(buffer.as_slice().as_ptr() as usize % 4096, 0);
        assert!(buffer.as_slice().iter().all(|b| *b == 0), "zeroed");

        static TEST_POOL: Pool = Pool::new();
        let mut pooled = TEST_POOL.take(1000).expect("fits");
        pooled.as_mut_slice().fill(7);
        let address = pooled.as_ref().as_ptr();
        let bytes = pooled.freeze(600);
        let part = bytes.slice(100..200);
        assert_eq!(bytes.len(), 600);
        drop(bytes);
        assert!(
            part.iter().all(|b| *b == 7),
            "a slice keeps the buffer alive"
        );
        drop(part);
        let again = TEST_POOL.take(4096).expect("fits");
        assert_eq!(
            again.as_ref().as_ptr(),
            address,
            "the freed buffer is reused"
        );
        assert!(
            TEST_POOL.take(SLOT + 1).is_none(),
            "larger payloads use the heap"
        );
        // One huge page serves four slots before another is mapped.
        let mut held = vec![again];
        while held.len() < HUGE_PAGE / SLOT {
            held.push(TEST_POOL.take(SLOT).expect("a slot"));
        }
        let mut starts: Vec<usize> = held.iter().map(|p| p.as_ref().as_ptr() as usize).collect();
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), HUGE_PAGE / SLOT, "distinct slots");
        let mapped = || TEST_POOL.mapped.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(mapped(), HUGE_PAGE);
        held.push(TEST_POOL.take(1).expect("a slot of a new page"));
        assert_eq!(mapped(), 2 * HUGE_PAGE);
    }
}
