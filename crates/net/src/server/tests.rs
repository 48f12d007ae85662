use super::*;
use crate::client::{RpcClient, RpcClientOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_proto::codec::{FrameHeader, FRAME_BODY_BYTES_MAX};
use weft_proto::messages::{StorageRequest, StorageResponse};
use weft_proto::{InodeId, TargetId};

/// Answers every request with its payload length, echoing the payload.
struct Echo;

impl Handler for Echo {
    type Response = StorageResponse;

    async fn handle(
        &self,
        _from: Identity,
        _request: Request,
        payload: Bytes,
    ) -> (Reply<StorageResponse>, Bytes) {
        (Ok(StorageResponse::Length(payload.len() as u64)), payload)
    }
}

/// A cluster key in a directory that lives as long as the test process.
fn cluster_key() -> Auth {
    static KEY: std::sync::OnceLock<Auth> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let directory = tempfile::tempdir().expect("tempdir").keep();
        let file = directory.join("cluster.key");
        auth::write_new_key(&file).expect("keygen");
        Auth::from_key_file(&file).expect("load")
    })
    .clone()
}

fn options() -> RpcClientOptions {
    RpcClientOptions {
        auth: cluster_key(),
        ..RpcClientOptions::default()
    }
}

/// An echo server that admits holders of [`cluster_key`].
async fn start() -> String {
    start_measured().await.0
}

/// An echo server, and its metrics.
async fn start_measured() -> (String, Metrics) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let metrics = weft_observe::MetricsBuilder::new("test", None).build();
    tokio::spawn(serve(
        listener,
        Arc::new(Echo),
        metrics.clone(),
        Admission::new(cluster_key(), CONNECTIONS_MAX_DEFAULT),
        std::future::pending(),
    ));
    (address, metrics)
}

// Goal: a peer with two rails gets a client's connections spread over both, and while one
// refuses connections every call goes through the other: none fails.
#[tokio::test]
async fn calls_spread_over_rails_and_go_on_over_one() {
    let (first, first_metrics) = start_measured().await;
    let (second, second_metrics) = start_measured().await;
    let client = RpcClient::new(format!("{first},{second}"), options());
    for _ in 0..4 {
        client
            .call::<StorageResponse>(&request(), Bytes::new())
            .await
            .expect("call");
    }
    for metrics in [&first_metrics, &second_metrics] {
        let text = metrics.encode();
        assert!(
            text.contains("weft_connections{role=\"test\"} 1"),
            "one connection on each rail: {text}"
        );
    }
    let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead = gone.local_addr().expect("address").to_string();
    drop(gone);
    let client = RpcClient::new(format!("{dead},{second}"), options());
    for _ in 0..6 {
        client
            .call::<StorageResponse>(&request(), Bytes::new())
            .await
            .expect("a call over the rail left");
    }
}

/// A connection that passed the handshake, for sending raw bytes.
async fn authenticated(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    auth::connect(
        &mut stream,
        (&cluster_key(), auth::VERSIONS_SPOKEN),
        (address, &[]),
    )
    .await
    .expect("handshake");
    stream
}

fn request() -> Request {
    Request::Storage(StorageRequest::Sync {
        target: TargetId(1),
        mirror: None,
        inode: InodeId::ROOT,
        capability: None,
    })
}

async fn assert_closed(address: &str, bytes: &[u8]) {
    let mut stream = authenticated(address).await;
    stream.write_all(bytes).await.expect("send");
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut buffer))
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
    let client = Arc::new(RpcClient::new(address, options()));
    let calls = (0..100usize).map(|size| {
        let client = Arc::clone(&client);
        tokio::spawn(async move {
            let payload = Bytes::from(vec![size as u8; size * 1000]);
            let (response, echoed) = client
                .call::<StorageResponse>(&request(), payload.clone())
                .await
                .expect("call");
            assert_eq!(response, StorageResponse::Length(payload.len() as u64));
            assert_eq!(echoed, payload);
        })
    });
    for call in calls {
        call.await.expect("task");
    }
}

async fn http_get(address: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_string(&mut answer),
    )
    .await
    .expect("the server answers")
    .expect("read");
    answer
}

// Goal: the RPC port also answers HTTP: /metrics shows the requests served so far, an
// unknown page is a 404, and RPC keeps working on the same port.
#[tokio::test]
async fn metrics_over_http_on_the_rpc_port() {
    let address = start().await;
    let client = RpcClient::new(
        address.clone(),
        RpcClientOptions {
            origin: 5,
            ..options()
        },
    );
    client
        .call::<StorageResponse>(&request(), Bytes::from_static(b"abcd"))
        .await
        .expect("call");
    let metrics = http_get(&address, "/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("weft_requests_total{role=\"test\",op=\"sync\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("client=\"0000000000000005\""), "{metrics}");
    let missing = http_get(&address, "/nothing").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    client
        .call::<StorageResponse>(&request(), Bytes::new())
        .await
        .expect("call again");
}

// Goal: a malformed frame — wrong magic, oversized length, damaged payload, undecodable
// body — closes that connection only; the server keeps serving others.
#[tokio::test]
async fn malformed_frames_close_only_their_connection() {
    let address = start().await;
    // Bytes that are not a Weft frame are taken for HTTP, which answers 400 and closes.
    let mut stream = TcpStream::connect(&address).await.expect("connect");
    stream.write_all(&[0xAB; 32]).await.expect("send");
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the server answers and closes")
    .expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 400"), "{answer:?}");
    let oversized = FrameHeader {
        version: weft_proto::codec::PROTOCOL_VERSION,
        flags: 0,
        kind: FrameKind::Request,
        request_id: 1,
        body_len: FRAME_BODY_BYTES_MAX + 1,
        payload_len: 0,
        payload_crc: 0,
        origin: 0,
    };
    assert_closed(&address, &oversized.encode()).await;
    let body = codec::encode_body(&request());
    let damaged = FrameHeader {
        version: weft_proto::codec::PROTOCOL_VERSION,
        flags: 0,
        kind: FrameKind::Request,
        request_id: 2,
        body_len: body.len() as u32,
        payload_len: 4,
        payload_crc: 12345,
        origin: 0,
    };
    let mut bytes = damaged.encode().to_vec();
    bytes.extend_from_slice(&body);
    bytes.extend_from_slice(b"data");
    assert_closed(&address, &bytes).await;
    let garbage = FrameHeader {
        version: weft_proto::codec::PROTOCOL_VERSION,
        flags: 0,
        kind: FrameKind::Request,
        request_id: 3,
        body_len: 5,
        payload_len: 0,
        payload_crc: 0,
        origin: 0,
    };
    let mut bytes = garbage.encode().to_vec();
    bytes.extend_from_slice(&[0xFF; 5]);
    assert_closed(&address, &bytes).await;

    let client = RpcClient::new(address, options());
    let (response, _) = client
        .call::<StorageResponse>(&request(), Bytes::from_static(b"ok"))
        .await
        .expect("still serving");
    assert_eq!(response, StorageResponse::Length(2));
}
