//! A storage server's side: primary and secondary of its groups.

use crate::{
    Answer, ChunkId, ChunkState, ClientId, GroupId, GroupMap, MemberState, Msg, Node, Refusal,
    Send, ServerId, Time, Timing, Version,
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

/// A forward waiting for members' acknowledgements.
#[derive(Clone, Debug)]
struct Pending<D> {
    group: GroupId,
    work: Work<D>,
    /// Members that have not acknowledged yet, with when it was last sent to each.
    waiting: BTreeMap<ServerId, Time>,
    /// When it was first sent.
    started: Time,
    /// The client to answer when every member has it.
    client: Option<(ClientId, u64)>,
}

/// Bringing one returning member up to date.
#[derive(Clone, Debug)]
struct Resync {
    version: Version,
    full: bool,
    begun: bool,
    remaining: BTreeSet<ChunkId>,
    /// The copies reached the member's disk (a member is good only once they did).
    synced: bool,
    in_flight: Option<u64>,
    done: bool,
}

/// A storage server's mirror machine.
#[derive(Debug)]
pub struct Server<D> {
    id: ServerId,
    timing: Timing,
    boot: u64,
    unsynced_boot: u64,
    store: Store<D>,
    map: GroupMap,
    lease_until: Option<Time>,
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
            map: GroupMap::default(),
            lease_until: None,
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

    fn has_lease(&self, now: Time) -> bool {
        self.lease_until.is_some_and(|until| now < until)
    }

    /// Heartbeats, retries of forwards, and resync progress.
    pub fn tick(&mut self, now: Time) -> Vec<Send<D>> {
        let mut out = Vec::new();
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.timing.heartbeat_ms;
            out.push(Send {
                to: Node::Mgmt,
                msg: Msg::Heartbeat {
                    boot: self.boot,
                    unsynced_boot: self.unsynced_boot,
                    sent_at: now,
                    resynced: self.resynced(),
                    unreachable: self.unreachable(now),
                },
            });
        }
        for op in self.pending.keys().copied().collect::<Vec<_>>() {
            let retry = self.timing.retry_ms;
            let pending = self.pending.get_mut(&op).expect("listed above");
            let due: Vec<ServerId> = pending
                .waiting
                .iter()
                .filter(|(_, sent)| now.saturating_sub(**sent) >= retry)
                .map(|(server, _)| *server)
                .collect();
            for server in due {
                pending.waiting.insert(server, now);
            }
            let pending = pending.clone();
            for (server, sent) in &pending.waiting {
                if *sent == now {
                    out.extend(self.forward(op, &pending, *server));
                }
            }
        }
        out.extend(self.advance_resyncs(now));
        out
    }

    fn resynced(&self) -> Vec<(GroupId, Version, ServerId)> {
        self.resyncs
            .iter()
            .filter(|(_, resync)| resync.done)
            .map(|((group, member), resync)| (*group, resync.version, *member))
            .collect()
    }

    fn unreachable(&self, now: Time) -> Vec<(GroupId, Version, ServerId)> {
        let mut out = BTreeSet::new();
        for pending in self.pending.values() {
            if now.saturating_sub(pending.started) < self.timing.member_timeout_ms {
                continue;
            }
            if let Some(group) = self.map.groups.get(&pending.group) {
                if group.primary == self.id {
                    for server in pending.waiting.keys() {
                        out.insert((pending.group, group.version, *server));
                    }
                }
            }
        }
        out.into_iter().collect()
    }

    fn forward(&self, op: u64, pending: &Pending<D>, to: ServerId) -> Option<Send<D>> {
        let version = self.map.groups.get(&pending.group)?.version;
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
        Some(Send {
            to: Node::Server(to),
            msg,
        })
    }

    /// Handles a message.
    pub fn handle(&mut self, now: Time, from: Node, msg: Msg<D>) -> Vec<Send<D>> {
        match (from, msg) {
            (Node::Mgmt, Msg::HeartbeatAck { sent_at, map }) => {
                let lease = sent_at + self.timing.lease_ms;
                self.lease_until = Some(self.lease_until.map_or(lease, |l| l.max(lease)));
                self.adopt(map, now)
            }
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
        let refusal = match self.map.groups.get(&group) {
            None => Some(Refusal::WrongVersion),
            Some(known) if known.primary != self.id => Some(Refusal::NotPrimary),
            Some(known) if known.version != version => Some(Refusal::WrongVersion),
            Some(_) if !self.has_lease(now) => Some(Refusal::NoLease),
            Some(_) => None,
        };
        if refusal.is_none() {
            self.served.push((now, group, version));
        }
        refusal
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
                // A retry of a write that is already here: answer once every member has it.
                let waiting = self
                    .pending
                    .values()
                    .any(|p| p.client == Some((client, current.writer.1)));
                if waiting {
                    return Vec::new();
                }
                return vec![reply(
                    client,
                    seq,
                    Answer::Written {
                        epoch: current.stamp_epoch,
                    },
                )];
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
            stamp_epoch: self.map.groups.get(&group).map_or(0, |g| g.loss_epoch),
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
        self.start(
            now,
            group,
            Work::Replicate { chunk, state },
            Some((client, seq)),
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
        let epoch = self.map.groups.get(&group).map_or(0, |g| g.loss_epoch);
        if since < epoch {
            return vec![reply(client, seq, Answer::Lost)];
        }
        self.store.sync(group);
        self.start(now, group, Work::Sync, Some((client, seq)))
    }

    /// Sends `work` to every present secondary of `group`; answers the client at once if
    /// there is none.
    fn start(
        &mut self,
        now: Time,
        group: GroupId,
        work: Work<D>,
        client: Option<(ClientId, u64)>,
    ) -> Vec<Send<D>> {
        let targets: Vec<ServerId> = self
            .map
            .groups
            .get(&group)
            .map(|g| g.present_secondaries().map(|m| m.server).collect())
            .unwrap_or_default();
        self.start_to(now, group, work, client, targets)
    }

    fn start_to(
        &mut self,
        now: Time,
        group: GroupId,
        work: Work<D>,
        client: Option<(ClientId, u64)>,
        targets: Vec<ServerId>,
    ) -> Vec<Send<D>> {
        if targets.is_empty() {
            return match client {
                Some((client, seq)) => vec![reply(client, seq, Self::answer_for(&work))],
                None => Vec::new(),
            };
        }
        let op = self.op_id();
        let pending = Pending {
            group,
            work,
            waiting: targets.iter().map(|t| (*t, now)).collect(),
            started: now,
            client,
        };
        let out = targets
            .iter()
            .filter_map(|t| self.forward(op, &pending, *t))
            .collect();
        self.pending.insert(op, pending);
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
        let mut out = self.complete_finished();
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Answers the clients of forwards every member has acknowledged.
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
            for resync in self.resyncs.values_mut() {
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
        }
        out
    }

    /// Takes a newer map: forwards stop waiting for members that left (recording what they
    /// miss), a deposed primary drops its forwards unanswered, resyncs are planned anew.
    fn adopt(&mut self, map: GroupMap, now: Time) -> Vec<Send<D>> {
        for (id, before) in self.map.merge_newer(map) {
            let group = self.map.groups[&id].clone();
            if group.primary != self.id {
                self.pending.retain(|_, p| p.group != id);
                self.resyncs.retain(|(g, _), _| *g != id);
                continue;
            }
            let present: BTreeSet<ServerId> =
                group.present_secondaries().map(|m| m.server).collect();

            let was_primary = before.as_ref().is_some_and(|b| b.primary == self.id);
            for member in &group.members {
                if member.state != MemberState::Absent || member.server == self.id {
                    continue;
                }
                let key = (id, member.server);
                if self.store.missed.contains_key(&key) {
                    continue;
                }
                // Newly absent: it misses what it had not acknowledged, and every later write.
                let was_in_sync = was_primary
                    && before
                        .as_ref()
                        .and_then(|b| b.member(member.server))
                        .is_some_and(|m| m.state == MemberState::Good);
                let missed = if was_in_sync {
                    Missed::Chunks(
                        self.pending
                            .values()
                            .filter(|p| p.group == id && p.waiting.contains_key(&member.server))
                            .filter_map(|p| match &p.work {
                                Work::Replicate { chunk, .. } => Some(*chunk),
                                _ => None,
                            })
                            .collect(),
                    )
                } else {
                    Missed::Everything
                };
                self.store.missed.insert(key, missed);
            }
            for pending in self.pending.values_mut().filter(|p| p.group == id) {
                pending.waiting.retain(|server, _| present.contains(server));
            }
            // An incremental resync goes on across versions while its member stays present and
            // this server stays primary. A full one starts again: the new version may mean the
            // member restarted and lost what it was sent.
            let version = group.version;
            let mut abandoned = Vec::new();
            self.resyncs.retain(|(g, member), resync| {
                if *g != id {
                    return true;
                }
                let keep = was_primary
                    && group
                        .member(*member)
                        .is_some_and(|m| m.state == MemberState::NeedsResync { full: false });
                if keep {
                    resync.version = version;
                } else {
                    abandoned.extend(resync.in_flight);
                }
                keep
            });
            // A step of an abandoned resync must not reach the member later: a begin sent
            // again would drop what the new resync copied.
            for op in abandoned {
                self.pending.remove(&op);
            }
            for member in group.present_secondaries() {
                let MemberState::NeedsResync { full } = member.state else {
                    if let Some(done) = self.resyncs.remove(&(id, member.server)) {
                        if let Some(op) = done.in_flight {
                            self.pending.remove(&op);
                        }
                    }
                    continue;
                };
                let key = (id, member.server);
                if self.resyncs.contains_key(&key) {
                    continue;
                }
                let missed = self.store.missed.get(&key).cloned();
                let (full, remaining) = match missed {
                    Some(Missed::Chunks(chunks)) if !full => (false, chunks),
                    _ => (true, self.store.chunks(id)),
                };
                self.resyncs.insert(
                    key,
                    Resync {
                        version: group.version,
                        full,
                        begun: false,
                        remaining,
                        synced: false,
                        in_flight: None,
                        done: false,
                    },
                );
            }
        }
        let mut out = self.complete_finished();
        out.extend(self.advance_resyncs(now));
        out
    }

    /// Sends each resync's next step: the begin, then one chunk at a time.
    fn advance_resyncs(&mut self, now: Time) -> Vec<Send<D>> {
        let mut out = Vec::new();
        for key in self.resyncs.keys().copied().collect::<Vec<_>>() {
            let resync = &self.resyncs[&key];
            if resync.in_flight.is_some() || resync.done {
                continue;
            }
            let (group, member) = key;
            let at = self.map.groups.get(&group).map_or(0, |g| g.version);
            let work = if !resync.begun {
                Work::ResyncBegin {
                    full: resync.full,
                    at,
                }
            } else if let Some(chunk) = resync.remaining.first().copied() {
                Work::ResyncChunk {
                    chunk,
                    state: self.store.volatile.get(&(group, chunk)).cloned(),
                    at,
                }
            } else if !resync.synced {
                Work::Sync
            } else {
                let resync = self.resyncs.get_mut(&key).expect("listed above");
                resync.done = true;
                self.store.missed.remove(&key);
                continue;
            };
            let sends = self.start_to(now, group, work, None, vec![member]);
            let op = self.next_op;
            self.resyncs.get_mut(&key).expect("listed above").in_flight = Some(op);
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
        let mine = self.map.groups.get(&group);
        let accepted = mine.is_some_and(|g| {
            g.version == version
                && g.primary == primary
                && g.member(self.id)
                    .is_some_and(|m| m.state != MemberState::Absent)
        });
        if !accepted {
            let known = mine.map_or(0, |g| g.version);
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

fn reply<D>(client: ClientId, seq: u64, answer: Answer<D>) -> Send<D> {
    Send {
        to: Node::Client(client),
        msg: Msg::Reply { seq, answer },
    }
}
