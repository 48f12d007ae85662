//! The process's allocator: small blocks from one with per-thread heaps, the rest from the
//! system's.
//!
//! A request's small allocations (frames, rows, replies, tasks, 4 KiB write buffers) are made
//! on one thread and often freed on another. The system's allocator, held to two arenas so
//! that large buffers do not multiply across threads ([`crate::tune_allocator`]), made those
//! threads queue for its arena locks: with sixteen arenas 4 KiB random I/O through the mount
//! ran 1.15-1.24x faster, but a `weft up` under 64 jobs of 1 MiB I/O peaked at 3.4x the
//! memory and kept 2.9x of it after. Blocks below [`SMALL_BYTES_MAX`] therefore come from
//! mimalloc, whose per-thread heaps take no lock, and the larger ones (payloads, read-ahead
//! and write-behind windows) from the system's allocator as tuned, trimmed when the process is
//! idle (`weft_net::memory`): 4 KiB random writes 1.20x and reads 1.31x, for 1.24x the peak
//! memory and 1.49x what stays after the load (docs/benchmarks.md, "Small blocks from
//! per-thread heaps"). With the boundary at 64 KiB, 2.5x stayed after the load.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks smaller than this come from the per-thread heaps.
pub const SMALL_BYTES_MAX: usize = 8 << 10;

/// Gives the per-thread heaps' free memory back to the kernel (for an idle process): this
/// thread's, and that of the heaps whose threads ended.
pub fn collect() {
    // SAFETY: mi_collect has no preconditions; it frees nothing in use.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Routes each block by its size, which a free and a reallocation are given again, so every
/// block goes back to the allocator it came from.
pub struct Split;

fn small(size: usize) -> bool {
    size < SMALL_BYTES_MAX
}

// SAFETY: each call is passed on to the allocator that `layout.size()` names, and a block's
// size at its free or reallocation is the size it was allocated with (GlobalAlloc's
// contract), so it goes back where it came from; a reallocation across the boundary copies
// into a block of the other allocator and frees the old one in its own.
unsafe impl GlobalAlloc for Split {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if small(layout.size()) {
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if small(layout.size()) {
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if small(layout.size()) {
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (small(layout.size()), small(new_size)) {
            (true, true) => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            _ => {
                // SAFETY: the caller guarantees `new_size`, rounded up to `layout.align()`,
                // does not overflow.
                let new_layout =
                    unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                new
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Split, SMALL_BYTES_MAX};
    use std::alloc::{GlobalAlloc, Layout};

    // Goal: a block grown or shrunk across the boundary keeps its bytes, and every block goes
    // back to the allocator it came from (a wrong one would abort the test process).
    #[test]
    fn blocks_keep_their_bytes_across_the_boundary() {
        let split = Split;
        for (from, to) in [
            (100, SMALL_BYTES_MAX + 100),
            (SMALL_BYTES_MAX + 100, 100),
            (SMALL_BYTES_MAX - 1, SMALL_BYTES_MAX),
            (10, 20),
            (1 << 20, 2 << 20),
        ] {
            let layout = Layout::from_size_align(from, 64).expect("layout");
            unsafe {
                let block = split.alloc(layout);
                assert!(!block.is_null());
                for i in 0..from {
                    *block.add(i) = (i % 251) as u8;
                }
                let moved = split.realloc(block, layout, to);
                assert!(!moved.is_null());
                assert_eq!(moved as usize % 64, 0, "alignment kept");
                for i in 0..from.min(to) {
                    assert_eq!(*moved.add(i), (i % 251) as u8, "byte {i} of {from} -> {to}");
                }
                split.dealloc(moved, Layout::from_size_align(to, 64).expect("layout"));
            }
        }
    }
}
