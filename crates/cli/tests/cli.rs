//! The binary as users run it: `weft up` (start, restart on the same data, stale mount after a
//! kill, clean stop on SIGINT), `weft mount --all` with a mounts file, and the admin listings.

mod common;

use common::{binary, cluster, weft, ProcessGuard};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use weft_testkit::{is_mounted, wait_until, ClusterSpec};

fn start_up(data: &Path, mountpoint: &Path, log: &Path, extra: &[&str]) -> ProcessGuard {
    let log = fs::File::create(log).expect("log file");
    let child = Command::new(binary())
        .args([
            "up",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--mountpoint",
            mountpoint.to_str().expect("utf-8"),
        ])
        .args(extra)
        .env("WEFT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log)
        .spawn()
        .expect("weft up starts");
    ProcessGuard::new(child, mountpoint)
}

// Goal: `weft up` is the one-command quick start: it mounts, prints where things are, stops
// cleanly on SIGINT, brings back the same file system on the same data directory, and detects
// and detaches a stale mount left by a killed run. Method: run the real binary three times.
#[test]
fn up_restart_and_stale_mount() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    let mnt = directory.path().join("mnt");
    let log = directory.path().join("up.log");

    let mut up = start_up(
        &data,
        &mnt,
        &log,
        &["--storage-servers", "2", "--targets-per-server", "2"],
    );
    wait_until("weft up to mount", || is_mounted(&mnt)).expect("mounted");
    wait_until("the start-up report", || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Press Ctrl-C")
    })
    .expect("report");
    let report = fs::read_to_string(&log).expect("log");
    assert!(
        report.contains("mounted at")
            && report.contains("management")
            && report.contains("storage-2"),
        "{report}"
    );
    fs::write(mnt.join("kept"), b"survives restarts").expect("write");
    up.signal(libc::SIGINT);
    let status = up.wait();
    assert!(
        status.success(),
        "clean stop: {}",
        fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(!is_mounted(&mnt), "SIGINT unmounts");

    let mut up = start_up(
        &data,
        &mnt,
        &log,
        &["--storage-servers", "2", "--targets-per-server", "2"],
    );
    wait_until("weft up to mount again", || {
        is_mounted(&mnt) && fs::read(mnt.join("kept")).is_ok()
    })
    .expect("mounted");
    assert_eq!(
        fs::read(mnt.join("kept")).expect("read"),
        b"survives restarts"
    );
    up.kill();
    assert!(is_mounted(&mnt), "a killed run leaves its mount behind");

    let mut up = start_up(
        &data,
        &mnt,
        &log,
        &["--storage-servers", "2", "--targets-per-server", "2"],
    );
    wait_until("weft up to mount over the stale one", || {
        fs::read(mnt.join("kept")).is_ok()
    })
    .expect("mounted");
    let output = fs::read_to_string(&log).expect("log");
    assert!(
        output.contains("stale mount"),
        "the stale mount is reported: {output}"
    );
    up.signal(libc::SIGTERM);
    assert!(up.wait().success());
    assert!(!is_mounted(&mnt), "SIGTERM unmounts");

    let refused = Command::new(binary())
        .args(["up", "--meta-servers", "0"])
        .output()
        .expect("runs");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("between 1 and 64"));
}

// Goal: a mounts file mounts a Weft file system from a client config, like beegfs-mounts.conf.
// Method: write a client config and a mounts file, run `weft mount --all`, use the mount, stop.
#[test]
fn mount_all_from_mounts_file() {
    let cluster = cluster(ClusterSpec::default());
    let directory = cluster.root().join("client");
    fs::create_dir_all(directory.join("mnt")).expect("mkdir");
    fs::write(
        directory.join("client.toml"),
        format!(
            "mgmt = \"{}\"\nfuse_threads = 2\nauth_key_file = \"{}\"\n",
            cluster.mgmt(),
            cluster.key_file().display()
        ),
    )
    .expect("config");
    fs::write(
        directory.join("mounts.conf"),
        format!("# test\n{} client.toml\n", directory.join("mnt").display()),
    )
    .expect("mounts file");
    let mnt = directory.join("mnt");
    let mut child = ProcessGuard::new(
        Command::new(binary())
            .args([
                "mount",
                "--all",
                directory.join("mounts.conf").to_str().expect("utf-8"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("weft mount --all"),
        &mnt,
    );
    wait_until("the mounts file's mount", || is_mounted(&mnt)).expect("mounted");
    fs::write(mnt.join("x"), b"through the mounts file").expect("write");
    assert_eq!(
        fs::read(mnt.join("x")).expect("read"),
        b"through the mounts file"
    );
    child.signal(libc::SIGTERM);
    assert!(child.wait().success());
    assert!(!is_mounted(&mnt));
}

// Goal: the admin listings show the cluster as it is. Method: compare `weft node list`,
// `weft target list --state` and `weft df` with the cluster's shape, asked through a mount
// path and with --mgmt.
#[test]
fn admin_listings() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let (ok, nodes, stderr) = weft(
        &cluster,
        &["node", "list", "--path", mnt.to_str().expect("utf-8")],
    );
    assert!(ok, "{stderr}");
    assert!(
        nodes.contains("meta-1") && nodes.contains("storage-1") && nodes.contains("storage-2"),
        "{nodes}"
    );
    let (ok, targets, stderr) = weft(
        &cluster,
        &["target", "list", "--state", "--mgmt", cluster.mgmt()],
    );
    assert!(ok, "{stderr}");
    assert_eq!(
        targets
            .lines()
            .filter(|line| line.contains(" online ") && line.contains(" good "))
            .count(),
        4,
        "{targets}"
    );
    let (ok, df, stderr) = weft(&cluster, &["df", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{stderr}");
    assert!(
        df.contains("METADATA SERVERS") && df.contains("STORAGE TARGETS"),
        "{df}"
    );
    assert_eq!(
        df.lines()
            .filter(|line| line.starts_with("target "))
            .count(),
        4,
        "{df}"
    );
    let (ok, _, stderr) = weft(
        &cluster,
        &[
            "entry",
            "info",
            mnt.join("missing").to_str().expect("utf-8"),
        ],
    );
    assert!(!ok && stderr.contains("cannot stat"), "{stderr}");
}

// Goal: `weft bench meta` runs every phase through a mount and through the native client,
// reports a rate for each, and leaves nothing behind. Method: a small run against a cluster of
// two metadata servers, then `weft fsck` and an empty root.
#[test]
fn bench_meta_through_mount_and_native() {
    let mut cluster = cluster(ClusterSpec {
        meta: 2,
        ..ClusterSpec::default()
    });
    let mnt = cluster.mount().expect("mount");
    let mount_text = mnt.to_str().expect("utf-8").to_string();
    let mgmt = cluster.mgmt().to_string();
    for target in [["--path", mount_text.as_str()], ["--mgmt", mgmt.as_str()]] {
        let mut args = vec![
            "bench",
            "meta",
            "--files",
            "20",
            "--dirs",
            "4",
            "--threads",
            "1,2",
        ];
        args.extend(target);
        let (ok, table, stderr) = weft(&cluster, &args);
        assert!(ok, "{stderr}");
        for phase in ["mkdir", "create", "stat", "read", "unlink", "rmdir"] {
            let rows = table
                .lines()
                .filter(|line| line.split_whitespace().nth(2) == Some(phase))
                .count();
            assert_eq!(rows, 2, "{phase} measured at 1 and 2 threads:\n{table}");
        }
    }
    assert_eq!(
        fs::read_dir(&mnt).expect("readdir").count(),
        0,
        "the benchmark cleans up"
    );
    let (ok, report, stderr) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{report}{stderr}");
}

// Goal: `weft bench io` runs its sequential and random phases through a mount (buffered and
// O_DIRECT, a file per thread and one shared file, one or four random requests in flight per
// thread) and through the native client, checks the data it reads, writes JSON lines and an
// SVG plot, and leaves nothing behind.
// Method: small runs against a local cluster; parse what they wrote.
#[test]
fn bench_io_through_mount_and_native() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let out = tempfile::tempdir().expect("tempdir");
    let (json, svg) = (out.path().join("io.jsonl"), out.path().join("io.svg"));
    let mount_text = mnt.to_str().expect("utf-8").to_string();
    let mgmt = cluster.mgmt().to_string();
    // Two of the runs keep 4 random requests in flight per thread; their reads check the data
    // like the others.
    let runs: [&[&str]; 4] = [
        &["--path", &mount_text],
        &["--path", &mount_text, "--direct", "--queue-depth", "4"],
        &["--path", &mount_text, "--shared-file"],
        &["--mgmt", &mgmt, "--shared-file", "--queue-depth", "4"],
    ];
    for extra in runs {
        let mut args = vec![
            "bench",
            "io",
            "--size",
            "2M",
            "--block-size",
            "256K",
            "--threads",
            "1,2",
            "--random-ops",
            "20",
        ];
        args.extend(["--json", json.to_str().expect("utf-8")]);
        args.extend(["--svg", svg.to_str().expect("utf-8")]);
        args.extend(extra);
        let (ok, table, stderr) = weft(&cluster, &args);
        assert!(ok, "{extra:?}: {stderr}");
        for phase in ["write", "read", "randwrite", "randread"] {
            let rows = table
                .lines()
                .filter(|line| line.split_whitespace().nth(2) == Some(phase))
                .count();
            assert_eq!(rows, 2, "{extra:?}: {phase} at 1 and 2 threads:\n{table}");
        }
        let plot = fs::read_to_string(&svg).expect("svg");
        assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
        assert_eq!(plot.matches("<polyline").count(), 4, "four lines: {plot}");
    }
    let lines: Vec<serde_json::Value> = fs::read_to_string(&json)
        .expect("json")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(
        lines.len(),
        4 * 8,
        "a line per phase and thread count of every run"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|line| line["config"]["queue_depth"] == 4)
            .count(),
        2 * 8,
        "the queue depth is recorded with the results"
    );
    for line in &lines {
        assert!(
            line["result"]["mb_per_second"].as_f64().expect("rate") > 0.0,
            "{line}"
        );
        assert_eq!(line["result"]["bytes"].as_u64().map(|b| b > 0), Some(true));
    }
    assert_eq!(
        fs::read_dir(&mnt).expect("readdir").count(),
        0,
        "the benchmark cleans up"
    );
    let (ok, report, stderr) = weft(&cluster, &["fsck", "--mgmt", cluster.mgmt()]);
    assert!(ok, "{report}{stderr}");
}

// Goal: `weft bench net` moves data through the client path and the protocol while the storage
// servers skip their disks: every phase reports a rate, no object reaches a target, and the
// files it made are gone afterwards. Method: a small run, then look at the target directories.
#[test]
fn bench_net_skips_the_disks() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let objects = |cluster: &weft_testkit::LocalCluster| {
        (1..=2)
            .flat_map(|storage| (1..=2).map(move |target| (storage, target)))
            .map(|(storage, target)| {
                count_files(&cluster.target_dir(storage, target).join("objects"))
            })
            .sum::<usize>()
    };
    fs::write(mnt.join("kept"), vec![1u8; 4 << 20]).expect("write");
    let before = objects(&cluster);
    assert!(before > 0, "a written file has objects on the targets");
    let (ok, table, stderr) = weft(
        &cluster,
        &[
            "bench",
            "net",
            "--mgmt",
            cluster.mgmt(),
            "--size",
            "4M",
            "--threads",
            "1,2",
            "--random-ops",
            "20",
        ],
    );
    assert!(ok, "{stderr}");
    for phase in ["write", "read", "randwrite", "randread"] {
        assert_eq!(
            table
                .lines()
                .filter(|line| line.split_whitespace().nth(2) == Some(phase))
                .count(),
            2,
            "{phase} at 1 and 2 threads:\n{table}"
        );
    }
    assert_eq!(objects(&cluster), before, "no data reached a disk");
    assert_eq!(
        fs::read_dir(&mnt).expect("readdir").count(),
        1,
        "its files are gone"
    );
    let (ok, _, stderr) = weft(
        &cluster,
        &["bench", "net", "--path", mnt.to_str().expect("utf-8")],
    );
    assert!(
        !ok && stderr.contains("--mgmt"),
        "a mount is refused: {stderr}"
    );
}

// Goal: `weft bench storage` has every storage server measure each of its targets — a write
// run, then a read run of the same files — reports every target with the bytes asked for,
// writes JSON lines, and its cleanup removes the files. Method: small runs on the standard
// cluster (two servers, two targets each); look at the target directories.
#[test]
fn bench_storage_measures_every_target() {
    let cluster = cluster(ClusterSpec::default());
    let out = tempfile::tempdir().expect("tempdir");
    let json = out.path().join("storage.jsonl");
    let svg = out.path().join("storage.svg");
    let json_text = json.to_str().expect("utf-8");
    for kind in ["--write", "--read"] {
        let mut args = vec![
            "bench",
            "storage",
            "start",
            "--size",
            "4M",
            "--block-size",
            "256K",
            "--threads",
            "2",
            "--wait",
            "--json",
            json_text,
            "--svg",
            svg.to_str().expect("utf-8"),
            "--mgmt",
            cluster.mgmt(),
        ];
        if kind == "--read" {
            args.push("--read");
        }
        let (ok, table, stderr) = weft(&cluster, &args);
        assert!(ok, "{kind}: {stderr}");
        let rows: Vec<&str> = table
            .lines()
            .filter(|line| line.starts_with("storage-"))
            .collect();
        assert_eq!(rows.len(), 4, "every target measured:\n{table}");
        for row in rows {
            assert!(row.contains(" 8388608 ") && row.ends_with("done"), "{row}");
        }
    }
    let lines = fs::read_to_string(&json).expect("json");
    assert_eq!(lines.lines().count(), 8, "a JSON line per target and run");
    assert!(fs::read_to_string(&svg).expect("svg").contains("<polyline"));
    let bench_dirs = || {
        (1..=2)
            .flat_map(|storage| (1..=2).map(move |target| (storage, target)))
            .filter(|(storage, target)| {
                cluster.target_dir(*storage, *target).join("bench").exists()
            })
            .count()
    };
    assert_eq!(bench_dirs(), 4, "the files are on every target");
    let (ok, _, stderr) = weft(
        &cluster,
        &["bench", "storage", "cleanup", "--mgmt", cluster.mgmt()],
    );
    assert!(ok, "{stderr}");
    assert_eq!(bench_dirs(), 0, "cleanup removes them");
    let (ok, _, stderr) = weft(
        &cluster,
        &[
            "bench",
            "storage",
            "start",
            "--read",
            "--size",
            "1M",
            "--wait",
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(
        !ok && stderr.contains("run a write first"),
        "a read needs files: {stderr}"
    );
}

// Goal: `weft bench sweep` measures every combination of chunk size, target count and
// connections asked for, names the winner of each phase with its margin, and leaves nothing
// behind. Method: a 2 x 2 x 1 sweep with small sizes.
#[test]
fn bench_sweep_names_a_winner() {
    let mut cluster = cluster(ClusterSpec::default());
    let mnt = cluster.mount().expect("mount");
    let out = tempfile::tempdir().expect("tempdir");
    let (json, svg) = (out.path().join("sweep.jsonl"), out.path().join("sweep.svg"));
    let (ok, table, stderr) = weft(
        &cluster,
        &[
            "bench",
            "sweep",
            "--mgmt",
            cluster.mgmt(),
            "--size",
            "2M",
            "--chunk-sizes",
            "256K,1M",
            "--num-targets",
            "1,2",
            "--connections",
            "1",
            "--json",
            json.to_str().expect("utf-8"),
            "--svg",
            svg.to_str().expect("utf-8"),
            "--repeat",
            "1",
        ],
    );
    assert!(ok, "{stderr}");
    let rows = table
        .lines()
        .filter(|line| line.split_whitespace().count() == 7 && !line.contains("chunk"))
        .count();
    assert_eq!(rows, 4, "a row per configuration:\n{table}");
    for phase in ["write", "read"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&format!("{phase}: best chunk"))),
            "{phase} has a winner:\n{table}"
        );
    }
    let lines = fs::read_to_string(&json).expect("json").lines().count();
    assert_eq!(lines, 4 * 2, "write and read of each configuration");
    let plot = fs::read_to_string(&svg).expect("svg");
    assert_eq!(plot.matches("<polyline").count(), 2, "write and read lines");
    assert_eq!(
        fs::read_dir(&mnt).expect("readdir").count(),
        0,
        "the sweep cleans up"
    );
}

fn count_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| {
            if entry.path().is_dir() {
                count_files(&entry.path())
            } else {
                1
            }
        })
        .sum()
}

// Goal: `weft up --meta-servers 2` runs a namespace spread over two metadata servers in one
// process, consistent by fsck, and stops cleanly. Method: make directories and files through
// its mount, read the management address from its report, run fsck, send SIGTERM.
#[test]
fn up_with_two_metadata_servers() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (data, mnt, log) = (
        directory.path().join("data"),
        directory.path().join("mnt"),
        directory.path().join("up.log"),
    );
    let mut up = start_up(
        &data,
        &mnt,
        &log,
        &["--meta-servers", "2", "--targets-per-server", "2"],
    );
    wait_until("the start-up report", || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Press Ctrl-C")
    })
    .expect("report");
    let report = fs::read_to_string(&log).expect("log");
    assert_eq!(report.matches("metadata     meta-").count(), 2, "{report}");
    let mgmt = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("management"))
        .expect("management line")
        .trim()
        .to_string();
    for index in 0..6 {
        let dir = mnt.join(format!("d{index}"));
        fs::create_dir(&dir).expect("mkdir");
        fs::write(dir.join("f"), b"x").expect("write");
    }
    let output = Command::new(binary())
        .args(["fsck", "--mgmt", &mgmt])
        .output()
        .expect("fsck");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    up.signal(libc::SIGTERM);
    assert!(up.wait().success());
    assert!(!is_mounted(&mnt));
}

// Goal: a mount started while no metadata server can answer for its root waits for one,
// saying so, instead of mounting and answering EIO; it comes up and serves once the server is
// back. A mount told to wait less gives up with a message that says what to start. Method: a
// cluster of real processes with its metadata server killed; two mounts, one with
// `mount_wait_ms=1500`; then the metadata server started again.
#[test]
fn a_mount_waits_for_its_cluster_or_says_why_not() {
    let mut cluster = cluster(ClusterSpec::default());
    cluster.kill("meta-1").expect("kill the metadata server");
    let (impatient, impatient_name) = cluster
        .start_mount(&["mount_wait_ms=1500"])
        .expect("start a mount");
    let (patient, patient_name) = cluster.start_mount(&[]).expect("start a mount");
    wait_until("the mount to say it waits", || {
        cluster
            .log(&patient_name)
            .contains("waiting for a metadata server to answer for the root")
    })
    .expect("the mount says it waits");
    assert!(
        !is_mounted(&patient),
        "nothing is mounted before the root answers"
    );
    wait_until("the impatient mount to give up", || {
        cluster.mount_has_exited(&impatient)
    })
    .expect("the impatient mount gives up");
    let said = cluster.log(&impatient_name);
    assert!(
        said.contains("no metadata server answered for the root directory")
            && said.contains("weft serve meta"),
        "{said}"
    );
    assert!(
        !is_mounted(&impatient),
        "a mount that gave up left nothing mounted"
    );

    cluster
        .restart("meta-1")
        .expect("start the metadata server again");
    wait_until("the waiting mount to come up", || {
        is_mounted(&patient) && fs::read_dir(&patient).is_ok()
    })
    .expect("the mount comes up once its root answers");
    fs::write(patient.join("after"), b"served").expect("write");
    assert_eq!(fs::read(patient.join("after")).expect("read"), b"served");
}
