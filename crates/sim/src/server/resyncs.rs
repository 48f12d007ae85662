//! The simulator's storage resyncs: a returning member's copy brought up to date by the plan
//! of `weft_mirror::resync`, one step at a time, each step a send of its own that the member
//! must take in the resync's version.

use super::*;

impl Server {
    /// A resync stops (its version ended, or the member does not take its steps); it starts
    /// again at the next map while the member needs it.
    pub(super) fn stop_resync(&mut self, now: Time, start: ResyncStart) -> Vec<Send<Bytes>> {
        let key = (start.group, start.member);
        let mut out = Vec::new();
        if self.resyncs.get(&key).is_some_and(|r| r.start == start) {
            self.resync_counts.stopped += 1;
            let resync = self.resyncs.remove(&key).expect("looked up above");
            if let Some(op) = resync.in_flight {
                out.extend(self.end_pending(now, op));
            }
            if let Some(held) = resync.object {
                out.extend(self.release(now, held));
            }
        }
        self.membership.resync_ended(start, false);
        out
    }

    /// Moves each resync on as far as it goes without waiting, by its plan: a step that
    /// takes a chunk's range waits while the range is held (the plan asks for it again); a
    /// step sent to the member waits for it; a resync whose steps all landed is reported
    /// finished.
    pub(super) fn advance_resyncs(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        for key in self.resyncs.keys().copied().collect::<Vec<_>>() {
            while let Some(resync) = self.resyncs.get_mut(&key) {
                if resync.in_flight.is_some() {
                    break;
                }
                let start = resync.start;
                let group = start.group;
                let work = match resync.plan.step() {
                    ResyncStep::Object(chunk) | ResyncStep::RemoveIfGone(chunk) => {
                        let object = (group, chunk);
                        let Ok(id) = self.ranges.try_lock(&object, 0..u64::MAX, || ()) else {
                            break;
                        };
                        resync.object = Some(Held { key: object, id });
                        // A chunk sealed by a move's last round keeps its bytes until the
                        // round retires them, and is copied until then, as a storage
                        // server's object is: a member that takes over holds all of it.
                        resync.plan.holds(match self.store.volatile.get(&object) {
                            Some(data) => resync::Held::Object {
                                length: data.len() as u64,
                                largest: COPY_PIECE,
                            },
                            None if self.store.sealed.contains(&object) => resync::Held::SealedOff,
                            None => resync::Held::Gone,
                        });
                        continue;
                    }
                    ResyncStep::Remove(chunk) => Work::Change {
                        tag: self.step_tag(start),
                        change: Change::Remove { chunk },
                    },
                    ResyncStep::Write {
                        object: chunk,
                        offset,
                        len,
                    } => {
                        // Under the chunk's range, as the plan holds it: the chunk is as long
                        // as when its copy began (a storage server fails the resync there).
                        let piece = offset as usize..(offset + len) as usize;
                        let data = match self.store.volatile.get(&(group, chunk)) {
                            Some(data) if data.len() >= piece.end => data[piece].to_vec(),
                            _ => panic!(
                                "chunk {chunk} of group {group:?} changed while its resync copy held its range"
                            ),
                        };
                        Work::Change {
                            tag: self.step_tag(start),
                            change: Change::Write {
                                chunk,
                                offset,
                                data,
                            },
                        }
                    }
                    ResyncStep::SyncObject(chunk) => Work::SyncChunk(chunk),
                    ResyncStep::Seal(chunk) => Work::Change {
                        tag: self.step_tag(start),
                        change: Change::Seal { chunk },
                    },
                    ResyncStep::Release(_) => {
                        if let Some(held) = resync.object.take() {
                            out.extend(self.release(now, held));
                        }
                        continue;
                    }
                    ResyncStep::ListMember { after } => Work::List { after },
                    ResyncStep::ListPrimary => {
                        // Sealed chunks too: the member gets their seals.
                        let sealed = self
                            .store
                            .sealed
                            .range((group, 0)..=(group, ChunkId::MAX))
                            .map(|(_, chunk)| *chunk);
                        let mut chunks: Vec<ChunkId> =
                            self.store.chunks(group).chain(sealed).collect();
                        chunks.sort_unstable();
                        chunks.dedup();
                        resync.plan.primary_listed(chunks);
                        continue;
                    }
                    ResyncStep::SyncMember => Work::Sync,
                    ResyncStep::Done => {
                        self.resync_counts.finished += 1;
                        let resync = self.resyncs.remove(&key).expect("looked up above");
                        if resync.plan.incremental() {
                            self.store.missed.remove(&key);
                        }
                        self.membership.resync_ended(start, true);
                        break;
                    }
                };
                out.extend(self.send_step(now, start, work));
            }
        }
        out
    }

    /// The tag of the next step of `start`'s resync.
    pub(super) fn step_tag(&mut self, start: ResyncStart) -> ChangeId {
        let numbers = self
            .numbering
            .of((start.group, start.version, start.member), || {
                self.next_resync_client += 1;
                self.next_resync_client
            });
        let number = numbers.draw();
        ChangeId {
            client: numbers.client,
            number,
            settled_below: number,
            abandoned: Vec::new(),
        }
    }

    /// Sends one step of `start`'s resync to its member, as the resync's forward under way.
    pub(super) fn send_step(
        &mut self,
        now: Time,
        start: ResyncStart,
        work: Work,
    ) -> Vec<Send<Bytes>> {
        let delivery = Delivery::new(
            &self.membership,
            now,
            self.id,
            start.group,
            Sending::Step(start),
        );
        let pending = Pending {
            work,
            run: Run::Step(delivery),
            waiter: Waiter::default(),
        };
        let (op, out) = self.start(now, pending);
        if let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) {
            if resync.start == start {
                // A step that ended at once (the member left) leaves nothing to wait for.
                resync.in_flight = op;
            }
        }
        out
    }
}

/// Chunks per page of a member's listing.
pub(super) const LIST_PAGE: usize = 4;

/// Bytes per write of a resync's copy of a chunk, so that a copy takes several.
pub(super) const COPY_PIECE: u64 = 8;
