//! A client's session with the cluster ([`Session`]): its id, the numbers of its mutating
//! requests and changes of file data, the handles it has open and the locks it holds. The
//! namespace calls and the data path number what they send by it; after a server restarts,
//! the opens and locks it keeps are reclaimed; after the session expires, a new id replaces
//! the old one and the opens are reclaimed in it. The locks and opens it holds live on each
//! file's home metadata server, in memory; the session remembers the ranges each of its lock
//! owners holds (with the same arithmetic as the server, `proto::locks`), the handles it has
//! open with their capabilities, and the epoch of each home it holds either on
//! ([`HeldLocks`], [`HeldOpens`]); `client/locks.rs` reclaims them when a home's epoch changes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use weft_mirror::numbers::{Numbers, Pending};
use weft_proto::access::{Caller, Capability};
use weft_proto::ids::ClientId;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::locks::apply_to_owner;
use weft_proto::messages::LockRange;
use weft_proto::messages::{ChangeTag, MutationId};

/// A client's session: what the servers know this client by and hold for it.
pub(crate) struct Session {
    /// The current session's id (a [`ClientId`]): a new one after the last one expired.
    id: AtomicU64,
    /// Held while an expired session is replaced.
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// The numbers of this client's mutating requests and changes.
    numbers: Numbers,
    /// The locks this client holds, to reclaim after their server restarts.
    pub(crate) locks: HeldLocks,
    /// The handles this client has open, per file, to open again after their server
    /// restarts, with the capabilities granted to them.
    pub(crate) opens: HeldOpens,
}

impl Session {
    /// The session management registered as `id`.
    pub(crate) fn new(id: ClientId) -> Session {
        Session {
            id: AtomicU64::new(id.0),
            renewing: tokio::sync::Mutex::new(()),
            numbers: Numbers::default(),
            locks: HeldLocks::default(),
            opens: HeldOpens::default(),
        }
    }

    /// The session's id now.
    pub(crate) fn id(&self) -> ClientId {
        ClientId(self.id.load(Ordering::Acquire))
    }

    /// Replaces the expired session `expired` with `renewed`; false when another caller
    /// replaced it already.
    pub(crate) fn renewed(&self, expired: ClientId, renewed: ClientId) -> bool {
        self.id
            .compare_exchange(expired.0, renewed.0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Begins a change of file data (a write or a fallocate), numbered among this client's
    /// mutations so the storage servers apply it at most once and never late
    /// ([`ChangeTag`]).
    pub(crate) fn begin_change(&self) -> Change<'_> {
        Change {
            session: self,
            pending: self.numbers.begin(),
        }
    }

    /// Begins a mutating metadata request: its id, and the number held until it is answered.
    pub(crate) fn begin_mutation(&self) -> (MutationId, Pending<'_>) {
        let pending = self.numbers.begin();
        (
            MutationId {
                client: self.id(),
                seq: pending.number,
                oldest_pending: pending.oldest_pending,
            },
            pending,
        )
    }
}

/// A change of file data in progress ([`Session::begin_change`]).
pub(crate) struct Change<'a> {
    session: &'a Session,
    pending: Pending<'a>,
}

impl Change<'_> {
    /// The tag a copy of the change sent now carries: what this client has settled is
    /// looked at again for every retry.
    pub(crate) fn tag(&self) -> ChangeTag {
        weft_net::mirror::change_tag(self.session.id(), self.pending.number, self.pending.marks())
    }

    /// The change failed: a copy of it still on its way must not land later.
    pub(crate) fn failed(&mut self) {
        self.pending.failed();
    }
}

/// What this client holds: inode → owner → ranges; and the epoch of each home seen.
#[derive(Default)]
pub(crate) struct HeldLocks {
    held: Mutex<HashMap<InodeId, HashMap<u64, Vec<LockRange>>>>,
    /// The epoch of each home this client held a lock or an open on when it last looked;
    /// `None` once everything held there must be reclaimed whatever its epoch (a new session).
    pub(crate) epochs: Mutex<HashMap<NodeId, Option<u64>>>,
    /// Held by the reclaim under way: the periodic one and one a grace answer asked for do
    /// not reclaim the same home twice at once.
    pub(crate) reclaiming: tokio::sync::Mutex<()>,
    /// Per home, its reclaims of opens begun and ended so far (odd while one runs): an open
    /// answered by a server that restarted before the open was recorded here may not be
    /// among the opens a reclaim saw.
    pub(crate) reclaims: Mutex<HashMap<NodeId, u64>>,
    /// Homes whose opens the next reclaim registers again whatever their epoch: an open
    /// recorded after a reclaim looked could not be registered again at once.
    pub(crate) stale: Mutex<std::collections::HashSet<NodeId>>,
}

/// The handles this client has open: inode → handles, with what each was opened for and by
/// whom (an open for a new capability asks the same), and the capabilities its opens were
/// granted.
#[derive(Default)]
pub(crate) struct HeldOpens {
    held: Mutex<HashMap<InodeId, HeldFile>>,
}

/// The opens of one file.
#[derive(Default)]
struct HeldFile {
    handles: HashMap<u64, (u8, Caller)>,
    /// At most one per access asked (read, write, both).
    capabilities: Vec<Capability>,
}

impl HeldOpens {
    pub(crate) fn record(
        &self,
        (inode, handle): (InodeId, u64),
        opened: (u8, Caller),
        capability: Option<Capability>,
    ) {
        self.held
            .lock()
            .expect("held opens poisoned")
            .entry(inode)
            .or_default()
            .handles
            .insert(handle, opened);
        if let Some(capability) = capability {
            self.renew(inode, capability);
        }
    }

    /// Keeps `capability` for the file instead of the one granting the same access (a grant
    /// made again, with a wider growth bound, for the room its home reserved).
    pub(crate) fn renew(&self, inode: InodeId, capability: Capability) {
        let mut held = self.held.lock().expect("held opens poisoned");
        if let Some(file) = held.get_mut(&inode) {
            file.capabilities
                .retain(|kept| kept.access != capability.access);
            file.capabilities.push(capability);
        }
    }

    /// Forgets a handle closed; the file's capabilities go with its last handle.
    pub(crate) fn forget(&self, inode: InodeId, handle: u64) {
        let mut held = self.held.lock().expect("held opens poisoned");
        if let Some(file) = held.get_mut(&inode) {
            file.handles.remove(&handle);
            if file.handles.is_empty() {
                held.remove(&inode);
            }
        }
    }

    /// A capability of `inode` granting `want` ([`weft_proto::access`] bits) to `session`, if
    /// an open of it was granted one.
    pub(crate) fn capability(
        &self,
        inode: InodeId,
        want: u8,
        session: weft_proto::ids::ClientId,
    ) -> Option<Capability> {
        let held = self.held.lock().expect("held opens poisoned");
        // Of those that grant it, the one whose room reaches furthest (a reserve grants the
        // access of the open it was asked through again, with the new room).
        held.get(&inode)?
            .capabilities
            .iter()
            .filter(|capability| capability.access & want == want && capability.session == session)
            .max_by_key(|capability| {
                capability
                    .growth
                    .map_or(u64::MAX, |growth| growth.object_end)
            })
            .copied()
    }

    /// The capability of `session` granting `want` that handle `handle` of `inode` holds,
    /// if it was opened for at least that (expired or not: it shows what the open was
    /// granted, see [`weft_proto::messages::MetaRequest::Open`]).
    pub(crate) fn granted(
        &self,
        inode: InodeId,
        handle: u64,
        want: u8,
        session: weft_proto::ids::ClientId,
    ) -> Option<Capability> {
        let opened_for = {
            let held = self.held.lock().expect("held opens poisoned");
            held.get(&inode)?.handles.get(&handle)?.0
        };
        if want == 0 || opened_for & want != want {
            return None;
        }
        self.capability(inode, want, session)
    }

    /// A handle of `inode` opened for at least `want`, with what it was opened for and by whom.
    pub(crate) fn handle_for(&self, inode: InodeId, want: u8) -> Option<(u64, (u8, Caller))> {
        let held = self.held.lock().expect("held opens poisoned");
        held.get(&inode)?
            .handles
            .iter()
            .find(|(_, (access, _))| access & want == want)
            .map(|(handle, opened)| (*handle, opened.clone()))
    }

    /// The handles open on files of `home`, with what each was opened for and by whom.
    pub(crate) fn of_home(&self, home: NodeId) -> Vec<(InodeId, u64, (u8, Caller))> {
        let held = self.held.lock().expect("held opens poisoned");
        held.iter()
            .filter(|(inode, _)| inode.home() == home)
            .flat_map(|(inode, file)| {
                file.handles
                    .iter()
                    .map(move |(handle, opened)| (*inode, *handle, opened.clone()))
            })
            .collect()
    }
}

impl HeldLocks {
    pub(crate) fn record(&self, inode: InodeId, lock: &LockRange) {
        let mut held = self.held.lock().expect("held locks poisoned");
        let owners = held.entry(inode).or_default();
        let ranges = owners.entry(lock.owner).or_default();
        apply_to_owner(ranges, lock);
        if ranges.is_empty() {
            owners.remove(&lock.owner);
        }
        if owners.is_empty() {
            held.remove(&inode);
        }
    }

    pub(crate) fn holds(&self, inode: InodeId, owner: u64) -> bool {
        let held = self.held.lock().expect("held locks poisoned");
        held.get(&inode)
            .is_some_and(|owners| owners.contains_key(&owner))
    }

    /// Has the next [`Client::reclaim`] open again and relock what is held on every home,
    /// whatever its epoch: for a new session.
    pub(crate) fn reclaim_everywhere(&self) {
        let mut epochs = self.epochs.lock().expect("epochs poisoned");
        epochs.values_mut().for_each(|epoch| *epoch = None);
    }

    /// Forgets every lock held; returns the files that held one.
    pub(crate) fn forget_all(&self) -> Vec<InodeId> {
        let mut held = self.held.lock().expect("held locks poisoned");
        held.drain().map(|(inode, _)| inode).collect()
    }

    /// Forgets `lock`'s range of its owner on `inode`, which the server no longer holds.
    pub(crate) fn forget(&self, inode: InodeId, lock: &LockRange) {
        let unlocked = LockRange {
            kind: weft_proto::messages::LockKind::Unlock,
            ..*lock
        };
        self.record(inode, &unlocked);
    }

    pub(crate) fn of_home(&self, home: NodeId) -> Vec<(InodeId, LockRange)> {
        let held = self.held.lock().expect("held locks poisoned");
        held.iter()
            .filter(|(inode, _)| inode.home() == home)
            .flat_map(|(inode, owners)| {
                owners.values().flatten().map(move |range| (*inode, *range))
            })
            .collect()
    }
}
