//! What each user, group and project uses in each storage pool, kept in the same transaction
//! as the inodes: every inode a mutating operation stores or removes goes through [`Inodes`],
//! which takes the old record's use off and adds the new one's. `weft quota report` reads it
//! ([`usage`]), `weft fsck` recounts it from the inodes ([`recount`]).
//!
//! A regular file uses its size (holes included), or the end of the space allocated past it
//! (`fallocate` with `KEEP_SIZE`) when that is larger, and one inode in its layout's pool; any
//! other inode uses one inode in its own pattern's pool (a directory's) or the default pool.
//! A file unlinked while open uses both until its last close. Shards of a spread directory
//! are the directory's, not inodes of their own.

use crate::schema::{InodeRecord, OpError, INODES};
use crate::store::{
    AccessGuard, Range, ReadableTable, Row, StorageError, Table, TableDefinition, WriteTransaction,
};
use std::collections::BTreeMap;
use weft_proto::ids::{InodeId, StoragePoolId};
use weft_proto::messages::FileKind;
use weft_proto::quota::{QuotaKind, QuotaUsage};

/// (kind: 0 user, 1 group, 2 project; its id; pool) → (bytes, inodes).
pub(crate) const USAGE: TableDefinition<(u8, u32, u16), (u64, u64)> = TableDefinition::new("usage");

type Key = (u8, u32, u16);

/// The rows `record` counts in (its user's, its group's, its project's if it has one), with
/// the bytes it uses there (and one inode each); none for a shard of a spread directory.
fn charges(record: &InodeRecord) -> Option<(Vec<Key>, u64)> {
    if record.shard_of != 0 {
        return None;
    }
    let pool = pool_of(record).0;
    let bytes = if record.kind == FileKind::Regular {
        record.size.max(record.allocated)
    } else {
        0
    };
    let keys = record
        .owner()
        .ids()
        .map(|(kind, id)| (kind.key(), id, pool))
        .collect();
    Some((keys, bytes))
}

/// The pool an inode's use counts in: a file's layout's, a directory's pattern's.
pub(crate) fn pool_of(record: &InodeRecord) -> StoragePoolId {
    record
        .layout
        .as_ref()
        .map(|layout| layout.pattern.pool)
        .or(record.pattern.map(|pattern| pattern.pool))
        .unwrap_or(StoragePoolId::DEFAULT)
}

/// The inodes table of a mutating operation, with the usage it keeps.
pub(crate) struct Inodes<'txn> {
    table: Table<'txn, u64, &'static [u8]>,
    usage: Table<'txn, Key, (u64, u64)>,
}

impl<'txn> Inodes<'txn> {
    pub fn open(txn: &'txn WriteTransaction) -> Result<Inodes<'txn>, OpError> {
        Ok(Inodes {
            table: txn.open_table(INODES)?,
            usage: txn.open_table(USAGE)?,
        })
    }

    /// Stores `record` as `inode`, moving its use from what the old record used.
    pub fn store(&mut self, inode: InodeId, record: &InodeRecord) -> Result<(), OpError> {
        let old = match self.table.get(inode.0)? {
            Some(bytes) => Some(InodeRecord::decode(inode.0, bytes.value())?),
            None => None,
        };
        self.table.insert(inode.0, record.encode().as_slice())?;
        let (was, now) = (old.as_ref().and_then(charges), charges(record));
        if was != now {
            if let Some(was) = was {
                self.charge(was, false)?;
            }
            if let Some(now) = now {
                self.charge(now, true)?;
            }
        }
        Ok(())
    }

    /// Removes `inode`, and its use.
    pub fn remove(&mut self, inode: InodeId) -> Result<(), OpError> {
        let old = match self.table.remove(inode.0)? {
            Some(bytes) => Some(InodeRecord::decode(inode.0, bytes.value())?),
            None => None,
        };
        if let Some(was) = old.as_ref().and_then(charges) {
            self.charge(was, false)?;
        }
        Ok(())
    }

    fn charge(&mut self, (keys, bytes): (Vec<Key>, u64), add: bool) -> Result<(), OpError> {
        for key in keys {
            let (used, inodes) = self.usage.get(key)?.map_or((0, 0), |v| v.value());
            // The counters count the rows, in the rows' transaction: one taken off was put on.
            debug_assert!(
                add || (used >= bytes && inodes >= 1),
                "usage {key:?} holds {used} bytes and {inodes} inodes, less than the {bytes} bytes and inode of a row it counted"
            );
            let (used, inodes) = if add {
                (used.saturating_add(bytes), inodes.saturating_add(1))
            } else {
                (used.saturating_sub(bytes), inodes.saturating_sub(1))
            };
            if inodes == 0 && used == 0 {
                self.usage.remove(key)?;
            } else {
                self.usage.insert(key, (used, inodes))?;
            }
        }
        Ok(())
    }
}

/// Reads go to the inodes table, as for any table: `load_inode(&inodes, …)`.
impl ReadableTable<u64, &'static [u8]> for Inodes<'_> {
    fn get<'a>(
        &self,
        key: impl std::borrow::Borrow<<u64 as redb::Value>::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, &'static [u8]>>, StorageError> {
        self.table.get(key.borrow())
    }

    fn range<'a, KR>(
        &self,
        range: impl std::ops::RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, u64, &'static [u8]>, StorageError>
    where
        KR: std::borrow::Borrow<<u64 as redb::Value>::SelfType<'a>> + 'a,
    {
        let start = match range.start_bound() {
            std::ops::Bound::Included(key) => std::ops::Bound::Included(*key.borrow()),
            std::ops::Bound::Excluded(key) => std::ops::Bound::Excluded(*key.borrow()),
            std::ops::Bound::Unbounded => std::ops::Bound::Unbounded,
        };
        let end = match range.end_bound() {
            std::ops::Bound::Included(key) => std::ops::Bound::Included(*key.borrow()),
            std::ops::Bound::Excluded(key) => std::ops::Bound::Excluded(*key.borrow()),
            std::ops::Bound::Unbounded => std::ops::Bound::Unbounded,
        };
        self.table.range::<u64>((start, end))
    }

    fn first(&self) -> Result<Option<Row<'_, u64, &'static [u8]>>, StorageError> {
        self.table.first()
    }

    fn len(&self) -> Result<u64, StorageError> {
        self.table.len()
    }
}

/// The usage table as rows.
pub(crate) fn usage(
    table: &impl ReadableTable<Key, (u64, u64)>,
) -> Result<Vec<QuotaUsage>, OpError> {
    let mut rows = Vec::new();
    for item in table.iter()? {
        let (key, value) = item?;
        let (kind, id, pool) = key.value();
        let Some(kind) = QuotaKind::from_key(kind) else {
            continue;
        };
        let (bytes, inodes) = value.value();
        rows.push(QuotaUsage {
            kind,
            id,
            pool: StoragePoolId(pool),
            bytes,
            inodes,
        });
    }
    Ok(rows)
}

/// What the inodes use, counted afresh from every inode.
pub(crate) fn recount(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<BTreeMap<Key, (u64, u64)>, OpError> {
    let mut counted: BTreeMap<Key, (u64, u64)> = BTreeMap::new();
    for item in inodes.iter()? {
        let (id, bytes) = item?;
        let record = InodeRecord::decode(id.value(), bytes.value())?;
        if let Some((keys, bytes)) = charges(&record) {
            for key in keys {
                let row = counted.entry(key).or_default();
                row.0 += bytes;
                row.1 += 1;
            }
        }
    }
    Ok(counted)
}

/// Replaces the usage table with `counted`; how many rows differed.
pub(crate) fn rewrite(
    txn: &WriteTransaction,
    counted: &BTreeMap<Key, (u64, u64)>,
) -> Result<usize, OpError> {
    let mut table = txn.open_table(USAGE)?;
    let stored: BTreeMap<Key, (u64, u64)> = table
        .iter()?
        .map(|item| item.map(|(key, value)| (key.value(), value.value())))
        .collect::<Result<_, _>>()?;
    let keys: std::collections::BTreeSet<&Key> = stored.keys().chain(counted.keys()).collect();
    let differing = keys
        .into_iter()
        .filter(|key| stored.get(*key) != counted.get(*key))
        .count();
    for key in stored.keys() {
        if !counted.contains_key(key) {
            table.remove(*key)?;
        }
    }
    for (key, value) in counted {
        if stored.get(key) != Some(value) {
            table.insert(*key, *value)?;
        }
    }
    Ok(differing)
}
