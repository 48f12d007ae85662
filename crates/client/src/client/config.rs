//! A client's settings ([`ClientConfig`]): `weft mount --set KEY=VALUE`, or a config file.

use serde::{Deserialize, Serialize};
use std::time::Duration;

weft_net::security_config! {
    /// Configuration of a client (`weft mount`).
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub struct ClientConfig {
        /// Management's address, `host:port` (its rails comma-separated; several management
        /// servers separated by `;`).
        pub mgmt: String,
        /// Connections kept to each server.
        #[serde(default = "default_connections")]
        pub connections_per_server: usize,
        /// Deadline of one request, in milliseconds.
        #[serde(
            rename = "request_timeout_ms",
            default = "default_request_timeout",
            with = "weft_proto::millis"
        )]
        pub request_timeout: Duration,
        /// How long one operation (a read, a write, a namespace call) is retried, in
        /// milliseconds: one deadline for all its retries, while its server is unreachable, its
        /// file moves, its object waits for a truncate or its home is in its grace period.
        #[serde(
            rename = "retry_timeout_ms",
            default = "default_retry_timeout",
            with = "weft_proto::millis"
        )]
        pub retry_timeout: Duration,
        /// Interval of session heartbeats and map refreshes, in milliseconds.
        #[serde(
            rename = "heartbeat_interval_ms",
            default = "default_heartbeat",
            with = "weft_proto::millis"
        )]
        pub heartbeat_interval: Duration,
        /// FUSE worker threads.
        #[serde(default = "default_fuse_threads")]
        pub fuse_threads: usize,
        /// How long the kernel may trust attributes and names it got from the mount, in
        /// milliseconds (0: ask every time). A change made through another mount shows in a stat
        /// here within this time; an open always fetches fresh attributes and drops cached data
        /// (close-to-open consistency).
        #[serde(
            rename = "attr_cache_ms",
            default = "default_attr_cache",
            with = "weft_proto::millis"
        )]
        pub attr_cache: Duration,
        /// Bytes of writes each open file may have on their way to the storage servers before a
        /// write waits (write-behind; 0: every write waits for the servers). Errors of those writes
        /// come back at the file's next write, flush (close) or fsync.
        #[serde(default = "default_write_behind")]
        pub write_behind_bytes: u32,
        /// Bytes read ahead of a reader that reads a file in order, per open file, in windows of
        /// this size (two at most in flight or kept; 0: none beyond the kernel's own). Dropped when
        /// this client writes or truncates the file.
        #[serde(default = "default_read_ahead")]
        pub read_ahead_bytes: u64,
        /// Let the kernel cache writes and trust its own file size (FUSE writeback caching). Only
        /// for files one client writes at a time: another client's writes to a file this one has
        /// cached pages of are not seen until it is opened again. Off by default.
        #[serde(default)]
        pub writeback_cache: bool,
        /// How long a mount waits, in milliseconds, for a metadata server to answer for its
        /// root before it gives up with a message (a mount started before the cluster is up
        /// waits for it instead of answering EIO).
        #[serde(
            rename = "mount_wait_ms",
            default = "default_mount_wait",
            with = "weft_proto::millis"
        )]
        pub mount_wait: Duration,
        /// The newest protocol version the client speaks (default: this build's). Pin it to
        /// the servers' while a cluster is upgraded clients first; a server of any version from
        /// 4 on serves the client.
        #[serde(default = "default_protocol_max")]
        pub protocol_max: u16,
    }
}

fn default_protocol_max() -> u16 {
    weft_proto::codec::PROTOCOL_VERSION
}

fn default_connections() -> usize {
    2
}
fn default_request_timeout() -> Duration {
    Duration::from_millis(30_000)
}
fn default_retry_timeout() -> Duration {
    Duration::from_millis(60_000)
}
fn default_heartbeat() -> Duration {
    Duration::from_millis(5_000)
}
fn default_fuse_threads() -> usize {
    4
}
fn default_attr_cache() -> Duration {
    Duration::from_millis(1_000)
}
fn default_write_behind() -> u32 {
    4 * 1024 * 1024
}

fn default_read_ahead() -> u64 {
    4 * 1024 * 1024
}

fn default_mount_wait() -> Duration {
    Duration::from_secs(120)
}

impl ClientConfig {
    /// A config with every default and the given management address.
    pub fn new(mgmt: impl Into<String>) -> ClientConfig {
        ClientConfig {
            mgmt: mgmt.into(),
            connections_per_server: default_connections(),
            request_timeout: default_request_timeout(),
            retry_timeout: default_retry_timeout(),
            heartbeat_interval: default_heartbeat(),
            fuse_threads: default_fuse_threads(),
            attr_cache: default_attr_cache(),
            write_behind_bytes: default_write_behind(),
            read_ahead_bytes: default_read_ahead(),
            writeback_cache: false,
            mount_wait: default_mount_wait(),
            protocol_max: default_protocol_max(),
            auth_key_file: None,
            auth: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
        }
    }

    /// What the client's connections prove themselves with (`auth_key_file`, `auth`, the TLS
    /// files).
    ///
    /// # Errors
    /// When the config names neither or both, or the key file is unusable.
    pub fn auth(&self) -> Result<weft_net::Auth, String> {
        weft_net::Auth::from_settings(self.auth_settings())
    }
}
