//! The file system the kernel talks to ([`WeftFs`]): its state, and how it runs each kernel
//! request (on its FUSE thread until it waits, then in a task, acting for the caller).

use super::*;

/// The Weft FUSE file system.
pub struct WeftFs {
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) state: Arc<State>,
}

impl std::fmt::Debug for WeftFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeftFs").finish()
    }
}

impl WeftFs {
    /// A file system over `client`, answering from tasks on `runtime`; the kernel may trust
    /// attributes and names for `attr_cache`; `writeback_cache` asks the kernel to cache
    /// writes. Write-behind and read-ahead are the client's ([`crate::ClientConfig`]).
    pub fn new(
        client: Arc<Client>,
        runtime: tokio::runtime::Handle,
        attr_cache: Duration,
        writeback_cache: bool,
    ) -> WeftFs {
        let state = Arc::new(State {
            client,
            ttl: attr_cache,
            writeback_cache,
            xattrs_absent: Mutex::default(),
            dirs: fresh::FreshAttrs::new(attr_cache),
            files: fresh::FreshAttrs::new(attr_cache),
            listings: super::listings::Listings::new(attr_cache),
            notifier: std::sync::OnceLock::new(),
            handles: Mutex::default(),
        });
        WeftFs { runtime, state }
    }

    /// Creates an entry other than an opened regular file and answers the kernel, keeping
    /// the directory's attributes from the reply.
    pub(super) fn create_entry(
        &self,
        request: &Request,
        (parent, name): (INodeNo, String),
        new: NewInode,
        reply: ReplyEntry,
    ) {
        let change = self.state.dirs.change(self.state.inode_of(parent));
        self.spawn(request, |state| async move {
            let result = state
                .client
                .create_entry(state.inode_of(parent), &name, new, None)
                .await
                .map(|created| {
                    change.finish(created.parent);
                    created.attr
                });
            reply_entry(&state, reply, result);
        });
    }

    /// Runs `work` for the kernel's `request` on this FUSE thread until it first waits
    /// ([`here_first`]): its metadata requests act for the caller (with a client key, whose
    /// servers may check the caller's access themselves).
    pub(super) fn spawn<F>(&self, request: &Request, work: impl FnOnce(Arc<State>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        here_first(&self.runtime, self.acting(request, work));
    }

    /// Runs `work` for the kernel's `request` as a task at once, acting for the caller as
    /// [`WeftFs::spawn`] does: for a write, whose sending from the FUSE thread would keep
    /// that thread from the kernel's next request under a deep queue of them (4 KiB random
    /// writes at a queue depth of 32 ran 8 % slower so, docs/benchmarks.md).
    pub(super) fn spawn_task<F>(&self, request: &Request, work: impl FnOnce(Arc<State>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.runtime.spawn(self.acting(request, work));
    }

    /// `work`, acting for the caller of `request` when the servers check callers.
    fn acting<F>(&self, request: &Request, work: impl FnOnce(Arc<State>) -> F) -> Work
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let work = work(Arc::clone(&self.state));
        if self.state.client.identity().is_none() {
            return Box::pin(work);
        }
        let caller = Caller {
            uid: request.uid(),
            gid: request.gid(),
            groups: supplementary_groups(request.pid()),
        };
        Box::pin(weft_net::stubs::acting_for(caller, work))
    }
}

/// A kernel request's work.
type Work = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Runs `work` on this thread until it first waits, and from then on as a task of `runtime`,
/// spawned by whatever wakes it. A request answered from what the client holds (a flush with
/// nothing to write, a close the server need not hear of) is answered by the FUSE thread that
/// read it, with no thread woken; one that waits for a server is sent from here, and the
/// runtime's thread that receives the answer runs the rest of it at once. Spawned at once
/// instead, a request would wake a runtime thread only to send it and wait.
fn here_first(runtime: &tokio::runtime::Handle, mut work: Work) {
    let parked = Arc::new(Parked {
        runtime: runtime.clone(),
        slot: Mutex::new(Slot::Polling { woken: false }),
    });
    let waker = std::task::Waker::from(Arc::clone(&parked));
    {
        // The work's tasks, timers and sockets are the runtime's.
        let _entered = runtime.enter();
        let mut context = std::task::Context::from_waker(&waker);
        // A panic in a request's work is that request's alone, as in a task: its reply,
        // dropped, answers EIO, and the FUSE thread goes on reading requests.
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            work.as_mut().poll(&mut context)
        }));
        match polled {
            Ok(std::task::Poll::Ready(())) => return,
            Ok(std::task::Poll::Pending) => {}
            Err(_) => {
                tracing::error!("a kernel request's work panicked: it is answered EIO");
                return;
            }
        }
    }
    let mut slot = parked.slot.lock().expect("parked work poisoned");
    if let Slot::Polling { woken: true } = *slot {
        *slot = Slot::Gone;
        drop(slot);
        runtime.spawn(work);
    } else {
        *slot = Slot::Waiting(work);
    }
}

/// Work that waited while polled on a FUSE thread ([`here_first`]), until it is woken.
struct Parked {
    runtime: tokio::runtime::Handle,
    slot: Mutex<Slot>,
}

enum Slot {
    /// Being polled on the FUSE thread; `woken` once a wake came meanwhile.
    Polling { woken: bool },
    /// Waiting for its wake.
    Waiting(Work),
    /// Spawned, or finished.
    Gone,
}

impl std::task::Wake for Parked {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut slot = self.slot.lock().expect("parked work poisoned");
        match std::mem::replace(&mut *slot, Slot::Gone) {
            Slot::Polling { .. } => *slot = Slot::Polling { woken: true },
            Slot::Waiting(work) => {
                drop(slot);
                self.runtime.spawn(work);
            }
            Slot::Gone => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::here_first;
    use std::sync::mpsc;

    // Goal: a request answered without waiting runs on the thread that read it; one that
    // waits is finished by the runtime whether its wake comes while it is still being polled
    // (it woke itself) or later, from a runtime thread or from any other thread.
    #[test]
    fn work_runs_here_until_it_waits_then_wherever_it_is_woken() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let here = std::thread::current().id();
        let (done, finished) = mpsc::channel();

        let answer = done.clone();
        here_first(
            runtime.handle(),
            Box::pin(async move {
                answer
                    .send(("ready", std::thread::current().id()))
                    .expect("send");
            }),
        );
        assert_eq!(finished.recv().expect("ready"), ("ready", here));

        let answer = done.clone();
        here_first(
            runtime.handle(),
            Box::pin(async move {
                tokio::task::yield_now().await;
                answer
                    .send(("yielded", std::thread::current().id()))
                    .expect("send");
            }),
        );
        let (what, thread) = finished.recv().expect("yielded");
        assert_eq!(what, "yielded");
        assert_ne!(thread, here, "finished by the runtime");

        let (tell, told) = tokio::sync::oneshot::channel::<u32>();
        let answer = done.clone();
        here_first(
            runtime.handle(),
            Box::pin(async move {
                let value = told.await.expect("told");
                answer
                    .send(("told", std::thread::current().id()))
                    .expect("send");
                assert_eq!(value, 7);
            }),
        );
        std::thread::spawn(move || tell.send(7).expect("tell"))
            .join()
            .expect("teller");
        assert_eq!(finished.recv().expect("told").0, "told");

        // A request whose work panics before it waits costs the thread nothing.
        here_first(
            runtime.handle(),
            Box::pin(async move {
                panic!("a request's work panicked");
            }),
        );

        let answer = done;
        here_first(
            runtime.handle(),
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                answer
                    .send(("slept", std::thread::current().id()))
                    .expect("send");
            }),
        );
        assert_eq!(finished.recv().expect("slept").0, "slept");
    }

    // Goal: a request that waits for a server's answer crosses one thread hand-off between
    // its reading and its reply: the runtime's task that reads the answer off the connection
    // wakes it, and that thread runs the rest of it (the reply to the kernel).
    #[test]
    fn a_request_answered_by_a_server_crosses_one_handoff() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (done, finished) = mpsc::channel();
        // Read here, as a FUSE thread reads a request.
        let handoffs = weft_net::handoffs::Handoffs::here();
        let (tell, told) = tokio::sync::oneshot::channel::<u32>();
        here_first(
            runtime.handle(),
            Box::pin(handoffs.trace(async move {
                let answer = told.await.expect("told");
                done.send(answer).expect("send");
            })),
        );
        // The connection's reader, a task of the runtime, hands the answer over.
        runtime.spawn(async move { tell.send(7).expect("tell") });
        assert_eq!(finished.recv().expect("answered"), 7);
        assert_eq!(
            handoffs.count(),
            1,
            "from the reading thread to the answer's"
        );
    }
}
