//! A metadata home's client, and whom the metadata requests of a task act for.

use super::*;

tokio::task_local! {
    /// Who the metadata requests of the current task act for: a mount sets it for each of the
    /// kernel's requests.
    static CALLER: Caller;
}

/// Runs `work` with the metadata requests it sends acting for `caller`; requests sent outside
/// such a scope act for the process's own user and groups. Only connections with a client key
/// send who they act for: members' requests are not checked by the servers.
pub async fn acting_for<F: std::future::Future>(caller: Caller, work: F) -> F::Output {
    CALLER.scope(caller, work).await
}

/// Whom the current task acts for, when it was told ([`acting_for`]); `None`: the process.
pub fn acting_caller() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Who the metadata requests of the current task act for (see [`acting_for`]).
pub fn caller() -> Caller {
    CALLER
        .try_with(Caller::clone)
        .unwrap_or_else(|_| Caller::of_process())
}

/// Client of one metadata home, on the server that serves it.
#[derive(Debug)]
pub struct MetaClient {
    rpc: RpcClient,
    route: MetaRoute,
    /// The changes the home answered that its disk may not have yet.
    kept: Arc<KeptChanges>,
}

impl MetaClient {
    /// A client for `route`'s home on the metadata server at `address`.
    pub fn new(
        address: impl Into<String>,
        route: MetaRoute,
        options: RpcClientOptions,
    ) -> MetaClient {
        MetaClient {
            rpc: RpcClient::new(address, options),
            route,
            kept: Arc::default(),
        }
    }

    /// This client, keeping the home's changes in `kept`.
    pub fn keeping(self, kept: Arc<KeptChanges>) -> MetaClient {
        MetaClient { kept, ..self }
    }

    /// The changes the home answered that its disk may not have yet.
    pub fn kept(&self) -> &KeptChanges {
        &self.kept
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        self.rpc.address()
    }

    /// Where this client's requests go.
    pub fn route(&self) -> MetaRoute {
        self.route
    }

    /// Sends any metadata request.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn call(&self, request: MetaRequest) -> Result<MetaResponse, RpcError> {
        Ok(self.send(request, Bytes::new()).await?.0)
    }

    /// Sends a metadata request and answers what it declares.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn ask<A: Answer<MetaResponse>>(&self, request: MetaRequest) -> Result<A, RpcError> {
        let response = self.call(request).await?;
        self.rpc.answer(response)
    }

    /// Sends any metadata request with a payload.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable or answers with an error.
    pub async fn send(
        &self,
        request: MetaRequest,
        payload: Bytes,
    ) -> Result<(MetaResponse, Bytes), RpcError> {
        let (response, payload) = self
            .rpc
            .call(
                &Request::Meta(
                    self.route,
                    request,
                    self.rpc.client_name().map(|_| caller()),
                ),
                payload,
            )
            .await?;
        let response = match response {
            MetaResponse::Numbered {
                reply,
                change,
                synced,
            } => {
                self.kept.answered(change, synced);
                *reply
            }
            MetaResponse::Synced(synced) => {
                self.kept.synced(synced);
                MetaResponse::Synced(synced)
            }
            other => other,
        };
        Ok((response, payload))
    }
}

impl MetaCalls for MetaClient {
    type Error = RpcError;

    fn ask<A: Answer<MetaResponse> + Send>(
        &self,
        request: MetaRequest,
    ) -> impl std::future::Future<Output = Result<A, RpcError>> + Send {
        MetaClient::ask(self, request)
    }
}
