//! The names leases this client holds: directories it made, whose homes promised that nobody
//! else adds a name to them while the lease runs (docs/design/namespace.md, "Names leases").
//! A lookup of a name this client did not add to such a directory is answered here: the name
//! is not there. A create's `LOOKUP` of its new name then costs no round trip.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_proto::ids::InodeId;

/// Names this client noted in all its leased directories together before it gives up a lease
/// rather than note more: the leases' memory stays bounded.
const NAMES_NOTED_MAX: usize = 1 << 18;

/// Leased directories kept at most.
const LEASES_KEPT: usize = 1024;

/// How long a lease that ran out is kept for its renewal by a create there (the home renews it
/// while nobody else added a name): a pause of the work in a directory does not end it.
const RUN_OUT_KEPT: Duration = Duration::from_secs(5);

/// One leased directory.
#[derive(Debug)]
struct Leased {
    until: Instant,
    /// Every name this client asked to add to it since the lease began (made, linked or
    /// renamed there, whether or not the home did): only those may be there.
    added: HashSet<String>,
}

#[derive(Debug, Default)]
struct State {
    dirs: HashMap<InodeId, Leased>,
    /// Names noted in `dirs`, together.
    noted: usize,
    /// Numbers every name noted and every directory made.
    sequence: u64,
    /// Directories being made (their requests sent, not answered), by the number their start
    /// took, with how many started at that number.
    making: BTreeMap<u64, usize>,
    /// The names noted while a directory was being made: one of them may be in it already
    /// when its lease arrives (another task found the new directory at its home and made a
    /// name there before the answer came back here).
    recent: VecDeque<(u64, InodeId, String)>,
}

/// The directories this client answers for.
#[derive(Debug, Default)]
pub(crate) struct NamesLeases {
    state: Arc<Mutex<State>>,
}

/// A directory being made, from before its request is sent until its lease (if any) is
/// noted: names noted meanwhile count in its lease.
pub(crate) struct Making {
    state: Arc<Mutex<State>>,
    number: u64,
    sent: Instant,
}

impl Drop for Making {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if let Some(count) = state.making.get_mut(&self.number) {
            *count -= 1;
            if *count == 0 {
                state.making.remove(&self.number);
            }
        }
        let oldest = state.making.keys().next().copied();
        match oldest {
            Some(oldest) => {
                while state.recent.front().is_some_and(|(n, _, _)| *n < oldest) {
                    state.recent.pop_front();
                }
            }
            None => state.recent.clear(),
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().expect("names leases poisoned")
}

/// Whether a lease may answer for `name` at all: the names a lookup fails on for another
/// reason (too long, `.`, `..`, a slash) are asked of the home.
fn answerable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= weft_proto::messages::NAME_BYTES_MAX
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

impl NamesLeases {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Whether `name` is surely not in `dir`: its lease runs, and this client never asked to
    /// add the name there since it began.
    pub fn absent(&self, dir: InodeId, name: &str) -> bool {
        if !answerable(name) {
            return false;
        }
        let state = self.state();
        state
            .dirs
            .get(&dir)
            .is_some_and(|leased| leased.until > Instant::now() && !leased.added.contains(name))
    }

    /// Notes, before a request that may add `name` to `dir` is sent, that it may be there
    /// from now on.
    pub fn naming(&self, dir: InodeId, name: &str) {
        let mut state = self.state();
        state.sequence += 1;
        if !state.making.is_empty() {
            let number = state.sequence;
            state.recent.push_back((number, dir, name.to_string()));
        }
        if !state.dirs.contains_key(&dir) {
            return;
        }
        if state.noted >= NAMES_NOTED_MAX {
            prune(&mut state);
        }
        let State { dirs, noted, .. } = &mut *state;
        let Some(leased) = dirs.get_mut(&dir) else {
            return;
        };
        if *noted >= NAMES_NOTED_MAX {
            // Too many names to keep: this directory is asked about again.
            *noted -= leased.added.len();
            dirs.remove(&dir);
        } else if leased.added.insert(name.to_string()) {
            *noted += 1;
        }
    }

    /// Before a request that makes a directory is sent: the lease it may get counts from now,
    /// with the names noted until it arrives.
    pub fn making(&self) -> Making {
        let mut state = self.state();
        state.sequence += 1;
        let number = state.sequence;
        *state.making.entry(number).or_default() += 1;
        Making {
            state: Arc::clone(&self.state),
            number,
            sent: Instant::now(),
        }
    }

    /// The home granted a lease of `ms` milliseconds (0: none) on `dir`, the directory
    /// `making` made.
    pub fn granted(&self, making: Making, dir: InodeId, ms: u32) {
        if ms == 0 {
            return;
        }
        let mut state = self.state();
        if state.dirs.len() >= LEASES_KEPT {
            prune(&mut state);
        }
        if state.dirs.len() >= LEASES_KEPT {
            return;
        }
        let added: HashSet<String> = state
            .recent
            .iter()
            .filter(|(number, parent, _)| *number > making.number && *parent == dir)
            .map(|(_, _, name)| name.clone())
            .collect();
        state.noted += added.len();
        state.dirs.insert(
            dir,
            Leased {
                until: making.sent + Duration::from_millis(u64::from(ms)),
                added,
            },
        );
    }

    /// The home renewed this client's lease on `dir` for `ms` milliseconds from `sent`, when
    /// a request that added a name there was first sent (0: not renewed; the lease runs out
    /// when it runs out).
    pub fn renewed(&self, dir: InodeId, sent: Instant, ms: u32) {
        if ms == 0 {
            return;
        }
        if let Some(leased) = self.state().dirs.get_mut(&dir) {
            leased.until = leased
                .until
                .max(sent + Duration::from_millis(u64::from(ms)));
        }
    }
}

/// Drops the leases that ran out longer ago than [`RUN_OUT_KEPT`].
fn prune(state: &mut State) {
    let now = Instant::now();
    let State { dirs, noted, .. } = state;
    dirs.retain(|_, leased| {
        let kept = leased.until + RUN_OUT_KEPT > now;
        if !kept {
            *noted -= leased.added.len();
        }
        kept
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a lease answers for names this client never added, never for one it did (even
    // when its request failed), nor once its time is up until a renewal; a name it cannot
    // answer for is asked of the home.
    #[test]
    fn a_lease_answers_only_for_names_never_added() {
        let leases = NamesLeases::default();
        let dir = InodeId(5);
        assert!(!leases.absent(dir, "a"), "no lease: ask the home");
        leases.granted(leases.making(), dir, 60_000);
        assert!(leases.absent(dir, "a"));
        leases.naming(dir, "a");
        assert!(
            !leases.absent(dir, "a"),
            "a name this client added may be there"
        );
        assert!(leases.absent(dir, "b"));
        for name in ["..", ".", &"n".repeat(256)] {
            assert!(!leases.absent(dir, name), "{name:?} is asked of the home");
        }
        let other = InodeId(6);
        let mut making = leases.making();
        making.sent -= Duration::from_millis(20);
        leases.granted(making, other, 10);
        assert!(
            !leases.absent(other, "b"),
            "a lease whose time is up answers nothing"
        );
        leases.renewed(other, Instant::now(), 60_000);
        assert!(leases.absent(other, "b"), "renewed");
    }

    // Goal: a name this client added to a directory while it was being made (another task
    // found it at its home first) is in the directory's lease when it arrives.
    #[test]
    fn a_name_added_while_the_directory_was_made_counts_in_its_lease() {
        let leases = NamesLeases::default();
        let dir = InodeId(8);
        let making = leases.making();
        leases.naming(dir, "early");
        leases.granted(making, dir, 60_000);
        assert!(!leases.absent(dir, "early"));
        assert!(leases.absent(dir, "late"));
        assert!(
            leases.state().recent.is_empty(),
            "nothing kept once no directory is being made"
        );
    }
}
