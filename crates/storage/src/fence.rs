//! The change fence of a storage server ([`weft_mirror::fence`] decides; this waits): one
//! for the changes clients send this server, and one per mirror group version for the changes
//! a primary forwards to it.
//!
//! An answer a client resends after (`Unavailable`, `StaleRoute`, `TruncatePending`: the change
//! was not made) is not kept. A client idle for [`CLIENT_IDLE`] is forgotten.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use weft_mirror::fence::{Fence, Tag};
use weft_proto::error::WireError;
use weft_proto::messages::{ChangeTag, StorageResponse};
use weft_proto::{ErrorCode, Recovery};

/// How long a client with nothing running is remembered after its last change.
const CLIENT_IDLE: Duration = Duration::from_secs(600);

/// How often idle clients are looked for.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The answer to a change.
pub(crate) type Answer = Result<StorageResponse, WireError>;

struct State {
    fence: Fence<Answer>,
    pruned: Instant,
}

/// The clients whose changes this server has seen.
pub(crate) struct ChangeFence {
    state: Mutex<State>,
    /// The fence's clock starts here.
    born: Instant,
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
        let born = Instant::now();
        ChangeFence {
            state: Mutex::new(State {
                fence: Fence::default(),
                pruned: born,
            }),
            born,
            finished: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Admits a copy of change `tag`, once no other copy of it, and no copy of a change its
    /// client gave up on, runs here.
    ///
    /// # Errors
    /// `Superseded` for a change its client settled or gave up on: a late copy, to drop.
    pub(crate) async fn admit(&self, tag: &ChangeTag) -> Result<Admission<'_>, WireError> {
        let decided = Tag {
            client: tag.client.0,
            number: tag.number,
            settled_below: tag.settled_below,
            abandoned: &tag.abandoned,
        };
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            {
                let now = self.now();
                let mut state = self.state.lock().expect("change fence poisoned");
                if state.pruned.elapsed() >= PRUNE_EVERY {
                    state.pruned = Instant::now();
                    let idle = u64::try_from(CLIENT_IDLE.as_millis()).unwrap_or(u64::MAX);
                    state.fence.forget_idle(now, idle);
                }
                match state.fence.admit(decided, now) {
                    weft_mirror::fence::Admission::Run => {
                        return Ok(Admission::Run(Running {
                            fence: self,
                            client: tag.client.0,
                            number: tag.number,
                            answer: None,
                        }))
                    }
                    weft_mirror::fence::Admission::Answered(answer) => {
                        return Ok(Admission::Answered(answer))
                    }
                    weft_mirror::fence::Admission::Late => {
                        return Err(WireError::new(
                            ErrorCode::Superseded,
                            format!(
                                "change {} of client {} arrived after its client moved on; dropped",
                                tag.number, tag.client
                            ),
                        ))
                    }
                    weft_mirror::fence::Admission::Wait => {}
                }
            }
            finished.await;
        }
    }
}

impl Running<'_> {
    /// Records the change's answer, for a copy that comes later.
    pub(crate) fn answer(mut self, answer: Result<&StorageResponse, &WireError>) {
        // A refusal its sender recovers from by sending the same change here again (routed
        // anew, or once its truncate is applied) must let that copy run.
        let resent = answer.is_err_and(|error| {
            matches!(
                error.code.recovery(),
                Recovery::Reroute | Recovery::ApplyTruncate
            )
        });
        if !resent {
            self.answer = Some(answer.cloned().map_err(Clone::clone));
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.fence
            .state
            .lock()
            .expect("change fence poisoned")
            .fence
            .finished(self.client, self.number, self.answer.take());
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

    fn written(len: u32) -> StorageResponse {
        StorageResponse::Written { len, verifier: 3 }
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
            Admission::Answered(Ok(StorageResponse::Written { len: 10, .. }))
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
