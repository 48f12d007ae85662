//! Weft's network layer: framed RPC over TCP for every role, between holders of the cluster key.
//!
//! Layout:
//! - [`auth`] — the cluster key and the handshake every connection runs before its first frame.
//! - [`buffer`] — huge-page buffers for large payloads, pooled (fewer segments per direct transfer).
//! - [`connection`] — one TCP connection with many requests in flight, matched by request id.
//! - [`handoffs`] — counts the threads a request's work crosses, for the metrics and the tests.
//! - [`kept`] — a client's changes to a metadata home not yet on its disk, kept for a replay.
//! - [`client`] — [`RpcClient`], a pool of connections to one peer with deadlines.
//! - [`server`] — [`serve`], the accept loop that hands each request to a [`Handler`], and HTTP
//!   on the same port to `weft_observe` (metrics, the service's pages, the InfluxDB push).
//! - [`memory`] — free memory handed back to the kernel when the process is idle.
//! - [`mirror`] — a server's side of its mirror groups: versions, lease, delivery, resync bookkeeping.
//! - [`retry`] — the one retry and backoff policy.
//! - [`tls`] — optional TLS: certificates of the cluster's CA both ways, and the stream type.
//! - [`stubs`] — typed clients per service, used by the client library and by servers alike.
//!
//! A malformed frame closes its connection and is logged; it never takes a server down.

pub mod auth;
pub mod buffer;
pub mod capability;
pub mod client;
pub mod cluster;
pub mod config;
mod connection;
pub mod handoffs;
pub mod kept;
pub mod memory;
pub mod mirror;
mod outbox;
pub mod retry;
pub mod server;
pub mod stubs;
pub mod tls;

pub use auth::{Auth, AuthMode};
pub use client::{RpcClient, RpcClientOptions, RpcError, TransportError};
pub use cluster::ClusterView;
pub use server::{
    serve, serve_with_exporters, Admission, Exporters, Handler, Listeners, CONNECTIONS_MAX_DEFAULT,
};
pub use stubs::{MetaClient, MgmtClient, ObjectWrite, Session, StorageClient};
pub use weft_proto::messages::{rail_address, rails};
pub use weft_proto::messages::{MetaCalls, MgmtCalls};

/// For [`service_config!`]'s `influxdb` key.
#[doc(hidden)]
pub use weft_observe as observe;
