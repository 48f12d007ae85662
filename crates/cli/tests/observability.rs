//! Observability: a real Prometheus scrapes a running cluster.

mod common;

use common::{cluster, pattern, ProcessGuard};
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
}
