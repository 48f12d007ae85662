//! A cluster of hosts: every server and every client host in a network namespace of its own,
//! on two networks (rails), every link rate-limited as between real hosts. Clients keep
//! writing through a cut rail, and what they wrote reads back whole from the other host.

mod common;

use common::{cluster, weft};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use weft_testkit::{wait_until, ClusterSpec, LocalCluster};

/// Bytes one write of the writers carries.
const RECORD_BYTES: usize = 1 << 20;

/// A file written record after record from one client host until stopped.
struct Writer {
    written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl Writer {
    fn start(path: PathBuf, seed: u64) -> Writer {
        let written = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (written, stop) = (Arc::clone(&written), Arc::clone(&stop));
            move || {
                common::private_file_table();
                let mut file = std::fs::File::create(&path)?;
                let mut records = 0;
                while !stop.load(Ordering::Acquire) {
                    file.write_all(&common::pattern(seed + records, RECORD_BYTES))?;
                    records += 1;
                    written.store(records * RECORD_BYTES as u64, Ordering::Release);
                }
                file.sync_all()?;
                Ok(records)
            }
        });
        Writer {
            written,
            stop,
            thread,
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Waits until `more` bytes were written after now.
    fn advance(&self, more: u64, what: &str) {
        let from = self.written();
        wait_until(what, || {
            self.thread.is_finished() || self.written() >= from + more
        })
        .expect("the writer goes on");
        assert!(!self.thread.is_finished(), "the writer stopped: {what}");
    }

    /// Stops the writer; answers how many records it wrote, or the error it met.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .expect("writer thread")
            .expect("every write and the fsync succeed: a cut rail is a pause, not an error")
    }
}

/// Checks the `records` records of `seed` at `path`.
fn verify(path: &Path, seed: u64, records: u64) {
    let data = std::fs::read(path).expect("read back");
    assert_eq!(
        data.len() as u64,
        records * RECORD_BYTES as u64,
        "{} holds every record",
        path.display()
    );
    for (record, chunk) in data.chunks(RECORD_BYTES).enumerate() {
        assert!(
            chunk == common::pattern(seed + record as u64, RECORD_BYTES).as_slice(),
            "record {record} of {} reads back as written",
            path.display()
        );
    }
}

fn bytes_on(cluster: &LocalCluster, host: &str) -> [u64; 2] {
    [0, 1].map(|rail| cluster.rail_bytes(host, rail).expect("link counters"))
}

// Goal: a cluster of hosts on two rate-limited rails serves two client hosts; every server
// is reached over both rails (their traffic spread over both); a storage host's rail and then
// a client host's rail cut while both clients write costs a pause, not an error, and the
// writes go on; what each wrote reads back whole from the other host.
#[test]
fn clients_write_through_a_cut_rail() {
    let mut cluster = cluster(ClusterSpec {
        meta: 1,
        storage: 3,
        targets_per_storage: 1,
        netns: true,
        rails: 2,
        link_rate_mbit: Some(400),
        // A cut rail holds a call for up to a heartbeat's deadline: the production defaults
        // of these timeouts are longer still.
        mgmt_settings: vec![
            "node_offline_timeout_ms=10000".into(),
            "session_timeout_ms=10000".into(),
        ],
        ..ClusterSpec::default()
    });
    for name in ["meta-1", "storage-1", "storage-2", "storage-3"] {
        let address = cluster.address_of(name).expect("address");
        assert_eq!(
            address.split(',').count(),
            2,
            "{name} is registered with one address per rail: {address}"
        );
    }
    let first = cluster.mount_on(1, &[]).expect("mount on client host 1");
    let second = cluster.mount_on(2, &[]).expect("mount on client host 2");
    let dir = first.join("wide");
    std::fs::create_dir(&dir).expect("mkdir");
    let (ok, _, err) = weft(
        &cluster,
        &[
            "entry",
            "set",
            "--chunk-size",
            "256K",
            "--num-targets",
            "3",
            &dir.display().to_string(),
        ],
    );
    assert!(ok, "{err}");
    let writers = [
        Writer::start(first.join("wide/one"), 1 << 32),
        Writer::start(second.join("wide/two"), 2 << 32),
    ];
    for writer in &writers {
        writer.advance(8 * RECORD_BYTES as u64, "the first records");
    }
    let before = bytes_on(&cluster, "storage-1");

    cluster
        .set_rail("storage-1", 0, false)
        .expect("cut storage-1's first rail");
    for writer in &writers {
        writer.advance(
            16 * RECORD_BYTES as u64,
            "writes while storage-1's first rail is cut",
        );
    }
    cluster
        .set_rail("storage-1", 0, true)
        .expect("restore the rail");

    cluster
        .set_rail("client-1", 1, false)
        .expect("cut client host 1's second rail");
    for writer in &writers {
        writer.advance(
            16 * RECORD_BYTES as u64,
            "writes while client host 1's second rail is cut",
        );
    }
    cluster
        .set_rail("client-1", 1, true)
        .expect("restore the rail");
    for writer in &writers {
        writer.advance(8 * RECORD_BYTES as u64, "writes after the rails are back");
    }
    let [one, two] = writers.map(Writer::stop);
    let after = bytes_on(&cluster, "storage-1");
    for rail in 0..2 {
        assert!(
            after[rail] - before[rail] > 4 * RECORD_BYTES as u64,
            "storage-1's rail {rail} carried part of the writes: {before:?} → {after:?}"
        );
    }
    // Each host reads what the other wrote: nothing of it is in its cache.
    verify(&second.join("wide/one"), 1 << 32, one);
    verify(&first.join("wide/two"), 2 << 32, two);
    common::fsck_clean(&cluster);
}
