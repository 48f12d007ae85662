//! What every Weft server process shares, written once.
//!
//! Layout:
//! - [`failpoint`] — fault-injection points armed by an environment variable in tests.
//! - [`durable`] — the one durable-write helper, `renameat2` with flags, and the framed on-disk
//!   record format.
//! - [`config`] — loading a typed TOML config with command-line overrides; unknown keys rejected.
//! - [`identity`] — a node's id kept in its data directory across restarts.
//! - [`missed`] — a mirror primary's durable record of what an absent member misses.
//! - [`usage`] — space and inode usage of a directory's file system.

pub mod config;
pub mod durable;
pub mod failpoint;
pub mod identity;
pub mod missed;
pub mod usage;

/// The host name, used as the default alias of a node or client.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}
