//! Management under simulated nodes: many storage servers and client sessions register,
//! heartbeat and follow the cluster map as real ones do (one connection each, a long-polled
//! `WatchClusterMap`), so that what management costs per node — heartbeat latency, the time a
//! map change takes to reach every node, the bytes it sends, its CPU — is measured at sizes
//! this machine has no hosts for. The simulated servers announce an address nothing listens
//! on: management's polls of them fail at once, as for a server that just died.

use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_net::MgmtCalls;
use weft_net::{MgmtClient, RpcClientOptions};
use weft_proto::messages::{NodeKind, SpaceUsage, TargetReport};
use weft_proto::{NodeId, TargetId};

/// Parameters of a run.
#[derive(Clone, Debug, Serialize)]
pub struct MgmtBenchConfig {
    /// Simulated storage servers, one target each.
    pub servers: usize,
    /// Simulated client sessions.
    pub clients: usize,
    /// Interval of a server's heartbeat (the storage default is 2 s).
    pub server_heartbeat: Duration,
    /// Interval of a client's heartbeat (the client default is 5 s).
    pub client_heartbeat: Duration,
    /// Map changes made during the steady phase, one every `change_interval`.
    pub changes: usize,
    /// Time between two map changes.
    pub change_interval: Duration,
}

/// Percentiles of a set of durations, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// How many were measured.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Latency {
        if samples.is_empty() {
            return Latency::default();
        }
        samples.sort();
        let at = |fraction: f64| {
            let index = ((samples.len() - 1) as f64 * fraction).round() as usize;
            samples[index].as_secs_f64() * 1e3
        };
        Latency {
            count: samples.len(),
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct MgmtBenchResult {
    /// Registrations (servers, their targets and client sessions) per second, each waiting for
    /// its answer before the next is sent (as many nodes starting one after another).
    pub registrations_per_second: f64,
    /// A server's heartbeat, sent to its answer.
    pub server_heartbeat: Latency,
    /// A client session's heartbeat.
    pub client_heartbeat: Latency,
    /// From a map change (a target registered) to each node holding the new map, over every
    /// node and change.
    pub map_push: Latency,
    /// Heartbeats that failed.
    pub heartbeat_errors: u64,
    /// Seconds of the steady phase.
    pub seconds: f64,
    /// Management's CPU during the steady phase, in cores (when its process id was given).
    pub mgmt_cpu_cores: Option<f64>,
    /// Bytes management sent per second during the steady phase.
    pub mgmt_sent_bytes_per_second: f64,
    /// Bytes of one encoded cluster map at the end.
    pub map_bytes: usize,
}

/// CPU seconds (user and system) process `pid` has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / per_second.max(1) as f64)
}

/// One simulated node's own connection to management.
fn connect(mgmt: &str, options: &RpcClientOptions) -> Arc<MgmtClient> {
    Arc::new(MgmtClient::new(
        mgmt,
        RpcClientOptions {
            connections: 1,
            ..options.clone()
        },
    ))
}

/// The newest map epoch each node holds, and when each arrived.
#[derive(Default)]
struct Arrivals {
    /// Per node: (epoch, when it arrived) of every map it received.
    seen: Vec<Vec<(u64, Instant)>>,
}

impl Arrivals {
    /// Nothing arrived yet at any of `nodes` nodes.
    fn of(nodes: usize) -> Arrivals {
        Arrivals {
            seen: vec![Vec::new(); nodes],
        }
    }
}

/// Where a simulated node's heartbeats are counted, and when they stop.
struct Beating {
    /// Latencies of the heartbeats answered.
    beats: Arc<Mutex<Vec<Duration>>>,
    /// Heartbeats that failed.
    errors: Arc<AtomicU64>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl Beating {
    /// Runs `beat` (true when answered) every `interval` from `offset` on, until stopped.
    fn spawn<F, Beat>(
        self,
        tasks: &mut tokio::task::JoinSet<()>,
        (offset, interval): (Duration, Duration),
        beat: F,
    ) where
        F: Fn() -> Beat + Send + 'static,
        Beat: std::future::Future<Output = bool> + Send,
    {
        tasks.spawn(async move {
            tokio::time::sleep(offset).await;
            while !self.stopping.load(Ordering::Acquire) {
                let sent = Instant::now();
                if beat().await {
                    self.beats.lock().expect("beats").push(sent.elapsed());
                } else {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(interval.saturating_sub(sent.elapsed())).await;
            }
        });
    }
}

/// Runs the simulation against management at `mgmt` for `steady` after every node has
/// registered.
///
/// # Errors
/// When a registration fails: management unreachable or refusing.
pub async fn run(
    mgmt: &str,
    options: &RpcClientOptions,
    config: &MgmtBenchConfig,
    mgmt_pid: Option<u32>,
) -> Result<MgmtBenchResult> {
    let admin = connect(mgmt, options);
    let (servers, clients, registrations_per_second) = register(mgmt, options, config).await?;

    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let server_beats = Arc::new(Mutex::new(Vec::new()));
    let client_beats = Arc::new(Mutex::new(Vec::new()));
    let nodes = servers.len() + clients.len();
    let arrivals = Arc::new(Mutex::new(Arrivals::of(nodes)));
    let mut tasks = tokio::task::JoinSet::new();
    let watching = (arrivals, Arc::clone(&stopping), Arc::clone(&stop));
    spawn_watchers(&mut tasks, (&servers, &clients), &watching);
    let beating = |beats: &Arc<Mutex<Vec<Duration>>>| Beating {
        beats: Arc::clone(beats),
        errors: Arc::clone(&errors),
        stopping: Arc::clone(&stopping),
    };
    for (index, (client, node, target)) in servers.iter().enumerate() {
        let (client, node, target) = (Arc::clone(client), *node, *target);
        let interval = config.server_heartbeat;
        // Spread over the interval, as servers started at different times are.
        let offset = interval.mul_f64(index as f64 / config.servers.max(1) as f64);
        beating(&server_beats).spawn(&mut tasks, (offset, interval), move || {
            let client = Arc::clone(&client);
            async move {
                client
                    .heartbeat(
                        (NodeKind::Storage, node),
                        vec![TargetReport {
                            target,
                            usage: SIMULATED_USAGE,
                        }],
                        weft_net::stubs::MetaReport::default(),
                        None,
                        weft_net::stubs::HEARTBEAT_DEADLINE,
                    )
                    .await
                    .is_ok()
            }
        });
    }
    for (index, (client, session)) in clients.iter().enumerate() {
        let (client, session) = (Arc::clone(client), *session);
        let interval = config.client_heartbeat;
        let offset = interval.mul_f64(index as f64 / config.clients.max(1) as f64);
        beating(&client_beats).spawn(&mut tasks, (offset, interval), move || {
            let client = Arc::clone(&client);
            async move { client.client_heartbeat(session, Vec::new()).await.is_ok() }
        });
    }

    // Steady phase: heartbeats go on, and the map changes now and then.
    // Every node holds the map of the last registration before the steady phase starts.
    tokio::time::sleep(config.change_interval).await;
    let steady = Instant::now();
    let cpu_before = mgmt_pid.and_then(cpu_seconds);
    let sent_before = sent_bytes(&admin, options).await;
    let changes = change_map(&admin, &servers, config).await?;
    tokio::time::sleep(config.change_interval).await;
    let seconds = steady.elapsed().as_secs_f64();
    let mgmt_cpu_cores = match (cpu_before, mgmt_pid.and_then(cpu_seconds)) {
        (Some(before), Some(after)) => Some((after - before) / seconds),
        _ => None,
    };
    let sent = sent_bytes(&admin, options)
        .await
        .saturating_sub(sent_before);
    let map_bytes =
        weft_proto::codec::encode_body(&admin.cluster_map().await.context("the map")?).len();
    stopping.store(true, Ordering::Release);
    stop.notify_waiters();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}

    let pushes = pushes(&changes, &watching.0.lock().expect("arrivals"));
    let take =
        |beats: &Arc<Mutex<Vec<Duration>>>| std::mem::take(&mut *beats.lock().expect("beats"));
    Ok(MgmtBenchResult {
        registrations_per_second,
        server_heartbeat: Latency::of(take(&server_beats)),
        client_heartbeat: Latency::of(take(&client_beats)),
        map_push: Latency::of(pushes),
        heartbeat_errors: errors.load(Ordering::Relaxed),
        seconds,
        mgmt_cpu_cores,
        mgmt_sent_bytes_per_second: sent as f64 / seconds,
        map_bytes,
    })
}

/// Simulated servers, each registered with one target, and their clients.
type Servers = Vec<(Arc<MgmtClient>, NodeId, TargetId)>;
/// Simulated client sessions and their clients.
type Clients = Vec<(Arc<MgmtClient>, weft_proto::ClientId)>;

/// Registers the simulated servers (a node and a target each) and client sessions, one after
/// another; answers them and the registrations per second.
async fn register(
    mgmt: &str,
    options: &RpcClientOptions,
    config: &MgmtBenchConfig,
) -> Result<(Servers, Clients, f64)> {
    let started = Instant::now();
    let mut servers = Vec::new();
    for index in 0..config.servers {
        let client = connect(mgmt, options);
        let node = client
            .register_node(
                None,
                NodeKind::Storage,
                format!("sim-storage-{index}"),
                vec!["127.0.0.1:9".to_string()],
            )
            .await
            .context("register a simulated storage server")?;
        let target = client
            .register_target(node, None)
            .await
            .context("register a simulated target")?;
        servers.push((client, node, target));
    }
    let mut clients = Vec::new();
    for index in 0..config.clients {
        let client = connect(mgmt, options);
        let session = client
            .register_client(format!("sim-client-{index}"))
            .await
            .context("register a simulated client session")?
            .id;
        clients.push((client, session));
    }
    let registrations = config.servers * 2 + config.clients;
    let per_second = registrations as f64 / started.elapsed().as_secs_f64();
    Ok((servers, clients, per_second))
}

/// Node `index`'s watch of the map: records when each new epoch arrived, until stopped.
async fn watch(
    watcher: Arc<MgmtClient>,
    index: usize,
    (arrivals, stopping, stop): (
        Arc<Mutex<Arrivals>>,
        Arc<AtomicBool>,
        Arc<tokio::sync::Notify>,
    ),
) {
    let mut epoch = 0;
    while !stopping.load(Ordering::Acquire) {
        let watched = tokio::select! {
            watched = watcher.watch_cluster_map(epoch, 10_000) => watched,
            () = stop.notified() => return,
        };
        match watched {
            Ok(map) => {
                if map.epoch > epoch {
                    epoch = map.epoch;
                    arrivals.lock().expect("arrivals").seen[index].push((epoch, Instant::now()));
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// How long each change (its epoch, when it was made) took to reach each node: a change
/// reached a node when the node first held a map of the change's epoch or later.
fn pushes(changes: &[(u64, Instant)], arrivals: &Arrivals) -> Vec<Duration> {
    let mut pushes = Vec::new();
    for (epoch, made) in changes {
        for seen in &arrivals.seen {
            if let Some((_, at)) = seen.iter().find(|(held, _)| held >= epoch) {
                pushes.push(at.saturating_duration_since(*made));
            }
        }
    }
    pushes
}

/// What every simulated target reports.
const SIMULATED_USAGE: SpaceUsage = SpaceUsage {
    total_bytes: 1 << 40,
    free_bytes: 1 << 39,
    total_inodes: 1 << 30,
    free_inodes: 1 << 29,
};

/// What a node's watch of the map records into, and is stopped by.
type Watching = (
    Arc<Mutex<Arrivals>>,
    Arc<AtomicBool>,
    Arc<tokio::sync::Notify>,
);

/// Every simulated node's watch of the map ([`watch`]), servers first.
fn spawn_watchers(
    tasks: &mut tokio::task::JoinSet<()>,
    (servers, clients): (&Servers, &Clients),
    (arrivals, stopping, stop): &Watching,
) {
    let watchers = servers
        .iter()
        .map(|(client, _, _)| Arc::clone(client))
        .chain(clients.iter().map(|(client, _)| Arc::clone(client)));
    for (index, watcher) in watchers.enumerate() {
        let watching = (Arc::clone(arrivals), Arc::clone(stopping), Arc::clone(stop));
        tasks.spawn(watch(watcher, index, watching));
    }
}

/// The steady phase's map changes, one target registered every `change_interval`; answers
/// each change's epoch and when it was made.
async fn change_map(
    admin: &MgmtClient,
    servers: &Servers,
    config: &MgmtBenchConfig,
) -> Result<Vec<(u64, Instant)>> {
    let mut changes = Vec::new();
    for change in 0..config.changes {
        tokio::time::sleep(config.change_interval).await;
        let (client, node, _) = &servers[change % servers.len().max(1)];
        let made = Instant::now();
        client
            .register_target(*node, None)
            .await
            .context("register a target (a map change)")?;
        let epoch = admin.cluster_map().await.context("the map")?.epoch;
        changes.push((epoch, made));
    }
    Ok(changes)
}

/// The bytes management's server behind `client` sent since it started (0 when it cannot
/// tell).
async fn sent_bytes(client: &MgmtClient, options: &RpcClientOptions) -> u64 {
    let rpc = weft_net::RpcClient::new(client.address(), options.clone());
    rpc.node_stats()
        .await
        .map(|stats| stats.sent_bytes)
        .unwrap_or(0)
}
