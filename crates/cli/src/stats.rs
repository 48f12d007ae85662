//! `weft stats server|client` (live load per node and per client session, like `beegfs-ctl
//! --serverstats` / `--clientstats`) and `weft cluster status` (management's view).

use crate::admin::{connect, human, reachability, ClusterArgs};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weft_net::MgmtCalls;
use weft_net::{RpcClient, RpcClientOptions};
use weft_proto::messages::{ClusterMap, ClusterStatus, NodeKind, NodeStats};
use weft_proto::ClientId;

#[derive(Subcommand)]
pub enum StatsCommand {
    /// Requests, bytes and queue per metadata and storage server, refreshed every interval.
    Server(StatsArgs),
    /// Requests and bytes per client session over all servers, refreshed every interval.
    Client(StatsArgs),
}

#[derive(Args)]
pub struct StatsArgs {
    /// Seconds between refreshes (each line is the rate over one interval).
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// Print one interval and stop.
    #[arg(long)]
    once: bool,
    /// One JSON object per interval instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Nodes, targets, states, space, recent throughput and events, as management sees them.
    Status {
        /// Print management's view as JSON (the same as GET /api/cluster on its port).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
}

/// One server's load over one interval.
#[derive(serde::Serialize)]
struct ServerRow {
    node: String,
    kind: NodeKind,
    requests_per_second: f64,
    errors_per_second: f64,
    received_bytes_per_second: f64,
    sent_bytes_per_second: f64,
    disk_read_bytes_per_second: f64,
    disk_written_bytes_per_second: f64,
    in_flight: u64,
    /// The three most frequent operations in the interval, with their rates.
    top_ops: Vec<(String, f64)>,
}

/// One client session's load over one interval, summed over all servers.
#[derive(serde::Serialize, Default)]
struct ClientRow {
    client: String,
    requests_per_second: f64,
    meta_requests_per_second: f64,
    written_bytes_per_second: f64,
    read_bytes_per_second: f64,
}

struct Server {
    name: String,
    kind: NodeKind,
    rpc: RpcClient,
}

fn servers(map: &ClusterMap, options: &RpcClientOptions) -> Vec<Server> {
    map.nodes
        .iter()
        .filter(|node| node.kind != NodeKind::Management)
        .filter_map(|node| {
            Some(Server {
                name: node.alias.clone(),
                kind: node.kind,
                rpc: RpcClient::new(
                    node.address()?,
                    RpcClientOptions {
                        connections: 1,
                        request_timeout: Duration::from_secs(5),
                        ..options.clone()
                    },
                ),
            })
        })
        .collect()
}

/// Every server's counters now; `None` for a server that does not answer.
async fn sample(servers: &[Server]) -> Vec<Option<NodeStats>> {
    let mut out = Vec::with_capacity(servers.len());
    for server in servers {
        out.push(server.rpc.node_stats().await.ok());
    }
    out
}

fn per_second(new: u64, old: u64, seconds: f64) -> f64 {
    new.saturating_sub(old) as f64 / seconds
}

fn server_rows(
    servers: &[Server],
    (old, new): (&[Option<NodeStats>], &[Option<NodeStats>]),
    seconds: f64,
) -> Vec<ServerRow> {
    let mut rows = Vec::new();
    for ((server, old), new) in servers.iter().zip(old).zip(new) {
        let (Some(old), Some(new)) = (old, new) else {
            continue;
        };
        let rate = |pick: fn(&NodeStats) -> u64| per_second(pick(new), pick(old), seconds);
        let before: BTreeMap<&str, u64> = old.ops.iter().map(|(op, n)| (op.as_str(), *n)).collect();
        let mut ops: Vec<(String, f64)> = new
            .ops
            .iter()
            .map(|(op, n)| {
                let then = before.get(op.as_str()).copied().unwrap_or(0);
                (op.clone(), per_second(*n, then, seconds))
            })
            .filter(|(op, rate)| *rate > 0.0 && op != "stats")
            .collect();
        ops.sort_by(|a, b| b.1.total_cmp(&a.1));
        ops.truncate(3);
        rows.push(ServerRow {
            node: server.name.clone(),
            kind: server.kind,
            requests_per_second: rate(|s| s.requests),
            errors_per_second: rate(|s| s.errors),
            received_bytes_per_second: rate(|s| s.received_bytes),
            sent_bytes_per_second: rate(|s| s.sent_bytes),
            disk_read_bytes_per_second: rate(|s| s.targets.iter().map(|t| t.read_bytes).sum()),
            disk_written_bytes_per_second: rate(|s| {
                s.targets.iter().map(|t| t.written_bytes).sum()
            }),
            in_flight: new.in_flight,
            top_ops: ops,
        });
    }
    rows
}

fn client_rows(
    servers: &[Server],
    (old, new): (&[Option<NodeStats>], &[Option<NodeStats>]),
    seconds: f64,
) -> Vec<ClientRow> {
    let mut clients: BTreeMap<ClientId, ClientRow> = BTreeMap::new();
    for ((server, old), new) in servers.iter().zip(old).zip(new) {
        let (Some(old), Some(new)) = (old, new) else {
            continue;
        };
        for client in &new.clients {
            if client.client.0 == 0 {
                // Servers and tools without a session (this command among them).
                continue;
            }
            let before = old.clients.iter().find(|c| c.client == client.client);
            let requests = per_second(client.requests, before.map_or(0, |c| c.requests), seconds);
            let row = clients.entry(client.client).or_insert_with(|| ClientRow {
                client: client.client.to_string(),
                ..ClientRow::default()
            });
            row.requests_per_second += requests;
            match server.kind {
                NodeKind::Meta => row.meta_requests_per_second += requests,
                NodeKind::Storage => {
                    row.written_bytes_per_second += per_second(
                        client.received_bytes,
                        before.map_or(0, |c| c.received_bytes),
                        seconds,
                    );
                    row.read_bytes_per_second += per_second(
                        client.sent_bytes,
                        before.map_or(0, |c| c.sent_bytes),
                        seconds,
                    );
                }
                NodeKind::Management => {}
            }
        }
    }
    let mut rows: Vec<ClientRow> = clients
        .into_values()
        .filter(|row| row.requests_per_second > 0.0)
        .collect();
    rows.sort_by(|a, b| b.requests_per_second.total_cmp(&a.requests_per_second));
    rows
}

fn mib(bytes_per_second: f64) -> String {
    format!("{:.1}", bytes_per_second / (1024.0 * 1024.0))
}

fn clock() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

pub fn stats(command: StatsCommand) -> Result<()> {
    let (clients, args) = match command {
        StatsCommand::Server(args) => (false, args),
        StatsCommand::Client(args) => (true, args),
    };
    if !(args.interval.is_finite() && args.interval >= 0.1) {
        return Err(anyhow!("--interval must be at least 0.1 seconds"));
    }
    let mgmt = args.cluster.mgmt()?;
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let (_, map) = connect(&mgmt).await?;
        let servers = servers(&map, &mgmt.options()?);
        let mut old = sample(&servers).await;
        let mut then = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs_f64(args.interval)).await;
            let new = sample(&servers).await;
            let now = Instant::now();
            let seconds = now.duration_since(then).as_secs_f64();
            let unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            if clients {
                let rows = client_rows(&servers, (&old, &new), seconds);
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({ "unix_ms": unix_ms, "interval_s": seconds, "clients": rows })
                    );
                } else {
                    print_clients(&rows);
                }
            } else {
                let rows = server_rows(&servers, (&old, &new), seconds);
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({ "unix_ms": unix_ms, "interval_s": seconds, "servers": rows })
                    );
                } else {
                    print_servers(&rows, servers.len());
                }
            }
            if args.once {
                return Ok(());
            }
            (old, then) = (new, now);
        }
    })
}

fn print_servers(rows: &[ServerRow], known: usize) {
    println!(
        "{}  {:<16} {:<8} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9} {:>5}  TOP OPERATIONS",
        clock(),
        "NODE",
        "KIND",
        "REQ/S",
        "ERR/S",
        "IN MiB/s",
        "OUT MiB/s",
        "DISK W",
        "DISK R",
        "QUEUE"
    );
    for row in rows {
        let top: Vec<String> = row
            .top_ops
            .iter()
            .map(|(op, rate)| format!("{op} {rate:.0}/s"))
            .collect();
        println!(
            "          {:<16} {:<8} {:>9.0} {:>7.0} {:>9} {:>9} {:>9} {:>9} {:>5}  {}",
            row.node,
            match row.kind {
                NodeKind::Meta => "meta",
                NodeKind::Storage => "storage",
                NodeKind::Management => "mgmt",
            },
            row.requests_per_second,
            row.errors_per_second,
            mib(row.received_bytes_per_second),
            mib(row.sent_bytes_per_second),
            mib(row.disk_written_bytes_per_second),
            mib(row.disk_read_bytes_per_second),
            row.in_flight,
            top.join(", ")
        );
    }
    if rows.len() < known {
        println!("          ({} servers did not answer)", known - rows.len());
    }
}

fn print_clients(rows: &[ClientRow]) {
    println!(
        "{}  {:<18} {:>9} {:>10} {:>11} {:>11}",
        clock(),
        "CLIENT",
        "REQ/S",
        "META REQ/S",
        "WRITE MiB/s",
        "READ MiB/s"
    );
    if rows.is_empty() {
        println!("          (no client did anything in this interval)");
    }
    for row in rows {
        println!(
            "          {:<18} {:>9.0} {:>10.0} {:>11} {:>11}",
            row.client,
            row.requests_per_second,
            row.meta_requests_per_second,
            mib(row.written_bytes_per_second),
            mib(row.read_bytes_per_second)
        );
    }
}

pub fn cluster(command: ClusterCommand) -> Result<()> {
    let ClusterCommand::Status { json, cluster } = command;
    let mgmt = cluster.mgmt()?;
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let (view, _) = connect(&mgmt).await?;
        let status = view
            .mgmt()
            .cluster_status()
            .await
            .map_err(|error| anyhow!("{error}: is management running at {}?", mgmt.mgmt))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&status)?);
            return Ok(());
        }
        let totals = &status.totals;
        println!(
            "Nodes {}/{} online · targets {}/{} online · {} client sessions · {} inodes",
            totals.nodes_online,
            totals.nodes,
            totals.targets_online,
            totals.targets,
            totals.client_sessions,
            totals.inodes
        );
        println!(
            "Storage {} of which {} free · now writing {}/s, reading {}/s, {} metadata ops/s",
            human(totals.capacity_bytes),
            human(totals.free_bytes),
            human(totals.now.written_bytes_per_second),
            human(totals.now.read_bytes_per_second),
            totals.now.meta_ops_per_second
        );
        print_nodes(&status);
        print_targets(&status);
        print_balance(&status);
        if !status.quotas.is_empty() {
            println!(
                "\n  Quotas ({} rules, `weft quota list` shows them):",
                status.quotas.len()
            );
            for state in status
                .quotas
                .iter()
                .filter(|s| s.bytes_blocked || s.inodes_blocked)
            {
                println!(
                    "  BLOCKED {:?} {} in pool {}",
                    state.rule.kind, state.rule.id, state.rule.pool
                );
            }
        }
        if !status.events.is_empty() {
            println!("\n  Recent events:");
            for event in status.events.iter().rev().take(10) {
                println!("  {:<8} {}", event.level, event.message);
            }
        }
        Ok(())
    })
}

/// The status's table of nodes.
fn print_nodes(status: &ClusterStatus) {
    println!(
        "\n  {:<6} {:<9} {:<16} {:<17} {:>8} {:>11} {:>11}",
        "ID", "KIND", "ALIAS", "STATE", "REQ/S", "IN/s", "OUT/s"
    );
    for node in &status.nodes {
        println!(
            "  {:<6} {:<9} {:<16} {:<17} {:>8} {:>11} {:>11}",
            node.id.0,
            match node.kind {
                NodeKind::Meta => "meta",
                NodeKind::Storage => "storage",
                NodeKind::Management => "mgmt",
            },
            node.alias,
            reachability(node.reachability),
            node.requests_per_second,
            human(node.received_bytes_per_second),
            human(node.sent_bytes_per_second)
        );
    }
}

/// The status's table of targets.
fn print_targets(status: &ClusterStatus) {
    println!(
        "\n  {:<7} {:<5} {:<5} {:<17} {:<12} {:>10} {:>10} {:>5} {:>11} {:>11}  MOVES",
        "TARGET",
        "NODE",
        "POOL",
        "REACHABILITY",
        "CONSISTENCY",
        "SIZE",
        "FREE",
        "USED",
        "WRITE/s",
        "READ/s"
    );
    for target in &status.targets {
        let usage = target.usage;
        let used = (usage.total_bytes - usage.free_bytes.min(usage.total_bytes))
            .saturating_mul(100)
            .checked_div(usage.total_bytes)
            .unwrap_or(0);
        let moves = match target.drain_left {
            Some(left) => format!("draining, {left} files left"),
            None => "-".to_string(),
        };
        println!(
            "  {:<7} {:<5} {:<5} {:<17} {:<12} {:>10} {:>10} {:>4}% {:>11} {:>11}  {moves}",
            target.id.0,
            target.node.0,
            target.pool.0,
            reachability(target.reachability),
            target.consistency,
            human(usage.total_bytes),
            human(usage.free_bytes),
            used,
            human(target.written_bytes_per_second),
            human(target.read_bytes_per_second)
        );
    }
}

/// Per pool of more than one target: the spread of the targets' fill, which rebalancing
/// narrows (`rebalance_margin_percent` of the metadata servers).
fn print_balance(status: &weft_proto::messages::ClusterStatus) {
    let mut pools: std::collections::BTreeMap<u16, Vec<f64>> = std::collections::BTreeMap::new();
    for target in &status.targets {
        let usage = target.usage;
        if usage.total_bytes > 0 {
            let used = usage.total_bytes - usage.free_bytes.min(usage.total_bytes);
            pools
                .entry(target.pool.0)
                .or_default()
                .push(used as f64 * 100.0 / usage.total_bytes as f64);
        }
    }
    let lines: Vec<String> = pools
        .iter()
        .filter(|(_, fills)| fills.len() > 1)
        .map(|(pool, fills)| {
            let mean = fills.iter().sum::<f64>() / fills.len() as f64;
            let furthest = fills.iter().map(|f| (f - mean).abs()).fold(0.0, f64::max);
            format!("  pool {pool}: mean fill {mean:.1} %, furthest target {furthest:.1} points from it")
        })
        .collect();
    if !lines.is_empty() {
        println!("\n  Balance (rebalancing works while a target is further than its margin):");
        for line in lines {
            println!("{line}");
        }
    }
}
