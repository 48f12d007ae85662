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
//! batch looks there first, then in the store. At its commit the batch writes its rows into
//! one redb transaction and commits that. Changes are kept in this form so that they can
//! outlive their batch: be logged as one append and reach the store's pages later, at a
//! checkpoint (docs/design/crash-consistency.md, "The store's changes").
//!
//! Errors are redb's ([`StorageError`], [`TableError`]), which the schema's `OpError` and
//! `StoreError` already take.

use crate::schema::StoreError;
use imbl::OrdMap;
pub(crate) use redb::{Key, Value};
use std::borrow::Borrow;
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::iter::Peekable;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

pub(crate) use redb::{DatabaseError, Durability, StorageError, TableDefinition, TableError};

/// The bytes of a changed key or value.
type Bytes = Arc<[u8]>;

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

/// What has changed in one table.
#[derive(Clone)]
struct TableChanges {
    rows: Rows,
    /// Rows the changes add to the store's count of the table (a removal takes one off).
    added: i64,
    /// Writes the rows into the table in a redb transaction (made for the table's types).
    apply: fn(&redb::WriteTransaction, &str, &Rows) -> Result<(), StoreError>,
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
    fn set<K: Key + 'static, V: Value + 'static>(
        &mut self,
        name: &str,
        (key, value): (OrderedKey, Option<Bytes>),
        added: i64,
    ) {
        let table = match self.0.get_mut(name) {
            Some(table) => table,
            None => self.0.entry(name.to_owned()).or_insert(TableChanges {
                rows: Rows::new(),
                added: 0,
                apply: apply_rows::<K, V>,
            }),
        };
        table.added += added;
        table.rows.insert(key, value);
    }
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

/// A table opened for changes in a [`WriteTransaction`]: its stored rows, read through the
/// transaction's changes, which its own changes join.
pub(crate) struct Table<'txn, K: Key + 'static, V: Value + 'static> {
    stored: redb::Table<'txn, K, V>,
    name: String,
    txn: &'txn WriteTransaction,
}

impl<K: Key + 'static, V: Value + 'static> ReadableTable<K, V> for Table<'_, K, V> {
    fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let key = key.borrow();
        let changed = self
            .txn
            .changes
            .borrow()
            .0
            .get(&self.name)
            .and_then(|table| changed::<K>(&table.rows, key));
        match changed {
            Some(value) => Ok(value.map(AccessGuard::changed)),
            None => Ok(redb::ReadableTable::get(&self.stored, key)?.map(AccessGuard::stored)),
        }
    }

    fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let changed = self
            .txn
            .changes
            .borrow()
            .0
            .get(&self.name)
            .map(|table| ChangedRange {
                rows: table.rows.clone(),
                left: key_bounds::<K, KR>(&range),
            });
        let stored = redb::ReadableTable::range(&self.stored, range)?;
        Ok(Range::new(Some(stored), changed))
    }

    fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError> {
        self.iter()?.next().transpose()
    }

    fn len(&self) -> Result<u64, StorageError> {
        let stored = redb::ReadableTableMetadata::len(&self.stored)?;
        let added = self
            .txn
            .changes
            .borrow()
            .0
            .get(&self.name)
            .map_or(0, |table| table.added);
        Ok(stored.saturating_add_signed(added))
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
        self.txn.changes.borrow_mut().set::<K, V>(
            &self.name,
            (OrderedKey::of::<K>(key), Some(value)),
            added,
        );
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
            self.txn.changes.borrow_mut().set::<K, V>(
                &self.name,
                (OrderedKey::of::<K>(key), None),
                -1,
            );
        }
        Ok(removed)
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
                removed.push(OrderedKey::of::<K>(&key.value()));
            }
        }
        let mut changes = self.txn.changes.borrow_mut();
        for key in removed {
            changes.set::<K, V>(&self.name, (key, None), -1);
        }
        Ok(())
    }
}

/// A table opened for reading in a [`ReadTransaction`].
pub(crate) struct ReadOnlyTable<K: Key + 'static, V: Value + 'static>(redb::ReadOnlyTable<K, V>);

impl<K: Key + 'static, V: Value + 'static> ReadableTable<K, V> for ReadOnlyTable<K, V> {
    fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        Ok(redb::ReadableTable::get(&self.0, key)?.map(AccessGuard::stored))
    }

    fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        Ok(Range::new(
            Some(redb::ReadableTable::range(&self.0, range)?),
            None,
        ))
    }

    fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError> {
        Ok(redb::ReadableTable::first(&self.0)?.map(stored_row))
    }

    fn len(&self) -> Result<u64, StorageError> {
        redb::ReadableTableMetadata::len(&self.0)
    }
}

/// The commit thread's transaction: every operation of a batch changes its tables, and the
/// batch commits them together.
pub(crate) struct WriteTransaction {
    redb: redb::WriteTransaction,
    changes: RefCell<Changes>,
}

impl WriteTransaction {
    /// Opens `definition` for changes; a table that does not exist yet is made.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'_, K, V>, TableError> {
        Ok(Table {
            stored: self.redb.open_table(definition)?,
            name: redb::TableHandle::name(&definition).to_owned(),
            txn: self,
        })
    }

    /// The names of the tables the store holds, for a store's upgrade.
    pub(crate) fn list_tables(
        &self,
    ) -> Result<impl Iterator<Item = redb::UntypedTableHandle> + '_, StorageError> {
        self.redb.list_tables()
    }

    /// Deletes a table and its changes, for a store's upgrade; answers whether it existed.
    pub(crate) fn delete_table(&self, table: impl redb::TableHandle) -> Result<bool, TableError> {
        self.changes.borrow_mut().0.remove(table.name());
        self.redb.delete_table(table)
    }

    /// Says whether the commit waits for the disk.
    pub(crate) fn set_durability(&mut self, durability: Durability) {
        self.redb.set_durability(durability);
    }

    /// Drops every change made in the transaction.
    pub(crate) fn abort(self) -> Result<(), StorageError> {
        self.redb.abort()
    }

    /// Commits every change made in the transaction.
    pub(crate) fn commit(self) -> Result<(), StoreError> {
        for (name, table) in &self.changes.borrow().0 {
            (table.apply)(&self.redb, name, &table.rows)?;
        }
        Ok(self.redb.commit()?)
    }
}

/// A snapshot of the store as of a commit.
pub(crate) struct ReadTransaction(redb::ReadTransaction);

impl ReadTransaction {
    /// Opens `definition` for reading.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<ReadOnlyTable<K, V>, TableError> {
        Ok(ReadOnlyTable(self.0.open_table(definition)?))
    }

    /// The names of the tables the store holds.
    #[cfg(test)]
    pub(crate) fn list_tables(
        &self,
    ) -> Result<impl Iterator<Item = redb::UntypedTableHandle> + '_, StorageError> {
        self.0.list_tables()
    }
}

/// A metadata target's store: its tables, and the file that keeps them.
pub(crate) struct Store(redb::Database);

impl Store {
    /// The store kept by `backend` (a home's store file), made empty if it holds nothing.
    pub(crate) fn open(backend: impl redb::StorageBackend) -> Result<Store, DatabaseError> {
        Ok(Store(redb::Builder::new().create_with_backend(backend)?))
    }

    /// The store in the file at `path`, made if there is none.
    #[cfg(test)]
    pub(crate) fn create(path: impl AsRef<std::path::Path>) -> Result<Store, DatabaseError> {
        Ok(Store(redb::Database::create(path)?))
    }

    /// A snapshot of the last commit.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction, StoreError> {
        Ok(ReadTransaction(self.0.begin_read()?))
    }

    /// The transaction of the next commit. One at a time: a second waits for the first to end.
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction, StoreError> {
        Ok(WriteTransaction {
            redb: self.0.begin_write()?,
            changes: RefCell::default(),
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

    #[test]
    fn a_batch_reads_its_own_changes_over_the_stored_rows_and_commits_them() {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::create(dir.path().join("store.redb")).expect("store");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut model: Model = Default::default();
        let txn = store.begin_write().expect("txn");
        txn.open_table(NUMBERS).expect("numbers");
        txn.open_table(NAMES).expect("names");
        txn.commit().expect("commit");
        for batch in 0..60 {
            let txn = store.begin_write().expect("txn");
            let mut next = model.clone();
            {
                let mut numbers = txn.open_table(NUMBERS).expect("numbers");
                let mut names = txn.open_table(NAMES).expect("names");
                for _ in 0..rng.gen_range(1..40) {
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
                    check(&numbers, &names, &next, &mut rng);
                }
            }
            if rng.gen_range(0..5) == 0 {
                txn.abort().expect("abort");
            } else {
                txn.commit().expect("commit");
                model = next;
            }
            let read = store.begin_read().expect("read");
            let numbers = read.open_table(NUMBERS).expect("numbers");
            let names = read.open_table(NAMES).expect("names");
            check(&numbers, &names, &model, &mut rng);
        }
    }
}
