//! The metadata store's tables, as every operation and every read sees them.
//!
//! Operations open tables in a [`WriteTransaction`] (the commit thread's batch), reads in a
//! [`ReadTransaction`] (a snapshot of the last commit), by the same typed definitions as redb's
//! ([`TableDefinition`]) and with the same vocabulary: [`Table`], [`ReadOnlyTable`], the
//! [`ReadableTable`] trait both implement, [`AccessGuard`] for a key or a value, [`Range`] for
//! rows in key order. Nothing outside this module names redb's own table types: where rows
//! live between a change and the disk is this module's business alone, so that the store
//! under the tables can change without touching an operation.
//!
//! A batch's changes are rows in memory: each changed key's newest value, or its removal,
//! per table ([`Changes`], persistent maps whose copies share their structure). A read in the
//! batch looks there first, then in the tables of the last checkpoint ([`Tables`], one redb
//! read transaction every batch and read shares until the next checkpoint). A batch is
//! logged as one append, and its rows reach the store's pages later, at a checkpoint: only a
//! checkpoint's commit writes them into a redb write transaction and commits that
//! (docs/design/crash-consistency.md, "The store's changes").
//!
//! Errors are redb's ([`StorageError`], [`TableError`]), which the schema's `OpError` and
//! `StoreError` already take.

use crate::schema::StoreError;
use imbl::OrdMap;
use std::borrow::Borrow;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::iter::Peekable;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

mod log;

use log::Log;
pub(crate) use log::{discard as discard_log, log_path, EpochFile, Header};

pub(crate) use redb::{Durability, StorageError, TableDefinition, TableError};

/// The type of a table's keys: redb's, and shareable between threads, as the tables opened
/// in a checkpoint's snapshot are ([`Tables`]).
pub(crate) trait Key: redb::Key + Send + Sync {}

impl<T: redb::Key + Send + Sync> Key for T {}

/// The type of a table's values, as [`Key`].
pub(crate) trait Value: redb::Value + Send + Sync {}

impl<T: redb::Value + Send + Sync> Value for T {}

/// The bytes of a changed key or value.
type Bytes = Arc<[u8]>;

/// A failure to read, write or sync the change log, as the store reports it.
fn log_failed(error: std::io::Error) -> StoreError {
    StoreError::Sync(Arc::new(error))
}

/// Rows of a table `name` that this build does not have, read back from the log or a replay.
fn unknown_table(name: &str) -> StoreError {
    log_failed(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("rows of a table {name:?} this build does not have"),
    ))
}

/// A key's bytes, ordered as its table orders its keys.
#[derive(Clone)]
struct OrderedKey {
    bytes: Bytes,
    order: fn(&[u8], &[u8]) -> Ordering,
}

impl OrderedKey {
    fn of<K: Key>(key: &K::SelfType<'_>) -> OrderedKey {
        OrderedKey {
            bytes: Arc::from(K::as_bytes(key).as_ref()),
            order: K::compare,
        }
    }
}

impl PartialEq for OrderedKey {
    fn eq(&self, other: &OrderedKey) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for OrderedKey {}

impl PartialOrd for OrderedKey {
    fn partial_cmp(&self, other: &OrderedKey) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedKey {
    fn cmp(&self, other: &OrderedKey) -> Ordering {
        (self.order)(&self.bytes, &other.bytes)
    }
}

/// A key's bytes, borrowed for a lookup.
struct Probe<'a> {
    bytes: &'a [u8],
    order: fn(&[u8], &[u8]) -> Ordering,
}

/// What `key` was changed to in `rows`: `None` if it was not changed, `Some(None)` if it was
/// removed.
fn changed<K: Key>(rows: &Rows, key: &K::SelfType<'_>) -> Option<Option<Bytes>> {
    let bytes = K::as_bytes(key);
    let probe = Probe {
        bytes: bytes.as_ref(),
        order: K::compare,
    };
    rows.get(&probe).cloned()
}

impl equivalent::Equivalent<OrderedKey> for Probe<'_> {
    fn equivalent(&self, key: &OrderedKey) -> bool {
        (self.order)(self.bytes, &key.bytes) == Ordering::Equal
    }
}

impl equivalent::Comparable<OrderedKey> for Probe<'_> {
    fn compare(&self, key: &OrderedKey) -> Ordering {
        (self.order)(self.bytes, &key.bytes)
    }
}

/// The changed rows of one table: each key's newest value, or `None` for a row removed.
type Rows = OrdMap<OrderedKey, Option<Bytes>>;

/// How the rows of one table are ordered and written into redb: the table's types, kept
/// apart from them.
#[derive(Clone, Copy)]
struct TableType {
    order: fn(&[u8], &[u8]) -> Ordering,
    /// Writes rows into the table in a redb transaction (made for the table's types).
    apply: fn(&redb::WriteTransaction, &str, &Rows) -> Result<(), StoreError>,
    /// Whether the tables of a checkpoint hold a row of a key's bytes.
    holds: fn(&Tables, &str, &[u8]) -> Result<bool, StoreError>,
}

impl TableType {
    fn of<K: Key + 'static, V: Value + 'static>() -> TableType {
        TableType {
            order: K::compare,
            apply: apply_rows::<K, V>,
            holds: holds_row::<K, V>,
        }
    }
}

fn holds_row<K: Key + 'static, V: Value + 'static>(
    tables: &Tables,
    name: &str,
    key: &[u8],
) -> Result<bool, StoreError> {
    let Some(table) = tables.table(TableDefinition::<K, V>::new(name))? else {
        return Ok(false);
    };
    let holds = redb::ReadableTable::get(table.as_ref(), K::from_bytes(key))?.is_some();
    Ok(holds)
}

/// What has changed in one table.
#[derive(Clone)]
struct TableChanges {
    rows: Rows,
    /// Rows the changes add to the store's count of the table (a removal takes one off).
    added: i64,
    kind: TableType,
}

fn apply_rows<K: Key + 'static, V: Value + 'static>(
    txn: &redb::WriteTransaction,
    name: &str,
    rows: &Rows,
) -> Result<(), StoreError> {
    let mut table = txn.open_table(TableDefinition::<K, V>::new(name))?;
    for (key, value) in rows {
        let key = K::from_bytes(&key.bytes);
        match value {
            Some(value) => drop(table.insert(key, V::from_bytes(value))?),
            None => drop(table.remove(key)?),
        }
    }
    Ok(())
}

/// Changed rows, by table name.
#[derive(Clone, Default)]
struct Changes(HashMap<String, TableChanges>);

impl Changes {
    /// Makes `value` the value of `key` in table `name` (`None`: removes it), where `added`
    /// says how the table's count of rows changes.
    fn set(
        &mut self,
        (name, kind): (&str, TableType),
        (key, value): (OrderedKey, Option<Bytes>),
        added: i64,
    ) {
        let table = match self.0.get_mut(name) {
            Some(table) => table,
            None => self.0.entry(name.to_owned()).or_insert(TableChanges {
                rows: Rows::new(),
                added: 0,
                kind,
            }),
        };
        table.added += added;
        table.rows.insert(key, value);
    }

    /// Removes `key` of table `name`, which the store's tables do not hold: the change is
    /// forgotten instead of kept as a removal, so that scans do not pass over it.
    fn forget(&mut self, name: &str, key: &OrderedKey) {
        if let Some(table) = self.0.get_mut(name) {
            if table.rows.remove(key).is_some() {
                table.added -= 1;
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Writes every row into `txn`.
    fn apply(&self, txn: &redb::WriteTransaction) -> Result<(), StoreError> {
        for (name, table) in &self.0 {
            (table.kind.apply)(txn, name, &table.rows)?;
        }
        Ok(())
    }
}

/// The store as of the last commit, as every read and every batch starts from it: the tables
/// as of the last checkpoint, and the rows changed since, which a read lays over them.
struct Published {
    changes: Changes,
    /// The number of the checkpoint the rows were changed after.
    after: u64,
    tables: Arc<Tables>,
}

/// The store's tables as of a checkpoint: one redb read transaction, shared by every read and
/// batch until the next checkpoint replaces it, and the tables opened in it so far. A batch
/// reads its tables here and keeps its changes in memory: it opens no redb transaction of its
/// own unless its commit is a checkpoint, so that a logged change costs no walk of redb's
/// table of tables, no transaction and no page.
struct Tables {
    redb: Mutex<redb::ReadTransaction>,
    /// The tables opened so far, by name: each a `redb::ReadOnlyTable` of its types.
    opened: Mutex<HashMap<String, Arc<dyn std::any::Any + Send + Sync>>>,
}

impl Tables {
    /// The tables of `db`'s last commit.
    fn of(db: &redb::Database) -> Result<Tables, StoreError> {
        Ok(Tables {
            redb: Mutex::new(db.begin_read()?),
            opened: Mutex::default(),
        })
    }

    /// Table `definition` as of the checkpoint; none if it did not exist then.
    fn table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Option<Arc<redb::ReadOnlyTable<K, V>>>, TableError> {
        let name = redb::TableHandle::name(&definition);
        let known = self
            .opened
            .lock()
            .expect("opened tables poisoned")
            .get(name)
            .cloned();
        // A name opened with other types is opened again, and redb checks them.
        if let Some(table) = known.and_then(|table| table.downcast().ok()) {
            return Ok(Some(table));
        }
        let table = match self
            .redb
            .lock()
            .expect("snapshot poisoned")
            .open_table(definition)
        {
            Ok(table) => Arc::new(table),
            Err(TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(error) => return Err(error),
        };
        self.opened
            .lock()
            .expect("opened tables poisoned")
            .insert(name.to_owned(), Arc::clone(&table) as _);
        Ok(Some(table))
    }
}

/// Which checkpoint the store's tables hold: a row of its own, written by each checkpoint
/// made while the log's epoch has records. Its number grows with each checkpoint that wrote
/// logged rows, and its log position (epoch, next record) says which records the tables hold
/// already: a start writes only those after it, since rows written again over a checkpoint
/// that holds newer values (the checkpoint's own batch is not logged) would undo them.
const CHECKPOINT: TableDefinition<(), (u64, u64, u64)> = TableDefinition::new("store_checkpoint");

/// A row of [`CHECKPOINT`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checkpoint {
    number: u64,
    /// The log's epoch and next record when it was made.
    position: (u64, u64),
}

/// The checkpoint the tables of `txn`'s snapshot hold.
fn checkpoint_of(txn: &redb::ReadTransaction) -> Result<Checkpoint, StoreError> {
    match txn.open_table(CHECKPOINT) {
        Ok(table) => Ok(redb::ReadableTable::get(&table, ())?.map_or(
            Checkpoint::default(),
            |row| {
                let (number, epoch, seq) = row.value();
                Checkpoint {
                    number,
                    position: (epoch, seq),
                }
            },
        )),
        Err(TableError::TableDoesNotExist(_)) => Ok(Checkpoint::default()),
        Err(error) => Err(error.into()),
    }
}

/// Records `checkpoint` in `txn`.
fn write_checkpoint(
    txn: &redb::WriteTransaction,
    checkpoint: Checkpoint,
) -> Result<(), StoreError> {
    let (epoch, seq) = checkpoint.position;
    txn.open_table(CHECKPOINT)?
        .insert((), (checkpoint.number, epoch, seq))?;
    Ok(())
}

/// A value or a key read from a table.
pub(crate) struct AccessGuard<'a, V: Value + 'static>(Guarded<'a, V>);

enum Guarded<'a, V: Value + 'static> {
    /// Read from the store.
    Stored(redb::AccessGuard<'a, V>),
    /// Read from the changes.
    Changed(Bytes),
}

impl<V: Value + 'static> AccessGuard<'_, V> {
    /// The value, borrowed from the guard.
    pub(crate) fn value(&self) -> V::SelfType<'_> {
        match &self.0 {
            Guarded::Stored(guard) => guard.value(),
            Guarded::Changed(bytes) => V::from_bytes(bytes),
        }
    }

    fn stored(guard: redb::AccessGuard<'_, V>) -> AccessGuard<'_, V> {
        AccessGuard(Guarded::Stored(guard))
    }

    fn changed<'a>(bytes: Bytes) -> AccessGuard<'a, V> {
        AccessGuard(Guarded::Changed(bytes))
    }
}

/// A key and its value.
pub(crate) type Row<'a, K, V> = (AccessGuard<'a, K>, AccessGuard<'a, V>);

fn stored_row<'a, K: Key + 'static, V: Value + 'static>(
    (key, value): (redb::AccessGuard<'a, K>, redb::AccessGuard<'a, V>),
) -> Row<'a, K, V> {
    (AccessGuard::stored(key), AccessGuard::stored(value))
}

/// The bounds of a range of keys, as ordered keys.
type KeyBounds = (Bound<OrderedKey>, Bound<OrderedKey>);

fn key_bounds<'a, K: Key + 'static, KR: Borrow<K::SelfType<'a>> + 'a>(
    range: &impl RangeBounds<KR>,
) -> KeyBounds {
    let bound = |bound: Bound<&KR>| bound.map(|key| OrderedKey::of::<K>(key.borrow()));
    (bound(range.start_bound()), bound(range.end_bound()))
}

/// The changed rows of a range not yet gone through: a copy of the table's changes (it
/// shares their structure), and the bounds of what is left.
struct ChangedRange {
    rows: Rows,
    left: KeyBounds,
}

impl ChangedRange {
    fn next(&mut self) -> Option<(OrderedKey, Option<Bytes>)> {
        let (start, end) = &self.left;
        let (key, value) = self
            .rows
            .range::<_, OrderedKey>((start.as_ref(), end.as_ref()))
            .next()?;
        let (key, value) = (key.clone(), value.clone());
        self.left.0 = Bound::Excluded(key.clone());
        Some((key, value))
    }
}

/// Rows of a table in key order: its stored rows with its changes laid over them.
pub(crate) struct Range<'a, K: Key + 'static, V: Value + 'static> {
    stored: Option<Peekable<redb::Range<'a, K, V>>>,
    changed: Option<ChangedRange>,
    /// The next changed row, taken from `changed` and not yet yielded.
    next_changed: Option<(OrderedKey, Option<Bytes>)>,
}

impl<'a, K: Key + 'static, V: Value + 'static> Range<'a, K, V> {
    fn new(stored: Option<redb::Range<'a, K, V>>, changed: Option<ChangedRange>) -> Self {
        Range {
            stored: stored.map(Iterator::peekable),
            changed,
            next_changed: None,
        }
    }
}

impl<'a, K: Key + 'static, V: Value + 'static> Iterator for Range<'a, K, V> {
    type Item = Result<Row<'a, K, V>, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.next_changed.is_none() {
                self.next_changed = self.changed.as_mut().and_then(ChangedRange::next);
            }
            let stored = self.stored.as_mut();
            let order = match (&self.next_changed, stored) {
                (None, None) => return None,
                (None, Some(stored)) => return stored.next().map(|item| item.map(stored_row)),
                (Some(_), None) => Ordering::Less,
                (Some((key, _)), Some(stored)) => match stored.peek() {
                    None => Ordering::Less,
                    Some(Err(_)) => Ordering::Greater,
                    Some(Ok((stored_key, _))) => {
                        (key.order)(&key.bytes, K::as_bytes(&stored_key.value()).as_ref())
                    }
                },
            };
            if order == Ordering::Greater {
                let stored = self.stored.as_mut()?;
                return stored.next().map(|item| item.map(stored_row));
            }
            if order == Ordering::Equal {
                // The change replaces the stored row.
                self.stored.as_mut().and_then(Iterator::next);
            }
            let (key, value) = self.next_changed.take()?;
            if let Some(value) = value {
                return Some(Ok((
                    AccessGuard::changed(key.bytes),
                    AccessGuard::changed(value),
                )));
            }
        }
    }
}

/// What a table opened for reading or for changes answers.
pub(crate) trait ReadableTable<K: Key + 'static, V: Value + 'static> {
    /// The value of `key`, if it has one.
    fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError>;

    /// The rows whose keys are in `range`, in key order.
    fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a;

    /// The row of the lowest key.
    fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError>;

    /// How many rows.
    fn len(&self) -> Result<u64, StorageError>;

    /// Every row, in key order.
    fn iter(&self) -> Result<Range<'_, K, V>, StorageError> {
        self.range::<K::SelfType<'_>>(..)
    }
}

/// The value of `key`: as `changes` changed it, or as `stored` holds it.
fn merged_get<'t, K: Key + 'static, V: Value + 'static>(
    changes: Option<&TableChanges>,
    stored: Option<&'t impl redb::ReadableTable<K, V>>,
    key: &K::SelfType<'_>,
) -> Result<Option<AccessGuard<'t, V>>, StorageError> {
    match changes.and_then(|table| changed::<K>(&table.rows, key)) {
        Some(value) => Ok(value.map(AccessGuard::changed)),
        None => match stored {
            Some(stored) => Ok(stored.get(key)?.map(AccessGuard::stored)),
            None => Ok(None),
        },
    }
}

/// The rows in `range`: `changes` laid over `stored`.
fn merged_range<'t, 'a, K: Key + 'static, V: Value + 'static, KR>(
    changes: Option<&TableChanges>,
    stored: Option<&'t impl redb::ReadableTable<K, V>>,
    range: impl RangeBounds<KR> + 'a,
) -> Result<Range<'t, K, V>, StorageError>
where
    KR: Borrow<K::SelfType<'a>> + 'a,
{
    let changed = changes.map(|table| ChangedRange {
        rows: table.rows.clone(),
        left: key_bounds::<K, KR>(&range),
    });
    let stored = match stored {
        Some(stored) => Some(stored.range(range)?),
        None => None,
    };
    Ok(Range::new(stored, changed))
}

/// How many rows: `stored`'s, and those `changes` added.
fn merged_len<K: Key + 'static, V: Value + 'static>(
    changes: Option<&TableChanges>,
    stored: Option<&impl redb::ReadableTable<K, V>>,
) -> Result<u64, StorageError> {
    let added = changes.map_or(0, |table| table.added);
    let stored = match stored {
        Some(stored) => stored.len()?,
        None => 0,
    };
    Ok(stored.saturating_add_signed(added))
}

/// A table opened for changes in a [`WriteTransaction`]: its stored rows, read through the
/// transaction's changes, which its own changes join.
pub(crate) struct Table<'txn, K: Key + 'static, V: Value + 'static> {
    /// As of the last checkpoint; none if the table did not exist then.
    stored: Option<Arc<redb::ReadOnlyTable<K, V>>>,
    name: String,
    txn: &'txn WriteTransaction,
}

impl<K: Key + 'static, V: Value + 'static> ReadableTable<K, V> for Table<'_, K, V> {
    fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let changes = self.txn.changes.borrow();
        merged_get(
            changes.0.get(&self.name),
            self.stored.as_deref(),
            key.borrow(),
        )
    }

    fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let changes = self.txn.changes.borrow();
        merged_range(changes.0.get(&self.name), self.stored.as_deref(), range)
    }

    fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError> {
        self.iter()?.next().transpose()
    }

    fn len(&self) -> Result<u64, StorageError> {
        let changes = self.txn.changes.borrow();
        merged_len(changes.0.get(&self.name), self.stored.as_deref())
    }
}

impl<K: Key + 'static, V: Value + 'static> Table<'_, K, V> {
    /// Makes `value` the value of `key`; answers the value it replaced.
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let key = key.borrow();
        let replaced = self.get(key)?;
        let value: Bytes = Arc::from(V::as_bytes(value.borrow()).as_ref());
        let added = if replaced.is_some() { 0 } else { 1 };
        self.txn
            .change::<K, V>(&self.name, (OrderedKey::of::<K>(key), Some(value)), added);
        Ok(replaced)
    }

    /// Removes the row of `key`; answers its value.
    pub(crate) fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let key = key.borrow();
        let removed = self.get(key)?;
        if removed.is_some() {
            let stored = self.holds_stored(key)?;
            self.txn
                .remove::<K, V>(&self.name, OrderedKey::of::<K>(key), stored);
        }
        Ok(removed)
    }

    /// Whether the table held `key` at the last checkpoint.
    fn holds_stored(&self, key: &K::SelfType<'_>) -> Result<bool, StorageError> {
        match &self.stored {
            Some(stored) => Ok(redb::ReadableTable::get(stored.as_ref(), key)?.is_some()),
            None => Ok(false),
        }
    }

    /// Keeps the rows in `range` that `keep` answers true for, and removes the others there.
    pub(crate) fn retain_in<'a, KR, F>(
        &mut self,
        range: impl RangeBounds<KR> + 'a,
        mut keep: F,
    ) -> Result<(), StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
        F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool,
    {
        let mut removed = Vec::new();
        for row in self.range(range)? {
            let (key, value) = row?;
            if !keep(key.value(), value.value()) {
                let stored = self.holds_stored(&key.value())?;
                removed.push((OrderedKey::of::<K>(&key.value()), stored));
            }
        }
        for (key, stored) in removed {
            self.txn.remove::<K, V>(&self.name, key, stored);
        }
        Ok(())
    }
}

/// A table opened for reading in a [`ReadTransaction`]: its stored rows as of the snapshot,
/// with the rows changed since the store's last checkpoint laid over them.
pub(crate) struct ReadOnlyTable<K: Key + 'static, V: Value + 'static> {
    stored: Arc<redb::ReadOnlyTable<K, V>>,
    changes: Option<TableChanges>,
}

impl<K: Key + 'static, V: Value + 'static> ReadableTable<K, V> for ReadOnlyTable<K, V> {
    fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        merged_get(
            self.changes.as_ref(),
            Some(self.stored.as_ref()),
            key.borrow(),
        )
    }

    fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        merged_range(self.changes.as_ref(), Some(self.stored.as_ref()), range)
    }

    fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError> {
        self.iter()?.next().transpose()
    }

    fn len(&self) -> Result<u64, StorageError> {
        merged_len(self.changes.as_ref(), Some(self.stored.as_ref()))
    }
}

/// How a batch's changes reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Commit {
    /// Appended to the store's log as one record (synced there if `sync`), its rows kept in
    /// memory until a checkpoint writes them into the tables. A store without a log, or a
    /// record the log has no room for, makes a checkpoint instead.
    Logged { sync: bool },
    /// A checkpoint: every row changed since the last one written into the tables in one redb
    /// transaction, which waits for the disk if `durable`.
    Checkpoint { durable: bool },
}

/// How a commit went: which of the two it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wrote {
    /// The record is in the log, synced if its commit asked for it.
    Logged,
    /// A checkpoint committed; it wrote rows logged before it if `of_logged` (the log can then
    /// restart once the checkpoint is on disk: [`Store::restart_log`]).
    Checkpoint { of_logged: bool },
}

/// The commit thread's transaction: every operation of a batch changes its tables, and the
/// batch commits them together. It reads the tables of the last checkpoint ([`Tables`]) under
/// the rows changed since, and opens a redb write transaction only for what needs one: a
/// checkpoint's commit, and the names or the deletion of tables (a store's upgrade). One at a
/// time: a second waits for the first to end.
pub(crate) struct WriteTransaction {
    tables: Arc<Tables>,
    /// redb's, once begun; the tables it deleted make the commit a checkpoint.
    redb: std::cell::OnceCell<redb::WriteTransaction>,
    deleted: RefCell<Vec<String>>,
    /// The rows changed since the last checkpoint, this batch's with them.
    changes: RefCell<Changes>,
    /// The batch's changes in the order made: its record in the log.
    record: RefCell<Vec<u8>>,
    /// The tables it opened that no commit opened before since the store opened, which redb
    /// may not hold yet: its commit is then a checkpoint, so that every table a read opens
    /// exists, and the checkpoint registers their types.
    new_tables: RefCell<Vec<(String, TableType)>>,
    store: Arc<Shared>,
    _turn: Turn,
}

/// A write transaction's turn to change the store, given back when it ends.
struct Turn(Arc<Shared>);

impl Turn {
    /// Waits until no other write transaction of the store runs, and takes the turn.
    fn take(shared: &Arc<Shared>) -> Turn {
        let mut taken = shared.turn.lock().expect("write turn poisoned");
        while *taken {
            taken = shared.turn_freed.wait(taken).expect("write turn poisoned");
        }
        *taken = true;
        Turn(Arc::clone(shared))
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *self.0.turn.lock().expect("write turn poisoned") = false;
        self.0.turn_freed.notify_one();
    }
}

impl WriteTransaction {
    /// Opens `definition` for changes; a table that does not exist yet is made.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'_, K, V>, TableError> {
        let name = redb::TableHandle::name(&definition);
        let known = self
            .store
            .types
            .lock()
            .expect("table types poisoned")
            .contains_key(name);
        if !known {
            self.new_tables
                .borrow_mut()
                .push((name.to_owned(), TableType::of::<K, V>()));
        }
        // A table deleted in this transaction holds only what was written since.
        let deleted = self.deleted.borrow().iter().any(|gone| gone == name);
        Ok(Table {
            stored: if deleted {
                None
            } else {
                self.tables.table(definition)?
            },
            name: name.to_owned(),
            txn: self,
        })
    }

    /// redb's own write transaction, begun at the first call.
    fn redb(&self) -> Result<&redb::WriteTransaction, StoreError> {
        if self.redb.get().is_none() {
            let _ = self.redb.set(self.store.db.begin_write()?);
        }
        Ok(self.redb.get().expect("just begun"))
    }

    fn change<K: Key + 'static, V: Value + 'static>(
        &self,
        name: &str,
        (key, value): (OrderedKey, Option<Bytes>),
        added: i64,
    ) {
        self.change_of((name, TableType::of::<K, V>()), (key, value), added);
    }

    fn change_of(
        &self,
        (name, kind): (&str, TableType),
        (key, value): (OrderedKey, Option<Bytes>),
        added: i64,
    ) {
        log::encode_row(
            &mut self.record.borrow_mut(),
            name,
            &key.bytes,
            value.as_deref(),
        );
        self.changes
            .borrow_mut()
            .set((name, kind), (key, value), added);
    }

    /// Removes `key`, which the stored table holds if `stored`: a removal is kept (and laid
    /// over the stored row) only then.
    fn remove<K: Key + 'static, V: Value + 'static>(
        &self,
        name: &str,
        key: OrderedKey,
        stored: bool,
    ) {
        self.remove_of((name, TableType::of::<K, V>()), key, stored);
    }

    fn remove_of(&self, (name, kind): (&str, TableType), key: OrderedKey, stored: bool) {
        if stored {
            self.change_of((name, kind), (key, None), -1);
        } else {
            log::encode_row(&mut self.record.borrow_mut(), name, &key.bytes, None);
            self.changes.borrow_mut().forget(name, &key);
        }
    }

    /// Where the rows changed so far end: those changed after are [`WriteTransaction::rows_since`]
    /// it.
    pub(crate) fn mark(&self) -> usize {
        self.record.borrow().len()
    }

    /// The rows changed since `mark`, in the order made and the log's encoding: one change's
    /// rows, which [`WriteTransaction::apply_rows`] makes again.
    pub(crate) fn rows_since(&self, mark: usize) -> Vec<u8> {
        self.record.borrow()[mark..].to_vec()
    }

    /// Makes the rows of `rows` (from [`WriteTransaction::rows_since`], in this store) again,
    /// in order, as the change that made them did.
    ///
    /// # Errors
    /// The rows do not decode, or name a table this store does not have.
    pub(crate) fn apply_rows(&self, rows: &[u8]) -> Result<(), StoreError> {
        let rows = log::decode_rows(rows).ok_or_else(|| {
            log_failed(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a change's rows do not decode",
            ))
        })?;
        for (table, key, value) in rows {
            let kind = self.table_type(&table)?;
            let key = OrderedKey {
                bytes: Arc::from(key),
                order: kind.order,
            };
            let changed = self
                .changes
                .borrow()
                .0
                .get(&table)
                .and_then(|changes| changes.rows.get(&key).cloned());
            let stored = (kind.holds)(&self.tables, &table, &key.bytes)?;
            let holds = changed.map_or(stored, |value| value.is_some());
            match value {
                Some(value) => self.change_of(
                    (&table, kind),
                    (key, Some(Arc::from(value))),
                    i64::from(!holds),
                ),
                None if holds => self.remove_of((&table, kind), key, stored),
                None => {}
            }
        }
        Ok(())
    }

    /// The type of table `name`, which a commit opened since the store opened.
    fn table_type(&self, name: &str) -> Result<TableType, StoreError> {
        let known = self
            .store
            .types
            .lock()
            .expect("table types poisoned")
            .get(name)
            .copied();
        known
            .or_else(|| {
                self.new_tables
                    .borrow()
                    .iter()
                    .find(|(new, _)| new == name)
                    .map(|(_, kind)| *kind)
            })
            .ok_or_else(|| unknown_table(name))
    }

    /// The names of the tables the store holds, without those first opened in this
    /// transaction, for a store's upgrade.
    pub(crate) fn list_tables(
        &self,
    ) -> Result<impl Iterator<Item = redb::UntypedTableHandle> + '_, StoreError> {
        Ok(self.redb()?.list_tables()?)
    }

    /// Deletes a table and its changes, for a store's upgrade; answers whether it existed.
    /// The commit that deletes one is a checkpoint.
    pub(crate) fn delete_table(&self, table: impl redb::TableHandle) -> Result<bool, StoreError> {
        self.changes.borrow_mut().0.remove(table.name());
        self.deleted.borrow_mut().push(table.name().to_owned());
        Ok(self.redb()?.delete_table(table)?)
    }

    /// Drops every change made in the transaction.
    pub(crate) fn abort(self) -> Result<(), StorageError> {
        match self.redb.into_inner() {
            Some(redb) => redb.abort(),
            None => Ok(()),
        }
    }

    /// Commits every change made in the transaction, as `how` says.
    ///
    /// # Errors
    /// The log or the store could not be written; nothing of the batch is then visible.
    pub(crate) fn commit(mut self, how: Commit) -> Result<Wrote, StoreError> {
        let record = self.record.take();
        let changes = self.changes.take();
        let store = Arc::clone(&self.store);
        // A batch that cannot be logged is a checkpoint (the commit thread asks first:
        // `Store::can_log`).
        let how = match how {
            Commit::Logged { .. }
                if !self.new_tables.borrow().is_empty() || !self.deleted.borrow().is_empty() =>
            {
                Commit::Checkpoint { durable: true }
            }
            how => how,
        };
        if let Commit::Logged { sync } = how {
            if let Some(redb) = self.redb.take() {
                // Begun only to list the tables.
                redb.abort()?;
            }
            if record.is_empty() {
                // Nothing changed: nothing to log, and nothing new to publish.
                if sync {
                    store.sync_log()?;
                }
                return Ok(Wrote::Logged);
            }
            let fits = store
                .log
                .lock()
                .expect("store log poisoned")
                .as_ref()
                .is_some_and(|log| log.fits(record.len()));
            if fits {
                store
                    .log
                    .lock()
                    .expect("store log poisoned")
                    .as_mut()
                    .map_or(Ok(()), |log| log.append(&record))
                    .map_err(log_failed)?;
                if sync {
                    // Seen by reads only once on disk, as a commit synced before its answer
                    // always was; a failed sync publishes nothing (the log refuses every later
                    // record, and the home is opened again).
                    store.sync_log()?;
                    // A crash here loses nothing answered, and the record is on disk.
                    weft_service::failpoint::failpoint("meta-after-log");
                }
                let mut published = store.published.lock().expect("published rows poisoned");
                *published = Arc::new(Published {
                    changes,
                    after: published.after,
                    tables: Arc::clone(&published.tables),
                });
                return Ok(Wrote::Logged);
            }
        }
        let durable = match how {
            Commit::Logged { .. } => true,
            Commit::Checkpoint { durable } => durable,
        };
        let mut redb = match self.redb.into_inner() {
            Some(redb) => redb,
            None => store.db.begin_write()?,
        };
        let previous = store.published();
        let of_logged = !previous.changes.is_empty();
        // The tables first opened in this transaction are made, even without rows.
        let deleted = self.deleted.take();
        for (name, kind) in self.new_tables.borrow().iter() {
            if !deleted.contains(name) {
                (kind.apply)(&redb, name, &Rows::new())?;
            }
        }
        changes.apply(&redb)?;
        let replayed = store.replayed.load(std::sync::atomic::Ordering::SeqCst);
        let has_records = store
            .log
            .lock()
            .expect("store log poisoned")
            .as_ref()
            .is_some_and(Log::has_records);
        let position = if replayed && has_records {
            // Every record before the position is on disk: a start after a crash numbers the
            // records after it from there. Only this thread appends, so the position holds.
            store.sync_log()?;
            store
                .log
                .lock()
                .expect("store log poisoned")
                .as_ref()
                .map(Log::position)
        } else {
            None
        };
        if of_logged || position.is_some() {
            // Readers whose snapshot holds this checkpoint no longer lay the logged rows over
            // it, and a start writes only the records after it.
            write_checkpoint(
                &redb,
                Checkpoint {
                    number: previous.after + u64::from(of_logged),
                    position: position.unwrap_or_default(),
                },
            )?;
        }
        redb.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        });
        redb.commit()?;
        store.types.lock().expect("table types poisoned").extend(
            self.new_tables
                .take()
                .into_iter()
                .filter(|(name, _)| !deleted.contains(name)),
        );
        // Every read and batch from now on starts from the tables as this checkpoint left
        // them; one that started before keeps the tables and rows it took.
        let tables = Tables::of(&store.db).inspect_err(|_| {
            // Reads would go on from the tables before it: nothing more commits, and the
            // home is opened again.
            store.stale.store(true, std::sync::atomic::Ordering::SeqCst);
        })?;
        // Only the write transaction's holder changes what is published.
        *store.published.lock().expect("published rows poisoned") = Arc::new(Published {
            changes: Changes::default(),
            after: previous.after + u64::from(of_logged),
            tables: Arc::new(tables),
        });
        Ok(Wrote::Checkpoint { of_logged })
    }
}

/// A snapshot of the store as of a commit.
pub(crate) struct ReadTransaction {
    /// The tables as of the last checkpoint, and the rows changed since.
    published: Arc<Published>,
}

impl ReadTransaction {
    /// Opens `definition` for reading.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<ReadOnlyTable<K, V>, TableError> {
        let name = redb::TableHandle::name(&definition);
        let changes = self.published.changes.0.get(name).cloned();
        let stored = self
            .published
            .tables
            .table(definition)?
            .ok_or_else(|| TableError::TableDoesNotExist(name.to_owned()))?;
        Ok(ReadOnlyTable { stored, changes })
    }

    /// The names of the tables the store holds.
    #[cfg(test)]
    pub(crate) fn list_tables(
        &self,
    ) -> Result<impl Iterator<Item = redb::UntypedTableHandle>, StorageError> {
        let tables: Vec<_> = self
            .published
            .tables
            .redb
            .lock()
            .expect("snapshot poisoned")
            .list_tables()?
            .collect();
        Ok(tables.into_iter())
    }
}

/// What a store's transactions share.
struct Shared {
    published: Mutex<Arc<Published>>,
    /// Whether a write transaction runs ([`Turn`]).
    turn: Mutex<bool>,
    turn_freed: std::sync::Condvar,
    /// Each table's type, learned as tables are opened: how rows read back from the log are
    /// written into their tables.
    types: Mutex<HashMap<String, TableType>>,
    /// None: every commit is a checkpoint.
    log: Mutex<Option<Log>>,
    /// Held by whoever writes and syncs the log's records ([`Shared::sync_log`]), and by its
    /// restart: taken before `log`.
    writing: Mutex<()>,
    /// Whether the rows the log held when the store opened are in the tables
    /// ([`Store::replay_log`]): until then no checkpoint may say the tables hold them.
    replayed: std::sync::atomic::AtomicBool,
    /// Whether a checkpoint committed but its tables could not be published: what is
    /// published is older than the store, and no write transaction begins any more.
    stale: std::sync::atomic::AtomicBool,
    /// Last, so that the tables' read transaction ends before the database.
    db: redb::Database,
}

impl Shared {
    /// The store as of the last commit.
    fn published(&self) -> Arc<Published> {
        Arc::clone(&self.published.lock().expect("published rows poisoned"))
    }

    /// Writes and syncs every record appended so far. Records are written in order: one
    /// writer at a time takes what is appended and syncs it before the next takes the records
    /// after them, so a sync that finds nothing to take finds everything before it synced
    /// (the commit thread's own syncs and the background flusher's share the log this way).
    fn sync_log(&self) -> Result<(), StoreError> {
        let _writing = self.writing.lock().expect("log writer poisoned");
        let taken = match self.log.lock().expect("store log poisoned").as_mut() {
            Some(log) => log.take_pending().map_err(log_failed)?,
            None => return Ok(()),
        };
        let Some(taken) = taken else {
            return Ok(());
        };
        log::write_taken(&taken).map_err(|error| {
            if let Some(log) = self.log.lock().expect("store log poisoned").as_mut() {
                log.set_broken();
            }
            log_failed(error)
        })
    }
}

/// A metadata target's store: its tables, the file that keeps them, and the log of the rows
/// changed since they were last written there.
pub(crate) struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// The store kept by `backend` (a home's store file), made empty if it holds nothing,
    /// with its log at `log` (none: every commit is a checkpoint). What the log holds is
    /// written into the tables by [`Store::replay_log`], once every table was opened.
    pub(crate) fn open(
        backend: impl redb::StorageBackend,
        log: Option<&std::path::Path>,
    ) -> Result<(Store, log::Logged), StoreError> {
        let db = redb::Builder::new()
            .create_with_backend(backend)
            .map_err(redb::Error::from)?;
        Store::with_log(db, log)
    }

    fn with_log(
        db: redb::Database,
        log: Option<&std::path::Path>,
    ) -> Result<(Store, log::Logged), StoreError> {
        let (log, logged) = match log {
            Some(path) => {
                let (log, logged) = Log::open(path).map_err(log_failed)?;
                (Some(log), logged)
            }
            None => (None, log::Logged::default()),
        };
        let after = checkpoint_of(&db.begin_read()?)?.number;
        let store = Store {
            shared: Arc::new(Shared {
                published: Mutex::new(Arc::new(Published {
                    changes: Changes::default(),
                    after,
                    tables: Arc::new(Tables::of(&db)?),
                })),
                turn: Mutex::new(false),
                turn_freed: std::sync::Condvar::new(),
                types: Mutex::default(),
                log: Mutex::new(log),
                writing: Mutex::new(()),
                replayed: std::sync::atomic::AtomicBool::new(logged.records.is_empty()),
                stale: std::sync::atomic::AtomicBool::new(false),
                db,
            }),
        };
        Ok((store, logged))
    }

    /// The store in the file at `path`, made if there is none, with its log beside it.
    #[cfg(test)]
    pub(crate) fn create(
        path: impl AsRef<std::path::Path>,
    ) -> Result<(Store, log::Logged), StoreError> {
        let db = redb::Database::create(path.as_ref()).map_err(redb::Error::from)?;
        Store::with_log(db, Some(&log::log_path(path.as_ref())))
    }

    /// Writes the rows of `logged`, read back from the log when the store opened, into the
    /// tables in one commit: those of the records after the last checkpoint's position. Every
    /// table they name must have been opened (in a commit) since the store opened. Answers
    /// whether it committed; the caller restarts the log once that commit is on disk
    /// ([`Store::restart_log`]). Done again after a crash, it writes the same rows again.
    ///
    /// # Errors
    /// A row names a table never opened, or the store could not be written.
    pub(crate) fn replay_log(&self, logged: log::Logged) -> Result<bool, StoreError> {
        let _turn = Turn::take(&self.shared);
        let db = &self.shared.db;
        let done = checkpoint_of(&db.begin_read()?)?;
        let records: Vec<_> = logged
            .records
            .into_iter()
            .filter(|(seq, _)| logged.epoch != done.position.0 || *seq >= done.position.1)
            .collect();
        let Some(&(last, _)) = records.last() else {
            self.shared
                .replayed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            return Ok(false);
        };
        let count: usize = records.iter().map(|(_, rows)| rows.len()).sum();
        let mut changes = Changes::default();
        {
            let types = self.shared.types.lock().expect("table types poisoned");
            for (table, key, value) in records.into_iter().flat_map(|(_, rows)| rows) {
                let kind = *types.get(&table).ok_or_else(|| unknown_table(&table))?;
                let key = OrderedKey {
                    bytes: Arc::from(key),
                    order: kind.order,
                };
                changes.set((&table, kind), (key, value.map(Arc::from)), 0);
            }
        }
        let txn = db.begin_write()?;
        changes.apply(&txn)?;
        write_checkpoint(
            &txn,
            Checkpoint {
                number: done.number + 1,
                position: (logged.epoch, last + 1),
            },
        )?;
        txn.commit()?;
        self.shared
            .replayed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self
            .shared
            .published
            .lock()
            .expect("published rows poisoned") = Arc::new(Published {
            changes: Changes::default(),
            after: done.number + 1,
            tables: Arc::new(Tables::of(db)?),
        });
        tracing::info!(
            rows = count,
            "the store's change log written into its tables"
        );
        Ok(true)
    }

    /// Starts the log again: for once a checkpoint of every row it holds is on disk.
    ///
    /// # Errors
    /// The log's header could not be written.
    pub(crate) fn restart_log(&self) -> Result<(), StoreError> {
        // No write of the records before may land over the new epoch's.
        let _writing = self.shared.writing.lock().expect("log writer poisoned");
        match self.shared.log.lock().expect("store log poisoned").as_mut() {
            Some(log) => log.restart().map_err(log_failed),
            None => Ok(()),
        }
    }

    /// Makes every record logged so far durable.
    ///
    /// # Errors
    /// The sync failed.
    pub(crate) fn sync_log(&self) -> Result<(), StoreError> {
        self.shared.sync_log()
    }

    /// Whether a write or a sync of the log failed, or a checkpoint's tables could not be
    /// published: the home must be opened again.
    pub(crate) fn log_broken(&self) -> bool {
        self.shared.stale.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .shared
                .log
                .lock()
                .expect("store log poisoned")
                .as_ref()
                .is_some_and(Log::broken)
    }

    /// Whether a batch with its rows in `txn` can be logged: the store has a log whose records
    /// use less than `checkpoint_bytes` and have room for the batch's, and the batch opened no
    /// table new since the store opened. Otherwise its commit is a checkpoint.
    pub(crate) fn can_log(&self, txn: &WriteTransaction, checkpoint_bytes: u64) -> bool {
        txn.new_tables.borrow().is_empty()
            && self
                .shared
                .log
                .lock()
                .expect("store log poisoned")
                .as_ref()
                .is_some_and(|log| {
                    log.used() < checkpoint_bytes && log.fits(txn.record.borrow().len())
                })
    }

    /// Whether the store has a change log (a home's own store does).
    pub(crate) fn logs(&self) -> bool {
        self.shared
            .log
            .lock()
            .expect("store log poisoned")
            .is_some()
    }

    /// Bytes of the log's records appended without a sync, which a crash would lose.
    pub(crate) fn unsynced_log_bytes(&self) -> usize {
        self.shared
            .log
            .lock()
            .expect("store log poisoned")
            .as_ref()
            .map_or(0, Log::unsynced)
    }

    /// Bytes of the log its records use.
    pub(crate) fn logged_bytes(&self) -> u64 {
        self.shared
            .log
            .lock()
            .expect("store log poisoned")
            .as_ref()
            .map_or(0, Log::used)
    }

    /// Whether rows are logged that no checkpoint wrote into the tables yet.
    pub(crate) fn has_logged_rows(&self) -> bool {
        !self
            .shared
            .published
            .lock()
            .expect("published rows poisoned")
            .changes
            .is_empty()
    }

    /// A snapshot of the last commit.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction, StoreError> {
        Ok(ReadTransaction {
            published: self.shared.published(),
        })
    }

    /// The transaction of the next commit. One at a time: a second waits for the first to end.
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction, StoreError> {
        let turn = Turn::take(&self.shared);
        if self.shared.stale.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(log_failed(std::io::Error::other(
                "a checkpoint's tables could not be read back: the store is opened again",
            )));
        }
        let published = self.shared.published();
        Ok(WriteTransaction {
            tables: Arc::clone(&published.tables),
            redb: std::cell::OnceCell::new(),
            deleted: RefCell::default(),
            changes: RefCell::new(published.changes.clone()),
            record: RefCell::default(),
            new_tables: RefCell::default(),
            store: Arc::clone(&self.shared),
            _turn: turn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    /// Keys ordered numerically, which their little-endian bytes are not.
    const NUMBERS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("numbers");
    /// Keys of variable length.
    const NAMES: TableDefinition<&str, u64> = TableDefinition::new("names");

    type Model = (BTreeMap<(u64, u64), Vec<u8>>, BTreeMap<String, u64>);

    /// Every read of `txn`'s tables answers what the model holds.
    fn check(
        numbers: &impl ReadableTable<(u64, u64), &'static [u8]>,
        names: &impl ReadableTable<&'static str, u64>,
        model: &Model,
        rng: &mut impl Rng,
    ) {
        let rows: Vec<_> = numbers
            .iter()
            .expect("rows")
            .map(|row| {
                let (key, value) = row.expect("a row");
                (key.value(), value.value().to_vec())
            })
            .collect();
        let expected: Vec<_> = model.0.iter().map(|(k, v)| (*k, v.clone())).collect();
        assert_eq!(rows, expected, "every row, in order");
        assert_eq!(numbers.len().expect("len"), model.0.len() as u64);
        let (low, high) = (rng.gen_range(0..300u64), rng.gen_range(0..300u64));
        let ranged: Vec<_> = numbers
            .range((low, 0)..(high, 0))
            .expect("range")
            .map(|row| row.expect("a row").0.value())
            .collect();
        let expected: Vec<_> = if low < high {
            model
                .0
                .range((low, 0)..(high, 0))
                .map(|(k, _)| *k)
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(ranged, expected, "the rows of {low}..{high}");
        let first = numbers.first().expect("first").map(|(key, _)| key.value());
        assert_eq!(first, model.0.keys().next().copied());
        for probe in 0..20 {
            let key = (probe * 17 % 300, probe % 3);
            let got = numbers.get(key).expect("get").map(|v| v.value().to_vec());
            assert_eq!(got.as_ref(), model.0.get(&key), "the value of {key:?}");
        }
        let names_read: Vec<_> = names
            .iter()
            .expect("names")
            .map(|row| {
                let (key, value) = row.expect("a row");
                (key.value().to_owned(), value.value())
            })
            .collect();
        let expected: Vec<_> = model.1.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(names_read, expected);
        assert_eq!(names.len().expect("len"), model.1.len() as u64);
    }

    /// A store with the two tables of the test, opened.
    fn opened(path: &std::path::Path) -> (Store, log::Logged) {
        let (store, logged) = Store::create(path).expect("store");
        let txn = store.begin_write().expect("txn");
        txn.open_table(NUMBERS).expect("numbers");
        txn.open_table(NAMES).expect("names");
        txn.commit(Commit::Checkpoint { durable: true })
            .expect("commit");
        (store, logged)
    }

    #[test]
    fn every_read_sees_the_rows_logged_or_checkpointed_before_it_and_a_reopening_keeps_them() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("store.redb");
        let (mut store, _) = opened(&path);
        // Made again from each change's rows, in order, as a replay makes them.
        let (copy, _) = opened(&dir.path().join("copy.redb"));
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model: Model = Default::default();
        for batch in 0..60 {
            let txn = store.begin_write().expect("txn");
            let mut next = model.clone();
            let mut changes = Vec::new();
            {
                let mut numbers = txn.open_table(NUMBERS).expect("numbers");
                let mut names = txn.open_table(NAMES).expect("names");
                for _ in 0..rng.gen_range(1..40) {
                    let mark = txn.mark();
                    let key = (rng.gen_range(0..300u64), rng.gen_range(0..3u64));
                    let name = format!("n{}", rng.gen_range(0..200u32));
                    match rng.gen_range(0..10) {
                        0..=4 => {
                            let value = vec![rng.gen(); rng.gen_range(0..20)];
                            let replaced = numbers.insert(key, value.as_slice()).expect("insert");
                            assert_eq!(
                                replaced.map(|v| v.value().to_vec()).as_ref(),
                                next.0.get(&key)
                            );
                            next.0.insert(key, value);
                        }
                        5..=6 => {
                            let removed = numbers.remove(key).expect("remove");
                            assert_eq!(removed.map(|v| v.value().to_vec()), next.0.remove(&key));
                        }
                        7 => {
                            let low = rng.gen_range(0..300u64);
                            let high = low + rng.gen_range(0..30);
                            numbers
                                .retain_in((low, 0)..(high, 0), |(_, b), _| b != 1)
                                .expect("retain");
                            next.0
                                .retain(|(a, b), _| !(*a >= low && *a < high && *b == 1));
                        }
                        8 => {
                            names.insert(name.as_str(), batch).expect("insert");
                            next.1.insert(name, batch);
                        }
                        _ => {
                            names.remove(name.as_str()).expect("remove");
                            next.1.remove(&name);
                        }
                    }
                    changes.push(txn.rows_since(mark));
                    check(&numbers, &names, &next, &mut rng);
                }
            }
            // A read begun before the commit goes on seeing the store as it was, checkpoint
            // or not.
            let earlier = store.begin_read().expect("read");
            if rng.gen_range(0..5) == 0 {
                txn.abort().expect("abort");
            } else {
                let made = copy.begin_write().expect("txn");
                for rows in &changes {
                    made.apply_rows(rows).expect("the rows of a change");
                }
                made.commit(Commit::Logged { sync: false }).expect("commit");
                // Logged, or now and then a checkpoint of every row logged so far.
                let how = if rng.gen_range(0..4) == 0 {
                    Commit::Checkpoint { durable: true }
                } else {
                    Commit::Logged { sync: true }
                };
                // The log starts again once a checkpoint of its rows is on disk; or not (a
                // crash first, or a sync not yet known to be done), and the records it keeps,
                // older than the checkpoint's own rows, must not undo them at the next opening.
                if let Wrote::Checkpoint { of_logged: true } = txn.commit(how).expect("commit") {
                    if rng.gen_range(0..2) == 0 {
                        store.restart_log().expect("restart the log");
                    }
                }
                let numbers = earlier.open_table(NUMBERS).expect("numbers");
                let names = earlier.open_table(NAMES).expect("names");
                check(&numbers, &names, &model, &mut rng);
                model = next;
            }
            drop(earlier);
            if batch % 15 == 14 {
                // Opened again, as a start does: the rows its log holds go into the tables.
                drop(store);
                let (reopened, logged) = opened(&path);
                store = reopened;
                if store.replay_log(logged).expect("replay") && rng.gen_range(0..2) == 0 {
                    store.restart_log().expect("restart the log");
                }
                assert!(!store.has_logged_rows());
            }
            for store in [&store, &copy] {
                let read = store.begin_read().expect("read");
                let numbers = read.open_table(NUMBERS).expect("numbers");
                let names = read.open_table(NAMES).expect("names");
                check(&numbers, &names, &model, &mut rng);
            }
        }
    }
}
