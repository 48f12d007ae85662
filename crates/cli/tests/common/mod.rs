//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;
use weft_testkit::{ClusterSpec, LocalCluster};

/// The `weft` binary under test.
pub fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_weft"))
}

/// Starts the standard test cluster: management, one metadata server, two storage servers
/// with two targets each.
pub fn cluster(spec: ClusterSpec) -> LocalCluster {
    LocalCluster::start(binary(), spec).expect("local cluster starts")
}

/// The errno of a failed operation, or panics if it succeeded.
pub fn errno<T: std::fmt::Debug>(result: std::io::Result<T>) -> i32 {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error
            .raw_os_error()
            .unwrap_or_else(|| panic!("no OS error in {error}")),
    }
}

/// Deterministic test data: every byte depends on its offset and a seed.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Runs the CLI and returns (success, stdout, stderr).
pub fn weft(cluster: &LocalCluster, args: &[&str]) -> (bool, String, String) {
    let output = cluster.weft(args).expect("weft runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
