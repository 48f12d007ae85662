//! `weft`: the one binary. Argument parsing and output only; every role lives in its library.
//!
//! - `weft up`: every role in one process and a FUSE mount (the quick start).
//! - `weft serve mgmt|meta|storage`: one service per process, as in production.
//! - `weft mount`: the FUSE client.
//! - `weft entry|node|target|df|fsck|client`: administration.
//! - `weft bench`: benchmarks.
//! - `weft keygen`: a cluster key file, or a client's; `weft certgen`: a CA and certificate for
//!   TLS.

#[global_allocator]
static ALLOCATOR: allocator::Split = allocator::Split;

mod admin;
mod allocator;
mod bench;
mod clients;
mod migrate;
mod mirror;
mod pool;
mod quota;
mod serve;
mod signals;
mod stats;
mod up;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(name = "weft", version, about = "Weft, a parallel file system")]
struct Cli {
    /// Log filter, e.g. `info`, `debug`, `weft_meta=debug` (also WEFT_LOG).
    /// The default is `info`, or the `log` key of a service's config file.
    #[arg(long, global = true, env = "WEFT_LOG")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local cluster in this process and mount it (foreground; Ctrl-C unmounts and stops).
    Up(up::UpArgs),
    /// Run one service.
    Serve(serve::ServeArgs),
    /// Mount a Weft file system with FUSE (foreground; Ctrl-C unmounts).
    Mount(serve::MountArgs),
    /// Show or change entries (files and directories).
    Entry {
        #[command(subcommand)]
        command: admin::EntryCommand,
    },
    /// Create a directory spread over several metadata servers (`--spread K`).
    Mkdir(admin::MkdirArgs),
    /// List nodes.
    Node {
        #[command(subcommand)]
        command: admin::NodeCommand,
    },
    /// List storage targets.
    Target {
        #[command(subcommand)]
        command: admin::TargetCommand,
    },
    /// Storage pools: which targets new files of a directory land on, and their capacity
    /// limits.
    Pool {
        #[command(subcommand)]
        command: pool::PoolCommand,
    },
    /// Quotas: what users, groups and projects (directory trees) use, per storage pool.
    Quota {
        #[command(subcommand)]
        command: quota::QuotaCommand,
    },
    /// Space and inodes per storage target and metadata target.
    Df(admin::ClusterArgs),
    /// Mirror groups of storage targets and metadata nodes.
    Mirror {
        #[command(subcommand)]
        command: mirror::MirrorCommand,
    },
    /// Management's view of the cluster: states, space, throughput, events.
    Cluster {
        #[command(subcommand)]
        command: stats::ClusterCommand,
    },
    /// Live load per server or per client session.
    Stats {
        #[command(subcommand)]
        command: stats::StatsCommand,
    },
    /// Check the namespace and the storage objects; --repair fixes what is safe to fix.
    Fsck(admin::FsckArgs),
    /// Make a cluster key file, or with --client NAME the key of a client identity, derived
    /// from the cluster key (mode 0600; an existing file is never overwritten).
    Keygen {
        /// The new key file.
        file: PathBuf,
        /// Make the key of the client NAME: it proves that name, and may only do what
        /// clients do, as its rule allows (`weft client set`).
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// The cluster key file, for --client; found as the admin commands find it when not
        /// given.
        #[arg(long, requires = "client")]
        key_file: Option<PathBuf>,
    },
    /// Restrictions of client identities: read-only, root squash, revoked.
    Client {
        #[command(subcommand)]
        command: clients::ClientCommand,
    },
    /// Make a cluster CA and a member certificate for TLS in DIR (ca.pem, ca.key, cert.pem,
    /// cert.key); existing files are never overwritten.
    Certgen {
        /// The directory to write them in (created if missing).
        dir: PathBuf,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
}

/// Where the admin commands find management, and the key that lets them in.
#[derive(clap::Args, Clone, Debug)]
pub struct MgmtLocator {
    /// Management address (several servers separated by `;`); by default that of the Weft
    /// mount holding the path (or the cwd).
    #[arg(long)]
    mgmt: Option<String>,
    /// The cluster key file; by default WEFT_KEY_FILE, then the key of the local `weft up`
    /// cluster, then /etc/weft/cluster.key.
    #[arg(long)]
    key_file: Option<PathBuf>,
}

/// Large buffers (I/O payloads of up to a few MiB, read-ahead windows) stay in the allocator's
/// heap once freed, instead of going back to the kernel and faulting in afresh at the next
/// request: glibc's default maps every allocation above 128 KiB (a threshold it raises only as
/// such blocks are freed) and returns freed memory above 128 KiB at the heap's top. A `perf`
/// profile of `weft bench net` reads with read-ahead had 15 % of its CPU in page faults and
/// zeroing pages; with these settings its reads ran 1.7-1.9x faster.
fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ALLOCATOR_ARENAS_MAX);
    }
}

/// Allocations at least this large get their own mapping (glibc's dynamic default starts at
/// 128 KiB).
const ALLOCATOR_MMAP_THRESHOLD: libc::c_int = 16 << 20;

/// Allocator arenas at most. glibc gives each thread that meets contention an arena of its
/// own (up to eight per core), and each keeps its freed memory: under 64 threads of mixed I/O
/// a `weft up` grew to 2.2 GB that way, and stayed there; with two arenas the same load
/// plateaued near 520 MiB.
const ALLOCATOR_ARENAS_MAX: libc::c_int = 2;

/// Free memory at the heap's top beyond this goes back to the kernel (all of it when the
/// process is idle: `weft_net::memory`).
const ALLOCATOR_TRIM_THRESHOLD: libc::c_int = 256 << 20;

fn main() {
    tune_allocator();
    weft_net::memory::also_on_idle(allocator::collect);
    let cli = Cli::parse();
    let filter = match log_filter(cli.log.as_deref().unwrap_or("info")) {
        Ok(filter) => filter,
        Err(error) => {
            eprintln!(
                "weft: --log {:?} is not a log filter (e.g. info, debug, weft_meta=debug): {error}",
                cli.log.unwrap_or_default()
            );
            std::process::exit(2);
        }
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours for a terminal only: log files stay plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    let _ = LOG_FILTER.set((handle, cli.log.is_some()));
    if !matches!(
        cli.command,
        Command::Up(_) | Command::Serve(_) | Command::Mount(_)
    ) {
        // A report piped into `head` ends quietly when the reader goes, as Unix tools do.
        // (Sockets are written with MSG_NOSIGNAL, so this never concerns the network.)
        // SAFETY: setting a signal's disposition to its default has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if let Err(error) = run(cli.command) {
        eprintln!("weft: {error:#}");
        std::process::exit(1);
    }
}

/// The log filter `spec` names. The replication library of management logs every vote and
/// election at `info`: only its warnings are kept, unless `spec` names it
/// (`info,openraft=info`).
fn log_filter(
    spec: &str,
) -> Result<tracing_subscriber::EnvFilter, tracing_subscriber::filter::ParseError> {
    if spec.contains("openraft") {
        tracing_subscriber::EnvFilter::try_new(spec)
    } else {
        tracing_subscriber::EnvFilter::try_new(format!("{spec},openraft=warn"))
    }
}

/// The log filter's handle, and whether `--log` or `WEFT_LOG` set it.
static LOG_FILTER: std::sync::OnceLock<(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
    bool,
)> = std::sync::OnceLock::new();

/// Applies the `log` key of a config file, unless `--log` or `WEFT_LOG` chose a filter.
pub fn configure_log(filter: Option<&str>) -> Result<()> {
    let (Some(filter), Some((handle, from_command_line))) = (filter, LOG_FILTER.get()) else {
        return Ok(());
    };
    if *from_command_line {
        return Ok(());
    }
    let parsed = log_filter(filter).map_err(|error| {
        anyhow::anyhow!(
            "invalid configuration: log = {filter:?} is not a log filter (e.g. info, debug, weft_meta=debug): {error}"
        )
    })?;
    handle.reload(parsed)?;
    Ok(())
}

/// Threads for blocking work (storage I/O, metadata store reads): more requests than this
/// wait for one, instead of each bringing a thread (and its allocator arena) of its own.
const BLOCKING_THREADS_MAX: usize = 64;

fn runtime() -> Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("weft")
        .max_blocking_threads(BLOCKING_THREADS_MAX)
        .build()?;
    runtime.spawn(weft_net::memory::give_back_when_idle());
    Ok(runtime)
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Up(args) => up::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Mount(args) => serve::mount(args),
        Command::Entry { command } => admin::entry(command),
        Command::Mkdir(args) => admin::mkdir(args),
        Command::Node { command } => admin::node(command),
        Command::Target { command } => admin::target(command),
        Command::Pool { command } => pool::pool(command),
        Command::Quota { command } => quota::quota(command),
        Command::Df(args) => admin::df(args),
        Command::Cluster { command } => stats::cluster(command),
        Command::Mirror { command } => mirror::mirror(command),
        Command::Stats { command } => stats::stats(command),
        Command::Fsck(args) => admin::fsck(args),
        Command::Bench { command } => bench::run(command),
        Command::Certgen { dir } => {
            let files = weft_net::tls::write_new_ca(&dir).map_err(anyhow::Error::msg)?;
            println!(
                "wrote a CA ({}) and a member certificate ({}, key {}): give them to every \
                 service and client (tls_cert_file, tls_key_file, tls_ca_file), and keep \
                 ca.key to sign more",
                files.ca.display(),
                files.cert.display(),
                files.key.display()
            );
            Ok(())
        }
        Command::Client { command } => clients::client(command),
        Command::Keygen {
            file,
            client: Some(name),
            key_file,
        } => {
            let cluster =
                weft_net::auth::find_key_file(key_file.as_deref(), "").ok_or_else(|| {
                    anyhow::anyhow!(
                        "no cluster key found: give its file with --key-file FILE (or \
                         WEFT_KEY_FILE)"
                    )
                })?;
            let auth = weft_net::Auth::from_key_file(&cluster).map_err(anyhow::Error::msg)?;
            weft_net::auth::write_client_key(&auth, &name, &file).map_err(anyhow::Error::msg)?;
            println!(
                "wrote the key of client {name} to {}: give it to that client's mount \
                 (--key-file, or auth_key_file in its config); `weft client set {name}` \
                 restricts it",
                file.display()
            );
            Ok(())
        }
        Command::Keygen { file, .. } => {
            weft_net::auth::write_new_key(&file).map_err(anyhow::Error::msg)?;
            println!(
                "wrote a new cluster key to {}: give it to every service (auth_key_file) and \
                 client (--key-file, WEFT_KEY_FILE or /etc/weft/cluster.key)",
                file.display()
            );
            Ok(())
        }
    }
}

/// Paths are given relative to the working directory.
pub fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
