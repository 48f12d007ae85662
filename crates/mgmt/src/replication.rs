//! Management replicated over three or five servers with Raft (`openraft`): every change of
//! the store ([`Command`]) is an entry of a log a majority of the servers commit (fsync) before
//! it is applied, in the log's order, to each server's own store.
//!
//! - The log, the vote and the commit point are kept in `raft.redb` ([`LogStore`]).
//! - The state machine is the store itself ([`StateMachine`]): each batch of entries is applied
//!   in one transaction of `mgmt.redb` that also records the last entry applied, so a restart
//!   neither loses nor applies twice an entry.
//! - A server too far behind the log is sent a snapshot: every row of the store
//!   ([`crate::store::StateRows`]).
//! - The servers speak over Weft's own connections ([`MgmtRequest::Raft`]), with its keys.
//!
//! Only the leader serves (`service`); the others answer `NotLeader` naming it.

// The storage traits of `openraft` return its `StorageError` (224 bytes): the helpers here
// return what the traits do.
#![allow(clippy::result_large_err)]

use crate::store::{apply, load_state_rows, state_rows, Command, MgmtStore, Outcome, StateRows};
use crate::MgmtError;
use bytes::Bytes;
use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, LogState, RaftLogReader, RaftNetwork,
    RaftNetworkFactory, RaftSnapshotBuilder, ServerState, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_net::{RpcClient, RpcClientOptions};
use weft_proto::messages::{mgmt_answers, MgmtRequest, MgmtResponse, RaftCall, Request};

openraft::declare_raft_types!(
    /// What management's replicated log is made of.
    pub(crate) Types:
        D = Command,
        R = Outcome,
        NodeId = u64,
        Node = BasicNode,
);

/// The Raft node of one management server.
pub(crate) type Raft = openraft::Raft<Types>;

type Fallible<T> = Result<T, StorageError<u64>>;

/// The last entry applied to the store, and the servers as last applied.
type Applied = (Option<LogId<u64>>, StoredMembership<u64, BasicNode>);

/// How often the leader tells the others it leads (and sends them new entries).
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(150);
/// A server that has not heard from a leader for a random time between these starts an
/// election; the others refuse to vote while they heard from a leader within the longer.
pub(crate) const ELECTION_TIMEOUT: (Duration, Duration) =
    (Duration::from_millis(1_000), Duration::from_millis(2_000));
/// Longest a change waits for a majority to commit it before the request that made it is
/// answered with an error (the change may still be committed later).
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// This server's Raft node, on a runtime of its own: however busy the service's threads are
/// (each change a request makes waits for the log in one of them), the log goes on, and so
/// does the clock a change's wait is bounded by.
pub(crate) struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    raft: Raft,
}

impl Replica {
    /// Starts this server's Raft node over `store`; server 1 starts the log the first time.
    pub async fn start(
        config: &crate::MgmtConfig,
        store: &MgmtStore,
        auth: weft_net::Auth,
    ) -> Result<Replica, MgmtError> {
        let log = LogStore::open(&config.data_dir)?;
        let machine = StateMachine::new(store)?;
        if machine
            .applied()
            .map_err(|error| MgmtError::Store(error.to_string()))?
            .0
            .is_none()
            && store.holds_anything()?
        {
            return Err(MgmtError::Config(format!(
                "{} holds the state of a management server that was not replicated: a replicated \
                 management starts from empty data directories (turning a single management \
                 server into three is not supported yet)",
                config.data_dir.display()
            )));
        }
        let network = Network {
            options: weft_net::RpcClientOptions {
                connections: 1,
                request_timeout: ELECTION_TIMEOUT.0,
                connect_timeout: ELECTION_TIMEOUT.0,
                auth,
                ..weft_net::RpcClientOptions::default()
            },
        };
        let settings = Arc::new(raft_config()?);
        let (replica, replicas) = (config.replica, config.replicas.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weft-raft")
            .enable_all()
            .build()
            .map_err(|error| MgmtError::Store(format!("replication runtime: {error}")))?;
        let started = runtime
            .spawn(async move {
                let raft = Raft::new(replica, settings, network, log, machine)
                    .await
                    .map_err(|error| MgmtError::Store(format!("replicated log: {error}")))?;
                let fresh = !raft
                    .is_initialized()
                    .await
                    .map_err(|error| MgmtError::Store(format!("replicated log: {error}")))?;
                if fresh && replica == 1 {
                    raft.initialize(membership(&replicas))
                        .await
                        .map_err(|error| {
                            MgmtError::Store(format!("cannot start the replicated log: {error}"))
                        })?;
                    tracing::info!(servers = ?replicas, "replicated log started");
                }
                Ok::<_, MgmtError>(raft)
            })
            .await
            .map_err(|error| MgmtError::Store(format!("replication runtime: {error}")))
            .and_then(|started| started);
        let raft = match started {
            Ok(raft) => raft,
            Err(error) => {
                // Not dropped here: a runtime cannot be dropped inside another.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        tracing::info!(
            replica = config.replica,
            of = config.replicas.len(),
            "management replicated"
        );
        Ok(Replica {
            runtime: Some(runtime),
            raft,
        })
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The log the store makes its changes through.
    pub fn log(&self) -> Log {
        let runtime = self.runtime.as_ref().expect("running").handle().clone();
        Log::new(self.raft.clone(), runtime)
    }

    /// Stops the Raft node and its runtime.
    pub async fn shutdown(mut self) {
        let _ = self.raft.shutdown().await;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The replicated log, as the store makes its changes through it.
#[derive(Clone)]
pub(crate) struct Log {
    raft: Raft,
    /// The Raft node's runtime, where changes are proposed.
    runtime: tokio::runtime::Handle,
    /// When a majority last acknowledged this server as leader, as far as this server knows;
    /// `None` while it does not lead.
    majority_heard: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Log {
    /// The log of `raft`; follows its metrics to know when a majority last acknowledged it.
    fn new(raft: Raft, runtime: tokio::runtime::Handle) -> Log {
        let majority_heard = Arc::new(std::sync::Mutex::new(None));
        let mut metrics = raft.metrics();
        runtime.spawn({
            let majority_heard = Arc::clone(&majority_heard);
            async move {
                loop {
                    let heard = {
                        let metrics = metrics.borrow_and_update();
                        match (metrics.state, metrics.millis_since_quorum_ack) {
                            (ServerState::Leader, Some(ms)) => {
                                Instant::now().checked_sub(Duration::from_millis(ms))
                            }
                            _ => None,
                        }
                    };
                    *majority_heard.lock().expect("majority poisoned") = heard;
                    // Ends with the Raft node.
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            }
        });
        Log {
            raft,
            runtime,
            majority_heard,
        }
    }

    /// Commits `command` on a majority and applies it here; its outcome. Waits on this thread
    /// (the caller's request is served in a thread that may block), for the Raft node's
    /// runtime, at most [`PROPOSE_TIMEOUT`].
    pub fn propose(&self, command: Command) -> Result<Outcome, MgmtError> {
        let (sent, written) = std::sync::mpsc::sync_channel(1);
        let raft = self.raft.clone();
        self.runtime.spawn(async move {
            let _ = sent.send(raft.client_write(command).await);
        });
        let written = match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| written.recv_timeout(PROPOSE_TIMEOUT)),
            Err(_) => written.recv_timeout(PROPOSE_TIMEOUT),
        };
        match written {
            Ok(Ok(response)) => Ok(response.data),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
                Err(MgmtError::NotLeader(leader_named(
                    forward.leader_node.as_ref().map(|node| node.addr.as_str()),
                )))
            }
            Ok(Err(error)) => Err(MgmtError::Store(format!("replicated log: {error}"))),
            // Not NotLeader: the change may still be committed, and a client must not make it
            // again elsewhere.
            Err(_) => Err(MgmtError::Store(format!(
                "no majority of the management servers committed a change within \
                 {PROPOSE_TIMEOUT:?}: it may still be made; ask again once a leader serves"
            ))),
        }
    }

    /// Whether this server leads and heard from a majority lately — within the shortest
    /// election timeout, before which no other server can be elected: a lease it grants now
    /// cannot overlap one a later leader grants. Measured against this clock, so it turns false
    /// on its own when the Raft node stalls and stops telling.
    pub fn leads_a_majority(&self) -> bool {
        self.majority_heard
            .lock()
            .expect("majority poisoned")
            .is_some_and(|heard| heard.elapsed() < ELECTION_TIMEOUT.0)
    }
}

/// A message saying who the leader is, for a `NotLeader` error.
pub(crate) fn leader_named(leader: Option<&str>) -> String {
    match leader {
        Some(address) => format!("this management server is not the leader; the leader is at {address}"),
        None => "this management server is not the leader, and no leader is elected yet; ask again shortly".to_string(),
    }
}

/// The Raft settings of management.
pub(crate) fn raft_config() -> Result<openraft::Config, MgmtError> {
    openraft::Config {
        cluster_name: "weft-mgmt".into(),
        heartbeat_interval: HEARTBEAT_INTERVAL.as_millis() as u64,
        election_timeout_min: ELECTION_TIMEOUT.0.as_millis() as u64,
        election_timeout_max: ELECTION_TIMEOUT.1.as_millis() as u64,
        install_snapshot_timeout: 10_000,
        ..openraft::Config::default()
    }
    .validate()
    .map_err(|error| MgmtError::Config(format!("replication settings: {error}")))
}

fn read_error(error: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::read_logs(openraft::AnyError::error(error.to_string())).into()
}

fn write_error(error: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_logs(openraft::AnyError::error(error.to_string())).into()
}

fn machine_error(error: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write_state_machine(openraft::AnyError::error(error.to_string())).into()
}

fn encode<T: Serialize>(value: &T) -> Fallible<Vec<u8>> {
    postcard::to_stdvec(value).map_err(write_error)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Fallible<T> {
    postcard::from_bytes(bytes).map_err(read_error)
}

/// index → postcard [`Entry`]: the log.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// "vote", "committed", "purged" → postcard: the log's own state.
const LOG_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("log_state");
/// "applied" (the last entry applied), "membership" (the servers, as last applied) →
/// postcard, in `mgmt.redb`: written in the transaction of the entries applied.
const APPLIED: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_applied");

/// The log, in `raft.redb`; every change is committed (fsync) before it is acknowledged.
#[derive(Clone)]
pub(crate) struct LogStore {
    db: Arc<Database>,
}

impl LogStore {
    pub fn open(data_dir: &Path) -> Result<LogStore, MgmtError> {
        let store_error = |error: redb::Error| MgmtError::Store(error.to_string());
        let db = Database::create(data_dir.join("raft.redb"))
            .map_err(|error| store_error(error.into()))?;
        let txn = db
            .begin_write()
            .map_err(|error| store_error(error.into()))?;
        txn.open_table(LOG)
            .map_err(|error| store_error(error.into()))?;
        txn.open_table(LOG_STATE)
            .map_err(|error| store_error(error.into()))?;
        txn.commit().map_err(|error| store_error(error.into()))?;
        Ok(LogStore { db: Arc::new(db) })
    }

    fn state<T: DeserializeOwned>(&self, key: &str) -> Fallible<Option<T>> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let table = txn.open_table(LOG_STATE).map_err(read_error)?;
        let value = table.get(key).map_err(read_error)?;
        value.map(|bytes| decode(bytes.value())).transpose()
    }

    fn set_state<T: Serialize>(&self, key: &str, value: &T) -> Fallible<()> {
        let bytes = encode(value)?;
        tokio::task::block_in_place(|| {
            let txn = self.db.begin_write().map_err(write_error)?;
            txn.open_table(LOG_STATE)
                .map_err(write_error)?
                .insert(key, bytes.as_slice())
                .map_err(write_error)?;
            txn.commit().map_err(write_error)
        })
    }

    /// Removes the entries in `range`, and notes `purged` when given, in one transaction.
    fn remove(&self, range: impl RangeBounds<u64>, purged: Option<LogId<u64>>) -> Fallible<()> {
        tokio::task::block_in_place(|| {
            let txn = self.db.begin_write().map_err(write_error)?;
            {
                let mut log = txn.open_table(LOG).map_err(write_error)?;
                log.retain_in(range, |_, _| false).map_err(write_error)?;
                if let Some(purged) = purged {
                    txn.open_table(LOG_STATE)
                        .map_err(write_error)?
                        .insert("purged", encode(&purged)?.as_slice())
                        .map_err(write_error)?;
                }
            }
            txn.commit().map_err(write_error)
        })
    }
}

impl RaftLogReader<Types> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Fallible<Vec<Entry<Types>>> {
        let txn = self.db.begin_read().map_err(read_error)?;
        let log = txn.open_table(LOG).map_err(read_error)?;
        let mut entries = Vec::new();
        for row in log.range(range).map_err(read_error)? {
            let (_, bytes) = row.map_err(read_error)?;
            entries.push(decode(bytes.value())?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<Types> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Fallible<LogState<Types>> {
        let purged: Option<LogId<u64>> = self.state("purged")?;
        let last = {
            let txn = self.db.begin_read().map_err(read_error)?;
            let log = txn.open_table(LOG).map_err(read_error)?;
            let last = log.last().map_err(read_error)?;
            match last {
                Some((_, bytes)) => Some(decode::<Entry<Types>>(bytes.value())?.log_id),
                None => None,
            }
        };
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Fallible<()> {
        self.set_state("vote", vote)
    }

    async fn read_vote(&mut self) -> Fallible<Option<Vote<u64>>> {
        self.state("vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Fallible<()> {
        self.set_state("committed", &committed)
    }

    async fn read_committed(&mut self) -> Fallible<Option<LogId<u64>>> {
        Ok(self.state::<Option<LogId<u64>>>("committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<Types>) -> Fallible<()>
    where
        I: IntoIterator<Item = Entry<Types>> + Send,
        I::IntoIter: Send,
    {
        let rows: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| Ok((entry.log_id.index, encode(&entry)?)))
            .collect::<Fallible<_>>()?;
        tokio::task::block_in_place(|| {
            let txn = self.db.begin_write().map_err(write_error)?;
            {
                let mut log = txn.open_table(LOG).map_err(write_error)?;
                for (index, bytes) in &rows {
                    log.insert(*index, bytes.as_slice()).map_err(write_error)?;
                }
            }
            txn.commit().map_err(write_error)
        })?;
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Fallible<()> {
        self.remove(log_id.index.., None)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Fallible<()> {
        self.remove(..=log_id.index, Some(log_id))
    }
}

/// The store as the log's state machine: entries are applied to `mgmt.redb`.
#[derive(Clone)]
pub(crate) struct StateMachine {
    db: Arc<Database>,
}

/// A snapshot as sent: the last entry it holds, the servers then, every row of the store.
#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotBody {
    rows: StateRows,
}

impl StateMachine {
    pub fn new(store: &MgmtStore) -> Result<StateMachine, MgmtError> {
        let db = store.database();
        let txn = db
            .begin_write()
            .map_err(|error| MgmtError::Store(error.to_string()))?;
        txn.open_table(APPLIED)
            .map_err(|error| MgmtError::Store(error.to_string()))?;
        txn.commit()
            .map_err(|error| MgmtError::Store(error.to_string()))?;
        Ok(StateMachine { db })
    }

    fn applied(&self) -> Fallible<Applied> {
        applied_in(&self.db.begin_read().map_err(read_error)?)
    }

    fn snapshot(&self) -> Fallible<Option<Snapshot<Types>>> {
        // One read transaction: the rows are those of the last entry it names.
        let txn = self.db.begin_read().map_err(read_error)?;
        let rows = state_rows(&txn).map_err(read_error)?;
        let (applied, membership) = applied_in(&txn)?;
        let Some(last) = applied else {
            return Ok(None);
        };
        let body = encode(&SnapshotBody { rows })?;
        Ok(Some(Snapshot {
            meta: SnapshotMeta {
                last_log_id: Some(last),
                last_membership: membership,
                snapshot_id: format!("{}-{}", last.leader_id.term, last.index),
            },
            snapshot: Box::new(Cursor::new(body)),
        }))
    }
}

fn applied_in(txn: &redb::ReadTransaction) -> Fallible<Applied> {
    let table = txn.open_table(APPLIED).map_err(read_error)?;
    let applied = match table.get("applied").map_err(read_error)? {
        Some(bytes) => decode(bytes.value())?,
        None => None,
    };
    let membership = match table.get("membership").map_err(read_error)? {
        Some(bytes) => decode(bytes.value())?,
        None => StoredMembership::default(),
    };
    Ok((applied, membership))
}

fn save_applied(
    txn: &redb::WriteTransaction,
    applied: &LogId<u64>,
    membership: Option<&StoredMembership<u64, BasicNode>>,
) -> Fallible<()> {
    let mut table = txn.open_table(APPLIED).map_err(machine_error)?;
    table
        .insert("applied", encode(&Some(*applied))?.as_slice())
        .map_err(machine_error)?;
    if let Some(membership) = membership {
        table
            .insert("membership", encode(membership)?.as_slice())
            .map_err(machine_error)?;
    }
    Ok(())
}

impl RaftSnapshotBuilder<Types> for StateMachine {
    async fn build_snapshot(&mut self) -> Fallible<Snapshot<Types>> {
        self.snapshot()?
            .ok_or_else(|| machine_error("no entry is applied yet to snapshot"))
    }
}

impl RaftStateMachine<Types> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Fallible<Applied> {
        self.applied()
    }

    async fn apply<I>(&mut self, entries: I) -> Fallible<Vec<Outcome>>
    where
        I: IntoIterator<Item = Entry<Types>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<Types>> = entries.into_iter().collect();
        tokio::task::block_in_place(|| {
            let txn = self.db.begin_write().map_err(machine_error)?;
            let mut outcomes = Vec::with_capacity(entries.len());
            let mut membership = None;
            for entry in &entries {
                outcomes.push(match &entry.payload {
                    EntryPayload::Blank => Outcome::Done,
                    EntryPayload::Normal(command) => apply(&txn, command).map_err(machine_error)?,
                    EntryPayload::Membership(servers) => {
                        membership =
                            Some(StoredMembership::new(Some(entry.log_id), servers.clone()));
                        Outcome::Done
                    }
                });
            }
            if let Some(last) = entries.last() {
                save_applied(&txn, &last.log_id, membership.as_ref())?;
            }
            txn.commit().map_err(machine_error)?;
            Ok(outcomes)
        })
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Fallible<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Fallible<()> {
        let body: SnapshotBody = decode(snapshot.get_ref())?;
        let Some(last) = meta.last_log_id else {
            return Ok(());
        };
        tokio::task::block_in_place(|| {
            let txn = self.db.begin_write().map_err(machine_error)?;
            load_state_rows(&txn, &body.rows).map_err(machine_error)?;
            save_applied(&txn, &last, Some(&meta.last_membership))?;
            txn.commit().map_err(machine_error)
        })
    }

    async fn get_current_snapshot(&mut self) -> Fallible<Option<Snapshot<Types>>> {
        // Built afresh from the store: a snapshot of the last entry applied.
        self.snapshot()
    }
}

/// Connects the management servers to each other.
pub(crate) struct Network {
    pub options: RpcClientOptions,
}

impl RaftNetworkFactory<Types> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer {
            target,
            rpc: RpcClient::new(node.addr.clone(), self.options.clone()),
        }
    }
}

/// Another management server, as the log's messages reach it.
pub(crate) struct Peer {
    /// Its Raft id.
    target: u64,
    rpc: RpcClient,
}

type Sent<T, E = openraft::error::Infallible> =
    Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl Peer {
    async fn send<Q, A, E>(&self, call: RaftCall, request: &Q, option: &RPCOption) -> Sent<A, E>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = postcard::to_stdvec(request)
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let (response, payload) = self
            .rpc
            .call_within::<MgmtResponse>(
                &Request::Mgmt(MgmtRequest::Raft { call }),
                Bytes::from(body),
                option.hard_ttl(),
            )
            .await
            .map_err(|error| RPCError::Unreachable(Unreachable::new(&error)))?;
        let _: mgmt_answers::Raft = self
            .rpc
            .answer(response)
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let answer: Result<A, RaftError<u64, E>> = postcard::from_bytes(&payload)
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl RaftNetwork<Types> for Peer {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<Types>,
        option: RPCOption,
    ) -> Sent<AppendEntriesResponse<u64>> {
        self.send(RaftCall::AppendEntries, &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<Types>,
        option: RPCOption,
    ) -> Sent<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.send(RaftCall::InstallSnapshot, &request, &option)
            .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        option: RPCOption,
    ) -> Sent<VoteResponse<u64>> {
        self.send(RaftCall::Vote, &request, &option).await
    }
}

/// Answers a message of another management server ([`MgmtRequest::Raft`]): its payload
/// decoded, handed to `raft`, the answer encoded as the reply's payload.
pub(crate) async fn answer(raft: &Raft, call: RaftCall, payload: &[u8]) -> Result<Bytes, String> {
    fn reply<T: Serialize>(answer: &T) -> Result<Bytes, String> {
        postcard::to_stdvec(answer)
            .map(Bytes::from)
            .map_err(|error| error.to_string())
    }
    let malformed = |error: postcard::Error| format!("malformed {call:?} message: {error}");
    match call {
        RaftCall::AppendEntries => {
            let request = postcard::from_bytes(payload).map_err(malformed)?;
            reply(&raft.append_entries(request).await)
        }
        RaftCall::Vote => {
            let request = postcard::from_bytes(payload).map_err(malformed)?;
            reply(&raft.vote(request).await)
        }
        RaftCall::InstallSnapshot => {
            let request = postcard::from_bytes(payload).map_err(malformed)?;
            reply(&raft.install_snapshot(request).await)
        }
    }
}

/// The servers of a replicated management, by Raft id (1, 2, … in the order of the config's
/// `replicas`).
pub(crate) fn membership(replicas: &[String]) -> BTreeMap<u64, BasicNode> {
    replicas
        .iter()
        .enumerate()
        .map(|(i, address)| (i as u64 + 1, BasicNode::new(address.clone())))
        .collect()
}
