//! The file system the kernel talks to ([`WeftFs`]): its state, and how it runs each kernel
//! request (in a task, acting for the caller).

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
            dirs: dirs::FreshDirs::new(attr_cache),
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

    /// Runs `work` for the kernel's `request`: its metadata requests act for the caller (with
    /// a client key, whose servers may check the caller's access themselves).
    pub(super) fn spawn<F>(&self, request: &Request, work: impl FnOnce(Arc<State>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let work = work(Arc::clone(&self.state));
        if self.state.client.identity().is_none() {
            self.runtime.spawn(work);
            return;
        }
        let caller = Caller {
            uid: request.uid(),
            gid: request.gid(),
            groups: supplementary_groups(request.pid()),
        };
        self.runtime
            .spawn(weft_net::stubs::acting_for(caller, work));
    }
}
