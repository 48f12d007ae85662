//! The server side: accept connections, authenticate them, and hand every request to a
//! [`Handler`], many in flight per connection. A malformed frame closes that connection only; a
//! peer that fails the handshake is refused before any request of it is read.

use crate::auth::{self, Auth, Identity, Refusal, HANDSHAKE_MAGIC, HANDSHAKE_TIMEOUT};
use crate::connection::{read_header, read_rest, FrameHead, OutFrame, PayloadBuffer};
use crate::outbox::Outbox;
use crate::tls::Stream;
use bytes::Bytes;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use weft_observe::http::HttpReply;
use weft_observe::metrics::Metrics;
use weft_proto::access;
use weft_proto::codec::{self, FrameKind, FRAME_HEADER_BYTES, FRAME_MAGIC};
use weft_proto::error::{ErrorCode, WireError};
use weft_proto::messages::{Reply, Request, StatsResponse, TargetStats};

tokio::task_local! {
    /// The protocol version of the request being handled on this task.
    static PEER_VERSION: u16;
}

/// The protocol version the request being handled came in: what its sender speaks. The
/// newest outside a request's handling.
pub fn peer_version() -> u16 {
    PEER_VERSION
        .try_with(|version| *version)
        .unwrap_or(weft_proto::codec::PROTOCOL_VERSION)
}

/// Requests one connection may have in flight before the server stops reading from it.
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: usize = 128;

/// Bytes of requests (headers, bodies, payloads) one connection may have in flight before the
/// server stops reading from it: three frames of the largest size, or 64 writes of 1 MiB.
pub const CONNECTION_BUDGET_BYTES: usize = 64 << 20;

/// Longest a frame may take to arrive once its header has.
pub const FRAME_REST_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of requests all connections of a service may have in flight, in each of its two
/// pools (requests from clients and tools, and requests servers pass on to each other):
/// what a service holds of requests is bounded whatever its connections do.
pub const SERVICE_BUDGET_BYTES_DEFAULT: usize = 256 << 20;

/// How long an authenticated connection may stay without a request in flight or arriving
/// before the server closes it (clients open a new one when they need it).
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);

/// A reply's body, in the version the request came in (one that version cannot say, an older
/// peer's, becomes an error it can), with its payload and the error it carries, if any.
fn encode_reply<R: Serialize>(
    version: u16,
    reply: &Reply<R>,
    payload: Bytes,
) -> (Vec<u8>, Bytes, Option<WireError>) {
    match codec::encode_body_in(version, reply) {
        Ok(body) => (body, payload, reply.as_ref().err().cloned()),
        Err(reason) => {
            let error = WireError::new(ErrorCode::VersionMismatch, reason);
            let body = codec::encode_body(&Err::<(), _>(error.clone()));
            (body, Bytes::new(), Some(error))
        }
    }
}

/// A service's request handler.
pub trait Handler: Send + Sync + 'static {
    /// What the service answers (`MetaResponse`, `MgmtResponse`, `StorageResponse`).
    type Response: Serialize + Send + 'static;

    /// Serves one request of the peer `from`; the returned payload travels raw after the
    /// reply body. A client identity's requests reach it only when they are for clients
    /// ([`Request::for_clients`]); the handler applies the client's rule.
    fn handle(
        &self,
        from: Identity,
        request: Request,
        payload: Bytes,
    ) -> impl Future<Output = (Reply<Self::Response>, Bytes)> + Send;

    /// Answers an HTTP GET of `path` (with `query`, without the `?`) on the service's port;
    /// `None` is a 404. `/metrics` is answered before this is asked.
    fn http(&self, path: &str, query: &str) -> impl Future<Output = Option<HttpReply>> + Send {
        let _ = (path, query);
        std::future::ready(None)
    }

    /// A storage server's per-target counters, for [`Request::Stats`].
    fn target_stats(&self) -> Vec<TargetStats> {
        Vec::new()
    }
}

/// A handler's pages, as the HTTP listener asks for them.
struct HandlerPages<H>(Arc<H>);

impl<H: Handler> weft_observe::Pages for HandlerPages<H> {
    fn page(&self, path: &str, query: &str) -> impl Future<Output = Option<HttpReply>> + Send {
        self.0.http(path, query)
    }
}

/// Who a service lets in, and how many at once.
#[derive(Clone, Debug)]
pub struct Admission {
    /// What peers must prove.
    pub auth: Auth,
    /// Connections open at most (config `connections_max`); a quarter of them (at least 8) may
    /// be in their handshake, or serving HTTP, at once.
    pub connections_max: usize,
    /// Bytes of requests in flight over all connections, per pool.
    pub budget_bytes: usize,
    /// How long a connection may stay idle.
    pub idle_timeout: Duration,
}

/// Default of a service's `connections_max`.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;

impl Admission {
    /// Peers proving `auth`, at most `connections_max` at once, with the default budget and
    /// idle timeout.
    pub fn new(auth: Auth, connections_max: usize) -> Admission {
        Admission {
            auth,
            connections_max,
            budget_bytes: SERVICE_BUDGET_BYTES_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
        }
    }

    /// Connections at most in their handshake (or serving HTTP) at once: peers that have not
    /// proved anything cannot take every slot from the members.
    fn handshakes_max(&self) -> usize {
        (self.connections_max / 4).max(8)
    }
}

/// What a request holds of its service's budget.
type Held = (
    tokio::sync::OwnedSemaphorePermit,
    Option<tokio::sync::OwnedSemaphorePermit>,
);

impl Slots {
    /// Takes `bytes` of a request of `from` from the service's budget: the servers' pool for
    /// a member's request flagged as passed on between servers, else the requests' pool,
    /// after the client's own share for a client identity.
    async fn take(&self, from: &Identity, flags: u8, bytes: usize) -> Held {
        let (pool, share) = match from {
            Identity::Member if flags & codec::FLAG_FORWARDED != 0 => (&self.forwards, None),
            Identity::Member => (&self.requests, None),
            Identity::Client(name) => (&self.requests, Some(self.share_of(name))),
        };
        let share = match share {
            Some(share) => Some(
                share
                    .acquire_many_owned(bytes.min(self.budget_bytes / CLIENT_SHARES) as u32)
                    .await
                    .expect("semaphore never closed"),
            ),
            None => None,
        };
        let pooled = Arc::clone(pool)
            .acquire_many_owned(bytes.min(self.budget_bytes) as u32)
            .await
            .expect("semaphore never closed");
        (pooled, share)
    }

    /// The share of the requests' budget the client `name` may hold.
    fn share_of(&self, name: &Arc<str>) -> Arc<Semaphore> {
        let mut shares = self.client_shares.lock().expect("client shares poisoned");
        // Shares nobody holds are forgotten once there are many (clients come and go).
        if shares.len() > CLIENT_SHARES_KEPT {
            let full = self.budget_bytes / CLIENT_SHARES;
            shares.retain(|_, share| share.available_permits() < full);
        }
        Arc::clone(
            shares
                .entry(Arc::clone(name))
                .or_insert_with(|| Arc::new(Semaphore::new(self.budget_bytes / CLIENT_SHARES))),
        )
    }
}

/// A client identity holds at most this fraction of a service's requests budget.
const CLIENT_SHARES: usize = 4;

/// Client shares kept before idle ones are forgotten.
const CLIENT_SHARES_KEPT: usize = 1024;

/// The slots of one service's connections, and the budgets of their requests.
struct Slots {
    handshaking: Arc<Semaphore>,
    admitted: Arc<Semaphore>,
    /// Bytes of requests in flight from clients and tools.
    requests: Arc<Semaphore>,
    /// Bytes of requests in flight that servers pass on to each other (mirror forwards,
    /// metadata replication): a pool of their own, so that two servers each full of their
    /// clients' writes, each forwarding to the other, can still read each other's forwards.
    forwards: Arc<Semaphore>,
    /// Per client identity, its share of `requests`.
    client_shares: std::sync::Mutex<std::collections::HashMap<Arc<str>, Arc<Semaphore>>>,
    budget_bytes: usize,
    idle_timeout: Duration,
}

/// Accepts connections on `listener` until `shutdown` completes: Weft RPC from peers that
/// prove `admission.auth`, and HTTP for the metrics and the handler's pages, on the same port.
/// A connection beyond the caps is closed at once (its peer retries later).
pub async fn serve<H: Handler>(
    listeners: impl Into<Listeners>,
    handler: Arc<H>,
    metrics: Metrics,
    admission: Admission,
    shutdown: impl Future<Output = ()>,
) {
    let refusals = Arc::new(RefusalLog::default());
    let slots = Arc::new(Slots {
        handshaking: Arc::new(Semaphore::new(admission.handshakes_max())),
        admitted: Arc::new(Semaphore::new(admission.connections_max)),
        requests: Arc::new(Semaphore::new(admission.budget_bytes)),
        forwards: Arc::new(Semaphore::new(admission.budget_bytes)),
        client_shares: std::sync::Mutex::default(),
        budget_bytes: admission.budget_bytes,
        idle_timeout: admission.idle_timeout,
    });
    accept_until(listeners.into(), shutdown, |stream| {
        let Ok(handshake) = Arc::clone(&slots.handshaking).try_acquire_owned() else {
            refusals.refused(&metrics, stream.peer_addr().ok(), &Refusal::Busy);
            return;
        };
        let gate = Gate {
            auth: admission.auth.clone(),
            refusals: Arc::clone(&refusals),
            slots: Arc::clone(&slots),
            handshake,
        };
        let serving = Serving {
            handler: Arc::clone(&handler),
            metrics: metrics.clone(),
            slots: Arc::clone(&slots),
        };
        tokio::spawn(serve_any(stream, gate, serving));
    })
    .await;
}

/// The log of refused connections: one line per refusal, at most one per peer address and
/// reason every [`REFUSAL_LOG_INTERVAL`], so a peer retrying in a loop cannot flood the log.
#[derive(Default)]
struct RefusalLog {
    /// Per address and reason: when a line was last written, and refusals since then.
    last: std::sync::Mutex<std::collections::HashMap<RefusalKey, (std::time::Instant, u64)>>,
}

type RefusalKey = (std::net::IpAddr, &'static str);

/// Shortest time between two log lines about refusals of one address for one reason.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Addresses remembered at most; entries older than the interval are forgotten first.
const REFUSAL_LOG_ADDRESSES_MAX: usize = 4096;

impl RefusalLog {
    fn refused(&self, metrics: &Metrics, peer: Option<std::net::SocketAddr>, refusal: &Refusal) {
        metrics.rpc().refused(refusal.kind());
        let Some(peer) = peer else {
            tracing::warn!(reason = %refusal, "refused a connection");
            return;
        };
        let now = std::time::Instant::now();
        let suppressed = {
            let mut last = self.last.lock().expect("refusal log lock");
            if last.len() >= REFUSAL_LOG_ADDRESSES_MAX {
                last.retain(|_, (at, _)| now.duration_since(*at) < REFUSAL_LOG_INTERVAL);
            }
            let room = last.len() < REFUSAL_LOG_ADDRESSES_MAX;
            match last.get_mut(&(peer.ip(), refusal.kind())) {
                Some((at, more)) if now.duration_since(*at) < REFUSAL_LOG_INTERVAL => {
                    *more += 1;
                    return;
                }
                Some((at, more)) => {
                    let suppressed = *more;
                    (*at, *more) = (now, 0);
                    suppressed
                }
                None if room => {
                    last.insert((peer.ip(), refusal.kind()), (now, 0));
                    0
                }
                None => {
                    // Too many addresses at once (a peer rotating its source address): they
                    // share one line per reason and interval.
                    let shared = last
                        .entry((std::net::Ipv6Addr::UNSPECIFIED.into(), refusal.kind()))
                        .or_insert((now, 0));
                    if now.duration_since(shared.0) < REFUSAL_LOG_INTERVAL && shared.1 > 0 {
                        shared.1 += 1;
                        return;
                    }
                    let suppressed = shared.1;
                    *shared = (now, 1);
                    suppressed
                }
            }
        };
        if suppressed == 0 {
            tracing::warn!(%peer, reason = %refusal, "refused a connection");
        } else {
            tracing::warn!(%peer, reason = %refusal, more = suppressed, "refused a connection (and more from this address since the last line)");
        }
    }
}

/// The sockets a service listens on: one per rail (network interface) of its node.
#[derive(Debug)]
pub struct Listeners(Vec<TcpListener>);

impl From<TcpListener> for Listeners {
    fn from(listener: TcpListener) -> Self {
        Listeners(vec![listener])
    }
}

impl Listeners {
    /// Binds every address of `listen` (`host:port`, or several comma-separated: one per
    /// rail).
    ///
    /// # Errors
    /// When an address cannot be bound, with the address named.
    pub async fn bind(listen: &str) -> std::io::Result<Listeners> {
        let mut listeners = Vec::new();
        for address in weft_proto::messages::rails(listen) {
            let listener = TcpListener::bind(address).await.map_err(|error| {
                std::io::Error::new(error.kind(), format!("cannot listen on {address}: {error}"))
            })?;
            listeners.push(listener);
        }
        if listeners.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no address to listen on in {listen:?}"),
            ));
        }
        Ok(Listeners(listeners))
    }

    /// The addresses the sockets took, one per rail.
    ///
    /// # Errors
    /// When a socket's address cannot be read.
    pub fn addresses(&self) -> std::io::Result<Vec<String>> {
        self.0
            .iter()
            .map(|listener| listener.local_addr().map(|address| address.to_string()))
            .collect()
    }

    /// The address peers name this node by: its rails, comma-separated.
    pub fn address(&self) -> String {
        weft_proto::messages::rail_address(&self.addresses().unwrap_or_default())
    }
}

/// Hands every connection accepted on any of `listeners` to `serve` until `shutdown`
/// completes.
async fn accept_until(
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
    serve: impl Fn(TcpStream),
) {
    let (accepted, mut streams) = tokio::sync::mpsc::channel(64);
    let accepting: Vec<_> = listeners
        .0
        .into_iter()
        .map(|listener| tokio::spawn(accept_loop(listener, accepted.clone())))
        .collect();
    drop(accepted);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            stream = streams.recv() => match stream {
                Some(stream) => serve(stream),
                None => break,
            },
        }
    }
    for task in accepting {
        task.abort();
        // Its socket is closed once the task is gone: a service started again in the same
        // process may bind the address at once.
        let _ = task.await;
    }
}

/// Accepts connections on one socket and passes them on until the receiver is gone.
async fn accept_loop(listener: TcpListener, accepted: tokio::sync::mpsc::Sender<TcpStream>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tracing::debug!(%peer, "connection accepted");
                if accepted.send(stream).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                // Running out of file descriptors must not end the accept loop.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// Where a service's metrics go besides its own port.
#[derive(Clone, Debug, Default)]
pub struct Exporters {
    /// A push of the metrics to InfluxDB.
    pub influxdb: Option<weft_observe::influx::InfluxConfig>,
    /// An HTTP-only address for them.
    pub metrics_listen: Option<String>,
}

/// [`serve`], with what the service's config asks for besides: a push of its metrics to
/// InfluxDB, and an HTTP-only address for them (`metrics_listen`).
///
/// # Errors
/// When `metrics_listen` cannot be bound, with the address named.
pub async fn serve_with_exporters<H: Handler>(
    listeners: impl Into<Listeners>,
    handler: Arc<H>,
    metrics: Metrics,
    exporters: Exporters,
    admission: Admission,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let Exporters {
        influxdb,
        metrics_listen,
    } = exporters;
    let http = match metrics_listen.as_deref() {
        Some(address) => {
            Some(spawn_metrics_listener(address, Arc::clone(&handler), metrics.clone()).await?)
        }
        None => None,
    };
    let pusher = influxdb.map(|influxdb| weft_observe::influx::spawn(influxdb, metrics.clone()));
    serve(listeners, handler, metrics, admission, shutdown).await;
    for task in pusher.into_iter().chain(http) {
        task.abort();
    }
    Ok(())
}

/// Binds `address` (a service's `metrics_listen`) and serves HTTP only there — metrics and
/// the handler's pages — until the returned task is aborted.
///
/// # Errors
/// When the address cannot be bound, with the address named.
async fn spawn_metrics_listener<H: Handler>(
    address: &str,
    handler: Arc<H>,
    metrics: Metrics,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(address).await.map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("cannot listen for metrics on {address} (metrics_listen): {error}"),
        )
    })?;
    Ok(tokio::spawn(async move {
        accept_until(listener.into(), std::future::pending(), |stream| {
            tokio::spawn(weft_observe::http::serve_http(
                stream,
                Arc::new(HandlerPages(Arc::clone(&handler))),
                metrics.clone(),
            ));
        })
        .await;
    }))
}

/// What a new connection passes before it is served: the handshake (with its slot among the
/// connections in a handshake), then a slot among the admitted; refusals are logged.
struct Gate {
    auth: Auth,
    refusals: Arc<RefusalLog>,
    slots: Arc<Slots>,
    handshake: tokio::sync::OwnedSemaphorePermit,
}

/// What serves a connection's requests.
struct Serving<H> {
    handler: Arc<H>,
    metrics: Metrics,
    slots: Arc<Slots>,
}

/// Serves a connection as Weft RPC (after its handshake) or as HTTP, by its first bytes.
async fn serve_any<H: Handler>(stream: TcpStream, gate: Gate, serving: Serving<H>) {
    let Gate {
        auth,
        refusals,
        slots,
        handshake,
    } = gate;
    let metrics = serving.metrics.clone();
    let _open = metrics.rpc().connection();
    // Past its handshake a connection moves to a slot of the admitted, if one is free.
    let admit = move || {
        drop(handshake);
        Arc::clone(&slots.admitted).try_acquire_owned().ok()
    };
    let peer = stream.peer_addr().ok();
    // One deadline for the first bytes, TLS and the whole handshake.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let refusal = match tokio::time::timeout_at(deadline, first_bytes(&stream)).await {
        Ok(Some(magic)) if magic == HANDSHAKE_MAGIC || magic[0] == TLS_HANDSHAKE_RECORD => {
            let tls_first = magic[0] == TLS_HANDSHAKE_RECORD;
            match authenticate(stream, tls_first, &auth, deadline).await {
                Ok((stream, from)) => match admit() {
                    Some(_slot) => {
                        return serve_connection(stream, (peer, from), serving).await;
                    }
                    None => Refusal::Full,
                },
                Err(refusal) => refusal,
            }
        }
        Ok(Some(magic)) if magic == FRAME_MAGIC.to_le_bytes() => Refusal::NoHandshake,
        Ok(Some(_)) => {
            let pages = Arc::new(HandlerPages(serving.handler));
            return weft_observe::http::serve_http(stream, pages, metrics).await;
        }
        Ok(None) => return,
        Err(_) => Refusal::Timeout,
    };
    refusals.refused(&metrics, peer, &refusal);
}

/// Runs TLS (when the peer began it) and the key handshake on a new connection, both before
/// `deadline`; the stream, ready for frames, and who the peer proved to be.
async fn authenticate(
    mut stream: TcpStream,
    tls_first: bool,
    auth: &Auth,
    deadline: tokio::time::Instant,
) -> Result<(Stream, Identity), Refusal> {
    crate::connection::tune(&stream);
    match (tls_first, auth.tls()) {
        (false, Some(_)) => {
            auth::refuse(&mut stream, &Refusal::TlsRequired).await;
            Err(Refusal::TlsRequired)
        }
        (false, None) => {
            let (_, from) = in_time(deadline, auth::accept(&mut stream, auth, &[])).await?;
            Ok((Stream::Tcp(stream), from))
        }
        (true, None) => Err(Refusal::TlsUnavailable),
        (true, Some(tls)) => {
            let (mut stream, binding) =
                match tokio::time::timeout_at(deadline, tls.accept(stream)).await {
                    Ok(Ok(accepted)) => accepted,
                    Ok(Err(error)) => return Err(Refusal::TlsFailed(error.to_string())),
                    Err(_) => return Err(Refusal::Timeout),
                };
            let (_, from) = in_time(deadline, auth::accept(&mut stream, auth, &binding)).await?;
            Ok((Stream::Tls(Box::new(stream)), from))
        }
    }
}

/// `handshake`'s outcome, or a timeout at `deadline`.
async fn in_time<T>(
    deadline: tokio::time::Instant,
    handshake: impl Future<Output = Result<T, Refusal>>,
) -> Result<T, Refusal> {
    tokio::time::timeout_at(deadline, handshake)
        .await
        .unwrap_or(Err(Refusal::Timeout))
}

/// Completes once the connection has had no request in flight for `timeout` (a frame that
/// arrives meanwhile ends the wait first).
async fn idle(in_flight: &Semaphore, timeout: Duration) {
    loop {
        tokio::time::sleep(timeout).await;
        if in_flight.available_permits() == REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX {
            return;
        }
    }
}

/// The first byte of a TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The connection's first four bytes, left unread; `None` when it closes before sending them.
async fn first_bytes(stream: &TcpStream) -> Option<[u8; 4]> {
    let mut magic = [0u8; 4];
    let mut pause = Duration::from_millis(1);
    loop {
        match stream.peek(&mut magic).await {
            Ok(0) | Err(_) => return None,
            Ok(4) => return Some(magic),
            // Fewer than four bytes so far: wait for more (peek returns at once while any
            // byte is queued), longer each time, so a peer that sent a byte or two costs a few
            // dozen wakeups before its deadline, not thousands.
            Ok(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
    }
}

async fn serve_connection<H: Handler>(
    stream: Stream,
    (peer, from): (Option<std::net::SocketAddr>, Identity),
    serving: Serving<H>,
) {
    let Serving {
        handler,
        metrics,
        slots,
    } = serving;
    let peer = peer.map(|a| a.to_string()).unwrap_or_default();
    let (mut reader, writer, direct) = stream.split();
    let frames = Outbox::start(writer, direct, REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX);
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX));
    let budget = Arc::new(Semaphore::new(CONNECTION_BUDGET_BYTES));
    loop {
        if frames.is_closed() {
            // The writer gave up on the peer (it does not read its answers).
            return;
        }
        let header = tokio::select! {
            header = read_header(&mut reader) => header,
            () = idle(&in_flight, slots.idle_timeout) => {
                tracing::debug!(%peer, "closing an idle connection");
                return;
            }
        };
        let header = match header {
            Ok(header) => header,
            Err(crate::connection::FrameReadError::Closed) => return,
            Err(error) => {
                tracing::warn!(%peer, %error, "closing connection after a bad frame");
                return;
            }
        };
        if header.kind != FrameKind::Request {
            tracing::warn!(%peer, "closing connection: peer sent a response to a server");
            return;
        }
        // The request's bytes are taken from the connection's budget before they are read:
        // a peer whose requests wait in handlers stops being read (back-pressure) instead
        // of filling memory. A frame as large as the bounds allow always fits the budget.
        let bytes = FRAME_HEADER_BYTES + header.body_len as usize + header.payload_len as usize;
        let held = Arc::clone(&budget)
            .acquire_many_owned(bytes.min(CONNECTION_BUDGET_BYTES) as u32)
            .await
            .expect("semaphore never closed");
        // And from the service's budget: all connections together hold at most that much.
        // A client identity takes at most a quarter of it, from its own share first, so one
        // client cannot stall the others; it never takes from the servers' pool, whatever
        // its header says.
        let held_by_service = slots.take(&from, header.flags, bytes).await;
        let permit = Arc::clone(&in_flight)
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let Some((request, payload, received)) = read_request(&mut reader, &header, &peer).await
        else {
            return;
        };
        let handler = Arc::clone(&handler);
        let frames = frames.clone();
        let metrics = metrics.clone();
        let from = from.clone();
        // Counted from this thread, which read the request, to the one that sends its answer.
        let handoffs = crate::handoffs::Handoffs::here();
        let op = request.op_name();
        let counted = Arc::clone(&handoffs);
        tokio::spawn(counted.trace(async move {
            let frame = answer(
                &*handler,
                &metrics,
                from,
                &header,
                (request, payload),
                received,
            )
            .await;
            // The request is served: its bytes go back to the budgets now, not when its peer
            // takes the answer (a peer that reads nothing is closed by the writer's deadline).
            drop((held, held_by_service));
            let _ = frames.send(frame).await;
            drop(permit);
            metrics.rpc().handoffs(op, handoffs.count());
        }));
    }
}

/// The rest of a request whose header arrived: the request, its payload, and the bytes of the
/// whole frame; `None` (logged) when the connection must close. Once begun, a frame must
/// arrive whole within its deadline: a peer that sends part of one and stalls does not hold
/// the connection and its budget for ever.
async fn read_request(
    reader: &mut crate::tls::ReadHalf,
    header: &weft_proto::codec::FrameHeader,
    peer: &str,
) -> Option<(Request, Bytes, u64)> {
    let rest = read_rest(reader, header, PayloadBuffer::Huge);
    let (body, payload) = match tokio::time::timeout(FRAME_REST_TIMEOUT, rest).await {
        Ok(Ok(rest)) => rest,
        Ok(Err(error)) => {
            tracing::warn!(%peer, %error, "closing connection after a bad frame");
            return None;
        }
        Err(_) => {
            tracing::warn!(%peer, timeout = ?FRAME_REST_TIMEOUT, "closing connection: a frame did not arrive whole in time");
            return None;
        }
    };
    let request = match codec::decode_body_in::<Request>(header.version, &body) {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(%peer, %error, "closing connection after a malformed request");
            return None;
        }
    };
    let received = (FRAME_HEADER_BYTES + body.len() + payload.len()) as u64;
    crate::memory::note_activity(received);
    Some((request, payload, received))
}

/// Serves one request (`received` bytes with its header) of the peer `from`: the handler's
/// answer, or the server's own to [`Request::Stats`], as a response frame in the request's
/// protocol version, timed in the metrics.
async fn answer<H: Handler>(
    handler: &H,
    metrics: &Metrics,
    from: Identity,
    header: &weft_proto::codec::FrameHeader,
    (request, payload): (Request, Bytes),
    received: u64,
) -> OutFrame {
    let timer = metrics
        .rpc()
        .start(request.op_name(), header.origin, received);
    let (body, payload, error) = match request {
        Request::Stats => {
            let stats = metrics.rpc().node_stats(handler.target_stats());
            encode_reply(
                header.version,
                &Ok(StatsResponse::Stats(stats)),
                Bytes::new(),
            )
        }
        request => {
            let handled = async {
                match &from {
                    Identity::Client(name) => match access::for_client(name, &request) {
                        Ok(()) => handler.handle(from, request, payload).await,
                        Err(error) => (Err(error), Bytes::new()),
                    },
                    Identity::Member => handler.handle(from, request, payload).await,
                }
            };
            let (reply, payload) = PEER_VERSION.scope(header.version, handled).await;
            encode_reply(header.version, &reply, payload)
        }
    };
    let head = FrameHead {
        kind: FrameKind::Response,
        request_id: header.request_id,
        origin: 0,
        version: header.version,
        flags: 0,
    };
    let frame = OutFrame::new(head, body, payload);
    timer.finish(error.as_ref(), frame.len() as u64);
    crate::memory::note_activity(frame.len() as u64);
    frame
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod refusal_tests;
