//! Read-ahead per open file: after two reads in a row that continue each other, an open file
//! ([`crate::OpenFile`]) reads the next `read_ahead_bytes` in the background, in windows, and
//! answers later reads from them. A window holds only while this client's writes, truncates and allocations of
//! the file leave it alone: each of them bumps the file's data version, and a window read
//! under another version is dropped. Windows live as long as their open file, which keeps the
//! close-to-open promise: an open never sees data read before it.

use crate::ReadData;
use futures::future::{BoxFuture, FutureExt, Shared};
use std::sync::Mutex;

/// Windows kept per open file: the one being read from and the next.
const WINDOWS_MAX: usize = 2;

type Fetch = Shared<BoxFuture<'static, Option<ReadData>>>;

/// Data read ahead: `[start, start + len)` as of `version`; the bytes may still be on the way.
struct Window {
    start: u64,
    len: u64,
    version: u64,
    data: Fetch,
}

/// The read-ahead state of one open file.
#[derive(Default)]
pub(crate) struct ReadAhead {
    state: Mutex<Stream>,
}

#[derive(Default)]
struct Stream {
    /// Where the last read ended.
    next: u64,
    /// Reads in a row that continued the one before.
    sequential: u32,
    windows: Vec<Window>,
}

/// What a read should do about read-ahead.
struct Plan {
    /// Data that answers the read, once it arrives (`None`: read from the servers).
    pub hit: Option<(u64, Fetch)>,
    /// A window to read now: (start, length).
    pub fetch: Option<(u64, u64)>,
}

/// The file as a read finds it: the version of its data and the size this client knows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FileNow {
    pub version: u64,
    pub size: u64,
}

impl ReadAhead {
    /// Notes a read of `size` bytes at `offset` of the file as it is `now`, and plans it:
    /// answer it from a window, and read the next window ahead when the reader has been
    /// sequential, `window` bytes at a time.
    fn plan(&self, (offset, size): (u64, u64), now: FileNow, window: u64) -> Plan {
        let FileNow {
            version,
            size: known,
        } = now;
        let mut stream = self.state.lock().expect("read-ahead poisoned");
        stream.sequential = if offset == stream.next {
            stream.sequential.saturating_add(1)
        } else {
            0
        };
        let end = offset.saturating_add(size);
        stream.next = end;
        stream
            .windows
            .retain(|w| w.version == version && w.start + w.len > offset);
        let hit = stream
            .windows
            .iter()
            .find(|w| w.start <= offset && end.min(known) <= w.start + w.len)
            .map(|w| (w.start, w.data.clone()));
        let mut fetch = None;
        if window > 0 && stream.sequential >= 1 && stream.windows.len() < WINDOWS_MAX {
            let from = stream
                .windows
                .iter()
                .map(|w| w.start + w.len)
                .max()
                .unwrap_or(end)
                .max(end);
            // Keep about one window ahead of the reader, and nothing past the end of the file.
            if from < known && from < end.saturating_add(window) {
                fetch = Some((from, window.min(known - from)));
            }
        }
        Plan { hit, fetch }
    }

    /// Notes a read of `size` bytes at `offset` (see [`ReadAhead::plan`]), starts with `fetch`
    /// the window to read ahead if one is due, and answers the read from a window that holds
    /// it; `None`: the caller reads from the servers.
    pub(crate) async fn read(
        &self,
        (offset, size): (u64, u64),
        now: FileNow,
        window: u64,
        fetch: impl FnOnce((u64, u64)) -> BoxFuture<'static, Option<ReadData>>,
    ) -> Option<ReadData> {
        let plan = self.plan((offset, size), now, window);
        if let Some(next) = plan.fetch {
            self.add(next, now.version, fetch(next));
        }
        let (start, data) = plan.hit?;
        slice(&data.await?, start, offset, size, now.size)
    }

    /// Records a window being read.
    fn add(
        &self,
        (start, len): (u64, u64),
        version: u64,
        data: BoxFuture<'static, Option<ReadData>>,
    ) {
        let mut stream = self.state.lock().expect("read-ahead poisoned");
        stream.windows.push(Window {
            start,
            len,
            version,
            data: data.shared(),
        });
    }
}

/// The part of `window` (read from `start`) that answers `size` bytes at `offset`; shorter at
/// the end of the file, `None` if the window came back shorter than the read needs.
fn slice(window: &ReadData, start: u64, offset: u64, size: u64, known: u64) -> Option<ReadData> {
    let from = (offset - start) as usize;
    let to = (offset.saturating_add(size).min(known) - start) as usize;
    if to > window.len() || from > to {
        return None;
    }
    Some(window.slice(from, to))
}
