//! Direct I/O on object files (`direct_io = true`): reads and writes bypass the page cache, so
//! a storage server's memory does not fill with data its clients already cache, and the disk
//! sees the I/O when it happens.
//!
//! O_DIRECT wants the file offset, the length and the buffer's address aligned to the device's
//! block. Requests are not: an unaligned write reads the blocks at its edges, lays its bytes
//! over them and writes whole blocks (read-modify-write), and then cuts the file back to its
//! logical end if the last block ran past it. The caller serialises writes that share a block
//! (the direct-I/O object store holds a lock per object stripe: shared for aligned
//! writes, exclusive for read-modify-write).

use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// The alignment of every direct transfer: offset, length and buffer address.
pub(crate) const ALIGN: u64 = 4096;

fn align_down(value: u64) -> u64 {
    value & !(ALIGN - 1)
}

fn align_up(value: u64) -> u64 {
    value.div_ceil(ALIGN) * ALIGN
}

/// Whether a write of `len` bytes at `offset` needs no read-modify-write.
pub(crate) fn is_aligned(offset: u64, len: usize) -> bool {
    offset % ALIGN == 0 && (len as u64) % ALIGN == 0
}

/// A zeroed buffer whose start is aligned for direct I/O.
pub(crate) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub(crate) fn zeroed(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + ALIGN as usize];
        let address = storage.as_ptr() as usize;
        let start = (ALIGN as usize - address % ALIGN as usize) % ALIGN as usize;
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Opens `path` for direct I/O.
pub(crate) fn open(path: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(write)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Reads whole blocks at an aligned `offset` into `buffer`, short at the end of the file.
fn read_blocks(file: &File, offset: u64, buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        let count = file.read_at(&mut buffer[filled..], offset + filled as u64)?;
        if count == 0 {
            break;
        }
        filled += count;
    }
    Ok(filled)
}

/// Writes `data` at `offset` of a file opened with [`open`] whose length is `length`.
pub(crate) fn write_at(file: &File, offset: u64, data: &[u8], length: u64) -> io::Result<()> {
    if is_aligned(offset, data.len()) {
        return write_aligned(file, offset, data);
    }
    let end = offset + data.len() as u64;
    let (start, stop) = (align_down(offset), align_up(end));
    let mut buffer = AlignedBuf::zeroed((stop - start) as usize);
    {
        // The edge blocks keep the bytes around the write.
        let block = ALIGN as usize;
        let span = buffer.as_mut_slice();
        if offset != start && start < length {
            read_blocks(file, start, &mut span[..block])?;
        }
        let last = span.len() - block;
        if end != stop && stop - ALIGN < length && (last > 0 || offset == start) {
            read_blocks(file, stop - ALIGN, &mut span[last..])?;
        }
    }
    #[cfg(test)]
    tests::after_edge_read();
    let at = (offset - start) as usize;
    buffer.as_mut_slice()[at..at + data.len()].copy_from_slice(data);
    file.write_all_at(buffer.as_slice(), start)?;
    // The last block may have run past the logical end: cut the file back to it.
    let logical = end.max(length);
    if stop > logical {
        file.set_len(logical)?;
    }
    Ok(())
}

/// Opens the file behind `file` again, with O_DIRECT: the same inode even if its name was
/// removed or reused meanwhile.
pub(crate) fn reopen(file: &File) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(file)
        ))
}

/// Writes `data`, whose offset and length are aligned ([`is_aligned`]), with a descriptor
/// opened for direct I/O; a buffer at an unaligned address goes through an aligned copy.
pub(crate) fn write_aligned(file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
    debug_assert!(is_aligned(offset, data.len()));
    if (data.as_ptr() as u64) % ALIGN == 0 {
        return file.write_all_at(data, offset);
    }
    let mut buffer = AlignedBuf::zeroed(data.len());
    buffer.as_mut_slice().copy_from_slice(data);
    file.write_all_at(buffer.as_slice(), offset)
}

/// Reads up to `buffer.len()` bytes at `offset` of a file of `length` bytes opened with
/// [`open`]; returns how many it read.
pub(crate) fn read_at(
    file: &File,
    offset: u64,
    buffer: &mut [u8],
    length: u64,
) -> io::Result<usize> {
    let end = (offset + buffer.len() as u64).min(length);
    if offset >= end {
        return Ok(0);
    }
    let (span, from, available) = read_span(file, offset, (end - offset) as usize)?;
    buffer[..available].copy_from_slice(&span[from..from + available]);
    Ok(available)
}

/// Reads the aligned blocks around `len` bytes at `offset`: the blocks, where the bytes start
/// in them, and how many of the bytes the file held (only those are to be used: a pooled
/// buffer holds what it last held past them).
fn read_span(file: &File, offset: u64, len: usize) -> io::Result<(Bytes, usize, usize)> {
    let (start, stop) = (align_down(offset), align_up(offset + len as u64));
    let span_len = (stop - start) as usize;
    let from = (offset - start) as usize;
    // A pooled huge page where the span fits: one segment per transfer (`weft_net::buffer`).
    let (span, read) = match weft_net::buffer::take(span_len) {
        Some(mut pooled) => {
            let read = read_blocks(file, start, pooled.as_mut_slice())?;
            (pooled.freeze(span_len), read)
        }
        None => {
            let mut span = AlignedBuf::zeroed(span_len);
            let read = read_blocks(file, start, span.as_mut_slice())?;
            (Bytes::from_owner(span), read)
        }
    };
    Ok((span, from, read.saturating_sub(from).min(len)))
}

/// Reads `len` bytes at `offset` of a file opened for direct I/O, all of them inside the file,
/// into an aligned buffer that becomes the answer without a copy. Bytes a concurrent truncate
/// took read as zeros.
pub(crate) fn read_owned(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let (span, from, available) = read_span(file, offset, len)?;
    if available < len {
        let mut padded = vec![0u8; len];
        padded[..available].copy_from_slice(&span[from..from + available]);
        return Ok(Bytes::from(padded));
    }
    Ok(span.slice(from..from + len))
}

/// Whether `directory`'s file system takes O_DIRECT: the error of a direct write if not.
pub(crate) fn supported(directory: &Path) -> io::Result<()> {
    let path = directory.join(".direct-io-probe");
    let result = open(&path, true).and_then(|file| {
        let buffer = AlignedBuf::zeroed(ALIGN as usize);
        file.write_all_at(buffer.as_slice(), 0)
    });
    let _ = std::fs::remove_file(&path);
    result
}

/// Checks that `directory`'s file system takes O_DIRECT, with a message that says what to do.
pub(crate) fn probe(directory: &Path) -> io::Result<()> {
    supported(directory).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!(
                "{} does not support direct I/O ({error}): set direct_io = false for this server",
                directory.display()
            ),
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// What an unaligned write on this thread runs between reading its edge blocks and
        /// writing them back: where a concurrent cut would slip in.
        static AFTER_EDGE_READ: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// Runs `hook` inside the next unaligned write on this thread, after its edge reads.
    pub(crate) fn on_edge_read(hook: impl FnOnce() + 'static) {
        AFTER_EDGE_READ.with(|slot| *slot.borrow_mut() = Some(Box::new(hook)));
    }

    pub(super) fn after_edge_read() {
        if let Some(hook) = AFTER_EDGE_READ.with(|slot| slot.borrow_mut().take()) {
            hook();
        }
    }

    // Goal: a huge-page buffer moves data through O_DIRECT.
    #[test]
    fn huge_buffers_carry_direct_io() {
        let mut buffer = weft_net::buffer::HugeBuf::zeroed(1 << 20).expect("map");
        buffer.as_mut_slice().fill(0x5a);
        let directory = tempfile::tempdir().expect("tempdir");
        if probe(directory.path()).is_err() {
            return;
        }
        let file = open(&directory.path().join("object"), true).expect("open");
        write_aligned(&file, 0, buffer.as_slice()).expect("write");
        let mut back = weft_net::buffer::HugeBuf::zeroed(1 << 20).expect("map");
        assert_eq!(
            read_blocks(&file, 0, back.as_mut_slice()).expect("read"),
            1 << 20
        );
        assert_eq!(back.as_slice(), buffer.as_slice());
    }

    // Goal: direct writes and reads at any offset and length give the same bytes and the same
    // file length as ordinary I/O would, around block edges and past the end.
    #[test]
    fn unaligned_direct_io_matches_buffered() {
        let directory = tempfile::tempdir().expect("tempdir");
        if probe(directory.path()).is_err() {
            // tmpfs and some overlay file systems refuse O_DIRECT; nothing to test there.
            return;
        }
        let path = directory.path().join("object");
        let file = open(&path, true).expect("open");
        let mut model: Vec<u8> = Vec::new();
        let writes: [(u64, usize, u8); 7] = [
            (0, 4096, 1),
            (100, 10, 2),
            (4000, 200, 3),
            (10_000, 5, 4),
            (8192, 4096, 5),
            (3, 1, 6),
            (20_480, 9000, 7),
        ];
        for (offset, len, fill) in writes {
            let data = vec![fill; len];
            write_at(&file, offset, &data, model.len() as u64).expect("write");
            let end = offset as usize + len;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[offset as usize..end].copy_from_slice(&data);
            assert_eq!(
                file.metadata().expect("stat").len(),
                model.len() as u64,
                "length after writing {len} at {offset}"
            );
        }
        for (offset, len) in [(0u64, 40_000usize), (99, 13), (4095, 2), (29_000, 4096)] {
            let mut buffer = vec![0u8; len];
            let read = read_at(&file, offset, &mut buffer, model.len() as u64).expect("read");
            let expected = &model
                [(offset as usize).min(model.len())..(offset as usize + len).min(model.len())];
            assert_eq!(&buffer[..read], expected, "read {len} at {offset}");
            let owned = read_owned(&file, offset, expected.len()).expect("read owned");
            assert_eq!(&owned[..], expected, "owned read of {len} at {offset}");
        }
    }
}
