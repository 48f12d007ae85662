//! Pushes a service's metrics to InfluxDB in its line protocol, as beegfs-mon does: the same
//! series `/metrics` shows, every `interval_ms`, to InfluxDB 1.x's `/write` API (InfluxDB 2
//! serves the same API for its 1.x-compatible buckets).
//!
//! A failing push is logged when it starts failing and when it works again, never in a loop;
//! the service goes on serving either way.

use crate::metrics::Metrics;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::net::TcpStream;

/// Default database the metrics go to.
pub const DATABASE_DEFAULT: &str = "weft";
/// Default time between pushes.
pub const INTERVAL_MS_DEFAULT: u64 = 10_000;
/// Longest wait for InfluxDB to answer one push.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[influxdb]` table of a service's config.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InfluxConfig {
    /// InfluxDB's HTTP address, `http://HOST:PORT`.
    pub url: String,
    /// The database; created if it does not exist.
    #[serde(default = "default_database")]
    pub database: String,
    /// Milliseconds between pushes.
    #[serde(
        rename = "interval_ms",
        default = "default_interval",
        with = "weft_proto::millis"
    )]
    pub interval: Duration,
}

fn default_database() -> String {
    DATABASE_DEFAULT.to_string()
}

fn default_interval() -> Duration {
    Duration::from_millis(INTERVAL_MS_DEFAULT)
}

impl InfluxConfig {
    /// Problems with the table, one per line, naming the key.
    ///
    /// # Errors
    /// A description of what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if host_port(&self.url).is_none() {
            problems.push(format!(
                "influxdb.url = {:?} is not http://HOST:PORT (https is not supported; put a proxy in front)",
                self.url
            ));
        }
        if self.interval < Duration::from_millis(100) {
            problems.push(format!(
                "influxdb.interval_ms = {} is below 100",
                self.interval.as_millis()
            ));
        }
        if self.database.is_empty() {
            problems.push("influxdb.database is empty".to_string());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// `HOST:PORT` of an `http://HOST:PORT[/]` URL.
fn host_port(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?.trim_end_matches('/');
    (rest.contains(':') && !rest.contains('/')).then_some(rest)
}

/// Starts pushing `metrics` as `config` says, until the returned task is aborted.
pub fn spawn(config: InfluxConfig, metrics: Metrics) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut failing: Option<String> = None;
        let mut database_made = false;
        loop {
            tokio::time::sleep(config.interval).await;
            let outcome = async {
                if !database_made {
                    let query = format!(
                        "/query?q={}",
                        url_encode(&format!("CREATE DATABASE \"{}\"", config.database))
                    );
                    post(&config.url, &query, Bytes::new()).await?;
                    database_made = true;
                }
                let lines = line_protocol(&metrics.encode(), unix_nanos());
                let path = format!("/write?db={}&precision=ns", url_encode(&config.database));
                post(&config.url, &path, Bytes::from(lines)).await
            }
            .await;
            match (outcome, &failing) {
                (Ok(()), Some(_)) => {
                    tracing::info!(url = %config.url, "pushing metrics to InfluxDB works again");
                    failing = None;
                }
                (Err(error), previous) if previous.as_ref() != Some(&error) => {
                    tracing::warn!(url = %config.url, %error, "cannot push metrics to InfluxDB; will keep trying");
                    failing = Some(error);
                }
                _ => {}
            }
        }
    })
}

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// POSTs `body` to `path` at `url`; an answer other than 2xx is an error with InfluxDB's words.
async fn post(url: &str, path: &str, body: Bytes) -> Result<(), String> {
    let address = host_port(url).ok_or_else(|| format!("{url} is not http://HOST:PORT"))?;
    let exchange = async {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|error| format!("cannot connect to {address}: {error}"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|error| error.to_string())?;
        tokio::spawn(connection);
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, address)
            .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(body))
            .map_err(|error| error.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| error.to_string())?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response
            .into_body()
            .collect()
            .await
            .map(|body| String::from_utf8_lossy(&body.to_bytes()).trim().to_string())
            .unwrap_or_default();
        Err(format!("InfluxDB answered {status}: {text}"))
    };
    tokio::time::timeout(PUSH_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{address} did not answer within {PUSH_TIMEOUT:?}"))?
}

/// The samples of a Prometheus text exposition as InfluxDB line protocol: the metric name is
/// the measurement, labels are tags, the value is the field `value`. Comments and values
/// InfluxDB cannot store (NaN, infinities) are left out.
pub fn line_protocol(exposition: &str, unix_nanos: u128) -> String {
    let mut out = String::new();
    for line in exposition.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        out.push_str(&escape_tag(name));
        for (key, value) in labels {
            if value.is_empty() {
                continue;
            }
            out.push(',');
            out.push_str(&escape_tag(&key));
            out.push('=');
            out.push_str(&escape_tag(&value));
        }
        out.push_str(&format!(" value={value} {unix_nanos}\n"));
    }
    out
}

/// `k1="v1",k2="v2"` with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            return labels;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => {}
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.push((key.trim_start_matches(',').to_string(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// A measurement, tag key or tag value with line protocol's special characters escaped.
fn escape_tag(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, ',' | '=' | ' ' | '\\') {
            out.push('\\');
        }
        if c == '\n' {
            out.push_str("\\n");
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: every sample becomes one line with its labels as tags, escaping what line protocol
    // needs escaped, and comments and non-finite values are left out.
    #[test]
    fn exposition_to_line_protocol() {
        let text = "# HELP weft_requests Requests.\n\
                    # TYPE weft_requests counter\n\
                    weft_requests_total{role=\"meta\",node=\"1\",op=\"create\"} 12\n\
                    weft_process_threads{role=\"meta\"} 9.0\n\
                    weft_odd{path=\"a b,c=d\\\"e\"} 1.5\n\
                    weft_bad NaN\n\
                    weft_plain 3\n\
                    # EOF\n";
        let lines = line_protocol(text, 42);
        assert_eq!(
            lines,
            "weft_requests_total,role=meta,node=1,op=create value=12 42\n\
             weft_process_threads,role=meta value=9 42\n\
             weft_odd,path=a\\ b\\,c\\=d\"e value=1.5 42\n\
             weft_plain value=3 42\n"
        );
    }

    // Goal: a bad URL or interval is refused with the key named.
    #[test]
    fn config_problems_name_the_key() {
        let config = InfluxConfig {
            url: "https://db:8086".into(),
            database: String::new(),
            interval: Duration::from_millis(5),
        };
        let problems = config.validate().expect_err("three problems");
        assert!(problems.contains("influxdb.url"), "{problems}");
        assert!(problems.contains("influxdb.interval_ms"), "{problems}");
        assert!(problems.contains("influxdb.database"), "{problems}");
        assert_eq!(host_port("http://127.0.0.1:8086/"), Some("127.0.0.1:8086"));
    }
}
