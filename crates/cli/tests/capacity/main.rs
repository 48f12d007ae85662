//! Capacity as operators run it: storage pools (which targets a directory's new files land
//! on), capacity classes that keep new files off full targets, and placement that keeps
//! targets level.

#[path = "../common/mod.rs"]
mod common;

use common::{cluster, make_dir_with_pattern, weft};
use std::fs;
use weft_testkit::ClusterSpec;

/// Runs `weft ARGS --mgmt …` against `cluster`, asserts it succeeded, and returns its output.
fn run_ok(cluster: &weft_testkit::LocalCluster, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--mgmt", cluster.mgmt()]);
    let (ok, out, err) = weft(cluster, &all);
    assert!(ok, "weft {args:?}: {err}");
    out
}

fn row_of(list: &str, name: &str) -> String {
    list.lines()
        .find(|line| line.split_whitespace().nth(1) == Some(name))
        .and_then(|line| line.split_whitespace().nth(2))
        .unwrap_or_default()
        .to_string()
}

/// The `weft_cluster_map_epoch` a service exports.
fn map_epoch(address: &str) -> u64 {
    let (_, text) = weft_testkit::http_get(address, "/metrics").expect("metrics");
    text.lines()
        .find(|line| line.starts_with("weft_cluster_map_epoch"))
        .and_then(|line| line.split_whitespace().last())
        .and_then(|value| value.parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// Waits until every metadata and storage server holds management's latest map.
fn wait_for_the_map(cluster: &weft_testkit::LocalCluster) {
    let latest = map_epoch(&cluster.address_of("mgmt").expect("mgmt"));
    for name in cluster.service_names() {
        let address = cluster.address_of(&name).expect("address");
        weft_testkit::wait_until(&format!("{name} to hold map epoch {latest}"), || {
            map_epoch(&address) >= latest
        })
        .expect("the map reaches every server");
    }
}

/// `weft quota report` as (kind, id, pool name, used, inodes) rows.
fn quota_rows(
    cluster: &weft_testkit::LocalCluster,
    args: &[&str],
) -> Vec<(String, u32, String, String, u64)> {
    let mut all = vec!["quota", "report"];
    all.extend_from_slice(args);
    all.extend(["--mgmt", cluster.mgmt()]);
    let (ok, out, err) = weft(cluster, &all);
    assert!(ok, "quota report: {err}");
    out.lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // TYPE NAME ID POOL (POOL-ID) USED INODES
            assert_eq!(fields.len(), 7, "{line}");
            (
                fields[0].to_string(),
                fields[2].parse().expect("id"),
                fields[3].to_string(),
                fields[5].to_string(),
                fields[6].parse().expect("inodes"),
            )
        })
        .collect()
}

/// Whether `result` failed with EDQUOT.
fn over_quota<T: std::fmt::Debug>(result: std::io::Result<T>) -> bool {
    match result {
        Err(error) => error.raw_os_error() == Some(libc::EDQUOT),
        Ok(value) => panic!("refused with EDQUOT, not done: {value:?}"),
    }
}

/// What `weft quota report` says user `uid` uses, in bytes ("80M", "1K", or bytes), over all
/// pools.
fn bytes_used_by(cluster: &weft_testkit::LocalCluster, uid: &str) -> u64 {
    quota_rows(cluster, &["--user", uid])
        .iter()
        .map(|row| {
            let text = &row.3;
            let (number, unit) = match text.char_indices().last() {
                Some((at, 'G')) => (&text[..at], 1 << 30),
                Some((at, 'M')) => (&text[..at], 1 << 20),
                Some((at, 'K')) => (&text[..at], 1 << 10),
                _ => (text.as_str(), 1),
            };
            number.parse::<u64>().expect("a size") * unit
        })
        .sum()
}

/// Runs `script` with `sh` as user nobody in `dir`: whether it succeeded, and its stderr.
fn as_nobody(dir: &std::path::Path, script: &str) -> (bool, String) {
    let output = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c", script])
        .current_dir(dir)
        .output()
        .expect("runuser");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

mod pools;
mod quotas;
