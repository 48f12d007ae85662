//! A storage server's side: primary and secondary of its groups. What it decides about its
//! groups (versions, lease, admission, unreachable members, resyncs to run, records of missed
//! changes) is [`Membership`], the machine the servers run; this module adds the data path the
//! simulator checks it with: chunks, stamps, forwards and resync copies.

use crate::membership::{Membership, Refused, ResyncStart};
use crate::{
    Answer, ChunkId, ChunkState, ClientId, GroupId, GroupMap, Msg, Node, Refusal, Send, ServerId,
    Time, Timing, Version,
};
use std::collections::{BTreeMap, BTreeSet};

/// What a returning member must get from its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missed {
    /// These chunks changed while it was away.
    Chunks(BTreeSet<ChunkId>),
    /// Anything may differ: copy everything.
    Everything,
}

/// A server's data: what the page cache holds (`volatile`) and what reached the disk
/// (`durable`). A crash keeps only `durable`. The records of what absent members missed are
/// written durably before the writes they cover are acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store<D> {
    /// Every chunk as reads see it.
    pub volatile: BTreeMap<(GroupId, ChunkId), ChunkState<D>>,
    /// Every chunk as it is on disk.
    pub durable: BTreeMap<(GroupId, ChunkId), ChunkState<D>>,
    /// What each absent member misses, per (group, member); durable.
    pub missed: BTreeMap<(GroupId, ServerId), Missed>,
}

impl<D> Default for Store<D> {
    fn default() -> Self {
        Store {
            volatile: BTreeMap::new(),
            durable: BTreeMap::new(),
            missed: BTreeMap::new(),
        }
    }
}

impl<D: Clone> Store<D> {
    /// A crash: what was not synced is gone.
    pub fn crash(&mut self) {
        self.volatile = self.durable.clone();
    }

    fn sync(&mut self, group: GroupId) {
        self.durable.retain(|(g, _), _| *g != group);
        for (key, state) in self.volatile.range((group, 0)..=(group, ChunkId::MAX)) {
            self.durable.insert(*key, state.clone());
        }
    }

    fn chunks(&self, group: GroupId) -> BTreeSet<ChunkId> {
        self.volatile
            .range((group, 0)..=(group, ChunkId::MAX))
            .map(|((_, chunk), _)| *chunk)
            .collect()
    }
}

/// What a forward to the members does.
#[derive(Clone, Debug)]
enum Work<D> {
    Replicate {
        chunk: ChunkId,
        state: ChunkState<D>,
    },
    Sync,
    ResyncBegin {
        full: bool,
        at: Version,
    },
    ResyncChunk {
        chunk: ChunkId,
        state: Option<ChunkState<D>>,
        at: Version,
    },
}

/// A member a forward waits for.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    /// When it was last sent.
    sent: Time,
    /// The version it was last sent with, and since when sends under that version failed.
    version: Version,
    since: Time,
}

/// A forward waiting for members' acknowledgements.
#[derive(Clone, Debug)]
struct Pending<D> {
    group: GroupId,
    work: Work<D>,
    waiting: BTreeMap<ServerId, Waiting>,
    /// The client to answer when every member has it.
    client: Option<(ClientId, u64)>,
    /// The resync this is a step of: sent with the resync's version only, and given up (the
    /// resync stops) when the member does not take it within the member timeout.
    resync: Option<ResyncStart>,
}

/// Bringing one returning member up to date, in one version of its group.
#[derive(Clone, Debug)]
struct Resync {
    start: ResyncStart,
    /// A full copy (asked for, or no record of what the member missed).
    full: bool,
    begun: bool,
    remaining: BTreeSet<ChunkId>,
    /// The copies reached the member's disk (a member is good only once they did).
    synced: bool,
    in_flight: Option<u64>,
}

/// A storage server's mirror machine.
#[derive(Debug)]
pub struct Server<D> {
    id: ServerId,
    timing: Timing,
    boot: u64,
    unsynced_boot: u64,
    store: Store<D>,
    membership: Membership<()>,
    next_heartbeat: Time,
    next_op: u64,
    /// Stamp counters per group, within the group's current version.
    counters: BTreeMap<GroupId, (Version, u64)>,
    pending: BTreeMap<u64, Pending<D>>,
    resyncs: BTreeMap<(GroupId, ServerId), Resync>,
    /// The resync this server (as a returning member) began per group: (primary, version). A
    /// late copy of the same begin must not drop the chunks copied since.
    begun: BTreeMap<GroupId, (ServerId, Version)>,
    /// Client operations served as primary: (time, group, version), for the simulator's
    /// split-brain check.
    pub served: Vec<(Time, GroupId, Version)>,
}

impl<D: Clone + PartialEq + std::fmt::Debug> Server<D> {
    /// A server starting (or restarting: `boot` must differ) with `store`; `unsynced_boot`
    /// differs from the last one when the restart lost what the store had not synced.
    pub fn new(
        id: ServerId,
        timing: Timing,
        (boot, unsynced_boot): (u64, u64),
        store: Store<D>,
        now: Time,
    ) -> Server<D> {
        Server {
            id,
            timing,
            boot,
            unsynced_boot,
            store,
            membership: Membership::new(),
            next_heartbeat: now,
            next_op: 1,
            counters: BTreeMap::new(),
            pending: BTreeMap::new(),
            resyncs: BTreeMap::new(),
            begun: BTreeMap::new(),
            served: Vec::new(),
        }
    }

    /// The data.
    pub fn store(&self) -> &Store<D> {
        &self.store
    }

    /// Gives the data back (for a restart after a crash).
    pub fn into_store(self) -> Store<D> {
        self.store
    }

    fn op_id(&mut self) -> u64 {
        self.next_op += 1;
        self.next_op
    }

    fn loss_epoch(&self, group: GroupId) -> u64 {
        self.membership
            .group(group)
            .map_or(0, |(g, _)| g.loss_epoch)
    }

    /// Heartbeats, retries of forwards, and resync progress.
    pub fn tick(&mut self, now: Time) -> Vec<Send<D>> {
        let mut out = Vec::new();
        let timeout = self.timing.member_timeout_ms;
        // Members a change has not reached for the member timeout; resync steps the member
        // has not taken for as long stop their resync.
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            let pending = &self.pending[&op];
            let late: Vec<(ServerId, Waiting)> = pending
                .waiting
                .iter()
                .filter(|(_, w)| now.saturating_sub(w.since) >= timeout)
                .map(|(member, w)| (*member, *w))
                .collect();
            if late.is_empty() {
                continue;
            }
            match pending.resync {
                Some(start) => {
                    self.pending.remove(&op);
                    self.stop_resync(start);
                }
                None => {
                    let group = pending.group;
                    for (member, waiting) in late {
                        self.membership.delivery_failing(
                            group,
                            member,
                            waiting.version,
                            waiting.since,
                        );
                    }
                }
            }
        }
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.timing.heartbeat_ms;
            out.push(Send {
                to: Node::Mgmt,
                msg: Msg::Heartbeat {
                    boot: self.boot,
                    unsynced_boot: self.unsynced_boot,
                    sent_at: now,
                    resynced: self.membership.resynced(),
                    unreachable: self.membership.unreachable(now, timeout),
                },
            });
        }
        let retry = self.timing.retry_ms;
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            let due: Vec<ServerId> = self.pending[&op]
                .waiting
                .iter()
                .filter(|(_, w)| now.saturating_sub(w.sent) >= retry)
                .map(|(member, _)| *member)
                .collect();
            for member in due {
                out.extend(self.send_forward(now, op, member));
            }
        }
        out.extend(self.complete_finished());
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Sends forward `op` to `member` with the version the decisions give; a member that left
    /// stops being waited for; a forward this server may no longer send is dropped (its
    /// client told to route again, a resync stopped).
    fn send_forward(&mut self, now: Time, op: u64, member: ServerId) -> Vec<Send<D>> {
        let Some(pending) = self.pending.get(&op) else {
            return Vec::new();
        };
        let version = match pending.resync {
            Some(start) => self
                .membership
                .resync_version(now, self.id, start)
                .map(Some),
            None => self
                .membership
                .version_to_member(now, self.id, pending.group, member),
        };
        match version {
            Ok(Some(version)) => {
                let pending = self.pending.get_mut(&op).expect("looked up above");
                let waiting = pending.waiting.entry(member).or_insert(Waiting {
                    sent: now,
                    version,
                    since: now,
                });
                if waiting.version != version {
                    // A new version starts the member's time over.
                    waiting.version = version;
                    waiting.since = now;
                }
                waiting.sent = now;
                vec![forward(op, pending, version, member)]
            }
            Ok(None) => {
                let pending = self.pending.get_mut(&op).expect("looked up above");
                pending.waiting.remove(&member);
                Vec::new()
            }
            Err(refused) => {
                let pending = self.pending.remove(&op).expect("looked up above");
                if let Some(start) = pending.resync {
                    self.stop_resync(start);
                }
                if let Work::Replicate { chunk, .. } = &pending.work {
                    // Applied here, given up before these members took it.
                    for member in pending.waiting.keys() {
                        self.membership
                            .undelivered(pending.group, *member, [*chunk]);
                    }
                }
                pending
                    .client
                    .map(|(client, seq)| reply(client, seq, Answer::Refused(refusal(refused))))
                    .into_iter()
                    .collect()
            }
        }
    }

    /// Handles a message.
    pub fn handle(&mut self, now: Time, from: Node, msg: Msg<D>) -> Vec<Send<D>> {
        match (from, msg) {
            (Node::Mgmt, Msg::HeartbeatAck { sent_at, map }) => self.adopt(sent_at, map, now),
            (
                Node::Client(client),
                Msg::Write {
                    group,
                    version,
                    chunk,
                    data,
                    seq,
                },
            ) => self.client_write(now, client, (group, version), chunk, data, seq),
            (
                Node::Client(client),
                Msg::Sync {
                    group,
                    version,
                    since,
                    seq,
                },
            ) => self.client_sync(now, client, (group, version), since, seq),
            (
                Node::Client(client),
                Msg::Read {
                    group,
                    version,
                    chunk,
                    seq,
                },
            ) => {
                let answer = match self.admit(now, group, version) {
                    Some(refusal) => Answer::Refused(refusal),
                    None => Answer::Data(
                        self.store
                            .volatile
                            .get(&(group, chunk))
                            .map(|s| s.data.clone()),
                    ),
                };
                vec![reply(client, seq, answer)]
            }
            (
                Node::Server(primary),
                msg @ (Msg::Replicate { .. }
                | Msg::SyncReplica { .. }
                | Msg::ResyncBegin { .. }
                | Msg::ResyncChunk { .. }),
            ) => self.as_member(primary, msg),
            (Node::Server(member), Msg::MemberAck { group, op, .. }) => {
                self.acknowledged(group, op, member, now)
            }
            // A member that knows another version refused: the forward is sent again on a
            // later tick, once one of the two has the current map.
            _ => Vec::new(),
        }
    }

    /// The answer to a client once `work` is on every member.
    fn answer_for(work: &Work<D>) -> Answer<D> {
        match work {
            Work::Replicate { state, .. } => Answer::Written {
                epoch: state.stamp_epoch,
            },
            _ => Answer::Done,
        }
    }

    /// Admits a client operation on `group` routed with `version`, recording it as served, or
    /// says why this server may not serve it.
    fn admit(&mut self, now: Time, group: GroupId, version: Version) -> Option<Refusal> {
        match self.membership.admit_primary(now, self.id, group, version) {
            Ok(_) => {
                self.served.push((now, group, version));
                None
            }
            Err(refused) => Some(refusal(refused)),
        }
    }

    fn client_write(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        chunk: ChunkId,
        data: D,
        seq: u64,
    ) -> Vec<Send<D>> {
        if let Some(refusal) = self.admit(now, group, version) {
            return vec![reply(client, seq, Answer::Refused(refusal))];
        }
        if let Some(current) = self.store.volatile.get(&(group, chunk)) {
            if current.writer.0 == client && current.writer.1 >= seq {
                // A retry of a write that is already here: answered once every member has it.
                // A forward still under way answers it; otherwise the members may never have
                // got it (its forward was dropped when the lease ran out), so it goes to them
                // again, with its stamp (a member that has it keeps it as it is).
                let waiting = self
                    .pending
                    .values()
                    .any(|p| p.client == Some((client, current.writer.1)));
                if waiting {
                    return Vec::new();
                }
                let state = current.clone();
                let members = self.membership.present_secondaries(group);
                return self.start(
                    now,
                    group,
                    Work::Replicate { chunk, state },
                    (Some((client, seq)), None),
                    members,
                );
            }
        }
        let counter = self.counters.entry(group).or_insert((version, 0));
        if counter.0 != version {
            *counter = (version, 0);
        }
        counter.1 += 1;
        let state = ChunkState {
            data,
            stamp: (version, counter.1),
            stamp_epoch: self.loss_epoch(group),
            writer: (client, seq),
        };
        self.store.volatile.insert((group, chunk), state.clone());
        for ((missed_group, _), missed) in &mut self.store.missed {
            if *missed_group == group {
                if let Missed::Chunks(chunks) = missed {
                    chunks.insert(chunk);
                }
            }
        }
        let members = self.membership.present_secondaries(group);
        self.start(
            now,
            group,
            Work::Replicate { chunk, state },
            (Some((client, seq)), None),
            members,
        )
    }

    fn client_sync(
        &mut self,
        now: Time,
        client: ClientId,
        (group, version): (GroupId, Version),
        since: u64,
        seq: u64,
    ) -> Vec<Send<D>> {
        if let Some(refusal) = self.admit(now, group, version) {
            return vec![reply(client, seq, Answer::Refused(refusal))];
        }
        if since < self.loss_epoch(group) {
            return vec![reply(client, seq, Answer::Lost)];
        }
        self.store.sync(group);
        let members = self.membership.present_secondaries(group);
        self.start(now, group, Work::Sync, (Some((client, seq)), None), members)
    }

    /// Sends `work` to `members`; answers the client at once if there is none. Returns the
    /// forward's operation id beside what to send.
    fn start(
        &mut self,
        now: Time,
        group: GroupId,
        work: Work<D>,
        (client, resync): (Option<(ClientId, u64)>, Option<ResyncStart>),
        members: Vec<ServerId>,
    ) -> Vec<Send<D>> {
        if members.is_empty() {
            return match client {
                Some((client, seq)) => vec![reply(client, seq, Self::answer_for(&work))],
                None => Vec::new(),
            };
        }
        let op = self.op_id();
        self.pending.insert(
            op,
            Pending {
                group,
                work,
                waiting: BTreeMap::new(),
                client,
                resync,
            },
        );
        let mut out = Vec::new();
        for member in members {
            out.extend(self.send_forward(now, op, member));
        }
        out.extend(self.complete_finished());
        out
    }

    fn acknowledged(
        &mut self,
        group: GroupId,
        op: u64,
        member: ServerId,
        now: Time,
    ) -> Vec<Send<D>> {
        let Some(pending) = self.pending.get_mut(&op) else {
            return Vec::new();
        };
        if pending.group != group {
            return Vec::new();
        }
        pending.waiting.remove(&member);
        if pending.resync.is_none() {
            self.membership.delivered(group, member);
        }
        let mut out = self.complete_finished();
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Answers the clients of forwards every member has acknowledged, and moves their
    /// resyncs on.
    fn complete_finished(&mut self) -> Vec<Send<D>> {
        let finished: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.waiting.is_empty())
            .map(|(op, _)| *op)
            .collect();
        let mut out = Vec::new();
        for op in finished {
            let pending = self.pending.remove(&op).expect("listed above");
            if let Some((client, seq)) = pending.client {
                out.push(reply(client, seq, Self::answer_for(&pending.work)));
            }
            let Some(start) = pending.resync else {
                continue;
            };
            let Some(resync) = self.resyncs.get_mut(&(start.group, start.member)) else {
                continue;
            };
            if resync.in_flight != Some(op) {
                continue;
            }
            resync.in_flight = None;
            match &pending.work {
                Work::ResyncBegin { .. } => resync.begun = true,
                Work::ResyncChunk { chunk, .. } => {
                    resync.remaining.remove(chunk);
                }
                Work::Sync => resync.synced = true,
                Work::Replicate { .. } => {}
            }
        }
        out
    }

    /// A resync stops (its version ended, or the member does not take its steps); it starts
    /// again at the next map while the member needs it.
    fn stop_resync(&mut self, start: ResyncStart) {
        let key = (start.group, start.member);
        if self.resyncs.get(&key).is_some_and(|r| r.start == start) {
            let resync = self.resyncs.remove(&key).expect("looked up above");
            if let Some(op) = resync.in_flight {
                self.pending.remove(&op);
            }
        }
        self.membership.resync_ended(start, false);
    }

    /// Takes a newer map, as the decisions say: forwards stop waiting for members that left
    /// (their records of what they miss started), a deposed primary drops its forwards
    /// unanswered, resyncs of versions that ended stop and new ones start.
    fn adopt(&mut self, sent_at: Time, map: GroupMap, now: Time) -> Vec<Send<D>> {
        let id = self.id;
        let adopted = self.membership.adopt(
            sent_at,
            self.timing.lease_ms,
            map.groups.into_values().map(|g| (g, ())).collect(),
            |member| member == id,
        );
        for group in &adopted.drop_missed {
            self.store.missed.retain(|(g, _), _| g != group);
        }
        for (group, member, owed) in &adopted.record_missed {
            // It misses what it had not acknowledged or was given up, and every later write.
            let unacknowledged = self
                .pending
                .values()
                .filter(|p| p.group == *group && p.waiting.contains_key(member))
                .filter_map(|p| match &p.work {
                    Work::Replicate { chunk, .. } => Some(*chunk),
                    _ => None,
                })
                .chain(owed.iter().copied())
                .collect();
            self.store
                .missed
                .entry((*group, *member))
                .or_insert(Missed::Chunks(unacknowledged));
        }
        for (_, group) in &adopted.taken {
            if group.primary != id {
                self.pending.retain(|_, p| p.group != group.id);
            } else {
                let present: BTreeSet<ServerId> =
                    group.present_secondaries().map(|m| m.server).collect();
                for pending in self.pending.values_mut().filter(|p| p.group == group.id) {
                    pending.waiting.retain(|member, _| present.contains(member));
                }
            }
            let ended: Vec<ResyncStart> = self
                .resyncs
                .values()
                .filter(|r| r.start.group == group.id && r.start.version != group.version)
                .map(|r| r.start)
                .collect();
            for start in ended {
                self.stop_resync(start);
            }
        }
        for start in adopted.starts {
            let key = (start.group, start.member);
            let (full, remaining) = match self.store.missed.get(&key) {
                Some(Missed::Chunks(chunks)) if !start.full => (false, chunks.clone()),
                _ => (true, self.store.chunks(start.group)),
            };
            if let Some(replaced) = self.resyncs.insert(
                key,
                Resync {
                    start,
                    full,
                    begun: false,
                    remaining,
                    synced: false,
                    in_flight: None,
                },
            ) {
                if let Some(op) = replaced.in_flight {
                    self.pending.remove(&op);
                }
            }
        }
        let mut out = self.complete_finished();
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Sends each resync's next step: the begin, then one chunk at a time, then a sync; a
    /// resync whose steps all landed is reported finished.
    fn advance_resyncs(&mut self, now: Time) -> Vec<Send<D>> {
        let mut out = Vec::new();
        for key in self.resyncs.keys().copied().collect::<Vec<_>>() {
            let Some(resync) = self.resyncs.get(&key) else {
                continue;
            };
            if resync.in_flight.is_some() {
                continue;
            }
            let start = resync.start;
            let at = start.version;
            let work = if !resync.begun {
                Work::ResyncBegin {
                    full: resync.full,
                    at,
                }
            } else if let Some(chunk) = resync.remaining.first().copied() {
                Work::ResyncChunk {
                    chunk,
                    state: self.store.volatile.get(&(start.group, chunk)).cloned(),
                    at,
                }
            } else if !resync.synced {
                Work::Sync
            } else {
                self.resyncs.remove(&key);
                self.store.missed.remove(&key);
                self.membership.resync_ended(start, true);
                continue;
            };
            let sends = self.start(
                now,
                start.group,
                work,
                (None, Some(start)),
                vec![start.member],
            );
            let op = self.next_op;
            if let Some(resync) = self.resyncs.get_mut(&key) {
                if self.pending.contains_key(&op) {
                    resync.in_flight = Some(op);
                }
            }
            out.extend(sends);
        }
        out
    }

    /// A forward from this group's primary.
    fn as_member(&mut self, primary: ServerId, msg: Msg<D>) -> Vec<Send<D>> {
        let (group, version, op) = match &msg {
            Msg::Replicate {
                group, version, op, ..
            }
            | Msg::SyncReplica { group, version, op }
            | Msg::ResyncBegin {
                group, version, op, ..
            }
            | Msg::ResyncChunk {
                group, version, op, ..
            } => (*group, *version, *op),
            _ => return Vec::new(),
        };
        if self
            .membership
            .admit_forward(self.id, group, version)
            .is_err()
        {
            let known = self.membership.group(group).map_or(0, |(g, _)| g.version);
            return vec![Send {
                to: Node::Server(primary),
                msg: Msg::MemberRefused {
                    group,
                    version: known,
                    op,
                },
            }];
        }
        match msg {
            Msg::Replicate { chunk, state, .. } => {
                let key = (group, chunk);
                let newer = self
                    .store
                    .volatile
                    .get(&key)
                    .is_none_or(|current| current.stamp < state.stamp);
                if newer {
                    self.store.volatile.insert(key, state);
                }
            }
            Msg::SyncReplica { .. } => self.store.sync(group),
            Msg::ResyncBegin { full, at, .. } => {
                let first = self.begun.insert(group, (primary, at)) != Some((primary, at));
                if full && first {
                    // Anything written before the resync's version may be stale: only what
                    // this primary sends survives.
                    self.store
                        .volatile
                        .retain(|(g, _), s| *g != group || s.stamp.0 >= at);
                }
            }
            Msg::ResyncChunk {
                chunk, state, at, ..
            } => {
                let key = (group, chunk);
                let current = self.store.volatile.get(&key);
                let stale = current.is_none_or(|c| c.stamp.0 < at);
                match state {
                    Some(state) => {
                        if stale || current.is_some_and(|c| c.stamp < state.stamp) {
                            self.store.volatile.insert(key, state);
                        }
                    }
                    None => {
                        if stale {
                            self.store.volatile.remove(&key);
                        }
                    }
                }
            }
            _ => {}
        }
        vec![Send {
            to: Node::Server(primary),
            msg: Msg::MemberAck { group, version, op },
        }]
    }
}

/// Forward `op` to `member` under `version`.
fn forward<D: Clone>(op: u64, pending: &Pending<D>, version: Version, member: ServerId) -> Send<D> {
    let group = pending.group;
    let msg = match &pending.work {
        Work::Replicate { chunk, state } => Msg::Replicate {
            group,
            version,
            op,
            chunk: *chunk,
            state: state.clone(),
        },
        Work::Sync => Msg::SyncReplica { group, version, op },
        Work::ResyncBegin { full, at } => Msg::ResyncBegin {
            group,
            version,
            op,
            full: *full,
            at: *at,
        },
        Work::ResyncChunk { chunk, state, at } => Msg::ResyncChunk {
            group,
            version,
            op,
            chunk: *chunk,
            state: state.clone(),
            at: *at,
        },
    };
    Send {
        to: Node::Server(member),
        msg,
    }
}

/// A refusal as the simulated wire carries it.
fn refusal(refused: Refused) -> Refusal {
    match refused {
        Refused::UnknownGroup | Refused::WrongVersion { .. } | Refused::NotPresent => {
            Refusal::WrongVersion
        }
        Refused::NotPrimary { .. } => Refusal::NotPrimary,
        Refused::NoLease => Refusal::NoLease,
    }
}

fn reply<D>(client: ClientId, seq: u64, answer: Answer<D>) -> Send<D> {
    Send {
        to: Node::Client(client),
        msg: Msg::Reply { seq, answer },
    }
}
