//! Tables whose values are records: the postcard bytes of one type per table, keyed by an
//! inode or an intent id. A [`RecordTable`] names such a table and its record type; opened in
//! a transaction it gives [`Records`], which encodes and decodes each record. That is the one
//! place a record of these tables becomes bytes and back, and a record that does not decode is
//! a damaged store, reported with its table and key.

use super::{OpError, StoreError};
use crate::store::{
    ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition, WriteTransaction,
};
use serde::{de::DeserializeOwned, Serialize};
use std::marker::PhantomData;

/// The table of record bytes `Txn` opens.
type RecordBytes<'txn, Txn> = <Txn as Transaction>::Table<'txn, u64, &'static [u8]>;

/// A key, and its record or why it did not decode.
pub(crate) type Decoded<T> = (u64, Result<T, OpError>);

/// A table of records of type `T`, by `u64` key.
pub(crate) struct RecordTable<T> {
    name: &'static str,
    record: PhantomData<fn() -> T>,
}

impl<T> RecordTable<T> {
    /// The table called `name`.
    pub(crate) const fn new(name: &'static str) -> RecordTable<T> {
        RecordTable {
            name,
            record: PhantomData,
        }
    }

    /// The table as the store names it, for what reads its keys and bytes whatever they hold (a
    /// check, a conversion of an older store).
    pub(crate) const fn definition(&self) -> TableDefinition<'static, u64, &'static [u8]> {
        TableDefinition::new(self.name)
    }
}

impl<T: Serialize + DeserializeOwned> RecordTable<T> {
    /// The table in `txn`: read-only in a read transaction, changeable in a write one.
    pub(crate) fn open<'txn, Txn: Transaction>(
        &self,
        txn: &'txn Txn,
    ) -> Result<Records<RecordBytes<'txn, Txn>, T>, OpError> {
        Ok(Records {
            table: txn.table(self.definition())?,
            name: self.name,
            record: PhantomData,
        })
    }
}

/// A transaction, read or write, in which a table is opened read-only or changeable: a
/// check reads a read snapshot or its repair's own write transaction, and a record table
/// opens in either.
pub(crate) trait Transaction {
    /// The table it opens.
    type Table<'a, K: crate::store::Key + 'static, V: crate::store::Value + 'static>: ReadableTable<
        K,
        V,
    >
    where
        Self: 'a;

    /// Opens `definition`.
    fn table<K: crate::store::Key + 'static, V: crate::store::Value + 'static>(
        &self,
        definition: TableDefinition<'static, K, V>,
    ) -> Result<Self::Table<'_, K, V>, OpError>;
}

impl Transaction for ReadTransaction {
    type Table<'a, K: crate::store::Key + 'static, V: crate::store::Value + 'static> =
        ReadOnlyTable<K, V>;

    fn table<K: crate::store::Key + 'static, V: crate::store::Value + 'static>(
        &self,
        definition: TableDefinition<'static, K, V>,
    ) -> Result<ReadOnlyTable<K, V>, OpError> {
        Ok(self.open_table(definition)?)
    }
}

impl Transaction for WriteTransaction {
    type Table<'a, K: crate::store::Key + 'static, V: crate::store::Value + 'static> =
        Table<'a, K, V>;

    fn table<K: crate::store::Key + 'static, V: crate::store::Value + 'static>(
        &self,
        definition: TableDefinition<'static, K, V>,
    ) -> Result<Table<'_, K, V>, OpError> {
        Ok(self.open_table(definition)?)
    }
}

/// An open table of records of type `T` (`B` is the store's table, read-only or not).
pub(crate) struct Records<B, T> {
    table: B,
    name: &'static str,
    record: PhantomData<fn() -> T>,
}

impl<B: ReadableTable<u64, &'static [u8]>, T: DeserializeOwned> Records<B, T> {
    /// The record of `key`, if there is one.
    pub(crate) fn get(&self, key: u64) -> Result<Option<T>, OpError> {
        match self.table.get(key)? {
            Some(bytes) => self.decode(key, bytes.value()).map(Some),
            None => Ok(None),
        }
    }

    /// Whether `key` has a record.
    pub(crate) fn contains(&self, key: u64) -> Result<bool, OpError> {
        Ok(self.table.get(key)?.is_some())
    }

    /// The lowest key, if any.
    pub(crate) fn first_key(&self) -> Result<Option<u64>, OpError> {
        Ok(self.table.first()?.map(|(key, _)| key.value()))
    }

    /// Every record, in key order.
    pub(crate) fn all(&self) -> Result<Vec<(u64, T)>, OpError> {
        self.each(usize::MAX)?
            .into_iter()
            .map(|(key, record)| Ok((key, record?)))
            .collect()
    }

    /// The first `limit` keys, each with its record or the error of a record that does not
    /// decode, in key order: for what passes over a damaged record instead of stopping at it.
    pub(crate) fn each(&self, limit: usize) -> Result<Vec<Decoded<T>>, OpError> {
        let mut records = Vec::new();
        for item in self.table.iter()?.take(limit) {
            let (key, bytes) = item?;
            let key = key.value();
            records.push((key, self.decode(key, bytes.value())));
        }
        Ok(records)
    }

    /// Every key, in order.
    pub(crate) fn keys(&self) -> Result<Vec<u64>, OpError> {
        let mut keys = Vec::new();
        for item in self.table.iter()? {
            keys.push(item?.0.value());
        }
        Ok(keys)
    }

    fn decode(&self, key: u64, bytes: &[u8]) -> Result<T, OpError> {
        postcard::from_bytes(bytes).map_err(|error| {
            StoreError::damaged(format!("the {} record of {key:#x}", self.name), error).into()
        })
    }
}

impl<T: Serialize + DeserializeOwned> Records<Table<'_, u64, &'static [u8]>, T> {
    /// Makes `record` the record of `key`.
    pub(crate) fn insert(&mut self, key: u64, record: &T) -> Result<(), OpError> {
        let bytes = postcard::to_stdvec(record).expect("records always encode");
        self.table.insert(key, bytes.as_slice())?;
        Ok(())
    }

    /// Removes the record of `key`; answers whether there was one.
    pub(crate) fn remove(&mut self, key: u64) -> Result<bool, OpError> {
        Ok(self.table.remove(key)?.is_some())
    }

    /// Removes the record of `key` and answers it.
    pub(crate) fn take(&mut self, key: u64) -> Result<Option<T>, OpError> {
        let record = self.get(key)?;
        self.table.remove(key)?;
        Ok(record)
    }
}
