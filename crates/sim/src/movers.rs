//! The simulator's movers: clients that move other clients' chunks to other groups round by
//! round, as metadata servers push the objects of the files they move (`Msg::Push`, run by
//! the primaries in `server/pushes.rs`), and the world's record of where each moved chunk
//! lives now.

use super::*;

/// A move under way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moving {
    /// The client whose chunk it is.
    pub(crate) owner: u32,
    pub(crate) chunk: ChunkId,
    pub(crate) from: GroupId,
    pub(crate) to: GroupId,
    pub(crate) id: u64,
    /// Rounds before the last one still to run.
    pub(crate) rounds_left: u32,
    /// Whether the last round was sent.
    pub(crate) sealing: bool,
}

/// A chunk that moved.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moved {
    pub(crate) from: GroupId,
    pub(crate) to: GroupId,
    /// When its last round was answered.
    pub(crate) at: Time,
}

impl World {
    /// The mover `client`'s move, when its last round was answered: its chunk lives in its
    /// new group from now on.
    pub(crate) fn moved_on(&mut self, client: u32) {
        let Some(moving) = self.moving.get(&client).copied() else {
            return;
        };
        if !moving.sealing {
            return;
        }
        self.moving.remove(&client);
        let at = match self.clients[client as usize].history.last() {
            Some(OpRecord {
                done: Some((at, _)),
                ..
            }) => *at,
            _ => self.now,
        };
        self.location.insert(moving.chunk, moving.to);
        self.moved.insert(
            moving.chunk,
            Moved {
                from: moving.from,
                to: moving.to,
                at,
            },
        );
        self.sealed
            .entry(moving.owner)
            .or_default()
            .push((moving.from, moving.chunk));
    }

    /// The mover `client`'s next round: of its move under way, or of a new move of a chunk
    /// of a client of a mirrored group, never moved before, to another mirrored group; none
    /// for a while now and then.
    pub(crate) fn next_round(&mut self, client: u32) -> Option<ClientOp> {
        if !self.moving.contains_key(&client) {
            if self.random.next_u64() % 4 != 0 {
                return None;
            }
            let owner = (self.random.next_u64() % u64::from(self.config.clients)) as u32;
            let groups = self.config.groups.len() as u32;
            let from = self.group_of(owner);
            if is_home(from) || groups < 2 {
                return None;
            }
            let index = self.random.next_u64() % self.config.chunks_per_client;
            let chunk = self.chunk_of(owner, index);
            let busy = self.moving.values().any(|m| m.chunk == chunk);
            if busy || self.moved.contains_key(&chunk) {
                return None;
            }
            let to = GroupId(
                (from.0 - 1 + self.random.between(1, u64::from(groups) - 1) as u32) % groups + 1,
            );
            self.next_move += 1;
            let moving = Moving {
                owner,
                chunk,
                from,
                to,
                id: self.next_move,
                rounds_left: self.random.between(0, 2) as u32,
                sealing: false,
            };
            self.moving.insert(client, moving);
        }
        let moving = self.moving.get_mut(&client).expect("just made");
        let seal = moving.rounds_left == 0;
        if seal {
            moving.sealing = true;
        } else {
            moving.rounds_left -= 1;
        }
        Some(ClientOp::Move {
            group: moving.from,
            chunk: moving.chunk,
            to: moving.to,
            id: moving.id,
            seal,
        })
    }
}
