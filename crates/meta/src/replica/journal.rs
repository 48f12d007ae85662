//! A home's store journal: each sync's changes to the store file, appended to a file of their
//! own and synced there, before they are written to the store file.
//!
//! A sync of the store file itself writes redb's pages where they lie (a dozen scattered
//! pages for a create) and flushes them; appending the same bytes in one piece to a file whose
//! blocks are written already, and flushing that, takes one contiguous write and no
//! allocation (less than half the time on this project's disks, see docs/benchmarks.md). The
//! store file is written after its record is durable, without a sync, and is synced only at a
//! checkpoint, when the journal is full: then every page written many times since reaches the
//! disk once, and the journal starts again.
//!
//! A crash leaves the store file with any part of what was written to it since the last
//! checkpoint, and the journal with every record synced since then. Opening the journal
//! ([`Journal::recover`]) writes those records to the store file again, in order, and syncs
//! it, before redb reads the file: it is then the file as of the last synced record, which is
//! what a sync of the store file itself would have left. The store file never holds a change
//! whose record is not durable, so a torn record (the end of the journal at a crash) was
//! never answered and is dropped.
//!
//! ```text
//! header, the first 4 KiB:   magic "WEFTJRNL" | version u32 | epoch u64 | salt u64
//!                              | crc32c u32
//! record, at a 4 KiB boundary: magic u32 | epoch u64 | salt u64 | seq u64 | changes u32
//!                              | payload u32
//!                              | changes (tag u8, offset or length u64, length u32) ...
//!                              | payload | crc32c u32 of all before it
//! ```
//!
//! A record belongs to the journal's current epoch and salt and follows the one before it
//! (`seq` one higher, from 0); the first that does not, or whose checksum fails, ends the
//! journal. A checkpoint moves the epoch on and draws a new random salt, so the records of an
//! earlier epoch that lie beyond the end are never taken for new ones, and no bytes a client
//! put in the store (a name, an attribute's value) can pass for a record. A header torn while
//! a checkpoint rewrote it is rebuilt from the first record after it, if that one is the
//! first of its epoch; a header of another version stops the start.

use crate::store::{EpochFile, Header};
use std::fs::File;
use std::io::{Error, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use weft_mirror::pages::{Changes, FileChange};
use weft_proto::checksum::crc32c;

/// Bytes of the journal file, written once when it is made.
const JOURNAL_BYTES: u64 = 16 << 20;
/// Records start at multiples of this, past the header.
const BLOCK: u64 = 4096;
/// The journal's file: its header's magic and version.
const FILE: EpochFile = EpochFile {
    magic: b"WEFTJRNL",
    version: VERSION,
    bytes: JOURNAL_BYTES,
};
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"JREC");
const VERSION: u32 = 1;
/// Bytes of a record before its changes.
const RECORD_HEAD: usize = 4 + 8 + 8 + 8 + 4 + 4;
/// Bytes of one change in a record.
const CHANGE_BYTES: usize = 1 + 8 + 4;

/// The journal of one home's store file (see the module's documentation).
pub(crate) struct Journal {
    file: File,
    path: PathBuf,
    epoch: u64,
    /// Drawn at random for each epoch.
    salt: u64,
    /// The next record's number.
    seq: u64,
    /// Where the next record goes.
    tail: u64,
}

/// The journal's path beside the store file at `store`.
pub(crate) fn journal_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

impl Journal {
    /// Opens the journal of the store file `store` at `path` (making it when there is none),
    /// writes what its records hold to the store file, syncs that, and starts the journal
    /// afresh.
    ///
    /// # Errors
    /// The journal or the store file cannot be read, written or synced.
    pub fn recover(store: &File, path: &Path) -> std::io::Result<Journal> {
        match Journal::replay(store, path)? {
            Some(mut journal) => {
                journal.checkpoint(store)?;
                Ok(journal)
            }
            None => Journal::make(path),
        }
    }

    /// Opens the journal at `path` and writes what its records hold to the store file
    /// `store`, without a sync; none when there is no journal, or only a torn header without
    /// records after it.
    fn replay(store: &File, path: &Path) -> std::io::Result<Option<Journal>> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut journal = Journal {
            file,
            path: path.to_path_buf(),
            epoch: 0,
            salt: 0,
            seq: 0,
            tail: BLOCK,
        };
        match FILE.read_header(&journal.file)? {
            Header::Good { epoch, salt } => (journal.epoch, journal.salt) = (epoch, salt),
            Header::Version(version) => {
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!(
                        "store journal {} is of version {version}; this build reads version \
                         {VERSION}: start the build that wrote it once, to write its records \
                         to the store",
                        path.display()
                    ),
                ))
            }
            // Torn while a checkpoint rewrote it, just after the store file was synced: the
            // records after it, if any, are of the epoch it was to name.
            Header::Torn => match journal.first_record_epoch()? {
                Some((epoch, salt)) => (journal.epoch, journal.salt) = (epoch, salt),
                None => return Ok(None),
            },
        }
        let mut replayed = 0;
        while let Some((changes, len)) = journal.read_record()? {
            apply(store, &changes)?;
            journal.tail += len;
            journal.seq += 1;
            replayed += 1;
        }
        if replayed > 0 {
            tracing::info!(path = %path.display(), records = replayed, "store journal replayed");
        }
        Ok(Some(journal))
    }

    /// Makes a new journal at `path`: every block written, so appending allocates nothing.
    fn make(path: &Path) -> std::io::Result<Journal> {
        let (epoch, salt) = (1, rand::random());
        Ok(Journal {
            file: FILE.make(path, (epoch, salt))?,
            path: path.to_path_buf(),
            epoch,
            salt,
            seq: 0,
            tail: BLOCK,
        })
    }

    /// Appends `changes` and syncs them; a full journal is checkpointed first (the store file
    /// synced). Changes too large for the journal are written to the store file and synced
    /// there instead. The caller writes them to the store file afterwards.
    ///
    /// # Errors
    /// A write or a sync failed: the changes may or may not be durable.
    pub fn append(&mut self, store: &File, changes: &Changes) -> std::io::Result<()> {
        let record = self.record(changes);
        if self.tail + record.len() as u64 > JOURNAL_BYTES {
            self.checkpoint(store)?;
        }
        if self.tail + record.len() as u64 > JOURNAL_BYTES {
            apply(store, changes)?;
            return store.sync_data();
        }
        self.file.write_all_at(&record, self.tail)?;
        self.file.sync_data()?;
        if weft_service::failpoint::misbehave("meta-slow-journal") {
            // A disk that takes its time: what runs beside a sync has room to go wrong.
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.tail += record.len() as u64;
        self.seq += 1;
        Ok(())
    }

    /// Syncs the store file and starts the journal again in a new epoch.
    fn checkpoint(&mut self, store: &File) -> std::io::Result<()> {
        store.sync_data()?;
        self.epoch += 1;
        self.salt = rand::random();
        self.seq = 0;
        self.tail = BLOCK;
        self.write_header()
    }

    fn write_header(&mut self) -> std::io::Result<()> {
        FILE.write_header(&self.file, (self.epoch, self.salt))
    }

    /// The epoch and salt of the record right after the header, if it is whole and the first
    /// of its epoch.
    fn first_record_epoch(&mut self) -> std::io::Result<Option<(u64, u64)>> {
        let mut head = [0u8; RECORD_HEAD];
        if self.file.read_exact_at(&mut head, BLOCK).is_err() {
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

    /// The record of `changes`, padded to a whole block.
    fn record(&self, changes: &Changes) -> Vec<u8> {
        let mut record = Vec::with_capacity(
            RECORD_HEAD + changes.changes.len() * CHANGE_BYTES + changes.payload.len() + 8,
        );
        record.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        record.extend_from_slice(&self.epoch.to_le_bytes());
        record.extend_from_slice(&self.salt.to_le_bytes());
        record.extend_from_slice(&self.seq.to_le_bytes());
        record.extend_from_slice(&(changes.changes.len() as u32).to_le_bytes());
        record.extend_from_slice(&(changes.payload.len() as u32).to_le_bytes());
        for change in &changes.changes {
            let (tag, at, len) = match *change {
                FileChange::Write { offset, len } => (0u8, offset, len),
                FileChange::SetLen(len) => (1u8, len, 0),
            };
            record.push(tag);
            record.extend_from_slice(&at.to_le_bytes());
            record.extend_from_slice(&len.to_le_bytes());
        }
        record.extend_from_slice(&changes.payload);
        let crc = crc32c(&record);
        record.extend_from_slice(&crc.to_le_bytes());
        record.resize(record.len().next_multiple_of(BLOCK as usize), 0);
        record
    }

    /// The record at the tail, and its length, or none where the journal ends.
    fn read_record(&self) -> std::io::Result<Option<(Changes, u64)>> {
        let mut head = [0u8; RECORD_HEAD];
        if self.tail + RECORD_HEAD as u64 > JOURNAL_BYTES {
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
        let (count, payload) = (word(28) as u64, word(32) as u64);
        let body = RECORD_HEAD as u64 + count * CHANGE_BYTES as u64 + payload;
        if self.tail + body + 4 > JOURNAL_BYTES {
            return Ok(None);
        }
        let mut record = vec![0; body as usize + 4];
        self.file.read_exact_at(&mut record, self.tail)?;
        let (bytes, crc) = record.split_at(body as usize);
        if u32::from_le_bytes(crc.try_into().expect("4 bytes")) != crc32c(bytes) {
            return Ok(None);
        }
        let mut changes = Changes::default();
        let mut at = RECORD_HEAD;
        for _ in 0..count {
            let tag = bytes[at];
            let offset = u64::from_le_bytes(bytes[at + 1..at + 9].try_into().expect("8 bytes"));
            let len = u32::from_le_bytes(bytes[at + 9..at + 13].try_into().expect("4 bytes"));
            changes.changes.push(match tag {
                0 => FileChange::Write { offset, len },
                1 => FileChange::SetLen(offset),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidData,
                        format!(
                            "store journal {}: a change of kind {tag}",
                            self.path.display()
                        ),
                    ))
                }
            });
            at += CHANGE_BYTES;
        }
        changes.payload = bytes[at..].to_vec();
        if weft_mirror::pages::payload_len(&changes.changes) != payload {
            return Err(Error::new(
                ErrorKind::InvalidData,
                format!(
                    "store journal {}: a record's changes do not match its payload",
                    self.path.display()
                ),
            ));
        }
        Ok(Some((changes, (body + 4).next_multiple_of(BLOCK))))
    }
}

/// Writes `changes` to `store`.
fn apply(store: &File, changes: &Changes) -> std::io::Result<()> {
    super::apply_changes(store, &changes.changes, &changes.payload)
}

/// Writes what the journal at `path` holds, if there is one, to the store file `store` (a
/// copy this server held as its home's primary before), syncs it and removes the journal: a
/// member writes its copy and syncs it as its primary ships, without a journal, and what the
/// journal held must never be written over what another primary ships.
///
/// # Errors
/// As [`Journal::recover`], or the journal cannot be removed.
pub(crate) fn settle(store: &File, path: &Path) -> std::io::Result<()> {
    if Journal::replay(store, path)?.is_some() {
        store.sync_data()?;
    }
    weft_service::durable::remove_durably(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new store file named `store` in a directory of its own, its journal's path, and its
    /// journal, made new.
    fn fresh() -> (tempfile::TempDir, PathBuf, File, Journal) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = journal_path(&dir.path().join("store"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("store"))
            .expect("store");
        let journal = Journal::recover(&file, &path).expect("new journal");
        (dir, path, file, journal)
    }

    fn changes(offset: u64, byte: u8, len: usize) -> Changes {
        let mut changes = Changes::default();
        changes.write(offset, &vec![byte; len]);
        changes
    }

    // Goal: what was appended to the journal reaches the store file at the next opening,
    // even if the writes to the store file itself were lost; a torn last record is dropped.
    // Method: append records without writing the store file (as a crash after the journal's
    // sync loses the store file's unsynced pages), tear a further record, then recover.
    #[test]
    fn a_recovery_writes_the_synced_records_and_drops_a_torn_one() {
        let (dir, path, file, mut journal) = fresh();
        journal.append(&file, &changes(0, 1, 5000)).expect("append");
        let mut cut = changes(8192, 2, 100);
        cut.set_len(9000);
        journal.append(&file, &cut).expect("append");
        let torn_at = journal.tail;
        journal.append(&file, &changes(0, 9, 4096)).expect("append");
        journal
            .file
            .write_all_at(&[0xff; 16], torn_at + 40)
            .expect("tear");
        drop(journal);

        let journal = Journal::recover(&file, &path).expect("recover");
        let bytes = std::fs::read(dir.path().join("store")).expect("read");
        assert_eq!(bytes.len(), 9000);
        assert!(bytes[..5000].iter().all(|b| *b == 1), "the first record");
        assert!(bytes[8192..8292].iter().all(|b| *b == 2), "the second");
        assert_eq!(journal.seq, 0, "the journal starts again");

        // Records of the epoch before, beyond the new end, are not taken for new ones.
        drop(journal);
        std::fs::write(dir.path().join("store"), b"").expect("empty the store");
        Journal::recover(&file, &path).expect("recover again");
        assert_eq!(
            std::fs::read(dir.path().join("store")).expect("read").len(),
            0
        );
    }

    // Goal: a copy this server journaled as its home's primary gets the journal's records when
    // it becomes a member's copy, and the journal goes; a copy without a journal stays as it
    // is. Method: records appended without writing the store file, then settled, twice.
    #[test]
    fn settling_writes_the_records_and_removes_the_journal() {
        let (dir, path, file, mut journal) = fresh();
        journal.append(&file, &changes(0, 3, 4096)).expect("append");
        drop(journal);
        settle(&file, &path).expect("settle");
        assert!(!path.exists(), "the journal is gone");
        let bytes = std::fs::read(dir.path().join("store")).expect("read");
        assert!(
            bytes.len() == 4096 && bytes.iter().all(|b| *b == 3),
            "the record"
        );
        settle(&file, &path).expect("settle without a journal");
        assert_eq!(
            std::fs::read(dir.path().join("store")).expect("read"),
            bytes
        );
    }

    // Goal: a header torn while a checkpoint rewrote it loses no record written after it, and
    // a journal of another version stops the start instead of being dropped. Method: records
    // appended, the header's checksum broken, recovery; then a header of version 9.
    #[test]
    fn a_torn_header_keeps_the_records_and_another_version_is_refused() {
        let (dir, path, file, mut journal) = fresh();
        journal.append(&file, &changes(0, 5, 4096)).expect("append");
        journal
            .append(&file, &changes(4096, 6, 4096))
            .expect("append");
        journal
            .file
            .write_all_at(&[0xee], 20)
            .expect("tear the header");
        drop(journal);
        Journal::recover(&file, &path).expect("recover");
        let bytes = std::fs::read(dir.path().join("store")).expect("read");
        assert!(bytes[..4096].iter().all(|b| *b == 5), "the first record");
        assert!(bytes[4096..8192].iter().all(|b| *b == 6), "the second");

        let journal = Journal::recover(&file, &path).expect("recover again");
        journal
            .file
            .write_all_at(&9u32.to_le_bytes(), 8)
            .expect("version 9");
        drop(journal);
        let refused = Journal::recover(&file, &path)
            .map(drop)
            .expect_err("refused");
        assert!(refused.to_string().contains("version 9"), "{refused}");
    }

    // Goal: a journal that fills up checkpoints (the store file synced) and goes on, and
    // changes larger than the journal go to the store file directly; nothing is lost either way.
    #[test]
    fn a_full_journal_checkpoints_and_goes_on() {
        let (dir, path, file, mut journal) = fresh();
        let records = JOURNAL_BYTES / (256 << 10) + 3;
        for i in 0..records {
            let change = changes(i * 4096, i as u8 + 1, 256 << 10);
            journal.append(&file, &change).expect("append");
            apply(&file, &change).expect("write the store");
        }
        assert!(journal.epoch >= 2, "checkpointed");
        let huge = changes(0, 0xaa, JOURNAL_BYTES as usize);
        journal.append(&file, &huge).expect("append huge");
        drop(journal);
        Journal::recover(&file, &path).expect("recover");
        let bytes = std::fs::read(dir.path().join("store")).expect("read");
        assert!(bytes[..JOURNAL_BYTES as usize].iter().all(|b| *b == 0xaa));
    }
}
