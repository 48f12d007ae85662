//! Configuration of a storage server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default listening address of a storage server.
pub const STORAGE_LISTEN_DEFAULT: &str = "127.0.0.1:8003";

/// Configuration of `weft serve storage`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Directory holding the node's identity; must exist.
    pub data_dir: PathBuf,
    /// Storage target directories, one per target; each must exist.
    pub targets: Vec<PathBuf>,
    /// Address to listen on, `host:port` (port 0 picks a free one).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Management's address, `host:port`.
    pub mgmt: String,
    /// Name shown in listings; the host name by default.
    #[serde(default)]
    pub alias: Option<String>,
    /// Interval between heartbeats to management.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_ms: u64,
    /// Most bytes of object data each target may hold (a quota); unlimited when absent.
    #[serde(default)]
    pub target_capacity_bytes: Option<u64>,
    /// Test mode: keep written data in memory until it is synced, so that killing the process
    /// loses exactly what a power loss would. Never use in production.
    #[serde(default)]
    pub crash_test_discard_unsynced: bool,
    /// Read and write object data with O_DIRECT on every target of this server: the page
    /// cache is bypassed (unaligned edges are read, modified and written whole). Durability is
    /// unchanged: a client's fsync still syncs the objects.
    #[serde(default)]
    pub direct_io: bool,
    /// On a target without `direct_io`, writes of at least this many bytes whose offset and
    /// length are multiples of 4 KiB go to the disk with O_DIRECT: streams skip the copy
    /// into the page cache and its writeback, while small writes and every read keep the
    /// cache. Reads of data written that way come from the disk. 0 sends every write through
    /// the page cache; otherwise at least 16 KiB (smaller writes are answered on the network
    /// thread, which must not wait for the disk).
    #[serde(default = "default_direct_write_min")]
    pub direct_write_min_bytes: u64,
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

fn default_listen() -> String {
    STORAGE_LISTEN_DEFAULT.to_string()
}

fn default_heartbeat() -> u64 {
    2_000
}

fn default_direct_write_min() -> u64 {
    256 << 10
}

fn default_connections_max() -> usize {
    weft_net::CONNECTIONS_MAX_DEFAULT
}

impl StorageConfig {
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
        let missing = weft_service::config::missing_directory;
        if !self.data_dir.is_dir() {
            problems.push(missing("data_dir", &self.data_dir));
        }
        if self.targets.is_empty() {
            problems.push("targets is empty: give at least one target directory".to_string());
        }
        for target in &self.targets {
            if !target.is_dir() {
                problems.push(missing("target", target));
            }
        }
        if self.heartbeat_interval_ms == 0 {
            problems.push("heartbeat_interval_ms must be above 0".to_string());
        }
        if let Some(influxdb) = &self.influxdb {
            if let Err(problem) = influxdb.validate() {
                problems.push(problem);
            }
        }
        let inline = crate::service::INLINE_IO_BYTES as u64;
        if self.direct_write_min_bytes != 0 && self.direct_write_min_bytes < inline {
            problems.push(format!(
                "direct_write_min_bytes = {} is too small: give 0 (off) or at least {inline}; writes below {inline} bytes are answered on the network thread, which must not wait for the disk",
                self.direct_write_min_bytes
            ));
        }
        if self.direct_io && self.crash_test_discard_unsynced {
            problems.push(
                "direct_io and crash_test_discard_unsynced exclude each other: the crash test keeps writes in memory"
                    .to_string(),
            );
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(direct_write_min_bytes: u64) -> StorageConfig {
        let dir = std::env::temp_dir();
        toml::from_str(&format!(
            "data_dir = {dir:?}\ntargets = [{dir:?}]\nmgmt = \"127.0.0.1:1\"\ndirect_write_min_bytes = {direct_write_min_bytes}\n"
        ))
        .expect("parses")
    }

    // Goal: a direct-write threshold below the size of writes answered on the network thread
    // is refused with what to give instead; 0 (off) and the default are accepted.
    #[test]
    fn direct_write_threshold_is_off_or_above_inline_writes() {
        let refused = config(4096).validate().expect_err("4 KiB is refused");
        assert!(
            refused.contains("direct_write_min_bytes = 4096") && refused.contains("give 0"),
            "{refused}"
        );
        config(0).validate().expect("0 turns it off");
        config(default_direct_write_min())
            .validate()
            .expect("the default");
    }
}
