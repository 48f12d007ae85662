//! Clients' changes apply at most once, and never late. A client retries a write or a fallocate
//! whose answer did not come (a timeout, a broken connection) while the original may still be
//! on its way: in a socket, in this server's queue, or running. Once the client has its answer
//! it moves on, and a newer change of the same bytes may follow; the original landing after it
//! would undo it. Every client change carries a [`ChangeTag`]: its number (the same in every
//! retry), the number below which all of its client's changes are settled, and the changes it
//! gave up on. The fence
//!
//! - runs one copy of a change at a time, and keeps the answer of a copy that ran: a retry
//!   gets that answer instead of running again, so a late original finds its change answered
//!   and is dropped;
//! - drops a copy of a change its client settled or gave up on (`Superseded`);
//! - holds a change while a copy of one its client gave up on still runs here, so that copy
//!   lands before the change or not at all.
//!
//! An answer a client resends after (`Unavailable`, `StaleRoute`, `TruncatePending`: the change
//! was not made) is not kept. The state lives in memory: a copy cannot outlive the process it
//! was sent to. Answers are kept until their client's mark passes them; a client idle for
//! [`CLIENT_IDLE`] is forgotten, which bounds the table when clients go away.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use weft_proto::error::WireError;
use weft_proto::messages::{ChangeTag, Response};
use weft_proto::ErrorCode;

/// How long a client with nothing running is remembered after its last change.
const CLIENT_IDLE: Duration = Duration::from_secs(600);

/// How often idle clients are looked for.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The answer to a change.
pub(crate) type Answer = Result<Response, WireError>;

struct ClientChanges {
    /// Changes numbered below this are settled at the client.
    settled_below: u64,
    /// Changes at or above the mark the client gave up on.
    abandoned: BTreeSet<u64>,
    /// Changes with a copy running here.
    running: BTreeSet<u64>,
    /// Answers of changes that ran here, at or above the mark.
    answered: BTreeMap<u64, Answer>,
    /// When a change of the client last arrived.
    last_seen: Instant,
}

struct Clients {
    by_id: HashMap<u64, ClientChanges>,
    pruned: Instant,
}

/// The clients whose changes this server has seen (one per storage server).
pub(crate) struct ChangeFence {
    clients: Mutex<Clients>,
    /// Woken when a change finishes.
    finished: Notify,
}

/// What to do with a copy of a change.
pub(crate) enum Admission<'a> {
    /// Run it, and report the answer through the guard.
    Run(Running<'a>),
    /// It ran already: this was its answer.
    Answered(Answer),
}

/// A copy of a change admitted to run; dropped without [`Running::answer`] (the request was
/// cancelled), the change counts as not made.
pub(crate) struct Running<'a> {
    fence: &'a ChangeFence,
    client: u64,
    number: u64,
    answer: Option<Answer>,
}

impl ChangeFence {
    pub(crate) fn new() -> ChangeFence {
        ChangeFence {
            clients: Mutex::new(Clients {
                by_id: HashMap::new(),
                pruned: Instant::now(),
            }),
            finished: Notify::new(),
        }
    }

    /// Admits a copy of change `tag`, once no other copy of it, and no copy of a change its
    /// client gave up on, runs here.
    ///
    /// # Errors
    /// `Superseded` for a change its client settled or gave up on: a late copy, to drop.
    pub(crate) async fn admit(&self, tag: &ChangeTag) -> Result<Admission<'_>, WireError> {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            {
                let mut clients = self.clients.lock().expect("change fence poisoned");
                clients.prune();
                let changes = clients
                    .by_id
                    .entry(tag.client.0)
                    .or_insert_with(ClientChanges::new);
                changes.learn(tag);
                if tag.number < changes.settled_below || changes.abandoned.contains(&tag.number) {
                    return Err(WireError::new(
                        ErrorCode::Superseded,
                        format!(
                            "change {} of client {} arrived after its client moved on; dropped",
                            tag.number, tag.client
                        ),
                    ));
                }
                if let Some(answer) = changes.answered.get(&tag.number) {
                    return Ok(Admission::Answered(answer.clone()));
                }
                let blocked = changes.running.iter().any(|&number| {
                    number == tag.number
                        || number < changes.settled_below
                        || changes.abandoned.contains(&number)
                });
                if !blocked {
                    changes.running.insert(tag.number);
                    return Ok(Admission::Run(Running {
                        fence: self,
                        client: tag.client.0,
                        number: tag.number,
                        answer: None,
                    }));
                }
            }
            finished.await;
        }
    }
}

impl ClientChanges {
    fn new() -> ClientChanges {
        ClientChanges {
            settled_below: 0,
            abandoned: BTreeSet::new(),
            running: BTreeSet::new(),
            answered: BTreeMap::new(),
            last_seen: Instant::now(),
        }
    }

    /// Takes in what `tag` says of its client's changes, and forgets what no copy can need.
    fn learn(&mut self, tag: &ChangeTag) {
        self.last_seen = Instant::now();
        if tag.settled_below > self.settled_below {
            self.settled_below = tag.settled_below;
            let mark = self.settled_below;
            self.answered = self.answered.split_off(&mark);
            self.abandoned = self.abandoned.split_off(&mark);
        }
        for &number in &tag.abandoned {
            if number >= self.settled_below {
                self.abandoned.insert(number);
                self.answered.remove(&number);
            }
        }
    }
}

impl Clients {
    fn prune(&mut self) {
        if self.pruned.elapsed() < PRUNE_EVERY {
            return;
        }
        self.pruned = Instant::now();
        self.by_id.retain(|_, changes| {
            !changes.running.is_empty() || changes.last_seen.elapsed() < CLIENT_IDLE
        });
    }
}

impl Running<'_> {
    /// Records the change's answer, for a copy that comes later.
    pub(crate) fn answer(mut self, answer: Result<&Response, &WireError>) {
        let resent = answer.is_err_and(|error| {
            matches!(
                error.code,
                ErrorCode::Unavailable | ErrorCode::StaleRoute | ErrorCode::TruncatePending
            )
        });
        if !resent {
            self.answer = Some(answer.cloned().map_err(Clone::clone));
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut clients = self.fence.clients.lock().expect("change fence poisoned");
        if let Some(changes) = clients.by_id.get_mut(&self.client) {
            changes.running.remove(&self.number);
            if let Some(answer) = self.answer.take() {
                if self.number >= changes.settled_below && !changes.abandoned.contains(&self.number)
                {
                    changes.answered.insert(self.number, answer);
                }
            }
        }
        drop(clients);
        self.fence.finished.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use weft_proto::ids::ClientId;

    fn tag(number: u64, settled_below: u64, abandoned: &[u64]) -> ChangeTag {
        ChangeTag {
            client: ClientId(7),
            number,
            settled_below,
            abandoned: abandoned.to_vec(),
        }
    }

    fn written(len: u32) -> Response {
        Response::Written { len, verifier: 3 }
    }

    async fn run<'a>(fence: &'a ChangeFence, tag: &ChangeTag) -> Running<'a> {
        match fence.admit(tag).await.expect("admitted") {
            Admission::Run(running) => running,
            Admission::Answered(_) => panic!("change {} ran already", tag.number),
        }
    }

    // Goal: a change runs once; a retry gets its answer; a late copy of a settled or
    // abandoned change is dropped; a change waits for a copy of an abandoned one still running.
    #[tokio::test]
    async fn changes_apply_once_and_never_late() {
        let fence = ChangeFence::new();
        let original = run(&fence, &tag(1, 1, &[])).await;
        // Its retry waits while the original runs, then gets the original's answer.
        let first = tag(1, 1, &[]);
        let mut retry = Box::pin(fence.admit(&first));
        assert!(
            retry.as_mut().now_or_never().is_none(),
            "one copy at a time"
        );
        original.answer(Ok(&written(10)));
        assert!(matches!(
            retry.await.expect("admitted"),
            Admission::Answered(Ok(Response::Written { len: 10, .. }))
        ));
        // An answer the client resends after is not kept: the retry runs.
        run(&fence, &tag(2, 1, &[]))
            .await
            .answer(Err(&WireError::new(ErrorCode::Unavailable, "busy")));
        run(&fence, &tag(2, 1, &[])).await.answer(Ok(&written(5)));
        // Once the client settled them, late copies are dropped.
        let late = fence.admit(&tag(1, 3, &[])).await.map(|_| ());
        assert_eq!(late.expect_err("late").code, ErrorCode::Superseded);
        // A change given up on while a copy of it runs holds the next change until it ends.
        let stuck = run(&fence, &tag(4, 3, &[])).await;
        let after = tag(5, 3, &[4]);
        let mut next = Box::pin(fence.admit(&after));
        assert!(
            next.as_mut().now_or_never().is_none(),
            "waits for the stuck copy"
        );
        drop(stuck);
        match next.await.expect("admitted") {
            Admission::Run(running) => running.answer(Ok(&written(1))),
            Admission::Answered(_) => panic!("change 5 ran already"),
        }
        let late = fence.admit(&tag(4, 3, &[])).await.map(|_| ());
        assert_eq!(late.expect_err("abandoned").code, ErrorCode::Superseded);
        // Another client's changes are not held by this one's.
        let other = ChangeTag {
            client: ClientId(8),
            ..tag(4, 0, &[])
        };
        assert!(fence.admit(&other).now_or_never().is_some());
    }
}
