//! The names leases this client holds: directories it made, whose homes promised that nobody
//! else adds a name to them while the lease runs (docs/design/namespace.md, "Names leases").
//! A lookup of a name this client did not add to such a directory is answered here: the name
//! is not there. A create's `LOOKUP` of its new name then costs no round trip.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use weft_proto::ids::InodeId;

/// Names this client adds to one leased directory before it stops answering for it: the
/// lease's memory stays bounded.
const NAMES_PER_LEASE_MAX: usize = 1 << 20;

/// Leased directories kept before the ones that ran out are dropped.
const LEASES_KEPT: usize = 4096;

/// One leased directory.
#[derive(Debug)]
struct Leased {
    until: Instant,
    /// Every name this client asked to add to it since the lease began (made, linked or
    /// renamed there, whether or not the home did): only those may be there.
    added: HashSet<String>,
}

/// The directories this client answers for.
#[derive(Debug, Default)]
pub(crate) struct NamesLeases {
    dirs: Mutex<HashMap<InodeId, Leased>>,
}

impl NamesLeases {
    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, Leased>> {
        self.dirs.lock().expect("names leases poisoned")
    }

    /// Whether `name` is surely not in `dir`: its lease runs, and this client never asked to
    /// add the name there since it began.
    pub fn absent(&self, dir: InodeId, name: &str) -> bool {
        let mut dirs = self.dirs();
        match dirs.get(&dir) {
            Some(leased) if leased.until <= Instant::now() => {
                dirs.remove(&dir);
                false
            }
            Some(leased) => !leased.added.contains(name),
            None => false,
        }
    }

    /// Notes, before a request that may add `name` to `dir` is sent, that it may be there
    /// from now on.
    pub fn naming(&self, dir: InodeId, name: &str) {
        let mut dirs = self.dirs();
        if let Some(leased) = dirs.get_mut(&dir) {
            if leased.added.len() >= NAMES_PER_LEASE_MAX {
                dirs.remove(&dir);
            } else {
                leased.added.insert(name.to_string());
            }
        }
    }

    /// The home granted a lease on `dir`, a directory this client made with a request first
    /// sent at `sent`, for `ms` milliseconds (0: none).
    pub fn granted(&self, dir: InodeId, sent: Instant, ms: u32) {
        if ms == 0 {
            return;
        }
        let mut dirs = self.dirs();
        if dirs.len() >= LEASES_KEPT {
            let now = Instant::now();
            dirs.retain(|_, leased| leased.until > now);
        }
        if dirs.len() < LEASES_KEPT {
            dirs.insert(
                dir,
                Leased {
                    until: sent + Duration::from_millis(u64::from(ms)),
                    added: HashSet::new(),
                },
            );
        }
    }

    /// The home renewed this client's lease on `dir` for `ms` milliseconds from `sent`, when
    /// a request that added a name there was first sent; 0: the lease is over.
    pub fn renewed(&self, dir: InodeId, sent: Instant, ms: u32) {
        let mut dirs = self.dirs();
        if ms == 0 {
            dirs.remove(&dir);
        } else if let Some(leased) = dirs.get_mut(&dir) {
            leased.until = leased
                .until
                .max(sent + Duration::from_millis(u64::from(ms)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a lease answers for names this client never added, never for one it did (even
    // when its request failed), and ends when the home says so or its time is up.
    #[test]
    fn a_lease_answers_only_for_names_never_added() {
        let leases = NamesLeases::default();
        let dir = InodeId(5);
        assert!(!leases.absent(dir, "a"), "no lease: ask the home");
        leases.granted(dir, Instant::now(), 60_000);
        assert!(leases.absent(dir, "a"));
        leases.naming(dir, "a");
        assert!(
            !leases.absent(dir, "a"),
            "a name this client added may be there"
        );
        assert!(leases.absent(dir, "b"));
        leases.renewed(dir, Instant::now(), 0);
        assert!(!leases.absent(dir, "b"), "the home ended the lease");
        leases.granted(dir, Instant::now() - Duration::from_millis(20), 10);
        assert!(
            !leases.absent(dir, "b"),
            "a lease whose time is up answers nothing"
        );
    }
}
