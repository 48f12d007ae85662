//! The simulator's moves of chunks between groups, as storage servers push objects (a drain,
//! `weft entry migrate`): a mover asks the primary of the group a chunk moves off for rounds
//! of its copy ([`Msg::Push`]), and the primary runs each as the storage servers do, by the
//! shared [`Round`] and [`Watches`]: every change it makes to the chunk as primary is noted
//! in the chunk's watch, a round copies what its watch says changed through a client of the
//! server's own (the copier) to the new group's primary, which forwards the copy as any write,
//! and checks the new group's loss epoch (its verifier) around it. The last round seals the
//! chunk here first, under its whole range (no change is under way, none lands after), copies
//! the last changes, syncs the copy, seals the chunk on the members, and only then drops its
//! bytes here.

use super::*;
use crate::client::ClientOp;
use weft_mirror::push::{Plan, Round, Step};

/// How a simulated round copies: in small pieces (chunks are a few dozen bytes), syncing
/// the copy at both ends, clearing it when the whole chunk is copied (its length is the
/// chunk's), sealing the members last.
const PLAN: Plan = Plan {
    piece: 16,
    boundary: u64::MAX,
    verify_each_round: true,
    clear_when_whole: true,
    mirrored: true,
};

/// The verifier a sync of the copy stands for when it answers that writes may be lost: none
/// a write answers (they answer loss epochs).
const LOST: u64 = u64::MAX;

/// Client ids from here on are servers' copiers: `COPIERS | server << 16 | boot`.
pub const COPIERS: ClientId = 1 << 31;

/// The copier client of `server` in its start `boot`: a restarted server's copier is another
/// client, so no answer to the old one reaches it.
pub fn copier_of(server: ServerId, boot: u64) -> ClientId {
    COPIERS | (server.0 & 0x7fff) << 16 | (boot & 0xffff) as ClientId
}

/// One round of a move under way here, as primary of the group its chunk moves off.
#[derive(Debug)]
pub(super) struct PushRun {
    /// The mover to answer, and its request's sequence number.
    mover: (ClientId, u64),
    key: (GroupId, ChunkId),
    /// The version it was admitted in: every step is admitted again in it.
    version: Version,
    to: GroupId,
    id: u64,
    seal: bool,
    /// The round, once its changes are taken (a last round waits for the whole range).
    round: Option<Round<GroupId>>,
    /// The chunk's whole range, held by a last round from its seal to its end.
    held: Option<Held>,
    /// The step under way: the copier's operation, or the members' seal.
    waiting: Option<Step>,
}

impl Server {
    /// Notes a change this server made to `key` as primary in the chunk's watch, if it is
    /// being moved.
    pub(super) fn note(&mut self, key: (GroupId, ChunkId), change: &Change) {
        match change {
            Change::Truncate { .. } | Change::Remove { .. } => self.watches.note_cut(key),
            Change::Write { .. } | Change::Punch { .. } => {
                let range = change.range();
                self.watches.note(key, range.start, range.end - range.start);
            }
            Change::Seal { .. } => {}
        }
    }

    /// A mover asks for a round of `chunk`'s move `id` to group `to`: admitted as primary of
    /// `group`, run here one at a time (a request while another runs is dropped: the mover
    /// sends it again).
    pub(super) fn push_request(
        &mut self,
        now: Time,
        mover: (ClientId, u64),
        (group, version, chunk): (GroupId, Version, ChunkId),
        (to, id, seal): (GroupId, u64, bool),
    ) -> Vec<Send<Bytes>> {
        if self.push.is_some() {
            return Vec::new();
        }
        if let Some(refusal) = self.admit(now, group, version) {
            return vec![reply(mover.0, mover.1, Answer::Refused(refusal))];
        }
        self.push = Some(PushRun {
            mover,
            key: (group, chunk),
            version,
            to,
            id,
            seal,
            round: None,
            held: None,
            waiting: None,
        });
        self.advance_push(now)
    }

    /// Moves the round under way on as far as it goes without waiting.
    pub(super) fn advance_push(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let mut out = Vec::new();
        loop {
            let Some(run) = self.push.as_ref() else {
                return out;
            };
            if run.waiting.is_some() {
                return out;
            }
            let (key, version, taken) = (run.key, run.version, run.round.is_some());
            // A primary deposed meanwhile (another took over, and runs the round again)
            // takes no step after its lease.
            if let Some(refusal) = self.admit(now, key.0, version) {
                out.extend(self.end_push(now, Answer::Refused(refusal)));
                return out;
            }
            if !taken && !self.take_round() {
                return out;
            }
            let run = self.push.as_mut().expect("looked up above");
            let Some(step) = run.round.as_mut().expect("taken").next_step() else {
                out.extend(self.end_push(now, Answer::Done));
                return out;
            };
            let (to, chunk) = (run.to, key.1);
            let op = match step {
                Step::Verify => ClientOp::Sync { group: to },
                Step::Clear => ClientOp::Change {
                    group: to,
                    change: Change::Remove { chunk },
                },
                Step::Copy(piece) => {
                    let data = self.store.volatile.get(&key).cloned().unwrap_or_default();
                    let start = (piece.offset as usize).min(data.len());
                    let end = ((piece.offset + piece.len) as usize).min(data.len());
                    let mut bytes = data[start..end].to_vec();
                    bytes.resize(piece.len as usize, 0);
                    // On a fresh copy a hole stays a hole, but for the last byte.
                    if piece.fresh && !piece.last && bytes.iter().all(|&byte| byte == 0) {
                        continue;
                    }
                    ClientOp::Change {
                        group: to,
                        change: Change::Write {
                            chunk,
                            offset: piece.offset,
                            data: bytes,
                        },
                    }
                }
                Step::SealMembers => {
                    run.waiting = Some(step);
                    out.extend(self.seal_members(now, key, version));
                    return out;
                }
                Step::Retire => {
                    self.store.retire(key);
                    continue;
                }
                Step::Ack { verifier } => {
                    self.watches.ack(key, run.id, verifier);
                    continue;
                }
            };
            run.waiting = Some(step);
            let sends = self.copier.submit(now, op);
            self.copier_out.extend(sends);
            return out;
        }
    }

    /// Takes what the round copies: a last round first holds the chunk's whole range (or
    /// waits for it: answers false) and seals the chunk, durably. A chunk sealed and dropped
    /// by an earlier last round only has its members sealed again.
    fn take_round(&mut self) -> bool {
        let run = self.push.as_mut().expect("a round under way");
        let key = run.key;
        if run.seal && run.held.is_none() {
            let Ok(id) = self.ranges.try_lock(&key, 0..u64::MAX, || ()) else {
                return false;
            };
            run.held = Some(Held { key, id });
        }
        let gone = self.store.sealed.contains(&key) && !self.store.volatile.contains_key(&key);
        let round = if gone {
            Round::gone(PLAN)
        } else {
            if run.seal {
                self.store.seal(key);
            }
            let watched = self.watches.take(key, run.id, run.seal);
            let length = self.store.volatile.get(&key).map_or(0, |d| d.len() as u64);
            Round::new(watched, length, run.seal, PLAN, None)
        };
        run.round = Some(round);
        true
    }

    /// Forwards the chunk's seal to every present member of its group (one absent misses
    /// it, and gets it with its resync).
    fn seal_members(
        &mut self,
        now: Time,
        (group, chunk): (GroupId, ChunkId),
        version: Version,
    ) -> Vec<Send<Bytes>> {
        let run = match self.begin_change(now, (group, version), chunk) {
            Ok(run) => run,
            Err(refused) => return self.end_push(now, Answer::Refused(refusal(refused))),
        };
        let waiter = Waiter {
            for_push: true,
            ..Waiter::default()
        };
        self.forward_change(now, (group, run), Change::Seal { chunk }, waiter)
    }

    /// The members' seal ended: taken by every present member, or given up (the round
    /// fails; the mover runs it again).
    pub(super) fn members_sealed(&mut self, now: Time, taken: bool) -> Vec<Send<Bytes>> {
        let Some(run) = self.push.as_mut() else {
            return Vec::new();
        };
        if !taken {
            return self.end_push(now, Answer::Refused(Refusal::WrongVersion));
        }
        run.waiting = None;
        self.advance_push(now)
    }

    /// The copier's messages: its answers move the round on.
    pub fn copier_handle(&mut self, now: Time, from: Node, msg: Msg<Bytes>) -> Vec<Send<Bytes>> {
        let sends = self.copier.handle(now, from, msg);
        self.copier_out.extend(sends);
        self.copied(now)
    }

    /// What the copier sends, to go out from its client id.
    pub fn take_copier_sends(&mut self) -> Vec<Send<Bytes>> {
        std::mem::take(&mut self.copier_out)
    }

    /// The copier's retries, and a last round's wait for its chunk's range.
    pub(super) fn tick_push(&mut self, now: Time) -> Vec<Send<Bytes>> {
        let sends = self.copier.tick(now);
        self.copier_out.extend(sends);
        if self.push.as_ref().is_some_and(|run| run.round.is_none()) {
            return self.advance_push(now);
        }
        Vec::new()
    }

    /// The copier answered the round's step (or has not yet): a copy that answers another
    /// loss epoch than before may have lost what it took, and the round fails with its
    /// watch restarted (the next copies the whole chunk again).
    fn copied(&mut self, now: Time) -> Vec<Send<Bytes>> {
        if !self.copier.idle() {
            return Vec::new();
        }
        let Some(run) = self.push.as_mut() else {
            return Vec::new();
        };
        if !matches!(
            run.waiting,
            Some(Step::Verify | Step::Clear | Step::Copy(_))
        ) {
            return Vec::new();
        }
        run.waiting = None;
        let answer = self.copier.history.last().and_then(|r| r.done.clone());
        let round = run.round.as_mut().expect("a step of a taken round");
        let answered = match answer {
            Some((_, Answer::Written { epoch })) => round.answered(run.to, epoch),
            Some((_, Answer::Done)) => Ok(()),
            // Writes answered since the copier's last sync may be gone: as a storage server
            // that restarted, it answers another verifier than any it answered before.
            Some((_, Answer::Lost)) => round.answered(run.to, LOST),
            other => panic!(
                "a copy of a chunk moving to group {} answered {other:?}",
                run.to
            ),
        };
        if answered.is_err() {
            self.watches.restart(run.key, run.id);
            return self.end_push(now, Answer::Refused(Refusal::WrongVersion));
        }
        self.advance_push(now)
    }

    /// Ends the round under way: the mover gets `answer` (a refusal: it sends the round
    /// again), the chunk's range is released.
    fn end_push(&mut self, now: Time, answer: Answer<Bytes>) -> Vec<Send<Bytes>> {
        let Some(run) = self.push.take() else {
            return Vec::new();
        };
        let mut out = vec![reply(run.mover.0, run.mover.1, answer)];
        if let Some(held) = run.held {
            out.extend(self.release(now, held));
        }
        out
    }
}
