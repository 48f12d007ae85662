//! The frames one connection sends, in order: written straight to the socket by the caller
//! that queued a frame when nothing else is being written (no thread woken to write it), and
//! otherwise by the connection's writer task, which batches whatever waits into one flush.
//!
//! Only one party writes at a time ([`Writer`]): the caller that found the connection idle,
//! or the writer task, which writes only what a caller handed over to it. A caller writes
//! without waiting (`try_write`): what the socket does not take at once, the rest of its
//! frame included, is left to the writer task, which waits for the socket and gives up on a
//! peer that reads nothing for [`WRITE_TIMEOUT`]. A connection in TLS has no such direct
//! path: its writer task writes every frame.

use crate::connection::OutFrame;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Longest a batch of frames may take to be written: a peer that reads nothing for this long
/// is closed.
pub(crate) const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Payloads from this size on are written to the socket itself, past the writer's buffer.
const UNBUFFERED_PAYLOAD_MIN: usize = 64 * 1024;

/// A frame waiting to be written: its first `written` bytes already were, and its slot in
/// the queue.
struct Waiting {
    frame: OutFrame,
    written: usize,
    _slot: OwnedSemaphorePermit,
}

/// Who may write to the socket now.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Writer {
    /// Nobody: the next caller writes its frame itself.
    #[default]
    Idle,
    /// A caller, writing its own frame: it hands over to the writer task when it is done and
    /// frames wait.
    Caller,
    /// The writer task, until the queue is written and flushed. Only a caller that hands over
    /// sets it, and only then wakes the task, so a wake the task finds without it is stale.
    Task,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiting>,
    writer: Writer,
    /// The connection failed, or its peer read nothing in time: nothing more is written.
    failed: bool,
    /// Every sender is gone: the writer task ends once the queue is written.
    senders_gone: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer task: frames wait, or the last sender went.
    wake: Notify,
    /// Frames queued at most (a sender beyond them waits).
    slots: Arc<Semaphore>,
    /// The socket, for a caller's write (plain TCP only).
    direct: Option<Arc<OwnedWriteHalf>>,
    /// Senders alive.
    senders: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("outbox poisoned")
    }

    /// Marks the connection failed (`state` is this outbox's, locked): nothing queued or sent
    /// later is written, and the socket's writing side is shut so the peer learns it at once
    /// (a TLS connection's closes when its writer task drops its half).
    fn fail(&self, mut state: std::sync::MutexGuard<'_, State>) {
        state.failed = true;
        state.queue.clear();
        state.writer = Writer::Idle;
        drop(state);
        if let Some(direct) = &self.direct {
            let socket: &tokio::net::TcpStream = (**direct).as_ref();
            let _ = socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Write);
        }
    }
}

/// A handle that queues frames on one connection; the writer task ends when the last one is
/// dropped and what they queued is written.
pub(crate) struct Outbox {
    shared: Arc<Shared>,
}

/// The outbox was closed: the connection failed or its peer read nothing in time.
#[derive(Debug)]
pub(crate) struct Closed;

impl Outbox {
    /// An outbox writing to `writer` (and, for plain TCP, straight to `direct`), with at most
    /// `capacity` frames queued; its writer task is spawned on the current runtime.
    pub(crate) fn start(
        writer: crate::tls::WriteHalf,
        direct: Option<Arc<OwnedWriteHalf>>,
        capacity: usize,
    ) -> Outbox {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            wake: Notify::new(),
            slots: Arc::new(Semaphore::new(capacity)),
            direct,
            senders: std::sync::atomic::AtomicUsize::new(1),
        });
        tokio::spawn(write_queued(Arc::clone(&shared), writer));
        Outbox { shared }
    }

    /// Whether nothing more can be sent: the connection failed, or its peer read nothing in
    /// time.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.state().failed
    }

    /// Sends `frame` after those sent before it: written now when the connection is idle and
    /// its socket takes it, else queued for the writer task (waiting for a slot when the
    /// queue is full).
    ///
    /// # Errors
    /// [`Closed`] when the connection failed.
    pub(crate) async fn send(&self, frame: OutFrame) -> Result<(), Closed> {
        let slot = Arc::clone(&self.shared.slots)
            .acquire_owned()
            .await
            .expect("the slots are never closed");
        let mut waiting = Waiting {
            frame,
            written: 0,
            _slot: slot,
        };
        let direct = {
            let mut state = self.shared.state();
            if state.failed {
                return Err(Closed);
            }
            if state.writer != Writer::Idle {
                state.queue.push_back(waiting);
                return Ok(());
            }
            match &self.shared.direct {
                Some(direct) => {
                    state.writer = Writer::Caller;
                    Arc::clone(direct)
                }
                None => {
                    state.writer = Writer::Task;
                    state.queue.push_back(waiting);
                    drop(state);
                    self.shared.wake.notify_one();
                    return Ok(());
                }
            }
        };
        // This caller is the only writer now: nothing is buffered in the writer task (it
        // flushes before it gives the connection up), so the frame goes out in order.
        let outcome = write_now(&direct, &mut waiting);
        let mut state = self.shared.state();
        match outcome {
            Ok(true) if state.queue.is_empty() => {
                state.writer = Writer::Idle;
                return Ok(());
            }
            Ok(true) => {}
            Ok(false) => state.queue.push_front(waiting),
            Err(error) => {
                tracing::debug!(%error, "a frame could not be written: closing the connection");
                self.shared.fail(state);
                return Ok(());
            }
        }
        // The writer task takes over: the rest of this frame, or those queued meanwhile.
        state.writer = Writer::Task;
        drop(state);
        self.shared.wake.notify_one();
        Ok(())
    }
}

impl Clone for Outbox {
    fn clone(&self) -> Outbox {
        self.shared
            .senders
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Outbox {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if self
            .shared
            .senders
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.shared.state().senders_gone = true;
            self.shared.wake.notify_one();
        }
    }
}

/// The bytes of `frame` past `written`, as up to three slices.
fn unwritten(frame: &OutFrame, written: usize) -> [&[u8]; 3] {
    let mut skip = written;
    [&frame.header[..], &frame.body[..], &frame.payload[..]].map(|part| {
        let cut = skip.min(part.len());
        skip -= cut;
        &part[cut..]
    })
}

/// Writes what is left of `waiting` to `socket` without waiting: true once it is all
/// written, false when the socket took only part of it (`waiting.written` says how much).
fn write_now(socket: &OwnedWriteHalf, waiting: &mut Waiting) -> std::io::Result<bool> {
    loop {
        let parts = unwritten(&waiting.frame, waiting.written);
        if parts.iter().all(|part| part.is_empty()) {
            return Ok(true);
        }
        let slices = parts.map(std::io::IoSlice::new);
        match socket.try_write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => waiting.written += written,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

/// The writer task: writes what callers queued, in batches of one flush, until the last
/// sender is gone and the queue is written, or the connection fails.
async fn write_queued(shared: Arc<Shared>, writer: crate::tls::WriteHalf) {
    let mut writer = BufWriter::with_capacity(256 * 1024, writer);
    loop {
        let batch: Vec<Waiting> = {
            let mut state = shared.state();
            if state.failed {
                return;
            }
            if state.writer == Writer::Task && state.queue.is_empty() {
                // Written and flushed: a caller may write directly again.
                state.writer = Writer::Idle;
            }
            if state.writer == Writer::Task {
                state.queue.drain(..).collect()
            } else if state.senders_gone && state.queue.is_empty() {
                return;
            } else {
                // Nothing handed over (a caller writes, or nobody): wait for a hand-over.
                Vec::new()
            }
        };
        if batch.is_empty() {
            shared.wake.notified().await;
            continue;
        }
        let written = async {
            for waiting in batch {
                write_one(&mut writer, &waiting).await?;
                // Its slot is free once it is in the buffer, as a channel's would be.
                drop(waiting);
            }
            writer.flush().await
        };
        let failure = match tokio::time::timeout(WRITE_TIMEOUT, written).await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => {
                tracing::debug!(%error, "a frame could not be written: closing the connection");
                true
            }
            Err(_) => {
                tracing::warn!(timeout = ?WRITE_TIMEOUT, "closing a connection whose peer does not read");
                true
            }
        };
        if failure {
            shared.fail(shared.state());
            return;
        }
    }
}

async fn write_one<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    waiting: &Waiting,
) -> std::io::Result<()> {
    let [header, body, payload] = unwritten(&waiting.frame, waiting.written);
    writer.write_all(header).await?;
    writer.write_all(body).await?;
    if payload.len() >= UNBUFFERED_PAYLOAD_MIN {
        writer.flush().await?;
        writer.get_mut().write_all(payload).await
    } else {
        writer.write_all(payload).await
    }
}

/// The writing half of a plain TCP connection shared with callers that write to it directly
/// ([`Outbox::send`]): the writer task's side of it.
pub(crate) struct SharedTcp(pub(crate) Arc<OwnedWriteHalf>);

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let socket: &tokio::net::TcpStream = (*self.0).as_ref();
        loop {
            std::task::ready!(socket.poll_write_ready(context))?;
            match socket.try_write(buffer) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // The write side closes when the last holder of the half drops it.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{read_frame, FrameHead, FrameReadError, PayloadBuffer};
    use weft_proto::codec::{FrameKind, PROTOCOL_VERSION};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// An outbox of 16 frames on a real loopback TCP connection, and its peer's end.
    async fn connected() -> (Outbox, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let connecting = tokio::net::TcpStream::connect(address);
        let (accepted, connected) = tokio::join!(listener.accept(), connecting);
        let (peer, _) = accepted.expect("accept");
        let (_reader, writer, direct) =
            crate::tls::Stream::Tcp(connected.expect("connect")).split();
        (Outbox::start(writer, direct, 16), peer)
    }

    // Goal: frames sent at once by many callers over one connection arrive whole and, for
    // each caller, in the order it sent them, whether a caller wrote its frame itself, left
    // part of it to the writer task (a peer that reads nothing for a while fills the
    // socket), or queued it behind another; and the peer sees the connection end once the
    // last sender is gone and everything is written. Method: a real TCP connection on
    // loopback; 8 senders × 40 frames of 0 B to 1 MiB; the peer starts reading after 200 ms.
    #[test]
    fn frames_arrive_whole_and_in_order_however_they_were_written() {
        runtime().block_on(async {
            let (outbox, mut peer) = connected().await;
            const SENDERS: u64 = 8;
            const FRAMES: u64 = 40;
            let mut senders = Vec::new();
            for sender in 0..SENDERS {
                let outbox = outbox.clone();
                senders.push(tokio::spawn(async move {
                    for index in 0..FRAMES {
                        let len = [0, 100, 70_000, 1 << 20][((sender + index) % 4) as usize];
                        let payload =
                            bytes::Bytes::from(vec![(sender * FRAMES + index) as u8; len]);
                        let head = FrameHead {
                            kind: FrameKind::Request,
                            request_id: sender << 32 | index,
                            origin: 0,
                            version: PROTOCOL_VERSION,
                            flags: 0,
                        };
                        let body = format!("{sender}/{index}").into_bytes();
                        outbox
                            .send(OutFrame::new(head, body, payload))
                            .await
                            .expect("sent");
                    }
                }));
            }
            drop(outbox);
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut next = [0u64; SENDERS as usize];
            loop {
                match read_frame(&mut peer, PayloadBuffer::Heap).await {
                    Ok((header, body, payload)) => {
                        let (sender, index) =
                            (header.request_id >> 32, header.request_id & 0xffff_ffff);
                        assert_eq!(
                            index, next[sender as usize],
                            "sender {sender}'s frames in order"
                        );
                        next[sender as usize] += 1;
                        assert_eq!(body, format!("{sender}/{index}").into_bytes());
                        let len = [0, 100, 70_000, 1 << 20][((sender + index) % 4) as usize];
                        assert_eq!(payload.len(), len);
                        assert!(payload
                            .iter()
                            .all(|byte| *byte == (sender * FRAMES + index) as u8));
                    }
                    Err(FrameReadError::Closed) => break,
                    Err(error) => panic!("a torn frame: {error}"),
                }
            }
            assert_eq!(next, [FRAMES; SENDERS as usize], "every frame arrived");
            for sender in senders {
                sender.await.expect("sender");
            }
        });
    }

    // Goal: a connection whose peer went away is closed for its senders once a write finds
    // it gone: `is_closed` says so and later sends are refused, not queued for ever.
    // Method: a real TCP connection on loopback; the peer closes its end; frames are sent
    // until a write fails.
    #[test]
    fn a_connection_whose_peer_is_gone_refuses_what_is_sent_after() {
        runtime().block_on(async {
            let (outbox, peer) = connected().await;
            drop(peer);
            let head = FrameHead {
                kind: FrameKind::Request,
                request_id: 1,
                origin: 0,
                version: PROTOCOL_VERSION,
                flags: 0,
            };
            let mut refused = false;
            for _ in 0..1000 {
                let frame =
                    OutFrame::new(head, b"body".to_vec(), bytes::Bytes::from(vec![1; 4096]));
                if outbox.send(frame).await.is_err() {
                    refused = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            assert!(refused, "a send after the peer left is refused");
            assert!(outbox.is_closed());
        });
    }
}
