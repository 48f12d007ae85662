//! The client's side: route to the primary with the map's version, retry until answered.

use weft_mirror::{
    Answer, Change, ChunkId, ClientId, GroupId, GroupMap, Msg, Node, Send, Time, Timing, Version,
};

/// An operation a client runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOp {
    /// Change a chunk: write, punch, truncate or remove.
    Change {
        /// The group.
        group: GroupId,
        /// The change.
        change: Change,
    },
    /// Make the group's acknowledged writes durable on every member.
    Sync {
        /// The group.
        group: GroupId,
    },
    /// Read a chunk.
    Read {
        /// The group.
        group: GroupId,
        /// The chunk.
        chunk: ChunkId,
    },
    /// Run a round of a chunk's move to another group, as a metadata server pushes an
    /// object of a file it moves.
    Move {
        /// The group the chunk moves off.
        group: GroupId,
        /// The chunk.
        chunk: ChunkId,
        /// The group it moves to.
        to: GroupId,
        /// The move.
        id: u64,
        /// Whether this is its last round.
        seal: bool,
    },
}

impl ClientOp {
    fn group(&self) -> GroupId {
        match self {
            ClientOp::Change { group, .. }
            | ClientOp::Sync { group }
            | ClientOp::Read { group, .. }
            | ClientOp::Move { group, .. } => *group,
        }
    }
}

/// One operation a client ran, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord<D> {
    /// The operation.
    pub op: ClientOp,
    /// Its sequence number.
    pub seq: u64,
    /// When it was submitted.
    pub issued: Time,
    /// When it was answered, and how (never `Refused`: refusals are retried).
    pub done: Option<(Time, Answer<D>)>,
}

/// A client that runs one operation at a time and retries it until it is answered: through
/// refusals (it fetches the map again), lost messages and failovers. Every retry carries the
/// same sequence number, so a write that did land is not applied twice.
#[derive(Debug)]
pub struct Client<D> {
    id: ClientId,
    timing: Timing,
    map: GroupMap,
    next_seq: u64,
    /// The operation in progress and when it was last sent.
    current: Option<(usize, Time)>,
    /// Every operation, in order.
    pub history: Vec<OpRecord<D>>,
    /// Per group, the oldest loss epoch among writes since the last sync.
    unsynced: std::collections::BTreeMap<GroupId, u64>,
}

impl<D: Clone + std::fmt::Debug> Client<D> {
    /// A client with no map yet.
    pub fn new(id: ClientId, timing: Timing) -> Client<D> {
        Client {
            id,
            timing,
            map: GroupMap::default(),
            next_seq: 0,
            current: None,
            history: Vec::new(),
            unsynced: std::collections::BTreeMap::new(),
        }
    }

    /// The client's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// Whether it can take another operation.
    pub fn idle(&self) -> bool {
        self.current.is_none()
    }

    /// Starts `op`; the client must be idle.
    pub fn submit(&mut self, now: Time, op: ClientOp) -> Vec<Send<D>> {
        assert!(self.idle(), "one operation at a time");
        self.next_seq += 1;
        self.history.push(OpRecord {
            op,
            seq: self.next_seq,
            issued: now,
            done: None,
        });
        self.current = Some((self.history.len() - 1, now));
        self.send(now)
    }

    /// Sends the current operation to its group's primary as the map has it, or asks
    /// management for the map first.
    fn send(&mut self, now: Time) -> Vec<Send<D>> {
        let Some((index, _)) = self.current else {
            return Vec::new();
        };
        self.current = Some((index, now));
        let record = &self.history[index];
        let group = record.op.group();
        let (to, version) = match group.plain_server() {
            Some(server) => (server, Version(0)),
            None => match self.map.groups.get(&group) {
                Some(group) => (group.primary, group.version),
                None => {
                    return vec![Send {
                        to: Node::Mgmt,
                        msg: Msg::GetMap,
                    }]
                }
            },
        };
        let seq = record.seq;
        let msg = match &record.op {
            ClientOp::Change { group, change } => Msg::Change {
                group: *group,
                version,
                change: change.clone(),
                seq,
            },
            ClientOp::Sync { group } => Msg::Sync {
                group: *group,
                version,
                since: self.unsynced.get(group).copied().unwrap_or(u64::MAX),
                seq,
            },
            ClientOp::Read { group, chunk } => Msg::Read {
                group: *group,
                version,
                chunk: *chunk,
                seq,
            },
            ClientOp::Move {
                group,
                chunk,
                to,
                id,
                seal,
            } => Msg::Push {
                group: *group,
                version,
                chunk: *chunk,
                to: *to,
                id: *id,
                seal: *seal,
                seq,
            },
        };
        vec![Send {
            to: Node::Server(to),
            msg,
        }]
    }

    /// Handles an answer or a map.
    pub fn handle(&mut self, now: Time, _from: Node, msg: Msg<D>) -> Vec<Send<D>> {
        match msg {
            Msg::Map(map) => {
                self.map.merge_newer(map);
                self.send(now)
            }
            Msg::Reply { seq, answer } => {
                let Some((index, _)) = self.current else {
                    return Vec::new();
                };
                if self.history[index].seq != seq {
                    return Vec::new();
                }
                if let Answer::Refused(_) = answer {
                    // Routed with an old map, or the primary lost its lease: ask again.
                    return vec![Send {
                        to: Node::Mgmt,
                        msg: Msg::GetMap,
                    }];
                }
                let group = self.history[index].op.group();
                match (&self.history[index].op, &answer) {
                    (ClientOp::Change { .. }, Answer::Written { epoch }) => {
                        let oldest = self.unsynced.entry(group).or_insert(*epoch);
                        *oldest = (*oldest).min(*epoch);
                    }
                    (ClientOp::Sync { .. }, Answer::Done | Answer::Lost) => {
                        self.unsynced.remove(&group);
                    }
                    _ => {}
                }
                self.history[index].done = Some((now, answer));
                self.current = None;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// Sends the current operation again when it has not been answered in time.
    pub fn tick(&mut self, now: Time) -> Vec<Send<D>> {
        match self.current {
            Some((_, sent)) if now.saturating_sub(sent) >= self.timing.retry_ms => {
                let mut out = vec![Send {
                    to: Node::Mgmt,
                    msg: Msg::GetMap,
                }];
                out.extend(self.send(now));
                out
            }
            _ => Vec::new(),
        }
    }
}
