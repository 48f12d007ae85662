//! Configuration of the management service.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Default listening address of management.
pub const MGMT_LISTEN_DEFAULT: &str = "127.0.0.1:8008";
/// Default time without a heartbeat after which a node is offline.
pub const NODE_OFFLINE_TIMEOUT_DEFAULT: Duration = Duration::from_millis(30_000);

weft_net::service_config! {
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
        #[serde(
            rename = "node_offline_timeout_ms",
            default = "default_offline_timeout",
            with = "weft_proto::millis"
        )]
        pub node_offline_timeout: Duration,
        /// A client session silent this long has expired: servers drop its locks and opens.
        #[serde(
            rename = "session_timeout_ms",
            default = "default_session_timeout",
            with = "weft_proto::millis"
        )]
        pub session_timeout: Duration,
        /// The directory-rename lock is taken back from a holder that did not release it (it
        /// crashed) after this long.
        #[serde(
            rename = "rename_lock_lease_ms",
            default = "default_rename_lock_lease",
            with = "weft_proto::millis"
        )]
        pub rename_lock_lease: Duration,
        /// How often management samples every server's load for the cluster view, `weft stats`
        /// and the web page, and checks for nodes gone offline and targets filling up.
        #[serde(
            rename = "stats_interval_ms",
            default = "default_stats_interval",
            with = "weft_proto::millis"
        )]
        pub stats_interval: Duration,
        /// A storage mirror group's primary silent this long is replaced by a good member, and a
        /// silent member leaves its group. Primaries get a lease shorter than this by their
        /// heartbeat interval and a margin, so an old primary stops before a new one starts;
        /// I/O to a group pauses for about this long when its primary's server dies.
        #[serde(
            rename = "mirror_promotion_timeout_ms",
            default = "default_promotion_timeout",
            with = "weft_proto::millis"
        )]
        pub mirror_promotion_timeout: Duration,
        /// How long a user or group may stay over a soft quota limit before what the limit
        /// counts is refused as over a hard one.
        #[serde(
            rename = "quota_grace_period_ms",
            default = "default_quota_grace",
            with = "weft_proto::millis"
        )]
        pub quota_grace_period: Duration,
        /// Every management server of a replicated management, this one included, each as
        /// nodes and clients reach it (its rails comma-separated), in the same order in every
        /// server's config: 3 or 5 of them, which keep serving while a majority runs. Empty
        /// (the default): this server alone.
        #[serde(default)]
        pub replicas: Vec<String>,
        /// Which of `replicas` this server is: 1 for the first. Server 1 starts the replicated
        /// log the first time.
        #[serde(default)]
        pub replica: u64,
        /// Whether the cluster view over HTTP (`/api/cluster` and the web page), which anyone
        /// who reaches management's port can read, shows the client sessions and every
        /// quota's rule and use. Off by default: those are for the cluster's members (`weft
        /// cluster status` with the cluster key, `weft quota list`); turn it on where the
        /// port is reached from a trusted network only.
        #[serde(default)]
        pub web_details: bool,
        /// Most live sessions one client key may hold at once: a registration past it is
        /// refused, so a client key cannot make management's store grow without bound.
        /// Sessions end when their clients stop heartbeating. Members are not counted.
        #[serde(default = "default_sessions_per_client")]
        pub sessions_per_client: usize,
    }
}

/// Default for `sessions_per_client`: far more mounts and jobs than one host runs.
pub const SESSIONS_PER_CLIENT_DEFAULT: usize = 1024;

fn default_sessions_per_client() -> usize {
    SESSIONS_PER_CLIENT_DEFAULT
}

/// Default grace period of soft quota limits: a week.
pub const QUOTA_GRACE_PERIOD_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);

fn default_quota_grace() -> Duration {
    QUOTA_GRACE_PERIOD_DEFAULT
}

/// Default time a mirror group's primary may be silent before a good member replaces it.
pub const MIRROR_PROMOTION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(6_000);

fn default_promotion_timeout() -> Duration {
    MIRROR_PROMOTION_TIMEOUT_DEFAULT
}

/// Default interval of management's samples of the servers.
pub const STATS_INTERVAL_DEFAULT: Duration = Duration::from_millis(2_000);

fn default_stats_interval() -> Duration {
    STATS_INTERVAL_DEFAULT
}

/// Default lease of the directory-rename lock.
pub const RENAME_LOCK_LEASE_DEFAULT: Duration = Duration::from_millis(30_000);

fn default_rename_lock_lease() -> Duration {
    RENAME_LOCK_LEASE_DEFAULT
}

/// Default time without a heartbeat after which a client session expires.
pub const SESSION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(60_000);

fn default_session_timeout() -> Duration {
    SESSION_TIMEOUT_DEFAULT
}

fn default_listen() -> String {
    MGMT_LISTEN_DEFAULT.to_string()
}

fn default_offline_timeout() -> Duration {
    NODE_OFFLINE_TIMEOUT_DEFAULT
}

impl MgmtConfig {
    /// Reports every problem of the config at once.
    ///
    /// # Errors
    /// A list of problems, one per line.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        self.shared_problems(&mut problems);
        if self.node_offline_timeout < Duration::from_millis(100) {
            problems.push(format!(
                "node_offline_timeout_ms = {} is below 100",
                self.node_offline_timeout.as_millis()
            ));
        }
        if self.stats_interval < Duration::from_millis(100) {
            problems.push(format!(
                "stats_interval_ms = {} is below 100",
                self.stats_interval.as_millis()
            ));
        }
        if self.session_timeout < Duration::from_millis(100) {
            problems.push(format!(
                "session_timeout_ms = {} is below 100",
                self.session_timeout.as_millis()
            ));
        }
        if self.mirror_promotion_timeout < Duration::from_millis(1_000) {
            problems.push(format!(
                "mirror_promotion_timeout_ms = {} is below 1000: it must exceed a lease and a storage heartbeat interval",
                self.mirror_promotion_timeout.as_millis()
            ));
        }
        if !self.replicas.is_empty() {
            if self.replicas.len() < 3 || self.replicas.len() % 2 == 0 {
                problems.push(format!(
                    "replicas lists {} management servers: list 3 or 5 (an even number survives \
                     no more failures than one fewer), or none for a single management server",
                    self.replicas.len()
                ));
            }
            if self.replica == 0 || self.replica > self.replicas.len() as u64 {
                problems.push(format!(
                    "replica = {} does not name one of the {} replicas: set it to this server's \
                     place in the list, 1 for the first",
                    self.replica,
                    self.replicas.len()
                ));
            }
            if let Some(bad) = self.replicas.iter().find(|address| {
                address.contains(';')
                    || weft_proto::messages::rails(address).next().is_none()
                    || weft_proto::messages::rails(address).any(|rail| !rail.contains(':'))
            }) {
                problems.push(format!(
                    "replicas: {bad:?} is not one server's address (host:port, its rails separated by commas)"
                ));
            }
        } else if self.replica != 0 {
            problems.push(format!(
                "replica = {} but replicas lists no management server: list them all, or leave replica out",
                self.replica
            ));
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() && !self.listen.contains(':') {
            problems.push(format!("listen = {:?} is not host:port", self.listen));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}
