//! Configuration of a metadata server.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Default listening address of a metadata server.
pub const META_LISTEN_DEFAULT: &str = "127.0.0.1:8005";
/// Default heartbeat interval.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_millis(2_000);

/// How a new file's storage targets are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetChooser {
    /// A random set of targets per file (spreads load without coordination).
    Randomized,
    /// Consecutive targets, rotating the start per file.
    Roundrobin,
    /// A random set of targets per file, each drawn with a weight of its free bytes: emptier
    /// targets get more of the new files, so targets filled unevenly (or added later) level
    /// out. As a `directory_chooser`: a metadata server drawn with a weight of how many
    /// fewer inodes it holds than the fullest, so a server that joins takes most new
    /// directories until it catches up. The default.
    #[default]
    Balanced,
}

weft_net::service_config! {
    /// Configuration of `weft serve meta`.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub struct MetaConfig {
        /// Directory holding the metadata target; must exist.
        pub data_dir: PathBuf,
        /// Address to listen on, `host:port` (port 0 picks a free one).
        #[serde(default = "default_listen")]
        pub listen: String,
        /// Management's address, `host:port` (its rails comma-separated; several management
        /// servers separated by `;`).
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
        #[serde(
            rename = "heartbeat_interval_ms",
            default = "default_heartbeat",
            with = "weft_proto::millis"
        )]
        pub heartbeat_interval: Duration,
        /// After a start, only locks that clients reclaim are granted for this long, and files
        /// unlinked while open wait this long for clients to open them again before they are
        /// disposed of. It must exceed the clients' heartbeat interval, at which they notice the
        /// restart.
        #[serde(
            rename = "lock_grace_ms",
            default = "default_lock_grace",
            with = "weft_proto::millis"
        )]
        pub lock_grace: Duration,
        /// Bytes per second background rebalancing copies at most, per metadata home: data
        /// moves from a pool's fullest target to its emptiest (targets just added, most of
        /// all) at this rate at most, so foreground I/O keeps most of its throughput. 0
        /// turns rebalancing off.
        #[serde(default = "default_rebalance_rate")]
        pub rebalance_bytes_per_second: u64,
        /// Rebalancing goes on while a target's fill (the share of its bytes used) is more
        /// than this many percentage points from its pool's mean.
        #[serde(default = "default_rebalance_margin")]
        pub rebalance_margin_percent: u8,
        /// Bytes of the store's change log (`meta.redb.rows`) its records fill before a
        /// checkpoint writes their rows into the store's tables: more means fewer
        /// checkpoints, more rows in memory and a longer start after a crash. 0 logs nothing:
        /// every batch of changes is committed to the tables and synced there. At most
        /// 8388608 (8 MiB).
        #[serde(default = "default_checkpoint_bytes")]
        pub checkpoint_bytes: u64,
        /// Answer each client's change only once it is on disk (true), or as soon as it is
        /// made and logged, its client keeping it until the home has it on disk and replaying
        /// it after a restart (false, the default; docs/design/crash-consistency.md,
        /// "Durability by replay"). Either way a server killed alone loses nothing
        /// acknowledged; with false, a client lost together with its server loses its changes
        /// that no fsync covered.
        #[serde(default = "default_sync_every_change")]
        pub sync_every_change: bool,
        /// After a start that may have lost changes answered before their sync, how long the
        /// home waits at most for its clients to replay them; clients that are gone by then
        /// lose theirs, and every change made after the first of them.
        #[serde(
            rename = "recovery_window_ms",
            default = "default_recovery_window",
            with = "weft_proto::millis"
        )]
        pub recovery_window: Duration,
        /// How long a change answered before its sync (with `sync_every_change` off, and a
        /// size report at close) may wait for it, in milliseconds. Unset: clients' changes are
        /// synced 2 ms after the first of a group; size reports at most 1 s after. A longer
        /// delay groups more changes per sync, and a restart has more to replay.
        #[serde(default)]
        pub sync_delay_ms: Option<u64>,
        /// How long, in milliseconds, a client that made a directory may answer that a name
        /// is not in it without asking, renewed by each create it makes there (a names
        /// lease, docs/design/namespace.md): a create's lookup of its new name then costs no
        /// round trip. A name another client adds there waits until the lease ran out, and so
        /// does every name added in the first moments after a start. 0 grants none; at most
        /// 10000.
        #[serde(
            rename = "names_lease_ms",
            default = "default_names_lease",
            with = "weft_proto::millis"
        )]
        pub names_lease: Duration,
    }
}

/// Default length of a names lease without a renewal: a holder renews it with each create it
/// makes in the directory, and a name another client adds waits at most this long.
pub const NAMES_LEASE_DEFAULT: Duration = Duration::from_millis(250);

/// Longest names lease a home grants.
pub const NAMES_LEASE_MAX: Duration = Duration::from_millis(10_000);

fn default_names_lease() -> Duration {
    NAMES_LEASE_DEFAULT
}

fn default_sync_every_change() -> bool {
    false
}

/// Default longest wait for the clients' replays after a start: a client finds the restarted
/// home at its next heartbeat (5 s), or later if it was waiting out a call to the home's old
/// address; one that missed a 10 s window under load answered its application EIO.
pub const RECOVERY_WINDOW_DEFAULT: Duration = Duration::from_millis(30_000);

fn default_recovery_window() -> Duration {
    RECOVERY_WINDOW_DEFAULT
}

/// Default checkpoint interval: every 8 MiB of the change log's records.
pub const CHECKPOINT_BYTES_DEFAULT: u64 = 8 << 20;

fn default_checkpoint_bytes() -> u64 {
    CHECKPOINT_BYTES_DEFAULT
}

/// Default rate of background rebalancing: 32 MiB/s per metadata home.
pub const REBALANCE_BYTES_PER_SECOND_DEFAULT: u64 = 32 << 20;

/// Default margin of background rebalancing: 5 percentage points of fill.
pub const REBALANCE_MARGIN_PERCENT_DEFAULT: u8 = 5;

fn default_rebalance_rate() -> u64 {
    REBALANCE_BYTES_PER_SECOND_DEFAULT
}

fn default_rebalance_margin() -> u8 {
    REBALANCE_MARGIN_PERCENT_DEFAULT
}

/// Default lock-reclaim grace period after a start.
pub const LOCK_GRACE_DEFAULT: Duration = Duration::from_millis(15_000);

fn default_lock_grace() -> Duration {
    LOCK_GRACE_DEFAULT
}

fn default_listen() -> String {
    META_LISTEN_DEFAULT.to_string()
}

fn default_heartbeat() -> Duration {
    HEARTBEAT_INTERVAL_DEFAULT
}

impl MetaConfig {
    /// Reports every problem of the config at once.
    ///
    /// # Errors
    /// A list of problems, one per line.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        self.shared_problems(&mut problems);
        if !self.data_dir.is_dir() {
            problems.push(weft_service::config::missing_directory(
                "data_dir",
                &self.data_dir,
            ));
        }
        if self.heartbeat_interval.is_zero() {
            problems.push("heartbeat_interval_ms must be above 0".to_string());
        }
        if !(1..=50).contains(&self.rebalance_margin_percent) {
            problems.push(format!(
                "rebalance_margin_percent is {}: give 1 to 50 (percentage points of fill)",
                self.rebalance_margin_percent
            ));
        }
        if self.checkpoint_bytes > CHECKPOINT_BYTES_DEFAULT {
            problems.push(format!(
                "checkpoint_bytes is {}: give 0 to {CHECKPOINT_BYTES_DEFAULT} (bytes of the \
                 change log between checkpoints; 0 logs nothing)",
                self.checkpoint_bytes
            ));
        }
        if self.names_lease > NAMES_LEASE_MAX {
            problems.push(format!(
                "names_lease_ms is {}: give 0 to {} (how long a directory's maker answers for \
                 names not in it; 0 grants no lease)",
                self.names_lease.as_millis(),
                NAMES_LEASE_MAX.as_millis()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}
