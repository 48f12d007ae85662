//! Configuration of a metadata server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default listening address of a metadata server.
pub const META_LISTEN_DEFAULT: &str = "127.0.0.1:8005";
/// Default heartbeat interval.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 2_000;

/// How a new file's storage targets are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetChooser {
    /// A random set of targets per file (spreads load without coordination).
    #[default]
    Randomized,
    /// Consecutive targets, rotating the start per file.
    Roundrobin,
}

/// Configuration of `weft serve meta`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    /// Directory holding the metadata target; must exist.
    pub data_dir: PathBuf,
    /// Address to listen on, `host:port` (port 0 picks a free one).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Management's address, `host:port`.
    pub mgmt: String,
    /// Name shown in listings; the host name by default.
    #[serde(default)]
    pub alias: Option<String>,
    /// How new files choose their targets.
    #[serde(default)]
    pub target_chooser: TargetChooser,
    /// How new directories choose their metadata server (their home).
    #[serde(default)]
    pub directory_chooser: TargetChooser,
    /// Interval between heartbeats to management.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// After a start, only locks that clients reclaim are granted for this long, and files
    /// unlinked while open wait this long for clients to open them again before they are
    /// disposed of. It must exceed the clients' heartbeat interval, at which they notice the
    /// restart.
    #[serde(default = "default_lock_grace")]
    pub lock_grace_ms: u64,
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

/// Default lock-reclaim grace period after a start.
pub const LOCK_GRACE_MS_DEFAULT: u64 = 15_000;

fn default_lock_grace() -> u64 {
    LOCK_GRACE_MS_DEFAULT
}

fn default_listen() -> String {
    META_LISTEN_DEFAULT.to_string()
}

fn default_heartbeat() -> u64 {
    HEARTBEAT_INTERVAL_MS_DEFAULT
}

fn default_connections_max() -> usize {
    weft_net::CONNECTIONS_MAX_DEFAULT
}

impl MetaConfig {
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
        if !self.data_dir.is_dir() {
            problems.push(weft_service::config::missing_directory(
                "data_dir",
                &self.data_dir,
            ));
        }
        if self.heartbeat_interval_ms == 0 {
            problems.push("heartbeat_interval_ms must be above 0".to_string());
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
