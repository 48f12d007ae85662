//! [`RpcClient`]: a small pool of connections to one peer, with a deadline on every call.
//! Connections are opened lazily and replaced when they break; a request never waits longer
//! than its deadline.

use crate::auth::{self, Auth};
use crate::connection::{ClientConnection, SendError};
use crate::tls::Stream;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use weft_proto::codec::{PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use weft_proto::error::WireError;
use weft_proto::messages::{Request, Response};
use weft_proto::ErrorCode;

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
            RpcError::Remote(error) => {
                matches!(error.code, ErrorCode::Unavailable | ErrorCode::StaleRoute)
            }
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

/// Connections to one peer address.
pub struct RpcClient {
    address: String,
    options: RpcClientOptions,
    slots: Vec<Mutex<Option<Arc<ClientConnection>>>>,
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
    /// A client for `address` (`host:port`); nothing is connected until the first call.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> RpcClient {
        let connections = options.connections.clamp(1, CONNECTIONS_PER_PEER_MAX);
        RpcClient {
            address: address.into(),
            options,
            slots: (0..connections).map(|_| Mutex::new(None)).collect(),
            next_slot: AtomicUsize::new(0),
        }
    }

    /// The peer's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The client name of the key these connections prove, when it is a client key.
    pub fn client_name(&self) -> Option<&str> {
        self.options.auth.client_name()
    }

    async fn connection(&self) -> Result<Arc<ClientConnection>, RpcError> {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut guard = self.slots[slot].lock().await;
        if let Some(connection) = guard.as_ref() {
            // A connection unused for a while is replaced rather than reused: its server
            // may be closing it as idle just now, and a request sent into that would be lost
            // in the race.
            if !connection.is_closed() && connection.idle_for() < REUSE_IDLE_MAX {
                return Ok(Arc::clone(connection));
            }
        }
        let stream = tokio::time::timeout(self.options.connect_timeout, self.open())
            .await
            .map_err(|_| RpcError::Timeout {
                address: self.address.clone(),
                timeout: self.options.connect_timeout,
            })??;
        let (stream, version) = stream;
        let connection = Arc::new(ClientConnection::start(
            stream,
            self.options.origin,
            version,
        ));
        *guard = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// A new connection to the peer, in TLS when configured, authenticated; and the protocol
    /// version agreed.
    async fn open(&self) -> Result<(Stream, u16), RpcError> {
        let transport = |source: TransportError| RpcError::Transport {
            address: self.address.clone(),
            source,
        };
        let stream = TcpStream::connect(&self.address)
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
                    .map_err(|error| self.tls_refused(&error.to_string()))?;
                (Stream::Tls(Box::new(stream)), Some(binding))
            }
        };
        let binding = binding.as_ref().map(|b| b.as_slice()).unwrap_or_default();
        let outcome = match &mut stream {
            Stream::Tcp(tcp) => {
                auth::connect(tcp, (auth, versions), (&self.address, binding)).await
            }
            Stream::Tls(tls) => {
                auth::connect(tls, (auth, versions), (&self.address, binding)).await
            }
        };
        match outcome {
            Ok(version) => Ok((stream, version)),
            // In TLS 1.3 a server refuses a client's certificate after the client finished
            // its side: the refusal shows as the connection closing at the first read.
            Err(auth::ConnectError::Transport(failure)) if auth.tls().is_some() => {
                Err(self.tls_refused(&failure.to_string()))
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

    /// A TLS failure with this peer, said as what to check.
    fn tls_refused(&self, error: &str) -> RpcError {
        RpcError::Refused {
            reason: format!(
                "TLS with {} failed: {error} (does it run with TLS, and are both certificates \
                 from this cluster's CA?)",
                self.address
            ),
            code: ErrorCode::PermissionDenied,
        }
    }

    /// Sends a request with a payload and waits for its answer and payload.
    ///
    /// # Errors
    /// [`RpcError`] when the peer is unreachable, too slow, or answers with an error.
    pub async fn call(
        &self,
        request: &Request,
        payload: Bytes,
    ) -> Result<(Response, Bytes), RpcError> {
        let timeout = self.options.request_timeout;
        let connection = self.connection().await?;
        let transport = |source: TransportError| RpcError::Transport {
            address: self.address.clone(),
            source,
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
                Err(RpcError::Timeout {
                    address: self.address.clone(),
                    timeout,
                })
            }
            Ok(Err(_)) => Err(transport(TransportError::Closed)),
            Ok(Ok(Err(failure))) => Err(transport(failure)),
            Ok(Ok(Ok((Err(error), _)))) => Err(RpcError::Remote(error)),
            Ok(Ok(Ok((Ok(response), payload)))) => {
                crate::memory::note_activity(payload.len() as u64);
                Ok((response, payload))
            }
        }
    }

    /// An error for a response of the wrong type.
    pub fn unexpected(&self, response: &Response) -> RpcError {
        RpcError::Unexpected {
            address: self.address.clone(),
            response: format!("{response:?}"),
        }
    }
}
