//! Configuration of a storage server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Default listening address of a storage server.
pub const STORAGE_LISTEN_DEFAULT: &str = "127.0.0.1:8003";

weft_net::service_config! {
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
        /// Management's address, `host:port` (its rails comma-separated; several management
        /// servers separated by `;`).
        pub mgmt: String,
        /// Name shown in listings; the host name by default.
        #[serde(default)]
        pub alias: Option<String>,
        /// Interval between heartbeats to management.
        #[serde(
            rename = "heartbeat_interval_ms",
            default = "default_heartbeat",
            with = "weft_proto::millis"
        )]
        pub heartbeat_interval: Duration,
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
    }
}

fn default_listen() -> String {
    STORAGE_LISTEN_DEFAULT.to_string()
}

fn default_heartbeat() -> Duration {
    Duration::from_millis(2_000)
}

fn default_direct_write_min() -> u64 {
    256 << 10
}

impl StorageConfig {
    /// Reports every problem of the config at once.
    ///
    /// # Errors
    /// A list of problems, one per line.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        self.shared_problems(&mut problems);
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
        if self.heartbeat_interval.is_zero() {
            problems.push("heartbeat_interval_ms must be above 0".to_string());
        }
        let inline = crate::service::INLINE_IO_BYTES as u64;
        if self.direct_write_min_bytes != 0 && self.direct_write_min_bytes < inline {
            problems.push(format!(
                "direct_write_min_bytes = {} is too small: give 0 (off) or at least {inline}; writes below {inline} bytes are answered on the network thread, which must not wait for the disk",
                self.direct_write_min_bytes
            ));
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
