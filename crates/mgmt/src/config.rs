//! Configuration of the management service.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default listening address of management.
pub const MGMT_LISTEN_DEFAULT: &str = "127.0.0.1:8008";
/// Default time without a heartbeat after which a node is offline.
pub const NODE_OFFLINE_TIMEOUT_MS_DEFAULT: u64 = 30_000;

/// Configuration of `weft serve mgmt`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MgmtConfig {
    /// Directory holding the management store; created if missing.
    pub data_dir: PathBuf,
    /// Address to listen on, `host:port`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// A node silent this long is offline; silent half as long, probably offline.
    #[serde(default = "default_offline_timeout")]
    pub node_offline_timeout_ms: u64,
    /// A client session silent this long has expired: servers drop its locks and opens.
    #[serde(default = "default_session_timeout")]
    pub session_timeout_ms: u64,
    /// The directory-rename lock is taken back from a holder that did not release it (it
    /// crashed) after this long.
    #[serde(default = "default_rename_lock_lease")]
    pub rename_lock_lease_ms: u64,
    /// How often management samples every server's load for the cluster view, `weft stats`
    /// and the web page, and checks for nodes gone offline and targets filling up.
    #[serde(default = "default_stats_interval")]
    pub stats_interval_ms: u64,
    /// A storage mirror group's primary silent this long is replaced by a good member, and a
    /// silent member leaves its group. Primaries get a lease shorter than this by their
    /// heartbeat interval and a margin, so an old primary stops before a new one starts;
    /// I/O to a group pauses for about this long when its primary's server dies.
    #[serde(default = "default_promotion_timeout")]
    pub mirror_promotion_timeout_ms: u64,
    /// Connections this service keeps open at most; beyond it new ones are closed at once
    /// (their peers retry). A quarter of them (at least 8) may be in their handshake at once.
    #[serde(default = "default_connections_max")]
    pub connections_max: usize,
    /// The cluster key file (`weft keygen FILE`): every connection, made or accepted, proves
    /// it holds this key. Required unless `auth = "none"`.
    #[serde(default)]
    pub auth_key_file: Option<PathBuf>,
    /// `"none"` runs without authentication: any peer that reaches the port can read and
    /// change everything (logged as a warning at every start).
    #[serde(default)]
    pub auth: Option<weft_net::AuthMode>,
    /// TLS for every connection this process makes and accepts: its certificate (PEM),
    /// signed by the cluster's CA. With `tls_key_file` and `tls_ca_file`; absent: plain TCP.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of `tls_cert_file` (PEM).
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// The cluster's CA certificate (PEM): peers must present a certificate it signed.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// Log filter: `info` (the default), `debug`, or per module, e.g. `info,weft_meta=debug`.
    /// `--log` and `WEFT_LOG` win over it.
    #[serde(default)]
    pub log: Option<String>,
    /// Also serve the metrics (and management's pages) over HTTP on this address, e.g.
    /// `127.0.0.1:9100`; they are always served on `listen` too.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Optional push of this service's metrics to InfluxDB (`[influxdb]`: `url`, `database`,
    /// `interval_ms`).
    #[serde(default)]
    pub influxdb: Option<weft_net::influx::InfluxConfig>,
}

/// Default time a mirror group's primary may be silent before a good member replaces it.
pub const MIRROR_PROMOTION_TIMEOUT_MS_DEFAULT: u64 = 6_000;

fn default_promotion_timeout() -> u64 {
    MIRROR_PROMOTION_TIMEOUT_MS_DEFAULT
}

/// Default interval of management's samples of the servers.
pub const STATS_INTERVAL_MS_DEFAULT: u64 = 2_000;

fn default_stats_interval() -> u64 {
    STATS_INTERVAL_MS_DEFAULT
}

/// Default lease of the directory-rename lock.
pub const RENAME_LOCK_LEASE_MS_DEFAULT: u64 = 30_000;

fn default_rename_lock_lease() -> u64 {
    RENAME_LOCK_LEASE_MS_DEFAULT
}

/// Default time without a heartbeat after which a client session expires.
pub const SESSION_TIMEOUT_MS_DEFAULT: u64 = 60_000;

fn default_session_timeout() -> u64 {
    SESSION_TIMEOUT_MS_DEFAULT
}

fn default_listen() -> String {
    MGMT_LISTEN_DEFAULT.to_string()
}

fn default_offline_timeout() -> u64 {
    NODE_OFFLINE_TIMEOUT_MS_DEFAULT
}

fn default_connections_max() -> usize {
    weft_net::CONNECTIONS_MAX_DEFAULT
}

impl MgmtConfig {
    /// Who this service lets in, and how many at once.
    ///
    /// # Errors
    /// When the security keys contradict each other or a file is unusable.
    pub fn admission(&self) -> Result<weft_net::Admission, String> {
        Ok(weft_net::Admission::new(
            weft_net::Auth::for_service(self.auth_settings())?,
            self.connections_max,
        ))
    }

    /// The security keys of this config.
    pub fn auth_settings(&self) -> weft_net::auth::AuthSettings<'_> {
        weft_net::auth::AuthSettings {
            mode: self.auth,
            key_file: self.auth_key_file.as_deref(),
            tls_cert_file: self.tls_cert_file.as_deref(),
            tls_key_file: self.tls_key_file.as_deref(),
            tls_ca_file: self.tls_ca_file.as_deref(),
        }
    }

    /// Reports every problem of the config at once.
    ///
    /// # Errors
    /// A list of problems, one per line.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if self.connections_max < 16 {
            problems.push(format!(
                "connections_max = {} is below 16",
                self.connections_max
            ));
        }
        if self.node_offline_timeout_ms < 100 {
            problems.push(format!(
                "node_offline_timeout_ms = {} is below 100",
                self.node_offline_timeout_ms
            ));
        }
        if self.stats_interval_ms < 100 {
            problems.push(format!(
                "stats_interval_ms = {} is below 100",
                self.stats_interval_ms
            ));
        }
        if self.session_timeout_ms < 100 {
            problems.push(format!(
                "session_timeout_ms = {} is below 100",
                self.session_timeout_ms
            ));
        }
        if self.mirror_promotion_timeout_ms < 1_000 {
            problems.push(format!(
                "mirror_promotion_timeout_ms = {} is below 1000: it must exceed a lease and a storage heartbeat interval",
                self.mirror_promotion_timeout_ms
            ));
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() && !self.listen.contains(':') {
            problems.push(format!("listen = {:?} is not host:port", self.listen));
        }
        if let Some(influxdb) = &self.influxdb {
            if let Err(problem) = influxdb.validate() {
                problems.push(problem);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}
