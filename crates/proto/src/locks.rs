//! Byte-range lock arithmetic, shared by the metadata server (which grants locks) and the
//! client (which remembers the locks it holds, to reclaim them after a server restart).

use crate::messages::{LockKind, LockRange};

/// Whether two ranges share a byte (ends are inclusive).
pub fn overlaps(a: &LockRange, b: &LockRange) -> bool {
    a.start <= b.end && b.start <= a.end
}

/// Whether locks of two different owners conflict: they overlap and one is exclusive.
pub fn conflicts(held: &LockRange, wanted: &LockRange) -> bool {
    wanted.kind != LockKind::Unlock
        && held.kind != LockKind::Unlock
        && overlaps(held, wanted)
        && (held.kind == LockKind::Write || wanted.kind == LockKind::Write)
}

/// Applies a lock request to the ranges one owner holds: the request replaces whatever the
/// owner held in its range (cutting held ranges at its edges), and an unlock only removes.
/// Returns true when anything held was released or replaced.
pub fn apply_to_owner(ranges: &mut Vec<LockRange>, lock: &LockRange) -> bool {
    let mut changed = false;
    let mut kept = Vec::with_capacity(ranges.len() + 2);
    for held in ranges.drain(..) {
        if !overlaps(&held, lock) {
            kept.push(held);
            continue;
        }
        changed = true;
        if held.start < lock.start {
            kept.push(LockRange {
                end: lock.start - 1,
                ..held
            });
        }
        if held.end > lock.end {
            kept.push(LockRange {
                start: lock.end + 1,
                ..held
            });
        }
    }
    if lock.kind != LockKind::Unlock {
        kept.push(*lock);
    }
    *ranges = kept;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(kind: LockKind, start: u64, end: u64) -> LockRange {
        LockRange {
            owner: 1,
            kind,
            start,
            end,
            pid: 1,
        }
    }

    fn kind_at(ranges: &[LockRange], byte: u64) -> Option<LockKind> {
        let found: Vec<_> = ranges
            .iter()
            .filter(|r| r.start <= byte && byte <= r.end)
            .collect();
        assert!(found.len() <= 1, "ranges of one owner never overlap");
        found.first().map(|r| r.kind)
    }

    proptest! {
        // Goal: after any sequence of requests, every byte holds the kind of the last request
        // covering it (or nothing after an unlock), and one owner's ranges never overlap.
        #[test]
        fn last_request_wins(requests in proptest::collection::vec((0u8..3, 0u64..64, 0u64..64), 1..20)) {
            let mut ranges = Vec::new();
            let mut model = [None; 64];
            for (kind, a, b) in requests {
                let kind = [LockKind::Read, LockKind::Write, LockKind::Unlock][kind as usize];
                let (start, end) = (a.min(b), a.max(b));
                apply_to_owner(&mut ranges, &range(kind, start, end));
                for slot in &mut model[start as usize..=end as usize] {
                    *slot = (kind != LockKind::Unlock).then_some(kind);
                }
            }
            for byte in 0..64u64 {
                prop_assert_eq!(kind_at(&ranges, byte), model[byte as usize]);
            }
        }
    }
}
