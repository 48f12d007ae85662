//! Observability: a real Prometheus scrapes a running cluster.

mod common;

use common::{cluster, pattern, weft, ProcessGuard};
use std::fs;
use std::process::{Command, Stdio};
use weft_testkit::{free_port, http_get, wait_until, ClusterSpec};

/// `text` with everything but letters and digits percent-encoded, for a URL's query.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// A running Prometheus with its own config, data directory and port.
struct Prometheus {
    address: String,
    _process: ProcessGuard,
}

impl Prometheus {
    fn start(directory: &std::path::Path, targets: &[String]) -> Prometheus {
        fs::create_dir_all(directory).expect("prometheus directory");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: weft\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = directory.join("prometheus.yml");
        fs::write(&config_path, config).expect("prometheus config");
        let address = format!("127.0.0.1:{}", free_port().expect("free port"));
        let log = fs::File::create(directory.join("prometheus.log")).expect("log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                directory.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus runs (scripts/test.sh installs it)");
        Prometheus {
            address,
            _process: ProcessGuard::new(child, directory),
        }
    }

    /// The instant vector of `query` as (labels, value) pairs; `None` until Prometheus answers.
    fn query(&self, query: &str) -> Option<Vec<(serde_json::Value, f64)>> {
        let path = format!("/api/v1/query?query={}", url_encode(query));
        let (status, body) = http_get(&self.address, &path).ok()?;
        if status != 200 {
            return None;
        }
        let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = answer["data"]["result"].as_array()?;
        Some(
            result
                .iter()
                .filter_map(|sample| {
                    let value = sample["value"][1].as_str()?.parse::<f64>().ok()?;
                    Some((sample["metric"].clone(), value))
                })
                .collect(),
        )
    }

    /// The single value of a scalar-like query (a sum), or 0 when there is none yet.
    fn value(&self, query: &str) -> f64 {
        self.query(query)
            .and_then(|samples| samples.first().map(|(_, value)| *value))
            .unwrap_or(0.0)
    }
}

// Goal: an operator's Prometheus scrapes every service of a running cluster and gets back
// what a user asks of it: every endpoint up, the bytes a mount wrote per storage target,
// metadata operations, the mount's own client series, and management's view of the targets.
// Method: a real Prometheus (Debian's binary, own config and port) scrapes the endpoints
// `weft node list` names, while a file is written and a directory made through the mount.
#[test]
fn prometheus_scrapes_every_service() {
    let mut cluster = cluster(ClusterSpec::default());
    let mount = cluster.mount().expect("mount");
    let data = pattern(3, 3 * 1024 * 1024);
    fs::write(mount.join("observed"), &data).expect("write through the mount");
    fs::create_dir(mount.join("a-directory")).expect("mkdir");

    let endpoints = cluster.service_addresses().expect("service addresses");
    assert_eq!(endpoints.len(), 4, "management, one metadata, two storage");
    for endpoint in &endpoints {
        let (status, text) = http_get(endpoint, "/metrics").expect("metrics endpoint");
        assert_eq!(status, 200, "{endpoint}/metrics: {text}");
    }
    let prometheus = Prometheus::start(&cluster.root().join("prometheus"), &endpoints);

    wait_until("Prometheus to scrape every service", || {
        prometheus
            .query("up{job=\"weft\"} == 1")
            .is_some_and(|up| up.len() == endpoints.len())
    })
    .expect("every endpoint up");
    let written = data.len() as f64;
    wait_until("the written bytes to reach Prometheus", || {
        prometheus.value("sum(weft_storage_written_bytes_total)") >= written
    })
    .expect("written bytes scraped");

    let per_target = prometheus
        .query("weft_storage_written_bytes_total")
        .expect("per-target series");
    assert_eq!(
        per_target.len(),
        4,
        "a 3 MiB file in 512 KiB chunks over 4 targets touches each: {per_target:?}"
    );
    assert!(
        prometheus.value("sum(weft_requests_total{role=\"meta\",op=\"create\"})") >= 2.0,
        "the file and the directory were created on the metadata server"
    );
    assert!(
        prometheus.value(
            "sum(weft_client_received_bytes_total{role=\"storage\",client!=\"other\",client!=\"none\"})"
        ) >= written,
        "the mount's session has its own series on the storage servers"
    );
    assert_eq!(
        prometheus.value("weft_cluster_storage_targets{reachability=\"online\"}"),
        4.0,
        "management reports every target online"
    );
    assert!(
        prometheus.value("min(weft_target_free_bytes{role=\"storage\"})") > 0.0,
        "free space per target"
    );
    assert!(
        prometheus.value("weft_meta_inodes") >= 3.0,
        "root, file and directory"
    );
    assert!(
        prometheus.value("sum(weft_meta_sync_duration_seconds_count)")
            >= prometheus.value("sum(weft_meta_commits_total)")
            && prometheus.value("sum(weft_meta_commits_total)") >= 2.0,
        "every commit of the metadata store is synced by its flusher, and timed"
    );

    // Every panel of every dashboard in the repository is valid PromQL over series that exist.
    let dashboards =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dashboards/grafana");
    let mut panels = 0;
    for entry in fs::read_dir(&dashboards).expect("dashboards directory") {
        let path = entry.expect("entry").path();
        let dashboard: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("read")).expect("JSON");
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"]
                    .as_str()
                    .expect("expr")
                    .replace("$__rate_interval", "1m");
                wait_until(&format!("{expr} ({}) to have data", path.display()), || {
                    prometheus
                        .query(&expr)
                        .is_some_and(|series| !series.is_empty())
                })
                .expect("every dashboard query has data");
                panels += 1;
            }
        }
    }
    assert!(panels >= 20, "four dashboards with their panels: {panels}");
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/prometheus.yml");
    let check = Command::new("promtool")
        .args(["check", "config"])
        .arg(&example)
        .output()
        .expect("promtool runs");
    assert!(
        check.status.success(),
        "examples/prometheus.yml is a valid config"
    );
}

/// Management's view as `weft cluster status --json` prints it.
fn cluster_status(cluster: &weft_testkit::LocalCluster) -> serde_json::Value {
    let (ok, out, err) = weft(
        cluster,
        &["cluster", "status", "--json", "--mgmt", cluster.mgmt()],
    );
    assert!(ok, "weft cluster status: {err}");
    serde_json::from_str(&out).expect("cluster status is JSON")
}

/// The messages of management's recent events.
fn events(cluster: &weft_testkit::LocalCluster) -> Vec<String> {
    cluster_status(cluster)["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|event| event["message"].as_str().map(str::to_string))
        .collect()
}

/// Waits until management has sampled the servers `rounds` more times.
fn wait_for_samples(cluster: &weft_testkit::LocalCluster, rounds: u64) {
    let interval = cluster_status(cluster)["sample_interval_ms"]
        .as_u64()
        .expect("interval");
    let start = cluster_status(cluster)["totals"]["now"]["unix_ms"]
        .as_u64()
        .unwrap_or(0);
    wait_until("management to sample the servers again", || {
        cluster_status(cluster)["totals"]["now"]["unix_ms"]
            .as_u64()
            .is_some_and(|at| at >= start + rounds * interval)
    })
    .expect("samples go on");
}

/// Keeps writing through the mount until dropped.
struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(path: std::path::PathBuf) -> Writer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let block = pattern(9, 256 * 1024);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                // Rewrites one 8 MiB file, so the test never fills the disk.
                let _ = fs::write(&path, &block);
                for _ in 0..31 {
                    use std::io::Write;
                    if let Ok(mut file) = fs::OpenOptions::new().append(true).open(&path) {
                        let _ = file.write_all(&block);
                    }
                }
            }
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// Goal: while a client writes, `weft stats server` shows the storage servers' write rate,
// `weft stats client` shows the writing session, and management's cluster view (CLI and
// GET /api/cluster) lists every node and target with the throughput. Method: a writer thread
// rewrites a file through the mount; each view is polled until it shows the writes.
#[test]
fn live_stats_and_cluster_view_show_the_load() {
    let mut cluster = cluster(ClusterSpec::default());
    let mount = cluster.mount().expect("mount");
    let _writer = Writer::start(mount.join("busy"));
    let once = |what: &str| {
        let (ok, out, err) = weft(
            &cluster,
            &[
                "stats",
                what,
                "--once",
                "--json",
                "--interval",
                "0.5",
                "--mgmt",
                cluster.mgmt(),
            ],
        );
        assert!(ok, "weft stats {what}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("stats JSON")
    };
    wait_until("weft stats server to show storage writes", || {
        once("server")["servers"]
            .as_array()
            .expect("servers")
            .iter()
            .any(|row| {
                row["kind"] == "storage"
                    && row["disk_written_bytes_per_second"].as_f64().unwrap_or(0.0) > 0.0
            })
    })
    .expect("server stats");
    let servers = once("server");
    assert_eq!(
        servers["servers"].as_array().map(Vec::len),
        Some(3),
        "one metadata and two storage servers: {servers}"
    );
    wait_until("weft stats client to show the writing session", || {
        once("client")["clients"]
            .as_array()
            .expect("clients")
            .iter()
            .any(|row| row["written_bytes_per_second"].as_f64().unwrap_or(0.0) > 0.0)
    })
    .expect("client stats");

    wait_until("the cluster view to show the writes", || {
        cluster_status(&cluster)["totals"]["now"]["written_bytes_per_second"]
            .as_u64()
            .is_some_and(|rate| rate > 0)
    })
    .expect("cluster throughput");
    let status = cluster_status(&cluster);
    assert_eq!(status["totals"]["nodes_online"], 3, "{status}");
    assert_eq!(status["totals"]["targets_online"], 4, "{status}");
    let targets = status["targets"].as_array().expect("targets");
    assert!(
        targets
            .iter()
            .all(|t| t["consistency"] == "good" && t["usage"]["total_bytes"].as_u64() > Some(0)),
        "{status}"
    );
    let (code, body) = http_get(cluster.mgmt(), "/api/cluster").expect("GET /api/cluster");
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON over HTTP");
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(3), "{json}");
    let (ok, table, _) = weft(&cluster, &["cluster", "status", "--mgmt", cluster.mgmt()]);
    assert!(
        ok && table.contains("storage-2") && table.contains("good"),
        "{table}"
    );
}

// Goal: state changes become events, each logged once: a storage server that goes offline and
// comes back, a target that fills up and gets space again. Method: 4 MiB targets filled
// through the mount, a storage server killed and restarted; management's events and log are
// read after several more of its rounds.
#[test]
fn state_changes_are_events_logged_once() {
    let mut cluster = cluster(ClusterSpec {
        target_capacity_bytes: Some(4 * 1024 * 1024),
        ..ClusterSpec::default()
    });
    let mount = cluster.mount().expect("mount");
    let _ = fs::write(mount.join("filler"), pattern(5, 24 * 1024 * 1024));
    wait_until("a full-target event", || {
        events(&cluster).iter().any(|e| e.contains("is full"))
    })
    .expect("full event");
    fs::remove_file(mount.join("filler")).expect("remove the filler");
    wait_until("a space-again event", || {
        events(&cluster)
            .iter()
            .any(|e| e.contains("has space again"))
    })
    .expect("space event");

    cluster.kill("storage-2").expect("kill storage-2");
    let offline = "storage node storage-2 (2) is offline";
    wait_until("an offline event", || {
        events(&cluster).iter().any(|e| e.contains(offline))
    })
    .expect("offline event");
    wait_for_samples(&cluster, 4);
    let log = cluster.log("mgmt");
    assert_eq!(log.matches(offline).count(), 1, "logged once:\n{log}");
    cluster.restart("storage-2").expect("restart storage-2");
    wait_until("an online-again event", || {
        events(&cluster)
            .iter()
            .any(|e| e.contains("storage node storage-2 (2) is online again"))
    })
    .expect("online event");
    wait_for_samples(&cluster, 4);
    let log = cluster.log("mgmt");
    let full_events = log.matches("is full").count();
    let targets_that_filled = events(&cluster)
        .iter()
        .filter(|e| e.contains("is full"))
        .count();
    assert_eq!(
        full_events, targets_that_filled,
        "each target's full event is logged once:\n{log}"
    );
    assert_eq!(log.matches(offline).count(), 1, "still once:\n{log}");
}

/// Runs headless Chromium (Debian's `chromium`) on `url` with `extra` arguments; returns
/// stdout. Virtual time lets the page's scripts fetch and render before the dump.
fn chromium(profile: &std::path::Path, url: &str, extra: &[&str]) -> String {
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs (scripts/test.sh installs it)");
    assert!(output.status.success(), "chromium failed on {url}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The `data-value` of the element with `id` in a DOM dump.
fn shown_value(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let rest = &dom[at..];
    let tag_end = rest.find('>').expect("tag ends");
    let value = rest[..tag_end]
        .split("data-value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_else(|| panic!("#{id} has no data-value"));
    value.to_string()
}

// Goal: management's web page, loaded in a real browser from a running cluster, shows the
// cluster's numbers (nodes and targets online, capacity, sessions, inodes, every target with
// its size, the quota rules where management is told to show them) with no outside resource,
// and looks right. Method: headless Chromium dumps the
// DOM after the page's scripts ran; the numbers are compared with `weft cluster status`; a
// screenshot is kept as a test artifact (target/test-artifacts/web-page.png).
#[test]
fn web_page_shows_the_cluster() {
    let mut cluster = cluster(ClusterSpec {
        mgmt_settings: vec!["web_details=true".into()],
        ..ClusterSpec::default()
    });
    let mount = cluster.mount().expect("mount");
    fs::write(mount.join("shown"), pattern(8, 1024 * 1024)).expect("write");
    let (ok, _, err) = weft(
        &cluster,
        &[
            "quota",
            "set",
            "--user",
            "1000",
            "--hard-inodes",
            "100",
            "--mgmt",
            cluster.mgmt(),
        ],
    );
    assert!(ok, "quota set: {err}");
    wait_for_samples(&cluster, 2);
    let url = format!("http://{}/", cluster.mgmt());
    let (code, page) = http_get(cluster.mgmt(), "/").expect("GET /");
    assert_eq!(code, 200);
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "the page loads nothing from outside"
    );

    let profile = cluster.root().join("chromium");
    let dom = chromium(&profile, &url, &["--dump-dom"]);
    let status = cluster_status(&cluster);
    let totals = &status["totals"];
    for (id, key) in [
        ("nodes-online", "nodes_online"),
        ("targets-online", "targets_online"),
        ("capacity", "capacity_bytes"),
        ("sessions", "client_sessions"),
        ("inodes", "inodes"),
    ] {
        assert_eq!(
            shown_value(&dom, id),
            totals[key].to_string(),
            "#{id} shows management's {key}"
        );
    }
    for target in status["targets"].as_array().expect("targets") {
        let row = format!(
            "data-target=\"{}\" data-total=\"{}\"",
            target["id"], target["usage"]["total_bytes"]
        );
        assert!(dom.contains(&row), "target row {row} in the page");
    }
    assert!(
        dom.contains("data-node=\"storage-2\" data-reachability=\"online\""),
        "storage-2 listed online"
    );
    assert!(dom.contains("registered at"), "events are listed");
    assert!(
        dom.contains("data-quota=\"user 1000\""),
        "the quota rule is listed"
    );

    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target directory")
        .join("test-artifacts");
    fs::create_dir_all(&artifacts).expect("artifact directory");
    let screenshot = artifacts.join("web-page.png");
    let _ = fs::remove_file(&screenshot);
    chromium(
        &profile,
        &url,
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1400,1200",
            "--hide-scrollbars",
        ],
    );
    let png = fs::read(&screenshot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}

/// A running InfluxDB 1.x (Debian's `influxd`) with its own config, directories and ports.
struct Influx {
    address: String,
    _process: ProcessGuard,
}

impl Influx {
    fn start(directory: &std::path::Path) -> Influx {
        fs::create_dir_all(directory).expect("influxdb directory");
        let address = format!("127.0.0.1:{}", free_port().expect("free port"));
        let rpc = format!("127.0.0.1:{}", free_port().expect("free port"));
        let path = |name: &str| directory.join(name).display().to_string();
        let config = format!(
            "reporting-disabled = true\nbind-address = \"{rpc}\"\n[meta]\n  dir = \"{}\"\n[data]\n  dir = \"{}\"\n  wal-dir = \"{}\"\n[http]\n  bind-address = \"{address}\"\n  log-enabled = false\n[monitor]\n  store-enabled = false\n",
            path("meta"),
            path("data"),
            path("wal")
        );
        let config_path = directory.join("influxdb.conf");
        fs::write(&config_path, config).expect("influxdb config");
        let log = fs::File::create(directory.join("influxd.log")).expect("log");
        let child = Command::new("influxd")
            .arg("-config")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("influxd runs (scripts/test.sh installs it)");
        let influx = Influx {
            address,
            _process: ProcessGuard::new(child, directory),
        };
        wait_until("InfluxDB to answer", || {
            http_get(&influx.address, "/ping").is_ok_and(|(code, _)| code == 204)
        })
        .expect("influxd starts");
        influx
    }

    /// The last value of every series of `measurement` in database `weft`, with its tags.
    fn last_values(&self, measurement: &str) -> Vec<(serde_json::Value, f64)> {
        let query = format!("SELECT last(value) FROM {measurement} GROUP BY *");
        let path = format!("/query?db=weft&q={}", url_encode(&query));
        let Ok((200, body)) = http_get(&self.address, &path) else {
            return Vec::new();
        };
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        answer["results"][0]["series"]
            .as_array()
            .map(|series| {
                series
                    .iter()
                    .filter_map(|s| Some((s["tags"].clone(), s["values"][0][1].as_f64()?)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

// Goal: with `[influxdb]` set, every service pushes the same metrics it serves to a real
// InfluxDB in line protocol, and an operator's queries find them: the bytes written per
// storage target and management's view of the targets. Method: Debian's influxd on its own
// ports; the cluster's services get influxdb.url; a file is written through the mount.
#[test]
fn metrics_are_pushed_to_influxdb() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let influx = Influx::start(&scratch.path().join("influxdb"));
    let mut cluster = cluster(ClusterSpec {
        settings: vec![
            format!("influxdb.url=http://{}", influx.address),
            "influxdb.interval_ms=500".to_string(),
        ],
        ..ClusterSpec::default()
    });
    let mount = cluster.mount().expect("mount");
    let data = pattern(4, 3 * 1024 * 1024);
    fs::write(mount.join("pushed"), &data).expect("write");
    wait_until("the written bytes to reach InfluxDB", || {
        let per_target = influx.last_values("weft_storage_written_bytes_total");
        per_target.len() == 4
            && per_target.iter().map(|(_, value)| value).sum::<f64>() >= data.len() as f64
    })
    .expect("storage metrics in InfluxDB");
    let (tags, _) = &influx.last_values("weft_storage_written_bytes_total")[0];
    assert_eq!(tags["role"], "storage", "labels become tags: {tags}");
    wait_until("management's view to reach InfluxDB", || {
        influx
            .last_values("weft_cluster_storage_targets")
            .iter()
            .any(|(tags, value)| tags["reachability"] == "online" && *value == 4.0)
    })
    .expect("management metrics in InfluxDB");
}

// Goal: the log level comes from the config file's `log` key (structured `tracing` lines on
// stderr), and a filter that makes no sense is refused with the key named; metrics can be
// served on an address of their own (`metrics_listen`). Method: management started with
// log=warn and a metrics address serves metrics there without logging its info lines; started
// with a broken filter it exits with a clear message.
#[test]
fn log_level_and_metrics_address_are_set_in_config() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let address = format!("127.0.0.1:{}", free_port().expect("port"));
    let metrics_address = format!("127.0.0.1:{}", free_port().expect("port"));
    let log_path = scratch.path().join("mgmt.log");
    let log = fs::File::create(&log_path).expect("log");
    let child = Command::new(common::binary())
        .args(["serve", "mgmt", "--listen", &address, "--set", "log=warn"])
        .args(["--set", "auth=none"])
        .args(["--set", &format!("metrics_listen={metrics_address}")])
        .arg("--data-dir")
        .arg(scratch.path().join("mgmt"))
        .env_remove("WEFT_LOG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("weft serve mgmt");
    let mut process = ProcessGuard::new(child, scratch.path());
    wait_until("management to serve", || {
        if let Some(status) = process.exited() {
            let log = fs::read_to_string(&log_path).unwrap_or_default();
            panic!("management exited ({status}) instead of serving:\n{log}");
        }
        http_get(&address, "/metrics").is_ok_and(|(code, _)| code == 200)
    })
    .expect("management serves");
    let (code, text) = http_get(&metrics_address, "/metrics").expect("the metrics address");
    assert!(
        code == 200 && text.contains("weft_requests_in_flight{role=\"mgmt\"}"),
        "metrics on their own address:\n{text}"
    );
    process.kill();
    let text = fs::read_to_string(&log_path).expect("read log");
    assert!(
        !text.contains("management serving"),
        "info lines are filtered out at warn:\n{text}"
    );

    let output = Command::new(common::binary())
        .args([
            "serve",
            "mgmt",
            "--listen",
            "127.0.0.1:0",
            "--set",
            "log=weft_mgmt=loud",
        ])
        .arg("--data-dir")
        .arg(scratch.path().join("mgmt"))
        .env_remove("WEFT_LOG")
        .output()
        .expect("weft serve mgmt");
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a broken filter is refused");
    assert!(message.contains("log = \"weft_mgmt=loud\""), "{message}");
}
