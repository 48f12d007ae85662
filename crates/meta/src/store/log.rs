//! The store's change log: each batch's changed rows, appended as one record to a file beside
//! the store and synced there, until a checkpoint writes them into the store's tables and the
//! log starts again.
//!
//! ```text
//! header, the first 4 KiB:   magic "WEFTROWS" | version u32 | epoch u64 | salt u64
//!                              | crc32c u32
//! record, at a multiple of 8: magic u32 | epoch u64 | salt u64 | seq u64 | payload u32
//!                              | payload | crc32c u32 of all before it
//! payload: rows, each         table u16 + bytes | key u32 + bytes | 0 (removed)
//!                              or 1 | value u32 + bytes
//! ```
//!
//! A record belongs to the log's current epoch and salt and follows the one before it (`seq`
//! one higher, from 0); the first that does not, or whose checksum fails, ends the log. A
//! restart moves the epoch on and draws a new random salt, so that records of an earlier epoch
//! beyond the end are never taken for new ones, and no bytes a client put in a row (a name, an
//! attribute's value) can pass for a record. The file is written whole when it is made, so an
//! append allocates nothing and its sync writes no metadata of the file. A record appended
//! after the last one rewrites the tail of the block they share with the same bytes, which a
//! torn write leaves as they were.

use std::fs::File;
use std::io::{Error, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weft_proto::checksum::crc32c;

/// Bytes of the log file, written once when it is made.
pub(crate) const LOG_BYTES: u64 = 16 << 20;
/// Where records start.
const FIRST_RECORD: u64 = 4096;
/// Records start at multiples of this.
const ALIGN: u64 = 8;
const HEADER_MAGIC: &[u8; 8] = b"WEFTROWS";
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"ROWS");
const VERSION: u32 = 1;
/// Bytes of a record before its payload.
const RECORD_HEAD: usize = 4 + 8 + 8 + 8 + 4;
/// Bytes of the header.
const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 4;

/// The header of a file of records in epochs, written whole when it is made (this log, and
/// the store's page journal, `replica/journal.rs`): magic, version, epoch, salt, CRC32C.
pub(crate) struct EpochFile {
    pub magic: &'static [u8; 8],
    pub version: u32,
    /// Bytes of the file.
    pub bytes: u64,
}

/// What such a file's header says.
pub(crate) enum Header {
    /// The current epoch and its salt.
    Good { epoch: u64, salt: u64 },
    /// Torn, or not a header.
    Torn,
    /// A file of another version.
    Version(u32),
}

impl EpochFile {
    /// Makes the file at `path`, every block written so that writing it allocates nothing,
    /// with the header of `epoch` and `salt`: under a staging name, renamed into place, the
    /// directory synced.
    pub fn make(&self, path: &Path, epoch: (u64, u64)) -> std::io::Result<File> {
        let mut staging = path.as_os_str().to_owned();
        staging.push(".new");
        let staging = PathBuf::from(staging);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&staging)?;
        let zeros = vec![0; 1 << 20];
        let mut at = 0;
        while at < self.bytes {
            file.write_all_at(&zeros, at)?;
            at += zeros.len() as u64;
        }
        self.write_header(&file, epoch)?;
        std::fs::rename(&staging, path)?;
        if let Some(directory) = path.parent() {
            weft_service::durable::sync_directory(directory)?;
        }
        Ok(file)
    }

    /// Writes and syncs the header of `epoch` and `salt`.
    pub fn write_header(&self, file: &File, (epoch, salt): (u64, u64)) -> std::io::Result<()> {
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(self.magic);
        header.extend_from_slice(&self.version.to_le_bytes());
        header.extend_from_slice(&epoch.to_le_bytes());
        header.extend_from_slice(&salt.to_le_bytes());
        let crc = crc32c(&header);
        header.extend_from_slice(&crc.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.sync_data()
    }

    /// What the header of `file` says.
    pub fn read_header(&self, file: &File) -> std::io::Result<Header> {
        let mut header = [0u8; HEADER_BYTES];
        if file.read_exact_at(&mut header, 0).is_err() {
            return Ok(Header::Torn);
        }
        let (body, crc) = header.split_at(HEADER_BYTES - 4);
        let version = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        if &body[..8] == self.magic && version != self.version {
            return Ok(Header::Version(version));
        }
        if &body[..8] != self.magic
            || u32::from_le_bytes(crc.try_into().expect("4 bytes")) != crc32c(body)
        {
            return Ok(Header::Torn);
        }
        Ok(Header::Good {
            epoch: u64::from_le_bytes(body[12..20].try_into().expect("8 bytes")),
            salt: u64::from_le_bytes(body[20..28].try_into().expect("8 bytes")),
        })
    }
}

/// The change log's file.
const FILE: EpochFile = EpochFile {
    magic: HEADER_MAGIC,
    version: VERSION,
    bytes: LOG_BYTES,
};

/// One changed row of a record: its table's name, its key, and its value (`None`: removed).
pub(crate) type LoggedRow = (String, Vec<u8>, Option<Vec<u8>>);

/// What an opened log held: its epoch, and each record's number and rows, in order.
#[derive(Debug, Default)]
pub(crate) struct Logged {
    pub epoch: u64,
    pub records: Vec<(u64, Vec<LoggedRow>)>,
}

/// Appends `row` to a record's payload.
pub(crate) fn encode_row(payload: &mut Vec<u8>, table: &str, key: &[u8], value: Option<&[u8]>) {
    payload.extend_from_slice(&(table.len() as u16).to_le_bytes());
    payload.extend_from_slice(table.as_bytes());
    payload.extend_from_slice(&(key.len() as u32).to_le_bytes());
    payload.extend_from_slice(key);
    match value {
        None => payload.push(0),
        Some(value) => {
            payload.push(1);
            payload.extend_from_slice(&(value.len() as u32).to_le_bytes());
            payload.extend_from_slice(value);
        }
    }
}

/// The rows of a record's payload (or of one change's, [`crate::store::WriteTransaction::rows_since`]);
/// `None` when they do not decode.
pub(crate) fn decode_rows(mut payload: &[u8]) -> Option<Vec<LoggedRow>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = bytes.split_at_checked(n)?;
        *bytes = rest;
        Some(taken)
    }
    fn length(bytes: &mut &[u8], width: usize) -> Option<usize> {
        let raw = take(bytes, width)?;
        Some(match width {
            2 => u16::from_le_bytes(raw.try_into().ok()?) as usize,
            _ => u32::from_le_bytes(raw.try_into().ok()?) as usize,
        })
    }
    let mut rows = Vec::new();
    while !payload.is_empty() {
        let n = length(&mut payload, 2)?;
        let table = String::from_utf8(take(&mut payload, n)?.to_vec()).ok()?;
        let n = length(&mut payload, 4)?;
        let key = take(&mut payload, n)?.to_vec();
        let value = match take(&mut payload, 1)?[0] {
            0 => None,
            1 => {
                let n = length(&mut payload, 4)?;
                Some(take(&mut payload, n)?.to_vec())
            }
            _ => return None,
        };
        rows.push((table, key, value));
    }
    Some(rows)
}

/// Records taken from the log to be written ([`Log::take_pending`]): the file, where they go,
/// and their bytes.
pub(crate) type Taken = (Arc<File>, u64, Vec<u8>);

/// Writes and syncs records taken from the log ([`Log::take_pending`]).
///
/// # Errors
/// The write or the sync failed: the log must refuse every later record.
pub(crate) fn write_taken((file, at, bytes): &Taken) -> std::io::Result<()> {
    file.write_all_at(bytes, *at)?;
    file.sync_data()
}

/// The change log of one store (see the module's documentation).
pub(crate) struct Log {
    file: Arc<File>,
    path: PathBuf,
    epoch: u64,
    /// Drawn at random for each epoch.
    salt: u64,
    /// The next record's number.
    seq: u64,
    /// Where the next record goes.
    tail: u64,
    /// Records appended without a sync, not written yet: they are written with the next sync,
    /// so that a crash of the process loses them as a power cut would.
    pending: Vec<u8>,
    /// A write or a sync failed: what the file holds is unknown, and nothing more is made
    /// durable until the home opens the log again.
    broken: bool,
}

/// The log's path beside the store file at `store`.
pub(crate) fn log_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".rows");
    PathBuf::from(name)
}

/// Removes the log at `path`, if there is one: for a store file that becomes a mirror
/// member's copy, written only by what its primary ships.
///
/// # Errors
/// The log could not be removed, or its directory synced.
pub(crate) fn discard(path: &Path) -> std::io::Result<()> {
    weft_service::durable::remove_durably(path)
}

impl Log {
    /// Opens the log at `path` (making it when there is none) and reads its records, in
    /// order. The caller writes their rows into the store, then [`Log::restart`]s it.
    ///
    /// # Errors
    /// The log cannot be read or made, or it is of another version.
    pub fn open(path: &Path) -> std::io::Result<(Log, Logged)> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                return Ok((Log::make(path)?, Logged::default()))
            }
            Err(error) => return Err(error),
        };
        let mut log = Log {
            file: Arc::new(file),
            path: path.to_path_buf(),
            epoch: 0,
            salt: 0,
            seq: 0,
            tail: FIRST_RECORD,
            pending: Vec::new(),
            broken: false,
        };
        match FILE.read_header(&log.file)? {
            Header::Good { epoch, salt } => (log.epoch, log.salt) = (epoch, salt),
            Header::Version(version) => {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "store change log {} is of version {version}; this build reads \
                         version {VERSION}: start the build that wrote it once, to write its \
                         rows into the store",
                        path.display()
                    ),
                ))
            }
            // Torn while a restart rewrote it, once the store held every row: the records
            // after it, if any, are of the epoch it was to name.
            Header::Torn => match log.first_record_epoch()? {
                Some((epoch, salt)) => (log.epoch, log.salt) = (epoch, salt),
                None => {
                    log.restart()?;
                    return Ok((log, Logged::default()));
                }
            },
        }
        let mut logged = Logged {
            epoch: log.epoch,
            records: Vec::new(),
        };
        while let Some((payload, len)) = log.read_record()? {
            let rows = decode_rows(&payload).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "store change log {}: a record whose checksum holds has rows that do \
                         not decode; the log is from another build or damaged",
                        path.display()
                    ),
                )
            })?;
            logged.records.push((log.seq, rows));
            log.tail += len;
            log.seq += 1;
        }
        if log.seq > 0 {
            tracing::info!(path = %path.display(), records = log.seq, "store change log read");
        }
        Ok((log, logged))
    }

    /// Makes a new log at `path`: every block written, so appending allocates nothing.
    fn make(path: &Path) -> std::io::Result<Log> {
        let (epoch, salt) = (1, rand::random());
        Ok(Log {
            file: Arc::new(FILE.make(path, (epoch, salt))?),
            path: path.to_path_buf(),
            epoch,
            salt,
            seq: 0,
            tail: FIRST_RECORD,
            pending: Vec::new(),
            broken: false,
        })
    }

    /// Whether a record of `payload` bytes fits after the last.
    pub fn fits(&self, payload: usize) -> bool {
        self.tail + record_len(payload) <= LOG_BYTES
    }

    /// Bytes used by records.
    pub fn used(&self) -> u64 {
        self.tail - FIRST_RECORD
    }

    /// Bytes of records appended without a sync.
    pub fn unsynced(&self) -> usize {
        self.pending.len()
    }

    /// The epoch, and the number the next record will have: every record before it in the
    /// epoch is in the log.
    pub fn position(&self) -> (u64, u64) {
        (self.epoch, self.seq)
    }

    /// Whether its epoch has records.
    pub fn has_records(&self) -> bool {
        self.seq > 0
    }

    /// Whether a write or a sync failed (see [`Log::append`]).
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Appends a record of `payload`, and syncs it (with every record appended before it) if
    /// `sync`. The caller checked that it [`fits`](Log::fits).
    ///
    /// # Errors
    /// A write or a sync failed: the record may or may not be durable.
    pub fn append(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.check()?;
        let start = self.pending.len();
        self.pending.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        self.pending.extend_from_slice(&self.epoch.to_le_bytes());
        self.pending.extend_from_slice(&self.salt.to_le_bytes());
        self.pending.extend_from_slice(&self.seq.to_le_bytes());
        self.pending
            .extend_from_slice(&(payload.len() as u32).to_le_bytes());
        self.pending.extend_from_slice(payload);
        let crc = crc32c(&self.pending[start..]);
        self.pending.extend_from_slice(&crc.to_le_bytes());
        let len = record_len(payload.len());
        self.pending.resize(start + len as usize, 0);
        debug_assert!(self.tail + len <= LOG_BYTES);
        self.tail += len;
        self.seq += 1;
        Ok(())
    }

    /// The records appended since the last sync, to be written and synced
    /// ([`write_taken`]) before any taken after them: the file, where they go, and their
    /// bytes. `None` when there are none.
    ///
    /// # Errors
    /// An earlier write or sync failed.
    pub fn take_pending(&mut self) -> std::io::Result<Option<Taken>> {
        self.check()?;
        if self.pending.is_empty() {
            return Ok(None);
        }
        let at = self.tail - self.pending.len() as u64;
        Ok(Some((
            Arc::clone(&self.file),
            at,
            std::mem::take(&mut self.pending),
        )))
    }

    /// Refuses every later record: a write or sync of taken records failed.
    pub fn set_broken(&mut self) {
        self.broken = true;
    }

    fn check(&self) -> std::io::Result<()> {
        if self.broken {
            return Err(Error::other(format!(
                "an earlier write or sync of the store change log {} failed; the home must \
                 be opened again",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Starts the log again in a new epoch: for once the store holds every row it logged.
    ///
    /// # Errors
    /// The header could not be written and synced.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.check()?;
        self.epoch += 1;
        self.salt = rand::random();
        self.seq = 0;
        self.tail = FIRST_RECORD;
        self.pending.clear();
        let written = self.write_header();
        self.broken = written.is_err();
        written
    }

    fn write_header(&mut self) -> std::io::Result<()> {
        FILE.write_header(&self.file, (self.epoch, self.salt))
    }

    /// The epoch and salt of the first record, if it is whole and the first of its epoch.
    fn first_record_epoch(&mut self) -> std::io::Result<Option<(u64, u64)>> {
        let mut head = [0u8; RECORD_HEAD];
        if self.file.read_exact_at(&mut head, FIRST_RECORD).is_err() {
            return Ok(None);
        }
        (self.epoch, self.salt) = (
            u64::from_le_bytes(head[4..12].try_into().expect("8 bytes")),
            u64::from_le_bytes(head[12..20].try_into().expect("8 bytes")),
        );
        Ok(self
            .read_record()?
            .is_some()
            .then_some((self.epoch, self.salt)))
    }

    /// The payload of the record at the tail, and the record's length, or none where the log
    /// ends.
    fn read_record(&self) -> std::io::Result<Option<(Vec<u8>, u64)>> {
        let mut head = [0u8; RECORD_HEAD];
        if self.tail + RECORD_HEAD as u64 > LOG_BYTES {
            return Ok(None);
        }
        self.file.read_exact_at(&mut head, self.tail)?;
        let word = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
        if word(0) != RECORD_MAGIC
            || long(4) != self.epoch
            || long(12) != self.salt
            || long(20) != self.seq
        {
            return Ok(None);
        }
        let payload = word(28) as usize;
        if self.tail + (RECORD_HEAD + payload + 4) as u64 > LOG_BYTES {
            return Ok(None);
        }
        let mut record = vec![0; RECORD_HEAD + payload + 4];
        self.file.read_exact_at(&mut record, self.tail)?;
        let (bytes, crc) = record.split_at(RECORD_HEAD + payload);
        if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != crc32c(bytes) {
            return Ok(None);
        }
        Ok(Some((bytes[RECORD_HEAD..].to_vec(), record_len(payload))))
    }
}

/// Bytes a record of `payload` bytes takes, up to where the next one starts.
fn record_len(payload: usize) -> u64 {
    ((RECORD_HEAD + payload + 4) as u64).next_multiple_of(ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(byte: u8, len: usize) -> Vec<u8> {
        let mut payload = Vec::new();
        encode_row(&mut payload, "inodes", &[byte; 8], Some(&vec![byte; len]));
        encode_row(&mut payload, "entries", &[byte; 3], None);
        payload
    }

    /// Appends `payload`, and writes and syncs it with what was appended before if `sync`.
    fn append(log: &mut Log, payload: &[u8], sync: bool) {
        log.append(payload).expect("append");
        if sync {
            if let Some(taken) = log.take_pending().expect("take") {
                write_taken(&taken).expect("write and sync");
            }
        }
    }

    // Goal: what was appended and synced is read back at the next opening, in order; a torn
    // last record and the records of an epoch before a restart are not.
    #[test]
    fn an_opening_reads_the_records_of_the_epoch_and_drops_a_torn_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = log_path(&dir.path().join("store"));
        let (mut log, logged) = Log::open(&path).expect("new log");
        assert!(logged.records.is_empty());
        append(&mut log, &payload(1, 100), true);
        append(&mut log, &payload(2, 5000), true);
        let torn_at = log.tail;
        append(&mut log, &payload(3, 10), true);
        log.file
            .write_all_at(&[0xff; 4], torn_at + 40)
            .expect("tear");
        drop(log);

        let (mut log, logged) = Log::open(&path).expect("open");
        assert_eq!(logged.records.len(), 2, "two records");
        assert_eq!(logged.records[1].0, 1, "numbered in order");
        let rows: Vec<_> = logged
            .records
            .into_iter()
            .flat_map(|(_, rows)| rows)
            .collect();
        assert_eq!(rows[0], ("inodes".into(), vec![1; 8], Some(vec![1; 100])));
        assert_eq!(rows[1], ("entries".into(), vec![1; 3], None));
        assert_eq!(rows[2].2, Some(vec![2; 5000]));
        log.restart().expect("restart");
        append(&mut log, &payload(4, 1), true);
        // Appended without a sync: not written, as a crash of the process would leave it.
        append(&mut log, &payload(5, 1), false);
        drop(log);
        let (_, logged) = Log::open(&path).expect("open again");
        assert_eq!(
            logged.records.len(),
            1,
            "only the new epoch's record: {logged:?}"
        );
        assert_eq!(logged.records[0].1[0].1, vec![4; 8]);
    }

    // Goal: a header torn while a restart rewrote it loses no record written after it, and a
    // log of another version stops the start instead of being dropped.
    #[test]
    fn a_torn_header_keeps_the_records_and_another_version_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = log_path(&dir.path().join("store"));
        let (mut log, _) = Log::open(&path).expect("new log");
        append(&mut log, &payload(5, 10), true);
        log.file.write_all_at(&[0xee], 20).expect("tear the header");
        drop(log);
        let (log, logged) = Log::open(&path).expect("open");
        assert_eq!(logged.records.len(), 1, "the record");
        log.file
            .write_all_at(&9u32.to_le_bytes(), 8)
            .expect("version 9");
        drop(log);
        let refused = Log::open(&path).map(drop).expect_err("refused");
        assert!(refused.to_string().contains("version 9"), "{refused}");
    }

    // Goal: a full log says so instead of writing past its end.
    #[test]
    fn a_record_that_does_not_fit_is_refused_before_it_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut log, _) = Log::open(&log_path(&dir.path().join("store"))).expect("log");
        let big = payload(6, 1 << 20);
        let mut appended = 0;
        while log.fits(big.len()) {
            append(&mut log, &big, false);
            appended += 1;
        }
        assert_eq!(appended, (LOG_BYTES - FIRST_RECORD) / record_len(big.len()));
        assert!(log.used() <= LOG_BYTES - FIRST_RECORD);
    }
}
