//! Byte-range locks per object, as a primary takes them: a change holds the range it changes
//! while it is applied here and forwarded to every member, and a resync holds a whole object
//! while it copies it, so every member applies overlapping changes in the primary's order and
//! a copy never overwrites a newer change. The table decides; a storage server waits on the
//! holder's gate (`G`, an async mutex), the simulator queues the operation.

use std::collections::HashMap;
use std::hash::Hash;
use std::ops::Range;

#[derive(Debug)]
struct Held<G> {
    id: u64,
    range: Range<u64>,
    gate: G,
}

/// The ranges held, per object `K`.
#[derive(Debug)]
pub struct RangeTable<K, G> {
    held: HashMap<K, Vec<Held<G>>>,
    next: u64,
}

impl<K, G> Default for RangeTable<K, G> {
    fn default() -> Self {
        RangeTable {
            held: HashMap::new(),
            next: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, G> RangeTable<K, G> {
    /// Takes `range` of `key` with the gate `gate()` and returns the hold's id, or returns the
    /// gate of a holder of an overlapping range.
    ///
    /// # Errors
    /// The gate of the holder to wait for before asking again.
    pub fn try_lock(
        &mut self,
        key: &K,
        range: Range<u64>,
        gate: impl FnOnce() -> G,
    ) -> Result<u64, &G> {
        let list = self.held.entry(key.clone()).or_default();
        if let Some(index) = list
            .iter()
            .position(|h| h.range.start < range.end && range.start < h.range.end)
        {
            return Err(&list[index].gate);
        }
        self.next += 1;
        list.push(Held {
            id: self.next,
            range,
            gate: gate(),
        });
        Ok(self.next)
    }

    /// Lets hold `id` of `key` go.
    pub fn unlock(&mut self, key: &K, id: u64) {
        if let Some(list) = self.held.get_mut(key) {
            list.retain(|h| h.id != id);
            if list.is_empty() {
                self.held.remove(key);
            }
        }
    }

    /// Whether any range of `key` is held.
    pub fn busy(&self, key: &K) -> bool {
        self.held.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a range waits for an overlapping one on the same object and only for it.
    #[test]
    fn overlapping_ranges_exclude_each_other() {
        let mut table = RangeTable::<u32, &str>::default();
        let first = table.try_lock(&7, 0..100, || "first").expect("free");
        let beside = table
            .try_lock(&7, 100..200, || "beside")
            .expect("beside is free");
        table
            .try_lock(&8, 0..100, || "other")
            .expect("another object is free");
        assert_eq!(table.try_lock(&7, 50..60, || "late"), Err(&"first"));
        assert_eq!(table.try_lock(&7, 150..160, || "late"), Err(&"beside"));
        table.unlock(&7, first);
        table
            .try_lock(&7, 50..60, || "second")
            .expect("free once released");
        table.unlock(&7, beside);
        assert!(table.busy(&7));
    }
}
