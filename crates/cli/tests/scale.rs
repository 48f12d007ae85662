//! A cluster of hosts: every server and every client host in a network namespace of its own,
//! on two networks (rails), every link rate-limited as between real hosts. Clients keep
//! writing through a cut rail, and what they wrote reads back whole from the other host.

mod common;

use common::{cluster, verify, Writer, RECORD_BYTES};
use std::path::PathBuf;
use weft_testkit::{ClusterSpec, LocalCluster};

/// Cuts `host`'s link on `rail`, waits until every writer wrote 16 more records, and restores
/// the link.
fn write_through_cut(cluster: &LocalCluster, writers: &[Writer], (host, rail): (&str, usize)) {
    cluster.set_rail(host, rail, false).expect("cut the rail");
    for writer in writers {
        writer.advance(
            16 * RECORD_BYTES as u64,
            &format!("writes while {host}'s rail {rail} is cut"),
        );
    }
    cluster
        .set_rail(host, rail, true)
        .expect("restore the rail");
}

fn bytes_on(cluster: &LocalCluster, host: &str) -> [u64; 2] {
    [0, 1].map(|rail| cluster.rail_bytes(host, rail).expect("link counters"))
}

// Goal: a cluster of hosts on two rate-limited rails, with three management servers, serves
// two client hosts; every server is reached over both rails (their traffic spread over both);
// a storage host's rail and then a client host's rail cut, and then management's leader
// killed, while both clients write costs a pause, not an error, and the writes go on; what
// each wrote reads back whole from the other host.
#[test]
fn clients_write_through_a_cut_rail() {
    let mut cluster = cluster(ClusterSpec {
        meta: 1,
        storage: 3,
        targets_per_storage: 1,
        netns: true,
        rails: 2,
        link_rate_mbit: Some(400),
        mgmt_replicas: 3,
        // A cut rail holds a call for up to a heartbeat's deadline: the production defaults
        // of these timeouts are longer still.
        mgmt_settings: vec![
            "node_offline_timeout_ms=10000".into(),
            "session_timeout_ms=10000".into(),
        ],
        ..ClusterSpec::default()
    });
    for name in ["meta-1", "storage-1", "storage-2", "storage-3"] {
        let address = cluster.address_of(name).expect("address");
        assert_eq!(
            address.split(',').count(),
            2,
            "{name} is registered with one address per rail: {address}"
        );
    }
    let first = cluster.mount_on(1, &[]).expect("mount on client host 1");
    let second = cluster.mount_on(2, &[]).expect("mount on client host 2");
    common::make_dir_with_pattern(
        &cluster,
        &first.join("wide"),
        &["--chunk-size", "256K", "--num-targets", "3"],
    );
    let writers = [
        Writer::start(first.join("wide/one"), 1 << 32),
        Writer::start(second.join("wide/two"), 2 << 32),
    ];
    for writer in &writers {
        writer.advance(8 * RECORD_BYTES as u64, "the first records");
    }
    let before = bytes_on(&cluster, "storage-1");

    write_through_cut(&cluster, &writers, ("storage-1", 0));
    write_through_cut(&cluster, &writers, ("client-1", 1));
    // Management's leader killed while both write: another leads, the writes go on.
    let leader = cluster.mgmt_leader().expect("management leads");
    cluster.kill(&leader).expect("kill management's leader");
    for writer in &writers {
        writer.advance(
            8 * RECORD_BYTES as u64,
            "writes after management's leader was killed",
        );
    }
    let next = cluster
        .mgmt_leader()
        .expect("another management server leads");
    assert_ne!(next, leader, "another management server leads");
    for writer in &writers {
        writer.advance(8 * RECORD_BYTES as u64, "writes after the rails are back");
    }
    let [one, two] = writers.map(Writer::stop);
    let after = bytes_on(&cluster, "storage-1");
    for rail in 0..2 {
        assert!(
            after[rail] - before[rail] > 4 * RECORD_BYTES as u64,
            "storage-1's rail {rail} carried part of the writes: {before:?} → {after:?}"
        );
    }
    // Each host reads what the other wrote: nothing of it is in its cache.
    verify(&second.join("wide/one"), 1 << 32, one);
    verify(&first.join("wide/two"), 2 << 32, two);
    common::fsck_clean(&cluster);
}

/// One point of a scaling curve: the hosts, the sum of the rates of the links that limit it,
/// and what fio measured.
struct Point {
    storage: usize,
    clients: usize,
    rails: usize,
    /// Sum of the limiting links' rates, MB/s of frames (each way).
    limit: f64,
    write: f64,
    read: f64,
}

/// Runs one fio job per client mount at once; answers the sum of their rates (MB/s) and the
/// bytes they moved.
fn fio_on_all(mounts: &[PathBuf], job: &[&str]) -> (f64, f64) {
    let runs: Vec<_> = mounts
        .iter()
        .enumerate()
        .map(|(index, mount)| {
            let directory = mount.join("scale").join(format!("client-{}", index + 1));
            std::fs::create_dir_all(&directory).expect("client directory");
            std::process::Command::new("fio")
                .args([
                    "--name=scale",
                    &format!("--directory={}", directory.display()),
                    "--bs=1M",
                    "--direct=1",
                    "--ioengine=libaio",
                    "--iodepth=16",
                    "--numjobs=2",
                    "--group_reporting",
                    "--output-format=json",
                ])
                .args(job)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("fio runs (scripts/test.sh installs it)")
        })
        .collect();
    runs.into_iter()
        .map(|run| {
            let output = run.wait_with_output().expect("fio");
            assert!(
                output.status.success(),
                "fio: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let report: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("fio's JSON report");
            let job = &report["jobs"][0];
            let both = |field: &str| {
                job["write"][field].as_f64().unwrap_or(0.0)
                    + job["read"][field].as_f64().unwrap_or(0.0)
            };
            (both("bw_bytes") / 1e6, both("io_bytes"))
        })
        .fold((0.0, 0.0), |sum, one| (sum.0 + one.0, sum.1 + one.1))
}

/// Measures sequential writes, then reads, of `clients` client hosts against `storage`
/// storage hosts (a target each, every file striped over all), every host on `rails` rails,
/// with storage links at `storage_mbit` and client links at `client_mbit` (None: not
/// limited).
fn measure_point(
    (storage, clients, rails): (usize, usize, usize),
    storage_mbit: Option<u32>,
    client_mbit: Option<u32>,
    seconds: u64,
) -> Point {
    let mut cluster = cluster(ClusterSpec {
        meta: 1,
        storage,
        targets_per_storage: 1,
        netns: true,
        rails,
        link_rate_mbit: storage_mbit,
        client_link_rate_mbit: client_mbit,
        ..ClusterSpec::default()
    });
    let mounts: Vec<PathBuf> = (1..=clients)
        .map(|host| cluster.mount_on(host, &[]).expect("mount"))
        .collect();
    let targets = storage.to_string();
    common::make_dir_with_pattern(
        &cluster,
        &mounts[0].join("scale"),
        &["--chunk-size", "1M", "--num-targets", &targets],
    );
    let sum =
        |hosts: usize, mbit: Option<u32>| mbit.map(|m| (hosts * rails) as f64 * f64::from(m) / 8.0);
    let limit = match (sum(storage, storage_mbit), sum(clients, client_mbit)) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => panic!("a scaling point needs rate-limited links"),
    };
    // Each job writes what the links carry in `seconds`, so the reads find whole files.
    let per_job_mib = ((limit * seconds as f64) / (clients * 2) as f64).ceil() as u64;
    let size = format!("--size={per_job_mib}M");
    // The bytes the limiting links carried (both ways, frames) per byte fio moved: what the
    // protocol, the headers and any read-ahead past what fio read add.
    let limiting: Vec<String> = if storage_mbit.is_some() {
        (1..=storage).map(|s| format!("storage-{s}")).collect()
    } else {
        (1..=clients).map(|c| format!("client-{c}")).collect()
    };
    let carried = || -> f64 {
        limiting
            .iter()
            .flat_map(|host| (0..rails).map(move |rail| (host, rail)))
            .map(|(host, rail)| cluster.rail_bytes(host, rail).expect("link counters") as f64)
            .sum()
    };
    let before = carried();
    let (write, written) = fio_on_all(&mounts, &["--rw=write", &size, "--end_fsync=1"]);
    let between = carried();
    let runtime = format!("--runtime={seconds}");
    let (read, read_bytes) = fio_on_all(&mounts, &["--rw=read", &size, "--time_based", &runtime]);
    let after = carried();
    eprintln!(
        "{storage} storage, {clients} client hosts, {rails} rails: limit {limit:.0} MB/s, write {write:.1} \
         ({:.3} link bytes per byte), read {read:.1} ({:.3} link bytes per byte)",
        (between - before) / written,
        (after - between) / read_bytes,
    );
    drop(cluster);
    Point {
        storage,
        clients,
        rails,
        limit,
        write,
        read,
    }
}

/// A number from the environment, or `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

// Goal: aggregate sequential bandwidth grows with the hosts when the network is the limit:
// 1, 2, 4 and 8 storage hosts (their links limited, two client hosts whose links are not),
// then 1, 2 and 4 client hosts (their links limited) against four storage hosts whose links
// are not, then one storage host on one and on two rails (its links limited); each point as
// a ratio to the sum of the limiting links' rates. Run by
// scripts/bench-scale.sh (release build): writes a Markdown table and an SVG plot into
// WEFT_SCALE_OUT.
#[test]
#[ignore = "a benchmark: scripts/bench-scale.sh"]
fn scaling_curve() {
    let seconds = setting("WEFT_SCALE_SECONDS", 10);
    let storage_mbit = setting("WEFT_SCALE_STORAGE_MBIT", 200) as u32;
    let client_mbit = setting("WEFT_SCALE_CLIENT_MBIT", 400) as u32;
    let out = PathBuf::from(std::env::var("WEFT_SCALE_OUT").unwrap_or_else(|_| ".".into()));
    // WEFT_SCALE_ONLY=storage, clients or rails runs one of the three curves.
    let only = std::env::var("WEFT_SCALE_ONLY").unwrap_or_default();
    let runs = |curve: &str| only.is_empty() || only == curve;
    let mut by_storage = Vec::new();
    for storage in [1, 2, 4, 8].into_iter().filter(|_| runs("storage")) {
        by_storage.push(measure_point(
            (storage, 2, 1),
            Some(storage_mbit),
            None,
            seconds,
        ));
    }
    let mut by_clients = Vec::new();
    for clients in [1, 2, 4].into_iter().filter(|_| runs("clients")) {
        by_clients.push(measure_point(
            (4, clients, 1),
            None,
            Some(client_mbit),
            seconds,
        ));
    }
    // One storage host on one rail, then on two: its rails' bandwidth adds up.
    let mut by_rails = Vec::new();
    for rails in [1, 2].into_iter().filter(|_| runs("rails")) {
        by_rails.push(measure_point(
            (1, 1, rails),
            Some(storage_mbit),
            None,
            seconds,
        ));
    }
    let mut table = String::from(
        "| storage hosts | client hosts | rails | limiting links | link limit MB/s | write MB/s | write / limit | read MB/s | read / limit |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for (points, limiting) in [
        (&by_storage, format!("storage, {storage_mbit} Mbit/s each")),
        (&by_clients, format!("client, {client_mbit} Mbit/s each")),
        (&by_rails, format!("storage, {storage_mbit} Mbit/s each")),
    ] {
        for point in points {
            table.push_str(&format!(
                "| {} | {} | {} | {limiting} | {:.0} | {:.1} | {:.3} | {:.1} | {:.3} |\n",
                point.storage,
                point.clients,
                point.rails,
                point.limit,
                point.write,
                point.write / point.limit,
                point.read,
                point.read / point.limit,
            ));
        }
    }
    print!("{table}");
    std::fs::write(out.join("scale.md"), &table).expect("write the table");
    let series = |points: &[Point], x: fn(&Point) -> usize| {
        vec![
            weft_bench::svg::Series {
                name: "write".into(),
                points: points
                    .iter()
                    .map(|p| (x(p) as f64, p.write / p.limit))
                    .collect(),
            },
            weft_bench::svg::Series {
                name: "read".into(),
                points: points
                    .iter()
                    .map(|p| (x(p) as f64, p.read / p.limit))
                    .collect(),
            },
        ]
    };
    let mut panels = vec![
        weft_bench::svg::Panel {
            title: format!("Storage hosts ({storage_mbit} Mbit/s links), 2 client hosts"),
            x_label: "storage hosts".into(),
            y_label: "bandwidth / link limit".into(),
            series: series(&by_storage, |p| p.storage),
        },
        weft_bench::svg::Panel {
            title: format!("Client hosts ({client_mbit} Mbit/s links), 4 storage hosts"),
            x_label: "client hosts".into(),
            y_label: "bandwidth / link limit".into(),
            series: series(&by_clients, |p| p.clients),
        },
        weft_bench::svg::Panel {
            title: format!("Rails of one storage host ({storage_mbit} Mbit/s each)"),
            x_label: "rails".into(),
            y_label: "bandwidth / link limit".into(),
            series: series(&by_rails, |p| p.rails),
        },
    ];
    panels.retain(|panel| panel.series.iter().any(|series| !series.points.is_empty()));
    std::fs::write(out.join("scale.svg"), weft_bench::svg::render(&panels))
        .expect("write the plot");
}

// Goal: IO500's phases through one mount on a client host of a namespace cluster (four
// storage hosts, two metadata servers, links at WEFT_IO500_MBIT, 2,000 Mbit/s by default).
// Run by scripts/bench-io500.sh (release build), which prints the result beside the local
// disk's and the peers'; its JSON line is appended to WEFT_IO500_JSON.
#[test]
#[ignore = "a benchmark: scripts/bench-io500.sh"]
fn io500_on_hosts() {
    let mbit = setting("WEFT_IO500_MBIT", 2000) as u32;
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        storage: 4,
        targets_per_storage: 1,
        netns: true,
        link_rate_mbit: Some(mbit),
        client_link_rate_mbit: Some(mbit),
        ..ClusterSpec::default()
    });
    let mount = cluster.mount_on(1, &[]).expect("mount");
    let args: Vec<String> = std::env::var("WEFT_IO500_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut command = std::process::Command::new(common::binary());
    command
        .args(["bench", "io500", "--path"])
        .arg(&mount)
        .args(["--label", "weft-hosts"])
        .args(&args);
    if let Ok(json) = std::env::var("WEFT_IO500_JSON") {
        command.args(["--json", &json]);
    }
    let status = command.status().expect("weft bench io500 runs");
    assert!(status.success(), "weft bench io500 failed");
}
