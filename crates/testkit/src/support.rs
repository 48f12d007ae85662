//! What the tests need beside a cluster: waiting for a condition, an HTTP GET of a service's
//! page, a free port, whether a path is mounted, and starting a process apart from the
//! files the tests hold open.

use super::*;
use std::sync::{mpsc, Mutex, OnceLock};

/// Polls `check` until it returns true; fails with `what` after [`WAIT_DEADLINE`].
///
/// # Errors
/// When the deadline passes.
pub fn wait_until(what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    while !check() {
        if started.elapsed() > WAIT_DEADLINE {
            bail!("timed out after {WAIT_DEADLINE:?} waiting for {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    Ok(())
}

/// Sends `GET path` over HTTP/1.1 to `address` and returns the status code and the body.
///
/// # Errors
/// When the server cannot be reached or the answer is not HTTP.
pub fn http_get(address: &str, path: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)
        .with_context(|| format!("cannot connect to {address}"))?;
    stream.set_read_timeout(Some(WAIT_DEADLINE))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP answer from {address}{path}: {answer:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("no status in {head:?}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// The body of a chunked HTTP answer.
fn dechunk(mut text: &str) -> Result<String> {
    let mut body = String::new();
    loop {
        let (size, rest) = text
            .split_once("\r\n")
            .ok_or_else(|| anyhow!("truncated chunked body"))?;
        let size = usize::from_str_radix(size.trim(), 16)?;
        if size == 0 {
            return Ok(body);
        }
        body.push_str(rest.get(..size).ok_or_else(|| anyhow!("short chunk"))?);
        text = rest.get(size + 2..).unwrap_or("");
    }
}

/// A port that was free a moment ago on 127.0.0.1.
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    // A port from the kernel's ephemeral range can be taken, between this call and the
    // service's bind, as the local end of any test's outgoing connection; so the port is
    // drawn at random from below that range and tried.
    let ephemeral_low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let floor = 10_000.min(ephemeral_low / 2);
    let span = u64::from(ephemeral_low - floor);
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0u32..1_000 {
        let mut hasher = random.build_hasher();
        hasher.write_u32(attempt);
        let port = floor + (hasher.finish() % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port between {floor} and {ephemeral_low}")
}

/// Whether `path` is a mount point in /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let text = fs::read_to_string("/proc/mounts").unwrap_or_default();
    let wanted = path.display().to_string().replace(' ', "\\040");
    text.lines()
        .any(|line| line.split(' ').nth(1) == Some(wanted.as_str()))
}

pub(crate) fn lazy_unmount(path: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(path)
        .stderr(Stdio::null())
        .status();
}

/// Starts `command` with its output appended to the file at `log`, from a thread whose file
/// table is its own: no file a test holds open on a mount is copied into the child.
///
/// The kernel sends a FUSE FLUSH for every close of a descriptor, and an exec closes the
/// child's copies of the parent's close-on-exec descriptors. A service started while a test
/// thread holds a file of the mount open would wait, in its exec, for the mount to flush
/// that file, and the flush for the very metadata server being started: a deadlock that
/// only the client's timeout ends. The spawning thread leaves the process's table before any
/// mount exists (its first use starts the first service), so the files tests open later
/// are not in it, and closes its copies of what was open then.
///
/// # Errors
/// When the log cannot be opened or the program cannot start.
pub(crate) fn spawn_apart(mut command: Command, log: PathBuf) -> std::io::Result<Child> {
    in_spawner(move || {
        let file = File::options().create(true).append(true).open(&log)?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
    })
}

/// Runs `command` to its end and returns what it printed, as [`Command::output`] does, but
/// started as [`spawn_apart`] starts services, so that it never waits in its exec for a mount
/// to flush a file a test holds open. Its outputs go through files the spawning thread
/// makes, read back here.
///
/// # Errors
/// When the program cannot start or its outputs cannot be read.
pub fn output_apart(mut command: Command) -> std::io::Result<Output> {
    let (mut child, stdout, stderr) = in_spawner(move || {
        // Every descriptor lives and dies in the spawning thread; only paths come back.
        let (stdout, stderr) = (
            tempfile::NamedTempFile::new()?,
            tempfile::NamedTempFile::new()?,
        );
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout.reopen()?)
            .stderr(stderr.reopen()?)
            .spawn()?;
        Ok((child, stdout.into_temp_path(), stderr.into_temp_path()))
    })?;
    let status = child.wait()?;
    Ok(Output {
        status,
        stdout: fs::read(&stdout)?,
        stderr: fs::read(&stderr)?,
    })
}

/// Runs `job` on the spawning thread (see [`spawn_apart`]). What it returns must hold no
/// descriptor: a number of that thread's table means another file, or none, elsewhere.
fn in_spawner<T: Send + 'static>(
    job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                // SAFETY: unshare(2) with CLONE_FILES gives only this thread a copy of the
                // file table, and close_range(2) closes this copy's descriptors past the
                // standard three: neither changes memory, nor a descriptor of another thread.
                // Closed here, the copies of pipes another test thread holds open for a
                // command's output (no mount exists yet) do not keep that command's output
                // from ending.
                unsafe {
                    if libc::unshare(libc::CLONE_FILES) == 0 {
                        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                    } else {
                        // Processes then start as from any thread, and may wait on a flush.
                        eprintln!(
                            "testkit: unshare(CLONE_FILES) failed ({}): processes share the \
                             test's open files",
                            std::io::Error::last_os_error()
                        );
                    }
                }
                for job in queue {
                    job();
                }
            })
            .expect("spawner thread");
        Mutex::new(jobs)
    });
    let (answer, answered) = mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = answer.send(job());
    });
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send(job)
        .expect("the spawner runs as long as the process");
    answered.recv().expect("the spawner answers every job")
}
