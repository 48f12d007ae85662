//! One opening of a metadata home's store file on its primary, as a machine without I/O: what
//! the store wrote since its last sync, the syncs it asked for and how each ended, and the one
//! send under way — a sync's changes, or a step of a resync of a member's copy.
//!
//! Metadata servers run it under each served home's link (`meta/src/replica.rs`), the
//! simulator's servers under each home they serve (`crates/sim`); both carry out its sends
//! (journal, ship, write the file; read a piece and send it) and tell it how they ended.
//!
//! The rules it keeps:
//! - one sync at a time, in the order asked: a sync takes everything written since the one
//!   before, and finishes only after it (a commit told durable by an older sync never waits on
//!   a newer one, nor the reverse);
//! - reads see the store's writes at once: the file, then the sync under way (or the one that
//!   failed), then what was written since;
//! - a sync that could not ship fails every later one: its changes go to the shell, which
//!   keeps them for the home's next opening, where they ship first (unless a copy written by
//!   another primary voids them);
//! - a sync that shipped leaves its extents in the record of every absent member, taken before
//!   its commits are answered;
//! - a resync's steps run one at a time, never while a sync is being sent, from the extents
//!   the member missed when it left in sync and they were recorded, else the whole file; each
//!   step is computed from the file's length when it is taken; the last gives the copy the
//!   length and a sync, and ends the resync (an incremental one with its record forgotten).

use crate::membership::ResyncStart;
use crate::pages::{Changes, PageResync, PageStep};
use crate::ServerId;
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a home cuts its file for the members' records and for full copies, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pieces {
    /// Bytes per extent of a record of what an absent member misses.
    pub extent: u64,
    /// Bytes per step of a full copy.
    pub piece: u64,
}

/// A served home's sends: see the module's documentation.
#[derive(Debug)]
pub struct HomeSends {
    pieces: Pieces,
    /// What the store wrote since the last sync was taken.
    next: Changes,
    /// The file's length as the store sees it.
    len: u64,
    /// Syncs asked for so far: the last one's ticket.
    asked: u64,
    /// The last sync finished.
    done: u64,
    /// The sync taken from `next` and not finished; after a failure, the one that failed,
    /// kept for the reads until the home is opened again.
    sync: Option<Taken>,
    /// Set when a sync failed: no later one is taken.
    failed: bool,
    /// The step of a resync being sent, and whether it is its last.
    step: Option<(ResyncStart, bool)>,
    /// The resyncs of members' copies, by member.
    resyncs: BTreeMap<ServerId, Run>,
}

/// A sync taken from what the store wrote.
#[derive(Debug)]
struct Taken {
    ticket: u64,
    changes: Arc<Changes>,
    /// Whether it is being sent (journaled, shipped, written to the file).
    sending: bool,
}

/// A resync of a member's copy.
#[derive(Debug)]
struct Run {
    start: ResyncStart,
    plan: PageResync,
}

/// A sync to send.
#[derive(Clone, Debug)]
pub struct SyncSend {
    /// Its ticket: it finishes every sync asked up to this one.
    pub ticket: u64,
    /// What it changes.
    pub changes: Arc<Changes>,
}

/// The next send of a home, as [`HomeSends::next_send`] picks it.
#[derive(Clone, Debug)]
pub enum NextSend {
    /// A sync's changes.
    Sync(SyncSend),
    /// A step of `start`'s resync.
    Step(ResyncStart, PageStep),
}

/// How a resync begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResyncBegun {
    /// Whether it copies only what the member missed.
    pub incremental: bool,
    /// Whether the record of what the member missed is void: a full copy covers it.
    pub forget_record: bool,
    /// The resync of the same member it replaced.
    pub replaced: Option<ResyncStart>,
    /// Steps to copy a file of the given length, for progress.
    pub total: u64,
}

/// How a resync's step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEnd {
    /// More steps follow.
    Going,
    /// It was the last: the member's copy is up to date. An incremental resync's record is
    /// forgotten now.
    Finished {
        /// Whether it copied only what the member missed.
        incremental: bool,
    },
    /// It was not taken: the resync stopped (it starts again when the member still needs it).
    Stopped,
    /// It is no step of a current resync (one replaced or stopped meanwhile).
    Stale,
}

/// Why a step was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoStep {
    /// The resync is no longer current: replaced or stopped.
    Stale,
    /// Another send is under way.
    Busy,
}

/// A sync failed: no later one can be asked for on this opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed;

impl HomeSends {
    /// A new opening of a home whose file is `file_len` bytes long. `carried` are the changes
    /// of syncs an earlier opening here could not ship: a sync of them is asked for at once,
    /// so the first sync taken ships them, before anything written after them.
    pub fn open(carried: Changes, file_len: u64, pieces: Pieces) -> HomeSends {
        let asked = u64::from(!carried.is_empty());
        HomeSends {
            pieces,
            len: carried.last_len().unwrap_or(file_len),
            next: carried,
            asked,
            done: 0,
            sync: None,
            failed: false,
            step: None,
            resyncs: BTreeMap::new(),
        }
    }

    /// The store writes `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.next.write(offset, data);
    }

    /// The store sets the file's length.
    pub fn set_len(&mut self, len: u64) {
        self.next.set_len(len);
        self.len = len;
    }

    /// The file's length as the store sees it.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// The store's writes since the last sync was taken.
    pub fn next(&self) -> &Changes {
        &self.next
    }

    /// Lays what the file lacks of the store's writes over `buffer`, which holds the file's
    /// bytes from `offset`.
    pub fn overlay(&self, offset: u64, buffer: &mut [u8]) {
        if let Some(sync) = &self.sync {
            sync.changes.overlay(offset, buffer);
        }
        self.next.overlay(offset, buffer);
    }

    /// Asks for a sync of everything written so far: its ticket.
    ///
    /// # Errors
    /// A sync failed: the home must be opened again.
    pub fn ask(&mut self) -> Result<u64, Failed> {
        if self.failed {
            return Err(Failed);
        }
        self.asked += 1;
        Ok(self.asked)
    }

    /// The last sync asked for.
    pub fn asked(&self) -> u64 {
        self.asked
    }

    /// Whether a sync was taken and has not finished: the next one waits for it.
    pub fn syncing(&self) -> bool {
        self.sync.is_some() && !self.failed
    }

    /// Whether a sync failed.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// How sync `ticket` ended: `Ok` once it finished, `Err` once it (or one before it)
    /// failed; `None` while it is under way.
    pub fn outcome(&self, ticket: u64) -> Option<Result<(), Failed>> {
        if self.done >= ticket {
            Some(Ok(()))
        } else if self.failed {
            Some(Err(Failed))
        } else {
            None
        }
    }

    /// Takes the sync asked for, with everything written since the last one, when none is
    /// under way; it is sent once [`HomeSends::send_sync`] says so.
    pub fn take_sync(&mut self) -> Option<SyncSend> {
        if self.sync.is_some() || self.failed || self.asked == self.done {
            return None;
        }
        let taken = Taken {
            ticket: self.asked,
            changes: Arc::new(std::mem::take(&mut self.next)),
            sending: false,
        };
        let send = SyncSend {
            ticket: taken.ticket,
            changes: Arc::clone(&taken.changes),
        };
        self.sync = Some(taken);
        Some(send)
    }

    /// Starts sending the sync taken, when no resync's step is being sent.
    ///
    /// # Errors
    /// A step is being sent (the shell's sends are not one at a time), or no sync is taken.
    pub fn send_sync(&mut self) -> Result<SyncSend, NoStep> {
        if self.step.is_some() {
            return Err(NoStep::Busy);
        }
        match &mut self.sync {
            Some(taken) if !self.failed && !taken.sending => {
                taken.sending = true;
                Ok(SyncSend {
                    ticket: taken.ticket,
                    changes: Arc::clone(&taken.changes),
                })
            }
            _ => Err(NoStep::Stale),
        }
    }

    /// The extents the sync being sent writes, in a file `before` bytes long before it: what
    /// each absent member misses, recorded before the sync finishes.
    pub fn missed(&self, before: u64) -> Vec<u64> {
        self.sync.as_ref().map_or_else(Vec::new, |sync| {
            sync.changes.extents(self.pieces.extent, before)
        })
    }

    /// The sync being sent reached the file and every present member (`shipped`), or not.
    /// Returns the changes to keep for the home's next opening when it did not; they stay
    /// here too, for the reads.
    pub fn synced(&mut self, shipped: bool) -> Option<Arc<Changes>> {
        let taken = self.sync.as_mut().expect("a sync is being sent");
        assert!(
            taken.sending,
            "sync {} ended before it was sent",
            taken.ticket
        );
        if !shipped {
            // Kept for the reads; nothing is sent after it.
            taken.sending = false;
            self.failed = true;
            return Some(Arc::clone(&taken.changes));
        }
        // Syncs finish one at a time, in the order asked for.
        assert!(
            self.done < taken.ticket && taken.ticket <= self.asked,
            "sync {} finished after sync {} with {} asked",
            taken.ticket,
            self.done,
            self.asked
        );
        self.done = taken.ticket;
        self.sync = None;
        None
    }

    /// The next send when none is under way: the sync asked for, else a step of a resync, for
    /// a file `file_len` bytes long now.
    pub fn next_send(&mut self, file_len: u64) -> Option<NextSend> {
        if self.failed || self.step.is_some() || self.sync.as_ref().is_some_and(|s| s.sending) {
            return None;
        }
        if self.take_sync().is_some() || self.syncing() {
            return self.send_sync().ok().map(NextSend::Sync);
        }
        let start = self.resyncs.values().next()?.start;
        match self.step(start, file_len) {
            Ok(Some(step)) => Some(NextSend::Step(start, step)),
            Ok(None) | Err(_) => None,
        }
    }

    /// Begins resync `start` of a member's copy: of `recorded`, the extents the member missed,
    /// when it left in sync and they were recorded and no full copy is asked for; else of the
    /// whole file, `file_len` bytes now. A resync of the same member under way is replaced:
    /// a step of it being sent lands or not, and is no step of this one.
    pub fn begin_resync(
        &mut self,
        start: ResyncStart,
        recorded: Option<Vec<u64>>,
        file_len: u64,
    ) -> ResyncBegun {
        let (plan, forget_record) = match recorded {
            Some(extents) if !start.full => {
                (PageResync::missed(extents, self.pieces.extent), false)
            }
            recorded => (PageResync::full(self.pieces.piece), recorded.is_some()),
        };
        let begun = ResyncBegun {
            incremental: plan.incremental(),
            forget_record,
            replaced: None,
            total: plan.total(file_len),
        };
        let replaced = self.resyncs.insert(start.member, Run { start, plan });
        ResyncBegun {
            replaced: replaced.map(|run| run.start),
            ..begun
        }
    }

    /// The resyncs under way.
    pub fn resyncs(&self) -> impl Iterator<Item = ResyncStart> + '_ {
        self.resyncs.values().map(|run| run.start)
    }

    /// The next step of resync `start`, for a file `file_len` bytes long now; `None` when its
    /// last step was taken.
    ///
    /// # Errors
    /// The resync is no longer current (or a sync failed: the home must be opened again), or
    /// a send is under way.
    pub fn step(&mut self, start: ResyncStart, file_len: u64) -> Result<Option<PageStep>, NoStep> {
        let Some(run) = self
            .resyncs
            .get_mut(&start.member)
            .filter(|run| run.start == start && !self.failed)
        else {
            return Err(NoStep::Stale);
        };
        if self.step.is_some() || self.sync.as_ref().is_some_and(|s| s.sending) {
            return Err(NoStep::Busy);
        }
        let step = run.plan.step(file_len);
        if let Some(step) = step {
            self.step = Some((start, matches!(step, PageStep::Finish { .. })));
        }
        Ok(step)
    }

    /// The step of resync `start` being sent was taken by its member (`taken`), or not.
    pub fn stepped(&mut self, start: ResyncStart, taken: bool) -> StepEnd {
        let last = match self.step {
            Some((stepping, last)) if stepping == start => last,
            _ => return StepEnd::Stale,
        };
        self.step = None;
        let current = self
            .resyncs
            .get(&start.member)
            .is_some_and(|run| run.start == start);
        if !current {
            return StepEnd::Stale;
        }
        if !taken {
            self.resyncs.remove(&start.member);
            return StepEnd::Stopped;
        }
        if !last {
            return StepEnd::Going;
        }
        let run = self.resyncs.remove(&start.member).expect("current");
        StepEnd::Finished {
            incremental: run.plan.incremental(),
        }
    }

    /// Stops resync `start` (its version ended, its member did not take a step in time):
    /// whether it was current. A step of it being sent is no longer waited for.
    pub fn stop_resync(&mut self, start: ResyncStart) -> bool {
        if self.step.is_some_and(|(stepping, _)| stepping == start) {
            self.step = None;
        }
        let current = self
            .resyncs
            .get(&start.member)
            .is_some_and(|run| run.start == start);
        if current {
            self.resyncs.remove(&start.member);
        }
        current
    }
}

#[cfg(test)]
mod tests;
