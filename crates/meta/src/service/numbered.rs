//! Numbered changes: on a home that answers before the sync, every change a client's
//! mutation (or size report) makes is given the next number of the home's changes, kept with
//! its rows, and answered with its number, its rows and the home's last synced number
//! ([`MetaResponse::Numbered`]), so that its client can keep what the home has not on disk
//! yet (docs/design/crash-consistency.md, "Durability by replay"). Other homes answer every
//! change once durable, unnumbered.
//!
//! The change is numbered in its own transaction, after it ran: its number is one of its rows,
//! so the start after a crash knows the last number on disk. A mutation answered from its
//! kept reply, or refused, changed nothing to number (a refusal's kept reply is the one row
//! it writes, which a client that got the refusal never asks for again).

use super::Meta;
use crate::commit::Answered;
use crate::schema::{number_change, OpError, REPLAYERS};
use crate::store::{ReadableTable, WriteTransaction};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;
use weft_net::kept::ChangeProofs;
use weft_proto::ids::{ClientId, NodeId};
use weft_proto::messages::{MetaResponse, MutationId, NumberedChange, Reply};
use weft_proto::ErrorCode;

tokio::task_local! {
    /// The change the request being served made, numbered ([`Meta::serve`] answers with it).
    static MADE: RefCell<Option<NumberedChange>>;
}

/// Runs `op`, mutation `mutation`'s change in `txn`, and numbers it if it changed anything
/// (in the home's start `incarnation`): its answer is then [`MetaResponse::Numbered`],
/// answered as [`Answered::Numbered`].
/// With `replays` (the home answers before the sync, keeps a log, has no mirror group, and
/// the client speaks a protocol that keeps changes), the change may be answered before its
/// sync: the first such change of a session in this start records the session among those
/// the next start waits for ([`REPLAYERS`]), and is answered once durable, so that the record
/// is on disk before the session holds anything to replay. Without, it is neither numbered
/// nor answered before it is durable.
pub(super) fn numbered(
    txn: &WriteTransaction,
    (home, incarnation, replays): (NodeId, u64, bool),
    (mutation, proofs): (MutationId, Option<&ChangeProofs>),
    op: impl FnOnce(&WriteTransaction) -> Result<MetaResponse, OpError>,
) -> Result<(MetaResponse, Answered), OpError> {
    let mark = txn.mark();
    let reply = op(txn)?;
    if !replays || txn.mark() == mark {
        // Answered once durable; or answered from its kept reply: nothing changed.
        return Ok((reply, Answered::Durable));
    }
    let mut replayers = txn.open_table(REPLAYERS)?;
    let first = replayers.get(mutation.client.0)?.map(|start| start.value()) != Some(incarnation);
    if first {
        replayers.insert(mutation.client.0, incarnation)?;
    }
    drop(replayers);
    let number = number_change(txn)?;
    let mut change = NumberedChange {
        incarnation,
        number,
        mutation,
        rows: txn.rows_since(mark),
        proof: Vec::new(),
    };
    if let Some(proofs) = proofs {
        change.proof = proofs.prove(home, &change);
    }
    let answered = if first {
        Answered::Durable
    } else {
        Answered::Numbered(number)
    };
    Ok((
        MetaResponse::Numbered {
            reply: Box::new(reply),
            change,
            synced: 0,
        },
        answered,
    ))
}

/// The answer of `reply`, a change's that [`numbered`] may have numbered: the numbered change
/// is kept for the request's answer ([`serve_numbered`]).
pub(super) fn keep(reply: MetaResponse) -> MetaResponse {
    match reply {
        MetaResponse::Numbered { reply, change, .. } => {
            // Outside a request (a test's own call) nobody keeps it.
            let _ = MADE.try_with(|made| {
                let previous = made.borrow_mut().replace(change);
                debug_assert!(previous.is_none(), "one numbered change per request");
            });
            *reply
        }
        reply => reply,
    }
}

impl Meta {
    /// Serves `serve`'s request, and answers it with the change it made, numbered, if it made
    /// one: with its rows only while the home does not have it on disk.
    pub(super) async fn serve_numbered(
        &self,
        serve: impl std::future::Future<Output = Reply<MetaResponse>>,
    ) -> Reply<MetaResponse> {
        let (reply, made) = MADE
            .scope(RefCell::new(None), async {
                let reply = serve.await;
                (reply, MADE.with(RefCell::take))
            })
            .await;
        match (reply, made) {
            (Ok(reply), Some(mut change)) => {
                let synced = self.committer.last_synced();
                if change.number <= synced {
                    change.rows = Vec::new();
                }
                Ok(MetaResponse::Numbered {
                    reply: Box::new(reply),
                    change,
                    synced,
                })
            }
            (reply, _) => reply,
        }
    }

    /// Waits until every change numbered up to `number` by this start (`incarnation`) is on
    /// disk, syncing now what is not: answers the home's last synced number.
    pub(super) async fn sync_home(
        &self,
        incarnation: u64,
        number: u64,
    ) -> Result<MetaResponse, OpError> {
        if incarnation != self.locks.epoch() {
            return Err(OpError::rejected(
                ErrorCode::InGrace,
                format!(
                    "metadata home {} started again since it numbered these changes: replay \
                     them first",
                    self.node
                ),
            ));
        }
        if self.committer.last_synced() < number {
            // A change that waits for its batch's sync makes every change before it durable.
            self.committer.sync().await?;
        }
        Ok(MetaResponse::Synced(self.committer.last_synced()))
    }
}

/// The replay of what a start lost: the changes a start before it answered before their
/// sync, which its clients keep and send back ([`MetaRequest::Replay`]) in the recovery
/// window. They are made again strictly in the order of their numbers, from the first the
/// store does not have; the window closes once every session that start answered so said it
/// sent everything, or at its deadline. A number still missing when every session said so was
/// given to a change whose answer never reached its client, which sends it again: the changes
/// after it are made. One still missing at the deadline may have been lost with a client that
/// did not come back: it and every change after it are dropped, and their clients told
/// (`Evicted`), as is every change of that start sent back after the window closed. Requests wait until the window
/// closed (the start's settling waits for it), so nothing new is made before what the clients
/// replay. Which start is recovered, and who is waited for, is kept in the store until the
/// window closes, so a start that ends during its window leaves the same recovery to the next.
///
/// [`MetaRequest::Replay`]: weft_proto::messages::MetaRequest::Replay
pub(super) struct Recovery {
    /// The start whose changes are recovered (0: none).
    recovering: u64,
    /// The highest number the store had on disk when the home opened.
    opened_at: u64,
    window: Mutex<Window>,
    /// True once the window closed.
    closed: tokio::sync::watch::Sender<bool>,
    /// Held while changes are made again, and while the window closes.
    making: tokio::sync::Mutex<()>,
}

struct Window {
    /// The next number to make again.
    next: u64,
    /// Changes sent back whose number is not the next yet: one before it is still missing.
    held: BTreeMap<u64, NumberedChange>,
    /// Sessions that did not say yet they sent everything.
    expected: HashSet<ClientId>,
    deadline: Instant,
    /// Once closed: the first number dropped, if any was.
    dropped_from: Option<u64>,
}

impl Recovery {
    /// The recovery of the changes of start `recovering`, by a start that opened with
    /// `opened_at` on disk, waiting for `expected` until `deadline` (none expected: closed at
    /// once).
    pub(super) fn new(
        (recovering, opened_at): (u64, u64),
        expected: HashSet<ClientId>,
        deadline: Instant,
    ) -> Recovery {
        let closed = expected.is_empty();
        Recovery {
            recovering,
            opened_at,
            window: Mutex::new(Window {
                next: opened_at + 1,
                held: BTreeMap::new(),
                expected,
                deadline,
                dropped_from: None,
            }),
            closed: tokio::sync::watch::Sender::new(closed),
            making: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits until the window closed.
    pub(super) async fn wait_closed(&self) {
        let mut closed = self.closed.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

impl Meta {
    /// Serves a replay of `client`'s `changes`, sent back after this start (see [`Recovery`]);
    /// with `done`, the client sent everything, and is answered once the window closed:
    /// `Evicted` if any of its changes was dropped.
    pub(super) async fn replay(
        &self,
        client: ClientId,
        changes: Vec<NumberedChange>,
        done: bool,
    ) -> Result<MetaResponse, OpError> {
        let recovery = &self.recovery;
        let mut mine = Vec::new();
        // Changes of a start recovered before this one: what became of them is not known
        // here any more, so they count as dropped.
        let mut older = 0;
        let mut on_disk = 0;
        for change in changes {
            if change.incarnation == self.locks.epoch() {
                // Made by this start: nothing to make again.
                continue;
            }
            if change.incarnation == recovery.recovering && change.number <= recovery.opened_at {
                // On disk before this start (sent back by this client under a session it
                // renewed since, too): made again, it would undo what later changes made of
                // the same rows.
                on_disk += 1;
                continue;
            }
            if change.mutation.client != client {
                return Err(OpError::rejected(
                    ErrorCode::InvalidArgument,
                    format!(
                        "session {client} sent back change {} of session {}: a client replays \
                         only its own changes",
                        change.number, change.mutation.client
                    ),
                ));
            }
            if change.incarnation != recovery.recovering {
                older += 1;
                continue;
            }
            let proved = match self.cluster.change_proofs() {
                Some(proofs) => proofs.check(self.node, &change),
                // Without a cluster key nothing is authenticated, and no proof made.
                None => true,
            };
            if !proved {
                return Err(OpError::rejected(
                    ErrorCode::InvalidArgument,
                    format!(
                        "change {} that session {client} sent back was not made by metadata \
                         home {}: its proof does not hold",
                        change.number, self.node
                    ),
                ));
            }
            mine.push(change.number);
            let mut window = recovery.window.lock().expect("recovery window poisoned");
            // Once the window closed, a change of the start recovered is one dropped.
            if !recovery.is_closed() && window.next <= change.number {
                window.held.insert(change.number, change);
            }
        }
        if on_disk > 0 {
            tracing::info!(
                session = client.0,
                on_disk,
                "changes sent back that were on disk before this start are not made again"
            );
        }
        // Whether or not they could be made now, a client that said it is done is.
        let made = self.make_held().await;
        if done {
            let close = {
                let mut window = recovery.window.lock().expect("recovery window poisoned");
                window.expected.remove(&client);
                window.expected.is_empty()
            };
            if close {
                self.close_recovery().await;
            }
        }
        made?;
        if older > 0 {
            return Err(OpError::rejected(
                ErrorCode::Evicted,
                format!(
                    "{older} changes session {client} kept for metadata home {} were made by a \
                     start whose recovery window closed without them: they may be lost",
                    self.node
                ),
            ));
        }
        if !done && !recovery.is_closed() {
            return Ok(MetaResponse::Done);
        }
        if done && recovery.is_closed() && mine.is_empty() {
            // A session that keeps nothing and says so outside a recovery (a client that
            // ends) is not waited for at the next start, unless it changes something again.
            self.committer
                .run(Box::new(move |txn| {
                    txn.open_table(REPLAYERS)?.remove(client.0)?;
                    Ok(MetaResponse::Done)
                }))
                .await?;
            return Ok(MetaResponse::Done);
        }
        recovery.wait_closed().await;
        let dropped = {
            let window = recovery.window.lock().expect("recovery window poisoned");
            let from = window.dropped_from.unwrap_or(window.next);
            mine.iter().filter(|number| **number >= from).count()
        };
        if dropped > 0 {
            return Err(OpError::rejected(
                ErrorCode::Evicted,
                format!(
                    "{dropped} of the changes session {client} kept for metadata home {} were \
                     dropped: a change made before them was lost with its client when the \
                     home restarted, or they came back after its recovery window closed",
                    self.node
                ),
            ));
        }
        Ok(MetaResponse::Done)
    }

    /// Makes again every held change whose number is the next, in order, durably; the next
    /// number moves past them once they are made.
    async fn make_held(&self) -> Result<(), OpError> {
        let recovery = &self.recovery;
        let _making = recovery.making.lock().await;
        if recovery.is_closed() {
            return Ok(());
        }
        let ready: Vec<NumberedChange> = {
            let window = recovery.window.lock().expect("recovery window poisoned");
            let mut ready = Vec::new();
            let mut next = window.next;
            while let Some(change) = window.held.get(&next) {
                ready.push(change.clone());
                next += 1;
            }
            ready
        };
        if ready.is_empty() {
            return Ok(());
        }
        let count = ready.len() as u64;
        let made = self
            .committer
            .run(Box::new(move |txn| {
                make_again(txn, &ready)?;
                Ok(MetaResponse::Done)
            }))
            .await;
        if let Err(error) = made {
            // Not made: they stay held, and the next replay tries again.
            tracing::error!(?error, count, "replayed changes could not be made again");
            return Err(error);
        }
        // A crash here, inside the window, leaves the same recovery to the next start, which
        // finds these changes on its disk.
        weft_service::failpoint::failpoint("meta-after-replayed-changes");
        self.committer.metrics().replayed.inc_by(count);
        let mut window = recovery.window.lock().expect("recovery window poisoned");
        for _ in 0..count {
            let next = window.next;
            window.held.remove(&next);
            window.next += 1;
        }
        tracing::info!(count, "clients' changes made again after a restart");
        Ok(())
    }

    /// Closes the recovery window: what is still held follows a number nobody sent, and is
    /// dropped; the inode numbers its creates may have handed out are skipped; the store
    /// forgets the recovery.
    pub(super) async fn close_recovery(&self) {
        let recovery = &self.recovery;
        let _making = recovery.making.lock().await;
        if recovery.is_closed() {
            return;
        }
        // Every session waited for said it sent everything: a number still missing was given
        // to a change whose answer never reached its client (the crash came first), which
        // that client sends again as a new request. The changes after it are made, as Lustre's
        // recovery does when every client is back; the usage they hold of it is counted again.
        // Otherwise a missing number may be a change lost with its client: the changes after
        // it are dropped.
        let (skipped, dropped) = {
            let mut window = recovery.window.lock().expect("recovery window poisoned");
            let held = std::mem::take(&mut window.held);
            if window.expected.is_empty() {
                if let Some((&last, _)) = held.iter().next_back() {
                    tracing::warn!(
                        made = held.len(),
                        from = window.next,
                        "numbers whose answers never reached their clients are skipped: the \
                         changes after them are made"
                    );
                    window.next = last + 1;
                }
                self.committer.metrics().replayed.inc_by(held.len() as u64);
                (held.into_values().collect::<Vec<_>>(), false)
            } else {
                self.committer.metrics().dropped.inc_by(held.len() as u64);
                window.dropped_from = Some(window.next);
                tracing::warn!(
                    dropped = held.len(),
                    first = window.next,
                    missing = ?window.expected,
                    "the recovery window closed without every client's changes: changes from \
                     the first missing one on are dropped"
                );
                (Vec::new(), true)
            }
        };
        let closed = self
            .committer
            .run(Box::new(move |txn| {
                if !skipped.is_empty() {
                    make_again(txn, &skipped)?;
                    let counted =
                        crate::schema::usage::recount(&txn.open_table(crate::schema::INODES)?)?;
                    crate::schema::usage::rewrite(txn, &counted)?;
                }
                // A change skipped or dropped may have handed out inode numbers that later
                // changes made again name (a create whose answer was lost, its file renamed
                // by another client): none is given out again.
                if dropped || !skipped.is_empty() {
                    crate::schema::skip_inodes(txn, INODES_SKIPPED)?;
                }
                crate::schema::set_recovering(txn, 0)?;
                Ok(MetaResponse::Done)
            }))
            .await;
        if let Err(error) = closed {
            // The window stays closed to new requests: the store failed, and the home is
            // opened again, which recovers the same changes.
            tracing::error!(?error, "could not record the end of the recovery");
            return;
        }
        recovery.closed.send_replace(true);
    }

    /// Closes the recovery window at its deadline.
    pub(super) async fn watch_recovery(&self) {
        if self.recovery.is_closed() {
            return;
        }
        let deadline = self
            .recovery
            .window
            .lock()
            .expect("recovery window poisoned")
            .deadline;
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => self.close_recovery().await,
            () = self.recovery.wait_closed() => {}
        }
    }
}

/// Makes `changes` again in `txn`, in order: the rows each wrote.
fn make_again(txn: &WriteTransaction, changes: &[NumberedChange]) -> Result<(), OpError> {
    for change in changes {
        txn.apply_rows(&change.rows)?;
    }
    Ok(())
}

/// Inode numbers skipped after changes were dropped: more than the creates of the changes a
/// home answers before their sync (at most 16 MiB of them).
const INODES_SKIPPED: u64 = 1 << 24;

/// The sessions a start waits for: those start `recovering` answered changes before their
/// sync.
pub(super) fn expected_sessions(
    replayers: &impl ReadableTable<u64, u64>,
    recovering: u64,
) -> Result<HashSet<ClientId>, OpError> {
    let mut expected = HashSet::new();
    if recovering == 0 {
        return Ok(expected);
    }
    for row in replayers.iter()? {
        let (session, start) = row?;
        if start.value() == recovering {
            expected.insert(ClientId(session.value()));
        }
    }
    Ok(expected)
}
