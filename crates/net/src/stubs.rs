//! Typed clients per service. The client library and the servers (a metadata server truncating
//! objects, a storage server heartbeating) call each other through these same stubs.
//!
//! One module per service: `mgmt` (management, its replicated servers asked in turn), `meta`
//! (one metadata home) and `storage` (one storage server). Each stub returns what its request
//! declares it answers (`weft_proto::answer`).

use crate::client::{RpcClient, RpcClientOptions, RpcError};
use crate::kept::KeptChanges;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use weft_proto::access::{Caller, Capability};
use weft_proto::answer::Answer;
pub use weft_proto::answer::CreateReply;
use weft_proto::ids::{ClientId, InodeId, NodeId, TargetId};
use weft_proto::messages::{
    mgmt_answers, storage_answers, ChangeTag, FallocateMode, MetaCalls, MetaRequest, MetaResponse,
    MetaRoute, MgmtCalls, MgmtRequest, MgmtResponse, MirrorGroupInfo, MirrorHeartbeat, NodeKind,
    NodeStats, Request, Route, SpaceUsage, StatsResponse, StorageRequest, StorageResponse,
    TargetReport,
};

/// Declares stubs of a service client: each one sends the request variant its parameters
/// fill (a field named alone takes the parameter of its name; `field: value` converts one)
/// through the client's `ask`, and returns the answer the variant declares
/// (`answers::Variant`, see [`weft_proto::answer`]).
macro_rules! stubs {
    (
        $client:ident: $request:ident, $answers:ident;
        $(
            $(#[$doc:meta])*
            fn $name:ident($($param:ident: $ty:ty),* $(,)?) {
                $variant:ident $({ $($field:ident $(: $value:expr)?),* $(,)? })?
            }
        )*
    ) => {
        impl $client {
            $(
                $(#[$doc])*
                #[allow(clippy::too_many_arguments)]
                pub async fn $name(
                    &self,
                    $($param: $ty),*
                ) -> Result<weft_proto::messages::$answers::$variant, RpcError> {
                    self.ask($request::$variant $({ $($field $(: $value)?),* })?).await
                }
            )*
        }
    };
}

mod meta;
mod mgmt;
mod storage;

pub use meta::*;
pub use mgmt::*;
pub use storage::*;

impl RpcClient {
    /// The answer `A` that `response`, of service response `R`, carries; a response that
    /// carries another is the server's error, reported as such.
    ///
    /// # Errors
    /// [`RpcError::Unexpected`] when the response is not the answer.
    pub fn answer<R: std::fmt::Debug, A: Answer<R>>(&self, response: R) -> Result<A, RpcError> {
        A::take(response).map_err(|other| self.unexpected(&other))
    }

    /// Asks any server for its load counters since it started.
    ///
    /// # Errors
    /// [`RpcError`] when the server is unreachable.
    pub async fn node_stats(&self) -> Result<NodeStats, RpcError> {
        let (response, _) = self
            .call::<StatsResponse>(&Request::Stats, Bytes::new())
            .await?;
        self.answer(response)
    }
}
