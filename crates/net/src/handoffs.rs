//! Counts a request's thread hand-offs: how many times its work went on on another thread than
//! the one that did its last step. A request is a future; its steps are its polls and the
//! wakes that let it go on. A wake from another thread (a commit thread that committed its
//! change, the task that read its answer off a connection) is a hand-off to that thread, and a
//! poll on another thread than the wake's is one more. Waiting costs the wake of a sleeping
//! thread, often more than the work itself on a small machine (docs/benchmarks.md), so the
//! metadata path counts them: `weft_request_handoffs` at the servers, and the mount's
//! requests in its tests.

use futures::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// This thread's number, the same for its whole life; 0 is never one.
pub fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|number| *number)
}

/// The hand-offs of one request so far.
#[derive(Debug)]
pub struct Handoffs {
    /// The thread of its last step.
    last: AtomicU64,
    count: AtomicU32,
    /// Whom a wake of the request is passed to (the waker of its latest poll).
    waker: AtomicWaker,
}

impl Handoffs {
    /// The count of a request whose first step is this thread's (it read the request).
    pub fn here() -> Arc<Handoffs> {
        Arc::new(Handoffs {
            last: AtomicU64::new(thread_number()),
            count: AtomicU32::new(0),
            waker: AtomicWaker::new(),
        })
    }

    /// Hand-offs so far.
    pub fn count(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }

    /// Notes a step of the request on this thread.
    fn step(&self) {
        let here = thread_number();
        if self.last.swap(here, Ordering::Relaxed) != here {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `future`, counted here at each of its steps.
    pub fn trace<F: Future>(self: &Arc<Self>, future: F) -> Traced<F> {
        Traced {
            future,
            handoffs: Arc::clone(self),
            waker: None,
        }
    }
}

impl Wake for Handoffs {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.step();
        self.waker.wake();
    }
}

pin_project_lite::pin_project! {
    /// A future whose steps a [`Handoffs`] counts.
    pub struct Traced<F> {
        #[pin]
        future: F,
        handoffs: Arc<Handoffs>,
        // The waker given to `future`, made once.
        waker: Option<Waker>,
    }
}

impl<F: Future> Future for Traced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        this.handoffs.step();
        this.handoffs.waker.register(cx.waker());
        let ours = this
            .waker
            .get_or_insert_with(|| Waker::from(Arc::clone(this.handoffs)));
        this.future.poll(&mut Context::from_waker(ours))
    }
}

#[cfg(test)]
mod tests {
    use super::Handoffs;
    use std::sync::{Arc, Mutex};
    use std::task::{Poll, Waker};

    // Goal: work done on the thread that read the request counts none; a wake from another
    // thread and the poll that follows on yet another count one each, and a poll on the
    // waking thread adds none.
    #[test]
    fn steps_on_other_threads_are_counted() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handoffs = Handoffs::here();
        runtime.block_on(handoffs.trace(async { tokio::task::yield_now().await }));
        assert_eq!(handoffs.count(), 0, "one thread throughout");

        // Read here, woken by another thread, polled on this one again: two.
        let handoffs = Handoffs::here();
        let parked: Arc<Mutex<Option<Waker>>> = Arc::default();
        let waiting = Arc::clone(&parked);
        let teller = std::thread::spawn(move || loop {
            // Wakes the request once it waits (its first poll left its waker).
            if let Some(waker) = waiting.lock().expect("parked").take() {
                return waker.wake();
            }
            std::thread::yield_now();
        });
        let mut polls = 0;
        runtime.block_on(handoffs.trace(std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                *parked.lock().expect("parked") = Some(cx.waker().clone());
                return Poll::Pending;
            }
            Poll::Ready(())
        })));
        teller.join().expect("teller");
        assert_eq!(handoffs.count(), 2, "to the teller and back");

        // Read on another thread, run here: one.
        let handoffs = std::thread::spawn(Handoffs::here).join().expect("reader");
        runtime.block_on(handoffs.trace(async {}));
        assert_eq!(handoffs.count(), 1);
    }
}
