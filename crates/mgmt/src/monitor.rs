//! Management's monitor: it samples every server's counters ([`Request::Stats`]) at a fixed
//! interval, keeps the cluster's recent throughput, and turns state changes — a node going
//! offline or coming back, a target filling up or getting space again — into events, each
//! logged once when it happens.
//!
//! [`Request::Stats`]: weft_proto::messages::Request::Stats

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_net::{RpcClient, RpcClientOptions};
use weft_proto::ids::{ClientId, NodeId, TargetId};
use weft_proto::messages::{
    ClientStats, ClientStatus, ClusterEvent, ClusterMap, ClusterSample, ClusterStatus,
    ClusterTotals, NodeKind, NodeStats, NodeStatus, Reachability, TargetStats, TargetStatus,
};

/// Samples of the cluster's throughput kept for the web page's charts.
pub(crate) const HISTORY_SAMPLES: usize = 150;
/// Events kept.
pub(crate) const EVENTS_KEPT: usize = 100;
/// Clients listed in the cluster view.
const CLIENTS_SHOWN: usize = 20;
/// A target with less free space than this percentage is full …
const FULL_BELOW_PERCENT: u64 = 1;
/// … until it has at least this much again (so a target at the edge is not reported in a loop).
const NOT_FULL_FROM_PERCENT: u64 = 2;

/// What management knows about the servers' load.
pub(crate) struct Monitor {
    interval: Duration,
    /// What management's connections to the servers prove themselves with.
    auth: weft_net::Auth,
    state: Mutex<MonitorState>,
    connections: Mutex<HashMap<String, Arc<RpcClient>>>,
}

#[derive(Default)]
struct MonitorState {
    samples: HashMap<(NodeKind, NodeId), Samples>,
    history: VecDeque<ClusterSample>,
    events: VecDeque<ClusterEvent>,
    reachability: HashMap<(NodeKind, NodeId), Reachability>,
    full: HashSet<TargetId>,
}

/// A server's two latest samples.
struct Samples {
    latest: (Instant, NodeStats),
    previous: Option<(Instant, NodeStats)>,
}

impl Samples {
    /// Seconds between the two samples; `None` without two.
    fn seconds(&self) -> Option<f64> {
        let (then, _) = self.previous.as_ref()?;
        let seconds = self.latest.0.duration_since(*then).as_secs_f64();
        (seconds > 0.0).then_some(seconds)
    }

    /// Per-second rate of a counter between the two samples; 0 without two.
    fn rate(&self, counter: impl Fn(&NodeStats) -> u64) -> u64 {
        match (self.seconds(), &self.previous) {
            (Some(seconds), Some((_, old))) => {
                per_second(counter(&self.latest.1), counter(old), seconds)
            }
            _ => 0,
        }
    }
}

/// The rate of a counter that went from `old` to `new` in `seconds`.
fn per_second(new: u64, old: u64, seconds: f64) -> u64 {
    (new.saturating_sub(old) as f64 / seconds).round() as u64
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn kind_name(kind: NodeKind) -> &'static str {
    match kind {
        NodeKind::Management => "management",
        NodeKind::Meta => "metadata node",
        NodeKind::Storage => "storage node",
    }
}

impl Monitor {
    pub fn new(interval: Duration, auth: weft_net::Auth) -> Monitor {
        Monitor {
            interval,
            auth,
            state: Mutex::default(),
            connections: Mutex::default(),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Records an event and logs it, once.
    pub fn event(&self, warning: bool, message: String) {
        if warning {
            tracing::warn!("{message}");
        } else {
            tracing::info!("{message}");
        }
        let mut state = self.state.lock().expect("monitor poisoned");
        state.events.push_back(ClusterEvent {
            unix_ms: unix_ms(),
            level: if warning { "warning" } else { "info" }.to_string(),
            message,
        });
        while state.events.len() > EVENTS_KEPT {
            state.events.pop_front();
        }
    }

    /// One round: state changes into events, then a sample of every reachable server.
    pub async fn tick(&self, map: &ClusterMap) {
        self.note_state_changes(map);
        let mut polls = tokio::task::JoinSet::new();
        for node in &map.nodes {
            if node.reachability == Reachability::Offline {
                continue;
            }
            let Some(address) = node.address() else {
                continue;
            };
            let client = self.connection(&address);
            let key = (node.kind, node.id);
            polls.spawn(async move { (key, client.node_stats().await) });
        }
        let mut sampled = Vec::new();
        while let Some(joined) = polls.join_next().await {
            if let Ok((key, Ok(stats))) = joined {
                sampled.push((key, stats));
            }
        }
        let now = Instant::now();
        let mut state = self.state.lock().expect("monitor poisoned");
        for (key, stats) in sampled {
            let previous = state.samples.remove(&key).and_then(|samples| {
                // A restarted server counts from zero again: its old sample is no base.
                (samples.latest.1.uptime_ms <= stats.uptime_ms).then_some(samples.latest)
            });
            state.samples.insert(
                key,
                Samples {
                    latest: (now, stats),
                    previous,
                },
            );
        }
        let sample = state.cluster_sample();
        state.history.push_back(sample);
        while state.history.len() > HISTORY_SAMPLES {
            state.history.pop_front();
        }
    }

    fn connection(&self, address: &str) -> Arc<RpcClient> {
        let mut connections = self.connections.lock().expect("connections poisoned");
        Arc::clone(connections.entry(address.to_string()).or_insert_with(|| {
            Arc::new(RpcClient::new(
                address,
                RpcClientOptions {
                    connections: 1,
                    request_timeout: self.interval.max(Duration::from_secs(1)),
                    connect_timeout: Duration::from_secs(1),
                    origin: 0,
                    auth: self.auth.clone(),
                    ..RpcClientOptions::default()
                },
            ))
        }))
    }

    /// Events for nodes that went offline or came back and targets that filled up or got
    /// space again since the last round.
    fn note_state_changes(&self, map: &ClusterMap) {
        let mut changes = Vec::new();
        {
            let mut state = self.state.lock().expect("monitor poisoned");
            for node in &map.nodes {
                let before = state
                    .reachability
                    .insert((node.kind, node.id), node.reachability);
                let name = format!("{} {} ({})", kind_name(node.kind), node.alias, node.id);
                match (before, node.reachability) {
                    (Some(old), Reachability::Offline) if old != Reachability::Offline => {
                        changes.push((true, format!("{name} is offline: no heartbeat")));
                    }
                    (Some(Reachability::Offline), Reachability::Online) => {
                        changes.push((false, format!("{name} is online again")));
                    }
                    _ => {}
                }
            }
            for target in &map.targets {
                let usage = target.usage;
                if usage.total_bytes == 0 {
                    continue;
                }
                let free_percent = usage.free_bytes.saturating_mul(100) / usage.total_bytes;
                let name = format!("storage target {} on node {}", target.id, target.node);
                if free_percent < FULL_BELOW_PERCENT && state.full.insert(target.id) {
                    changes.push((
                        true,
                        format!(
                            "{name} is full: {} of {} bytes free",
                            usage.free_bytes, usage.total_bytes
                        ),
                    ));
                } else if free_percent >= NOT_FULL_FROM_PERCENT && state.full.remove(&target.id) {
                    changes.push((false, format!("{name} has space again")));
                }
            }
        }
        for (warning, message) in changes {
            self.event(warning, message);
        }
    }

    /// The cluster view, from `map` and the samples.
    pub fn status(&self, map: &ClusterMap) -> ClusterStatus {
        let state = self.state.lock().expect("monitor poisoned");
        let mut status = ClusterStatus {
            unix_ms: unix_ms(),
            sample_interval_ms: self.interval.as_millis() as u64,
            ..ClusterStatus::default()
        };
        let mut target_rates: HashMap<TargetId, (u64, u64, u64, u64)> = HashMap::new();
        for node in &map.nodes {
            let samples = state.samples.get(&(node.kind, node.id));
            let rate = |counter: fn(&NodeStats) -> u64| samples.map_or(0, |s| s.rate(counter));
            if let Some(samples) = samples {
                for stats in &samples.latest.1.targets {
                    let old = samples
                        .previous
                        .as_ref()
                        .and_then(|(_, old)| old.targets.iter().find(|t| t.target == stats.target));
                    let rate = |pick: fn(&TargetStats) -> u64| match (samples.seconds(), old) {
                        (Some(seconds), Some(old)) => per_second(pick(stats), pick(old), seconds),
                        _ => 0,
                    };
                    target_rates.insert(
                        stats.target,
                        (
                            rate(|t| t.read_bytes),
                            rate(|t| t.written_bytes),
                            rate(|t| t.operations),
                            stats.queue_depth,
                        ),
                    );
                }
            }
            status.nodes.push(NodeStatus {
                id: node.id,
                kind: node.kind,
                alias: node.alias.clone(),
                addresses: node.addresses.clone(),
                reachability: node.reachability,
                uptime_ms: samples.map_or(0, |s| s.latest.1.uptime_ms),
                requests_per_second: rate(|s| s.requests),
                received_bytes_per_second: rate(|s| s.received_bytes),
                sent_bytes_per_second: rate(|s| s.sent_bytes),
                in_flight: samples.map_or(0, |s| s.latest.1.in_flight),
                meta_usage: node.meta_usage,
                meta_inodes: node.meta_inodes_used,
            });
        }
        for target in &map.targets {
            let (read, written, operations, queue_depth) =
                target_rates.get(&target.id).copied().unwrap_or_default();
            status.targets.push(TargetStatus {
                id: target.id,
                node: target.node,
                pool: target.pool,
                reachability: target.reachability,
                consistency: <&str>::from(map.target_consistency(target.id)).to_string(),
                usage: target.usage,
                read_bytes_per_second: read,
                written_bytes_per_second: written,
                operations_per_second: operations,
                queue_depth,
                drain_left: None,
                drain_blocked: None,
            });
        }
        status.clients = state.client_rates();
        status.history = state.history.iter().copied().collect();
        status.events = state.events.iter().cloned().collect();
        let online = |r: Reachability| r == Reachability::Online;
        status.totals = ClusterTotals {
            nodes: map.nodes.len() as u64,
            nodes_online: map.nodes.iter().filter(|n| online(n.reachability)).count() as u64,
            targets: map.targets.len() as u64,
            targets_online: map
                .targets
                .iter()
                .filter(|t| online(t.reachability))
                .count() as u64,
            client_sessions: map.live_sessions.len() as u64,
            capacity_bytes: map.targets.iter().map(|t| t.usage.total_bytes).sum(),
            free_bytes: map.targets.iter().map(|t| t.usage.free_bytes).sum(),
            inodes: map.nodes.iter().filter_map(|n| n.meta_inodes_used).sum(),
            now: state.history.back().copied().unwrap_or_default(),
        };
        status
    }
}

impl MonitorState {
    /// The cluster's throughput over the last two samples of each server.
    fn cluster_sample(&self) -> ClusterSample {
        let mut sample = ClusterSample {
            unix_ms: unix_ms(),
            ..ClusterSample::default()
        };
        for ((kind, _), samples) in &self.samples {
            match kind {
                NodeKind::Storage => {
                    sample.read_bytes_per_second +=
                        samples.rate(|s| s.targets.iter().map(|t| t.read_bytes).sum());
                    sample.written_bytes_per_second +=
                        samples.rate(|s| s.targets.iter().map(|t| t.written_bytes).sum());
                }
                NodeKind::Meta => sample.meta_ops_per_second += samples.rate(|s| s.requests),
                NodeKind::Management => {}
            }
        }
        sample
    }

    /// Each client session's load over every server, busiest first.
    fn client_rates(&self) -> Vec<ClientStatus> {
        let mut clients: HashMap<ClientId, ClientStatus> = HashMap::new();
        for ((kind, _), samples) in &self.samples {
            let (Some(seconds), Some((_, old))) = (samples.seconds(), &samples.previous) else {
                continue;
            };
            for client in &samples.latest.1.clients {
                if client.client.0 == 0 {
                    continue;
                }
                let before = old.clients.iter().find(|c| c.client == client.client);
                // A session new since the last sample did all its work in between.
                let rate = |pick: fn(&ClientStats) -> u64| {
                    per_second(pick(client), before.map_or(0, pick), seconds)
                };
                let entry = clients.entry(client.client).or_insert(ClientStatus {
                    client: client.client,
                    requests_per_second: 0,
                    written_bytes_per_second: 0,
                    read_bytes_per_second: 0,
                });
                entry.requests_per_second += rate(|c| c.requests);
                if *kind == NodeKind::Storage {
                    entry.written_bytes_per_second += rate(|c| c.received_bytes);
                    entry.read_bytes_per_second += rate(|c| c.sent_bytes);
                }
            }
        }
        let mut clients: Vec<ClientStatus> = clients
            .into_values()
            .filter(|c| c.requests_per_second > 0)
            .collect();
        clients.sort_by_key(|c| (std::cmp::Reverse(c.requests_per_second), c.client.0));
        clients.truncate(CLIENTS_SHOWN);
        clients
    }
}
