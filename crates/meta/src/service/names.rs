//! Names leases: a client that made a directory here may answer, for a while, that a name is
//! not in it without asking (docs/design/namespace.md, "Names leases"). A create's `LOOKUP`
//! of its new name then costs no round trip.
//!
//! The home's promise: while a lease runs, no name is added to its directory but by its
//! holder. A name added by anyone else (another client, another home finishing a rename or a
//! mkdir, a directory spreading) first recalls the lease and waits until it ran out; a
//! recalled lease is renewed no more. A holder counts its lease from before it first sent the
//! request that got it, the home from when it granted or renewed it, so the holder's lease
//! ends first. A start of the home does not know what its earlier start granted: every
//! addition waits one lease from the start, or the longer one an earlier start recorded.

use crate::config::NAMES_LEASE_MAX;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use weft_proto::ids::{ClientId, InodeId};
use weft_proto::messages::MetaRequest;

/// Leases kept before the ones that ran out are dropped.
const LEASES_KEPT: usize = 4096;

/// One directory's lease.
#[derive(Clone, Copy, Debug)]
struct Lease {
    holder: ClientId,
    until: Instant,
    /// Someone else adds a name: the lease is renewed no more.
    recalled: bool,
}

/// The names leases of a home.
#[derive(Debug)]
pub(crate) struct NamesLeases {
    /// How long a lease runs; zero grants none.
    length: Duration,
    /// By directory. A lease that ran out stays while nobody else added a name: its holder's
    /// next create renews it, as nothing was added that its holder does not know of.
    dirs: Mutex<HashMap<InodeId, Lease>>,
    /// Until when leases an earlier start of the home granted may run.
    quiet_until: Instant,
}

impl NamesLeases {
    /// The leases of a home that starts now, each running `length` (zero: none). `record` is
    /// where its starts keep the longest lease one of them may have granted, when they grant
    /// any: a start that runs shorter leases than the one before waits out the longer ones
    /// (an operator who lowers `names_lease_ms` and restarts). Blocks (a file's sync).
    pub fn start(length: Duration, record: Option<&Path>) -> NamesLeases {
        let before = record
            .and_then(|path| std::fs::read_to_string(path).ok())
            .map_or(Duration::ZERO, |text| {
                // A record that says nothing readable: the longest any start grants.
                text.trim()
                    .parse()
                    .map_or(NAMES_LEASE_MAX, Duration::from_millis)
            });
        let quiet = before.max(length);
        if let Some(path) = record {
            if quiet != before {
                write_record(path, quiet);
            }
            if let Some(runtime) = (quiet > length)
                .then(tokio::runtime::Handle::try_current)
                .and_then(Result::ok)
            {
                // Once the earlier start's leases ran out, only this start's can run.
                let (path, lowered) = (path.to_path_buf(), length);
                runtime.spawn(async move {
                    tokio::time::sleep(quiet).await;
                    let _ = tokio::task::spawn_blocking(move || write_record(&path, lowered)).await;
                });
            }
        }
        NamesLeases {
            length,
            dirs: Mutex::default(),
            quiet_until: Instant::now() + quiet,
        }
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, Lease>> {
        self.dirs.lock().expect("names leases poisoned")
    }

    fn length_ms(&self) -> u32 {
        u32::try_from(self.length.as_millis()).unwrap_or(u32::MAX)
    }

    /// Grants `holder` a lease on `dir`, a directory it made, before the directory is seen by
    /// anyone else (in the commit that makes it). Answers its length in milliseconds (0: no
    /// lease).
    pub fn grant(&self, dir: InodeId, holder: ClientId) -> u32 {
        if self.length.is_zero() {
            return 0;
        }
        let now = Instant::now();
        let mut dirs = self.dirs();
        if dirs.len() >= LEASES_KEPT {
            dirs.retain(|_, lease| lease.until > now);
        }
        if dirs.len() >= LEASES_KEPT {
            return 0;
        }
        dirs.insert(
            dir,
            Lease {
                holder,
                until: now + self.length,
                recalled: false,
            },
        );
        self.length_ms()
    }

    /// Renews `client`'s lease on `dir`, if it holds one nobody recalled (run out or not);
    /// answers its length in milliseconds, or 0.
    pub fn renew(&self, dir: InodeId, client: ClientId) -> u32 {
        match self.dirs().get_mut(&dir) {
            Some(lease) if lease.holder == client && !lease.recalled => {
                lease.until = Instant::now() + self.length;
                self.length_ms()
            }
            _ => 0,
        }
    }

    /// Waits until a name may be added to `dir` by `adder` (`None`: not a client's request):
    /// another's lease on it is recalled and has run out, and so has any lease of an earlier
    /// start.
    pub async fn clear_for(&self, dir: InodeId, adder: Option<ClientId>) {
        loop {
            let wait = {
                let now = Instant::now();
                let mut until = (now < self.quiet_until).then_some(self.quiet_until);
                let mut dirs = self.dirs();
                match dirs.get_mut(&dir) {
                    Some(lease) if Some(lease.holder) == adder => {}
                    Some(lease) if lease.until <= now => {
                        dirs.remove(&dir);
                    }
                    Some(lease) => {
                        lease.recalled = true;
                        until = until.max(Some(lease.until));
                    }
                    None => {}
                }
                until
            };
            match wait {
                Some(until) => tokio::time::sleep_until(until).await,
                None => return,
            }
        }
    }
}

/// Records `length` at `path`, before a lease of that length is granted. A failure is logged:
/// the next start then waits what it finds, or its own length.
fn write_record(path: &Path, length: Duration) {
    let text = format!("{}\n", length.as_millis());
    if let Err(error) = weft_service::durable::write_file_durably(path, text.as_bytes()) {
        tracing::warn!(%error, "recording the names lease length failed");
    }
}

/// The directory `request` may add a name to, and the client it comes from (`None`: another
/// home's step): every request that adds a name is here. (A consistency check's repair that
/// files a damaged directory's entry again under its name's hash is not: it mends what no
/// lookup could find before.)
pub(crate) fn adds_name(request: &MetaRequest) -> Option<(InodeId, Option<ClientId>)> {
    match request {
        MetaRequest::Create {
            mutation, parent, ..
        }
        | MetaRequest::CreateSpread {
            mutation, parent, ..
        } => Some((*parent, Some(mutation.client))),
        MetaRequest::Link {
            mutation,
            new_parent,
            ..
        }
        | MetaRequest::Rename {
            mutation,
            new_parent,
            ..
        } => Some((*new_parent, Some(mutation.client))),
        MetaRequest::InsertDentry { parent, .. } | MetaRequest::ExchangeDentry { parent, .. } => {
            Some((*parent, None))
        }
        // A directory that spreads has its names added on other homes from then on.
        MetaRequest::SetShards { dir, .. } => Some((*dir, None)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NAMES_LEASE_DEFAULT;

    // Goal: a holder renews its lease, another client's addition recalls it and waits until
    // it ran out, after which the holder renews it no more; the holder's own additions never
    // wait past the start's quiet time.
    #[tokio::test(start_paused = true)]
    async fn another_clients_name_waits_for_the_lease_and_ends_it() {
        let leases = NamesLeases::start(NAMES_LEASE_DEFAULT, None);
        let (dir, holder, other) = (InodeId(7), ClientId(1), ClientId(2));
        leases.clear_for(dir, Some(holder)).await;
        let started = Instant::now();
        assert_eq!(leases.grant(dir, holder), 250);
        assert_eq!(leases.renew(dir, holder), 250, "renewed by its holder");
        assert_eq!(leases.renew(dir, other), 0, "not another's to renew");
        leases.clear_for(dir, Some(holder)).await;
        assert_eq!(
            Instant::now(),
            started,
            "the holder's own names do not wait"
        );
        tokio::time::sleep(NAMES_LEASE_DEFAULT * 2).await;
        assert_eq!(
            leases.renew(dir, holder),
            250,
            "run out, but nobody else added a name: renewed"
        );
        let renewed = Instant::now();
        leases.clear_for(dir, Some(other)).await;
        assert!(
            Instant::now() >= renewed + NAMES_LEASE_DEFAULT,
            "another's name waits until the lease ran out"
        );
        assert_eq!(leases.renew(dir, holder), 0, "a recalled lease is over");
        let again = Instant::now();
        leases.clear_for(dir, None).await;
        assert_eq!(Instant::now(), again, "nothing left to wait for");
    }

    // Goal: a home that starts makes every addition wait until leases of its earlier start
    // ran out.
    #[tokio::test(start_paused = true)]
    async fn a_start_waits_for_leases_it_does_not_know() {
        let started = Instant::now();
        let leases = NamesLeases::start(NAMES_LEASE_DEFAULT, None);
        leases.clear_for(InodeId(9), Some(ClientId(3))).await;
        assert!(Instant::now() >= started + NAMES_LEASE_DEFAULT);
        let none = NamesLeases::start(Duration::ZERO, None);
        assert_eq!(none.grant(InodeId(9), ClientId(3)), 0, "leases turned off");
    }

    // Goal: a start with shorter leases than the start before waits out the longer ones, and
    // records its own length once they ran out.
    #[tokio::test(start_paused = true)]
    async fn a_start_with_shorter_leases_waits_out_the_longer_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = dir.path().join("meta.names-lease");
        let long = Duration::from_millis(4000);
        drop(NamesLeases::start(long, Some(&record)));
        assert_eq!(
            std::fs::read_to_string(&record).expect("recorded"),
            "4000\n"
        );
        let started = Instant::now();
        let shorter = NamesLeases::start(NAMES_LEASE_DEFAULT, Some(&record));
        shorter.clear_for(InodeId(9), None).await;
        assert!(
            Instant::now() >= started + long,
            "the longer leases are waited out"
        );
        // The record is written on a blocking thread, in real time.
        for _ in 0..1000 {
            if std::fs::read_to_string(&record).expect("recorded") == "250\n" {
                return;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the shorter length is recorded once the longer leases ran out");
    }
}
