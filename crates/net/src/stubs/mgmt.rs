//! The management service's client: of its one server, or of every server of a replicated
//! management, asked in turn.

use super::*;

/// Longest a heartbeat (a server's or a client session's) waits for management's answer
/// before the next is sent, over another connection: well below the default offline, session
/// and promotion timeouts, well above the time a loaded management takes to answer.
pub const HEARTBEAT_DEADLINE: Duration = Duration::from_secs(3);

/// Whether a request to one server of a replicated management goes to another after `error`:
/// the server does not lead, or cannot be reached.
fn asks_another(error: &RpcError) -> bool {
    match error {
        RpcError::Remote(error) => error.code == weft_proto::ErrorCode::NotLeader,
        RpcError::Transport { .. } | RpcError::Timeout { .. } => true,
        _ => false,
    }
}

/// What a metadata server reports in its heartbeat (nothing, for a storage server).
#[derive(Debug, Default)]
pub struct MetaReport {
    /// Space and inodes of its metadata target.
    pub usage: Option<SpaceUsage>,
    /// Inodes of the homes it serves (none before it serves one: management keeps the last).
    pub inodes_used: Option<u64>,
    /// What each user and group uses in each pool, per home it serves.
    pub quota_usage: Vec<(NodeId, Vec<weft_proto::quota::QuotaUsage>)>,
    /// Per home it serves, per target the map shows draining that the home looked for, the
    /// files of the home that still use it.
    pub target_uses: Vec<(NodeId, Vec<(TargetId, u64)>)>,
    /// Per home it serves, the draining targets some of whose files cannot move off, and why.
    pub drain_blocked: Vec<(NodeId, Vec<weft_proto::messages::DrainBlock>)>,
}

/// A client session management opened ([`MgmtClient::register_client`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The session's id.
    pub id: ClientId,
    /// How long management keeps it without a heartbeat, when it says (a server of protocol
    /// version 6 does not).
    pub timeout: Option<Duration>,
}

/// Client of the management service: of its one server, or of every server of a replicated
/// management (named together, separated by `;`), asking the one that answered last first
/// and the others in turn when it is not the leader or cannot be reached.
#[derive(Debug)]
pub struct MgmtClient {
    address: String,
    servers: Vec<RpcClient>,
    /// The server asked first: the last that answered.
    answered: std::sync::atomic::AtomicUsize,
    /// The cluster's clock (management's) less this process's, in milliseconds, as the last
    /// heartbeat measured it ([`MgmtClient::cluster_clock_ms`]).
    clock_offset_ms: std::sync::atomic::AtomicI64,
}

/// How long a client of a replicated management keeps looking for its leader (an election
/// takes a few seconds) before it gives up on a request.
const LEADER_SEARCH: Duration = Duration::from_secs(6);
/// The pause between two rounds of the management servers while none leads.
const LEADER_SEARCH_PAUSE: Duration = Duration::from_millis(300);

impl MgmtClient {
    /// A client for management at `address`: one server's address (its rails separated by
    /// commas), or every management server's, separated by `;`.
    pub fn new(address: impl Into<String>, options: RpcClientOptions) -> MgmtClient {
        let address = address.into();
        let mut servers: Vec<RpcClient> = weft_proto::messages::mgmt_servers(&address)
            .map(|server| RpcClient::new(server, options.clone()))
            .collect();
        if servers.is_empty() {
            servers.push(RpcClient::new(address.clone(), options));
        }
        MgmtClient {
            address,
            servers,
            answered: std::sync::atomic::AtomicUsize::new(0),
            clock_offset_ms: std::sync::atomic::AtomicI64::new(0),
        }
    }

    /// The cluster's clock now, in milliseconds since the Unix epoch: this process's clock
    /// moved by what the last heartbeat measured against management's (this process's own
    /// before the first). Capabilities are granted and checked by it, so servers whose clocks
    /// differ agree on when one expires, to within a heartbeat's round trip.
    pub fn cluster_clock_ms(&self) -> u64 {
        let offset = self
            .clock_offset_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        crate::capability::local_clock_ms().saturating_add_signed(offset)
    }

    /// Management's address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `request` and answers what it declares.
    async fn ask<A: Answer<MgmtResponse>>(&self, request: MgmtRequest) -> Result<A, RpcError> {
        let (server, response) = self.send(request, None).await?;
        server.answer(response)
    }

    /// A heartbeat, answered within `deadline`: one sent over a cut rail gives way to the next
    /// over another rail before the lease or session it renews runs out. Asks each server
    /// once at most: the next heartbeat comes soon.
    async fn beat<A: Answer<MgmtResponse>>(
        &self,
        request: MgmtRequest,
        deadline: Duration,
    ) -> Result<A, RpcError> {
        let (server, response) = self.send(request, Some(deadline)).await?;
        server.answer(response)
    }

    /// Asks the server that answered last, then the others while they are not the leader or
    /// cannot be reached; with no deadline, for up to [`LEADER_SEARCH`] while none leads.
    /// Answers the server that answered, and its response.
    async fn send(
        &self,
        request: MgmtRequest,
        deadline: Option<Duration>,
    ) -> Result<(&RpcClient, MgmtResponse), RpcError> {
        use std::sync::atomic::Ordering;
        let request = Request::Mgmt(request);
        let count = self.servers.len();
        let searching_until = std::time::Instant::now() + LEADER_SEARCH;
        loop {
            let first = self.answered.load(Ordering::Relaxed);
            let mut error = None;
            for i in 0..count {
                let index = (first + i) % count;
                let server = &self.servers[index];
                let answer = match deadline {
                    Some(deadline) => server.call_within(&request, Bytes::new(), deadline).await,
                    None => server.call(&request, Bytes::new()).await,
                };
                match answer {
                    Ok((response, _)) => {
                        self.answered.store(index, Ordering::Relaxed);
                        return Ok((server, response));
                    }
                    Err(failed) if count > 1 && asks_another(&failed) => error = Some(failed),
                    Err(failed) => return Err(failed),
                }
            }
            let error = error.expect("every server was asked");
            if deadline.is_some() || std::time::Instant::now() >= searching_until {
                return Err(error);
            }
            tokio::time::sleep(LEADER_SEARCH_PAUSE).await;
        }
    }

    /// Sends a heartbeat with usage reports, answered within `deadline`
    /// ([`crate::mirror::Membership::heartbeat_deadline`]); answers the lease granted and the
    /// node's storage mirror groups.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or does not know the node.
    pub async fn heartbeat(
        &self,
        (kind, node): (NodeKind, NodeId),
        targets: Vec<TargetReport>,
        meta: MetaReport,
        mirror: Option<MirrorHeartbeat>,
        deadline: Duration,
    ) -> Result<(u64, Vec<MirrorGroupInfo>), RpcError> {
        let MetaReport {
            usage: meta_usage,
            inodes_used: meta_inodes_used,
            quota_usage,
            target_uses,
            drain_blocked,
        } = meta;
        let asked_at = crate::capability::local_clock_ms();
        let ack: mgmt_answers::Heartbeat = self
            .beat(
                MgmtRequest::Heartbeat {
                    kind,
                    node,
                    targets,
                    meta_usage,
                    meta_inodes_used,
                    mirror,
                    quota_usage,
                    target_uses,
                    drain_blocked,
                },
                deadline,
            )
            .await?;
        let answered_at = crate::capability::local_clock_ms();
        if ack.unix_ms > 0 {
            // Management's clock read half way through the round trip.
            let middle = asked_at / 2 + answered_at / 2;
            let offset = ack.unix_ms as i64 - middle as i64;
            self.clock_offset_ms
                .store(offset, std::sync::atomic::Ordering::Relaxed);
        }
        Ok((ack.lease_ms, ack.mirror_groups))
    }

    /// Opens a client session.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable.
    pub async fn register_client(&self, alias: String) -> Result<Session, RpcError> {
        let registered: mgmt_answers::RegisterClient =
            self.ask(MgmtRequest::RegisterClient { alias }).await?;
        let timeout_ms = registered.session_timeout_ms;
        Ok(Session {
            id: registered.client,
            timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
        })
    }

    /// Renews a client session, reporting what its mount does not serve.
    ///
    /// # Errors
    /// [`RpcError`] when management is unreachable or the session expired.
    pub async fn client_heartbeat(
        &self,
        client: ClientId,
        unserved: Vec<(String, u64)>,
    ) -> Result<(), RpcError> {
        let request = MgmtRequest::ClientHeartbeat { client, unserved };
        self.beat(request, HEARTBEAT_DEADLINE).await
    }
}

impl MgmtCalls for MgmtClient {
    type Error = RpcError;

    fn ask<A: Answer<MgmtResponse> + Send>(
        &self,
        request: MgmtRequest,
    ) -> impl std::future::Future<Output = Result<A, RpcError>> + Send {
        MgmtClient::ask(self, request)
    }
}
