//! Operations that span metadata servers, one module per protocol: [`mkdir`] and [`rmdir`] of a
//! directory placed on another server, [`link`] and [`unlink`] of an inode living elsewhere,
//! [`rename`] into a directory on another server, [`exchange`] with an entry elsewhere, and
//! [`spread`] directories. Each module holds its transaction steps (on this server as the
//! coordinator, and on the other servers as the steps they are asked to run) and their
//! orchestration.
//!
//! This module holds what they share: who runs an intent now ([`IntentRuns`]), the calls to
//! other metadata servers under the retry policy, the step after an intent is recorded
//! ([`Meta::drive`], [`Meta::finish_intent`]), recovery of the intents a crash left, and
//! telling the other homes which intents have settled. The intent records themselves are in
//! `ops::intent`.

pub(super) mod exchange;
pub(super) mod link;
pub(super) mod mkdir;
pub(super) mod rename;
pub(super) mod rmdir;
pub(super) mod spread;
pub(super) mod unlink;

use crate::commit::Answered;
use crate::ops::intent::{
    intents, prepared_or_local, settled_below, Decided, Intent, IntentOp, Prepared,
};
use crate::ops::lookup::get_attr;
use crate::ops::OpContext;
use crate::schema::OpError;
use crate::service::targets::{TARGET_RETRY, WORK_RETRY_INTERVAL};
use crate::service::{rpc_error, Meta};
use std::collections::HashMap;
use std::sync::Mutex;
use weft_net::MetaCalls;
use weft_proto::ids::{InodeId, NodeId};
use weft_proto::messages::{InodeAttr, MetaRequest, MetaResponse, MutationId};

/// What a home keeps of its intents beside its tables.
#[derive(Default)]
pub(crate) struct IntentState {
    /// Who runs this home's intents now: requests (first tries and retries) and recovery.
    pub(super) runs: IntentRuns,
    /// Per other home: the intent id below which it was told this home's intents finished.
    pub(super) settled_told: Mutex<HashMap<NodeId, u64>>,
    /// Spread directories whose shards must still learn what new entries inherit (every
    /// spread directory after a start, since a crash may have come between a change and its
    /// copy to the shards).
    pub(in crate::service) shard_syncs: Mutex<std::collections::BTreeSet<InodeId>>,
}

/// What became of a mutation sent again ([`Meta::copy_of`]).
pub(in crate::service) enum Copy {
    /// It ran: its reply.
    Answered(Box<Result<MetaResponse, OpError>>),
    /// Its cross-server intent is still in flight.
    Pending,
    /// It never ran here.
    New,
}

/// Who runs a home's intents now. More than one may run the same intent at once (a client's
/// retry finds its intent open and runs it too, recovery may be at it): the others' steps may
/// still be on their way when one of them finishes it, so the other homes are told it settled
/// only once none runs it ([`Meta::tell_settled`]).
#[derive(Default)]
pub(super) struct IntentRuns(Mutex<Runs>);

#[derive(Default)]
pub(super) struct Runs {
    /// Requests preparing a cross-server operation: they may find an intent open and run it.
    preparing: usize,
    /// Runs per intent.
    running: HashMap<u64, usize>,
}

impl IntentRuns {
    fn runs(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.0.lock().expect("intent runs poisoned")
    }

    /// A request starts preparing a cross-server operation.
    fn preparing(&self) -> Preparing<'_> {
        self.runs().preparing += 1;
        Preparing(self)
    }

    /// Recovery starts running intent `id`, unless something runs it already.
    fn recover(&self, id: u64) -> Option<Running<'_>> {
        let mut runs = self.runs();
        if runs.running.contains_key(&id) {
            return None;
        }
        runs.running.insert(id, 1);
        Some(Running(self, id))
    }

    /// The oldest intent being run (`Some(None)`: none), or `None` while a request prepares.
    fn oldest(&self) -> Option<Option<u64>> {
        let runs = self.runs();
        (runs.preparing == 0).then(|| runs.running.keys().min().copied())
    }
}

/// A request preparing a cross-server operation.
pub(super) struct Preparing<'a>(&'a IntentRuns);

impl<'a> Preparing<'a> {
    /// The request runs intent `id`.
    fn run(self, id: u64) -> Running<'a> {
        let runs = self.0;
        std::mem::forget(self);
        let mut state = runs.runs();
        state.preparing -= 1;
        *state.running.entry(id).or_default() += 1;
        Running(runs, id)
    }
}

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        self.0.runs().preparing -= 1;
    }
}

/// A run of an intent.
pub(super) struct Running<'a>(&'a IntentRuns, u64);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut runs = self.0.runs();
        if let Some(count) = runs.running.get_mut(&self.1) {
            *count -= 1;
            if *count == 0 {
                runs.running.remove(&self.1);
            }
        }
    }
}

/// The last step of a cross-server operation, on its coordinator: the intent goes, and the
/// reply `finish` makes (from what the steps before answered) is kept with its change; an
/// error of a step before is the reply, and only the intent goes.
pub(super) fn conclude<T>(
    txn: &crate::store::WriteTransaction,
    id: u64,
    mutation: MutationId,
    outcome: Result<T, OpError>,
    finish: impl FnOnce(&crate::store::WriteTransaction, T) -> Result<MetaResponse, OpError>,
) -> Result<MetaResponse, OpError> {
    crate::ops::intent::drop_intent(txn, id)?;
    // Admitted when its intent was recorded: finished whatever its client settled since.
    crate::service::idempotent_admitted(txn, mutation, |txn| finish(txn, outcome?))
}

impl Meta {
    /// Attributes of an inode on another metadata server.
    pub(super) async fn remote_attr(&self, inode: InodeId) -> Result<MetaResponse, OpError> {
        let meta = self.cluster.meta(inode.home()).await.map_err(rpc_error)?;
        Ok(MetaResponse::Attr(
            meta.get_attr(inode).await.map_err(rpc_error)?,
        ))
    }

    /// The attributes of `inode`, from this server's store or from its home.
    pub(super) async fn attr_of(&self, inode: InodeId) -> Result<InodeAttr, OpError> {
        let response = if inode.home() == self.node {
            self.read(|txn| get_attr(txn, inode))?
        } else {
            self.remote_attr(inode).await?
        };
        match response {
            MetaResponse::Attr(attr) => Ok(attr),
            other => Err(OpError::inconsistent(format!(
                "the attributes of {inode} came back as {other:?}"
            ))),
        }
    }

    /// Asks metadata node `node` to do a step of an intent, under the retry policy: `Ok(Ok)`
    /// its answer, `Ok(Err)` its refusal, `Err` when it cannot be reached (the intent stays
    /// for recovery).
    pub(super) async fn ask_meta(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<Result<MetaResponse, OpError>, OpError> {
        let call = |meta: std::sync::Arc<weft_net::MetaClient>| {
            let request = request.clone();
            async move { meta.call(request).await }
        };
        match self.cluster.call_meta(node, &TARGET_RETRY, call).await {
            Ok(response) => Ok(Ok(response)),
            Err(weft_net::RpcError::Remote(error)) => Ok(Err(OpError::Rejected(error))),
            Err(error) => Err(rpc_error(error)),
        }
    }

    /// [`Meta::ask_meta`] for a step whose refusal is an error like any other.
    pub(super) async fn call_meta(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<MetaResponse, OpError> {
        self.ask_meta(node, request).await?
    }

    /// [`Meta::call_meta`] for a step that answers with attributes.
    pub(super) async fn call_meta_attr(
        &self,
        node: NodeId,
        request: MetaRequest,
    ) -> Result<InodeAttr, OpError> {
        match self.call_meta(node, request).await? {
            MetaResponse::Attr(attr) => Ok(attr),
            other => Err(OpError::inconsistent(format!(
                "metadata node {node} answered {other:?} where attributes were expected"
            ))),
        }
    }

    /// Runs the remaining steps of an intent: after step (1) in a live request, or in recovery.
    /// Errors reaching the other server leave the intent for the next recovery pass.
    pub(super) async fn finish_intent(
        &self,
        id: u64,
        intent: Intent,
    ) -> Result<MetaResponse, OpError> {
        let mutation = intent.mutation;
        match &intent.op {
            IntentOp::Mkdir(op) => self.continue_mkdir(id, mutation, op).await,
            IntentOp::Rmdir(op) => self.continue_rmdir(id, mutation, op).await,
            IntentOp::MkdirSpread(op) => self.continue_mkdir_spread(id, mutation, op).await,
            IntentOp::RmdirSpread(op) => self.continue_rmdir_spread(id, mutation, op).await,
            IntentOp::Link(op) => self.continue_link(id, mutation, op).await,
            IntentOp::Unlink(op) => self.continue_unlink(id, mutation, op).await,
            IntentOp::RenameOut(op) => self.continue_rename(id, mutation, op).await,
            IntentOp::Exchange(op) => self.continue_exchange(id, mutation, op).await,
        }
    }

    /// What became of `mutation`, for a copy of it sent again: its kept reply, or, while its
    /// cross-server intent is still in flight, that intent run here to its end as the copy's
    /// first run would (see `Meta::kept_reply`), or nothing (it never ran). Both are looked
    /// for in one snapshot (an intent ends in the commit that keeps its reply) and while
    /// preparing, so the intent's settlement cannot pass it before its run is counted. An
    /// intent that cannot finish yet (a server it needs is away) stays for the next try.
    pub(in crate::service) async fn copy_of(&self, mutation: MutationId) -> Result<Copy, OpError> {
        let preparing = self.intents.runs.preparing();
        let (kept, pending) = self.read(|txn| {
            Ok((
                super::replies::kept(txn, mutation)?,
                crate::ops::intent::pending_of(txn, mutation)?,
            ))
        })?;
        let Some((id, intent)) = pending else {
            return Ok(kept.map_or(Copy::New, |kept| Copy::Answered(Box::new(kept))));
        };
        let _running = preparing.run(id);
        if let Err(error) = self.finish_intent(id, intent).await {
            tracing::debug!(
                intent = id,
                ?error,
                "an operation sent again is still pending"
            );
        }
        Ok(
            match self.read(|txn| super::replies::kept(txn, mutation))? {
                Some(kept) => Copy::Answered(Box::new(kept)),
                None => Copy::Pending,
            },
        )
    }

    /// Starts a cross-server operation: `prepare` records its intent (or finds the stored
    /// reply of a retry) in one transaction, then [`Meta::drive`] answers it.
    pub(super) async fn start_intent(
        &self,
        prepare: impl FnOnce(&crate::store::WriteTransaction) -> Result<Prepared, OpError>
            + Send
            + 'static,
        failpoint: &str,
    ) -> Result<MetaResponse, OpError> {
        let preparing = self.intents.runs.preparing();
        let prepared = self.committer.run_with(prepare).await?;
        self.drive(prepared, preparing, failpoint).await
    }

    /// Runs an operation in one local transaction unless `prepare` finds it spans servers:
    /// `prepare` answers `None` for the local case, which `local` then runs as a mutation in
    /// the same transaction (one commit and one sync, as any local change); otherwise the
    /// operation goes on as [`Meta::start_intent`]'s do.
    pub(super) async fn local_or_intent(
        &self,
        mutation: MutationId,
        prepare: impl FnOnce(&crate::store::WriteTransaction) -> Result<Option<Prepared>, OpError>
            + Send
            + 'static,
        local: impl FnOnce(&crate::store::WriteTransaction, &OpContext) -> Result<MetaResponse, OpError>
            + Send
            + 'static,
        failpoint: &str,
    ) -> Result<MetaResponse, OpError> {
        let preparing = self.intents.runs.preparing();
        // Refused only if local: a session that expired here changes nothing locally.
        let local = self.mutation_op(mutation, local);
        let decided = self
            .committer
            .run_client_change_with(move |txn| {
                // When the local change may be answered is what its mutation said (a session's
                // first change answered before its sync is answered once durable); a prepared
                // intent is answered once durable.
                let mut answered = Answered::Durable;
                let decided = prepared_or_local(txn, prepare, |txn| {
                    local?(txn).map(|(reply, how)| {
                        answered = how;
                        reply
                    })
                })?;
                Ok((decided, answered))
            })
            .await?;
        match decided {
            Decided::Local(answer) => {
                self.background.work.notify_one();
                answer.map(super::numbered::keep)
            }
            Decided::Prepared(prepared) => self.drive(prepared, preparing, failpoint).await,
        }
    }

    /// Answers a prepared cross-server operation: a retry gets its stored reply; a new intent
    /// runs its remaining steps (`failpoint` names the crash point right after the intent).
    pub(super) async fn drive(
        &self,
        prepared: Prepared,
        preparing: Preparing<'_>,
        failpoint: &str,
    ) -> Result<MetaResponse, OpError> {
        match prepared {
            Prepared::Answered(answer) => answer,
            Prepared::Intent(id, intent) => {
                let _running = preparing.run(id);
                weft_service::failpoint::failpoint(failpoint);
                self.finish_intent(id, intent).await
            }
        }
    }

    /// Finishes the intents a crash left (at start and then in the work loop).
    pub(super) async fn recover_intents(&self) {
        let Ok(pending) = self.read(intents) else {
            return;
        };
        for (id, intent) in pending {
            // A request finishing it now is left alone.
            let Some(_running) = self.intents.runs.recover(id) else {
                continue;
            };
            match self.finish_intent(id, intent).await {
                Ok(_) | Err(OpError::Rejected(_)) => {
                    tracing::info!(intent = id, "finished an operation interrupted by a crash")
                }
                Err(error) => tracing::debug!(
                    intent = id,
                    ?error,
                    "an interrupted operation is still pending"
                ),
            }
        }
    }

    /// Tells the other homes up to which intent this home's cross-server operations have
    /// finished, so they can forget the markers that keep their steps from running twice
    /// (a table that would otherwise grow with every such operation ever made). Only what is
    /// durable is told: a failover must never find an intent it must finish that the others
    /// take for a late copy. A home that is offline is told once it is back.
    pub(super) async fn tell_settled(&self) {
        let Ok(oldest_open) = self.read(settled_below) else {
            return;
        };
        // Read after the store: a request that found an intent open before it was finished
        // is preparing or running it now, and its steps must still land.
        let Some(running) = self.intents.runs.oldest() else {
            return;
        };
        let below = running.map_or(oldest_open, |running| running.min(oldest_open));
        let homes: Vec<NodeId> = {
            let told = self
                .intents
                .settled_told
                .lock()
                .expect("settled table poisoned");
            self.cluster
                .map()
                .meta_homes()
                .into_iter()
                .filter(|home| *home != self.node && told.get(home).is_none_or(|t| *t < below))
                .collect()
        };
        if homes.is_empty() {
            return;
        }
        // What was read is committed; this makes it durable.
        if self.committer.sync().await.is_err() {
            return;
        }
        for home in homes {
            let request = MetaRequest::IntentsSettled {
                coordinator: self.node,
                below,
            };
            let told = async {
                let meta = self.cluster.meta(home).await.ok()?;
                tokio::time::timeout(WORK_RETRY_INTERVAL, meta.call(request))
                    .await
                    .ok()?
                    .ok()
            };
            if told.await.is_some() {
                self.intents
                    .settled_told
                    .lock()
                    .expect("settled table poisoned")
                    .insert(home, below);
            }
        }
    }
}
