//! The metrics every server exports in Prometheus' text format, and the per-client load table
//! behind them.
//!
//! A service builds its [`Metrics`] once at start: [`MetricsBuilder::new`] registers what
//! every server has — requests by operation with their latency, errors by kind, connections,
//! bytes, load per client, and the process's CPU, memory and file descriptors — and the
//! service adds its own families (per target) to [`MetricsBuilder::registry`] before
//! [`MetricsBuilder::build`]. `weft_net::serve` records every request and answers
//! `GET /metrics` on the service's own port.
//!
//! Names follow Prometheus' conventions: a `weft_` prefix, base units (`_bytes`, `_seconds`),
//! and `_total` on counters (added by the encoder). Every series carries the labels `role`
//! and (for metadata and storage servers) `node`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_proto::error::WireError;
use weft_proto::messages::{ClientStats, NodeStats, SpaceUsage, TargetStats, STATS_CLIENTS_MAX};
use weft_proto::ClientId;

/// Clients shown with their own `client` label; the others are summed under `client="other"`.
pub const CLIENTS_LABELED_MAX: usize = 20;
/// How often the busiest clients are chosen again (at a scrape).
const CLIENT_RANKING_INTERVAL: Duration = Duration::from_secs(10);
/// A client unseen this long is folded into the `other` totals and forgotten.
const CLIENT_FORGET_AFTER: Duration = Duration::from_secs(600);

/// The buckets of every latency histogram: 50 µs to about 6.5 s, doubling.
pub fn latency_histogram_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 2.0, 18)
}

/// Buckets of [`RpcMetrics::handoffs`]: none, one, two... up to eight.
fn handoffs_histogram() -> Histogram {
    Histogram::new([0.0, 1.0, 2.0, 3.0, 4.0, 8.0])
}

/// A latency histogram with [`latency_histogram_buckets`].
pub fn latency_histogram() -> Histogram {
    Histogram::new(latency_histogram_buckets())
}

/// Labels of per-operation series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The request's name ([`weft_proto::messages::Request::op_name`]).
    pub op: &'static str,
}

/// Labels of per-error series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The error code's name ([`weft_proto::ErrorCode::name`]).
    pub kind: &'static str,
}

/// One series family drawn from a record: name, help, and the value of a record.
pub type Column<T> = (&'static str, &'static str, fn(&T) -> u64);

/// A family of latency histograms.
pub type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A service's metrics: the registry to encode and the request counters `weft_net::serve` feeds.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    rpc: Arc<RpcMetrics>,
}

impl Metrics {
    /// Every series in Prometheus' text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// The request counters.
    pub fn rpc(&self) -> &RpcMetrics {
        &self.rpc
    }
}

/// Builds a service's [`Metrics`].
#[derive(Debug)]
pub struct MetricsBuilder {
    registry: Registry,
    rpc: RpcMetrics,
}

impl MetricsBuilder {
    /// The registry of a `role` (`mgmt`, `meta`, `storage`) server, with what every server
    /// exports already in it. `node` labels every series when the role has node ids.
    pub fn new(role: &'static str, node: Option<u32>) -> MetricsBuilder {
        let mut labels: Vec<(Cow<'static, str>, Cow<'static, str>)> =
            vec![(Cow::Borrowed("role"), Cow::Borrowed(role))];
        if let Some(node) = node {
            labels.push((Cow::Borrowed("node"), Cow::Owned(node.to_string())));
        }
        let mut registry = Registry::with_labels(labels.into_iter());
        let rpc = RpcMetrics::register(&mut registry);
        registry.register_collector(Box::new(ProcessCollector {
            started: unix_now(),
        }));
        MetricsBuilder { registry, rpc }
    }

    /// Where the service registers its own families.
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The finished metrics.
    pub fn build(self) -> Metrics {
        Metrics {
            registry: Arc::new(self.registry),
            rpc: Arc::new(self.rpc),
        }
    }
}

/// What the server loop counts for every request.
#[derive(Debug)]
pub struct RpcMetrics {
    started: Instant,
    /// Requests and errors by operation: `weft_requests_total` and [`RpcMetrics::node_stats`].
    totals: Arc<Mutex<OpTotals>>,
    durations: LatencyFamily<OpLabels>,
    handoffs: Family<OpLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    connections: Gauge,
    refused: Family<ErrorLabels, Counter>,
    in_flight: Gauge,
    received_bytes: Counter,
    sent_bytes: Counter,
    clients: Arc<ClientTable>,
}

impl RpcMetrics {
    fn register(registry: &mut Registry) -> RpcMetrics {
        let metrics = RpcMetrics {
            started: Instant::now(),
            totals: Arc::default(),
            durations: LatencyFamily::new_with_constructor(latency_histogram),
            handoffs: Family::new_with_constructor(handoffs_histogram),
            errors: Family::default(),
            connections: Gauge::default(),
            refused: Family::default(),
            in_flight: Gauge::default(),
            received_bytes: Counter::default(),
            sent_bytes: Counter::default(),
            clients: Arc::default(),
        };
        registry.register_collector(Box::new(RequestCollector(Arc::clone(&metrics.totals))));
        registry.register(
            "weft_request_duration_seconds",
            "Time from a request's arrival to its answer, by operation",
            metrics.durations.clone(),
        );
        registry.register(
            "weft_request_handoffs",
            "Thread hand-offs per request, by operation: how many times its work went on on \
             another thread than its step before, from the reading of the request to the \
             sending of its answer (a commit thread that committed it, a task woken by it)",
            metrics.handoffs.clone(),
        );
        registry.register(
            "weft_request_errors",
            "Requests answered with an error, by error kind",
            metrics.errors.clone(),
        );
        registry.register(
            "weft_connections",
            "Open connections from clients and other servers",
            metrics.connections.clone(),
        );
        registry.register(
            "weft_connections_refused",
            "Connections refused before their first request (no or another key, another \
             protocol version, no handshake in time), by reason",
            metrics.refused.clone(),
        );
        registry.register(
            "weft_requests_in_flight",
            "Requests received and not answered yet (the service's queue depth)",
            metrics.in_flight.clone(),
        );
        registry.register(
            "weft_received_bytes",
            "Bytes of request bodies and payloads received",
            metrics.received_bytes.clone(),
        );
        registry.register(
            "weft_sent_bytes",
            "Bytes of answer bodies and payloads sent",
            metrics.sent_bytes.clone(),
        );
        registry.register_collector(Box::new(ClientCollector(Arc::clone(&metrics.clients))));
        metrics
    }

    /// Counts an open connection until the guard drops.
    pub fn connection(&self) -> ConnectionGuard {
        self.connections.inc();
        ConnectionGuard(self.connections.clone())
    }

    /// Counts a connection refused in its handshake, for `reason`.
    pub fn refused(&self, reason: &'static str) {
        self.refused
            .get_or_create(&ErrorLabels { kind: reason })
            .inc();
    }

    /// Starts timing a request of `op` from `origin` that brought `received` bytes.
    pub fn start(&self, op: &'static str, origin: u32, received: u64) -> RequestTimer<'_> {
        self.in_flight.inc();
        self.received_bytes.inc_by(received);
        RequestTimer {
            metrics: self,
            op,
            origin,
            received,
            started: Instant::now(),
        }
    }

    /// Records the thread hand-offs a request of `op` crossed before its answer was sent
    /// (`weft_net::handoffs`).
    pub fn handoffs(&self, op: &'static str, count: u32) {
        self.handoffs
            .get_or_create(&OpLabels { op })
            .observe(f64::from(count));
    }

    /// The load table per client.
    pub fn clients(&self) -> &ClientTable {
        &self.clients
    }

    /// The counters since the start, with a storage server's `targets`, as a Stats request
    /// (which is in flight itself) answers them.
    pub fn node_stats(&self, targets: Vec<TargetStats>) -> NodeStats {
        let (ops, errors) = {
            let totals = self.totals.lock().expect("totals poisoned");
            (totals.by_op(), totals.errors)
        };
        let clients = self
            .clients
            .totals()
            .into_iter()
            .take(STATS_CLIENTS_MAX)
            .map(|(origin, load)| ClientStats {
                client: ClientId(u64::from(origin)),
                requests: load.requests,
                received_bytes: load.received_bytes,
                sent_bytes: load.sent_bytes,
            })
            .collect();
        NodeStats {
            uptime_ms: self.started.elapsed().as_millis() as u64,
            // Monitoring is not load: the Stats requests themselves are left out.
            requests: ops
                .iter()
                .filter(|(op, _)| op != "stats")
                .map(|(_, count)| count)
                .sum(),
            errors,
            received_bytes: self.received_bytes.get(),
            sent_bytes: self.sent_bytes.get(),
            in_flight: (self.in_flight.get() - 1).max(0) as u64,
            ops,
            clients,
            targets,
        }
    }
}

/// Requests and errors by operation since the start.
#[derive(Debug, Default)]
struct OpTotals {
    ops: std::collections::BTreeMap<&'static str, u64>,
    errors: u64,
}

impl OpTotals {
    /// Requests by operation name, in name order.
    fn by_op(&self) -> Vec<(String, u64)> {
        self.ops
            .iter()
            .map(|(op, count)| (op.to_string(), *count))
            .collect()
    }
}

/// Counts one open connection.
#[derive(Debug)]
pub struct ConnectionGuard(Gauge);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A request being served; [`RequestTimer::finish`] records it.
#[derive(Debug)]
pub struct RequestTimer<'a> {
    metrics: &'a RpcMetrics,
    op: &'static str,
    origin: u32,
    received: u64,
    started: Instant,
}

impl RequestTimer<'_> {
    /// Records the answer: its kind, its size and how long it took.
    pub fn finish(self, error: Option<&WireError>, sent: u64) {
        let metrics = self.metrics;
        let labels = OpLabels { op: self.op };
        metrics
            .durations
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(error) = error {
            metrics
                .errors
                .get_or_create(&ErrorLabels {
                    kind: error.code.name(),
                })
                .inc();
        }
        {
            let mut totals = metrics.totals.lock().expect("totals poisoned");
            *totals.ops.entry(self.op).or_default() += 1;
            totals.errors += u64::from(error.is_some());
        }
        metrics.sent_bytes.inc_by(sent);
        metrics.in_flight.dec();
        metrics.clients.record(
            self.origin,
            Load {
                requests: 1,
                received_bytes: self.received,
                sent_bytes: sent,
            },
        );
    }
}

/// Requests and bytes of one client, or of several.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Load {
    /// Requests answered.
    pub requests: u64,
    /// Bytes received from the client (what it wrote, plus request bodies).
    pub received_bytes: u64,
    /// Bytes sent to the client (what it read, plus answer bodies).
    pub sent_bytes: u64,
}

impl Load {
    fn add(&mut self, other: Load) {
        self.requests += other.requests;
        self.received_bytes += other.received_bytes;
        self.sent_bytes += other.sent_bytes;
    }

    fn minus(self, other: Load) -> Load {
        Load {
            requests: self.requests - other.requests,
            received_bytes: self.received_bytes - other.received_bytes,
            sent_bytes: self.sent_bytes - other.sent_bytes,
        }
    }
}

/// Load per client session, with a bounded number of labeled series.
///
/// The busiest [`CLIENTS_LABELED_MAX`] clients (by requests since the last ranking) get a
/// series of their own; everything else is the `other` series. Every series only grows: a
/// client's own series counts from when it got its label, and `other` keeps what the client
/// did before and gets everything back when the client loses its label.
#[derive(Debug, Default)]
pub struct ClientTable {
    state: Mutex<ClientState>,
}

#[derive(Debug, Default)]
struct ClientState {
    clients: HashMap<u32, ClientEntry>,
    /// Load of clients forgotten since.
    retired: Load,
    ranked: Option<Instant>,
}

#[derive(Debug)]
struct ClientEntry {
    total: Load,
    /// The total when the client got its own series; `None` while it has none.
    labeled_since: Option<Load>,
    /// The total at the last ranking.
    at_ranking: Load,
    seen: Instant,
}

impl ClientTable {
    /// Adds `load` to `origin`'s totals (0: servers and tools without a session).
    pub fn record(&self, origin: u32, load: Load) {
        let mut state = self.state.lock().expect("client table poisoned");
        if !state.clients.contains_key(&origin) {
            // A new client gets a series of its own at once while labels are free.
            let labeled = state
                .clients
                .values()
                .filter(|entry| entry.labeled_since.is_some())
                .count();
            let entry = ClientEntry {
                total: Load::default(),
                labeled_since: (labeled < CLIENTS_LABELED_MAX).then(Load::default),
                at_ranking: Load::default(),
                seen: Instant::now(),
            };
            state.clients.insert(origin, entry);
        }
        let entry = state.clients.get_mut(&origin).expect("inserted above");
        entry.total.add(load);
        entry.seen = Instant::now();
    }

    /// Every client's all-time totals, busiest first (for `weft stats client`).
    pub fn totals(&self) -> Vec<(u32, Load)> {
        let state = self.state.lock().expect("client table poisoned");
        let mut rows: Vec<(u32, Load)> = state
            .clients
            .iter()
            .map(|(origin, entry)| (*origin, entry.total))
            .collect();
        rows.sort_by_key(|(origin, load)| (std::cmp::Reverse(load.requests), *origin));
        rows
    }

    /// The exported series: the labeled clients and `other`, ranking again when it is due.
    pub fn series(&self, now: Instant) -> Vec<(String, Load)> {
        let mut state = self.state.lock().expect("client table poisoned");
        if state
            .ranked
            .is_none_or(|at| now.duration_since(at) >= CLIENT_RANKING_INTERVAL)
        {
            state.rank(now);
        }
        let mut other = state.retired;
        let mut rows = Vec::new();
        for (origin, entry) in &state.clients {
            match entry.labeled_since {
                Some(since) => {
                    rows.push((client_label(*origin), entry.total.minus(since)));
                    other.add(since);
                }
                None => other.add(entry.total),
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.push(("other".to_string(), other));
        rows
    }
}

impl ClientState {
    /// Gives the busiest clients their own series and folds long-idle ones into `retired`.
    fn rank(&mut self, now: Instant) {
        let stale: Vec<u32> = self
            .clients
            .iter()
            .filter(|(_, entry)| now.duration_since(entry.seen) >= CLIENT_FORGET_AFTER)
            .map(|(origin, _)| *origin)
            .collect();
        for origin in stale {
            if let Some(entry) = self.clients.remove(&origin) {
                self.retired.add(entry.total);
            }
        }
        let mut by_recent: Vec<(u64, u32)> = self
            .clients
            .iter()
            .map(|(origin, entry)| (entry.total.requests - entry.at_ranking.requests, *origin))
            .collect();
        by_recent.sort_by_key(|(recent, origin)| (std::cmp::Reverse(*recent), *origin));
        let busiest: Vec<u32> = by_recent
            .iter()
            .filter(|(recent, _)| *recent > 0)
            .take(CLIENTS_LABELED_MAX)
            .map(|(_, origin)| *origin)
            .collect();
        let labeled_now = self
            .clients
            .values()
            .filter(|entry| entry.labeled_since.is_some())
            .count();
        let mut free = CLIENTS_LABELED_MAX - labeled_now;
        // A labeled client keeps its series while it is among the busiest or while no busier
        // client waits for one; idle ones make room.
        let waiting = busiest
            .iter()
            .filter(|origin| self.clients[*origin].labeled_since.is_none())
            .count();
        if waiting > free {
            let mut surplus = waiting - free;
            for (_, origin) in by_recent.iter().rev() {
                if surplus == 0 {
                    break;
                }
                let entry = self.clients.get_mut(origin).expect("ranked client exists");
                if entry.labeled_since.is_some() && !busiest.contains(origin) {
                    entry.labeled_since = None;
                    surplus -= 1;
                    free += 1;
                }
            }
        }
        for origin in &busiest {
            let entry = self.clients.get_mut(origin).expect("ranked client exists");
            if entry.labeled_since.is_none() && free > 0 {
                entry.labeled_since = Some(entry.total);
                free -= 1;
            }
        }
        for entry in self.clients.values_mut() {
            entry.at_ranking = entry.total;
        }
        self.ranked = Some(now);
    }
}

/// Reads the space of a service's targets at each scrape: (label value of `target`, usage).
pub type SpaceSource = Box<dyn Fn() -> Vec<(String, SpaceUsage)> + Send + Sync>;

/// Exports the epoch of the cluster map a service holds (`weft_cluster_map_epoch`), read at
/// each scrape: management's is the latest, and a server or client whose epoch is behind it
/// has not learned the last change yet.
pub struct MapEpochCollector(pub Box<dyn Fn() -> u64 + Send + Sync>);

impl std::fmt::Debug for MapEpochCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapEpochCollector")
    }
}

impl Collector for MapEpochCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(
            "weft_cluster_map_epoch",
            "The epoch of the cluster map this process holds; it grows with every change of \
             the map that routing or placement follows.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new((self.0)() as i64).encode(metric)
    }
}

/// Exports the capacity and free space and inodes of a service's targets, read at each
/// scrape.
pub struct SpaceCollector(pub SpaceSource);

impl std::fmt::Debug for SpaceCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpaceCollector")
    }
}

impl Collector for SpaceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let targets = (self.0)();
        let columns: [Column<SpaceUsage>; 4] = [
            (
                "weft_target_capacity_bytes",
                "Bytes the target may hold.",
                |usage| usage.total_bytes,
            ),
            (
                "weft_target_free_bytes",
                "Bytes still free on the target.",
                |usage| usage.free_bytes,
            ),
            (
                "weft_target_inodes",
                "Inodes the target's file system may hold.",
                |usage| usage.total_inodes,
            ),
            (
                "weft_target_free_inodes",
                "Inodes still free on the target's file system.",
                |usage| usage.free_inodes,
            ),
        ];
        encode_columns(
            &mut encoder,
            &columns,
            ("target", &targets),
            MetricType::Gauge,
        )
    }
}

/// Encodes one family per column, with a series per row labeled `label` = the row's name.
fn encode_columns<T>(
    encoder: &mut DescriptorEncoder,
    columns: &[Column<T>],
    (label, rows): (&str, &[(String, T)]),
    kind: MetricType,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in columns {
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for (row, record) in rows {
            let labels = [(label, row.as_str())];
            let metric = family.encode_family(&labels)?;
            match kind {
                MetricType::Counter => ConstCounter::new(value(record)).encode(metric)?,
                _ => ConstGauge::new(value(record) as i64).encode(metric)?,
            }
        }
    }
    Ok(())
}

/// The `client` label of a session: its id as `weft` prints it; `none` for servers and tools.
pub fn client_label(origin: u32) -> String {
    if origin == 0 {
        "none".to_string()
    } else {
        format!("{:016x}", u64::from(origin))
    }
}

/// Exports the request counts by operation the server loop keeps in [`OpTotals`].
#[derive(Debug)]
struct RequestCollector(Arc<Mutex<OpTotals>>);

impl Collector for RequestCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.lock().expect("totals poisoned").by_op();
        let columns: [Column<u64>; 1] =
            [
                ("weft_requests", "Requests served, by operation.", |count| {
                    *count
                }),
            ];
        encode_columns(&mut encoder, &columns, ("op", &rows), MetricType::Counter)
    }
}

#[derive(Debug)]
struct ClientCollector(Arc<ClientTable>);

impl Collector for ClientCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.0.series(Instant::now());
        let columns: [Column<Load>; 3] = [
            (
                "weft_client_requests",
                "Requests served per client session (the busiest have their own series).",
                |load| load.requests,
            ),
            (
                "weft_client_received_bytes",
                "Bytes received from each client session.",
                |load| load.received_bytes,
            ),
            (
                "weft_client_sent_bytes",
                "Bytes sent to each client session.",
                |load| load.sent_bytes,
            ),
        ];
        encode_columns(
            &mut encoder,
            &columns,
            ("client", &rows),
            MetricType::Counter,
        )
    }
}

/// The process's CPU time, memory, threads and descriptors, read from `/proc` at each scrape.
#[derive(Debug)]
struct ProcessCollector {
    started: f64,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let process = ProcessSample::read();
        let gauges: [(&str, &str, f64); 5] = [
            (
                "weft_process_resident_memory_bytes",
                "Resident memory of the process.",
                process.resident_bytes,
            ),
            (
                "weft_process_virtual_memory_bytes",
                "Virtual memory of the process.",
                process.virtual_bytes,
            ),
            (
                "weft_process_open_fds",
                "Open file descriptors of the process.",
                process.open_fds,
            ),
            (
                "weft_process_threads",
                "Threads of the process.",
                process.threads,
            ),
            (
                "weft_process_start_time_seconds",
                "When this service started, in seconds since the Unix epoch.",
                self.started,
            ),
        ];
        for (name, help, value) in gauges {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)?;
        }
        let metric = encoder.encode_descriptor(
            "weft_process_cpu_seconds",
            "CPU time the process used, user and system.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(process.cpu_seconds).encode(metric)?;
        Ok(())
    }
}

/// One reading of `/proc/self`; zeros where it cannot be read.
#[derive(Debug, Default)]
struct ProcessSample {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    threads: f64,
    open_fds: f64,
}

impl ProcessSample {
    fn read() -> ProcessSample {
        let mut sample = ProcessSample::default();
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the command name, which is in parentheses and may hold spaces.
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let field = |n: usize| -> f64 {
                    fields
                        .get(n)
                        .and_then(|f| f.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                // Field numbers of proc(5) minus 3: utime 14, stime 15, num_threads 20,
                // vsize 23, rss 24.
                if ticks > 0 {
                    sample.cpu_seconds = (field(11) + field(12)) / ticks as f64;
                }
                sample.threads = field(17);
                sample.virtual_bytes = field(20);
                sample.resident_bytes = field(21) * page.max(0) as f64;
            }
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            sample.open_fds = entries.count() as f64;
        }
        sample
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(requests: u64) -> Load {
        Load {
            requests,
            received_bytes: requests * 10,
            sent_bytes: requests,
        }
    }

    fn other(series: &[(String, Load)]) -> Load {
        series
            .iter()
            .find(|(client, _)| client == "other")
            .map(|(_, load)| *load)
            .expect("other is always exported")
    }

    // Goal: with more clients than labels, the busiest get their own series, the rest are
    // summed, nothing is lost from the totals, and no exported counter ever goes down while
    // the busiest clients change.
    #[test]
    fn busiest_clients_are_labeled_and_series_only_grow() {
        let table = ClientTable::default();
        let mut now = Instant::now();
        let clients = CLIENTS_LABELED_MAX as u32 + 10;
        let mut previous: HashMap<String, Load> = HashMap::new();
        let mut grand = 0u64;
        for round in 0..6u32 {
            for origin in 1..=clients {
                // The busy half changes from round to round.
                let requests: u32 = if (origin + round) % 2 == 0 { 100 } else { 1 };
                table.record(origin, load(u64::from(requests)));
                grand += u64::from(requests);
            }
            let series = table.series(now);
            assert!(
                series.len() <= CLIENTS_LABELED_MAX + 1,
                "bounded: {series:?}"
            );
            let sum: u64 = series.iter().map(|(_, load)| load.requests).sum();
            assert_eq!(sum, grand, "labeled series plus other hold every request");
            let other_now = other(&series);
            if let Some(before) = previous.get("other") {
                assert!(other_now.requests >= before.requests, "other only grows");
                assert!(other_now.received_bytes >= before.received_bytes);
            }
            for (client, load) in &series {
                // Between two scrapes a client cannot lose its label and get it back.
                if let Some(before) = previous.get(client) {
                    assert!(load.requests >= before.requests, "{client} went down");
                }
            }
            if round > 0 {
                let labeled: Vec<&String> = series
                    .iter()
                    .map(|(client, _)| client)
                    .filter(|client| *client != "other")
                    .collect();
                assert_eq!(labeled.len(), CLIENTS_LABELED_MAX, "every label in use");
            }
            previous = series.into_iter().collect();
            now += CLIENT_RANKING_INTERVAL;
        }
    }

    // Goal: a client idle for long is forgotten, and what it did stays in `other`.
    #[test]
    fn forgotten_clients_stay_counted() {
        let table = ClientTable::default();
        let start = Instant::now();
        table.record(5, load(7));
        let series = table.series(start);
        let total: u64 = series.iter().map(|(_, load)| load.requests).sum();
        assert_eq!(total, 7);
        let later = table.series(start + CLIENT_FORGET_AFTER + CLIENT_RANKING_INTERVAL);
        assert_eq!(later.len(), 1, "only other is left: {later:?}");
        assert_eq!(other(&later).requests, 7);
        assert!(table.totals().is_empty());
    }

    // Goal: the text exposition has the conventional names, the role label and the client
    // series, and the process metrics read real values.
    #[test]
    fn exposition_names_and_labels() {
        let metrics = MetricsBuilder::new("storage", Some(3)).build();
        let timer = metrics.rpc().start("write", 9, 4096);
        timer.finish(None, 16);
        let text = metrics.encode();
        for expected in [
            "weft_requests_total{role=\"storage\",node=\"3\",op=\"write\"} 1",
            "weft_received_bytes_total{role=\"storage\",node=\"3\"} 4096",
            "weft_client_requests_total{role=\"storage\",node=\"3\",client=\"0000000000000009\"} 1",
            "weft_request_duration_seconds_count{role=\"storage\",node=\"3\",op=\"write\"} 1",
            "# TYPE weft_process_cpu_seconds counter",
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
        let resident = text
            .lines()
            .find(|line| line.starts_with("weft_process_resident_memory_bytes"))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .expect("resident memory series");
        assert!(resident > 0.0, "resident memory is read from /proc");
    }
}
