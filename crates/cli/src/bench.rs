//! `weft bench`: runs the benchmarks of `weft-bench` and prints and saves their results.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use weft_bench::io::{self, IoBenchConfig, IoPhaseResult, NativeFiles, PosixFiles};
use weft_bench::meta::{self, MetaBenchConfig, NativeTarget, PhaseResult, PosixTarget};
use weft_bench::svg::{Panel, Series};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// mdtest-like metadata benchmark: mkdir, create, stat, read, unlink, rmdir.
    Meta(MetaArgs),
    /// IOR/IOzone-like data benchmark: sequential write and read (N-N or N-1), random 4 KiB
    /// writes and reads, with a thread sweep; every read checks its data.
    Io(IoArgs),
    /// The `io` workload through the native client with the storage servers skipping disk
    /// I/O (writes dropped, reads answered with zeros): the network and the protocol alone.
    /// Needs --mgmt.
    Net(IoArgs),
    /// IO500's phases (ior-easy and ior-hard write and read, mdtest-easy and mdtest-hard,
    /// find) in its order through a directory, scored with its formula.
    Io500(Io500Args),
    /// Management under simulated nodes: servers and client sessions that register,
    /// heartbeat and follow the map as real ones do; reports heartbeat and map push latency,
    /// management's CPU and bytes sent. Use a management of its own: the simulated nodes stay
    /// registered.
    Mgmt(MgmtSimArgs),
    /// Runs the `io` workload through the native client over every combination of chunk
    /// sizes, target counts and connections per server, and says which wins and by how much.
    Sweep(SweepArgs),
    /// StorageBench: every storage server measures its own targets, no client network
    /// involved (start, status, stop, cleanup).
    Storage {
        #[command(subcommand)]
        action: StorageBenchAction,
    },
}

#[derive(Args)]
pub struct Io500Args {
    /// Run in this directory (a Weft mount, or any file system to compare with).
    #[arg(long)]
    path: PathBuf,
    /// Threads (IO500's processes).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// ior-easy: bytes each thread writes to its own file, in 1 MiB transfers (suffixes K, M, G).
    #[arg(long, default_value = "256M")]
    easy_size: String,
    /// ior-hard: 47,008-byte records each thread writes to the shared file.
    #[arg(long, default_value_t = 2000)]
    hard_records: u64,
    /// mdtest-easy: empty files each thread makes in its own directory.
    #[arg(long, default_value_t = 2000)]
    easy_files: usize,
    /// mdtest-hard: 3,901-byte files each thread makes in the shared directory.
    #[arg(long, default_value_t = 1000)]
    hard_files: usize,
    /// Leave the kernel's caches alone (by default they are emptied before every phase after
    /// the writes, which needs root, so that reads do not come from what the writes cached).
    #[arg(long)]
    keep_caches: bool,
    /// Name of this target in the output and the JSON.
    #[arg(long)]
    label: Option<String>,
    /// Append the result as a JSON line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run_io500(args: Io500Args) -> Result<()> {
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let config = weft_bench::io500::Io500Config {
        threads: args.threads,
        easy_bytes_per_thread: crate::admin::parse_size(&args.easy_size)?,
        hard_records_per_thread: args.hard_records,
        easy_files_per_thread: args.easy_files,
        hard_files_per_thread: args.hard_files,
        drop_caches: !args.keep_caches,
    };
    let run = format!("weft-io500-{}", std::process::id());
    let result = weft_bench::io500::run(&args.path, &config, &run)
        .with_context(|| format!("IO500 run in {}", args.path.display()))?;
    let label = args
        .label
        .unwrap_or_else(|| args.path.display().to_string());
    weft_bench::io500::print(&label, &result);
    if let Some(path) = &args.json {
        append_json(
            path,
            std::iter::once(
                serde_json::json!({ "label": label, "config": config, "result": result }),
            ),
        )?;
    }
    Ok(())
}

#[derive(Args)]
pub struct MgmtSimArgs {
    #[command(flatten)]
    locator: crate::MgmtLocator,
    /// Simulated storage servers (one target each).
    #[arg(long, default_value_t = 200)]
    servers: usize,
    /// Simulated client sessions.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// A server's heartbeat interval, ms.
    #[arg(long, default_value_t = 2000)]
    server_heartbeat_ms: u64,
    /// A client's heartbeat interval, ms.
    #[arg(long, default_value_t = 5000)]
    client_heartbeat_ms: u64,
    /// Map changes (a target registered) made while the nodes heartbeat.
    #[arg(long, default_value_t = 10)]
    changes: usize,
    /// Time between two map changes, ms.
    #[arg(long, default_value_t = 2000)]
    change_interval_ms: u64,
    /// Management's process id, to measure its CPU.
    #[arg(long)]
    mgmt_pid: Option<u32>,
    /// Append the result as a JSON line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn run_mgmt_sim(args: MgmtSimArgs) -> Result<()> {
    let cluster = crate::admin::locate(&args.locator, None)?;
    let config = weft_bench::mgmt::MgmtBenchConfig {
        servers: args.servers,
        clients: args.clients,
        server_heartbeat: std::time::Duration::from_millis(args.server_heartbeat_ms),
        client_heartbeat: std::time::Duration::from_millis(args.client_heartbeat_ms),
        changes: args.changes,
        change_interval: std::time::Duration::from_millis(args.change_interval_ms),
    };
    let options = cluster.options()?;
    let result = crate::runtime()?.block_on(weft_bench::mgmt::run(
        &cluster.mgmt,
        &options,
        &config,
        args.mgmt_pid,
    ))?;
    let latency = |name: &str, l: &weft_bench::mgmt::Latency| {
        println!(
            "{name:<22} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  ({} samples)",
            l.p50_ms, l.p99_ms, l.max_ms, l.count
        );
    };
    println!(
        "{} servers, {} client sessions: {:.0} registrations/s",
        args.servers, args.clients, result.registrations_per_second
    );
    latency("server heartbeat", &result.server_heartbeat);
    latency("client heartbeat", &result.client_heartbeat);
    latency("map push to every node", &result.map_push);
    println!(
        "heartbeat errors {}; management CPU {}; sent {:.1} MB/s; map {} bytes",
        result.heartbeat_errors,
        result
            .mgmt_cpu_cores
            .map_or("not measured".to_string(), |cores| format!(
                "{:.2} cores",
                cores
            )),
        result.mgmt_sent_bytes_per_second / 1e6,
        result.map_bytes
    );
    if let Some(path) = &args.json {
        append_json(
            path,
            std::iter::once(serde_json::json!({ "config": config, "result": result })),
        )?;
    }
    Ok(())
}

#[derive(Args)]
pub struct SweepArgs {
    /// Management address of the cluster (the sweep runs through the native client).
    #[arg(long)]
    mgmt: String,
    /// Chunk sizes to try, e.g. 256K,512K,1M.
    #[arg(long, value_delimiter = ',', default_value = "256K,512K,1M")]
    chunk_sizes: Vec<String>,
    /// Numbers of targets per file to try, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    num_targets: Vec<u64>,
    /// Connections per storage server to try, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    connections: Vec<usize>,
    /// Threads of the workload.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Bytes each thread writes and reads sequentially.
    #[arg(long, default_value = "128M")]
    size: String,
    /// Size of each sequential request.
    #[arg(long, default_value = "1M")]
    block_size: String,
    /// Random 4 KiB writes and reads per thread (0: skip them).
    #[arg(long, default_value_t = 0)]
    random_ops: usize,
    /// Runs per configuration; each phase reports the median run (noise on a shared machine
    /// makes single runs differ by 1.3x and more).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Append every configuration's results as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw each configuration's write and read MB/s into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// One configuration of a sweep.
#[derive(Clone, Debug, serde::Serialize)]
struct SweepConfig {
    chunk_size_bytes: u64,
    num_targets: u64,
    connections: usize,
}

fn run_sweep(args: SweepArgs) -> Result<()> {
    if args.threads == 0 || args.repeat == 0 {
        bail!("--threads and --repeat need at least 1");
    }
    let configs = sweep_configs(&args)?;
    let io_config = IoBenchConfig {
        bytes_per_thread: crate::admin::parse_size(&args.size)?,
        block_bytes: usize::try_from(crate::admin::parse_size(&args.block_size)?)?,
        shared_file: false,
        random_ops_per_thread: args.random_ops,
        queue_depth: 1,
        verify: true,
    };
    let runtime = crate::runtime()?;
    let mut measured: Vec<(SweepConfig, Vec<IoPhaseResult>)> = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        eprintln!(
            "configuration {}/{}: chunk {} B, {} targets, {} connections per server",
            index + 1,
            configs.len(),
            config.chunk_size_bytes,
            config.num_targets,
            config.connections
        );
        let runs = sweep_one(&args, (index, config), &io_config, &runtime)?;
        measured.push((config.clone(), median_phases(runs)));
    }
    print_sweep(&measured);
    if let Some(path) = &args.svg {
        let series = |phase: &str| Series {
            name: phase.to_string(),
            points: measured
                .iter()
                .enumerate()
                .map(|(index, (_, results))| ((index + 1) as f64, rate(results, phase, false)))
                .collect(),
        };
        let panel = Panel {
            title: "sweep: configurations in the order of the table".into(),
            x_label: "configuration (table row)".into(),
            y_label: "MB/s".into(),
            series: vec![series("write"), series("read")],
        };
        std::fs::write(path, weft_bench::svg::render(&[panel]))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json {
        append_json(
            path,
            measured.iter().flat_map(|(config, results)| {
                results.iter().map(move |result| {
                    serde_json::json!({ "sweep": config, "threads": args.threads, "result": result })
                })
            }),
        )?;
    }
    Ok(())
}

/// Every configuration a sweep's arguments name, each checked.
fn sweep_configs(args: &SweepArgs) -> Result<Vec<SweepConfig>> {
    let mut chunk_sizes = Vec::new();
    for text in &args.chunk_sizes {
        chunk_sizes.push(crate::admin::parse_size(text)?);
    }
    let mut configs = Vec::new();
    for chunk_size_bytes in &chunk_sizes {
        for num_targets in &args.num_targets {
            for connections in &args.connections {
                weft_proto::layout::StripePattern::raid0(
                    *chunk_size_bytes,
                    *num_targets,
                    weft_proto::StoragePoolId::DEFAULT,
                )
                .with_context(|| format!("chunk size {chunk_size_bytes}, {num_targets} targets"))?;
                if *connections == 0 {
                    bail!("--connections needs at least 1");
                }
                configs.push(SweepConfig {
                    chunk_size_bytes: *chunk_size_bytes,
                    num_targets: *num_targets,
                    connections: *connections,
                });
            }
        }
    }
    Ok(configs)
}

/// Runs the sweep's phases `args.repeat` times with configuration `index`, in a directory
/// of its own that is removed after.
fn sweep_one(
    args: &SweepArgs,
    (index, config): (usize, &SweepConfig),
    io_config: &IoBenchConfig,
    runtime: &tokio::runtime::Runtime,
) -> Result<Vec<Vec<IoPhaseResult>>> {
    let mut client_config = crate::admin::Cluster::at(args.mgmt.clone(), None).client_config();
    client_config.connections_per_server = config.connections;
    let client = runtime
        .block_on(weft_client::Client::connect(&client_config))
        .map_err(|error| anyhow::anyhow!("{error}: is management running at {}?", args.mgmt))?;
    let name = format!("weft-bench-sweep-{}-{index}", std::process::id());
    let dir = runtime.block_on(async {
        let dir = client
            .mkdir(weft_proto::InodeId::ROOT, &name, 0o755, 0o022, (0, 0))
            .await?;
        let pattern = weft_proto::layout::StripePattern::raid0(
            config.chunk_size_bytes,
            config.num_targets,
            weft_proto::StoragePoolId::DEFAULT,
        )?;
        client.set_pattern(dir.inode, pattern).await?;
        anyhow::Ok(dir.inode)
    })?;
    let target = NativeFiles {
        client: Arc::clone(&client),
        runtime: runtime.handle().clone(),
        dir,
    };
    let mut runs = Vec::new();
    for _ in 0..args.repeat {
        runs.push(io::run(&target, io_config, args.threads, "sweep")?);
    }
    runtime.block_on(client.rmdir(weft_proto::InodeId::ROOT, &name))?;
    Ok(runs)
}

/// The rate of `phase` in `results`: IOPS or MB/s; 0 when it did not run.
fn rate(results: &[IoPhaseResult], phase: &str, iops: bool) -> f64 {
    results
        .iter()
        .find(|r| r.phase == phase)
        .map(|r| if iops { r.iops } else { r.mb_per_second })
        .unwrap_or(0.0)
}

/// The sweep's table, and per phase its best configuration against its worst.
fn print_sweep(measured: &[(SweepConfig, Vec<IoPhaseResult>)]) {
    println!(
        "{:>10} {:>7} {:>5} {:>10} {:>10} {:>10} {:>10}",
        "chunk", "targets", "conns", "write MB/s", "read MB/s", "rw IOPS", "rr IOPS"
    );
    let cell = |v: f64| {
        if v > 0.0 {
            format!("{v:.0}")
        } else {
            "-".to_string()
        }
    };
    for (config, results) in measured {
        println!(
            "{:>10} {:>7} {:>5} {:>10.1} {:>10.1} {:>10} {:>10}",
            config.chunk_size_bytes,
            config.num_targets,
            config.connections,
            rate(results, "write", false),
            rate(results, "read", false),
            cell(rate(results, "randwrite", true)),
            cell(rate(results, "randread", true))
        );
    }
    for (phase, iops) in [
        ("write", false),
        ("read", false),
        ("randwrite", true),
        ("randread", true),
    ] {
        let mut ranked: Vec<(&SweepConfig, f64)> = measured
            .iter()
            .map(|(config, results)| (config, rate(results, phase, iops)))
            .filter(|(_, v)| *v > 0.0)
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        if let (Some(best), Some(worst)) = (ranked.first(), ranked.last()) {
            println!(
                "{phase}: best chunk {} B, {} targets, {} connections: {:.1} {}, {:.2}x the worst",
                best.0.chunk_size_bytes,
                best.0.num_targets,
                best.0.connections,
                best.1,
                if iops { "IOPS" } else { "MB/s" },
                best.1 / worst.1
            );
        }
    }
}

/// Per phase, the result of the run with the median rate.
fn median_phases(runs: Vec<Vec<IoPhaseResult>>) -> Vec<IoPhaseResult> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|phase| {
            let mut same: Vec<&IoPhaseResult> = runs
                .iter()
                .filter_map(|run| run.iter().find(|r| r.phase == phase.phase))
                .collect();
            same.sort_by(|a, b| a.mb_per_second.total_cmp(&b.mb_per_second));
            same[same.len() / 2].clone()
        })
        .collect()
}

#[derive(Subcommand)]
pub enum StorageBenchAction {
    /// Starts a run on every storage server (or on the targets named).
    Start(StorageStartArgs),
    /// Shows the current or last run, per target.
    Status(StorageStatusArgs),
    /// Stops a run.
    Stop(StorageStatusArgs),
    /// Removes the files the runs wrote.
    Cleanup(StorageStatusArgs),
}

#[derive(Args)]
pub struct StorageStartArgs {
    /// Read the files an earlier write run left (default: write new ones).
    #[arg(long)]
    read: bool,
    /// Bytes per request (suffixes K, M).
    #[arg(long, default_value = "1M")]
    block_size: String,
    /// Bytes each thread writes or reads (suffixes K, M, G).
    #[arg(long, default_value = "1G")]
    size: String,
    /// Threads per target.
    #[arg(long, default_value_t = 1)]
    threads: u16,
    /// Only these targets, e.g. 1,3.
    #[arg(long, value_delimiter = ',')]
    targets: Vec<u32>,
    #[command(flatten)]
    status: StorageStatusArgs,
}

#[derive(Args)]
pub struct StorageStatusArgs {
    /// Wait until the run ends, showing progress.
    #[arg(long)]
    wait: bool,
    /// Append the per-target results as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw each target's MB/s into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
    #[command(flatten)]
    locator: crate::MgmtLocator,
}

#[derive(Args)]
pub struct IoArgs {
    /// Run in this directory (a Weft mount, or any file system to compare with).
    #[arg(long, conflicts_with = "mgmt")]
    path: Option<PathBuf>,
    /// Run through the native client library against this management address.
    #[arg(long)]
    mgmt: Option<String>,
    /// Bytes each thread writes and reads sequentially (suffixes K, M, G).
    #[arg(long, default_value = "256M")]
    size: String,
    /// Size of each sequential request (a multiple of 4K; suffixes K, M).
    #[arg(long, default_value = "1M")]
    block_size: String,
    /// Thread counts to sweep, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    threads: Vec<usize>,
    /// One shared file with a region per thread (N-1) instead of a file per thread (N-N).
    #[arg(long)]
    shared_file: bool,
    /// Open with O_DIRECT (with --path; the native client never caches).
    #[arg(long)]
    direct: bool,
    /// Random 4 KiB writes, then as many reads, per thread (0: skip them).
    #[arg(long, default_value_t = 2000)]
    random_ops: usize,
    /// Random requests each thread keeps in flight (the queue depth of the random phases).
    #[arg(long, default_value_t = 1)]
    queue_depth: usize,
    /// Name of this target in the table, the JSON and the plot.
    #[arg(long)]
    label: Option<String>,
    /// Append results as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw throughput and IOPS against threads into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn append_json(path: &PathBuf, lines: impl Iterator<Item = serde_json::Value>) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    for line in lines {
        writeln!(file, "{line}")?;
    }
    Ok(())
}

/// The plot of an I/O run: MB/s of the sequential phases and IOPS of the random ones, against
/// threads.
fn io_plot(label: &str, results: &[IoPhaseResult]) -> String {
    let series = |phases: &[&str], value: fn(&IoPhaseResult) -> f64| -> Vec<Series> {
        phases
            .iter()
            .map(|phase| Series {
                name: (*phase).to_string(),
                points: results
                    .iter()
                    .filter(|r| r.phase == *phase)
                    .map(|r| (r.threads as f64, value(r)))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    let mut panels = vec![Panel {
        title: format!("{label}: sequential"),
        x_label: "threads".into(),
        y_label: "MB/s".into(),
        series: series(&["write", "read"], |r| r.mb_per_second),
    }];
    let random = series(&["randwrite", "randread"], |r| r.iops);
    if !random.is_empty() {
        panels.push(Panel {
            title: format!("{label}: random 4 KiB"),
            x_label: "threads".into(),
            y_label: "IOPS".into(),
            series: random,
        });
    }
    weft_bench::svg::render(&panels)
}

fn run_io(args: IoArgs, net: bool) -> Result<()> {
    if args.threads.is_empty() || args.threads.contains(&0) {
        bail!("--threads needs counts of at least 1, e.g. 1,2,4");
    }
    if net && args.mgmt.is_none() {
        bail!("weft bench net runs through the native client: give --mgmt HOST:PORT");
    }
    let config = IoBenchConfig {
        bytes_per_thread: crate::admin::parse_size(&args.size)?,
        block_bytes: usize::try_from(crate::admin::parse_size(&args.block_size)?)?,
        shared_file: args.shared_file,
        random_ops_per_thread: args.random_ops,
        queue_depth: args.queue_depth,
        verify: !net,
    };
    let run_name = |threads: usize| format!("weft-bench-io-{}-{threads}", std::process::id());
    let mut all = Vec::new();
    let label = match (&args.path, &args.mgmt) {
        (Some(path), None) => {
            let target = PosixFiles {
                dir: path.clone(),
                direct: args.direct,
            };
            for threads in &args.threads {
                all.extend(io::run(&target, &config, *threads, &run_name(*threads))?);
            }
            args.label
                .clone()
                .unwrap_or_else(|| path.display().to_string())
        }
        (None, Some(mgmt)) => {
            let runtime = crate::runtime()?;
            let cluster = crate::admin::Cluster::at(mgmt.clone(), None);
            let client = if net {
                let config = cluster.client_config();
                let transport = Arc::new(weft_bench::io::NetBench);
                runtime
                    .block_on(weft_client::Client::connect_over(&config, transport))
                    .map_err(|error| crate::admin::not_reached(&error, mgmt))?
            } else {
                runtime.block_on(cluster.client())?
            };
            let target = NativeFiles {
                client,
                runtime: runtime.handle().clone(),
                dir: weft_proto::InodeId::ROOT,
            };
            for threads in &args.threads {
                all.extend(io::run(&target, &config, *threads, &run_name(*threads))?);
            }
            let kind = if net { "net" } else { "native" };
            args.label
                .clone()
                .unwrap_or_else(|| format!("{kind}@{mgmt}"))
        }
        _ => {
            bail!("give --path DIR (a mount or any directory) or --mgmt HOST:PORT (native client)")
        }
    };
    io::print_table(&label, &all);
    if let Some(path) = &args.json {
        append_json(
            path,
            all.iter().map(|result| {
                serde_json::json!({ "target": label, "config": config, "direct": args.direct, "result": result })
            }),
        )?;
    }
    if let Some(path) = &args.svg {
        std::fs::write(path, io_plot(&label, &all))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[derive(Args)]
pub struct MetaArgs {
    /// Run in this directory (a Weft mount, or any file system to compare with).
    #[arg(long, conflicts_with = "mgmt")]
    path: Option<PathBuf>,
    /// Run through the native client library against this management address.
    #[arg(long)]
    mgmt: Option<String>,
    /// Files per thread.
    #[arg(long, default_value_t = 1000)]
    files: usize,
    /// Directories per thread.
    #[arg(long, default_value_t = 100)]
    dirs: usize,
    /// Bytes written into each file.
    #[arg(long, default_value_t = 4096)]
    file_bytes: usize,
    /// Thread counts to sweep, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    threads: Vec<usize>,
    /// All threads in one shared directory.
    #[arg(long)]
    shared: bool,
    /// Name of this target in the table and the JSON.
    #[arg(long)]
    label: Option<String>,
    /// Append results as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn record(
    label: &str,
    shared: bool,
    results: &[PhaseResult],
    json: Option<&PathBuf>,
) -> Result<()> {
    meta::print_table(label, results);
    if let Some(path) = json {
        append_json(
            path,
            results.iter().map(|result| {
                serde_json::json!({ "target": label, "shared_dir": shared, "result": result })
            }),
        )?;
    }
    Ok(())
}

/// Asks every storage server (holding one of `only`, if given) to do `op`; returns each
/// server's alias and answer.
async fn storage_bench_all(
    cluster: &crate::admin::Cluster,
    op: &weft_proto::messages::StorageBenchOp,
    only: &[weft_proto::TargetId],
) -> Result<Vec<(String, weft_proto::messages::StorageBenchStatus)>> {
    use weft_proto::messages::NodeKind;
    let (_, map) = crate::admin::connect(cluster).await?;
    let mut answers = Vec::new();
    for node in map.nodes.iter().filter(|n| n.kind == NodeKind::Storage) {
        let holds =
            |target: &weft_proto::TargetId| map.target(*target).is_some_and(|t| t.node == node.id);
        if !only.is_empty() && !only.iter().any(holds) {
            continue;
        }
        let Some(address) = node.address() else {
            continue;
        };
        let storage = weft_net::StorageClient::new(address.clone(), cluster.options()?);
        let status = storage
            .storage_bench(op.clone())
            .await
            .with_context(|| format!("storage node {} ({address})", node.alias))?;
        answers.push((node.alias.clone(), status));
    }
    if answers.is_empty() {
        bail!("no storage server holds the targets named");
    }
    Ok(answers)
}

fn print_storage_bench(answers: &[(String, weft_proto::messages::StorageBenchStatus)]) {
    println!(
        "{:<16} {:>7} {:>6} {:>14} {:>9} {:>10}  state",
        "node", "target", "kind", "bytes", "seconds", "MB/s"
    );
    let (mut bytes, mut seconds) = (0u64, 0f64);
    for (alias, status) in answers {
        for t in &status.targets {
            let elapsed = t.elapsed_micros as f64 / 1e6;
            let state = match (&t.error, t.finished) {
                (Some(error), _) => format!("error: {error}"),
                (None, true) => "done".to_string(),
                (None, false) => "running".to_string(),
            };
            println!(
                "{alias:<16} {:>7} {:>6} {:>14} {:>9.2} {:>10.1}  {state}",
                t.target.0,
                if status.read { "read" } else { "write" },
                t.bytes,
                elapsed,
                t.bytes as f64 / elapsed.max(1e-9) / 1e6
            );
            bytes += t.bytes;
            seconds = seconds.max(elapsed);
        }
    }
    println!(
        "{:<16} {:>7} {:>6} {bytes:>14} {seconds:>9.2} {:>10.1}",
        "all",
        "",
        "",
        bytes as f64 / seconds.max(1e-9) / 1e6
    );
}

fn run_storage_bench(action: StorageBenchAction) -> Result<()> {
    use weft_proto::messages::StorageBenchOp;
    let (op, status_args, only) = match action {
        StorageBenchAction::Start(args) => {
            let targets: Vec<weft_proto::TargetId> = args
                .targets
                .iter()
                .map(|t| weft_proto::TargetId(*t))
                .collect();
            let op = StorageBenchOp::Start {
                targets: targets.clone(),
                read: args.read,
                block_bytes: u32::try_from(crate::admin::parse_size(&args.block_size)?)
                    .context("--block-size is too large")?,
                bytes_per_thread: crate::admin::parse_size(&args.size)?,
                threads: args.threads,
            };
            (op, args.status, targets)
        }
        StorageBenchAction::Status(args) => (StorageBenchOp::Status, args, Vec::new()),
        StorageBenchAction::Stop(args) => (StorageBenchOp::Stop, args, Vec::new()),
        StorageBenchAction::Cleanup(args) => (StorageBenchOp::Cleanup, args, Vec::new()),
    };
    let cluster = crate::admin::locate(&status_args.locator, None)?;
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let mut answers = storage_bench_all(&cluster, &op, &only).await?;
        while status_args.wait && answers.iter().any(|(_, s)| s.running) {
            eprintln!(
                "  {} MB so far",
                answers
                    .iter()
                    .flat_map(|(_, s)| s.targets.iter().map(|t| t.bytes))
                    .sum::<u64>()
                    / 1_000_000
            );
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            answers = storage_bench_all(&cluster, &StorageBenchOp::Status, &only).await?;
        }
        print_storage_bench(&answers);
        if let Some(path) = &status_args.json {
            append_json(
                path,
                answers.iter().flat_map(|(alias, status)| {
                    status.targets.iter().map(move |t| {
                        serde_json::json!({ "node": alias, "read": status.read, "result": t })
                    })
                }),
            )?;
        }
        if let Some(path) = &status_args.svg {
            let mut points: Vec<(f64, f64)> = answers
                .iter()
                .flat_map(|(_, status)| status.targets.iter())
                .map(|t| {
                    let seconds = t.elapsed_micros as f64 / 1e6;
                    (
                        f64::from(t.target.0),
                        t.bytes as f64 / seconds.max(1e-9) / 1e6,
                    )
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let kind = if answers.iter().any(|(_, s)| s.read) {
                "read"
            } else {
                "write"
            };
            let panel = Panel {
                title: format!("StorageBench {kind}, per target"),
                x_label: "target".into(),
                y_label: "MB/s".into(),
                series: vec![Series {
                    name: kind.into(),
                    points,
                }],
            };
            std::fs::write(path, weft_bench::svg::render(&[panel]))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let failed: Vec<String> = answers
            .iter()
            .flat_map(|(_, s)| s.targets.iter())
            .filter_map(|t| {
                t.error
                    .as_ref()
                    .map(|e| format!("target {}: {e}", t.target))
            })
            .collect();
        if !failed.is_empty() {
            bail!("StorageBench failed on {}", failed.join("; "));
        }
        Ok(())
    })
}

pub fn run(command: BenchCommand) -> Result<()> {
    let args = match command {
        BenchCommand::Storage { action } => return run_storage_bench(action),
        BenchCommand::Sweep(args) => return run_sweep(args),
        BenchCommand::Io500(args) => return run_io500(args),
        BenchCommand::Mgmt(args) => return run_mgmt_sim(args),
        BenchCommand::Meta(args) => args,
        BenchCommand::Io(args) => return run_io(args, false),
        BenchCommand::Net(args) => return run_io(args, true),
    };
    if args.threads.is_empty() || args.threads.contains(&0) {
        bail!("--threads needs counts of at least 1, e.g. 1,2,4");
    }
    let config = MetaBenchConfig {
        files_per_thread: args.files,
        dirs_per_thread: args.dirs,
        file_bytes: args.file_bytes,
        shared_dir: args.shared,
    };
    let run_name = |threads: usize| format!("weft-bench-meta-{}-{threads}", std::process::id());
    let mut all = Vec::new();
    match (&args.path, &args.mgmt) {
        (Some(path), None) => {
            let target = PosixTarget { base: path.clone() };
            let label = args
                .label
                .clone()
                .unwrap_or_else(|| path.display().to_string());
            for threads in &args.threads {
                all.extend(meta::run(&target, &config, *threads, &run_name(*threads))?);
            }
            record(&label, args.shared, &all, args.json.as_ref())
        }
        (None, Some(mgmt)) => {
            let runtime = crate::runtime()?;
            let client =
                runtime.block_on(crate::admin::Cluster::at(mgmt.clone(), None).client())?;
            let target = NativeTarget {
                client,
                runtime: runtime.handle().clone(),
                base: weft_proto::InodeId::ROOT,
            };
            let label = args
                .label
                .clone()
                .unwrap_or_else(|| format!("native@{mgmt}"));
            for threads in &args.threads {
                all.extend(meta::run(&target, &config, *threads, &run_name(*threads))?);
            }
            record(&label, args.shared, &all, args.json.as_ref())
        }
        _ => {
            bail!("give --path DIR (a mount or any directory) or --mgmt HOST:PORT (native client)")
        }
    }
}
