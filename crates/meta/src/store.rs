//! The metadata store's tables, as every operation and every read sees them.
//!
//! Operations open tables in a [`WriteTransaction`] (the commit thread's batch), reads in a
//! [`ReadTransaction`] (a snapshot of the last commit), by the same typed definitions as redb's
//! ([`TableDefinition`]) and with the same vocabulary: [`Table`], [`ReadOnlyTable`], the
//! [`ReadableTable`] trait both implement, [`AccessGuard`] for a key or a value, [`Range`] for
//! rows in key order. Nothing outside this module names redb's own table types: where rows
//! live between a change and the disk is this module's business alone, so that the store
//! under the tables (today redb's, one copy-on-write transaction per batch) can change without
//! touching an operation.
//!
//! Errors are redb's ([`StorageError`], [`TableError`]), which the schema's `OpError` and
//! `StoreError` already take.

pub(crate) use redb::{Key, Value};
use std::borrow::Borrow;
use std::ops::RangeBounds;

use crate::schema::StoreError;
pub(crate) use redb::{
    CommitError, DatabaseError, Durability, StorageError, TableDefinition, TableError,
};

/// A value or a key read from a table.
pub(crate) struct AccessGuard<'a, V: Value + 'static>(redb::AccessGuard<'a, V>);

impl<V: Value + 'static> AccessGuard<'_, V> {
    /// The value, borrowed from the guard.
    pub(crate) fn value(&self) -> V::SelfType<'_> {
        self.0.value()
    }
}

/// A key and its value.
pub(crate) type Row<'a, K, V> = (AccessGuard<'a, K>, AccessGuard<'a, V>);

fn row<'a, K: Key + 'static, V: Value + 'static>(
    (key, value): (redb::AccessGuard<'a, K>, redb::AccessGuard<'a, V>),
) -> Row<'a, K, V> {
    (AccessGuard(key), AccessGuard(value))
}

/// Rows of a table in key order (or in reverse, from the back).
pub(crate) struct Range<'a, K: Key + 'static, V: Value + 'static>(redb::Range<'a, K, V>);

impl<'a, K: Key + 'static, V: Value + 'static> Iterator for Range<'a, K, V> {
    type Item = Result<Row<'a, K, V>, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|item| item.map(row))
    }
}

impl<K: Key + 'static, V: Value + 'static> DoubleEndedIterator for Range<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back().map(|item| item.map(row))
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

/// Implements [`ReadableTable`] for a table type that wraps one of redb's in field `0`.
macro_rules! readable_through_redb {
    ($table:ident $(<$life:lifetime>)?) => {
        impl<K: Key + 'static, V: Value + 'static> ReadableTable<K, V> for $table<$($life,)? K, V> {
            fn get<'a>(
                &self,
                key: impl Borrow<K::SelfType<'a>>,
            ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
                Ok(redb::ReadableTable::get(&self.0, key)?.map(AccessGuard))
            }

            fn range<'a, KR>(
                &self,
                range: impl RangeBounds<KR> + 'a,
            ) -> Result<Range<'_, K, V>, StorageError>
            where
                KR: Borrow<K::SelfType<'a>> + 'a,
            {
                Ok(Range(redb::ReadableTable::range(&self.0, range)?))
            }

            fn first(&self) -> Result<Option<Row<'_, K, V>>, StorageError> {
                Ok(redb::ReadableTable::first(&self.0)?.map(row))
            }

            fn len(&self) -> Result<u64, StorageError> {
                redb::ReadableTableMetadata::len(&self.0)
            }
        }
    };
}

/// A table opened for changes in a [`WriteTransaction`].
pub(crate) struct Table<'txn, K: Key + 'static, V: Value + 'static>(redb::Table<'txn, K, V>);

readable_through_redb!(Table<'_>);

impl<K: Key + 'static, V: Value + 'static> Table<'_, K, V> {
    /// Makes `value` the value of `key`; answers the value it replaced.
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        Ok(self.0.insert(key, value)?.map(AccessGuard))
    }

    /// Removes the row of `key`; answers its value.
    pub(crate) fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        Ok(self.0.remove(key)?.map(AccessGuard))
    }

    /// Keeps the rows in `range` that `keep` answers true for, and removes the others there.
    pub(crate) fn retain_in<'a, KR, F>(
        &mut self,
        range: impl RangeBounds<KR> + 'a,
        keep: F,
    ) -> Result<(), StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
        F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool,
    {
        self.0.retain_in(range, keep)
    }
}

/// A table opened for reading in a [`ReadTransaction`].
pub(crate) struct ReadOnlyTable<K: Key + 'static, V: Value + 'static>(redb::ReadOnlyTable<K, V>);

readable_through_redb!(ReadOnlyTable);

/// The commit thread's transaction: every operation of a batch changes its tables, and the
/// batch commits them together.
pub(crate) struct WriteTransaction(redb::WriteTransaction);

impl WriteTransaction {
    /// Opens `definition` for changes; a table that does not exist yet is made.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'_, K, V>, TableError> {
        Ok(Table(self.0.open_table(definition)?))
    }

    /// The names of the tables the store holds, for a store's upgrade.
    pub(crate) fn list_tables(
        &self,
    ) -> Result<impl Iterator<Item = redb::UntypedTableHandle> + '_, StorageError> {
        self.0.list_tables()
    }

    /// Deletes a table, for a store's upgrade; answers whether it existed.
    pub(crate) fn delete_table(&self, table: impl redb::TableHandle) -> Result<bool, TableError> {
        self.0.delete_table(table)
    }

    /// Says whether the commit waits for the disk.
    pub(crate) fn set_durability(&mut self, durability: Durability) {
        self.0.set_durability(durability);
    }

    /// Drops every change made in the transaction.
    pub(crate) fn abort(self) -> Result<(), StorageError> {
        self.0.abort()
    }

    /// Commits every change made in the transaction.
    pub(crate) fn commit(self) -> Result<(), CommitError> {
        self.0.commit()
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
        Ok(WriteTransaction(self.0.begin_write()?))
    }
}
