//! The numbers of a client's changes, and what the client has settled of them.
//!
//! Every mutating request gets a number, the same in each of its retries. Each request also
//! carries the number below which all of the client's requests are settled (none is still
//! pending): a metadata server forgets stored replies below it, and a storage server drops a
//! late copy of a data change below it ([`ChangeTag`]). That mark must never pass a number a
//! request still uses, so a number is drawn and entered as pending in one step: drawn first
//! and entered after, another request could be sent in between with a mark above it, and the
//! server would take the first request, when it comes, for a late copy of a settled one.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// The numbers of a client's requests ([`Numbers::begin`]).
#[derive(Debug)]
pub(crate) struct Numbers {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    next: u64,
    /// Requests begun and not ended.
    pending: BTreeSet<u64>,
    /// Data changes that failed while older requests are still pending: a copy of one still
    /// on its way is dropped by its server ([`ChangeTag::abandoned`]).
    abandoned: BTreeSet<u64>,
}

/// A request's number, pending until dropped.
#[derive(Debug)]
pub(crate) struct Pending<'a> {
    numbers: &'a Numbers,
    /// The request's number.
    pub(crate) number: u64,
    /// The oldest number pending when this one began.
    pub(crate) oldest_pending: u64,
    failed: bool,
}

/// What a copy of a data change sent now tells its server of the client's other changes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Marks {
    /// Every request numbered below this is settled.
    pub(crate) settled_below: u64,
    /// Failed changes at or above the mark.
    pub(crate) abandoned: Vec<u64>,
}

impl Default for Numbers {
    fn default() -> Numbers {
        Numbers {
            state: Mutex::new(State {
                next: 1,
                pending: BTreeSet::new(),
                abandoned: BTreeSet::new(),
            }),
        }
    }
}

impl Numbers {
    /// Draws the next number, pending until the returned guard drops.
    pub(crate) fn begin(&self) -> Pending<'_> {
        let mut state = self.state.lock().expect("request numbers poisoned");
        let number = state.next;
        state.next += 1;
        state.pending.insert(number);
        let oldest_pending = *state.pending.first().expect("just inserted");
        Pending {
            numbers: self,
            number,
            oldest_pending,
            failed: false,
        }
    }
}

impl Pending<'_> {
    /// The marks a copy of this change sent now carries: looked at again for every retry.
    pub(crate) fn marks(&self) -> Marks {
        let mut state = self.numbers.state.lock().expect("request numbers poisoned");
        let settled_below = state.pending.first().copied().unwrap_or(self.number);
        state.abandoned = state.abandoned.split_off(&settled_below);
        Marks {
            settled_below,
            abandoned: state.abandoned.iter().copied().collect(),
        }
    }

    /// The change failed: a copy of it still on its way must not land later.
    pub(crate) fn failed(&mut self) {
        self.failed = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut state = self.numbers.state.lock().expect("request numbers poisoned");
        state.pending.remove(&self.number);
        if self.failed {
            state.abandoned.insert(self.number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests begun on many threads at once, each sent right after it begins, one at a time
    /// (the lock plays the server's socket): the server's mark, the highest `settled_below`
    /// it has seen, never passes a request that comes after it.
    #[test]
    fn no_request_arrives_below_the_mark_of_one_sent_before_it() {
        let numbers = Numbers::default();
        let server_mark = Mutex::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..200_000 {
                        let change = numbers.begin();
                        let marks = change.marks();
                        let mut mark = server_mark.lock().expect("mark");
                        assert!(
                            change.number >= *mark,
                            "change {} arrived below the mark {} of one sent before it",
                            change.number,
                            *mark
                        );
                        *mark = (*mark).max(marks.settled_below).max(change.oldest_pending);
                    }
                });
            }
        });
    }

    #[test]
    fn failed_changes_are_named_until_everything_before_them_settles() {
        let numbers = Numbers::default();
        let first = numbers.begin();
        let mut second = numbers.begin();
        second.failed();
        drop(second);
        let third = numbers.begin();
        assert_eq!(
            third.marks(),
            Marks {
                settled_below: 1,
                abandoned: vec![2]
            }
        );
        drop(first);
        assert_eq!(
            third.marks(),
            Marks {
                settled_below: 3,
                abandoned: vec![]
            }
        );
    }
}
