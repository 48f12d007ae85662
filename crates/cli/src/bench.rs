//! `weft bench`: runs the benchmarks of `weft-bench` and prints and saves their results.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use weft_bench::meta::{self, MetaBenchConfig, NativeTarget, PhaseResult, PosixTarget};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// mdtest-like metadata benchmark: mkdir, create, stat, read, unlink, rmdir.
    Meta(MetaArgs),
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
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        for result in results {
            let line =
                serde_json::json!({ "target": label, "shared_dir": shared, "result": result });
            writeln!(file, "{line}")?;
        }
    }
    Ok(())
}

pub fn run(command: BenchCommand) -> Result<()> {
    let BenchCommand::Meta(args) = command;
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
            let client = runtime
                .block_on(weft_client::Client::connect(
                    &weft_client::ClientConfig::new(mgmt.clone()),
                ))
                .map_err(|error| anyhow::anyhow!("{error}: is management running at {mgmt}?"))?;
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
