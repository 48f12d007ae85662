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
    crate::connection::tune(&stream);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{RpcClient, RpcClientOptions};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weft_proto::codec::{FrameHeader, FRAME_BODY_BYTES_MAX};
    use weft_proto::messages::{Response, StorageRequest};
    use weft_proto::{InodeId, TargetId};

    /// Answers every request with its payload length, echoing the payload.
    struct Echo;

    impl Handler for Echo {
        async fn handle(&self, _request: Request, payload: Bytes) -> (Reply, Bytes) {
            (Ok(Response::Length(payload.len() as u64)), payload)
        }
    }

    async fn start() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(serve(listener, Arc::new(Echo), std::future::pending()));
        address
    }

    fn request() -> Request {
        Request::Storage(StorageRequest::Sync {
            target: TargetId(1),
            inode: InodeId::ROOT,
        })
    }

    async fn assert_closed(address: &str, bytes: &[u8]) {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream.write_all(bytes).await.expect("send");
        let mut buffer = [0u8; 64];
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buffer))
                .await
                .expect("server answers");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "the server closes a connection after a bad frame"
        );
    }

    // Goal: many requests in flight on one connection each get their own answer and payload.
    #[tokio::test]
    async fn concurrent_calls_match_their_replies() {
        let address = start().await;
        let client = Arc::new(RpcClient::new(address, RpcClientOptions::default()));
        let calls = (0..100usize).map(|size| {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                let payload = Bytes::from(vec![size as u8; size * 1000]);
                let (response, echoed) = client
                    .call(&request(), payload.clone())
                    .await
                    .expect("call");
                assert_eq!(response, Response::Length(payload.len() as u64));
                assert_eq!(echoed, payload);
            })
        });
        for call in calls {
            call.await.expect("task");
        }
    }

    // Goal: a malformed frame — wrong magic, oversized length, damaged payload, undecodable
    // body — closes that connection only; the server keeps serving others.
    #[tokio::test]
    async fn malformed_frames_close_only_their_connection() {
        let address = start().await;
        assert_closed(&address, &[0xAB; 32]).await;
        let oversized = FrameHeader {
            kind: FrameKind::Request,
            request_id: 1,
            body_len: FRAME_BODY_BYTES_MAX + 1,
            payload_len: 0,
            payload_crc: 0,
        };
        assert_closed(&address, &oversized.encode()).await;
        let body = codec::encode_body(&request());
        let damaged = FrameHeader {
            kind: FrameKind::Request,
            request_id: 2,
            body_len: body.len() as u32,
            payload_len: 4,
            payload_crc: 12345,
        };
        let mut bytes = damaged.encode().to_vec();
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(b"data");
        assert_closed(&address, &bytes).await;
        let garbage = FrameHeader {
            kind: FrameKind::Request,
            request_id: 3,
            body_len: 5,
            payload_len: 0,
            payload_crc: 0,
        };
        let mut bytes = garbage.encode().to_vec();
        bytes.extend_from_slice(&[0xFF; 5]);
        assert_closed(&address, &bytes).await;

        let client = RpcClient::new(address, RpcClientOptions::default());
        let (response, _) = client
            .call(&request(), Bytes::from_static(b"ok"))
            .await
            .expect("still serving");
        assert_eq!(response, Response::Length(2));
    }
}
