//! [`RpcClient`]: a small pool of connections to one peer, with a deadline on every call.
//! Connections are opened lazily and replaced when they break; a request never waits longer
//! than its deadline.

use crate::auth::{self, Auth};
use crate::connection::{ClientConnection, SendError};
use crate::tls::Stream;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use weft_proto::codec::{PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use weft_proto::error::WireError;
use weft_proto::messages::{rails, Request};
use weft_proto::{ErrorCode, Recovery};

/// Default deadline of one request.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default time allowed to open a connection.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Most connections one client keeps to one peer.
pub const CONNECTIONS_PER_PEER_MAX: usize = 64;

/// Why the bytes to or from a peer did not get through.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The OS failed a connect, a read or a write.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error, shared by every call the broken connection carried.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The peer closed the connection.
    #[error("connection closed")]
    Closed,
    /// The peer broke the protocol: a frame or a handshake message that makes no sense.
    #[error("{0}")]
    Protocol(String),
}

impl TransportError {
    /// An OS error met while doing `what`.
    pub fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> TransportError {
        move |source| TransportError::Io {
            what,
            source: Arc::new(source),
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The peer answered with an error.
    #[error("{0}")]
    Remote(WireError),
    /// The peer could not be reached or the connection broke.
    #[error("cannot reach {address}: {source}")]
    Transport {
        /// The peer.
        address: String,
        /// What happened.
        #[source]
        source: TransportError,
    },
    /// No answer within the deadline.
    #[error("{address} did not answer within {timeout:?}")]
    Timeout {
        /// The peer.
        address: String,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The peer refused the connection's handshake (another key, none, another protocol
    /// version): asking again will not help.
    #[error("{reason}")]
    Refused {
        /// What failed and what to do, naming the peer.
        reason: String,
        /// Why, as a code: `PermissionDenied` for keys, `VersionMismatch` for versions.
        code: ErrorCode,
    },
    /// The peer answered with a response of the wrong type.
    #[error("{address} answered with an unexpected response: {response}")]
    Unexpected {
        /// The peer.
        address: String,
        /// What came back.
        response: String,
    },
}

impl RpcError {
    /// The error code a caller maps to errno.
    pub fn code(&self) -> ErrorCode {
        match self {
            RpcError::Remote(error) => error.code,
            RpcError::Transport { .. } => ErrorCode::Unavailable,
            RpcError::Timeout { .. } => ErrorCode::TimedOut,
            RpcError::Refused { code, .. } => *code,
            RpcError::Unexpected { .. } => ErrorCode::Internal,
        }
    }

    /// Whether the same request may succeed if sent again: the peer was not reached or busy.
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::Remote(error) => error.code.recovery() == Recovery::Reroute,
            RpcError::Transport { .. } | RpcError::Timeout { .. } => true,
            RpcError::Refused { .. } | RpcError::Unexpected { .. } => false,
        }
    }
}

/// Longest a pooled connection is reused after its last request: well below a server's idle
/// timeout ([`crate::server::IDLE_TIMEOUT_DEFAULT`]).
const REUSE_IDLE_MAX: Duration = Duration::from_secs(60);

/// Tunables of an [`RpcClient`].
#[derive(Clone, Debug)]
pub struct RpcClientOptions {
    /// Connections kept to the peer; requests spread over them.
    pub connections: usize,
    /// Deadline of one request.
    pub request_timeout: Duration,
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// The client session the requests are sent for (the low 32 bits of its id; 0 for servers
    /// and tools), stamped on every frame so servers can count load per client.
    pub origin: u32,
    /// What the connections prove themselves with.
    pub auth: Auth,
    /// The newest protocol version offered in the handshake: [`PROTOCOL_VERSION`], or lower
    /// to act as a peer of an older version (compatibility tests).
    pub protocol_max: u16,
}

impl Default for RpcClientOptions {
    fn default() -> Self {
        RpcClientOptions {
            connections: 2,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            origin: 0,
            auth: Auth::none(),
            protocol_max: PROTOCOL_VERSION,
        }
    }
}

/// How long a rail whose connect or connection failed is passed over when a connection is
/// opened: long enough not to wait for a dead link's connect timeout on every call, short
/// enough to use the rail again soon after it is back.
const RAIL_REST: Duration = Duration::from_secs(5);

/// One address of the peer, and when a connect or connection over it last failed.
struct Rail {
    address: String,
    failed: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Rail {
    fn new(address: impl Into<String>) -> Rail {
        Rail {
            address: address.into(),
            failed: std::sync::Mutex::new(None),
        }
    }

    fn fail(&self) {
        *self.failed.lock().expect("rail lock poisoned") = Some(std::time::Instant::now());
    }

    /// Whether the rail failed less than [`RAIL_REST`] ago.
    fn resting(&self) -> bool {
        self.failed
            .lock()
            .expect("rail lock poisoned")
            .is_some_and(|at| at.elapsed() < RAIL_REST)
    }
}

/// A pooled connection and the rail it runs over.
struct Pooled {
    rail: usize,
    connection: Arc<ClientConnection>,
}

/// What the connections to one peer share with the tasks that move them back to their rails.
struct Pool {
    rails: Vec<Rail>,
    options: RpcClientOptions,
    slots: Vec<Mutex<Option<Pooled>>>,
    /// Per slot: a connection over its own rail is being opened in the background.
    returning: Vec<std::sync::atomic::AtomicBool>,
}

/// Connections to one peer, spread over its rails: slot `i` runs over rail `i % rails`, moves
/// to another rail while its own fails, and back once it answers again.
pub struct RpcClient {
    address: String,
    pool: Arc<Pool>,
    next_slot: AtomicUsize,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("address", &self.address)
            .finish()
    }
}

impl RpcClient {
    /// A client for `address` (`host:port`, or several comma-separated: the peer's rails);
    /// nothing is connected until the first call. Each rail gets at least one connection.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> RpcClient {
        let address = address.into();
        let mut rails: Vec<Rail> = rails(&address).map(Rail::new).collect();
        if rails.is_empty() {
            // Connecting to it fails with the address named, as for any bad address.
            rails.push(Rail::new(address.as_str()));
        }
        let connections = options
            .connections
            .max(rails.len())
            .clamp(1, CONNECTIONS_PER_PEER_MAX);
        RpcClient {
            address,
            pool: Arc::new(Pool {
                rails,
                options,
                slots: (0..connections).map(|_| Mutex::new(None)).collect(),
                returning: (0..connections)
                    .map(|_| std::sync::atomic::AtomicBool::new(false))
                    .collect(),
            }),
            next_slot: AtomicUsize::new(0),
        }
    }

    /// The peer's address, as given (all its rails).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The client name of the key these connections prove, when it is a client key.
    pub fn client_name(&self) -> Option<&str> {
        self.pool.options.auth.client_name()
    }

    /// A connection for the next call, and its rail.
    async fn connection(&self) -> Result<(usize, Arc<ClientConnection>), RpcError> {
        let pool = &self.pool;
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        let own_rail = slot % pool.rails.len();
        let mut guard = pool.slots[slot].lock().await;
        if let Some(pooled) = guard.as_ref() {
            // A connection unused for a while is replaced rather than reused: its server
            // may be closing it as idle just now, and a request sent into that would be lost
            // in the race.
            let connection = &pooled.connection;
            if !connection.is_closed() && connection.idle_for() < REUSE_IDLE_MAX {
                if pooled.rail != own_rail && !pool.rails[own_rail].resting() {
                    Pool::return_to_rail(pool, slot, own_rail);
                }
                return Ok((pooled.rail, Arc::clone(connection)));
            }
            if connection.is_closed() && pool.rails.len() > 1 {
                // A connection that broke may have broken with its link: the new one tries
                // the other rails first.
                pool.rails[pooled.rail].fail();
            }
        }
        // The slot's own rail first, then the others; rails that failed just now last.
        let mut order: Vec<usize> = (0..pool.rails.len())
            .map(|step| (own_rail + step) % pool.rails.len())
            .collect();
        order.sort_by_key(|&rail| pool.rails[rail].resting());
        let mut last = None;
        for rail in order {
            match pool.open_on(rail).await {
                Ok(connection) => {
                    *guard = Some(Pooled {
                        rail,
                        connection: Arc::clone(&connection),
                    });
                    return Ok((rail, connection));
                }
                Err(error @ RpcError::Refused { .. }) => return Err(error),
                Err(error) => {
                    pool.rails[rail].fail();
                    last = Some(error);
                }
            }
        }
        Err(last.expect("a peer has at least one rail"))
    }
}

impl Pool {
    /// A new connection over `rail`, within the connect timeout.
    async fn open_on(&self, rail: usize) -> Result<Arc<ClientConnection>, RpcError> {
        let address = &self.rails[rail].address;
        let (stream, version) =
            tokio::time::timeout(self.options.connect_timeout, self.open(address))
                .await
                .map_err(|_| RpcError::Timeout {
                    address: address.clone(),
                    timeout: self.options.connect_timeout,
                })??;
        Ok(Arc::new(ClientConnection::start(
            stream,
            self.options.origin,
            version,
        )))
    }

    /// Opens a connection over `slot`'s own `rail` in the background and puts it in the slot
    /// once it stands; the calls meanwhile go on over the connection the slot has.
    fn return_to_rail(pool: &Arc<Pool>, slot: usize, rail: usize) {
        if pool.returning[slot].swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(pool);
        tokio::spawn(async move {
            match pool.open_on(rail).await {
                Ok(connection) => {
                    tracing::debug!(rail = %pool.rails[rail].address, "connection back on its rail");
                    *pool.slots[slot].lock().await = Some(Pooled { rail, connection });
                }
                Err(_) => pool.rails[rail].fail(),
            }
            pool.returning[slot].store(false, Ordering::Release);
        });
    }

    /// A new connection to the peer, in TLS when configured, authenticated; and the protocol
    /// version agreed.
    async fn open(&self, address: &str) -> Result<(Stream, u16), RpcError> {
        let transport = |source: TransportError| RpcError::Transport {
            address: address.to_string(),
            source,
        };
        let stream = TcpStream::connect(address)
            .await
            .map_err(|error| transport(TransportError::io("connect")(error)))?;
        crate::connection::tune(&stream);
        let auth = &self.options.auth;
        let versions = (PROTOCOL_VERSION_MIN, self.options.protocol_max);
        let (mut stream, binding) = match auth.tls() {
            None => (Stream::Tcp(stream), None),
            Some(tls) => {
                // The TCP connection stands: a failure now is the peer's certificate, or a
                // peer that runs without TLS (which closes at once), and asking again will
                // not help.
                let (stream, binding) = tls
                    .connect(stream)
                    .await
                    .map_err(|error| tls_refused(address, &error.to_string()))?;
                (Stream::Tls(Box::new(stream)), Some(binding))
            }
        };
        let binding = binding.as_ref().map(|b| b.as_slice()).unwrap_or_default();
        let outcome = match &mut stream {
            Stream::Tcp(tcp) => auth::connect(tcp, (auth, versions), (address, binding)).await,
            Stream::Tls(tls) => auth::connect(tls, (auth, versions), (address, binding)).await,
        };
        match outcome {
            Ok(version) => Ok((stream, version)),
            // In TLS 1.3 a server refuses a client's certificate after the client finished
            // its side: the refusal shows as the connection closing at the first read.
            Err(auth::ConnectError::Transport(failure)) if auth.tls().is_some() => {
                Err(tls_refused(address, &failure.to_string()))
            }
            Err(auth::ConnectError::Transport(failure)) => Err(transport(failure)),
            Err(auth::ConnectError::Refused(reason)) => Err(RpcError::Refused {
                reason,
                code: ErrorCode::PermissionDenied,
            }),
            Err(auth::ConnectError::Version(reason)) => Err(RpcError::Refused {
                reason,
                code: ErrorCode::VersionMismatch,
            }),
        }
    }
}

/// A TLS failure with the peer at `address`, said as what to check.
fn tls_refused(address: &str, error: &str) -> RpcError {
    RpcError::Refused {
        reason: format!(
            "TLS with {address} failed: {error} (does it run with TLS, and are both \
             certificates from this cluster's CA?)"
        ),
        code: ErrorCode::PermissionDenied,
    }
}

impl RpcClient {
    /// Sends a request with a payload and waits for its answer and payload.
    ///
    /// # Errors
    /// [`RpcError`] when the peer is unreachable, too slow, or answers with an error.
    pub async fn call<R: DeserializeOwned>(
        &self,
        request: &Request,
        payload: Bytes,
    ) -> Result<(R, Bytes), RpcError> {
        self.call_within(request, payload, self.pool.options.request_timeout)
            .await
    }

    /// [`RpcClient::call`] with a deadline of its own: for calls that must fail over to
    /// another rail sooner than a cut link is noticed (heartbeats, which hold leases).
    ///
    /// # Errors
    /// [`RpcError`] when the peer is unreachable, too slow, or answers with an error.
    pub async fn call_within<R: DeserializeOwned>(
        &self,
        request: &Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(R, Bytes), RpcError> {
        let (rail, connection) = self.connection().await?;
        let transport = |source: TransportError| {
            // Calls meanwhile open their connections over the peer's other rails.
            self.pool.rails[rail].fail();
            RpcError::Transport {
                address: self.pool.rails[rail].address.clone(),
                source,
            }
        };
        crate::memory::note_activity(payload.len() as u64);
        let (request_id, receiver) = match connection.send(request, payload).await {
            Ok(sent) => sent,
            Err(SendError::Closed) => return Err(transport(TransportError::Closed)),
            Err(SendError::TooNew(reason)) => {
                return Err(RpcError::Refused {
                    reason: format!("{}: {reason}", self.address),
                    code: ErrorCode::VersionMismatch,
                })
            }
        };
        match tokio::time::timeout(timeout, receiver).await {
            Err(_) => {
                connection.forget(request_id);
                if self.pool.rails.len() > 1 {
                    // The rail may be cut (a stalled link shows no error for many seconds):
                    // the next call of this slot opens a connection, over another rail while
                    // this one rests. Calls still waiting on this connection keep it.
                    self.pool.rails[rail].fail();
                    connection.retire();
                }
                Err(RpcError::Timeout {
                    address: self.pool.rails[rail].address.clone(),
                    timeout,
                })
            }
            Ok(Err(_)) => Err(transport(TransportError::Closed)),
            Ok(Ok(Err(failure))) => Err(transport(failure)),
            Ok(Ok(Ok(answered))) => match answered.reply::<R>() {
                Err(failure) => Err(transport(failure)),
                Ok(Err(error)) => Err(RpcError::Remote(error)),
                Ok(Ok(response)) => {
                    crate::memory::note_activity(answered.payload.len() as u64);
                    Ok((response, answered.payload))
                }
            },
        }
    }

    /// An error for a response that does not carry what its request declares.
    pub fn unexpected(&self, response: &impl std::fmt::Debug) -> RpcError {
        RpcError::Unexpected {
            address: self.address.clone(),
            response: format!("{response:?}"),
        }
    }
}
