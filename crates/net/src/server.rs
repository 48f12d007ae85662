//! The server side: accept connections and hand every request to a [`Handler`], many in flight
//! per connection. A malformed frame closes that connection only.

use crate::connection::{read_frame, write_frames, OutFrame};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use weft_proto::codec::{self, FrameKind};
use weft_proto::messages::{Reply, Request};

/// Requests one connection may have in flight before the server stops reading from it.
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: usize = 128;

/// A service's request handler.
pub trait Handler: Send + Sync + 'static {
    /// Serves one request; the returned payload travels raw after the reply body.
    fn handle(
        &self,
        request: Request,
        payload: Bytes,
    ) -> impl Future<Output = (Reply, Bytes)> + Send;
}

/// Accepts connections on `listener` until `shutdown` completes.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    tokio::spawn(serve_connection(stream, Arc::clone(&handler)));
                }
                Err(error) => {
                    // Running out of file descriptors must not end the accept loop.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn serve_connection<H: Handler>(stream: TcpStream, handler: Arc<H>) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let (mut reader, writer) = stream.into_split();
    let (frames, queue) = mpsc::channel::<OutFrame>(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX);
    tokio::spawn(write_frames(writer, queue));
    let in_flight = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX));
    loop {
        let (header, body, payload) = match read_frame(&mut reader).await {
            Ok(frame) => frame,
            Err(crate::connection::FrameReadError::Closed) => return,
            Err(error) => {
                tracing::warn!(%peer, %error, "closing connection after a bad frame");
                return;
            }
        };
        if header.kind != FrameKind::Request {
            tracing::warn!(%peer, "closing connection: peer sent a response to a server");
            return;
        }
        let request = match codec::decode_body::<Request>(&body) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%peer, %error, "closing connection after a malformed request");
                return;
            }
        };
        let permit = Arc::clone(&in_flight)
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let handler = Arc::clone(&handler);
        let frames = frames.clone();
        tokio::spawn(async move {
            let (reply, payload): (Reply, Bytes) = handler.handle(request, payload).await;
            let frame = OutFrame::new(
                FrameKind::Response,
                header.request_id,
                codec::encode_body(&reply),
                payload,
            );
            let _ = frames.send(frame).await;
            drop(permit);
        });
    }
}
