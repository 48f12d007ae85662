//! One TCP connection: an outbox its callers write their frames through ([`Outbox`]), a
//! reader task that matches responses to waiting callers by request id. Frame reading lives
//! here once, for both sides, and writing in [`crate::outbox`].

use crate::client::TransportError;
use crate::outbox::Outbox;
use crate::tls::{ReadHalf, Stream};
use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use weft_proto::codec::{self, DecodeError, FrameHeader, FrameKind, FRAME_HEADER_BYTES};
use weft_proto::messages::{Reply, Request};

/// Frames queued for one connection's writer before callers wait.
const WRITE_QUEUE_FRAMES_MAX: usize = 256;

/// Idle time before the first keepalive probe: a peer that vanished without closing (power
/// off, cut link) is noticed within seconds, not at the kernel's two-hour default.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(5);
/// Interval between keepalive probes.
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// Unanswered probes before the connection is dropped.
const KEEPALIVE_RETRIES: u32 = 3;

/// Longest sent data may stay unacknowledged (or wait for a peer's receive window to open)
/// before the connection is dropped: a cut link under load is noticed in a bounded time (the
/// kernel would retransmit for many minutes), and its calls fail over to another rail or are
/// retried. Longer than a server may hold back reading a connection whose budget is full
/// (requests waiting for a mirror failover), shorter than a request's default deadline.
const UNACKNOWLEDGED_MAX: std::time::Duration = std::time::Duration::from_secs(20);

/// Sets the socket options every Weft connection uses: no Nagle delay, fast keepalives, and
/// no waiting for acknowledgements longer than [`UNACKNOWLEDGED_MAX`].
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "cannot set TCP keepalive");
    }
    if let Err(error) =
        socket2::SockRef::from(stream).set_tcp_user_timeout(Some(UNACKNOWLEDGED_MAX))
    {
        tracing::debug!(%error, "cannot set TCP user timeout");
    }
}

/// A frame ready to be written.
pub(crate) struct OutFrame {
    pub header: [u8; FRAME_HEADER_BYTES],
    pub body: Vec<u8>,
    pub payload: Bytes,
}

/// What a frame's header says besides the lengths and the checksum of what follows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FrameHead {
    /// Request or response.
    pub kind: FrameKind,
    /// Chosen by the requester, echoed by the response.
    pub request_id: u64,
    /// The requesting client session's (low 32 bits), 0 for servers and answers.
    pub origin: u32,
    /// The connection's protocol version.
    pub version: u16,
    /// Header flags.
    pub flags: u8,
}

impl OutFrame {
    /// A frame with the header `head`.
    pub(crate) fn new(head: FrameHead, body: Vec<u8>, payload: Bytes) -> OutFrame {
        let FrameHead {
            kind,
            request_id,
            origin,
            version,
            flags,
        } = head;
        let header = FrameHeader {
            version,
            flags,
            kind,
            request_id,
            origin,
            body_len: u32::try_from(body.len()).expect("bodies are bounded well below 4 GiB"),
            payload_len: u32::try_from(payload.len()).expect("payloads are bounded below 4 GiB"),
            payload_crc: if payload.is_empty() {
                0
            } else {
                weft_proto::checksum::crc32c(&payload)
            },
        };
        OutFrame {
            header: header.encode(),
            body,
            payload,
        }
    }
}

impl OutFrame {
    /// Bytes on the wire: header, body and payload.
    pub(crate) fn len(&self) -> usize {
        self.header.len() + self.body.len() + self.payload.len()
    }
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameReadError {
    #[error("connection closed")]
    Closed,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Where a frame's payload is received.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadBuffer {
    /// The heap, page-aligned from a page on (answers: the caller copies them on).
    Heap,
    /// A pooled huge page for a large payload (requests: a storage target may write it to the
    /// disk with O_DIRECT, where one physically contiguous buffer is one segment).
    Huge,
}

/// Reads one frame: header, body, payload, with bounds and the payload checksum checked.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: PayloadBuffer,
) -> Result<(FrameHeader, Vec<u8>, Bytes), FrameReadError> {
    let header = read_header(reader).await?;
    let (body, payload) = read_rest(reader, &header, buffer).await?;
    Ok((header, body, payload))
}

/// Reads and bounds-checks a frame's header; [`FrameReadError::Closed`] when the peer closed
/// the connection between frames.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<FrameHeader, FrameReadError> {
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    match reader.read_exact(&mut header_bytes).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(FrameReadError::Closed)
        }
        Err(error) => return Err(error.into()),
    }
    Ok(FrameHeader::decode(&header_bytes)?)
}

/// Reads the body and payload `header` announced, and checks the payload's checksum.
pub(crate) async fn read_rest<R: AsyncRead + Unpin>(
    reader: &mut R,
    header: &FrameHeader,
    buffer: PayloadBuffer,
) -> Result<(Vec<u8>, Bytes), FrameReadError> {
    // Into spare capacity, as the payload below: a body costs the memory of the bytes that
    // arrived, not of the length its header claims.
    let body_len = header.body_len as usize;
    let mut body = Vec::with_capacity(body_len);
    while body.len() < body_len {
        if reader.read_buf(&mut body).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    let len = header.payload_len as usize;
    let huge = buffer == PayloadBuffer::Huge && len >= HUGE_PAYLOAD;
    let payload = match huge.then(|| crate::buffer::take(len)).flatten() {
        Some(mut pooled) => {
            reader.read_exact(pooled.as_mut_slice()).await?;
            pooled.freeze(len)
        }
        None => {
            // Read into spare capacity: zeroing a buffer the socket overwrites at once would
            // cost a pass over every payload. The capacity is exactly the payload, so no read
            // runs past it.
            let mut payload = page_aligned(len);
            while payload.len() < len {
                if reader.read_buf(&mut payload).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            }
            payload.freeze()
        }
    };
    if !payload.is_empty() {
        header.check_payload(&payload)?;
    }
    Ok((body, payload))
}

/// Payloads of at least this many bytes are received into pooled huge pages.
const HUGE_PAYLOAD: usize = 256 << 10;

/// Payloads of at least this many bytes start on a page boundary.
const PAGE: usize = 4096;

/// An empty buffer of capacity exactly `len`; from a page on it starts at a page boundary, so a
/// storage target can hand a received write to O_DIRECT as it is instead of copying it into an
/// aligned buffer first.
fn page_aligned(len: usize) -> BytesMut {
    if len < PAGE {
        return BytesMut::with_capacity(len);
    }
    let mut whole = BytesMut::with_capacity(len + PAGE);
    let mut payload = whole.split_off(whole.as_ptr().align_offset(PAGE));
    // `split_off` keeps the rest of the capacity; cut it to the payload.
    drop(payload.split_off(len));
    payload
}

/// A response frame as it arrived: the caller decodes its body, as the response of the
/// service it asked ([`Answered::reply`]).
pub(crate) struct Answered {
    /// The protocol version the body is in.
    version: u16,
    /// The reply, encoded.
    body: Vec<u8>,
    /// The raw payload after it.
    pub(crate) payload: Bytes,
}

impl Answered {
    /// The reply, decoded as service response `R`.
    ///
    /// # Errors
    /// [`TransportError::Protocol`] when the body is not a reply of that service.
    pub(crate) fn reply<R: DeserializeOwned>(&self) -> Result<Reply<R>, TransportError> {
        codec::decode_body_in::<Reply<R>>(self.version, &self.body)
            .map_err(|error| TransportError::Protocol(error.to_string()))
    }
}

type Waiter = oneshot::Sender<Result<Answered, TransportError>>;

/// Why a request could not be sent.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The connection is closed.
    Closed,
    /// The peer speaks an older protocol version, in which the request cannot be said.
    TooNew(String),
}

/// The client side of one connection.
pub(crate) struct ClientConnection {
    frames: Outbox,
    waiters: Arc<Mutex<HashMap<u64, Waiter>>>,
    next_request_id: AtomicU64,
    closed: Arc<AtomicBool>,
    /// Stamped on every request: the client session this connection works for.
    origin: u32,
    /// The protocol version agreed in the handshake: requests are encoded in it.
    version: u16,
    /// When the last request was sent.
    last_sent: Mutex<std::time::Instant>,
}

impl ClientConnection {
    pub(crate) fn start(stream: Stream, origin: u32, version: u16) -> ClientConnection {
        let (reader, writer, direct) = stream.split();
        let frames = Outbox::start(writer, direct, WRITE_QUEUE_FRAMES_MAX);
        let waiters: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        tokio::spawn(read_responses(
            reader,
            Arc::clone(&waiters),
            Arc::clone(&closed),
        ));
        ClientConnection {
            frames,
            waiters,
            next_request_id: AtomicU64::new(1),
            closed,
            origin,
            version,
            last_sent: Mutex::new(std::time::Instant::now()),
        }
    }

    /// How long ago the last request was sent on this connection.
    pub(crate) fn idle_for(&self) -> std::time::Duration {
        self.last_sent.lock().expect("last sent poisoned").elapsed()
    }

    /// Marks the connection as not to be used for new calls (its slot opens another); the
    /// calls waiting on it still get their answers.
    pub(crate) fn retire(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.frames.is_closed()
    }

    /// Sends a request and returns the receiver of its reply.
    ///
    /// # Errors
    /// [`SendError`]: the connection closed, or the peer's protocol version has no encoding
    /// of the request.
    pub(crate) async fn send(
        &self,
        request: &Request,
        payload: Bytes,
    ) -> Result<(u64, oneshot::Receiver<Result<Answered, TransportError>>), SendError> {
        let body = codec::encode_body_in(self.version, request).map_err(SendError::TooNew)?;
        *self.last_sent.lock().expect("last sent poisoned") = std::time::Instant::now();
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, receiver) = oneshot::channel();
        self.waiters
            .lock()
            .expect("waiter map poisoned")
            .insert(request_id, waiter);
        let head = FrameHead {
            kind: FrameKind::Request,
            request_id,
            origin: self.origin,
            version: self.version,
            flags: if request.forwarded() {
                codec::FLAG_FORWARDED
            } else {
                0
            },
        };
        let frame = OutFrame::new(head, body, payload);
        if self.frames.send(frame).await.is_err() {
            self.waiters
                .lock()
                .expect("waiter map poisoned")
                .remove(&request_id);
            self.closed.store(true, Ordering::Release);
            return Err(SendError::Closed);
        }
        Ok((request_id, receiver))
    }

    /// Drops the waiter of a request whose caller gave up (deadline passed).
    pub(crate) fn forget(&self, request_id: u64) {
        self.waiters
            .lock()
            .expect("waiter map poisoned")
            .remove(&request_id);
    }
}

async fn read_responses(
    mut reader: ReadHalf,
    waiters: Arc<Mutex<HashMap<u64, Waiter>>>,
    closed: Arc<AtomicBool>,
) {
    let failure = loop {
        match read_frame(&mut reader, PayloadBuffer::Heap).await {
            Ok((header, body, payload)) => {
                if header.kind != FrameKind::Response {
                    break TransportError::Protocol(
                        "the peer sent a request on a client connection".to_string(),
                    );
                }
                let waiter = waiters
                    .lock()
                    .expect("waiter map poisoned")
                    .remove(&header.request_id);
                let Some(waiter) = waiter else { continue };
                let _ = waiter.send(Ok(Answered {
                    version: header.version,
                    body,
                    payload,
                }));
            }
            Err(FrameReadError::Closed) => break TransportError::Closed,
            Err(FrameReadError::Io(error)) => break TransportError::io("read a frame")(error),
            Err(FrameReadError::Decode(error)) => {
                break TransportError::Protocol(error.to_string())
            }
        }
    };
    closed.store(true, Ordering::Release);
    let pending: Vec<Waiter> = waiters
        .lock()
        .expect("waiter map poisoned")
        .drain()
        .map(|(_, w)| w)
        .collect();
    for waiter in pending {
        let _ = waiter.send(Err(failure.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a payload buffer of a page or more starts on a page boundary (O_DIRECT takes it
    // as it is), and no buffer holds more than its payload (a read into it cannot run into the
    // next frame).
    #[test]
    fn payload_buffers_are_page_aligned_and_exact() {
        for len in [0, 100, PAGE - 1, PAGE, PAGE + 1, 1 << 20] {
            let buffer = page_aligned(len);
            assert_eq!(buffer.capacity(), len, "capacity of a {len}-byte payload");
            if len >= PAGE {
                assert_eq!(buffer.as_ptr() as usize % PAGE, 0, "{len}-byte payload");
            }
        }
    }
}
