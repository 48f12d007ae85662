//! The metadata store's schema: its tables, their records and encodings, the conversions of
//! older stores, and the helpers every operation uses. Every table is defined here and every
//! stored record is encoded and decoded here (the fuzz targets aside); this module imports
//! nothing else of the crate. A table whose values are records of one type is a
//! [`RecordTable`], which encodes and decodes them.
//!
//! | table | key | value |
//! |---|---|---|
//! | `inodes` | inode id | format version byte + postcard [`InodeRecord`] |
//! | `entries` | (parent, cookie) | (child, kind, name) — the cookie is the name's hash bucket and a slot ([`name_bucket`]) |
//! | `counters` | name | last value allocated |
//! | `replies` | (client, seq) | postcard reply of a mutating request |
//! | `disposals` | inode id | postcard layout whose objects await removal |
//! | `truncates` | inode id | postcard [`TruncateWork`] awaiting its targets |
//! | `orphans` | inode id | 0 — unlinked inodes still open somewhere |
//! | `xattrs` | (inode, name) | value — extended attributes, POSIX ACLs included |
//! | `intents` | intent id | postcard [`Intent`]: a cross-server operation in flight |
//! | `remote_created` | (coordinator, intent) | inode created here for another server's mkdir |
//! | `intent_names` | (parent, name) | intent about to remove or replace that dentry |
//! | `written` | inode id | postcard [`SlotSet`]: the slots of the file's layout data was written to |
//! | `usage` | (user 0 or group 1, id, pool) | (bytes, inodes) it uses ([`crate::schema::usage`]) |

mod inodes;
mod intents;
mod moves;
mod records;
pub(crate) mod usage;

pub(crate) use inodes::{InodeRecord, TruncateWork, FIRST_COOKIE, LINKS_MAX};
use inodes::{COOKIE_BITS, SLOT_BITS};
pub(crate) use records::{RecordTable, Records, Transaction};

pub(crate) use intents::{
    ExchangeIntent, Intent, IntentOp, LinkIntent, MkdirIntent, RenameIntent, RmdirIntent,
    SpreadMkdirIntent, SpreadRmdirIntent, UnlinkIntent,
};
pub(crate) use moves::{
    load_move, load_tombstones, take_moved_objects, MoveWork, SlotId, MOVES, TOMBSTONES,
};

use crate::store::{ReadableTable, Table, TableDefinition};
use redb::TableHandle;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use weft_proto::codec::PROTOCOL_VERSION;
use weft_proto::error::WireError;
use weft_proto::ids::InodeId;
use weft_proto::layout::{FileLayout, SlotSet, StripePattern};
use weft_proto::messages::{FileKind, InodeAttr, Timestamp, NAME_BYTES_MAX};
use weft_proto::ErrorCode;

pub(crate) const INODES: TableDefinition<u64, &[u8]> = TableDefinition::new("inodes");
/// A directory's entries by (directory, cookie). A name's cookie lies in its hash bucket
/// ([`name_bucket`]): a lookup reads one bucket, a listing runs in cookie order, and an entry
/// keeps its cookie for as long as it exists, so listings resume exactly where they stopped.
pub(crate) const ENTRIES: TableDefinition<(u64, u64), (u64, u8, &str)> =
    TableDefinition::new("entries");
/// The entries table as stored by a mutating operation.
pub(crate) type Entries<'txn> = Table<'txn, (u64, u64), (u64, u8, &'static str)>;
pub(crate) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// Replies kept for retries, encoded in the protocol version the table is named after (a
/// store of an older version's table is converted when it opens: [`convert_from_version_4`]).
pub(crate) const REPLIES: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("replies_v5");
/// Per client session: the sequence number below which the client said every mutation was
/// answered (the largest `oldest_pending` it sent), whose replies were dropped: a copy of
/// such a mutation arriving late is refused, never run a second time.
pub(crate) const REPLY_FLOORS: TableDefinition<u64, u64> = TableDefinition::new("reply_floors");
/// Removed files whose objects await removal: inode → the file's layout.
pub(crate) const DISPOSALS: RecordTable<FileLayout> = RecordTable::new("disposals");
/// Truncates that must still reach a file's targets: inode → [`TruncateWork`].
pub(crate) const TRUNCATES: RecordTable<TruncateWork> = RecordTable::new("truncates");
pub(crate) const ORPHANS: TableDefinition<u64, u64> = TableDefinition::new("orphans");
pub(crate) const XATTRS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("xattrs");
/// Cross-server operations in flight (`ops/intent.rs`). An intent may hold a `MetaRequest`,
/// encoded in the protocol version the table is named after; a store of an older version's
/// table is converted when it opens ([`convert_from_version_4`]).
pub(crate) const INTENTS: RecordTable<Intent> = RecordTable::new("intents_v5");
pub(crate) const REMOTE_CREATED: TableDefinition<(u32, u64), u64> =
    TableDefinition::new("remote_created");
/// Per coordinating home: the intent id below which all its intents finished
/// (`ops::intent::settle_intents`); steps of those are late copies.
pub(crate) const SETTLED_INTENTS: TableDefinition<u32, u64> =
    TableDefinition::new("settled_intents");
pub(crate) const INTENT_NAMES: TableDefinition<(u64, &str), u64> =
    TableDefinition::new("intent_names");
/// Files created open whose writer has not reported a size yet. A size report of such a file
/// takes it off in the same commit and is answered before that commit is synced: a crash
/// loses both together, and a start recomputes the size of every file still listed from its
/// objects (`Meta::settle_unreported`). The last close of a file takes it off too.
pub(crate) const UNREPORTED: TableDefinition<u64, ()> = TableDefinition::new("unreported");
/// Client sessions this home answered changes before their sync: session → the start (lock
/// epoch) that first did, written and synced before that first answer. A start whose last
/// run answered so waits for these sessions to replay what they keep
/// (`service/numbered.rs`).
pub(crate) const REPLAYERS: TableDefinition<u64, u64> = TableDefinition::new("replayers");
/// The slots of each regular file's layout that data was written to in its truncate
/// generation, from the writers' size reports (and from the objects when a size is settled
/// without one): `weft fsck` takes a missing object of such a slot for lost data, where a
/// missing object of another slot is a hole. A file without a row has none recorded (or was
/// written before the table existed). A truncate keeps only the slots its size leaves bytes on.
pub(crate) const WRITTEN: RecordTable<SlotSet> = RecordTable::new("written");

/// Opens every table in a commit of its own: the store then knows each table's type, as a
/// start needs before it writes the rows its store's log holds into them
/// (`Store::replay_log`), and before [`create_tables`] changes any of them. Every table must be
/// opened here.
pub(crate) fn open_tables(db: &crate::store::Store) -> Result<(), OpError> {
    let txn = db.begin_write()?;
    open_every_table(&txn)?;
    // Made by `create_tables`, after it counted what a store without it uses.
    let usage = crate::schema::usage::USAGE.name();
    if txn.list_tables()?.any(|table| table.name() == usage) {
        txn.open_table(crate::schema::usage::USAGE)?;
    }
    txn.commit(crate::store::Commit::Checkpoint { durable: true })?;
    Ok(())
}

fn open_every_table(txn: &crate::store::WriteTransaction) -> Result<(), OpError> {
    txn.open_table(INODES)?;
    txn.open_table(ENTRIES)?;
    txn.open_table(COUNTERS)?;
    txn.open_table(REPLIES)?;
    txn.open_table(REPLY_FLOORS)?;
    txn.open_table(DISPOSALS.definition())?;
    txn.open_table(TRUNCATES.definition())?;
    txn.open_table(ORPHANS)?;
    txn.open_table(XATTRS)?;
    txn.open_table(INTENTS.definition())?;
    txn.open_table(REMOTE_CREATED)?;
    txn.open_table(SETTLED_INTENTS)?;
    txn.open_table(INTENT_NAMES)?;
    txn.open_table(UNREPORTED)?;
    txn.open_table(REPLAYERS)?;
    txn.open_table(WRITTEN.definition())?;
    txn.open_table(MOVES.definition())?;
    txn.open_table(TOMBSTONES.definition())?;
    Ok(())
}

/// Creates every table, so readers never meet a missing one, and converts the tables of a
/// store written by an earlier version.
pub(crate) fn create_tables(db: &crate::store::Store) -> Result<(), OpError> {
    let txn = db.begin_write()?;
    open_every_table(&txn)?;
    count_usage(&txn)?;
    txn.open_table(crate::schema::usage::USAGE)?;
    migrate_entries(&txn)?;
    convert_from_version_4::<u64, Intent>(
        &txn,
        TableDefinition::new("intents"),
        (INTENTS.definition(), PROTOCOL_VERSION),
    )?;
    convert_from_version_4::<
        (u64, u64),
        weft_proto::messages::Reply<weft_proto::messages::MetaResponse>,
    >(
        &txn,
        TableDefinition::new("replies"),
        (REPLIES, REPLY_VERSION),
    )?;
    convert_from_version_4::<u64, MoveWork>(
        &txn,
        TableDefinition::new("moves"),
        (MOVES.definition(), PROTOCOL_VERSION),
    )?;
    txn.commit(crate::store::Commit::Checkpoint { durable: true })?;
    Ok(())
}

/// Counts what users and groups use in a store made before usage was kept (it has no usage
/// table yet).
fn count_usage(txn: &crate::store::WriteTransaction) -> Result<(), OpError> {
    if txn
        .list_tables()?
        .any(|table| table.name() == crate::schema::usage::USAGE.name())
    {
        return Ok(());
    }
    let counted = crate::schema::usage::recount(&txn.open_table(INODES)?)?;
    crate::schema::usage::rewrite(txn, &counted)?;
    tracing::info!(rows = counted.len(), "usage of users and groups counted");
    Ok(())
}

/// Moves the entries of a store written before entries were keyed by name hash (a table of
/// entries by name plus a table of listing positions) into [`ENTRIES`], and drops the old
/// tables. Listing positions change once, here.
fn migrate_entries(txn: &crate::store::WriteTransaction) -> Result<(), OpError> {
    const DENTRIES_V1: TableDefinition<(u64, &str), (u64, u64, u8)> =
        TableDefinition::new("dentries");
    const COOKIES_V1: TableDefinition<(u64, u64), &str> = TableDefinition::new("cookies");
    if !txn
        .list_tables()?
        .any(|table| table.name() == DENTRIES_V1.name())
    {
        return Ok(());
    }
    let mut entries = txn.open_table(ENTRIES)?;
    let mut moved = 0u64;
    {
        let old = txn.open_table(DENTRIES_V1)?;
        for item in old.iter()? {
            let (key, value) = item?;
            let (parent, name) = key.value();
            let (child, _, kind) = value.value();
            let cookie = free_cookie(&entries, InodeId(parent), name)?;
            entries.insert((parent, cookie), (child, kind, name))?;
            moved += 1;
        }
    }
    txn.delete_table(DENTRIES_V1)?;
    if txn
        .list_tables()?
        .any(|table| table.name() == COOKIES_V1.name())
    {
        txn.delete_table(COOKIES_V1)?;
    }
    tracing::info!(entries = moved, "directory entries now keyed by name hash");
    Ok(())
}

/// Re-encodes the records of table `old` of a store written by protocol version 4 (intents
/// holding requests, replies) in the version `new` holds its records in (`into`), and drops
/// `old`. A field added since (a project) takes its default.
fn convert_from_version_4<K, T>(
    txn: &crate::store::WriteTransaction,
    old: TableDefinition<K, &[u8]>,
    (new, into): (TableDefinition<K, &[u8]>, u16),
) -> Result<(), OpError>
where
    K: crate::store::Key + 'static,
    T: Serialize + serde::de::DeserializeOwned,
{
    if !txn.list_tables()?.any(|table| table.name() == old.name()) {
        return Ok(());
    }
    let mut converted = 0u64;
    {
        let mut records = txn.open_table(new)?;
        let stored = txn.open_table(old)?;
        for item in stored.iter()? {
            let (key, bytes) = item?;
            let decoded =
                weft_proto::wire::in_version(4, || postcard::from_bytes::<T>(bytes.value()));
            let record = match decoded {
                Ok(record) => record,
                Err(error) => {
                    // As version 4 did: a record it could not read was passed over.
                    tracing::warn!(table = old.name(), %error, "an unreadable record is left out");
                    continue;
                }
            };
            let bytes = weft_proto::wire::in_version(into, || postcard::to_stdvec(&record))
                .expect("records encode");
            records.insert(key.value(), bytes.as_slice())?;
            converted += 1;
        }
    }
    txn.delete_table(old)?;
    tracing::info!(
        table = old.name(),
        records = converted,
        "records converted to protocol version 5"
    );
    Ok(())
}

/// Why an operation failed: rejected (nothing was written, the batch goes on) or the store
/// failed (the whole batch is abandoned).
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpError {
    /// Refused: the code and message are the client's answer.
    #[error("{0}")]
    Rejected(WireError),
    /// This server failed: never the client's fault, and never kept as a reply.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A failure of a metadata server's store, of its commit, or of what it holds. Cloned into the
/// answer of every operation of a failed batch, so its sources are shared.
#[derive(Clone, Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// redb failed.
    #[error("metadata store")]
    Redb(#[source] Arc<redb::Error>),
    /// A stored record does not decode.
    #[error("{what} is damaged")]
    Damaged {
        /// Which record.
        what: String,
        /// Why it does not decode.
        #[source]
        source: postcard::Error,
    },
    /// The store, or another server's answer, contradicts what the operation relies on: a
    /// broken invariant, reported with what was found.
    #[error("{0}")]
    Inconsistent(String),
    /// Syncing the store file, or shipping its changes to the home's mirror members, failed;
    /// no later commit is made durable until the home is opened again.
    #[error("metadata store sync failed")]
    Sync(#[source] Arc<std::io::Error>),
    /// The commit thread has stopped: the home is closing.
    #[error("the commit thread stopped")]
    Stopped,
}

impl StoreError {
    /// A stored record `what` that does not decode.
    pub fn damaged(what: impl Into<String>, source: postcard::Error) -> StoreError {
        StoreError::Damaged {
            what: what.into(),
            source,
        }
    }
}

impl OpError {
    pub fn rejected(code: ErrorCode, message: impl Into<String>) -> OpError {
        OpError::Rejected(WireError::new(code, message))
    }

    /// A broken expectation of the store or of another server's answer (see
    /// [`StoreError::Inconsistent`]).
    pub fn inconsistent(message: impl Into<String>) -> OpError {
        OpError::Store(StoreError::Inconsistent(message.into()))
    }

    /// The client's answer. A store failure is logged here with its whole chain of causes,
    /// and the client learns only that this server failed.
    pub fn into_wire(self) -> WireError {
        match self {
            OpError::Rejected(error) => error,
            OpError::Store(error) => {
                let message = weft_proto::error::error_chain(&error);
                tracing::error!(%message, "metadata store failed");
                WireError::new(ErrorCode::Io, message)
            }
        }
    }
}

/// The protocol version [`REPLIES`] holds its replies in, whatever the build speaks: a field
/// added since (whether an inode has no extended attributes, version 13) is left out of them,
/// and a reply answered again says what a reply of that version says (that a client ask).
/// So a store's replies read the same before and after an upgrade.
const REPLY_VERSION: u16 = 12;

/// A reply as [`REPLIES`] stores it.
pub(crate) fn reply_bytes(
    reply: &weft_proto::messages::Reply<weft_proto::messages::MetaResponse>,
) -> Vec<u8> {
    weft_proto::wire::in_version(REPLY_VERSION, || postcard::to_stdvec(reply))
        .expect("replies encode")
}

/// A stored reply ([`REPLIES`]) as the answer it was.
pub(crate) fn stored_reply(bytes: &[u8]) -> Result<weft_proto::messages::MetaResponse, OpError> {
    match weft_proto::wire::in_version(REPLY_VERSION, || {
        postcard::from_bytes::<weft_proto::messages::Reply<weft_proto::messages::MetaResponse>>(
            bytes,
        )
    }) {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(error)) => Err(OpError::Rejected(error)),
        Err(error) => Err(StoreError::damaged("stored reply", error).into()),
    }
}

macro_rules! store_errors {
    ($($error:ty),*) => {$(
        impl From<$error> for StoreError {
            fn from(error: $error) -> StoreError {
                StoreError::Redb(Arc::new(error.into()))
            }
        }

        impl From<$error> for OpError {
            fn from(error: $error) -> OpError {
                OpError::Store(error.into())
            }
        }
    )*};
}
store_errors!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::Error
);

pub(crate) fn now() -> Timestamp {
    let elapsed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: elapsed.as_secs() as i64,
        nanos: elapsed.subsec_nanos(),
    }
}

/// Checks a new entry name: not empty, no `/` or NUL, not `.` or `..`, at most 255 bytes.
pub(crate) fn check_name(name: &str) -> Result<(), OpError> {
    if name.len() > NAME_BYTES_MAX {
        return Err(OpError::rejected(
            ErrorCode::NameTooLong,
            format!("name of {} bytes exceeds {NAME_BYTES_MAX}", name.len()),
        ));
    }
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(OpError::rejected(
            ErrorCode::InvalidArgument,
            format!("invalid name {name:?}"),
        ));
    }
    Ok(())
}

pub(crate) fn kind_code(kind: FileKind) -> u8 {
    match kind {
        FileKind::Regular => 1,
        FileKind::Directory => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

pub(crate) fn kind_from_code(code: u8) -> FileKind {
    match code {
        2 => FileKind::Directory,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        _ => FileKind::Regular,
    }
}

/// Reads an inode or fails with `NotFound`.
/// The slots of `inode`'s layout recorded as written ([`WRITTEN`]).
pub(crate) fn load_written(
    table: &Records<impl ReadableTable<u64, &'static [u8]>, SlotSet>,
    inode: InodeId,
) -> Result<SlotSet, OpError> {
    Ok(table.get(inode.0)?.unwrap_or_default())
}

/// Records the slots of `inode`'s layout that `change` makes of its written ones.
pub(crate) fn change_written(
    txn: &crate::store::WriteTransaction,
    inode: InodeId,
    change: impl FnOnce(&mut SlotSet),
) -> Result<(), OpError> {
    let mut table = WRITTEN.open(txn)?;
    let before = load_written(&table, inode)?;
    let mut after = before;
    change(&mut after);
    if after.is_empty() {
        table.remove(inode.0)?;
    } else if after != before {
        table.insert(inode.0, &after)?;
    }
    Ok(())
}

pub(crate) fn load_inode(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<InodeRecord, OpError> {
    match inodes.get(inode.0)? {
        Some(bytes) => InodeRecord::decode(inode.0, bytes.value()),
        None => Err(OpError::rejected(
            ErrorCode::NotFound,
            format!("inode {inode} does not exist"),
        )),
    }
}

/// Reads a directory or fails with `NotFound` / `NotDirectory`.
pub(crate) fn load_dir(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    inode: InodeId,
) -> Result<InodeRecord, OpError> {
    let record = load_inode(inodes, inode)?;
    if !record.is_dir() {
        return Err(OpError::rejected(
            ErrorCode::NotDirectory,
            format!("inode {inode} is not a directory"),
        ));
    }
    Ok(record)
}

/// Stores an inode, and what it uses ([`crate::schema::usage`]).
pub(crate) fn store_inode(
    inodes: &mut crate::schema::usage::Inodes<'_>,
    inode: InodeId,
    record: &InodeRecord,
) -> Result<(), OpError> {
    debug_assert_eq!(
        record.kind == FileKind::Regular,
        record.layout.is_some(),
        "inode {inode} ({:?}) stored with layout {:?}: a regular file has one, nothing else does",
        record.kind,
        record.layout
    );
    debug_assert!(
        record.kind == FileKind::Directory || (record.shards.is_empty() && record.shard_of == 0),
        "inode {inode} ({:?}) stored as a spread directory's shard or with shards",
        record.kind
    );
    inodes.store(inode, record)
}

/// A dentry as stored: the child it names, its cookie and the child's kind.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dentry {
    pub child: InodeId,
    pub cookie: u64,
    pub kind: FileKind,
}

/// The first cookie of `name`'s hash bucket; the bucket's slots follow it. FNV-1a over the
/// name, mixed (MurmurHash3's finalizer), cut to the bucket bits. Stable forever: entries stay
/// where it put them. Never below 256, so never 0 (the start of a listing), 1 or 2 (`.` and
/// `..`).
pub(crate) fn name_bucket(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    let bucket = (hash >> (64 - (COOKIE_BITS - SLOT_BITS))).max(1);
    bucket << SLOT_BITS
}

/// Whether `cookie` lies in `name`'s hash bucket, where lookups search for it.
pub(crate) fn cookie_fits_name(cookie: u64, name: &str) -> bool {
    cookie >> SLOT_BITS == name_bucket(name) >> SLOT_BITS
}

/// The cookies `name` may have in `parent`.
fn bucket_range(parent: InodeId, name: &str) -> std::ops::RangeInclusive<(u64, u64)> {
    let first = name_bucket(name);
    (parent.0, first)..=(parent.0, first + (1 << SLOT_BITS) - 1)
}

pub(crate) fn load_dentry(
    entries: &impl ReadableTable<(u64, u64), (u64, u8, &'static str)>,
    parent: InodeId,
    name: &str,
) -> Result<Option<Dentry>, OpError> {
    for item in entries.range(bucket_range(parent, name))? {
        let (key, value) = item?;
        let (child, kind, stored) = value.value();
        if stored == name {
            return Ok(Some(Dentry {
                child: InodeId(child),
                cookie: key.value().1,
                kind: kind_from_code(kind),
            }));
        }
    }
    Ok(None)
}

/// The first free cookie of `name`'s bucket in `parent`.
fn free_cookie(
    entries: &impl ReadableTable<(u64, u64), (u64, u8, &'static str)>,
    parent: InodeId,
    name: &str,
) -> Result<u64, OpError> {
    let range = bucket_range(parent, name);
    let ((_, mut cookie), (_, last)) = (*range.start(), *range.end());
    for item in entries.range(range)? {
        if item?.0.value().1 != cookie {
            break;
        }
        cookie += 1;
    }
    if cookie > last {
        return Err(OpError::rejected(
            ErrorCode::NoSpace,
            format!("directory {parent} has too many names with the hash of {name:?}"),
        ));
    }
    Ok(cookie)
}

/// Inserts a dentry at a free cookie of its name's bucket; the caller stores the directory
/// after (its times change).
pub(crate) fn insert_dentry(
    entries: &mut Entries<'_>,
    parent: InodeId,
    parent_record: &InodeRecord,
    name: &str,
    child: InodeId,
    kind: FileKind,
) -> Result<(), OpError> {
    debug_assert!(
        parent_record.is_dir(),
        "an entry {name:?} was added to {parent}, which is a {:?}",
        parent_record.kind
    );
    if let Err(OpError::Rejected(error)) = parent_record.accepts_new_name(parent, name) {
        // Callers check before they write: a rejection now would commit half an operation.
        return Err(OpError::inconsistent(format!(
            "an entry was added without its checks: {}",
            error.message
        )));
    }
    // A full bucket is not among the callers' checks either: the batch is abandoned rather
    // than half of this operation committed.
    let cookie = free_cookie(entries, parent, name).map_err(|error| match error {
        OpError::Rejected(error) => OpError::inconsistent(error.message),
        store => store,
    })?;
    entries.insert((parent.0, cookie), (child.0, kind_code(kind), name))?;
    Ok(())
}

/// Makes an existing dentry name `child` of `kind`, at the cookie it has.
pub(crate) fn replace_dentry(
    entries: &mut Entries<'_>,
    parent: InodeId,
    name: &str,
    dentry: Dentry,
) -> Result<(), OpError> {
    entries.insert(
        (parent.0, dentry.cookie),
        (dentry.child.0, kind_code(dentry.kind), name),
    )?;
    Ok(())
}

pub(crate) fn remove_dentry(
    entries: &mut Entries<'_>,
    parent: InodeId,
    dentry: Dentry,
) -> Result<(), OpError> {
    entries.remove((parent.0, dentry.cookie))?;
    Ok(())
}

/// Takes `dentry`'s name out of directory `parent`, whose `record` gets its times moved and,
/// for a subdirectory's name, one link fewer; stores the directory and returns its record.
pub(crate) fn take_name(
    inodes: &mut crate::schema::usage::Inodes<'_>,
    entries: &mut Entries<'_>,
    (parent, mut record): (InodeId, InodeRecord),
    dentry: Dentry,
) -> Result<InodeRecord, OpError> {
    remove_dentry(entries, parent, dentry)?;
    if dentry.kind == FileKind::Directory {
        record.nlink = record.nlink.saturating_sub(1);
    }
    record.touch(now());
    store_inode(inodes, parent, &record)?;
    Ok(record)
}

/// Whether a directory has any entry.
pub(crate) fn dir_is_empty(
    entries: &impl ReadableTable<(u64, u64), (u64, u8, &'static str)>,
    dir: InodeId,
) -> Result<bool, OpError> {
    Ok(entries
        .range((dir.0, 0)..=(dir.0, u64::MAX))?
        .next()
        .is_none())
}

/// Allocates the next inode id of this home.
pub(crate) fn allocate_inode(
    counters: &mut Table<&'static str, u64>,
    home: weft_proto::NodeId,
) -> Result<InodeId, OpError> {
    let next = counters.get("inode")?.map(|v| v.value()).unwrap_or(1) + 1;
    counters.insert("inode", next)?;
    Ok(InodeId::new(home, next))
}

/// The counter of the home's numbered changes ([`number_change`]).
const CHANGE_COUNTER: &str = "change";

/// The number of the last change a client made at this home (0 before the first): its
/// changes are numbered one by one, in the order they were made, and the number is kept with
/// them, so the start after a crash knows the last one on disk.
pub(crate) fn last_change_number(
    counters: &impl crate::store::ReadableTable<&'static str, u64>,
) -> Result<u64, OpError> {
    Ok(counters
        .get(CHANGE_COUNTER)?
        .map_or(0, |number| number.value()))
}

/// Makes this start (`incarnation`) the one the home ran with, in `txn`: answers the one it
/// ran with before (0 for none).
pub(crate) fn swap_incarnation(
    txn: &crate::store::WriteTransaction,
    incarnation: u64,
) -> Result<u64, OpError> {
    let mut counters = txn.open_table(COUNTERS)?;
    let previous = counters
        .get("incarnation")?
        .map_or(0, |value| value.value());
    counters.insert("incarnation", incarnation)?;
    Ok(previous)
}

/// The start whose changes answered before their sync a recovery waits for (0: none): kept
/// until the recovery window closes, so that a start ending during it leaves the same
/// recovery to the next.
pub(crate) fn recovering(txn: &crate::store::WriteTransaction) -> Result<u64, OpError> {
    Ok(txn
        .open_table(COUNTERS)?
        .get("recovering")?
        .map_or(0, |value| value.value()))
}

/// Records the start a recovery waits for the changes of (0: none).
pub(crate) fn set_recovering(
    txn: &crate::store::WriteTransaction,
    start: u64,
) -> Result<(), OpError> {
    txn.open_table(COUNTERS)?.insert("recovering", start)?;
    Ok(())
}

/// Moves the home's inode counter `by` numbers on: past the numbers changes lost with their
/// clients may have handed out, which other clients may hold.
pub(crate) fn skip_inodes(txn: &crate::store::WriteTransaction, by: u64) -> Result<(), OpError> {
    let mut counters = txn.open_table(COUNTERS)?;
    let next = counters.get("inode")?.map_or(1, |value| value.value()) + by;
    counters.insert("inode", next)?;
    Ok(())
}

/// Numbers a client's change made in `txn`: one above the last.
pub(crate) fn number_change(txn: &crate::store::WriteTransaction) -> Result<u64, OpError> {
    let mut counters = txn.open_table(COUNTERS)?;
    let number = last_change_number(&counters)? + 1;
    counters.insert(CHANGE_COUNTER, number)?;
    Ok(number)
}

/// Refuses `mutation` when its client said before that every mutation below a higher number
/// was answered: its reply was dropped then, and a copy arriving this late (a retry's
/// original, delayed in the network) must not run a second time. `Superseded`: the client
/// had its answer long ago.
pub(crate) fn refuse_settled(
    txn: &crate::store::WriteTransaction,
    mutation: weft_proto::messages::MutationId,
) -> Result<(), OpError> {
    let floor = txn
        .open_table(REPLY_FLOORS)?
        .get(mutation.client.0)?
        .map_or(0, |floor| floor.value());
    if mutation.seq < floor {
        return Err(OpError::rejected(
            ErrorCode::Superseded,
            format!(
                "mutation {} of client session {} arrived after the session said every mutation below {floor} was answered: a late copy, not run again",
                mutation.seq, mutation.client
            ),
        ));
    }
    Ok(())
}
